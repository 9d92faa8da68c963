"""export: produce the graph's NPU-ready ONNX with the model's own code (models/<model>/export.py).

Fixes (wrapping, constant folding, fixed lengths, int32 I/O) belong here, never later: the
result must already have the declared static I/O, no int64, no control flow, no int8.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import modelcode, onnxinfo
from ..errors import StageError
from ..fileio import atomic_path
from ..spec import GraphSpec
from .lint import find_problems, io_mismatches

HARD_RULES = {"dynamic-dim", "io-dtype", "control-flow", "int8-in-onnx"}


def run(graph: GraphSpec, source: Path | None, out_onnx: Path) -> dict[str, Any]:
    """Export `graph` to `out_onnx` (atomically) and check it; return the stage record."""
    if source is not None and not source.is_file():
        raise StageError(f"{graph.model_dir / 'model.yaml'}: source.file: {source} not found "
                         f"(reinstall the package or fix the path)")
    with atomic_path(out_onnx) as tmp:
        ctx = modelcode.ModelContext(graph=graph, source_path=source, out_path=tmp, options=dict(graph.options))
        modelcode.call(graph, graph.export, ctx)
        model = onnxinfo.load(tmp, f"ONNX written by {graph.model_code}:{graph.export}()", shown_as=out_onnx)
        problems = io_mismatches(model, graph)
        problems += [f.line() for f in find_problems(model, graph) if f.rule in HARD_RULES]
        if problems:
            raise StageError(f"export of graph '{graph.name}' by {graph.model_code}:{graph.export}() is not "
                             f"NPU-ready: " + "; ".join(problems))
        record = {"io": onnxinfo.graph_io(model), "nodes": len(model.graph.node),
                  "parameters": onnxinfo.parameter_count(model),
                  "opset": max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None)}
    return record
