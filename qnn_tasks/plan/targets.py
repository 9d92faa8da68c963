"""specs x SoCs x toolchain -> build targets, their names and their places in the build tree.

The build tree mirrors the graph (docs/toolchains.md; with a precision level so fp16 and w8a16
builds of one graph sit side by side):
    build/<model>/<graph>/<stage>/...                                      per-graph stages
    build/<model>/<graph>/<toolchain-id>/<precision>/<stage>/...           per-variant toolchain stages
    build/<model>/<graph>/<toolchain-id>/<precision>/<SOC>/<stage>/...     per-chip stages
Task names: `<graph>` for graph stages; `<variant>` = `<graph>` (primary precision) or
`<graph>-<precision>`; `<variant>-<SOC>` for chip stages.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from qnn_tasks.modelspec import specsplit
from qnn_tasks.modelspec.project import GraphSpec, Project, Soc

BUILD_DIR = "build"


@dataclass(frozen=True)
class GraphTarget:
    """One graph: export, simplify, lint and cpucheck run once for it."""
    graph: GraphSpec
    dir: Path  # relative to the project root

    @property
    def name(self) -> str:
        return self.graph.name

    def stage_dir(self, stage: str) -> Path:
        return _cached_join(self, stage)

    @cached_property
    def exported(self) -> Path:
        return self.stage_dir("export") / f"{self.name}.onnx"

    @cached_property
    def simplified(self) -> Path:
        return self.stage_dir("simplify") / f"{self.name}.onnx"

    @cached_property
    def lint_record(self) -> Path:
        return self.stage_dir("lint") / "lint.json"

    @cached_property
    def inputs(self) -> Path:
        return self.stage_dir("cpucheck") / "inputs.npz"

    @cached_property
    def reference(self) -> Path:
        return self.stage_dir("cpucheck") / "reference.npz"

    @cached_property
    def calibration(self) -> Path:
        return self.stage_dir("calibrate") / "calibration.npz"


@dataclass(frozen=True)
class VariantTarget:
    """One graph at one precision with one toolchain: the toolchain's per-graph stages (quantize, convert ...)."""
    graph_target: GraphTarget
    precision: str
    toolchain_id: str
    dir: Path
    suffix: str = ""  # "@<profile>" for every toolchain but the first of a run

    @property
    def base_name(self) -> str:
        graph = self.graph_target.graph
        # `precision: auto`: every candidate is named by its precision (none is the graph's one binary until chosen)
        return graph.name if self.precision == graph.precision and not graph.auto else f"{graph.name}-{self.precision}"

    @property
    def name(self) -> str:
        return self.base_name + self.suffix

    @property
    def graph(self) -> GraphSpec:
        return self.graph_target.graph

    def stage_dir(self, stage: str) -> Path:
        return _cached_join(self, stage)


@dataclass(frozen=True)
class ChipTarget:
    """One graph variant on one chip: config, context, verification."""
    variant: VariantTarget
    soc: Soc
    toolchain_id: str
    dir: Path
    skip_reason: str | None

    @property
    def name(self) -> str:
        return f"{self.variant.base_name}-{self.soc.name}{self.variant.suffix}"

    @property
    def graph(self) -> GraphSpec:
        return self.variant.graph

    @property
    def graph_target(self) -> GraphTarget:
        return self.variant.graph_target

    @property
    def precision(self) -> str:
        return self.variant.precision

    @property
    def verify(self) -> dict:
        return self.graph.verify[self.precision]

    def stage_dir(self, stage: str) -> Path:
        return _cached_join(self, stage)

    @cached_property
    def dir_str(self) -> str:
        return str(self.dir)


def upstream_references(graph: GraphSpec) -> dict[str, Path]:
    """graph -> the cpucheck reference (CPU outputs) of each earlier graph its `samples: {from: ...}` reads."""
    upstream = (graph.samples or {}).get("from") or {}
    return {s["graph"]: GraphTarget(graph=graph, dir=Path(BUILD_DIR) / graph.model / s["graph"]).reference
            for s in upstream.values() if isinstance(s, dict)}


def _cached_join(target: GraphTarget | VariantTarget | ChipTarget, stage: str) -> Path:
    """target.dir / stage, built once: task generation asks for the same dirs thousands of times."""
    cache = target.__dict__.setdefault("_stage_dirs", {})
    if stage not in cache:
        cache[stage] = target.dir / stage
    return cache[stage]


def graph_targets(project: Project) -> list[GraphTarget]:
    """Every graph, and after a split graph its parts (`<graph>.part<N>`: graphs of their own from the split on)."""
    graphs = [p for g in project.graphs() for p in [g] + (specsplit.parts(g) if specsplit.is_whole(g) else [])]
    return [GraphTarget(graph=g, dir=Path(BUILD_DIR) / g.model / g.name) for g in graphs]


def variant_targets(project: Project, toolchain_id: str, suffix: str = "",
                    graphs: list[GraphTarget] | None = None) -> list[VariantTarget]:
    return [VariantTarget(graph_target=gt, precision=p, toolchain_id=toolchain_id, dir=gt.dir / toolchain_id / p,
                          suffix=suffix)
            for gt in (graphs if graphs is not None else graph_targets(project)) for p in gt.graph.precisions
            if not specsplit.is_whole(gt.graph)]  # a split graph goes to the chips as its parts


def chip_targets(project: Project, toolchain_id: str, suffix: str = "",
                 variants: list[VariantTarget] | None = None) -> list[ChipTarget]:
    """Every (graph variant, chip) pair the graph asks for; chips that can't run it carry a skip reason.

    A graph without `socs:` builds for the table's default chips (socs.yaml `default:`); those that
    can't run its precision (a chip that runs only quantized graphs, for fp16) are still listed
    (skipped, with the reason) so nothing disappears silently.
    """
    targets = []
    default = project.default_socs if project.default_socs is not None else tuple(project.socs)
    for vt in variants if variants is not None else variant_targets(project, toolchain_id, suffix):
        for soc_name in vt.graph.socs or default:
            soc = project.socs[soc_name]
            reason = soc.skip_reason(vt.precision)
            targets.append(ChipTarget(variant=vt, soc=soc, toolchain_id=toolchain_id,
                                      dir=vt.dir / soc.name, skip_reason=reason))
    return targets


@dataclass(frozen=True)
class PipelineTarget:
    """A model's `pipeline:` on one chip with one toolchain: its graphs' binaries chained on the simulator."""
    pipeline: object        # specpipeline.PipelineSpec
    chips: tuple[ChipTarget, ...]  # one per graph of the chain, in order (primary precision)
    dir: Path

    @property
    def name(self) -> str:
        first = self.chips[0]
        return f"{self.pipeline.name or self.pipeline.model}-{first.soc.name}{first.variant.suffix}"

    @property
    def soc(self) -> Soc:
        return self.chips[0].soc

    def stage_dir(self, stage: str) -> Path:
        return _cached_join(self, stage)


def pipeline_targets(project: Project, chips: list[ChipTarget], toolchain_id: str) -> list[PipelineTarget]:
    """Every chip on which all graphs of a model's pipeline are built (primary precisions, not skipped)."""
    built = {(ct.graph.name, ct.soc.name): ct for ct in chips
             if ct.precision == ct.graph.precision and not ct.skip_reason}
    targets = []
    for model in project.models:
        chains = [(model.pipeline, Path(BUILD_DIR) / model.name / "pipeline")] if model.pipeline else []
        chains += [(spec, Path(BUILD_DIR) / model.name / f"pipeline.{spec.size}")
                   for spec in model.size_pipelines]  # a pipeline over graphs with sizes: one per size
        chains += [(specsplit.pipeline(g), Path(BUILD_DIR) / model.name / g.name / "pipeline")
                   for g in model.graphs if specsplit.is_whole(g)]  # a split graph's parts, chained
        for spec, folder in chains:
            for soc in project.socs:
                chain = [built.get((name, soc)) for name in spec.graphs]
                if all(chain):
                    targets.append(PipelineTarget(pipeline=spec, chips=tuple(chain), dir=folder / toolchain_id / soc))
    return targets
