"""Ctrl-C: stop at once, say one line, keep nothing half-written, exit 130.

doit itself lets KeyboardInterrupt escape as a traceback after saving its state. Here the first
SIGINT stops every child process and remote call (executors.stop_all), the stage funnel removes
what the interrupted stages had begun, doit saves the state of the tasks that did finish, and
the uncaught KeyboardInterrupt ends in one line instead of a traceback.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

EXIT_CODE = 130
_running: dict[int, tuple[str, str]] = {}  # thread id -> ("stage:target", its out_dir) being run
_last: list[str] = []


def install() -> None:
    """Take over SIGINT and the top-level exception hook (main thread only; idempotent)."""
    if threading.current_thread() is not threading.main_thread() or getattr(install, "done", False):
        return
    signal.signal(signal.SIGINT, _on_sigint)
    signal.signal(signal.SIGTERM, _on_sigint)
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


def _on_sigint(signum, frame) -> None:
    from qnn_tasks.run import executors

    executors.stop_all()
    raise KeyboardInterrupt


def finish() -> None:
    """One line, release the tree, exit 130 (called when KeyboardInterrupt reaches the top)."""
    from qnn_tasks.run import executors
    from qnn_tasks.run import treelock

    executors.stop_all()
    active = list(_running.values())
    for _, out_dir in active:  # what the interrupted stages had begun (their records were removed first)
        treelock.sweep(Path(out_dir))
    tasks = sorted({task for task, _ in active}) or _last
    where = f"during {', '.join(tasks)}" if tasks else "before any stage started"
    print(f"\ninterrupted {where}; nothing half-written kept", file=sys.stderr, flush=True)
    treelock.release()
    sys.stdout.flush()
    os._exit(EXIT_CODE)
