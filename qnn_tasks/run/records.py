"""Stage records that never outlive their outputs.

A record is written last, after the outputs it vouches for are in place, and names each of them
with its size and SHA-256 (`files`). Whoever reads a record (the report, a downstream stage)
believes it only while those files are still there with that size and content; otherwise the
record is `stale`. Content is re-hashed only for files modified after the record was written,
so checking a fresh tree costs a `stat` per file.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.fileio import read_json, write_json

CHUNK = 1 << 20


_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> digest: each file hashed once per process


def sha256(path: Path | str) -> str:
    st = os.stat(path)
    memo = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if memo not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
        _DIGESTS[memo] = h.hexdigest()
    return _DIGESTS[memo]


def vouch(paths: list[str], root: Path | str = ".") -> dict[str, dict[str, Any]]:
    """Size and digest of each output (project-relative path -> {size, sha256}); files are looked up under root."""
    return {p: {"size": os.stat(Path(root) / p).st_size, "sha256": sha256(Path(root) / p)} for p in paths}


def write(path: Path | str, record: dict[str, Any]) -> None:
    write_json(Path(path), record)


def read(path: Path | str) -> dict[str, Any] | None:
    try:
        return read_json(Path(path))
    except (FileNotFoundError, ValueError):
        return None


def problems(record: dict[str, Any], record_path: Path | str, root: Path | str = ".") -> list[str]:
    """Why the record no longer describes its outputs (empty: it does); paths are relative to `root`."""
    files = record.get("files")
    if not files:
        return []
    try:
        written = os.stat(record_path).st_mtime_ns
    except FileNotFoundError:
        written = 0
    found = []
    for name, facts in files.items():
        path = Path(root) / name
        try:
            st = os.stat(path)
        except FileNotFoundError:
            found.append(f"{name} is missing")
            continue
        if st.st_size != facts["size"]:
            found.append(f"{name} has {st.st_size} bytes, its record says {facts['size']}")
        elif st.st_mtime_ns > written and sha256(path) != facts["sha256"]:
            found.append(f"{name} changed since its record was written")
    return found


def trusted(path: Path | str, fix: str) -> dict[str, Any]:
    """A passed record whose outputs are intact, or a StageError saying what to rerun."""
    record = read(path)
    if record is None:
        raise StageError(f"{path}: no record (run {fix})")
    if record.get("status") not in ("passed", "warning"):
        raise StageError(f"{path}: the stage {record.get('status', 'did not finish')} (run {fix})")
    bad = problems(record, path)
    if bad:
        raise StageError(f"{path}: stale: {'; '.join(bad)} (run {fix})")
    return record
