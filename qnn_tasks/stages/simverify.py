"""simverify: judge the simulator's kept outputs against the CPU reference (metrics, thresholds, checks).

Inputs and reference outputs come from the cpucheck stage (real inputs, CPU outputs of the same
simplified graph); the NPU outputs from the simulate stage. Judging is cheap: a threshold edit
re-runs this stage only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.judge import checks as verification
from qnn_tasks.judge import samples as sample_store
from qnn_tasks.run import calls, records
from qnn_tasks.run.calls import StageCall
from qnn_tasks.spec.project import GraphSpec


def quantized_hint(graph: GraphSpec) -> str:
    """What to try when 8-bit weights fail, from the graph's own calibration settings (never what is already set)."""
    calibration = graph.calibration or {}
    tries = [] if calibration.get("per_channel") else ["calibration.per_channel: true"]
    samples = calibration.get("samples")
    tries += [f"more and more varied calibration samples (calibration.samples is {samples})" if samples
              else "more and more varied calibration samples",
              "a finite mask constant (e.g. -1e4) at export", "or keep this graph fp16"]
    return "; 8-bit weights lose accuracy here: try " + ", ".join(tries)


def run(graph: GraphSpec, verify: dict[str, Any], outputs_file: Path, reference_file: Path, simulation: Path,
        target: str, precision: str, lint_record: Path | None = None) -> dict[str, Any]:
    sim = records.trusted(simulation, f"doit simulate:{target}")
    outputs = sample_store.load(outputs_file)
    reference = sample_store.load(reference_file, limit=len(outputs))
    result, violations = verification.judge(graph, verify, reference, outputs)
    made_by = reference_from(reference_file)
    record = {"device": sim.get("device"), "samples": len(outputs), **result, "timing": sim.get("timing"),
              "reference_from": made_by,
              "outputs_file": str(outputs_file), "reference_file": str(reference_file), "log": sim.get("log"),
              "violations": violations}
    notes = [check["note"] for check in result["checks"] if check.get("note")]  # a check's doubt about its own setup
    if notes:
        record["warnings"] = notes
    if violations:
        truth = f" (judged against {made_by})" if "float64" in made_by else ""
        raise StageError(f"simverify of {target} failed: " + "; ".join(violations) + truth
                         + (quantized_hint(graph) if precision == "w8a16" else "") + (accuracy_hints(lint_record) if lint_record else "")
                         + f" (to find the first diverging node: doit diagnose:{target})", record)
    return record


def reference_from(reference_file: Path) -> str | None:
    """What made the CPU reference (cpucheck's record beside it): the float32 simplified graph, or a float64
    evaluation of the original when cpucheck found the original's float32 rounding to be the weaker side."""
    made = (records.read(Path(reference_file).with_name("cpucheck.json")) or {}).get("reference_from")
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
               call.target, a["precision"], calls.path(a, "lint"))
