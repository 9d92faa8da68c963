"""The report's content: report.json assembled from stage records, never by rerunning a tool.

A record is believed only while the files it vouches for are there with the size and digest it
names (records.problems), and while what it was made from is what today's spec and files say
(plan/freshness.py: settings, inputs, code, toolchain); otherwise its stage shows `stale` with the
reason, the target is `stale` (counted, and failing the report task: the gate). `summary.complete` says whether
every expected target has a verdict (none pending or stale); `summary.ok` (holds) whether everything the run
promised holds: the documented CI gate reads only it, and the report task fails exactly when it is false
(gate_problems says why). run/reportmark.py marks a report superseded (not ok) while a run that may change it has not
finished.
Rendering (report.md, index.html, plots) is report/render.py.
report.json has one stable schema for CI gates (docs/verification-and-report.md).
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qnn_tasks.modelspec import specsplit
from qnn_tasks.plan import freshness
from qnn_tasks.plan.matrix import choose_chips, crosssize_chips, loop_chips
from qnn_tasks.plan.paths import COMPAT_RECORD
from qnn_tasks.plan.rows import CHOOSE, CROSSSIZE, LOOP, PIPELINE, report_columns
from qnn_tasks.plan.stagedef import record_path
from qnn_tasks.plan.stageplans import runs_loop
from qnn_tasks.plan.targets import ChipTarget, GraphTarget
from qnn_tasks.run import records
from qnn_tasks.run.status import BAD, COUNTED, GOOD, JUDGED, NO_VERDICT, Status, good, worst

if TYPE_CHECKING:  # only annotated: the planner is the task layer's
    from qnn_tasks.plan.planner import Planner

SCHEMA = "qnn-npu-compile/report/v1"
DEVICE_STAGES = ("verify", "power")


def graph_record_paths(gt: GraphTarget) -> dict[str, Path]:
    """A split part's export .. cpucheck are its graph's split record (record_path says so), its lint its own."""
    return {stage: Path(record_path(stage, gt)) for stage in report_columns("graph")}


def chip_record_paths(ct: ChipTarget) -> dict[str, Path]:
    return {stage: Path(record_path(stage, ct)) for stage in report_columns("chip")}


def diagnosis_path(ct: ChipTarget) -> Path:
    return Path(record_path("diagnose", ct))


def variant_record_path(ct: ChipTarget, stage: str) -> str:
    """Record of a toolchain graph stage (quantize, convert, modellib) of the target's variant."""
    return record_path(stage, ct.variant)


def _variant_stages(planner: Planner, ct: ChipTarget) -> tuple[str, ...]:
    """The variant's stages: w8a16-mixed's repair first, then the toolchain's (quantize; convert, modellib)."""
    from qnn_tasks.modelspec import precision_table

    repair = ("repair",) if precision_table.is_repaired(ct.precision) else ()
    return repair + tuple(s.name for s in planner.binding(ct).toolchain.graph_stages(ct.precision))


def read_checked(path: Path | str) -> dict[str, Any] | None:
    """A record as the report shows it: `stale` (with why) when its outputs are not what it vouches for."""
    record = records.read(path)
    if record is None:
        why = records.damage(path)  # a file there that is not a record is stale, not "not built yet"
        return None if why is None else {"status": Status.STALE, "stale": [why],
                                         "error": f"stale: {why} (rerun doit to rebuild it)"}
    if not good(record.get("status")):
        return record
    problems = records.problems(record, path)
    if problems:
        record = {**record, "status": Status.STALE, "stale": problems,
                  "error": f"stale: {'; '.join(problems)} (rerun doit to rebuild it)"}
    return record


def read_current(path: Path | str, facts: dict[str, Any] | None) -> dict[str, Any] | None:
    """A record as read_checked shows it, and `stale` (with why) when it was made from other settings or files
    than today's (`facts`: freshness.Expected's; None: nothing to compare, e.g. no plan for it today)."""
    record = read_checked(path)
    if record is None or facts is None or record.get("status") not in JUDGED:
        return record
    why = freshness.reason(record, facts)
    if why is None:
        return record
    return {**record, "status": Status.STALE, "stale": [why], "error": f"stale: {why}"}


def collect(planner: Planner) -> dict[str, Any]:
    """Assemble report.json's content from the records on disk."""
    expect = freshness.Expected(planner)
    graph_entries = []
    for gt in planner.graphs:
        stages = {stage: read_current(path, expect.of(stage, gt)) for stage, path in graph_record_paths(gt).items()}
        export = stages.get("export") or {}
        entry = {"model": gt.graph.model, "graph": gt.name, "precision": gt.graph.precision,
                 "source": export.get("source"), "status": in_order(stages.values()), "stages": stages}
        recurrent = recurrence(planner, gt, stages.get("lint"))
        if recurrent:
            entry["recurrent"] = recurrent
        graph_entries.append(entry)
    graph_status = {g["graph"]: g["status"] for g in graph_entries}
    graph_errors = {g["graph"]: next((f"graph {g['graph']} {r.get('status')} at {stage}: {r.get('error')}"
                                      for stage, r in g["stages"].items()
                                      if r and r.get("status") in BAD), f"graph {g['graph']} failed")
                    for g in graph_entries}
    targets = [_target(planner, expect, ct, graph_status, graph_errors) for ct in planner.chips]
    variants = []
    for t in targets:
        if not any(v["name"] == t["variant"] for v in variants):
            variants.append({"name": t["variant"], "model": t["model"], "graph": t["graph"], "precision": t["precision"],
                             "toolchain_id": t["toolchain_id"]})
    from qnn_tasks.report import upgrade_diff as compare

    pipelines = [pipeline_entry(pt, expect.of(PIPELINE.name, pt)) for pt in planner.pipelines]
    loops = [loop_entry(ct, expect.of(LOOP.name, ct)) for ct in loop_chips(planner)]
    choices = [choice_entry(ct, expect.of(CHOOSE.name, ct)) for ct in choose_chips(planner)]
    from qnn_tasks.report import sizes as size_report

    checked = {CROSSSIZE.record_of(ct): ct for ct in crosssize_chips(planner)}
    sizes = size_report.entries(planner, targets, lambda path: read_current(
        path, expect.of(CROSSSIZE.name, checked[path]) if path in checked else None), combine)
    broken = [{"model": model, "status": "not buildable", "error": problem} for model, problem in planner.project.broken]
    data = {"schema": SCHEMA, "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "summary": {},  # filled last, from the entries below (summarize)
            "toolchains": [{"profile": b.profile.name, "id": b.id, "suffix": b.suffix, "qnn": b.fingerprint.get("qnn"),
                            "upgrade": b.profile.upgrade} for b in planner.bindings],
            "graphs": graph_entries, "splits": _splits(planner), "variants": variants, "targets": targets,
            "pipelines": pipelines, "loops": loops, "sizes": sizes, "models_not_buildable": broken,
            "choices": choices, "precision_comparison": precision_comparison(targets, choices)}
    data["comparison"] = compare.upgrade_diff(data)
    data["compatibility"] = records.read(COMPAT_RECORD)
    data["summary"] = summarize(data)
    return data


# counts that say what there is, never what failed; every other count of the summary must be 0 for `ok`, so a
# count added later fails the gate until it is declared here
INFORMATIONAL = frozenset({"targets", "from_cache", *(s.value for s in GOOD | {Status.SKIPPED, Status.REJECTED})})
# rejected: a `precision: auto` candidate that missed its checks; the graph's choice fails the gate when none passes


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """report.json's `summary`, from its entries alone (targets, graphs, pipelines, loops, sizes, unbuildable models,
    upgrade comparison): every count, `complete`, and `ok`, the one field the documented gate reads."""
    targets, pipelines = data["targets"], data.get("pipelines", [])
    loops, sizes, choices = data.get("loops", []), data.get("sizes", []), data.get("choices", [])
    # complete: every graph and expected (not skipped) target, pipeline, loop and size check has a verdict its
    # outputs still back
    no_verdict = [t for t in data.get("graphs", []) + targets + pipelines + loops + sizes + choices
                  if t["status"] in NO_VERDICT]
    summary = {"targets": len(targets), **{s.value: sum(1 for t in targets if t["status"] == s) for s in COUNTED},
               "graphs_failed": sum(1 for g in data.get("graphs", []) if g["status"] in BAD),
               "from_cache": sum(1 for t in targets if (t.get("provenance") or {}).get("from_cache")),
               "pipelines_failed": sum(1 for p in pipelines if p["status"] in BAD),
               "models_not_buildable": len(data.get("models_not_buildable", [])),
               "loops_failed": sum(1 for p in loops if p["status"] in BAD),
               "crosssize_failed": sum(1 for p in sizes if p["status"] in BAD),
               "choices_failed": sum(1 for c in choices if c["status"] in BAD),
               "upgrade_regressions": sum(len(b.get("regressions") or []) for b in data.get("comparison") or []
                                          if b.get("gate")),
               "complete": not no_verdict and not data.get("models_not_buildable"), "current": True,
               "superseded_by": None}
    summary["ok"] = holds(summary)
    return summary


def failing_counts(summary: dict[str, Any]) -> dict[str, int]:
    """The summary's non-zero counts of what does not hold (every count but the INFORMATIONAL ones)."""
    return {k: v for k, v in summary.items() if type(v) is int and k not in INFORMATIONAL and v}


def holds(summary: dict[str, Any]) -> bool:
    """`summary.ok`: everything the run promised holds (every target, graph, pipeline, loop and size check passed,
    no gating upgrade regressed, nothing stale or pending, the report current). The documented CI gate reads only
    this field and `doit report`'s exit code is this same function (gate_problems says why)."""
    return summary.get("complete") is True and summary.get("current") is True and not failing_counts(summary)


def _splits(planner: Planner) -> dict[str, list[dict[str, Any]]]:
    """Each split graph's parts with their cut tensors and sizes (from its split record), by graph name."""
    found = {}
    for gt in planner.graphs:
        record = read_checked(record_path("split", gt)) if specsplit.is_whole(gt.graph) else None
        if record and good(record.get("status")):
            found[gt.name] = record.get("parts", [])
    return found


def _target(planner: Planner, expect: freshness.Expected, ct: ChipTarget, graph_status: dict[str, str],
            graph_errors: dict[str, str]) -> dict[str, Any]:
    stages = {stage: read_current(path, expect.of(stage, ct)) for stage, path in chip_record_paths(ct).items()}
    toolchain_stages = {stage: read_current(variant_record_path(ct, stage), expect.of(stage, ct.variant))
                        for stage in _variant_stages(planner, ct)}
    own = [*toolchain_stages.values(), *stages.values()]
    upstream = graph_status[ct.graph.name]
    # a graph's lint warnings are shown with the graph; they do not make a cleanly verified target a "warning"
    status = Status.SKIPPED if ct.skip_reason else in_order(
        [{"status": upstream if upstream != Status.WARNING else Status.PASSED}] + own)
    graph_failed = upstream in BAD
    reason = ct.skip_reason or (graph_errors[ct.graph.name] if graph_failed else
                                _first_error(own) if status in BAD else None)
    if status == Status.REJECTED:  # a `precision: auto` candidate that missed its checks: why, as the stage said
        reason = next((r["rejected"] for r in own if r and r.get("rejected")), None)
    if status == Status.WARNING and not reason:
        reason = "; ".join(w for r in own if r for w in r.get("warnings") or [])
    if graph_failed:
        stages = {stage: None for stage in stages}  # records of an earlier build no longer describe this one
    return {"name": ct.name, "model": ct.graph.model, "graph": ct.graph.name, "variant": ct.variant.name,
            "soc": ct.soc.row(), "toolchain_id": ct.toolchain_id, "toolchain": planner.binding(ct).profile.name,
            "precision": ct.precision, "status": status, "reason": reason, "toolchain_stages": toolchain_stages,
            "stages": stages, "provenance": provenance(stages), "diagnosis": diagnosis(ct, stages.get("context")),
            "device": device_results(ct), **lint_figures(ct, stages.get("context"))}


def lint_figures(ct: ChipTarget, context: dict[str, Any] | None) -> dict[str, Any]:
    """What a target shows from its graph's lint record, read once: the latency estimate, what a load holds
    (graphs/memory.py: the binary's own figure once built, with the estimate and its error beside it) and the weights
    a quantized binary keeps at 16 bits unasked (an embedding table a Gather reads)."""
    from qnn_tasks.graphs import memory

    lint = read_checked(record_path("lint", ct.graph_target))
    return {"latency_ms": latency(ct, lint), "memory": memory.of_records(lint, context, ct.precision),
            "sixteen_bit": (((lint or {}).get("memory_estimate") or {}).get(ct.precision) or {}).get("sixteen_bit")}


def latency(ct: ChipTarget, lint: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The phone-time estimate from the graph's lint record (qnn_tasks/latency: an estimate, never a measurement),
    with what `doit verify` measured on phones beside it when it ran. `lint`: the record, when read already."""
    from qnn_tasks.latency import shown

    lint = lint if lint is not None else read_checked(record_path("lint", ct.graph_target))
    found = shown.latency_ms(lint, ct.soc.name, ct.precision, ct.graph.options.get("audio_seconds_per_sample"))
    return shown.with_phone(found, (device_results(ct) or {}).get("verify"))


def recurrence(planner: Planner, gt: GraphTarget, lint: dict[str, Any] | None) -> dict[str, Any] | None:
    """A graph whose outputs feed its own inputs (lint names the pairs): whether a loop verifies it, and if not, the
    note the report shows (its targets were judged per sample from the CPU's state)."""
    feed = ((lint or {}).get("recurrent") or {}).get("feed")
    if not feed:
        return None
    loop = planner.model(gt.graph).loop
    looped = runs_loop(loop, gt.graph) and all(loop.feed.get(i) == o for i, o in feed.items())
    pairs = ", ".join(f"{i} <- {o}" for i, o in feed.items())
    note = (f"recurrent ({pairs}), verified in its loop" if looped else
            f"recurrent ({pairs}), verified WITHOUT a loop: each sample was judged from the CPU's state, so the fp16 "
            "error the state carries from step to step was not measured (lint proposes the loop: declaration)")
    return {"feed": feed, "loop": looped, "note": note}


def pipeline_entry(pt, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pipeline on one chip: its end-to-end record (links' metrics, final metrics and checks); `stale` when it
    chained other graphs, feeds or checks than today's declaration."""
    record = read_current(record_path("pipeline", pt), facts)
    return {"name": pt.name, "model": pt.pipeline.model, "graphs": list(pt.pipeline.graphs), "soc": pt.soc.row(),
            "toolchain_id": pt.chips[0].toolchain_id, "status": combine([record]),
            "reason": _first_error([record]), "record": record, "latency_ms": _chained(pt.chips)}


def _chained(chips: list[ChipTarget]) -> dict[str, Any] | None:
    """A pipeline's estimated phone time: its graphs' estimates added, once per run of the chain."""
    from qnn_tasks.latency.estimate import chain

    found = [latency(ct) for ct in chips]
    return None if any(f is None for f in found) else {**chain(found), "per": "run of the chain"}


def loop_entry(ct: ChipTarget, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A graph's loop on one chip: its record (per-step error against the CPU loop, the run's metrics and checks)."""
    record = read_current(record_path("loop", ct), facts)
    return {"name": ct.name, "model": ct.graph.model, "graph": ct.graph.name, "soc": ct.soc.row(),
            "precision": ct.precision, "toolchain_id": ct.toolchain_id,
            "status": Status.SKIPPED if ct.skip_reason else combine([record]),
            "reason": ct.skip_reason or _first_error([record]), "record": record,
            "latency_ms": None if (found := latency(ct)) is None else {**found, "per": "step"}}


def choice_entry(ct: ChipTarget, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """`precision: auto` on one chip: which candidate was chosen, and each candidate's verdict, size and cost."""
    record = read_current(CHOOSE.record_of(ct), facts)
    return {"name": f"{ct.graph.name}-{ct.soc.name}{ct.variant.suffix}", "model": ct.graph.model,
            "graph": ct.graph.name, "soc": ct.soc.row(), "toolchain_id": ct.toolchain_id,
            "order": list(ct.graph.auto), "status": combine([record]), "reason": _first_error([record]),
            "chosen": (record or {}).get("chosen"), "record": record}


def provenance(stages: dict[str, Any]) -> dict[str, Any]:
    """Where the heavy stages ran: the cache (restored), a Dask worker, or here."""
    found: dict[str, Any] = {"from_cache": [], "workers": {}}
    for stage in ("context", "simulate"):
        record = stages.get(stage) or {}
        if record.get("from_cache"):
            found["from_cache"].append(stage)
        executor = (record.get("from_cache") or {}).get("executor") or record.get("executor") or {}
        if executor.get("kind") == "dask":
            found["workers"][stage] = executor.get("worker")
    return found


def diagnosis(ct: ChipTarget, context: dict[str, Any] | None) -> dict[str, Any] | None:
    """The diagnose record, marked stale when it diagnosed another binary, or other inputs, than the current ones."""
    record = read_checked(diagnosis_path(ct))
    if not record:
        return None
    diagnosed = record.get("diagnosed") or {}
    current = next((f["sha256"] for name, f in ((context or {}).get("files") or {}).items() if name.endswith(".bin")),
                   None)
    stale = []
    if diagnosed.get("binary_sha256") and current and diagnosed["binary_sha256"] != current:
        stale.append("diagnosed an earlier build of this binary")
    inputs = current_inputs_sha256(ct)
    if diagnosed.get("inputs_sha256") and inputs and diagnosed["inputs_sha256"] != inputs:
        stale.append("diagnosed other inputs than the current samples")
    return {**record, "stale": stale, "status": Status.STALE} if stale else record


def current_inputs_sha256(ct: ChipTarget) -> str | None:
    """The digest of the graph's current verification inputs, as its cpucheck record vouches for them."""
    inputs = str(ct.graph_target.inputs)
    cpucheck = records.read(record_path("cpucheck", ct.graph_target)) or {}  # a part's: its graph's split record
    return ((cpucheck.get("files") or {}).get(inputs) or {}).get("sha256")


def precision_comparison(targets: list[dict[str, Any]], choices: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The precisions side by side (fp16 vs w8a16, w4a16, w8a16-mixed with the share of weight bytes its repair
    kept at 16 bits) per graph, chip and toolchain (graphs built at more than one precision); `chosen` marks the
    candidate `precision: auto` picked there."""
    picked = {(c["graph"], c["soc"]["name"], c["toolchain_id"]): (c.get("chosen") or {}).get("precision")
              for c in choices}
    from qnn_tasks.report.upgrade_diff import target_figures

    rows = []
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for t in targets:
        groups.setdefault((t["graph"], t["soc"]["name"], t["toolchain_id"]), []).append(t)
    for (graph, soc, toolchain_id), group in groups.items():
        if len(group) < 2:
            continue
        for t in group:
            figures = target_figures(t)
            rows.append({"graph": graph, "soc": soc, "precision": t["precision"], "status": t["status"],
                         "bin_size": figures["bin_size"], "sim_median_s": figures["sim_median_s"],
                         "min_cosine": figures["min_cosine"], "checks_passed": figures["checks_passed"],
                         "promoted_share": ((t.get("toolchain_stages") or {}).get("repair") or {}).get("share"),
                         "chosen": picked.get((graph, soc, toolchain_id)) == t["precision"],
                         "sixteen_bit": t.get("sixteen_bit")})
    return rows


def gate_problems(data: dict[str, Any]) -> list[str]:
    """Why `summary.ok` is false, one line each; empty exactly when it is true (the report task fails on a
    non-empty list: the documented CI gate and `doit report`'s exit code agree by construction)."""
    summary = data["summary"]
    if summary.get("ok"):
        return []
    problems = [f"model {b['model']} is not buildable: {b['error']}" for b in data.get("models_not_buildable", [])]
    entries = (data["targets"] + data.get("pipelines", []) + data.get("loops", []) + data.get("sizes", [])
               + data.get("choices", []))
    stale = [t["name"] for t in entries if t["status"] == Status.STALE]
    if stale:
        problems.append(f"{len(stale)} target(s) stale (made from other settings or files than today's, or their "
                        f"outputs changed since: {_names(stale)}; the report says why); run doit to rebuild them")
    for block in data.get("comparison") or []:
        if block.get("gate") and block.get("regressions"):
            names = ", ".join(r["target"] for r in block["regressions"][:5])
            problems.append(f"upgrade gate: {len(block['regressions'])} regression(s) from {block['baseline']} to "
                            f"{block['candidate']}: {names} (see the report's upgrade section)")
    failed = [t["name"] for t in entries if t["status"] == Status.FAILED]
    if failed:
        problems.append(f"{len(failed)} target(s) failed ({_names(failed)}; the report says why)")
    pending = [t["name"] for t in entries if t["status"] == Status.PENDING]
    if pending:
        problems.append(f"{len(pending)} target(s) not verified (no verdict: not built, or their run was interrupted "
                        f"or lost: {_names(pending)}); run doit to build them")
    if not problems:  # what no line above explains yet (a graph without a verdict, a new count): named by its field
        facts = [f"summary.{k} {v}" for k, v in failing_counts(summary).items()]
        if not facts:
            facts = ["summary.complete false (something expected has no verdict: run doit to build it)"
                     if not summary.get("complete") else "summary.ok false"]
        problems.append(f"{', '.join(facts)} (the report says why)")
    return problems


# ------------------------------------------------------------------ device results (doit verify / doit power)

def device_record_paths(ct: ChipTarget) -> dict[str, Path]:
    return {stage: Path(record_path(stage, ct)) for stage in DEVICE_STAGES}


def device_results(ct: ChipTarget) -> dict[str, Any] | None:
    """A target's records from phones (on demand: absent unless `doit verify` / `doit power` ran).

    They are reported beside the build, never folded into the target's status: a phone that was not
    attached today says nothing about the binary.
    """
    found = {stage: records.read(path) for stage, path in device_record_paths(ct).items()}
    return found if any(found.values()) else None


# ------------------------------------------------------------------ helpers

def combine(stage_records) -> Status:
    """A status from records (a missing one is pending): the worst of theirs (run/status.py PRECEDENCE)."""
    return worst(r.get("status") if r else Status.PENDING for r in stage_records)


def in_order(stage_records) -> Status:
    """A chain's status: failed where a stage failed on today's inputs (read_current: a failure made from other
    inputs is stale, not failed), else in build order, the first stage without a passing verdict decides (a later
    record made from an earlier stage's outputs that are gone or rebuilt says nothing of its own); all passing:
    warning or passed. A failed cpucheck fails its graph though lint, which it does not read, has not run."""
    stage_records = list(stage_records)
    if any(r and r.get("status") == Status.FAILED for r in stage_records):
        return Status.FAILED
    for record in stage_records:
        status = combine([record])
        if not good(status):
            return status
    return combine(stage_records)


def _names(names: list[str], first: int = 5) -> str:
    return ", ".join(names[:first]) + (f" and {len(names) - first} more" if len(names) > first else "")


def _first_error(stage_records) -> str | None:
    return next((r.get("error") for r in stage_records if r and r.get("status") in BAD), None)


def write(report_dir: Path, data: dict[str, Any]) -> dict[str, Path]:
    from qnn_tasks.report.render import write as render

    return render(report_dir, data)
