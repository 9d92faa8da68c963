"""On-demand doit tasks (created only when asked for, so `doit` and no-op runs never build them): one group per
ON_DEMAND row (plan/rows.py), its tasks made from the row's plans by TaskFactory.task like any stage's. What sets
a row apart is read from the row: `devices` (the call says whether the target was asked for by name), `own_record`
(the runner writes its own records, run here with the funnel's one-line errors). (cache:stats / cache:gc are in
tasks/project.py: doit parses a task's options only for tasks that exist at load.)
"""
from __future__ import annotations

import fnmatch
import sys
from typing import TYPE_CHECKING, Any, Callable

from doit.exceptions import InvalidTask, TaskFailed

from qnn_tasks.errors import QnnTasksError, machine_failure
from qnn_tasks.plan.matrix import on_demand_targets
from qnn_tasks.plan.stagedef import StageDef
from qnn_tasks.tasks.doithooks import UnknownTask, nearest_tasks

if TYPE_CHECKING:
    from qnn_tasks.run.calls import StageCall
    from qnn_tasks.tasks.project import TaskFactory


def on_demand_tasks(factory: TaskFactory, row: StageDef) -> Any:
    """The tasks of an on-demand group: one per target of the row that plans one (a dict for a project-wide row)."""
    made = []
    for target in on_demand_targets(factory.planner, row):
        plan = row.plan(factory.planner, row, target)
        if plan is not None:
            task = factory.task(row, plan, target)
            task["verbosity"] = 2
            made.append(task)
    if row.scope == "project":
        return made[0]
    # doit accepts any `<group>:<name>` of a delayed group and then runs nothing for a name it never made (exit 0):
    # a mistyped on-demand target is an error naming the nearest ones instead
    names = [f"{row.name}:{t['name']}" for t in made]
    for asked in sys.argv[1:]:
        if asked.startswith(f"{row.name}:") and asked not in names and not any(c in asked for c in "*?["):
            raise InvalidTask(str(UnknownTask(asked, nearest_tasks(asked, names))).strip())
    return (task for task in made)  # doit takes a generator or a dict, not a list


def asked_by_name(stage: str, name: str) -> bool:
    """`doit verify:<name>` (or a pattern matching it) on the command line, not just the `verify` group."""
    return any(arg.startswith(f"{stage}:") and fnmatch.fnmatchcase(f"{stage}:{name}", arg) for arg in sys.argv[1:])


def own_record_action(task: str, call: Callable[[], StageCall]) -> Callable[[], TaskFailed | None]:
    """The action of a row whose runner writes its own records (`own_record`): run here, its errors one line each, a
    machine's refusal (a full disk) one line too, Ctrl-C named after it, as the funnel does for every other stage."""
    def action() -> TaskFailed | None:
        from qnn_tasks.run import interrupts
        from qnn_tasks.run.calls import execute

        interrupts.running(task)
        try:
            made = call()
            interrupts.running(task, made.out_dir)
            execute(made)
        except QnnTasksError as err:
            return TaskFailed(f"{task}: {err}")
        except OSError as err:
            if not machine_failure(err):
                raise
            return TaskFailed(f"{task}: {machine_failure(err)}")
        finally:
            interrupts.running(None)
        return None
    return action
