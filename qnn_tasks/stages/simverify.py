"""simverify: judge the simulator's kept outputs against the CPU reference (metrics, thresholds, checks).

Inputs and reference outputs come from the cpucheck stage (real inputs, CPU outputs of the same
simplified graph, or the original's float64 outputs when cpucheck found its float32 run the weaker side); the NPU
outputs from the simulate stage. Judging is cheap: a threshold edit re-runs this stage only. A failure against a
float32 reference is judged again against the simplified graph in float64: the NPU passes if the float32
reference's own error was what differed, and otherwise the message gives both distances from that truth.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.judge import padding, sample_store, verification
from qnn_tasks.modelspec import precision_table
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.run import calls, records
from qnn_tasks.run.calls import StageCall


def quantized_hint(graph: GraphSpec, precision: str = "w8a16") -> str:
    """What to try when quantized weights fail, from the graph's own calibration settings (never what is already
    set); 4-bit weights are told about 8-bit ones first."""
    calibration = graph.section("calibration")
    tries = [] if calibration.get("per_channel") else ["calibration.per_channel: true"]
    if precision != "w8a16" and "w8a16" not in graph.precisions:
        tries.append("precision: w8a16 (8-bit weights)")
    samples = calibration.get("samples")
    tries += [f"more and more varied calibration samples (calibration.samples is {samples})" if samples
              else "more and more varied calibration samples",
              "a finite mask constant (e.g. -1e4) at export", "or keep this graph fp16"]
    bits = precision_table.BY_NAME[precision].weight_bits
    return f"; {bits}-bit weights lose accuracy here: try " + ", ".join(tries)


def run(graph: GraphSpec, verify: dict[str, Any], outputs_file: Path, reference_file: Path, simulation: Path,
        target: str, precision: str, lint_record: Path | None = None, inputs_file: Path | None = None,
        simplified: Path | None = None, cpucheck_record: Path | None = None) -> dict[str, Any]:
    sim = records.trusted(simulation, f"doit simulate:{target}")
    outputs = sample_store.load(outputs_file)
    reference = sample_store.load(reference_file, limit=len(outputs))
    result, violations = verification.judge(graph, verify, reference, outputs)
    cpucheck = records.read(cpucheck_record) if cpucheck_record else None  # the record that made the reference
    made_by = reference_from(cpucheck)
    truth: dict[str, Any] = {}
    if violations and "float64" not in made_by and inputs_file and simplified \
            and not precision_table.is_quantized(precision):
        # float32 is in doubt only now: is the NPU off the truth, or the float32 CPU reference? (8-bit weights lose
        # orders of magnitude more than float32 rounding: not worth a CPU run there)
        truth = against_float64(graph, verify, simplified, inputs_file, reference, outputs, violations)
        if truth.get("result") is not None and not truth["violations"]:
            result, violations = truth["result"], []
            made_by = f"{truth['from']} (the float32 CPU reference is the weaker side)"
    record = {"device": sim.get("device"), "samples": len(outputs), **result, "timing": sim.get("timing"),
              "reference_from": made_by,
              "outputs_file": str(outputs_file), "reference_file": str(reference_file), "log": sim.get("log"),
              "violations": violations}
    if truth:
        record["float64"] = {k: v for k, v in truth.items() if k not in ("result", "violations")}
        if not violations:
            record["console"] = [truth["note"]]
    notes = [check["note"] for check in result["checks"] if check.get("note")]  # a check's doubt about its own setup
    if notes:
        record["warnings"] = notes
    if violations:
        said = f" (judged against {made_by})" if "float64" in made_by else ""
        said += f"; {truth['note']}" if truth.get("note") else ""
        said += padded_windows(graph, verify, reference, outputs, cpucheck, record)
        if graph.auto:  # a candidate of `precision: auto` that misses its checks is not chosen: a verdict, not a failure
            record["rejected"] = f"{precision} misses its checks: " + "; ".join(violations) + said
            return record
        raise StageError(f"simverify of {target} failed: " + "; ".join(violations) + said
                         + (quantized_hint(graph, precision) if precision_table.is_quantized(precision) else "")
                         + (accuracy_hints(lint_record) if lint_record else "")
                         + f" (to find the first diverging node: doit diagnose:{target})", record)
    return record


def padded_windows(graph: GraphSpec, verify: dict[str, Any], reference: list[dict[str, Any]],
                   outputs: list[dict[str, Any]], cpucheck: dict[str, Any] | None, record: dict[str, Any]) -> str:
    """"; without sample 5 (...) it passes ... (fix: pad_min)" when the failure lives on the zero-padded audio windows
    alone: judged again without them (second judgements of the same numbers, no run). The pad_min named is the least
    that drops each padded sample that fails beside the unpadded ones and after which the rest passes, not one that
    drops every padded sample."""
    padded = padding.recorded(cpucheck)
    rows = [padded[i] for i in range(len(outputs)) if i in padded]
    if not rows or len(rows) == len(outputs) or not passes_without(graph, verify, reference, outputs, rows):
        return ""
    # a padded sample fails when the samples with no padding fail once it joins them
    fails = [r for r in rows if not passes_without(graph, verify, reference, outputs, [x for x in rows if x is not r])]
    start = padding.least_pad_min(graph, fails) if fails else 1
    options = padding.choices(graph, rows, start)
    least = next((p for p in options if passes_without(graph, verify, reference, outputs,
                                                       padding.dropped(graph, rows, p))), options[-1])
    gone = padding.dropped(graph, rows, least)
    # one that passes beside the unpadded ones but holds fewer real samples than a failing one goes only as pad_min
    # is a threshold
    forced = {r["sample"] for r in padding.dropped(graph, rows, start)} - {r["sample"] for r in fails}
    failing = [r for r in gone if r["sample"] not in forced]
    record["padded_windows"] = {"samples": [r["sample"] for r in gone], "passes_without": True,
                                "pad_min": padding.least_pad_min(graph, failing), "keeps": len(outputs) - len(gone)}
    return "; " + padding.passes_without(graph, gone, failing, rows, len(outputs))


def passes_without(graph: GraphSpec, verify: dict[str, Any], reference: list[dict[str, Any]],
                   outputs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> bool:
    """Whether the outputs pass judged without the samples of `rows`."""
    out = {r["sample"] for r in rows}
    keep = [i for i in range(len(outputs)) if i not in out]
    if not keep:
        return False
    return not verification.judge(graph, verify, [reference[i] for i in keep], [outputs[i] for i in keep])[1]


def against_float64(graph: GraphSpec, verify: dict[str, Any], simplified: Path, inputs_file: Path,
                    reference: list[dict[str, Any]], outputs: list[dict[str, Any]], violations: list[str]) -> dict[str, Any]:
    """The NPU judged again against the simplified graph evaluated in float64 (graphs/float64.py).

    `result`/`violations`: the judgement against that truth; `note`: both numbers for each output, the NPU's and
    the float32 CPU reference's distance from it. Costs one CPU run of the graph, paid only after a failure.
    """
    import numpy as np
    import onnx

    from qnn_tasks.graphs import float64
    from qnn_tasks.judge import metrics

    try:
        exact, how = float64.evaluate(onnx.load(str(simplified)), sample_store.load(inputs_file, limit=len(outputs)),
                                      Path(simplified).name)
    except RuntimeError as err:
        return {"from": None, "note": str(err)}
    exact = [{spec.name: e[spec.name] for spec in graph.outputs} for e in exact]
    judged, still = verification.judge(graph, verify, exact, outputs)
    parts, sides = [], {}
    for spec in graph.outputs:
        truth = np.stack([e[spec.name] for e in exact])
        npu = metrics.compare(truth, np.stack([o[spec.name] for o in outputs]))["max_abs"]
        cpu = metrics.compare(truth, np.stack([r[spec.name] for r in reference]))["max_abs"]
        sides[spec.name] = {"npu_max_abs": npu, "cpu_float32_max_abs": cpu}
        if any(line.startswith(f"output '{spec.name}'") for line in violations):
            parts.append(f"output '{spec.name}': NPU max_abs {npu:.3g}, float32 CPU reference {cpu:.3g}")
    if still:
        note = f"against {how} too: " + "; ".join(parts) if parts else f"against {how} too: " + "; ".join(still)
    else:
        note = (f"the float32 CPU reference's own error is what differed (against {how}: " + "; ".join(parts)
                + "): the NPU passes against the float64 evaluation")
    return {"from": how, "max_abs": sides, "note": note, "result": judged, "violations": still}


def reference_from(cpucheck: dict[str, Any] | None) -> str | None:
    """What made the CPU reference (cpucheck's record): the float32 simplified graph, or a float64 evaluation of
    the original when cpucheck found the original's float32 rounding to be the weaker side."""
    made = (cpucheck or {}).get("reference_from")
    return made if made and "float64" in made else "the simplified graph in float32 on CPU"


def accuracy_hints(lint_record: Path) -> str:
    """Lint's accuracy warnings that a built-in rewrite fixes: the likely cause of a failed comparison, named."""
    lint = records.read(lint_record) or {}
    fixes = sorted({f["fix"] for f in lint.get("findings", [])
                    if f.get("severity") == "warning" and str(f.get("why", "")).startswith("accuracy")
                    and "rewrites" in f.get("fix", "")})
    return f"; lint warned of fp16 accuracy hazards: {'; '.join(fixes)}" if fixes else ""


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), a["verify"], Path(a["outputs"]), Path(a["reference"]), Path(a["simulation"]),
               call.target, a["precision"], calls.path(a, "lint"), calls.path(a, "inputs"), calls.path(a, "simplified"),
               calls.path(a, "cpucheck"))
