"""The glue between a pipeline's graphs: which runs' outputs feed a graph's runs, stacked, scaled, reshaped.

A graph of the chain runs several times (its runs): the first once per sample of its stream, a graph fed
plainly once per run of the graph feeding it, and a stacked input once per window of `runs` consecutive
runs of its source, every `hop` runs. The CPU chain and the NPU chain go through the same functions, each
with its own outputs, so neither sees the other's numbers; an input fed a constant (`{value: ...}`) gets it on
every run of both.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.judge import bounds
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.modelspec.specpipeline import Naming, source

Runs = list[dict[str, np.ndarray]]  # one graph's outputs (or inputs), one dict per run


def stack(values: list[np.ndarray], runs: int, axis: int, hop: int, rank: int) -> list[np.ndarray]:
    """Every window of `runs` consecutive values, one window every `hop` values, stacked for an input of `rank`
    dims: on a new `axis` when the input has one dim more than a value, else joined on that existing axis.
    Fewer values than `runs` give no window."""
    return list(windows(values, runs, axis, hop, rank))


def windows(values: list[np.ndarray], runs: int, axis: int, hop: int, rank: int) -> Iterator[np.ndarray]:
    """The windows of `stack`, made one at a time (a caller that glues each keeps only the glued copies)."""
    if len(values) < runs:
        return
    ndim = np.ndim(values[0])
    if rank not in (ndim, ndim + 1):
        raise ValueError(f"values of rank {ndim} neither stack nor join into rank {rank}")
    join = np.stack if rank == ndim + 1 else np.concatenate
    for start in range(0, len(values) - runs + 1, hop):
        yield join(values[start:start + runs], axis=axis)


def feed_runs(graph: GraphSpec, feed: dict[str, list[str]], glue: dict[str, dict[str, Any]],
              earlier: list[GraphSpec], produced: dict[str, Runs], naming: Naming | None = None,
              values: dict[str, Any] | None = None) -> tuple[Runs, list[dict[str, Any]]]:
    """The inputs of every run of `graph` from the runs of the graphs before it, and what was stacked (for the
    record): per input the source's runs, stacked as declared, then value * scale + offset (in float64), then
    reshaped to the input's shape; an input in `values` gets its constant on every run. `naming`: how messages
    name graphs and feed keys (a size's pipeline's)."""
    naming = naming or Naming({g.name: g for g in [*earlier, graph]})
    given = values or {}  # (`values` below is each input's runs)
    columns, stacked, constants = {}, [], {}
    for tensor in graph.inputs:
        if f"{graph.name}.{tensor.name}" in given:
            constants[tensor.name] = constant(given[f"{graph.name}.{tensor.name}"], tensor)
            continue
        from_graph, output = source(graph, tensor.name, feed, earlier)
        values = [run[output] for run in produced[from_graph]]
        step = glue.get(f"{graph.name}.{tensor.name}") or {}
        settings = step.get("stack")
        key = f"pipeline.feed.{naming.key(f'{graph.name}.{tensor.name}')}"
        if settings:
            if len(values) < settings["runs"]:
                model_yaml = graph.model_dir / "model.yaml"
                raise StageError(f"{model_yaml}: {key}.stack: stacks {settings['runs']} runs of "
                                 f"{naming.quoted(from_graph)}, which ran only {len(values)} times "
                                 f"(fix: give the pipeline's first graph more samples, or stack fewer runs)")
            _bounded(graph, key, naming.quoted(from_graph), values, settings)
            values = stack(values, settings["runs"], settings["axis"], settings["hop"], stack_rank(values, tensor, step))
            stacked.append({"input": tensor.name, "from": f"{from_graph}.{output}", **settings,
                            "source_runs": len(produced[from_graph]), "windows": len(values)})
        columns[tensor.name] = [glued(np.asarray(v), step, tensor) for v in values]
        _finite(graph, key, step, naming.quoted(from_graph), values, columns[tensor.name])
    counts = {name: len(column) for name, column in columns.items()}
    if len(set(counts.values())) > 1:  # the spec pairs inputs by rate; this guards a stream cut short
        raise StageError(f"pipeline: the inputs of {naming.graph(graph.name)} come in different numbers of runs: "
                         f"{counts}")
    runs = min(counts.values(), default=0)
    return [{t.name: constants[t.name] if t.name in constants else columns[t.name][i] for t in graph.inputs}
            for i in range(runs)], stacked


def constant(value: Any, tensor) -> np.ndarray:
    """A constant fed to an input (`{value: ...}`, checked at load): one number for all of it, or a list of its
    shape; in its dtype."""
    return np.full(tensor.shape, value, dtype=tensor.dtype) if not isinstance(value, list) \
        else np.asarray(value, dtype=tensor.dtype).reshape(tensor.shape)


def stack_rank(values: list[np.ndarray], tensor, step: dict[str, Any]) -> int:
    """The rank the runs stack into: the input's, or with reshape and ranks that neither stack nor join, one more
    than a run's (stacked on a new axis, then reshaped to the input; checked at load)."""
    rank, ndim = len(tensor.shape), np.ndim(values[0]) if values else 0
    return ndim + 1 if step.get("reshape") and values and rank not in (ndim, ndim + 1) else rank


def glued(value: np.ndarray, step: dict[str, Any], tensor) -> np.ndarray:
    if step.get("scale", 1.0) != 1.0 or step.get("offset", 0.0) != 0.0:
        value = value.astype(np.float64) * step["scale"] + step["offset"]
    value = value.reshape(tensor.shape) if step.get("reshape") else value
    return value.astype(tensor.dtype, copy=False)


def _bounded(graph: GraphSpec, key: str, from_graph: str, values: list[np.ndarray], settings: dict[str, int]) -> None:
    """Stacked windows copy each run `runs / hop` times: refuse before stacking what would pass the byte bound.
    `key`: the feed's key in model.yaml; `from_graph`: the source graph as a message names it."""
    windows = (len(values) - settings["runs"]) // settings["hop"] + 1
    size = windows * settings["runs"] * int(np.asarray(values[0]).nbytes)
    if size > bounds.MAX_SAMPLE_BYTES:
        raise StageError(f"{graph.model_dir / 'model.yaml'}: {key}.stack: {windows} "
                         f"windows of {settings['runs']} runs of {from_graph} take {bounds.mib(size)}, more than the "
                         f"bound of {bounds.mib(bounds.MAX_SAMPLE_BYTES)} (fix: a larger hop, fewer runs, or "
                         "verify.samples to end sooner)")


def _finite(graph: GraphSpec, key: str, step: dict[str, Any], from_graph: str, values: list, glued: list) -> None:
    """Finite outputs the glue's scale/offset (or the input's dtype) turn into Inf/NaN are the glue's fault: say so,
    rather than let the next graph's outputs fail and blame a link."""
    for before, after in zip(values, glued):
        dtype = np.asarray(after).dtype
        if dtype.kind == "f" and np.isfinite(before).all() and not np.isfinite(after).all():
            raise StageError(f"{graph.model_dir / 'model.yaml'}: {key}: the glue (scale "
                             f"{step.get('scale', 1.0):g}, offset {step.get('offset', 0.0):g}, as {dtype}) turns "
                             f"finite outputs of {from_graph} into Inf/NaN (fix: a scale and offset that keep the "
                             f"values within {dtype}'s range)")
