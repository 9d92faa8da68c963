# Stand-in for the Android QNN runtime libs folder (`qnn-libs-<version>`, as sherpa-onnx publishes it), for tests only.
"""Writes a qnn-libs folder whose .so files are PLACEHOLDERS (a few lines of text, not libraries) plus the
stand-in `qnn-net-run` runner, so the device flow (find the libs, check the arch and version, push, set
LD_LIBRARY_PATH / ADSP_LIBRARY_PATH, run) can be tested without the proprietary QNN SDK.

    from standins.qnn_libs import make_qnn_libs, make_archive
    libs = make_qnn_libs(tmp / "qnn-libs-2.51.0", "2.51.0", archs=["v75", "v79"])
    archive = make_archive(libs, tmp / "qnn-libs-2.51.0.tar.bz2")

Layout (flat, like sherpa-onnx's archive): libQnnHtp.so, libQnnSystem.so, libQnnHtpV<NN>Stub.so and
libQnnHtpV<NN>Skel.so per arch, qnn-net-run, VERSION (the version marker), README.txt (says what this is).
Each placeholder holds `QNN-STANDIN-PLACEHOLDER`, `qnn_version=<version>` and a QNN-style build id
`v<version>.<date>`, which is how the stand-in runner tells the runtime's version (a real libQnnHtp.so
knows its own build). `qnn-net-run` is a /bin/sh wrapper that moves LD_LIBRARY_PATH aside and execs
tests/standins/qnn_net_run.py with this host's Python.
"""
from __future__ import annotations

import os
import shlex
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STANDINS = HERE.parent
RUNNER_SCRIPT = STANDINS / "qnn_net_run.py"
REPO = STANDINS.parent.parent
MARK = "QNN-STANDIN-PLACEHOLDER"


def placeholder(name: str, version: str) -> str:
    return (f"{MARK}: {name} is NOT a library. A placeholder written by tests/standins/qnn_libs for tests of the\n"
            f"device flow; the stand-in qnn-net-run reads this text instead of loading a real QNN runtime.\n"
            f"name={name}\nqnn_version={version}\nbuild_id=v{version}.000000000000\n")


def runner_wrapper(socs_yaml: Path | None) -> str:
    exe = sys.executable
    lines = ["#!/bin/sh",
             "# Stand-in qnn-net-run (tests only): runs tests/standins/qnn_net_run.py on the host's Python.",
             "# LD_LIBRARY_PATH points at placeholder .so files: keep it away from the host's loader.",
             'export STANDIN_LD_LIBRARY_PATH="$LD_LIBRARY_PATH"',
             "unset LD_LIBRARY_PATH",
             f"export PYTHONPATH={shlex.quote(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}"]
    if socs_yaml is not None:
        lines.append(f"export STANDIN_SOCS_YAML={shlex.quote(str(socs_yaml))}")
    lines.append(f'exec {shlex.quote(exe)} {shlex.quote(str(RUNNER_SCRIPT))} "$@"')
    return "\n".join(lines) + "\n"


def make_qnn_libs(dest: Path, version: str, archs=("v75", "v79"), *, runner: bool = True, skip: tuple[str, ...] = (),
                  version_file: bool = True,
                  socs_yaml: Path | None = REPO / "qnn_tasks" / "data" / "socs.yaml") -> Path:  # the packaged table
    """A stand-in qnn-libs folder at `dest`; `skip` leaves out files by name (e.g. libQnnHtpV79Skel.so)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    names = ["libQnnHtp.so", "libQnnSystem.so"]
    for arch in archs:
        n = arch.lstrip("v")
        names += [f"libQnnHtpV{n}Stub.so", f"libQnnHtpV{n}Skel.so"]
    for name in names:
        if name not in skip:
            (dest / name).write_text(placeholder(name, version))
    if version_file:
        (dest / "VERSION").write_text(f"{version}\n")
    (dest / "README.txt").write_text(
        "Stand-in QNN runtime libs for tests: every .so here is a text PLACEHOLDER, not an Android library.\n"
        "qnn-net-run is a wrapper around tests/standins/qnn_net_run.py (runs the binary on the x86 HTP simulator).\n")
    if runner and "qnn-net-run" not in skip:
        path = dest / "qnn-net-run"
        path.write_text(runner_wrapper(socs_yaml))
        os.chmod(path, 0o755)
    return dest


def make_archive(folder: Path, archive: Path) -> Path:
    """`qnn-libs-<version>.tar.bz2` of the folder (entries under the folder's name)."""
    with tarfile.open(archive, "w:bz2") as tar:
        tar.add(folder, arcname=folder.name)
    return archive
