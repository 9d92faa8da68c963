"""Real tests for qnn_tasks.qnnbin: compile tiny models with the QNN EP, read them back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
onnxruntime_qnn = pytest.importorskip("onnxruntime_qnn")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from qnn_tasks.qnn.binary import QnnBinError, find_system_library, main, read_binary_info  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SOC_ARCH = {"57": "v75", "69": "v79"}  # SM8650, SM8750


def _tiny_float_model(path: Path) -> None:
    """Conv + Relu, float32 x[1,3,16,16] -> y[1,8,16,16]."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.random((8, 3, 3, 3), dtype=np.float32), "w"),
        numpy_helper.from_array(np.zeros(8, np.float32), "b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)


def _tiny_quant_model(path: Path) -> None:
    """Two quantized inputs/outputs (uint8 and uint16), to check tensor arrays and encodings."""
    def const(value, name):
        return numpy_helper.from_array(np.asarray(value), name)

    inits = [
        const(np.float32(0.02), "xs"), const(np.uint8(128), "xz"),
        const(np.full((8, 3, 3, 3), 130, np.uint8), "wq"), const(np.float32(0.01), "ws"), const(np.uint8(128), "wz"),
        const(np.float32(0.05), "ys"), const(np.uint8(0), "yz"),
        const(np.float32(0.0001), "s2"), const(np.uint16(1000), "z2"),
        const(np.float32(1 / 65536), "o2s"), const(np.uint16(0), "o2z"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wf"]),
        helper.make_node("Conv", ["xf", "wf"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["y"]),
        helper.make_node("DequantizeLinear", ["x2", "s2", "z2"], ["x2f"]),
        helper.make_node("Sigmoid", ["x2f"], ["sg"]),
        helper.make_node("QuantizeLinear", ["sg", "o2s", "o2z"], ["y2"]),
    ]
    graph = helper.make_graph(
        nodes, "tinyq",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 3, 16, 16]),
         helper.make_tensor_value_info("x2", TensorProto.UINT16, [1, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 8, 16, 16]),
         helper.make_tensor_value_info("y2", TensorProto.UINT16, [1, 4, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, path)


def _compile(model: Path, out_onnx: Path, soc_model: str) -> Path:
    """Compile with the QNN HTP EP; return the *_qnn.bin written next to out_onnx."""
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    so = ort.SessionOptions()
    so.add_provider_for_devices(
        devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": soc_model}
    )
    flags = ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED
    ort.ModelCompiler(so, str(model), flags=flags).compile_to_file(str(out_onnx))
    bins = sorted(out_onnx.parent.glob(out_onnx.stem + "*.bin"))
    assert len(bins) == 1, bins
    return bins[0]


@pytest.fixture(scope="session")
def binaries(tmp_path_factory) -> dict[str, Path]:
    """Real context binaries: float model for soc 57/69, quantized model for soc 57."""
    if not any(d.ep_name == "QNNExecutionProvider" for d in ort.get_ep_devices()):
        ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
    tmp = tmp_path_factory.mktemp("qnnbin")
    _tiny_float_model(tmp / "tiny.onnx")
    _tiny_quant_model(tmp / "tinyq.onnx")
    out = {soc: _compile(tmp / "tiny.onnx", tmp / f"tiny_{soc}_ctx.onnx", soc) for soc in SOC_ARCH}
    out["q57"] = _compile(tmp / "tinyq.onnx", tmp / "tinyq_57_ctx.onnx", "57")
    out["model"] = tmp / "tiny.onnx"
    return out


def _onnx_io(model: Path) -> tuple[list, list]:
    """[(name, shape)] of an ONNX model's inputs and outputs."""
    graph = onnx.load(model).graph

    def io(values):
        return [(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values]

    return io(graph.input), io(graph.output)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "qnn_tasks.qnn.binary", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


def test_find_system_library():
    lib = find_system_library()
    assert lib.name == "libQnnSystem.so" and lib.is_file()


def test_env_override_missing_library(monkeypatch, tmp_path):
    monkeypatch.setenv("QNN_SYSTEM_LIB", str(tmp_path / "nope.so"))
    with pytest.raises(QnnBinError, match="QNN_SYSTEM_LIB"):
        find_system_library()


@pytest.mark.parametrize("soc", sorted(SOC_ARCH))
def test_float_binary(binaries, soc):
    info = read_binary_info(binaries[soc])
    assert info.binary_info_version == 3
    assert info.soc_model == int(soc)
    assert info.dsp_arch == SOC_ARCH[soc]
    assert info.context_metadata == [1, int(SOC_ARCH[soc][1:])]
    assert info.build_id.startswith("v2.")
    assert info.core_api_version.startswith("2.")
    assert len(info.graphs) == 1
    graph = info.graphs[0]
    inputs, outputs = _onnx_io(binaries["model"])
    assert [(t.name, t.shape) for t in graph.inputs] == inputs == [("x", [1, 3, 16, 16])]
    assert [(t.name, t.shape) for t in graph.outputs] == outputs == [("y", [1, 8, 16, 16])]
    # The EP keeps float32 graph I/O even when the HTP computes in fp16.
    assert all(t.dtype == "float32" and t.quantization is None for t in graph.inputs + graph.outputs)


def test_socs_differ(binaries):
    a, b = read_binary_info(binaries["57"]), read_binary_info(binaries["69"])
    assert (a.soc_model, a.dsp_arch) != (b.soc_model, b.dsp_arch)


def test_quantized_binary(binaries):
    graph = read_binary_info(binaries["q57"]).graphs[0]
    got = {t.name: (t.dtype, t.shape, t.quantization) for t in graph.inputs + graph.outputs}
    assert [t.name for t in graph.inputs] == ["x", "x2"]
    assert [t.name for t in graph.outputs] == ["y", "y2"]
    # QNN stores offset = -zero_point.
    assert got["x"] == ("ufixed_point_8", [1, 3, 16, 16], {"encoding": "scale_offset", "scale": 0.02, "offset": -128})
    assert got["x2"] == ("ufixed_point_16", [1, 4, 5], {"encoding": "scale_offset", "scale": 0.0001, "offset": -1000})
    assert got["y"][:2] == ("ufixed_point_8", [1, 8, 16, 16])
    assert got["y2"][0] == "ufixed_point_16"


def test_to_dict_is_json(binaries):
    data = json.loads(json.dumps(read_binary_info(binaries["57"]).to_dict()))
    assert data["soc_model"] == 57 and data["graphs"][0]["inputs"][0]["name"] == "x"


def test_cli_json(binaries):
    result = _cli(str(binaries["69"]), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["soc_model"] == 69 and data["dsp_arch"] == "v79"


def test_cli_summary(binaries, capsys):
    assert main([str(binaries["57"])]) == 0
    out = capsys.readouterr().out
    assert "v75" in out and "float32 [1, 3, 16, 16]" in out


@pytest.fixture
def corrupt(tmp_path) -> Path:
    path = tmp_path / "corrupt.bin"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    return path


def _assert_one_line_error(result: subprocess.CompletedProcess, path: Path) -> None:
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in result.stderr


def test_cli_corrupt(corrupt):
    _assert_one_line_error(_cli(str(corrupt)), corrupt)


def test_cli_missing(tmp_path):
    missing = tmp_path / "missing.bin"
    _assert_one_line_error(_cli(str(missing), "--json"), missing)


def test_read_errors(tmp_path, corrupt):
    with pytest.raises(QnnBinError, match="MALFORMED_BINARY"):
        read_binary_info(corrupt)
    with pytest.raises(QnnBinError, match="no such file"):
        read_binary_info(tmp_path / "missing.bin")
    empty = tmp_path / "empty.bin"
    empty.touch()
    with pytest.raises(QnnBinError, match="empty"):
        read_binary_info(empty)


def test_truncated_binary(binaries, tmp_path):
    cut = tmp_path / "cut.bin"
    cut.write_bytes(binaries["57"].read_bytes()[:-100])
    with pytest.raises(QnnBinError, match=str(cut)):
        read_binary_info(cut)
