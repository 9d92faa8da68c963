"""What the plan expects of one model, as plain JSON: the input of a `dist` stage call.

Paths are project-relative; nothing here reads a record (verified.py does). `expected` holds, per record
path, what today's spec says the record must have been made from (plan/freshness.py): a record made under
other settings or from other files is stale, and its target is left out. Only the run's first
toolchain ships: a package holds one QNN version, the one its runtime libraries must match.
"""
from __future__ import annotations

from typing import Any

from qnn_tasks.plan import freshness
from qnn_tasks.plan.stages import CHIP_STAGES, CROSSSIZE, LOOP, PIPELINE, loop_chips, report_columns, size_chips
from qnn_tasks.plan.targets import ChipTarget
from qnn_tasks.spec import sizes as specsizes


def of_model(planner, model: str) -> dict[str, Any]:
    """The model's spec facts, graphs, chip targets (of the first toolchain) and pipelines, JSON-able."""
    spec = next(m for m in planner.project.models if m.name == model)
    binding = planner.bindings[0]
    loops = {ct.name for ct in loop_chips(planner)}
    chips = [ct for ct in binding.chips if ct.graph.model == model]
    graphs = [gt for gt in planner.graphs if gt.graph.model == model]
    pipelines = [pt for pt in binding.pipelines if pt.pipeline.model == model]
    return {
        "model": model, "licence": spec.licence, "description": spec.description, "ship": dict(spec.ship),
        "platforms": {ct.soc.name: ct.soc.platform for ct in chips},  # the AI pack leaves non-phone chips out
        "toolchain": {"id": binding.id, "profile": binding.profile.name, "file": str(binding.profile.file),
                      "settings": binding.profile.settings, **binding.fingerprint},
        "graphs": [{"name": gt.name, "io": gt.graph.io(), "precisions": list(gt.graph.precisions),
                    "simplified": str(gt.simplified), "source_file": planner.source(gt.graph),
                    **({"sizes": specsizes.facts(gt.graph)} if gt.graph.size else {}),
                    "records": {stage: str(gt.stage_dir(stage) / f"{stage}.json") for stage in report_columns("graph")}}
                   for gt in graphs],
        "chips": [_chip(planner, ct, ct.name in loops) for ct in chips],
        "pipelines": [{"name": pt.name, "soc": pt.soc.name, "graphs": list(pt.pipeline.graphs),
                       "targets": [ct.name for ct in pt.chips],
                       "record": str(pt.stage_dir("pipeline") / "pipeline.json")}
                      for pt in pipelines],
        "expected": expected(planner, graphs, chips, pipelines),
    }


def expected(planner, graphs: list, chips: list[ChipTarget], pipelines: list) -> dict[str, dict[str, Any]]:
    """Record path -> what today's spec says it was made from, for every record dist reads (none for a record
    today's plan has no task for)."""
    expect = freshness.Expected(planner)
    found: dict[str, Any] = {}

    def add(path: str, stage: str, target: Any) -> None:
        facts = expect.of(stage, target)
        if facts is not None:
            found[path] = facts

    for gt in graphs:
        for stage in report_columns("graph"):
            add(str(gt.stage_dir(stage) / f"{stage}.json"), stage, gt)
    loops = {ct.name for ct in loop_chips(planner)}
    for ct in chips:
        for stage, path in _chip(planner, ct, ct.name in loops)["records"].items():
            variant = stage not in {s.name for s in CHIP_STAGES} and stage not in (LOOP.name, CROSSSIZE.name)
            add(path, stage, ct.variant if variant else size_chips(planner, ct)[-1] if stage == CROSSSIZE.name else ct)
    for pt in pipelines:
        add(str(pt.stage_dir("pipeline") / "pipeline.json"), PIPELINE.name, pt)
    return found


def _chip(planner, ct: ChipTarget, has_loop: bool) -> dict[str, Any]:
    binding = planner.binding(ct)
    records = {s.name: f"{ct.variant.dir}/{s.name}/{s.name}.json" for s in binding.toolchain.graph_stages(ct.precision)}
    records.update({s.name: f"{ct.dir_str}/{s.name}/{s.name}.json" for s in CHIP_STAGES})
    if has_loop:
        records[LOOP.name] = f"{ct.dir_str}/{LOOP.name}/{LOOP.name}.json"
    sizes = size_chips(planner, ct)
    if len(sizes) > 1:  # a size ships only when padding a shorter input into the larger sizes changes nothing
        records[CROSSSIZE.name] = CROSSSIZE.record_of(sizes[-1])
    context = planner.context_files(ct)
    return {"target": ct.name, "graph": ct.graph.name, "precision": ct.precision, "soc": ct.soc.row(),
            "skip": ct.skip_reason, "records": records,
            "binary": next((f for f in context if f.endswith(".bin")), None),
            "ctx_onnx": next((f for f in context if f.endswith(".onnx")), None),
            "provider_options": planner.config_files(ct)[0],
            "runtime_manifest": next((f for f in context if f.endswith("runtime_libs.json")), None),
            "device_records": {s: f"{ct.dir_str}/{s}/{s}.json" for s in ("verify",)}}
