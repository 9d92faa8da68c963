"""Verification samples on disk: a list of {input name: array} stacked into one .npz per set."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.fileio import atomic_path
from qnn_tasks.judge import fitting
from qnn_tasks.judge.dtypes import cast_to
from qnn_tasks.modelspec.project import GraphSpec, TensorSpec


def check(samples: list[dict[str, np.ndarray]], specs: tuple[TensorSpec, ...], what: str) -> None:
    """Every sample must carry exactly the declared tensors with their shapes and dtypes."""
    if not samples:
        raise StageError(f"{what}: no samples were produced")
    names = [s.name for s in specs]
    for i, sample in enumerate(samples):
        if sorted(sample) != sorted(names):
            raise StageError(f"{what}: sample {i} has tensors {sorted(sample)}, model.yaml declares {sorted(names)}")
        for spec in specs:
            value = np.asarray(sample[spec.name])
            if tuple(value.shape) != spec.shape:
                raise StageError(f"{what}: sample {i} '{spec.name}' has shape {list(value.shape)}, "
                                 f"model.yaml says {list(spec.shape)}")
            if value.dtype.name != spec.dtype:
                raise StageError(f"{what}: sample {i} '{spec.name}' has dtype {value.dtype.name}, "
                                 f"model.yaml says {spec.dtype}")
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                raise StageError(f"{what}: sample {i} '{spec.name}' holds {int((~np.isfinite(value)).sum())} NaN/Inf "
                                 "values (fix: give only finite inputs: a NaN input makes every comparison fail)")


def save(path: Path, samples: list[dict[str, np.ndarray]]) -> None:
    stacked = {name: np.stack([np.asarray(s[name]) for s in samples]) for name in samples[0]}
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **stacked)


def load(path: Path, limit: int | None = None, names: list[str] | None = None) -> list[dict[str, np.ndarray]]:
    """The samples of a saved set (`names`: only those arrays, the others are not read)."""
    if not Path(path).is_file():
        raise StageError(f"{path}: missing (rerun the cpucheck task that makes it)")
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files if names is None or name in names}
    count = len(next(iter(arrays.values())))
    count = count if limit is None else min(count, limit)
    return [{name: arr[i] for name, arr in arrays.items()} for i in range(count)]


def read_declared(graph: GraphSpec, notes: dict[str, Any] | None = None,
                  upstream: dict[str, list[np.ndarray]] | None = None) -> list[dict[str, np.ndarray]]:
    """The graph's declared sample files (model.yaml `samples: {files: ...}`), in file-name order.

    A `.npz` holds one array per declared input, named after it: either one sample (the declared
    shape) or a stacked batch of N samples (N, *declared shape). A `.npy` holds the one input of a
    single-input graph, shaped the same way. Integer arrays are cast to the declared dtype when
    every value fits (numpy saves int64 by default), float arrays to the declared float dtype.
    Media sources (`image:`, `audio:`, `raw:`, `fill:`) are read by judge/media.py (`notes`: what it kept or
    changed, for the record).
    """
    if graph.samples and "files" not in graph.samples:
        from qnn_tasks.judge import media

        return media.load(graph, notes, upstream)
    files = graph.sample_files()
    where = f"{graph.model_dir / 'model.yaml'}: {graph.key}.samples"
    if not files:
        raise StageError(f"{where}: no sample file matches {graph.samples['files'] if graph.samples else None} "
                         f"(fix: add .npz/.npy files to {graph.model_dir} or fix the pattern)")
    result: list[dict[str, np.ndarray]] = []
    for path in files:
        if not path.resolve().is_relative_to(Path(graph.model_dir).resolve()):  # samples stay in the model folder
            raise StageError(f"{where}: {path} leads through a symlink to {path.resolve()}, outside the model folder "
                             "(fix: copy the file into the model folder)")
        arrays = _arrays(path, graph, where)
        counts = set()
        for spec in graph.inputs:
            value = arrays[spec.name]
            if fitting.same_shape(value.shape, spec, graph):  # a graph with sizes: any length, fitted later
                arrays[spec.name] = value[None]
            elif not fitting.same_shape(value.shape[1:], spec, graph):
                raise StageError(f"{where}: {path.name}: '{spec.name}' has shape {list(value.shape)}; model.yaml "
                                 f"declares {list(spec.shape)} (fix: save one sample of that shape, or a stack "
                                 f"(N, {', '.join(map(str, spec.shape))}))")
            arrays[spec.name] = cast_to(arrays[spec.name], spec, f"{where}: {path.name}")
            _finite(arrays[spec.name], spec, f"{where}: {path.name}")
            counts.add(len(arrays[spec.name]))
        if len(counts) != 1:
            raise StageError(f"{where}: {path.name}: its arrays stack different numbers of samples {sorted(counts)} "
                             f"(fix: give every input the same leading count)")
        result += [{spec.name: arrays[spec.name][i] for spec in graph.inputs} for i in range(counts.pop())]
    return result


def _arrays(path: Path, graph: GraphSpec, where: str) -> dict[str, np.ndarray]:
    names = [t.name for t in graph.inputs]
    try:
        if path.suffix == ".npy":
            if len(names) != 1:
                raise StageError(f"{where}: {path.name}: a .npy holds one array but the graph has inputs {names} "
                                 f"(fix: save an .npz with one array per input: np.savez(file, {'=..., '.join(names)}=...))")
            return {names[0]: np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except StageError:
        raise
    except Exception as err:
        raise StageError(f"{where}: {path}: not a readable numpy file: {type(err).__name__}: {err} "
                         f"(fix: write it with np.savez / np.save)") from None
    if sorted(arrays) != sorted(names):
        raise StageError(f"{where}: {path.name}: holds arrays {sorted(arrays)}, model.yaml declares inputs {sorted(names)} "
                         f"(fix: name each array after its input)")
    return arrays


def _finite(stack: np.ndarray, spec: TensorSpec, where: str) -> None:
    """A sample file's NaN/Inf is the file's fault, not the export's: name the file, the input and the sample."""
    if stack.dtype.kind != "f":
        return
    bad = ~np.isfinite(stack)
    if bad.any():
        first = int(np.argwhere(bad.reshape(len(stack), -1).any(axis=1))[0][0])
        raise StageError(f"{where}: '{spec.name}' holds {int(bad.sum())} NaN/Inf values (first in sample {first}) "
                         "(fix: replace or drop those samples: verification needs finite inputs)")


