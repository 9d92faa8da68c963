"""Spec objects <-> plain JSON-able dicts, so a stage call can travel to a child process or a Dask worker.

Paths are written relative to the project root when they lie inside it (a worker runs with the
project root, or a scratch copy of it, as its working directory).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qnn_tasks.modelspec.project import (
    DEFAULT_CONTEXT_MB,
    DEFAULT_MEMORY_MB,
    LEGACY_RUNS,
    GraphSpec,
    Soc,
    Source,
    TensorSpec,
    ToolchainProfile,
)
from qnn_tasks.modelspec.specsizes import SizeSpec


def relative(path: Path | str | None, root: Path) -> str | None:
    """`path` relative to `root` when inside it, else unchanged (e.g. a file inside an installed package)."""
    if path is None:
        return None
    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    rel = os.path.relpath(text, root)
    return text if rel.startswith("..") else rel


def graph_to_dict(graph: GraphSpec, root: Path) -> dict[str, Any]:
    return {"name": graph.name, "model": graph.model, "model_dir": relative(graph.model_dir, root),
            "inputs": [t.as_dict() for t in graph.inputs], "outputs": [t.as_dict() for t in graph.outputs],
            "precisions": list(graph.precisions), "socs": list(graph.socs) if graph.socs else None,
            "export": graph.export, "options": graph.options, "settings": graph.settings, "verify": graph.verify,
            "allow_cpu_fallback": graph.allow_cpu_fallback,
            "source": None if graph.source is None else {"package": graph.source.package, "file": graph.source.file,
                                                         "url": graph.source.url},
            "source_key": graph.source_key, "rewrites": graph.rewrites, "constant_inputs": graph.constant_inputs,
            "samples": graph.samples, "has_code": graph.has_code, "split": graph.split,
            **({"auto": list(graph.auto)} if graph.auto else {}),  # only where declared: other graphs' keys stay
            **({"size": graph.size.as_dict()} if graph.size else {})}


def graph_from_dict(data: dict[str, Any]) -> GraphSpec:
    def tensors(items: list[dict[str, Any]]) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(name=t["name"], shape=tuple(t["shape"]), dtype=t["dtype"], onnx_name=t.get("onnx_name"))
                     for t in items)

    return GraphSpec(name=data["name"], model=data["model"], model_dir=Path(data["model_dir"]),
                     inputs=tensors(data["inputs"]), outputs=tensors(data["outputs"]),
                     precisions=tuple(data["precisions"]), socs=tuple(data["socs"]) if data["socs"] else None,
                     export=data["export"], options=data["options"], settings=data.get("settings") or {},
                     verify=data["verify"], allow_cpu_fallback=data["allow_cpu_fallback"],
                     source=Source(**data["source"]) if data.get("source") else None,
                     source_key=data.get("source_key", "source.file"), rewrites=data.get("rewrites") or {},
                     constant_inputs=data.get("constant_inputs") or {}, samples=data.get("samples"),
                     has_code=data.get("has_code", True), split=data.get("split"), auto=tuple(data.get("auto") or ()),
                     size=SizeSpec.from_dict(data["size"]) if data.get("size") else None)


def soc_to_dict(soc: Soc) -> dict[str, Any]:
    data = {**soc.row(), "runs": list(soc.runs), "note": soc.note, "file": soc.file, "context_mb": soc.context_mb}
    if soc.platform != "phone":  # only where it says something: the calls of phone rows stay as they were
        data["platform"] = soc.platform
    if soc.memory_mb != DEFAULT_MEMORY_MB:
        data["memory_mb"] = soc.memory_mb
    return data


def soc_from_dict(data: dict[str, Any]) -> Soc:
    return Soc(name=data["name"], soc_id=data["soc_id"], dsp_arch=data["dsp_arch"], vtcm_mb=data["vtcm_mb"],
               runs=tuple(data["runs"]) if "runs" in data else LEGACY_RUNS[data["fp16"]], note=data.get("note", ""),
               file=data.get("file", ""), platform=data.get("platform", "phone"),
               context_mb=data.get("context_mb", DEFAULT_CONTEXT_MB),
               memory_mb=data.get("memory_mb", DEFAULT_MEMORY_MB))


def profile_to_dict(profile: ToolchainProfile, root: Path) -> dict[str, Any]:
    return {"name": profile.name, "file": relative(profile.file, root), "kind": profile.kind,
            "options": profile.options, "settings": profile.settings, "packages": list(profile.packages)}


def profile_from_dict(data: dict[str, Any]) -> ToolchainProfile:
    return ToolchainProfile(name=data["name"], file=Path(data["file"]), kind=data["kind"], options=data["options"],
                            settings=data["settings"], packages=tuple(data.get("packages") or ()))
