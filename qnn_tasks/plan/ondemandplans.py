"""The on-demand stages' plan functions (socscheck, toolcheck, compat, verify / power, dist; diagnose's is a chip
stage's, in plan/stageplans.py): what each needs for one target, as a Plan, like a built stage's. Their targets are
plan/matrix.py's `on_demand_targets`: a toolchain of the run, the whole project, a chip target (after the `devices`
survey for the phone stages), a model. Nothing here imports doit, onnx or numpy.
"""
from __future__ import annotations

import json
from typing import Any

from qnn_tasks.modelspec import specjson
from qnn_tasks.modelspec.project import ModelSpec
from qnn_tasks.plan import paths
from qnn_tasks.plan.planner import Binding, Planner
from qnn_tasks.plan.stagedef import Plan, StageDef, record_path
from qnn_tasks.plan.stageplans import chip_plan
from qnn_tasks.plan.targets import ChipTarget

SURVEY = "devices"  # the phone stages' first target: which phones are attached, and what each runs


def toolchain_plan(p: Planner, stage: StageDef, binding: Binding, key: str, doc: str,
                   args: dict[str, Any]) -> Plan:
    """A stage once per toolchain of the run: its record is build/<stage>.json for the first, build/<stage>-<profile>
    .json for the others."""
    return Plan(name=binding.profile.name, out_dir=paths.project_dir(stage.name, binding.suffix), file_dep=[],
                outputs=[], key=key, doc=doc, args=lambda: {**args, "toolchain_id": binding.id},
                base=lambda: {"toolchain": {"id": binding.id, **binding.fingerprint}}, binding=binding,
                record_file=paths.project_record(stage.name, binding.suffix))


def plan_socscheck(p: Planner, stage: StageDef, binding: Binding) -> Plan:
    """Every row of the SoC table compiled with this toolchain: the table and the toolchain are the key."""
    rows = [soc.row() for soc in p.project.socs.values()]
    return toolchain_plan(p, stage, binding, p.key(stage, binding, json.dumps(rows, sort_keys=True), labels=("socs",)),
                          f"compile a tiny model for every SoC row with {binding.id}; confirm socModel/arch",
                          {"socs": rows})


def plan_toolcheck(p: Planner, stage: StageDef, binding: Binding) -> Plan:
    return toolchain_plan(p, stage, binding, p.key(stage, binding), f"dependency checks of {binding.id}", {})


def plan_compat(p: Planner, stage: StageDef, _: None) -> Plan:
    """One task for the project: every chip target's binary (those whose context record passed, read when it runs) on
    every ort-qnn runtime of the run."""
    runtimes = [b for b in p.bindings if b.toolchain.kind == "ort-qnn"]

    def binary(ct: ChipTarget) -> dict[str, Any]:
        return {"target": ct.name, "toolchain": p.binding(ct).profile.name, "context_record": record_path("context", ct),
                "ctx_onnx": p.context_files(ct)[0], "provider_options": p.config_files(ct)[0],
                "graph": p.graph_dict(ct.graph), "verify": ct.verify, "inputs": str(ct.graph_target.inputs),
                "reference": str(ct.graph_target.reference), "soc": ct.soc.row()}

    return Plan(name="", out_dir=f"{paths.BUILD}/{stage.name}", file_dep=[], outputs=[], key=p.key(stage, None),
                doc="load every built binary on every configured runtime's simulator (build/compat/compat.json)",
                args=lambda: {"runtimes": [{"profile": b.profile.name, "id": b.id, "qnn": b.fingerprint.get("qnn")}
                                           for b in runtimes],
                              "profiles": {b.profile.name: b.profile_dict(p.root) for b in runtimes},
                              "socs": [soc.row() for soc in p.project.socs.values()], "root": str(p.root),
                              "binaries": [binary(ct) for ct in p.chips if not ct.skip_reason]},
                base=dict)


def plan_device(p: Planner, stage: StageDef, target: ChipTarget | str) -> Plan:
    """verify / power: the `devices` survey (build/<stage>/devices.json), then each chip target on its phones. No
    file_dep: a missing binary says "build it" rather than make `doit verify` build every chip."""
    if target == SURVEY:
        survey = f"{paths.BUILD}/{stage.name}/{paths.DEVICES_FILE}"
        return Plan(name=SURVEY, out_dir=f"{paths.BUILD}/{stage.name}", file_dep=[], outputs=[], key=p.key(stage, None),
                    doc=f"list attached phones and their chips; which targets each runs ({survey})",
                    args=lambda: {"survey": survey,
                                  "socs": {name: specjson.soc_to_dict(soc) for name, soc in p.project.socs.items()},
                                  "targets": [[ct.name, ct.soc.name, ct.skip_reason] for ct in p.chips]},
                    base=dict, record_file=survey)
    ct = target
    assert isinstance(ct, ChipTarget)
    binding = p.binding(ct)
    gt = ct.graph_target
    doc = {"verify": "run {graph} on attached {soc} phones, compare with the CPU, measure",
           "power": "run {graph} for a fixed time on an attached {soc} phone; battery before/after"}[stage.name]

    def args() -> dict[str, Any]:
        files = p.context_files(ct)
        return {"graph": p.graph_dict(ct.graph), "verify": ct.verify, "soc": specjson.soc_to_dict(ct.soc),
                "precision": ct.precision, "binary": next(f for f in files if f.endswith(".bin")),
                "manifest": next((f for f in files if f.endswith("runtime_libs.json")), None),
                "context_record": record_path("context", ct), "inputs": str(gt.inputs), "reference": str(gt.reference),
                "profile": {**binding.profile_dict(p.root), "file": str(binding.profile.file)},  # as messages name it
                "root": str(p.root), "base": p.chip_base(ct), "fallback": str(gt.simplified),
                "toolchains": [[b.profile.name, b.fingerprint.get("qnn")] for b in p.bindings]}

    return chip_plan(p, stage, ct, [], [], p.key(stage, None), args, doc.format(graph=ct.graph.name, soc=ct.soc.name))


def plan_dist(p: Planner, stage: StageDef, model: ModelSpec) -> Plan:
    """A model's package from the verified targets of the first toolchain; it goes outside build/ (dist/<model>/ or
    $QNN_DIST, known when it runs), so it has no build record."""
    return Plan(name=model.name, out_dir="", file_dep=[], outputs=[], key=p.key(stage, None),
                doc=f"package {model.name}'s verified binaries, manifest, CPU fallback and runtime libs "
                    f"(dist/{model.name}/)",
                args=lambda: {"model": model.name, "root": str(p.root),
                              "toolchains": ",".join(b.profile.name for b in p.bindings)},
                base=dict, model=model.name, record_file="")
