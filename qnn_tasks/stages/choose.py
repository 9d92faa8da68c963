"""choose: `precision: auto` on one chip — the smallest binary among the candidates that passed their checks.

Every candidate (default w4a16-mixed, w8a16-mixed, fp16) was built and verified on this chip like any variant; a
candidate that missed its checks was recorded `rejected` (not a failed build). This stage reads their verdicts and
their binaries' sizes and picks the smallest that passed (ties: the order the model gave). What the search cost is
data: the compiles spent (each candidate's binary, and its repair's) and the seconds of those stages. No passing
candidate fails the stage in one line naming each candidate's result. `doit dist` ships only the chosen binary.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.judge import verification
from qnn_tasks.run import records
from qnn_tasks.run.calls import StageCall
from qnn_tasks.run.status import Status, good

COST_STAGES = ("repair", "quantize", "context", "simulate", "simverify")  # the stages a candidate's verdict took


def run(graph: str, soc: str, candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """Judge `candidates` (in the model's order: precision, target, skip, and their stage records) on `soc`."""
    found = [_candidate(c) for c in candidates]
    passing = [c for c in found if c["passed"]]
    record = {"graph": graph, "soc": soc, "order": [c["precision"] for c in found], "candidates": found,
              "compiles": sum(c["compiles"] for c in found),
              "build_seconds": round(sum(c["build_seconds"] for c in found), 1)}
    if not passing:
        said = "; ".join(f"{c['precision']} {c['status']}" + (f" ({c['why']})" if c.get("why") else "") for c in found)
        raise StageError(f"precision auto of '{graph}' on {soc}: no candidate passes its checks: {said} (fix: add a "
                         "wider precision to precision.auto, e.g. fp16, or loosen that precision's verify thresholds)",
                         record)
    chosen = min(passing, key=lambda c: (c["binary_bytes"], found.index(c)))
    record["chosen"] = {k: chosen[k] for k in ("precision", "target", "binary_bytes")}
    record["console"] = [f"chose {chosen['precision']} ({chosen['binary_bytes']:,} bytes) of "
                         + ", ".join(f"{c['precision']} {c['status']}" for c in found)]
    return record


def _candidate(candidate: dict[str, Any]) -> dict[str, Any]:
    """One candidate's verdict, binary size, repair share and cost, from its records."""
    entry: dict[str, Any] = {"precision": candidate["precision"], "target": candidate["target"], "passed": False,
                             "binary_bytes": None, "compiles": 0, "build_seconds": 0.0}
    if candidate.get("skip"):
        return {**entry, "status": Status.SKIPPED, "why": candidate["skip"]}
    read = {stage: records.read(Path(path)) for stage, path in candidate["records"].items()}
    verdict = read.get("simverify") or {}
    status = str(verdict.get("status") or Status.PENDING)
    entry.update(status=status, passed=good(status), min_cosine=verification.min_cosine(verdict),
                 checks=[{k: c.get(k) for k in ("kind", "value", "passed")} for c in verdict.get("checks") or []])
    why = verdict.get("rejected") or verdict.get("error") or (read.get("repair") or {}).get("rejected")
    if why and not entry["passed"]:
        entry["why"] = why
    context = read.get("context") or {}
    sizes = [f.get("size") for name, f in (context.get("files") or {}).items() if name.endswith(".bin")]
    entry["binary_bytes"] = sum(s for s in sizes if isinstance(s, int)) or None
    repair = read.get("repair")
    if repair:
        entry["promoted_share"] = repair.get("share")
    entry["compiles"] = (1 if context else 0) + int((repair or {}).get("compiles") or 0)
    entry["build_seconds"] = round(sum(float((read.get(s) or {}).get("seconds") or 0.0) for s in COST_STAGES), 1)
    if entry["passed"] and entry["binary_bytes"] is None:
        entry.update(passed=False, why="its context record vouches for no binary")
    return entry


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args  # plain data: names and record paths
    return run(a["graph"], a["soc"], a["candidates"])
