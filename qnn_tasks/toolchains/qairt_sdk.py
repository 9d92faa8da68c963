"""What a QAIRT SDK folder is: its root, version, tools, environment and the runtime libs a phone needs.

Only small files are read and nothing is run here except `environment()` (which sources the SDK's
bin/envsetup.sh once, when a stage first needs it), so `doit list` stays instant.
Layout of a real SDK (what the stand-in in tests/standins/qairt_sdk mirrors):

    qairt/<version>/            the SDK root ($QNN_SDK_ROOT after `source bin/envsetup.sh`)
      sdk.yaml                  name, version (and build id)
      bin/envsetup.sh, bin/check-linux-dependency.sh, bin/check-python-dependency
      bin/x86_64-linux-clang/   qnn-onnx-converter, qnn-model-lib-generator, qnn-context-binary-generator
      lib/x86_64-linux-clang/   libQnnHtp.so (host backend), libQnnHtpNetRunExtensions.so ...
      lib/aarch64-android/      libQnnHtp.so, libQnnSystem.so, libQnnHtpV<arch>Stub.so (the phone's CPU side)
      lib/hexagon-v<arch>/unsigned/libQnnHtpV<arch>Skel.so   (runs on the DSP)
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qnn_tasks.errors import ToolchainError

HOST = "x86_64-linux-clang"
ANDROID = "aarch64-android"
CONVERTER = f"bin/{HOST}/qnn-onnx-converter"
MODEL_LIB_GENERATOR = f"bin/{HOST}/qnn-model-lib-generator"
CONTEXT_GENERATOR = f"bin/{HOST}/qnn-context-binary-generator"
HTP_BACKEND = f"lib/{HOST}/libQnnHtp.so"
NETRUN_EXTENSIONS = f"lib/{HOST}/libQnnHtpNetRunExtensions.so"
ENVSETUP = "bin/envsetup.sh"
CHECK_LINUX = "bin/check-linux-dependency.sh"
CHECK_PYTHON = "bin/check-python-dependency"
MARKERS = (ENVSETUP, CONVERTER, MODEL_LIB_GENERATOR, CONTEXT_GENERATOR, HTP_BACKEND)
VERSION_RE = re.compile(r"^v?(\d+\.\d+\.\d+(?:\.\d+)?)$")
SDK_FIX = ("point settings.sdk_root in toolchain/qairt.yaml (or QNN_SDK_ROOT, which "
           "`source qairt/<version>/bin/envsetup.sh` sets) at the qairt/<version> folder that holds bin/, lib/ and sdk.yaml")


@dataclass(frozen=True)
class Sdk:
    root: Path | None
    source: str                       # where the root came from: "settings.sdk_root", "QNN_SDK_ROOT" or "none"
    problem: str | None               # why this is not a usable SDK root (None: it is)
    version: str | None
    meta: dict[str, str]              # sdk.yaml's top-level scalars

    def path(self, rel: str) -> Path:
        self.require()
        return self.root / rel

    def require(self) -> None:
        if self.problem:
            raise ToolchainError(self.problem)

    def identity(self) -> dict[str, Any]:
        """What the fingerprint records of the SDK: version sources, never the path."""
        return {"version": self.version, "folder": self.root.name if self.root else None, "sdk_yaml": self.meta,
                "problem": self.problem is not None}


def locate(setting: str | None) -> Sdk:
    """Find the SDK root (settings.sdk_root, else $QNN_SDK_ROOT) and say what is wrong with it, cheaply."""
    if setting:
        root, source = Path(os.path.expanduser(os.path.expandvars(setting))), "settings.sdk_root"
    elif os.environ.get("QNN_SDK_ROOT"):
        root, source = Path(os.environ["QNN_SDK_ROOT"]), "QNN_SDK_ROOT"
    else:
        return Sdk(None, "none", f"no QAIRT SDK: settings.sdk_root is not set and QNN_SDK_ROOT is empty (fix: {SDK_FIX})",
                   None, {})
    if not root.is_dir():
        return Sdk(root, source, f"QAIRT SDK root {root} (from {source}) does not exist (fix: {SDK_FIX})", None, {})
    missing = [m for m in MARKERS if not (root / m).is_file()]
    if missing:
        inner = sorted(p.parent.name for p in root.glob("*/sdk.yaml")) + sorted(
            f"qairt/{p.parent.name}" for p in root.glob("qairt/*/sdk.yaml"))
        hint = f"; did you mean {root / inner[-1]}?" if inner else ""
        return Sdk(root, source, f"{root} (from {source}) is not a QAIRT SDK root: no {missing[0]}{hint} "
                                 f"(fix: {SDK_FIX})", None, {})
    meta = _read_meta(root / "sdk.yaml")
    version = _version(root, meta)
    problem = None if version else (f"{root}: cannot tell the QAIRT version (no version in sdk.yaml and the folder "
                                    f"name is not one) (fix: {SDK_FIX})")
    return Sdk(root, source, problem, version, meta)


def _read_meta(path: Path) -> dict[str, str]:
    """sdk.yaml's `key: value` lines (a tiny file; no YAML parser needed for scalars)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    return {k: v.strip().strip("'\"") for k, v in re.findall(r"^([A-Za-z_]+):[ \t]*(\S[^\n#]*?)[ \t]*(?:#.*)?$", text, re.M)}


def _version(root: Path, meta: dict[str, str]) -> str | None:
    """The folder name when it is a version (qairt/2.40.0.251030), else sdk.yaml's version (+ build id)."""
    match = VERSION_RE.match(root.name)
    if match:
        return match.group(1)
    version = meta.get("version")
    if version and VERSION_RE.match(version):
        version = VERSION_RE.match(version).group(1)
        build = meta.get("build_id")
        return f"{version}.{build}" if build and version.count(".") == 2 else version
    return None


# ------------------------------------------------------------------ interpreter and NDK

def python_for_sdk(setting: str | None) -> tuple[Path | None, str | None]:
    """The SDK converter's interpreter: settings.python, else python3.10 on PATH. (path, problem)."""
    fix = ("set settings.python in toolchain/qairt.yaml to a Python 3.10 with numpy<2 onnx==1.17.0 onnxruntime onnxsim "
           "(e.g. a venv: python3.10 -m venv /opt/qairt-py310)")
    if setting:
        path = Path(os.path.expanduser(os.path.expandvars(setting)))
        if not path.is_file() or not os.access(path, os.X_OK):
            return path, f"the SDK's Python {path} (settings.python) does not exist or is not executable (fix: {fix})"
        return path, None
    found = shutil.which("python3.10")
    if found:
        return Path(found), None
    return None, f"no Python for the SDK's converter: settings.python is not set and python3.10 is not on PATH (fix: {fix})"


def python_version(python: Path | None) -> str | None:
    """The interpreter's version from its venv's pyvenv.cfg when there is one (a small file; nothing is run)."""
    if python is None:
        return None
    cfg = python.parent.parent / "pyvenv.cfg"
    try:
        match = re.search(r"^version(?:_info)?\s*=\s*(\S+)", cfg.read_text(), re.M)
    except OSError:
        return None
    return match.group(1) if match else None


def find_ndk(setting: str | None) -> tuple[Path | None, str]:
    """The Android NDK root (a folder holding ndk-build): settings.ndk, $ANDROID_NDK_ROOT, ndk-build on PATH.

    Returns (root or None, how it was found or why it was not).
    """
    candidates = []
    if setting:
        candidates.append((Path(os.path.expanduser(os.path.expandvars(setting))), "settings.ndk"))
    if os.environ.get("ANDROID_NDK_ROOT"):
        candidates.append((Path(os.environ["ANDROID_NDK_ROOT"]), "ANDROID_NDK_ROOT"))
    on_path = shutil.which("ndk-build")
    if on_path:
        candidates.append((Path(on_path).resolve().parent, "ndk-build on PATH"))
    rejected = []
    for root, source in candidates:
        if (root / "ndk-build").is_file():
            return root, source
        rejected.append(f"{source}={root} has no ndk-build")
    why = "; ".join(rejected) if rejected else "settings.ndk is not set, ANDROID_NDK_ROOT is empty and ndk-build is not on PATH"
    return None, f"no Android NDK ({why})"


def ndk_revision(root: Path) -> str | None:
    try:
        match = re.search(r"Pkg\.Revision\s*=\s*(\S+)", (root / "source.properties").read_text())
    except OSError:
        return None
    return match.group(1) if match else None


# ------------------------------------------------------------------ environment

_ENV_CACHE: dict[str, dict[str, str]] = {}


def environment(sdk: Sdk) -> dict[str, str]:
    """os.environ after `source <sdk>/bin/envsetup.sh` (run once per SDK and process)."""
    sdk.require()
    key = str(sdk.root)
    if key not in _ENV_CACHE:
        script = sdk.root / ENVSETUP
        proc = subprocess.run(["bash", "-c", 'cd "$(dirname "$1")" && source "$1" >&2 && env -0', "envsetup", str(script)],
                              capture_output=True, env=dict(os.environ))
        if proc.returncode != 0:
            raise ToolchainError(f"`source {script}` failed (exit {proc.returncode}): "
                                 f"{proc.stderr.decode(errors='replace').strip()[-400:]} (fix: {SDK_FIX})")
        env = dict(item.split("=", 1) for item in proc.stdout.decode(errors="replace").split("\0") if "=" in item)
        env.pop("PWD", None)
        env.pop("OLDPWD", None)
        _ENV_CACHE[key] = env
    return dict(_ENV_CACHE[key])


# ------------------------------------------------------------------ what a phone needs

def runtime_libs(sdk: Sdk, dsp_arch: str) -> dict[str, Any]:
    """The Android libs (with paths and sizes) a phone needs to run a binary for `dsp_arch` (docs/shipping.md)."""
    arch = dsp_arch.lstrip("v")
    wanted = [
        ("libQnnHtp.so", f"lib/{ANDROID}", "HTP backend (CPU side): QnnConfig backendLib", "LD_LIBRARY_PATH"),
        ("libQnnSystem.so", f"lib/{ANDROID}", "system library (reads the context binary): QnnConfig systemLib",
         "LD_LIBRARY_PATH"),
        (f"libQnnHtpV{arch}Stub.so", f"lib/{ANDROID}", f"CPU-side stub for the {dsp_arch} DSP", "LD_LIBRARY_PATH"),
        (f"libQnnHtpV{arch}Skel.so", f"lib/hexagon-{dsp_arch}/unsigned", f"DSP-side skeleton for {dsp_arch}",
         "ADSP_LIBRARY_PATH"),
    ]
    libs = []
    for name, folder, role, search_path in wanted:
        path = sdk.root / folder / name if sdk.root else Path(folder) / name
        present = path.is_file()
        libs.append({"name": name, "path": str(path), "present": present, "size": path.stat().st_size if present else None,
                     "role": role, "device_search_path": search_path})
    return {"qairt_version": sdk.version, "dsp_arch": dsp_arch, "libs": libs,
            "missing": [lib["name"] for lib in libs if not lib["present"]],
            "note": "ship these with the context binary, from the same QAIRT version that built it "
                    "(a runtime older than the compiler fails with err 5000/5005); ADSP_LIBRARY_PATH must "
                    "include the Skel's folder (';'-separated)"}
