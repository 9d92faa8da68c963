"""The phone-latency estimate: arithmetic on a graph's ONNX features (features.py) with the coefficients that
benchmarks/bench_latency_fit.py fitted to AI Hub Models' published on-device timings (data/latency/fit.json).
Pure Python: planning (`doit list`) may apply it."""
from __future__ import annotations

import math
from typing import Any

# The fit's terms: time = chip_scale x sum(ms_per_unit x term). Convolution and matrix MACs apart (the HTP runs
# them at different rates), the activation elements written (memory traffic) and the elementwise nodes (ops
# the converter does not fuse into a convolution or matrix product each cost a pass over their tensor).
TERMS = ("conv_macs", "matmul_macs", "activations", "elementwise_nodes")


def terms_of(f: dict[str, Any]) -> list[float]:
    """A graph's values of TERMS, from features.graph_features."""
    return [float(f["conv_macs"]), float(f["matmul_macs"]), float(f["activations"]),
            float((f.get("families") or {}).get("elementwise", 0))]


FIT_FILE = "fit.json"
# Ops the NPU runs in a way the fit cannot have seen: no estimate at all
REFUSED_OPS = {"Loop", "If", "Scan", "LSTM", "GRU", "RNN", "NonMaxSuppression", "TopK"}
UNSEEN_SHARE_REFUSED = 0.2  # unseen ops above this share of the nodes: refused; below it: the band is widened
WIDEN = 2.0  # a widened band is this many times as wide (in log terms)


def load_fit() -> dict[str, Any]:
    """The committed fit (qnn_tasks/data/latency/fit.json)."""
    import json
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parent.parent / "data" / "latency" / FIT_FILE).read_text())


_FIT: dict[str, Any] = {}


def fit() -> dict[str, Any]:
    """load_fit(), read once per process."""
    if not _FIT:
        _FIT.update(load_fit())
    return _FIT


def basis(coefficients: dict[str, Any], precision: str) -> str:
    p = coefficients["precisions"][precision]
    return (f"estimated from {p['measurements']} published phone measurements ({len(p['models'])} models, "
            f"AI Hub Models, {coefficients['source']['commit'][:7]})")


def estimate(features: dict[str, Any], chip: str, precision: str,
             coefficients: dict[str, Any] | None = None) -> dict[str, Any]:
    """latency_ms of one graph on one chip at one precision: {estimate, low, high, basis, fit_error} (+ `widened`:
    why the band is wider than the fit's own error); or {estimate: None, refused: why, ...} for a graph, chip or
    precision the fit cannot speak for. Never a measurement: `basis` says what it is."""
    c = coefficients or fit()
    p = c["precisions"].get(precision)
    if p is None:
        return {"estimate": None, "refused": f"no published {precision} timings were fitted "
                f"(fitted: {', '.join(sorted(c['precisions']))})", "basis": "not estimated"}
    shown = {"basis": basis(c, precision), "fit_error": dict(p["fit_error"])}  # a copy: the fit is shared
    if chip not in p["chip_scale"]:
        return {"estimate": None, "refused": f"no published timings on {chip} were fitted "
                f"(fitted: {', '.join(sorted(p['chip_scale']))})", **shown}
    ops = features.get("ops") or {}
    nodes = max(features.get("nodes") or 0, 1)
    flow = sorted(set(ops) & REFUSED_OPS)
    if flow:
        return {"estimate": None, "refused": f"ops no fitted model has: {', '.join(flow)} (control flow, recurrence "
                "or data-dependent ops: the time depends on more than the graph's size)", **shown}
    seen = set(p["ops_seen"])
    unseen = {op: n for op, n in sorted(ops.items()) if op not in seen}
    if sum(unseen.values()) / nodes > UNSEEN_SHARE_REFUSED:
        return {"estimate": None, "refused": f"{sum(unseen.values())} of {nodes} nodes are ops no fitted model has "
                f"({', '.join(unseen)}): an op mix the fit never saw", **shown}
    lo_macs, hi_macs = p["macs_range"]
    macs = max(features["macs"], 1)
    if macs < lo_macs / 10 or macs > hi_macs * 10:
        return {"estimate": None, "refused": f"{macs / 1e9:.3g} GMAC is over 10x outside the fitted "
                f"models' {lo_macs / 1e9:.3g}..{hi_macs / 1e9:.3g} GMAC", **shown}
    widened = []
    if unseen:
        widened.append(f"ops no fitted model has: {', '.join(unseen)}")
    values = terms_of(features)
    for name, value in zip(p["terms"], values):
        lo, hi = p["ranges"][name]
        if not lo <= value <= hi:
            widened.append(f"{name} {value:.3g} outside the fitted {lo:.3g}..{hi:.3g}")
    ms = p["chip_scale"][chip] * sum(k * v for k, v in zip(p["ms_per_unit"], values))
    if ms <= 0:
        return {"estimate": None, "refused": "the graph has none of the work the fit measures (no MACs, "
                "activations or elementwise ops)", **shown}
    log_ms = math.log(ms)
    band = p["band_log"] * (WIDEN if widened else 1.0)
    out = {"estimate": _round(math.exp(log_ms)), "low": _round(math.exp(log_ms - band)),
           "high": _round(math.exp(log_ms + band)), **shown}
    if widened:
        out["widened"] = widened
    return out


def _round(ms: float) -> float:
    return float(f"{ms:.3g}")


def realtime_factor(latency: dict[str, Any], seconds_per_inference: float | None) -> float | None:
    """Estimated seconds of compute per second of real time (audio seconds per inference): < 1 keeps up."""
    if not seconds_per_inference or latency.get("estimate") is None:
        return None
    return _round(latency["estimate"] / 1000.0 / seconds_per_inference)


def chain(latencies: list[dict[str, Any]]) -> dict[str, Any]:
    """A pipeline's latency: its graphs' estimates and bands added (refused if any graph's is)."""
    refused = [lat.get("refused") for lat in latencies if lat.get("estimate") is None]
    if refused or not latencies:
        return {"estimate": None, "refused": refused[0] if refused else "no graphs", "basis": "not estimated"}
    out = {key: _round(sum(lat[key] for lat in latencies)) for key in ("estimate", "low", "high")}
    return {**out, "basis": latencies[0]["basis"], "fit_error": latencies[0]["fit_error"]}
