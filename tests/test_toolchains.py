"""Several QNN versions side by side, with real wheels: onnxruntime-qnn 2.7.0 (QNN 2.51, this interpreter) and
2.3.0 (QNN 2.47, onnxruntime 1.24.4) in the pinned environment toolchain/ort-qnn-2.47.yaml makes with uv
(scripts/install.sh creates it once; the first use would too).

One run builds both trees; the graph stages run once; the report compares the two builds (and gates on a
regression when asked); `doit compat` measures which runtime loads which binary.
"""
from __future__ import annotations

import json
import shutil

import pytest
from conftest import Project, copy_project, only_fp16, restrict_socs

from qnn_tasks.errors import EXIT_SPEC

BOTH = "ort-qnn,ort-qnn-2.47"
GRAPH_STAGES = ("export", "simplify", "lint", "cpucheck")
GRAPH_TASKS = {f"{s}:{g}" for s in GRAPH_STAGES for g in ("vad", "minilm")}
CHIP_STAGES = ("config", "context", "simulate", "simverify")
pytestmark = pytest.mark.slow


def targets(suffix: str) -> set[str]:
    return {f"{s}:{g}-SM8650{suffix}" for s in CHIP_STAGES for g in ("vad", "minilm")}


def record(project: Project, graph: str, stage: str, tree: str) -> dict:
    model = "silero-vad" if graph == "vad" else "minilm"
    path = next(project.root.glob(f"build/{model}/{graph}/{tree}/fp16/SM8650/{stage}/{stage}.json"))
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def both(built_graphs, tmp_path_factory) -> Project:
    """Both examples (fp16, SM8650; the VAD on 8 frames, MiniLM on 1 sentence) under both toolchains.

    From the session's built graph stages: the toolchain stages are what this module is about.
    """
    project = copy_project(tmp_path_factory.mktemp("both") / "project", source=built_graphs.root, with_build=True)
    restrict_socs(project, ["SM8650"])
    only_fp16(project)
    # QNN 2.47's simulator is ~7x slower than 2.51's (measured alone: MiniLM 22.9 s a sentence against 3.3 s, the
    # VAD 0.39 s a frame against 0.06 s): one sentence, 8 frames
    project.edit("models/minilm/model.yaml", "      samples: 8", "      samples: 1")
    project.edit("models/silero-vad/model.yaml", "    verify:\n", "    verify:\n      samples: 8\n")
    project.result = project.doit(env={"QNN_TOOLCHAIN": BOTH})
    return project


def test_both_trees_build_and_graph_stages_run_once(both):
    result = both.result
    assert result.returncode == 0, result.stdout + result.stderr
    # export .. cpucheck: one task per graph, shared by both toolchains (none has a per-toolchain twin)
    graph_tasks = {t for t in result.executed | result.uptodate if t.split(":")[0] in GRAPH_STAGES}
    assert graph_tasks == GRAPH_TASKS, graph_tasks
    assert targets("") | targets("@ort-qnn-2.47") <= result.executed
    new = record(both, "vad", "context", "ort-qnn-2.7.0-qnn2.51.0-ort1.32.0")
    old = record(both, "vad", "context", "ort-qnn-2.3.0-qnn2.47.0-ort1.24.4")
    assert new["binary"]["build_id"].startswith("v2.51.") and old["binary"]["build_id"].startswith("v2.47.")
    assert old["toolchain"]["onnxruntime"] == "1.24.4" and old["toolchain"]["profile"] == "ort-qnn-2.47"
    assert old["executor"]["python"].endswith("/bin/python") and ".cache/qnn-npu-compile/envs" in old["executor"]["python"]
    for graph in ("vad", "minilm"):
        assert record(both, graph, "simverify", "ort-qnn-2.3.0-qnn2.47.0-ort1.24.4")["status"] == "passed"
    again = both.doit(env={"QNN_TOOLCHAIN": BOTH})
    assert again.executed == set()


def test_report_has_the_upgrade_diff(both):
    report = json.loads(both.path("build/report/report.json").read_text())
    assert [t["profile"] for t in report["toolchains"]] == ["ort-qnn", "ort-qnn-2.47"]
    block, = report["comparison"]
    assert block["baseline"] == "ort-qnn" and block["candidate"] == "ort-qnn-2.47"
    assert block["qnn"] == ["2.51.0", "2.47.0"]
    assert {r["target"] for r in block["rows"]} == {"vad-SM8650", "minilm-SM8650"}
    for row in block["rows"]:
        for side in ("a", "b"):
            figures = row[side]
            assert figures["status"] == "passed" and 0.99 < figures["min_cosine"] <= 1.0 and figures["bin_size"] > 0
            assert figures["compile_seconds"] > 0 and figures["sim_median_s"] > 0
        assert row["a"]["qnn_build"].startswith("v2.51.") and row["b"]["qnn_build"].startswith("v2.47.")
    assert block["regressions"] == [] and block["gate"] is False
    assert "## Upgrade diff: ort-qnn (QNN 2.51.0) vs ort-qnn-2.47 (QNN 2.47.0)" in both.path("build/report/report.md").read_text()


def test_a_threshold_passing_under_one_version_only_is_a_regression_and_gates(both, tmp_path):
    project = copy_project(tmp_path / "project", source=both.root, with_build=True)
    # measured: the two QNN versions give MiniLM embeddings a slightly different max-abs error
    a = record(project, "minilm", "simverify", "ort-qnn-2.7.0-qnn2.51.0-ort1.32.0")["metrics"]["embedding"]["max_abs"]
    b = record(project, "minilm", "simverify", "ort-qnn-2.3.0-qnn2.47.0-ort1.24.4")["metrics"]["embedding"]["max_abs"]
    assert a != b
    order = BOTH if a < b else "ort-qnn-2.47,ort-qnn"  # the baseline is the one that passes
    project.edit("models/minilm/model.yaml", "    verify:\n",
                 f"    verify:\n      per_output: {{embedding: {{max_abs: {(a + b) / 2!r}}}}}\n")
    result = project.doit(env={"QNN_TOOLCHAIN": order, "QNN_UPGRADE_GATE": "1"})
    assert result.returncode != 0
    assert not any(t.startswith(("context", "simulate")) for t in result.executed)  # re-judged, not rebuilt
    line = next(line for line in (result.stdout + result.stderr).splitlines() if line.startswith("report: upgrade gate:"))
    assert "1 regression(s)" in line and "minilm-SM8650" in line
    report = json.loads(project.path("build/report/report.json").read_text())
    block, = report["comparison"]
    assert block["gate"] is True and [r["target"].split("@")[0] for r in block["regressions"]] == ["minilm-SM8650"]
    assert "passes with A (passed), failed with B" in block["regressions"][0]["why"][0]


def test_compat_table_measures_which_runtime_loads_which_binary(both, tmp_path):
    # the VAD's binaries from both versions (MiniLM's would only add minutes of loading on the simulator)
    project = copy_project(tmp_path / "project", source=both.root, with_build=True)
    shutil.rmtree(project.path("models/minilm"))
    result = project.doit("compat", env={"QNN_TOOLCHAIN": BOTH, "QNN_COMPAT_SAMPLES": "2"})
    assert result.returncode == 0, result.stdout + result.stderr
    table = json.loads(project.path("build/compat/compat.json").read_text())
    assert {b["target"] for b in table["binaries"]} == {"vad-SM8650", "vad-SM8650@ort-qnn-2.47"}
    assert [r["qnn"] for r in table["runtimes"]] == ["2.51.0", "2.47.0"]
    by_target = {b["target"]: b for b in table["binaries"]}
    new, old = by_target["vad-SM8650"], by_target["vad-SM8650@ort-qnn-2.47"]
    assert new["built_with"].startswith("v2.51.") and old["built_with"].startswith("v2.47.")
    assert new["runs"]["ort-qnn"]["loads"] and new["runs"]["ort-qnn"]["matches"]
    refused = new["runs"]["ort-qnn-2.47"]
    assert refused["loads"] is False and ("5000" in refused["error"] or "INVALID_ARGUMENT" in refused["error"])
    assert old["runs"]["ort-qnn"]["loads"] and old["runs"]["ort-qnn"]["matches"]  # newer runtime, older binary
    assert old["runs"]["ort-qnn-2.47"]["loads"] and old["runs"]["ort-qnn-2.47"]["matches"]
    assert new["minimum_runtime"] == "2.51.0" and old["minimum_runtime"] == "2.47.0"
    # the load oracle beside each measurement, from the binary's own ep_compatibility_info (qnn/loadoracle.py)
    assert "predicted vs measured: 4 cases, 0 disagree" in result.stdout, result.stdout
    assert table["oracle"]["cases"] == 4 and table["oracle"]["disagree"] == 0 and table["oracle"]["disagreements"] == []
    assert new["facts"]["qnn_version"] == "2.51.0" and old["facts"]["qnn_version"] == "2.47.0"
    assert new["facts"]["soc_models"] == [57] and new["facts"]["bin_arch"] == 75
    predicted = refused["predicted"]
    assert (predicted["outcome"], predicted["rule"], predicted["code"]) == ("refused", "runtime-older", "5000/5005")
    assert "needs QNN 2.51.0 or newer" in predicted["reason"]
    for run in (new["runs"]["ort-qnn"], old["runs"]["ort-qnn-2.47"]):
        assert (run["predicted"]["outcome"], run["predicted"]["rule"]) == ("loads", "match")
    assert old["runs"]["ort-qnn"]["predicted"]["loads"] is True  # an older binary on a newer runtime
    # every SoC row x every known runtime version, predicted (the chip rules are not measurable on the simulator)
    assert new["matrix"]["SM8550"]["2.51.0"]["rule"] == "arch-newer"  # v75 binary, v73 chip
    assert new["matrix"]["SM8750"]["2.51.0"]["rule"] == "arch-older"
    assert new["matrix"]["QCS8300"]["2.51.0"]["rule"] == "soc-model"  # another v75 chip
    assert old["matrix"]["SM8650"]["2.51.0"]["outcome"] == "loads"
    assert set(table["oracle"]["versions"]) >= {"2.47.0", "2.51.0"}
    project.doit("report", env={"QNN_TOOLCHAIN": BOTH})
    markdown = project.path("build/report/report.md").read_text()
    assert "## Runtime compatibility" in markdown and "predicted vs measured: 4 cases, 0 disagree" in markdown
    assert "/ predicted refused (5000/5005)" in markdown
    # a package of the QNN 2.47 build (the run's first toolchain ships) names the measured minimum runtime
    shipped = project.doit("dist:silero-vad", env={"QNN_TOOLCHAIN": "ort-qnn-2.47,ort-qnn"})
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    (binary,) = json.loads(project.path("dist/silero-vad/manifest.json").read_text())["graphs"]["vad"]["binaries"]
    assert binary["sha256"] == old["binary_sha256"] and binary["qnn_version"] == "2.47.0"
    assert (binary["min_runtime_qnn"], binary["min_runtime_from"]) == ("2.47.0", "compat")


def test_a_pinned_environment_that_cannot_be_made_fails_in_one_line(tmp_path):
    project = copy_project(tmp_path / "project")
    project.path("toolchain/ort-qnn-9.yaml").write_text(
        "kind: ort-qnn\npackages: [onnxruntime-qnn==9.9.9, onnxruntime==1.24.4]\n")
    result = project.doit("list", env={"QNN_TOOLCHAIN": "ort-qnn-9", "QNN_ENVS_DIR": str(tmp_path / "envs")})
    assert result.returncode == EXIT_SPEC
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("creating ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "toolchain/ort-qnn-9.yaml: packages: cannot create the pinned environment (onnxruntime-qnn==9.9.9)" in lines[0]
    assert "(fix: " in lines[0]
    assert not list((tmp_path / "envs").glob("*/bin/python"))  # nothing half-made kept
