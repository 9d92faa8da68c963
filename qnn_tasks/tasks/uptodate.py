"""Up-to-date checkers for doit, as small named callables (doit's `tools.config_changed` shape).

`Fresh`: a build task's key is unchanged and its files are what its last success left. `ChecksThisRun`: shared by
one run's checkers and the report's. Stamps are cheap (one stat per file); contents are digested only where a
stamp cannot tell (a replaced file that kept size and mtime, the report's own inputs).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterator

from qnn_tasks.run.status import Status, good


def key_of(data: dict[str, Any]) -> str:
    """A short, stable digest of JSON-able settings: a task's key."""
    return hashlib.md5(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _stats(paths: list[str]) -> Iterator[tuple[str, os.stat_result | None]]:
    for path in paths:
        try:
            yield path, os.stat(path)
        except FileNotFoundError:
            yield path, None


def content_signature(paths: list[str]) -> str:
    """The files' contents, one digest: each file is hashed once (run/digests.py caches by size, mtime, inode, ctime)."""
    from qnn_tasks.run.digests import sha256

    h = hashlib.md5()
    for path, st in _stats(paths):
        h.update(f"{path}\0{sha256(path) if st is not None else '-'}\n".encode())
    return h.hexdigest()


def stamp_signature(paths: list[str]) -> str:
    """One digest of the files' stamps (size, mtime, inode, ctime: the key run/digests.py caches a digest under)."""
    from qnn_tasks.run.digests import stamp

    h = hashlib.md5()
    for path, st in _stats(paths):
        h.update(f"{path}\0{stamp(st) if st is not None else '-'}\n".encode())
    return h.hexdigest()


def content_signature_by_stamp(paths: list[str], saved_stamp: Any, saved: Any) -> tuple[str, str]:
    """(stamp_signature, content_signature) of the files, one `stat` each while every stamp is as saved.

    Equal stamps are what the digest cache would answer from without reading a file, so the saved content
    signature still holds; it also spares a no-op run loading that cache. Any stamp changed: digested.
    """
    stamps = stamp_signature(paths)
    if isinstance(saved, str) and saved_stamp == stamps:
        return stamps, saved
    return stamps, content_signature(paths)


def _signatures(paths: list[str]) -> tuple[int, int]:
    """(mtime, size) and (inode, ctime) signatures of the files, from one `stat` each."""
    times: list[int] = []
    ids: list[int] = []
    for _, st in _stats(paths):
        if st is None:
            times.append(-1)
            ids.append(-1)
        else:
            times += (st.st_mtime_ns, st.st_size)
            ids += (st.st_ino, st.st_ctime_ns)
    return hash(tuple(times)), hash(tuple(ids))


class ChecksThisRun:
    """Whether any build task's outputs were checked in this doit run (then the report needs no check of its own).

    Shared by the `Fresh` checkers of one run and the report's up-to-date check: a named object, not a module
    global two tasks talk through.
    """

    def __init__(self) -> None:
        self.done = False

    def mark(self) -> None:
        self.done = True

    def __bool__(self) -> bool:
        return self.done


class Fresh:
    """doit `uptodate`: the stage's key is unchanged and its files are what the last success left.

    Like doit's own `config_changed`, plus the outputs: a target truncated, replaced or deleted by
    hand makes its task run again. Size and mtime must be as saved; when a file's inode or ctime
    is not (`cp -p`, `rsync -t` and `tar` keep size and mtime, not these; so does copying the
    whole tree), the outputs must still have the digests their record names, for this target.
    """

    def __init__(self, key: str, paths: list[str], record: str | None = None,
                 checks: ChecksThisRun | None = None) -> None:
        self.key = key
        self.paths = paths
        self.record = record
        self.checks = checks

    def __call__(self, task, values) -> bool:
        if self.checks is not None:
            self.checks.mark()
        task.value_savers.append(lambda: dict(zip(("files", "ids"), _signatures(self.paths)), key=self.key))
        if values.get("key") != self.key:
            return False
        stored = values.get("files")
        if isinstance(stored, str):  # saved by a version before 2026-12 (an md5): compare it its way
            return stored == md5_signature(self.paths) and self.vouched(task.name)
        times, ids = _signatures(self.paths)
        if stored != times:
            return False
        return values.get("ids") == ids or self.vouched(task.name)

    def vouched(self, task_name: str) -> bool:
        """The record is this task's, passed, and names every output with the digest it has now."""
        if self.record is None:
            return False
        from qnn_tasks.run import records

        record = records.read(self.record)
        stage, _, target = task_name.partition(":")
        if record is None or record.get("stage") != stage or record.get("target") != target:
            return False
        if record.get("status") == Status.SKIPPED:
            return True
        outputs = [p for p in self.paths if p != self.record]
        files = record.get("files")
        if not good(record.get("status")) or not isinstance(files, dict):
            return False
        return set(outputs) <= set(files) and records.problems(record, self.record) == []


def md5_signature(paths: list[str]) -> str:
    """The stamp older versions saved, so an upgrade does not rebuild every up-to-date target once."""
    parts = [f"{path}:{st.st_mtime_ns}:{st.st_size}" for path, st in _stats(paths) if st]
    return hashlib.md5("\n".join(parts).encode()).hexdigest()
