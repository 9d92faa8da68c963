"""Where the latency estimate shows: from a graph's lint record (its ONNX features, recorded before any compile),
per target in report.json and manifest.json, and in `doit list`'s line of each compile. Pure Python."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from qnn_tasks.latency.estimate import estimate, realtime_factor

LINT_KEY = "latency_features"  # the lint record's field holding features.graph_features of the simplified ONNX


def lint_fields(model) -> dict[str, Any]:
    """The lint record's latency features ({} when the graph's shapes cannot be read: no estimate, lint goes on)."""
    from qnn_tasks.latency.features import graph_features

    try:
        return {LINT_KEY: graph_features(model)}
    except Exception:  # noqa: BLE001 - an estimate is never worth failing lint for
        return {}


def latency_ms(lint: dict[str, Any] | None, soc: str, precision: str,
               audio_seconds: float | None = None) -> dict[str, Any] | None:
    """latency_ms of a target from its graph's lint record (None before lint ran), with the estimated real-time
    factor when the graph has a real-time unit (`options.audio_seconds_per_sample`)."""
    features = (lint or {}).get(LINT_KEY)
    if not features:
        return None
    try:
        found = estimate(features, soc, precision)
    except (OSError, ValueError):  # no readable fit.json (a broken install): no estimate, the build goes on
        return None
    rtf = realtime_factor(found, audio_seconds)
    if rtf is not None:
        found["realtime_factor"] = {"estimate": rtf, "audio_seconds_per_inference": audio_seconds}
    return found


def with_phone(latency: dict[str, Any] | None, verify: dict[str, Any] | None) -> dict[str, Any] | None:
    """The estimate with what `doit verify` measured on phones beside it (per inference median, ms)."""
    measured = [{"device": d.get("model"), "soc_model": d.get("soc_model"),
                 "median_ms": round(1000 * d["timing"]["per_inference_median_s"], 3)}
                for d in (verify or {}).get("devices") or []
                if (d.get("timing") or {}).get("per_inference_median_s") is not None]
    if latency is None or not measured:
        return latency
    return {**latency, "phone": measured}


def text(latency: dict[str, Any] | None) -> str:
    """One line for people: `~1.2 ms on the phone (estimated 0.8-1.9 ms)`, the refusal, or ""."""
    if not latency:
        return ""
    if latency.get("estimate") is None:
        return f"no phone-time estimate: {latency.get('refused')}"
    wide = " (band widened: " + "; ".join(latency["widened"]) + ")" if latency.get("widened") else ""
    return (f"phone ~{latency['estimate']:g} ms, estimated {latency['low']:g}-{latency['high']:g} ms "
            f"from AI Hub's published timings{wide}")


def doc_text(lint_record: Path | str, soc: str, precision: str) -> str:
    """`doit list`'s words for a compile: the estimate from the graph's last lint ("" before its first lint).
    For the doc only (never a key or a dependency), as plan/stageplans.last_weights reads the same record."""
    try:
        record = json.loads(Path(lint_record).read_text())
    except (OSError, ValueError):
        return ""
    return text(latency_ms(record if isinstance(record, dict) else None, soc, precision))
