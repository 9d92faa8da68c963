"""The If kept on the CPU (`lint: {allow: [control-flow]}` + `allow_cpu_fallback: true`) when its branches read
weights stored in the main graph, as PyTorch's exporter writes them (issue 43, item 2).

onnxruntime's compile dropped such weights from the CPU part it writes and refused its own output, in a line that
had lost the tensor and node names (" is not output of any previous nodes."). The export stage now copies them
into the branches that read them (rewrites/branchweights.py), and the compile reads the branches' weights
from a file, since onnxruntime writes a weight it holds in memory as a marker it then refuses (toolchains/ort_bodies.py).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper
from test_if_to_where import feeds_both_ways, if_project, sm8650_fp16, value
from test_rewrites import const, model_of, ops, run

from qnn_tasks.rewrites import branchweights

RNG = np.random.default_rng(43)


def heads(sharpen_node=False):
    """probs, logits = If(sum(x) > 0): (softmax(2 * x @ wa), x @ wa) else (softmax(x @ wb), x @ wb).

    wa, wb and the 2 live in the main graph and only the branches read them; two outputs keep the If off the NPU
    (QNN's If takes one). `sharpen_node`: the 2 is a main-graph Constant node instead of an initializer."""
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "wa"], ["la"], name="then_head"),
                                helper.make_node("Mul", ["la", "sharpen"], ["sharp"], name="then_sharpen"),
                                helper.make_node("Softmax", ["sharp"], ["pa"], axis=-1, name="then_softmax")],
                               "then", [], [value("pa", (1, 4)), value("la", (1, 4))])
    else_g = helper.make_graph([helper.make_node("MatMul", ["x", "wb"], ["lb"], name="else_head"),
                                helper.make_node("Softmax", ["lb"], ["pb"], axis=-1, name="else_softmax")],
                               "else", [], [value("pb", (1, 4)), value("lb", (1, 4))])
    nodes = [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="total"),
             helper.make_node("Greater", ["total", "zero"], ["positive"], name="positive"),
             helper.make_node("If", ["positive"], ["probs", "logits"], name="pick", then_branch=then_g,
                              else_branch=else_g)]
    weights = [const("wa", RNG.standard_normal((16, 4))), const("wb", RNG.standard_normal((16, 4))), const("zero", 0.0)]
    if sharpen_node:
        nodes.insert(0, helper.make_node("Constant", [], ["sharpen"], value=const("sharpen", 2.0), name="two"))
    else:
        weights.append(const("sharpen", 2.0))
    return model_of(nodes, [value("x", (1, 16))], [value("probs", (1, 4)), value("logits", (1, 4))], weights)


LIFTED = ["'sharpen' into the then_branch of If node 'pick'", "'wa' into the then_branch of If node 'pick'",
          "'wb' into the else_branch of If node 'pick'"]
BRANCHES = ("then_branch", "else_branch")


def initializers(graph) -> list[str]:
    return sorted(t.name for t in graph.initializer)


@pytest.mark.parametrize("sharpen_node", [False, True])
def test_lift_copies_what_only_a_branch_reads_into_it(sharpen_node):
    """wa, wb and the 2 (an initializer, or a Constant node) move into the branches that read them; the 0 the main
    graph reads stays; the outputs are the same on both branches."""
    model = heads(sharpen_node)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    sites = branchweights.lift(model)
    assert sorted(sites) == LIFTED and sites.refused == []
    onnx.checker.check_model(model, full_check=True)
    assert initializers(model.graph) == ["zero"] and ops(model) == ["ReduceSum", "Greater", "If"]
    then_g, else_g = (next(a.g for a in model.graph.node[-1].attribute if a.name == b) for b in BRANCHES)
    assert initializers(then_g) == (["wa"] if sharpen_node else ["sharpen", "wa"]) and initializers(else_g) == ["wb"]
    assert [n.op_type for n in then_g.node][0] == ("Constant" if sharpen_node else "MatMul")
    for feeds in feeds_both_ways(4):
        for a, b in zip(run(before, feeds), run(model, feeds)):
            np.testing.assert_array_equal(b, a)
    assert branchweights.lift(model) == []  # nothing left to lift


def test_lift_leaves_what_the_main_graph_reads_and_external_weights(tmp_path):
    """A weight a main-graph node reads too stays there (the compile keeps it); one stored as external data is
    refused with its reason (the stages that copy a model's weight files read the main graph's list)."""
    from onnx.external_data_helper import convert_model_to_external_data

    model = heads()
    model.graph.node.insert(0, helper.make_node("MatMul", ["x", "wa"], ["unused_score"], name="main_head"))
    model.graph.output.append(value("unused_score", (1, 4)))
    sites = branchweights.lift(model)
    assert "wa" in initializers(model.graph) and not any("'wa'" in site for site in sites)

    model = heads()
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="w.bin", size_threshold=64)
    onnx.save(model, str(tmp_path / "m.onnx"))  # wa, wb (256 bytes each) go to w.bin
    model = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    sites = branchweights.lift(model)
    assert sites == ["'sharpen' into the then_branch of If node 'pick'"]
    assert sites.refused == ["'wa' (read by the then_branch of If node 'pick') is stored as external data: left in "
                             "the main graph", "'wb' (read by the else_branch of If node 'pick') is stored as "
                             "external data: left in the main graph"]


def test_export_lifts_branch_weights_and_says_so(tmp_path):
    """The export stage of a graph keeping its If (allowed on the CPU) writes the branches with their weights and
    lists what it moved in its record."""
    import yaml
    from test_yaml_defects import packaged_graph

    from qnn_tasks.modelspec.project import TensorSpec
    from qnn_tasks.stages import export

    graph = packaged_graph(tmp_path, [TensorSpec("x", (1, 16), "float32")],
                           [TensorSpec("probs", (1, 4), "float32"), TensorSpec("logits", (1, 4), "float32")],
                           settings={"lint": yaml.safe_load("allow: [control-flow]")}, allow_cpu_fallback=True)
    onnx.save(heads(), str(tmp_path / "m.onnx"))
    record = export.run(graph, tmp_path / "m.onnx", tmp_path / "out.onnx")
    assert sorted(record["lifted_into_bodies"]) == LIFTED
    assert initializers(onnx.load(str(tmp_path / "out.onnx")).graph) == ["zero"]


def test_weights_inside_a_branch_kept_on_the_cpu_compile(tmp_path):
    """Weights inside the branches of an If the NPU does not take (onnxruntime 1.32 wrote them as in-memory markers
    and refused its own output: "Initializer 'wa' references an ORT in-memory address marker"): the compile reads
    them from a file and the compiled model holds them inline, with no file left beside it."""
    from qnn_tasks.modelspec.project import TensorSpec
    from qnn_tasks.toolchains.ort_qnn import cpu_partition

    toolchain, _, options = sm8650_fp16(tmp_path, [TensorSpec("x", (1, 16), "float32")],
                                        [TensorSpec("probs", (1, 4), "float32")])
    model = heads()
    branchweights.lift(model)
    onnx.save(model, str(tmp_path / "lifted.onnx"))
    compiled = toolchain.compile_variant(tmp_path / "lifted.onnx", options, tmp_path / "compiled")
    assert [n["op_type"] for n in cpu_partition(compiled)["cpu_nodes"]] == ["If"]
    assert sorted(p.name for p in compiled.parent.iterdir()) == ["compile.log", "lifted_ctx.onnx",
                                                                  "lifted_ctx_qnn.bin"]
    [pick] = [n for n in onnx.load(str(compiled)).graph.node if n.op_type == "If"]
    then_g = next(a.g for a in pick.attribute if a.name == "then_branch")
    [wa] = [t for t in then_g.initializer if t.name == "wa"]
    assert not wa.external_data
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(wa), onnx.numpy_helper.to_array(
        next(t for t in heads_weights(model) if t.name == "wa")))


def heads_weights(model):
    """Every initializer of the model's If branches."""
    return [t for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH
            for t in a.g.initializer]

@pytest.mark.slow
def test_the_if_route_builds_a_graph_whose_branches_read_main_graph_weights(tmp_path):
    """The documented route on an If whose branches read wa, wb and the 2 from the main graph: on main the context
    stage failed (" is not output of any previous nodes."); now the whole chain builds for SM8650, the If is the
    reported CPU partition and the simulator agrees with the CPU on inputs that take both branches."""
    project = if_project(tmp_path / "project", heads(), "    allow_cpu_fallback: true\n")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    export = project.one_json("build/if-cls/cls/export/export.json")
    assert sorted(export["lifted_into_bodies"]) == LIFTED
    context = project.one_json("build/if-cls/cls/*/fp16/SM8650/context/context.json")
    assert [n["op_type"] for n in context["partition"]["cpu_nodes"]] == ["If"]
    assert "1 node(s) of graph 'cls' fall back to CPU on SM8650: If 'pick'" in context["warnings"][0]
    simverify = project.one_json("build/if-cls/cls/*/fp16/SM8650/simverify/simverify.json")
    assert simverify["status"] in ("passed", "warning")
    assert all(simverify["metrics"][name]["cosine"] > 0.999 for name in ("probs", "logits"))


def test_compiling_branch_weights_of_the_main_graph_names_them(tmp_path):
    """The bug itself, compiled as exported: the failure keeps onnxruntime's whole message (the tensor, its node and
    the If) and says which branch reads the weight and why the compile lost it."""
    from qnn_tasks.errors import ToolchainError
    from qnn_tasks.modelspec.project import TensorSpec

    toolchain, _, options = sm8650_fp16(tmp_path, [TensorSpec("x", (1, 16), "float32")],
                                        [TensorSpec("probs", (1, 4), "float32")])
    onnx.save(heads(), str(tmp_path / "heads.onnx"))
    with pytest.raises(ToolchainError) as failure:
        toolchain.compile_variant(tmp_path / "heads.onnx", options, tmp_path / "compiled")
    message = str(failure.value)
    assert "\n" not in message
    assert "input 'wa' of node: name: then_head OpType: MatMul is not output of any previous nodes" in message
    assert ("'wa' (read by MatMul node 'then_head') is a constant of the main graph that only the then_branch of If "
            "node 'pick' reads: onnxruntime's compile drops those (onnxruntime issue #32131)") in message



ROUTE = ('or keep it on the CPU: add "lint: {allow: [control-flow]}" and "allow_cpu_fallback: true" to graphs.g in '
         'models/m/model.yaml (the NPU runs the rest; the report names the CPU partition)')


def test_lint_and_export_name_the_cpu_route_beside_the_rewrites(tmp_path):
    """The control-flow fix named fold-if and if-to-where only; it now names the keys that keep the If on the CPU
    (those the graph still lacks), in lint's line and in export's refusal."""
    import dataclasses

    from test_rewrites import graph_spec
    from test_yaml_defects import packaged_graph

    from qnn_tasks.errors import StageError
    from qnn_tasks.graphs.lintrules import find_problems
    from qnn_tasks.modelspec.project import TensorSpec
    from qnn_tasks.stages import export

    [line] = [f.line() for f in find_problems(heads(), graph_spec()) if f.rule == "control-flow"]
    assert '"rewrites: [if-to-where]"' in line and '"rewrites: [fold-if]"' in line and line.endswith(f"{ROUTE})")
    fallback = dataclasses.replace(graph_spec(), allow_cpu_fallback=True)
    [line] = [f.line() for f in find_problems(heads(), fallback) if f.rule == "control-flow"]
    assert ('or keep it on the CPU: add "lint: {allow: [control-flow]}" to graphs.g in models/m/model.yaml' in line
            and "allow_cpu_fallback" not in line)

    graph = packaged_graph(tmp_path / "m", [TensorSpec("x", (1, 16), "float32")],
                           [TensorSpec("probs", (1, 4), "float32"), TensorSpec("logits", (1, 4), "float32")])
    (tmp_path / "m").mkdir()
    onnx.save(heads(), str(tmp_path / "m" / "m.onnx"))
    with pytest.raises(StageError) as refused:
        export.run(graph, tmp_path / "m" / "m.onnx", tmp_path / "out.onnx")
    assert "[control-flow] If node 'pick'" in str(refused.value) and ROUTE in str(refused.value)
