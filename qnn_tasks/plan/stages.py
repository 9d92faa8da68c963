"""The stage table: one row per stage, and what each stage needs for one target (a Plan).

A row says the stage's name, scope (graph / variant / chip), doc, the modules whose code is in
its key, and whether it is heavy (native work: a child process or a Dask worker runs it). Its
plan function turns one target into files read, files written, a key and lazily built call
arguments. tasks/project.py turns rows x targets into doit tasks; executors run the calls. Nothing here
imports doit, onnx or numpy: planning happens on every `doit` invocation.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator

from qnn_tasks import toolchains
from qnn_tasks.plan import codekeys
from qnn_tasks.plan.paths import COMPAT_RECORD, DEVICE_STAMP, PROMOTED_FILE
from qnn_tasks.plan.targets import (
    BUILD_DIR,
    ChipTarget,
    GraphTarget,
    PipelineTarget,
    VariantTarget,
    chip_targets,
    graph_targets,
    pipeline_targets,
    variant_targets,
)
from qnn_tasks.spec import precisions as precision_table
from qnn_tasks.spec import serial as specjson
from qnn_tasks.spec import split as specsplit
from qnn_tasks.spec.checks import DEFAULT_REPAIR_BUDGET, MODEL_CHECKS
from qnn_tasks.spec.pipeline import first_samples
from qnn_tasks.spec.project import GraphSpec, Project, ToolchainProfile
from qnn_tasks.spec.yamlread import as_name

# In every key: records name what they were made from (`made_from`) since this format, so a record of before,
# which the report cannot compare with today's spec, is built again once rather than believed.
RECORD_FORMAT = "made_from/1"


@dataclass
class Plan:
    name: str                                  # doit subtask name
    out_dir: str                               # the stage's own folder
    file_dep: list[str]                        # files it reads
    outputs: list[str]                         # files it writes (the record vouches for them)
    key: str                                   # settings + code version (+ toolchain, SoC row), digested
    doc: str
    args: Callable[[], dict[str, Any]]         # call arguments, built when the task runs
    base: Callable[[], dict[str, Any]]         # fields every record of this target starts with
    binding: "Binding | None" = None           # the toolchain that runs it (toolchain stages)
    task_dep: list[str] = field(default_factory=list)
    skip: str | None = None                    # a visible skip (e.g. no fp16 on this chip)
    heavy: bool | None = None                  # overrides the row's (a judgement that runs model code)
    model: str = ""                            # the model it belongs to (its model.yaml's `stage_timeout`)

    @property
    def record(self) -> str:
        return f"{self.out_dir}/{self.out_dir.rsplit('/', 1)[-1]}.json"


@dataclass(frozen=True)
class StageDef:
    """One stage: everything the task layer, the executors, the report and the code key need to know of it."""
    name: str
    scope: str                                 # "graph" | "variant" | "chip" | "pipeline" | "model" | "project"
    doc: str
    runner: str                                # "module:function" run with the StageCall; its imports are the code key
    plan: Callable[["Planner", "StageDef", Any], Plan | None] | None
    heavy: bool = True
    remote: bool = False                       # may run on a Dask worker (reads only build files)
    toolchain: bool = False                    # runs with (and is keyed by) a toolchain
    column: bool = True                        # a column of the report's stage table

    def record_of(self, target: Any) -> str:
        """Where this stage's record for a target is (`record_path`: the one place a record path is made)."""
        return record_path(self.name, target)


SPLIT_MADE = ("export", "simplify", "cpucheck", "calibrate")  # what a split part's graph's split stage made for it


def record_path(stage: str, target: Any) -> str:
    """The record of `stage` for a target (graph, variant, chip or pipeline): <target dir>/<stage>/<stage>.json.

    A split part (`<graph>.part<N>`) has no export, simplify, cpucheck or calibrate of its own: its graph's split
    stage made its ONNX, inputs, reference and calibration set, so those facts are the graph's split record. The
    report, dist, the cache and the stages all ask here, so a part's records are found the same way by everyone.
    """
    if stage in SPLIT_MADE and isinstance(target, GraphTarget) and specsplit.is_part(target.graph):
        return f"{target.dir.parent / target.graph.split['of']}/split/split.json"
    folder = target.dir_str if isinstance(target, ChipTarget) else str(target.dir)
    return f"{folder}/{stage}/{stage}.json"


@dataclass
class Binding:
    """One toolchain of this run: its profile, implementation, id, fingerprint and targets."""
    profile: ToolchainProfile
    toolchain: Any
    id: str
    fingerprint: dict[str, Any]
    fingerprint_json: str
    suffix: str                                # "" for the first toolchain, "@<profile>" for the others
    variants: list[VariantTarget] = field(default_factory=list)
    chips: list[ChipTarget] = field(default_factory=list)
    pipelines: list[PipelineTarget] = field(default_factory=list)

    def profile_dict(self, root: Path) -> dict[str, Any]:
        return specjson.profile_to_dict(self.profile, root)


class Planner:
    """Everything planning needs for one run, with the pieces keys repeat serialised once."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.root = project.root
        self.graphs = graph_targets(project)
        self.bindings: list[Binding] = []
        for index, profile in enumerate(project.toolchains or (project.toolchain,)):
            chain = toolchains.from_profile(profile)
            fingerprint = chain.fingerprint()
            toolchain_id = as_name(chain.id(), profile.file, "", "the toolchain id made from its kind and versions",
                                 "check the versions it is made of (for qairt: the SDK folder name or sdk.yaml's "
                                 "version and build)")
            binding = Binding(profile=profile, toolchain=chain, id=toolchain_id, fingerprint=fingerprint,
                              fingerprint_json=json.dumps(fingerprint, sort_keys=True),
                              suffix="" if index == 0 else f"@{profile.name}")
            binding.variants = variant_targets(project, binding.id, binding.suffix, self.graphs)
            binding.chips = chip_targets(project, binding.id, binding.suffix, binding.variants)
            binding.pipelines = pipeline_targets(project, binding.chips, binding.id)
            self.bindings.append(binding)
        self.variants = [vt for b in self.bindings for vt in b.variants]
        self.chips = [ct for b in self.bindings for ct in b.chips]
        self.pipelines = [pt for b in self.bindings for pt in b.pipelines]
        self._by_suffix = {b.suffix: b for b in self.bindings}
        self._models = {m.name: m for m in project.models}  # a scan per graph grew with models x graphs
        self._json: dict[tuple, str] = {}
        self._sources: dict[str, str] = {}
        self._key_prefixes: dict[tuple[str, int], tuple[str, str]] = {}
        self._made_of: dict[str, tuple[str, Binding | None, tuple[str, ...], tuple[str, ...]]] = {}
        self._model_code: dict[Path, list[str]] = {}

    # ------------------------------------------------------------ shared pieces
    @cached_property
    def sized_chips(self) -> dict[tuple[str, str, str, str], list[ChipTarget]]:
        """(declared graph, precision, chip, toolchain suffix) -> the chip targets of its sizes, ascending (once)."""
        index: dict[tuple[str, str, str, str], list[ChipTarget]] = {}
        for ct in self.chips:
            if ct.graph.size is not None:
                index.setdefault((ct.graph.size.graph, ct.precision, ct.soc.name, ct.variant.suffix), []).append(ct)
        return {key: sorted(chips, key=lambda c: c.graph.size.size) for key, chips in index.items()}

    def binding(self, target: VariantTarget | ChipTarget | PipelineTarget) -> Binding:
        if isinstance(target, PipelineTarget):
            target = target.chips[0]
        variant = target.variant if isinstance(target, ChipTarget) else target
        return self._by_suffix[variant.suffix]

    def cached_json(self, kind: str, name: str, make: Callable[[], Any]) -> str:
        key = (kind, name)
        if key not in self._json:
            self._json[key] = json.dumps(make(), sort_keys=True)
        return self._json[key]

    def key(self, stage: StageDef, binding: Binding | None, *parts: str, labels: tuple[str, ...] = ()) -> str:
        """The digest of the stage's code, its toolchain (toolchain stages) and `parts`, the settings it reads.

        `labels` name the parts (not digested) for plan/freshness.py, which says which setting changed; "" for a
        part that is a JSON mapping of labelled settings itself."""
        keyed_binding = binding if binding and stage.toolchain else None
        cached = self._key_prefixes.get((stage.name, id(keyed_binding)))
        if cached is None:  # once per (stage, toolchain): the same for its thousands of targets
            entries = (stage.runner,) + ((type(keyed_binding.toolchain).__module__,) if keyed_binding else ())
            code = codekeys.digest(entries)
            cached = ("|".join((stage.name, code, keyed_binding.fingerprint_json if keyed_binding else "",
                                RECORD_FORMAT)), code)
            self._key_prefixes[(stage.name, id(keyed_binding))] = cached
        digest = hashlib.md5("|".join((cached[0],) + parts).encode()).hexdigest()
        self._made_of[digest] = (cached[1], keyed_binding, labels, parts)  # references only: no copy, no parsing
        return digest

    def made_of(self, key: str) -> tuple[str, Binding | None, tuple[str, ...], tuple[str, ...]] | None:
        """(code version, keyed toolchain, labels, parts) of a key this planner made (None: another's)."""
        return self._made_of.get(key)

    def graph_dict(self, graph: GraphSpec) -> dict[str, Any]:
        data = specjson.graph_to_dict(graph, self.root)
        if specsplit.is_part(graph):  # its I/O are the cut tensors, known once the split stage has run
            try:
                parts = json.loads((self.root / self.split_dir(graph.model, graph.split["of"]) / "parts.json").read_text())
                data.update(parts.get(graph.name) or {})
            except (OSError, ValueError):
                pass  # not split yet: the stage that needs the I/O depends on the split's files and runs after it
        return data

    def split_dir(self, model: str, graph: str) -> str:
        return f"{BUILD_DIR}/{model}/{graph}/split"

    def budgets(self, graph: GraphSpec) -> dict[str, dict[str, Any]]:
        """The context budget of each arch this graph builds for: {arch: {mb, socs, where, memory_mb, memory_where,
        vtcm_mb}}: the smallest row's weight budget (context_mb), resident memory limit (memory_mb) and VTCM."""
        found: dict[str, dict[str, Any]] = {}
        default = self.project.default_socs if self.project.default_socs is not None else tuple(self.project.socs)
        for name in graph.socs or default:
            soc = self.project.socs[name]
            if not any(soc.supports(p) for p in graph.precisions):
                continue
            entry = found.setdefault(soc.dsp_arch, {"mb": soc.context_mb, "socs": [], "where": soc.where(),
                                                    "memory_mb": soc.memory_mb, "memory_where": soc.where(),
                                                    "vtcm_mb": soc.vtcm_mb})
            entry["socs"].append(soc.name)
            if soc.context_mb < entry["mb"]:
                entry.update(mb=soc.context_mb, where=soc.where())
            if soc.memory_mb < entry["memory_mb"]:
                entry.update(memory_mb=soc.memory_mb, memory_where=soc.where())
            entry["vtcm_mb"] = min(entry["vtcm_mb"], soc.vtcm_mb)
        return found

    def model(self, graph: GraphSpec):
        return self._models[graph.model]

    def model_named(self, name: str):
        """The model's spec (None for a name that is no model, e.g. a project-wide stage's)."""
        return self._models.get(name)

    def _source_of(self, graph: GraphSpec):
        return graph.source or self.model(graph).source  # a graph's `source:` overrides the model's

    def source(self, graph: GraphSpec) -> str | None:
        path = self._source_of(graph).resolve_file(self.model(graph).dir)
        return specjson.relative(path, self.root) if path else None

    def source_key(self, graph: GraphSpec) -> dict[str, Any]:
        source = self._source_of(graph)
        return {"package": source.package, "version": source.package_version(), "file": source.file}

    def code_deps(self, graph: GraphSpec) -> list[str]:
        """The model's own code and its source file, relative where inside the project.

        The code is export.py (optional) and every other .py beside it: export.py may import its helpers
        from its folder (Whisper's decoder and weight reader), and an edit to one must rebuild too.
        """
        source = self.source(graph)
        code = self._model_code_files(graph.model_dir) if graph.has_code else []
        return code + ([source] if source else [])

    def _model_code_files(self, model_dir: Path) -> list[str]:
        if model_dir not in self._model_code:
            names = sorted(e.name for e in os.scandir(model_dir) if e.name.endswith(".py") and e.is_file())
            self._model_code[model_dir] = [os.path.relpath(model_dir / n, self.root) for n in names]
        return self._model_code[model_dir]

    def check_deps(self, graph: GraphSpec, verify: dict[str, Any]) -> list[str]:
        """Files the task checks read (a ctc check's alphabet, in the model folder)."""
        return [os.path.relpath(graph.model_dir / c["alphabet"], self.root) for c in verify["checks"] if c.get("alphabet")]

    def sample_deps(self, graph: GraphSpec) -> list[str]:
        """The declared sample files (model.yaml `samples:`), read by cpucheck and calibrate."""
        from qnn_tasks.plan.targets import upstream_references

        return [os.path.relpath(p, self.root) for p in graph.sample_files()] \
            + [str(p) for p in upstream_references(graph).values()]  # `from:` an earlier graph's CPU outputs

    def variant_chain(self, vt: VariantTarget) -> list[tuple[Any, str, list[str]]]:
        """(stage, out_dir, outputs) of the toolchain's graph stages for this variant, in order."""
        chain = []
        for stage in self.binding(vt).toolchain.graph_stages(vt.precision):
            out = vt.stage_dir(stage.name)
            chain.append((stage, str(out), [str(p) for p in stage.outputs(vt.graph, vt.precision, out)]))
        return chain

    def compile_source(self, vt: VariantTarget) -> str:
        """What `context` compiles: the last graph stage's primary output, else the simplified ONNX."""
        if vt.name not in self._sources:
            chain = self.variant_chain(vt)
            self._sources[vt.name] = chain[-1][2][0] if chain else str(vt.graph_target.simplified)
        return self._sources[vt.name]

    def chip_key(self, stage: StageDef, ct: ChipTarget, **extra: Any) -> str:
        soc = self.cached_json("soc", ct.soc.name, ct.soc.row)
        settings = self.cached_json(f"extra:{stage.name}", ct.variant.name, lambda: extra)
        return self.key(stage, self.binding(ct), soc, ct.precision, settings, labels=("soc", "precision", ""))

    def chip_base(self, ct: ChipTarget) -> dict[str, Any]:
        binding = self.binding(ct)
        return {"graph": ct.graph.name, "model": ct.graph.model, "precision": ct.precision, "soc": ct.soc.row(),
                "toolchain": {"id": ct.toolchain_id, "profile": binding.profile.name, **binding.fingerprint}}

    def config_files(self, ct: ChipTarget) -> list[str]:
        return [f"{ct.dir_str}/config/{f}" for f in self.binding(ct).toolchain.config_files(ct.graph)]

    def context_files(self, ct: ChipTarget) -> list[str]:
        return [f"{ct.dir_str}/context/{f}" for f in self.binding(ct).toolchain.context_files(ct.graph)]


# ------------------------------------------------------------------ graph stages (once per graph)

def graph_plan(p: Planner, stage: StageDef, gt: GraphTarget, file_dep: list[str], outputs: list[Any],
                key: dict[str, Any], args: Callable[[], dict[str, Any]], doc: str, base: dict[str, Any] | None = None,
                task_dep: list[str] | None = None) -> Plan:
    g = gt.graph
    return Plan(name=gt.name, out_dir=str(gt.stage_dir(stage.name)), file_dep=file_dep,
                outputs=[str(o) for o in outputs],
                key=p.key(stage, None, json.dumps(key, sort_keys=True), labels=("",)),
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
    return graph_plan(p, stage, gt, [str(gt.exported)], [gt.simplified], {"io": g.io(), "simplify": g.simplify},
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
                       {"lint": g.lint, "precision": g.precision, "budgets": keyed, "split": g.split,
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
                       {"io": g.io(), "options": g.options, "tolerance": g.cpucheck, "source": p.source_key(g),
                        "constant_inputs": g.constant_inputs, "samples": g.samples},
                       lambda: {"graph": p.graph_dict(g), "source": p.source(g), "simplified": str(gt.simplified),
                                "inputs": str(gt.inputs), "reference": str(gt.reference)},
                       f"CPU check of {gt.simplified} against the original model")


def plan_calibrate(p: Planner, stage: StageDef, gt: GraphTarget) -> Plan | None:
    g = gt.graph
    if not precision_table.any_quantized(g.precisions) or specsplit.is_part(g):
        return None
    return graph_plan(p, stage, gt, p.code_deps(g) + p.sample_deps(g), [gt.calibration],
                       {"io": g.io(), "options": g.options, "calibration": g.calibration, "source": p.source_key(g),
                        "samples": g.samples},
                       lambda: {"graph": p.graph_dict(g), "source": p.source(g), "out": str(gt.calibration)},
                       f"{g.calibration['samples']} real calibration samples for {g.name} from "
                       + (f"export.py:{g.calibration['function']}()" if g.has_code else "the declared sample files"),
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

def plan_variant_stage(p: Planner, stage: StageDef, vt: VariantTarget) -> Plan | None:
    binding = p.binding(vt)
    source = str(vt.graph_target.simplified)
    for graph_stage, out, outputs in p.variant_chain(vt):
        if graph_stage.name == stage.name:
            g, gt = vt.graph, vt.graph_target
            calibration = str(gt.calibration) if graph_stage.needs_calibration else None
            # w8a16-mixed: the first graph stage quantizes with the weights its repair promoted
            promoted = (f"{vt.dir / REPAIR.name}/{PROMOTED_FILE}" if precision_table.is_repaired(vt.precision)
                        and source == str(gt.simplified) else None)
            key = {"precision": vt.precision, "io": g.io(), "calibration": g.calibration if calibration else None}
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
    """A w8a16-mixed variant's search for the weights to keep at 16 bits, measured on the first chip it builds for."""
    chip = next((ct for ct in p.chips if ct.variant is vt and not ct.skip_reason), None) \
        if precision_table.is_repaired(vt.precision) else None
    if chip is None:
        return None
    g, gt = vt.graph, vt.graph_target
    out = str(vt.dir / stage.name)
    budget = g.calibration.get("repair_budget", DEFAULT_REPAIR_BUDGET)
    runs_code = any(check["kind"] in MODEL_CHECKS for check in chip.verify["checks"])
    settings = json.dumps({"verify": chip.verify, "calibration": g.calibration, "budget": budget, "io": g.io(),
                           "soc": chip.soc.row()}, sort_keys=True)
    binding = p.binding(vt)
    return Plan(name=vt.name, out_dir=out, model=g.model,
                file_dep=[str(gt.simplified), str(gt.calibration), str(gt.inputs), str(gt.reference)]
                + (p.code_deps(g) if runs_code else []) + p.check_deps(g, chip.verify),
                outputs=[f"{out}/{PROMOTED_FILE}"], key=p.key(stage, binding, settings, labels=("",)),
                doc=f"find the fewest weights of {g.name} to keep at 16 bits so that w8a16 passes its checks, on "
                    f"{chip.soc.name}'s simulator (budget {budget} compiles)",
                args=lambda: {"graph": p.graph_dict(g), "verify": chip.verify, "soc": specjson.soc_to_dict(chip.soc),
                              "simplified": str(gt.simplified), "calibration": str(gt.calibration),
                              "inputs": str(gt.inputs), "reference": str(gt.reference), "budget": budget},
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
                               "simplified": str(ct.graph_target.simplified)},
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
                               "binary": next((f for f in ctx_files if f.endswith(".bin")), None)},
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
    the tokens file). Their graphs are built for the encoder's chips and precisions (spec/transducer.py)."""
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


def crosssize_chips(planner: Planner) -> list[ChipTarget]:
    """The chip targets that carry a cross-size check (the largest size of each graph with sizes, not skipped)."""
    return [ct for ct in planner.chips if not ct.skip_reason and plan_crosssize(planner, CROSSSIZE, ct) is not None]


def runs_loop(loop: Any, graph: GraphSpec) -> bool:
    """Whether `graph` is its model's `loop:` graph, or a size of it (a loop over a graph with sizes runs per size)."""
    return loop is not None and loop.graph in (graph.name, graph.size.graph if graph.size else None)


def loop_chips(planner: Planner) -> list[ChipTarget]:
    """The chip targets whose graph is its model's `loop:` graph (each has a loop stage)."""
    return [ct for ct in planner.chips if runs_loop(loop := planner.model(ct.graph).loop, ct.graph)
            and (not loop.start or plan_loop(planner, LOOP, ct) is not None)]


def _failed(record: str) -> bool | None:
    """A stage record's verdict: True if it failed, False if it passed, None if there is none."""
    try:
        return json.loads(Path(record).read_text()).get("status") == "failed"
    except (FileNotFoundError, ValueError):
        return None


# ------------------------------------------------------------------ the table

GRAPH_STAGES = (
    StageDef("export", "graph", "Export each graph's NPU-ready ONNX (static shapes, int32 I/O, no If/int8): the "
             "model's export.py, or the built-in packaged-ONNX export, plus declared rewrites.",
             "qnn_tasks.stages.export:run_call", plan_export),
    StageDef("simplify", "graph", "Simplify each graph with onnxsim and confirm its I/O shapes are fixed.",
             "qnn_tasks.stages.simplify:run_call", plan_simplify),
    StageDef("lint", "graph", "Lint each graph for what troubles the NPU (dynamic dims, int64, control flow, fp16 "
             "hazards, size).", "qnn_tasks.stages.lint:run_call", plan_lint, heavy=False),
    StageDef("cpucheck", "graph", "Run each simplified graph on CPU against the original model on real inputs; keep "
             "the reference.", "qnn_tasks.stages.cpucheck:run_call", plan_cpucheck),
    StageDef("calibrate", "graph", "Make each quantized graph's calibration set from real inputs (once per graph).",
             "qnn_tasks.stages.calibrate:run_call", plan_calibrate, column=False),
    StageDef("split", "graph", "Cut each graph declared with split: into parts (graphs <graph>.part<N> of their own) "
             "and check the parts chained on CPU against the whole graph.", "qnn_tasks.stages.split:run_call",
             plan_split, column=False),
)
CHIP_STAGES = (
    StageDef("config", "chip", "Write each chip's HTP settings for each graph (toolchain options + SoC row).",
             "qnn_tasks.toolchains.calls:config", plan_config, heavy=False, toolchain=True),
    StageDef("context", "chip", "Compile each graph to a QNN context binary per chip; check CPU fallback and the chip "
             "it was built for.", "qnn_tasks.toolchains.calls:context", plan_context, remote=True, toolchain=True),
    StageDef("simulate", "chip", "Run each binary on the host HTP simulator and keep its outputs (judged by "
             "simverify).", "qnn_tasks.stages.simulate:run_call", plan_simulate, remote=True, toolchain=True),
    StageDef("simverify", "chip", "Judge each binary's simulator outputs against the CPU reference (metrics, "
             "thresholds, checks).", "qnn_tasks.stages.simverify:run_call", plan_simverify, heavy=False),
)
PIPELINE = StageDef("pipeline", "pipeline", "Chain each model's pipeline graphs on the host simulator (each fed the "
                    "previous one's NPU outputs) and judge the end against the same chain on CPU.",
                    "qnn_tasks.stages.pipeline:run_call", plan_pipeline, remote=True, toolchain=True, column=False)
CROSSSIZE = StageDef("crosssize", "chip", "Check each graph with sizes (dims:) on each chip's simulator: a sample that "
                     "fits a smaller size gives the same result padded into every larger one.",
                     "qnn_tasks.stages.crosssize:run_call", plan_crosssize, heavy=False, column=False)
VARIANT_RUNNER = "qnn_tasks.toolchains.calls:graph_stage"  # quantize; convert, modellib: rows from the toolchain
REPAIR = StageDef("repair", "variant", "Find the fewest weights of each w8a16-mixed graph to keep at 16 bits so that "
                  "it passes its checks, measured on the first chip's host simulator.",
                  "qnn_tasks.stages.repair:run_call", plan_repair, remote=True, toolchain=True, column=False)
# On demand: created only when asked for (`doit diagnose`), never in the default run. Rows without a runner are
# task-layer work (phones, dependency checks) that calls no stage function.
LOOP = StageDef("loop", "chip", "Run each model's loop: graph step after step on the host simulator (its outputs fed "
                "back, the NPU carrying its own state) and on CPU; error per step, the whole run judged.",
                "qnn_tasks.stages.loop:run_call", plan_loop, toolchain=True, column=False)
DIAGNOSE = StageDef("diagnose", "chip", "Find the first node where the NPU diverges from the CPU, and why (on demand, "
                    "not in the default run).", "qnn_tasks.stages.diagnose:run_call", plan_diagnose, remote=True,
                    toolchain=True, column=False)
SOCSCHECK = StageDef("socscheck", "project", "Compile a tiny model for every SoC row and confirm the binary's "
                     "socModel/arch (on demand).", "qnn_tasks.qnn.socscheck:run_call", None, toolchain=True,
                     column=False)
COMPAT = StageDef("compat", "project", "Load every built binary on every configured runtime's simulator: which QNN "
                  "runtimes load it, and do outputs still match (on demand).", "qnn_tasks.stages.compat:run_call", None,
                  toolchain=True, column=False)
# A release act, not a build step: it writes outside build/ (dist/<model>/, what an app ships), so a plain `doit`
# never replaces a package someone may be uploading; asked for by name once the report passes.
DIST = StageDef("dist", "model", "Package what was verified for phones: dist/<model>/ with the binaries per chip, "
                "manifest.json, model card, CPU fallback, runtime libraries (on demand).",
                "qnn_tasks.ship.package:run_call", None, heavy=False, column=False)
ON_DEMAND = (
    DIAGNOSE, SOCSCHECK,
    StageDef("toolcheck", "project", "Run each toolchain's dependency checks and say clearly what is missing (on "
             "demand).", "", None, column=False),
    COMPAT,
    StageDef("verify", "chip", "Run each chip's binaries on the attached phones (adb) and compare with the CPU; "
             "latency, CPU use (on demand).", "", None, column=False),
    StageDef("power", "chip", "Fixed-length run on an attached phone with battery level before/after (on demand, "
             "opt-in).", "", None, column=False),
    DIST,
)


_REGISTERED: list[StageDef] = []


def register(row: StageDef) -> None:
    """Add a stage of the project's own (a row whose runner and plan live in its module), run after the built-in
    stages of its scope. Called from dodo.py before `project_tasks`."""
    if row.scope not in ("graph", "chip"):
        raise ValueError(f"stage '{row.name}': scope '{row.scope}' cannot be registered (use 'graph' or 'chip')")
    if any(r.name == row.name for r in GRAPH_STAGES + CHIP_STAGES + ON_DEMAND + tuple(_REGISTERED)):
        raise ValueError(f"stage '{row.name}' exists already")
    _REGISTERED.append(row)


def registered(scope: str) -> list[StageDef]:
    return [r for r in _REGISTERED if r.scope == scope]


def report_columns(scope: str) -> tuple[str, ...]:
    """The stages the report shows a column for, per target kind ("graph" or "chip"): the built-in rows', then those
    a project registered (asked at report and dist time, after dodo.py's `register` calls)."""
    built_in = GRAPH_STAGES if scope == "graph" else CHIP_STAGES
    return tuple(row.name for row in built_in + tuple(registered(scope)) if row.column)


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
            + ([CROSSSIZE] if any(gt.graph.size for gt in planner.graphs) else []))


def targets_of(planner: Planner, stage: StageDef) -> list:
    return {"graph": planner.graphs, "variant": planner.variants, "chip": planner.chips,
            "pipeline": planner.pipelines}[stage.scope]


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
    paths += [record_path(stage.name, ct) for ct in planner.chips for stage in CHIP_STAGES + (DIAGNOSE,)]
    paths += [PIPELINE.record_of(pt) for pt in planner.pipelines]
    paths += [LOOP.record_of(ct) for ct in loop_chips(planner)]
    paths += [CROSSSIZE.record_of(ct) for ct in crosssize_chips(planner)]
    return paths + [DEVICE_STAMP, COMPAT_RECORD]  # one file for all device records (not 2 stats per target)
