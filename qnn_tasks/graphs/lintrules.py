"""lint's rules: what will trouble the NPU, found in an ONNX before compiling (stages/lint.py runs them on the
simplified graph; export refuses the hard ones at once).

Errors fail the stage (dynamic dims, batch != 1, unsupported I/O dtypes, control flow, int8
inside the ONNX, weights over the context budget of a chip's arch: socs.yaml context_mb, a resident memory estimate
over its memory_mb); warnings are known HTP hazards with their fix,
and a `why` saying whether they matter for accuracy, speed or compatibility. A hazard that a
built-in rewrite fixes is found by that rewrite's own matcher (qnn_tasks.rewrites, dry run), and
its fix is the model.yaml line that enables it.
A graph may acknowledge a rule with `lint: {allow: [rule]}`: its findings are then recorded as
"allowed" and neither fail nor warn.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from qnn_tasks import rewrites
from qnn_tasks.graphs import memory, onnxinfo, split
from qnn_tasks.modelspec import precision_table, specsplit
from qnn_tasks.modelspec.project import GraphSpec

SUPPORTED_IO_DTYPES = {"float32", "float16", "int32", "uint8", "int8", "uint16", "int16", "bool"}
FP16_MAX = 65504.0


@dataclass
class Finding:
    rule: str
    severity: str  # "error" | "warning" | "allowed"
    where: str
    message: str
    fix: str
    why: str = ""  # "accuracy: ...", "speed: ..." or "compatibility: ...": what it costs if left

    def line(self) -> str:
        matters = f"; matters for {self.why}" if self.why else ""
        return f"[{self.rule}] {self.where}: {self.message}{matters} (fix: {self.fix})"


SHOWN_SITES = 3  # a refusal names this many sites of a rule, then counts the rest


def summary_lines(findings: list[Finding]) -> list[str]:
    """One line per rule and finding text: the count and the first few sites, not the same line per node (errors
    and warnings alike: a model with 23 similar nodes printed 23 warnings). A packaged int8 model repeated "[int8-in-onnx] ... (fix: ...)" for each of its 44 nodes (9,335 characters).
    """
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for f in findings:
        groups.setdefault((f.rule, f.message, f.fix, f.why), []).append(f.where)
    lines = []
    for (rule, message, fix, why), wheres in groups.items():
        if len(wheres) == 1:
            where = wheres[0]
        else:
            more = f" and {len(wheres) - SHOWN_SITES} more" if len(wheres) > SHOWN_SITES else ""
            where = f"{len(wheres)} sites ({', '.join(wheres[:SHOWN_SITES])}{more})"
        lines.append(Finding(rule, "error", where, message, fix, why).line())
    return lines


def find_problems(model, graph: GraphSpec, loop_feed: dict[str, str] | None = None,
                  budgets: dict[str, dict[str, Any]] | None = None,
                  estimates: dict[str, dict[str, Any]] | None = None) -> list[Finding]:
    """Every finding on the model, with its severity before `allow` is applied. `loop_feed`: the model's `loop:` feed
    when it loops this graph; `budgets`: the context budget of each arch it builds for; `estimates`: its memory
    estimates when the caller has them (without budgets there is no limit to hold them to, and none is made)."""
    sizes = size_findings(split.size_line(model), graph, budgets or {})
    held = memory_findings(model, estimates if estimates is not None else memory_estimates(model, graph, budgets),
                           graph, budgets, {f.where for f in sizes}) if budgets else []
    findings = _io_findings(model) + _node_findings(model, graph) + _rewrite_findings(model, graph) + sizes + held \
        + _recurrent_findings(model, graph, loop_feed or {})
    allowed = set(graph.section("lint").get("allow", []))
    for f in findings:
        if f.rule in allowed:
            f.severity = "allowed"  # acknowledged in model.yaml: recorded, neither error nor warning
    return findings


def _io_findings(model) -> list[Finding]:
    findings = []
    io = onnxinfo.graph_io(model)
    for kind in ("inputs", "outputs"):
        for t in io[kind]:
            where = f"{kind[:-1]} '{t['name']}'"
            dynamic = [d for d in t["shape"] if not isinstance(d, int) or d <= 0]
            if dynamic:
                findings.append(Finding("dynamic-dim", "error", where, f"dynamic dims {dynamic} in shape {t['shape']}",
                                        "export with fixed shapes (batch 1, fixed chunk/length)"))
            elif kind == "inputs" and len(t["shape"]) > 1 and t["shape"][0] != 1:
                findings.append(Finding("batch", "error", where, f"first dim is {t['shape'][0]}, not batch 1",
                                        "export with batch 1; if this dim is not the batch, add "
                                        "`lint: {allow: [batch]}` to the graph"))
            if t["dtype"] not in SUPPORTED_IO_DTYPES:
                fix = "export int32 instead of int64" if t["dtype"] == "int64" else "use float32/float16/int32 I/O"
                findings.append(Finding("io-dtype", "error", where, f"dtype {t['dtype']} is not supported on HTP", fix))
    return findings


def _node_findings(model, graph: GraphSpec) -> list[Finding]:
    from onnx import numpy_helper

    from qnn_tasks.rewrites import foldif, graphtools, ifwhere

    constants = graphtools.constant_tensors(model.graph)
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    conditions = {c.node: c for c in foldif.conditions(model)}
    selects = {c.node: c for c in ifwhere.candidates(model)}
    findings = []
    for node in model.graph.node:
        where = onnxinfo.node_label(node)
        if node.op_type in onnxinfo.CONTROL_FLOW_OPS:
            findings.append(Finding("control-flow", "error", where, "control flow does not run on HTP",
                                    _control_flow_fix(conditions.get(node.name or node.output[0]),
                                                      selects.get(node.name or node.output[0]), graph),
                                    "compatibility: the graph does not compile with it"))
        elif onnxinfo.is_quantized(node):
            findings.append(Finding("int8-in-onnx", "error", where, "int8 quantization inside the ONNX",
                                    "export the float model (before quantization) and let QNN quantize it"
                                    + (": precision: w8a16 is already set" if "w8a16" in graph.precisions
                                       else " (precision: w8a16)"),
                                    "compatibility: QNN quantizes itself"))
        elif node.op_type == "Erf" and not _in_gelu(node, consumers, constants, numpy_helper):
            findings.append(Finding("erf", "warning", where,
                                    "Erf outside a whole GELU (x * 0.5 * (1 + erf(x / sqrt 2))) runs on CPU on HTP; "
                                    "onnxsim's fuse_preceding_mul_into_conv folds GELU's x0.5 into the next Conv",
                                    "simplify: {skip_optimizers: [fuse_preceding_mul_into_conv]}",
                                    "speed: the Erf falls back to CPU" if graph.allow_cpu_fallback else
                                    "compatibility: the Erf needs the CPU, and with allow_cpu_fallback: false (the "
                                    "default) the context stage fails"))
    return findings


def _control_flow_fix(condition, select, graph: GraphSpec) -> str:
    """How to remove it (fold-if, if-to-where, or at export), then how to keep it on the CPU instead."""
    removal = _removal_fix(condition, select, graph)
    return f"{removal}; {_cpu_route(graph)}" if _cpu_route(graph) else removal


def _cpu_route(graph: GraphSpec) -> str:
    """The route that keeps control flow as a CPU partition the context record and the report name: the keys this
    graph still lacks ("" when it has both)."""
    keys = (('"lint: {allow: [control-flow]}"', "control-flow" in graph.section("lint").get("allow", [])),
            ('"allow_cpu_fallback: true"', graph.allow_cpu_fallback))
    missing = [key for key, present in keys if not present]
    if not missing:
        return ""
    return (f"or keep it on the CPU: add {' and '.join(missing)} to graphs.{graph.name} in "
            f"models/{graph.model}/model.yaml (the NPU runs the rest; the report names the CPU partition)")


def _removal_fix(condition, select, graph: GraphSpec) -> str:
    """fold-if when the If's condition is (or can be made) a constant; if-to-where when its branches are pure and
    cheap (`select`: its ifwhere.Candidate); otherwise fix it at export."""
    from qnn_tasks.rewrites import yaml_fix

    if condition is not None and condition.value is not None:
        return f"{yaml_fix('fold-if', graph.name, graph.model, graph.rewrites)} to constant-fold the condition (it is a constant)"
    fold = ""
    if condition is not None and condition.blockers:
        values = ", ".join(f"{b}: <value>" for b in condition.blockers)
        # each as the spec loader accepts it pasted: an input is fed (inputs) or fixed (constant_inputs), not both,
        # and a second constant_inputs key would be a duplicate
        declared = [b for b in condition.blockers if b in {t.name for t in graph.inputs}]
        target = (f"graphs.{graph.name}.constant_inputs (as {values})" if graph.constant_inputs
                  else f'"constant_inputs: {{{values}}}" under graphs.{graph.name}')
        where = (f"move {', '.join(declared)} from graphs.{graph.name}.inputs to {target}" if declared
                 else f"declare them in {target}")
        fold = (f"if the condition's input(s) {', '.join(condition.blockers)} are fixed in deployment, {where}, and "
                f"{yaml_fix('fold-if', graph.name, graph.model, graph.rewrites)}")
    if select is not None and not select.reason:
        where = (f"{yaml_fix('if-to-where', graph.name, graph.model, graph.rewrites)}: it computes both branches and "
                 "picks with Where (both are pure and cheap)")
        return where + (f"; or, {fold}" if fold else "")
    refused = f"if-to-where does not apply: {select.reason}; " if select is not None else ""
    if fold:
        return f"{refused}{fold}; else fix the branch at export"
    return f"{refused}fix the branch/length at export (constant-fold the condition, unroll the loop)"


def _rewrite_findings(model, graph: GraphSpec) -> list[Finding]:
    """The sites each built-in rewrite would change, as warnings whose fix enables it."""
    from onnx import numpy_helper

    from qnn_tasks.rewrites import graphtools

    # each rule rides on its rewrite's catalogue row (`lint=`): the rewrite's own matcher finds its sites
    sites = rewrites.find(model, [rewrite.name for rewrite in rewrites.LINT_ADVICE.values()])
    constants = graphtools.constant_tensors(model.graph)
    constants.update({n.output[0]: a.t for n in model.graph.node if n.op_type == "ConstantOfShape"
                      for a in n.attribute if a.name == "value"})
    findings = []
    for rule, rewrite in rewrites.LINT_ADVICE.items():
        op, problem, fix = rewrite.lint.op, rewrite.lint.problem, rewrites.advice(rewrite.name, graph)
        for site in sites[rewrite.name]:
            if op is None:
                lowest = float(numpy_helper.to_array(constants[site]).min())
                where, message = f"constant '{site}' (min {lowest:.3g})", problem  # same text: one grouped warning
            else:
                where, message = f"{op} node '{site}'", problem
            findings.append(Finding(rule, "warning", where, message, fix, rewrite.why))
    return findings


# A state input and the output that feeds it back, as exporters name them: state/stateN, h0/hn, cache_in/cache_out,
# past_key_values.0.key/present.0.key. Names are stripped of these affixes; a pair also needs one shape and dtype.
_IN_AFFIXES = (("past_key_values", "past_", "prev_", "previous_", "old_", "in_", "input_"),
               ("_in", "_0", "0", "_prev", "_past", "_old"))
_OUT_AFFIXES = (("present", "new_", "out_", "output_", "updated_"),  # not "next_": next_ids = ids + 1 is no state
                ("_out", "_n", "n", "_1", "_new", "_updated"))


def _stems(name: str, affixes: tuple[tuple[str, ...], tuple[str, ...]]) -> set[str]:
    prefixes, suffixes = affixes
    lowered = name.lower()
    heads = {lowered} | {lowered[len(p):] for p in prefixes if lowered.startswith(p)}
    stems = heads | {h[:-len(x)] for h in heads for x in suffixes if h.endswith(x) and len(h) > len(x)}
    return {stem.strip("._-/:") for stem in stems} - {""}


# ops that hand their first input on unchanged in value: an output reached from an input through only these is that
# input passed straight through (a pass-through, not a recurrence: feeding it back would change nothing)
_VALUE_KEEPING_OPS = {"Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Dropout"}


def _passed_through(model) -> dict[str, str]:
    """output -> the graph input it is, unchanged in value (through Identity, Cast, Reshape and the like only)."""
    producers = {out: node for node in model.graph.node for out in node.output}
    inputs = {i.name for i in model.graph.input}
    found = {}
    for output in model.graph.output:
        name, seen = output.name, set()
        while name not in inputs and name in producers and name not in seen:
            seen.add(name)
            node = producers[name]
            if node.op_type not in _VALUE_KEEPING_OPS or name != node.output[0] or not node.input:
                break
            name = node.input[0]
        if name in inputs:
            found[output.name] = name
    return found


def recurrent_feed(model) -> dict[str, str]:
    """input -> the output of the same shape and dtype that, by its name, is that input's next value (an output that
    is the input passed straight through is no next value)."""
    io = onnxinfo.graph_io(model)
    through = _passed_through(model)
    outputs = [(t["name"], _stems(t["name"], _OUT_AFFIXES), t["shape"], t["dtype"]) for t in io["outputs"]]
    feed = {}
    for t in io["inputs"]:
        stems = _stems(t["name"], _IN_AFFIXES)
        match = next((name for name, out_stems, shape, dtype in outputs if name != t["name"] and stems & out_stems
                      and list(shape) == list(t["shape"]) and dtype == t["dtype"]
                      and through.get(name) != t["name"]), None)
        if match:
            feed[t["name"]] = match
    return feed


def _recurrent_findings(model, graph: GraphSpec, loop_feed: dict[str, str]) -> list[Finding]:
    """A graph whose outputs feed its own inputs is judged per sample from the CPU's state unless a loop runs it."""
    import yaml

    missing = {i: o for i, o in recurrent_feed(model).items() if loop_feed.get(i) != o}
    if not missing:
        return []
    pairs = ", ".join(f"input '{i}' <- output '{o}'" for i, o in missing.items())
    looped = graph.size.graph if graph.size else graph.name  # a loop over a graph with sizes names the graph
    declaration = yaml.safe_dump({"loop": {"graph": looped, "feed": {**loop_feed, **missing}}},
                                 default_flow_style=True, sort_keys=False, width=2 ** 16).strip()[1:-1]
    return [Finding("recurrent", "warning", f"graph '{graph.name}'",
                    f"{pairs} (same shape): a recurrent graph, judged per sample from the CPU's state, so the fp16 "
                    "error its state carries from step to step is not measured",
                    f'declare its loop at the top of models/{graph.model}/model.yaml: "{declaration}" '
                    "(docs/pipelines-and-loops.md, Graphs that loop)",
                    "accuracy: a VAD judged frame by frame agreed with the CPU on 100% of frames, in its loop on 68%")]


def size_findings(weights: dict[str, int], graph: GraphSpec, budgets: dict[str, dict[str, Any]]) -> list[Finding]:
    """A graph whose weights in one of its precisions exceed an arch's context budget (socs.yaml context_mb):
    refused before compile, with both fixes in numbers. A graph declared with `split:` is checked as its parts."""
    if specsplit.is_whole(graph) or not budgets:
        return []
    arch, budget = min(budgets.items(), key=lambda item: item[1]["mb"])
    limit = budget["mb"] * split.MB
    findings = []
    for precision in graph.precisions:
        size = weights[precision]
        if size <= limit:
            continue
        parts = max(2, math.ceil(weights[graph.precision] / limit))
        whole = graph.split["of"] if specsplit.is_part(graph) else graph.name
        more = (f"split: {{parts: {graph.split['parts'] * parts}}} on graph '{whole}'" if specsplit.is_part(graph)
                else f"split: {{parts: {parts}}}")
        fix = ([] if precision_table.is_quantized(precision) or "w8a16" in graph.precisions else
               [f"precision: w8a16 would be {_mb(weights['w8a16'])}"])
        fix.append(f"{more} gives parts of about {_mb(weights[graph.precision] / parts)}")
        findings.append(Finding("size", "error", f"graph '{graph.name}' ({precision})",
                                f"{_mb(size)} of weights, over the {budget['mb']:,} MB context budget of {arch} "
                                f"({', '.join(budget['socs'])}; context_mb in {budget['where']})", "; ".join(fix),
                                "compatibility: one context may not hold it (an estimate, not measured on a phone)"))
    return findings


def _mb(size: float) -> str:
    mb = size / split.MB
    return f"{mb:,.1f} MB" if mb < 100 else f"{mb:,.0f} MB"


def memory_estimates(model, graph: GraphSpec, budgets: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{precision: the resident memory a loaded context of this graph needs} (graphs/memory.py), on the smallest
    VTCM of the chips it builds for (8 MB where it builds for none)."""
    vtcm = min((b.get("vtcm_mb", 8) for b in budgets.values()), default=8)
    return memory.estimates(model, graph.precisions, vtcm)


def parts_that_fit(model, precision: str, overhead: int, limit: int, most: int = 64) -> int | None:
    """The fewest `split: {parts: N}` whose largest part (its weights as the split cuts them, plus this graph's I/O,
    run lists and spill: kept whole, an upper bound) fits `limit`; None when no split up to `most` parts does."""
    for parts in range(2, most + 1):
        try:
            cut = split.plan(model, split.balanced_cuts(model, parts, precision), precision)
        except split.SplitError:
            return None  # no more places to cut
        if max(p.weight_bytes for p in cut) + overhead <= limit:
            return parts
    return None


def memory_findings(model, estimates: dict[str, dict[str, Any]], graph: GraphSpec,
                    budgets: dict[str, dict[str, Any]], sized: set[str]) -> list[Finding]:
    """A graph whose estimated resident memory at a precision exceeds the smallest memory limit (socs.yaml
    memory_mb) of the chips it builds for: refused before compile, pointed at split:. A precision whose weights
    alone are over the context budget is told so once, by the size rule."""
    if specsplit.is_whole(graph) or not budgets:
        return []
    arch, budget = min(budgets.items(), key=lambda item: item[1]["memory_mb"])
    limit = budget["memory_mb"] * memory.MB
    findings = []
    for precision, est in estimates.items():
        where = f"graph '{graph.name}' ({precision})"
        if est["resident"] <= limit or where in sized:
            continue
        parts = parts_that_fit(model, precision, est["resident"] - est["const"], limit)
        whole = graph.split["of"] if specsplit.is_part(graph) else graph.name
        more = ("no split of it fits (each part keeps its I/O)" if parts is None else
                f"split: {{parts: {graph.split['parts'] * parts}}} on graph '{whole}'" if specsplit.is_part(graph)
                else f"split: {{parts: {parts}}}")
        findings.append(Finding(
            "memory", "error", where,
            f"needs about {memory.mb(est['resident'])} resident when loaded (estimated: weights "
            f"{memory.mb(est['const'])}, I/O {memory.mb(est['io'])}, spill {memory.mb(est['spill_fill'])}), over the "
            f"{budget['memory_mb']:,} MiB limit of {arch} ({', '.join(budget['socs'])}; memory_mb in "
            f"{budget['memory_where']})",
            f"{more}, or smaller inputs (the I/O and activations scale with them)",
            "compatibility: the phone refuses to allocate it at load (QNN error 1002; an estimate, not measured "
            "on a phone)"))
    return findings


def _in_gelu(erf, consumers, constants, numpy_helper) -> bool:
    """Erf -> Add(1) -> Mul(x) -> Mul(0.5), in any order of the two Muls: the pattern HTP fuses."""
    frontier, halves = [erf], 0
    for _ in range(3):
        nxt = [c for n in frontier for c in consumers.get(n.output[0], []) if c.op_type in ("Add", "Mul")]
        halves += sum(1 for n in nxt if n.op_type == "Mul"
                      and any(_scalar(constants.get(i), numpy_helper) == 0.5 for i in n.input))
        frontier = nxt
    return halves > 0


def _scalar(tensor, numpy_helper) -> float | None:
    if tensor is None:
        return None
    value = numpy_helper.to_array(tensor)
    return float(value.reshape(-1)[0]) if value.size == 1 else None
