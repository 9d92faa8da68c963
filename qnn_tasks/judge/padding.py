"""Zero-padded audio windows as the cause of a disagreement: which samples they are, and what to tell a person.

With `pad: true` a clip's last partial window is filled with zeros; a front end that normalises per window then
works on near-zero energies and near-equal values, which fp16 keeps only as rounding noise. judge/media.py
records each padded sample (cpucheck's record: `samples_read.audio.padded`); diagnose names them as the cause
of a diverging node, simverify when the target passes without them, both with the `pad_min` that drops them.
"""
from __future__ import annotations

from typing import Any

from qnn_tasks.spec.project import GraphSpec

SHOWN = 3  # sites named before "and N more"

WHY = ("a window of mostly zeros gives near-zero energies and near-equal values, of which fp16 (about 3 significant "
       "digits) keeps only rounding noise where the CPU's float32 keeps the value: the disagreement is on the padding, "
       "not on audio")


def recorded(cpucheck_record: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    """The padded samples cpucheck read (its record), by sample index; {} when none were padded."""
    audio = ((cpucheck_record or {}).get("samples_read") or {}).get("audio") or {}
    return {int(row["sample"]): row for row in audio.get("padded") or []}


def numbers(rows: list[dict[str, Any]]) -> str:
    """`sample 5`, or `samples 5, 11, 17 and 2 more`."""
    shown = ", ".join(str(r["sample"]) for r in rows[:SHOWN])
    more = f" and {len(rows) - SHOWN} more" if len(rows) > SHOWN else ""
    return f"sample{'s' if len(rows) > 1 else ''} {shown}{more}"


def windows(rows: list[dict[str, Any]]) -> str:
    """What those samples are: `speech.wav's last window: 244 of 4000 values are audio, the rest padding`."""
    real = sorted({r["real"] for r in rows})
    amount = f"{real[0]}" if len(real) == 1 else f"{real[0]} to {real[-1]}"
    kind = "only" if all(r["only"] for r in rows) else "last" if not any(r["only"] for r in rows) else "last (or only)"
    files = list(dict.fromkeys(r["file"] for r in rows))
    if len(rows) == 1:
        where = f"{files[0]}'s {kind} window"
    else:
        named = ", ".join(files[:SHOWN]) + (f" and {len(files) - SHOWN} more" if len(files) > SHOWN else "")
        where = f"the {kind} windows of {named}"
    return f"{where}: {amount} of {rows[0]['values']} values are audio, the rest padding"


def fix(graph: GraphSpec, rows: list[dict[str, Any]]) -> str:
    """pad_min just above the most real samples those windows hold (at most a frame: drops every partial window);
    pad: false too unless a clip is shorter than a frame (pad: false refuses such a clip)."""
    frame = graph.samples["audio"]["frame"]
    least = min(max(r["real"] for r in rows) + 1, frame)
    either = "" if any(r["only"] for r in rows) else ", or pad: false"
    return (f"set {graph.key}.samples.audio.pad_min: {least} in models/{graph.model}/model.yaml (drops windows of "
            f"fewer than {least} real samples){either}")


def hazard(graph: GraphSpec, rows: list[dict[str, Any]], op: str, node: str, seen: str = "") -> dict[str, str]:
    """diagnose's hint for a node that diverges only on padded windows (`seen`: an element there, in words)."""
    verb = "is" if len(rows) == 1 else "are"
    action = "subtracts near-equal values" if op == "Sub" else "computes on near-zero values"
    return {"hazard": f"padded audio window: {numbers(rows)} {verb} {windows(rows)} (zeros); {op} '{node}' {action} "
                      "there", "why": f"{seen}; {WHY}" if seen else WHY, "fix": fix(graph, rows)}


def passes_without(graph: GraphSpec, rows: list[dict[str, Any]]) -> str:
    """simverify's clause when the target passes once the padded windows are left out."""
    return (f"without {numbers(rows)} ({windows(rows)}) it passes: the NPU and the CPU disagree on the zero padding "
            f"(fix: {fix(graph, rows)})")
