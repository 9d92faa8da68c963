"""simplify: onnxsim with per-graph options, then confirm every input/output shape is fixed."""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, Callable

from qnn_tasks.errors import StageError
from qnn_tasks.fileio import atomic_path
from qnn_tasks.graphs import onnxinfo
from qnn_tasks.graphs.onnxinfo import io_mismatches
from qnn_tasks.graphs.split import PROTOBUF_LIMIT
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall


def run(graph: GraphSpec, exported: Path, out_onnx: Path) -> dict[str, Any]:
    import onnx

    model = onnxinfo.load(exported, "exported ONNX")
    light = onnx.load(str(exported), load_external_data=False)  # the proto alone: its weights' files named
    if onnxinfo.has_external_data(light):
        if _total_bytes(exported, light) > PROTOBUF_LIMIT:
            return _large(graph, exported, out_onnx)
        model = onnx.load(str(exported))  # under 2 GB: onnxsim takes it whole, weights and all
    before = len(model.graph.node)
    settings = graph.section("simplify")
    skipped = list(settings.get("skip_optimizers", []))
    if settings.get("skip", False):
        simplified = model
    else:
        try:
            simplified, ok = onnxsim_simplify()(model, skipped_optimizers=skipped or None)
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


def _total_bytes(path: Path, model) -> int:
    """The file and the external data files it names: what one proto would have to hold."""
    from onnx.external_data_helper import uses_external_data

    files = {e.value for t in model.graph.initializer if uses_external_data(t) for e in t.external_data
             if e.key == "location"}
    return path.stat().st_size + sum((path.parent / f).stat().st_size for f in files if (path.parent / f).is_file())


def _large(graph: GraphSpec, exported: Path, out_onnx: Path) -> dict[str, Any]:
    """A model over 2 GB: onnxsim loads the whole model into one protobuf (2 GB at most), so it is skipped (recorded)
    and onnx's shape inference runs by path on the external-data model instead; the weights are copied beside the
    output, never loaded."""
    import shutil

    import onnx
    from onnx.external_data_helper import uses_external_data

    light = onnx.load(str(exported), load_external_data=False)
    files = sorted({e.value for t in light.graph.initializer if uses_external_data(t) for e in t.external_data
                    if e.key == "location"})
    out_onnx.parent.mkdir(parents=True, exist_ok=True)
    for name in files:  # the data first: the .onnx appears (atomically) only once its weights are in place
        target = out_onnx.parent / name
        target.unlink(missing_ok=True)
        shutil.copyfile(exported.parent / name, target)  # not a hard link: onnx's checker refuses those
    with atomic_path(out_onnx) as tmp:
        onnx.shape_inference.infer_shapes_path(str(exported), str(tmp))
    inferred = onnx.load(str(out_onnx), load_external_data=False)
    problems = io_mismatches(inferred, graph)
    if problems:
        out_onnx.unlink()
        raise StageError(f"graph '{graph.name}' does not match model.yaml: " + "; ".join(problems))
    return {"nodes_before": len(light.graph.node), "nodes_after": len(inferred.graph.node), "skipped_optimizers": [],
            "onnxsim": "skipped: the model is over 2 GB (external data) and onnxsim loads it as one protobuf; shapes "
                       "inferred with onnx.shape_inference.infer_shapes_path instead",
            "external_data": files, "io": onnxinfo.graph_io(inferred),
            "also_wrote": [str(out_onnx.parent / name) for name in files]}  # its record vouches for the weights too


def onnxsim_simplify() -> Callable[..., tuple[Any, bool]]:
    """onnxsim's simplify(), without running its package __init__.

    onnxsim 0.8.1's __init__ imports ~400 modules, torch among them (measured: 3.4 s on top of onnx, against 0.7 s
    for the simplifier alone), and a stage process that simplifies a packaged or hand-made ONNX pays it all. The
    package is entered through a bare module with its search path, the simplifier imported, and the bare module
    dropped again, so a later `import onnxsim` elsewhere runs the real __init__ (reusing the loaded submodules).
    """
    loaded = sys.modules.get("onnxsim.onnx_simplifier")
    if loaded is None and "onnxsim" in sys.modules:  # the whole package is loaded: its simplifier costs nothing
        from onnxsim import onnx_simplifier as loaded
    if loaded is not None:
        return loaded.simplify
    spec = importlib.util.find_spec("onnxsim")
    if spec is None or not spec.submodule_search_locations:
        raise StageError("onnxsim is not installed (fix: pip install the project again: it pins onnxsim)")
    bare = types.ModuleType("onnxsim")
    bare.__path__, bare.__spec__, bare.__file__ = list(spec.submodule_search_locations), spec, spec.origin
    sys.modules["onnxsim"] = bare
    try:
        from onnxsim.onnx_simplifier import simplify
    finally:
        if sys.modules.get("onnxsim") is bare:
            del sys.modules["onnxsim"]
    return simplify


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), Path(a["exported"]), Path(a["out"]))
