"""Calls into a model's own code (models/<model>/export.py): export, samples, reference."""
from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .errors import StageError
from .spec import GraphSpec, Source, load_yaml


@dataclass
class ModelContext:
    """What a model's functions get: the graph spec, its source file, options, and where to write."""
    graph: GraphSpec
    source_path: Path | None
    out_path: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def error(self, message: str) -> StageError:
        """An error to raise from model code: it reaches the user as one line naming the graph."""
        return StageError(f"{self.graph.model_code}: graph '{self.graph.name}': {message}")


def context_for(graph: GraphSpec, out_path: Path | None = None) -> ModelContext:
    """The context the stages give the model's functions: its model.yaml source file and the graph's options.

    For callers that get only the graph (verification checks): model.yaml was validated when the
    project loaded, so its `source:` is read back here as is.
    """
    data = load_yaml(graph.model_dir / "model.yaml") or {}
    declared = data.get("source") or {}
    source = Source(package=declared.get("package"), file=declared.get("file"), url=declared.get("url"))
    path = source.resolve_file(graph.model_dir)
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
        raise StageError(f"{path}: failed to import: {type(err).__name__}: {err}") from err
    sys.modules[name] = module
    return module


def call(graph: GraphSpec, function: str, ctx: ModelContext, *args: Any) -> Any:
    """Call `function` from the model's export.py; its failures become one-line StageErrors."""
    module = load_module(graph)
    fn: Callable | None = getattr(module, function, None)
    if not callable(fn):
        raise StageError(f"{graph.model_code}: no function '{function}' (graph '{graph.name}' needs it); "
                         f"define {function}(ctx{', ...' if args else ''}) there")
    try:
        return fn(ctx, *args)
    except StageError:
        raise
    except Exception as err:
        frame = traceback.extract_tb(err.__traceback__)[-1]
        raise StageError(f"{graph.model_code}:{function}() failed for graph '{graph.name}': "
                         f"{type(err).__name__}: {err} (at {Path(frame.filename).name}:{frame.lineno})") from err
