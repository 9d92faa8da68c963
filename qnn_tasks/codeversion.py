"""The version of the code that produced an artifact: a digest of the modules a stage runs.

Part of every stage's key (DESIGN rule 3), so upgrading qnn-npu-compile reruns exactly the
stages whose code changed, and a shared cache never hands out a result of other code. Computed
once per process per module set.
"""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=None)
def module_digest(module: str) -> str:
    """SHA-256 of one module's source (a path relative to qnn_tasks/, e.g. "stages/export.py")."""
    path = PACKAGE / module
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        raise ValueError(f"code version: no module qnn_tasks/{module}") from None


@functools.lru_cache(maxsize=None)
def digest(modules: tuple[str, ...]) -> str:
    """One short digest for a set of modules (order does not matter)."""
    joined = "|".join(f"{m}:{module_digest(m)}" for m in sorted(set(modules)))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]
