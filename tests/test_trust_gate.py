"""A gate that cannot be fooled (issue 23, items 4 and 5): the documented CI gate (docs/team.md), `doit report` and
the up-to-date checks on the real example build (`verified`: both graphs on SM8650 + SM8750).

Item 4: a report with targets that have no verdict (pending: not built, interrupted, lost) fails
the documented gate and `doit report`; a run killed after it started stages leaves the previous
report marked superseded, never looking current. Item 5: a file replaced with its size and mtime
kept (`cp -p`) or a record with a forged digest is stale and rebuilt, and simulate refuses a
binary of another chip before running it. The gate is run exactly as docs/team.md writes it (jq).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, Project, copy_project
from test_faults import Running

VAD = "build/silero-vad/vad/*/fp16"
# (Running: a doit in the background whose stdout lines arrive as they are printed)


@pytest.fixture
def built(verified, tmp_path) -> Project:
    """A private copy of the verified example build (both graphs, SM8650 + SM8750), up to date."""
    return copy_project(tmp_path / "project", source=verified.root, with_build=True)


def documented_gate() -> str:
    """The jq expression of the CI gate in docs/team.md ("A CI job"), exactly as documented."""
    text = (ROOT / "docs" / "team.md").read_text()
    gates = re.findall(r"`jq -e '([^']+)' build/report/report\.json`", text)
    assert len(gates) == 1, gates  # one gate, documented once
    return gates[0]


def gate_passes(project: Project, expression: str | None = None) -> bool:
    """Run the documented gate (or one of its terms) on the project's report.json: with jq when installed (it is
    here), else the same condition (terms `.a.b` or `.a.b == N` joined by `and`) evaluated in Python."""
    report = project.path("build/report/report.json")
    expression = expression or documented_gate()
    if shutil.which("jq"):
        run = subprocess.run(["jq", "-e", expression, str(report)], capture_output=True, text=True, check=False)
        assert run.returncode in (0, 1), run.stderr  # 0: true, 1: false; anything else is a broken gate
        return run.returncode == 0
    data = json.loads(report.read_text())

    def term(text: str) -> bool:
        path, _, value = (part.strip() for part in text.partition("=="))
        found = data
        for key in path.lstrip(".").split("."):
            found = found.get(key) if isinstance(found, dict) else None
        return found == json.loads(value) if value else found not in (None, False)

    return all(term(t) for t in expression.split(" and "))


def report_json(project: Project) -> dict:
    return json.loads(project.path("build/report/report.json").read_text())


def one(project: Project, pattern: str) -> Path:
    paths = list(project.root.glob(pattern))
    assert len(paths) == 1, paths
    return paths[0]


def report_failure(result) -> str:
    """The one line `doit report` fails with (besides the line naming index.html); no traceback."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines()
             if line.startswith("report: ") and not line.startswith("report: build/report/index.html")]
    assert len(lines) == 1, output
    return lines[0]


# ------------------------------------------------------------------ item 4: nothing verified must not pass

def test_the_documented_gate_passes_a_complete_verified_build(built):
    assert documented_gate() == ".summary.ok"  # one field: the summary decides what fails (test_gate_field.py)
    result = built.doit("report")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = report_json(built)["summary"]
    assert summary["complete"] is True and summary["current"] is True and summary["superseded_by"] is None
    assert summary["passed"] == summary["targets"] == 4
    assert gate_passes(built)


def test_pending_targets_fail_the_gate_and_doit_report(built):
    """What an unreachable store or a lost scheduler leaves: targets whose stages have no record."""
    for soc in ("SM8650", "SM8750"):
        one(built, f"{VAD}/{soc}/simulate/simulate.json").unlink()
        one(built, f"{VAD}/{soc}/simverify/simverify.json").unlink()
    result = built.doit("report")
    line = report_failure(result)
    assert "2 target(s) not verified" in line and "vad-SM8650, vad-SM8750" in line and "run doit" in line, line
    summary = report_json(built)["summary"]
    assert summary["pending"] == 2 and summary["complete"] is False
    assert not gate_passes(built)  # the old gate (failed == 0 and stale == 0 ...) was true here


@pytest.mark.slow
def test_a_killed_run_never_leaves_the_previous_verdict_looking_current(built):
    assert built.doit("report").returncode == 0 and gate_passes(built)
    built.doit("forget", "simulate:vad-SM8650", check=True)
    run = Running(built)
    run.wait_for(".  simulate:vad-SM8650")
    time.sleep(0.5)
    code, _, stderr = run.stop(signal.SIGTERM)
    assert code in (130, 143), stderr  # (143: if SIGTERM gets its own exit code)
    summary = report_json(built)["summary"]  # the previous run's report, still there: marked, not current
    assert summary["current"] is False and summary["complete"] is False
    assert f"pid {run.proc.pid}" in summary["superseded_by"] and "rerun doit" in summary["superseded_by"]
    assert not gate_passes(built)

    line = report_failure(built.doit("report"))  # its stage's record was removed when it started
    assert "1 target(s) not verified" in line and "vad-SM8650" in line, line
    assert not gate_passes(built)

    resumed = built.doit()
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "simulate:vad-SM8650" in resumed.executed
    assert report_json(built)["summary"]["current"] is True and gate_passes(built)
    assert built.doit().executed == set()  # and a no-op run leaves the finished report alone


# ------------------------------------------------------------------ item 5: digests checked, chip checked

def swap_binary(project: Project, target: str = "SM8650", source: str = "SM8750") -> Path:
    """Another chip's binary of the same size copied over this chip's with its mtime kept (`cp -p`)."""
    binary = one(project, f"{VAD}/{target}/context/vad_ctx_qnn.bin")
    other = one(project, f"{VAD}/{source}/context/vad_ctx_qnn.bin")
    assert binary.stat().st_size == other.stat().st_size and binary.read_bytes() != other.read_bytes()
    subprocess.run(["cp", "-p", str(other), str(binary)], check=True)
    assert binary.stat().st_mtime_ns == other.stat().st_mtime_ns
    return binary


@pytest.mark.slow
def test_a_binary_replaced_with_size_and_mtime_kept_is_stale_and_rebuilt(built):
    binary = swap_binary(built)
    line = report_failure(built.doit("report"))
    assert "1 target(s) stale" in line and "vad-SM8650" in line, line
    target = next(t for t in report_json(built)["targets"] if t["name"] == "vad-SM8650")
    assert target["status"] == "stale" and "vad_ctx_qnn.bin changed since its record" in target["reason"]
    assert not gate_passes(built)

    repaired = built.doit()
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert {"context:vad-SM8650", "simulate:vad-SM8650"} <= repaired.executed, repaired.executed
    assert not any(t.endswith("SM8750") for t in repaired.executed), repaired.executed
    from qnn_tasks.qnn import binary as qnnbin

    assert qnnbin.read_binary_info(binary).soc_model == 57  # SM8650's soc_id again
    assert gate_passes(built)


@pytest.mark.slow
def test_a_record_with_a_forged_digest_is_stale_and_its_stage_reruns(built):
    record = one(built, f"{VAD}/SM8750/context/context.json")
    before = record.stat()
    data = json.loads(record.read_text())
    binary = next(name for name in data["files"] if name.endswith(".bin"))
    data["files"][binary]["sha256"] = "0" * 64
    record.write_text(json.dumps(data, indent=2) + "\n")
    os.utime(record, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime as they were
    assert record.stat().st_size == before.st_size

    line = report_failure(built.doit("report"))
    assert "1 target(s) stale" in line and "vad-SM8750" in line, line
    assert not gate_passes(built)
    repaired = built.doit()
    assert repaired.returncode == 0 and "context:vad-SM8750" in repaired.executed, repaired.stdout
    assert json.loads(record.read_text())["files"][binary]["sha256"] != "0" * 64
    assert gate_passes(built)


def test_simulate_refuses_another_chips_binary_before_running_it(built):
    """`doit -s` runs the one task without its dependencies: the stage itself must check the binary."""
    swap_binary(built)
    outputs = one(built, f"{VAD}/SM8650/simulate/outputs.npz")
    kept = outputs.stat().st_mtime_ns
    built.doit("forget", "simulate:vad-SM8650", check=True)
    result = built.doit("-s", "simulate:vad-SM8650")
    line = result.failure_line("simulate:vad-SM8650")
    assert "not a binary for SM8650: socModel 69 != soc_id 57, arch v79 != dsp_arch v75" in line, line
    assert "refused before running it (fix: rebuild it: doit context:vad-SM8650)" in line, line
    sim = json.loads(one(built, f"{VAD}/SM8650/simulate/simulate.json").read_text())
    assert sim["status"] == "failed" and "files" not in sim
    assert outputs.stat().st_mtime_ns == kept  # nothing was simulated


def test_pipeline_refuses_another_chips_binary_before_running_anything(verified):
    from qnn_tasks.errors import StageError
    from qnn_tasks.modelspec.load import load_socs
    from qnn_tasks.stages import pipeline

    sm8650 = load_socs(verified.path("socs/socs.yaml"))["SM8650"]
    other = one(verified, f"{VAD}/SM8750/context/vad_ctx_qnn.bin")
    with pytest.raises(StageError) as err:  # nothing else is given: the check comes before any input is read
        pipeline.run([], [], [], [], Path("no-inputs.npz"), {}, {}, "vad-SM8650", Path("no-out"),
                     binaries=[(other, "vad-SM8650")], soc=sm8650)
    assert "not a binary for SM8650: socModel 69 != soc_id 57" in str(err.value)
    assert "(fix: rebuild it: doit context:vad-SM8650)" in str(err.value)


def test_a_copied_tree_stays_up_to_date(built):
    """Copying (new inodes and ctimes, mtimes kept) costs one digest check, not a rebuild."""
    result = built.doit()
    assert result.returncode == 0 and result.executed == set(), result.stdout


# ------------------------------------------------------------------ minors: damaged records, Ctrl-C in the report

def test_a_record_that_is_not_a_record_is_stale(built):
    one(built, f"{VAD}/SM8750/simverify/simverify.json").write_text("[]\n")
    one(built, "build/minilm/minilm/*/fp16/SM8650/simverify/simverify.json").write_bytes(b"\xff\xfe{}")
    result = built.doit("report")
    line = report_failure(result)
    assert "2 target(s) stale" in line, line
    targets = {t["name"]: t for t in report_json(built)["targets"]}
    assert targets["vad-SM8750"]["status"] == "stale" and "holds a JSON list, not a record" in targets["vad-SM8750"]["reason"]
    assert targets["minilm-SM8650"]["status"] == "stale" and "is not UTF-8 (byte 0)" in targets["minilm-SM8650"]["reason"]
    repaired = built.doit()
    assert repaired.returncode == 0 and {"simverify:vad-SM8750", "simverify:minilm-SM8650"} <= repaired.executed


def test_ctrl_c_during_doit_report_is_one_line_and_exit_130(built, tmp_path):
    for attempt in range(3):
        project = copy_project(tmp_path / f"try{attempt}", source=built.root, with_build=True)
        (project.root / "build" / ".qnn-digests.json").unlink(missing_ok=True)  # cold: the report hashes everything
        (project.root / "build" / "report" / "report.json").unlink()  # so that it renders
        run = Running(project, "report")
        run.wait_for(".  report")
        code, took, stderr = run.stop(signal.SIGINT)
        if code in (0, 1):  # it finished before the signal arrived: try again
            continue
        assert code == 130, (code, stderr)
        assert took < 2.0 and "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
        assert [line for line in stderr.splitlines() if line.strip()] == [
            "interrupted during report; nothing half-written kept"], stderr
        assert not list((project.root / "build" / "report").rglob("*.part"))
        return
    pytest.fail("doit report finished before SIGINT in 3 tries")
