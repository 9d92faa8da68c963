"""Where doit meets the stage table: rows (plans.py) x targets -> doit task dicts, and the report.

Every build task is the same shape: its action runs one StageCall through the funnel
(runstage.py); its `uptodate` is one `Fresh` check (the stage's key — settings, code version,
toolchain fingerprint, SoC row — is unchanged AND the files it wrote are as the last successful
run left them, so a damaged or hand-replaced output is rebuilt); files it reads are `file_dep`s.
On-demand tasks (diagnose, socscheck, toolcheck, verify, power, compat, cache) live in
tasks_ondemand.py. With tasks_ondemand.py, the only modules that know doit.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from doit.exceptions import TaskFailed
from doit.loader import create_after

from . import digests, interrupts, treelock
from .errors import QnnTasksError
from .plans import Plan, Planner, StageDef, all_outputs, build_stage_defs, record_paths, targets_of
from .spec import load_project

if TYPE_CHECKING:
    from .calls import StageCall

TOOLCHAIN_ENV = "QNN_TOOLCHAIN"
DEFAULT_TOOLCHAIN = "ort-qnn"
REPORT_DIR = Path("build") / "report"
REPORT_JSON = REPORT_DIR / "report.json"


def doit_config() -> dict[str, Any]:
    # sqlite3: a second doit process (or the report) can read the state while one runs; dbm can't.
    # default_tasks is filled in by TaskFactory.namespace(): every build stage in order, `report`
    # last, so that with `continue` doit runs it after every other task, failed or not.
    return {"default_tasks": [], "continue": True, "backend": "sqlite3", "dep_file": ".doit.db"}


def project_tasks(root: Path) -> dict[str, Any]:
    """Everything dodo.py exposes to doit. A spec error or a busy tree prints one line and exits 2 / 3."""
    try:
        project = load_project(root, os.environ.get(TOOLCHAIN_ENV, DEFAULT_TOOLCHAIN))
        interrupts.install()  # `doit report` alone too: Ctrl-C is one line and exit 130 for every command
        if treelock.needs_lock(sys.argv):
            treelock.acquire(root, sys.argv)
        digests.persist(root)
        planner = Planner(project)
    except treelock.TreeBusy as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(3) from None
    except QnnTasksError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    # Everything loaded so far (doit, our modules, the specs, the planner) lives until the process ends:
    # moving it out of the collector's reach keeps the full collections that thousands of task dicts
    # trigger from walking it again and again (~40 ms of a no-op run's task loading, measured). Once per
    # process: a test session that loads projects in-process keeps collecting its own garbage.
    if gc.get_freeze_count() == 0:
        gc.freeze()
    return TaskFactory(planner).namespace()


# ------------------------------------------------------------------ checkers and actions

def _stats(paths: list[str]) -> Iterator[tuple[str, os.stat_result | None]]:
    for path in paths:
        try:
            yield path, os.stat(path)
        except FileNotFoundError:
            yield path, None


def _content_signature(paths: list[str]) -> str:
    """The files' contents, one digest: each file is hashed once (digests.py caches by size, mtime, inode, ctime)."""
    from .digests import sha256

    h = hashlib.md5()
    for path, st in _stats(paths):
        h.update(f"{path}\0{sha256(path) if st is not None else '-'}\n".encode())
    return h.hexdigest()


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


_checked_this_run: list[bool] = []  # set once a build task's outputs were checked in this doit run


class Fresh:
    """doit `uptodate`: the stage's key is unchanged and its files are what the last success left.

    Like doit's own `config_changed`, plus the outputs: a target truncated, replaced or deleted by
    hand makes its task run again. Size and mtime must be as saved; when a file's inode or ctime
    is not (`cp -p`, `rsync -t` and `tar` keep size and mtime, not these; so does copying the
    whole tree), the outputs must still have the digests their record names, for this target.
    """

    def __init__(self, key: str, paths: list[str], record: str | None = None) -> None:
        self.key = key
        self.paths = paths
        self.record = record

    def __call__(self, task, values) -> bool:
        _checked_this_run[:] = [True]
        task.value_savers.append(lambda: dict(zip(("files", "ids"), _signatures(self.paths)), key=self.key))
        if values.get("key") != self.key:
            return False
        stored = values.get("files")
        if isinstance(stored, str):  # saved by a version before 2026-12 (an md5): compare it its way
            return stored == _md5_signature(self.paths) and self.vouched(task.name)
        times, ids = _signatures(self.paths)
        if stored != times:
            return False
        return values.get("ids") == ids or self.vouched(task.name)

    def vouched(self, task_name: str) -> bool:
        """The record is this task's, passed, and names every output with the digest it has now."""
        if self.record is None:
            return False
        from . import records

        record = records.read(self.record)
        stage, _, target = task_name.partition(":")
        if record is None or record.get("stage") != stage or record.get("target") != target:
            return False
        if record.get("status") == "skipped":
            return True
        outputs = [p for p in self.paths if p != self.record]
        files = record.get("files")
        if record.get("status") not in ("passed", "warning") or not isinstance(files, dict):
            return False
        return set(outputs) <= set(files) and records.problems(record, self.record) == []


def _md5_signature(paths: list[str]) -> str:
    """The stamp older versions saved, so an upgrade does not rebuild every up-to-date target once."""
    parts = [f"{path}:{st.st_mtime_ns}:{st.st_size}" for path, st in _stats(paths) if st]
    return hashlib.md5("\n".join(parts).encode()).hexdigest()


def stage_action(call: Callable[[], StageCall], base: Callable[[], dict[str, Any]], root: str,
                 cache: Callable[[], Any]) -> Callable[[], TaskFailed | None]:
    """The doit action of a build task: the funnel, its one line turned into a task failure."""
    def action() -> TaskFailed | None:
        from . import runstage

        message = runstage.run(call(), base(), root, cache())
        return TaskFailed(message) if message else None
    return action


def _task_function(name: str, doc: str, make: Callable[[], Any]) -> Callable[[], Any]:
    """A `task_<name>` function for doit: its docstring is the group's doc in `doit list`."""
    def task() -> Any:
        return make()
    task.__name__ = f"task_{name}"
    task.__doc__ = doc
    return task


def _key(data: dict[str, Any]) -> str:
    return hashlib.md5(json.dumps(data, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------ tasks

class TaskFactory:
    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.project = planner.project
        self.root = str(planner.root)
        self._cache: list[Any] = []

    def cache(self) -> Any:
        """The shared artifact cache ($QNN_CACHE or the first profile's `cache:`), opened on first use."""
        if not self._cache:
            from .cache import configured

            self._cache.append(configured(self.project.toolchain.cache))
        return self._cache[0]

    def namespace(self) -> dict[str, Any]:
        """DOIT_CONFIG and one `task_<stage>` function per stage, in build order."""
        stages = [(row.name, row.doc, lambda row=row: self.stage_tasks(row)) for row in build_stage_defs(self.planner)]
        stages.append(("report", "Write build/report/index.html, report.json and report.md from the stage records.",
                       self.report_task))
        config = doit_config()
        config["default_tasks"] = [name for name, _, _ in stages]
        namespace: dict[str, Any] = {"DOIT_CONFIG": config}
        for name, doc, make in stages:
            namespace[f"task_{name}"] = _task_function(name, doc, make)
        # not in the default run, but created at load: doit parses options (cache:gc --keep-days) only of tasks
        # that exist then
        namespace["task_cache"] = _task_function("cache", "The shared artifact cache: cache:stats, cache:gc "
                                                 "--keep-days N (on demand).", self.cache_tasks)
        for name, doc in ON_DEMAND:  # created only when asked for: `doit` and no-op runs skip them
            namespace[f"task_{name}"] = create_after()(_task_function(name, doc, lambda name=name: _on_demand(self, name)))
        return namespace

    def stage_tasks(self, row: StageDef) -> Iterator[dict]:
        for target in targets_of(self.planner, row):
            plan = row.plan(self.planner, row, target)
            if plan is not None:
                yield self.task(row, plan)

    def task(self, row: StageDef, plan: Plan) -> dict[str, Any]:
        if plan.skip:
            return self._skip(row, plan)
        record = plan.record
        binding = plan.binding if row.toolchain else None

        def call(row: StageDef = row, plan: Plan = plan) -> StageCall:
            from .calls import StageCall, use_toolchain  # only when a task runs: not on a no-op `doit`

            profile = binding.profile_dict(self.planner.root) if binding else None
            if binding:
                use_toolchain(profile, binding.toolchain)  # in this process: the planner's own object
            return StageCall(stage=row.name, target=plan.name, args=plan.args(), inputs=plan.file_dep,
                             out_dir=plan.out_dir, outputs=plan.outputs, record=record, key=plan.key,
                             toolchain=profile, heavy=row.heavy if plan.heavy is None else plan.heavy,
                             remote=row.remote)

        task = {"name": plan.name, "actions": [stage_action(call, plan.base, self.root, self.cache)],
                "file_dep": plan.file_dep, "targets": plan.outputs + [record],
                "uptodate": [Fresh(plan.key, plan.outputs + [record], record)], "doc": plan.doc, "clean": True}
        if plan.task_dep:
            task["task_dep"] = plan.task_dep
        return task

    @staticmethod
    def _skip(row: StageDef, plan: Plan) -> dict[str, Any]:
        def action(plan: Plan = plan) -> None:
            from .records import write

            write(plan.record, {"stage": row.name, "target": plan.name, **plan.base(), "status": "skipped",
                                "reason": plan.skip, "seconds": 0.0})
            print(f"{row.name}:{plan.name}: skipped: {plan.skip}")

        return {"name": plan.name, "actions": [action], "targets": [plan.record],
                "uptodate": [Fresh(_key({"skip": plan.skip}), [plan.record], plan.record)],
                "doc": f"SKIPPED: {plan.skip}", "clean": True}

    # ---------------------------------------------------------- the shared cache (doit cache:stats / cache:gc)
    def cache_tasks(self) -> Iterator[dict]:
        def store():
            cache = self.cache()
            if cache is None:
                raise QnnTasksError("no cache store configured (fix: set QNN_CACHE=<folder or fsspec URL>, or `cache:` "
                                    "in the toolchain profile)")
            return cache

        def stats() -> TaskFailed | None:
            try:
                s = store().stats()
            except QnnTasksError as err:
                return TaskFailed(f"cache:stats: {err}")
            stages = ", ".join(f"{k} {v}" for k, v in s["by_stage"].items()) or "none"
            print(f"cache {s['store']}: {s['entries']} entries ({stages}), {s['blobs']} blobs, "
                  f"{s['bytes'] / 2**20:.1f} MiB; built {s['oldest'] or '-'} .. {s['newest'] or '-'}")
            return None

        def gc(keep_days: float) -> TaskFailed | None:
            try:
                result = store().gc(keep_days)
            except QnnTasksError as err:
                return TaskFailed(f"cache:gc: {err}")
            print(f"cache:gc: kept {result['entries_kept']} entries, dropped {result['entries_dropped']} older than "
                  f"{keep_days:g} days, removed {result['blobs_removed']} unused blobs "
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
                from . import report

                data = report.collect(planner)
                paths = report.write(REPORT_DIR, data)
            finally:
                interrupts.running(None)
            print(f"report: {paths['html']} ({report.summary_line(data)})")
            problems = report.gate_problems(data)
            return TaskFailed("report: " + "; ".join(problems)) if problems else None

        def outputs_signature() -> str:
            return _content_signature(all_outputs(planner))

        def records_unchanged(task, values) -> bool:
            # No file_dep on the records: a failed stage must not block the report of it. A damaged output
            # re-renders it too (to show `stale`): in a build, the stage tasks' own checks have caught it
            # already; for `doit report` alone the outputs are checked here. By content (digests cached by
            # size, mtime, inode and ctime): a file replaced with its size and mtime kept (`cp -p`) counts,
            # a copied tree does not. The report itself too: a run that marked it superseded re-renders it.
            interrupts.running("report")  # from here on, Ctrl-C is "interrupted during report" (checks take time)
            interrupts.running(None)
            targets = "\n".join(f"{ct.name}:{ct.skip_reason}" for ct in planner.chips)  # added/removed targets too
            signature = f"{_content_signature(record_paths(planner) + _renderer_files())}:{_key({'targets': targets})}"
            task.value_savers.append(lambda: {"records": signature, "outputs": outputs_signature(),
                                              "report": _content_signature([str(REPORT_JSON)])})
            if values.get("records") != signature or not REPORT_JSON.is_file():
                return False
            if values.get("report") != _content_signature([str(REPORT_JSON)]):
                return False
            return bool(_checked_this_run) or values.get("outputs") == outputs_signature()

        return {"actions": [render], "uptodate": [records_unchanged], "verbosity": 2,
                "targets": [str(REPORT_DIR / n) for n in ("index.html", "report.json", "report.md")],
                "doc": "Write build/report/index.html, report.json and report.md from the stage records", "clean": True}


ON_DEMAND = [
    ("diagnose", "Find the first node where the NPU diverges from the CPU, and why (on demand, not in the default run)."),
    ("socscheck", "Compile a tiny model for every SoC row and confirm the binary's socModel/arch (on demand)."),
    ("toolcheck", "Run each toolchain's dependency checks and say clearly what is missing (on demand)."),
    ("compat", "Load every built binary on every configured runtime's simulator: which QNN runtimes load it, and do "
               "outputs still match (on demand)."),
    ("verify", "Run each chip's binaries on the attached phones (adb) and compare with the CPU; latency, CPU use "
               "(on demand)."),
    ("power", "Fixed-length run on an attached phone with battery level before/after (on demand, opt-in)."),
]


def _on_demand(factory: TaskFactory, name: str) -> Any:
    """The tasks of an on-demand group, from tasks_ondemand.py (imported only when one is asked for)."""
    from .tasks_ondemand import OnDemand

    return getattr(OnDemand(factory), f"{name}_tasks" if name != "compat" else "compat_task")()


def _renderer_files() -> list[str]:
    """A new report version re-renders too (and only the report)."""
    here = Path(__file__).parent
    return [str(here / "report.py"), str(here / "report_render.py"), str(here / "templates" / "report.html.j2")]
