"""Promises of docs/trust.md that doit 0.37 (pinned in pyproject.toml) does not keep by itself, set once per process.

- **A failed stage exits 1.** With `continue`, doit counts every task downstream of a failed one (an
  `UnmetDependency`) as an *error*, and a run with an error exits 2, which the docs keep for bugs. Here such a task
  fails as the stage that caused it did: exit 1, unless a real error (a task that raised) happened too.
- **The report is the last thing a run writes.** In a parallel run (`doit -n 2`, `-n 8 -P thread` with Dask) doit
  hands out a task with no dependencies as soon as a worker is free, so the report was rendered while stages still
  ran, and the documented gate failed after a green run. A task marked `meta: {RUNS_LAST: True}` (the report) now
  waits for every other task of the command line, and runs after them whether they failed or not, as it does in a
  serial run (it is last in `default_tasks`). `doit report` alone waits for nothing.
- **A full disk is one line.** doit's state file (`.doit.db`, sqlite) on a full, read-only or failing disk raised
  a traceback (exit 3) out of doit itself. Its writes are now said once in one line and the run exits non-zero
  (74 if nothing else failed). Losing them is safe: every build task's up-to-date check reads the stage's record,
  not doit's state, so the next run checks again and reruns what no record vouches for.
"""
from __future__ import annotations

import errno
import sqlite3
import sys
from typing import Any

from qnn_tasks.errors import EXIT_IO, machine_failure

RUNS_LAST = "runs_last"  # a task's meta flag: after every other selected task, failed or not


def install() -> None:
    """Wrap doit's runner and dispatcher once (idempotent)."""
    from doit import control, runner

    if getattr(runner.Runner._handle_task_error, "qnn", False):
        return
    from doit import dependency

    handle_error = runner.Runner._handle_task_error
    finish = runner.Runner.finish
    dispatcher = control.TaskControl.task_dispatcher
    parent_status = control.ExecNode.parent_status

    def _handle_task_error(self, node, base_fail) -> None:
        from doit.exceptions import UnmetDependency

        before = self.final_result
        handle_error(self, node, base_fail)
        if isinstance(base_fail, UnmetDependency) and before != runner.ERROR:
            self.final_result = runner.FAILURE  # the failed stage's consequence, not a bug

    def task_dispatcher(self) -> Any:
        for name in self.selected_tasks:
            task = self.tasks.get(name)
            if task is not None and runs_last(task):
                others = [n for n in self.selected_tasks if n != name and not _depends_on(self.tasks, n, name)]
                task.task_dep.extend(n for n in others if n not in task.task_dep)
        return dispatcher(self)

    def _parent_status(self, parent_node) -> None:
        if runs_last(self.task):
            return  # a failed (or ignored) task before it does not stop the report: it says what failed
        parent_status(self, parent_node)

    def _finish(self) -> int:
        result = finish(self)
        return EXIT_IO if STATE_FAILURES and result == runner.SUCCESS else result

    _handle_task_error.qnn = True
    runner.Runner.finish = _finish
    for method in ("dump", "remove", "remove_all"):
        setattr(dependency.SqliteDB, method, _state_write(getattr(dependency.SqliteDB, method)))
    runner.Runner._handle_task_error = _handle_task_error
    control.TaskControl.task_dispatcher = task_dispatcher
    control.ExecNode.parent_status = _parent_status


def runs_last(task: Any) -> bool:
    return bool((task.meta or {}).get(RUNS_LAST))


def _depends_on(tasks: dict[str, Any], name: str, target: str) -> bool:
    """Whether task `name` reaches `target` through task_dep (then waiting for it would be a cycle)."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current == target:
            return True
        if current in seen or current not in tasks:
            continue
        seen.add(current)
        todo.extend(tasks[current].task_dep)
    return False


STATE_FAILURES: list[str] = []  # the one line said for doit's state file (once per run)
_SQLITE_ERRNOS = (("full", errno.ENOSPC), ("readonly", errno.EROFS), ("i/o", errno.EIO))


def _state_write(method: Any) -> Any:
    """A SqliteDB write that says a refused write once, in one line, instead of raising out of doit."""
    def write(self, *args: Any) -> Any:
        try:
            return method(self, *args)
        except sqlite3.DatabaseError as err:  # OperationalError: "database or disk is full", "disk I/O error", ...
            code = next((n for word, n in _SQLITE_ERRNOS if word in str(err).lower()), None)
            if code is None:
                raise
            if not STATE_FAILURES:
                line = machine_failure(OSError(code, str(err), self.name))
                STATE_FAILURES.append(line)
                print(f"error: {line}; doit could not save which tasks are done, so the next run checks them "
                      f"again", file=sys.stderr, flush=True)
            return None
    return write
