"""Values read from the environment as numbers, yes/no flags or choices (QNN_LOCK_WAIT, QNN_STAGE_TIMEOUT,
QNN_EXECUTOR, ...), each with its type and bounds in one table here, checked like a spec's.

A value that is not a number, not finite, out of range, not a yes/no or not one of the choices is one line naming
the variable and the fix (`$QNN_LOCK_WAIT: 'abc' is not a number (fix: ...)`); doit then exits 78 like for any
setup error. Every variable is checked when the project loads (`check_all`), so a bad one stops the run before
any stage starts rather than halfway. Variables that hold a path, a URL or names (QNN_TOOLCHAIN, QNN_CACHE,
QNN_RUNTIME_LIBS, QNN_SDK_ROOT, ...) are checked by their readers, which name the variable.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping

from qnn_tasks.errors import SpecError

LOCK_WAIT = "QNN_LOCK_WAIT"            # seconds to wait for the doit building this tree (default 0: refuse at once)
STAGE_TIMEOUT = "QNN_STAGE_TIMEOUT"    # seconds a stage may take, where its model.yaml sets no `stage_timeout`
PROGRESS_SECONDS = "QNN_PROGRESS_SECONDS"  # without a terminal: a progress line at most this often (0: every step)
COMPAT_SAMPLES = "QNN_COMPAT_SAMPLES"  # samples each binary runs in `doit compat`
VERIFY_ROUNDS = "QNN_VERIFY_ROUNDS"    # phone timing: rounds and inferences per round, power run length
VERIFY_INFERENCES = "QNN_VERIFY_INFERENCES"
POWER_SECONDS = "QNN_POWER_SECONDS"
ADB_PORT = "ANDROID_ADB_SERVER_PORT"
KEEP_DEVICE_FILES = "QNN_KEEP_DEVICE_FILES"  # yes/no
UPGRADE_GATE = "QNN_UPGRADE_GATE"            # yes/no
EXECUTOR = "QNN_EXECUTOR"                    # child (default), inprocess, dask://host:port, tcp://..., tls://...

DAY = 24 * 3600.0
STAGE_TIMEOUT_DEFAULT = 4 * 3600.0  # generous: the largest example compiles in minutes; a hang is caught in hours
STAGE_TIMEOUT_MAX = 7 * DAY
# name -> (default, lowest, highest, whole numbers only)
BOUNDS: dict[str, tuple[float | None, float, float, bool]] = {
    LOCK_WAIT: (0.0, 0.0, DAY, False),
    STAGE_TIMEOUT: (STAGE_TIMEOUT_DEFAULT, 1.0, STAGE_TIMEOUT_MAX, False),
    PROGRESS_SECONDS: (15.0, 0.0, DAY, False),
    COMPAT_SAMPLES: (2, 1, 10_000, True),
    VERIFY_ROUNDS: (None, 0, 1_000_000, True),       # None: unset, the profile's settings.device decides
    VERIFY_INFERENCES: (None, 0, 1_000_000, True),
    POWER_SECONDS: (None, 0.0, 7 * DAY, False),
    ADB_PORT: (None, 1, 65535, True),
}
FLAGS = {KEEP_DEVICE_FILES: None, UPGRADE_GATE: False}  # name -> default (None: unset, the profile decides)
YES_NO = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
CHOICES = {EXECUTOR: ("child", ("child", "inprocess"), ("dask://", "tcp://", "tls://"))}  # default, words, prefixes


def _raw(name: str, env: Mapping[str, str] | None) -> str:
    return (os.environ if env is None else env).get(name, "").strip()


def number(name: str, env: Mapping[str, str] | None = None) -> float:
    """The variable's value (its default when unset or empty), or a SpecError in one line."""
    default, low, high, whole = BOUNDS[name]
    raw = _raw(name, env)
    if not raw:
        return default  # type: ignore[return-value]
    kind = "a whole number" if whole else "a number of seconds"
    fix = f"set {name} to {kind} from {low:g} to {high:g}, or unset it" + (f" (default {default:g})" if default
                                                                           is not None else "")
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        raise SpecError(f"${name}", "", f"{raw[:40]!r} is not {kind}", fix) from None
    if not math.isfinite(value) or not low <= value <= high:
        raise SpecError(f"${name}", "", f"{raw[:40]} is out of range", fix)
    return value


def flag(name: str, env: Mapping[str, str] | None = None) -> bool | None:
    """A yes/no variable (1/0, true/false, yes/no, on/off; its default when unset), or a SpecError in one line."""
    raw = _raw(name, env)
    if not raw:
        return FLAGS[name]
    if raw.lower() not in YES_NO:
        raise SpecError(f"${name}", "", f"{raw[:40]!r} is not a yes or no", f"set {name} to 1 or 0, or unset it")
    return YES_NO[raw.lower()]


def choice(name: str, env: Mapping[str, str] | None = None) -> str:
    """One of the variable's words, or one of its prefixes followed by an address; else a SpecError in one line."""
    default, words, prefixes = CHOICES[name]
    raw = _raw(name, env)
    if not raw:
        return default
    if raw in words or any(raw.startswith(prefix) and len(raw) > len(prefix) for prefix in prefixes):
        return raw
    raise SpecError(f"${name}", "", f"unknown value {raw[:60]!r}",
                    f"use one of: {', '.join(words + tuple(p + 'host:port' for p in prefixes))}")


def check_all(env: Mapping[str, str] | None = None) -> None:
    """Check every variable now (at load): a bad value is one line before any stage runs."""
    for name in BOUNDS:
        number(name, env)
    for name in FLAGS:
        flag(name, env)
    for name in CHOICES:
        choice(name, env)
