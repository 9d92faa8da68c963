"""The device survey (build/verify/devices.json): every attached device, its chip (ro.soc.model
matched to socs/socs.yaml) and which targets it runs; a phone whose chip has no build is listed as
"CPU fallback: no build for <chip>". No phone at all, or none that can run a build: fails.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from qnn_tasks import fileio
from qnn_tasks.devices import adb
from qnn_tasks.errors import QnnTasksError, StageError
from qnn_tasks.modelspec.project import Soc
from qnn_tasks.qnn import select
from qnn_tasks.run.status import Status
from qnn_tasks.stages.verify.settings import now_iso, unexpected_error


def survey(socs: dict[str, Soc], targets: list[tuple[str, str, str | None]], record_path: Path) -> dict[str, Any]:
    """Devices found, their chips, which targets each runs; `targets` = (name, soc name, skip reason)."""
    start = time.perf_counter()
    record: dict[str, Any] = {"stage": "verify-devices", "measured_at": now_iso(), "devices": []}
    try:
        server = adb.server_from_env()
        record["adb_server"] = server.address
        adb.probe(server)
        serials = adb.serial_filter()
        record["serial_filter"] = serials
        devices = adb.list_devices(server)
        if not devices:
            raise StageError(f"no phone attached to the adb server at {server.address}: {adb.ATTACH_HINT}")
        for info in devices:
            entry = {**info.as_dict(), **classify(info, socs, targets, serials)}
            record["devices"].append(entry)
            print(f"verify: {info.label()}: {entry['verdict']}", flush=True)
        if serials:
            missing = sorted(set(serials) - {d.serial for d in devices})
            if missing:
                record["filter_not_attached"] = missing
                print(f"verify: {adb.ENV_DEVICES} names devices that are not attached: {', '.join(missing)}")
        record["cpu_fallback"] = [d["serial"] for d in record["devices"] if d["status"] == "cpu-fallback"]
        runnable = [d for d in record["devices"] if d["status"] == "verify"]
        if not runnable:
            why = "; ".join(f"{d['serial']}: {d['verdict']}" for d in record["devices"])
            raise StageError(f"none of the attached phones can run a build ({why})")
        record.update(status=Status.PASSED, seconds=round(time.perf_counter() - start, 3))
        fileio.write_json(record_path, record)
        return record
    except QnnTasksError as err:
        record.update(status=Status.FAILED, error=str(err), seconds=round(time.perf_counter() - start, 3))
        fileio.write_json(record_path, record)
        raise
    except Exception as err:
        raise unexpected_error(record, record_path, err, start) from None


def classify(info: adb.DeviceInfo, socs: dict[str, Soc], targets: list[tuple[str, str, str | None]],
             serials: list[str] | None) -> dict[str, Any]:
    """status: verify | cpu-fallback | unavailable | ignored, with the one-line verdict."""
    if serials is not None and info.serial not in serials:
        return {"status": "ignored", "verdict": f"ignored (not in {adb.ENV_DEVICES})", "targets": []}
    if not info.usable:
        return {"status": "unavailable", "verdict": info.error or f"state {info.state}", "targets": []}
    chip = info.soc_model
    if not chip:
        return {"status": "cpu-fallback", "targets": [],
                "verdict": "CPU fallback: ro.soc.model is empty (Android < 12 or not a Qualcomm SoC), so no build "
                           "can be picked for it"}
    if chip not in socs:
        return {"status": "cpu-fallback", "targets": [],
                "verdict": f"CPU fallback: ro.soc.model '{chip}' is not in socs/socs.yaml (no NPU build; if it is "
                           f"a Snapdragon with an HTP, add its row)"}
    if info.abi and not info.abi.startswith("arm64"):
        return {"status": "cpu-fallback", "targets": [],
                "verdict": f"CPU fallback: ABI {info.abi}, not arm64-v8a (the aarch64 QNN runtime cannot run there)"}
    # the package selector's rule 1 (qnn/select.py): a target's binary is listed for its own chip only
    built = [b["path"] for b in select.candidates([{"socs": [soc], "path": name} for name, soc, skip in targets
                                                  if not skip], chip)]
    if not built:
        skipped = sorted({skip for _, soc, skip in targets if soc == chip and skip})
        return {"status": "cpu-fallback", "targets": [], "soc": socs[chip].row(),
                "verdict": f"CPU fallback: no build for {chip}" + (f" ({'; '.join(skipped)})" if skipped else "")}
    return {"status": "verify", "targets": built, "soc": socs[chip].row(),
            "verdict": f"{chip} ({socs[chip].dsp_arch}): runs {', '.join(built)}"}
