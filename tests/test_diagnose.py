"""diagnose on the real Silero VAD: the fp16 Pow(x, 2) hazard is found at the Pow node, on real quiet audio."""
from __future__ import annotations

import json

import pytest
from conftest import copy_project

from qnn_tasks.fileio import read_json

VAD_YAML = "models/silero-vad/model.yaml"
TARGET = "vad-SM8650"


def _diagnosis(project) -> dict:
    return project.one_json("build/silero-vad/vad/*/fp16/SM8650/diagnose/diagnose.json")


@pytest.fixture(scope="module")
def pow_project(built_graphs, tmp_path_factory):
    """The VAD exported with Pow(x, 2) kept (the shipped export rewrites it as Mul(x, x))."""
    project = copy_project(tmp_path_factory.mktemp("pow") / "project", source=built_graphs.root, with_build=True)
    project.edit(VAD_YAML, "keep_pow: false", "keep_pow: true ")
    return project


@pytest.mark.slow
def test_diagnose_names_the_pow_node_as_first_divergence(pow_project):
    result = pow_project.doit(f"diagnose:{TARGET}")
    assert result.returncode == 0, result.stdout + result.stderr
    # the verdict and where to read more reach the console
    assert "first divergence at Pow node" in result.stderr and "Mul(x, x)" in result.stderr
    assert "details: build/silero-vad/vad/" in result.stderr and "diagnose.md" in result.stderr
    first = _diagnosis(pow_project)["first_divergence"]
    assert first["op_type"] == "Pow"
    assert first["tensor"].startswith("pow")
    # The measured hazard: on a quiet frame the CPU squares ~1e-6 to ~1e-12, HTP's fp16 Pow gives garbage.
    assert abs(first["cpu_value"]) < 1e-9
    assert abs(first["npu_value"] - first["cpu_value"]) > 1.0
    assert any(abs(v) < 6.1e-5 for v in first["input_values"].values())
    fixes = " ".join(h["fix"] for h in first["hazards"])
    assert "Mul(x, x)" in fixes
    summary = (next(pow_project.root.glob("build/silero-vad/vad/*/fp16/SM8650/diagnose/diagnose.md"))).read_text()
    assert "Pow node" in summary and "Mul(x, x)" in summary


@pytest.mark.slow
def test_diagnostic_graph_reproduces_the_failure_and_ranks_every_node(pow_project):
    record = _diagnosis(pow_project)
    assert record["diagnostic_reproduces_failure"] is True
    assert record["method"] == "all-intermediates"
    nodes = record["nodes"]
    assert [n["index"] for n in nodes] == sorted(n["index"] for n in nodes)
    before = [n for n in nodes if n["index"] < record["first_divergence"]["index"]]
    assert before and all(n["rel_max_abs"] < record["threshold_rel_max_abs"] for n in before)
    assert (pow_project.root / record["plot"]).is_file()


@pytest.mark.slow
def test_lint_warns_about_pow_square_before_compiling(pow_project):
    pow_project.doit("lint:vad", check=True)
    lint = read_json(pow_project.root / "build/silero-vad/vad/lint/lint.json")
    rules = [f["rule"] for f in lint["findings"]]
    assert "pow-square" in rules
    assert any("Mul(x, x)" in w for w in lint["warnings"])


@pytest.mark.slow
def test_simverify_failure_points_at_diagnose(pow_project):
    result = pow_project.doit(f"simverify:{TARGET}")
    assert result.returncode != 0
    assert f"doit diagnose:{TARGET}" in result.stdout + result.stderr


@pytest.mark.slow
def test_bisection_by_cutting_finds_the_same_node(pow_project):
    """The fallback when the diagnostic graph hides a failure: compile prefixes of the graph, bisect."""
    import onnx

    from qnn_tasks.graphs.intermediates import expose_intermediates
    from qnn_tasks.judge import sample_store
    from qnn_tasks.modelspec import load as spec
    from qnn_tasks.stages.diagnose import bisect
    from qnn_tasks.toolchains import from_profile

    root = pow_project.root
    model = onnx.load(str(root / "build/silero-vad/vad/simplify/vad.onnx"))
    _, tensors = expose_intermediates(model)
    inputs = sample_store.load(root / "build/silero-vad/vad/cpucheck/inputs.npz")
    toolchain = from_profile(spec.load_toolchain(root, "ort-qnn"))
    options = json.loads(next(root.glob("build/silero-vad/vad/*/fp16/SM8650/config/provider_options.json")).read_text())
    found = bisect(model, tensors, inputs, toolchain, options, root / "build" / "bisect-test", threshold=0.05)
    assert found is not None and found["op_type"] == "Pow"


@pytest.mark.slow
def test_each_target_diagnoses_its_own_chip(pow_project):
    """Two targets in one run: each record names its own graph, model and chip (a loop variable bound late once
    gave every diagnose.json the last target's)."""
    result = pow_project.doit(f"diagnose:{TARGET}", "diagnose:vad-SM8750")
    assert result.returncode == 0, result.stdout + result.stderr
    for soc in ("SM8650", "SM8750"):
        record = pow_project.one_json(f"build/silero-vad/vad/*/fp16/{soc}/diagnose/diagnose.json")
        assert record["target"] == f"vad-{soc}" and record["soc"]["name"] == soc
        assert record["graph"] == "vad" and record["model"] == "silero-vad"


@pytest.mark.slow
def test_a_diagnosis_of_another_binary_is_marked_stale(pow_project, tmp_path):
    project = copy_project(tmp_path / "project", source=pow_project.root, with_build=True)
    path = next(project.root.glob("build/silero-vad/vad/*/fp16/SM8650/diagnose/diagnose.json"))
    record = json.loads(path.read_text())
    assert record["diagnosed"]["binary_sha256"] and record["diagnosed"]["inputs_sha256"]
    record["diagnosed"]["binary_sha256"] = "0" * 64  # what a diagnosis of an earlier build of the binary holds
    path.write_text(json.dumps(record))
    project.doit("report")
    report = json.loads(project.path("build/report/report.json").read_text())
    diagnosis = next(t for t in report["targets"] if t["name"] == TARGET)["diagnosis"]
    assert diagnosis["status"] == "stale" and diagnosis["stale"] == ["diagnosed an earlier build of this binary"]
    assert "This diagnosis is stale" in project.path("build/report/index.html").read_text()


def test_verdicts_say_what_the_table_and_plot_show():
    """The words agree with the numbers: a node that creates error, error carried gradually, or none."""
    from qnn_tasks.stages.diagnose import verdict

    final = {"metrics": {"logits": {"cosine": 0.9954}}}
    verify = {"checks": [{"kind": "ranking", "output": "logits"}]}
    gradual = [{"index": i, "node": f"n{i}", "op_type": "MatMul", "tensor": f"t{i}", "rel_max_abs": 0.01 * 1.5 ** i}
               for i in range(10)]  # grows by 1.5x a node: past 0.05 from node 4 on, never a 10x jump
    said = verdict(None, gradual, 0.05, final, verify)
    assert said["kind"] == "gradual"
    assert "6 of 10 nodes are past the 0.05 threshold, but none creates its error" in said["text"]
    assert "gate on ranking" in said["text"] and "min_cosine to about 0.994" in said["text"]
    clean = verdict(None, gradual[:3], 0.05, final, verify)
    assert clean["kind"] == "clean" and "no node's error passes 0.05" in clean["text"]
    first = {"op_type": "Pow", "node": "p", "rel_max_abs": 7.0, "hazards": [{"hazard": "fp16 Pow", "fix": "write Mul(x, x)"}]}
    named = verdict(first, gradual, 0.05, final, verify)
    assert named["kind"] == "node" and "Pow node 'p'" in named["text"] and "write Mul(x, x)" in named["text"]
    # four checks of one kind (one per output) are advised once: it said "gate on elements, elements, elements, elements"
    many = {"checks": [{"kind": "elements", "output": f"map{i}"} for i in range(4)] + [{"kind": "top1", "output": "c"}]}
    advice = verdict(None, gradual, 0.05, final, many)["text"]
    assert "gate on elements, top1 and set min_cosine" in advice


@pytest.mark.slow
def test_shipped_export_passes_and_shows_no_divergence(built_graphs, tmp_path):
    project = copy_project(tmp_path / "project", source=built_graphs.root, with_build=True)
    project.doit(f"simverify:{TARGET}", check=True)
    result = project.doit(f"diagnose:{TARGET}", check=True)
    assert f"diagnose:{TARGET}" in result.executed
    record = _diagnosis(project)
    assert record["first_divergence"] is None
    assert record["shipped_binary_failed"] is False
    assert not record["final_output_violations"]
