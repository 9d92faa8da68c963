"""A cache of the loaded project specs, so a no-op `doit` neither imports nor parses YAML.

Valid while every spec file (socs.yaml, models/*/model.yaml and their export.py, the toolchain
profile), the spec code itself and the model.yaml sections the project's own stages declare (and the files
declaring them) are the same, for the same toolchain name and Python. Anything else (a corrupt or stale cache
included) just means loading the YAML.
"""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # modelspec/project.py reads and writes its cache through this module: importing it would be a cycle
    from qnn_tasks.modelspec.project import Project

CACHE = ".qnn-specs.cache"


def _fingerprint(root: Path, toolchain: str) -> tuple:
    from qnn_tasks import codekeys
    from qnn_tasks.modelspec import stagesettings

    data = Path(__file__).resolve().parents[1] / "data"  # the packaged table and profiles under the project's
    files = [root / "socs" / "socs.yaml", data / "socs.yaml"]
    for name in toolchain.split(","):  # the project's profile and the packaged one it may override
        files += [root / "toolchain" / f"{name.strip()}.yaml", data / "toolchain" / f"{name.strip()}.yaml"]
    for model_yaml in sorted((root / "models").glob("*/model.yaml")):
        files += [model_yaml, model_yaml.with_name("export.py")]
    stats = []
    for path in files:
        try:
            st = os.stat(path)
            stats.append((str(path), st.st_mtime_ns, st.st_size))
        except FileNotFoundError:
            stats.append((str(path), None, None))
    # the spec code itself: every module the loader imports, derived from its imports; and the sections of the
    # stages this project registered (dodo.py): their checks and defaults are in the loaded spec
    return (sys.version_info[:2], toolchain, str(root), tuple(stats), codekeys.digest(("qnn_tasks.modelspec.load",)),
            stagesettings.fingerprint())


def read(root: Path, toolchain: str) -> Project | None:
    try:
        with open(root / CACHE, "rb") as fh:
            fingerprint, project = pickle.load(fh)
    except Exception:  # missing, truncated, from another version: load the YAML instead
        return None
    return project if fingerprint == _fingerprint(root, toolchain) else None


def write(root: Path, toolchain: str, project: Project) -> None:
    tmp = root / f"{CACHE}.{os.getpid()}.part"
    try:
        with open(tmp, "wb") as fh:
            pickle.dump((_fingerprint(root, toolchain), project), fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, root / CACHE)
    except OSError:  # a read-only checkout (or a full disk) still works, just without the cache
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # read-only: nothing was written
            pass
