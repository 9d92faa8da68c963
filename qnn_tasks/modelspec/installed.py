"""Facts about installed distributions (versions, install folders), remembered across runs.

importlib.metadata scans every sys.path folder on each lookup (~5 ms each on a machine with torch,
dask and friends installed), and every `doit` asks for the toolchain's versions and the models'
source packages: a tenth of a no-op run's own cost. The answers are kept in one small file per
interpreter under ~/.cache/qnn-npu-compile/, valid while the interpreter, sys.path and the
modification time of each folder on it are unchanged: installing, upgrading or removing a
distribution adds or removes its `.dist-info` folder there, which changes the folder's mtime.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Callable

_facts: dict[str, str | None] | None = None
_fingerprint: str | None = None


def memo_file() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qnn-npu-compile"
    return base / f"installed-{hashlib.md5(sys.executable.encode()).hexdigest()[:12]}.json"


def _site_fingerprint() -> str:
    """sys.path plus the mtime of each of its folders (site-packages, PYTHONPATH entries, `--target` dirs).

    The working folder is left out: it is the project, whose top level changes on every run (the
    tree lock), and distributions are not installed there.
    """
    parts = [sys.executable, sys.version]
    cwd = os.getcwd()
    for entry in sys.path:
        parts.append(entry)
        if entry in ("", ".", cwd):
            continue
        try:
            parts.append(str(os.stat(entry).st_mtime_ns))
        except OSError:
            parts.append("-")
    return hashlib.md5("\n".join(parts).encode()).hexdigest()


def _load() -> dict[str, str | None]:
    global _facts, _fingerprint
    if _facts is None:
        _fingerprint = _site_fingerprint()
        try:
            stored = json.loads(memo_file().read_text())
            _facts = stored["facts"] if stored.get("fingerprint") == _fingerprint else {}
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or damaged: ask importlib again
            _facts = {}
    return _facts


def remembered(key: str, compute: Callable[[], str | None]) -> str | None:
    """`compute()`'s answer for `key`, computed once per installed set of distributions."""
    facts = _load()
    if key not in facts:
        facts[key] = compute()
        _save(facts)
    return facts[key]


def _save(facts: dict[str, str | None]) -> None:
    path = memo_file()
    tmp = path.with_name(f"{path.name}.{os.getpid()}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"fingerprint": _fingerprint, "facts": facts}))
        os.replace(tmp, path)
    except OSError:  # a read-only home still works, just without the memo
        tmp.unlink(missing_ok=True)


def version(package: str) -> str | None:
    """The installed version of a distribution, None when it is not installed."""
    def lookup() -> str | None:
        import importlib.metadata

        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None
    return remembered(f"version:{package}", lookup)


def location(package: str) -> Path | None:
    """The folder a distribution's files are installed relative to (its `locate_file("")`)."""
    def lookup() -> str | None:
        import importlib.metadata

        try:
            return str(importlib.metadata.distribution(package).locate_file(""))
        except importlib.metadata.PackageNotFoundError:
            return None
    found = remembered(f"location:{package}", lookup)
    return Path(found) if found else None
