"""Each stage's plan function: what the stage needs for one target (files read, files written, its key's settings,
its call's arguments), as a Plan. The rows of the stage table (plan/rows.py) name them; the Planner
(plan/planner.py) serves their keys and shared pieces. Nothing here imports doit, onnx or numpy.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from qnn_tasks.modelspec import precision_table, specjson, specsplit
from qnn_tasks.modelspec.checks import DEFAULT_REPAIR_BUDGET, MODEL_CHECKS
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.modelspec.specpipeline import first_samples
from qnn_tasks.plan.paths import PROMOTED_FILE
from qnn_tasks.plan.planner import Planner
from qnn_tasks.plan.stagedef import Plan, StageDef, record_path
from qnn_tasks.plan.targets import ChipTarget, GraphTarget, PipelineTarget, VariantTarget
from qnn_tasks.run.status import Status
from qnn_tasks.toolchains import repairstep

# ------------------------------------------------------------------ graph stages (once per graph)

def graph_plan(p: Planner, stage: StageDef, gt: GraphTarget, file_dep: list[str], outputs: list[Any],
                key: dict[str, Any], args: Callable[[], dict[str, Any]], doc: str, base: dict[str, Any] | None = None,
                task_dep: list[str] | None = None) -> Plan:
    """A graph stage's plan; its key holds `key` and the stage's own model.yaml section (the row's `settings`)."""
    g = gt.graph
    keyed = {**key, **stage.settings.keyed(g)} if stage.settings else key
    return Plan(name=gt.name, out_dir=str(gt.stage_dir(stage.name)), file_dep=file_dep,
                outputs=[str(o) for o in outputs],
                key=p.key(stage, None, json.dumps(keyed, sort_keys=True), labels=("",)),
                doc=doc, args=args, base=lambda: base or {"graph": g.name}, task_dep=task_dep or [], model=g.model)


def plan_export(p: Planner, stage: StageDef, gt: GraphTarget) -> Plan | None:
    g = gt.graph
    if specsplit.is_part(g):
        return None  # a part's ONNX, inputs and reference come from its graph's split stage
    source_key = p.source_key(g)
    return graph_plan(p, stage, gt, p.code_deps(g), [gt.exported],
                       {"io": g.io(), "export": g.export, "options": g.options, "source": source_key,
                        "rewrites": g.rewrites, "constant_inputs": g.constant_inputs},
                       lambda: {"graph": p.graph_dict(g), "source": p.source(g), "out": str(gt.exported)},
                       f"export {g.model}/{g.name} -> {gt.exported}" + ("" if g.has_code else " (built-in: packaged ONNX)"),
                       base={"graph": g.name, "model": g.model, "source": source_key})


def plan_simplify(p: Planner, stage: StageDef, gt: GraphTarget) -> Plan | None:
    g = gt.graph
    if specsplit.is_part(g):
        return None
    return graph_plan(p, stage, gt, [str(gt.exported)], [gt.simplified], {"io": g.io()},
                       lambda: {"graph": p.graph_dict(g), "exported": str(gt.exported), "out": str(gt.simplified)},
                       f"onnxsim {gt.exported} -> {gt.simplified}")


def plan_lint(p: Planner, stage: StageDef, gt: GraphTarget) -> Plan:
    g = gt.graph
    loop = p.model(g).loop
    loop_feed = loop.feed if runs_loop(loop, g) else None  # lint proposes a missing loop (a size: the graph's)
    budgets = p.budgets(g)
    tightest = min(budgets.items(), key=lambda item: item[1]["mb"], default=None)
    budget = f"context budget {tightest[1]['mb']} MB on {tightest[0]}" if tightest else ""
    said = "; ".join(part for part in (last_weights(gt.lint_record, g.precisions), budget) if part)
    keyed = {arch: budget["mb"] for arch, budget in budgets.items()}  # not the file: a clone shares the cache
    return graph_plan(p, stage, gt, [str(gt.simplified)], [],
                       {"precision": g.precision, "budgets": keyed, "split": g.split,
                        **({"loop_feed": loop_feed} if loop_feed else {})},
                       lambda: {"graph": p.graph_dict(g), "simplified": str(gt.simplified), "budgets": budgets,
                                "loop_feed": loop_feed},
                       f"lint {gt.simplified} -> {gt.lint_record}" + (f" ({said})" if said else ""))


def last_weights(record: Path, precisions: tuple[str, ...]) -> str:
    """`weights 87.3 MB fp16 at the last lint` from the graph's lint record, "" before its first lint. For `doit
    list`'s doc only (never a key or a dependency): the one file besides YAML and package metadata that planning
    reads, a ~2 KB record per graph (~30 us each), so a person sees a graph's size before spending its compile."""
    try:
        measured = json.loads(Path(record).read_text()).get("weight_bytes") or {}
        sizes = [f"{measured[p] / 1e6:.1f} MB {p}" for p in precisions if isinstance(measured.get(p), int)]
    except (OSError, ValueError, AttributeError):
        return ""
    return f"weights {', '.join(sizes)} at the last lint" if sizes else ""


def plan_cpucheck(p: Planner, stage: StageDef, gt: GraphTarget) -> Plan | None:
    g = gt.graph
    if specsplit.is_part(g):
        return None
    return graph_plan(p, stage, gt, [str(gt.simplified)] + p.code_deps(g) + p.sample_deps(g),
                       [gt.inputs, gt.reference],
                       {"io": g.io(), "options": g.options, "source": p.source_key(g),
                        "constant_inputs": g.constant_inputs, "samples": g.samples},
                       lambda: {"graph": p.graph_dict(g), "source": p.source(g), "simplified": str(gt.simplified),
                                "inputs": str(gt.inputs), "reference": str(gt.reference)},
                       f"CPU check of {gt.simplified} against the original model")


def plan_calibrate(p: Planner, stage: StageDef, gt: GraphTarget) -> Plan | None:
    g = gt.graph
    if not precision_table.any_quantized(g.precisions) or specsplit.is_part(g):
        return None
    calibration = g.section("calibration")
    return graph_plan(p, stage, gt, p.code_deps(g) + p.sample_deps(g), [gt.calibration],
                       {"io": g.io(), "options": g.options, "source": p.source_key(g), "samples": g.samples},
                       lambda: {"graph": p.graph_dict(g), "source": p.source(g), "out": str(gt.calibration)},
                       f"{calibration['samples']} real calibration samples for {g.name} from "
                       + (f"export.py:{calibration['function']}()" if g.has_code else "the declared sample files"),
                       task_dep=[f"export:{gt.name}"])  # a graph export refuses (int8 inside) has nothing to calibrate


def plan_split(p: Planner, stage: StageDef, gt: GraphTarget) -> Plan | None:
    """A graph declared with `split:` cut into its parts: each part's ONNX, inputs, reference (and calibration)."""
    g = gt.graph
    if not specsplit.is_whole(g):
        return None
    parts = [t for t in p.graphs if specsplit.is_part(t.graph) and t.graph.split["of"] == g.name
             and t.graph.model == g.model]
    calibration = str(gt.calibration) if precision_table.any_quantized(g.precisions) else None
    files = [{"name": t.name, "onnx": str(t.simplified), "inputs": str(t.inputs), "reference": str(t.reference),
              **({"calibration": str(t.calibration)} if calibration else {})} for t in parts]
    out = str(gt.stage_dir(stage.name))
    return graph_plan(p, stage, gt, [str(gt.simplified), str(gt.inputs), str(gt.reference)]
                      + ([calibration] if calibration else []),
                      [f for part in files for k, f in part.items() if k != "name"] + [f"{out}/parts.json"],
                      {"split": g.split, "precision": g.precision, "parts": [t.name for t in parts]},
                      lambda: {"graph": p.graph_dict(g), "simplified": str(gt.simplified), "inputs": str(gt.inputs),
                               "reference": str(gt.reference), "calibration": calibration, "parts": files},
                      f"split {g.name} into {len(parts)} parts ({', '.join(t.name for t in parts)}); chain them on "
                      "CPU against the whole graph")


# ------------------------------------------------------------------ toolchain graph stages (once per variant)

def promoted_file(vt: VariantTarget) -> str | None:
    """A repaired variant's promoted.json: the weights its quantize keeps at 16 bits, and the chosen step's files
    its quantize, context and simulate may adopt (the repair row's folder: the table imports this module)."""
    return f"{vt.dir / 'repair'}/{PROMOTED_FILE}" if precision_table.is_repaired(vt.precision) else None


def plan_variant_stage(p: Planner, stage: StageDef, vt: VariantTarget) -> Plan | None:
    binding = p.binding(vt)
    source = str(vt.graph_target.simplified)
    for graph_stage, out, outputs in p.variant_chain(vt):
        if graph_stage.name == stage.name:
            g, gt = vt.graph, vt.graph_target
            calibration = str(gt.calibration) if graph_stage.needs_calibration else None
            # w8a16-mixed: the first graph stage quantizes with the weights its repair promoted
            promoted = promoted_file(vt) if source == str(gt.simplified) else None
            key = {"precision": vt.precision, "io": g.io(),
                   "calibration": g.section("calibration") if calibration else None}
            return Plan(name=vt.name, out_dir=out, file_dep=[source] + ([calibration] if calibration else [])
                        + ([promoted] if promoted else []),
                        outputs=outputs, key=p.key(stage, binding, json.dumps(key, sort_keys=True), labels=("",)),
                        doc=f"{stage.name} {g.name} ({vt.precision}) with {vt.toolchain_id}",
                        args=lambda g=g, vt=vt, source=source, calibration=calibration, promoted=promoted: {
                            "graph": p.graph_dict(g), "precision": vt.precision, "source": source,
                            "calibration": calibration, **({"promoted": promoted} if promoted else {})},
                        base=lambda g=g, vt=vt, binding=binding: {
                            "graph": g.name, "precision": vt.precision,
                            "toolchain": {"id": vt.toolchain_id, "profile": binding.profile.name, **binding.fingerprint}},
                        binding=binding, model=g.model)
        source = outputs[0]
    return None


def plan_repair(p: Planner, stage: StageDef, vt: VariantTarget) -> Plan | None:
    """A repaired variant's (w8a16-mixed, w4a16-mixed) search for the weights to keep at 16 bits, measured on the
    first chip it builds for."""
    chip = next((ct for ct in p.chips if ct.variant is vt and not ct.skip_reason), None) \
        if precision_table.is_repaired(vt.precision) else None
    if chip is None:
        return None
    g, gt = vt.graph, vt.graph_target
    out = str(vt.dir / stage.name)
    budget = g.section("calibration").get("repair_budget", DEFAULT_REPAIR_BUDGET)
    runs_code = any(check["kind"] in MODEL_CHECKS for check in chip.verify["checks"])
    settings = json.dumps({"verify": chip.verify, "calibration": g.section("calibration"), "budget": budget,
                           "io": g.io(), "soc": chip.soc.row(), "precision": vt.precision}, sort_keys=True)
    binding = p.binding(vt)
    return Plan(name=vt.name, out_dir=out, model=g.model,
                file_dep=[str(gt.simplified), str(gt.calibration), str(gt.inputs), str(gt.reference)]
                + (p.code_deps(g) if runs_code else []) + p.check_deps(g, chip.verify),
                outputs=[f"{out}/{PROMOTED_FILE}"] + [f"{out}/{f}" for f in repairstep.files(g.name)],
                key=p.key(stage, binding, settings, labels=("",)),
                doc=f"find the fewest weights of {g.name} to keep at 16 bits so that "
                    f"{precision_table.BY_NAME[vt.precision].base} passes its checks, on {chip.soc.name}'s simulator "
                    f"(budget {budget} compiles)",
                args=lambda: {"graph": p.graph_dict(g), "verify": chip.verify, "soc": specjson.soc_to_dict(chip.soc),
                              "simplified": str(gt.simplified), "calibration": str(gt.calibration),
                              "inputs": str(gt.inputs), "reference": str(gt.reference), "budget": budget,
                              "precision": vt.precision},
                base=lambda: {"graph": g.name, "precision": vt.precision, "soc": chip.soc.name,
                              "toolchain": {"id": vt.toolchain_id, "profile": binding.profile.name,
                                            **binding.fingerprint}},
                binding=binding)


# ------------------------------------------------------------------ chip stages (per variant x chip)

def chip_plan(p: Planner, stage: StageDef, ct: ChipTarget, file_dep: list[str], outputs: list[str], key: str,
               args: Callable[[], dict[str, Any]], doc: str, task_dep: list[str] | None = None) -> Plan:
    return Plan(name=ct.name, out_dir=f"{ct.dir_str}/{stage.name}", file_dep=file_dep, outputs=outputs, key=key,
                model=ct.graph.model,
                doc=doc, args=args, base=lambda: p.chip_base(ct), binding=p.binding(ct), task_dep=task_dep or [],
                skip=ct.skip_reason)


def plan_config(p: Planner, stage: StageDef, ct: ChipTarget) -> Plan:
    return chip_plan(p, stage, ct, [], p.config_files(ct), p.chip_key(stage, ct),
                      lambda: {"graph": p.graph_dict(ct.graph), "precision": ct.precision,
                               "soc": specjson.soc_to_dict(ct.soc)},
                      f"{p.binding(ct).toolchain.kind} HTP settings for {ct.graph.name} on {ct.soc.name} "
                      f"(soc_id {ct.soc.soc_id}, {ct.soc.dsp_arch})")


def plan_context(p: Planner, stage: StageDef, ct: ChipTarget) -> Plan:
    source = p.compile_source(ct.variant)
    return chip_plan(p, stage, ct, [source] + p.config_files(ct), p.context_files(ct),
                      p.chip_key(stage, ct, allow_cpu_fallback=ct.graph.allow_cpu_fallback),
                      lambda: {"graph": p.graph_dict(ct.graph), "soc": specjson.soc_to_dict(ct.soc), "source": source,
                               "config_dir": f"{ct.dir_str}/config", "lint": str(ct.graph_target.lint_record),
                               "simplified": str(ct.graph_target.simplified), "promoted": promoted_file(ct.variant)},
                      f"compile {ct.graph.name} ({ct.precision}) for {ct.soc.name} with {ct.toolchain_id}"
                      + _estimated(ct), task_dep=[f"lint:{ct.graph.name}"])


def _estimated(ct: ChipTarget) -> str:
    """`; phone ~1.2 ms, estimated ...` from the graph's last lint, for `doit list`: step 0 before a compile."""
    from qnn_tasks.latency.shown import doc_text

    said = doc_text(ct.graph_target.lint_record, ct.soc.name, ct.precision)
    return f"; {said}" if said else ""


def plan_simulate(p: Planner, stage: StageDef, ct: ChipTarget) -> Plan:
    gt = ct.graph_target
    ctx_files = p.context_files(ct)
    config = p.config_files(ct)[0]
    return chip_plan(p, stage, ct, ctx_files + [config, str(gt.inputs), str(gt.reference)],
                      [f"{ct.dir_str}/simulate/outputs.npz", f"{ct.dir_str}/simulate/cpu_vs_npu.png"],
                      p.chip_key(stage, ct, verify={"samples": ct.verify["samples"]}),
                      lambda: {"graph": p.graph_dict(ct.graph), "ctx_onnx": ctx_files[0], "provider_options": config,
                               "inputs": str(gt.inputs), "samples": ct.verify["samples"], "reference": str(gt.reference),
                               "title": ct.name, "soc_name": ct.soc.name, "soc": specjson.soc_to_dict(ct.soc),
                               "binary": next((f for f in ctx_files if f.endswith(".bin")), None),
                               "promoted": promoted_file(ct.variant)},
                      f"run {ct.graph.name} for {ct.soc.name} on the HTP simulator; keep the outputs")


def plan_simverify(p: Planner, stage: StageDef, ct: ChipTarget) -> Plan:
    gt = ct.graph_target
    outputs = f"{ct.dir_str}/simulate/outputs.npz"
    simulation = record_path("simulate", ct)
    settings = p.cached_json("verify", ct.variant.name, lambda: ct.verify)
    # Records are not dependencies: their volatile parts (seconds, where it ran) would change the cache key
    # of an identical judgement. The outputs are; the simulate record only lends its timing, and lint's
    # only adds hints to a failure message. A check that runs the model's code (wer) depends on that code. The inputs
    # and the simplified graph (read only to judge a failure again in float64) made the reference, a dependency.
    runs_code = any(check["kind"] in MODEL_CHECKS for check in ct.verify["checks"])
    plan = chip_plan(p, stage, ct, [outputs, str(gt.reference)] + (p.code_deps(ct.graph) if runs_code else [])
                      + p.check_deps(ct.graph, ct.verify), [],
                      p.key(stage, None, ct.precision, settings, labels=("precision", "verify")),
                      lambda: {"graph": p.graph_dict(ct.graph), "verify": ct.verify, "outputs": outputs,
                               "reference": str(gt.reference), "simulation": simulation, "precision": ct.precision,
                               "lint": str(gt.lint_record), "inputs": str(gt.inputs), "simplified": str(gt.simplified),
                               "cpucheck": record_path("cpucheck", gt)},
                      f"judge {ct.graph.name} on {ct.soc.name}: simulator outputs vs CPU (metrics, thresholds, checks)")
    plan.heavy = True if runs_code else None  # decoding speech is work for a child process
    return plan


def plan_diagnose(p: Planner, stage: StageDef, ct: ChipTarget) -> Plan | None:
    if ct.skip_reason:
        return None
    gt = ct.graph_target
    config = p.config_files(ct)[0]
    source = p.compile_source(ct.variant)  # w8a16: the quantized (QDQ) model the binary was compiled from
    model = source if source.endswith(".onnx") else str(gt.simplified)
    binary = next((f for f in p.context_files(ct) if f.endswith(".bin")), None)
    verdict = record_path("simverify", ct)
    inputs = [model, config, str(gt.inputs), str(gt.reference)] + ([binary] if binary else [])
    return chip_plan(p, stage, ct, inputs, [f"{ct.dir_str}/diagnose/diagnose.md"],
                      p.chip_key(stage, ct, verify=ct.verify),
                      lambda: {"graph": p.graph_dict(ct.graph), "verify": ct.verify, "soc": specjson.soc_to_dict(ct.soc),
                               "model": model, "provider_options": config, "inputs": str(gt.inputs),
                               "reference": str(gt.reference), "shipped_failed": _failed(verdict), "binary": binary,
                               "precision": ct.variant.precision, "cpucheck": record_path("cpucheck", gt)},
                      f"find where {ct.graph.name} diverges on {ct.soc.name}: per-node CPU vs NPU error")


def plan_pipeline(p: Planner, stage: StageDef, pt: PipelineTarget) -> Plan:
    """The model's graphs chained on the simulator: each fed the NPU outputs of the one before."""
    spec = pt.pipeline
    chain = [{"graph": ct.graph, "ctx": p.context_files(ct), "config": p.config_files(ct)[0],
              "simplified": str(ct.graph_target.simplified), "target": ct.name} for ct in pt.chips]
    first_inputs = str(pt.chips[0].graph_target.inputs)
    first_outputs = simulated_first_link(pt)
    file_dep = [first_inputs] + [f for link in chain for f in link["ctx"] + [link["config"], link["simplified"]]] \
        + p.check_deps(chain[-1]["graph"], spec.verify) + ([first_outputs] if first_outputs else [])
    settings = json.dumps({"graphs": spec.graphs, "feed": spec.feed, "verify": spec.verify,
                           **({"glue": spec.glue} if spec.glue else {}),
                           **({"values": spec.values} if spec.values else {})}, sort_keys=True)
    soc = p.cached_json("soc", pt.soc.name, pt.soc.row)
    binding = p.binding(pt)
    return Plan(name=pt.name, out_dir=str(pt.stage_dir(stage.name)), file_dep=file_dep, model=spec.model,
                outputs=[f"{pt.stage_dir(stage.name)}/outputs.npz"],
                key=p.key(stage, binding, soc, settings, labels=("soc", "pipeline")),
                doc=f"chain {' -> '.join(spec.graphs)} on {pt.soc.name}'s simulator; judge the end against the CPU chain",
                args=lambda: {"graphs": [p.graph_dict(link["graph"]) for link in chain],
                              "ctx": [link["ctx"][0] for link in chain], "configs": [link["config"] for link in chain],
                              "simplified": [link["simplified"] for link in chain], "inputs": first_inputs,
                              "feed": {k: list(v) for k, v in spec.feed.items()}, "verify": spec.verify,
                              "soc": specjson.soc_to_dict(pt.soc),
                              "binaries": [[next((f for f in link["ctx"] if f.endswith(".bin")), None), link["target"]]
                                           for link in chain],
                              **({"glue": spec.glue} if spec.glue else {}),
                              **({"values": spec.values} if spec.values else {}),
                              **({"size": spec.size} if spec.size else {}),  # messages name graphs as written
                              **({"first_outputs": first_outputs, "first_record": record_path("simulate", pt.chips[0])}
                                 if first_outputs else {})},
                base=lambda: {"model": spec.model, "graphs": list(spec.graphs), "soc": pt.soc.row(),
                              "toolchain": {"id": binding.id, "profile": binding.profile.name, **binding.fingerprint}},
                binding=binding)


def simulated_first_link(pt: PipelineTarget) -> str | None:
    """The first graph's simulate outputs when they cover the samples the chain starts from: the same binary on
    the same inputs (its first N samples), so the pipeline takes them instead of simulating the window again."""
    first, spec = pt.chips[0], pt.pipeline  # never a skipped chip: pipeline_targets leaves those out
    if any(not ct.graph.inputs for ct in pt.chips):  # a split graph's parts (I/O known once split): fed plainly
        needed = spec.verify["samples"]
    else:
        needed = first_samples([ct.graph for ct in pt.chips], spec.glue, spec.feed, spec.verify["samples"], spec.values)
    limit = first.verify["samples"]
    if limit is None or (needed is not None and needed <= limit):
        return f"{first.dir_str}/simulate/outputs.npz"
    return None


def plan_loop(p: Planner, stage: StageDef, ct: ChipTarget) -> Plan | None:
    """The model's `loop:` graph run step after step on the chip's simulator and on CPU, each carrying its state."""
    loop = p.model(ct.graph).loop
    if not runs_loop(loop, ct.graph):
        return None
    start, start_files, task_dep = None, [], []
    if loop.start:  # encoder once -> decoder loop: each run starts from the pipeline's kept outputs on this chip
        pt = start_pipeline(p, ct)
        if pt is None:
            return None  # the pipeline is not built for this chip or precision: no run to start from
        chain = pt.stage_dir("pipeline")
        start = {"npu": f"{chain}/outputs.npz", "cpu": f"{chain}/reference.npz", "inputs": loop.start,
                 "pipeline": pt.name}
        start_files, task_dep = [start["npu"], start["cpu"]], [f"pipeline:{pt.name}"]
    gt = ct.graph_target
    ctx_files = p.context_files(ct)
    config = p.config_files(ct)[0]
    settings = loop.settings(ct.precision)
    code = p.code_deps(ct.graph) if loop.step or any(c["kind"] in MODEL_CHECKS for c in settings["verify"]["checks"]) else []
    partners, partner_files = transducer_partners(p, ct, loop.transducer)
    out = f"{ct.dir_str}/{stage.name}"
    return chip_plan(p, stage, ct, ctx_files + [config, str(gt.simplified), str(gt.inputs)] + start_files + code
                      + partner_files,
                      [f"{out}/outputs.npz", f"{out}/reference.npz", f"{out}/per_step_error.png"]
                      + ([f"{out}/per_chunk_agreement.png"] if loop.transducer else []),
                      p.chip_key(stage, ct, loop=settings),
                      lambda: {"graph": p.graph_dict(ct.graph), "loop": settings, "ctx_onnx": ctx_files[0],
                               "provider_options": config, "simplified": str(gt.simplified), "inputs": str(gt.inputs),
                               "soc_name": ct.soc.name, "start": start,
                               "partners": {role: {**files, "graph": p.graph_dict(c.graph)}
                                            for role, (c, files) in partners.items()}},
                      f"run {ct.graph.name} as a loop on {ct.soc.name}'s simulator (the NPU carrying its own state) "
                      "and on CPU; judge every step" + (f" (each run started by pipeline:{start['pipeline']}'s outputs)"
                                                         if start else ""),
                      task_dep=task_dep)


def transducer_partners(p: Planner, ct: ChipTarget, transducer: dict[str, Any] | None
                        ) -> tuple[dict[str, tuple[ChipTarget, dict[str, str]]], list[str]]:
    """A transducer loop's decoder and joiner on the encoder's chip, precision and toolchain: role -> (their chip
    target, the binary, config and simplified ONNX the search runs), and those files (the loop's dependencies, with
    the tokens file). Their graphs are built for the encoder's chips and precisions (modelspec/spectransducer.py)."""
    if not transducer:
        return {}, []
    found = {}
    for role in ("decoder", "joiner"):
        partner = next(c for c in p.chips if c.graph.model == ct.graph.model and c.graph.name == transducer[role]
                       and c.precision == ct.precision and c.soc.name == ct.soc.name
                       and c.variant.suffix == ct.variant.suffix)
        found[role] = (partner, {"ctx_onnx": p.context_files(partner)[0], "provider_options": p.config_files(partner)[0],
                                 "simplified": str(partner.graph_target.simplified)})
    tokens = os.path.relpath(ct.graph.model_dir / transducer["tokens"], p.root)
    return found, [f for _, files in found.values() for f in files.values()] + [tokens]


def start_pipeline(p: Planner, ct: ChipTarget) -> PipelineTarget | None:
    """The pipeline a loop with `start:` on this chip target starts from: the one at the loop graph's size when the
    model's pipeline is one per size (`<model>.<dim><size>`), else the model's own pipeline; on the same chip and
    toolchain. None when it is not built there."""
    size = ct.graph.size
    wanted = f"{size.dim}{size.size}" if size and p.model(ct.graph).size_pipelines else ""
    return next((pt for pt in p.pipelines if pt.pipeline.model == ct.graph.model and pt.soc.name == ct.soc.name
                 and pt.pipeline.size == wanted and (wanted or not pt.pipeline.name)  # not a split graph's parts
                 and pt.chips[0].variant.suffix == ct.variant.suffix), None)


def size_chips(p: Planner, ct: ChipTarget) -> list[ChipTarget]:
    """Every size of the chip target's graph (model.yaml `dims:`) at its precision, chip and toolchain, ascending;
    empty for a graph without sizes."""
    size = ct.graph.size
    if size is None:
        return []
    return p.sized_chips[(size.graph, ct.precision, ct.soc.name, ct.variant.suffix)]


def plan_crosssize(p: Planner, stage: StageDef, ct: ChipTarget) -> Plan | None:
    """On the largest size of a graph with sizes: every smaller size's samples padded into every larger size give
    the same result on this chip's simulator (the kept simulate outputs of each size, judged by the graph's checks)."""
    sizes = size_chips(p, ct)
    if len(sizes) < 2 or sizes[-1] is not ct:
        return None
    inputs = [str(c.graph_target.inputs) for c in sizes]
    outputs = [f"{c.dir_str}/simulate/outputs.npz" for c in sizes]
    names = [c.graph.name for c in sizes]
    settings = p.cached_json("verify", ct.variant.name, lambda: ct.verify)
    runs_code = any(check["kind"] in MODEL_CHECKS for check in ct.verify["checks"])
    return chip_plan(p, stage, ct, inputs + outputs + (p.code_deps(ct.graph) if runs_code else [])
                     + p.check_deps(ct.graph, ct.verify), [],
                     p.key(stage, None, ct.precision, settings, json.dumps(ct.graph.size.as_dict(), sort_keys=True),
                           labels=("precision", "verify", "dims")),
                     lambda: {"graphs": [p.graph_dict(c.graph) for c in sizes], "verify": ct.verify, "inputs": inputs,
                              "outputs": outputs, "soc_name": ct.soc.name},
                     f"cross-size check of {ct.graph.size.graph} on {ct.soc.name}: a sample that fits "
                     f"{', '.join(names[:-1])} gives the same result padded into every larger size up to {names[-1]}",
                     task_dep=[f"simulate:{c.name}" for c in sizes[:-1]])


def auto_candidates(p: Planner, ct: ChipTarget) -> list[ChipTarget]:
    """`precision: auto`: the candidates of ct's graph on ct's chip with ct's toolchain, in the model's order."""
    found = {c.precision: c for c in p.chips if c.graph_target is ct.graph_target and c.soc.name == ct.soc.name
             and c.toolchain_id == ct.toolchain_id}
    return [found[precision] for precision in ct.graph.auto if precision in found]


def plan_choose(p: Planner, stage: StageDef, ct: ChipTarget) -> Plan | None:
    """`precision: auto` on one chip: the smallest verified candidate. Planned on the first candidate's target (its
    record lives there); named `choose:<graph>-<chip>`."""
    g = ct.graph
    if not g.auto or ct.precision != g.auto[0]:
        return None
    candidates = auto_candidates(p, ct)
    built = [c for c in candidates if not c.skip_reason]
    binding = p.binding(ct)

    def stage_records(c: ChipTarget) -> dict[str, str]:
        found = {s.name: record_path(s.name, c.variant) for s in binding.toolchain.graph_stages(c.precision)}
        if precision_table.is_repaired(c.precision):
            found["repair"] = record_path("repair", c.variant)
        return {**found, **{name: record_path(name, c) for name in ("context", "simulate", "simverify")}}

    settings = json.dumps({"order": list(g.auto), "verify": {c.precision: c.verify for c in candidates}},
                          sort_keys=True)
    binaries = [f for c in built for f in p.context_files(c) if f.endswith(".bin")]
    return Plan(name=f"{g.name}-{ct.soc.name}{ct.variant.suffix}", out_dir=f"{ct.dir_str}/{stage.name}",
                file_dep=binaries + [f"{c.dir_str}/simulate/outputs.npz" for c in built]
                + [str(ct.graph_target.reference)],
                outputs=[], key=p.key(stage, None, settings, labels=("",)), model=g.model,
                doc=f"precision auto: the smallest of {', '.join(g.auto)} that passes its checks on {ct.soc.name}",
                args=lambda: {"graph": g.name, "soc": ct.soc.name,
                              "candidates": [{"precision": c.precision, "target": c.name, "skip": c.skip_reason,
                                              "records": stage_records(c)} for c in candidates]},
                base=lambda: {"graph": g.name, "soc": ct.soc.row(), "toolchain": {"id": ct.toolchain_id}},
                binding=binding, task_dep=[f"simverify:{c.name}" for c in built],
                skip=None if built else f"no candidate of precision auto builds for {ct.soc.name}")


def runs_loop(loop: Any, graph: GraphSpec) -> bool:
    """Whether `graph` is its model's `loop:` graph, or a size of it (a loop over a graph with sizes runs per size)."""
    return loop is not None and loop.graph in (graph.name, graph.size.graph if graph.size else None)


def _failed(record: str) -> bool | None:
    """A stage record's verdict: True if it failed, False if it passed, None if there is none."""
    try:
        return json.loads(Path(record).read_text()).get("status") == Status.FAILED
    except (FileNotFoundError, ValueError):
        return None

