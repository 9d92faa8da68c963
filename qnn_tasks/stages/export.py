"""export: produce the graph's NPU-ready ONNX: the model's export.py, or the built-in export of a packaged ONNX.

Fixes (wrapping, constant folding, fixed lengths, int32 I/O, known HTP rewrites) belong here,
never later: the result must already have the declared static I/O, no int64, no control flow,
no int8. Without an export() in export.py, a packaged ONNX (source.file) is exported by the
built-in one (graphs/packaged.py). The graph's declared `rewrites:` apply to either.

Whatever the exporter prints (a torch exporter's IR dumps, native warnings) goes to
`export.log` beside the ONNX, not the console. The result is run once on CPU, so output shapes
that differ from model.yaml fail here, not later as a puzzling CPU fallback.
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError, one_line
from qnn_tasks.fileio import atomic_path
from qnn_tasks.graphs import modelcode, onnxinfo, packaged
from qnn_tasks.graphs.lintrules import find_problems, summary_lines
from qnn_tasks.graphs.onnxinfo import io_mismatches
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.nativelog import all_output_to
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall

HARD_RULES = {"dynamic-dim", "io-dtype", "control-flow", "int8-in-onnx"}
SIZE_NOTE_KEYS = {"what", "bytes", "option"}


def _no_cpu_partition(finding, graph: GraphSpec) -> str:
    """Control flow a graph acknowledges (`lint: {allow: [control-flow]}`) stays in the model only as a CPU partition,
    which `allow_cpu_fallback: true` must allow too (the context stage then reports it)."""
    return (f"{finding.where}: graphs.{graph.name}.lint allows control-flow, but it can only run on the CPU (fix: add "
            f"allow_cpu_fallback: true to graphs.{graph.name} in models/{graph.model}/model.yaml to keep it there as "
            "a reported CPU partition, or remove it: doit lint says whether fold-if or if-to-where applies)")


def run(graph: GraphSpec, source: Path | None, out_onnx: Path) -> dict[str, Any]:
    """Export `graph` to `out_onnx` (atomically) and check it; return the stage record."""
    if source is not None and not source.is_file():
        raise StageError(f"{graph.model_dir / 'model.yaml'}: {graph.source_key}: {source} not found "
                         f"(reinstall the package or fix the path)")
    custom = graph.has_code and modelcode.has_function(graph, graph.export)
    if not custom and (graph.export != "export" or not (graph.source and graph.source.file)):
        custom = True  # no built-in export for this graph: calling export.py says what is missing
    log = Path(out_onnx).with_name("export.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    what = f"{graph.model_code}:{graph.export}()" if custom else f"the built-in export of {source}"
    log.write_text(f"# export of graph '{graph.name}' by {what}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    with atomic_path(out_onnx) as tmp:
        ctx = modelcode.ModelContext(graph=graph, source_path=source, out_path=tmp, options=dict(graph.options))
        try:
            with all_output_to(log):
                if custom:
                    modelcode.call(graph, graph.export, ctx)
                else:
                    ctx.default_export()
        except StageError as err:
            raise _with_log(err, log) from None
        if tmp.stat().st_size == 0:
            raise StageError(f"{what} wrote nothing to ctx.out_path for graph '{graph.name}' (fix: save the "
                             f"NPU-ready model there, e.g. onnx.save(model, str(ctx.out_path)))")
        if ctx.export_record is None:  # export.py wrote it: the declared rewrites still apply
            ctx.export_record = {"rewrites": packaged.rewrite_file(graph, tmp)} if graph.rewrites else {}
        model = onnxinfo.load(tmp, f"ONNX written by {what}", shown_as=out_onnx)
        lifted = _lift_branch_weights(model, tmp)
        problems = io_mismatches(model, graph)
        hard = [f for f in find_problems(model, graph) if f.rule in HARD_RULES]
        problems += summary_lines([f for f in hard if f.severity != "allowed" or f.rule != "control-flow"])
        problems += [_no_cpu_partition(f, graph) for f in hard if f.severity == "allowed" and f.rule == "control-flow"
                     and not graph.allow_cpu_fallback]
        if not problems:
            with all_output_to(log):
                problems = run_once(tmp, graph)
        if problems:
            raise StageError(f"export of graph '{graph.name}' by {what} is not NPU-ready: " + "; ".join(problems))
        record = {"io": onnxinfo.graph_io(model), "nodes": len(model.graph.node),
                  "parameters": onnxinfo.parameter_count(model),
                  "opset": max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None),
                  "exported_by": "export.py" if custom else "built-in", "log": str(log),
                  **ctx.export_record, **({"size_notes": _size_notes(ctx, what)} if ctx.size_notes else {}),
                  **({"lifted_into_bodies": list(lifted)} if lifted else {})}
        unused = [r["name"] for r in record.get("rewrites", []) if r["count"] == 0]
        stale = (record.get("boundary") or {}).get("stale_output_metadata", {})
        record["warnings"] = [f"graph '{graph.name}': {tensor}: the ONNX's metadata said {dims['onnx']}, on CPU it computes {dims['computed']}: "
                              f"metadata replaced (fix: none needed here; correct the ONNX's exporter to silence this)"
                              for tensor, dims in stale.items()]
        record["warnings"] += [f"rewrite '{name}' found nothing to change in graph '{graph.name}' (fix: remove it "
                               f"from {graph.key}.rewrites in models/{graph.model}/model.yaml)" for name in unused]
        record["warnings"] += [f"graph '{graph.name}': {refused}, where onnxruntime's compile drops it (fix: keep it "
                               "inside the .onnx, or copy it into the body's initializers at export)"
                               for refused in lifted.refused]
    return record


def _lift_branch_weights(model, path: Path) -> list[str]:
    """Copy the main-graph constants only an If/Loop/Scan body reads into that body (onnxruntime's compile drops
    them otherwise), and save the model again if any moved; returns the Sites (rewrites/branchweights.py)."""
    import onnx

    from qnn_tasks.rewrites import branchweights

    lifted = branchweights.lift(model)
    if lifted:
        onnx.save(model, str(path))  # weights kept as external data stay where they are: lift leaves those
    return lifted


def _size_notes(ctx: modelcode.ModelContext, what: str) -> list[dict[str, Any]]:
    """The notes export.py left in ctx.size_notes, checked: each says what, how many bytes, and which option."""
    for index, note in enumerate(ctx.size_notes):
        if not (isinstance(note, dict) and set(note) == SIZE_NOTE_KEYS and isinstance(note["what"], str)
                and isinstance(note["option"], str) and isinstance(note["bytes"], int) and note["bytes"] >= 0):
            raise StageError(f"{what}: ctx.size_notes[{index}] is {note!r} (fix: append a dict of exactly "
                             f"{{'what': str, 'bytes': int >= 0, 'option': str}})")
    return [dict(note) for note in ctx.size_notes]


def run_once(path: Path, graph: GraphSpec) -> list[str]:
    """Run the exported ONNX on CPU once (zeros of the declared shapes); compare real output shapes with model.yaml.

    Declared output dims can be wrong in a way no static check sees (an exporter writes the dims
    it was given): the actual run is the ground truth.
    """
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        values = session.run(None, {t.name: np.zeros(t.shape, np.dtype(t.dtype)) for t in graph.inputs})
    except Exception as err:
        return [f"onnxruntime cannot run it on CPU: {one_line(err)} (fix the export)"]
    declared = {t.name: list(t.shape) for t in graph.outputs}
    return [f"output '{name}' is {list(value.shape)} when run on CPU, model.yaml says {declared[name]} "
            f"(fix: correct {graph.key}.outputs.{name}.shape in models/{graph.model}/model.yaml, or the export)"
            for name, value in zip(names, values) if name in declared and list(np.shape(value)) != declared[name]]


def _with_log(err: StageError, log: Path) -> StageError:
    """The one-line error, plus where the exporter's output and the full traceback are."""
    cause = err.__cause__
    if cause is not None:
        with open(log, "a") as fh:
            fh.write("\n# FAILED\n" + "".join(traceback.format_exception(cause)))
    text = log.read_text(errors="replace")
    if text.count("\n") <= 1:  # nothing but our header: no point sending the user there
        return err
    return StageError(f"{err} (exporter output{' and traceback' if cause is not None else ''}: {log})", err.record)


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), calls.path(a, "source"), Path(a["out"]))
