"""The Planner: everything planning needs for one run (the project's targets, a Binding per toolchain), with the pieces
keys repeat serialised once. The plan functions (plan/stageplans.py) ask it for keys, files and settings.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from qnn_tasks import codekeys, toolchains
from qnn_tasks.modelspec import specjson, specsplit
from qnn_tasks.modelspec.project import GraphSpec, Project, ToolchainProfile
from qnn_tasks.modelspec.yamlread import as_name
from qnn_tasks.plan.stagedef import StageDef
from qnn_tasks.plan.targets import (
    BUILD_DIR,
    ChipTarget,
    PipelineTarget,
    VariantTarget,
    chip_targets,
    graph_targets,
    pipeline_targets,
    variant_targets,
)

# In every key: records name what they were made from (`made_from`) since this format, so a record of before,
# which the report cannot compare with today's spec, is built again once rather than believed.
RECORD_FORMAT = "made_from/1"


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
        """A chip stage's key: the SoC row, the precision, `extra` and the stage's own model.yaml section (if any)."""
        if stage.settings:
            extra = {**extra, **stage.settings.keyed(ct.graph)}
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
