"""`qnn-npu-compile init` / `python -m qnn_tasks` (fast: no build; the wheel test builds for real)."""
from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from qnn_tasks.scaffold import FILES


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qnn_tasks", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_init_scaffolds_a_project_that_lists(tmp_path):
    made = cli("init", "proj", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    root = tmp_path / "proj"
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(FILES)
    dodo = (root / "dodo.py").read_text()
    assert len([line for line in dodo.splitlines() if not line.startswith('"""')]) == 2  # two lines of code
    assert (root / ".gitignore").read_text().split() == ["build/", "dist/", ".doit.db*", ".qnn-specs.cache*"]
    workflow = (root / ".github/workflows/qnn-npu-compile.yml").read_text()
    assert "- run: doit" in workflow and "path: build/report/" in workflow and "if: always()" in workflow
    listing = subprocess.run([sys.executable, "-m", "doit", "list", "--all"], cwd=root, capture_output=True, text=True,
                             timeout=120)
    assert listing.returncode == 0 and listing.stderr == "", listing.stderr
    assert "socscheck:ort-qnn" in listing.stdout  # the packaged toolchain profile, no toolchain/ folder needed


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path):
    (tmp_path / ".gitignore").write_text("mine\n")
    (tmp_path / "socs").mkdir()
    (tmp_path / "socs" / "socs.yaml").write_text("socs: {}\n")
    refused = cli("init", ".", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    line, = refused.stderr.splitlines()
    assert line == ("error: .: init would overwrite socs/socs.yaml, .gitignore (fix: init an empty folder, or move "
                    "those files away first; nothing was written)")
    assert (tmp_path / ".gitignore").read_text() == "mine\n"
    assert not (tmp_path / "dodo.py").exists() and not (tmp_path / "models").exists()


def test_socs_and_explain_commands(tmp_path):
    listed = cli("socs", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert "w8a16 " in rows["SM7550"] and "fp16" not in rows["SM7550"].split()[3] and "Snapdragon 7 Gen 3" in rows["SM7550"]
    assert " yes " in rows["SM8650"] and " yes " not in rows["SM7550"]  # the default chips
    log = tmp_path / "compile.log"
    log.write_text("[W:onnxruntime:, qnn_model_wrapper.cc:565 CreateQnnNode] QNN.backendValidateOpConfig() failed for "
                   "node `Relu1` of type `Relu` with error code 3110\n")
    explained = cli("explain", str(log), cwd=tmp_path)
    assert explained.returncode == 0
    assert explained.stdout.startswith(f"{log}: QNN error 3110 (QNN_OP_PACKAGE_ERROR_VALIDATION_FAILURE)")


def refused_line(result: subprocess.CompletedProcess) -> str:
    """A refusal is exit 2, one line on stderr, nothing on stdout."""
    assert result.returncode == 2 and result.stdout == "", (result.returncode, result.stdout, result.stderr)
    line, = result.stderr.splitlines()
    assert "Traceback" not in line and line.endswith("nothing was written)"), line
    return line


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_init_under_a_file_refuses_in_one_line(tmp_path):
    (tmp_path / "notes").write_text("mine\n")
    line = refused_line(cli("init", "notes/proj", cwd=tmp_path))
    assert line == ("error: notes/proj: notes is a file, not a folder (fix: name a folder to create the project in; "
                    "nothing was written)")
    assert tree(tmp_path) == ["notes"] and (tmp_path / "notes").read_text() == "mine\n"


def test_init_checks_every_folder_before_writing_any_file(tmp_path):
    """`.github` is a file: today's init wrote dodo.py, models/, socs/ and .gitignore before failing on it."""
    (tmp_path / ".github").write_text("mine\n")
    line = refused_line(cli("init", ".", cwd=tmp_path))
    assert line == ("error: .: .github is a file, but init writes .github/workflows/qnn-npu-compile.yml (fix: move "
                    ".github away, or init another folder; nothing was written)")
    assert tree(tmp_path) == [".github"]


def test_init_never_writes_through_a_symlink_out_of_the_folder(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    project = tmp_path / "proj"
    project.mkdir()
    (project / "models").symlink_to(outside)
    line = refused_line(cli("init", "proj", cwd=tmp_path))
    assert line.startswith(f"error: proj: models is a symlink (to {outside}) and init writes only inside proj (fix: ")
    assert tree(outside) == [] and tree(project) == ["models"]


@contextmanager
def tmpfs(where: Path, size: str, read_only: bool = False):
    """A real small filesystem mounted at `where` (needs root and mount rights; the test is skipped without)."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip() or 'not root'}): the filesystem cases need one")
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_init_on_a_read_only_filesystem_refuses_in_one_line(tmp_path):
    with tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        line = refused_line(cli("init", "ro/proj", cwd=tmp_path))
        assert line == ("error: ro/proj: cannot write in ro: read-only file system (fix: init a writable folder; "
                        "nothing was written)")
        assert tree(ro) == []


def test_init_on_a_full_disk_removes_what_it_wrote(tmp_path):
    """Three pages of tmpfs: the first files fit, a later one does not; the refusal leaves no half project."""
    with tmpfs(tmp_path / "small", "12k") as small:
        line = refused_line(cli("init", "small/proj", cwd=tmp_path))
        assert line.startswith("error: small/proj: writing ") and "No space left on device" in line
        assert tree(small) == []
