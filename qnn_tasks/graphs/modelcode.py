"""Calls into a model's own code (models/<model>/export.py): export, samples, reference.

export.py is optional for a packaged ONNX (see graphs/packaged.py): a function it does not define falls
back to the built-in one where there is one (`has_function`).
"""
from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from qnn_tasks.errors import StageError
from qnn_tasks.modelspec.project import GraphSpec


@dataclass
class ModelContext:
    """What a model's functions get: the graph spec, its source file, options, and where to write."""
    graph: GraphSpec
    source_path: Path | None
    out_path: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)
    export_record: dict[str, Any] | None = None  # set by default_export(): what it fixed and rewrote
    # export() may say what a size of its graph comes from and which option changes it: {"what", "bytes", "option"}
    # each; the export record keeps them (`size_notes`) and a package's manifest carries them
    size_notes: list[dict[str, Any]] = field(default_factory=list)
    step: int | None = None   # in a loop's step(): the index of the step just run
    side: str | None = None   # in a loop's step(): "cpu" or "npu", the loop being driven

    @property
    def size(self) -> int | None:
        """The size of the graph's sized dim this export is for (model.yaml `dims:`), else None; the shapes in
        ctx.graph.inputs/outputs are already written with it."""
        return self.graph.size.size if self.graph.size else None

    @property
    def dim(self) -> str | None:
        """The name of the graph's sized dim (model.yaml `dims:`), else None."""
        return self.graph.size.dim if self.graph.size else None

    def error(self, message: str) -> StageError:
        """An error to raise from model code: it reaches the user as one line naming the graph."""
        return StageError(f"{self.graph.model_code}: graph '{self.graph.name}': {message}")

    def default_export(self, skip: Iterable[str] = ()) -> None:
        """The built-in export of the packaged ONNX into out_path: declared dims, int32 I/O, constant
        inputs and the graph's declared rewrites (minus `skip`)."""
        from qnn_tasks.graphs import packaged

        self.export_record = packaged.export(self.graph, self.source_path, self.out_path, skip=skip)


def context_for(graph: GraphSpec, out_path: Path | None = None) -> ModelContext:
    """The context the stages give the model's functions: the graph's source file and options (for callers
    that get only the graph, such as verification checks)."""
    path = graph.source.resolve_file(graph.model_dir) if graph.source else None
    return ModelContext(graph=graph, source_path=path, out_path=out_path, options=dict(graph.options))


def load_module(graph: GraphSpec):
    path = graph.model_code
    name = f"qnn_model_{graph.model.replace('-', '_')}"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise StageError(f"{path}: failed to import: {type(err).__name__}: {_first_line(err)}"
                         f"{_where(err, graph)}") from err
    sys.modules[name] = module
    return module


def has_function(graph: GraphSpec, function: str) -> bool:
    """Whether the model's export.py exists and defines `function`."""
    return graph.model_code.is_file() and callable(getattr(load_module(graph), function, None))


def call(graph: GraphSpec, function: str, ctx: ModelContext, *args: Any) -> Any:
    """Call `function` from the model's export.py; its failures become one-line StageErrors.

    The line named is the last one inside the model's folder (the user's code), not a frame deep
    inside torch or onnx.
    """
    module = load_module(graph)
    fn: Callable | None = getattr(module, function, None)
    if not callable(fn):
        raise StageError(f"{graph.model_code}: no function '{function}' (graph '{graph.name}' needs it); "
                         f"define {function}(ctx{', ...' if args else ''}) there")
    try:
        return fn(ctx, *args)
    except StageError:
        raise
    except SystemExit as err:  # sys.exit() in model code would end the stage's process, its record unwritten
        raise StageError(f"{graph.model_code}:{function}() called sys.exit({err.code!r}) for graph '{graph.name}'"
                         f"{_where(err, graph)} (fix: raise an exception with the reason, or return; "
                         "a loop's step function stops the loop by returning None)") from None
    except Exception as err:
        raise StageError(f"{graph.model_code}:{function}() failed for graph '{graph.name}': "
                         f"{type(err).__name__}: {_first_line(err)}{_where(err, graph)}") from err


def user_frame(err: BaseException, graph: GraphSpec) -> traceback.FrameSummary | None:
    """The innermost traceback frame in a file under the model's folder, else the innermost of all."""
    frames = traceback.extract_tb(err.__traceback__)
    folder = graph.model_dir.resolve()
    inside = [f for f in frames if Path(f.filename).resolve().is_relative_to(folder)]
    return (inside or frames or [None])[-1]


def _where(err: BaseException, graph: GraphSpec) -> str:
    frame = user_frame(err, graph)
    if frame is None:
        return ""
    path = Path(frame.filename).resolve()
    shown = path.relative_to(graph.model_dir.resolve()) if path.is_relative_to(graph.model_dir.resolve()) else path
    return f" (at {shown}:{frame.lineno})"


def _first_line(err: BaseException) -> str:
    """Exceptions from torch/onnx carry pages of text; the first non-empty line says what happened."""
    text = str(err).strip()
    return text.splitlines()[0].strip() if text else ""
