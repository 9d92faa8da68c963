"""calibrate: the real samples a w8a16 graph is quantized with, made once per graph, reused by every chip."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.graphs import modelcode
from qnn_tasks.judge import fitting, sample_store
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall


def run(graph: GraphSpec, source: Path | None, out: Path) -> dict[str, Any]:
    settings = graph.section("calibration")
    wanted, function = settings["samples"], settings["function"]
    ctx = modelcode.ModelContext(graph=graph, source_path=source, options=dict(graph.options))
    if function == "samples" and (graph.samples or not graph.has_code):  # the declared samples, like cpucheck's
        from qnn_tasks.judge.inputs import real_inputs
        from qnn_tasks.plan.targets import upstream_references

        produced, where = real_inputs(graph, ctx, upstream_references(graph))
        where += f" (calibration of graph '{graph.name}')"
    else:
        produced = modelcode.call(graph, function, ctx)
        where = f"{graph.model_code}:{function}() (calibration of graph '{graph.name}')"
    produced, _ = fitting.fit(produced, graph, where)  # a graph with sizes: to this size, as cpucheck's
    sample_store.check(produced, graph.inputs, where)
    if len(produced) < wanted:
        raise StageError(f"{where} produced {len(produced)} samples, calibration.samples asks for {wanted}: "
                         f"make more real inputs there or lower {graph.key}.calibration.samples "
                         f"(at least 8 are needed)")
    chosen = _spread(produced, wanted)
    sample_store.save(out, chosen)
    flat = np.concatenate([np.asarray(s[t.name], np.float64).ravel() for s in chosen for t in graph.inputs])
    return {"samples": len(chosen), "available": len(produced), "function": function,
            "value_range": [float(flat.min()), float(flat.max())]}


def _spread(samples: list[dict], count: int) -> list[dict]:
    """`count` samples spread evenly over all produced ones (every clip/sentence gets a say)."""
    index = np.linspace(0, len(samples) - 1, count).round().astype(int)
    return [samples[i] for i in index]


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), calls.path(a, "source"), Path(a["out"]))
