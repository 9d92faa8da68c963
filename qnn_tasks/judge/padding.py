"""Zero-padded audio windows as the cause of a disagreement: which samples they are, and what to tell a person.

With `pad: true` a clip's last partial window is filled with zeros; a front end that normalises per window then
works on near-zero energies and near-equal values, which fp16 keeps only as rounding noise. judge/media.py
records each padded sample (cpucheck's record: `samples_read.audio.padded`); diagnose names them as the cause
of a diverging node, simverify when the target passes without them, both with the least `pad_min` that drops the
failing ones (and how many samples it keeps): a larger one would throw away passing samples for nothing.
"""
from __future__ import annotations

from typing import Any

from qnn_tasks.modelspec.project import GraphSpec

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


def tail(row: dict[str, Any], frame: int) -> int:
    """The real samples of a padded sample's last window, the one pad_min is compared with (in a sample of
    stacked windows every window before it is whole)."""
    return row["real"] - (row["values"] - frame)


def least_pad_min(graph: GraphSpec, failing: list[dict[str, Any]]) -> int:
    """The least pad_min that drops every one of these windows: one more than the most real samples they hold."""
    frame = graph.samples["audio"]["frame"]
    return min(max(tail(r, frame) for r in failing) + 1, frame)


def choices(graph: GraphSpec, rows: list[dict[str, Any]], least: int = 1) -> list[int]:
    """Each pad_min from `least` up that drops a different set of these windows, smallest first (the last one
    drops them all)."""
    frame = graph.samples["audio"]["frame"]
    return sorted({v for v in (min(tail(r, frame) + 1, frame) for r in rows) if v >= least})


def dropped(graph: GraphSpec, rows: list[dict[str, Any]], pad_min: int) -> list[dict[str, Any]]:
    """The padded samples among `rows` that `pad_min` drops."""
    frame = graph.samples["audio"]["frame"]
    return [r for r in rows if tail(r, frame) < pad_min]


def fix(graph: GraphSpec, failing: list[dict[str, Any]], padded: list[dict[str, Any]], total: int) -> str:
    """The least pad_min that drops every failing padded sample, and how many of the `total` samples it keeps (a
    larger one would throw away passing samples for nothing). A passing padded sample with fewer real samples than
    a failing one goes too, said so: no value drops the failing ones alone. pad: false too when it drops no more
    (and no clip is shorter than a frame: pad: false refuses such a clip)."""
    least = least_pad_min(graph, failing)
    gone = dropped(graph, padded, least)
    failed = {r["sample"] for r in failing}
    passing = [r for r in gone if r["sample"] not in failed]
    either = "" if len(gone) < len(padded) or any(r["only"] for r in padded) else ", or pad: false"
    said = (f"set {graph.key}.samples.audio.pad_min: {least} in models/{graph.model}/model.yaml (drops windows of "
            f"fewer than {least} real samples: keeps {total - len(gone)} of {total} samples")
    return said + (f"; {also_dropped(graph, passing, failing)}" if passing else "") + ")" + either


def also_dropped(graph: GraphSpec, passing: list[dict[str, Any]], failing: list[dict[str, Any]]) -> str:
    """Why the proposed pad_min drops passing samples: they hold fewer real samples than a failing one."""
    frame = graph.samples["audio"]["frame"]
    held = sorted({tail(r, frame) for r in passing})
    amount = f"{held[0]}" if len(held) == 1 else f"{held[0]} to {held[-1]}"
    one = len(passing) == 1
    said = (f"no pad_min drops only the failing samples: {numbers(passing)} {'passes' if one else 'pass'} with "
            f"{amount} real samples")
    if failing:
        worst = max(failing, key=lambda r: tail(r, frame))
        said += f", fewer than failing sample {worst['sample']}'s {tail(worst, frame)}"
    return said + f", so this least value drops {'it' if one else 'them'} too"


def hazard(graph: GraphSpec, rows: list[dict[str, Any]], padded: list[dict[str, Any]], total: int, op: str, node: str,
           seen: str = "") -> dict[str, str]:
    """diagnose's hint for a node that diverges only on the padded samples `rows` (of the `padded` ones, of `total`
    samples; `seen`: an element there, in words)."""
    verb = "is" if len(rows) == 1 else "are"
    action = "subtracts near-equal values" if op == "Sub" else "computes on near-zero values"
    return {"hazard": f"padded audio window: {numbers(rows)} {verb} {windows(rows)} (zeros); {op} '{node}' {action} "
                      "there", "why": f"{seen}; {WHY}" if seen else WHY, "fix": fix(graph, rows, padded, total)}


def passes_without(graph: GraphSpec, rows: list[dict[str, Any]], failing: list[dict[str, Any]],
                   padded: list[dict[str, Any]], total: int) -> str:
    """simverify's clause when the target passes once the padded samples `rows` are left out (`failing`: those
    that must go; the rest go with them as pad_min is a threshold)."""
    return (f"without {numbers(rows)} ({windows(rows)}) it passes: the NPU and the CPU disagree on the zero padding "
            f"(fix: {fix(graph, failing, padded, total)})")
