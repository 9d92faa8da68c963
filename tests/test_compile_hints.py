"""A compile failure that names a node lint flagged repeats lint's fix for it (issue 43, item 5): a w8a16 compile
refusing the Add of a -inf attention mask names `finite-mask`, the rewrite lint proposed for that very constant,
and the fix it names makes the compile pass."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tiny_project import only_model

from qnn_tasks.graphs.flagged import lint_fix_for

T, D = 16, 32
YAML = f"""licence: test fixture
source: {{file: masked.onnx}}
graphs:
  masked:
    inputs: {{x: {{shape: [1, {T}, {D}], dtype: float32}}}}
    outputs: {{y: {{shape: [1, {T}, {T}]}}}}
    samples: {{files: samples/x.npz}}
    precision: [w8a16]
    socs: [SM8650]
"""


def masked_attention() -> onnx.ModelProto:
    """Scores plus a causal mask of -inf, then Softmax: the shape exporters write."""
    rng = np.random.default_rng(0)
    mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)[None]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"], name="scores"),
             helper.make_node("Add", ["s", "mask"], ["m"], name="add_mask"),
             helper.make_node("Softmax", ["m"], ["y"], axis=-1, name="softmax")]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, T])],
                              [numpy_helper.from_array((rng.standard_normal((D, T)) / 4).astype(np.float32), "w"),
                               numpy_helper.from_array(mask, "mask")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def test_a_compile_refusing_a_flagged_mask_names_lints_fix_and_the_fix_compiles(tmp_path: Path) -> None:
    project, folder = only_model(tmp_path / "project", "masked")
    onnx.save(masked_attention(), str(folder / "masked.onnx"))
    np.savez(folder / "samples/x.npz", x=np.random.default_rng(1).standard_normal((32, 1, T, D)).astype(np.float32))
    (folder / "model.yaml").write_text(YAML)
    failed = project.doit("context")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    line = next(x for x in failed.stdout.splitlines() if x.startswith("context:masked-SM8650: compile of"))
    assert "node `add_mask`" in line  # QNN's own words
    assert "lint flagged constant 'mask' (min -inf), which node `add_mask` reads: [fp16-overflow-constant]" in line
    assert 'add "rewrites: [finite-mask]" to graphs.masked in models/masked/model.yaml' in line
    (folder / "model.yaml").write_text(YAML.replace("    socs:", "    rewrites: [finite-mask]\n    socs:"))
    fixed = project.doit("context")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_no_lint_record_or_no_matching_site_adds_nothing(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(masked_attention(), str(model))
    failure = "QNN.graphAddNode() failed for node `softmax` of type `Softmax`"
    assert lint_fix_for(failure, tmp_path / "absent.json", model) == ""
    record = tmp_path / "lint.json"
    record.write_text(json.dumps({"findings": [{"rule": "fp16-overflow-constant", "where": "constant 'mask' (min -inf)",
                                                "message": "overflows fp16", "fix": "rewrites: [finite-mask]"}]}))
    assert lint_fix_for(failure, record, model) == ""  # softmax reads m, which no lint finding names
    said = lint_fix_for(failure.replace("softmax", "add_mask"), record, model)
    assert said == ("; lint flagged constant 'mask' (min -inf), which node `add_mask` reads: [fp16-overflow-constant] "
                    "overflows fp16 (fix: rewrites: [finite-mask])")
