"""Sample arrays cast to a declared input's dtype, exactly or not at all (shared by .npz samples and media)."""
from __future__ import annotations

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.modelspec.project import TensorSpec


def cast_to(value: np.ndarray, spec: TensorSpec, where: str) -> np.ndarray:
    """`value` as the dtype model.yaml declares: ints only when no value changes, floats to floats."""
    wanted = np.dtype(spec.dtype)
    if value.dtype == wanted:
        return value
    if value.dtype.kind in "iub" and wanted.kind in "iub":
        cast = value.astype(wanted)
        if np.array_equal(cast, value):
            return cast
    elif value.dtype.kind == "f" and wanted.kind == "f":
        return value.astype(wanted)
    raise StageError(f"{where}: '{spec.name}' has dtype {value.dtype.name}, model.yaml declares {spec.dtype} "
                     f"(fix: save it as {spec.dtype})")
