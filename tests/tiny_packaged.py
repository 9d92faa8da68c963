"""A small real ONNX (Conv + Relu + Conv, dynamic batch) and a YAML-only model folder for it.

Used where the point is the project around a model (an installed wheel, QNN error messages), not the model:
it compiles in a fraction of a second and one simulated run takes well under a second.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODEL_YAML = """\
# A packaged ONNX ported with YAML only (no export.py): see README "Adding a packaged ONNX model".
licence: test fixture
source: {{file: tiny.onnx}}
graphs:
  {graph}:
    inputs:
      x: {{shape: [1, 8, 16, 16], dtype: float32}}    # the ONNX says [batch, 8, 16, 16]: fixed here
    outputs:
      y: {{shape: [1, 8, 16, 16]}}
    samples: {{files: "samples/*.npz"}}
{extra}"""


def tiny_model(batch: int | str = "batch") -> onnx.ModelProto:
    """Dynamic batch by default, as packaged ONNX files often are (the export fixes it); batch=1 to compile as is."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((8, 8, 1, 1)) * 0.2).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r"]),
         helper.make_node("Conv", ["r", "w2"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8, 16, 16])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def write_model(model_dir: Path, graph: str = "tiny", extra: str = "", samples: int = 3) -> Path:
    """models/<name>/: tiny.onnx, samples/inputs.npz (a stack of `samples` inputs) and model.yaml."""
    (model_dir / "samples").mkdir(parents=True, exist_ok=True)
    onnx.save(tiny_model(), str(model_dir / "tiny.onnx"))
    rng = np.random.default_rng(3)
    np.savez(model_dir / "samples" / "inputs.npz", x=rng.standard_normal((samples, 1, 8, 16, 16)).astype(np.float32))
    (model_dir / "model.yaml").write_text(MODEL_YAML.format(graph=graph, extra=extra))
    return model_dir
