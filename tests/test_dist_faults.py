"""`doit dist` on a failing machine and into a shared folder (issue 40, item 4).

The tiny project (one graph, real stages, real simulator) is built once; `doit dist` then writes its package into
a QNN_DIST that is a file, a real tmpfs mounted here and filled to a few free bytes at every write of the package,
a read-only remount, and one folder shared by two copies of the project, each a real doit process: one stopped
(SIGSTOP) while its package is half-written, one killed (SIGKILL) there. Every failure is one line naming the path
and the reason, exit 1 (a failed task), the package before byte-identical, nothing half-written left behind.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Project, copy_project
from test_full_disk import fill, tmpfs
from tiny_project import tiny_project

from qnn_tasks.errors import QnnTasksError

DISK = 4 << 20  # the tmpfs: the tiny package (0.8 MiB) and the filler


@pytest.fixture(scope="module")
def tiny_built(tmp_path_factory) -> Project:
    project = tiny_project(tmp_path_factory.mktemp("tiny-dist") / "project")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    return project


def dist(project: Project, dest: Path, wait: float = 0) -> subprocess.CompletedProcess:
    return project.doit("dist", env={"QNN_DIST": str(dest), "QNN_LOCK_WAIT": str(wait)})


def tree(folder: Path) -> dict[str, str]:
    """Every file below `folder` (hidden ones too) -> its SHA-256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def complete(package: Path) -> bool:
    """A package whose manifest lists every file it holds, each with the bytes the manifest says."""
    files = json.loads((package / "manifest.json").read_text())["files"]
    return all(hashlib.sha256((package / rel).read_bytes()).hexdigest() == facts["sha256"]
               for rel, facts in files.items())


def the_line(result, needle: str) -> str:
    """dist's one line: exit 1 (a failed task), no traceback, exactly one `dist:tiny: ` line, containing `needle`."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    [line] = [line for line in output.splitlines() if line.startswith("dist:tiny: ")]
    assert needle in line, output
    return line


def this_host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())


def hidden(dest: Path) -> list[str]:
    """What a dist leaves beside the packages: work folders and lock files (none once it has ended)."""
    return sorted(p.name for p in dest.iterdir() if p.name.startswith(".tiny."))


def test_qnn_dist_naming_a_file_is_one_line(tiny_built, tmp_path):
    not_a_folder = tmp_path / "packages"
    not_a_folder.write_text("mine")
    line = the_line(dist(tiny_built, not_a_folder), f"dist:tiny: {not_a_folder}: is a file, not a folder")
    assert "nothing was written (fix: set QNN_DIST to a folder" in line
    line = the_line(dist(tiny_built, not_a_folder / "sub"), f"{not_a_folder}: is a file, not a folder (the "
                    f"packages' folder {not_a_folder / 'sub'} would be below it)")
    assert not_a_folder.read_text() == "mine"


@pytest.mark.slow
def test_a_full_disk_at_any_write_of_dist_is_one_line_and_keeps_the_package_before(tiny_built, tmp_path):
    with tmpfs(tmp_path / "disk", DISK) as disk:
        dest = disk / "packages"
        for leave in (0, 64 << 10):  # no package yet: the lock file, then the binary, cannot be written
            filler = fill(disk, leave)
            line = the_line(dist(tiny_built, dest), ": no space left on the device (fix: free space on the "
                            "filesystem that holds it")
            assert "nothing shipped, no package was written: " in line and f"{dest}/" in line, line
            assert ".dist-" not in line  # the package's path, not the hidden folder's
            assert not dest.exists() or list(dest.iterdir()) == []
            filler.unlink()
        assert dist(tiny_built, dest).returncode == 0
        package = dest / "tiny"
        finished = tree(package)
        # an older package: its card differs, so the next dist writes the card and the manifest, and links the rest
        with open(package / "MODEL_CARD.md", "a") as card:
            card.write("an older package\n")
        before = tree(package)
        named = set()
        # each write of the dist in turn is the one that fails, until there is room for all of them
        for leave in (*range(0, 64 << 10, 4096), 96 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20):
            filler = fill(disk, leave)
            result = dist(tiny_built, dest)
            filler.unlink()
            if result.returncode == 0:  # enough space this time: the new package, whole
                assert tree(package) == finished and complete(package)
                break
            line = the_line(result, ": no space left on the device (fix: free space on the filesystem")
            assert "nothing shipped, the package before is kept: " in line, line
            named.add(line.split(": ")[2])
            assert tree(package) == before  # byte-identical, never half-replaced
            assert hidden(dest) == []
        assert f"{dest}/.tiny.dist.lock" in named and f"{package}/manifest.json" in named, named
        assert tree(package) == finished and hidden(dest) == []


@pytest.mark.slow
def test_a_read_only_qnn_dist_is_one_line(tiny_built, tmp_path):
    with tmpfs(tmp_path / "disk", DISK) as disk:
        dest = disk / "packages"
        assert dist(tiny_built, dest).returncode == 0
        before = tree(dest)
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        line = the_line(dist(tiny_built, dest), "the filesystem is read-only (fix: ")
        assert line.startswith(f"dist:tiny: nothing shipped, the package before is kept: {dest}/"), line
        assert tree(dest) == before


def started(project: Project, dest: Path) -> subprocess.Popen | None:
    """`doit dist` in `project`, stopped (SIGSTOP) as soon as its half-written package folder exists in `dest`;
    None when it finished before it could be stopped (the caller tries again)."""
    env = {**os.environ, "QNN_DIST": str(dest), "QNN_LOCK_WAIT": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "doit", "dist"], cwd=project.root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        if any(p.is_dir() and p.name.startswith(".tiny.dist-") for p in dest.iterdir()):
            proc.send_signal(signal.SIGSTOP)
            break
        time.sleep(0.001)
    if [p for p in dest.iterdir() if p.is_dir() and p.name.startswith(".tiny.dist-")]:
        return proc
    proc.kill()
    proc.communicate()
    return None


def half_written(project: Project, dest: Path) -> tuple[subprocess.Popen, Path]:
    """A real dist stopped mid-package, and its folder."""
    dest.mkdir(exist_ok=True)
    for _ in range(5):
        proc = started(project, dest)
        if proc is not None:
            [folder] = [p for p in dest.iterdir() if p.is_dir() and p.name.startswith(".tiny.dist-")]
            return proc, folder
    pytest.fail("the dist finished five times before it could be stopped mid-package")


@pytest.mark.slow
def test_two_projects_sharing_one_qnn_dist_never_remove_each_others_work(tiny_built, tmp_path):
    first = copy_project(tmp_path / "first", source=tiny_built.root, with_build=True)
    second = copy_project(tmp_path / "second", source=tiny_built.root, with_build=True)
    dest = tmp_path / "shared"
    proc, folder = half_written(first, dest)
    try:
        writing = tree(folder)
        line = the_line(dist(second, dest), "another dist is writing tiny's package into this folder")
        assert f"(pid {proc.pid} on {this_host()}, since " in line and f"for the project {first.root})" in line
        assert "nothing was touched (fix: run doit dist again when it has finished, or set QNN_LOCK_WAIT" in line
        assert tree(folder) == writing and not (dest / "tiny").exists()
        assert folder.name == f".tiny.dist-{this_host()}-{proc.pid}"  # its owner, in its name
        waiting = subprocess.Popen([sys.executable, "-m", "doit", "dist"], cwd=second.root, text=True,
                                   env={**os.environ, "QNN_DIST": str(dest), "QNN_LOCK_WAIT": "120"},
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(2)  # it is waiting now (it takes the lock only after the first lets go)
        assert waiting.poll() is None
    finally:
        proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in out + err, out + err
    out, err = waiting.communicate(timeout=120)
    assert waiting.returncode == 0 and "Traceback" not in out + err, out + err
    assert f"dist:tiny: waiting for the dist writing {dest}/tiny (pid {proc.pid} on " in err, err
    assert sorted(p.name for p in dest.iterdir()) == ["tiny"] and complete(dest / "tiny")
    # and started at the same moment, again and again: each waits for the other, neither fails
    for _ in range(3):
        both = [subprocess.Popen([sys.executable, "-m", "doit", "dist"], cwd=p.root, text=True,
                                 env={**os.environ, "QNN_DIST": str(dest), "QNN_LOCK_WAIT": "120"},
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for p in (first, second)]
        for run in both:
            out, err = run.communicate(timeout=300)
            assert run.returncode == 0 and "Traceback" not in out + err, out + err
        assert sorted(p.name for p in dest.iterdir()) == ["tiny"] and complete(dest / "tiny")


@pytest.mark.slow
def test_a_dead_owners_leftover_is_swept_and_a_live_or_foreign_one_kept(tiny_built, tmp_path):
    dest = tmp_path / "shared"
    proc, folder = half_written(tiny_built, dest)
    proc.kill()  # SIGKILL mid-package: nothing can clean up
    proc.communicate()
    assert folder.is_dir() and not (folder / "manifest.json").exists()
    foreign = dest / ".tiny.dist-elsewhere.example-4242"  # another host's: this one cannot tell if it still writes
    live = dest / f".tiny.dist-{this_host()}-{os.getpid()}"  # this test's own process: alive
    legacy = dest / ".tiny.dist-31337"  # an older dist's name, no host in it
    for kept in (foreign, live, legacy):
        (kept / "SM8650").mkdir(parents=True)
    result = dist(tiny_built, dest)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, output
    assert not folder.exists()  # the dead owner's: swept
    assert hidden(dest) == sorted(p.name for p in (foreign, live, legacy)) and complete(dest / "tiny")
    for kept, why in ((foreign, "written by pid 4242 on elsewhere.example, which this machine cannot check"),
                      (live, f"its owner, pid {os.getpid()} on this machine, is running"),
                      (legacy, "its name does not say which process wrote it")):
        assert f"dist:tiny: {kept.name} left in place ({why}); remove it once that dist has ended" in output, output


def test_each_refused_write_names_the_package_path_and_its_fix(tmp_path):
    """What the tmpfs cannot make here (EIO, EDQUOT, permission denied: the tests run as root), by its line: the
    package's path, never the hidden folder's nor (for a full disk) the copy's source; other errors are not hidden."""
    import errno

    from qnn_tasks.ship import package

    dest, tmp = tmp_path / "packages" / "tiny", tmp_path / "packages" / ".tiny.dist-host-1"
    cases = [(OSError(errno.EIO, "Input/output error", str(tmp / "manifest.json")),
              f"nothing shipped, no package was written: {dest}/manifest.json: input/output error"),
             (OSError(errno.EDQUOT, "Disk quota exceeded", "build/tiny/x.bin", None, str(tmp / "SM8650/x.bin")),
              f"{dest}/SM8650/x.bin: disk quota exceeded (fix: free space or raise your quota"),
             (PermissionError(errno.EACCES, "Permission denied", str(tmp)),
              f"{dest}: Permission denied (fix: set QNN_DIST to a folder you can write"),
             (PermissionError(errno.EACCES, "Permission denied", str(tmp_path)),
              f"{tmp_path}: Permission denied (fix: set QNN_DIST to a folder you can write"),
             (PermissionError(errno.EACCES, "Permission denied", "build/tiny/x.bin"),
              "build/tiny/x.bin: Permission denied (fix: check who may read it)")]
    for err, said in cases:
        line = package._refused(err, tmp, dest)
        assert isinstance(line, QnnTasksError) and said in str(line) and "\n" not in str(line), (str(line), said)
    bug = FileNotFoundError(errno.ENOENT, "No such file or directory", "x")
    assert package._refused(bug, tmp, dest) is bug  # a bug keeps its traceback
