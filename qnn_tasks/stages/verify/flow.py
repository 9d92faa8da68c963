"""The device stages' flow: `verify_target` and `power_target` for one chip target.

On each attached phone of the target's chip: refuse what it cannot load (refusal), then verify
(push, run, pull, judge against the CPU reference, measure) or the power run. The record
(<chip dir>/<stage>/<stage>.json) is rewritten after every step, so a phone unplugged mid-run leaves
what was measured, and the other phones still run.
"""
from __future__ import annotations

import shutil
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from qnn_tasks import fileio
from qnn_tasks.devices import adb
from qnn_tasks.errors import QnnTasksError, StageError
from qnn_tasks.modelspec import specjson
from qnn_tasks.qnn import runtimelibs
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall
from qnn_tasks.run.status import Status
from qnn_tasks.stages.verify.choice import LoadFailed, decide, for_this_chip
from qnn_tasks.stages.verify.device_run import cleanup, push_payload, require_ok, run_on_device, runner_args
from qnn_tasks.stages.verify.measure import best_cpu, cpu_text, measure_latency, ms_text, num_text, real_time_factor
from qnn_tasks.stages.verify.payload import build_payload, read_outputs
from qnn_tasks.stages.verify.power import power_on
from qnn_tasks.stages.verify.refusal import binary_facts, refuse_incompatible, refused
from qnn_tasks.stages.verify.settings import (
    DEVICE_LABEL,
    POWER_CONDITIONS,
    DeviceSettings,
    Job,
    device_folder,
    device_settings,
    now_iso,
    safe_text,
    touch_stamp,
    unexpected_error,
)
from qnn_tasks.stages.verify.survey import survey


def run_call(call: StageCall) -> dict[str, Any]:
    """`doit verify`: the `devices` survey, or one chip target on its phones (the plan's call, run in doit's process)."""
    return _survey(call) if "survey" in call.args else verify_target(job_of(call))


def power_call(call: StageCall) -> dict[str, Any]:
    """`doit power`: the `devices` survey, or one chip target's fixed-length run on a phone."""
    return _survey(call) if "survey" in call.args else power_target(job_of(call))


def _survey(call: StageCall) -> dict[str, Any]:
    a = call.args
    return survey({name: calls.soc({"soc": soc}) for name, soc in a["socs"].items()},
                  [tuple(t) for t in a["targets"]], Path(a["survey"]))


def job_of(call: StageCall) -> Job:
    """The Job of a device call (plan/ondemandplans.py's plan_device, and `required` from the task layer)."""
    a = call.args
    return Job(stage=call.stage, target=call.target, graph=calls.graph(a), verify=a["verify"], soc=calls.soc(a),
               precision=a["precision"], binary=Path(a["binary"]), manifest=calls.path(a, "manifest"),
               context_record=Path(a["context_record"]), inputs=Path(a["inputs"]), reference=Path(a["reference"]),
               out_dir=Path(call.out_dir), record=Path(call.record), profile=specjson.profile_from_dict(a["profile"]),
               root=Path(a["root"]), base=a["base"], required=bool(a.get("required")),
               toolchains=[(name, qnn) for name, qnn in a["toolchains"]], fallback=calls.path(a, "fallback"))


def verify_target(job: Job) -> dict[str, Any]:
    return _on_devices(job, _verify_on)


def power_target(job: Job) -> dict[str, Any]:
    return _on_devices(job, power_on)


def _on_devices(job: Job, run_one: Callable[..., None]) -> dict[str, Any]:
    start = time.perf_counter()
    record: dict[str, Any] = {"stage": job.stage, "target": job.target, **job.base, "kind": "device",
                              "label": DEVICE_LABEL, "measured_at": now_iso(), "status": Status.RUNNING, "devices": []}
    if job.stage == "power":
        record["conditions"] = POWER_CONDITIONS

    def save() -> None:
        record["seconds"] = round(time.perf_counter() - start, 3)
        fileio.write_json(job.record_path, record)
        touch_stamp()

    try:
        settings = device_settings(job.profile)
        server = adb.server_from_env()
        try:
            adb.probe(server)
        except adb.DeviceError:
            if job.required:
                raise
            print(f"{job.stage}:{job.target}: skipped: no usable adb server at {server.address} (the "
                  f"{job.stage}:devices line says how to start one)", flush=True)
            return {"status": Status.SKIPPED, "reason": "no adb server"}
        serials = adb.serial_filter()
        attached = adb.list_devices(server)
        mine = [d for d in attached if d.usable and for_this_chip(job, d)  # the selector's rule 1
                and (serials is None or d.serial in serials)]
        if not mine:
            others = ", ".join(d.label() for d in attached) or "none"
            reason = f"no {job.soc.name} phone attached (attached: {others})"
            if job.required:
                raise StageError(f"{reason}: {adb.ATTACH_HINT}")
            print(f"{job.stage}:{job.target}: skipped: {reason}", flush=True)
            return {"status": Status.SKIPPED, "reason": reason}  # an earlier record with results is left as it was
        binary = binary_facts(job)
        libs = runtimelibs.resolve(job.profile.settings, job.profile.file, job.root, job.manifest, job.soc.dsp_arch,
                                   job.cache_dir)
        record.update(binary=binary, runtime=libs.as_dict(), settings=settings.__dict__)
        save()
        for info in mine:
            entry: dict[str, Any] = {"serial": info.serial, "model": info.model, "android": info.android,
                                     "abi": info.abi, "soc_model": info.soc_model, "manufacturer": info.manufacturer,
                                     "chip": job.soc.row(), "status": Status.RUNNING, "phase": "checks", "warnings": []}
            record["devices"].append(entry)
            save()
            try:
                selection = refuse_incompatible(job, binary, libs, info, entry)
                phone = adb.Phone(server, info)
                run_one(job, phone, binary, libs, settings, entry, save, selection)
                entry["status"] = Status.WARNING if entry["warnings"] else Status.PASSED
            except QnnTasksError as err:
                entry.update(status=Status.FAILED, error=str(err))
            except Exception as err:  # a bug or a tool crash on this phone: keep the traceback, go on with the others
                log = job.record_path.with_name(f"{job.stage}-{safe_text(info.serial)}-error.log")
                log.write_text(traceback.format_exc())
                entry.update(status=Status.FAILED, error=f"unexpected {type(err).__name__}: {err} (traceback: {log})")
            if entry["status"] == Status.FAILED:
                short = entry["error"] if len(entry["error"]) < 200 else entry["error"][:200] + " ..."
                print(f"{job.stage}:{job.target}: {info.label()}: FAILED: {short}", flush=True)
            save()
        failed = [e for e in record["devices"] if e["status"] == Status.FAILED]
        if failed:
            record.update(status=Status.FAILED, error="; ".join(f"{e['serial']}: {e['error']}" for e in failed))
            save()
            raise _Recorded(record["error"])
        record["status"] = Status.WARNING if any(e["status"] == Status.WARNING for e in record["devices"]) else Status.PASSED
        save()
        return record
    except _Recorded:
        raise
    except QnnTasksError as err:
        record.update(status=Status.FAILED, error=str(err))
        save()
        raise
    except Exception as err:
        raise unexpected_error(record, job.record_path, err, start) from None


class _Recorded(StageError):
    """A failure whose record is already written."""


def _verify_on(job: Job, phone: adb.Phone, binary: dict[str, Any], libs: runtimelibs.RuntimeLibs,
               settings: DeviceSettings, entry: dict[str, Any], save: Callable[[], None],
               selection: dict[str, Any]) -> None:
    from qnn_tasks.judge import sample_store, verification

    workdir = device_folder(job.root, job.target)
    local = job.out_dir / safe_text(phone.info.serial)
    payload = build_payload(job, binary, libs, job.verify["samples"])
    label = phone.info.label()

    def first_run() -> Any:  # the selector's "did the context load": push, then the verification run
        push_payload(job, phone, payload, workdir, entry, save)
        entry.update(phase="run", samples=payload.samples)
        save()
        timeout = 600 + 60 * payload.samples
        run = run_on_device(phone, workdir,
                            runner_args(payload.bin_name, payload.input_list, "out", payload.native_inputs),
                            "run.log", "the verification run", settings.cpu_sample_seconds, timeout)
        require_ok(run, phone, "the verification run", local / "qnn-net-run.log", job.soc, LoadFailed)
        return run

    try:
        run = decide(job, selection, libs, phone.info, entry, first_run,
                     lambda decision: refused(job, binary, libs, phone.info, selection, decision))
        entry.update(runner_log=str(local / "qnn-net-run.log"), accuracy_run={"seconds": run.seconds, "cpu": run.cpu})
        entry["phase"] = "pull"
        save()
        shutil.rmtree(local / "out", ignore_errors=True)  # never read a stale Result_<i> of an earlier run
        out_dir = phone.pull_dir_as_tar(workdir, "out", local, "pulling outputs")
        outputs = read_outputs(out_dir, payload, job.binary)
        shutil.rmtree(out_dir, ignore_errors=True)  # kept as outputs.npz
        reference = sample_store.load(job.reference, limit=payload.samples)
        result, violations = verification.judge(job.graph, job.verify, reference, outputs)
        sample_store.save(local / "outputs.npz", outputs)
        entry.update(result, violations=violations, outputs_file=str(local / "outputs.npz"),
                     reference_file=str(job.reference), phase="timing")
        save()
        timing = measure_latency(job, phone, payload, workdir, settings, run, local)
        entry["timing"] = timing
        entry["cpu"] = best_cpu([run.cpu] + timing.pop("_cpu", []))
        entry["rtf"] = real_time_factor(job.graph, timing.get("per_inference_median_s"), job.verify)
        entry["phase"] = "done"
        save()
        line = (f"{job.stage}:{job.target}: {label}: {payload.samples} samples "
                f"{'FAILED: ' + '; '.join(violations) if violations else 'match the CPU'}; "
                f"{ms_text(timing.get('per_inference_median_s'))}/inference "
                f"(p90 {ms_text(timing.get('per_inference_p90_s'))}), "
                f"first output {ms_text(timing.get('first_output_median_s'))}, "
                f"RTF {num_text(entry['rtf'].get('value'))}, "
                + cpu_text(entry["cpu"]))
        print(line, flush=True)
        if violations:
            raise StageError(f"device outputs of {job.target} on {label} differ from the CPU: " + "; ".join(violations)
                             + f" (the simulator's verdict: doit simverify:{job.target}; to find the first diverging "
                               f"node: doit diagnose:{job.target})")
    finally:
        if "device_folder" in entry:  # something was pushed
            cleanup(job, phone, workdir, settings, entry)
