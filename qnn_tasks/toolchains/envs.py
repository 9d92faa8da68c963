"""Pinned toolchain environments: a profile's `packages:` get an isolated interpreter of their own.

Two onnxruntime-qnn versions cannot live in one interpreter (each needs its own onnxruntime;
docs/toolchains.md), so a profile such as

    kind: ort-qnn
    packages: [onnxruntime-qnn==2.3.0, onnxruntime==1.24.4]

runs its heavy stages in a virtual environment made once with uv (fast, caches wheels) and
reused: keyed by the package list and this Python's version, under $QNN_ENVS_DIR (default
~/.cache/qnn-npu-compile/envs). The environment holds the pinned packages plus what the stage code
imports (numpy, onnx and ml_dtypes at this interpreter's versions, PyYAML, matplotlib); qnn_tasks
itself comes from this checkout through PYTHONPATH, so both sides run the same code. Versions are
read from the environment's package metadata without starting it.

    python -m qnn_tasks.toolchains.makeenv ort-qnn-2.47    # create it now (install.sh does)
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from qnn_tasks.errors import ToolchainError
from qnn_tasks.modelspec.project import ToolchainProfile

ENV_DIR = "QNN_ENVS_DIR"
# What the stage code imports in a child process besides the pinned toolchain packages.
SUPPORT = ("numpy", "PyYAML", "matplotlib")


@dataclass(frozen=True)
class Env:
    path: Path
    python: Path
    site_packages: Path

    def version(self, package: str) -> str | None:
        for dist in importlib.metadata.distributions(path=[str(self.site_packages)]):
            if _normal(dist.metadata["Name"] or "") == _normal(package):
                return dist.version
        return None


def root() -> Path:
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "qnn-npu-compile" / "envs")


def requirements(profile: ToolchainProfile) -> list[str]:
    """The pinned packages, plus this project's onnx (and its ml_dtypes) pins and the support packages (unpinned)."""
    pinned = {_normal(p.split("==")[0]) for p in profile.packages}
    extra = [f"{name}=={importlib.metadata.version(name)}" for name in ("onnx", "ml_dtypes")] + list(SUPPORT)
    return list(profile.packages) + [r for r in extra if _normal(re.split(r"[=<>]", r)[0]) not in pinned]


def location(profile: ToolchainProfile) -> Path:
    key = "\n".join(sorted(requirements(profile)) + [f"python{sys.version_info[0]}.{sys.version_info[1]}"])
    return root() / f"{profile.kind}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def find(profile: ToolchainProfile) -> Env | None:
    """The environment if it exists (nothing is created)."""
    path = location(profile)
    python = path / "bin" / "python"
    sites = sorted((path / "lib").glob("python3*/site-packages")) if python.exists() else []
    return Env(path, python, sites[0]) if sites and (path / ".complete").is_file() else None


def ensure(profile: ToolchainProfile, quiet: bool = False) -> Env:
    """The profile's environment, created (once, under a lock, atomically) if it does not exist yet."""
    env = find(profile)
    if env is not None:
        return env
    path = location(profile)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another doit may be creating the same one
        env = find(profile)
        if env is not None:
            return env
        if not quiet:
            print(f"creating the pinned environment of {profile.file} ({', '.join(profile.packages)}) in {path} "
                  f"(once; uv caches the wheels) ...", file=sys.stderr, flush=True)
        tmp = Path(f"{path}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _uv(["venv", "--quiet", "--python", sys.executable, str(tmp)], profile)
            _uv(["pip", "install", "--quiet", "--python", str(tmp / "bin" / "python"), *requirements(profile)], profile)
            (tmp / ".complete").write_text("\n".join(requirements(profile)) + "\n")
            shutil.rmtree(path, ignore_errors=True)
            os.replace(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    env = find(profile)
    assert env is not None
    return env


def _uv(args: list[str], profile: ToolchainProfile) -> None:
    command = [_uv_binary(), *args]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode == 0:
        return
    text = (proc.stderr or proc.stdout).strip()
    culprit = next((p for p in profile.packages if p.split("==")[0].lower() in text.lower()), None)
    reason = next((line.strip(" ×╰─▶") for line in text.splitlines() if line.strip(" ×╰─▶")), "uv failed")
    raise ToolchainError(f"{profile.file}: packages: cannot create the pinned environment"
                         + (f" ({culprit})" if culprit else "") + f": {reason} (fix: pin versions that exist "
                         f"for this platform, e.g. pip index versions {(culprit or 'onnxruntime-qnn').split('==')[0]})")


def _uv_binary() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise ToolchainError("uv is not installed (fix: pip install uv; pinned toolchain environments are made with it)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
