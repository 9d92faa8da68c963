"""`pipeline:` in model.yaml: the model's graphs chained, verified end to end.

    pipeline:
      graphs: [features, classifier]        # in order, at least two graphs of this model
      feed: {classifier.x: features.y}      # optional: <graph>.<input>: <graph>.<output> where names differ
      # or with glue:  classifier.x: {from: features.y, reshape: true, scale: 0.1, offset: 2.0}
                                            # (split on the first dot: `classifier.x.1` is input `x.1`)
      verify:                               # the last graph's outputs vs the same chain on CPU
        thresholds: {min_cosine: 0.99}
        checks: [{top1: {output: logits, min: 0.95}}]

Every input of a later graph is fed from an earlier graph's output of the same name (or as `feed`
says), with the same shape; a `feed` mapping may add glue the deployment does between the graphs:
`reshape: true` (an output of another shape and the same size) and a fixed affine step
`value * scale + offset`, applied alike to the CPU chain and the NPU chain. The first graph's verification inputs start the chain. Loaded from
spec/project.py; only YAML is read here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PIPELINE_KEYS = {"graphs", "feed", "verify"}
GLUE_KEYS = {"from", "reshape", "scale", "offset"}


@dataclass(frozen=True)
class PipelineSpec:
    model: str
    graphs: tuple[str, ...]
    feed: dict[str, tuple[str, str]]   # "<graph>.<input>" -> (graph, output)
    verify: dict[str, Any]             # validated like a graph's verify section (fp16 defaults)
    glue: dict[str, dict[str, Any]] = field(default_factory=dict)  # "<graph>.<input>" -> {reshape, scale, offset}


def load(data: Any, graphs: tuple, model: str, path: Path) -> PipelineSpec | None:
    from qnn_tasks.errors import SpecError
    from qnn_tasks.spec.checks import verify_section
    from qnn_tasks.spec.yamlread import as_bool, as_mapping, as_number, check_keys

    if data is None:
        return None
    section = as_mapping(data, path, "pipeline")
    check_keys(section, PIPELINE_KEYS, path, "pipeline")
    names = section.get("graphs")
    by_name = {g.name: g for g in graphs}
    if not isinstance(names, list) or len(names) < 2 or len(set(names)) != len(names):
        raise SpecError(path, "pipeline.graphs", f"needs two or more different graph names in order, got {names!r}",
                        f"e.g. graphs: [{', '.join(list(by_name)[:2]) or 'first, second'}]")
    for name in names:
        if name not in by_name:
            raise SpecError(path, "pipeline.graphs", f"'{name}' is not a graph of this model",
                            f"use graphs declared under graphs: ({', '.join(by_name)})")
    feed, glue = {}, {}
    for key, value in as_mapping(section.get("feed"), path, "pipeline.feed").items():
        if isinstance(value, dict):  # the output, and the glue between the graphs
            check_keys(value, GLUE_KEYS, path, f"pipeline.feed.{key}")
            if "from" not in value:
                raise SpecError(path, f"pipeline.feed.{key}.from", "required key is missing",
                                "e.g. {from: features.y, reshape: true, scale: 0.1, offset: 2.0}")
            glue[str(key)] = {"reshape": as_bool(value.get("reshape", False), path, f"pipeline.feed.{key}.reshape"),
                              "scale": as_number(value.get("scale", 1.0), path, f"pipeline.feed.{key}.scale"),
                              "offset": as_number(value.get("offset", 0.0), path, f"pipeline.feed.{key}.offset")}
            value = value["from"]
        target, source = _split(str(key), names), _split(str(value), names)
        if len(target) != 2 or len(source) != 2 or target[0] not in names or source[0] not in names \
                or names.index(source[0]) >= names.index(target[0]):
            raise SpecError(path, f"pipeline.feed.{key}", f"'{key}: {value}' does not feed a later graph's input "
                            "from an earlier graph's output", "write <later graph>.<input>: <earlier graph>.<output>")
        feed[str(key)] = (source[0], source[1])
    produced: dict[str, tuple[str, tuple[int, ...]]] = {}  # output name -> (graph, shape)
    for position, name in enumerate(names):
        graph = by_name[name]
        if position:
            for tensor in graph.inputs:
                source_graph, output = feed.get(f"{name}.{tensor.name}", (None, tensor.name))
                found = produced.get(output) if source_graph is None else _output(by_name[source_graph], output)
                if found is None:
                    raise SpecError(path, "pipeline", f"input '{tensor.name}' of graph '{name}' is fed by no earlier "
                                    "graph's output", f"add feed: {{{name}.{tensor.name}: <graph>.<output>}}")
                reshape = glue.get(f"{name}.{tensor.name}", {}).get("reshape")
                if reshape and _size(found[1]) != _size(tensor.shape):
                    raise SpecError(path, f"pipeline.feed.{name}.{tensor.name}.reshape", f"input '{tensor.name}' of "
                                    f"'{name}' {list(tensor.shape)} has {_size(tensor.shape)} values, the output feeding "
                                    f"it {list(found[1])} {_size(found[1])}", "reshape only between tensors of one size")
                if not reshape and tuple(found[1]) != tuple(tensor.shape):
                    raise SpecError(path, "pipeline", f"input '{tensor.name}' of '{name}' is {list(tensor.shape)}, "
                                    f"the output feeding it is {list(found[1])}",
                                    "make the shapes agree in model.yaml, or, for one size, feed: "
                                    f"{{{name}.{tensor.name}: {{from: <graph>.<output>, reshape: true}}}}")
        for tensor in graph.outputs:
            produced[tensor.name] = (name, tensor.shape)
    last = by_name[names[-1]]
    verify = verify_section(section.get("verify"), last.precision, {t.name: t.shape for t in last.outputs}, path,
                             "pipeline.verify")
    return PipelineSpec(model=model, graphs=tuple(names), feed=feed, verify=verify, glue=glue)


def _size(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _split(ref: str, graphs: list) -> list[str]:
    """`<graph>.<tensor>` -> [graph, tensor]: the graph part is a graph of the chain, the rest is the tensor's name,
    dots and all (`classifier.x.1` is input `x.1`); split on the first dot when no graph matches."""
    known = [g for g in graphs if isinstance(g, str) and ref.startswith(f"{g}.") and len(ref) > len(g) + 1]
    if known:
        graph = max(known, key=len)
        return [graph, ref[len(graph) + 1:]]
    return ref.split(".", 1)


def _output(graph, name: str) -> tuple[str, tuple[int, ...]] | None:
    tensor = next((t for t in graph.outputs if t.name == name), None)
    return (graph.name, tensor.shape) if tensor else None
