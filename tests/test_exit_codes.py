"""Failing machines (issue 34, items 7 and 12): each documented exit code of `doit`, the report last in a parallel run,
a stage time limit, and numbers from the environment.

All on the tiny project (one graph, real stages, real simulator: seconds). The codes 130 and 143 are
tests/test_signals.py's, 75 is also tests/test_faults.py's, 74 is tests/test_full_disk.py's (a real read-only
filesystem).
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from pathlib import Path

import pytest
from conftest import Project
from tiny_project import tiny_project

from qnn_tasks import envvalues
from qnn_tasks.errors import EXIT_BUSY, EXIT_SPEC, SpecError

# export.py for the tiny graph: the packaged export, then (when the marker file exists) a hang that never returns,
# as a loop's step function or any model code can; it leaves a half-written file behind as a killed writer would
HANGING_EXPORT = '''\
import os
import time
from pathlib import Path


def export(ctx):
    ctx.default_export()
    marker = Path(os.environ["QNN_TEST_HANG"])
    if marker.is_file():
        marker.write_text(str(os.getpid()))
        (ctx.out_path.parent / ".tiny.onnx.x.part").write_bytes(b"half")
        while True:
            time.sleep(1)
'''


@pytest.fixture
def tiny(tmp_path) -> Project:
    return tiny_project(tmp_path / "project")


def one_error_line(result) -> str:
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, output
    return lines[0]


def test_1_for_a_failed_stage_not_2(tiny):
    """A failing stage fails the tasks after it (doit's UnmetDependency): exit 1, as docs/trust.md says, not 2.
    (0 for a green build: test_a_parallel_run_writes_its_report_last.)"""
    tiny.path("models/tiny/export.py").write_text("def export(ctx):\n    raise ctx.error('no graph today')\n")
    failed = tiny.doit("simplify")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "graph 'tiny': no graph today" in failed.failure_line("export:tiny")


def test_2_only_for_a_task_that_raised(tiny):
    """2 stays doit's code for a bug (a task that raised), also beside a failed stage, which alone is 1."""
    with open(tiny.path("dodo.py"), "a") as dodo:
        dodo.write("\n\ndef task_boom():\n    def boom():\n        raise RuntimeError('a bug')\n"
                   "    return {'actions': [boom], 'uptodate': [False]}\n")
    tiny.path("models/tiny/export.py").write_text("def export(ctx):\n    raise ctx.error('no graph today')\n")
    bug = tiny.doit("boom")
    assert bug.returncode == 2 and "RuntimeError: a bug" in bug.stdout + bug.stderr
    both = tiny.doit("simplify", "boom")
    assert both.returncode == 2, both.stdout + both.stderr


def test_3_for_an_unknown_task_and_78_for_a_bad_setup(tiny):
    unknown = tiny.doit("simplfy:tiny")
    assert unknown.returncode == 3 and "simplify:tiny" in unknown.stdout + unknown.stderr
    bad = tiny.doit("list", env={"QNN_TOOLCHAIN": "no-such-profile"})
    assert bad.returncode == EXIT_SPEC
    one_error_line(bad)


def test_75_while_another_doit_holds_the_tree(tiny):
    lock = tiny.path("build/.qnn-lock")
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as fh:
        fh.write(json.dumps({"pid": 4242, "host": "elsewhere", "since": "then", "command": "doit", "clean": False}))
        fh.flush()
        fcntl.flock(fh, fcntl.LOCK_EX)
        busy = tiny.doit("export")
    assert busy.returncode == EXIT_BUSY
    assert "another doit is building this tree (pid 4242 on elsewhere" in one_error_line(busy)


@pytest.mark.slow
def test_a_parallel_run_writes_its_report_last(tiny):
    """`doit -n 2`: the report waits for every stage, so the documented gate passes after a green run."""
    result = tiny.doit("-n", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert tiny.doit().returncode == 0  # and up to date: 0 too
    started = [line[3:] for line in result.stdout.splitlines() if line.startswith(".  ")]
    assert started[-1] == "report", started
    report = tiny.path("build/report/report.json")
    summary = json.loads(report.read_text())["summary"]
    assert summary["current"] and summary["complete"] and summary["passed"] == 1, summary
    newest_record = max(p.stat().st_mtime_ns for p in tiny.path("build/tiny").rglob("*.json"))
    assert report.stat().st_mtime_ns >= newest_record
    # and a failed stage still gets its report, after everything else, with exit 1
    tiny.path("models/tiny/export.py").write_text("def export(ctx):\n    raise ctx.error('broken')\n")
    failed = tiny.doit("-n", "2")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert [line for line in failed.stdout.splitlines() if line.startswith(".  ")][-1] == ".  report"
    assert json.loads(report.read_text())["summary"]["failed"] == 1


@pytest.mark.slow
def test_a_stage_that_never_returns_is_stopped_at_its_time_limit_and_retried(tiny, tmp_path):
    marker = tmp_path / "hang"
    marker.touch()
    tiny.path("models/tiny/export.py").write_text(HANGING_EXPORT)
    tiny.edit("models/tiny/model.yaml", "licence: test fixture\n", "licence: test fixture\nstage_timeout: 3\n")
    env = {"QNN_TEST_HANG": str(marker)}
    start = time.monotonic()
    result = tiny.doit("export", env=env)
    took = time.monotonic() - start
    assert result.returncode == 1, result.stdout + result.stderr
    line = result.failure_line("export:tiny")
    assert "stopped after 3 s, the stage's time limit (models/tiny/model.yaml: stage_timeout)" in line, line
    assert took < 60, took
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):  # the child running the model code is gone
        os.kill(pid, signal.SIGCONT)
    folder = tiny.path("build/tiny/tiny/export")
    record = json.loads((folder / "export.json").read_text())
    assert record["status"] == "failed" and record["timed_out_after_s"] == 3 and "files" not in record
    assert not (folder / "tiny.onnx").exists() and not list(folder.glob("*.part")), list(folder.iterdir())
    # the next run retries it; the environment's limit applies where model.yaml sets none
    tiny.edit("models/tiny/model.yaml", "stage_timeout: 3\n", "")
    again = tiny.doit("export", env={**env, "QNN_STAGE_TIMEOUT": "2"})
    assert "export:tiny" in again.executed and again.returncode == 1
    assert "stopped after 2 s, the stage's time limit ($QNN_STAGE_TIMEOUT)" in again.failure_line("export:tiny")
    marker.unlink()
    fixed = tiny.doit("export", env=env)
    assert fixed.returncode == 0 and "export:tiny" in fixed.executed, fixed.stdout + fixed.stderr


@pytest.mark.parametrize("name, value", [("QNN_LOCK_WAIT", "abc"), ("QNN_STAGE_TIMEOUT", "0"),
                                         ("QNN_STAGE_TIMEOUT", "nan"), ("QNN_PROGRESS_SECONDS", "-1"),
                                         ("QNN_COMPAT_SAMPLES", "2.5"), ("QNN_LOCK_WAIT", "1e999")])
def test_a_bad_number_in_the_environment_is_one_line(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(SpecError) as err:
        envvalues.check_all()
    assert str(err.value).startswith(f"${name}: ") and "(fix: set " in str(err.value)


def test_a_bad_lock_wait_stops_doit_in_one_line_with_exit_78(tiny):
    result = tiny.doit("export", env={"QNN_LOCK_WAIT": "abc"})
    assert result.returncode == EXIT_SPEC
    assert one_error_line(result) == ("error: $QNN_LOCK_WAIT: 'abc' is not a number of seconds (fix: set QNN_LOCK_WAIT "
                                      "to a number of seconds from 0 to 86400, or unset it (default 0))")


def test_stage_timeout_in_model_yaml_is_checked(tiny):
    tiny.edit("models/tiny/model.yaml", "licence: test fixture\n", "licence: test fixture\nstage_timeout: soon\n")
    result = tiny.doit("list")
    assert "models/tiny/model.yaml: stage_timeout: expected a number, got 'soon'" in result.stdout + result.stderr
    assert Path(tiny.root / "models/tiny/model.yaml").is_file()


@pytest.mark.slow
def test_a_dask_run_writes_its_report_last(tmp_path):
    """`QNN_EXECUTOR=dask://... doit -n 2 -P thread` (docs/team.md's Dask run) on a real local cluster."""
    from test_cluster_trust import dask_env, start_cluster, stop_cluster, wait_for_workers

    cluster = start_cluster(tmp_path)
    try:
        wait_for_workers(cluster)
        project = tiny_project(tmp_path / "project", socs=("SM8650", "SM8750"))
        result = project.doit("-n", "2", "-P", "thread", env=dask_env(tmp_path, cluster["address"]))
    finally:
        stop_cluster(cluster)
    assert result.returncode == 0, result.stdout + result.stderr
    started = [line[3:] for line in result.stdout.splitlines() if line.startswith(".  ")]
    assert started[-1] == "report" and {"simulate:tiny-SM8650", "simulate:tiny-SM8750"} <= set(started), started
    summary = json.loads(project.path("build/report/report.json").read_text())["summary"]
    assert summary["current"] and summary["complete"] and summary["passed"] == 2, summary
