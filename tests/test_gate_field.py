"""One gate field, and a package that states only what holds (issue 40: item 2, and the end of item 1).

Item 2: report.json's `summary.ok` says whether everything the run promised holds; docs/team.md's gate reads only
it (the line is read from the page and run with jq, as a CI job runs it) and `doit report` exits non-zero exactly
when it is false. A real build whose cross-size check fails (`leaky`: its export ignores the mask, so padding
changes the answer) fails both; with that model gone the same records pass both. Then every failure kind the
report knows, enumerated from the report itself (each list of entries with a status, each status that is not a
pass, unbuildable models, a gating upgrade's regressions, a superseded report): each makes `ok` false, the
documented gate fail and the report task's problems non-empty, and every count of the summary is reached by one
of them, so a kind or a count added later without the other fails here.
Item 1's end: the package of that build ships `leaky`'s sizes as "exact length only" with why (both selectors
follow it on this very manifest), and says its chains `leaky.seq<N> -> head` are incomplete on SM8650 (head
ships, the graph feeding it does not), naming the graph and why; `pool`, whose check passed, keeps "smallest that
fits" and its complete chains.
"""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import Project, copy_project
from sized_project import HEAD_YAML, sized_project
from test_ship_select import CASES, JARS, JAVA
from test_trust_gate import documented_gate

from qnn_tasks.qnn import select
from qnn_tasks.report import gather

VIEWS = {"precision_comparison"}  # lists that repeat the targets' statuses side by side: not verdicts of their own
NOT_VERDICTS = {"toolchains", "variants", "comparison"}  # lists without a status (comparison: its own kind below)
ALWAYS_LISTED = {"loops", "models_not_buildable", "choices"}  # verdict lists this build leaves empty
pytestmark = pytest.mark.skipif(not shutil.which("jq"), reason="the documented gate is a jq line "
                                "(scripts/install.sh installs jq)")


@pytest.fixture(scope="module")
def failing(tmp_path_factory) -> Project:
    """pool (masked: its cross-size check passes) and leaky (mask ignored: it fails), each followed by a head
    (pool_head, head) in a pipeline per size, on SM8650; built with --continue, then `doit report` once."""
    project = sized_project(tmp_path_factory.mktemp("gate") / "p", {"pool": "masked", "leaky": "ignored"}, head="leaky")
    with project.path("models/pool/model.yaml").open("a") as f:  # graph names are unique in a project: pool_head
        f.write(HEAD_YAML.replace("{name}", "pool").replace("  head:", "  pool_head:").replace(", head]", ", pool_head]"))
    export = project.path("models/pool/export.py")
    export.write_text(export.read_text().replace('ctx.graph.name == "head"', 'ctx.graph.name == "pool_head"'))
    run = project.doit("-n", "2", "--continue")
    assert run.returncode != 0 and "crosssize:leaky.seq32-SM8650: " in run.stdout + run.stderr, run.stdout
    project.report = project.doit("report")
    return project


def gate(report: dict | None = None, path: Path | None = None) -> bool:
    """The documented gate, exactly as docs/team.md writes it, run by jq on a report.json (the data, or a file)."""
    with tempfile.TemporaryDirectory() as scratch:
        if path is None:
            path = Path(scratch) / "report.json"
            path.write_text(json.dumps(report))
        run = subprocess.run(["jq", "-e", documented_gate(), str(path)], capture_output=True, text=True, check=False)
    assert run.returncode in (0, 1), run.stderr  # 0: true, 1: false or null; anything else is a broken gate
    return run.returncode == 0


def test_a_failed_cross_size_check_fails_the_documented_gate_and_doit_report(failing, tmp_path):
    assert not gate(path=failing.path("build/report/report.json"))  # (the old gate listed counts, not this one)
    summary = json.loads(failing.path("build/report/report.json").read_text())["summary"]
    assert summary["crosssize_failed"] == 1 and summary["failed"] == 0 and summary["complete"] is True, summary
    assert summary["ok"] is False and documented_gate() == ".summary.ok"
    assert failing.report.returncode != 0 and "crosssize:leaky.seq32-SM8650" in failing.report.stdout
    # the same records without the failing model: the gate and doit report pass (the gate is not always false)
    alone = copy_project(tmp_path / "alone", source=failing.root, with_build=True)
    shutil.rmtree(alone.path("models/leaky"))
    passed = alone.doit("report")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert json.loads(alone.path("build/report/report.json").read_text())["summary"]["ok"] is True
    assert gate(path=alone.path("build/report/report.json"))


def passing(report: dict) -> dict:
    """The report with every verdict made a pass (no unbuildable model, no gating regression), summarized again."""
    data = copy.deepcopy(report)
    for name in verdict_lists(data):
        for entry in data[name]:
            entry["status"] = "passed"
    data["models_not_buildable"], data["comparison"] = [], []
    data["summary"] = gather.summarize(data)
    return data


def verdict_lists(data: dict) -> list[str]:
    """The report's lists whose entries carry a status (each is a kind of verdict), from the report itself."""
    lists = [k for k, v in data.items() if isinstance(v, list)]
    unknown = set(lists) - VIEWS - NOT_VERDICTS - ALWAYS_LISTED - {
        k for k in lists if data[k] and all(isinstance(e, dict) and "status" in e for e in data[k])}
    assert not unknown, f"report lists not classified here: {unknown} (a verdict to count in the summary, or a view)"
    return [k for k in lists if k not in VIEWS | NOT_VERDICTS]


def failure_kinds(base: dict):
    """(name, report) for every way a report can fail: each verdict list x each non-passing status, an unbuildable
    model, a gating upgrade's regression."""
    for name in verdict_lists(base):
        statuses = ["not buildable"] if name == "models_not_buildable" else ["failed", "stale", "pending"]
        for status in statuses:
            data = copy.deepcopy(base)
            entry = copy.deepcopy(base[name][0]) if base[name] else {"name": f"injected-{name}", "model": "m",
                                                                       "error": "e"}
            data[name].append({**entry, "status": status})
            yield f"{name}:{status}", data
    data = copy.deepcopy(base)
    data["comparison"] = [{"baseline": "a", "candidate": "b", "gate": True, "rows": [],
                           "regressions": [{"target": "vad-SM8650", "why": "cosine fell"}]}]
    yield "comparison:regression", data


def test_every_failure_kind_fails_summary_ok_the_documented_gate_and_the_exit_code(failing):
    base = passing(json.loads(failing.path("build/report/report.json").read_text()))
    assert base["summary"]["ok"] is True and gate(base) and gather.gate_problems(base) == []
    assert {"graphs", "targets", "pipelines", "sizes", "loops", "models_not_buildable"} <= set(verdict_lists(base))
    counts = {k for k, v in base["summary"].items() if type(v) is int and k not in gather.INFORMATIONAL}
    reached = set()
    for kind, data in failure_kinds(base):
        data["summary"] = gather.summarize(data)
        failing_counts = gather.failing_counts(data["summary"])
        reached |= set(failing_counts)
        assert data["summary"]["ok"] is False, (kind, data["summary"])
        assert not gate(data), kind
        # the report task's exit decision: problems exactly when not ok (tasks/project.py fails on them)
        problems = gather.gate_problems(data)
        assert problems and all(p.strip() for p in problems), kind
    assert reached == counts, f"summary counts no failure kind makes non-zero: {counts - reached}"
    # each count alone, and not complete / not current, is not ok
    for key in counts:
        assert gather.holds({**base["summary"], key: 1}) is False, key
    for key in ("complete", "current"):
        assert gather.holds({**base["summary"], key: False}) is False, key


def test_a_superseded_report_is_not_ok(failing, tmp_path):
    """What a run leaves on the previous report before its first stage: not ok, so the gate fails until it ends."""
    base = passing(json.loads(failing.path("build/report/report.json").read_text()))
    (tmp_path / "build" / "report").mkdir(parents=True)
    report = tmp_path / "build" / "report" / "report.json"
    report.write_text(json.dumps(base))
    assert gate(path=report)
    subprocess.run([sys.executable, "-c", f"from qnn_tasks.run import reportmark; reportmark.supersede({str(tmp_path)!r})"],
                   check=True)
    summary = json.loads(report.read_text())["summary"]
    assert summary["ok"] is False and summary["current"] is False and not gate(path=report)


def test_a_size_whose_cross_size_check_failed_ships_for_its_exact_length_only(failing, tmp_path):
    shipped = failing.doit("dist")
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    manifest = json.loads(failing.path("dist/leaky/manifest.json").read_text())
    [sizes] = manifest["selection"]["sizes"]
    assert sizes["rule"] == "exact length only", sizes
    assert sizes["why"].startswith("padding is not vouched for: cross-size check of leaky on SM8650: leaky.seq16 "
                                   "and leaky.seq32 differ") and "padding changes the answer" in sizes["why"], sizes
    assert manifest["graphs"]["leaky.seq16"]["binaries"] == [] and manifest["graphs"]["head"]["binaries"]
    # the Python selector: a shorter input takes no size; its own length takes its size, unpadded
    short, exact = select.choose_size(manifest, "leaky", 3), select.choose_size(manifest, "leaky", 16)
    assert (short.graph, short.rule) == (None, select.NOT_EXACT) and sizes["why"] in short.reason, short
    assert (exact.graph, exact.pad, exact.rule) == ("leaky.seq16", 0, select.FITS), exact
    assert select.choose_size(manifest, "leaky", 20).graph is None
    card = failing.path("dist/leaky/MODEL_CARD.md").read_text()
    assert "- Sizes of `leaky` along seq: 16, 32 (exact length only; pad mask 0, x 0; longer: skip); NOT padded: " \
           "padding is not vouched for: cross-size check of leaky on SM8650" in card, card
    # where the check passed the claim stands
    pool = json.loads(failing.path("dist/pool/manifest.json").read_text())["selection"]["sizes"][0]
    assert pool["rule"] == "smallest that fits" and "why" not in pool
    # a check that has not run (its record gone) vouches for nothing either
    unchecked = copy_project(tmp_path / "unchecked", source=failing.root, with_build=True)
    [record] = unchecked.root.glob("build/pool/pool.seq32/*/fp16/SM8650/crosssize/crosssize.json")
    record.unlink()
    assert unchecked.doit("dist:pool").returncode == 0
    [sizes] = json.loads(unchecked.path("dist/pool/manifest.json").read_text())["selection"]["sizes"]
    assert (sizes["rule"], sizes["why"]) == ("exact length only", "padding is not vouched for: the cross-size check "
                                             "has not run on SM8650 (run doit); run a size only on an input of "
                                             "exactly its length"), sizes
    # the Java selector on this very manifest: the shared table plus these cases, through SelectorTest
    java_follows(tmp_path, manifest, [3, 16, 20, 32, 40])


def java_follows(tmp_path, manifest: dict, lengths: list[int]) -> None:
    missing = [str(j) for j in JARS if not j.is_file()] + ([] if shutil.which("javac") else ["javac"])
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (bash scripts/install.sh installs them)")
    table = json.loads(CASES.read_text())
    table["manifests"]["built-leaky"] = manifest
    table["size_cases"] += [{"name": f"built-leaky-{n}", "manifest": "built-leaky", "graph": "leaky", "length": n,
                             "expect": select.choose_size(manifest, "leaky", n).as_dict()} for n in lengths]
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(table))
    classpath = ":".join(map(str, JARS))
    classes = tmp_path / "classes"
    compiled = subprocess.run(["javac", "--release", "8", "-d", str(classes), "-cp", classpath,
                               *sorted(str(p) for p in JAVA.rglob("*.java"))], capture_output=True, text=True,
                              timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    run = subprocess.run(["java", f"-Dselector.cases={cases}",
                          f"-Dselector.manifest_cases={CASES.with_name('manifest_cases.json')}",
                          f"-Dselector.device_cases={CASES.with_name('device_cases.json')}", "-cp", f"{classes}:{classpath}",
                          "org.junit.runner.JUnitCore", "qnntasks.ship.SelectorTest"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "OK (" in run.stdout, run.stdout + run.stderr


def test_a_chain_whose_feeding_graph_is_not_shipped_says_so_for_that_chip(failing):
    if not failing.path("dist/leaky/manifest.json").is_file():
        assert failing.doit("dist").returncode == 0
    manifest = json.loads(failing.path("dist/leaky/manifest.json").read_text())
    chains = {c["name"]: c for c in manifest["pipelines"]}
    assert set(chains) == {"leaky.seq16", "leaky.seq32"}, chains
    for size in (16, 32):
        chain = chains[f"leaky.seq{size}"]
        assert chain["graphs"] == [f"leaky.seq{size}", "head"]
        state = chain["chips"]["SM8650"]
        assert state["complete"] is False and [m["graph"] for m in state["missing"]] == [f"leaky.seq{size}"]
        assert state["missing"][0]["reason"].startswith("failed: crosssize: cross-size check of leaky"), state
        assert state["why"].startswith(f"leaky.seq{size} not shipped for SM8650"), state
    card = failing.path("dist/leaky/MODEL_CARD.md").read_text()
    assert "- `leaky.seq16 -> head` on SM8650: INCOMPLETE: leaky.seq16 not shipped for SM8650" in card, card
    # pool's chains ship whole: every graph's binary, the chain verified on SM8650
    pool = json.loads(failing.path("dist/pool/manifest.json").read_text())
    assert [(c["name"], c["graphs"], c["chips"]) for c in pool["pipelines"]] == [
        (f"pool.seq{n}", [f"pool.seq{n}", "pool_head"], {"SM8650": {"complete": True}}) for n in (16, 32)]
    assert "- `pool.seq16 -> pool_head` on SM8650: complete" in failing.path("dist/pool/MODEL_CARD.md").read_text()
