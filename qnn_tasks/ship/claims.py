"""What a package claims beyond each binary, only where it holds: padding between sizes, and chains per chip.

A graph with sizes is shipped "smallest that fits, padded" only while its cross-size check passed on every chip
it is built for (read as the report reads it: stale too when made under other settings than today's); else each size is shipped for inputs of exactly its length, and
the manifest says why. A pipeline is listed per chip with whether every graph of its chain ships a binary there
and the chain was verified there; an incomplete one names each graph that is not shipped and why (a decoder is
never shipped without a word about the encoder that feeds it).
"""
from __future__ import annotations

from typing import Any

from qnn_tasks.report.gather import combine
from qnn_tasks.run.status import Status, good
from qnn_tasks.ship import verified


def unpadded(inventory: dict[str, Any]) -> dict[str, str]:
    """Declared graph with sizes -> why padding into a larger size is not vouched for (absent: it is)."""
    sized = {g["name"]: g["sizes"]["graph"] for g in inventory["graphs"] if g.get("sizes")}
    found: dict[str, str] = {}
    seen = set()
    for chip in inventory["chips"]:
        path = chip["records"].get("crosssize")
        if chip["skip"] or chip["graph"] not in sized or not path or path in seen:
            continue
        seen.add(path)
        record = verified.read(inventory, path)
        status, soc = combine([record]), chip["soc"]["name"]
        if good(status):
            continue
        error = str((record or {}).get("error") or "").removeprefix(f"{status}: ")
        why = {Status.FAILED: error or f"the cross-size check failed on {soc}",  # its error names the check and chip
               Status.STALE: f"the cross-size check on {soc} is stale: {error}"}.get(
            status, f"the cross-size check has not run on {soc} (run doit)")
        found.setdefault(sized[chip["graph"]], why)
    return found


def chains(inventory: dict[str, Any], shipped: list[dict[str, Any]], omitted: list[dict[str, str]]) -> list[dict]:
    """The model's pipelines, each with every chip a graph of it ships a binary for: complete (every graph shipped
    there and the chain verified there), else `missing` (graph, reason) and `why`. `shipped`: the inventory chip
    entries that ship."""
    reasons = {o["target"]: o["reason"] for o in omitted}
    on_chip = {(c["graph"], c["soc"]["name"]) for c in shipped}
    found = []
    for chain in inventory.get("chains") or ():
        graphs = chain["graphs"]
        chips = {}
        for soc in sorted({s for g, s in on_chip if g in graphs}):
            missing = [{"graph": g, "reason": _why_missing(inventory, reasons, g, soc)} for g in graphs
                       if (g, soc) not in on_chip]
            run = next((p for p in inventory["pipelines"] if p["soc"] == soc and p["graphs"] == graphs), None)
            checked = run is not None and good(combine([verified.read(inventory, run["record"])]))
            if not missing and checked:
                chips[soc] = {"complete": True}
                continue
            names = ", ".join(m["graph"] for m in missing)
            why = (f"{names} not shipped for {soc}: on this chip the chain runs {names} on the CPU fallback, a chain "
                   "this package did not verify" if missing else f"the chain was not verified on {soc}'s simulator")
            chips[soc] = {"complete": False, "missing": missing, "why": why}
        if chips:
            found.append({"name": chain["name"], "graphs": list(graphs), "chips": chips})
    return found


def _why_missing(inventory: dict[str, Any], reasons: dict[str, str], graph: str, soc: str) -> str:
    """Why `graph` ships no binary for `soc`: its target's reason for being left out, or that it is not built there."""
    targets = [c["target"] for c in inventory["chips"] if c["graph"] == graph and c["soc"]["name"] == soc]
    return next((reasons[t] for t in targets if t in reasons), f"skipped: {graph} is not built for {soc}")
