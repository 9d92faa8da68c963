"""specs x SoCs x toolchain -> build targets, their names and their places in the build tree.

The build tree mirrors the graph (DESIGN rule 5):
    build/<model>/<graph>/<stage>/...                         per-graph stages
    build/<model>/<graph>/<toolchain-id>/<SOC>/<stage>/...    per-chip stages
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .spec import GraphSpec, Project, Soc

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


@dataclass(frozen=True)
class ChipTarget:
    """One graph on one chip with one toolchain: config, context, verification."""
    graph_target: GraphTarget
    soc: Soc
    toolchain_id: str
    dir: Path
    skip_reason: str | None

    @property
    def name(self) -> str:
        return f"{self.graph_target.name}-{self.soc.name}"

    @property
    def graph(self) -> GraphSpec:
        return self.graph_target.graph

    def stage_dir(self, stage: str) -> Path:
        return _cached_join(self, stage)


def _cached_join(target: GraphTarget | ChipTarget, stage: str) -> Path:
    """target.dir / stage, built once: task generation asks for the same dirs thousands of times."""
    cache = target.__dict__.setdefault("_stage_dirs", {})
    if stage not in cache:
        cache[stage] = target.dir / stage
    return cache[stage]


def graph_targets(project: Project) -> list[GraphTarget]:
    return [GraphTarget(graph=g, dir=Path(BUILD_DIR) / g.model / g.name) for g in project.graphs()]


def chip_targets(project: Project, toolchain_id: str) -> list[ChipTarget]:
    """Every (graph, chip) pair the graph asks for; chips that can't run its precision carry a skip reason.

    A graph without `socs:` builds for every chip in the table; those that can't run its
    precision are still listed (skipped, with the reason) so nothing disappears silently.
    """
    targets = []
    for gt in graph_targets(project):
        names = gt.graph.socs or tuple(project.socs)
        for soc_name in names:
            soc = project.socs[soc_name]
            reason = None
            if not soc.supports(gt.graph.precision):
                reason = (f"{soc.name} ({soc.dsp_arch}) cannot run {gt.graph.precision} graphs "
                          f"(no fp16 on HTP {soc.dsp_arch})")
            targets.append(ChipTarget(graph_target=gt, soc=soc, toolchain_id=toolchain_id,
                                      dir=gt.dir / toolchain_id / soc.name, skip_reason=reason))
    return targets
