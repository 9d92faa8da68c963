"""The built-in export, reference and samples of a packaged ONNX: model.yaml alone, no Python.

export    = load the source ONNX + fix the declared dims + int32 at the int64 boundary + constant
            inputs + the graph's declared rewrites, shapes re-inferred;
reference = the ORIGINAL ONNX on CPU (inputs cast back to its dtypes, constant inputs fed);
samples   = the declared sample files (samples.read_declared).
An export.py may still call these (`ctx.default_export(skip=...)`) and override any of them.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from qnn_tasks import rewrites
from qnn_tasks.errors import StageError
from qnn_tasks.modelspec.project import GraphSpec


def source_where(graph: GraphSpec) -> str:
    return f"{graph.model_dir / 'model.yaml'}: {graph.source_key}"


def load_source(graph: GraphSpec, source: Path | None):
    """The source ONNX; a file that is not ONNX is one line naming the file and its model.yaml key."""
    import onnx

    where = source_where(graph)
    if source is None:
        raise StageError(f"{where}: no source file (fix: set it to the packaged .onnx)")
    if not Path(source).is_file():
        raise StageError(f"{where}: {source} not found (fix: reinstall the package or fix the path)")
    fix = "(fix: point it at an .onnx file, or add export.py whose export() converts it)"
    if not graph.source or not graph.source.package:  # in the model folder: there once symlinks are followed
        real = Path(source).resolve()
        if not real.is_relative_to(Path(graph.model_dir).resolve()):
            raise StageError(f"{where}: {source} leads through a symlink to {real}, outside the model folder "
                             "(fix: copy the file into the model folder)")
    if Path(source).stat().st_size == 0:
        raise StageError(f"{where}: {source} is empty (0 bytes), not an ONNX model {fix}")
    try:
        model = onnx.load(str(source), load_external_data=False)  # weights kept beside it stay there (dims only)
        from qnn_tasks.graphs.onnxinfo import has_external_data, load_small_tensors

        if has_external_data(model):
            load_small_tensors(model, Path(source).parent)  # constants the rewrites may read; not the weights
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise StageError(f"{where}: {source} is not an ONNX model ({type(err).__name__}: {first}) {fix}") from None
    if not model.HasField("graph") or not model.ir_version:  # protobuf parses many byte strings as an empty model
        raise StageError(f"{where}: {source} is not an ONNX model (it holds no graph or IR version) {fix}")
    return model


def _external_files(model) -> list[str]:
    """The files a model's external initializers live in (relative to the model; inside its folder, checked)."""
    from onnx.external_data_helper import uses_external_data

    names = sorted({e.value for t in model.graph.initializer if uses_external_data(t) for e in t.external_data
                    if e.key == "location"})
    for name in names:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise StageError(f"external data '{name}' lies outside the model's folder (fix: keep the weights file "
                             "beside the .onnx)")
    return names


def export(graph: GraphSpec, source: Path | None, out_path: Path, skip: Iterable[str] = ()) -> dict[str, Any]:
    """Write the NPU-ready graph to `out_path`; return what was fixed and rewritten (for the export record)."""
    import onnx

    from qnn_tasks.rewrites import boundary, graphtools

    model = load_source(graph, source)
    try:
        fixed = boundary.fix_io(model, graph.inputs, graph.outputs, graph.constant_inputs)
    except boundary.BoundaryError as err:
        raise StageError(f"{source_where(graph)}: {source.name}: {err} "
                         f"(fix: {err.fix.replace('<graph>', graph.name)})") from None
    report = apply_rewrites(graph, model, skip)
    graphtools.remove_dead(model.graph)
    external = _external_files(model)
    for name in external:  # the source's weight files beside the export (names kept: the model points at them)
        shutil.copyfile(Path(source).parent / name, Path(out_path).parent / name)
    if external:  # checked by path, where its weights are (an in-memory check cannot find them)
        onnx.save(model, str(out_path))
    try:
        onnx.checker.check_model(str(out_path) if external else model)
    except Exception as err:
        raise StageError(f"{source_where(graph)}: the rewritten {source.name} is not valid ONNX: "
                         f"{str(err).strip().splitlines()[0]} (fix: drop the last rewrite from {graph.key}.rewrites "
                         f"and report it)") from None
    if not external:
        onnx.save(model, str(out_path))
    return {"boundary": fixed, **({"external_data": external} if external else {}), "rewrites": report, "skipped_rewrites": sorted(set(skip) & set(graph.rewrites))}


def rewrite_file(graph: GraphSpec, path: Path) -> list[dict[str, Any]]:
    """Apply the graph's declared rewrites to an ONNX an export.py wrote (in place)."""
    import onnx

    model = onnx.load(str(path))
    report = apply_rewrites(graph, model)
    onnx.save(model, str(path))
    return report


def apply_rewrites(graph: GraphSpec, model, skip: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The graph's declared rewrites; one that cannot do its job exactly is one line naming its model.yaml key."""
    try:
        return rewrites.apply(model, graph.rewrites, skip=skip)
    except rewrites.RewriteError as err:
        raise StageError(f"{graph.model_dir / 'model.yaml'}: {graph.key}.rewrites: {err}") from None


def reference(graph: GraphSpec, source: Path | None, inputs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The original packaged ONNX on CPU: inputs cast back to its dtypes, constant inputs fed."""
    session, feeds = _session_feeds(graph, source, inputs)
    names = [t.name for t in graph.outputs]
    fetch = [t.source_name for t in graph.outputs]  # the original's own names (model.yaml may rename: onnx_name)
    return [dict(zip(names, session.run(fetch, f))) for f in feeds]


def reference_float64(graph: GraphSpec, source: Path | None,
                      inputs: list[dict[str, np.ndarray]]) -> tuple[list[dict[str, np.ndarray]], str]:
    """(outputs, how) of the original packaged ONNX evaluated in float64 (graphs/float64.py): the truth its float32
    run is measured against when a comparison with it fails."""
    from qnn_tasks.graphs import float64

    _, feeds = _session_feeds(graph, source, inputs)
    outs, how = float64.evaluate(load_source(graph, source), feeds, Path(source).name)
    return [{t.name: o[t.source_name] for t in graph.outputs} for o in outs], how


def _session_feeds(graph: GraphSpec, source: Path | None, inputs: list[dict[str, np.ndarray]]):
    """A CPU session of the original and each sample's feeds: renamed, cast to its dtypes, constant inputs added."""
    import onnxruntime as ort

    load_source(graph, source)  # a clear error for a missing or non-ONNX file before onnxruntime's own
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the original's dynamic dims make ORT warn about every declared shape
    session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    types = {i.name: i.type for i in session.get_inputs()}
    constants = {name: np.asarray(value, dtype=_np_type(types[name])).reshape(_shape(session, name, value))
                 for name, value in graph.constant_inputs.items()}
    source_names = {t.name: t.source_name for t in graph.inputs}
    feeds = []
    for sample in inputs:
        feeds.append({**{source_names.get(name, name): np.asarray(value).astype(_np_type(types[source_names.get(name, name)]))
                         for name, value in sample.items()}, **constants})
    return session, feeds


def _np_type(ort_type: str) -> np.dtype:
    """'tensor(int64)' -> int64."""
    name = ort_type[len("tensor("):-1]
    return np.dtype({"float": "float32", "double": "float64"}.get(name, name))


def _shape(session, name: str, value: Any) -> tuple:
    shape = next(i.shape for i in session.get_inputs() if i.name == name)
    if all(isinstance(d, int) for d in shape) and int(np.prod(shape)) == np.asarray(value).size:
        return tuple(shape)
    return np.asarray(value).shape
