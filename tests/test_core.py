"""The core tested in seconds, without a real build: planning, the failure funnel (with an executor of the
test's own), the shared cache's put / lookup / restore, and the tree lock."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_project, plans_of

from qnn_tasks.modelspec.load import load_project
from qnn_tasks.plan.planner import Planner
from qnn_tasks.plan.rows import GRAPH_STAGES
from qnn_tasks.run import executors, funnel, treelock
from qnn_tasks.run.cache import Store
from qnn_tasks.run.calls import StageCall
from qnn_tasks.run.outcome import Outcome

# ------------------------------------------------------------------ planning

def _planner(root: Path) -> Planner:
    return Planner(load_project(root))


def test_plan_names_every_stage_of_every_target(tmp_path: Path) -> None:
    plans = plans_of(_planner(copy_project(tmp_path / "p").root))
    assert {"export:vad", "simplify:vad", "lint:vad", "cpucheck:vad", "context:vad-SM8650", "simverify:vad-SM8650",
            "export:minilm", "context:minilm-SM8750"} <= set(plans)
    context = plans["context:vad-SM8650"]
    assert context.out_dir.endswith("/SM8650/context") and context.record.endswith("/context/context.json")
    assert plans["simplify:vad"].file_dep == [plans["export:vad"].outputs[0]]  # each stage reads the one before


def test_a_setting_changes_only_the_keys_it_belongs_to(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "p")
    before = {name: plan.key for name, plan in plans_of(_planner(project.root)).items()}
    yaml_path = project.root / "models" / "silero-vad" / "model.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("    precision: fp16\n", "    precision: fp16\n"
                                                       "    simplify: {skip_optimizers: [fuse_bn_into_conv]}\n", 1))
    after = {name: plan.key for name, plan in plans_of(_planner(project.root)).items()}
    changed = {name for name in before if before[name] != after.get(name)}
    assert "simplify:vad" in changed
    assert not {n for n in changed if n.startswith(("export:", "simplify:minilm", "lint:minilm", "context:minilm"))}


def test_model_code_beside_export_py_is_a_dependency_of_the_stages_that_run_it(tmp_path: Path) -> None:
    """export.py may import helpers from its own folder: an edit to one must rebuild like an edit to export.py."""
    project = copy_project(tmp_path / "p")
    (project.root / "models" / "silero-vad" / "vad_helpers.py").write_text("SCALE = 1.0\n")
    plans = plans_of(_planner(project.root))
    for task in ("export:vad", "cpucheck:vad"):
        assert {"models/silero-vad/export.py", "models/silero-vad/vad_helpers.py"} <= set(plans[task].file_dep), task
    assert "models/silero-vad/vad_helpers.py" not in plans["export:minilm"].file_dep


def test_graph_rows_are_in_build_order() -> None:
    assert [r.name for r in GRAPH_STAGES][:4] == ["export", "simplify", "lint", "cpucheck"]


# ------------------------------------------------------------------ the funnel

class FakeExecutor:
    """Runs a call by writing what the test says; stands in for the child process / Dask worker."""

    def __init__(self, outcome: Outcome, write: bool = True) -> None:
        self.outcome = outcome
        self.write = write
        self.calls: list[StageCall] = []

    def run(self, call: StageCall, sink) -> Outcome:
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
    fake = FakeExecutor(Outcome.success({"answer": 42}, executor={"kind": "fake"}))
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: fake)
    assert funnel.run(_call(), {"graph": "g"}, str(tree)) is None
    record = json.loads((tree / "build/m/g/stage/stage.json").read_text())
    assert record["status"] == "passed" and record["answer"] == 42 and record["executor"] == {"kind": "fake"}
    assert set(record["files"]) == {"build/m/g/stage/out.txt"} and len(record["files"]["build/m/g/stage/out.txt"]["sha256"]) == 64


def test_funnel_vouches_for_a_file_a_stage_also_wrote_beside_its_outputs_only(tree: Path, monkeypatch) -> None:
    """A stage that writes a file whose name it learns as it runs (a > 2 GB model's weights) names it in
    `also_wrote`: the record vouches for it when it lies beside a declared output, never for one elsewhere."""
    (tree / "elsewhere.txt").write_text("not the stage's")

    class Writes(FakeExecutor):
        def run(self, call, sink):
            outcome = super().run(call, sink)
            Path(call.out_dir, "out.txt.data").write_text("weights")
            return outcome

    fake = Writes(Outcome.success({"also_wrote": ["build/m/g/stage/out.txt.data", "elsewhere.txt",
                                                  "build/m/g/stage/../../../../elsewhere.txt"]}))
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: fake)
    assert funnel.run(_call(), {}, str(tree)) is None
    record = json.loads((tree / "build/m/g/stage/stage.json").read_text())
    assert set(record["files"]) == {"build/m/g/stage/out.txt", "build/m/g/stage/out.txt.data"}
    assert "also_wrote" not in record


def test_funnel_failure_is_one_line_and_a_failed_record(tree: Path, monkeypatch) -> None:
    fake = FakeExecutor(Outcome.failure("model.yaml: x: bad (fix: y)", {"partial": 1}, traceback="Traceback ..."),
                        write=False)
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: fake)
    line = funnel.run(_call(), {}, str(tree))
    assert line.startswith("stage:g: model.yaml: x: bad (fix: y)") and "traceback: build/m/g/stage/stage-error.log" in line
    record = json.loads((tree / "build/m/g/stage/stage.json").read_text())
    assert record["status"] == "failed" and "files" not in record and record["partial"] == 1
    assert (tree / "build/m/g/stage/stage-error.log").read_text() == "Traceback ..."


def test_funnel_refuses_a_stage_that_wrote_nothing(tree: Path, monkeypatch) -> None:
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: FakeExecutor(Outcome.success({}),
                                                                                             write=False))
    assert "wrote no build/m/g/stage/out.txt" in funnel.run(_call(), {}, str(tree))


def test_funnel_without_the_lock_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert "does not hold the build tree's lock" in funnel.run(_call(), {}, str(tmp_path))
    assert not (tmp_path / "build").exists()


def test_funnel_restores_from_the_cache_without_running(tree: Path, monkeypatch) -> None:
    store = Store(str(tree / "store"))
    first = FakeExecutor(Outcome.success({"n": 1}))
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: first)
    assert funnel.run(_call(), {}, str(tree), store) is None
    os.remove("build/m/g/stage/out.txt")
    second = FakeExecutor(Outcome.success({"n": 2}))
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: second)
    assert funnel.run(_call(), {}, str(tree), store) is None
    assert second.calls == [] and Path("build/m/g/stage/out.txt").read_text() == "made by stage"
    record = json.loads(Path("build/m/g/stage/stage.json").read_text())
    assert record["n"] == 1 and record["from_cache"]["store"] == store.url



def test_funnel_does_not_store_again_what_a_worker_stored(tree: Path, monkeypatch) -> None:
    """`stored`: a Dask worker already put outputs and record in the store; the client only restores them."""
    store = Store(str(tree / "store"))
    puts = []
    monkeypatch.setattr(store, "put", lambda *args, **kw: puts.append(args))
    fake = FakeExecutor(Outcome.success({"n": 1}, executor={"kind": "dask"}, stored=True))
    monkeypatch.setattr(executors, "for_call", lambda call, root, cache=None: fake)
    assert funnel.run(_call(), {}, str(tree), store) is None and puts == []
    fake.outcome = Outcome.success({"n": 1})
    Path("build/m/g/stage/out.txt").unlink()
    monkeypatch.setattr(store, "lookup", lambda key: None)
    assert funnel.run(_call(), {}, str(tree), store) is None and len(puts) == 1


# ------------------------------------------------------------------ outcomes

def test_outcome_round_trips_through_json() -> None:
    """A child answers in JSON lines and a Dask worker returns a plain dict: both come back equal."""
    for outcome in (Outcome.success({"a": [1, 2.5], "warnings": []}, executor={"kind": "child", "pid": 7}),
                    Outcome.success({}, stored=True),
                    Outcome.failure("model.yaml: x: bad (fix: y)", {"partial": True}, traceback="Traceback ...",
                                    executor={"kind": "dask", "worker": "tcp://w:1"})):
        assert Outcome.from_dict(json.loads(json.dumps(outcome.to_dict()))) == outcome
    assert not Outcome.failure("no").ok and Outcome.failure("no").record == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        Outcome.success({}).ok = False  # type: ignore[misc]


@pytest.mark.parametrize("data", [None, [], {}, {"ok": "yes"}, {"ok": True, "record": []},
                                  {"ok": True, "executor": "here"}, {"ok": True, "surprise": 1}])
def test_outcome_from_anything_else_is_refused(data) -> None:
    with pytest.raises(ValueError, match="not a stage outcome"):
        Outcome.from_dict(data)


def test_run_here_turns_errors_into_outcomes(monkeypatch) -> None:
    """The in-process executor: a stage's QnnTasksError keeps its line and partial record; a bug keeps its traceback."""
    from qnn_tasks.errors import StageError
    from qnn_tasks.run import calls
    from qnn_tasks.run.executors.local import InProcess, run_here

    def stage_error(call):
        raise StageError("model.yaml: x: bad (fix: y)", {"partial": 1})

    monkeypatch.setattr(calls, "execute", stage_error)
    assert run_here(_call(), None) == Outcome.failure("model.yaml: x: bad (fix: y)", {"partial": 1})
    monkeypatch.setattr(calls, "execute", lambda call: 1 / 0)
    bug = run_here(_call(), None)
    assert not bug.ok and bug.error == "unexpected ZeroDivisionError: division by zero" and "1 / 0" in bug.traceback
    monkeypatch.setattr(calls, "execute", lambda call: {"answer": 42})
    done = InProcess().run(_call(), None)
    assert done.ok and done.record == {"answer": 42} and done.executor["kind"] == "inprocess"


PROBE_STAGE = """
from qnn_tasks.errors import StageError


def run_call(call):
    if call.args.get("kill"):  # what the kernel's out-of-memory killer does to a process
        import os
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    if call.args.get("fail"):
        raise StageError("probe: asked to fail (fix: do not ask)", {"partial": call.args["fail"]})
    return {"echo": call.args["echo"], "nan": float("nan")}
"""


def test_child_process_answers_with_an_outcome(tmp_path: Path) -> None:
    """A real child process (the default executor): the outcome crosses its JSON line and comes back typed."""
    import math

    from qnn_tasks.run.executors.local import Child

    (tmp_path / "probe_stage.py").write_text(PROBE_STAGE)
    child = Child(str(tmp_path))
    try:
        call = StageCall(stage="probe", target="t", args={"echo": [1, "two"]}, inputs=[], out_dir="build/probe",
                         outputs=[], record="", key="", runner="probe_stage:run_call")
        done = child.run(call, None)
        assert done.ok and done.record["echo"] == [1, "two"] and math.isnan(done.record["nan"])
        assert done.executor["kind"] == "child" and done.executor["pid"] != os.getpid()
        failed = child.run(StageCall.from_json(call.to_json().replace('"echo"', '"fail": 3, "x"')), None)
        assert failed == Outcome.failure("probe: asked to fail (fix: do not ask)", {"partial": 3},
                                         executor=failed.executor)
    finally:
        child.stop()


def test_a_child_killed_by_signal_9_is_said_to_be_most_likely_out_of_memory(tmp_path: Path) -> None:
    from qnn_tasks.errors import ToolchainError
    from qnn_tasks.run.executors.local import Child

    (tmp_path / "probe_stage.py").write_text(PROBE_STAGE)
    child = Child(str(tmp_path))
    try:
        call = StageCall(stage="probe", target="t", args={"kill": True}, inputs=[], out_dir="build/probe",
                         outputs=[], record="", key="", runner="probe_stage:run_call")
        with pytest.raises(ToolchainError) as err:
            child.run(call, None)
        line = str(err.value)
        assert "the worker process running probe:t died (signal 9)" in line and "\n" not in line
        assert "most often the kernel's out-of-memory killer (check `dmesg`; fix: fewer jobs at once" in line
    finally:
        child.stop()

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


def test_progress_estimates_each_series_from_its_own_pace(monkeypatch) -> None:
    """A stage that simulates series after series (the repair: one per step) gets an estimate from the series it
    is in, not from the stage's whole elapsed time over the samples of this series."""
    import io

    from qnn_tasks.run import console

    out = io.StringIO()
    monkeypatch.setattr(console, "OUT", out)
    clock = iter([0.0, 60.0, 120.0, 200.0, 260.0])  # the sink's start, then one tick per sample of 60 s
    monkeypatch.setattr(console.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(console, "_tty", lambda: False)
    monkeypatch.setenv("QNN_PROGRESS_SECONDS", "0")
    sink = console.progress_sink("repair:net")
    sink(1, 2, "sample")
    sink(2, 2, "sample")
    sink(1, 2, "sample")  # the next step's first sample: 80 s after the last tick (its quantize and compile)
    sink(2, 3, "sample")
    lines = out.getvalue().splitlines()
    assert lines[0] == "repair:net: sample 1/2, 1 min 00 s elapsed, ~1 min 00 s left"
    assert lines[1].startswith("repair:net: sample 1/2, 3 min 20 s elapsed, ~1 min 20 s left"), lines
    assert lines[2].endswith("~1 min 10 s left"), lines  # (260 - 120) / 2 x 1 left
