"""Verification samples on disk: a list of {input name: array} stacked into one .npz per set."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import StageError
from .fileio import atomic_path
from .spec import TensorSpec


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


def save(path: Path, samples: list[dict[str, np.ndarray]]) -> None:
    stacked = {name: np.stack([np.asarray(s[name]) for s in samples]) for name in samples[0]}
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **stacked)


def load(path: Path, limit: int | None = None) -> list[dict[str, np.ndarray]]:
    if not Path(path).is_file():
        raise StageError(f"{path}: missing (rerun the cpucheck task that makes it)")
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    count = len(next(iter(arrays.values())))
    count = count if limit is None else min(count, limit)
    return [{name: arr[i] for name, arr in arrays.items()} for i in range(count)]
