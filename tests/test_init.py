"""`qnn-npu-compile init` / `python -m qnn_tasks` (fast: no build; the wheel test builds for real)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
