"""Pipeline glue declared in YAML: a reshape between tensors of one size and a fixed affine step between graphs.

Two packaged ONNX graphs built here, YAML only, fed raw float32 sample files: `embed` maps x [1, 64] to
y [1, 64]; `head` takes z [1, 8, 8]. The deployment feeds head.z = reshape(embed.y / 10 + 2): declared as
`feed: {head.z: {from: embed.y, reshape: true, scale: 0.1, offset: 2.0}}`, applied alike to the CPU and the
NPU chain. Real compiles and simulator runs on SM8650; spec errors are one line.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EXAMPLES, Project
from onnx import TensorProto, helper, numpy_helper

YAML = "models/glued/model.yaml"
MODEL_YAML = """\
licence: test fixture
source: {file: embed.onnx}
graphs:
  embed:
    inputs: {x: {shape: [1, 64], dtype: float32}}
    outputs: {y: {shape: [1, 64]}}
    samples: {raw: {files: "samples/x.bin"}}
    socs: [SM8650]
  head:
    source: {file: head.onnx}
    inputs: {z: {shape: [1, 8, 8], dtype: float32}}
    outputs: {logits: {shape: [1, 5]}}
    samples: {raw: {files: "samples/z.bin"}}
    socs: [SM8650]
pipeline:
  graphs: [embed, head]
  feed: {head.z: {from: embed.y, reshape: true, scale: 0.1, offset: 2.0}}
  verify:
    checks:
      - top1: {output: logits, min: 1.0}
"""


def _model(nodes, name, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def embed_model() -> onnx.ModelProto:
    weights = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], "embed",
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [numpy_helper.from_array(weights, "w")])


def head_model() -> onnx.ModelProto:
    """Sensitive to the glue: a log of the fed values (positive only after + 2 on values of about +-1)."""
    weights = np.random.default_rng(1).standard_normal((8, 5)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["z"], ["positive"]),
             helper.make_node("Add", ["positive", "floor"], ["floored"]),
             helper.make_node("Log", ["floored"], ["logz"]),
             helper.make_node("ReduceMean", ["logz"], ["pooled"], axes=[-1], keepdims=0),
             helper.make_node("MatMul", ["pooled", "w"], ["logits"])]
    return _model(nodes, "head", [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 8])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])],
                  [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array(0.1, np.float32), "floor")])


def glued_project(root: Path) -> Project:
    root.mkdir(parents=True)
    for name in ("dodo.py", "socs", "toolchain"):
        (shutil.copytree if (EXAMPLES / name).is_dir() else shutil.copy2)(EXAMPLES / name, root / name)
    folder = root / "models" / "glued"
    (folder / "samples").mkdir(parents=True)
    onnx.save(embed_model(), str(folder / "embed.onnx"))
    onnx.save(head_model(), str(folder / "head.onnx"))
    rng = np.random.default_rng(2)
    (folder / "samples" / "x.bin").write_bytes((rng.standard_normal((6, 64)) * 0.15).astype("<f4").tobytes())
    (folder / "samples" / "z.bin").write_bytes(rng.uniform(1, 3, (6, 8, 8)).astype("<f4").tobytes())
    (folder / "model.yaml").write_text(MODEL_YAML)
    return Project(root)


def test_glue_is_applied_to_both_chains_and_verified(tmp_path):
    project = glued_project(tmp_path / "project")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    [record_file] = project.root.glob("build/glued/pipeline/*/SM8650/pipeline/pipeline.json")
    record = json.loads(record_file.read_text())
    assert record["status"] == "passed" and record["samples"] == 6 and record["checks"][0]["value"] == 1.0
    # the CPU chain's end is head(reshape(embed(x) / 10 + 2)), computed here from the ONNX files
    x = np.frombuffer(project.path("models/glued/samples/x.bin").read_bytes(), "<f4").reshape(6, 1, 64)
    embed = ort.InferenceSession(embed_model().SerializeToString(), providers=["CPUExecutionProvider"])
    head = ort.InferenceSession(head_model().SerializeToString(), providers=["CPUExecutionProvider"])
    expected = [head.run(None, {"z": (embed.run(None, {"x": s})[0].astype(np.float64) / 10 + 2)
                                .reshape(1, 8, 8).astype(np.float32)})[0] for s in x]
    with np.load(record["reference_file"] if Path(record["reference_file"]).is_absolute()
                 else project.path(record["reference_file"])) as reference:
        np.testing.assert_allclose(reference["logits"], np.stack(expected), rtol=1e-5, atol=1e-6)
    # without the + 2 most fed values would be negative and the Relu/Log would see another input
    assert not np.allclose(np.stack(expected), np.stack([head.run(None, {"z": embed.run(None, {"x": s})[0].reshape(
        1, 8, 8) / 10})[0] for s in x]), atol=1e-3)


@pytest.mark.parametrize("edit, fragments", [
    ("reshape: true, scale", ["pipeline: input 'z' of 'head' is [1, 8, 8], the output feeding it is [1, 64]",
                              "feed: {head.z: {from: <graph>.<output>, reshape: true}}"]),
    ("{from: embed.y, reshape: true,", ["pipeline.feed.head.z.from: required key is missing"], ),
    ("scale: 0.1", ["pipeline.feed.head.z.scale: expected a number, got 'tenth'"]),
    ("offset: 2.0", ["pipeline.feed.head.z.shift: unknown key", "use one of: from, offset, reshape, scale"]),
    ("z: {shape: [1, 8, 8]", [("pipeline.feed.head.z.reshape: input 'z' of 'head' [1, 8, 9] has 72 values, "
                              "the output feeding it [1, 64] 64"), "reshape only between tensors of one size"]),
])
def test_glue_spec_errors(tmp_path, edit, fragments):
    project = glued_project(tmp_path / "project")
    replacement = {"reshape: true, scale": "scale", "{from: embed.y, reshape: true,": "{reshape: true,",
                   "scale: 0.1": "scale: tenth", "offset: 2.0": "shift: 2.0",
                   "z: {shape: [1, 8, 8]": "z: {shape: [1, 8, 9]"}[edit]
    project.edit(YAML, edit, replacement)
    result = project.doit("list")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr  # that model is not buildable
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: {project.path(YAML)}: ") and "(fix: " in line, line
    for fragment in fragments:
        assert fragment in line, line
