"""Graph size and `split:`: weight bytes at lint against a context budget, and a graph cut into parts that each
build, verify on the simulator and chain end to end (real compiles and runs, SM8650 only).

The model is built in code: a residual MLP stack x [1, 16, 256] -> 4 blocks (LayerNorm -> MatMul 256x512 -> Relu ->
MatMul 512x256 -> + x) -> y, 2.1 MB of fp16 weights. A test-lowered budget (socs/socs.yaml: SM8650 context_mb: 2)
refuses it before compile with both fixes in numbers; with `split: {parts: 2}` it builds as two parts of 1.1 MB.
A second graph of the same file is cut at two named tensors (3 parts). The bad cuts are one line each.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import Project
from onnx import TensorProto, helper, numpy_helper
from tiny_project import only_model

from qnn_tasks.graphs import split

SEQ, WIDTH, BLOCKS = 16, 256, 4
YAML = "models/stack/model.yaml"
GRAPH = """\
  {name}:
    inputs: {{x: {{shape: [1, 16, 256], dtype: float32}}}}
    outputs: {{y: {{shape: [1, 16, 256]}}}}
    samples: {{files: samples/x.npz}}
    verify: {{samples: 3}}
    socs: [SM8650]
"""
MODEL_YAML = "licence: test fixture\nsource: {file: stack.onnx}\ngraphs:\n" + GRAPH.format(name="net")
SECOND = GRAPH.format(name="net2") + "    split: {at: [b0.res, b1.res]}\n"


def stack_model(blocks: int = BLOCKS, outlier: int | None = None) -> onnx.ModelProto:
    """The residual MLP stack; `outlier`: the block whose first MatMul meets an outlier input channel (test_repair)."""
    rng = np.random.default_rng(3)
    inits, nodes, x = [], [], "x"

    def weight(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    for b in range(blocks):
        p = f"b{b}"
        nodes.append(helper.make_node("LayerNormalization", [x, weight(f"{p}.g", np.ones(WIDTH)),
                                                             weight(f"{p}.beta", np.zeros(WIDTH))], [f"{p}.ln"], axis=-1))
        up, fed = rng.standard_normal((WIDTH, 2 * WIDTH)) / 16, f"{p}.ln"
        if b == outlier:  # an outlier channel: tiny activations on channel 7 meet a weight row 100x the others
            scale = np.ones(WIDTH)
            scale[7] = 0.01
            nodes.append(helper.make_node("Mul", [fed, weight(f"{p}.s", scale)], [f"{p}.scaled"]))
            fed, up[7, :] = f"{p}.scaled", up[7, :] * 100
        nodes += [helper.make_node("MatMul", [fed, weight(f"{p}.w1", up)], [f"{p}.up"]),
                  helper.make_node("Relu", [f"{p}.up"], [f"{p}.act"]),
                  helper.make_node("MatMul", [f"{p}.act", weight(f"{p}.w2", rng.standard_normal((2 * WIDTH, WIDTH)) / 23)],
                                   [f"{p}.down"]),
                  helper.make_node("Add", [x, f"{p}.down"], [f"{p}.res"])]
        x = f"{p}.res"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, SEQ, WIDTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def stack_project(root: Path) -> Project:
    project, folder = only_model(root, "stack")
    onnx.save(stack_model(), str(folder / "stack.onnx"))
    np.savez(folder / "samples/x.npz", x=np.random.default_rng(4).standard_normal((3, 1, SEQ, WIDTH)).astype(np.float32))
    (folder / "model.yaml").write_text(MODEL_YAML)
    own = project.path("socs/socs.yaml")
    own.write_text(own.read_text().replace("SM8650:  {soc_id: 57, dsp_arch: v75, vtcm_mb: 8, fp16: true,",
                                           "SM8650:  {soc_id: 57, dsp_arch: v75, vtcm_mb: 8, fp16: true, context_mb: 2,"))
    return project


# ------------------------------------------------------------------ the cuts themselves (no build)

def test_weight_bytes_per_precision():
    model = stack_model()
    weights = BLOCKS * 2 * WIDTH * 2 * WIDTH
    norms = BLOCKS * 2 * WIDTH
    assert split.weight_bytes(model, "fp16") == (weights + norms) * 2
    assert split.weight_bytes(model, "w8a16") == weights + norms * 4  # 1-dim floats stay 4 bytes


def test_balanced_parts_cut_where_one_tensor_crosses():
    model = onnx.shape_inference.infer_shapes(stack_model())
    cuts = split.balanced_cuts(model, 2)
    assert cuts == [["b1.res"]]  # the residual stream between blocks 2 and 3: half the weights on each side
    parts = split.plan(model, cuts)
    assert [p.weight_bytes for p in parts] == [parts[0].weight_bytes] * 2
    assert split.balanced_cuts(model, 4) == [["b0.res"], ["b1.res"], ["b2.res"]]


def test_parts_on_a_graph_with_no_place_to_cut_say_to_remove_split():
    """Every node reads x: no cut leaves the later part free of a graph input. "Ask for at most 1 parts" was the fix;
    one part is no split, so the fix is to remove split:."""
    nodes = [helper.make_node("Add", ["x", "w0"], ["a"]), helper.make_node("Mul", ["a", "x"], ["y"])]
    graph = helper.make_graph(nodes, "flat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(np.ones((1, 4), np.float32), "w0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(split.SplitError) as info:
        split.balanced_cuts(model, 2, where="model.yaml: graphs.flat.split.parts")
    line = str(info.value)
    assert line.startswith("model.yaml: graphs.flat.split.parts: 2 parts asked, the graph has no place to cut"), line
    assert "(fix: remove split: from the graph: it is built whole)" in line and "at most 1 parts" not in line, line
    # a graph with places to cut still gets the number it can take
    with pytest.raises(split.SplitError, match=r"1000 parts asked, the graph has \d+ places to cut \(fix: ask for at "
                                                r"most \d+ parts"):
        split.balanced_cuts(onnx.shape_inference.infer_shapes(stack_model()), 1000)


@pytest.mark.parametrize("at, expected", [
    (["b9.res"], "split.at: 'b9.res' is not a tensor of the graph (fix: name a tensor computed inside the graph"),
    (["b0.res", "b0.down"], "split.at: 'b0.down' (cut 2) is computed in part 1, before cut 1 ('b0.res'), so part 1 "
                            "would need part 2's tensor: a cycle (fix: list the cut tensors in the order"),
    (["b1.up", "b1.act"], "split.at: part 2 (at 'b1.up' and 'b1.act') holds no weights (fix: move the cut"),
])
def test_bad_cuts_are_one_line(at, expected):
    model = onnx.shape_inference.infer_shapes(stack_model())
    with pytest.raises(split.SplitError) as err:
        split.plan(model, [[t] for t in at], where="models/stack/model.yaml: graphs.net.split.at")
    message = str(err.value)
    assert "\n" not in message and message.startswith("models/stack/model.yaml: graphs.net.")
    assert expected in message, message


# ------------------------------------------------------------------ real builds

@pytest.mark.slow
def test_over_budget_refused_then_split_builds(tmp_path):
    project = stack_project(tmp_path / "p")
    refused = project.doit("context:net-SM8650")
    assert refused.returncode != 0
    line = refused.failure_line("lint:net")
    assert ("[size] graph 'net' (fp16): 2.1 MB of weights, over the 2 MB context budget of v75 (SM8650; context_mb in "
            in line), line
    assert "(fix: precision: w8a16 would be 1.1 MB; split: {parts: 2} gives parts of about 1.0 MB)" in line, line
    assert not list(project.root.glob("build/stack/net/**/*.bin"))  # stopped before compile
    listed = project.doit("list", "--all").stdout  # the size lint measured, beside the budget, before any compile
    assert "weights 2.1 MB fp16 at the last lint; context budget 2 MB on v75)" in \
        next(line for line in listed.splitlines() if line.startswith("lint:net ")), listed

    project.edit(YAML, "    socs: [SM8650]\n", "    socs: [SM8650]\n    split: {parts: 2}\n")
    project.path(YAML).write_text(project.path(YAML).read_text() + SECOND)
    built = project.doit("simverify", "pipeline")
    assert built.returncode == 0, built.stdout + built.stderr
    record = project.one_json("build/stack/net/split/split.json")
    assert record["cuts"] == [["b1.res"]]  # half the weights each side, one tensor crossing
    assert all(row["weight_bytes"] < 2_000_000 for row in record["parts"])
    assert record["parts"][0]["outputs"][0]["bytes"] == SEQ * WIDTH * 4  # the cut tensor and its size
    assert record["end_to_end_cpu"]["y"]["cosine"] > 0.99999
    for part in ("net.part1", "net.part2", "net2.part1", "net2.part2", "net2.part3"):
        lint = project.one_json(f"build/stack/{part}/lint/lint.json")
        assert lint["status"] == "passed" and lint["weight_bytes"]["fp16"] < 2_000_000
        verdict = project.one_json(f"build/stack/{part}/*/fp16/SM8650/simverify/simverify.json")
        assert verdict["status"] == "passed", verdict
        assert project.one_json(f"build/stack/{part}/*/fp16/SM8650/context/context.json")["bin_size"] > 0
    for graph, parts in (("net", 2), ("net2", 3)):
        chain = project.one_json(f"build/stack/{graph}/pipeline/*/SM8650/pipeline/pipeline.json")
        assert chain["status"] == "passed" and [link["graph"] for link in chain["links"]] == \
            [f"{graph}.part{k}" for k in range(1, parts + 1)]
        assert chain["metrics"]["y"]["cosine"] > 0.99, chain["metrics"]
        kept = chain["links"][0]["simulated_by"]  # part 1's own simulation starts the chain: not simulated twice
        assert f"/{graph}.part1/" in kept and kept.endswith("/SM8650/simulate/outputs.npz"), kept
    assert json.loads(project.path("build/stack/net2/split/parts.json").read_text())["net2.part3"]["inputs"] == \
        [{"name": "b1.res", "shape": [1, SEQ, WIDTH], "dtype": "float32"}]
    assert not list(project.root.glob("build/stack/net/**/*.bin"))  # the whole graph is never compiled


def test_cut_at_a_missing_tensor_stops_the_split_task(tmp_path):
    project = stack_project(tmp_path / "p")
    project.edit(YAML, "    socs: [SM8650]\n", "    socs: [SM8650]\n    split: {at: [b1.nothing]}\n")
    result = project.doit("split:net")
    assert result.returncode != 0
    line = result.failure_line("split:net")
    assert "models/stack/model.yaml: graphs.net.split.at: 'b1.nothing' is not a tensor of the graph" in line, line


def test_external_data_model_goes_through_export_simplify_lint_split_and_cpu(tmp_path, monkeypatch):
    """The > 2 GB path on a small file: the limits are lowered so the stack (weights in a .data file) takes it."""
    from qnn_tasks.graphs import onnxinfo, packaged
    from qnn_tasks.graphs.cpu import run_onnx_cpu
    from qnn_tasks.modelspec.load import load_model, load_soc_table
    from qnn_tasks.stages import lint, simplify

    monkeypatch.setattr(simplify, "PROTOBUF_LIMIT", 100_000)
    monkeypatch.setattr(split, "EXTERNAL_ABOVE", 100_000)
    monkeypatch.setattr(onnxinfo, "SMALL_TENSOR", 100)  # the weights stay in the file
    project = stack_project(tmp_path / "p")
    source = project.path("models/stack/stack.onnx")
    onnx.save(stack_model(), str(source), save_as_external_data=True, location="stack.onnx.data", size_threshold=0)
    graph = load_model(project.path("models/stack"), load_soc_table(project.root)[0]).graphs[0]
    exported = tmp_path / "export" / "net.onnx"
    exported.parent.mkdir()
    assert packaged.export(graph, source, exported)["external_data"] == ["stack.onnx.data"]
    assert exported.stat().st_size < 100_000 and (exported.parent / "stack.onnx.data").is_file()
    out = tmp_path / "simplify" / "net.onnx"
    record = simplify.run(graph, exported, out)
    assert record["onnxsim"].startswith("skipped: the model is over 2 GB (external data)")
    assert (out.parent / "stack.onnx.data").stat().st_size == (exported.parent / "stack.onnx.data").stat().st_size
    assert out.stat().st_size < 100_000  # the weights stayed beside it
    linted = lint.run(graph, out, {"v75": {"mb": 1000, "socs": ["SM8650"], "where": "test"}})
    assert linted["weight_bytes"]["fp16"] == split.weight_bytes(stack_model(), "fp16")
    names = ["net.part1", "net.part2"]
    paths = [tmp_path / "parts" / f"{n}.onnx" for n in names]
    rows = split.write_parts(out, split.balanced_cuts(split.load_light(out), 2), names, paths, "fp16", "split.parts")
    assert all(row["external_data"] and Path(row["file"] + ".data").is_file() for row in rows)
    x = [{"x": np.random.default_rng(5).standard_normal((1, SEQ, WIDTH)).astype(np.float32)}]
    whole = run_onnx_cpu(source, x)[0]["y"]
    middle = run_onnx_cpu(paths[0], x)[0]
    end = run_onnx_cpu(paths[1], [middle])[0]["y"]
    np.testing.assert_allclose(end, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("split_yaml, expected", [
    ("{at: [b1.res], parts: 2}", "graphs.net.split: give either at: or parts: (fix: e.g. split: {at: [block3_out]} or "),
    ("{parts: 1}", "graphs.net.split.parts:"),
    ("{at: [b1.res, b1.res]}", "graphs.net.split.at: must be a list of different tensor names"),
    ("{parts: 2}\n  net.part2:\n    inputs: {x: {shape: [1, 4], dtype: float32}}\n    outputs: {y: {shape: [1, 4]}}\n"
     "    samples: {files: samples/x.npz}",
     "graphs.net.split: part 2 is named 'net.part2', which is a declared graph too (fix: rename graph 'net.part2')"),
])
def test_split_spec_errors_are_one_line(tmp_path, split_yaml, expected):
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.load import load_model, load_soc_table

    project = stack_project(tmp_path / "p")
    project.edit(YAML, "    socs: [SM8650]\n", f"    socs: [SM8650]\n    split: {split_yaml}\n")
    with pytest.raises(SpecError) as err:
        load_model(project.path("models/stack"), load_soc_table(project.root)[0])
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_split_graph_in_the_models_own_loop_is_a_spec_error(tmp_path):
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.load import load_model, load_soc_table

    project = stack_project(tmp_path / "p")
    project.edit(YAML, "    socs: [SM8650]\n", "    socs: [SM8650]\n    split: {parts: 2}\n")
    project.path(YAML).write_text(project.path(YAML).read_text() + "loop: {graph: net, feed: {x: y}}\n")
    with pytest.raises(SpecError) as err:
        load_model(project.path("models/stack"), load_soc_table(project.root)[0])
    assert "model.yaml: loop.graph: 'net' is split into parts (graphs.net.split), so it is never compiled whole " \
           "(fix: remove split: from graphs.net, or leave it out of loop.graph)" in str(err.value), str(err.value)


def test_a_split_graph_with_sizes_is_refused_at_load_in_one_line(tmp_path):
    """`split:` with `dims:` was accepted at load and then crashed the cross-size check (an unexpected KeyError):
    refused at load, naming the file, the key and what to do instead."""
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.load import load_model, load_soc_table

    project = stack_project(tmp_path / "p")
    project.edit(YAML, "    socs: [SM8650]\n", "    socs: [SM8650]\n    split: {parts: 2}\n    dims: {seq: [8, 16]}\n")
    for shape in ("inputs: {x: {shape: [1, 16, 256]", "outputs: {y: {shape: [1, 16, 256]"):
        project.edit(YAML, shape, shape.replace("16", "seq"))
    with pytest.raises(SpecError) as err:
        load_model(project.path("models/stack"), load_soc_table(project.root)[0])
    message = str(err.value)
    assert message.endswith("model.yaml: graphs.net.split: a graph with sizes (dims:) cannot be split (fix: remove "
                            "split: or dims:, or declare each size as a graph of its own with its shapes written out "
                            "and split: on each)") and "\n" not in message, message
