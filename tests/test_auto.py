"""`precision: auto` (issue 42, items 2-4): every candidate built and verified on the chip, the smallest binary that
passes its checks chosen and shipped; a 4-bit repair; a repair stopped by a task check, not by the cosine.

The graph is test_repair's 12-block MLP stack with an outlier channel in block 2 (real quantizer, compiler and
simulator). Candidates, in the order declared: plain w4a16 (misses cosine 0.99: rejected, not a failed build),
w4a16-mixed judged at cosine 0.975 (its repair keeps the outlier's weight at 16 bits), w8a16-mixed judged by a task
check (the same argmax in every row, at a cosine threshold plain w8a16 passes), and fp16. The 4-bit repaired binary
is the smallest that passes, so it ships alone; both selectors choose it.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from test_repair import SOC, outlier_project
from test_split import YAML
from test_split_ship import JARS, JAVA, PROBE

from qnn_tasks.qnn import select

pytestmark = pytest.mark.slow
ORDER = ["w4a16", "w4a16-mixed", "w8a16-mixed", "fp16"]
VERIFY = ("    verify: {samples: 3, w4a16-mixed: {thresholds: {min_cosine: 0.975, min_snr_db: 12}},\n"
          "             w8a16-mixed: {thresholds: {min_cosine: 0.9, min_snr_db: 10},\n"
          "                           checks: [{top1: {output: y, min: 0.95}}]}}\n")


@pytest.fixture(scope="module")
def auto(tmp_path_factory):
    project = outlier_project(tmp_path_factory.mktemp("auto") / "p", precision="{auto: [" + ", ".join(ORDER) + "]}")
    project.edit(YAML, "    verify: {samples: 3}\n", VERIFY)
    project.result = project.doit()
    return project


def _choice(project) -> dict:
    return project.one_json(f"build/stack/net/*/w4a16/{SOC}/choose/choose.json")


def test_auto_ships_the_smallest_candidate_that_passes(auto):
    assert auto.result.returncode == 0, auto.result.stdout + auto.result.stderr
    assert f"choose:net-{SOC}" in auto.result.executed
    record = _choice(auto)
    found = {c["precision"]: c for c in record["candidates"]}
    assert [c["precision"] for c in record["candidates"]] == ORDER == record["order"]
    assert found["w4a16"]["status"] == "rejected" and "cosine" in found["w4a16"]["why"]
    assert all(found[p]["status"] == "passed" for p in ORDER[1:])
    sizes = [found[p]["binary_bytes"] for p in ORDER[1:]]
    assert sizes == sorted(sizes), sizes  # 4-bit repaired < 8-bit repaired < fp16
    assert record["chosen"] == {"precision": "w4a16-mixed", "target": f"net-w4a16-mixed-{SOC}",
                                "binary_bytes": sizes[0]}
    # the cost: one binary per candidate and each repair's compiles, with the seconds those stages took
    repairs = [auto.one_json(f"build/stack/net/*/{p}/repair/repair.json") for p in ("w4a16-mixed", "w8a16-mixed")]
    assert record["compiles"] == len(ORDER) + sum(r["compiles"] for r in repairs) and record["build_seconds"] > 0
    sim = auto.one_json(f"build/stack/net/*/w4a16/{SOC}/simverify/simverify.json")
    assert sim["status"] == "rejected" and sim["rejected"].startswith("w4a16 misses its checks: output 'y': cosine")
    assert auto.doit().executed == set()  # all cached: a rejected candidate is a verdict, not a failure to retry


def test_the_4bit_repair_keeps_the_outlier_weight_at_16_bits(auto):
    record = auto.one_json("build/stack/net/*/w4a16-mixed/repair/repair.json")
    assert record["plain"]["precision"] == "w4a16" and not record["plain"]["passed"]
    assert record["plain"]["min_cosine"] < 0.975 and record["ranked"][0]["weight"] == "b2.w1"
    assert [p["weight"] for p in record["promoted"]] == ["b2.w1"] and record["share"] <= 0.10
    assert record["min_cosine"] >= 0.975 and record["size_ratio"] <= 1.15


def test_the_repair_stops_on_the_task_check_not_the_cosine(auto):
    """Plain w8a16 clears the cosine and SNR thresholds (0.9, 10 dB) yet changes the argmax of a third of the rows:
    the repair goes on until the task check passes (0.95 of the rows' argmax the same)."""
    record = auto.one_json("build/stack/net/*/w8a16-mixed/repair/repair.json")
    plain = record["plain"]
    assert plain["min_cosine"] > 0.9 and not plain["passed"]
    assert [(c["kind"], c["passed"]) for c in plain["checks"]] == [("top1", False)], plain
    final = record["steps"][-1]
    assert final["passed"] and [(c["kind"], c["passed"]) for c in final["checks"]] == [("top1", True)]
    assert [p["weight"] for p in record["promoted"]] == ["b2.w1"]


def test_the_report_shows_the_choice_and_the_rejected_candidate(auto):
    result = auto.doit("report")
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(auto.path("build/report/report.json").read_text())
    assert data["summary"]["ok"] and data["summary"]["rejected"] == 1 and data["summary"]["choices_failed"] == 0
    [choice] = data["choices"]
    assert choice["status"] == "passed" and choice["chosen"]["precision"] == "w4a16-mixed"
    rows = {r["precision"]: r for r in data["precision_comparison"]}
    assert [p for p, r in rows.items() if r["chosen"]] == ["w4a16-mixed"] and rows["w4a16"]["status"] == "rejected"
    html = auto.path("build/report/index.html").read_text()
    assert "Precision auto" in html and "w4a16-mixed</strong>" in html


def test_dist_ships_only_the_chosen_binary_and_both_selectors_take_it(auto, tmp_path):
    shipped = auto.doit("dist")
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    folder = auto.path("dist/stack")
    data = json.loads((folder / "manifest.json").read_text())
    [binary] = data["graphs"]["net"]["binaries"]
    assert binary["precision"] == "w4a16-mixed" and binary["auto"]["chosen"] == "w4a16-mixed"
    assert [c["status"] for c in binary["auto"]["candidates"]] == ["rejected", "passed", "passed", "passed"]
    assert binary["repair"]["promoted"][0]["weight"] == "b2.w1"
    reasons = {o["precision"]: o["reason"] for o in data["omitted"]}
    assert reasons["w4a16"].startswith("rejected: simverify: w4a16 misses its checks")
    assert reasons["fp16"].startswith("not chosen: precision auto ships w4a16-mixed on SM8650")
    assert "w4a16-mixed" in data["selection"]["precision_order"]
    runtime = binary["min_runtime_qnn"]
    decision = select.choose(data, "net", SOC, runtime, lambda b: None)
    assert (decision.target, decision.path, decision.precision) == ("npu", binary["path"], "w4a16-mixed")
    missing = [str(j) for j in JARS if not j.is_file()] + ([] if shutil.which("javac") else ["javac"])
    if missing:
        pytest.skip(f"the Java selector needs {', '.join(missing)} (bash scripts/install.sh installs them)")
    (tmp_path / "SplitProbe.java").write_text(PROBE)
    classes, classpath = tmp_path / "classes", str(JARS[0])
    compiled = subprocess.run(["javac", "--release", "8", "-d", str(classes), "-cp", classpath,
                               str(JAVA / "src/main/java/qnntasks/ship/Selector.java"), str(tmp_path / "SplitProbe.java")],
                              capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    run = subprocess.run(["java", "-cp", f"{classes}:{classpath}", "SplitProbe", str(folder / "manifest.json"), "net",
                          runtime, SOC], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    [java] = json.loads(run.stdout)["decisions"]
    assert (java["target"], java["path"], java["precision"]) == ("npu", binary["path"], "w4a16-mixed")
