"""A graph's real inputs: its declared samples (model.yaml `samples:`, or what an earlier graph's CPU outputs make
through the pipeline's glue: `samples: {from: ...}`), else its export.py's samples(). What cpucheck verifies with
and calibrate quantizes with.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.graphs import modelcode
from qnn_tasks.judge import sample_store
from qnn_tasks.modelspec.project import GraphSpec


def real_inputs(graph: GraphSpec, ctx: modelcode.ModelContext, upstream: dict[str, Path],
                notes: dict[str, Any] | None = None) -> tuple[list[dict[str, np.ndarray]], str]:
    """(samples, where they came from): the declared sample files if any, else export.py's samples().
    `upstream`: the CPU reference of each earlier graph `samples: {from: ...}` reads (plan/targets.py
    upstream_references); `notes` receives what reading media kept or changed (bit depth, orientation, decoder)
    for the record."""
    if graph.samples:
        columns = upstream_columns(graph, upstream) if graph.samples.get("from") else None
        return (sample_store.read_declared(graph, notes, columns),
                f"{graph.model_dir / 'model.yaml'}: {graph.key}.samples")
    if not graph.has_code:  # a YAML-only graph without samples: export and lint ran, this stage needs them
        from qnn_tasks.modelspec.specport import missing_samples

        raise StageError(missing_samples(graph.model_dir, graph.key))
    return modelcode.call(graph, "samples", ctx), f"{graph.model_code}:samples() for graph '{graph.name}'"


def upstream_columns(graph: GraphSpec, files: dict[str, Path]) -> dict[str, list[np.ndarray]]:
    """input -> its samples from an earlier graph's CPU outputs (`samples: {from: ...}`): that graph's cpucheck
    reference (`files`: graph -> its reference), through the pipeline's glue for the input (stacked runs, reshape,
    scale, offset). The samples' bytes are checked against the bound before anything is stacked; windows are stacked
    and glued one at a time."""
    from qnn_tasks.judge import glue as glue_step

    wanted: dict[str, list[str]] = {}
    for source in graph.samples["from"].values():
        wanted.setdefault(source["graph"], []).append(source["output"])
    produced = {name: sample_store.load(path, names=wanted[name]) for name, path in files.items()}
    _bounded_upstream(graph, {name: len(produced[source["graph"]]) for name, source in graph.samples["from"].items()})
    columns = {}
    for name, source in graph.samples["from"].items():
        tensor = next(t for t in graph.inputs if t.name == name)
        values = [run[source["output"]] for run in produced[source["graph"]]]
        settings = source["glue"].get("stack")
        if settings:
            rank = glue_step.stack_rank(values, tensor, source["glue"])
            values = glue_step.windows(values, settings["runs"], settings["axis"], settings["hop"], rank)
        columns[name] = [glue_step.glued(np.asarray(v), source["glue"], tensor) for v in values]
        if not columns[name]:
            raise StageError(f"{graph.model_dir / 'model.yaml'}: {graph.key}.samples.from: "
                             f"{_source_words(graph, source)} gave {len(produced[source['graph']])} runs, too few "
                             f"for one sample of '{name}' (fix: give '{source.get('declared', source['graph'])}' more "
                             "samples)")
    return columns


def _source_words(graph: GraphSpec, source: dict[str, Any]) -> str:
    """The graph a `from:` source reads, as the user wrote it: a size followed is that graph at this graph's size."""
    from qnn_tasks.modelspec.specsizes import described

    if "declared" in source and graph.size:
        return described(source["declared"], graph.size.dim, graph.size.size)
    return described(source["graph"])


def _bounded_upstream(graph: GraphSpec, runs: dict[str, int]) -> None:
    """The samples `from:` makes (input -> the earlier graph's run count), refused before stacking when they would
    pass the byte bound, with a fix `from:` accepts: fewer samples upstream, or a larger hop of the stack."""
    from qnn_tasks.judge import bounds

    per_sample = sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in graph.inputs)
    most = max(1, bounds.MAX_SAMPLE_BYTES // per_sample)
    for name, count in runs.items():
        source = graph.samples["from"][name]
        settings = source["glue"].get("stack")
        made = count if not settings else max(0, (count - settings["runs"]) // settings["hop"] + 1)
        if made * per_sample <= bounds.MAX_SAMPLE_BYTES:
            continue
        upstream = most if not settings else (most - 1) * settings["hop"] + settings["runs"]
        how = "" if not settings else (f" (windows of {settings['runs']} of its {count} runs, one every "
                                       f"{settings['hop']})")
        # a size followed is fed by the size's pipeline: its feed is written under the declared graph's name
        fed = graph.size.graph if "declared" in source and graph.size else graph.name
        stack = "" if not settings else f", or a larger hop in pipeline.feed.{fed}.{name}.stack"
        who = _source_words(graph, source) if "declared" in source else repr(source["graph"])
        raise StageError(f"{graph.model_dir / 'model.yaml'}: {graph.key}.samples.from: {who} gives {made} samples "
                         f"of {per_sample} bytes{how}, {bounds.mib(made * per_sample)}, more than the bound of {bounds.mib(bounds.MAX_SAMPLE_BYTES)} (fix: give "
                         f"'{source.get('declared', source['graph'])}' at most {upstream} samples (a limit: on the "
                         f"media its samples come from){stack})")
