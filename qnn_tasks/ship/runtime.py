"""The QNN runtime libraries a phone needs per Hexagon arch, from the configured source, same QNN as the compiler.

The source is the one `doit verify` uses (qnn/runtimelibs.py): $QNN_RUNTIME_LIBS, else the profile's
`settings.runtime_libs`, else the qairt toolchain's runtime_libs.json beside a binary. Libraries of another
QNN version than the compiler's are refused (a runtime older than the binary fails with 5000/5005; a newer
one was never verified). With no source, nothing is copied: the manifest lists exactly which files and which
version are required (`shipped: false`) and dist says so in one line.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.qnn import runtimelibs

ANDROID_ABI = "arm64-v8a"


def plan(archs: list[str], compiler_qnn: str | None, settings: dict[str, Any], profile_file: Path, root: Path,
         manifests: dict[str, Path], cache_dir: Path) -> tuple[dict[str, Any], dict[str, dict[str, Path]], str | None]:
    """(manifest's runtime_libs per arch, arch -> {file name: source path} to copy, the one line to print or None).

    manifests: arch -> a qairt runtime_libs.json of one of its binaries (the SDK's libs), where there is one.
    """
    entries: dict[str, Any] = {}
    copies: dict[str, dict[str, Path]] = {}
    configured = runtimelibs.configured_path(settings, profile_file, root)
    missing = []
    for arch in sorted(archs):
        required = runtimelibs.required_libs(arch)
        manifest = manifests.get(arch)
        if configured is None and manifest is None:
            missing.append(arch)
            entries[arch] = _entry(arch, compiler_qnn, required, source=None)
            continue
        libs = _resolve(settings, profile_file, root, manifest, arch, cache_dir)
        if runtimelibs.version_tuple(libs.version) != runtimelibs.version_tuple(compiler_qnn):
            raise StageError(f"runtime libs {libs.source}: QNN {libs.version or 'unknown'} (from {libs.version_from}), "
                             f"the binaries were compiled with QNN {compiler_qnn}: a phone needs the compiler's "
                             "version "
                             f"(fix: point {runtimelibs.ENV} at the QNN {compiler_qnn} libraries)")
        copies[arch] = {name: libs.libs[name] for name, _ in required}
        entries[arch] = _entry(arch, libs.version, required, source=_given(configured, manifest))
    line = None
    if missing:
        names = "; ".join(f"{a}: {', '.join(n for n, _ in runtimelibs.required_libs(a))}" for a in missing)
        line = (f"runtime libs NOT shipped (no source configured): the phone needs QNN {compiler_qnn} {names} "
                f"(listed in manifest.json runtime_libs; {runtimelibs.SHIP_HINT})")
    return entries, copies, line


def _resolve(settings, profile_file, root, manifest, arch, cache_dir) -> runtimelibs.RuntimeLibs:
    """The arch's four libraries (a phone runs no qnn-net-run from a package: the runner is not required)."""
    try:
        return runtimelibs.resolve(settings, profile_file, root, manifest, arch, cache_dir)
    except StageError as err:
        if runtimelibs.RUNNER not in str(err):
            raise
    configured = runtimelibs.configured_path(settings, profile_file, root)
    if configured is None:
        return runtimelibs.from_manifest(manifest, arch)
    path, given = configured
    folder = runtimelibs.unpack(path, cache_dir) if path.is_file() else path
    name = path.name if path.is_dir() else folder.name
    return runtimelibs.from_folder(folder, arch, f"{path} ({given})", name_for_version=name)


def _given(configured: tuple[Path, str] | None, manifest: Path | None) -> str:
    """How the source was given, without this machine's paths (the package must not depend on where it was made)."""
    if configured is None:
        return "the qairt SDK (runtime_libs.json)"
    return runtimelibs.ENV if configured[1].startswith(runtimelibs.ENV) else f"settings.{runtimelibs.SETTING}"


def _entry(arch: str, version: str | None, required: list[tuple[str, str]], source: str | None) -> dict[str, Any]:
    """The manifest's runtime_libs entry of one arch; `path` (and digests, added as copied) only when shipped."""
    return {"qnn_version": version, "shipped": source is not None, "source": source, "abi": ANDROID_ABI,
            "files": [{"name": name, "search_path": search,
                       **({"path": f"runtime-libs/{arch}/{name}"} if source is not None else {})}
                      for name, search in required]}
