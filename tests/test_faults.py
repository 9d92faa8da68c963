"""Fault injection on the real examples: results a CI gate can trust.

SIGINT and SIGKILL during export, context and simulate; two `doit` at once in one tree;
truncated and deleted binaries; `.part` litter of a killed run. Each case asserts the exit code,
the one line a person reads, that no record says `passed` for outputs that are missing or
damaged, and that the next `doit` repairs the tree with the minimal set of tasks.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import Project, copy_project

from qnn_tasks.errors import EXIT_BUSY
from qnn_tasks.run import records

SOCS = ("SM8650", "SM8750")
INTERRUPT_LIMIT_S = 2.0  # Ctrl-C must stop every stage within this


class Running:
    """A doit started in the background whose stdout lines arrive as they are printed."""

    def __init__(self, project: Project, *args: str, env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "-m", "doit", *args], cwd=project.root, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, line: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.lines:
            assert self.proc.poll() is None, f"doit ended before {line!r}: {self.lines}\n{self.proc.stderr.read()}"
            assert time.monotonic() < deadline, f"no {line!r} in {self.lines}"
            time.sleep(0.02)

    def stop(self, sig: int) -> tuple[int, float, str]:
        """Send `sig`; return the exit code, the seconds it took to exit and stderr."""
        start = time.monotonic()
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        took = time.monotonic() - start
        self._reader.join(timeout=10)
        return code, took, self.proc.stderr.read()

    def finish(self) -> tuple[int, str]:
        code = self.proc.wait(timeout=1800)
        self._reader.join(timeout=10)
        return code, self.proc.stderr.read()


def record_path(project: Project, glob: str) -> Path:
    paths = list(project.root.glob(glob))
    assert len(paths) == 1, paths
    return paths[0]


def litter(project: Project) -> list[Path]:
    build = project.root / "build"
    return [p for p in build.rglob("*") if p.name.endswith(".part") or p.name in (".staging", ".work")
            or p.name.startswith(".cache-restore")]


def no_passed_without_outputs(project: Project) -> None:
    """Every record that says passed vouches for files that are there, byte for byte."""
    for path in (project.root / "build").rglob("*.json"):
        record = records.read(path)
        if isinstance(record, dict) and record.get("status") in ("passed", "warning") and record.get("files"):
            assert records.problems(record, path, project.root) == [], path


def stale_size(report: dict) -> int:
    context = target(report, "minilm-SM8650")["stages"]["context"]
    return next(f["size"] for name, f in context["files"].items() if name.endswith(".bin"))


def report_of(project: Project) -> dict:
    result = project.doit("report")
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return json.loads(project.path("build/report/report.json").read_text())


def target(report: dict, name: str) -> dict:
    return next(t for t in report["targets"] if t["name"] == name)


@pytest.fixture
def built(verified, tmp_path) -> Project:
    """A private copy of the verified example build (both graphs, SM8650 + SM8750), up to date."""
    return copy_project(tmp_path / "project", source=verified.root, with_build=True)


# ------------------------------------------------------------------ Ctrl-C (SIGINT)

# task -> the folder of its stage
STAGE_DIRS = {"export:minilm": "build/minilm/minilm/export",  # a PyTorch export: seconds of tracing
              "context:minilm-SM8650": "build/minilm/minilm/*/fp16/SM8650/context",
              "simulate:vad-SM8650": "build/silero-vad/vad/*/fp16/SM8650/simulate"}


def stage_dir(project: Project, task: str) -> Path:
    return next(project.root.glob(STAGE_DIRS[task]))


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(STAGE_DIRS))
def test_ctrl_c_stops_at_once_says_one_line_and_keeps_nothing_half_written(built, task):
    stage = task.split(":")[0]
    folder = stage_dir(built, task)
    built.doit("forget", task, check=True)
    run = Running(built, task, env={"QNN_PROGRESS_SECONDS": "0"})
    run.wait_for(f".  {task}")
    time.sleep(0.8)  # inside the stage's native work
    code, took, stderr = run.stop(signal.SIGINT)
    assert code == 130, (code, stderr)
    assert took < INTERRUPT_LIMIT_S, f"took {took:.2f} s to stop"
    lines = [line for line in stderr.splitlines() if line.strip() and "interrupted" in line]
    assert lines == [f"interrupted during {task}; nothing half-written kept"], stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr

    # the record was invalidated before the stage started: nothing vouches for a half-made output
    assert not (folder / f"{stage}.json").exists()
    assert litter(built) == []
    no_passed_without_outputs(built)
    if stage != "export":
        assert target(report_of(built), task.partition(":")[2])["status"] == "pending"

    again = built.doit(task)  # the next run repairs exactly that stage
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.executed == {task}, again.executed
    assert (folder / f"{stage}.json").is_file()
    no_passed_without_outputs(built)


@pytest.mark.slow
def test_ctrl_c_during_a_whole_build_reports_the_stage_and_resumes(built):
    """The issue's case: a `context` rebuild of a fully built tree is interrupted; no `passed` stays behind."""
    built.edit("socs/socs.yaml", "SM8650:  {soc_id: 57, dsp_arch: v75, vtcm_mb: 8", "SM8650:  {soc_id: 57, dsp_arch: v75, vtcm_mb: 4")
    run = Running(built)
    run.wait_for(".  context:minilm-SM8650")
    time.sleep(0.8)
    code, took, stderr = run.stop(signal.SIGINT)
    assert code == 130 and took < INTERRUPT_LIMIT_S, (code, took, stderr)
    assert "interrupted during context:minilm-SM8650; nothing half-written kept" in stderr
    report = report_of(built)
    assert target(report, "minilm-SM8650")["status"] == "pending"
    assert report["summary"]["passed"] < report["summary"]["targets"]
    assert not list(built.root.glob("build/minilm/minilm/*/fp16/SM8650/context/context.json"))
    resumed = built.doit()
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "context:minilm-SM8650" in resumed.executed
    assert "config:minilm-SM8650" in resumed.uptodate  # it finished before Ctrl-C, and doit kept that
    assert not any(t.endswith("SM8750") for t in resumed.executed)  # the other chip was never touched
    assert all(t["status"] == "passed" for t in report_of(built)["targets"])


# ------------------------------------------------------------------ SIGKILL: litter is swept by the next run

@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(STAGE_DIRS))
def test_sigkill_litter_is_swept_and_the_tree_repaired(built, task):
    built.doit("forget", task, check=True)
    run = Running(built, task)
    run.wait_for(f".  {task}")
    time.sleep(1.0)
    run.stop(signal.SIGKILL)
    time.sleep(0.5)  # children die with their parent (PR_SET_PDEATHSIG)
    plant = stage_dir(built, task) / ".x.onnx.1234.part"
    plant.write_bytes(b"half")  # what a killed atomic write leaves behind
    lock = json.loads(built.path("build/.qnn-lock").read_text())
    assert lock["clean"] is False  # the killed run never released the tree

    again = built.doit(task)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "cleaned " in again.stderr and "leftover(s) of an interrupted run" in again.stderr
    assert litter(built) == [] and not plant.exists()
    assert task in again.executed
    no_passed_without_outputs(built)
    assert json.loads(built.path("build/.qnn-lock").read_text())["clean"] is True


# ------------------------------------------------------------------ two doit runs in one tree

@pytest.mark.slow
def test_second_doit_refuses_naming_the_first_and_read_only_commands_work(built):
    built.doit("forget", "simulate:vad-SM8650", "simulate:vad-SM8750", check=True)
    first = Running(built, "simverify")
    first.wait_for(".  simulate:vad-SM8650")
    second = built.doit("simverify")
    assert second.returncode == EXIT_BUSY, second.stdout + second.stderr
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "another doit is building this tree" in lines[0], second.stderr
    assert f"pid {first.proc.pid}" in lines[0] and "since " in lines[0] and "QNN_LOCK_WAIT" in lines[0]
    assert second.stdout == ""
    listing = built.doit("list")  # read-only commands still work
    assert listing.returncode == 0 and "simverify" in listing.stdout
    waiting = Running(built, "simverify", env={"QNN_LOCK_WAIT": "600"})  # or wait for it
    code, stderr = first.finish()
    assert code == 0, stderr
    code, stderr = waiting.finish()
    assert code == 0, stderr
    assert "waiting for the doit building this tree" in stderr
    assert not any(line.startswith(".  ") for line in waiting.lines), waiting.lines  # the first did it all
    no_passed_without_outputs(built)
    assert all(t["status"] == "passed" for t in report_of(built)["targets"])


# ------------------------------------------------------------------ damaged and deleted targets

@pytest.mark.slow
def test_truncated_binary_is_stale_in_the_report_and_rebuilt_by_the_next_doit(built):
    binary = next(built.root.glob("build/minilm/minilm/*/fp16/SM8650/context/minilm_ctx_qnn.bin"))
    with open(binary, "r+b") as fh:
        fh.truncate(1000)
    report = built.doit("report")  # the report alone checks the outputs its records vouch for
    assert report.returncode != 0
    assert "report: 1 target(s) stale" in report.stdout + report.stderr and "minilm-SM8650" in report.stdout + report.stderr
    data = json.loads(built.path("build/report/report.json").read_text())
    assert data["summary"]["stale"] == 1 and data["summary"]["passed"] == data["summary"]["targets"] - 1
    stale = target(data, "minilm-SM8650")
    assert stale["status"] == "stale" and "has 1000 bytes" in stale["reason"]
    context = binary.parent / "context.json"
    assert records.problems(records.read(context), context, built.root) == [
        f"{binary.relative_to(built.root)} has 1000 bytes, its record says {stale_size(data)}"]

    repaired = built.doit()
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "context:minilm-SM8650" in repaired.executed
    assert not any(t.startswith(("export", "simplify", "cpucheck")) or t.endswith("SM8750") or "vad" in t
                   for t in repaired.executed), repaired.executed
    assert binary.stat().st_size > 1_000_000
    assert all(t["status"] == "passed" for t in report_of(built)["targets"])


@pytest.mark.slow
def test_deleted_binary_is_rebuilt(built):
    binary = next(built.root.glob("build/silero-vad/vad/*/fp16/SM8750/context/vad_ctx_qnn.bin"))
    binary.unlink()
    assert target(report_of(built), "vad-SM8750")["status"] == "stale"
    repaired = built.doit()
    assert repaired.returncode == 0 and "context:vad-SM8750" in repaired.executed
    assert binary.is_file()
    no_passed_without_outputs(built)


def test_hand_edited_record_reruns_its_stage(built):
    record = next(built.root.glob("build/silero-vad/vad/*/fp16/SM8650/simverify/simverify.json"))
    data = json.loads(record.read_text())
    data["status"] = "passed"
    data["metrics"]["output"]["cosine"] = 1.0  # a record "improved" by hand
    record.write_text(json.dumps(data))
    result = built.doit("simverify")
    assert result.executed == {"simverify:vad-SM8650"}
    assert json.loads(record.read_text())["metrics"]["output"]["cosine"] < 1.0


# ------------------------------------------------------------------ simulate once, judge many times

def test_threshold_edit_rejudges_without_simulating(built):
    built.edit("models/silero-vad/model.yaml", "output: {max_abs: 0.05}", "output: {max_abs: 0.06}")
    built.edit("models/minilm/model.yaml", "ranking: {output: embedding, top: 1, min: 1.0}",
               "ranking: {output: embedding, top: 1, min: 0.9}")
    start = time.monotonic()
    result = built.doit()
    took = time.monotonic() - start
    assert result.returncode == 0, result.stdout + result.stderr
    judged = {f"simverify:{g}-{s}" for g in ("vad", "minilm") for s in SOCS}
    assert result.executed == judged | {"report"}, result.executed
    vad = json.loads(next(built.root.glob("build/silero-vad/vad/*/fp16/SM8650/simverify/simverify.json")).read_text())
    assert vad["metrics"]["output"]["thresholds"]["max_abs"] == 0.06
    assert took < 30, took  # no simulator run: judging kept outputs is quick (the benchmark measures it)


# ------------------------------------------------------------------ a console a person can follow

@pytest.mark.slow
def test_console_shows_progress_and_durations(built):
    built.doit("forget", "simulate:vad-SM8650", check=True)
    result = built.doit("simulate:vad-SM8650", env={"QNN_PROGRESS_SECONDS": "0"})  # every step, not every 15 s
    assert result.returncode == 0, result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("simulate:vad-SM8650: sample ")]
    assert progress[0].startswith("simulate:vad-SM8650: sample 1/36, ") and "elapsed, ~" in progress[0]
    assert re.search(r"^simulate:vad-SM8650: passed in \d+\.\d s$", result.stderr, re.M), result.stderr
    assert "Traceback" not in result.stderr and "[W:onnxruntime" not in result.stderr  # tool chatter is in the log
