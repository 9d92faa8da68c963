"""Who is writing `<folder>/<model>/` now: one dist per model and folder at a time, also across projects and hosts
sharing one QNN_DIST, and no dist removing what another one is still writing.

A dist holds an flock on `<folder>/.<model>.dist.lock` (the file names its holder: host, pid, project, since when)
from before it touches anything of the model's until its package is in place, then removes the file. Its work
folders carry their owner in their names (`.<model>.dist-<host>-<pid>`, `.<model>.old-<host>-<pid>`); a leftover
is removed only when its owner is provably dead (this host, and no process has its pid). A holder killed with
SIGKILL loses its flock with its process, so its lock file is taken over, never waited for.
"""
from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from qnn_tasks import envvalues
from qnn_tasks.errors import QnnTasksError

WAIT_ENV = envvalues.LOCK_WAIT  # the tree lock's wait applies to the dist folder's lock too (default 0: refuse)
_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS}  # a filesystem without flock


class DistBusy(QnnTasksError):
    """Another live dist is writing this model's package into the same folder."""


def host() -> str:
    """This machine's name as it appears in work folder names (no separators a path or the parser would split on)."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "localhost"


def owner() -> str:
    return f"{host()}-{os.getpid()}"


def work_folder(dest_root: Path, model: str, kind: str) -> Path:
    """This process's `.<model>.<kind>-<host>-<pid>` folder in dest_root."""
    return dest_root / f".{model}.{kind}-{owner()}"


def parse_owner(name: str, model: str, kind: str) -> tuple[str, int] | None:
    """(host, pid) of a `.<model>.<kind>-<host>-<pid>` name; None for a name without both (another version's)."""
    match = re.fullmatch(rf"\.{re.escape(model)}\.{kind}-([A-Za-z0-9._]+)-(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def leftovers(dest_root: Path, model: str, kind: str) -> Iterator[tuple[Path, str | None]]:
    """Every `.<model>.<kind>-*` folder but this process's own, with None when its owner is provably dead, else why
    it is left in place (who may still be writing it)."""
    mine = work_folder(dest_root, model, kind).name
    for path in sorted(dest_root.glob(f".{model}.{kind}-*")):
        if path.name == mine:
            continue
        found = parse_owner(path.name, model, kind)
        if found is None:
            yield path, "its name does not say which process wrote it"
        elif found[0] != host():
            yield path, f"written by pid {found[1]} on {found[0]}, which this machine cannot check"
        elif alive(found[1]):
            yield path, f"its owner, pid {found[1]} on this machine, is running"
        else:
            yield path, None


def describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "pid unknown"
    return (f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}, "
            f"for the project {holder.get('project')}")


class ModelLock:
    """The flock on `<dest_root>/.<model>.dist.lock` for the block (`with ModelLock(...)`)."""

    def __init__(self, dest_root: Path, model: str, project: Path, wait: float | None = None) -> None:
        self.path = dest_root / f".{model}.dist.lock"
        self.model, self.project = model, project
        self.wait = envvalues.number(WAIT_ENV) if wait is None else wait
        self.fd: int | None = None
        self.locked = False

    def __enter__(self) -> ModelLock:
        deadline = time.monotonic() + self.wait
        announced = False
        while not self._try():
            holder = self._holder()
            if time.monotonic() >= deadline:
                raise DistBusy(f"{self.path}: another dist is writing {self.model}'s package into this folder "
                               f"({describe(holder)}): nothing was touched (fix: run doit dist again when it has "
                               f"finished, or set {WAIT_ENV}=<seconds> to wait for it)")
            if not announced:
                print(f"dist:{self.model}: waiting for the dist writing {self.path.parent}/{self.model} "
                      f"({describe(holder)}) ...", file=sys.stderr, flush=True)
                announced = True
            time.sleep(0.2)
        return self

    def _try(self) -> bool:
        """Take the lock if free; False while another process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError as err:
            if err.errno not in _NO_LOCKS:
                os.close(fd)
                raise
            self.fd = fd  # no flock here (some network filesystems): the owner names in the folders still hold
            return True
        try:
            same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its last holder removed the file after we opened it: take the new one
            os.close(fd)
            return False
        self.fd, self.locked = fd, True
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": host(), "project": str(self.project),
                                     "since": _dt.datetime.now().astimezone().isoformat(timespec="seconds")}).encode())
        except OSError as err:
            self.__exit__()  # a full disk: the lock file goes again; the caller says why in one line
            err.filename = err.filename or str(self.path)
            raise
        return True

    def _holder(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text() or "null")
        except (OSError, ValueError):
            return None

    def __exit__(self, *exc: object) -> None:
        if self.fd is None:
            return
        try:
            if self.locked:
                self.path.unlink(missing_ok=True)  # before letting go: a waiter that opened it sees it gone, retries
        except OSError:
            pass  # a read-only folder now: the file stays; the next dist takes its flock over
        finally:
            os.close(self.fd)  # releases the flock
            self.fd, self.locked = None, False
