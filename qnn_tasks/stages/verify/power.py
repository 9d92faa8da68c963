"""`doit power` on one phone: the opt-in fixed-length run.

A calibration run sizes the inference count for `power_seconds`; battery level/charge from
`dumpsys battery` before and after, CPU use; the conditions to hold fixed are printed and recorded.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from qnn_tasks.devices import adb
from qnn_tasks.qnn import runtimelibs
from qnn_tasks.stages.verify.choice import LoadFailed, decide
from qnn_tasks.stages.verify.device_run import cleanup, push_payload, require_ok, run_on_device, runner_args
from qnn_tasks.stages.verify.measure import cpu_text, num_text
from qnn_tasks.stages.verify.payload import build_payload
from qnn_tasks.stages.verify.refusal import refused
from qnn_tasks.stages.verify.settings import POWER_CONDITIONS, DeviceSettings, Job, device_folder, now_iso, safe_text


def power_on(job: Job, phone: adb.Phone, binary: dict[str, Any], libs: runtimelibs.RuntimeLibs,
             settings: DeviceSettings, entry: dict[str, Any], save: Callable[[], None],
             selection: dict[str, Any]) -> None:
    workdir = device_folder(job.root, job.target)
    local = job.out_dir / safe_text(phone.info.serial)
    payload = build_payload(job, binary, libs, 1)
    n = settings.timing_inferences

    def first_run() -> Any:  # the selector's "did the context load": push, then the calibration run
        push_payload(job, phone, payload, workdir, entry, save)
        entry["phase"] = "calibrate"
        save()
        calib = run_on_device(phone, workdir, runner_args(payload.bin_name, payload.one_sample_list, "p0",
                                                           payload.native_inputs,
                                                           ["--num_inferences", str(n), "--keep_num_outputs", "1"]),
                              "p0.log", "the calibration run", settings.cpu_sample_seconds, 600 + 30 * n)
        require_ok(calib, phone, "the calibration run", local / "power-calibration.log", error=LoadFailed)
        return calib

    try:
        calib = decide(job, selection, libs, phone.info, entry, first_run,
                       lambda decision: refused(job, binary, libs, phone.info, selection, decision))
        per = (calib.seconds or 1.0) / n
        total = max(n, math.ceil(settings.power_seconds / max(per, 1e-6)))
        before = battery(phone)
        entry.update(phase="run", battery_before=before, inferences=total, target_seconds=settings.power_seconds)
        if before.get("charging"):
            entry["warnings"].append("the phone is powered (AC/USB/wireless) during the run: the battery drop is not "
                                     "meaningful; run it on battery (wireless adb) for a real figure")
        save()
        print(f"power:{job.target}: {phone.info.label()}: {total} inferences (~{settings.power_seconds:g} s); "
              f"hold these fixed: {POWER_CONDITIONS}", flush=True)
        run = run_on_device(phone, workdir, runner_args(payload.bin_name, payload.one_sample_list, "p1",
                                                         payload.native_inputs,
                                                         ["--num_inferences", str(total), "--keep_num_outputs", "1"]),
                            "p1.log", "the power run", settings.cpu_sample_seconds,
                            settings.power_seconds * 3 + 600)
        require_ok(run, phone, "the power run", local / "power-run.log")
        after = battery(phone)
        entry.update(phase="done", battery_after=after, seconds=run.seconds, cpu=run.cpu,
                     per_inference_mean_s=(run.seconds / total) if run.seconds else None,
                     battery_drop=battery_drop(before, after), conditions=POWER_CONDITIONS)
        save()
        drop = entry["battery_drop"]
        print(f"power:{job.target}: {phone.info.label()}: {num_text(run.seconds)} s, "
              f"battery {drop.get('level_points')} points / {num_text(drop.get('charge_mah'))} mAh, "
              f"{cpu_text(run.cpu)}", flush=True)
    finally:
        if "device_folder" in entry:  # something was pushed
            cleanup(job, phone, workdir, settings, entry)


def battery(phone: adb.Phone) -> dict[str, Any]:
    text = phone.check("dumpsys battery", "dumpsys battery")
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(": ")
        if sep:
            fields[key.strip().lower()] = value.strip()

    def number(key: str) -> float | None:
        try:
            return float(fields[key])
        except (KeyError, ValueError):
            return None

    powered = [k for k in ("ac powered", "usb powered", "wireless powered", "dock powered") if fields.get(k) == "true"]
    temp = number("temperature")
    return {"level": number("level"), "scale": number("scale"), "charge_counter_uah": number("charge counter"),
            "temperature_c": temp / 10 if temp is not None else None, "voltage_mv": number("voltage"),
            "status": fields.get("status"), "powered_by": powered, "charging": bool(powered), "at": now_iso()}


def battery_drop(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    level = (before["level"] - after["level"]) if before.get("level") is not None and after.get("level") is not None else None
    charge = None
    if before.get("charge_counter_uah") is not None and after.get("charge_counter_uah") is not None:
        charge = (before["charge_counter_uah"] - after["charge_counter_uah"]) / 1000
    return {"level_points": level, "charge_mah": charge,
            "note": "level has 1-point steps: use runs of 30-60 minutes; the charge counter is finer where the phone reports it"}
