"""A stage call is data: the stage's name and JSON-able arguments, run here by `execute`.

The task layer builds calls from the stage table; an executor (run/executors/) decides where `execute` runs: in this process,
in a child process (quick Ctrl-C, a pinned toolchain environment) or on a Dask worker. Paths in
a call are relative to the project root, which is the working directory wherever it runs.
Nothing here knows doit.
"""
from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from qnn_tasks.modelspec import specjson
from qnn_tasks.modelspec.project import GraphSpec, Soc


@dataclass(frozen=True)
class StageCall:
    stage: str                       # e.g. "context"
    target: str                      # the doit subtask name, e.g. "vad-SM8650"
    args: dict[str, Any]             # the stage's arguments (JSON-able)
    inputs: list[str]                # files it reads (project-relative): cache key, shipped to remote workers
    out_dir: str                     # the stage's own folder: every file in it is the stage's output
    outputs: list[str]               # the files the record vouches for
    record: str                      # where the record goes (inside out_dir)
    key: str                         # digest of settings + code version (+ toolchain fingerprint, SoC row)
    toolchain: dict[str, Any] | None = None   # profile (specjson) for toolchain stages, else None
    heavy: bool = True               # native work: run where Ctrl-C can stop it (child process / worker)
    remote: bool = False             # may run on a Dask worker (needs no model code)
    env: dict[str, str] = field(default_factory=dict)   # extra environment (e.g. QNN_SDK_ROOT)
    runner: str = ""                 # "module:function" from the stage table, imported where the call runs
    time_limit: float | None = None  # seconds it may take in a child process, then the child is killed
    time_limit_from: str = ""        # where the limit is set (model.yaml's stage_timeout, $QNN_STAGE_TIMEOUT)
    marks_report: bool = True        # its run may change the report's verdict: the last report is superseded

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "StageCall":
        return cls(**json.loads(text))


# ------------------------------------------------------------------ argument decoding

def graph(args: dict[str, Any]) -> GraphSpec:
    return specjson.graph_from_dict(args["graph"])


def soc(args: dict[str, Any]) -> Soc:
    return specjson.soc_from_dict(args["soc"])


def path(args: dict[str, Any], name: str) -> Path | None:
    value = args.get(name)
    return None if value is None else Path(value)


# ------------------------------------------------------------------ running one

def runner(name: str) -> Callable[[StageCall], dict[str, Any]]:
    """The function a `module:function` string (a stage table row's runner) names, imported now."""
    module, _, function = name.partition(":")
    if not module or not function:
        raise ValueError(f"stage runner '{name}' is not 'module:function'")
    return getattr(importlib.import_module(module), function)


def execute(call: StageCall) -> dict[str, Any]:
    """Run the call in this process (working directory: the project root); return the stage's record fields."""
    if not call.runner:
        raise ValueError(f"stage '{call.stage}' has no runner")
    return runner(call.runner)(call)
