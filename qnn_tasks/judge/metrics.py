"""Compare outputs: max-abs, mean-abs, cosine similarity and SNR, plus non-finite detection."""
from __future__ import annotations

from typing import Any

import numpy as np

from qnn_tasks.modelspec.checks import THRESHOLD_KEYS


def compare(reference: np.ndarray, actual: np.ndarray) -> dict[str, Any]:
    """Metrics of `actual` against `reference` (same shape), computed in float64."""
    ref = np.asarray(reference, dtype=np.float64)
    got = np.asarray(actual, dtype=np.float64)
    for side, values in (("actual", got), ("reference", ref)):  # a NaN reference would pass every threshold
        bad = ~np.isfinite(values)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            return {"max_abs": float("inf"), "mean_abs": float("inf"), "cosine": float("nan"), "snr_db": float("-inf"),
                    "non_finite": int(bad.sum()), "non_finite_in": side, "first_non_finite": list(first)}
    diff = np.abs(ref - got)
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape)) if diff.size else ()
    return {"max_abs": float(diff.max(initial=0.0)), "mean_abs": float(diff.mean()) if diff.size else 0.0,
            "cosine": cosine(ref, got), "snr_db": snr_db(ref, got), "non_finite": 0, "worst_index": list(worst)}


def non_finite_samples(stacked: np.ndarray) -> list[int]:
    """The samples (first axis) holding a NaN or an Inf."""
    values = np.asarray(stacked)
    return [int(i) for i in np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def snr_db(reference: np.ndarray, actual: np.ndarray) -> float:
    signal = float(np.sum(np.square(reference, dtype=np.float64)))
    noise = float(np.sum(np.square(np.asarray(reference, np.float64) - actual)))
    if noise == 0.0:
        return float("inf")
    if signal == 0.0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))


# the CPU checks' thresholds: cpucheck's where model.yaml's `cpucheck:` sets none, and a split's parts chained against
# the whole graph
DEFAULT_TOLERANCE = {"max_abs": 1e-3, "min_cosine": 0.9999}

METRIC_OF = {"max_abs": "max_abs", "mean_abs": "mean_abs", "min_cosine": "cosine", "min_snr_db": "snr_db"}


def violations(output: str, metrics: dict[str, Any], thresholds: dict[str, float]) -> list[str]:
    """Human lines for each threshold a metric breaks: output, metric, value, threshold."""
    lines = []
    if metrics.get("non_finite"):
        where = " in the reference" if metrics.get("non_finite_in") == "reference" else ""
        lines.append(f"output '{output}': {metrics['non_finite']} NaN/Inf values{where} (first at index "
                     f"{metrics['first_non_finite']})")
        return lines
    for key, limit in thresholds.items():
        value = metrics[METRIC_OF[key]]
        # written as "not within" so that a NaN metric breaks the threshold instead of passing it
        broken = not value <= limit if THRESHOLD_KEYS[key] == "max" else not value >= limit
        if broken:
            word = "above" if THRESHOLD_KEYS[key] == "max" else "below"
            lines.append(f"output '{output}': {METRIC_OF[key]} = {value:.6g} is {word} the threshold {limit:g}")
    return lines
