"""A stage call is data: the stage's name and JSON-able arguments, run here by `execute`.

`tasks.py` builds calls; an executor (executors/) decides where `execute` runs: in this process,
in a child process (quick Ctrl-C, a pinned toolchain environment) or on a Dask worker. Paths in
a call are relative to the project root, which is the working directory wherever it runs.
Nothing here knows doit.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import specjson
from .spec import GraphSpec, Soc


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


_TOOLCHAINS: dict[str, Any] = {}  # profile (JSON) -> toolchain object, one per process


def use_toolchain(profile: dict[str, Any], chain: Any) -> None:
    """Calls run in this process use the planner's own toolchain object for this profile."""
    _TOOLCHAINS[json.dumps(profile, sort_keys=True)] = chain


def toolchain(call: StageCall):
    """The call's toolchain object, built once per process and profile."""
    if call.toolchain is None:
        raise ValueError(f"stage {call.stage} has no toolchain")
    key = json.dumps(call.toolchain, sort_keys=True)
    if key not in _TOOLCHAINS:
        from . import toolchains

        _TOOLCHAINS[key] = toolchains.from_profile(specjson.profile_from_dict(call.toolchain))
    return _TOOLCHAINS[key]


# ------------------------------------------------------------------ the stages

def _export(call: StageCall) -> dict[str, Any]:
    from .stages import export

    a = call.args
    return export.run(graph(a), path(a, "source"), Path(a["out"]))


def _simplify(call: StageCall) -> dict[str, Any]:
    from .stages import simplify

    a = call.args
    return simplify.run(graph(a), Path(a["exported"]), Path(a["out"]))


def _lint(call: StageCall) -> dict[str, Any]:
    from .stages import lint

    return lint.run(graph(call.args), Path(call.args["simplified"]))


def _cpucheck(call: StageCall) -> dict[str, Any]:
    from .stages import cpucheck

    a = call.args
    return cpucheck.run(graph(a), path(a, "source"), Path(a["simplified"]), Path(a["inputs"]), Path(a["reference"]))


def _calibrate(call: StageCall) -> dict[str, Any]:
    from .stages import calibrate

    a = call.args
    return calibrate.run(graph(a), path(a, "source"), Path(a["out"]))


def _graph_stage(call: StageCall) -> dict[str, Any]:
    """A toolchain's per-variant stage (quantize; convert, modellib)."""
    from .toolchains.base import StageInput

    a = call.args
    chain = toolchain(call).graph_stages(a["precision"])
    stage = next(s for s in chain if s.name == call.stage)
    return stage.run(StageInput(graph=graph(a), precision=a["precision"], source=Path(a["source"]),
                                out_dir=Path(call.out_dir), calibration=path(a, "calibration")))


def _config(call: StageCall) -> dict[str, Any]:
    a = call.args
    return toolchain(call).write_config(graph(a), a["precision"], soc(a), Path(call.out_dir))


def _context(call: StageCall) -> dict[str, Any]:
    a = call.args
    return toolchain(call).compile(graph(a), soc(a), Path(a["source"]), Path(a["config_dir"]), Path(call.out_dir))


def _simulate(call: StageCall) -> dict[str, Any]:
    from .stages import simulate

    a = call.args
    return simulate.run(graph(a), Path(a["ctx_onnx"]), Path(a["provider_options"]), Path(a["inputs"]),
                        a["samples"], Path(call.out_dir), Path(a["reference"]), a["title"], a["soc_name"])


def _simverify(call: StageCall) -> dict[str, Any]:
    from .stages import simverify

    a = call.args
    return simverify.run(graph(a), a["verify"], Path(a["outputs"]), Path(a["reference"]), Path(a["simulation"]),
                         call.target, a["precision"], path(a, "lint"))


def _diagnose(call: StageCall) -> dict[str, Any]:
    from .stages import diagnose

    a = call.args
    return diagnose.run(graph(a), a["verify"], soc(a), toolchain(call), Path(a["model"]), Path(a["provider_options"]),
                        Path(a["inputs"]), Path(a["reference"]), Path(call.out_dir), shipped_failed=a["shipped_failed"],
                        binary=a.get("binary"))


def _pipeline(call: StageCall) -> dict[str, Any]:
    from .stages import pipeline

    a = call.args
    return pipeline.run([specjson.graph_from_dict(g) for g in a["graphs"]], [Path(p) for p in a["ctx"]],
                        [Path(p) for p in a["configs"]], [Path(p) for p in a["simplified"]], Path(a["inputs"]),
                        a["feed"], a["verify"], call.target, Path(call.out_dir))


def _loop(call: StageCall) -> dict[str, Any]:
    from .stages import loop

    a = call.args
    return loop.run(graph(a), a["loop"], Path(a["ctx_onnx"]), Path(a["provider_options"]), Path(a["simplified"]),
                    Path(a["inputs"]), call.target, a["soc_name"], Path(call.out_dir), a.get("start"))


def _socscheck(call: StageCall) -> dict[str, Any]:
    from .socscheck import check_table

    return {"rows": check_table({row["name"]: specjson.soc_from_dict(row) for row in call.args["socs"]})}


def _compat(call: StageCall) -> dict[str, Any]:
    from .compat import run_binary

    a = call.args
    return run_binary(graph(a), a["verify"], Path(a["ctx_onnx"]), Path(a["provider_options"]), Path(a["inputs"]),
                      Path(a["reference"]), a["samples"], Path(call.out_dir))


RUNNERS: dict[str, Callable[[StageCall], dict[str, Any]]] = {
    "export": _export, "simplify": _simplify, "lint": _lint, "cpucheck": _cpucheck, "calibrate": _calibrate,
    "quantize": _graph_stage, "convert": _graph_stage, "modellib": _graph_stage,
    "config": _config, "context": _context, "simulate": _simulate, "simverify": _simverify, "diagnose": _diagnose,
    "pipeline": _pipeline, "loop": _loop, "socscheck": _socscheck, "compat": _compat,
}


def execute(call: StageCall) -> dict[str, Any]:
    """Run the call in this process (working directory: the project root); return the stage's record fields."""
    runner = RUNNERS.get(call.stage)
    if runner is None:
        raise ValueError(f"unknown stage '{call.stage}'")
    return runner(call)
