"""`split:` of a graph in model.yaml: cut it into parts, each a graph of its own, chained as a pipeline.

    graphs:
      decoder:
        split: {at: [b3.res2, b7.res2]}     # cut after the nodes computing these tensors: 3 parts
        # or: split: {parts: 3}             # balanced by weight bytes where the fewest tensors cross

Each part is a graph named `<graph>.part<N>` (N from 1): its own lint, binary per chip, simulation and verdict,
and the parts are chained on each chip by the pipeline stage (a pipeline named after the graph). A part's
inputs and outputs are the cut tensors, known only once the split stage has cut the simplified ONNX: its
GraphSpec here has none, and Planner.graph_dict fills them from the split stage's parts.json when a stage
runs. Only YAML is read here.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # modelspec/project.py loads through this module: importing it here would be a cycle
    from qnn_tasks.modelspec.project import GraphSpec
    from qnn_tasks.modelspec.specloop import LoopSpec
    from qnn_tasks.modelspec.specpipeline import PipelineSpec

SPLIT_KEYS = {"at", "parts"}
MAX_PARTS = 64


def load(data: Any, path: Path, key: str) -> dict[str, Any] | None:
    """{"at": [tensor, ...]} or {"parts": N}, validated; None when the graph is not split."""
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.yamlread import as_int, as_mapping, check_keys

    if data is None:
        return None
    section = as_mapping(data, path, key)
    check_keys(section, SPLIT_KEYS, path, key)
    if ("at" in section) == ("parts" in section):
        raise SpecError(path, key, "give either at: or parts:", "e.g. split: {at: [block3_out]} or split: {parts: 2}")
    if "parts" in section:
        return {"parts": as_int(section["parts"], path, f"{key}.parts", 2, MAX_PARTS)}
    at = section["at"]
    if not isinstance(at, list) or not at or not all(isinstance(t, str) and t for t in at) or len(set(at)) != len(at):
        raise SpecError(path, f"{key}.at", f"must be a list of different tensor names, got {at!r}",
                        "e.g. at: [block3_out, block7_out] (tensors computed inside the graph, in order)")
    if len(at) >= MAX_PARTS:
        raise SpecError(path, f"{key}.at", f"{len(at) + 1} parts", f"cut into at most {MAX_PARTS} parts")
    return {"at": list(at)}


def count(split: dict[str, Any]) -> int:
    return split["parts"] if "parts" in split else len(split["at"]) + 1


def part_name(graph: str, index: int) -> str:
    return f"{graph}.part{index}"


def is_part(graph: GraphSpec) -> bool:
    return bool(graph.split) and "part" in graph.split


def is_whole(graph: GraphSpec) -> bool:
    """A graph that declares `split:`: built only up to the split; its parts go to the chips."""
    return bool(graph.split) and "part" not in graph.split


def parts(graph: GraphSpec) -> list[GraphSpec]:
    """The part GraphSpecs of a split graph (no I/O yet: the split stage finds the cut tensors)."""
    from qnn_tasks.modelspec.checks import verify_section

    n = count(graph.split)
    made = []
    for index in range(1, n + 1):
        last = index == n
        # the last part has the graph's outputs and its checks; the others default thresholds on as many samples
        verify = graph.verify if last else {p: {**verify_section(None, p, {}, graph.model_dir / "model.yaml",
                                                                 f"graphs.{graph.name}.verify"),
                                                "samples": graph.verify[p]["samples"]} for p in graph.precisions}
        made.append(replace(graph, name=part_name(graph.name, index), inputs=(), outputs=(), export="export",
                            options={}, rewrites={}, constant_inputs={}, samples=None, has_code=False, source=None,
                            verify=verify, split={"part": index, "of": graph.name, "parts": n}))
    return made


def clashes(graphs: tuple[GraphSpec, ...], path: Path) -> None:
    """A part's generated name may not be a declared graph's."""
    from qnn_tasks.errors import SpecError

    names = {g.name for g in graphs}
    for graph in graphs:
        if graph.split:
            for index in range(1, count(graph.split) + 1):
                if part_name(graph.name, index) in names:
                    raise SpecError(path, f"graphs.{graph.name}.split", f"part {index} is named "
                                    f"'{part_name(graph.name, index)}', which is a declared graph too",
                                    f"rename graph '{part_name(graph.name, index)}'")


def not_sized(graphs: tuple[GraphSpec, ...], path: Path) -> None:
    """`split:` and `dims:` on one graph are refused: the cross-size check compares whole graphs of each size, and a
    split graph is never built whole (each size would need its own cuts, parts and chain)."""
    from qnn_tasks.errors import SpecError

    for graph in graphs:
        if graph.split and graph.size:
            raise SpecError(path, f"graphs.{graph.size.graph}.split", "a graph with sizes (dims:) cannot be split",
                            "remove split: or dims:, or declare each size as a graph of its own with its shapes "
                            "written out and split: on each")


def not_chained(graphs: tuple[GraphSpec, ...], pipeline: PipelineSpec | None, loop: LoopSpec | None,
                path: Path) -> None:
    """A split graph is built as its parts: the model's own pipeline: or loop: cannot name it (it would never run)."""
    from qnn_tasks.errors import SpecError

    split = {g.name for g in graphs if g.split}
    uses = (("pipeline.graphs", pipeline.graphs if pipeline else ()), ("loop.graph", (loop.graph,) if loop else ()))
    for key, names in uses:
        for name in names:
            if name in split:
                raise SpecError(path, key, f"'{name}' is split into parts (graphs.{name}.split), so it is never "
                                "compiled whole", f"remove split: from graphs.{name}, or leave it out of {key}")


def pipeline(graph: GraphSpec) -> PipelineSpec:
    """The split graph's parts chained on the simulator (inputs fed by name: each part's outputs are the next one's
    inputs), judged at the end with the graph's own verify settings."""
    from qnn_tasks.modelspec.specpipeline import PipelineSpec

    names = tuple(part_name(graph.name, i) for i in range(1, count(graph.split) + 1))
    return PipelineSpec(model=graph.model, graphs=names, feed={}, verify=graph.verify[graph.precision],
                        name=graph.name)
