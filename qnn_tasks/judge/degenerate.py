"""Data that verifies nothing: inputs or outputs with no variation, which every comparison passes.

Two all-zero vectors have a cosine of 1.0 and a max-abs of 0: silent clips, a glue that multiplies by 0 or a
graph whose outputs do not depend on the samples would pass any threshold. Such data is refused (inputs, at
cpucheck and at each link of a pipeline) or the verdict says "not verified" with the reason (outputs).
"""
from __future__ import annotations

import numpy as np


def constant_inputs(samples: list[dict[str, np.ndarray]]) -> str | None:
    """Why the samples exercise nothing (every input holds one value over all samples and elements), or None."""
    if not samples:
        return None
    values = {}
    for name in samples[0]:
        first = np.asarray(samples[0][name]).reshape(-1)[:1]
        if not first.size or not all(_all_equal(np.asarray(s[name]), first[0]) for s in samples):
            return None
        values[name] = _shown(first[0])
    shown = ", ".join(f"'{name}' is {value}" for name, value in values.items())
    return f"every input is one constant over all {len(samples)} sample(s) ({shown})"


def constant_output(reference: np.ndarray, actual: np.ndarray) -> str | None:
    """Why one output's comparison shows nothing (stacked over samples, both sides), or None:
    all zero, one value repeated, or the same output for every sample."""
    sides = []
    for values in (np.asarray(reference), np.asarray(actual)):
        flat = values.reshape(-1)
        if not flat.size:
            sides.append("empty")
        elif not flat.any():
            sides.append("all zero")
        elif flat.size > 1 and _all_equal(flat, flat[0]):
            sides.append(f"the one value {_shown(flat[0])}")
        elif len(values) > 1 and all(np.array_equal(v, values[0]) for v in values[1:]):
            sides.append(f"the same for all {len(values)} samples")
        else:
            return None
    return sides[0] if sides[0] == sides[1] else f"{sides[0]} on the CPU, {sides[1]} on the NPU"


def _all_equal(values: np.ndarray, value: object) -> bool:
    return bool(np.all(values == value))


def _shown(value: np.generic) -> str:
    return f"{value.item():.6g}" if value.dtype.kind in "fc" else str(value.item())
