"""Where doit meets the stage table: rows (plan/rows.py) x targets -> doit task dicts, and the report.

Every build task is the same shape: its action runs one StageCall through the funnel
(run/funnel.py); its `uptodate` is one `Fresh` check (the stage's key — settings, code version,
toolchain fingerprint, SoC row — is unchanged AND the files it wrote are as the last successful
run left them, so a damaged or hand-replaced output is rebuilt); files it reads are `file_dep`s.
On-demand groups (diagnose, socscheck, toolcheck, compat, verify, power, dist) are made from
their rows the same way, when asked for (tasks/ondemand.py). With tasks/ondemand.py, the only
modules that know doit.
"""
from __future__ import annotations

import gc
import os
import re
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from doit.exceptions import TaskFailed
from doit.loader import create_after

from qnn_tasks import envvalues
from qnn_tasks.errors import EXIT_BUSY, EXIT_IO, EXIT_SPEC, MachineError, QnnTasksError, machine_failure
from qnn_tasks.modelspec.load import load_project
from qnn_tasks.plan import paths
from qnn_tasks.plan.matrix import all_outputs, build_stage_defs, record_paths, targets_of
from qnn_tasks.plan.planner import Planner
from qnn_tasks.plan.rows import ON_DEMAND
from qnn_tasks.plan.stagedef import Plan, StageDef
from qnn_tasks.run import digests, interrupts, treelock
from qnn_tasks.run.status import Status
from qnn_tasks.tasks import doithooks, statefile
from qnn_tasks.tasks.doithooks import RUNS_LAST
from qnn_tasks.tasks.ondemand import asked_by_name, on_demand_tasks, own_record_action
from qnn_tasks.tasks.uptodate import (
    ChecksThisRun,
    Fresh,
    content_signature,
    content_signature_by_stamp,
    key_of,
)

if TYPE_CHECKING:
    from qnn_tasks.run.calls import StageCall

TOOLCHAIN_ENV = "QNN_TOOLCHAIN"
DEFAULT_TOOLCHAIN = "ort-qnn"
REPORT_DIR = Path(paths.REPORT_DIR)
REPORT_JSON = REPORT_DIR / "report.json"


def doit_config() -> dict[str, Any]:
    # sqlite3: a second doit process (or the report) can read the state while one runs; dbm can't.
    # default_tasks is filled in by TaskFactory.namespace(): every build stage in order, `report`
    # last, so that with `continue` doit runs it after every other task, failed or not.
    return {"default_tasks": [], "continue": True, "backend": statefile_backend(), "dep_file": ".doit.db"}


def statefile_backend() -> str:
    """doit's state-file backend: ours (a refused write is one line) when the installed package registers it."""
    from importlib.metadata import entry_points

    registered = any(point.name == statefile.NAME for point in entry_points(group="doit.BACKEND"))
    return statefile.NAME if registered else "sqlite3"  # run from a source tree without `pip install`


def project_tasks(root: Path) -> dict[str, Any]:
    """Everything dodo.py exposes to doit. A spec error or a busy tree prints one line and exits
    EXIT_SPEC / EXIT_BUSY (errors.py: distinct from doit's own codes)."""
    try:
        envvalues.check_all()  # a wrong value in the environment is one line before anything runs
        project = load_project(root, os.environ.get(TOOLCHAIN_ENV, DEFAULT_TOOLCHAIN))
        interrupts.install()  # `doit report` alone too: Ctrl-C is one line and exit 130 for every command
        if treelock.needs_lock(sys.argv):
            treelock.acquire(root, sys.argv)
        digests.persist(root)
        planner = Planner(project)
        doithooks.install()  # a failed stage exits 1; the report runs last; a mistyped target names the nearest
    except treelock.TreeBusy as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_BUSY) from None
    except QnnTasksError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(EXIT_SPEC) from None
    except OSError as err:  # the lock cannot be written: a full disk, a read-only tree, an I/O error
        print(f"error: {cannot_start(root, err)}", file=sys.stderr)
        raise SystemExit(EXIT_IO) from None
    for _, problem in project.broken:  # the bad model's one line, on every command; the rest still builds
        print(f"error: {problem}", file=sys.stderr)
    # Everything loaded so far (doit, our modules, the specs, the planner) lives until the process ends:
    # moving it out of the collector's reach keeps the full collections that thousands of task dicts
    # trigger from walking it again and again (~40 ms of a no-op run's task loading, measured). Once per
    # process: a test session that loads projects in-process keeps collecting its own garbage.
    first = gc.get_freeze_count() == 0
    if first:
        gc.freeze()
    return TaskFactory(planner, freeze=first).namespace()


def cannot_start(root: Path, err: OSError) -> str:
    """The one line for a run that cannot write its tree; the previous report is marked superseded (or removed) first,
    since the specs or samples may have changed since it was written and this run cannot verify them."""
    from qnn_tasks.run import reportmark

    try:
        reportmark.supersede(root, f": it could not start ({err.strerror})")
    except MachineError:
        pass  # read-only: nothing here can change the tree either
    return machine_failure(err) or f"{err.filename or root / 'build'}: {err.strerror or err}"


def report_not_written(err: OSError) -> str:
    """Why the report could not be written, in one line; the previous report.json is removed (needing no space)."""
    line = machine_failure(err) or f"{err.filename or REPORT_DIR}: {err.strerror or err}"
    try:
        REPORT_JSON.unlink(missing_ok=True)
    except OSError:
        return f"{line}; the previous {REPORT_JSON} could not be removed either: do not gate on it"
    return f"{line}; the previous {REPORT_JSON} was removed (it is not this run's verdict)"


# ------------------------------------------------------------------ checkers and actions

def no_cache() -> None:
    """The cache of a row that may not use the shared one (it measures this machine, not the build)."""
    return None


def stage_action(call: Callable[[], StageCall], base: Callable[[], dict[str, Any]], root: str,
                 cache: Callable[[], Any]) -> Callable[[], TaskFailed | None]:
    """The doit action of a build task: the funnel, its one line turned into a task failure."""
    def action() -> TaskFailed | None:
        from qnn_tasks.run import funnel as runstage

        message = runstage.run(call(), base(), root, cache())
        return TaskFailed(message) if message else None
    return action


FREEZE_EVERY = 1000  # tasks between two gc.freeze() calls while doit loads the tasks


def frozen_as_made(tasks: Iterator[dict], every: int = FREEZE_EVERY) -> Iterator[dict]:
    """The tasks, moving what is alive out of the collector's reach every `every` of them.

    doit keeps every task (and the closures and plans it holds) until the process ends, yet each full
    collection triggered while thousands of them are made walks all of them again: at 27,000 tasks that
    was about half of the loading time (measured with gc disabled). gc.freeze() is a list splice, and
    what it moves is what lives until exit anyway.
    """
    for count, task in enumerate(tasks, 1):
        yield task
        if count % every == 0:
            gc.freeze()
    gc.freeze()


def _task_function(name: str, doc: str, make: Callable[[], Any], freeze: bool = False) -> Callable[[], Any]:
    """A `task_<name>` function for doit: its docstring is the group's doc in `doit list`.

    freeze: the tasks of a generator are frozen out of the collector as they are made (frozen_as_made).
    """
    def task() -> Any:
        made = make()
        return frozen_as_made(made) if freeze and not isinstance(made, dict) else made
    task.__name__ = f"task_{name}"
    task.__doc__ = doc
    return task


# ------------------------------------------------------------------ tasks

class TaskFactory:
    def __init__(self, planner: Planner, freeze: bool = False) -> None:
        self.planner = planner
        self.freeze = freeze  # the doit process's own factory: freeze its tasks as made (not in a test session)
        self.project = planner.project
        self.root = str(planner.root)
        self._cache: list[Any] = []
        self.checks = ChecksThisRun()  # the build tasks' checkers tell the report's that outputs were checked
        from qnn_tasks.plan.freshness import SpecFacts

        self.spec = SpecFacts()  # the build tasks' keys and inputs, as they are planned: the report's check reads them
        self._cache_lock = threading.Lock()  # `-n 8 -P thread`: opened (and an unreachable store said) once

    def cache(self) -> Any:
        """The shared artifact cache ($QNN_CACHE or the first profile's `cache:`), opened on first use.

        None when none is configured, or when the store cannot be reached (said once; the build goes on).
        """
        with self._cache_lock:
            if not self._cache:
                from qnn_tasks.run.cache import for_build

                self._cache.append(for_build(self.project.toolchain.cache, self.project.toolchain.file))
        return self._cache[0]

    def time_limit(self, model: str) -> tuple[float, str]:
        """Seconds a stage of this model may take, and where that is set: its model.yaml's `stage_timeout`, else
        $QNN_STAGE_TIMEOUT, else the default (a limit only changes when a stage is stopped: it is in no task key)."""
        spec = self.planner.model_named(model) if model else None
        if spec is not None and spec.stage_timeout is not None:
            return spec.stage_timeout, f"{os.path.relpath(spec.file, self.root)}: stage_timeout"
        limit = envvalues.number(envvalues.STAGE_TIMEOUT)
        if os.environ.get(envvalues.STAGE_TIMEOUT, "").strip():
            return limit, f"${envvalues.STAGE_TIMEOUT}"
        return limit, f"the default (set `stage_timeout:` in the model's model.yaml, or ${envvalues.STAGE_TIMEOUT})"

    def namespace(self) -> dict[str, Any]:
        """DOIT_CONFIG and one `task_<stage>` function per stage, in build order."""
        stages = [(row.name, row.doc, lambda row=row: self.stage_tasks(row)) for row in build_stage_defs(self.planner)]
        stages.append(("report", "Write build/report/index.html, report.json and report.md from the stage records.",
                       self.report_task))
        if self.project.broken:  # first, so that `doit` fails (exit 1) however the rest goes
            stages.insert(0, ("spec", "Models whose model.yaml does not load: not buildable until it is fixed.",
                              self.broken_tasks))
        config = doit_config()
        config["default_tasks"] = [name for name, _, _ in stages]
        namespace: dict[str, Any] = {"DOIT_CONFIG": config}
        for name, doc, make in stages:
            namespace[f"task_{name}"] = _task_function(name, doc, make, self.freeze)
        # not in the default run, but created at load: doit parses options (cache:gc --keep-days) only of tasks
        # that exist then
        namespace["task_cache"] = _task_function("cache", "The shared artifact cache: cache:stats, cache:gc "
                                                 "--keep-days N (on demand).", self.cache_tasks)
        # a delayed group may be made after tasks ran in this process: frozen only where none run (`doit list`)
        freeze_delayed = self.freeze and not treelock.needs_lock(sys.argv)
        for row in ON_DEMAND:  # created only when asked for: `doit` and no-op runs skip them
            namespace[f"task_{row.name}"] = create_after()(_task_function(
                row.name, row.doc, lambda row=row: on_demand_tasks(self, row), freeze_delayed))
        return namespace

    def stage_tasks(self, row: StageDef) -> Iterator[dict]:
        for target in targets_of(self.planner, row):
            plan = row.plan(self.planner, row, target)
            if plan is not None:
                self.spec.add(row.name, plan)
                yield self.task(row, plan, target)

    def task(self, row: StageDef, plan: Plan, target: Any = None) -> dict[str, Any]:
        if plan.skip:
            return self._skip(row, plan)
        record = plan.record
        binding = plan.binding if row.toolchain else None
        label = f"{row.name}:{plan.name}" if plan.name else row.name

        def call(row: StageDef = row, plan: Plan = plan) -> StageCall:
            from qnn_tasks.run.calls import StageCall  # only when a task runs: not on a no-op `doit`
            from qnn_tasks.toolchains.calltoolchain import use_toolchain

            profile = binding.profile_dict(self.planner.root) if binding else None
            if binding:
                use_toolchain(profile, binding.toolchain)  # in this process: the planner's own object
            limit, limit_from = self.time_limit(plan.model)
            args = plan.args()
            if row.devices:  # no phone of the chip fails a target asked for by name, skips one of the group
                args["required"] = asked_by_name(row.name, plan.name)
            return StageCall(stage=row.name, target=plan.name, args=args, inputs=plan.file_dep,
                             out_dir=plan.out_dir, outputs=plan.outputs, record=record, key=plan.key,
                             toolchain=profile, heavy=row.heavy if plan.heavy is None else plan.heavy,
                             remote=row.remote, runner=row.runner, time_limit=limit, time_limit_from=limit_from,
                             marks_report=row.marks_report)

        def base(plan: Plan = plan) -> dict[str, Any]:
            from qnn_tasks.plan import freshness  # what the record is made from: the report compares it with today's

            return {**plan.base(), "made_from": freshness.expected(self.planner, plan, target)}

        if row.own_record:
            action = own_record_action(label, call)
        else:
            action = stage_action(call, base, self.root, self.cache if row.cached else no_cache)
        task = {"actions": [action], "file_dep": plan.file_dep, "targets": plan.outputs + ([record] if record else []),
                "uptodate": [False] if row.always else [Fresh(plan.key, plan.outputs + [record], record, self.checks)],
                "doc": plan.doc, "clean": True}
        if plan.name:  # a project-wide stage is one task, named by its group
            task["name"] = plan.name
        if plan.task_dep:
            task["task_dep"] = plan.task_dep
        return task

    @staticmethod
    def _skip(row: StageDef, plan: Plan) -> dict[str, Any]:
        def action(plan: Plan = plan) -> TaskFailed | None:
            from qnn_tasks.run.records import write

            if not row.own_record:  # a stage that writes its own records keeps its earlier one (a phone's results)
                try:
                    write(plan.record, {"stage": row.name, "target": plan.name, **plan.base(), "status": Status.SKIPPED,
                                        "reason": plan.skip, "seconds": 0.0})
                except OSError as err:  # a full disk: one line, as for any stage
                    return TaskFailed(f"{row.name}:{plan.name}: {machine_failure(err) or err}")
            print(f"{row.name}:{plan.name}: skipped: {plan.skip}")
            return None

        if row.own_record:
            return {"name": plan.name, "actions": [action], "uptodate": [False], "doc": f"SKIPPED: {plan.skip}"}
        return {"name": plan.name, "actions": [action], "targets": [plan.record],
                "uptodate": [Fresh(key_of({"skip": plan.skip}), [plan.record], plan.record)],
                "doc": f"SKIPPED: {plan.skip}", "clean": True}

    def broken_tasks(self) -> Iterator[dict]:
        """One failing task per model whose spec does not load: its one line, and a non-zero `doit`."""
        for model, problem in self.project.broken:
            name = re.sub(r"[^A-Za-z0-9._-]", "_", model)  # the folder name itself may be what is wrong with it
            message = f"spec:{name}: not buildable: {problem}"
            yield {"name": name, "actions": [lambda message=message: TaskFailed(message)], "uptodate": [False],
                   "doc": f"NOT BUILDABLE: {problem}"}

    # ---------------------------------------------------------- the shared cache (doit cache:stats / cache:gc)
    def cache_tasks(self) -> Iterator[dict]:
        def store():
            from qnn_tasks.run.cache import configured

            cache = configured(self.project.toolchain.cache, self.project.toolchain.file)  # unreachable: one line
            if cache is None:
                raise QnnTasksError("no cache store configured (fix: set QNN_CACHE=<folder or fsspec URL>, or `cache:` "
                                    "in the toolchain profile)")
            return cache

        def stats() -> TaskFailed | None:
            try:
                s = store().stats()
            except (QnnTasksError, OSError) as err:
                return TaskFailed(f"cache:stats: {err}")
            stages = ", ".join(f"{k} {v}" for k, v in s["by_stage"].items()) or "none"
            bad = f" (+ {s['bad']} unusable: `doit cache:gc` drops them)" if s["bad"] else ""
            print(f"cache {s['store']}: {s['entries']} entries ({stages}){bad}, {s['blobs']} blobs, "
                  f"{s['bytes'] / 2**20:.1f} MiB; built {s['oldest'] or '-'} .. {s['newest'] or '-'}")
            return None

        def gc(keep_days: float) -> TaskFailed | None:
            try:
                result = store().gc(keep_days)
            except (QnnTasksError, OSError) as err:
                return TaskFailed(f"cache:gc: {err}")
            print(f"cache:gc: kept {result['entries_kept']} entries, dropped {result['entries_dropped']} older than "
                  f"{keep_days:g} days and {result['entries_bad']} unusable, removed {result['blobs_removed']} unused blobs "
                  f"({result['bytes_freed'] / 2**20:.1f} MiB)")
            return None

        yield {"name": "stats", "actions": [stats], "uptodate": [False], "verbosity": 2,
               "doc": "entries, blobs and size of the shared cache ($QNN_CACHE)"}
        yield {"name": "gc", "actions": [gc], "uptodate": [False], "verbosity": 2,
               "params": [{"name": "keep_days", "long": "keep-days", "type": float, "default": 30.0,
                           "help": "keep entries built within this many days"}],
               "doc": "drop cache entries older than --keep-days N (default 30) and unused blobs"}

    # ---------------------------------------------------------- report
    def report_task(self) -> dict[str, Any]:
        planner = self.planner

        def render() -> TaskFailed | None:
            interrupts.running("report", str(REPORT_DIR))  # Ctrl-C here: "interrupted during report", exit 130
            try:
                from qnn_tasks.report import gather as report
                from qnn_tasks.report import render

                data = report.collect(planner)
                paths = report.write(REPORT_DIR, data)
            except OSError as err:  # a full disk, a read-only tree: the old report must not stand in for this one
                return TaskFailed(f"report: {report_not_written(err)}")
            finally:
                interrupts.running(None)
            print(f"report: {paths['html']} ({render.summary_line(data)})")
            if data["summary"]["ok"]:  # the field the documented gate reads: the exit code is the same function
                return None
            return TaskFailed("report: " + "; ".join(report.gate_problems(data)))

        def outputs_signature() -> str:
            return content_signature(all_outputs(planner))

        def records_unchanged(task, values) -> bool:
            # No file_dep on the records: a failed stage must not block the report of it. A damaged output
            # re-renders it too (to show `stale`): in a build, the stage tasks' own checks have caught it
            # already; for `doit report` alone the outputs are checked here. By content (digests cached by
            # size, mtime, inode and ctime): a file replaced with its size and mtime kept (`cp -p`) counts,
            # a copied tree does not. The report itself too: a run that marked it superseded re-renders it.
            interrupts.running("report")  # from here on, Ctrl-C is "interrupted during report" (checks take time)
            interrupts.running(None)
            targets = "\n".join([f"{ct.name}:{ct.skip_reason}" for ct in planner.chips]  # added/removed targets too
                                + [f"broken {m}: {e}" for m, e in planner.project.broken])
            from qnn_tasks.plan import freshness

            # what the verdicts are judged against: every task's key (settings, code, toolchain) and the files they
            # read, so an edited threshold or source re-renders the report (to show `stale`) without a build
            keys, inputs = self.spec.facts() if self.spec.count else freshness.spec_facts(planner)
            input_stamps, input_content = content_signature_by_stamp(inputs, values.get("inputs_stamp"),
                                                                     values.get("inputs_content"))
            context = f"{renderer_code()}:{key_of({'targets': targets})}:{keys}:{input_content}"
            stamps, records = content_signature_by_stamp(record_paths(planner), values.get("records_stamp"),
                                                         values.get("records_content"))
            signature = f"{records}:{context}"

            def save() -> dict[str, str]:
                report_stamp, report = content_signature_by_stamp([str(REPORT_JSON)], None, None)
                inputs_now = content_signature_by_stamp(inputs, input_stamps, input_content)
                return {"records": signature, "records_stamp": stamps, "records_content": records,
                        "inputs_stamp": inputs_now[0], "inputs_content": inputs_now[1],
                        "outputs": outputs_signature(), "report": report, "report_stamp": report_stamp}

            task.value_savers.append(save)
            if values.get("records") != signature or not REPORT_JSON.is_file():
                return False
            if content_signature_by_stamp([str(REPORT_JSON)], values.get("report_stamp"),
                                          values.get("report"))[1] != values.get("report"):
                return False
            return bool(self.checks) or values.get("outputs") == outputs_signature()

        return {"actions": [render], "uptodate": [records_unchanged], "verbosity": 2, "meta": {RUNS_LAST: True},
                "targets": [str(REPORT_DIR / n) for n in ("index.html", "report.json", "report.md")],
                "doc": "Write build/report/index.html, report.json and report.md from the stage records", "clean": True}




def renderer_code() -> str:
    """The report's code version: a new renderer or template re-renders the report (and only the report)."""
    from qnn_tasks import codekeys

    return codekeys.digest(("qnn_tasks.report.gather",), ("report/templates/report.html.j2",))
