"""The core tested in seconds, without a real build: planning, the failure funnel (with an executor of the
test's own), the shared cache's put / lookup / restore, and the tree lock."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import copy_project

from qnn_tasks.plan.stages import GRAPH_STAGES, Planner, build_stage_defs, targets_of
from qnn_tasks.run import executors, funnel, treelock
from qnn_tasks.run.cache import Store
from qnn_tasks.run.calls import StageCall
from qnn_tasks.spec.project import load_project

# ------------------------------------------------------------------ planning

def _planner(root: Path) -> Planner:
    return Planner(load_project(root))


def _plans(planner: Planner) -> dict[str, Any]:
    found = {}
    for row in build_stage_defs(planner):
        for target in targets_of(planner, row):
            plan = row.plan(planner, row, target)
            if plan is not None:
                found[f"{row.name}:{plan.name}"] = plan
    return found


def test_plan_names_every_stage_of_every_target(tmp_path: Path) -> None:
    plans = _plans(_planner(copy_project(tmp_path / "p").root))
    assert {"export:vad", "simplify:vad", "lint:vad", "cpucheck:vad", "context:vad-SM8650", "simverify:vad-SM8650",
            "export:minilm", "context:minilm-SM8750"} <= set(plans)
    context = plans["context:vad-SM8650"]
    assert context.out_dir.endswith("/SM8650/context") and context.record.endswith("/context/context.json")
    assert plans["simplify:vad"].file_dep == [plans["export:vad"].outputs[0]]  # each stage reads the one before


def test_a_setting_changes_only_the_keys_it_belongs_to(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "p")
    before = {name: plan.key for name, plan in _plans(_planner(project.root)).items()}
    yaml_path = project.root / "models" / "silero-vad" / "model.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("    precision: fp16\n", "    precision: fp16\n"
                                                       "    simplify: {skip_optimizers: [fuse_bn_into_conv]}\n", 1))
    after = {name: plan.key for name, plan in _plans(_planner(project.root)).items()}
    changed = {name for name in before if before[name] != after.get(name)}
    assert "simplify:vad" in changed
    assert not {n for n in changed if n.startswith(("export:", "simplify:minilm", "lint:minilm", "context:minilm"))}


def test_model_code_beside_export_py_is_a_dependency_of_the_stages_that_run_it(tmp_path: Path) -> None:
    """export.py may import helpers from its own folder: an edit to one must rebuild like an edit to export.py."""
    project = copy_project(tmp_path / "p")
    (project.root / "models" / "silero-vad" / "vad_helpers.py").write_text("SCALE = 1.0\n")
    plans = _plans(_planner(project.root))
    for task in ("export:vad", "cpucheck:vad"):
        assert {"models/silero-vad/export.py", "models/silero-vad/vad_helpers.py"} <= set(plans[task].file_dep), task
    assert "models/silero-vad/vad_helpers.py" not in plans["export:minilm"].file_dep


def test_graph_rows_are_in_build_order() -> None:
    assert [r.name for r in GRAPH_STAGES][:4] == ["export", "simplify", "lint", "cpucheck"]


# ------------------------------------------------------------------ the funnel

class FakeExecutor:
    """Runs a call by writing what the test says; stands in for the child process / Dask worker."""

    def __init__(self, outcome: dict[str, Any], write: bool = True) -> None:
        self.outcome = outcome
        self.write = write
        self.calls: list[StageCall] = []

    def run(self, call: StageCall, sink) -> dict[str, Any]:
        self.calls.append(call)
        if self.write:
            for output in call.outputs:
                Path(output).parent.mkdir(parents=True, exist_ok=True)
                Path(output).write_text(f"made by {call.stage}")
        return self.outcome


def _call(out_dir: str = "build/m/g/stage") -> StageCall:
    return StageCall(stage="stage", target="g", args={}, inputs=[], out_dir=out_dir,
                     outputs=[f"{out_dir}/out.txt"], record=f"{out_dir}/stage.json", key="k", runner="x:y")


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    treelock.acquire(tmp_path, ["doit"])
    yield tmp_path
    treelock.release()


def test_funnel_success_writes_a_record_vouching_for_the_outputs(tree: Path, monkeypatch) -> None:
    fake = FakeExecutor({"ok": True, "record": {"answer": 42}, "executor": {"kind": "fake"}})
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: fake)
    assert funnel.run(_call(), {"graph": "g"}, str(tree)) is None
    record = json.loads((tree / "build/m/g/stage/stage.json").read_text())
    assert record["status"] == "passed" and record["answer"] == 42 and record["executor"] == {"kind": "fake"}
    assert set(record["files"]) == {"build/m/g/stage/out.txt"} and len(record["files"]["build/m/g/stage/out.txt"]["sha256"]) == 64


def test_funnel_failure_is_one_line_and_a_failed_record(tree: Path, monkeypatch) -> None:
    fake = FakeExecutor({"ok": False, "error": "model.yaml: x: bad (fix: y)", "traceback": "Traceback ...",
                         "record": {}}, write=False)
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: fake)
    line = funnel.run(_call(), {}, str(tree))
    assert line.startswith("stage:g: model.yaml: x: bad (fix: y)") and "traceback: build/m/g/stage/stage-error.log" in line
    record = json.loads((tree / "build/m/g/stage/stage.json").read_text())
    assert record["status"] == "failed" and "files" not in record


def test_funnel_refuses_a_stage_that_wrote_nothing(tree: Path, monkeypatch) -> None:
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: FakeExecutor({"ok": True, "record": {}},
                                                                                             write=False))
    assert "wrote no build/m/g/stage/out.txt" in funnel.run(_call(), {}, str(tree))


def test_funnel_without_the_lock_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert "does not hold the build tree's lock" in funnel.run(_call(), {}, str(tmp_path))
    assert not (tmp_path / "build").exists()


def test_funnel_restores_from_the_cache_without_running(tree: Path, monkeypatch) -> None:
    store = Store(str(tree / "store"))
    first = FakeExecutor({"ok": True, "record": {"n": 1}})
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: first)
    assert funnel.run(_call(), {}, str(tree), store) is None
    os.remove("build/m/g/stage/out.txt")
    second = FakeExecutor({"ok": True, "record": {"n": 2}})
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: second)
    assert funnel.run(_call(), {}, str(tree), store) is None
    assert second.calls == [] and Path("build/m/g/stage/out.txt").read_text() == "made by stage"
    record = json.loads(Path("build/m/g/stage/stage.json").read_text())
    assert record["n"] == 1 and record["from_cache"]["store"] == store.url


# ------------------------------------------------------------------ the cache

def test_cache_put_lookup_restore_and_a_corrupted_blob(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = Path("build/m/g/context")
    out.mkdir(parents=True)
    (out / "g.bin").write_bytes(b"binary" * 100)
    (out / "context.json").write_text("{}")  # the record is not stored as a file
    store = Store(str(tmp_path / "store"))
    (out / "notes.txt").write_text("a user's own file")  # not the stage's: never uploaded
    record = {"status": "passed", "files": {"build/m/g/context/g.bin": {"sha256": "x", "size": 600}}}
    manifest = store.put("k1", "context", "g-SM8650", out, record)
    assert set(manifest["files"]) == {"build/m/g/context/g.bin"}
    assert store.lookup("k1")["record"] == record and store.lookup("nope") is None
    (out / "g.bin").unlink()
    assert store.restore(store.lookup("k1"), out) and (out / "g.bin").read_bytes() == b"binary" * 100
    blob = Path(store.blob(manifest["files"]["build/m/g/context/g.bin"]["sha256"]))
    blob.write_bytes(b"flipped" * 100)
    (out / "g.bin").unlink()
    assert not store.restore(store.lookup("k1") or manifest, out)
    assert not (out / "g.bin").exists() and not blob.exists() and store.lookup("k1") is None  # dropped, rebuilt next


# ------------------------------------------------------------------ the lock

def test_a_second_process_is_refused_the_lock_with_who_holds_it(tmp_path: Path) -> None:
    treelock.acquire(tmp_path, ["doit", "context"])
    try:
        probe = ("import sys; from pathlib import Path; from qnn_tasks.run import treelock\n"
                 "try:\n    treelock.acquire(Path(sys.argv[1]), ['doit'])\n"
                 "except treelock.TreeBusy as err:\n    print(err); sys.exit(3)\n")
        proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True)
        assert proc.returncode == 3
        assert "another doit is building this tree" in proc.stdout and f"{os.getpid()}" in proc.stdout
    finally:
        treelock.release()
    proc = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
