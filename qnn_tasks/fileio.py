"""Atomic file writes: an interrupted build never leaves a half file that looks finished."""
from __future__ import annotations

import json
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside `final`; rename it onto `final` only if the block succeeds."""
    final = Path(final)
    tmp = None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".part", dir=final.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; results should read like any other file
        yield tmp
        os.replace(tmp, final)
    except OSError as err:
        if err.filename is None:  # a refused write() names no file: name the one being written (full disk ...)
            err.filename = str(final)
        raise
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()


def write_json(path: Path, data: Any) -> None:
    """Strict JSON (no NaN/Infinity tokens): non-finite numbers are written as null."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(finite(data), indent=2, sort_keys=False, default=_jsonable, allow_nan=False) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if hasattr(value, "item") and hasattr(value, "dtype"):  # numpy scalar
        return finite(value.item())
    return value


def _jsonable(value: Any) -> Any:
    """numpy scalars and Paths in records become plain JSON values."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")
