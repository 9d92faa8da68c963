"""Every rewrite lint or diagnose advises is accepted by the stage that applies it, and then the finding is gone.

For each case of the rewrite catalogue a tiny graph built here triggers the finding; the fix is taken from the
message a user reads (lint's finding, the export stage's refusal of control flow, diagnose's hazard), its model.yaml
line pasted into a model.yaml as the message says, and the project loaded by the spec loader; the real export stage
(`stages/export.run`, which applies the declared rewrites) must apply it without refusing a site, and lint (or
diagnose's explanation) run again on the rewritten, simplified graph must no longer report it. No compiles: every
stage here is onnx and onnxruntime on CPU, in process.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from test_rewrites import const, model_of, run

from qnn_tasks import rewrites
from qnn_tasks.errors import StageError
from qnn_tasks.modelspec.load import load_project
from qnn_tasks.stages import diagnose, export, simplify
from qnn_tasks.stages import lint as lint_stage

F, I32 = TensorProto.FLOAT, TensorProto.INT32
SHAPE = (1, 8, 16)


@dataclass
class Case:
    """A graph that triggers one finding, and what the model.yaml declares besides its I/O."""
    model: onnx.ModelProto
    outputs: dict[str, tuple[int, ...]] = field(default_factory=lambda: {"y": SHAPE})
    inputs: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=lambda: {"x": (SHAPE, "float32")})
    constants: dict[str, str] = field(default_factory=dict)  # `<value>` a message leaves to the user -> the value
    feeds: Callable[[], list[dict[str, np.ndarray]]] | None = None  # diagnose's samples
    tensor: str = ""  # where diagnose finds the divergence
    hazard: str = ""  # the diagnose hazard whose fix it is


def value(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def graph(nodes, initializers=(), outputs=None, inputs=None):
    return model_of(nodes, inputs or [value("x", SHAPE)], outputs or [value("y", SHAPE)], initializers)


def x_feeds(loc=0.0, scale=1.0, count=2):
    rng = np.random.default_rng(43)
    return [{"x": (loc + scale * rng.standard_normal(SHAPE)).astype(np.float32)} for _ in range(count)]


# ------------------------------------------------------------------ the graphs

def pow_square() -> Case:
    return Case(graph([helper.make_node("Pow", ["x", "two"], ["y"], name="square")], [const("two", 2.0)]),
                feeds=lambda: x_feeds(scale=1e-8), tensor="y", hazard="fp16 Pow on tiny inputs")


def pow_square_constant_node() -> Case:
    """The exponent a Constant node (as torch exports it): pow-square's matcher reads it, so diagnose names it too."""
    nodes = [helper.make_node("Constant", [], ["two"], value=const("", 2.0)),
             helper.make_node("Pow", ["x", "two"], ["y"], name="square")]
    return Case(graph(nodes), feeds=lambda: x_feeds(scale=1e-8), tensor="y", hazard="fp16 Pow on tiny inputs")


def layer_norm() -> Case:
    """LayerNorm with variance as E[x^2] - E[x]^2 (opset 17: axes as attributes); around 30, it cancels in fp16."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], keepdims=1),
             helper.make_node("Mul", ["x", "x"], ["x2"]),
             helper.make_node("ReduceMean", ["x2"], ["ex2"], axes=[-1], keepdims=1),
             helper.make_node("Mul", ["mean", "mean"], ["m2"]),
             helper.make_node("Sub", ["ex2", "m2"], ["var"], name="variance"),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Reciprocal", ["sd"], ["inv"], name="inverse"),
             helper.make_node("Sub", ["x", "mean"], ["d"]), helper.make_node("Mul", ["d", "inv"], ["y"])]
    return Case(graph(nodes, [const("eps", 1e-5)]), feeds=lambda: x_feeds(loc=30.0), tensor="inv",
                hazard="cancellation in fp16")


def reduce_sum_square() -> Case:
    node = helper.make_node("ReduceSumSquare", ["x"], ["y"], axes=[2], keepdims=1, name="energy")
    return Case(graph([node], outputs=[value("y", (1, 8, 1))]), outputs={"y": (1, 8, 1)})


def clip_computed() -> Case:
    nodes = [helper.make_node("ReduceMax", ["x"], ["peak"], keepdims=0),
             helper.make_node("Mul", ["peak", "half"], ["limit"]),
             helper.make_node("Clip", ["x", "zero", "limit"], ["y"], name="computed_max")]
    return Case(graph(nodes, [const("half", 0.5), const("zero", 0.0)]))


def neg() -> Case:
    return Case(graph([helper.make_node("Neg", ["x"], ["y"], name="flip")]))


def finite_mask() -> Case:
    """An additive -inf mask before a Softmax."""
    mask = np.zeros((1, 1, 16), np.float32)
    mask[..., 10:] = -np.inf
    nodes = [helper.make_node("Add", ["x", "mask"], ["masked"], name="apply_mask"),
             helper.make_node("Softmax", ["masked"], ["y"], axis=-1)]
    return Case(graph(nodes, [numpy_helper.from_array(mask, "mask")]), feeds=x_feeds, tensor="masked",
                hazard="mask constant overflows fp16")


def finite_mask_constant_node() -> Case:
    """The mask a Constant node: finite-mask changes it, so diagnose sees it too (it read initializers only)."""
    case = finite_mask()
    mask = case.model.graph.initializer.pop()
    case.model.graph.node.insert(0, helper.make_node("Constant", [], ["mask"], value=mask))
    return case


def constant_condition() -> Case:
    """If(flag), flag a constant: fold-if keeps the taken branch."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [value("t", SHAPE)])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [], [value("e", SHAPE)])
    node = helper.make_node("If", ["flag"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)
    return Case(graph([node], [numpy_helper.from_array(np.array(True), "flag")]))


def sample_rate() -> Case:
    """If(sr == 16000) on an int32 input sr, as the Silero VAD: constant once `constant_inputs` fixes sr."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [value("t", SHAPE)])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["e"])], "else", [], [value("e", SHAPE)])
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], name="rate_branch", then_branch=then_g, else_branch=else_g)]
    model = graph(nodes, [const("rate", 16000, np.int32)], inputs=[value("x", SHAPE), value("sr", (1,), I32)])
    return Case(model, inputs={"x": (SHAPE, "float32"), "sr": ((1,), "int32")}, constants={"sr": "16000"})


def data_dependent_condition() -> Case:
    from test_if_to_where import classifier

    return Case(classifier(), inputs={"x": ((1, 16), "float32")}, outputs={"probs": (1, 4), "logits": (1, 4)})


def spectrum() -> Case:
    """An STFT conv on int16-scale audio that overflows fp16 (test_scale_input's front end)."""
    from test_scale_input import FRAMES, FREQS, SAMPLES, audio, power_spectrum

    return Case(power_spectrum(), inputs={"x": ((1, 1, SAMPLES), "float32")}, outputs={"y": (1, FREQS, FRAMES)},
                feeds=lambda: audio(2, loudness=20000.0), tensor="spec", hazard="fp16 overflow")


# lint rule -> its case: one for each rewrite row lint advises (rewrites.LINT_ADVICE; a new one without a case
# fails below)
LINT_CASES = {"pow-square": pow_square, "variance-cancellation": layer_norm, "reduce-sum-square": reduce_sum_square,
              "clip-computed": clip_computed, "neg": neg, "fp16-overflow-constant": finite_mask}
# the rewrite lint's control-flow finding (the export stage refuses it) advises -> its case
CONTROL_FLOW_CASES = {"fold-if": constant_condition, "fold-if with constant_inputs": sample_rate,
                      "if-to-where": data_dependent_condition}
# the rewrite one of diagnose's hazards advises -> its case
DIAGNOSE_CASES = {"scale-input": spectrum, "pow-square": pow_square,
                  "pow-square of a Constant": pow_square_constant_node, "centred-variance": layer_norm,
                  "finite-mask": finite_mask, "finite-mask in a Constant": finite_mask_constant_node}


def rewrite_of(case_name: str) -> str:
    return rewrites.LINT_ADVICE[case_name].name if case_name in LINT_CASES else case_name.split()[0]


# ------------------------------------------------------------------ a project, its stages, and a user's edit

MODEL_YAML = """\
licence: test fixture
source: {{file: m.onnx}}
graphs:
  g:
    inputs: {inputs}
    outputs: {outputs}
{lines}"""


def flow(value) -> str:
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=2 ** 16).strip()


def write_project(root: Path, case: Case, lines: list[str], removed: tuple[str, ...] = ()):
    """models/m/{m.onnx, model.yaml} with `lines` under graphs.g (and the `removed` inputs left out of its inputs),
    loaded by the spec loader: its graph g."""
    folder = root / "models" / "m"
    folder.mkdir(parents=True)
    onnx.save(case.model, str(folder / "m.onnx"))
    inputs = {name: {"shape": list(shape), "dtype": dtype} for name, (shape, dtype) in case.inputs.items()
              if name not in removed}
    outputs = {name: {"shape": list(shape)} for name, shape in case.outputs.items()}
    (folder / "model.yaml").write_text(MODEL_YAML.format(inputs=flow(inputs), outputs=flow(outputs),
                                                         lines="".join(f"    {line}\n" for line in lines)))
    project = load_project(root)
    assert not project.broken, project.broken[0][1]  # the spec loader refused the pasted line: one line saying why
    [model] = project.models
    [spec] = model.graphs
    return spec


def export_and_simplify(spec, out: Path) -> tuple[dict, Path]:
    """The export stage (which applies the declared rewrites, then refuses what the NPU cannot run) and simplify."""
    out.mkdir(parents=True)
    record = export.run(spec, spec.model_dir / spec.source.file, out / "exported.onnx")
    simplify.run(spec, out / "exported.onnx", out / "simplified.onnx")
    return record, out / "simplified.onnx"


def lint_findings(spec, simplified: Path) -> list[dict]:
    return lint_stage.run(spec, simplified)["findings"]


# how a message says to edit model.yaml: a quoted line to add under the graph, an entry to add to (or set in) its
# `rewrites:` list, inputs to move out of its `inputs:`
QUOTED_LINE = re.compile(r'"((?:rewrites|constant_inputs): [\[{].*?[\]}])"')
LIST_ENTRY = re.compile(r"(add|set (\S+) to) (\S.*?) (?:to|in) graphs\.\w+\.rewrites")
MOVED_INPUTS = re.compile(r"move (.+?) from graphs\.\w+\.inputs")


def pasted(lines: list[str], fix: str, name: str, constants: dict[str, str]) -> tuple[list[str], tuple[str, ...]]:
    """The graph's model.yaml lines after a user follows `fix` for rewrite `name` as it is written, and the inputs it
    says to move: a quoted `rewrites:` line naming the rewrite is added as a line (beside one the graph has, it is a
    duplicate key the spec loader refuses), and a `constant_inputs:` line when the case fills in its `<value>`s."""
    lines = list(lines)
    for text in QUOTED_LINE.findall(fix):
        key = text.split(":")[0]
        if key == "rewrites" and name in {entry_name(e) for e in yaml_entries(text)}:
            lines.append(text)
        elif key == "constant_inputs" and constants:
            for input_name, filled in constants.items():
                text = text.replace(f"{input_name}: <value>", f"{input_name}: {filled}")
            lines.append(text)
    for _, replaced, entry in LIST_ENTRY.findall(fix):
        if entry_name(entry) != name:
            continue
        [at] = [i for i, line in enumerate(lines) if line.startswith("rewrites:")]
        entries = [e for e in yaml_entries(lines[at]) if not replaced or entry_name(e) != replaced]
        lines[at] = f"rewrites: [{', '.join(entries + [entry])}]"
    assert any(line.startswith("rewrites:") and name in line for line in lines), f"no line enables {name}: {fix}"
    moved = MOVED_INPUTS.search(fix) if constants else None  # only with the constant_inputs it moves them to
    return lines, tuple(moved.group(1).split(", ")) if moved else ()


def yaml_entries(snippet: str) -> list[str]:
    """The entries of a `rewrites: [...]` line as written (top-level commas split them)."""
    body = snippet.split(": ", 1)[1].strip()[1:-1]
    entries, depth, start = [], 0, 0
    for i, char in enumerate(body):
        depth += (char in "[{") - (char in "]}")
        if char == "," and depth == 0:
            entries.append(body[start:i].strip())
            start = i + 1
    return [e for e in entries + [body[start:].strip()] if e]


def entry_name(entry: str) -> str:
    loaded = yaml.safe_load(entry)
    return next(iter(loaded)) if isinstance(loaded, dict) else loaded


def applied(record: dict, name: str) -> dict:
    """The export record's entry for rewrite `name`: it changed something and refused nothing."""
    [entry] = [r for r in record["rewrites"] if r["name"] == name]
    assert entry["count"] > 0 and not entry.get("refused"), entry
    assert not any(f"rewrite '{name}' found nothing" in w for w in record["warnings"]), record["warnings"]
    return entry


# ------------------------------------------------------------------ lint's advice

OTHER = {"neg": "pow-square"}  # a rewrite already declared (lint then says: add <entry> to graphs.g.rewrites)


@pytest.mark.parametrize("declared", [False, True], ids=["first-rewrite", "added-to-a-list"])
@pytest.mark.parametrize("rule", list(LINT_CASES))
def test_lint_advice_is_accepted_and_clears_the_finding(tmp_path, rule, declared):
    case, name = LINT_CASES[rule](), rewrite_of(rule)
    lines = [f"rewrites: [{OTHER.get(name, 'neg')}]"] if declared else []
    spec = write_project(tmp_path / "before", case, lines)
    _, simplified = export_and_simplify(spec, tmp_path / "before" / "build")
    fixes = {f["fix"] for f in lint_findings(spec, simplified) if f["rule"] == rule}
    assert len(fixes) == 1, f"lint does not report {rule} on its case"
    fix = fixes.pop()
    assert (f"add {name} to graphs.g.rewrites" in fix) == declared, fix

    spec = write_project(tmp_path / "after", case, *pasted(lines, fix, name, case.constants))
    assert name in spec.rewrites
    record, simplified = export_and_simplify(spec, tmp_path / "after" / "build")
    applied(record, name)
    assert not [f for f in lint_findings(spec, simplified) if f["rule"] == rule]


@pytest.mark.parametrize("declared", [False, True], ids=["first-rewrite", "added-to-a-list"])
@pytest.mark.parametrize("case_name", list(CONTROL_FLOW_CASES))
def test_control_flow_advice_is_accepted_and_removes_the_if(tmp_path, case_name, declared):
    """The export stage refuses an If, its message naming the rewrite that removes it: pasted, export passes."""
    case, name = CONTROL_FLOW_CASES[case_name](), rewrite_of(case_name)
    lines = ["rewrites: [neg]"] if declared else []
    spec = write_project(tmp_path / "before", case, lines)
    with pytest.raises(StageError, match=r"\[control-flow\]") as refused:
        export_and_simplify(spec, tmp_path / "before" / "build")
    fix = str(refused.value)

    spec = write_project(tmp_path / "after", case, *pasted(lines, fix, name, case.constants))
    record, simplified = export_and_simplify(spec, tmp_path / "after" / "build")
    applied(record, name)
    assert "If" not in {n.op_type for n in onnx.load(str(simplified)).graph.node}
    assert not [f for f in lint_findings(spec, simplified) if f["rule"] == "control-flow"]


# ------------------------------------------------------------------ diagnose's advice

def saturated(value: np.ndarray) -> np.ndarray:
    """A stand-in for the NPU: the CPU's value in fp16, saturated at +-65504 as HTP does."""
    if value.dtype != np.float32:
        return value
    return np.clip(value, -diagnose.FP16_MAX, diagnose.FP16_MAX).astype(np.float16).astype(np.float32)


def diagnosed(model: onnx.ModelProto, case: Case, spec) -> dict:
    """What diagnose.run says of the divergence at `case.tensor`, measured on CPU (no compile): the intermediates,
    the cancelling Sub upstream if any, the explanation with its hazards, and the scale-input advice."""
    from qnn_tasks.graphs.intermediates import expose_intermediates

    exposed, tensors = expose_intermediates(model)
    feeds = case.feeds()
    names = [o.name for o in exposed.graph.output]
    cpu = [dict(zip(names, run(exposed, f))) for f in feeds]
    npu = [{k: saturated(v) for k, v in c.items()} for c in cpu]
    nodes = diagnose.rank_nodes(model, tensors, cpu, npu)
    first = next(n for n in nodes if n["tensor"] == case.tensor)
    first = diagnose.cancellation_source(model, nodes, first, cpu, diagnose.DEFAULT_THRESHOLD) or first
    detail = diagnose.explain(model, first, cpu, npu, feeds, "fp16", spec)
    diagnose.advise_scale_input(model, detail, [{**i, **c} for i, c in zip(feeds, cpu)], spec)
    return detail


@pytest.mark.parametrize("declared", [False, True], ids=["first-rewrite", "added-to-a-list"])
@pytest.mark.parametrize("case_name", list(DIAGNOSE_CASES))
def test_diagnose_advice_is_accepted_and_clears_the_hazard(tmp_path, case_name, declared):
    case, name = DIAGNOSE_CASES[case_name](), rewrite_of(case_name)
    lines = ["rewrites: [neg]"] if declared else []
    if declared and name == "scale-input":  # a factor too weak: the conv is in range, its square still overflows
        lines, case.tensor = ["rewrites: [{scale-input: {factor: 1/64}}]"], "power2"
    spec = write_project(tmp_path / "before", case, lines)
    _, simplified = export_and_simplify(spec, tmp_path / "before" / "build")
    detail = diagnosed(onnx.load(str(simplified)), case, spec)
    [hazard] = [h for h in detail["hazards"] if h["hazard"] == case.hazard]
    fix = hazard["fix"]

    spec = write_project(tmp_path / "after", case, *pasted(lines, fix, name, case.constants))
    record, simplified = export_and_simplify(spec, tmp_path / "after" / "build")
    applied(record, name)
    after = diagnosed(onnx.load(str(simplified)), case, spec)
    assert case.hazard not in {h["hazard"] for h in after["hazards"]}, after["hazards"]


def cancelling_difference() -> Case:
    """A Sub of nearly equal values (1.001 x - relu(x) around 30) that is no variance: centred-variance does not
    match it."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["xk"]), helper.make_node("Relu", ["x"], ["xr"]),
             helper.make_node("Sub", ["xk", "xr"], ["d"], name="difference"), helper.make_node("Abs", ["d"], ["ad"]),
             helper.make_node("Add", ["ad", "eps"], ["ade"]), helper.make_node("Sqrt", ["ade"], ["sd"]),
             helper.make_node("Reciprocal", ["sd"], ["y"], name="inverse")]
    return Case(graph(nodes, [const("k", 1.001), const("eps", 1e-6)]), feeds=lambda: x_feeds(loc=30.0), tensor="y",
                hazard="cancellation in fp16")


def cube() -> Case:
    return Case(graph([helper.make_node("Pow", ["x", "three"], ["y"], name="cube")], [const("three", 3.0)]),
                feeds=lambda: x_feeds(scale=1e-3), tensor="y", hazard="fp16 Pow on tiny inputs")


def max_seed() -> Case:
    """A -inf that only seeds a Max: fp16 holds it, finite-mask leaves it, and it is no hazard."""
    seed = numpy_helper.from_array(np.full((1, 1, 16), -np.inf, np.float32), "seed")
    return Case(graph([helper.make_node("Max", ["x", "seed"], ["y"], name="running_max")], [seed]), feeds=x_feeds,
                tensor="y", hazard="")


@pytest.mark.parametrize("builder, rewrite", [(cancelling_difference, "centred-variance"), (cube, "pow-square"),
                                              (max_seed, "finite-mask")])
def test_diagnose_names_no_rewrite_where_the_rewrite_would_change_nothing(builder, rewrite):
    """One rule with the rewrite: on main diagnose advised centred-variance for any cancelling Sub and finite-mask
    for a -inf seeding a Max, which the export stage then applied to nothing ("found nothing to change")."""
    from test_rewrites import graph_spec

    case = builder()
    assert rewrites.find(case.model, [rewrite]) == {rewrite: []}
    hazards = diagnosed(case.model, case, graph_spec())["hazards"]
    assert [h["hazard"] for h in hazards] == ([case.hazard] if case.hazard else [])
    assert not any("rewrites" in h["fix"] or "rewrite" in h for h in hazards), hazards


# ------------------------------------------------------------------ every case the catalogue covers has a test

def test_every_lint_rewrite_rule_has_a_case():
    """A new rewrite row with `lint=` fails here until LINT_CASES builds a graph that triggers it."""
    assert set(LINT_CASES) == set(rewrites.LINT_ADVICE)


def test_every_catalogued_rewrite_is_advised_by_some_case():
    advised = {rewrite_of(c) for cases in (LINT_CASES, CONTROL_FLOW_CASES, DIAGNOSE_CASES) for c in cases}
    assert advised == set(rewrites.CATALOGUE)


def test_entries_split_as_written():
    assert yaml_entries("rewrites: [neg, {scale-input: {input: x, factor: 1/64}}]") == \
        ["neg", "{scale-input: {input: x, factor: 1/64}}"]
    assert entry_name("neg") == "neg" and entry_name("{finite-mask: {value: -10000.0}}") == "finite-mask"
