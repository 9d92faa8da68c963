"""simplify: onnxsim with per-graph options, then confirm every input/output shape is fixed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.fileio import atomic_path
from qnn_tasks.graphs import onnxinfo
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall
from qnn_tasks.spec.project import GraphSpec
from qnn_tasks.stages.lint import io_mismatches


def run(graph: GraphSpec, exported: Path, out_onnx: Path) -> dict[str, Any]:
    import onnx

    model = onnxinfo.load(exported, "exported ONNX")
    before = len(model.graph.node)
    skipped = list(graph.simplify.get("skip_optimizers", []))
    if graph.simplify.get("skip", False):
        simplified = model
    else:
        import onnxsim

        try:
            simplified, ok = onnxsim.simplify(model, skipped_optimizers=skipped or None)
        except Exception as err:
            raise StageError(f"onnxsim failed on graph '{graph.name}' ({exported}): {type(err).__name__}: "
                             f"{str(err).strip().splitlines()[0] if str(err).strip() else ''} "
                             f"(fix: add the failing optimizer to simplify.skip_optimizers, or simplify: {{skip: true}})") from None
        if not ok:
            raise StageError(f"onnxsim could not validate the simplified graph '{graph.name}' "
                             f"(fix: simplify.skip_optimizers or simplify: {{skip: true}})")
    problems = io_mismatches(simplified, graph)
    if problems:
        raise StageError(f"simplified graph '{graph.name}' does not match model.yaml: " + "; ".join(problems))
    with atomic_path(out_onnx) as tmp:
        onnx.save(simplified, str(tmp))
    return {"nodes_before": before, "nodes_after": len(simplified.graph.node),
            "skipped_optimizers": skipped, "io": onnxinfo.graph_io(simplified)}


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), Path(a["exported"]), Path(a["out"]))
