"""A packaged ONNX with the NPU-porting hazards users met, built in code; and a YAML-only model folder for it.

`hazards.onnx` (opset 17) has dynamic dims (batch, time), int64 I/O, and:
  * a LayerNorm whose variance is E[x^2] - E[x]^2 (Pow for E[x]^2): cancels in fp16     -> centred-variance
  * ReduceSumSquare (an energy normalisation): falls back to CPU                        -> reduce-sum-square
  * Clip with a computed max (half the peak): falls back to CPU                         -> clip-computed
  * If(mode == 1) on an int64 `mode` input: control flow                                -> constant_inputs + fold-if
  * a -inf seeding a running Max: harmless, must not be flagged or rewritten
Inputs: x float [batch, time, 64] (around 30: where fp16 cancels), ids int64 [batch, time].
Outputs: y float [batch, time, 64], next_ids int64 [batch, time] (= ids + 1).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DIM, VOCAB, TIME = 64, 100, 16
MODEL_YAML = """\
# Written by tests/test_packaged.py: a packaged ONNX ported with YAML only (no export.py).
licence: test fixture
source: {{file: hazards.onnx}}
graphs:
  hazards:
    inputs:
      x: {{shape: [1, {time}, {dim}], dtype: float32}}
      ids: {{shape: [1, {time}], dtype: int32}}
    outputs:
      y: {{shape: [1, {time}, {dim}]}}
      next_ids: {{shape: [1, {time}], dtype: int32}}
    constant_inputs: {{mode: 1}}
    rewrites: {rewrites}
    samples: {{files: "samples/*.npz"}}
    socs: [SM8650, SM8750]
"""
ALL_REWRITES = "[fold-if, centred-variance, reduce-sum-square, clip-computed]"


def hazards_model() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    F, I64 = TensorProto.FLOAT, TensorProto.INT64

    def c(name, value, dtype=np.float32):
        return numpy_helper.from_array(np.asarray(value, dtype), name)

    then_g = helper.make_graph([helper.make_node("Relu", ["clipped"], ["then_y"])], "mode1", [],
                               [helper.make_tensor_value_info("then_y", F, None)])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["clipped"], ["else_y"])], "mode0", [],
                               [helper.make_tensor_value_info("else_y", F, None)])
    nodes = [
        helper.make_node("Gather", ["embedding", "ids"], ["e"], name="embed"),
        helper.make_node("Add", ["x", "e"], ["h"]),
        # LayerNorm, variance as E[h^2] - E[h]^2
        helper.make_node("ReduceMean", ["h"], ["mean"], axes=[-1], keepdims=1, name="mean"),
        helper.make_node("Mul", ["h", "h"], ["h2"]),
        helper.make_node("ReduceMean", ["h2"], ["mean_h2"], axes=[-1], keepdims=1),
        helper.make_node("Pow", ["mean", "two"], ["mean_sq"]),
        helper.make_node("Sub", ["mean_h2", "mean_sq"], ["var"], name="layernorm_variance"),
        helper.make_node("Add", ["var", "eps"], ["var_eps"]),
        helper.make_node("Sqrt", ["var_eps"], ["std"]),
        helper.make_node("Reciprocal", ["std"], ["inv_std"]),
        helper.make_node("Sub", ["h", "mean"], ["centred"]),
        helper.make_node("Mul", ["centred", "inv_std"], ["normed"]),
        helper.make_node("Mul", ["normed", "gamma"], ["scaled"]),
        # energy normalisation with ReduceSumSquare (axes as an attribute at opset 17)
        helper.make_node("ReduceSumSquare", ["scaled"], ["energy"], axes=[-1], keepdims=1, name="energy"),
        helper.make_node("Sqrt", ["energy"], ["norm"]),
        helper.make_node("Div", ["scaled", "norm"], ["unit"]),
        # Clip at half the peak: a computed max
        helper.make_node("ReduceMax", ["unit"], ["peak"], keepdims=0),
        helper.make_node("Mul", ["peak", "half"], ["limit"]),
        helper.make_node("Clip", ["unit", "floor", "limit"], ["clipped"], name="clip_at_half_peak"),
        # a branch on a mode input the deployment fixes
        helper.make_node("Equal", ["mode", "one_i"], ["is_mode1"]),
        helper.make_node("If", ["is_mode1"], ["branch"], name="mode_branch", then_branch=then_g, else_branch=else_g),
        # -inf seeding a running maximum: fine in fp16
        helper.make_node("Max", ["branch", "max_start"], ["y"], name="running_max"),
        helper.make_node("Add", ["ids", "one_i"], ["next_ids"]),
    ]
    graph = helper.make_graph(
        nodes, "hazards",
        [helper.make_tensor_value_info("x", F, ["batch", "time", DIM]),
         helper.make_tensor_value_info("ids", I64, ["batch", "time"]),
         helper.make_tensor_value_info("mode", I64, [])],
        [helper.make_tensor_value_info("y", F, ["batch", "time", DIM]),
         helper.make_tensor_value_info("next_ids", I64, ["batch", "time"])],
        [c("embedding", rng.standard_normal((VOCAB, DIM)) * 0.1), c("gamma", 1 + 0.1 * rng.standard_normal(DIM)),
         c("two", 2.0), c("eps", 1e-5), c("half", 0.5), c("floor", -0.05), c("one_i", 1, np.int64),
         c("max_start", -np.inf)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def write_samples(folder: Path) -> None:
    """Real-looking inputs: activations around 30 (a DC offset, the fp16 cancellation case), token ids.

    ids are saved as int64 (numpy's default: the loader casts them to the declared int32).
    One file stacks 3 samples, one holds a single sample.
    """
    rng = np.random.default_rng(2)
    folder.mkdir(parents=True, exist_ok=True)
    stacked = {"x": (30 + 0.5 * rng.standard_normal((3, 1, TIME, DIM))).astype(np.float32),
               "ids": rng.integers(0, VOCAB, (3, 1, TIME))}
    np.savez(folder / "a_stacked.npz", **stacked)
    np.savez(folder / "b_single.npz", x=(25 + 0.3 * rng.standard_normal((1, TIME, DIM))).astype(np.float32),
             ids=rng.integers(0, VOCAB, (1, TIME)))


def write_model_folder(folder: Path, rewrites: str = ALL_REWRITES) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(hazards_model(), str(folder / "hazards.onnx"))
    write_samples(folder / "samples")
    (folder / "model.yaml").write_text(MODEL_YAML.format(time=TIME, dim=DIM, rewrites=rewrites))
