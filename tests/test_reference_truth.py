"""The reference is the truth, not the original's float32 rounding (issue 35, item 1).

A LayerNorm written as ReduceSum(x*x) * (1/N) - (ReduceSum(x) * (1/N))^2 on inputs of mean 100 (std 1, 64
features) cancels in float32: the original is ~3e-3 off a float64 evaluation of itself, the graph rewritten by
`centred-variance` ~1e-5. cpucheck must blame the original, pass saying so with both numbers, and hand the float64
outputs to the NPU's judge; a genuinely broken export must still fail. Real onnx, onnxruntime and doit.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from test_rewrites import const, model_of
from test_yaml_defects import arithmetic_layer_norm, small_project

from qnn_tasks.errors import StageError
from qnn_tasks.graphs import float64

SHAPE = (1, 16, 64)
LAYER_NORM_YAML = """\
licence: test
source: {file: m.onnx}
graphs:
  norm:
    inputs: {x: {shape: [1, 16, 64], dtype: float32}}
    outputs: {y: {shape: [1, 16, 64]}}
    rewrites: [centred-variance]
    samples: {files: "samples/*.npz"}
"""


def layer_norm_project(root: Path, yaml: str = LAYER_NORM_YAML, model: onnx.ModelProto | None = None):
    """small_project's folder with the cancelling LayerNorm as m.onnx and 4 samples of mean 100, std 1."""
    project = small_project(root, {"ln": yaml})
    folder = project.root / "models" / "ln"
    onnx.save(model or arithmetic_layer_norm("sum_mul", shape=SHAPE), str(folder / "m.onnx"))
    x = (100.0 + np.random.default_rng(35).standard_normal((4, *SHAPE))).astype(np.float32)
    np.savez(folder / "samples" / "a.npz", x=x)
    return project


def test_the_double_copy_computes_in_float64_and_says_how():
    model = arithmetic_layer_norm("sum_mul", shape=SHAPE)
    x = (100.0 + np.random.default_rng(1).standard_normal(SHAPE)).astype(np.float32)
    [out], how = float64.evaluate(model, [{"x": x}], "m.onnx")
    assert out["y"].dtype == np.float64 and how == "a float64 copy of m.onnx under onnxruntime CPU"
    exact = x.astype(np.float64)
    exact = (exact - exact.mean(-1, keepdims=True)) / np.sqrt(exact.var(-1, keepdims=True) + 1e-5)
    assert np.abs(out["y"] - exact).max() < 1e-9
    # the copy is valid ONNX: every float32 tensor, I/O and cast is double now
    onnx.checker.check_model(float64.double_copy(model), full_check=True)


def test_constants_of_every_form_and_casts_are_doubled():
    """Constant(value_float[s]), Constant(value), ConstantOfShape and Cast(to=float) all compute in float64."""
    nodes = [helper.make_node("Constant", [], ["c"], value_float=100.0),
             helper.make_node("Constant", [], ["d"], value_floats=[1.0, 3.0]),
             helper.make_node("ConstantOfShape", ["shape"], ["z"], value=const("", [1e-9])),
             helper.make_node("Cast", ["i"], ["f"], to=1),
             helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Mul", ["a", "d"], ["b"]),
             helper.make_node("Add", ["b", "z"], ["e"]), helper.make_node("Add", ["e", "f"], ["y"])]
    model = model_of(nodes, [helper.make_tensor_value_info("x", 1, [2]), helper.make_tensor_value_info("i", 6, [2])],
                     [helper.make_tensor_value_info("y", 1, [2])], [const("shape", [2], np.int64)])
    onnx.checker.check_model(float64.double_copy(model), full_check=True)
    [out], how = float64.evaluate(model, [{"x": np.array([1e-7, 2.0], np.float32), "i": np.array([1, 2], np.int32)}],
                                  "c.onnx")
    assert how == "a float64 copy of c.onnx under onnxruntime CPU"
    np.testing.assert_allclose(out["y"], [(100 + 1e-7) + 1e-9 + 1, 306 + 1e-9 + 2], rtol=1e-15)  # float32 loses 1e-7


def erf_model(op="Erf", opset=13):
    return model_of([helper.make_node(op, ["x"], ["y"])], [helper.make_tensor_value_info("x", 1, [1, 8])],
                    [helper.make_tensor_value_info("y", 1, [1, 8])], opset=opset)


def test_an_op_without_a_double_kernel_runs_in_float32_between_casts():
    """onnxruntime's CPU provider has no double Erf (MiniLM's GELU) or Conv (the VAD): they are cast down and up."""
    from math import erf

    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(1, 8)
    [out], how = float64.evaluate(erf_model(), [{"x": x}], "erf.onnx")
    assert how == "a float64 copy of erf.onnx under onnxruntime CPU (Erf in float32: no double kernel)"
    exact = np.array([[erf(v) for v in x.astype(np.float64)[0]]])
    assert out["y"].dtype == np.float64 and 0 < np.abs(out["y"] - exact).max() < 1e-6


def test_a_function_op_whose_body_has_no_double_kernel_falls_back_to_the_reference_evaluator():
    # Gelu (opset 20) is expanded by onnxruntime into an Erf it cannot run in double: casting the Gelu does not help
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(1, 8)
    [out], how = float64.evaluate(erf_model("Gelu", 20), [{"x": x}], "gelu.onnx")
    assert how.startswith("a float64 copy of gelu.onnx under onnx's ReferenceEvaluator (onnxruntime could not run it: ")
    from math import erf, sqrt

    exact = np.array([[v * 0.5 * (1 + erf(v / sqrt(2))) for v in x.astype(np.float64)[0]]])
    assert out["y"].dtype == np.float64 and np.abs(out["y"] - exact).max() < 1e-7  # its erf is an approximation


def test_cpucheck_blames_the_cancelling_original_and_hands_the_truth_to_the_npu(tmp_path):
    """Failed on 04de191: 'simplified ONNX differs from the original model: output 'y': max_abs = 0.0043...'."""
    project = layer_norm_project(tmp_path / "p")
    result = project.doit("cpucheck:norm")
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, output
    record = project.one_json("build/ln/norm/cpucheck/cpucheck.json")
    truth = record["float64"]
    assert truth["from"] == "a float64 copy of m.onnx under onnxruntime CPU"
    sides = truth["metrics"]["y"]
    print("against float64: original fp32", sides["original_float32"]["max_abs"],
          "rewritten fp32", sides["simplified_float32"]["max_abs"], "fp32 vs fp32", record["metrics"]["y"]["max_abs"])
    assert record["metrics"]["y"]["max_abs"] > 1e-3  # what failed before: the two float32 runs disagree
    assert sides["original_float32"]["max_abs"] > 1e-3 > 100 * sides["simplified_float32"]["max_abs"]
    assert record["reference_from"] == "a float64 copy of m.onnx under onnxruntime CPU (the float32 original is the weaker side)"
    [line] = [row for row in output.splitlines() if "float32 error is what differs" in row]
    assert re.search(r"output 'y': original float32 max_abs [0-9.e-]+, simplified float32 [0-9.e-]+", line), line
    # the NPU is judged against the float64 truth (stored in the outputs' dtype), not the original's float32 run
    x = np.load(project.root / "build/ln/norm/cpucheck/inputs.npz")["x"]
    reference = np.load(project.root / "build/ln/norm/cpucheck/reference.npz")["y"]
    exact = x.astype(np.float64)
    exact = (exact - exact.mean(-1, keepdims=True)) / np.sqrt(exact.var(-1, keepdims=True) + 1e-5)
    assert reference.dtype == np.float32 and np.abs(reference - exact).max() < 1e-6


def test_a_broken_export_still_fails_and_the_float64_numbers_say_it_is_the_export(tmp_path):
    """An export.py that changes the math (the rewritten output scaled by 1.05): the weak original does not excuse it."""
    project = layer_norm_project(tmp_path / "p")
    (project.root / "models/ln/export.py").write_text(
        "import onnx\nfrom onnx import helper, numpy_helper\nimport numpy as np\n\n\n"
        "def export(ctx):\n"
        "    ctx.default_export()\n"
        "    model = onnx.load(str(ctx.out_path))\n"
        "    y = model.graph.node[-1].output[0]\n"
        "    model.graph.node[-1].output[0] = 'y_exact'\n"
        "    model.graph.initializer.append(numpy_helper.from_array(np.array(1.05, np.float32), 'wrong'))\n"
        "    model.graph.node.append(helper.make_node('Mul', ['y_exact', 'wrong'], [y]))\n"
        "    onnx.save(model, str(ctx.out_path))\n")
    result = project.doit("cpucheck:norm")
    line = result.failure_line("cpucheck:norm")
    assert "simplified ONNX differs from the original model: output 'y': max_abs = " in line
    record = project.one_json("build/ln/norm/cpucheck/cpucheck.json")
    sides = record["float64"]["metrics"]["y"]
    assert sides["original_float32"]["max_abs"] < 1e-2 < 0.1 < sides["simplified_float32"]["max_abs"]
    assert "; against a float64 copy of m.onnx under onnxruntime CPU: output 'y': original float32 max_abs" in line
    assert "(fix the export, or loosen graphs.norm.cpucheck)" in line and "weaker side" not in json.dumps(record)


def test_a_passing_cpucheck_pays_nothing(tmp_path):
    """Inputs of mean 0: the float32 runs agree and no float64 evaluation is made (off the hot path)."""
    project = layer_norm_project(tmp_path / "p")
    folder = project.root / "models" / "ln"
    np.savez(folder / "samples" / "a.npz", x=np.random.default_rng(2).standard_normal((4, *SHAPE)).astype(np.float32))
    result = project.doit("cpucheck:norm")
    assert result.returncode == 0, result.stdout + result.stderr
    record = project.one_json("build/ln/norm/cpucheck/cpucheck.json")
    assert "float64" not in record and record["reference_from"] == "the original m.onnx on CPU"


@pytest.mark.slow
def test_the_npu_is_judged_against_the_float64_truth_on_the_simulator(tmp_path):
    """The same project through compile and the HTP simulator (fp16, SM8650): the binary passes against the
    float64 truth, and simverify's record names it (on 04de191 cpucheck failed, so no chip was ever judged)."""
    project = layer_norm_project(tmp_path / "p")
    result = project.doit("simverify:norm-SM8650", "report")
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, output
    record = project.one_json("build/ln/norm/*/*/SM8650/simverify/simverify.json")
    assert record["reference_from"] == ("a float64 copy of m.onnx under onnxruntime CPU "
                                        "(the float32 original is the weaker side)")
    assert record["metrics"]["y"]["cosine"] > 0.999  # measured 0.99966
    html = project.path("build/report/index.html").read_text()
    assert "judged against a float64 copy of m.onnx under onnxruntime CPU" in html
    assert "the original&#39;s own float32 error is what differs" in html


@pytest.mark.slow
def test_a_diagnosis_of_earlier_samples_is_stale_once_the_target_passes(tmp_path):
    """Issue 35, item 6: a diagnosis made on an earlier run's samples (another inputs_sha256, other numbers) was shown
    as current in report.json and index.html after the target passed with the same binary."""
    yaml = LAYER_NORM_YAML.replace("    rewrites: [centred-variance]\n", "    cpucheck: {max_abs: 0.01}\n")
    project = layer_norm_project(tmp_path / "p", yaml)
    failed = project.doit("simverify:norm-SM8650")
    line = failed.failure_line("simverify:norm-SM8650")  # the cancelling variance on fp16
    # judged again against the float64 truth: the NPU is the side that is off, and the line says so with both numbers
    found = re.search(r"; against a float64 copy of norm\.onnx under onnxruntime CPU too: output 'y': NPU max_abs "
                      r"([0-9.e+-]+), float32 CPU reference ([0-9.e+-]+)", line)
    assert found and float(found[1]) > 100 * float(found[2]) and float(found[2]) > 1e-3, line
    record = project.one_json("build/ln/norm/*/*/SM8650/simverify/simverify.json")
    assert record["status"] == "failed" and record["reference_from"] == "the simplified graph in float32 on CPU"
    project.doit("diagnose:norm-SM8650", check=True)
    # new samples (mean 0: nothing cancels), the same binary: the target passes
    x = np.random.default_rng(3).standard_normal((4, *SHAPE)).astype(np.float32)
    np.savez(project.root / "models/ln/samples/a.npz", x=x)
    result = project.doit("simverify:norm-SM8650", "report")
    assert "context:norm-SM8650" not in result.executed, result.stdout
    report = json.loads(project.path("build/report/report.json").read_text())
    [target] = report["targets"]
    assert target["status"] == "passed"
    assert target["diagnosis"]["status"] == "stale"
    assert target["diagnosis"]["stale"] == ["diagnosed other inputs than the current samples"]
    html = project.path("build/report/index.html").read_text()
    section = html[html.index("Diagnosis: where the NPU diverges"):]
    assert "This diagnosis is stale: diagnosed other inputs than the current samples" in section


def test_simverify_judges_a_failure_again_against_float64_and_blames_a_weak_float32_reference(tmp_path):
    """The judging logic alone: the NPU outputs here are the exact LayerNorm in float32, written by the test (no
    simulator computes better than float32 CPU; the line of a real NPU failure is checked on the simulator above).
    The float32 CPU reference of the cancelling graph is 3e-3 off: against it the exact outputs fail max_abs 1e-3,
    against the float64 evaluation of the same graph they pass, and the record and console line say so."""
    from test_taskchecks import graph_of

    from qnn_tasks.graphs.cpu import run_onnx_cpu
    from qnn_tasks.judge import sample_store
    from qnn_tasks.run import records
    from qnn_tasks.stages import simverify

    model = arithmetic_layer_norm("sum_mul", shape=SHAPE)
    onnx.save(model, str(tmp_path / "norm.onnx"))
    x = (100.0 + np.random.default_rng(36).standard_normal((4, *SHAPE))).astype(np.float32)
    inputs = [{"x": s} for s in x]
    exact = x.astype(np.float64)
    exact = (exact - exact.mean(-1, keepdims=True)) / np.sqrt(exact.var(-1, keepdims=True) + 1e-5)
    sample_store.save(tmp_path / "inputs.npz", inputs)
    sample_store.save(tmp_path / "reference.npz", run_onnx_cpu(tmp_path / "norm.onnx", inputs))
    sample_store.save(tmp_path / "outputs.npz", [{"y": e.astype(np.float32)} for e in exact])
    records.write(tmp_path / "simulate.json", {"status": "passed"})
    verify = {"thresholds": {"max_abs": 1e-3}, "per_output": {}, "checks": []}
    args = (graph_of(tmp_path, "y", SHAPE), verify, tmp_path / "outputs.npz", tmp_path / "reference.npz",
            tmp_path / "simulate.json", "norm-SM8650", "fp16")
    with pytest.raises(StageError, match=r"max_abs = 0\.00[0-9]+ is above the threshold 0\.001"):
        simverify.run(*args)  # without the graph and its inputs nothing can be evaluated again
    record = simverify.run(*args, inputs_file=tmp_path / "inputs.npz", simplified=tmp_path / "norm.onnx")
    assert record["reference_from"] == ("a float64 copy of norm.onnx under onnxruntime CPU "
                                        "(the float32 CPU reference is the weaker side)")
    sides = record["float64"]["max_abs"]["y"]
    assert sides["npu_max_abs"] < 1e-5 and sides["cpu_float32_max_abs"] > 1e-3 and record["metrics"]["y"]["max_abs"] < 1e-5
    assert record["console"][0].startswith("the float32 CPU reference's own error is what differed (against a float64 "
                                           "copy of norm.onnx under onnxruntime CPU: output 'y': NPU max_abs ")
