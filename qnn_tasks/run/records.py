"""Stage records that never outlive their outputs.

A record is written last, after the outputs it vouches for are in place, and names each of them
with its size and SHA-256 (`files`). Whoever reads a record (the report, a downstream stage)
believes it only while those files are still there with that size and content; otherwise the
record is `stale`. Every check compares content: digests are cached by size, mtime, inode and
ctime (run/digests.py), so checking an unchanged tree costs a `stat` per file, and a file replaced
with its size and mtime kept (`cp -p`) is hashed again.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.fileio import read_json, write_json
from qnn_tasks.run.digests import sha256
from qnn_tasks.run.status import good

__all__ = ["beside", "damage", "digests", "problems", "read", "sha256", "trusted", "vouch", "write"]


def vouch(paths: list[str], root: Path | str = ".") -> dict[str, dict[str, Any]]:
    """Size and digest of each output (project-relative path -> {size, sha256}); files are looked up under root."""
    return {p: {"size": os.stat(Path(root) / p).st_size, "sha256": sha256(Path(root) / p)} for p in paths}


def beside(extra: Any, outputs: list[str]) -> list[str]:
    """The files a stage says it also wrote (`also_wrote`: names known only once it ran, as the weights file of a
    model over 2 GB) that its record may vouch for: existing files in the folder of one of its declared outputs, no
    link and nothing elsewhere (a stage's word is not trusted to name another's files)."""
    folders = {os.path.dirname(os.path.normpath(o)) for o in outputs}
    found = []
    for path in extra if isinstance(extra, list) else ():
        if not isinstance(path, str) or ".." in Path(path).parts or Path(path).is_absolute():
            continue
        if os.path.dirname(os.path.normpath(path)) in folders and os.path.isfile(path) and not os.path.islink(path):
            found.append(os.path.normpath(path))
    return sorted(set(found) - set(outputs))


def digests(paths: list[str]) -> dict[str, str | None]:
    """Each file's SHA-256 (None for one that is not there): what a stage read, as `made_from` names it."""
    found: dict[str, str | None] = {}
    for path in paths:
        try:
            found[path] = sha256(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            found[path] = None
    return found


def write(path: Path | str, record: dict[str, Any]) -> None:
    write_json(Path(path), record)


def read(path: Path | str) -> dict[str, Any] | None:
    """The record, or None when there is none or the file is not a record (see `damage`)."""
    try:
        record = read_json(Path(path))
    except (OSError, ValueError):  # ValueError: not JSON, or not UTF-8 (UnicodeDecodeError)
        return None
    return record if isinstance(record, dict) else None


def damage(path: Path | str) -> str | None:
    """Why a record file that exists is not a record (None: it is one, or there is no file)."""
    try:
        data = read_json(Path(path))
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as err:
        return f"{path} is not UTF-8 (byte {err.start})"
    except ValueError as err:
        return f"{path} is not JSON ({err})"
    except OSError as err:
        return f"{path} cannot be read ({err.strerror})"
    if not isinstance(data, dict):
        return f"{path} holds a JSON {type(data).__name__}, not a record (an object)"
    return None


def problems(record: dict[str, Any], record_path: Path | str, root: Path | str = ".") -> list[str]:
    """Why the record no longer describes its outputs (empty: it does); paths are relative to `root`."""
    files = record.get("files")
    if not files:
        return []
    if not isinstance(files, dict):
        return [f"{record_path}: `files` is not a mapping of output -> size and sha256"]
    found = []
    for name, facts in files.items():
        path = Path(root) / name
        if not isinstance(facts, dict) or not isinstance(facts.get("size"), int) or not isinstance(facts.get("sha256"), str):
            found.append(f"{name}: its record names no size and sha256")
            continue
        try:
            st = os.stat(path)
        except FileNotFoundError:
            found.append(f"{name} is missing")
            continue
        if st.st_size != facts["size"]:
            found.append(f"{name} has {st.st_size} bytes, its record says {facts['size']}")
        elif sha256(path) != facts["sha256"]:
            found.append(f"{name} changed since its record was written (its SHA-256 is not the record's)")
    return found


def trusted(path: Path | str, fix: str) -> dict[str, Any]:
    """A passed record whose outputs are intact, or a StageError saying what to rerun."""
    record = read(path)
    if record is None:
        why = damage(path)
        raise StageError(f"{why or f'{path}: no record'} (run {fix})")
    if not good(record.get("status")):
        raise StageError(f"{path}: the stage {record.get('status', 'did not finish')} (run {fix})")
    bad = problems(record, path)
    if bad:
        raise StageError(f"{path}: stale: {'; '.join(bad)} (run {fix})")
    return record
