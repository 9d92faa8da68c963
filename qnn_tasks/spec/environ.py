"""The environment variables the tool reads as numbers, flags or choices: each one's type and bounds in one table.

`value(name)` is the variable read and checked; `check_all()` runs at the start of every doit command
(tasks/project.py), so `QNN_LOCK_WAIT=abc` is one line (`environment variable QNN_LOCK_WAIT: 'abc' is not a
number (fix: ...)`, exit 78) before anything runs, never a traceback from the code that reads it later. Variables
that hold a path, a URL or names (QNN_TOOLCHAIN, QNN_CACHE, QNN_RUNTIME_LIBS, QNN_SDK_ROOT, ...) are checked by
their readers, which name the variable when what it points at is wrong.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import NamedTuple

from qnn_tasks.errors import SpecError

FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


class Var(NamedTuple):
    kind: str                        # "number", "integer", "flag" or "choice"
    default: object
    low: float | None = None
    high: float | None = None
    example: str = ""
    choices: tuple[str, ...] = ()    # "choice": the words, or prefixes ending in "://"


DAY = 24 * 3600.0
VARS = {
    "QNN_LOCK_WAIT": Var("number", 0.0, 0.0, 7 * DAY, "QNN_LOCK_WAIT=600 (seconds to wait for the running doit)"),
    "QNN_PROGRESS_SECONDS": Var("number", 15.0, 0.0, DAY, "QNN_PROGRESS_SECONDS=15"),
    "QNN_COMPAT_SAMPLES": Var("integer", 2, 1, 10_000, "QNN_COMPAT_SAMPLES=2"),
    "QNN_VERIFY_ROUNDS": Var("integer", None, 0, 1_000_000, "QNN_VERIFY_ROUNDS=3"),
    "QNN_VERIFY_INFERENCES": Var("integer", None, 0, 1_000_000, "QNN_VERIFY_INFERENCES=20"),
    "QNN_POWER_SECONDS": Var("number", None, 0.0, 7 * DAY, "QNN_POWER_SECONDS=600"),
    "QNN_KEEP_DEVICE_FILES": Var("flag", None, example="QNN_KEEP_DEVICE_FILES=1"),
    "QNN_UPGRADE_GATE": Var("flag", False, example="QNN_UPGRADE_GATE=1"),
    "ANDROID_ADB_SERVER_PORT": Var("integer", None, 1, 65535, "ANDROID_ADB_SERVER_PORT=5037"),
    "QNN_EXECUTOR": Var("choice", "child", example="QNN_EXECUTOR=child",
                        choices=("child", "inprocess", "dask://", "tcp://", "tls://")),
}


def value(name: str, env: Mapping[str, str] | None = None) -> object:
    """The variable's value of its type (its default when unset or empty), else one SpecError line naming it."""
    var = VARS[name]
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return var.default
    where = f"environment variable {name}"
    fix = f"e.g. {var.example}, or unset it" if var.example else "unset it"
    if var.kind == "flag":
        if raw.lower() not in FLAGS:
            raise SpecError(where, "", f"{raw[:40]!r} is not a yes or no", f"write 1 or 0 ({fix})")
        return FLAGS[raw.lower()]
    if var.kind == "choice":
        if any(raw == c if not c.endswith("://") else raw.startswith(c) and len(raw) > len(c) for c in var.choices):
            return raw
        raise SpecError(where, "", f"unknown value {raw[:60]!r}",
                        f"use one of: {', '.join(c + ('host:port' if c.endswith('://') else '') for c in var.choices)}")
    try:
        number = int(raw) if var.kind == "integer" else float(raw)
    except ValueError:
        raise SpecError(where, "", f"{raw[:40]!r} is not {'a whole number' if var.kind == 'integer' else 'a number'}",
                        fix) from None
    if not math.isfinite(number) or (var.low is not None and number < var.low) \
            or (var.high is not None and number > var.high):
        raise SpecError(where, "", f"{raw[:40]} is out of range", f"use a value from {var.low:g} to {var.high:g} ({fix})")
    return number


def check_all(env: Mapping[str, str] | None = None) -> None:
    """Every variable of the table, checked (the first wrong one is the SpecError)."""
    for name in VARS:
        value(name, env)
