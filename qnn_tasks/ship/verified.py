"""Which of a model's targets were verified, read the way the report reads records (report/gather.py).

A record is believed only while the files it vouches for are there with their digests (a binary
changed since its context record makes that record `stale`), and while it was made from the settings
and files today's spec names (the inventory's `expected`: a source edited or a threshold raised since
makes it `stale` with the reason); the target is then left out. A target
ships only when every stage it depends on passed: its graph's stages, its toolchain and chip
stages, its loop, and every pipeline it is a link of. Everything else is named with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qnn_tasks.report.gather import combine, read_current
from qnn_tasks.run.status import BAD, Status, good


@dataclass
class Shippable:
    chip: dict[str, Any]                  # the inventory's chip entry
    records: dict[str, dict[str, Any]]    # stage -> its (believed) record
    pipelines: list[dict[str, Any]] = field(default_factory=list)  # pipeline records this target is a link of


def read(inventory: dict[str, Any], path: str) -> dict[str, Any] | None:
    """A record as dist believes it: as the report reads it, and stale when made from other settings or files than
    today's spec states (the inventory's `expected`)."""
    return read_current(path, (inventory.get("expected") or {}).get(path))


def sort_out(inventory: dict[str, Any]) -> tuple[list[Shippable], list[dict[str, str]], dict[str, dict]]:
    """(targets to ship, [{target, reason, graph, soc, precision}] left out, graph name -> its believed graph-stage
    records)."""
    graph_records = {g["name"]: {stage: read(inventory, path) for stage, path in g["records"].items()}
                     for g in inventory["graphs"]}
    pipelines = {p["name"]: (p, read(inventory, p["record"])) for p in inventory["pipelines"]}
    ship, omitted = [], []
    for chip in inventory["chips"]:
        target = chip["target"]
        if chip["skip"]:
            omitted.append(left_out(chip, f"skipped: {chip['skip']}"))
            continue
        own = {stage: read(inventory, path) for stage, path in chip["records"].items()}
        links = [(name, record) for name, (p, record) in pipelines.items() if target in p["targets"]]
        reason = _why_not(graph_records[chip["graph"]], own, links)
        if reason:
            omitted.append(left_out(chip, reason))
        else:
            ship.append(Shippable(chip=chip, records=own, pipelines=[r for _, r in links]))
    ship, omitted = auto_chosen(inventory, ship, omitted)
    return whole_chains(inventory, ship, omitted) + (graph_records,)


def auto_chosen(inventory: dict[str, Any], ship: list[Shippable],
                omitted: list[dict[str, str]]) -> tuple[list[Shippable], list[dict[str, str]]]:
    """`precision: auto`: of a graph's verified candidates on a chip, only the one its choose record names ships
    (the smallest that passed); the others are left out saying so. Without a passing choice, none ships."""
    kept = list(ship)
    for choice in inventory.get("choices") or []:
        record = read(inventory, choice["record"])
        status = combine([record])
        chosen = (record or {}).get("chosen") if good(status) else None
        for item in [s for s in kept if s.chip["target"] in choice["targets"]]:
            if chosen and item.chip["target"] == chosen["target"]:
                item.records["choose"] = record
                continue
            kept.remove(item)
            if chosen:
                why = (f"not chosen: precision auto ships {chosen['precision']} on {choice['soc']}, the smallest "
                       "candidate that passes its checks")
            elif status == Status.PENDING:
                why = "unbuilt: choose has no record (run doit to build and verify it)"
            else:
                word = Status.STALE if status == Status.STALE else Status.FAILED
                why = f"{word}: choose: {(record or {}).get('error') or status}"
            omitted.append(left_out(item.chip, why))
    return kept, omitted


def whole_chains(inventory: dict[str, Any], ship: list[Shippable],
                 omitted: list[dict[str, str]]) -> tuple[list[Shippable], list[dict[str, str]]]:
    """A split graph's part ships on a chip only with every other part there (at its precision): one part alone
    runs nothing. The others are left out, naming the part that is not verified and why."""
    parts = {g["name"]: g["part"]["of"] for g in inventory["graphs"] if g.get("part")}
    chips = {c["target"]: c for c in inventory["chips"]}

    def chain(chip: dict[str, Any]) -> tuple[str, str, str] | None:
        of = parts.get(chip["graph"])
        return (of, chip["soc"]["name"], chip["precision"]) if of else None

    missing = {chain(chips[o["target"]]): o for o in omitted if o["target"] in chips and chain(chips[o["target"]])}
    kept = []
    for item in ship:
        why = missing.get(chain(item.chip))
        if why is None:
            kept.append(item)
            continue
        word, _, rest = why["reason"].partition(": ")
        omitted.append({"target": item.chip["target"], "reason": f"{word}: {why['target']}, another part of the split "
                                                                    f"graph {parts[item.chip['graph']]}: {rest}"})
    return kept, omitted


def left_out(chip: dict[str, Any], reason: str) -> dict[str, str]:
    """An `omitted` entry: the target, why, and which build it is (graph, chip, precision), so that the selectors
    tell a phone of that chip "the build for <chip> failed verification" rather than "no build"."""
    return {"target": chip["target"], "reason": reason, "graph": chip["graph"], "soc": chip["soc"]["name"],
            "precision": chip["precision"]}


def _why_not(graph: dict[str, Any], own: dict[str, Any], links: list[tuple[str, Any]]) -> str | None:
    """The first reason the target is not verified (None: it is), in build order."""
    stages = [(f"graph stage {s}", r) for s, r in graph.items()] + [(s, r) for s, r in own.items()] \
        + [(f"pipeline {name}", r) for name, r in links]
    for label, record in stages:
        status = combine([record])
        if status in BAD or status == Status.REJECTED:
            word = str(status)  # failed, stale or rejected
            error = str(record.get("error") or record.get("rejected") or status)
            return f"{word}: {label}: {error.removeprefix(f'{word}: ')}"
        if status == Status.PENDING:
            return f"unbuilt: {label} has no record (run doit to build and verify it)"
    return None


def graph_ok(stages: dict[str, Any]) -> bool:
    """Every graph stage (export .. cpucheck) has a believed, passing record."""
    return all(good(combine([record])) for record in stages.values())
