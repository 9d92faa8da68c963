"""Incremental builds: after a change doit re-runs exactly the graph stages that depend on it.

Asserted on the tasks doit really executed (". task" lines) in real `doit export simplify lint
cpucheck` runs. One copy of the built example project is shared by the module (building it
costs ~15 s); the `proj` fixture restores every edited model file after each test and rebuilds,
so each test starts from a fully up-to-date project.

Two doit rules explain every expected set below:
* a task re-runs when its `config_changed` key (the stage's options) or one of its file_deps
  changed, or one of its targets is missing;
* file_deps are compared by content (MD5Checker): a dependency rebuilt byte-for-byte identical
  does NOT re-run the tasks that read it.
"""
from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GRAPH_STAGES, Project, copy_project

from qnn_tasks.modelspec.load import load_project, load_socs

GRAPHS = {"minilm": "minilm", "vad": "silero-vad"}
ALL_GRAPH_TASKS = {f"{stage}:{graph}" for stage in GRAPH_STAGES for graph in GRAPHS}
VAD_YAML = "models/silero-vad/model.yaml"


def tasks(graph: str, *stages: str) -> set[str]:
    return {f"{stage}:{graph}" for stage in stages}


def build(project: Project):
    result = project.doit(*GRAPH_STAGES)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert result.executed | result.uptodate == ALL_GRAPH_TASKS, result.stdout
    return result


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def settled(built_graphs, tmp_path_factory) -> Project:
    """A private copy of the built project, brought up to date once in its new place."""
    project = copy_project(tmp_path_factory.mktemp("incremental") / "project", source=built_graphs.root,
                           with_build=True)
    project.first_run = build(project)  # see test_relocated_copy_*
    return project


@pytest.fixture
def proj(settled) -> Project:
    models = settled.root / "models"
    snapshot = {p: p.read_bytes() for p in models.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    yield settled
    for path, data in snapshot.items():
        if path.read_bytes() != data:
            path.write_bytes(data)
    build(settled)  # back to up to date for the next test


def test_second_run_executes_nothing(proj):
    result = build(proj)
    assert result.executed == set()
    assert result.uptodate == ALL_GRAPH_TASKS


def test_a_tree_stamped_by_the_previous_version_stays_up_to_date(proj, monkeypatch):
    """.doit.db written before output stamps became int hashes (md5 strings): an upgrade rebuilds nothing."""
    from qnn_tasks.tasks.project import project_tasks
    from qnn_tasks.tasks.uptodate import md5_signature

    monkeypatch.chdir(proj.root)
    monkeypatch.setattr(sys, "argv", ["doit", "list"])  # read-only: no tree lock
    tasks = project_tasks(proj.root)
    targets = {f"{stage}:{t['name']}": t["targets"] for stage in GRAPH_STAGES for t in tasks[f"task_{stage}"]()}
    db = proj.path(".doit.db")
    conn = sqlite3.connect(db)
    try:
        rows = dict(conn.execute("select task_id, task_data from doit"))
        restamped = 0
        for task in ALL_GRAPH_TASKS:
            data = json.loads(rows[task])
            assert isinstance(data["_values_:"]["files"], int)
            data["_values_:"]["files"] = md5_signature(targets[task])  # outputs + record, as stamped before
            conn.execute("update doit set task_data = ? where task_id = ?", (json.dumps(data), task))
            restamped += 1
        conn.commit()
    finally:
        conn.close()
    assert restamped == len(ALL_GRAPH_TASKS)
    result = build(proj)
    assert result.executed == set(), result.stdout


def test_relocated_copy_never_reruns_simplify_or_lint(settled):
    # The copy's doit db came from another directory. simplify/lint only depend on build/ files
    # (relative paths), so whatever else happens, they stay up to date.
    assert settled.first_run.executed <= {t for t in ALL_GRAPH_TASKS if t.split(":")[0] in ("export", "cpucheck")}
    assert {t for t in ALL_GRAPH_TASKS if t.split(":")[0] in ("simplify", "lint")} <= settled.first_run.uptodate


def test_relocated_copy_is_up_to_date(settled):
    assert settled.first_run.executed == set()


def test_option_edit_reruns_only_that_graph(proj):
    vad = proj.path("build/silero-vad/vad")
    samples_before = json.loads((vad / "cpucheck/cpucheck.json").read_text())["samples"]
    exported_before = md5(vad / "export/vad.onnx")

    proj.edit(VAD_YAML, "frames_per_clip: 6", "frames_per_clip: 3")
    result = build(proj)
    # export and cpucheck key on the graph's options, so both re-run; nothing of minilm does.
    # frames_per_clip only changes the verification samples, not the exported graph: export writes
    # the same bytes, so simplify and lint (which depend on that file's content, and whose keys do
    # not hold `options`) are rightly up to date.
    assert result.executed == tasks("vad", "export", "cpucheck")
    assert md5(vad / "export/vad.onnx") == exported_before
    samples_after = json.loads((vad / "cpucheck/cpucheck.json").read_text())["samples"]
    assert samples_after < samples_before
    assert build(proj).executed == set()


@pytest.mark.slow
def test_option_edit_that_changes_the_export_reruns_all_its_stages(proj):
    proj.edit(VAD_YAML, "keep_pow: false", "keep_pow: true")
    result = build(proj)
    # The exported graph now differs (Pow kept), so everything downstream of it re-runs, for vad only.
    assert result.executed == tasks("vad", *GRAPH_STAGES)
    lint = json.loads(proj.path("build/silero-vad/vad/lint/lint.json").read_text())
    assert any(f["rule"] == "pow-square" and f["severity"] == "warning" for f in lint["findings"])
    assert lint["op_counts"].get("Pow", 0) > 0


@pytest.mark.slow
def test_tolerance_edit_reruns_only_cpucheck(proj):
    # the VAD's (MiniLM's cpucheck imports sentence-transformers: ~10 s, twice with the restore)
    proj.edit(VAD_YAML, "    lint:\n", "    cpucheck: {max_abs: 2.0e-3}\n    lint:\n")
    result = build(proj)
    assert result.executed == {"cpucheck:vad"}
    record = json.loads(proj.path("build/silero-vad/vad/cpucheck/cpucheck.json").read_text())
    assert record["thresholds"]["max_abs"] == pytest.approx(2.0e-3)


def test_model_code_edit_reruns_that_models_export_and_cpucheck(proj):
    code = proj.path("models/silero-vad/export.py")
    code.write_text(code.read_text() + "\n# a comment: the code changed, its graph did not\n")
    result = build(proj)
    # export.py is a file_dep of export (writes the graph) and of cpucheck (samples/reference).
    # The re-exported ONNX is byte-identical, so simplify/lint stay up to date; minilm is untouched.
    assert result.executed == tasks("vad", "export", "cpucheck")


@pytest.mark.parametrize("target, expected", [
    # simplify re-runs to restore its target. It writes the same bytes as before, so lint and cpucheck,
    # whose file_dep is that file, are up to date by content (doit compares MD5s, not mtimes).
    ("build/silero-vad/vad/simplify/vad.onnx", {"simplify:vad"}),
    ("build/silero-vad/vad/export/vad.onnx", {"export:vad"}),  # same reasoning one stage earlier
    ("build/silero-vad/vad/lint/lint.json", {"lint:vad"}),  # the record is lint's only target
    ("build/silero-vad/vad/cpucheck/reference.npz", {"cpucheck:vad"}),
])
def test_deleted_target_reruns_its_task(proj, target, expected):
    path = proj.path(target)
    before = md5(path)
    path.unlink()
    result = build(proj)
    assert result.executed == expected
    assert path.is_file()
    if path.suffix == ".onnx":
        assert md5(path) == before  # deterministic stage: why nothing downstream re-ran


def _read_db(db: Path) -> dict[str, dict]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return {task: json.loads(data) for task, data in conn.execute("select task_id, task_data from doit")}
    finally:
        conn.close()


def test_dependency_db_is_sqlite_and_readable_while_doit_runs(proj):
    db = proj.path(".doit.db")
    assert db.read_bytes()[:16] == b"SQLite format 3\x00"
    rows = _read_db(db)
    assert ALL_GRAPH_TASKS <= set(rows)
    assert rows["simplify:vad"]["deps:"] == ["build/silero-vad/vad/export/vad.onnx"]
    assert {"key", "files"} <= set(rows["cpucheck:minilm"]["_values_:"])  # the stage's key + its outputs' stats

    proj.doit("forget", "cpucheck:vad", check=True)
    assert "cpucheck:vad" not in _read_db(db)
    proc = subprocess.Popen([sys.executable, "-m", "doit", "cpucheck:vad"], cwd=proj.root, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reads_while_running = 0
    try:
        while proc.poll() is None:
            snapshot = _read_db(db)  # a second process reads the state while doit runs
            assert "simplify:vad" in snapshot
            if proc.poll() is None:
                reads_while_running += 1
            time.sleep(0.02)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    assert re.findall(r"^\.  (\S+)$", stdout, re.M) == ["cpucheck:vad"]
    assert reads_while_running > 0
    assert "cpucheck:vad" in _read_db(db)  # and the result is there once it finished


def test_list_all_documents_every_task(tmp_path):
    project = copy_project(tmp_path / "fresh")  # the real spec: every SoC row, incl. skipped ones
    result = project.doit("list", "--all")
    assert result.returncode == 0, result.stderr
    listed = {}
    for line in result.stdout.splitlines():
        assert line.strip(), "empty line in doit list"
        parts = line.split(None, 1)
        assert len(parts) == 2 and parts[1].strip(), f"task without a doc: {line!r}"
        listed[parts[0]] = parts[1]
    socs = load_socs(project.path("socs/socs.yaml"))
    expected = set(GRAPH_STAGES) | {"config", "context"} | ALL_GRAPH_TASKS
    chips = {g.name: g.socs or tuple(socs) for g in load_project(project.root).graphs()}  # a graph may list its chips
    expected |= {f"{stage}:{graph}-{soc}" for stage in ("config", "context") for graph in GRAPHS for soc in chips[graph]}
    assert expected <= set(listed), sorted(expected - set(listed))
    no_fp16 = [name for name, soc in socs.items() if not soc.fp16]
    assert no_fp16  # the table has a chip without fp16: its tasks are listed as skipped, with the reason
    for name in no_fp16:
        assert listed[f"context:vad-{name}"].startswith("SKIPPED: ")
        assert "fp16" in listed[f"context:vad-{name}"]
    assert "build/minilm/minilm/export/minilm.onnx" in listed["export:minilm"]
