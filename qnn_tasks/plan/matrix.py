"""The default run read from the stage table: which rows a planner's project needs (build_stage_defs), their targets,
every (row, plan), the files they write and the records the report reads; and the on-demand rows' targets.
"""
from __future__ import annotations

from typing import Iterator

from qnn_tasks.modelspec import precision_table, specsplit
from qnn_tasks.plan.ondemandplans import SURVEY
from qnn_tasks.plan.paths import COMPAT_RECORD, DEVICE_STAMP
from qnn_tasks.plan.planner import Planner
from qnn_tasks.plan.rows import (
    CHIP_STAGES,
    CHOOSE,
    CROSSSIZE,
    DIAGNOSE,
    GRAPH_STAGES,
    LOOP,
    PIPELINE,
    REPAIR,
    VARIANT_RUNNER,
    registered,
    report_columns,
)
from qnn_tasks.plan.stagedef import Plan, StageDef, record_path
from qnn_tasks.plan.stageplans import plan_crosssize, plan_loop, plan_variant_stage, runs_loop
from qnn_tasks.plan.targets import ChipTarget


def variant_stage_defs(planner: Planner) -> list[StageDef]:
    """Rows for the toolchains' per-variant stages (quantize; convert, modellib), each name once, in order."""
    seen: dict[str, StageDef] = {}
    for binding in planner.bindings:
        for precision in sorted({p for gt in planner.graphs for p in gt.graph.precisions}):
            for graph_stage in binding.toolchain.graph_stages(precision):
                seen.setdefault(graph_stage.name, StageDef(graph_stage.name, "variant", graph_stage.doc + ".",
                                                           VARIANT_RUNNER, plan_variant_stage, remote=True,
                                                           toolchain=True, column=False))
    return list(seen.values())


def build_stage_defs(planner: Planner) -> list[StageDef]:
    """Every stage of the default run, in build order."""
    rows = list(GRAPH_STAGES)
    if not any(precision_table.any_quantized(gt.graph.precisions) for gt in planner.graphs):
        rows = [r for r in rows if r.name != "calibrate"]
    if not any(specsplit.is_whole(gt.graph) for gt in planner.graphs):
        rows = [r for r in rows if r.name != "split"]
    repairs = [REPAIR] if any(precision_table.is_repaired(vt.precision) for vt in planner.variants) else []
    return (rows + registered("graph") + repairs + variant_stage_defs(planner) + list(CHIP_STAGES) + registered("chip")
            + ([PIPELINE] if planner.pipelines else []) + ([LOOP] if any(m.loop for m in planner.project.models) else [])
            + ([CROSSSIZE] if any(gt.graph.size for gt in planner.graphs) else [])
            + ([CHOOSE] if any(gt.graph.auto for gt in planner.graphs) else []))


def targets_of(planner: Planner, stage: StageDef) -> list:
    return {"graph": planner.graphs, "variant": planner.variants, "chip": planner.chips,
            "pipeline": planner.pipelines}[stage.scope]


def on_demand_targets(planner: Planner, stage: StageDef) -> list:
    """An on-demand row's targets by its scope: the one project, each toolchain of the run, each model that loads,
    or a built stage's targets (the phone stages' `devices` survey first)."""
    if stage.scope == "project":
        return [None]
    if stage.scope == "toolchain":
        return list(planner.bindings)
    if stage.scope == "model":
        broken = {name for name, _ in planner.project.broken}
        return [m for m in planner.project.models if m.name not in broken]
    return ([SURVEY] if stage.devices else []) + list(targets_of(planner, stage))


def plans(planner: Planner) -> Iterator[tuple[StageDef, Plan]]:
    """Every (row, plan) of the default run, in build order: planning alone, no build."""
    for row in build_stage_defs(planner):
        for target in targets_of(planner, row):
            plan = row.plan(planner, row, target)
            if plan is not None:
                yield row, plan


def all_outputs(planner: Planner) -> list[str]:
    """Every file the default run's stages write (what the report vouches for when run alone)."""
    return [out for _, plan in plans(planner) if not plan.skip for out in plan.outputs]




def record_paths(planner: Planner) -> list[str]:
    """Every record the report reads, as strings: the report's up-to-date check stats them on each run."""
    paths = list(dict.fromkeys(record_path(stage, gt) for gt in planner.graphs for stage in report_columns("graph")))
    paths += sorted({record_path(s.name, ct.variant) for ct in planner.chips
                     for s in planner.binding(ct).toolchain.graph_stages(ct.precision)})
    paths += sorted({REPAIR.record_of(ct.variant) for ct in planner.chips if precision_table.is_repaired(ct.precision)})
    paths += [record_path(stage.name, ct) for ct in planner.chips for stage in CHIP_STAGES + (DIAGNOSE,)]
    paths += [PIPELINE.record_of(pt) for pt in planner.pipelines]
    paths += [LOOP.record_of(ct) for ct in loop_chips(planner)]
    paths += [CROSSSIZE.record_of(ct) for ct in crosssize_chips(planner)]
    paths += [CHOOSE.record_of(ct) for ct in choose_chips(planner)]
    return paths + [DEVICE_STAMP, COMPAT_RECORD]  # one file for all device records (not 2 stats per target)


def choose_chips(planner: Planner, chips: list[ChipTarget] | None = None) -> list[ChipTarget]:
    """The chip targets (of `chips`, default all) that carry `precision: auto`'s choice (each auto graph's first
    candidate, per chip)."""
    return [ct for ct in (planner.chips if chips is None else chips) if ct.graph.auto and ct.precision == ct.graph.auto[0]]


def crosssize_chips(planner: Planner) -> list[ChipTarget]:
    """The chip targets that carry a cross-size check (the largest size of each graph with sizes, not skipped)."""
    return [ct for ct in planner.chips if not ct.skip_reason and plan_crosssize(planner, CROSSSIZE, ct) is not None]


def loop_chips(planner: Planner) -> list[ChipTarget]:
    """The chip targets whose graph is its model's `loop:` graph (each has a loop stage)."""
    return [ct for ct in planner.chips if runs_loop(loop := planner.model(ct.graph).loop, ct.graph)
            and (not loop.start or plan_loop(planner, LOOP, ct) is not None)]
