"""QNN error codes turned into one line a person can act on (qnn_tasks/data/qnn_errors.yaml, qnn/errorcodes.py).

Every `measured` entry is reproduced here on a real log line: 3110 by compiling a float graph for a chip
that runs only quantized graphs (SM7550), 5000 by loading a QNN 2.51 binary on the QNN 2.47 runtime (the
pinned environment of toolchain profile ort-qnn-2.47), 5005 by loading a multi-SoC binary on the x86
simulator, 14001 by compiling for a soc_model QNN does not know. `documentation` entries cannot be
produced here (phones, weight-shared binaries): they are parsed from the log lines public reports show.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import onnx
import pytest
from conftest import EXAMPLES, ROOT, Project
from tiny_packaged import tiny_model, write_model

from qnn_tasks.errors import StageError, ToolchainError
from qnn_tasks.modelspec.load import load_model, load_soc_table
from qnn_tasks.modelspec.project import Soc
from qnn_tasks.qnn import errorcodes as qnnerrors
from qnn_tasks.toolchains.ort_qnn import compile_context

SOCS = load_soc_table(Path("/nonexistent"))[0]  # the packaged table


@pytest.fixture
def tiny(tmp_path) -> Path:
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(batch=1), str(model))
    return model


def compile_error(model: Path, out_dir: Path, options: dict, **context) -> str:
    with pytest.raises(ToolchainError) as err:
        compile_context(model, out_dir / "m_ctx.onnx", options, out_dir / "compile.log", context=context)
    return str(err.value)


def test_catalogue_entries_are_complete_and_shown_in_the_docs():
    entries = qnnerrors.catalogue()
    assert {3110, 5000, 5004, 5005, 1002, 14001, 6001} <= set(entries)
    for code, entry in entries.items():
        assert entry["name"].startswith("QNN_") and "_ERROR_" in entry["name"], code
        assert entry["source"] in ("measured", "documentation") and entry["evidence"] and entry["meaning"], code
        assert entry["fixes"] and entry["fixes"][-1].get("when") in (None, {}), f"{code}: no fallback fix"
    page = (ROOT / "docs" / "error-codes.md").read_text()
    assert qnnerrors.table_markdown() in page, "docs/error-codes.md's table is not the catalogue's (regenerate it)"


def test_3110_float_graph_on_a_quantized_only_chip(tiny, tmp_path):
    """The issue's example: compile float for SM7550 -> "SM7550 runs only quantized graphs: add w8a16 to ..."."""
    model_dir = write_model(tmp_path / "models" / "tiny")
    graph = load_model(model_dir, SOCS).graphs[0]
    line = compile_error(tiny, tmp_path / "out", {"soc_model": "64", "vtcm_mb": "8"},
                         soc=SOCS["SM7550"], graph=graph, precision="fp16")
    log = (tmp_path / "out" / "compile.log").read_text()
    assert "backendValidateOpConfig() failed" in log and "error code 3110" in log  # the real log line
    assert "not selected by that EP" in line  # what onnxruntime says ...
    # ... and what it means here
    assert ("QNN error 3110 (QNN_OP_PACKAGE_ERROR_VALIDATION_FAILURE): QNN's HTP backend rejected an op's "
            "configuration for this chip: SM7550 runs only quantized graphs: add w8a16 to graphs.tiny.precision in "
            f"{model_dir / 'model.yaml'}") in line
    assert "\n" not in line


def test_3110_when_a_project_row_wrongly_says_the_chip_runs_float(tmp_path):
    """Through doit: a row claiming fp16 on SM7550 fails `context` with one line naming the row's file and the fix."""
    project = Project(tmp_path / "project")
    project.root.mkdir()
    (project.root / "dodo.py").write_text((EXAMPLES / "dodo.py").read_text())
    write_model(project.root / "models" / "tiny", extra="    socs: [SM7550]\n")
    (project.root / "socs").mkdir()
    (project.root / "socs" / "socs.yaml").write_text(
        "socs:\n  SM7550: {soc_id: 64, dsp_arch: v73, vtcm_mb: 8, runs: [fp16, w8a16]}   # wrong: it runs w8a16 only\n")
    result = project.doit("context:tiny-SM7550")
    line = result.failure_line("context:tiny-SM7550")
    assert "QNN error 3110 (QNN_OP_PACKAGE_ERROR_VALIDATION_FAILURE)" in line
    assert (f"SM7550 refused float ops: if it runs only quantized graphs, set runs: [w8a16] on its row "
            f"({project.root / 'socs' / 'socs.yaml'}) and add w8a16 to graphs.tiny.precision in models/tiny/model.yaml") in line
    record = json.loads((project.root / "build/tiny/tiny").glob("*/fp16/SM7550/context/context.json").__next__().read_text())
    assert record["status"] == "failed" and "QNN error 3110" in record["error"]


def test_14001_unknown_soc_model(tiny, tmp_path):
    soc = Soc(name="SM9999", soc_id=999, dsp_arch="v81", vtcm_mb=8, runs=("fp16", "w8a16"), file="socs/socs.yaml")
    line = compile_error(tiny, tmp_path, {"soc_model": "999", "vtcm_mb": "8"}, soc=soc, precision="fp16")
    assert "QNN_DEVICE_ERROR_INVALID_CONFIG" in (tmp_path / "compile.log").read_text()
    assert ("QNN error 14001 (QNN_DEVICE_ERROR_INVALID_CONFIG): QNN could not set up the HTP device with this "
            "configuration: soc_id 999 is not a chip this QNN knows: check the SM9999 row of socs/socs.yaml") in line


def test_5005_multi_soc_binary_on_the_simulator(tiny, tmp_path):
    from qnn_tasks.devices import simulator

    ctx = tmp_path / "multi" / "m_ctx.onnx"
    ctx.parent.mkdir()
    compile_context(tiny, ctx, {"soc_model": "57,69", "vtcm_mb": "8"}, tmp_path / "compile.log")
    import numpy as np

    with pytest.raises(StageError) as err:
        simulator.run(ctx, {"soc_model": "57", "vtcm_mb": "8"}, [{"x": np.zeros((1, 8, 16, 16), np.float32)}],
                      tmp_path / "simulator.log")
    line = str(err.value)
    assert "QNN_CONTEXT_ERROR_CREATE_FROM_BINARY" in (tmp_path / "simulator.log").read_text()
    assert ("QNN error 5005 (QNN_CONTEXT_ERROR_CREATE_FROM_BINARY): the runtime could not create a context from the "
            "binary") in line
    assert "the x86 simulator cannot load multi-SoC or shared-weights binaries (verify those on a phone)" in line


def test_5000_newer_binary_on_the_older_runtime(tiny, tmp_path):
    """A QNN 2.51 binary on the QNN 2.47 simulator (the pinned environment of profile ort-qnn-2.47)."""
    from qnn_tasks.modelspec.load import load_toolchain
    from qnn_tasks.toolchains import envs

    env = envs.ensure(load_toolchain(tmp_path, "ort-qnn-2.47"), quiet=True)
    ctx = tmp_path / "bin" / "m_ctx.onnx"
    ctx.parent.mkdir()
    compile_context(tiny, ctx, {"soc_model": "57", "vtcm_mb": "8"}, tmp_path / "compile.log")
    wrapper = onnx.load(str(ctx))
    wrapper.ir_version = 10  # onnxruntime 1.24 reads IR 10 (stages/compat.py lowers it the same way)
    onnx.save(wrapper, str(ctx))
    code = ("import sys, numpy as np\nfrom pathlib import Path\nfrom qnn_tasks.devices import simulator\n"
            "from qnn_tasks.errors import StageError\n"
            "try:\n"
            f"    simulator.run(Path({str(ctx)!r}), {{'soc_model': '57', 'vtcm_mb': '8'}}, "
            "[{'x': np.zeros((1, 8, 16, 16), np.float32)}], Path(sys.argv[1]))\n"
            "except StageError as err:\n    print(err)\n")
    log = tmp_path / "simulator.log"
    proc = subprocess.run([str(env.python), "-c", code, str(log)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "QNN_CONTEXT_ERROR_INVALID_ARGUMENT" in log.read_text()  # the real log line (by name, not number)
    line = proc.stdout.strip()
    assert ("QNN error 5000 (QNN_CONTEXT_ERROR_INVALID_ARGUMENT): the runtime refused the context binary, typically "
            "one built by a newer QNN than the runtime loading it: build with a QNN no newer than the runtime") in line
    assert "QNN_TOOLCHAIN=ort-qnn-2.47" in line and "doit compat" in line


@pytest.mark.parametrize("text, code, fragment", [
    # documentation only: the forms public reports show (no phone, no weight-shared binary loads here)
    (("QnnDsp <E> Failed to find available PD for contextId 1 on deviceId 0 coreId 0 with context size estimate 1842"
      "\nQnnDsp <E> Failed to create context from binary with err 1002"), 1002, "each weight-shared binary may take a PD"),
    ("<E> Failed to create context from binary with err 0x138c", 5004, "same QAIRT version"),
    ("QnnGraph_execute failed: error code 6001", 6001, "python -m qnn_tasks.qnn.binary"),
    ("QnnDevice_create returned 0x36b1 (QNN_DEVICE_ERROR_INVALID_CONFIG)", 14001, "ADSP_LIBRARY_PATH"),
    ("Could not create context from binary. Error: 5005", 5005, "same QAIRT version as the runtime libs"),
])
def test_phone_log_lines_are_explained(text, code, fragment):
    lines = qnnerrors.explain(text, "phone", soc=SOCS["SM8650"])
    assert len(lines) == 1 and lines[0].startswith(f"QNN error {code} ("), lines
    assert fragment in lines[0], lines[0]
    if code == 14001:
        assert "libQnnHtpV75Stub.so" in lines[0]


def test_unknown_and_repeated_codes():
    assert qnnerrors.explain("2026-12-01 08:11:53 error code 4242; soc_model 3110 x", "compile") == []
    text = "error code 3110\nerror code 3110\nQNN_CONTEXT_ERROR_INVALID_ARGUMENT"
    assert qnnerrors.find_codes(text) == [3110, 5000]


def l2_model(path: Path, written_out: bool) -> None:
    """MatMul then an L2 normalisation (MiniLM's last step): ReduceL2, or the same norm written out."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 32)) * 0.2).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(1e-12, np.float32), "eps"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    norm = ([helper.make_node("Mul", ["m", "m"], ["sq"]), helper.make_node("ReduceSum", ["sq", "axes"], ["ss"], keepdims=1),
             helper.make_node("Sqrt", ["ss"], ["n"])] if written_out else
            [helper.make_node("ReduceL2", ["m"], ["n"], axes=[-1], keepdims=1)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), *norm, helper.make_node("Clip", ["n", "eps"], ["nc"]),
             helper.make_node("Div", ["m", "nc"], ["y"])]
    graph = helper.make_graph(nodes, "l2", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.slow
def test_3110_float_op_inside_a_w8a16_graph_on_a_quantized_only_chip(tmp_path):
    """MiniLM's w8a16 case in small: at w8a16 ReduceL2 falls back to CPU on SM7550 (3110 in compile.log), not on
    SM8650; the message says why and how to write it; written out, it runs on HTP on SM7550 too."""
    import numpy as np

    project = Project(tmp_path / "project")
    model_dir = project.root / "models" / "l2"
    (model_dir / "samples").mkdir(parents=True)
    (project.root / "dodo.py").write_text((EXAMPLES / "dodo.py").read_text())
    l2_model(model_dir / "l2.onnx", written_out=False)
    np.savez(model_dir / "samples" / "inputs.npz", x=np.random.default_rng(1).standard_normal((8, 1, 16)).astype(np.float32))
    (model_dir / "model.yaml").write_text(
        "licence: test fixture\nsource: {file: l2.onnx}\ngraphs:\n  l2:\n    inputs:\n      x: {shape: [1, 16], dtype: float32}\n"
        "    outputs:\n      y: {shape: [1, 32]}\n    samples: {files: \"samples/*.npz\"}\n    precision: w8a16\n"
        "    calibration: {samples: 8}\n    socs: [SM7550, SM8650]\n")
    result = project.doit("context")
    assert "context:l2-SM8650" in result.executed and "context:l2-SM7550" in result.executed
    line = result.failure_line("context:l2-SM7550")
    assert "3 node(s) of graph 'l2' fall back to CPU on SM7550" in line and "ReduceL2 'ReduceL2_1'" in line
    assert "write it as Sqrt(ReduceSum(Mul(x, x))) at export" in line
    assert ("QNN error 3110 (QNN_OP_PACKAGE_ERROR_VALIDATION_FAILURE): QNN's HTP backend rejected an op's configuration "
            "for this chip: SM7550 runs only quantized ops: float ops left inside the w8a16 graph") in line
    log = next(project.root.glob("build/l2/l2/*/w8a16/SM7550/context/compile.log")).read_text()
    assert re.search(r"`ReduceL2_1ElementWiseMultiply(_\d+)?` of type `ElementWiseMultiply` with error code 3110", log), log[-500:]
    assert "context:l2-SM8650: failed" not in result.stdout + result.stderr  # the same graph is all on HTP there
    # the fix the message gives works: written out, the norm runs on HTP on SM7550
    l2_model(model_dir / "l2.onnx", written_out=True)
    fixed = project.doit("context")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
