"""SHA-256 of build files, hashed once and re-hashed whenever the file may have changed.

A digest is cached under the file's (size, mtime, inode, ctime): `cp -p`, `rsync -t` and `tar`
keep size and mtime but cannot keep the inode and ctime of the file they replace, so a replaced
file is always hashed again. The doit process keeps the cache in build/.qnn-digests.json, so
checking records against their outputs (the report, the up-to-date checks) costs a `stat` per
file after the first run. The cache is as trusted as the tree it sits in: whoever can write
the tree can write records too (docs/trust.md).
"""
from __future__ import annotations

import atexit
import json
import os
import threading
from pathlib import Path

from qnn_tasks import fileio

CACHE_FILE = Path("build") / ".qnn-digests.json"
MAX_ENTRIES = 200_000  # bounds a hand-made or runaway cache file

_memo: dict[str, tuple[int, int, int, int, str]] = {}  # abspath -> (size, mtime_ns, ino, ctime_ns, sha256)
_lock = threading.Lock()
_persisted: dict[str, object] = {}  # "path": the cache file, "dirty": bool


def stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What must stay equal for a cached digest to still be the file's."""
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns


def sha256(path: Path | str) -> str:
    """The file's SHA-256 (hex), from the cache when its stamp is unchanged."""
    if "pending" in _persisted:
        _load()
    key = os.path.abspath(path)
    st = os.stat(key)
    now = stamp(st)
    cached = _memo.get(key)
    if cached is not None and cached[:4] == now:
        return cached[4]
    digest = fileio.sha256(key)
    if stamp(os.stat(key)) == now:  # a file written while it was read is not cached
        with _lock:
            _memo[key] = (*now, digest)
            _persisted["dirty"] = True
    return digest


def persist(root: Path | str) -> None:
    """Use the tree's digest cache in this process (the doit process; idempotent): read on first use, saved at exit."""
    path = Path(os.path.abspath(root)) / CACHE_FILE
    if _persisted.get("path") == path:
        return
    _persisted.update(path=path, dirty=False, pending=True)
    atexit.register(save)


def _load() -> None:
    with _lock:
        if not _persisted.pop("pending", None):
            return
        path = _persisted["path"]
        try:
            data = json.loads(path.read_text())  # type: ignore[union-attr]
        except (OSError, ValueError):  # absent, unreadable or damaged: start empty (costs a re-hash)
            return
        if not isinstance(data, dict) or len(data) > MAX_ENTRIES:
            return
        prefix = _prefix()
        for name, entry in data.items():
            if (isinstance(name, str) and name.startswith(prefix) and isinstance(entry, list) and len(entry) == 5
                    and all(type(v) is int for v in entry[:4]) and isinstance(entry[4], str)):
                _memo.setdefault(name, tuple(entry))  # type: ignore[arg-type]


def _prefix() -> str:
    return str(Path(_persisted["path"]).parent.parent) + os.sep  # type: ignore[arg-type]


def save() -> None:
    """Write the cache atomically (entries of this tree only; last writer wins, a lost entry is a re-hash)."""
    path = _persisted.get("path")
    if not isinstance(path, Path) or not _persisted.get("dirty") or not path.parent.is_dir():
        return
    prefix = _prefix()
    with _lock:
        entries = {k: list(v) for k, v in _memo.items() if k.startswith(prefix) and os.path.lexists(k)}
        _persisted["dirty"] = False
    if len(entries) > MAX_ENTRIES:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        tmp.write_text(json.dumps(entries))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
