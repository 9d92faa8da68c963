"""The upgrade diff: the same targets built by two toolchains (e.g. two QNN versions), side by side.

The run's first toolchain is the baseline A; every other one is a candidate B compared with it,
target by target (same graph, precision and chip): status, min cosine, min SNR, task checks,
.bin size, compile time, simulator time. A regression is a target that passes on A and not on B,
a cosine drop beyond the candidate profile's `upgrade.cosine_margin`, or a binary grown beyond
`upgrade.size_growth`. With `upgrade.gate: true` (or QNN_UPGRADE_GATE=1) a regression fails the
report task, so `doit` exits non-zero and CI can block the upgrade.
"""
from __future__ import annotations

from typing import Any

from qnn_tasks import envvalues
from qnn_tasks.run.status import GOOD, Status

GATE_ENV = envvalues.UPGRADE_GATE


def target_figures(t: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one target that a comparison looks at (None where not built)."""
    stages = t.get("stages") or {}
    ctx, sim = stages.get("context") or {}, stages.get("simverify") or {}
    metrics = (sim.get("metrics") or {}).values()
    cosines = [m.get("cosine") for m in metrics if m.get("cosine") is not None]
    snrs = [m.get("snr_db") for m in metrics if m.get("snr_db") is not None]
    checks = sim.get("checks") or []
    return {"status": t.get("status"), "min_cosine": min(cosines) if cosines else None,
            "min_snr_db": min(snrs) if snrs else None,
            "checks_passed": all(c.get("passed") for c in checks) if checks else None,
            "checks": {c.get("kind"): c.get("value") for c in checks},
            "bin_size": ctx.get("bin_size"), "compile_seconds": ctx.get("compile_seconds"),
            "sim_median_s": (sim.get("timing") or {}).get("per_inference_median_s"),
            "qnn_build": (ctx.get("binary") or {}).get("build_id")}


def upgrade_diff(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One block per candidate toolchain (empty with a single toolchain)."""
    chains = data.get("toolchains") or []
    if len(chains) < 2:
        return []
    baseline = chains[0]
    by_key: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for t in data["targets"]:
        by_key[(t["toolchain"], t["graph"], t["precision"], t["soc"]["name"])] = t
    blocks = []
    for candidate in chains[1:]:
        margins = candidate.get("upgrade") or {}
        gate = bool(margins.get("gate")) or bool(envvalues.flag(GATE_ENV))
        rows, regressions = [], []
        for (chain, graph, precision, soc), a in by_key.items():
            if chain != baseline["profile"]:
                continue
            b = by_key.get((candidate["profile"], graph, precision, soc))
            if b is None or a["status"] == Status.SKIPPED:
                continue
            fa, fb = target_figures(a), target_figures(b)
            why = regression(fa, fb, margins)
            row = {"target": a["name"], "graph": graph, "precision": precision, "soc": soc, "a": fa, "b": fb,
                   "regression": why}
            rows.append(row)
            if why:
                regressions.append({"target": a["name"], "why": why})
        blocks.append({"baseline": baseline["profile"], "candidate": candidate["profile"],
                       "qnn": [baseline.get("qnn"), candidate.get("qnn")], "gate": gate,
                       "margins": {k: margins.get(k) for k in ("cosine_margin", "size_growth")},
                       "rows": rows, "regressions": regressions})
    return blocks


def regression(a: dict[str, Any], b: dict[str, Any], margins: dict[str, Any]) -> list[str]:
    """Why B is worse than A for one target (empty: it is not)."""
    why = []
    if a["status"] in GOOD and b["status"] not in GOOD:
        why.append(f"passes with A ({a['status']}), {b['status']} with B")
    margin = margins.get("cosine_margin")
    if a["min_cosine"] is not None and b["min_cosine"] is not None and margin is not None \
            and a["min_cosine"] - b["min_cosine"] > margin:
        why.append(f"min cosine {a['min_cosine']:.6f} -> {b['min_cosine']:.6f} (drop beyond {margin:g})")
    growth = margins.get("size_growth")
    if a["bin_size"] and b["bin_size"] and growth is not None and b["bin_size"] > a["bin_size"] * (1 + growth):
        why.append(f".bin {a['bin_size']} -> {b['bin_size']} bytes (grew beyond {growth:.0%})")
    if a["checks_passed"] and b["checks_passed"] is False:
        why.append("task checks pass with A, fail with B")
    return why
