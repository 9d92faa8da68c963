"""Signals in quick succession: any number of SIGINT/SIGTERM, at any gap, end `doit` within 2 s.

Real doit runs of a real simulate stage (a child process running the HTP simulator) on the tiny
project; two signals 1-10 ms apart (and bursts of five) for every pair kind. Each run must exit
130, or 143 when a SIGTERM reached it (signals pending at once are handled in an order of the
kernel's choosing, so "the first one sent" cannot be the contract), print one line, release the
tree's lock, and the next `doit` must repair the tree.
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import time

import pytest
from conftest import Project
from test_faults import Running, litter, no_passed_without_outputs
from tiny_project import tiny_project

TASK = "simulate:tiny-SM8650"
SIMULATE_RECORD = "build/tiny/tiny/*/fp16/SM8650/simulate/simulate.json"
LIMIT_S = 2.0
INT, TERM = signal.SIGINT, signal.SIGTERM


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Project:
    """The tiny project built up to its context binary; simulate (~8 s of simulator work) not yet run."""
    project = tiny_project(tmp_path_factory.mktemp("signals") / "project", samples=100)
    project.doit("context", "cpucheck", check=True)
    return project


def lock_is_free(project: Project) -> bool:
    fd = os.open(project.path("build/.qnn-lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def interrupt(project: Project, signals: list[int], gap_s: float, *options: str) -> None:
    """Start `doit simulate`, send `signals` `gap_s` apart inside the stage; check how it ended."""
    run = Running(project, *options, TASK)
    run.wait_for(f".  {TASK}")
    time.sleep(0.7)  # inside the stage: the child runs the simulator
    start = time.monotonic()
    for i, sig in enumerate(signals):
        if i:
            time.sleep(gap_s)
        try:
            run.proc.send_signal(sig)
        except ProcessLookupError:
            break  # it already ended: later signals have nothing to hit
    try:
        code = run.proc.wait(timeout=15)
    except Exception:
        run.proc.kill()
        run.proc.wait()
        pytest.fail(f"doit hung after signals {signals} {gap_s * 1000:.0f} ms apart")
    took = time.monotonic() - start
    run._reader.join(timeout=10)
    stderr = run.proc.stderr.read()
    what = f"signals {[signal.Signals(s).name for s in signals]} {gap_s * 1000:.0f} ms apart {' '.join(options)}"
    if signals[0] == INT and TERM in signals:  # the run may have ended before the SIGTERM reached it
        assert code in (130, 143), (what, code, stderr)
    else:  # a SIGTERM sent first reaches the run before anything else is decided
        assert code == (143 if TERM in signals else 130), (what, code, stderr)
    assert took < LIMIT_S, (what, f"took {took:.2f} s")
    lines = [line for line in stderr.splitlines() if "interrupted" in line]
    assert lines == [f"interrupted during {TASK}; nothing half-written kept"], (what, stderr)
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, (what, stderr)
    assert lock_is_free(project), what
    assert litter(project) == [], what
    if len(signals) == 1:  # the graceful path: doit saved its state and marked the tree clean
        assert json.loads(project.path("build/.qnn-lock").read_text())["clean"] is True, what
    assert not list(project.root.glob(SIMULATE_RECORD)), what  # no record vouches for a half-made output
    no_passed_without_outputs(project)


@pytest.mark.slow
def test_any_number_of_signals_at_any_gap_end_the_run_and_the_next_run_repairs(tiny):
    tiny.doit("forget", TASK, check=True)
    interrupt(tiny, [INT], 0)  # one signal: the graceful path
    interrupt(tiny, [TERM], 0)
    pairs = [(INT, INT), (INT, TERM), (TERM, TERM), (TERM, INT)]
    for gap_ms in (1, 4, 10):
        for pair in pairs:
            interrupt(tiny, list(pair), gap_ms / 1000)
    interrupt(tiny, [INT] * 5, 0.002)  # a burst: a held-down Ctrl-C
    interrupt(tiny, [TERM, INT, TERM, INT, TERM], 0.001)
    parallel = ("-n", "2", "-P", "thread")  # the stage runs in one of doit's threads, not the main one
    interrupt(tiny, [INT], 0, *parallel)
    interrupt(tiny, [INT, TERM], 0.003, *parallel)
    interrupt(tiny, [TERM, TERM], 0.001, *parallel)

    again = tiny.doit(TASK)  # the lock is free and the tree is repaired by the next run
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.executed == {TASK}, again.executed
    assert litter(tiny) == []
    record = json.loads(next(tiny.root.glob(SIMULATE_RECORD)).read_text())
    assert record["status"] == "passed"
    no_passed_without_outputs(tiny)
    assert json.loads(tiny.path("build/.qnn-lock").read_text())["clean"] is True


DIST_SIGNALLED = """\
import os, signal, sys, time
from qnn_tasks.ship import package
real_write = package.write

def write(*args, **kwargs):  # the real dist, signalled once it is writing (when a user's Ctrl-C lands)
    os.kill(os.getpid(), signal.{sig})
    time.sleep(10)
    return real_write(*args, **kwargs)

package.write = write
from doit.doit_cmd import DoitMain
sys.exit(DoitMain().run(["dist"]))
"""


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_during_dist_says_dist_was_interrupted(tmp_path, sig, code):
    """dist runs no stage: the line said "interrupted before any stage started"; it names dist and its model."""
    import subprocess
    import sys

    project = tiny_project(tmp_path / "project")
    done = subprocess.run([sys.executable, "-c", DIST_SIGNALLED.replace("{sig}", sig)], cwd=project.root,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if "interrupted" in line]
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert lines == ["interrupted during dist:tiny; nothing half-written kept"], done.stderr
    assert "Traceback" not in done.stderr and not project.path("dist/tiny").exists(), done.stderr
