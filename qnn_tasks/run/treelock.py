"""One writer per build tree: a second `doit` that would build here refuses (or waits), naming the first.

The lock is an flock on build/.qnn-lock, held from task loading to exit; the file names the
holder (pid, host, since when, command). Read-only commands (`doit list`, `info`, `help`, and
`doit report` alone) take no lock. A holder that ended without releasing (SIGKILL, power loss)
leaves `clean: false` behind: the next holder sweeps the litter such a run leaves (`*.part`
files, `.staging` folders) before building.
"""
from __future__ import annotations

import atexit
import datetime as _dt
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from qnn_tasks import envvalues
from qnn_tasks.errors import QnnTasksError

LOCK_FILE = Path("build") / ".qnn-lock"
WAIT_ENV = envvalues.LOCK_WAIT  # seconds to wait for the running doit before refusing (default 0)
READ_ONLY_COMMANDS = {"list", "info", "help", "dumpdb", "tabcompletion"}
READ_ONLY_TASKS = {"report", "cache:stats"}

_held: dict[str, object] = {}


class TreeBusy(QnnTasksError):
    """Another doit holds the tree."""


def needs_lock(argv: list[str]) -> bool:
    """Whether this doit command line may build (anything but listing, info, or rendering the report)."""
    words = [a for a in argv[1:] if not a.startswith("-")]
    if words and words[0] in READ_ONLY_COMMANDS:
        return False
    if words and words[0] == "run":
        words = words[1:]
    return not words or any(w not in READ_ONLY_TASKS for w in words)


def acquire(root: Path, argv: list[str], wait: float | None = None) -> dict:
    """Take the tree's lock for this process (idempotent); sweep a dead holder's litter. Returns the holder facts."""
    if "fd" in _held:
        return _held["me"]  # type: ignore[return-value]
    path = root / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    wait = envvalues.number(WAIT_ENV) if wait is None else wait
    deadline = time.monotonic() + wait
    announced = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = _read(fd)
            if time.monotonic() >= deadline:
                os.close(fd)
                raise TreeBusy(f"{path}: another doit is building this tree ({describe(holder)}); wait for it to "
                               f"finish or stop it (to wait instead of refusing: {WAIT_ENV}=<seconds>)") from None
            if not announced:
                print(f"waiting for the doit building this tree ({describe(holder)}) ...", file=sys.stderr, flush=True)
                announced = True
            time.sleep(0.5)
    previous = _read(fd)
    swept = sweep(root / "build") if previous and not previous.get("clean", True) else 0
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "since": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
          "command": " ".join(["doit"] + argv[1:]), "clean": False}
    _write(fd, me)
    _held.update(fd=fd, me=me)
    atexit.register(release)
    if swept:
        print(f"cleaned {swept} leftover(s) of an interrupted run (pid {previous.get('pid')}, {previous.get('since')})",
              file=sys.stderr)
    return me


def owned() -> bool:
    return "fd" in _held


def release() -> None:
    """Mark the tree clean and let go (at exit, also after Ctrl-C)."""
    fd = _held.pop("fd", None)
    me = _held.pop("me", None)
    if fd is None:
        return
    try:
        _write(fd, {**me, "clean": True})  # type: ignore[dict-item]
    except OSError:
        pass  # a full or read-only disk: the file keeps `clean: false`, so the next holder sweeps (harmless)
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def describe(holder: dict | None) -> str:
    if not holder:
        return "pid unknown"
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}: {holder.get('command')}"


def sweep(folder: Path) -> int:
    """Remove the litter of killed runs below `folder`: `*.part` files and `.staging`/`.work` folders."""
    count = 0
    if not folder.is_dir():
        return 0
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in list(dirnames):
            if name in (".staging", ".work") or name.startswith(".cache-restore"):
                shutil.rmtree(os.path.join(dirpath, name), ignore_errors=True)
                dirnames.remove(name)
                count += 1
        for name in filenames:
            if name.endswith(".part"):
                try:
                    os.unlink(os.path.join(dirpath, name))
                    count += 1
                except FileNotFoundError:
                    pass
    return count


def _read(fd: int) -> dict | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return json.loads(os.read(fd, 65536).decode() or "null")
    except (ValueError, OSError):
        return None


def _write(fd: int, data: dict) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(data).encode())
