"""What a stage is: a row of the stage table (StageDef), what it needs for one target (Plan), and where its record is
(record_path, the one place a record path is made).

A row says the stage's name, scope (graph / variant / chip), doc, the modules whose code is in
its key, whether it is heavy (native work: a child process or a Dask worker runs it), and its model.yaml section
if it has one (modelspec/stagesettings.py: the loader checks it, the plan digests it into the stage's key). Its
plan function turns one target into files read, files written, a key and lazily built call
arguments. Nothing here imports doit, onnx or numpy: planning happens on every `doit` invocation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from qnn_tasks.modelspec import specsplit
from qnn_tasks.plan.targets import ChipTarget, GraphTarget

if TYPE_CHECKING:  # the planner reads rows: importing it here would be a cycle
    from qnn_tasks.modelspec.stagesettings import StageSettings
    from qnn_tasks.plan.planner import Binding, Planner


@dataclass
class Plan:
    name: str                                  # doit subtask name
    out_dir: str                               # the stage's own folder
    file_dep: list[str]                        # files it reads
    outputs: list[str]                         # files it writes (the record vouches for them)
    key: str                                   # settings + code version (+ toolchain, SoC row), digested
    doc: str
    args: Callable[[], dict[str, Any]]         # call arguments, built when the task runs
    base: Callable[[], dict[str, Any]]         # fields every record of this target starts with
    binding: "Binding | None" = None           # the toolchain that runs it (toolchain stages)
    task_dep: list[str] = field(default_factory=list)
    skip: str | None = None                    # a visible skip (e.g. no fp16 on this chip)
    heavy: bool | None = None                  # overrides the row's (a judgement that runs model code)
    model: str = ""                            # the model it belongs to (its model.yaml's `stage_timeout`)
    record_file: str | None = None             # a record elsewhere (build/<stage>.json of a project-wide stage); ""
                                               # for none (dist: its package is its record)

    @property
    def record(self) -> str:
        if self.record_file is not None:
            return self.record_file
        return f"{self.out_dir}/{self.out_dir.rsplit('/', 1)[-1]}.json"


@dataclass(frozen=True)
class StageDef:
    """One stage: everything the task layer, the executors, the report and the code key need to know of it."""
    name: str
    scope: str                                 # "graph" | "variant" | "chip" | "pipeline" | "model" | "toolchain"
                                               # | "project" (one task, named by the stage alone)
    doc: str
    runner: str                                # "module:function" run with the StageCall; its imports are the code key
    plan: Callable[["Planner", "StageDef", Any], Plan | None] | None
    heavy: bool = True
    remote: bool = False                       # may run on a Dask worker (reads only build files)
    toolchain: bool = False                    # runs with (and is keyed by) a toolchain
    column: bool = True                        # a column of the report's stage table
    settings: StageSettings | None = None      # its section under graphs.<graph> in model.yaml, digested in its key
    # What sets an on-demand stage apart, each a fact the task layer and the funnel read (never the stage's name):
    cached: bool = True                        # the shared cache may restore it (not: it measures this machine)
    always: bool = False                       # runs whenever asked, no up-to-date check (phones come and go)
    marks_report: bool = True                  # its run may change the report's verdict: the last is superseded
    devices: bool = False                      # runs on attached phones: a `devices` subtask lists them first
    own_record: str = ""                       # why it writes its own record(s), not the funnel's (then its
                                               # runner runs in this process, its errors one line as the funnel's)

    def record_of(self, target: Any) -> str:
        """Where this stage's record for a target is (`record_path`: the one place a record path is made)."""
        return record_path(self.name, target)


SPLIT_MADE = ("export", "simplify", "cpucheck", "calibrate")  # what a split part's graph's split stage made for it


def record_path(stage: str, target: Any) -> str:
    """The record of `stage` for a target (graph, variant, chip or pipeline): <target dir>/<stage>/<stage>.json.

    A split part (`<graph>.part<N>`) has no export, simplify, cpucheck or calibrate of its own: its graph's split
    stage made its ONNX, inputs, reference and calibration set, so those facts are the graph's split record. The
    report, dist, the cache and the stages all ask here, so a part's records are found the same way by everyone.
    """
    if stage in SPLIT_MADE and isinstance(target, GraphTarget) and specsplit.is_part(target.graph):
        return f"{target.dir.parent / target.graph.split['of']}/split/split.json"
    folder = target.dir_str if isinstance(target, ChipTarget) else str(target.dir)
    return f"{folder}/{stage}/{stage}.json"
