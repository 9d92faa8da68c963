"""The built-in rewrites (qnn_tasks/rewrites) on small models built in code: real onnx and onnxruntime.

Each rewrite: how many sites it changed, the op types it wrote, the CPU outputs before and after
(equal, or within float rounding), and what lint says about the same hazard (it names the
rewrite with the model.yaml line to add). Also: the packaged-ONNX boundary (static dims, int32
casts, constant inputs), the catalogue's option validation and the static onnxsim pass list.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qnn_tasks import rewrites
from qnn_tasks.graphs.lintrules import find_problems
from qnn_tasks.modelspec import specport
from qnn_tasks.modelspec.project import GraphSpec, Source, TensorSpec
from qnn_tasks.rewrites import boundary, foldif

F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
RNG = np.random.default_rng(0)


def model_of(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def tensor(name, dtype=F, shape=(1, 8, 16)):
    return helper.make_tensor_value_info(name, dtype, list(shape) if shape is not None else None)


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def run(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


def rewritten(model, name, **options):
    """(sites, the model after `name` alone) on a copy; the original stays as it was."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    report = rewrites.apply(copy, {name: options})
    onnx.checker.check_model(copy, full_check=True)
    assert [r["name"] for r in report] == [name]
    assert report[0]["count"] == len(report[0]["sites"])
    return report[0]["sites"], copy


def assert_same_outputs(before, after, feeds, rtol=0.0, atol=0.0):
    for a, b in zip(run(before, feeds), run(after, feeds)):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)


def x_feeds(shape=(1, 8, 16), loc=0.0, scale=1.0):
    return {"x": (loc + scale * RNG.standard_normal(shape)).astype(np.float32)}


def graph_spec(rewrite_names=(), model="m", name="g") -> GraphSpec:
    return GraphSpec(name=name, model=model, model_dir=Path("models") / model, inputs=(TensorSpec("x", (1, 8, 16), "float32"),),
                     outputs=(TensorSpec("y", (1, 8, 16), "float32"),), precisions=("fp16",), socs=None, export="export",
                     options={}, verify={}, allow_cpu_fallback=False,
                     source=Source(None, "m.onnx", None), rewrites=rewrites.normalize(list(rewrite_names)))


def lint_lines(model, rule, graph=None) -> list[str]:
    return [f.line() for f in find_problems(model, graph or graph_spec()) if f.rule == rule]


# ================================================================ pow-square

def pow_model():
    nodes = [helper.make_node("Pow", ["x", "two"], ["a"], name="square_init"),
             helper.make_node("Constant", [], ["two_c"], value=const("", 2.0)),
             helper.make_node("Pow", ["a", "two_c"], ["b"], name="square_const"),
             helper.make_node("Pow", ["b", "three"], ["y"], name="cube")]  # not a square: left alone
    return model_of(nodes, [tensor("x")], [tensor("y")], [const("two", 2.0), const("three", 3.0)])


def test_pow_square():
    model = pow_model()
    sites, after = rewritten(model, "pow-square")
    assert sites == ["square_init", "square_const"]
    assert ops(after) == ["Mul", "Mul", "Pow"]
    assert [n.name for n in after.graph.node][:2] == ["square_init_as_mul", "square_const_as_mul"]
    assert "two" not in {t.name for t in after.graph.initializer}  # its exponent is dead and removed
    assert_same_outputs(model, after, x_feeds(scale=0.5), rtol=1e-6)


def test_lint_pow_square_names_the_rewrite():
    lines = lint_lines(pow_model(), "pow-square")
    assert len(lines) == 2
    assert all('add "rewrites: [pow-square]" to graphs.g in models/m/model.yaml' in line for line in lines)
    assert all("Mul(x, x)" in line and "matters for accuracy" in line for line in lines)


# ================================================================ reduce-sum-square

@pytest.mark.parametrize("opset", [11, 13, 17, 18])
def test_reduce_sum_square_axes_attribute_or_input(opset):
    """Axes are an attribute of ReduceSumSquare before opset 18 and of ReduceSum before 13; inputs after."""
    inits = [const("axes", [2], np.int64)] if opset >= 18 else []
    rss = (helper.make_node("ReduceSumSquare", ["x", "axes"], ["y"], keepdims=1, name="energy") if opset >= 18 else
           helper.make_node("ReduceSumSquare", ["x"], ["y"], axes=[2], keepdims=1, name="energy"))
    model = model_of([rss], [tensor("x")], [tensor("y", shape=(1, 8, 1))], inits, opset)
    sites, after = rewritten(model, "reduce-sum-square")
    assert sites == ["energy"] and ops(after) == ["Mul", "ReduceSum"]
    reduce_sum = after.graph.node[1]
    has_axes_input = len(reduce_sum.input) == 2
    assert has_axes_input == (opset >= 13)
    assert any(a.name == "axes" for a in reduce_sum.attribute) == (opset < 13)
    assert_same_outputs(model, after, x_feeds(loc=3.0), rtol=1e-6)


def test_reduce_sum_square_over_all_axes_keepdims_0():
    model = model_of([helper.make_node("ReduceSumSquare", ["x"], ["y"], keepdims=0)], [tensor("x")], [tensor("y", shape=())])
    sites, after = rewritten(model, "reduce-sum-square")
    assert len(sites) == 1 and ops(after) == ["Mul", "ReduceSum"]
    assert_same_outputs(model, after, x_feeds(), rtol=1e-6)


def test_lint_reduce_sum_square():
    model = model_of([helper.make_node("ReduceSumSquare", ["x"], ["y"], axes=[2], keepdims=1, name="energy")],
                     [tensor("x")], [tensor("y", shape=(1, 8, 1))])
    [line] = lint_lines(model, "reduce-sum-square")
    assert "ReduceSumSquare node 'energy'" in line and "matters for speed" in line
    assert 'add "rewrites: [reduce-sum-square]" to graphs.g in models/m/model.yaml' in line


# ================================================================ clip-computed

def clip_model():
    nodes = [helper.make_node("ReduceMax", ["x"], ["peak"], keepdims=0),
             helper.make_node("Mul", ["peak", "half"], ["limit"]),
             helper.make_node("Clip", ["x", "zero", "limit"], ["a"], name="computed_max"),
             helper.make_node("Clip", ["a", "", "limit"], ["b"], name="computed_max_no_min"),
             helper.make_node("Clip", ["b", "low", "high"], ["y"], name="constant_bounds")]  # runs on HTP as is
    return model_of(nodes, [tensor("x")], [tensor("y")],
                    [const("half", 0.5), const("zero", 0.0), const("low", -0.25), const("high", 0.75)])


def test_clip_computed():
    model = clip_model()
    sites, after = rewritten(model, "clip-computed")
    assert sites == ["computed_max", "computed_max_no_min"]
    assert ops(after) == ["ReduceMax", "Mul", "Max", "Min", "Min", "Clip"]
    assert_same_outputs(model, after, x_feeds())


def test_clip_with_bounds_computed_from_constants_only_is_left_alone():
    nodes = [helper.make_node("Neg", ["high"], ["low"]), helper.make_node("Clip", ["x", "low", "high"], ["y"])]
    model = model_of(nodes, [tensor("x")], [tensor("y")], [const("high", 0.5)])
    sites, _ = rewritten(model, "clip-computed")
    assert sites == []


def test_lint_clip_computed():
    lines = lint_lines(clip_model(), "clip-computed")
    assert len(lines) == 2 and all('"rewrites: [clip-computed]"' in line for line in lines)
    assert all("matters for speed" in line for line in lines)


# ================================================================ centred-variance

def layer_norm(square="mul", mean_square="mul", keepdims=1, opset=18):
    """LayerNorm over the last axis with variance = E[x^2] - E[x]^2 (squares as Mul or Pow)."""
    axes = [const("axes", [-1], np.int64)] if opset >= 18 else []
    kwargs = {} if opset >= 18 else {"axes": [-1]}
    reduce_inputs = (lambda name: [name, "axes"]) if opset >= 18 else (lambda name: [name])
    sq = (helper.make_node("Mul", ["x", "x"], ["x2"]) if square == "mul" else helper.make_node("Pow", ["x", "two"], ["x2"]))
    msq = (helper.make_node("Mul", ["mean", "mean"], ["m2"]) if mean_square == "mul"
           else helper.make_node("Pow", ["mean", "two"], ["m2"]))
    nodes = [helper.make_node("ReduceMean", reduce_inputs("x"), ["mean"], keepdims=keepdims, **kwargs), sq,
             helper.make_node("ReduceMean", reduce_inputs("x2"), ["ex2"], keepdims=keepdims, **kwargs), msq,
             helper.make_node("Sub", ["ex2", "m2"], ["var"], name="variance"),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Reciprocal", ["sd"], ["inv"])]
    if keepdims:
        nodes += [helper.make_node("Sub", ["x", "mean"], ["d"]), helper.make_node("Mul", ["d", "inv"], ["y"])]
        out = tensor("y")
    else:
        nodes += [helper.make_node("Identity", ["inv"], ["y"])]
        out = tensor("y", shape=(1, 8))
    return model_of(nodes, [tensor("x")], [out], axes + [const("eps", 1e-5), const("two", 2.0)], opset)


@pytest.mark.parametrize("square, mean_square", [("mul", "mul"), ("pow", "pow"), ("mul", "pow")])
@pytest.mark.parametrize("opset", [17, 18])
def test_centred_variance(square, mean_square, opset):
    model = layer_norm(square, mean_square, opset=opset)
    sites, after = rewritten(model, "centred-variance")
    assert sites == ["variance"]
    assert "Pow" not in ops(after)  # both squares are gone with the old variance
    new = next(n for n in after.graph.node if n.output[0] == "var")
    assert new.op_type == "ReduceMean" and new.name == "variance_as_centred_variance"
    producer = {o: n for n in after.graph.node for o in n.output}
    centred = producer[new.input[0]]  # Mul(d, d) with d = Sub(x, mean)
    assert centred.op_type == "Mul" and producer[centred.input[0]].op_type == "Sub"
    assert list(producer[centred.input[0]].input) == ["x", "mean"]
    # fp32: both formulas agree to rounding when the mean is small against the spread
    assert_same_outputs(model, after, x_feeds(loc=0.5), rtol=1e-4, atol=1e-4)


def test_centred_variance_without_kept_dims_adds_a_kept_mean():
    model = layer_norm(keepdims=0)
    sites, after = rewritten(model, "centred-variance")
    assert sites == ["variance"]
    kept = next(n for n in after.graph.node if n.name == "variance_mean_kept")
    assert kept.op_type == "ReduceMean" and helper.get_attribute_value(kept.attribute[0]) == 1
    feeds = {"x": (0.5 + np.random.default_rng(7).standard_normal((1, 8, 16))).astype(np.float32)}  # RNG kept for others
    assert_same_outputs(model, after, feeds, rtol=1e-4, atol=1e-4)


def test_centred_variance_is_more_exact_in_low_precision():
    """The reason for the rewrite: with a large mean, E[x^2] - E[x]^2 cancels (here in fp32 at a mean of 3000;
    fp16 on HTP cancels already at 30: cosine 0.71 vs 0.99991 on the simulator, see README)."""
    model = layer_norm()
    _, after = rewritten(model, "centred-variance")
    feeds = x_feeds(loc=3000.0, scale=0.5)
    exact = feeds["x"].astype(np.float64)
    exact = (exact - exact.mean(-1, keepdims=True)) / np.sqrt(exact.var(-1, keepdims=True) + 1e-5)
    err_raw = np.abs(run(model, feeds)[0] - exact).max()
    err_centred = np.abs(run(after, feeds)[0] - exact).max()
    # the raw form's variance may cancel below zero: sqrt gives NaN, the worst error (which samples do depends on RNG)
    assert err_centred < 0.01 and not err_raw <= 0.01


def test_lint_variance_cancellation():
    [line] = lint_lines(layer_norm(), "variance-cancellation")
    assert "Sub node 'variance'" in line and "matters for accuracy" in line
    assert 'add "rewrites: [centred-variance]" to graphs.g in models/m/model.yaml' in line


# ================================================================ neg

def test_neg_float_and_int():
    nodes = [helper.make_node("Neg", ["x"], ["y"], name="flip"), helper.make_node("Neg", ["i"], ["j"], name="flip_ids")]
    model = model_of(nodes, [tensor("x"), tensor("i", I32, (1, 8))], [tensor("y"), tensor("j", I32, (1, 8))])
    sites, after = rewritten(model, "neg")
    assert sites == ["flip", "flip_ids"] and ops(after) == ["Sub", "Sub"]
    zeros = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
    assert {a.dtype.name for a in zeros.values()} == {"float32", "int32"} and all(not a.any() for a in zeros.values())
    feeds = {**x_feeds(), "i": RNG.integers(-5, 5, (1, 8)).astype(np.int32)}
    assert_same_outputs(model, after, feeds)
    [line] = lint_lines(model, "neg")[:1]
    assert '"rewrites: [neg]"' in line and "matters for compatibility" in line


# ================================================================ finite-mask

def mask_model():
    """Three masks below fp16's range (an initializer, a Constant node, a ConstantOfShape) and one -inf seeding a Max."""
    mask = np.zeros((1, 1, 16), np.float32)
    mask[..., 10:] = -np.inf
    nodes = [helper.make_node("Add", ["x", "mask"], ["a"]),
             helper.make_node("Constant", [], ["fmin"], value=const("", np.finfo(np.float32).min)),
             helper.make_node("Where", ["keep", "a", "fmin"], ["b"]),
             helper.make_node("ConstantOfShape", ["shape"], ["fill"], value=const("", [-np.inf])),
             helper.make_node("Where", ["keep", "b", "fill"], ["c"]),
             helper.make_node("Softmax", ["c"], ["s"], axis=-1),
             helper.make_node("Max", ["s", "running_max_start"], ["y"])]
    keep = np.ones((1, 1, 16), bool)
    keep[..., 12:] = False
    return model_of(nodes, [tensor("x")], [tensor("y")],
                    [numpy_helper.from_array(mask, "mask"), numpy_helper.from_array(keep, "keep"),
                     const("shape", [1, 8, 16], np.int64), const("running_max_start", -np.inf)])


def test_finite_mask():
    model = mask_model()
    sites, after = rewritten(model, "finite-mask")
    assert sites == ["mask", "fmin", "fill"]  # not running_max_start: it only seeds a Max
    constants = {t.name: numpy_helper.to_array(t) for t in after.graph.initializer}
    assert constants["mask"].min() == -1e4 and np.isinf(constants["running_max_start"])
    assert_same_outputs(model, after, x_feeds())  # exp(-1e4 - max) is 0 in fp32 too


def test_finite_mask_value_option():
    sites, after = rewritten(mask_model(), "finite-mask", value=-3e4)
    assert len(sites) == 3
    assert numpy_helper.to_array(next(t for t in after.graph.initializer if t.name == "mask")).min() == -3e4


def test_lint_fp16_overflow_constant_not_for_a_max_seed():
    lines = lint_lines(mask_model(), "fp16-overflow-constant")
    assert sorted(line.split("'")[1] for line in lines) == ["fill", "fmin", "mask"]
    assert not any("running_max_start" in line for line in lines)
    assert all('"rewrites: [finite-mask]"' in line and "matters for accuracy" in line for line in lines)


# ================================================================ fold-if

def sample_rate_model():
    """Like the Silero VAD: If(Equal(Gather(Reshape(sr)), 16000)) picks a branch; sr is an int64 input."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t_out"]),
                                helper.make_node("Mul", ["t_out", "w16k"], ["t_y"])], "then", [], [tensor("t_y")],
                               [const("w16k", 2.0)])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["e_y"])], "else", [], [tensor("e_y")])
    nodes = [helper.make_node("Reshape", ["sr", "flat"], ["sr1"]), helper.make_node("Gather", ["sr1", "first"], ["sr0"]),
             helper.make_node("Equal", ["sr0", "rate"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], name="rate_branch", then_branch=then_g, else_branch=else_g)]
    return model_of(nodes, [tensor("x", shape=("batch", 8, 16)), tensor("sr", I64, ())], [tensor("y", shape=("batch", 8, 16))],
                    [const("flat", [-1], np.int64), const("first", 0, np.int64), const("rate", 16000, np.int64)])


def test_fold_if_with_a_constant_input():
    model = sample_rate_model()
    [condition] = foldif.conditions(model)
    assert condition.value is None and condition.blockers == ["sr"]  # lint says: fix sr, then fold-if
    feeds = x_feeds()
    before = run(model, {**feeds, "sr": np.array(16000, np.int64)})
    boundary.fix_io(model, [TensorSpec("x", (1, 8, 16), "float32")], [TensorSpec("y", (1, 8, 16), "float32")],
                    {"sr": 16000})
    sites, after = rewritten(model, "fold-if")
    assert sites == ["rate_branch (then)"]
    assert ops(after) == ["Relu", "Mul"]  # the condition's Reshape/Gather/Equal are gone too
    assert {t.name for t in after.graph.initializer} == {"w16k"}
    np.testing.assert_array_equal(run(after, feeds)[0], before[0])


def test_fold_if_on_a_shape_once_dims_are_fixed_and_nested():
    """If(Shape(x)[1] == 8): constant only once the dims are static; its taken branch holds another If."""
    inner_then = helper.make_graph([helper.make_node("Relu", ["x"], ["it"])], "inner_then", [], [tensor("it")])
    inner_else = helper.make_graph([helper.make_node("Abs", ["x"], ["ie"])], "inner_else", [], [tensor("ie")])
    outer_then = helper.make_graph(
        [helper.make_node("If", ["flag"], ["inner"], name="inner_branch", then_branch=inner_then, else_branch=inner_else),
         helper.make_node("Add", ["inner", "one"], ["ot"])], "outer_then", [], [tensor("ot")])
    outer_else = helper.make_graph([helper.make_node("Identity", ["x"], ["oe"])], "outer_else", [], [tensor("oe")])
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "one_i"], ["frames"]),
             helper.make_node("Equal", ["frames", "eight"], ["is8"]),
             helper.make_node("If", ["is8"], ["y"], name="length_branch", then_branch=outer_then, else_branch=outer_else)]
    model = model_of(nodes, [tensor("x", shape=(1, "frames", 16))], [tensor("y", shape=(1, "frames", 16))],
                     [const("one_i", 1, np.int64), const("eight", 8, np.int64), const("one", 1.0),
                      numpy_helper.from_array(np.array(False), "flag")])
    assert rewrites.find(model, ["fold-if"]) == {"fold-if": []}  # a dynamic dim: not a constant yet
    feeds = x_feeds()
    before = run(model, feeds)
    boundary.fix_io(model, [TensorSpec("x", (1, 8, 16), "float32")], [TensorSpec("y", (1, 8, 16), "float32")])
    sites, after = rewritten(model, "fold-if")
    assert sites == ["length_branch (then)", "inner_branch (else)"]
    assert ops(after) == ["Abs", "Add"]
    np.testing.assert_array_equal(run(after, feeds)[0], before[0])


def test_fold_if_branch_output_also_read_inside_the_branch():
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["s"])],
                               "then", [], [tensor("r"), tensor("s")])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Abs", ["i"], ["j"])],
                               "else", [], [tensor("i"), tensor("j")])
    model = model_of([helper.make_node("If", ["flag"], ["y", "z"], name="branch", then_branch=then_g, else_branch=else_g)],
                     [tensor("x")], [tensor("y"), tensor("z")], [numpy_helper.from_array(np.array([True]), "flag")])
    feeds = x_feeds()
    sites, after = rewritten(model, "fold-if")
    assert sites == ["branch (then)"] and ops(after) == ["Relu", "Add"]
    for a, b in zip(run(after, feeds), run(model, feeds)):
        np.testing.assert_array_equal(a, b)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([False]), "flag"))
    sites, after = rewritten(model, "fold-if")
    assert sites == ["branch (else)"] and ops(after) == ["Identity", "Abs"]
    for a, b in zip(run(after, feeds), run(model, feeds)):
        np.testing.assert_array_equal(a, b)


def test_lint_control_flow_names_fold_if_and_constant_inputs():
    model = sample_rate_model()
    [line] = [f.line() for f in find_problems(model, graph_spec()) if f.rule == "control-flow"]
    assert '"constant_inputs: {sr: <value>}"' in line and '"rewrites: [fold-if]"' in line
    boundary.fix_io(model, [TensorSpec("x", (1, 8, 16), "float32")], [TensorSpec("y", (1, 8, 16), "float32")],
                    {"sr": 8000})
    [line] = [f.line() for f in find_problems(model, graph_spec()) if f.rule == "control-flow"]
    assert 'add "rewrites: [fold-if]" to graphs.g in models/m/model.yaml to constant-fold the condition' in line


# ================================================================ the packaged-ONNX boundary

def test_fix_io_static_dims_int32_casts_and_order():
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Add", ["x", "e"], ["y"]),
             helper.make_node("Add", ["ids", "one"], ["next_ids"])]
    model = model_of(nodes, [tensor("ids", I64, ("batch", "time")), tensor("x", F, ("batch", "time", 4))],
                     [tensor("y", F, ("batch", "time", 4)), tensor("next_ids", I64, ("batch", "time"))],
                     [const("table", RNG.standard_normal((10, 4))), const("one", 1, np.int64)])
    ids = RNG.integers(0, 10, (1, 6))
    x = RNG.standard_normal((1, 6, 4)).astype(np.float32)
    before = run(model, {"ids": ids.astype(np.int64), "x": x})
    report = boundary.fix_io(model, [TensorSpec("x", (1, 6, 4), "float32"), TensorSpec("ids", (1, 6), "int32")],
                             [TensorSpec("y", (1, 6, 4), "float32"), TensorSpec("next_ids", (1, 6), "float32")])
    onnx.checker.check_model(model, full_check=True)
    io = [(v.name, v.type.tensor_type.elem_type, [d.dim_value for d in v.type.tensor_type.shape.dim])
          for v in list(model.graph.input) + list(model.graph.output)]
    assert io == [("x", F, [1, 6, 4]), ("ids", I32, [1, 6]), ("y", F, [1, 6, 4]), ("next_ids", I32, [1, 6])]
    assert report["casts"] == ["input 'ids': int32 -> int64", "output 'next_ids': int64 -> int32"]
    assert report["dims"]["input 'x'"] == {"onnx": ["batch", "time", 4], "declared": [1, 6, 4]}
    after = run(model, {"x": x, "ids": ids.astype(np.int32)})
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1].astype(np.int32))


@pytest.mark.parametrize("inputs, outputs, constants, problem", [
    ([("x", (1, 8, 16), "float32")], [("y", (1, 8, 16), "float32")], {}, "input 'sr' of the ONNX is not declared"),
    ([("x", (1, 8, 16), "float32")], [("y", (1, 8, 16), "float32")], {"rate": 1}, "constant input 'rate' is not an input"),
    ([("x", (1, 8), "float32")], [("y", (1, 8, 16), "float32")], {"sr": 1}, "input 'x' has rank 3 in the ONNX"),
    ([("x", (1, 9, 16), "float32")], [("y", (1, 9, 16), "float32")], {"sr": 1}, "input 'x' is ['batch', 8, 16] in the ONNX"),
    ([("x", (1, 8, 16), "float16")], [("y", (1, 8, 16), "float32")], {"sr": 1}, "input 'x' is float32 in the ONNX"),
    ([("x", (1, 8, 16), "float32")], [("z", (1, 8, 16), "float32")], {"sr": 1}, "output 'y' of the ONNX is not declared"),
])
def test_fix_io_mismatches_are_one_line(inputs, outputs, constants, problem):
    with pytest.raises(boundary.BoundaryError) as info:
        boundary.fix_io(sample_rate_model(), [TensorSpec(*t) for t in inputs], [TensorSpec(*t) for t in outputs], constants)
    assert problem in str(info.value) and "\n" not in str(info.value)


# ================================================================ the catalogue

def test_apply_runs_in_catalogue_order_whatever_the_declared_order():
    model = layer_norm("pow", "pow")
    report = rewrites.apply(model, ["pow-square", "centred-variance"])
    # centred-variance first: it consumes the Pow squares of its pattern, pow-square finds none left
    assert [(r["name"], r["count"]) for r in report] == [("centred-variance", 1), ("pow-square", 0)]


@pytest.mark.parametrize("declared, problem", [
    (["pow-squared"], "unknown rewrite 'pow-squared'; known rewrites: fold-if, if-to-where, centred-variance, pow-square"),
    (["neg", "neg"], "declared twice"),
    ([{"finite-mask": {"value": float("-inf")}}], "finite-mask value must be a negative number >= -65504"),
    ([{"finite-mask": {"valu": -1.0}}], "unknown option 'valu'"),
    ([{"neg": {"value": -1.0}}], "unknown option 'value' for rewrite 'neg'"),
    ("neg", "expected a list of rewrite names or a mapping"),
    ([["neg"]], "neither a rewrite name"),
])
def test_normalize_rejects(declared, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        rewrites.normalize(declared)


def test_normalize_forms():
    assert rewrites.normalize(["neg", {"finite-mask": {"value": -2e4}}]) == {"neg": {}, "finite-mask": {"value": -2e4}}
    assert rewrites.normalize({"pow-square": None, "finite-mask": {}}) == {"pow-square": {}, "finite-mask": {"value": -1e4}}


def test_every_catalogue_entry_has_its_function():
    for name in rewrites.NAMES:
        assert callable(rewrites.function(name))


def test_onnxsim_optimizer_list_matches_the_installed_onnxsim():
    """specport's static list (spec loading imports no onnxsim) == what the installed onnxsim runs by default."""
    import onnxsim
    import onnxsim.onnxsim_cpp2py_export as C

    model = model_of([helper.make_node("Relu", ["x"], ["y"])], [tensor("x")], [tensor("y")])
    onnxsim.simplify(model)  # registers onnxsim's own passes in onnxoptimizer's registry
    installed = set(C._list_optimizers())
    # onnxsim adds the batched MatMul+Add -> Gemm rewrite to that registry's default set by name
    assert set(specport.ONNXSIM_OPTIMIZERS) == installed | {BATCHED_GEMM}
    try:
        import onnxoptimizer
    except ImportError:  # onnxsim vendors onnxoptimizer; the standalone package is optional
        return
    assert set(onnxoptimizer.get_fuse_and_elimination_passes()) <= installed


BATCHED_GEMM = "fuse_matmul_add_bias_into_gemm_batched"


def test_skipping_the_batched_gemm_fusion_keeps_matmul_add():
    """The one default pass not in onnxoptimizer's list is real: skipping it keeps a rank-3 MatMul + Add."""
    import onnxsim

    weight, bias = const("w", np.ones((16, 16))), const("b", np.ones(16))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    model = model_of(nodes, [tensor("x")], [tensor("y")], [weight, bias])
    fused, _ = onnxsim.simplify(model)
    kept, _ = onnxsim.simplify(model, skipped_optimizers=[BATCHED_GEMM])
    assert "Gemm" in {n.op_type for n in fused.graph.node}
    assert [n.op_type for n in kept.graph.node] == ["MatMul", "Add"]


# ================================================================ every hint is YAML the spec loader reads

GRAPH_KEYS = ("rewrites", "constant_inputs", "simplify", "lint")


def yaml_snippets(text: str) -> list[str]:
    """The model.yaml text a message tells the user to write: `<key>: [...]`/`{...}` (brackets balanced), and the
    entry of `add <entry> to graphs.g.rewrites` (as a list of its own)."""
    import re

    found = []
    for match in re.finditer(rf"\b({'|'.join(GRAPH_KEYS)}): ([\[{{])", text):
        depth, end = 0, match.start(2)
        for end in range(match.start(2), len(text)):
            depth += (text[end] in "[{") - (text[end] in "]}")
            if depth == 0:
                break
        assert depth == 0, f"unbalanced hint in: {text}"
        found.append(text[match.start():end + 1])
    found += [f"rewrites: [{m.group(1)}]" for m in re.finditer(r"(?:add|set \S+ to) (\S.*?) (?:to|in) graphs\.\w+\.rewrites",
                                                                text)]
    return found


def every_hint() -> list[str]:
    """The fix text of every message that suggests a model.yaml line: lint on a model with each hazard (without and
    with other rewrites declared), the spec error for a bad rewrite, diagnose's scale-input advice, scale-input's own
    refusal, and the CPU-fallback hints."""
    from test_if_to_where import classifier
    from test_scale_input import audio, cpu_tensors, power_spectrum

    from qnn_tasks.errors import RewriteError
    from qnn_tasks.stages.diagnose import advise_scale_input, hazards
    from qnn_tasks.toolchains.ort_qnn import FALLBACK_HINTS

    hazardous = [pow_model(), clip_model(), layer_norm(), mask_model(), sample_rate_model(), classifier(),
                 model_of([helper.make_node("Neg", ["x"], ["y"], name="flip")], [tensor("x")], [tensor("y")]),
                 model_of([helper.make_node("ReduceSumSquare", ["x"], ["y"], axes=[2], keepdims=1)], [tensor("x")],
                          [tensor("y", shape=(1, 8, 1))]),
                 model_of([helper.make_node("Erf", ["x"], ["y"])], [tensor("x", shape=(2, 8, 16))],
                          [tensor("y", shape=(2, 8, 16))])]
    fixes = [f.fix for model in hazardous for graph in (graph_spec(), graph_spec(["neg"]))
             for f in find_problems(model, graph)]
    with pytest.raises(specport.SpecError) as bad:
        specport.rewrites(["pow-squared"], Path("model.yaml"), "graphs.g.rewrites")
    fixes.append(str(bad.value))
    spectrum = power_spectrum()
    declared = dataclasses.replace(graph_spec(), rewrites=rewrites.normalize([{"scale-input": {"factor": "1/64"}}]))
    for graph in (graph_spec(), declared):
        detail = {"tensor": "spec", "cpu_value": -670882.0, "npu_value": -65504.0, "input_values": {"x": 3.0}}
        detail["hazards"] = hazards(spectrum.graph.node[0], detail, {}, "fp16")
        advise_scale_input(spectrum, detail, cpu_tensors(spectrum, audio(2, loudness=20000.0)), graph)
        fixes += [h["fix"] for h in detail["hazards"]]
    two_inputs = model_of([helper.make_node("Add", ["x", "z"], ["y"])], [tensor("x"), tensor("z")], [tensor("y")])
    with pytest.raises(RewriteError) as ambiguous:
        rewrites.apply(two_inputs, [{"scale-input": {"factor": "1/64"}}])
    return fixes + [str(ambiguous.value)] + list(FALLBACK_HINTS.values())


def test_every_yaml_hint_loads_through_the_spec_loader(tmp_path):
    """On main the spec error's example `{finite-mask: {value: -1.0e4}}` was read as a string and refused."""
    from conftest import EXAMPLES
    from tiny_packaged import write_model

    from qnn_tasks.modelspec.load import load_model, load_socs

    socs = load_socs(EXAMPLES / "socs" / "socs.yaml")
    snippets = sorted({s for fix in every_hint() for s in yaml_snippets(fix)})
    keys = {s.split(":")[0] for s in snippets}
    assert keys == set(GRAPH_KEYS) and len(snippets) >= 12, snippets
    for i, snippet in enumerate(snippets):
        # lint's fold-if hint leaves the deployment's value to the user; the tiny model's own input is x, not fixed
        filled = snippet.replace("<value>", "16000").replace("constant_inputs: {x:", "constant_inputs: {x_fixed:")
        model_dir = write_model(tmp_path / f"m{i}", graph="g", extra=f"    {filled}\n")
        graph = load_model(model_dir, socs).graphs[0]  # a SpecError here is one line naming the snippet's key
        declared = {"rewrites": graph.rewrites, "constant_inputs": graph.constant_inputs,
                    "simplify": graph.section("simplify"), "lint": graph.section("lint")}[snippet.split(":")[0]]
        assert declared, snippet
