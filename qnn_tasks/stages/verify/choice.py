"""What runs on this phone: the package selector's rules (qnn_tasks/qnn/select.py) applied to one chip target.

`doit verify` and `doit power` decide per device exactly as an app does with the package: the target's binary is
listed as manifest.json lists it (socs = its own chip, min_runtime_qnn = what `doit compat` measured for this exact
binary, else its QNN build), the phone's runtime is the runtime libraries pushed with it, and "did the context load"
is the first qnn-net-run on the phone. The decision and its reason go into the device's record (`decision`) and the
console; a CPU decision fails the device with the fix (refusal.refused) or the runner's own error.
One binary per call: verify runs every precision of a chip as its own target, so the precision order never decides.
"""
from __future__ import annotations

from typing import Any, Callable

from qnn_tasks.devices import adb
from qnn_tasks.errors import StageError
from qnn_tasks.qnn import runtimelibs, select
from qnn_tasks.stages.verify.settings import Job


class LoadFailed(StageError):
    """The first run on the phone failed: the context did not load (or run)."""


def binary_entry(job: Job, binary: dict[str, Any], measured: str | None) -> dict[str, Any]:
    """The target's binary as a package's manifest.json lists it (SHIP-CONTRACT: graphs.<g>.binaries[])."""
    return {"soc": job.soc.name, "socs": [job.soc.name], "soc_model": binary.get("soc_model"),
            "dsp_arch": binary.get("dsp_arch"), "precision": job.precision, "path": binary["path"],
            "size": binary.get("size"), "sha256": binary.get("sha256"), "qnn_build_id": binary.get("build_id"),
            "qnn_version": binary.get("qnn_version"), "min_runtime_qnn": measured or binary.get("qnn_version"),
            "min_runtime_from": "compat" if measured else "compiler"}


def manifest_view(job: Job, entry: dict[str, Any]) -> dict[str, Any]:
    fallback = {"path": str(job.fallback), "runs_on": "CPU"} if job.fallback else None
    return {"schema_version": select.SCHEMA_VERSION, "model": job.graph.model,
            "selection": {"precision_order": [job.precision]},
            "graphs": {job.graph.name: {"binaries": [entry], "fallback": fallback}}}


def for_this_chip(job: Job, info: adb.DeviceInfo) -> bool:
    """Rule 1 before anything is read: the phone's ro.soc.model is the target's chip, exactly."""
    return bool(select.candidates([{"socs": [job.soc.name]}], info.soc_model))


def decide(job: Job, entry: dict[str, Any], libs: runtimelibs.RuntimeLibs, info: adb.DeviceInfo,
           record: dict[str, Any], first_run: Callable[[], Any],
           refused: Callable[[select.Decision], StageError]) -> Any:
    """select.choose on this phone; `first_run` pushes and runs once (raising LoadFailed when the runner fails), and
    is called only when rules 1-3 let the binary through. Returns the first run's result on an NPU decision."""
    state: dict[str, Any] = {}

    def load(_binary: Any) -> str | None:
        try:
            state["run"] = first_run()
        except LoadFailed as err:
            state["error"] = err
            return str(err)
        return None

    decision = select.choose(manifest_view(job, entry), job.graph.name, info.soc_model, libs.version, load)
    record["decision"] = decision.as_dict()
    where = "NPU" if decision.target == "npu" else "CPU"
    print(f"{job.stage}:{job.target}: {info.label()}: decision: {where}: {decision.reason}", flush=True)
    if decision.target == "npu":
        return state["run"]
    if "error" in state:
        raise state["error"]
    raise refused(decision)
