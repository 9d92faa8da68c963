"""Checks before pushing: nothing goes to a phone that cannot load the binary.

`binary_facts`         the binary's QNN build, socModel and arch, read from the .bin (qnnbin);
`refuse_incompatible`  refuses a binary of another chip or arch and a non-arm64 phone; returns the binary as the
                       package selector sees it, its minimum runtime the one `doit compat` measured for this exact
                       binary (build/compat/compat.json, by SHA-256) when there is one, else its QNN build;
`refused`              the selector's CPU decisions (runtime libs of unknown version, older than that minimum:
                       err 5000/5005) as one line with the fix.
"""
from __future__ import annotations

from typing import Any

from qnn_tasks import fileio
from qnn_tasks.devices import adb
from qnn_tasks.errors import StageError
from qnn_tasks.modelspec.project import BINARY_CHIP_FACTS
from qnn_tasks.plan.paths import COMPAT_RECORD
from qnn_tasks.qnn import runtimelibs, select
from qnn_tasks.stages.verify import choice
from qnn_tasks.stages.verify.settings import Job

COMPAT_FILE = COMPAT_RECORD
COMPAT_SOURCE = f"{COMPAT_FILE}, measured by doit compat"


def binary_facts(job: Job) -> dict[str, Any]:
    """The binary's QNN build, socModel and arch, read from the file itself with qnnbin (the context record
    may describe an earlier build); the record's `binary` section is used only when libQnnSystem.so is not
    available here and the record's bin_size matches the file."""
    path = job.binary
    if not path.is_file():
        raise StageError(f"no context binary for {job.target} yet ({path}): build it first "
                         f"(doit context:{job.target} cpucheck:{job.graph.name})")
    size = path.stat().st_size
    from qnn_tasks.qnn import binary as qnnbin

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
    from qnn_tasks.run import records

    return {"path": str(path), "size": size, "sha256": records.sha256(path), "build_id": info.get("build_id"),
            "qnn_version": ".".join(map(str, runtimelibs.version_tuple(info.get("build_id")) or ())) or None,
            "soc_model": info.get("soc_model"), "dsp_arch": info.get("dsp_arch"), "facts_from": source,
            "graph": graphs[0]}


def refuse_incompatible(job: Job, binary: dict[str, Any], libs: runtimelibs.RuntimeLibs, info: adb.DeviceInfo,
                        entry: dict[str, Any]) -> dict[str, Any]:
    """Refuses what no rule of the selector covers (a binary file of another chip or arch, a non-arm64 phone) and
    returns the binary as the selector sees it (choice.binary_entry): its minimum runtime is the one `doit compat`
    measured for this exact binary (build/compat/compat.json) or, without a measurement, its QNN build. The runtime
    comparison itself is the selector's rule 3 (choice.decide); `refused` words its CPU decisions with the fix."""
    soc = job.soc
    device_has = {"soc_model": f"soc_id {soc.soc_id}", "dsp_arch": soc.dsp_arch}  # this message's own wording
    problems = [f"{BINARY_CHIP_FACTS[m.fact][0]} {m.recorded} (the device's {soc.name} is {device_has[m.fact]})"
                for m in soc.binary_mismatches(binary)]
    if problems:
        raise StageError(f"refused before pushing anything to {info.label()}: {binary['path']} was built for "
                         f"{' and '.join(problems)}; a context binary runs only on the chip it was compiled for "
                         f"(fix: rebuild it for {soc.name}: doit context:{job.target})")
    if info.abi and not info.abi.startswith("arm64"):
        raise StageError(f"refused: {info.label()} reports ABI {info.abi}; the aarch64-android QNN runtime needs arm64-v8a")
    built = runtimelibs.version_tuple(binary["build_id"])
    shipped = runtimelibs.version_tuple(libs.version)
    measured = measured_minimum(binary, entry) if shipped is not None else None
    if shipped is not None and built is not None:
        if measured is not None and measured <= shipped < built:
            entry["warnings"].append(f"runtime libs QNN {libs.version} are older than the binary's QNN build "
                                     f"{_text(built)}, which usually fails to load (err 5000/5005), but doit compat "
                                     f"measured this exact binary loading with matching outputs on QNN {_text(measured)} "
                                     f"({COMPAT_FILE}): not refused, the measurement wins")
        elif shipped > built and shipped[:2] != built[:2]:
            entry["warnings"].append(f"runtime libs QNN {libs.version} are newer than the binary's QNN "
                                     f"{_text(built)}: usually fine, but the guide ships the same version")
    return choice.binary_entry(job, binary, _text(measured) if measured is not None else None)


def refused(job: Job, binary: dict[str, Any], libs: runtimelibs.RuntimeLibs, info: adb.DeviceInfo,
            selection: dict[str, Any], decision: select.Decision) -> StageError:
    """A CPU decision of rules 1-3 (qnn/select.py) as one line with the fix; nothing was pushed."""
    shipped = runtimelibs.version_tuple(libs.version)
    built = runtimelibs.version_tuple(binary["build_id"])
    if decision.rule == select.RUNTIME_UNKNOWN:
        return StageError(f"refused before pushing: cannot tell the QNN version of the runtime libs in {libs.source} "
                          f"(checked {', '.join(runtimelibs.VERSION_FILES[:2])} files, the folder/archive name and "
                          f"libQnnHtp.so), so the err 5000/5005 check cannot be made (fix: name the folder or archive "
                          f"qnn-libs-<version>, or add a VERSION file with e.g. 2.40.0)")
    if decision.rule == select.RUNTIME_OLDER and shipped is not None and selection["min_runtime_from"] == "compat":
        measured = runtimelibs.version_tuple(selection["min_runtime_qnn"])
        return StageError(f"refused before pushing anything to {info.label()}: {binary['path']} needs a QNN runtime "
                          f"of {_text(measured)} or newer, the oldest measured to load this exact binary with "
                          f"matching outputs ({COMPAT_SOURCE}), but the runtime libs to ship are QNN {libs.version} "
                          f"({libs.source}) (fix: {rebuild_hint(job, shipped, measured)})")
    if decision.rule == select.RUNTIME_OLDER and built is not None:
        v = _text(built)
        return StageError(f"refused before pushing anything to {info.label()}: {binary['path']} was built with QNN {v} "
                          f"(build {binary['build_id']}) but the runtime libs to ship are QNN {libs.version} "
                          f"({libs.source}); a runtime older than the compiler fails to load the binary on the phone "
                          f"(err 5000/5005). Fix: ship runtime libs of QNN {v} ({runtimelibs.ENV} or "
                          f"settings.{runtimelibs.SETTING}), or rebuild the binary with a QNN {libs.version} toolchain "
                          f"(e.g. QNN_TOOLCHAIN=qairt with that SDK) and rerun doit context:{job.target}")
    return StageError(f"refused before pushing anything to {info.label()}: {decision.reason} "
                      f"(fix: rebuild it: doit context:{job.target})")


def measured_minimum(binary: dict[str, Any], entry: dict[str, Any]) -> tuple[int, ...] | None:
    """The minimum runtime `doit compat` measured for this exact binary (by SHA-256), if any; records in the
    device entry which rule decides (`compat`: minimum_runtime, source)."""
    from qnn_tasks.stages import compattable

    built = runtimelibs.version_tuple(binary["build_id"])
    by_build = {"minimum_runtime": _text(built) if built else None, "source": "the binary's QNN build (build id "
                f"{binary['build_id']}): a runtime older than the compiler fails to load it"}
    measured = compattable.lookup(binary.get("sha256"))
    if measured is None:
        entry["compat"] = {**by_build, "source": by_build["source"] + f"; no entry for this binary in {COMPAT_FILE}"}
        return None
    minimum = runtimelibs.version_tuple(measured.get("minimum_runtime"))
    if minimum is None:
        entry["warnings"].append(f"doit compat measured no runtime that loads this exact binary with matching outputs "
                                 f"({COMPAT_FILE}): checked against its QNN build instead")
        entry["compat"] = {**by_build, "source": by_build["source"] + f"; {COMPAT_FILE} has no working runtime for it"}
        return None
    entry["compat"] = {"minimum_runtime": _text(minimum), "source": COMPAT_SOURCE}
    return minimum


def rebuild_hint(job: Job, shipped: tuple[int, ...], measured: tuple[int, ...]) -> str:
    """The newest of this run's toolchains whose QNN is not newer than the runtime to ship (not the one that built
    this binary: it would build the same file again), else: ship newer runtime libs."""
    ship = f"ship runtime libs of QNN {_text(measured)} or newer ({runtimelibs.ENV} or settings.{runtimelibs.SETTING})"
    fits = [(version, name) for name, qnn in job.toolchains
            if name != job.profile.name and (version := runtimelibs.version_tuple(qnn)) is not None and version <= shipped]
    if not fits:
        own = runtimelibs.version_tuple(dict(job.toolchains).get(job.profile.name))
        if own and own <= shipped:
            return (f"none of this run's other toolchains is old enough ({job.profile.name}, QNN {_text(own)}, built "
                    f"this very binary: rebuilding with it gives the same file); {ship}")
        return f"none of this run's toolchains is old enough; {ship}"
    version, name = max(fits)
    return f"rebuild with QNN_TOOLCHAIN={name} (QNN {_text(version)}), or {ship}"


def _text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))
