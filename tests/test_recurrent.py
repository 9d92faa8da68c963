"""A graph whose outputs feed its own inputs (issue 35): lint names the pairs and proposes the `loop:` declaration
(ready to paste: the spec loader reads it), and the report marks such a graph verified without a loop.

Models built in code (real onnx); the report's note from a real planner over a project loaded from disk.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_rewrites import const, graph_spec, model_of

from qnn_tasks.graphs.lintrules import find_problems, recurrent_feed
from qnn_tasks.modelspec.load import load_project
from qnn_tasks.modelspec.specsizes import SizeSpec
from qnn_tasks.plan.planner import Planner
from qnn_tasks.plan.rows import GRAPH_STAGES
from qnn_tasks.plan.stageplans import plan_lint

F = TensorProto.FLOAT


def value(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def cell(state_in="state", state_out="stateN"):
    """y, stateN = head(s), s where s = tanh(x W + state U): one step of a recurrent net."""
    rng = np.random.default_rng(35)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("MatMul", [state_in, "u"], ["su"]),
             helper.make_node("Add", ["xw", "su"], ["pre"]), helper.make_node("Tanh", ["pre"], [state_out]),
             helper.make_node("MatMul", [state_out, "head"], ["y"])]
    return model_of(nodes, [value("x", (1, 8)), value(state_in, (1, 16))], [value("y", (1, 4)), value(state_out, (1, 16))],
                    [const("w", rng.standard_normal((8, 16))), const("u", rng.standard_normal((16, 16)) * 0.3),
                     const("head", rng.standard_normal((16, 4)))])


@pytest.mark.parametrize("inputs, outputs, feed", [
    (["state"], ["stateN"], {"state": "stateN"}),
    (["h0", "c0"], ["hn", "cn"], {"h0": "hn", "c0": "cn"}),
    (["cache_in"], ["cache_out"], {"cache_in": "cache_out"}),
    (["past_key_values.0.key"], ["present.0.key"], {"past_key_values.0.key": "present.0.key"}),
    (["hidden"], ["new_hidden"], {"hidden": "new_hidden"}),
    (["x", "input"], ["y", "output"], {}),        # same shapes, unrelated names
    (["state"], ["stateN_big"], {}),             # related name, another shape (below)
])
def test_recurrent_feed_pairs_inputs_with_the_outputs_that_feed_them(inputs, outputs, feed):
    nodes = [helper.make_node("Tanh", [i], [o]) for i, o in zip(inputs, outputs)]
    shapes = {o: (1, 32) if o.endswith("_big") else (1, 16) for o in outputs}
    model = model_of(nodes, [value(i, (1, 16)) for i in inputs], [value(o, shapes[o]) for o in outputs])
    assert recurrent_feed(model) == feed


@pytest.mark.parametrize("chain", [["Identity"], ["Identity", "Cast"], ["Reshape"]])
def test_an_input_passed_straight_to_an_output_is_not_state(chain):
    """issue 43: on main `state -> Identity -> stateN` was flagged recurrent; a pass-through is no recurrence (feeding
    it back changes nothing), while the cell beside it, whose output is computed, still is."""
    nodes, name = [], "state"
    for k, op in enumerate(chain):
        out = "stateN" if k == len(chain) - 1 else f"t{k}"
        extra = {"to": F} if op == "Cast" else {}
        nodes.append(helper.make_node(op, [name, "shape"] if op == "Reshape" else [name], [out], **extra))
        name = out
    nodes.append(helper.make_node("Tanh", ["h0"], ["hn"]))
    model = model_of(nodes, [value("state", (1, 16)), value("h0", (1, 16))], [value("stateN", (1, 16)),
                                                                              value("hn", (1, 16))],
                     [const("shape", [1, 16], np.int64)])
    assert recurrent_feed(model) == {"h0": "hn"}
    [finding] = [f for f in find_problems(model, graph_spec(name="rnn")) if f.rule == "recurrent"]
    assert "input 'state'" not in finding.message and finding.message.startswith("input 'h0' <- output 'hn'")


def test_lint_proposes_the_loop_a_recurrent_graph_needs(tmp_path):
    """On main lint said nothing: a recurrent graph judged per sample from the CPU's state passed unflagged."""
    [finding] = [f for f in find_problems(cell(), graph_spec(name="rnn")) if f.rule == "recurrent"]
    assert finding.severity == "warning" and finding.where == "graph 'rnn'"
    assert finding.message.startswith("input 'state' <- output 'stateN' (same shape): a recurrent graph")
    assert finding.fix == ('declare its loop at the top of models/m/model.yaml: "loop: {graph: rnn, feed: {state: stateN}}" '
                           "(docs/pipelines-and-loops.md, Graphs that loop)")
    assert finding.why.startswith("accuracy:")
    # the proposal is ready to paste: the spec loader reads it as the model's loop
    declaration = finding.fix.split('"')[1]
    loop = load_with(tmp_path, declaration).loop
    assert loop.graph == "rnn" and loop.feed == {"state": "stateN"}


def test_lint_proposes_a_loop_over_the_declared_graph_for_a_size_and_the_plan_knows_its_loop(tmp_path):
    """A size of a graph (`rnn.seq8`) runs in a loop declared over the graph (`loop: {graph: rnn}`): lint proposes
    that declaration, and with it declared, every size's lint is told the loop's feed (no warning)."""
    size = SizeSpec(graph="rnn", dim="seq", size=8, sizes=(8, 16), pad={"x": 0.0}, longer="skip")
    [finding] = [f for f in find_problems(cell(), replace(graph_spec(name="rnn.seq8"), size=size))
                 if f.rule == "recurrent"]
    assert '"loop: {graph: rnn, feed: {state: stateN}}"' in finding.fix
    sized = MODEL_YAML.replace("  rnn:\n", "  rnn:\n    dims: {seq: [8, 16]}\n").replace("[1, 8], dtype", "[1, seq], dtype")
    folder = tmp_path / "models" / "m"
    load_with(tmp_path)
    (folder / "model.yaml").write_text(sized + "loop: {graph: rnn, feed: {state: stateN}}\n")
    planner = Planner(load_project(tmp_path))
    lint = next(s for s in GRAPH_STAGES if s.name == "lint")
    assert [(gt.name, plan_lint(planner, lint, gt).args()["loop_feed"]) for gt in planner.graphs] == [
        ("rnn.seq8", {"state": "stateN"}), ("rnn.seq16", {"state": "stateN"})]


def test_a_declared_loop_or_an_allow_silences_it():
    assert not [f for f in find_problems(cell(), graph_spec(name="rnn"), {"state": "stateN"}) if f.rule == "recurrent"]
    allowed = replace(graph_spec(name="rnn"), settings={"lint": {"allow": ["recurrent"]}})
    [finding] = [f for f in find_problems(cell(), allowed) if f.rule == "recurrent"]
    assert finding.severity == "allowed"


MODEL_YAML = """\
licence: test
source: {file: m.onnx}
graphs:
  rnn:
    inputs:
      x: {shape: [1, 8], dtype: float32}
      state: {shape: [1, 16], dtype: float32}
    outputs:
      y: {shape: [1, 4]}
      stateN: {shape: [1, 16]}
    samples: {files: "samples/*.npz"}
"""


def load_with(root, extra: str = ""):
    """models/m/ with the cell as m.onnx, its samples and model.yaml (+ `extra` at the top level), loaded."""
    import onnx
    from conftest import EXAMPLES

    from qnn_tasks.modelspec.load import load_model, load_socs

    folder = root / "models" / "m"
    (folder / "samples").mkdir(parents=True, exist_ok=True)
    onnx.save(cell(), str(folder / "m.onnx"))
    np.savez(folder / "samples" / "s.npz", x=np.zeros((2, 1, 8), np.float32), state=np.zeros((2, 1, 16), np.float32))
    (folder / "model.yaml").write_text(MODEL_YAML + (f"{extra}\n" if extra else ""))
    return load_model(folder, load_socs(EXAMPLES / "socs" / "socs.yaml"))


@pytest.mark.parametrize("declared", [False, True])
def test_the_report_marks_a_recurrent_graph_verified_without_a_loop(tmp_path, declared):
    import shutil

    from conftest import EXAMPLES

    from qnn_tasks.modelspec.load import load_project
    from qnn_tasks.plan.planner import Planner
    from qnn_tasks.plan.rows import GRAPH_STAGES
    from qnn_tasks.plan.stageplans import plan_lint
    from qnn_tasks.report import gather

    shutil.copytree(EXAMPLES / "socs", tmp_path / "socs")
    load_with(tmp_path, "loop: {graph: rnn, feed: {state: stateN}}" if declared else "")
    planner = Planner(load_project(tmp_path))
    [gt] = planner.graphs
    lint = {"status": "warning", "recurrent": {"feed": {"state": "stateN"}, "loop": {}}}
    mark = gather.recurrence(planner, gt, lint)
    assert mark["feed"] == {"state": "stateN"} and mark["loop"] is declared
    if declared:
        assert mark["note"] == "recurrent (state <- stateN), verified in its loop"
    else:
        assert mark["note"].startswith("recurrent (state <- stateN), verified WITHOUT a loop: each sample was judged "
                                       "from the CPU's state")
    assert gather.recurrence(planner, gt, {"status": "passed"}) is None
    # the lint stage is told the declared loop (and reruns when it changes: it is in the stage's key)
    lint_stage = next(stage for stage in GRAPH_STAGES if stage.name == "lint")
    plan = plan_lint(planner, lint_stage, gt)
    assert plan.args()["loop_feed"] == ({"state": "stateN"} if declared else None)
    if declared:  # the same graph without its loop has another lint key
        (tmp_path / "models" / "m" / "model.yaml").write_text(MODEL_YAML)
        unlooped = Planner(load_project(tmp_path))
        assert plan_lint(unlooped, lint_stage, unlooped.graphs[0]).key != plan.key
