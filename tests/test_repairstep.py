"""What a repaired variant's build adopts from its repair's chosen step, and what it refuses (toolchains/repairstep.py).

The files are stand-in bytes made here: adoption is decided by names, digests and settings, never by their content.
The end-to-end case (a real quantize, compile and simulation adopted) is tests/test_repair.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qnn_tasks import fileio
from qnn_tasks.judge import sample_store
from qnn_tasks.toolchains import repairstep

OPTIONS = {"backend_type": "htp", "soc_model": "57"}


@pytest.fixture()
def kept(tmp_path: Path) -> dict[str, Path]:
    step, repair = tmp_path / ".work" / "step2", tmp_path / "repair"
    (step / "compiled").mkdir(parents=True)
    (step / "qdq.onnx").write_bytes(b"qdq")
    (step / "quantize.log").write_text("log\n")
    (step / "compiled" / "net_ctx.onnx").write_bytes(b"ctx")
    (step / "compiled" / "net_ctx_qnn.bin").write_bytes(b"bin")
    sample_store.save(step / "outputs.npz", [{"y": np.ones(3, np.float32)}] * 2)
    inputs = tmp_path / "inputs.npz"
    sample_store.save(inputs, [{"x": np.zeros(3, np.float32)}] * 2)
    facts = repairstep.keep(step, repair, {
        "qdq": "qdq.onnx", "log": "quantize.log", "quantize": {"nodes": 7}, "ctx_onnx": "compiled/net_ctx.onnx",
        "bin": "compiled/net_ctx_qnn.bin", "outputs": "outputs.npz", "chip": "SM8650", "options": OPTIONS,
        "inputs_sha256": fileio.sha256(inputs), "samples": 2, "compile_seconds": 1.5, "seconds": [0.1, 0.2]})
    promoted = repair / "promoted.json"
    promoted.write_text(json.dumps({"promoted": [], "chosen": facts}))
    assert sorted(f"chosen/{p.name}" for p in (repair / "chosen").iterdir()) == sorted(repairstep.files("net"))
    return {"promoted": promoted, "chosen": repair / "chosen", "inputs": inputs}


def test_each_stage_adopts_what_the_repair_made_from_the_same_things(kept, tmp_path):
    qdq = repairstep.qdq(kept["promoted"])
    assert qdq["path"] == kept["chosen"] / "qdq.onnx" and qdq["record"]["nodes"] == 7
    assert qdq["record"]["log"] == str(kept["chosen"] / "quantize.log")
    placed = tmp_path / "quantize" / "net_w8a16-mixed_qdq.onnx"
    fileio.place(qdq["path"], placed)
    assert placed.read_bytes() == b"qdq"
    binary = repairstep.binary(kept["promoted"], placed, "SM8650", dict(OPTIONS))
    assert binary == {"ctx_onnx": kept["chosen"] / "net_ctx.onnx", "bin": kept["chosen"] / "net_ctx_qnn.bin",
                      "compile_seconds": 1.5}
    outputs = repairstep.outputs(kept["promoted"], binary["bin"], kept["inputs"], 2, dict(OPTIONS), False)
    assert outputs == {"file": kept["chosen"] / "outputs.npz", "seconds": [0.1, 0.2]}


def test_nothing_is_adopted_from_another_qdq_chip_option_binary_or_sample_set(kept, tmp_path):
    other = tmp_path / "other.onnx"
    other.write_bytes(b"another qdq")
    chosen_bin = kept["chosen"] / "net_ctx_qnn.bin"
    assert repairstep.binary(kept["promoted"], other, "SM8650", OPTIONS) is None           # not the QDQ compiled
    assert repairstep.binary(kept["promoted"], kept["chosen"] / "qdq.onnx", "SM8750", OPTIONS) is None  # another chip
    assert repairstep.binary(kept["promoted"], kept["chosen"] / "qdq.onnx", "SM8650",
                             {**OPTIONS, "vtcm_mb": "4"}) is None                          # other provider options
    assert repairstep.outputs(kept["promoted"], other, kept["inputs"], 2, OPTIONS, False) is None    # another binary
    assert repairstep.outputs(kept["promoted"], chosen_bin, kept["inputs"], 1, OPTIONS, False) is None  # fewer samples
    assert repairstep.outputs(kept["promoted"], chosen_bin, kept["inputs"], 2, OPTIONS, True) is None   # CPU fallback
    sample_store.save(kept["inputs"], [{"x": np.ones(3, np.float32)}] * 2)
    assert repairstep.outputs(kept["promoted"], chosen_bin, kept["inputs"], 2, OPTIONS, False) is None  # new inputs


def test_a_changed_or_missing_file_is_not_adopted(kept):
    (kept["chosen"] / "qdq.onnx").write_bytes(b"edited")
    assert repairstep.qdq(kept["promoted"]) is None
    (kept["chosen"] / "net_ctx_qnn.bin").unlink()
    assert repairstep.binary(kept["promoted"], kept["chosen"] / "qdq.onnx", "SM8650", OPTIONS) is None
    assert repairstep.qdq(None) is None and repairstep.qdq(kept["promoted"].parent / "missing.json") is None


def test_an_unfused_source_is_quantized_from_the_stages_own_folder(tmp_path):
    """The quantizer writes `<model>-inferred.onnx` beside the model it reads: the repair and the plain variant,
    quantizing one simplified graph side by side (doit -n 2), once raced on that file in the simplify stage's folder
    (one of them failed). Each reads a hard link in its own folder instead (no bytes copied), or a saved copy where
    the source keeps external data (onnx refuses external data with more than one link)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from qnn_tasks.toolchains.ort_quantize import preprocessed

    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",  # named: or renamed
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    source = tmp_path / "simplify" / "net.onnx"
    source.parent.mkdir()
    onnx.save(model, str(source))
    first, second = preprocessed(source, tmp_path / "a"), preprocessed(source, tmp_path / "b")
    assert first == tmp_path / "a" / "net.onnx" and second == tmp_path / "b" / "net.onnx"
    assert first.stat().st_ino == source.stat().st_ino  # a link, not a copy
    external = tmp_path / "big" / "net.onnx"
    external.parent.mkdir()
    onnx.save(model, str(external), save_as_external_data=True, location="net.data", size_threshold=0)
    copy = preprocessed(external, tmp_path / "c")
    assert copy.parent == tmp_path / "c" and copy.stat().st_ino != external.stat().st_ino
    assert np.array_equal(numpy_helper.to_array(onnx.load(str(copy)).graph.initializer[0]), np.ones((64, 64)))
    for folder in (source.parent, external.parent):  # nothing written beside the sources
        assert {p.suffix for p in folder.iterdir()} <= {".onnx", ".data"} and len(list(folder.iterdir())) <= 2
