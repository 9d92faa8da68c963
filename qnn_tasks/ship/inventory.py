"""What the plan expects of one model, as plain JSON: the input of a `dist` stage call.

Paths are project-relative; nothing here reads a record (verified.py does). `expected` holds, per record
path, what today's spec says the record must have been made from (plan/freshness.py): a record made under
other settings or from other files is stale, and its target is left out. Only the run's first
toolchain ships: a package holds one QNN version, the one its runtime libraries must match.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from qnn_tasks.modelspec import precision_table, specsizes, specsplit
from qnn_tasks.plan import freshness
from qnn_tasks.plan.matrix import choose_chips, loop_chips
from qnn_tasks.plan.rows import CHOOSE, CROSSSIZE, LOOP, PIPELINE, REPAIR, report_columns
from qnn_tasks.plan.stagedef import record_path
from qnn_tasks.plan.stageplans import auto_candidates, size_chips
from qnn_tasks.plan.targets import ChipTarget, GraphTarget

if TYPE_CHECKING:  # only annotated: the planner is the task layer's
    from qnn_tasks.modelspec.project import ModelSpec
    from qnn_tasks.plan.planner import Planner


def of_model(planner: Planner, model: str) -> dict[str, Any]:
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
        "graphs": [_graph(planner, gt) for gt in graphs],
        "chips": [_chip(planner, ct, ct.name in loops) for ct in chips],
        "pipelines": [{"name": pt.name, "soc": pt.soc.name, "graphs": list(pt.pipeline.graphs),
                       "targets": [ct.name for ct in pt.chips],
                       "record": PIPELINE.record_of(pt)}
                      for pt in pipelines],
        # the model's declared chains (one per size over graphs with sizes), whichever chips they run on
        "chains": [{"name": p.name or p.model, "graphs": list(p.graphs), "feeds": _feeds(p, graphs)}
                   for p in ([spec.pipeline] if spec.pipeline else []) + list(spec.size_pipelines)],
        # the graph run step after step and what it feeds back (input <- output), for the app that runs it
        "loop": None if spec.loop is None else {"graph": spec.loop.graph, "feed": dict(spec.loop.feed),
                                                "start": dict(spec.loop.start or {}), "steps": spec.loop.steps,
                                                **_transducer(planner, spec)},
        # `precision: auto`: per graph and chip, the record that says which candidate ships (stages/choose.py)
        "choices": [{"graph": ct.graph.name, "soc": ct.soc.name, "record": CHOOSE.record_of(ct),
                     "targets": [c.name for c in auto_candidates(planner, ct)]}
                    for ct in choose_chips(planner, chips)],
        "expected": expected(planner, graphs, chips, pipelines),
    }


def _transducer(planner: Planner, spec: ModelSpec) -> dict[str, Any]:
    """A transducer loop's search settings and its tokens file (project-relative: dist copies it), else nothing."""
    settings = spec.loop.transducer
    if not settings:
        return {}
    graph = next(g for g in spec.graphs if g.name == spec.loop.graph)
    tokens = os.path.relpath(graph.model_dir / settings["tokens"], planner.root)
    return {"run_steps": spec.loop.run_steps, "transducer": dict(settings), "tokens_file": tokens}


def _feeds(pipeline, graphs: list[GraphTarget]) -> list[dict[str, Any]]:
    """Each later graph's inputs of a chain and the earlier output feeding each (with its glue: reshape, scale,
    offset, stack) or the constant it is fed, as the pipeline stage feeds them (modelspec/specpipeline.py `source`)."""
    from qnn_tasks.modelspec.specpipeline import source

    by_name = {gt.graph.name: gt.graph for gt in graphs}
    chain = [by_name[name] for name in pipeline.graphs if name in by_name]
    if len(chain) != len(pipeline.graphs):
        return []
    found = []
    for position, graph in enumerate(chain[1:], start=1):
        for tensor in graph.inputs:
            key = f"{graph.name}.{tensor.name}"
            if key in pipeline.values:  # a constant the app feeds on every run (a start token)
                found.append({"to": key, "value": pipeline.values[key]})
                continue
            origin, output = source(graph, tensor.name, pipeline.feed, chain[:position])
            found.append({"to": key, "from": f"{origin}.{output}", **pipeline.glue.get(key, {})})
    return found


def _graph(planner: Planner, gt: GraphTarget) -> dict[str, Any]:
    """A graph's facts; a split graph names its parts (and its split record), a part which graph it is part of and
    its I/O: the cut tensors, known from the split stage's parts.json (Planner.graph_dict)."""
    g = gt.graph
    io = {k: planner.graph_dict(g)[k] for k in ("inputs", "outputs")} if specsplit.is_part(g) else g.io()
    records = {stage: record_path(stage, gt) for stage in report_columns("graph")}
    facts: dict[str, Any] = {}
    if specsplit.is_whole(g):
        records["split"] = record_path("split", gt)
        facts["split"] = {"parts": [specsplit.part_name(g.name, i) for i in range(1, specsplit.count(g.split) + 1)]}
    elif specsplit.is_part(g):
        facts["part"] = {"of": g.split["of"], "index": g.split["part"], "parts": g.split["parts"]}
    return {"name": gt.name, "io": io, "precisions": list(g.precisions), "simplified": str(gt.simplified),
            "source_file": planner.source(g), **({"sizes": specsizes.facts(g)} if g.size else {}), **facts,
            **({"audio_seconds_per_sample": audio} if (audio := g.options.get("audio_seconds_per_sample")) else {}),
            "records": records}


def expected(planner: Planner, graphs: list[GraphTarget], chips: list[ChipTarget], pipelines: list) -> dict[str, dict[str, Any]]:
    """Record path -> what today's spec says it was made from, for every record dist reads (none for a record
    today's plan has no task for: a split part's export .. cpucheck are its graph's split record, judged there)."""
    expect = freshness.Expected(planner)
    found: dict[str, Any] = {}

    def add(path: str, stage: str, target: Any) -> None:
        facts = expect.of(stage, target)
        if facts is not None:
            found[path] = facts

    for gt in graphs:
        for stage, path in _graph(planner, gt)["records"].items():
            add(path, stage, gt)
    loops = {ct.name for ct in loop_chips(planner)}
    for ct in chips:
        for stage, path in _chip(planner, ct, ct.name in loops)["records"].items():
            variant = stage not in report_columns("chip") and stage not in (LOOP.name, CROSSSIZE.name)
            add(path, stage, ct.variant if variant else size_chips(planner, ct)[-1] if stage == CROSSSIZE.name else ct)
    for pt in pipelines:
        add(PIPELINE.record_of(pt), PIPELINE.name, pt)
    for ct in choose_chips(planner, chips):
        add(CHOOSE.record_of(ct), CHOOSE.name, ct)
    return found


def _chip(planner: Planner, ct: ChipTarget, has_loop: bool) -> dict[str, Any]:
    binding = planner.binding(ct)
    records = {s.name: record_path(s.name, ct.variant) for s in binding.toolchain.graph_stages(ct.precision)}
    if precision_table.is_repaired(ct.precision):  # the weights its quantize kept at 16 bits, and the search's steps
        records[REPAIR.name] = REPAIR.record_of(ct.variant)
    records.update({name: record_path(name, ct) for name in report_columns("chip")})  # a project's own stages too
    if has_loop:
        records[LOOP.name] = LOOP.record_of(ct)
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
            "device_records": {s: record_path(s, ct) for s in ("verify",)}}
