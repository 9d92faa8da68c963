"""The Android QNN runtime a phone needs to run a context binary, and its QNN version (docs/shipping.md).

For a chip of Hexagon arch v<NN> the phone needs, from ONE QNN/QAIRT version:
    libQnnHtp.so, libQnnSystem.so, libQnnHtpV<NN>Stub.so   (CPU side: LD_LIBRARY_PATH)
    libQnnHtpV<NN>Skel.so                                   (DSP side: ADSP_LIBRARY_PATH, ';'-separated)
    qnn-net-run                                             (the SDK's bin/aarch64-android runner)

Where they come from, first match wins:
  1. env QNN_RUNTIME_LIBS, else `settings.runtime_libs` in toolchain/<name>.yaml (relative to the
     project root): a folder (an SDK's qairt/<version>, or a flat `qnn-libs` folder like sherpa-onnx
     publishes) or an archive of one (`qnn-libs-<version>.tar.bz2`; unpacked once under
     build/verify/runtime-libs/, refusing absolute paths, '..' and links that leave the folder);
  2. the qairt toolchain's `runtime_libs.json` manifest beside the context binary (its SDK's libs);
     qnn-net-run then comes from that SDK's bin/aarch64-android/.
The onnxruntime-qnn wheel ships no Android libraries, so ort-qnn builds need (1).

The version of the libs is what the "runtime older than the compiler" check (err 5000/5005) compares
with the binary's QNN build: a VERSION / version.txt file in the folder, else a version in the
folder's or archive's name (qnn-libs-2.40.0, qairt/2.40.0.251030), else the manifest's QAIRT
version, else a QNN build id (v2.40.0.<date>) found inside libQnnHtp.so.
"""
from __future__ import annotations

import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qnn_tasks.errors import SpecError, StageError

ENV = "QNN_RUNTIME_LIBS"
SETTING = "runtime_libs"
RUNNER = "qnn-net-run"
VERSION_FILES = ("VERSION", "version", "VERSION.txt", "version.txt", "qnn_version.txt", "QNN_VERSION")
VERSION_RE = re.compile(r"(?<![\d.])(\d+\.\d+\.\d+)(?:\.\d+)?(?![\d])")
BUILD_ID_RE = re.compile(rb"v(\d+\.\d+\.\d+)\.\d{6,}")
ARCHIVE_SUFFIXES = (".tar.bz2", ".tbz2", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar")
SHIP_HINT = (f"set {ENV}=<folder or qnn-libs-<version>.tar.bz2> (sherpa-onnx publishes them; or the QAIRT SDK's "
             f"qairt/<version> folder), or settings.{SETTING}: <path> in the toolchain profile")


def required_libs(dsp_arch: str) -> list[tuple[str, str]]:
    """(file name, device search path) the phone needs for this arch."""
    arch = dsp_arch.lower().lstrip("v")
    return [("libQnnHtp.so", "LD_LIBRARY_PATH"), ("libQnnSystem.so", "LD_LIBRARY_PATH"),
            (f"libQnnHtpV{arch}Stub.so", "LD_LIBRARY_PATH"), (f"libQnnHtpV{arch}Skel.so", "ADSP_LIBRARY_PATH")]


@dataclass
class RuntimeLibs:
    source: str                  # where they came from, for messages and records
    version: str | None          # QNN version, e.g. "2.40.0"
    version_from: str
    libs: dict[str, Path]        # file name -> local path (the arch's four)
    runner: Path | None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "version": self.version, "version_from": self.version_from,
                "libs": {k: str(v) for k, v in self.libs.items()}, "runner": str(self.runner) if self.runner else None,
                "notes": self.notes}


def version_tuple(text: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) from '2.40.0', '2.40.0.251030' or a build id 'v2.51.0.260929181845'."""
    if not text:
        return None
    match = VERSION_RE.search(str(text).lstrip("v"))
    return tuple(int(x) for x in match.group(1).split(".")) if match else None  # type: ignore[return-value]


def configured_path(settings: dict[str, Any], profile_file: Path, root: Path,
                    env: dict[str, str] | None = None) -> tuple[Path, str] | None:
    """The user's runtime libs path (env first, then the profile setting) and how it was given."""
    env = os.environ if env is None else env
    if env.get(ENV):
        return Path(env[ENV]).expanduser(), f"{ENV}={env[ENV]}"
    value = settings.get(SETTING)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SpecError(profile_file, f"settings.{SETTING}", f"expected a path, got {value!r}",
                        "a qnn-libs folder or qnn-libs-<version>.tar.bz2")
    path = Path(value).expanduser()
    return (path if path.is_absolute() else root / path), f"settings.{SETTING} in {profile_file}"


def resolve(settings: dict[str, Any], profile_file: Path, root: Path, manifest: Path | None, dsp_arch: str,
            cache_dir: Path, env: dict[str, str] | None = None) -> RuntimeLibs:
    """Find the arch's runtime libs and the runner; fail naming any missing file."""
    configured = configured_path(settings, profile_file, root, env)
    if configured:
        path, given = configured
        if not path.exists():
            raise StageError(f"runtime libs not found: {path} ({given}) does not exist ({SHIP_HINT})")
        if path.is_file():
            folder = unpack(path, cache_dir)
            libs = from_folder(folder, dsp_arch, f"{path} ({given})", name_for_version=_archive_stem(path))
        else:
            libs = from_folder(path, dsp_arch, f"{path} ({given})", name_for_version=path.name)
    elif manifest is not None and manifest.is_file():
        libs = from_manifest(manifest, dsp_arch)
    else:
        raise StageError(f"no Android QNN runtime libs to ship to the phone: {SHIP_HINT}. The onnxruntime-qnn "
                         f"wheel has none; the qairt toolchain writes runtime_libs.json from its SDK")
    missing = [name for name, _ in required_libs(dsp_arch) if name not in libs.libs]
    if missing:
        raise StageError(f"runtime libs for {dsp_arch} missing: {', '.join(missing)} not found in {libs.source} "
                         f"(the phone needs {', '.join(n for n, _ in required_libs(dsp_arch))} from one QNN version; "
                         f"copy them from the SDK's lib/aarch64-android and lib/hexagon-{dsp_arch}/unsigned)")
    if libs.runner is None:
        raise StageError(f"{RUNNER} (aarch64-android) not found in {libs.source}: put the SDK's "
                         f"bin/aarch64-android/{RUNNER} there (or use the SDK folder itself)")
    return libs


def from_folder(folder: Path, dsp_arch: str, source: str, name_for_version: str) -> RuntimeLibs:
    found: dict[str, Path] = {}
    for name, _ in required_libs(dsp_arch):
        candidates = sorted(folder.rglob(name), key=lambda p: (_preference(p), len(p.parts)))
        candidates = [p for p in candidates if p.is_file()]
        if candidates:
            found[name] = candidates[0]
    runners = sorted((p for p in folder.rglob(RUNNER) if p.is_file()),
                     key=lambda p: (0 if "aarch64-android" in p.parts else 1, len(p.parts)))
    version, how = folder_version(folder, name_for_version, found.get("libQnnHtp.so"))
    return RuntimeLibs(source=source, version=version, version_from=how, libs=found,
                       runner=runners[0] if runners else None)


def _preference(path: Path) -> int:
    """Prefer the Android (aarch64) copy of a lib in an SDK tree that also holds x86/other targets."""
    text = path.as_posix()
    if "aarch64-android" in text or "/hexagon-" in text or "unsigned" in text:
        return 0
    if "x86" in text or "windows" in text or "oe-linux" in text or "qnx" in text:
        return 2
    return 1


def folder_version(folder: Path, name: str, htp: Path | None) -> tuple[str | None, str]:
    for file_name in VERSION_FILES:
        path = folder / file_name
        if path.is_file():
            match = VERSION_RE.search(path.read_text(errors="replace"))
            if match:
                return match.group(1), f"{path}"
    for candidate, label in ((name, f"the name '{name}'"), (folder.name, f"the folder name '{folder.name}'")):
        match = VERSION_RE.search(candidate)
        if match:
            return match.group(1), label
    sdk_yaml = folder / "sdk.yaml"
    if sdk_yaml.is_file():
        match = VERSION_RE.search(sdk_yaml.read_text(errors="replace"))
        if match:
            return match.group(1), str(sdk_yaml)
    if htp is not None:
        match = BUILD_ID_RE.search(htp.read_bytes()[: 64 << 20])
        if match:
            return match.group(1).decode(), f"a QNN build id inside {htp.name}"
    return None, "unknown"


def from_manifest(manifest: Path, dsp_arch: str) -> RuntimeLibs:
    """The qairt toolchain's runtime_libs.json: {qairt_version, dsp_arch, libs: [{name, path, present}]}."""
    import json

    try:
        data = json.loads(manifest.read_text())
    except ValueError as err:
        raise StageError(f"{manifest}: not readable JSON ({err}); rebuild the context (doit context:...)") from None
    libs = {lib["name"]: Path(lib["path"]) for lib in data.get("libs", [])
            if lib.get("present", True) and Path(lib.get("path", "")).is_file()}
    runner = None
    htp = libs.get("libQnnHtp.so")
    roots = [htp.parents[2]] if htp is not None and len(htp.parents) > 2 else []
    for root in roots:
        candidate = root / "bin" / "aarch64-android" / RUNNER
        if candidate.is_file():
            runner = candidate
    version = data.get("qairt_version")
    if data.get("dsp_arch") and data["dsp_arch"] != dsp_arch:
        raise StageError(f"{manifest}: lists libs for {data['dsp_arch']}, the chip needs {dsp_arch} "
                         f"(rebuild the context for this chip)")
    return RuntimeLibs(source=f"{manifest} (the toolchain's SDK)", version=version,
                       version_from=f"QAIRT version in {manifest.name}" if version else "unknown", libs=libs,
                       runner=runner)


def _archive_stem(path: Path) -> str:
    name = path.name
    for suffix in ARCHIVE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def unpack(archive: Path, cache_dir: Path) -> Path:
    """Unpack an archive of runtime libs once (keyed by its content hash); return the folder."""
    from qnn_tasks.fileio import extract_safely, sha256

    if not tarfile.is_tarfile(archive):
        raise StageError(f"{archive}: not a tar archive (give a folder, or a .tar.bz2/.tar.gz/.tar.xz of one)")
    dest = cache_dir / f"{_archive_stem(archive)}-{sha256(archive)[:12]}"
    done = dest / ".unpacked"
    if not done.is_file():
        import shutil

        shutil.rmtree(dest, ignore_errors=True)
        try:
            extract_safely(archive, dest)
        except (ValueError, tarfile.TarError, OSError) as err:
            shutil.rmtree(dest, ignore_errors=True)
            raise StageError(f"runtime libs archive refused: {err}") from None
        done.write_text(str(archive) + "\n")
    return dest
