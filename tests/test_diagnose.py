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


def test_diagnose_names_the_pow_node_as_first_divergence(pow_project):
    result = pow_project.doit(f"diagnose:{TARGET}")
    assert result.returncode == 0, result.stdout + result.stderr
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


def test_diagnostic_graph_reproduces_the_failure_and_ranks_every_node(pow_project):
    record = _diagnosis(pow_project)
    assert record["diagnostic_reproduces_failure"] is True
    assert record["method"] == "all-intermediates"
    nodes = record["nodes"]
    assert [n["index"] for n in nodes] == sorted(n["index"] for n in nodes)
    before = [n for n in nodes if n["index"] < record["first_divergence"]["index"]]
    assert before and all(n["rel_max_abs"] < record["threshold_rel_max_abs"] for n in before)
    assert (pow_project.root / record["plot"]).is_file()


def test_lint_warns_about_pow_square_before_compiling(pow_project):
    pow_project.doit("lint:vad", check=True)
    lint = read_json(pow_project.root / "build/silero-vad/vad/lint/lint.json")
    rules = [f["rule"] for f in lint["findings"]]
    assert "pow-square" in rules
    assert any("Mul(x, x)" in w for w in lint["warnings"])


def test_simverify_failure_points_at_diagnose(pow_project):
    result = pow_project.doit(f"simverify:{TARGET}")
    assert result.returncode != 0
    assert f"doit diagnose:{TARGET}" in result.stdout + result.stderr


def test_bisection_by_cutting_finds_the_same_node(pow_project):
    """The fallback when the diagnostic graph hides a failure: compile prefixes of the graph, bisect."""
    import onnx

    from qnn_tasks import samples, spec
    from qnn_tasks.stages.diagnose import bisect, expose_intermediates
    from qnn_tasks.toolchains import from_profile

    root = pow_project.root
    model = onnx.load(str(root / "build/silero-vad/vad/simplify/vad.onnx"))
    _, tensors = expose_intermediates(model)
    inputs = samples.load(root / "build/silero-vad/vad/cpucheck/inputs.npz")
    toolchain = from_profile(spec.load_toolchain(root, "ort-qnn"))
    options = json.loads(next(root.glob("build/silero-vad/vad/*/fp16/SM8650/config/provider_options.json")).read_text())
    found = bisect(model, tensors, inputs, toolchain, options, root / "build" / "bisect-test", threshold=0.05)
    assert found is not None and found["op_type"] == "Pow"


def test_shipped_export_passes_and_shows_no_divergence(built_graphs, tmp_path):
    project = copy_project(tmp_path / "project", source=built_graphs.root, with_build=True)
    project.doit(f"simverify:{TARGET}", check=True)
    result = project.doit(f"diagnose:{TARGET}", check=True)
    assert f"diagnose:{TARGET}" in result.executed
    record = _diagnosis(project)
    assert record["first_divergence"] is None
    assert record["shipped_binary_failed"] is False
    assert not record["final_output_violations"]
