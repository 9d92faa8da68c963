"""doit's state file (`.doit.db`, sqlite) as a doit BACKEND plugin: a refused write is one line, not a traceback.

Registered in pyproject.toml under the entry-point group `doit.BACKEND` as `qnn-sqlite3`; doit_config() selects it
when the installed package registers it. doit imports every registered backend on every command of every project
in this environment (its `PluginDict.to_dict()`), so this module stays cheap: sqlite3, doit's own dependency
module and errors.py, nothing of the project.

On a full, read-only or failing disk sqlite refuses the write ("database or disk is full", "disk I/O error"). Losing
it is safe: every build task's up-to-date check reads the stage's record, not doit's state, so the next run checks
again and reruns what no record vouches for. The run says so once and exits EXIT_IO if nothing else failed
(tasks/doithooks.py reads `STATE_FAILURES` when the run ends).
"""
from __future__ import annotations

import errno
import sqlite3
import sys
from typing import Any, Callable

from doit.dependency import SqliteDB

from qnn_tasks.errors import machine_failure

NAME = "qnn-sqlite3"  # the entry-point name in pyproject.toml
STATE_FAILURES: list[str] = []  # the one line said for doit's state file (once per run)
_SQLITE_ERRNOS = (("full", errno.ENOSPC), ("readonly", errno.EROFS), ("i/o", errno.EIO))


class StateFile(SqliteDB):
    """doit's sqlite3 backend whose writes say a refused write once, in one line, instead of raising out of doit."""

    desc = "sqlite3, a refused write (full disk, read-only, I/O error) is one line (qnn-npu-compile)"

    def dump(self) -> None:
        self._write(super().dump)

    def remove(self, task_id: str) -> None:
        self._write(super().remove, task_id)

    def remove_all(self) -> None:
        self._write(super().remove_all)

    def _write(self, method: Callable[..., Any], *args: Any) -> None:
        try:
            method(*args)
        except sqlite3.DatabaseError as err:  # OperationalError: "database or disk is full", "disk I/O error", ...
            code = next((n for word, n in _SQLITE_ERRNOS if word in str(err).lower()), None)
            if code is None:
                raise
            if not STATE_FAILURES:
                line = machine_failure(OSError(code, str(err), self.name))
                STATE_FAILURES.append(line)
                print(f"error: {line}; doit could not save which tasks are done, so the next run checks them "
                      f"again", file=sys.stderr, flush=True)
