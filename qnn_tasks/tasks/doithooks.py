"""Promises of docs/trust.md that doit does not keep by itself, and the only module that changes doit's own code.

doit's plugin points carry what they can: the state file is a BACKEND plugin (tasks/statefile.py), tasks are
dicts, up-to-date checks are `uptodate` callables. What follows has no seam in doit 0.37 and is patched, once
per process, here and nowhere else (tests/test_doit_seams.py fails when a doit release changes a patched
function, and checks no other module patches doit or reads its private names):

- **A failed stage exits 1.** With `continue`, doit counts every task downstream of a failed one (an
  `UnmetDependency`) as an *error*, and a run with an error exits 2, which the docs keep for bugs. Here such a task
  fails as the stage that caused it did: exit 1, unless a real error (a task that raised) happened too.
  `Runner._handle_task_error`: the runner class is chosen inside `Run._execute`, so no plugin can subclass it.
- **The report is the last thing a run writes.** In a parallel run (`doit -n 2`, `-n 8 -P thread` with Dask) doit
  hands out a task with no dependencies as soon as a worker is free, so the report was rendered while stages still
  ran, and the documented gate failed after a green run. A task marked `meta: {RUNS_LAST: True}` (the report) now
  waits for every other task of the command line, and runs after them whether they failed or not, as it does in a
  serial run (it is last in `default_tasks`). `doit report` alone waits for nothing. `TaskControl.task_dispatcher`
  and `ExecNode.parent_status`: doit has no order-only dependency and builds its TaskControl inside `Run._execute`.
- **A full disk is one line.** The state-file plugin says a refused write once; `Runner.finish` makes such a run
  exit EXIT_IO (74) if nothing else failed.
- **A mistyped target names the nearest tasks.** `TaskControl._filter_tasks` raises doit's "Invalid parameter";
  it is the only place that knows both the name asked for and every task.
"""
from __future__ import annotations

import inspect
from typing import Any, Iterable

from doit.exceptions import InvalidCommand

from qnn_tasks.errors import EXIT_IO, ToolchainError
from qnn_tasks.tasks import statefile

RUNS_LAST = "runs_last"  # a task's meta flag: after every other selected task, failed or not

# (module, class, function, its parameters): every doit function replaced here. install() refuses to patch one
# whose parameters changed; tests/test_doit_seams.py also pins each one's source, so any change is looked at.
PATCHED = (
    ("doit.runner", "Runner", "_handle_task_error", ("self", "node", "base_fail")),
    ("doit.runner", "Runner", "finish", ("self",)),
    ("doit.control", "TaskControl", "task_dispatcher", ("self",)),
    ("doit.control", "ExecNode", "parent_status", ("self", "parent_node")),
    ("doit.control", "TaskControl", "_filter_tasks", ("self", "task_selection")),
)


class DoitChanged(ToolchainError):
    """The installed doit is not the one these patches were written against."""


def install() -> None:
    """Wrap doit's runner, dispatcher and task selection once (idempotent)."""
    from doit import control, runner

    if getattr(runner.Runner._handle_task_error, "qnn", False):
        return
    check_patched()
    handle_error = runner.Runner._handle_task_error
    finish = runner.Runner.finish
    dispatcher = control.TaskControl.task_dispatcher
    parent_status = control.ExecNode.parent_status
    filter_tasks = control.TaskControl._filter_tasks

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
        return EXIT_IO if statefile.STATE_FAILURES and result == runner.SUCCESS else result

    def _filter_tasks(self, task_selection):  # only the error path does any work
        try:
            return filter_tasks(self, task_selection)
        except InvalidCommand as err:
            if err.not_found is None or isinstance(err, UnknownTask):
                raise
            raise UnknownTask(err.not_found, nearest_tasks(err.not_found, self.tasks)) from None

    _handle_task_error.qnn = True
    runner.Runner.finish = _finish
    runner.Runner._handle_task_error = _handle_task_error
    control.TaskControl.task_dispatcher = task_dispatcher
    control.ExecNode.parent_status = _parent_status
    control.TaskControl._filter_tasks = _filter_tasks


def check_patched() -> None:
    """Refuse, in one line, a doit whose patched functions take other parameters than the ones written against."""
    import importlib

    import doit

    for module, owner, name, parameters in PATCHED:
        function = getattr(getattr(importlib.import_module(module), owner, None), name, None)
        found = tuple(inspect.signature(function).parameters) if callable(function) else None
        if found != parameters:
            raise DoitChanged(
                f"doit {doit.__version__}: {module}.{owner}.{name} is not the function qnn-npu-compile adjusts "
                f"(expected parameters {parameters}, found {found}); install the doit pinned in its pyproject.toml")


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


class UnknownTask(InvalidCommand):
    """doit's "Invalid parameter" for a name that is no task or target, plus the nearest task names."""

    def __init__(self, not_found: str, suggestions: list[str]) -> None:
        super().__init__(not_found=not_found)
        self.suggestions = suggestions

    def __str__(self) -> str:
        text = super().__str__().rstrip("\n")
        if self.suggestions:
            text += f"\nDid you mean: {', '.join(self.suggestions)}?"
        return text + "\n"


def nearest_tasks(name: str, known: Iterable[str], limit: int = 5) -> list[str]:
    """The task names closest to a mistyped one: whole names first, then the part after `group:`."""
    import difflib

    names = [n for n in known if not n.startswith("_regex_target")]
    found = difflib.get_close_matches(name, names, n=limit, cutoff=0.6)
    group, _, sub = name.partition(":")
    if sub and len(found) < limit:  # the group is right, the target is not: compare targets of that group
        subs = {n.partition(":")[2]: n for n in names if n.startswith(f"{group}:")}
        found += [subs[s] for s in difflib.get_close_matches(sub, list(subs), n=limit, cutoff=0.5)
                  if subs[s] not in found][:limit - len(found)]
    return found
