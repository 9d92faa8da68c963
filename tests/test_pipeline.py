"""Pipelines: a model's graphs chained on the simulator and judged end to end (real compiles and runs).

The model is built in code as two packaged ONNX files, ported with YAML only:
  features:   x [1, 16, 64] (activations around 30) -> a LayerNorm whose variance is E[x^2] - E[x]^2
  classifier: the normalised features -> mean over time -> 10 logits
With `rewrites: [centred-variance]` the chain's predictions match the CPU's; without it the first
graph's fp16 cancellation degrades what the second one sees, and the pipeline's top1 check fails.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import Project, copy_project
from modelpackage_check import agreement
from onnx import TensorProto, helper, numpy_helper

TIME, DIM, CLASSES = 16, 64, 10
YAML = "models/chain/model.yaml"
MODEL_YAML = """\
licence: test fixture
source: {{file: features.onnx}}
graphs:
  features:
    inputs: {{x: {{shape: [1, {t}, {d}], dtype: float32}}}}
    outputs: {{y: {{shape: [1, {t}, {d}]}}}}
    rewrites: {rewrites}
    samples: {{files: samples/features.npz}}
    socs: [SM8650]
  classifier:
    source: {{file: classifier.onnx}}
    inputs: {{y: {{shape: [1, {t}, {d}], dtype: float32}}}}
    outputs: {{logits: {{shape: [1, {c}]}}}}
    samples: {{files: samples/classifier.npz}}
    socs: [SM8650]
pipeline:
  graphs: [features, classifier]
  verify:
    checks:
      - top1: {{output: logits, min: 1.0}}
"""


def features_model() -> onnx.ModelProto:
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], keepdims=1),
             helper.make_node("Mul", ["x", "x"], ["x2"]),
             helper.make_node("ReduceMean", ["x2"], ["mean_x2"], axes=[-1], keepdims=1),
             helper.make_node("Mul", ["mean", "mean"], ["mean_sq"]),
             helper.make_node("Sub", ["mean_x2", "mean_sq"], ["var"], name="variance"),
             helper.make_node("Add", ["var", "eps"], ["var_eps"]),
             helper.make_node("Sqrt", ["var_eps"], ["std"]),
             helper.make_node("Sub", ["x", "mean"], ["centred"]),
             helper.make_node("Div", ["centred", "std"], ["y"])]
    graph = helper.make_graph(nodes, "features", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "t", DIM])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "t", DIM])],
                              [numpy_helper.from_array(np.array(1e-5, np.float32), "eps")])
    return _model(graph)


def classifier_model() -> onnx.ModelProto:
    weights = np.random.default_rng(3).standard_normal((DIM, CLASSES)).astype(np.float32) * 3
    nodes = [helper.make_node("ReduceMean", ["y"], ["pooled"], axes=[1], keepdims=0),
             helper.make_node("MatMul", ["pooled", "w"], ["logits"])]
    graph = helper.make_graph(nodes, "classifier", [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TIME, DIM])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])],
                              [numpy_helper.from_array(weights, "w")])
    return _model(graph)


def _model(graph) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def chain_project(root: Path, rewrites: str) -> Project:
    project = copy_project(root)
    for model in ("silero-vad", "minilm"):  # only the chain: keeps the build short
        import shutil

        shutil.rmtree(project.path(f"models/{model}"))
    folder = project.path("models/chain")
    (folder / "samples").mkdir(parents=True)
    onnx.save(features_model(), str(folder / "features.onnx"))
    onnx.save(classifier_model(), str(folder / "classifier.onnx"))
    rng = np.random.default_rng(4)
    np.savez(folder / "samples/features.npz",
             x=(30 + rng.standard_normal((8, 1, TIME, DIM))).astype(np.float32))  # around 30: fp16 cancels
    np.savez(folder / "samples/classifier.npz", y=rng.standard_normal((8, 1, TIME, DIM)).astype(np.float32))
    (folder / "model.yaml").write_text(MODEL_YAML.format(t=TIME, d=DIM, c=CLASSES, rewrites=rewrites))
    return project


def record(project: Project) -> dict:
    return json.loads(next(project.root.glob("build/chain/pipeline/*/SM8650/pipeline/pipeline.json")).read_text())


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Project:
    project = chain_project(tmp_path_factory.mktemp("chain-good") / "project", "[centred-variance]")
    project.result = project.doit()
    return project


def test_chain_is_verified_end_to_end(good):
    assert good.result.returncode == 0, good.result.stdout + good.result.stderr
    assert "pipeline:chain-SM8650" in good.result.executed
    rec = record(good)
    assert rec["status"] == "passed" and rec["graphs"] == ["features", "classifier"] and rec["samples"] == 8
    assert [link["graph"] for link in rec["links"]] == ["features", "classifier"]
    for link in rec["links"]:  # each link's NPU outputs against the same chain on CPU: error carried, measured
        assert all(m["cosine"] > 0.999 for m in link["metrics"].values()), link
    top1 = next(c for c in rec["checks"] if c["kind"] == "top1")
    assert top1["passed"] and top1["value"] == 1.0
    # the first link is the features graph's own simulate output (all 8 samples): simulated once, not twice
    kept = rec["links"][0]["simulated_by"]
    assert kept.endswith("/SM8650/simulate/outputs.npz") and "/features/" in kept, kept
    assert "simulated_by" not in rec["links"][1] and rec["links"][1]["seconds"] > 0
    assert {"simulate:features-SM8650", "pipeline:chain-SM8650"} <= good.result.executed
    report = json.loads(good.path("build/report/report.json").read_text())
    assert [p["name"] for p in report["pipelines"]] == ["chain-SM8650"] and report["pipelines"][0]["status"] == "passed"
    assert "## Pipelines" in good.path("build/report/report.md").read_text()
    # the chain's phone time: its graphs' estimates added, once per run (an estimate, never a measurement)
    chained = report["pipelines"][0]["latency_ms"]
    graphs = [t["latency_ms"] for t in report["targets"] if t["soc"]["name"] == "SM8650"]
    assert chained["per"] == "run of the chain" and len(graphs) == 2
    if all(g["estimate"] is not None for g in graphs):
        assert chained["estimate"] == pytest.approx(sum(g["estimate"] for g in graphs), abs=0.002)
        assert chained["basis"].startswith("estimated from ")
    else:
        assert chained["estimate"] is None and chained["refused"]
    assert good.doit("pipeline").executed == set()


def test_the_package_of_a_chain_carries_its_end_to_end_verdict(good, tmp_path):
    shipped = good.doit("dist", env={"QNN_DIST": str(tmp_path)})
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    data = json.loads((tmp_path / "chain" / "manifest.json").read_text())
    for graph in ("features", "classifier"):
        (binary,) = data["graphs"][graph]["binaries"]
        (chain,) = binary["verification"]["pipelines"]
        assert chain["measured_on"] == "x86 HTP simulator" and chain["status"] == "passed" and chain["samples"] == 8
        assert chain["graphs"] == ["features", "classifier"]
        assert next(c for c in chain["checks"] if c["kind"] == "top1")["passed"]
    # ONNX Runtime's ModelPackage: the chain the app runs, in order, with which outputs feed which inputs
    (chain,) = agreement(tmp_path / "chain")["pipelines"]
    assert chain["graphs"] == ["features", "classifier"] and chain["feeds"], chain


def test_the_first_link_reuses_the_first_graphs_simulation_only_when_it_covers_the_chain(tmp_path):
    """Planning only: the pipeline takes the first graph's simulate outputs when they hold every sample the chain
    starts from, and simulates the first graph itself when they hold fewer."""
    from qnn_tasks.modelspec.load import load_project
    from qnn_tasks.plan.planner import Planner
    from qnn_tasks.plan.rows import PIPELINE
    from qnn_tasks.plan.stageplans import plan_pipeline, simulated_first_link

    def first_link(project: Project) -> tuple[str | None, list[str]]:
        planner = Planner(load_project(project.root))
        (pt,) = planner.pipelines
        return simulated_first_link(pt), plan_pipeline(planner, PIPELINE, pt).file_dep

    project = chain_project(tmp_path / "covered", "[centred-variance]")
    kept, file_dep = first_link(project)  # features: all its samples; the chain: all of them
    assert "/features/" in kept and kept.endswith("/SM8650/simulate/outputs.npz") and kept in file_dep
    project.edit(YAML, "    socs: [SM8650]\n  classifier:", "    socs: [SM8650]\n    verify: {samples: 2}\n  classifier:")
    assert first_link(project)[0] is None  # the chain needs all 8; the features' simulation holds 2
    project.edit(YAML, "  graphs: [features, classifier]\n  verify:", "  graphs: [features, classifier]\n  verify:\n    samples: 2")
    kept, file_dep = first_link(project)
    assert kept is not None and kept in file_dep  # 2 of 2: covered again


def test_a_degraded_first_graph_fails_the_pipelines_task_check(tmp_path):
    project = chain_project(tmp_path / "project", "[]")  # no centred-variance: the LayerNorm cancels in fp16
    result = project.doit("pipeline:chain-SM8650")
    line = result.failure_line("pipeline:chain-SM8650")
    assert "pipeline chain-SM8650 failed at its end" in line and "check top1 on 'logits'" in line
    assert "the weakest link is graph 'features'" in line
    rec = record(project)
    assert rec["status"] == "failed"
    first, second = rec["links"]
    assert first["metrics"]["y"]["cosine"] < 0.99  # the damage is born in the first graph ...
    top1 = next(c for c in rec["checks"] if c["kind"] == "top1")
    assert top1["value"] < 1.0 and top1["disagreeing_samples"]  # ... and changes the second one's predictions


@pytest.mark.parametrize("edit, fragments", [
    (("graphs: [features, classifier]", "graphs: [features]"), ["pipeline.graphs", "two or more"]),
    (("graphs: [features, classifier]", "graphs: [features, decoder]"), ["'decoder' is not a graph of this model"]),
    (("graphs: [features, classifier]", "graphs: [classifier, features]"), ["input 'x' of graph 'features'"]),
    (("  verify:\n", "  feed: {features.x: classifier.logits}\n  verify:\n"), ["pipeline.feed.features.x"]),
    (("top1: {output: logits, min: 1.0}", "top1: {output: logits, min: 2}"), ["pipeline.verify.checks[0].top1.min"]),
])
def test_pipeline_spec_errors(tmp_path, edit, fragments):
    project = chain_project(tmp_path / "project", "[centred-variance]")
    project.edit(YAML, *edit)
    result = project.doit("list")
    assert result.returncode == 0 and "spec " in result.stdout, result.stderr  # this model is unbuildable
    line = result.stderr.strip()
    assert "\n" not in line and str(project.path(YAML)) in line and "(fix: " in line
    for fragment in fragments:
        assert fragment in line, line


def test_diagnose_names_the_cancelling_subtraction_not_its_victim(tmp_path):
    """The error is born in E[x^2] - E[x]^2 (a Sub of nearly equal values), not at the Div where it shows."""
    project = chain_project(tmp_path / "project", "[]")
    result = project.doit("diagnose:features-SM8650")
    assert result.returncode == 0, result.stdout + result.stderr
    first = project.one_json("build/chain/features/*/fp16/SM8650/diagnose/diagnose.json")["first_divergence"]
    assert first["op_type"] == "Sub" and first["node"] == "variance"
    hazard = next(h for h in first["hazards"] if h["hazard"] == "cancellation in fp16")
    assert "centred-variance" in hazard["fix"]
    assert "first divergence at Sub node 'variance'" in result.stderr


OVERFLOW_YAML = """\
licence: test fixture
source: {file: power.onnx}
graphs:
  power:
    inputs: {pcm: {shape: [1, 512], dtype: float32}}
    outputs: {energy: {shape: [1, 1]}}
    samples: {files: samples.npz}
    socs: [SM8650]
    verify: {samples: 4}
"""


def test_diagnose_says_fp16_overflow_for_squared_int16_scale_audio(tmp_path):
    """Squaring int16-scale audio (values to 3e4) leaves fp16's range: the CPU has ~1e9, the NPU saturates."""
    project = chain_project(tmp_path / "project", "[centred-variance]")
    folder = project.path("models/power")
    folder.mkdir()
    nodes = [helper.make_node("Mul", ["pcm", "pcm"], ["squared"], name="square"),
             helper.make_node("ReduceMean", ["squared"], ["energy"], axes=[1], keepdims=1)]
    graph = helper.make_graph(nodes, "power", [helper.make_tensor_value_info("pcm", TensorProto.FLOAT, [1, 512])],
                              [helper.make_tensor_value_info("energy", TensorProto.FLOAT, [1, 1])])
    onnx.save(_model(graph), str(folder / "power.onnx"))
    rng = np.random.default_rng(6)
    np.savez(folder / "samples.npz", pcm=(rng.standard_normal((4, 1, 512)) * 12000).clip(-32768, 32767).astype(np.float32))
    (folder / "model.yaml").write_text(OVERFLOW_YAML)
    result = project.doit("diagnose:power-SM8650")
    assert result.returncode == 0, result.stdout + result.stderr
    first = project.one_json("build/power/power/*/fp16/SM8650/diagnose/diagnose.json")["first_divergence"]
    assert first["op_type"] == "Mul" and first["node"] == "square"
    assert abs(first["cpu_value"]) > 65504
    hazard = next(h for h in first["hazards"] if h["hazard"] == "fp16 overflow")
    # the input's scale reaches the square exactly, but the energy itself (~1.4e8) is beyond fp16: undoing a scale
    # there multiplies by s^-2 = 2^22, which fp16 cannot hold, so diagnose does not advise scale-input (it once did:
    # a rewrite whose output overflows again); the square is the overflow named
    assert "scale-input" not in hazard["fix"] and "rewrite" not in hazard
