"""Judge NPU outputs against the CPU reference: per-output metrics and thresholds, task-level checks.

Shared by every place outputs come from (host simulator today, a phone later), so a binary
passes or fails by the same rules wherever it ran.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from qnn_tasks.judge import degenerate, metrics, taskchecks
from qnn_tasks.modelspec.project import GraphSpec


def judge(graph: GraphSpec, verify: dict[str, Any], reference: list[dict[str, np.ndarray]],
          actual: list[dict[str, np.ndarray]]) -> tuple[dict[str, Any], list[str]]:
    """Metrics, check results and the list of human-readable violations (empty = pass).

    `verify` is the graph's validated `verify:` section (spec.GraphSpec.verify).
    """
    per_output, violations, flat = {}, [], {}
    for spec in graph.outputs:
        ref = np.stack([r[spec.name] for r in reference])
        got = np.stack([a[spec.name] for a in actual])
        limits = {**verify["thresholds"], **verify["per_output"].get(spec.name, {})}
        per_output[spec.name] = {**metrics.compare(ref, got), "thresholds": limits}
        violations += metrics.violations(spec.name, per_output[spec.name], limits)
        flat[spec.name] = degenerate.constant_output(ref, got)
    not_verified = None
    if flat and all(flat.values()):  # every comparison would pass on such data: it proves nothing
        not_verified = ("not verified: " + "; ".join(f"output '{name}' is {why}" for name, why in flat.items())
                        + f" over {len(actual)} sample(s): nothing distinguishes a working binary from a broken one "
                        "(fix: samples that make the outputs vary)")
        violations.insert(0, not_verified)
    checks = []
    for check in verify["checks"]:
        result = run_check(graph, check, reference, actual)
        checks.append(result)
        if not result["passed"]:
            # a check may explain its own failure (wer shows the first differing transcript)
            violations.append(f"check {result['kind']} on '{check['output']}': " + (
                result.get("failure") or f"{result['value']:.4g} is below the required {result['min']:g} "
                                         f"({result['meaning']})"))
    degenerate_outputs = {name: why for name, why in flat.items() if why}
    return {"metrics": per_output, "checks": checks,
            **({"degenerate": degenerate_outputs} if degenerate_outputs else {}),
            **({"not_verified": not_verified} if not_verified else {})}, violations


def min_cosine(result: dict[str, Any]) -> float | None:
    """The lowest cosine over a judged result's (or a simverify record's) outputs, rounded; None without one."""
    values = [m.get("cosine") for m in (result.get("metrics") or {}).values() if m.get("cosine") is not None]
    return round(min(values), 6) if values else None


def run_check(graph: GraphSpec, check: dict[str, Any], reference: list[dict[str, np.ndarray]],
              actual: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """One task-level check. Array checks see the stacked output; model checks see the graph and every sample."""
    kind = check["kind"]
    if kind in CHECKS or kind == "ctc":
        ref = np.stack([r[check["output"]] for r in reference])
        got = np.stack([a[check["output"]] for a in actual])
        if check.get("slice"):  # a part of each sample's output, e.g. the score columns "..., 4:"
            from qnn_tasks.modelspec.checkopts import parse_slice

            index = (slice(None),) + parse_slice(check["slice"])
            ref, got = ref[index], got[index]
        if kind == "ctc":  # its alphabet file lives in the model folder
            from qnn_tasks.judge.taskchecks import ctc

            return ctc(ref, got, check, graph.model_dir)
        result = CHECKS[kind](ref, got, check)
        return {**result, "slice": check["slice"]} if check.get("slice") else result
    return _model_checks()[kind](graph, check, reference, actual)


def agreement(ref: np.ndarray, got: np.ndarray, check: dict[str, Any]) -> dict[str, Any]:
    """Fraction of samples where CPU and NPU make the same decision (value > threshold)."""
    threshold = float(check.get("threshold", 0.5))
    same = (ref.reshape(len(ref), -1) > threshold) == (got.reshape(len(got), -1) > threshold)
    value = float(same.all(axis=1).mean())
    required = float(check.get("min", 0.99))
    return {"kind": "agreement", "output": check["output"], "value": value, "min": required, "passed": value >= required,
            "meaning": f"share of samples with the same decision at threshold {threshold}",
            "disagreeing_samples": [int(i) for i in np.flatnonzero(~same.all(axis=1))][:20]}


def ranking(ref: np.ndarray, got: np.ndarray, check: dict[str, Any]) -> dict[str, Any]:
    """Share of samples whose `top` nearest neighbours (by cosine, in order) are unchanged.

    Only the top of the ranking is meaningful: far neighbours of unrelated sentences sit at
    near-equal similarity (e.g. -0.0326 vs -0.0328) and swap under any rounding.
    """
    top = int(check.get("top", 1))
    def order(x: np.ndarray) -> np.ndarray:
        flat = x.reshape(len(x), -1).astype(np.float64)
        flat /= np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-12)
        sim = flat @ flat.T
        np.fill_diagonal(sim, -np.inf)
        return np.argsort(-sim, axis=1, kind="stable")[:, :top]

    same = (order(ref) == order(got)).all(axis=1)
    value = float(same.mean())
    required = float(check.get("min", 1.0))
    return {"kind": "ranking", "output": check["output"], "value": value, "min": required, "passed": value >= required,
            "meaning": f"share of samples whose {top} nearest neighbour(s) are unchanged",
            "disagreeing_samples": [int(i) for i in np.flatnonzero(~same)][:20]}


def top1(ref: np.ndarray, got: np.ndarray, check: dict[str, Any]) -> dict[str, Any]:
    """Share of predictions (argmax along `axis`, by default the last) that CPU and NPU make the same.

    A [1, classes] output gives one prediction per sample; a [1, frames, classes] output one per frame.
    With `score_threshold`, a prediction counts only where either side's best score reaches it: a detector's
    thousands of background candidates score near zero, and their argmax is noise on both sides.
    """
    axis = int(check.get("axis", -1))
    ref_class, got_class = np.argmax(ref, axis=axis), np.argmax(got, axis=axis)
    same = ref_class == got_class
    counted = np.ones_like(same, dtype=bool)
    if check.get("score_threshold") is not None:
        counted = np.maximum(np.max(ref, axis=axis), np.max(got, axis=axis)) >= float(check["score_threshold"])
    value = float(same[counted].mean()) if counted.any() else 0.0
    required = float(check.get("min", 0.99))
    per_sample = (same | ~counted).reshape(len(same), -1).all(axis=1)  # ignored predictions do not disagree
    result = {"kind": "top1", "output": check["output"], "value": value, "min": required, "passed": value >= required,
              "meaning": "share of predictions (argmax) the NPU makes the same as the CPU",
              "disagreeing_samples": [int(i) for i in np.flatnonzero(~per_sample)][:20]}
    if check.get("score_threshold") is not None:
        threshold = float(check["score_threshold"])
        result.update(meaning=f"share of predictions (argmax) scoring {threshold:g} or more that the NPU makes the "
                              "same as the CPU", counted=int(counted.sum()), ignored=int((~counted).sum()))
        if not counted.any():
            result.update(passed=False, failure=f"no prediction scores {threshold:g} or more on either side, so "
                                                "nothing was compared (fix: lower score_threshold or check the samples)")
    agreed = same | ~counted
    if not agreed.all():  # the first prediction that differs (a loop's first differing token): both classes
        where = np.unravel_index(int(np.flatnonzero(~agreed.reshape(-1))[0]), same.shape)
        result["first_difference"] = {"sample": int(where[0]), "cpu": int(ref_class[where]), "npu": int(got_class[where])}
    return result


# (ref, got, check) -> result: checks on the stacked output arrays alone
CHECKS = {"agreement": agreement, "ranking": ranking, "top1": top1, "elements": taskchecks.elements,
          "detection": taskchecks.detection}


def _model_checks() -> dict[str, Any]:
    """(graph, check, reference, actual) -> result: checks that call the model's own code (imported when used)."""
    from qnn_tasks.judge.speech import wer_check

    return {"wer": wer_check}
