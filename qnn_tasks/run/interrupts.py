"""Ctrl-C and SIGTERM: stop at once, say one line, keep nothing half-written, exit 130 (143 for SIGTERM).

doit itself lets KeyboardInterrupt escape as a traceback after saving its state. Here the first
SIGINT or SIGTERM raises KeyboardInterrupt in the main thread and wakes a watcher thread, which
stops every child process and remote call (the stop functions the executors register) off the signal handler; the stage
funnel removes what the interrupted stages had begun, doit saves the state of the tasks that did
finish, and the uncaught KeyboardInterrupt ends in one line instead of a traceback.

A signal handler may run on top of any code of the main thread, including itself, so it takes no
lock: a second signal (or the first one's graceful path taking longer than GRACE_S) ends the process
at once with only lock-free steps: SIGKILL to the children, the interrupted stages' folders swept,
one line written to fd 2, os._exit. The tree's lock file then still says `clean: false` (the
kernel drops the flock), so the next run sweeps the whole tree before building.
"""
from __future__ import annotations

import itertools
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from qnn_tasks.run import treelock  # imported now: an import inside a handler can wait for a lock its frame holds

EXIT_CODE = 130  # Ctrl-C; 143 (128 + SIGTERM) when a SIGTERM reached the run
GRACE_S = 1.5    # the first signal's graceful path (doit saving its state) gets this long; then _exit_now
_running: dict[int, tuple[str, str]] = {}  # thread id -> ("stage:target", its out_dir) being run
_last: list[str] = []
_children: set[int] = set()  # process groups of the child workers alive (killed without a lock)
_first: list[int] = []       # the signals whose Python handler ran
_arrived: list[int] = []     # the signals that reached the process (the C handler writes them to the wakeup fd)
_said = itertools.count()    # the interrupted line is printed by whoever draws 0 (next() is atomic)
_wake: list[int] = []        # the watcher's pipe: [read fd, write fd]


def install() -> None:
    """Take over SIGINT, SIGTERM and the top-level exception hook (main thread only; idempotent)."""
    if threading.current_thread() is not threading.main_thread() or getattr(install, "done", False):
        return
    _wake[:] = os.pipe()
    for fd in _wake:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(_wake[1], warn_on_full_buffer=False)  # each signal's number as it reaches us
    threading.Thread(target=_watch, name="qnn-interrupts", daemon=True).start()
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    previous = sys.excepthook

    def hook(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):
            finish()
        previous(kind, value, tb)

    sys.excepthook = hook
    install.done = True  # type: ignore[attr-defined]


def running(task: str | None, out_dir: str = "") -> None:
    """The funnel says which stage this thread runs, and where it writes (None when it is done)."""
    ident = threading.get_ident()
    if task is None:
        _running.pop(ident, None)
    else:
        _running[ident] = (task, out_dir)
        _last[:] = [task]


def child_started(pgid: int) -> None:
    _children.add(pgid)


def child_ended(pgid: int) -> None:
    _children.discard(pgid)


def exit_code() -> int:
    """143 when a SIGTERM reached the run (alone or with Ctrl-C), else 130.

    Not "the first signal": two signals pending at once run their handlers in an order of the
    kernel's and Python's choosing, not the order they were sent.
    """
    _drain()
    return 128 + signal.SIGTERM if signal.SIGTERM in set(_arrived) | set(_first) else EXIT_CODE


def _drain() -> None:
    """Every signal number the C handler has written to the wakeup fd so far (no lock, never blocks)."""
    while _wake:
        try:
            data = os.read(_wake[0], 64)
        except (BlockingIOError, OSError):
            return
        if not data:
            return
        _arrived.extend(b for b in data if b in (signal.SIGINT, signal.SIGTERM))


_stoppers: list = []  # the executors' stop_all, registered when they are imported (they import this module)


def stop_with(stop: Callable[[], None]) -> None:
    """Call `stop` on the first signal (off the handler) and when the interrupt reaches the top."""
    if stop not in _stoppers:
        _stoppers.append(stop)


def _stop_executors() -> None:
    for stop in list(_stoppers):
        stop()


def _on_signal(signum, frame) -> None:
    if _first:  # a second signal, maybe on top of the first one's handler: end now, lock-free
        _exit_now()
    _first.append(signum)  # the watcher, woken by the wakeup fd, stops the executors: a handler must not
    raise KeyboardInterrupt  # wait for their locks


def _watch() -> None:
    """Wait for the first signal; stop every executor; end the process if the graceful path overruns."""
    while not _arrived:
        try:
            select.select([_wake[0]], [], [])
        except OSError:
            return
        _drain()
    deadline = time.monotonic() + GRACE_S
    threading.Thread(target=_stop_executors, name="qnn-stop", daemon=True).start()  # Dask may take its time
    time.sleep(max(0.0, deadline - time.monotonic()))
    _exit_now()


def _what() -> tuple[list[tuple[str, str]], str]:
    active = list(_running.values())
    tasks = sorted({task for task, _ in active}) or list(_last)
    where = f"during {', '.join(tasks)}" if tasks else "before any stage started"
    return active, f"\ninterrupted {where}; nothing half-written kept\n"


def _exit_now() -> None:
    """End the process at once, taking no lock (see the module's doc)."""
    for pgid in tuple(_children):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    active, line = _what()
    for _, out_dir in active:
        if out_dir:  # a task that writes no stage folder (dist, report's checks) has nothing here to sweep
            treelock.sweep(Path(out_dir))
    if next(_said) == 0:
        try:
            os.write(2, line.encode())
        except OSError:
            pass
    os._exit(exit_code())


def finish() -> None:
    """One line, release the tree, exit 130 or 143 (called when KeyboardInterrupt reaches the top)."""
    _stop_executors()
    active, line = _what()
    for _, out_dir in active:  # what the interrupted stages had begun (their records were removed first)
        if out_dir:  # dist and report's checks write no stage folder: Path("") would sweep the working directory
            treelock.sweep(Path(out_dir))
    if next(_said) == 0:
        sys.stderr.write(line)
        sys.stderr.flush()
    treelock.release()
    sys.stdout.flush()
    os._exit(exit_code())
