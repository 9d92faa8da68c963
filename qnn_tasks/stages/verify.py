"""verify / power: run a chip target's context binary on attached phones over adb (SPEC 4 and 5).

`survey`        build/verify/devices.json: every attached device, its chip (ro.soc.model matched to
                socs/socs.yaml) and which targets it runs; a phone whose chip has no build is listed as
                "CPU fallback: no build for <chip>". No phone at all, or none that can run a build: fails.
`verify_target` for one chip target, on each attached device of that chip:
                1. refuse before pushing anything: a binary whose socModel/arch is not the device's chip,
                   or whose QNN build is newer than the runtime libs to ship (err 5000/5005 on the phone);
                   missing runtime libs for the arch (named);
                2. push (skipping files already there with the same size and md5) into
                   /data/local/tmp/<project>/<target>/: lib/ (libQnnHtp, libQnnSystem, V<NN>Stub, V<NN>Skel),
                   qnn-net-run, the context binary, the verification inputs as raw files + input_list.txt;
                3. `qnn-net-run --retrieve_context <bin> --backend lib/libQnnHtp.so --input_list input_list.txt
                   --output_dir out` with LD_LIBRARY_PATH and ADSP_LIBRARY_PATH (';'-separated, lib/ first);
                   its process's /proc/<pid>/stat is sampled every 2 s (CPU use);
                4. pull Result_<i>/<output>.raw (float32) and judge them against cpucheck's CPU reference with
                   the same metrics, thresholds and checks as simverify (verification.judge);
                5. latency: wall time on the device of runs with 1 inference (first output: load + 1) and with
                   N inferences (--num_inferences), per round; per inference = (T_N - T_1) / (N - 1); median
                   and p90 over the rounds; real-time factor where the graph gives options.audio_seconds_per_sample;
                6. remove the device folder unless asked to keep it.
                The record (<chip dir>/verify/verify.json) is rewritten after every step, so a phone that is
                unplugged mid-run leaves what was measured, and the other phones still run.
`power_target`  the opt-in fixed-length run: inference repeated for N seconds, battery level/charge from
                `dumpsys battery` before and after, CPU use; <chip dir>/power/power.json.

Plain functions, no doit: tasks.py turns the exceptions (QnnTasksError) into task failures.
"""
from __future__ import annotations

import datetime as _dt
import math
import os
import re
import shlex
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import fileio, runtimelibs
from ..devices import adb
from ..errors import QnnTasksError, SpecError, StageError
from ..spec import GraphSpec, Soc, ToolchainProfile

DEVICE_LABEL = "measured on an attached phone over adb (device results)"
RUNNER = runtimelibs.RUNNER
DEFAULT_ADSP_PATH = "/odm/lib/rfsa/adsp;/vendor/lib/rfsa/adsp;/vendor/dsp/cdsp;/system/lib/rfsa/adsp;/system/vendor/lib/rfsa/adsp;/dsp"
ENV_KEEP = "QNN_KEEP_DEVICE_FILES"
ENV_ROUNDS = "QNN_VERIFY_ROUNDS"
ENV_INFERENCES = "QNN_VERIFY_INFERENCES"
ENV_POWER_SECONDS = "QNN_POWER_SECONDS"
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
RECORDS_STAMP = Path("build") / "verify" / "records.stamp"  # report.DEVICE_STAMP


# ------------------------------------------------------------------ settings and job

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
        raw = env.get(var)
        if raw is None or raw == "":
            continue
        if kind is bool:
            values[key] = raw.strip().lower() in ("1", "true", "yes", "on")
            continue
        try:
            values[key] = kind(raw)
        except ValueError:
            raise SpecError(f"environment variable {var}", "", f"{raw!r} is not a number", f"e.g. {var}=3") from None
    settings = DeviceSettings(**values)
    if settings.timing_inferences < 2:
        settings = DeviceSettings(**{**values, "timing_inferences": 2})
    if settings.cpu_sample_seconds <= 0:
        settings = DeviceSettings(**{**values, "cpu_sample_seconds": 2.0})
    return settings


@dataclass
class Job:
    """One chip target on phones: what tasks.py knows about it."""
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
    profile: ToolchainProfile
    root: Path
    base: dict[str, Any]
    required: bool                  # asked for by name: no device of the chip is a failure
    cache_dir: Path = Path("build") / "verify" / "runtime-libs"

    @property
    def record_path(self) -> Path:
        return self.out_dir / f"{self.stage}.json"


def device_folder(root: Path, target: str) -> str:
    return f"{adb.DEVICE_TMP}/{_safe(root.resolve().name)}/{_safe(target)}"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------ survey (build/verify/devices.json)

def survey(socs: dict[str, Soc], targets: list[tuple[str, str, str | None]], record_path: Path) -> dict[str, Any]:
    """Devices found, their chips, which targets each runs; `targets` = (name, soc name, skip reason)."""
    start = time.perf_counter()
    record: dict[str, Any] = {"stage": "verify-devices", "measured_at": _now(), "devices": []}
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
        record.update(status="passed", seconds=round(time.perf_counter() - start, 3))
        fileio.write_json(record_path, record)
        return record
    except QnnTasksError as err:
        record.update(status="failed", error=str(err), seconds=round(time.perf_counter() - start, 3))
        fileio.write_json(record_path, record)
        raise
    except Exception as err:
        raise _unexpected(record, record_path, err, start) from None


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
    built = [name for name, soc, skip in targets if soc == chip and not skip]
    if not built:
        skipped = sorted({skip for _, soc, skip in targets if soc == chip and skip})
        return {"status": "cpu-fallback", "targets": [], "soc": socs[chip].row(),
                "verdict": f"CPU fallback: no build for {chip}" + (f" ({'; '.join(skipped)})" if skipped else "")}
    return {"status": "verify", "targets": built, "soc": socs[chip].row(),
            "verdict": f"{chip} ({socs[chip].dsp_arch}): runs {', '.join(built)}"}


# ------------------------------------------------------------------ verify one target

def verify_target(job: Job) -> dict[str, Any]:
    return _on_devices(job, _verify_on)


def power_target(job: Job) -> dict[str, Any]:
    return _on_devices(job, _power_on)


def _on_devices(job: Job, run_one: Callable[..., None]) -> dict[str, Any]:
    start = time.perf_counter()
    record: dict[str, Any] = {"stage": job.stage, "target": job.target, **job.base, "kind": "device",
                              "label": DEVICE_LABEL, "measured_at": _now(), "status": "running", "devices": []}
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
            return {"status": "skipped", "reason": "no adb server"}
        serials = adb.serial_filter()
        attached = adb.list_devices(server)
        mine = [d for d in attached if d.usable and d.soc_model == job.soc.name
                and (serials is None or d.serial in serials)]
        if not mine:
            others = ", ".join(d.label() for d in attached) or "none"
            reason = f"no {job.soc.name} phone attached (attached: {others})"
            if job.required:
                raise StageError(f"{reason}: {adb.ATTACH_HINT}")
            print(f"{job.stage}:{job.target}: skipped: {reason}", flush=True)
            return {"status": "skipped", "reason": reason}  # an earlier record with results is left as it was
        binary = binary_facts(job)
        libs = runtimelibs.resolve(job.profile.settings, job.profile.file, job.root, job.manifest, job.soc.dsp_arch,
                                   job.cache_dir)
        record.update(binary=binary, runtime=libs.as_dict(), settings=settings.__dict__)
        save()
        for info in mine:
            entry: dict[str, Any] = {"serial": info.serial, "model": info.model, "android": info.android,
                                     "abi": info.abi, "soc_model": info.soc_model, "manufacturer": info.manufacturer,
                                     "chip": job.soc.row(), "status": "running", "phase": "checks", "warnings": []}
            record["devices"].append(entry)
            save()
            try:
                refuse_incompatible(job, binary, libs, info, entry)
                phone = adb.Phone(server, info)
                run_one(job, phone, binary, libs, settings, entry, save)
                entry["status"] = "warning" if entry["warnings"] else "passed"
            except QnnTasksError as err:
                entry.update(status="failed", error=str(err))
            except Exception as err:  # a bug or a tool crash on this phone: keep the traceback, go on with the others
                log = job.record_path.with_name(f"{job.stage}-{_safe(info.serial)}-error.log")
                log.write_text(traceback.format_exc())
                entry.update(status="failed", error=f"unexpected {type(err).__name__}: {err} (traceback: {log})")
            if entry["status"] == "failed":
                short = entry["error"] if len(entry["error"]) < 200 else entry["error"][:200] + " ..."
                print(f"{job.stage}:{job.target}: {info.label()}: FAILED: {short}", flush=True)
            save()
        failed = [e for e in record["devices"] if e["status"] == "failed"]
        if failed:
            record.update(status="failed", error="; ".join(f"{e['serial']}: {e['error']}" for e in failed))
            save()
            raise _Recorded(record["error"])
        record["status"] = "warning" if any(e["status"] == "warning" for e in record["devices"]) else "passed"
        save()
        return record
    except _Recorded:
        raise
    except QnnTasksError as err:
        record.update(status="failed", error=str(err))
        save()
        raise
    except Exception as err:
        raise _unexpected(record, job.record_path, err, start) from None


class _Recorded(StageError):
    """A failure whose record is already written."""


def touch_stamp() -> None:
    """The report re-renders when this changes (one file instead of every target's device records)."""
    RECORDS_STAMP.parent.mkdir(parents=True, exist_ok=True)
    RECORDS_STAMP.write_text(f"{_now()} {time.time_ns()}\n")


def _unexpected(record: dict[str, Any], record_path: Path, err: Exception, start: float) -> StageError:
    log = record_path.with_name(f"{record.get('stage', 'verify')}-error.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(traceback.format_exc())
    record.update(status="failed", error=f"unexpected {type(err).__name__}: {err} (traceback: {log})",
                  seconds=round(time.perf_counter() - start, 3))
    fileio.write_json(record_path, record)
    touch_stamp()
    return StageError(record["error"])


# ------------------------------------------------------------------ checks before pushing

def binary_facts(job: Job) -> dict[str, Any]:
    """The binary's QNN build, socModel and arch, read from the file itself with qnnbin (the context record
    may describe an earlier build); the record's `binary` section is used only when libQnnSystem.so is not
    available here and the record's bin_size matches the file."""
    path = job.binary
    if not path.is_file():
        raise StageError(f"no context binary for {job.target} yet ({path}): build it first "
                         f"(doit context:{job.target} cpucheck:{job.graph.name})")
    size = path.stat().st_size
    from .. import qnnbin

    try:
        info = qnnbin.read_binary_info(path).to_dict()
        source = "read from the binary (qnnbin)"
    except qnnbin.QnnBinError as err:
        info, source = None, ""
        try:
            context = fileio.read_json(job.context_record)
            if context.get("bin_size") == size and context.get("binary"):
                info, source = context["binary"], f"the context record {job.context_record} (qnnbin: {err})"
        except (FileNotFoundError, ValueError):
            pass
        if info is None:
            raise StageError(f"cannot read {path}: {err}") from None
    graphs = info.get("graphs") or []
    if len(graphs) != 1:
        raise StageError(f"{path} holds {len(graphs)} graphs; device verification runs binaries with exactly one")
    return {"path": str(path), "size": size, "build_id": info.get("build_id"),
            "qnn_version": ".".join(map(str, runtimelibs.version_tuple(info.get("build_id")) or ())) or None,
            "soc_model": info.get("soc_model"), "dsp_arch": info.get("dsp_arch"), "facts_from": source,
            "graph": graphs[0]}


def refuse_incompatible(job: Job, binary: dict[str, Any], libs: runtimelibs.RuntimeLibs, info: adb.DeviceInfo,
                        entry: dict[str, Any]) -> None:
    """Nothing is pushed to a phone that cannot load the binary: wrong chip or arch, runtime older than the build."""
    soc = job.soc
    problems = []
    if binary["soc_model"] != soc.soc_id:
        problems.append(f"socModel {binary['soc_model']} (the device's {soc.name} is soc_id {soc.soc_id})")
    if binary["dsp_arch"] != soc.dsp_arch:
        problems.append(f"arch {binary['dsp_arch']} (the device's {soc.name} is {soc.dsp_arch})")
    if problems:
        raise StageError(f"refused before pushing anything to {info.label()}: {binary['path']} was built for "
                         f"{' and '.join(problems)}; a context binary runs only on the chip it was compiled for "
                         f"(fix: rebuild it for {soc.name}: doit context:{job.target})")
    if info.abi and not info.abi.startswith("arm64"):
        raise StageError(f"refused: {info.label()} reports ABI {info.abi}; the aarch64-android QNN runtime needs arm64-v8a")
    built = runtimelibs.version_tuple(binary["build_id"])
    shipped = runtimelibs.version_tuple(libs.version)
    if shipped is None:
        raise StageError(f"refused before pushing: cannot tell the QNN version of the runtime libs in {libs.source} "
                         f"(checked {', '.join(runtimelibs.VERSION_FILES[:2])} files, the folder/archive name and "
                         f"libQnnHtp.so), so the err 5000/5005 check cannot be made (fix: name the folder or archive "
                         f"qnn-libs-<version>, or add a VERSION file with e.g. 2.40.0)")
    if built is not None and shipped < built:
        v = ".".join(map(str, built))
        raise StageError(f"refused before pushing anything to {info.label()}: {binary['path']} was built with QNN {v} "
                         f"(build {binary['build_id']}) but the runtime libs to ship are QNN {libs.version} "
                         f"({libs.source}); a runtime older than the compiler fails to load the binary on the phone "
                         f"(err 5000/5005). Fix: ship runtime libs of QNN {v} ({runtimelibs.ENV} or "
                         f"settings.{runtimelibs.SETTING}), or rebuild the binary with a QNN {libs.version} toolchain "
                         f"(e.g. QNN_TOOLCHAIN=qairt with that SDK) and rerun doit context:{job.target}")
    if built is not None and shipped[:2] != built[:2]:
        entry["warnings"].append(f"runtime libs QNN {libs.version} are newer than the binary's QNN "
                                 f"{'.'.join(map(str, built))}: usually fine, but the guide ships the same version")


# ------------------------------------------------------------------ payload (host side)

@dataclass
class Payload:
    files: dict[str, Path]               # device-relative path -> local file
    executable: set[str]
    bin_name: str
    input_list: str                      # device-relative
    one_sample_list: str
    native_inputs: bool
    samples: int
    outputs: list[dict[str, Any]]        # the binary's output tensors, in the graph's declared order
    extra: dict[str, Any] = field(default_factory=dict)


def build_payload(job: Job, binary: dict[str, Any], libs: runtimelibs.RuntimeLibs, limit: int | None) -> Payload:
    """The files for the phone. Inputs: raw files + input_list.txt (one line per sample, `<tensor>:=<file>`
    per input, in order), packed into one deterministic inputs.tar that is unpacked on the device (hundreds
    of small pushes would dominate the run; one file also makes the same-hash skip cheap)."""
    import io
    import tarfile

    from .. import samples as sample_store

    import numpy as np

    samples = sample_store.load(job.inputs, limit=limit)
    qnn = binary["graph"]
    inputs = _bind(job.graph.inputs, qnn["inputs"], "input", job.binary)
    outputs = _bind(job.graph.outputs, qnn["outputs"], "output", job.binary)
    native = any(not _float_like(t["dtype"]) for _, t in inputs)
    folder = job.out_dir / "device-payload"
    folder.mkdir(parents=True, exist_ok=True)
    members: dict[str, bytes] = {}
    lines = []
    for i, sample in enumerate(samples):
        words = []
        for spec, tensor in inputs:
            rel = f"inputs/s{i:04d}_{_safe(tensor['name'])}.raw"
            members[rel] = _encode(np.asarray(sample[spec.name]), tensor, native, job.binary)
            words.append(f"{tensor['name']}:={rel}")
        lines.append(" ".join(words))
    members["input_list.txt"] = ("\n".join(lines) + "\n").encode()
    members["input_list_1.txt"] = (lines[0] + "\n").encode()
    (folder / "input_list.txt").write_bytes(members["input_list.txt"])
    archive = folder / "inputs.tar"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    with fileio.atomic_path(archive) as tmp:
        tmp.write_bytes(buffer.getvalue())
    files: dict[str, Path] = {f"lib/{name}": path for name, path in libs.libs.items()}
    files[RUNNER] = libs.runner  # type: ignore[assignment]
    files[job.binary.name] = job.binary
    files["inputs.tar"] = archive
    return Payload(files=files, executable={RUNNER}, bin_name=job.binary.name, input_list="input_list.txt",
                   one_sample_list="input_list_1.txt", native_inputs=native, samples=len(samples),
                   outputs=[{"declared": spec.name, "shape": list(spec.shape), **tensor} for spec, tensor in outputs])


def _bind(declared, qnn: list[dict[str, Any]], kind: str, binary: Path) -> list[tuple[Any, dict[str, Any]]]:
    """Declared tensors paired with the binary's; raw files are flat, so only the element count must agree."""
    from ..epcontext import pair_tensors  # the same pairing as the simulator's EPContext wrapper

    pairs = pair_tensors(declared, qnn, kind, binary)
    for spec, tensor in pairs:
        if math.prod(tensor["shape"]) != math.prod(spec.shape):
            raise StageError(f"{binary}: {kind} '{spec.name}' is {tensor['shape']} in the binary (tensor "
                             f"'{tensor['name']}'), model.yaml says {list(spec.shape)}")
    return pairs


def _float_like(dtype: str) -> bool:
    return dtype in ("float32", "float16") or "fixed_point" in dtype


NATIVE = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int8": "i1", "uint8": "u1", "int16": "<i2",
          "uint16": "<u2", "bool": "u1", "int64": "<i8", "uint32": "<u4"}
FIXED = {"ufixed_point_8": "u1", "ufixed_point_16": "<u2", "sfixed_point_8": "i1", "sfixed_point_16": "<i2"}


def _encode(value, tensor: dict[str, Any], native: bool, binary: Path) -> bytes:
    """A raw file as qnn-net-run reads it: float32 unless --use_native_input_files (then the tensor's own type)."""
    import numpy as np

    dtype = tensor["dtype"]
    if not native:
        return np.ascontiguousarray(value, dtype="<f4").tobytes()
    if dtype in NATIVE:
        return np.ascontiguousarray(value, dtype=NATIVE[dtype]).tobytes()
    if dtype in FIXED:
        q = tensor.get("quantization") or {}
        if "scale" not in q:
            raise StageError(f"{binary}: input '{tensor['name']}' is {dtype} without a per-tensor scale/offset")
        info = np.iinfo(np.dtype(FIXED[dtype]))
        quantized = np.round(np.asarray(value, np.float64) / q["scale"]) - int(q.get("offset", 0))
        return np.clip(quantized, info.min, info.max).astype(FIXED[dtype]).tobytes()
    raise StageError(f"{binary}: input '{tensor['name']}' has QNN type {dtype}, which cannot be written as a raw input")


# ------------------------------------------------------------------ device side

@dataclass
class RunResult:
    returncode: int
    seconds: float | None
    output: str
    cpu: dict[str, Any] | None


def run_script(workdir: str, args: list[str], log: str, period: float, out: str) -> str:
    """Shell text that runs qnn-net-run in `workdir`, times it on the device and samples its /proc/<pid>/stat."""
    q = shlex.quote
    lib = f"{workdir}/lib"
    every = max(1, round(period / 0.1))
    command = " ".join(q(a) for a in [f"./{RUNNER}", *args])
    return "\n".join([
        f"cd {q(workdir)} || exit 97",
        f'export LD_LIBRARY_PATH={q(lib)}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"',
        f'export ADSP_LIBRARY_PATH={q(lib + ";")}"${{ADSP_LIBRARY_PATH:-{DEFAULT_ADSP_PATH}}}"',
        "qt_now() { d=$(date +%s%N 2>/dev/null); case \"$d\" in ''|*N*) "
        "awk '{printf \"%.0f\\n\", $1*1000000000}' /proc/uptime;; *) echo \"$d\";; esac; }",
        f"rm -rf {q(out)} {q(log)} {q(log + '.pid')} {q(log + '.time')} {q(log + '.times')}",
        # the subshell's only long-lived child is the runner: `times` after `wait` gives its total CPU time
        f"( t0=$(qt_now); {command} >{q(log)} 2>&1 & p=$!; echo $p >{q(log + '.pid')}; wait $p; rc=$?; "
        f"t1=$(qt_now); times >{q(log + '.times')}; echo \"$rc $t0 $t1\" >{q(log + '.time')} ) &",
        f"while [ ! -s {q(log + '.pid')} ]; do sleep 0.05; done",
        f"pid=$(cat {q(log + '.pid')})",
        f"echo \"{SCRIPT_MARK}CLK_TCK $(getconf CLK_TCK 2>/dev/null || echo 100)\"",
        "n=0",
        f"while [ ! -s {q(log + '.time')} ]; do",
        f"  if [ $((n % {every})) -eq 0 ]; then s=$(cat /proc/$pid/stat 2>/dev/null) && "
        f"echo \"{SCRIPT_MARK}STAT $(qt_now) $s\"; fi",
        "  n=$((n+1)); sleep 0.1",
        "done",
        "wait",
        f"read rc t0 t1 < {q(log + '.time')}",
        f"echo \"{SCRIPT_MARK}TIME $rc $t0 $t1\"",
        f"echo \"{SCRIPT_MARK}CHILDREN $(tail -n 1 {q(log + '.times')})\"",
        f"echo {SCRIPT_MARK}LOG_BEGIN; tail -c 65536 {q(log)}; echo; echo {SCRIPT_MARK}LOG_END",
        "exit $rc",
    ])


def run_on_device(phone: adb.Phone, workdir: str, args: list[str], log: str, what: str, period: float,
                  timeout: float) -> RunResult:
    out = args[args.index("--output_dir") + 1]
    result = phone.shell(run_script(workdir, args, log, period, out), what, timeout=timeout)
    return parse_run(result.returncode, result.stdout + result.stderr)


def parse_run(returncode: int, text: str) -> RunResult:
    tck, samples, seconds, total_cpu, in_log, log_lines = 100, [], None, None, False, []
    for line in text.splitlines():
        if in_log:
            if line == f"{SCRIPT_MARK}LOG_END":
                in_log = False
            else:
                log_lines.append(line)
            continue
        if line == f"{SCRIPT_MARK}LOG_BEGIN":
            in_log = True
        elif line.startswith(f"{SCRIPT_MARK}CLK_TCK "):
            tck = int(line.split()[1]) if line.split()[1].isdigit() else 100
        elif line.startswith(f"{SCRIPT_MARK}STAT "):
            _, stamp, stat = line.split(" ", 2)
            ticks = proc_ticks(stat)
            if ticks is not None and stamp.isdigit():
                samples.append((int(stamp), ticks))
        elif line.startswith(f"{SCRIPT_MARK}CHILDREN "):
            times = re.findall(r"(\d+)m([\d.]+)s", line)
            if len(times) == 2:
                total_cpu = sum(int(m) * 60 + float(sec) for m, sec in times)
        elif line.startswith(f"{SCRIPT_MARK}TIME "):
            parts = line.split()
            if len(parts) == 4 and parts[2].isdigit() and parts[3].isdigit():
                seconds = (int(parts[3]) - int(parts[2])) / 1e9
                returncode = int(parts[1]) if parts[1].lstrip("-").isdigit() else returncode
        else:
            log_lines.append(line)
    output = "\n".join(log_lines).strip()
    return RunResult(returncode, seconds, output, cpu_use(samples, tck, total_cpu, seconds))


def proc_ticks(stat: str) -> int | None:
    """utime + stime (clock ticks) from a /proc/<pid>/stat line (the comm may hold spaces)."""
    try:
        fields = stat.rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def cpu_use(samples: list[tuple[int, int]], tck: int, total_cpu_s: float | None = None,
            wall_s: float | None = None) -> dict[str, Any]:
    """CPU use of the runner process: /proc/<pid>/stat (utime+stime) sampled every period, and its total
    CPU time at exit (the shell's `times` for its reaped child), over the run's wall time."""
    result: dict[str, Any] = {"cores": None, "clk_tck": tck, "samples": len(samples),
                              "method": "(utime+stime) of the runner / CLK_TCK / elapsed: sampled from /proc/<pid>/stat "
                                        "during the run, and in total at exit (shell `times` of the reaped runner)"}
    if len(samples) >= 2:
        (t0, k0), (t1, k1) = samples[0], samples[-1]
        window = (t1 - t0) / 1e9
        if window > 0:
            result.update(sampled_cores=(k1 - k0) / tck / window, sampled_window_s=window,
                          series=[[round((t - t0) / 1e9, 3), k] for t, k in samples[:200]])
    if total_cpu_s is not None and wall_s:
        result.update(cores=total_cpu_s / wall_s, cpu_seconds=total_cpu_s, wall_s=wall_s)
    elif "sampled_cores" in result:
        result["cores"] = result["sampled_cores"]
    if result["cores"] is not None:
        result["percent_of_one_core"] = result["cores"] * 100
    else:
        result["note"] = "no CPU figure: the run ended before a second /proc/<pid>/stat sample and `times` gave nothing"
    return result


def _runner_args(bin_name: str, input_list: str, out: str, native: bool, extra: list[str] = ()) -> list[str]:
    args = ["--retrieve_context", bin_name, "--backend", "lib/libQnnHtp.so", "--input_list", input_list,
            "--output_dir", out]
    if native:
        args.append("--use_native_input_files")
    return args + list(extra)


def _require_ok(run: RunResult, phone: adb.Phone, what: str, log_file: Path) -> None:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text(run.output + "\n")
    if run.returncode == 0:
        return
    tail = "\n".join(run.output.splitlines()[-15:]) or "(no output)"
    hint = {126: " (not executable: is it the aarch64-android build?)", 127: " (not found or cannot start)",
            97: " (the device folder is gone)"}.get(run.returncode, "")
    raise StageError(f"{RUNNER} exited with {run.returncode}{hint} on {phone.info.label()} during {what}; its "
                     f"output: {tail} (full log: {log_file})")


def _push(job: Job, phone: adb.Phone, payload: Payload, workdir: str, entry: dict[str, Any],
          save: Callable[[], None]) -> None:
    entry.update(phase="push", device_folder=workdir)
    save()
    report = phone.push_tree(payload.files, workdir, payload.executable)
    phone.check(f"cd {shlex.quote(workdir)} && chmod 755 {RUNNER} && rm -rf inputs && tar -xf inputs.tar",
                "unpacking the inputs")
    entry["push"] = report.as_dict()
    save()
    print(f"{job.stage}:{job.target}: {phone.info.label()}: pushed {len(report.pushed)} file(s), "
          f"{len(report.skipped)} already there (same size and md5)", flush=True)


def _cleanup(job: Job, phone: adb.Phone, workdir: str, settings: DeviceSettings, entry: dict[str, Any]) -> None:
    if settings.keep_files:
        entry["device_files"] = f"kept in {workdir} ({ENV_KEEP}=1 or settings.device.keep_files)"
    elif phone.remove(workdir):
        entry["device_files"] = "removed"
    else:
        entry["device_files"] = f"not removed ({workdir}): the device is gone"


# ------------------------------------------------------------------ verify on one phone

def _verify_on(job: Job, phone: adb.Phone, binary: dict[str, Any], libs: runtimelibs.RuntimeLibs,
               settings: DeviceSettings, entry: dict[str, Any], save: Callable[[], None]) -> None:
    from .. import samples as sample_store, verification

    workdir = device_folder(job.root, job.target)
    local = job.out_dir / _safe(phone.info.serial)
    payload = build_payload(job, binary, libs, job.verify["samples"])
    label = phone.info.label()
    try:
        _push(job, phone, payload, workdir, entry, save)
        entry.update(phase="run", samples=payload.samples)
        save()
        timeout = 600 + 60 * payload.samples
        run = run_on_device(phone, workdir, _runner_args(payload.bin_name, payload.input_list, "out", payload.native_inputs),
                            "run.log", "the verification run", settings.cpu_sample_seconds, timeout)
        _require_ok(run, phone, "the verification run", local / "qnn-net-run.log")
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
                f"{_ms(timing.get('per_inference_median_s'))}/inference (p90 {_ms(timing.get('per_inference_p90_s'))}), "
                f"first output {_ms(timing.get('first_output_median_s'))}, RTF {_num(entry['rtf'].get('value'))}, "
                + _cpu_text(entry["cpu"]))
        print(line, flush=True)
        if violations:
            raise StageError(f"device outputs of {job.target} on {label} differ from the CPU: " + "; ".join(violations)
                             + f" (the simulator's verdict: doit simverify:{job.target}; to find the first diverging "
                               f"node: doit diagnose:{job.target})")
    finally:
        _cleanup(job, phone, workdir, settings, entry)


def read_outputs(out_dir: Path, payload: Payload, binary: Path) -> list[dict[str, Any]]:
    """Result_<i>/<output>.raw (float32) -> [{declared output name: array of the declared shape}]."""
    from ..epcontext import plain_name
    import numpy as np

    results = []
    for i in range(payload.samples):
        folder = out_dir / f"Result_{i}"
        sample = {}
        for out in payload.outputs:
            candidates = [folder / f"{out['name']}.raw", folder / f"{plain_name(out['name'])}.raw",
                          folder / f"{_safe(out['name'])}.raw"]
            path = next((c for c in candidates if c.is_file()), None)
            if path is None:
                have = sorted(p.name for p in folder.glob("*.raw")) if folder.is_dir() else []
                raise StageError(f"{RUNNER} wrote no {candidates[0].name} in Result_{i} (found: {have or 'nothing'}); "
                                 f"{binary} output '{out['name']}'")
            data = np.fromfile(path, dtype="<f4")
            if data.size != math.prod(out["shape"]):
                raise StageError(f"{path}: {data.size} float32 values, output '{out['declared']}' has "
                                 f"{math.prod(out['shape'])} ({out['shape']})")
            sample[out["declared"]] = data.reshape(out["shape"])
        results.append(sample)
    return results


def measure_latency(job: Job, phone: adb.Phone, payload: Payload, workdir: str, settings: DeviceSettings,
                    accuracy: RunResult, local: Path) -> dict[str, Any]:
    """Rounds of (1 inference, N inferences) runs; per inference = (T_N - T_1) / (N - 1)."""
    import numpy as np

    n, rounds = settings.timing_inferences, settings.timing_rounds
    timing: dict[str, Any] = {
        "label": "wall time on the phone (device clock around the qnn-net-run process)",
        "method": f"per round: T1 = a run of 1 inference (load + first output), TN = a run of {n} inferences "
                  f"(--num_inferences {n}, same sample); per inference = (TN - T1) / {n - 1}",
        "rounds": rounds, "inferences_per_round": n, "accuracy_run_s": accuracy.seconds,
        "accuracy_run_samples": payload.samples, "_cpu": []}
    firsts, per = [], []
    for r in range(rounds):
        one = run_on_device(phone, workdir, _runner_args(payload.bin_name, payload.one_sample_list, f"t{r}a",
                                                         payload.native_inputs),
                            f"t{r}a.log", f"latency round {r + 1}", settings.cpu_sample_seconds, 600)
        _require_ok(one, phone, f"latency round {r + 1} (1 inference)", local / f"latency-{r + 1}-single.log")
        bulk = run_on_device(phone, workdir, _runner_args(payload.bin_name, payload.one_sample_list, f"t{r}b",
                                                          payload.native_inputs,
                                                          ["--num_inferences", str(n), "--keep_num_outputs", "1"]),
                             f"t{r}b.log", f"latency round {r + 1}", settings.cpu_sample_seconds, 600 + 30 * n)
        _require_ok(bulk, phone, f"latency round {r + 1} ({n} inferences)", local / f"latency-{r + 1}-bulk.log")
        phone.shell(f"cd {shlex.quote(workdir)} && rm -rf t{r}a t{r}b", "cleanup of latency outputs")
        timing["_cpu"] += [one.cpu, bulk.cpu]
        if one.seconds is not None:
            firsts.append(one.seconds)
        if one.seconds is not None and bulk.seconds is not None:
            if bulk.seconds > one.seconds:
                per.append((bulk.seconds - one.seconds) / (n - 1))
            else:
                timing.setdefault("notes", []).append(
                    f"round {r + 1}: the {n}-inference run ({bulk.seconds:.3f} s) was not longer than the 1-inference "
                    f"run ({one.seconds:.3f} s): load-time noise exceeds {n - 1} inferences; raise "
                    f"settings.device.timing_inferences ({ENV_INFERENCES})")
    timing["first_output_rounds_s"] = firsts
    timing["per_inference_rounds_s"] = per
    if firsts:
        timing.update(first_output_median_s=float(np.median(firsts)), first_output_p90_s=float(np.percentile(firsts, 90)))
    if per:
        timing.update(per_inference_median_s=float(np.median(per)), per_inference_p90_s=float(np.percentile(per, 90)))
    if accuracy.seconds is not None and firsts and payload.samples > 1:
        timing["accuracy_run_per_inference_s"] = max(accuracy.seconds - float(np.median(firsts)), 0.0) / (payload.samples - 1)
    return timing


def best_cpu(runs: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The CPU measurement over the longest run (the per-period samples need runs of several seconds)."""
    measured = [c for c in runs if c and c.get("cores") is not None]
    if measured:
        return max(measured, key=lambda c: c.get("wall_s") or c.get("sampled_window_s") or 0)
    return next((c for c in runs if c), None)


def real_time_factor(graph: GraphSpec, per_inference: float | None, verify: dict[str, Any] | None = None) -> dict[str, Any]:
    """per-inference time / audio seconds per inference, where the graph gives its audio length per
    sample in `options.audio_seconds_per_sample` (the VAD example: 0.032 s)."""
    audio = (verify or {}).get("audio_seconds") or graph.options.get("audio_seconds_per_sample")
    if not isinstance(audio, (int, float)) or isinstance(audio, bool) or audio <= 0:
        return {"value": None, "note": f"graph '{graph.name}' declares no audio length per inference "
                                       f"(options.audio_seconds_per_sample)"}
    if per_inference is None:
        return {"value": None, "audio_seconds_per_sample": audio, "note": "no latency measured"}
    return {"value": per_inference / audio, "audio_seconds_per_sample": audio,
            "note": "per-inference wall time / audio seconds per inference (< 1: faster than real time)"}


# ------------------------------------------------------------------ power on one phone

def _power_on(job: Job, phone: adb.Phone, binary: dict[str, Any], libs: runtimelibs.RuntimeLibs,
              settings: DeviceSettings, entry: dict[str, Any], save: Callable[[], None]) -> None:
    workdir = device_folder(job.root, job.target)
    local = job.out_dir / _safe(phone.info.serial)
    payload = build_payload(job, binary, libs, 1)
    n = settings.timing_inferences
    try:
        _push(job, phone, payload, workdir, entry, save)
        entry["phase"] = "calibrate"
        save()
        calib = run_on_device(phone, workdir, _runner_args(payload.bin_name, payload.one_sample_list, "p0",
                                                           payload.native_inputs,
                                                           ["--num_inferences", str(n), "--keep_num_outputs", "1"]),
                              "p0.log", "the calibration run", settings.cpu_sample_seconds, 600 + 30 * n)
        _require_ok(calib, phone, "the calibration run", local / "power-calibration.log")
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
        run = run_on_device(phone, workdir, _runner_args(payload.bin_name, payload.one_sample_list, "p1",
                                                         payload.native_inputs,
                                                         ["--num_inferences", str(total), "--keep_num_outputs", "1"]),
                            "p1.log", "the power run", settings.cpu_sample_seconds,
                            settings.power_seconds * 3 + 600)
        _require_ok(run, phone, "the power run", local / "power-run.log")
        after = battery(phone)
        entry.update(phase="done", battery_after=after, seconds=run.seconds, cpu=run.cpu,
                     per_inference_mean_s=(run.seconds / total) if run.seconds else None,
                     battery_drop=battery_drop(before, after), conditions=POWER_CONDITIONS)
        save()
        drop = entry["battery_drop"]
        print(f"power:{job.target}: {phone.info.label()}: {_num(run.seconds)} s, battery {drop.get('level_points')} "
              f"points / {_num(drop.get('charge_mah'))} mAh, {_cpu_text(run.cpu)}", flush=True)
    finally:
        _cleanup(job, phone, workdir, settings, entry)


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
            "status": fields.get("status"), "powered_by": powered, "charging": bool(powered), "at": _now()}


def battery_drop(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    level = (before["level"] - after["level"]) if before.get("level") is not None and after.get("level") is not None else None
    charge = None
    if before.get("charge_counter_uah") is not None and after.get("charge_counter_uah") is not None:
        charge = (before["charge_counter_uah"] - after["charge_counter_uah"]) / 1000
    return {"level_points": level, "charge_mah": charge,
            "note": "level has 1-point steps: use runs of 30-60 minutes; the charge counter is finer where the phone reports it"}


def _cpu_text(cpu: dict[str, Any] | None) -> str:
    cores = (cpu or {}).get("cores")
    return f"CPU {cores:.2f} cores" if cores is not None else "CPU use: not measured"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else (f"{seconds * 1000:.2f} ms" if seconds < 1 else f"{seconds:.2f} s")


def _num(value: Any) -> str:
    return "-" if value is None else (f"{value:.3g}" if isinstance(value, float) else str(value))
