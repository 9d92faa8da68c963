"""cpucheck: the simplified ONNX on CPU must match the original model on real inputs.

The inputs are the declared sample files (model.yaml `samples:`) or the model's own `samples()`;
the original model's outputs come from its `reference()` (PyTorch or the packaged ONNX) or, for a
packaged ONNX without one, from the original ONNX on CPU (packaged.reference). The simplified
graph's CPU outputs on the same inputs become the reference every chip is verified against later.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.graphs import modelcode, packaged
from qnn_tasks.judge import fitting, metrics
from qnn_tasks.judge import samples as sample_store
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall
from qnn_tasks.spec.project import GraphSpec

DEFAULT_TOLERANCE = {"max_abs": 1e-3, "min_cosine": 0.9999}


def run(graph: GraphSpec, source: Path | None, simplified: Path, inputs_out: Path, reference_out: Path) -> dict[str, Any]:
    ctx = modelcode.ModelContext(graph=graph, source_path=source, options=dict(graph.options))
    inputs, where = real_inputs(graph, ctx)
    inputs, fitted = fitting.fit(inputs, graph, where)
    sample_store.check(inputs, graph.inputs, where)
    if graph.has_code and modelcode.has_function(graph, "reference") or not (graph.source and graph.source.file):
        original, by = modelcode.call(graph, "reference", ctx, inputs), f"{graph.model_code}:reference()"
    else:
        original, by = packaged.reference(graph, source, inputs), f"the original {source.name} on CPU"
    cpu = run_onnx_cpu(simplified, inputs)

    thresholds = {**DEFAULT_TOLERANCE, **graph.cpucheck}
    per_output, problems = {}, []
    for spec in graph.outputs:
        missing = [i for i, o in enumerate(original) if spec.name not in o]
        if missing:
            raise StageError(f"{by} returned no '{spec.name}' for sample {missing[0]}")
        ref = np.stack([np.asarray(o[spec.name]) for o in original])
        got = np.stack([o[spec.name] for o in cpu])
        if list(got.shape[1:]) != list(spec.shape):
            raise StageError(f"output '{spec.name}': the simplified ONNX gives shape {list(got.shape[1:])}, model.yaml "
                             f"says {list(spec.shape)} (fix: {graph.key}.outputs.{spec.name}.shape)")
        if ref.shape != got.shape:
            raise StageError(f"output '{spec.name}': original model gives shape {list(ref.shape[1:])}, "
                             f"simplified ONNX gives {list(got.shape[1:])}")
        per_output[spec.name] = metrics.compare(ref, got)
        problems += metrics.violations(spec.name, per_output[spec.name], thresholds)
    record = {"samples": len(inputs), "samples_from": where, "reference_from": by, "thresholds": thresholds,
              "metrics": per_output, **({"fitted": fitted} if fitted else {})}
    if problems:
        raise StageError(f"cpucheck of graph '{graph.name}': simplified ONNX differs from the original model: "
                         + "; ".join(problems) + f" (fix the export, or loosen {graph.key}.cpucheck)", record)
    sample_store.save(inputs_out, inputs)
    sample_store.save(reference_out, cpu)
    return record


def real_inputs(graph: GraphSpec, ctx: modelcode.ModelContext) -> tuple[list[dict[str, np.ndarray]], str]:
    """(samples, where they came from): the declared sample files if any, else export.py's samples()."""
    if graph.samples:
        return sample_store.read_declared(graph), f"{graph.model_dir / 'model.yaml'}: {graph.key}.samples"
    return modelcode.call(graph, "samples", ctx), f"{graph.model_code}:samples() for graph '{graph.name}'"


def run_onnx_cpu(model_path: Path, inputs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # unused-initializer notices are not for the console
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(None, sample))) for sample in inputs]


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), calls.path(a, "source"), Path(a["simplified"]), Path(a["inputs"]), Path(a["reference"]))
