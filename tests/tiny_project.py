"""A tiny packaged-ONNX project built in code: real stages, real simulator, seconds instead of minutes.

One graph (`tiny`: MatMul -> Relu -> MatMul on [1, 32, 64]), fed `samples` real random inputs,
built for the given chips. The fault and cluster tests use it where the point is a real stage call
(a real child process, a real Dask call), not the example models' numbers.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from conftest import Project, copy_project
from onnx import TensorProto, helper, numpy_helper

ROWS, DIM = 128, 256
MODEL_YAML = """\
licence: test fixture
source: {{file: tiny.onnx}}
graphs:
  tiny:
    inputs: {{x: {{shape: [1, {rows}, {dim}], dtype: float32}}}}
    outputs: {{y: {{shape: [1, {rows}, {dim}]}}}}
    samples: {{files: samples/x.npz}}
    socs: [{socs}]
"""


def tiny_model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    w1 = (rng.standard_normal((DIM, DIM)) / 8).astype(np.float32)
    w2 = (rng.standard_normal((DIM, DIM)) / 8).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, ROWS, DIM])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, ROWS, DIM])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def only_model(root: Path, name: str) -> tuple[Project, Path]:
    """A copy of the example project whose models are replaced by an empty `models/<name>/samples` folder."""
    project = copy_project(root)
    for model in project.root.glob("models/*"):
        shutil.rmtree(model)
    folder = project.path(f"models/{name}")
    (folder / "samples").mkdir(parents=True)
    return project, folder


def tiny_project(root: Path, socs: tuple[str, ...] = ("SM8650",), samples: int = 8) -> Project:
    """The example project with its models replaced by `tiny` (not built)."""
    project, folder = only_model(root, "tiny")
    onnx.save(tiny_model(), str(folder / "tiny.onnx"))
    rng = np.random.default_rng(8)
    np.savez(folder / "samples/x.npz", x=rng.standard_normal((samples, 1, ROWS, DIM)).astype(np.float32))
    (folder / "model.yaml").write_text(MODEL_YAML.format(rows=ROWS, dim=DIM, socs=", ".join(socs)))
    return project
