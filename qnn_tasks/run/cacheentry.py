"""What may be read from a cache store, and what goes in: the store is shared, so its contents are untrusted.

A manifest must have the shape this version writes, name files by plain project-relative paths
(checked for every entry, so `cache:gc` can drop the others) and, on restore, only paths inside
the stage's own folder with no symlink on the way. What goes in is what the stage vouches for
(its record's `files`) and the files its record names (logs, plots), never whatever else sits in
the folder (a user's own file).
"""
from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

SCHEMA = "qnn-npu-compile/cache/v1"
MANIFEST_LIMIT = 16 << 20        # bytes: a manifest is a record plus a file list; anything bigger is not ours
FILES_LIMIT = 10_000             # file names in one manifest
SHA256 = re.compile(r"[0-9a-f]{64}")


def parse_manifest(data: bytes, key: str, other_versions: bool = False) -> tuple[dict[str, Any] | None, str | None]:
    """(manifest, None) for a usable entry, (None, "<json key>: <problem>") for one that is not.

    An entry of another schema version is (None, None) — a plain miss — or, with `other_versions`,
    returned as it is (gc keeps it by its age, for the version that wrote it).
    """
    if len(data) > MANIFEST_LIMIT:
        return None, f"is larger than {MANIFEST_LIMIT >> 20} MiB"
    try:
        manifest = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        return None, f"is not UTF-8 (byte {err.start})"
    except ValueError as err:
        return None, f"is not valid JSON ({err})"
    if not isinstance(manifest, dict):
        return None, f"is a JSON {type(manifest).__name__}, not an object"
    if not isinstance(manifest.get("schema"), str):
        return None, "schema: missing"
    if manifest["schema"] != SCHEMA:
        return (manifest if other_versions else None), None
    problem = _shape_problem(manifest, key)
    return (None, problem) if problem else (manifest, None)


def _shape_problem(manifest: dict[str, Any], key: str) -> str | None:
    if manifest.get("key") != key:
        return f"key: {str(manifest.get('key'))[:80]!r} is not the key it is stored under"
    if not isinstance(manifest.get("record"), dict):
        return "record: missing or not an object"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "files: missing or not an object of file names"
    if len(files) > FILES_LIMIT:
        return f"files: more than {FILES_LIMIT} names"
    for name, facts in files.items():
        unsafe = unsafe_name(name, "")  # the stage's folder is checked on restore; this much holds for any entry
        if unsafe:
            return f"files: {name[:200]!r} {unsafe}"
        if not isinstance(facts, dict) or not SHA256.fullmatch(str(facts.get("sha256"))):
            return f"files: {name[:200]!r}: no sha256 digest"
        size = facts.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return f"files: {name[:200]!r}: size is not a byte count"
    return None


def unsafe_name(name: object, folder: str, hidden_ok: bool = False) -> str | None:
    """Why `name` is not a plain project-relative file name inside `folder` (None: it is; "" for the project).

    Plain: '/'-separated, relative, no empty, '.', '..' or hidden part, no backslash or control character.
    """
    if not isinstance(name, str) or not name:
        return "is not a file name"
    if len(name) > 4096 or re.search(r"[\x00-\x1f\x7f\\]", name):
        return "holds a backslash or a control character"
    if name.startswith("/") or PurePosixPath(name).is_absolute() or re.match(r"[A-Za-z]:", name):
        return "is an absolute path"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' part"
    if not hidden_ok and any(part.startswith(".") for part in parts):
        return "has a hidden part"
    base = PurePosixPath(folder).parts
    if tuple(parts[: len(base)]) != base or len(parts) == len(base):
        return f"lies outside the stage's folder {folder}"
    return None


def symlink_on_the_way(root: Path, name: str, folder: str) -> str | None:
    """Why writing `name` under `root` would follow a symlink in or below the stage's folder (None: it would not)."""
    parts = name.split("/")
    for depth in range(len(PurePosixPath(folder).parts), len(parts) + 1):
        path = root.joinpath(*parts[:depth])
        if path.is_symlink():
            return f"passes the symlink {'/'.join(parts[:depth])}"
    return None


def stage_files(root: Path, out_dir: Path | str, record: dict[str, Any], record_name: str) -> list[str]:
    """What a stage put in its folder: the outputs its record vouches for (`files`) and the files it names.

    Project-relative names, each a regular file inside `out_dir` (not the record itself): a log or a
    plot the record points at is shared; a user's own file that sits in the folder never is.
    """
    folder = str(PurePosixPath(out_dir))
    names = set(record.get("files") or {}) | set(_named_paths(record))
    found = []
    for name in sorted(names):
        if (unsafe_name(name, folder) or name == f"{folder}/{record_name}"
                or symlink_on_the_way(root, name, folder) or not (root / name).is_file()):
            continue
        found.append(name)
    return found


def _named_paths(value: Any, depth: int = 0) -> Iterator[str]:
    """Every string in a record that could be a path (bounded: a record is small and made by our stages)."""
    if depth > 12:
        return
    if isinstance(value, str):
        if "/" in value and len(value) < 4096:
            yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _named_paths(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value[:10_000]:
            yield from _named_paths(item, depth + 1)
