"""The spec cache: used while the spec files are unchanged, never stale, never in the way."""
from __future__ import annotations

import subprocess
import sys

from conftest import copy_project

from qnn_tasks.modelspec import speccache
from qnn_tasks.modelspec.load import load_project

VAD_YAML = "models/silero-vad/model.yaml"


def test_warm_cache_gives_the_same_project_without_yaml(tmp_path):
    project = copy_project(tmp_path / "project")
    first = load_project(project.root)
    assert (project.root / speccache.CACHE).is_file()
    assert speccache.read(project.root, "ort-qnn") == first
    # a fresh interpreter listing tasks from the warm cache never imports PyYAML
    probe = ("import sys; from pathlib import Path; from qnn_tasks.tasks.project import project_tasks; "
             "project_tasks(Path('.').resolve()); print('yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=project.root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_edited_spec_file_is_read_again(tmp_path):
    project = copy_project(tmp_path / "project")
    load_project(project.root)
    project.edit(VAD_YAML, "frames_per_clip: 6", "frames_per_clip: 13")
    assert speccache.read(project.root, "ort-qnn") is None
    assert load_project(project.root).graphs()[1].options["frames_per_clip"] == 13
    (project.root / "models/silero-vad/export.py").write_text("# gone\n")  # the model's code counts too
    assert speccache.read(project.root, "ort-qnn") is None


def test_a_bad_edit_is_still_a_spec_error_after_a_warm_cache(tmp_path):
    project = copy_project(tmp_path / "project")
    assert project.doit("list").returncode == 0
    project.edit(VAD_YAML, "    precision: fp16\n", "    precision: fp16\n    frames: oops\n")
    result = project.doit("list")
    assert "graphs.vad.frames: unknown key" in result.stderr and "spec " in result.stdout  # vad unbuildable
    project.edit(VAD_YAML, "    frames: oops\n", "")
    result = project.doit("list")  # fixed: loaded again, no broken model left over from a cache
    assert result.returncode == 0 and result.stderr == "" and "spec " not in result.stdout


def test_a_corrupt_cache_falls_back_to_the_yaml(tmp_path):
    project = copy_project(tmp_path / "project")
    (project.root / speccache.CACHE).write_bytes(b"not a pickle")
    assert len(load_project(project.root).graphs()) == 2
    assert speccache.read(project.root, "ort-qnn") is not None  # rewritten
