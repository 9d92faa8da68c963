"""Numbers read from the environment (QNN_LOCK_WAIT, QNN_STAGE_TIMEOUT, ...), checked like a spec's.

A value that is not a number, not finite or out of range is one line naming the variable and the fix
(`$QNN_LOCK_WAIT: 'abc' is not a number (fix: ...)`); doit then exits 78 like for any setup error.
Every variable is checked when the project loads (`check_all`), so a bad one stops the run before
any stage starts rather than halfway.
"""
from __future__ import annotations

import math
import os

from qnn_tasks.errors import SpecError

LOCK_WAIT = "QNN_LOCK_WAIT"            # seconds to wait for the doit building this tree (default 0: refuse at once)
STAGE_TIMEOUT = "QNN_STAGE_TIMEOUT"    # seconds a stage may take, where its model.yaml sets no `stage_timeout`
PROGRESS_SECONDS = "QNN_PROGRESS_SECONDS"  # without a terminal: a progress line at most this often (0: every step)
COMPAT_SAMPLES = "QNN_COMPAT_SAMPLES"  # samples each binary runs in `doit compat`

DAY = 24 * 3600.0
STAGE_TIMEOUT_DEFAULT = 4 * 3600.0  # generous: the largest example compiles in minutes; a hang is caught in hours
STAGE_TIMEOUT_MAX = 7 * DAY
# name -> (default, lowest, highest, whole numbers only)
BOUNDS: dict[str, tuple[float, float, float, bool]] = {
    LOCK_WAIT: (0.0, 0.0, DAY, False),
    STAGE_TIMEOUT: (STAGE_TIMEOUT_DEFAULT, 1.0, STAGE_TIMEOUT_MAX, False),
    PROGRESS_SECONDS: (15.0, 0.0, DAY, False),
    COMPAT_SAMPLES: (2, 1, 10_000, True),
}


def number(name: str) -> float:
    """The variable's value (its default when unset or empty), or a SpecError in one line."""
    default, low, high, whole = BOUNDS[name]
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    kind = "a whole number" if whole else "a number of seconds"
    fix = f"set {name} to {kind} from {low:g} to {high:g}, or unset it (default {default:g})"
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise SpecError(f"${name}", "", f"{raw[:40]!r} is not {kind}", fix) from None
    if not math.isfinite(value) or not low <= value <= high:
        raise SpecError(f"${name}", "", f"{raw[:40]} is out of range", fix)
    return value


def check_all() -> None:
    """Check every variable now (at load): a bad value is one line before any stage runs."""
    for name in BOUNDS:
        number(name)
