"""Device settings, the Job tasks/project.py fills in, and what every device stage shares.

`device_settings`  `settings.device` of the toolchain profile, overridden by QNN_KEEP_DEVICE_FILES,
                   QNN_VERIFY_ROUNDS, QNN_VERIFY_INFERENCES, QNN_POWER_SECONDS;
`Job`              one chip target on phones (verify or power);
the device folder's name, timestamps, the report's stamp (build/verify/records.stamp) and the record
of an unexpected error.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qnn_tasks import envvalues, fileio
from qnn_tasks.devices import adb
from qnn_tasks.errors import SpecError, StageError
from qnn_tasks.modelspec.project import GraphSpec, Soc, ToolchainProfile
from qnn_tasks.plan.paths import DEVICE_STAMP
from qnn_tasks.qnn import runtimelibs
from qnn_tasks.run.status import Status

DEVICE_LABEL = "measured on an attached phone over adb (device results)"
RUNNER = runtimelibs.RUNNER
DEFAULT_ADSP_PATH = "/odm/lib/rfsa/adsp;/vendor/lib/rfsa/adsp;/vendor/dsp/cdsp;/system/lib/rfsa/adsp;/system/vendor/lib/rfsa/adsp;/dsp"
ENV_KEEP = envvalues.KEEP_DEVICE_FILES
ENV_ROUNDS = envvalues.VERIFY_ROUNDS
ENV_INFERENCES = envvalues.VERIFY_INFERENCES
ENV_POWER_SECONDS = envvalues.POWER_SECONDS
DEVICE_SETTINGS = {"keep_files": "keep the device folder after the run (default false)",
                   "timing_rounds": "latency rounds (default 3; 0 = no latency runs)",
                   "timing_inferences": "inferences per latency run (default 20)",
                   "power_seconds": "length of the `doit power` run in seconds (default 600)",
                   "cpu_sample_seconds": "/proc/<pid>/stat sampling period (default 2)"}
POWER_CONDITIONS = ("hold screen (off), brightness, network (same Wi-Fi or airplane mode) and thermal state (start "
                    "cool, same ambient) fixed between runs you compare, and run on battery: a phone charging over "
                    "USB shows no real drop (use wireless adb: `adb tcpip 5555`, `adb connect <ip>:5555`, then unplug); "
                    "repeat: thermal state changes results")
SCRIPT_MARK = "QT_"
RECORDS_STAMP = Path(DEVICE_STAMP)


@dataclass(frozen=True)
class DeviceSettings:
    keep_files: bool = False
    timing_rounds: int = 3
    timing_inferences: int = 20
    power_seconds: float = 600.0
    cpu_sample_seconds: float = 2.0


def device_settings(profile: ToolchainProfile, env: dict[str, str] | None = None) -> DeviceSettings:
    """`settings.device` of the toolchain profile, overridden by QNN_KEEP_DEVICE_FILES, QNN_VERIFY_ROUNDS,
    QNN_VERIFY_INFERENCES, QNN_POWER_SECONDS."""
    env = os.environ if env is None else env
    block = profile.settings.get("device") or {}
    if not isinstance(block, dict):
        raise SpecError(profile.file, "settings.device", f"expected a mapping, got {block!r}",
                        "e.g. device: {keep_files: false, timing_rounds: 3}")
    for key in block:
        if key not in DEVICE_SETTINGS:
            raise SpecError(profile.file, f"settings.device.{key}", "unknown setting",
                            "use one of: " + ", ".join(f"{k} ({v})" for k, v in DEVICE_SETTINGS.items()))
    values: dict[str, Any] = {}
    for key, kind in (("keep_files", bool), ("timing_rounds", int), ("timing_inferences", int),
                      ("power_seconds", float), ("cpu_sample_seconds", float)):
        if key in block:
            value = block[key]
            ok = isinstance(value, bool) if kind is bool else (isinstance(value, (int, float)) and not isinstance(value, bool))
            if not ok or (kind is not bool and value < 0):
                raise SpecError(profile.file, f"settings.device.{key}", f"expected {kind.__name__}, got {value!r}")
            values[key] = kind(value)
    for var, key, kind in ((ENV_KEEP, "keep_files", bool), (ENV_ROUNDS, "timing_rounds", int),
                           (ENV_INFERENCES, "timing_inferences", int), (ENV_POWER_SECONDS, "power_seconds", float)):
        given = envvalues.flag(var, env) if kind is bool else envvalues.number(var, env)
        if given is not None:
            values[key] = kind(given)
    settings = DeviceSettings(**values)
    if settings.timing_inferences < 2:
        settings = DeviceSettings(**{**values, "timing_inferences": 2})
    if settings.cpu_sample_seconds <= 0:
        settings = DeviceSettings(**{**values, "cpu_sample_seconds": 2.0})
    return settings


@dataclass
class Job:
    """One chip target on phones: what tasks/project.py knows about it."""
    stage: str                      # "verify" or "power"
    target: str
    graph: GraphSpec
    verify: dict[str, Any]
    soc: Soc
    precision: str
    binary: Path                    # the context binary the phone loads
    manifest: Path | None           # the toolchain's runtime_libs.json beside it (qairt), if any
    context_record: Path
    inputs: Path
    reference: Path
    out_dir: Path
    record: Path                    # the stage's record (as the plan names it), rewritten after every step
    profile: ToolchainProfile
    root: Path
    base: dict[str, Any]
    required: bool                  # asked for by name: no device of the chip is a failure
    cache_dir: Path = Path("build") / "verify" / "runtime-libs"
    toolchains: list[tuple[str, str | None]] = field(default_factory=list)  # this run's (profile, QNN version)
    fallback: Path | None = None    # what the CPU runs instead (the simplified ONNX cpucheck verified), for decisions

    @property
    def record_path(self) -> Path:
        return self.record


def device_folder(root: Path, target: str) -> str:
    return f"{adb.DEVICE_TMP}/{safe_text(root.resolve().name)}/{safe_text(target)}"


def safe_text(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def touch_stamp() -> None:
    """The report re-renders when this changes (one file instead of every target's device records)."""
    RECORDS_STAMP.parent.mkdir(parents=True, exist_ok=True)
    RECORDS_STAMP.write_text(f"{now_iso()} {time.time_ns()}\n")


def unexpected_error(record: dict[str, Any], record_path: Path, err: Exception, start: float) -> StageError:
    log = record_path.with_name(f"{record.get('stage', 'verify')}-error.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(traceback.format_exc())
    record.update(status=Status.FAILED, error=f"unexpected {type(err).__name__}: {err} (traceback: {log})",
                  seconds=round(time.perf_counter() - start, 3))
    fileio.write_json(record_path, record)
    touch_stamp()
    return StageError(record["error"])
