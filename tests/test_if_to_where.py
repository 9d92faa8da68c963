"""if-to-where on a classifier that picks between two scores by a data-dependent condition (issue 22).

Real onnx and onnxruntime for the CPU equality on inputs that take both branches; one real compile and
simulator run (fp16, SM8650) shows the If graph leaves the If on CPU and the rewritten graph runs whole on the NPU.
"""
from __future__ import annotations

from unittest import mock

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_rewrites import const, graph_spec, model_of, ops, rewritten, run

from qnn_tasks import rewrites
from qnn_tasks.graphs.lintrules import find_problems
from qnn_tasks.rewrites import ifwhere

F = TensorProto.FLOAT
RNG = np.random.default_rng(22)


def value(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def classifier(then_nodes=None, else_shape=(1, 4)):
    """probs, logits = If(sum(x) > 0): (softmax(2 * score_a), score_a) else (softmax(score_b), score_b).

    Both branches name their inner tensors 'p' and 'logit' (a clash once both are inlined); they read the outer
    scores, the then branch reads its own output 'logit' and has an initializer of its own."""
    then_nodes = then_nodes or [helper.make_node("Mul", ["logit", "sharpen"], ["sharp"]),  # reads its own output
                                helper.make_node("Softmax", ["sharp"], ["p"], axis=-1)]
    then_g = helper.make_graph([helper.make_node("Identity", ["score_a"], ["logit"])] + then_nodes, "then", [],
                               [value("p", (1, 4)), value("logit", (1, 4))], [const("sharpen", 2.0)])
    else_out = "p" if else_shape == (1, 4) else "q"
    else_nodes = [helper.make_node("Softmax", ["score_b"], ["p"], axis=-1),
                  helper.make_node("Identity", ["score_b"], ["logit"])]
    if else_shape != (1, 4):
        else_nodes.append(helper.make_node("Concat", ["p", "p"], ["q"], axis=-1))
    else_g = helper.make_graph(else_nodes, "else", [], [value(else_out, else_shape), value("logit", (1, 4))])
    nodes = [helper.make_node("MatMul", ["x", "wa"], ["score_a"], name="head_a"),
             helper.make_node("MatMul", ["x", "wb"], ["score_b"], name="head_b"),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="total"),
             helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
             helper.make_node("If", ["positive"], ["probs", "logits"], name="pick", then_branch=then_g,
                              else_branch=else_g)]
    return model_of(nodes, [value("x", (1, 16))], [value("probs", (1, 4)), value("logits", (1, 4))],
                    [const("wa", RNG.standard_normal((16, 4))), const("wb", RNG.standard_normal((16, 4))),
                     const("zero", 0.0)])


def feeds_both_ways(count=6):
    """Inputs whose sum is positive, then negative, alternately: both branches are taken."""
    feeds = []
    for i in range(count):
        x = RNG.standard_normal((1, 16)).astype(np.float32)
        x += np.float32((1 if i % 2 == 0 else -1) * 0.5 - x.mean())
        feeds.append({"x": x})
    assert {bool(f["x"].sum() > 0) for f in feeds} == {True, False}
    return feeds


def test_if_to_where_is_exact_on_cpu_for_both_branches():
    model = classifier()
    sites, after = rewritten(model, "if-to-where")
    assert sites == ["pick"]
    assert "If" not in ops(after) and ops(after).count("Where") == 2
    assert ops(after).count("Softmax") == 2  # both branches are computed
    for feeds in feeds_both_ways():
        for a, b in zip(run(model, feeds), run(after, feeds)):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(b, a)


def branch_with(node_count):
    """A then branch of `node_count` nodes (its logit Identity included)."""
    relus = node_count - 3
    return [helper.make_node("Mul", ["logit", "sharpen"], ["t0"])] + \
        [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(relus)] + \
        [helper.make_node("Softmax", [f"t{relus}"], ["p"], axis=-1)]


COSTLY = ("its then branch (60 nodes) costs about 6,055,200 multiply-adds, computed on every input beside the 804,268 "
          "of the graph's cheaper path: more than the 25% if-to-where allows (or 2,071,040)")


@pytest.mark.parametrize("model, reason", [
    (lambda: classifier(else_shape=(1, 8)), "output 'probs' differs between the branches: then float32 [1, 4], "
                                            "else float32 [1, 8] (Where needs the same shape and dtype)"),
    (lambda: classifier(branch_with(60)), COSTLY),
    (lambda: classifier([helper.make_node("RandomUniformLike", ["score_a"], ["noise"], name="noise"),
                         helper.make_node("Add", ["score_a", "noise"], ["sharp"]),
                         helper.make_node("Softmax", ["sharp"], ["p"], axis=-1)]),
     "its then branch is not pure (RandomUniformLike node 'noise')"),
    (lambda: classifier([helper.make_node("If", ["positive"], ["p"], name="inner", then_branch=helper.make_graph(
        [helper.make_node("Softmax", ["score_a"], ["pa"], axis=-1)], "t", [], [value("pa", (1, 4))]),
        else_branch=helper.make_graph([helper.make_node("Softmax", ["score_b"], ["pb"], axis=-1)], "e", [],
                                      [value("pb", (1, 4))]))]),
     "its then branch holds control flow (If node 'inner')"),
])
def test_if_to_where_refuses_with_the_reason(model, reason):
    model = model()
    before = onnx.ModelProto()
    before.CopyFrom(model)
    [report] = rewrites.apply(model, ["if-to-where"])
    assert report["count"] == 0 and report["refused"] == [f"If node 'pick': {reason}"]
    assert "If" in ops(model)
    [line] = [f.line() for f in find_problems(model, graph_spec()) if f.rule == "control-flow"]
    assert f"if-to-where does not apply: {reason}" in line


def deep(branch_nodes, layers, width=256):
    """y = If(sum(h) > 0): chain(h) else h, with h = `layers` width x width MatMuls of x; the then chain alternates Add
    of 0.01 and Relu, `branch_nodes` nodes on [1, width]: the branch's share of the cost falls as the layers grow."""
    rng = np.random.default_rng(layers)
    rest = [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"], name=f"layer{i}") for i in range(layers)]
    rest[0].input[0] = "x"
    chain = [helper.make_node("Add" if i % 2 == 0 else "Relu", [f"t{i}", "step"][:2 - i % 2], [f"t{i + 1}"])
             for i in range(branch_nodes)]
    chain[0].input[0] = f"h{layers}"
    chain[-1].output[0] = "y_then"
    then_g = helper.make_graph(chain, "then", [], [value("y_then", (1, width))])
    else_g = helper.make_graph([helper.make_node("Identity", [f"h{layers}"], ["y_else"])], "else", [],
                               [value("y_else", (1, width))])
    nodes = rest + [helper.make_node("ReduceSum", [f"h{layers}"], ["total"], keepdims=0, name="total"),
                    helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
                    helper.make_node("If", ["positive"], ["y"], name="pick", then_branch=then_g, else_branch=else_g)]
    weights = [const(f"w{i}", rng.standard_normal((width, width)) / np.sqrt(width)) for i in range(layers)]
    return model_of(nodes, [value("x", (1, width))], [value("y", (1, width))],
                    weights + [const("step", 0.01), const("zero", 0.0)])


def test_the_bound_is_on_cost_not_on_nodes():
    """A 40-node branch (refused on main: > 16 nodes) beside 200 MatMul layers adds 22% to the graph's cost and is
    rewritten (exact on both branches); beside 64 layers it adds 65% and is refused; 16 small nodes stay free."""
    assert ifwhere.MAX_EXTRA_WORK == 0.25
    assert rewritten(classifier(branch_with(16)), "if-to-where")[0] == ["pick"]
    model = deep(40, 200, width=128)
    sites, after = rewritten(model, "if-to-where")
    assert sites == ["pick"] and "If" not in ops(after)
    for sign in (1, -1):
        feeds = {"x": (sign * np.abs(RNG.standard_normal((1, 128)))).astype(np.float32)}
        np.testing.assert_array_equal(run(after, feeds)[0], run(model, feeds)[0])
    [report] = rewrites.apply(deep(40, 64, width=128), ["if-to-where"])
    assert report["count"] == 0 and "its then branch (40 nodes) costs about" in report["refused"][0]


def wide_after_conv(count, channels=64, side=32):
    """y = If(sum(h) > 0): `count` nodes (Add 0.01, Relu in turn) on h else h, h = a 3x3 Conv of x [1, C, S, S]."""
    shape = (1, channels, side, side)
    chain = [helper.make_node("Add" if i % 2 == 0 else "Relu", [f"t{i}", "step"][:2 - i % 2], [f"t{i + 1}"])
             for i in range(count)]
    chain[0].input[0], chain[-1].output[0] = "h", "y_then"
    then_g = helper.make_graph(chain, "then", [], [value("y_then", shape)])
    else_g = helper.make_graph([helper.make_node("Identity", ["h"], ["y_else"])], "else", [], [value("y_else", shape)])
    nodes = [helper.make_node("Conv", ["x", "w"], ["h"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("ReduceSum", ["h"], ["total"], keepdims=0, name="total"),
             helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
             helper.make_node("If", ["positive"], ["y"], name="pick", then_branch=then_g, else_branch=else_g)]
    w = np.random.default_rng(count).standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels)
    return model_of(nodes, [value("x", shape)], [value("y", shape)], [const("w", w), const("step", 0.01),
                                                                          const("zero", 0.0)])


def test_wide_elementwise_work_is_counted_beside_a_conv():
    """4 Add/Relu nodes on [1, 64, 32, 32] after a 64-channel 3x3 Conv: with an element counted as one multiply-add
    the branch added 3% and was rewritten, and it took +163-194% on the SM8650 simulator (bench_node_cost.py);
    at ELEMENT_COST it is refused, with its cost."""
    [report] = rewrites.apply(wide_after_conv(4), ["if-to-where"])
    assert report["refused"] == ["If node 'pick': its then branch (4 nodes) costs about 60,693,120 multiply-adds, "
                                 "computed on every input beside the 68,395,756 of the graph's cheaper path: more "
                                 "than the 25% if-to-where allows (or 2,071,040)"]
    with mock.patch.object(ifwhere, "ELEMENT_COST", 1):  # as it was counted before it was measured
        assert rewritten(wide_after_conv(4), "if-to-where")[0] == ["pick"]


def test_a_constant_condition_is_left_to_fold_if():
    model = classifier()
    model.graph.node[3].input[1] = "zero"
    model.graph.node[3].input[0] = "zero"  # Greater(0, 0): constant False
    [report] = rewrites.apply(model, ["if-to-where"])
    assert report["count"] == 0 and "fold-if" in report["refused"][0]


def test_lint_suggests_if_to_where_for_a_data_dependent_condition():
    [line] = [f.line() for f in find_problems(classifier(), graph_spec()) if f.rule == "control-flow"]
    assert 'add "rewrites: [if-to-where]" to graphs.g in models/m/model.yaml' in line
    assert "computes both branches and picks with Where" in line


def sm8650_fp16(tmp_path, inputs, outputs):
    """(toolchain, chip row, provider options) of a real fp16 build for SM8650: the examples' row and ort-qnn profile."""
    from conftest import EXAMPLES
    from test_yaml_defects import packaged_graph

    from qnn_tasks.modelspec.load import load_socs, load_toolchain
    from qnn_tasks.toolchains import from_profile

    soc = load_socs(EXAMPLES / "socs" / "socs.yaml")["SM8650"]
    toolchain = from_profile(load_toolchain(EXAMPLES, "ort-qnn"))
    graph = packaged_graph(tmp_path, inputs, outputs)
    return toolchain, soc, toolchain.write_config(graph, "fp16", soc, tmp_path)["provider_options"]


def compile_and_simulate(model, path, feeds, toolchain, options):
    """Compile `model` (saved at `path`), run it on the simulator with CPU fallback disabled: (outputs, partition)."""
    from qnn_tasks.devices import simulator
    from qnn_tasks.toolchains.ort_qnn import cpu_partition

    onnx.save(model, str(path))
    compiled = toolchain.compile_variant(path, options, path.parent / f"{path.stem}_compiled")
    outputs, _, _ = simulator.run(compiled, options, feeds, path.parent / f"{path.stem}_simulator.log")
    return outputs, cpu_partition(compiled)


def test_if_to_where_puts_the_whole_classifier_on_the_npu(tmp_path):
    """Real compiles for SM8650 (fp16): the If graph leaves the If on CPU; the rewritten graph is one NPU partition
    and the simulator (CPU fallback disabled) agrees with the CPU on inputs that take both branches."""
    from qnn_tasks.judge import metrics
    from qnn_tasks.modelspec.project import TensorSpec
    from qnn_tasks.toolchains.ort_qnn import cpu_partition

    toolchain, _, options = sm8650_fp16(tmp_path, [TensorSpec("x", (1, 16), "float32")],
                                     [TensorSpec("probs", (1, 4), "float32")])
    model = classifier()
    onnx.save(model, str(tmp_path / "if.onnx"))
    if_partition = cpu_partition(toolchain.compile_variant(tmp_path / "if.onnx", options, tmp_path / "if_compiled"))
    assert [n["op_type"] for n in if_partition["cpu_nodes"]] == ["If"]

    _, after = rewritten(model, "if-to-where")
    feeds = feeds_both_ways(4)
    simulated, partition = compile_and_simulate(after, tmp_path / "where.onnx", feeds, toolchain, options)
    assert partition["cpu_nodes"] == [] and partition["npu_partitions"] == 1
    cpu = np.stack([run(model, f)[0] for f in feeds])
    npu = np.stack([s["probs"] for s in simulated])
    cosine = metrics.cosine(cpu, npu)
    print(f"if-to-where, fp16 SM8650: probs cosine {cosine:.6f}, max-abs {np.abs(cpu - npu).max():.3g}")
    assert cosine > 0.999 and (cpu.argmax(-1) == npu.argmax(-1)).all()


def test_if_to_where_declared_in_model_yaml_is_applied_by_the_export_stage(tmp_path):
    """`rewrites: [if-to-where]` on a packaged ONNX: the export record names the If; a refused one says why."""
    import yaml
    from test_yaml_defects import packaged_graph

    from qnn_tasks.graphs import packaged
    from qnn_tasks.modelspec.project import TensorSpec

    declared = rewrites.normalize(yaml.safe_load("rewrites: [if-to-where]")["rewrites"])
    io = [TensorSpec("x", (1, 16), "float32")], [TensorSpec("probs", (1, 4), "float32"),
                                                 TensorSpec("logits", (1, 4), "float32")]
    graph = packaged_graph(tmp_path, *io, rewrites=declared)
    for model, sites, refused in ((classifier(), ["pick"], None),
                                  (classifier(branch_with(60)), [], [f"If node 'pick': {COSTLY}"])):
        onnx.save(model, str(tmp_path / "m.onnx"))
        record = packaged.export(graph, tmp_path / "m.onnx", tmp_path / "out.onnx")
        [entry] = record["rewrites"]
        assert entry["name"] == "if-to-where" and entry["sites"] == sites and entry.get("refused") == refused
        assert ("If" in ops(onnx.load(str(tmp_path / "out.onnx")))) == bool(refused)


I32 = TensorProto.INT32


def guarded(then_nodes, table=None):
    """y = If(token < 4): x + then_nodes(token, x) else x: the condition guards what the then branch computes.

    The then branch ends in 'found' [1, 8]; the table has 4 rows, so a token >= 4 must take the else branch."""
    table = RNG.standard_normal((4, 8)) if table is None else table
    then_g = helper.make_graph(then_nodes + [helper.make_node("Add", ["x", "found"], ["y_then"])], "then", [],
                               [value("y_then", (1, 8))])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["y_else"])], "else", [], [value("y_else", (1, 8))])
    nodes = [helper.make_node("Less", ["token", "rows"], ["known"], name="known"),
             helper.make_node("If", ["known"], ["y"], name="pick", then_branch=then_g, else_branch=else_g)]
    return model_of(nodes, [value("x", (1, 8)), value("token", (1,), I32)], [value("y", (1, 8))],
                    [const("table", table), const("rows", 4, np.int32), const("two", [[2.0] * 8]), const("two_i", 2.0)])


LOOKUP = [helper.make_node("Gather", ["table", "token"], ["found"], axis=0, name="lookup")]
OUT_OF_RANGE = {"x": np.ones((1, 8), np.float32), "token": np.array([7], np.int32)}


def test_if_to_where_refuses_a_branch_the_condition_guards():
    """The If guards an embedding lookup: on main the rewrite computed the Gather on every token, and the rewritten
    graph failed on token 7, which the original handles (its else branch)."""
    model = guarded(LOOKUP)
    np.testing.assert_array_equal(run(model, OUT_OF_RANGE)[0], OUT_OF_RANGE["x"])  # the original handles it
    [report] = rewrites.apply(model, ["if-to-where"])
    reason = ("its then branch's Gather node 'lookup' reads data-dependent indices (out of range on some inputs), "
              "and both branches would run on inputs the condition keeps from it")
    assert report["count"] == 0 and report["refused"] == [f"If node 'pick': {reason}"]
    assert "If" in ops(model) and run(model, OUT_OF_RANGE)[0].shape == (1, 8)
    [line] = [f.line() for f in find_problems(model, graph_spec()) if f.rule == "control-flow"]
    assert f"if-to-where does not apply: {reason}" in line and "rewrites: [if-to-where]" not in line


def scores(op):
    """then: found = op(x, ...) on data-dependent values."""
    return [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=1, name="total"),
            {"Div": helper.make_node("Div", ["x", "total"], ["found"], name="ratio"),
             "Log": helper.make_node("Log", ["x"], ["found"], name="ratio"),
             "Sqrt": helper.make_node("Sqrt", ["x"], ["found"], name="ratio"),
             "Pow": helper.make_node("Pow", ["x", "total"], ["found"], name="ratio"),
             "Mod": helper.make_node("Mod", ["x", "total"], ["found"], name="ratio", fmod=1)}[op]]


@pytest.mark.parametrize("op, problem", [
    ("Div", "divides by a data-dependent value (it may be 0)"),
    ("Mod", "divides by a data-dependent value (it may be 0)"),
    ("Log", "reads a data-dependent value (NaN or Inf outside its domain)"),
    ("Sqrt", "reads a data-dependent value (NaN or Inf outside its domain)"),
    ("Pow", "raises to a power that is not a constant non-negative integer (NaN or Inf on some inputs)"),
])
def test_if_to_where_refuses_ops_not_defined_on_every_input(op, problem):
    [report] = rewrites.apply(guarded(scores(op)), ["if-to-where"])
    assert report["refused"] == [f"If node 'pick': its then branch's {op} node 'ratio' {problem}, and both branches "
                                 "would run on inputs the condition keeps from it"]


def test_if_to_where_keeps_total_branches():
    """A constant in-range lookup, a division by a constant without zeros, x^2 and an op not listed but computed from
    constants only: all defined on every input, so the rewrite applies and the outputs are equal on both branches."""
    branch = [helper.make_node("Constant", [], ["row"], value=helper.make_tensor("row", I32, [1], [3])),
              helper.make_node("Gather", ["table", "row"], ["picked"], axis=0, name="lookup"),
              helper.make_node("Sqrt", ["two"], ["root2"], name="root2"),  # constants only
              helper.make_node("Div", ["picked", "root2"], ["scaled"], name="scale"),
              helper.make_node("Pow", ["scaled", "two_i"], ["found"], name="square")]
    model = guarded(branch)
    sites, after = rewritten(model, "if-to-where")
    assert sites == ["pick"] and "Where" in ops(after)
    for token in (1, 7):
        feeds = {"x": RNG.standard_normal((1, 8)).astype(np.float32), "token": np.array([token], np.int32)}
        np.testing.assert_array_equal(run(after, feeds)[0], run(model, feeds)[0])


def test_if_to_where_refuses_a_constant_index_out_of_range():
    model = guarded([helper.make_node("Constant", [], ["row"], value=helper.make_tensor("row", I32, [1], [9])),
                     helper.make_node("Gather", ["table", "row"], ["found"], axis=0, name="lookup")])
    [report] = rewrites.apply(model, ["if-to-where"])
    assert "Gather node 'lookup' reads constant indices outside [-4, 4)" in report["refused"][0]


CLASSIFIER_YAML = """\
licence: test
source: {{file: m.onnx}}
graphs:
  cls:
    inputs:
      x: {{shape: [1, 16], dtype: float32}}
    outputs:
      probs: {{shape: [1, 4]}}
      logits: {{shape: [1, 4]}}
    samples: {{files: "samples/*.npz"}}
    socs: [SM8650]
    lint: {{allow: [control-flow]}}
{extra}"""


def if_project(root, model, extra=""):
    """A fresh project whose only model is `model` (an If it keeps), YAML only, with 4 samples taking both branches."""
    import shutil

    from conftest import copy_project

    project = copy_project(root)
    for folder in project.path("models").iterdir():
        shutil.rmtree(folder)
    folder = project.path("models/if-cls")
    (folder / "samples").mkdir(parents=True)
    onnx.save(model, str(folder / "m.onnx"))
    feeds = feeds_both_ways(4)
    np.savez(folder / "samples" / "x.npz", x=np.stack([f["x"] for f in feeds]))
    (folder / "model.yaml").write_text(CLASSIFIER_YAML.format(extra=extra))
    return project


def test_allowed_control_flow_without_cpu_fallback_is_one_export_line(tmp_path):
    """`lint: {allow: [control-flow]}` alone: the If can only run on the CPU, so export says which key is missing."""
    result = if_project(tmp_path / "project", classifier(branch_with(60))).doit("export:cls")
    line = result.failure_line("export:cls")
    assert ("If node 'pick': graphs.cls.lint allows control-flow, but it can only run on the CPU (fix: add "
            "allow_cpu_fallback: true to graphs.cls in models/if-cls/model.yaml to keep it there") in line


@pytest.mark.slow
def test_allowed_control_flow_builds_a_reported_cpu_partition(tmp_path):
    """An If if-to-where refuses (too costly), allowed to stay on the CPU: on main export refused it whatever the
    spec said. Now the whole chain builds for SM8650: the context record and the report name the CPU partition, and
    the simulator (CPU fallback allowed for this graph only) agrees with the CPU on inputs taking both branches."""
    import json

    project = if_project(tmp_path / "project", classifier(branch_with(60)), "    allow_cpu_fallback: true\n")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    context = project.one_json("build/if-cls/cls/*/fp16/SM8650/context/context.json")
    assert [n["op_type"] for n in context["partition"]["cpu_nodes"]] == ["If"]
    assert context["status"] == "warning" and "1 node(s) of graph 'cls' fall back to CPU on SM8650: If 'pick'" in \
        context["warnings"][0]
    simverify = project.one_json("build/if-cls/cls/*/fp16/SM8650/simverify/simverify.json")
    assert simverify["status"] in ("passed", "warning") and simverify["metrics"]["probs"]["cosine"] > 0.999
    report = json.loads(project.path("build/report/report.json").read_text())
    [target] = report["targets"]
    assert target["status"] == "warning" and "fall back to CPU on SM8650: If 'pick'" in target["reason"]
