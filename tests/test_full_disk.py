"""A failing machine never leaves a passing gate (issue 34, item 1): a real small filesystem (a tmpfs mounted here).

The tiny project (one graph, real stages, real simulator) is built once on the ordinary disk, then copied whole
(specs, samples, build tree, doit's state) onto a tmpfs. One sample file is changed and the filesystem filled to
a few free bytes; `doit` must then end with one line per failed write (no traceback), a non-zero exit, and a
report.json that no gate can pass (the documented `jq` gate of docs/team.md, and `doit report`). Freeing the
space, the next `doit` repairs the tree. A read-only remount is refused in one line with exit 74.
"""
from __future__ import annotations

import errno
import json
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from conftest import Project, copy_project
from test_trust_gate import documented_gate
from tiny_project import DIM, ROWS, tiny_project

from qnn_tasks.errors import EXIT_IO, machine_failure

pytestmark = pytest.mark.slow
DISK = 24 << 20  # the tmpfs: the tiny build (~5 MiB) and its rebuild fit with room to spare


@pytest.fixture(scope="module")
def tiny_built(tmp_path_factory) -> Project:
    project = tiny_project(tmp_path_factory.mktemp("tiny-disk") / "project")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    return project


@contextmanager
def tmpfs(where: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes mounted at `where` for the block (skips the test where mounting is not allowed)."""
    where.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'mount failed'}): needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """Take all but `leave` bytes of the filesystem with one file (removed to free the space again)."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    size = st.f_bavail * st.f_frsize - leave
    if size > 0:
        with open(filler, "ab") as fh:
            os.posix_fallocate(fh.fileno(), 0, size)
    return filler


def change_sample(project: Project, seed: int) -> None:
    rng = np.random.default_rng(seed)
    np.savez(project.path("models/tiny/samples/x.npz"), x=rng.standard_normal((8, 1, ROWS, DIM)).astype(np.float32))


def gate_fails(project: Project) -> bool:
    """The documented jq gate, run as a CI job would: a missing or unreadable report fails it too (jq exits 2)."""
    run = subprocess.run(["jq", "-e", documented_gate(), "build/report/report.json"], cwd=project.root,
                         capture_output=True, text=True)
    return run.returncode != 0


def assert_no_passing_verdict(project: Project) -> None:
    report = project.path("build/report/report.json")
    if report.is_file():
        summary = json.loads(report.read_text())["summary"]
        assert not (summary["current"] and summary["complete"] and summary["failed"] == 0
                    and summary.get("pending", 0) == 0), summary
    assert gate_fails(project)


def disk_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "no space left on the device" in line]


@pytest.mark.skipif(not Path("/usr/bin/jq").exists() and not Path("/usr/local/bin/jq").exists(),
                    reason="the documented gate is a jq expression")
def test_a_full_disk_at_any_write_fails_the_gate_in_one_line_and_the_next_run_repairs(tiny_built, tmp_path):
    with tmpfs(tmp_path / "disk", DISK) as disk:
        project = copy_project(disk / "project", source=tiny_built.root, with_build=True)
        assert not gate_fails(project)  # the copied verdict: current, complete, passed
        change_sample(project, 9)
        # 0 bytes: the superseded mark, doit's state and the first output fail; 64 KiB: records fit, outputs don't;
        # 600 KB: the first stages' outputs fit, a later one does not (each run starts where the last one failed)
        for leave in (0, 64 << 10, 600_000):
            filler = fill(disk, leave)
            result = project.doit()
            output = result.stdout + result.stderr
            assert result.returncode == 1, output
            assert "Traceback" not in output, output
            lines = disk_lines(output)
            assert lines and all(": no space left on the device (fix: free space on the filesystem" in line
                                 for line in lines), output
            assert_no_passing_verdict(project)
            report = project.doit("report")
            assert report.returncode != 0 and "Traceback" not in report.stdout + report.stderr
            assert_no_passing_verdict(project)
            filler.unlink()
        repaired = project.doit()
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr
        assert {"cpucheck:tiny", "simulate:tiny-SM8650", "simverify:tiny-SM8650"} <= repaired.executed
        summary = json.loads(project.path("build/report/report.json").read_text())["summary"]
        assert summary["current"] and summary["complete"] and summary["passed"] == 1
        assert not gate_fails(project)
        assert not list(project.path("build").rglob("*.part"))


def test_a_read_only_tree_is_one_line_and_exit_74(tiny_built, tmp_path):
    with tmpfs(tmp_path / "disk", DISK) as disk:
        project = copy_project(disk / "project", source=tiny_built.root, with_build=True)
        change_sample(project, 10)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        result = project.doit()
        output = result.stdout + result.stderr
        assert result.returncode == EXIT_IO, output
        assert "Traceback" not in output, output
        [line] = [line for line in output.splitlines() if line.startswith("error: ")]
        assert "the filesystem is read-only (fix: build on a writable filesystem" in line, output


def test_each_machine_failure_is_named_with_its_fix():
    """EIO and EDQUOT cannot be made on this machine's filesystems (no quota support in its tmpfs): their lines."""
    for code, said in ((errno.ENOSPC, "no space left on the device"), (errno.EDQUOT, "disk quota exceeded"),
                       (errno.EROFS, "the filesystem is read-only"), (errno.EIO, "input/output error")):
        line = machine_failure(OSError(code, os.strerror(code), "build/x/y.onnx"))
        assert line.startswith(f"build/x/y.onnx: {said}") and "(fix: " in line, line
    assert machine_failure(OSError(errno.EACCES, "denied")) is None  # not the machine's: said as it is
