"""cpucheck: the simplified ONNX on CPU must match the original model on real inputs.

The inputs are the declared sample files (model.yaml `samples:`) or the model's own `samples()`;
the original model's outputs come from its `reference()` (PyTorch or the packaged ONNX) or, for a
packaged ONNX without one, from the original ONNX on CPU (packaged.reference). The simplified
graph's CPU outputs on the same inputs become the reference every chip is verified against later.
When they differ and the original is an ONNX, both are measured against the original evaluated in float64
(graphs/float64.py): if the simplified graph is within the thresholds of that truth, the original's own float32
rounding was what differed (e.g. a variance cancelling at a large mean, which the rewrite fixed), the check passes
saying so with both numbers, and the float64 outputs become the reference. Only a failed comparison pays for it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.graphs import modelcode, packaged
from qnn_tasks.graphs.cpu import run_onnx_cpu
from qnn_tasks.judge import degenerate, fitting, metrics, sample_store
from qnn_tasks.judge.inputs import real_inputs
from qnn_tasks.judge.metrics import DEFAULT_TOLERANCE
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.plan.targets import upstream_references
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall


def run(graph: GraphSpec, source: Path | None, simplified: Path, inputs_out: Path, reference_out: Path) -> dict[str, Any]:
    ctx = modelcode.ModelContext(graph=graph, source_path=source, options=dict(graph.options))
    notes: dict[str, Any] = {}
    inputs, where = real_inputs(graph, ctx, upstream_references(graph), notes)
    inputs, fitted = fitting.fit(inputs, graph, where)
    sample_store.check(inputs, graph.inputs, where)
    flat = degenerate.constant_inputs(inputs)
    if flat:
        raise StageError(f"{where}: {flat}: the NPU and the CPU agree on such inputs whatever the binary does, so "
                         "nothing would be verified (fix: samples that vary, e.g. clips that are not silent)",
                         {"samples": len(inputs), "samples_from": where, "not_verified": flat})
    by_code = graph.has_code and modelcode.has_function(graph, "reference") or not (graph.source and graph.source.file)
    if by_code:
        original, by = modelcode.call(graph, "reference", ctx, inputs), f"{graph.model_code}:reference()"
    else:
        original, by = packaged.reference(graph, source, inputs), f"the original {source.name} on CPU"
    cpu = run_onnx_cpu(simplified, inputs)

    thresholds = {**DEFAULT_TOLERANCE, **graph.section("cpucheck")}
    per_output, problems, broken = {}, [], []
    for spec in graph.outputs:
        missing = [i for i, o in enumerate(original) if spec.name not in o]
        if missing:
            raise StageError(f"{by} returned no '{spec.name}' for sample {missing[0]}")
        ref, got = stacked(original, spec.name), stacked(cpu, spec.name)
        if list(got.shape[1:]) != list(spec.shape):
            raise StageError(f"output '{spec.name}': the simplified ONNX gives shape {list(got.shape[1:])}, model.yaml "
                             f"says {list(spec.shape)} (fix: {graph.key}.outputs.{spec.name}.shape)")
        if ref.shape != got.shape:
            raise StageError(f"output '{spec.name}': original model gives shape {list(ref.shape[1:])}, "
                             f"simplified ONNX gives {list(got.shape[1:])}")
        per_output[spec.name] = metrics.compare(ref, got)
        found = metrics.violations(spec.name, per_output[spec.name], thresholds)
        problems += found
        broken += [spec.name] if found else []
    record = {"samples": len(inputs), "samples_from": where, "reference_from": by, "thresholds": thresholds,
              "metrics": per_output, **({"samples_read": notes} if notes else {}), **({"fitted": fitted} if fitted else {})}
    reference = cpu
    if problems and not by_code:  # float32 is in doubt: measure both sides against float64
        truth = against_float64(graph, source, inputs, original, cpu, thresholds, broken)
        record["float64"] = {k: v for k, v in truth.items() if k != "outputs"}
        if truth.get("outputs") is not None and not truth["problems"]:
            record["reference_from"] = f"{truth['from']} (the float32 original is the weaker side)"
            record["console"] = [truth["note"]]
            reference = [{k: np.asarray(v).astype(np.asarray(c[k]).dtype) for k, v in t.items()}
                         for t, c in zip(truth["outputs"], cpu)]
            problems = []
    if problems:
        extra = f"; {record['float64']['note']}" if record.get("float64", {}).get("note") else ""
        bad = {name: metrics.non_finite_samples(stacked(original, name)) for name in (o.name for o in graph.outputs)}
        if any(bad.values()):  # nothing to compare there: the original is what fails, not the simplification
            raise StageError(original_fails(graph, by, bad, inputs, notes, original, cpu, thresholds, extra), record)
        raise StageError(f"cpucheck of graph '{graph.name}': simplified ONNX differs from the original model: "
                         + "; ".join(problems) + extra + f" (fix the export, or loosen {graph.key}.cpucheck)", record)
    sample_store.save(inputs_out, inputs)
    sample_store.save(reference_out, reference)
    return record


def original_fails(graph: GraphSpec, by: str, bad: dict[str, list[int]], inputs: list[dict[str, np.ndarray]],
                   notes: dict[str, Any], original: list[dict[str, np.ndarray]], cpu: list[dict[str, np.ndarray]],
                   thresholds: dict[str, float], note: str = "") -> str:
    """The failure when the original model itself returns NaN/Inf: on which samples (a padded audio window says how
    much of it is audio, a length input its value), whether the simplified ONNX matches on the others, and a fix:
    the pad_min that drops those windows when they all are padded ones, else the model or the samples. `note`: the
    float64 comparison's, when one was made."""
    from qnn_tasks.judge import padding

    samples = sorted({i for found in bad.values() for i in found})
    outputs = ", ".join(f"'{name}'" for name, found in bad.items() if found)
    padded = padding.recorded({"samples_read": notes})
    rows = [padded[i] for i in samples if i in padded]
    lengths = ((graph.samples or {}).get("audio") or {}).get("lengths")
    if len(rows) == len(samples):
        which = f"{padding.numbers(rows)} ({padding.windows(rows)})"
    else:
        def real(i: int) -> str:  # how much of the sample is audio, where it has a real length
            if i in padded:
                return f" ({padded[i]['real']} of {padded[i]['values']} values are audio)"
            return f" ({lengths} is {int(np.asarray(inputs[i][lengths]).reshape(-1)[0])})" if lengths else ""
        shown = samples[:padding.SHOWN]
        which = (f"sample{'s' if len(samples) > 1 else ''} " + ", ".join(f"{i}{real(i)}" for i in shown)
                 + (f" and {len(samples) - len(shown)} more" if len(samples) > len(shown) else ""))
    said = (f"cpucheck of graph '{graph.name}': the original model fails, not the simplification: {by} returns "
            f"non-finite values (NaN/Inf) in output {outputs} on {which}, so there is nothing to compare the "
            "simplified ONNX with")
    keep = [i for i in range(len(original)) if i not in set(samples)]
    still = [line for o in graph.outputs for line in metrics.violations(
        o.name, metrics.compare(stacked([original[i] for i in keep], o.name), stacked([cpu[i] for i in keep], o.name)),
        thresholds)] if keep else []
    said += (f"; on the other samples the simplified ONNX differs too: {'; '.join(still)}" if still else "") + note
    finite = "make the model finite on such inputs (e.g. an epsilon where it takes a log or divides)"
    if len(rows) == len(samples):
        every = list(padded.values())
        return said + f" (fix: {padding.fix(graph, rows, every, len(original))}; or {finite})"
    return said + f" (fix: {finite}, or leave those samples out of {graph.key}.samples)"


def stacked(samples: list[dict[str, np.ndarray]], name: str) -> np.ndarray:
    return np.stack([np.asarray(s[name]) for s in samples])


def against_float64(graph: GraphSpec, source: Path | None, inputs: list[dict[str, np.ndarray]],
                    original: list[dict[str, np.ndarray]], cpu: list[dict[str, np.ndarray]],
                    thresholds: dict[str, float], broken: list[str]) -> dict[str, Any]:
    """The original ONNX in float64, both float32 sides measured against it: which one is off.

    `problems` lists the thresholds the simplified graph still breaks against the float64 truth (empty: the
    original's own float32 rounding was what differed); `note` says so with both numbers for each broken output.
    """
    try:
        truth, how = packaged.reference_float64(graph, source, inputs)
    except RuntimeError as err:
        return {"from": None, "problems": [], "note": str(err)}
    per_output, problems, parts = {}, [], []
    for spec in graph.outputs:
        exact = stacked(truth, spec.name)
        sides = {"original_float32": metrics.compare(exact, stacked(original, spec.name)),
                 "simplified_float32": metrics.compare(exact, stacked(cpu, spec.name))}
        per_output[spec.name] = sides
        problems += metrics.violations(spec.name, sides["simplified_float32"], thresholds)
        if spec.name in broken:
            parts.append(f"output '{spec.name}': original float32 max_abs {sides['original_float32']['max_abs']:.3g}, "
                         f"simplified float32 {sides['simplified_float32']['max_abs']:.3g}")
    if problems:
        note = f"against {how}: " + "; ".join(parts)
    else:
        note = ("the original's own float32 error is what differs (against " + how + ": " + "; ".join(parts)
                + "): the float64 evaluation is the reference")
    return {"from": how, "metrics": per_output, "problems": problems, "note": note, "outputs": truth}


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), calls.path(a, "source"), Path(a["simplified"]), Path(a["inputs"]), Path(a["reference"]))
