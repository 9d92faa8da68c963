"""Fit samples to one size of a graph with `dims:` (modelspec/specsizes.py): pad the shorter, skip or truncate the longer.

A sample may come at any length along the sized dim (export.py's samples() at the text's own length, a
file padded to some other length): its content length is where the last value that is not its input's
pad value lies (the longest over the inputs with the dim, and over every axis that is the dim: a [seq, seq]
mask is as long as its longest side). Padding appends the input's pad value along every such axis;
truncating cuts each at the size. Samples of a graph without sizes pass through unchanged.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.modelspec.project import GraphSpec, TensorSpec


def same_shape(shape: tuple[int, ...], spec: TensorSpec, graph: GraphSpec) -> bool:
    """`shape` is the declared one, any length along the sized dim allowed (a sample before fitting)."""
    axes = graph.size.axes.get(spec.name) if graph.size and spec.name in graph.size.pad else None
    if axes is None or len(shape) != len(spec.shape):
        return tuple(shape) == spec.shape
    return all(a == b for i, (a, b) in enumerate(zip(shape, spec.shape)) if i not in axes)


def content_length(sample: dict[str, np.ndarray], graph: GraphSpec) -> int:
    """How far along the sized dim the sample holds values other than the pad values."""
    size = graph.size
    length = 0
    for name, pad in size.pad.items():
        value = np.asarray(sample[name])
        for axis in size.axes[name]:
            if value.ndim <= axis:
                continue  # a wrong shape: the sample check names it after fitting
            other = tuple(i for i in range(value.ndim) if i != axis)
            used = np.flatnonzero((value != pad).any(axis=other) if other else value != pad)
            length = max(length, int(used[-1]) + 1 if used.size else 0)
    return length


def to_size(value: np.ndarray, axes: tuple[int, ...], size: int, pad: float) -> np.ndarray:
    """`value` cut or padded (with `pad`) to `size` along each of `axes`, its dtype kept."""
    value = np.asarray(value)
    for axis in axes:
        if value.ndim <= axis:
            continue
        if value.shape[axis] >= size:
            value = np.take(value, np.arange(size), axis=axis)
            continue
        widths = [(0, 0)] * value.ndim
        widths[axis] = (0, size - value.shape[axis])
        value = np.pad(value, widths, constant_values=np.asarray(pad).astype(value.dtype))
    return value


def fit(samples: list[dict[str, np.ndarray]], graph: GraphSpec, where: str
        ) -> tuple[list[dict[str, np.ndarray]], dict[str, Any]]:
    """(the samples fitted to the graph's size, what was done: kept, skipped, truncated sample indices)."""
    size = graph.size
    if size is None:
        return samples, {}
    fitted, skipped, truncated = [], [], []
    for index, sample in enumerate(samples):
        length = content_length(sample, graph)
        if length > size.size:
            if size.longer == "skip":
                skipped.append(index)
                continue
            truncated.append(index)
        fitted.append({name: (to_size(value, size.axes[name], size.size, size.pad[name]) if name in size.pad else value)
                       for name, value in sample.items()})
    if samples and not fitted:
        raise StageError(f"{where}: none of the {len(samples)} samples fits {graph.name} ({size.dim} {size.size}): "
                         f"each is longer (fix: add shorter samples, or set graphs.{size.graph}.dims.{size.dim}.longer: "
                         "truncate)")
    return fitted, {"dim": size.dim, "size": size.size, "samples": len(samples), "kept": len(fitted),
                    "skipped": skipped, "truncated": truncated, "longer": size.longer}
