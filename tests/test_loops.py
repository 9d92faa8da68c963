"""Loops: one graph run step after step with its outputs fed back, on the simulator and on CPU (real builds).

The model is built in code: an accumulator `accN = acc + x @ W` (with `level = mean(accN)`), ported
with YAML only. Fed back, `acc` grows step after step; the NPU keeps it in fp16, so its distance
from the CPU loop's float32 `acc` grows with the step count — the per-step record must show that.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import Project, copy_project
from modelpackage_check import agreement
from onnx import TensorProto, helper, numpy_helper

DIM, STEPS = 16, 60
YAML = "models/acc/model.yaml"
MODEL_YAML = """\
licence: test fixture
source: {{file: acc.onnx}}
graphs:
  acc:
    inputs:
      x: {{shape: [1, {d}], dtype: float32}}
      acc: {{shape: [1, {d}], dtype: float32}}
    outputs:
      accN: {{shape: [1, {d}]}}
      level: {{shape: [1, 1]}}
    samples: {{files: samples.npz}}
    socs: [SM8650]
loop:
  graph: acc
  feed: {{acc: accN}}
{extra}  verify:
    thresholds: {{min_cosine: 0.99, min_snr_db: 10}}
    checks:
      - agreement: {{output: level, threshold: 0.0, min: 1.0}}
"""


def accumulator() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    weights = (np.abs(rng.standard_normal((DIM, DIM))) * 0.7).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["step"]),
             helper.make_node("Add", ["acc", "step"], ["accN"]),
             helper.make_node("ReduceMean", ["accN"], ["level"], axes=[1], keepdims=1)]
    graph = helper.make_graph(nodes, "acc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, DIM]),
                                             helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1, DIM])],
                              [helper.make_tensor_value_info("accN", TensorProto.FLOAT, [1, DIM]),
                               helper.make_tensor_value_info("level", TensorProto.FLOAT, [1, 1])],
                              [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


STEP_CODE = '''\
import numpy as np


def step(ctx, inputs, outputs):
    """Autoregressive: the next x is made from this step's output; stop after 12 steps."""
    if ctx.step + 1 >= 12:
        return None
    return {"x": (np.tanh(outputs["accN"] * 0.05) + 0.5).astype(np.float32)}
'''


def acc_project(root: Path, extra: str = "", code: str | None = None) -> Project:
    project = copy_project(root)
    for model in ("silero-vad", "minilm"):  # only the accumulator: keeps the build short
        shutil.rmtree(project.path(f"models/{model}"))
    folder = project.path("models/acc")
    folder.mkdir(parents=True)
    onnx.save(accumulator(), str(folder / "acc.onnx"))
    rng = np.random.default_rng(8)
    np.savez(folder / "samples.npz", x=(1.0 + 0.3 * rng.standard_normal((STEPS, 1, DIM))).astype(np.float32),
             acc=np.zeros((STEPS, 1, DIM), np.float32))
    (folder / "model.yaml").write_text(MODEL_YAML.format(d=DIM, extra=extra))
    if code is not None:
        (folder / "export.py").write_text(code)
    return project


def loop_record(project: Project) -> dict:
    return project.one_json("build/acc/acc/*/fp16/SM8650/loop/loop.json")


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> Project:
    project = acc_project(tmp_path_factory.mktemp("loop-stream") / "project")
    project.result = project.doit()
    return project


def test_the_npu_carries_its_own_state_and_its_error_grows_per_step(stream):
    assert stream.result.returncode == 0, stream.result.stdout + stream.result.stderr
    assert "loop:acc-SM8650" in stream.result.executed
    rec = loop_record(stream)
    assert rec["status"] == "passed" and rec["steps"] == rec["steps_cpu"] == STEPS and rec["feed"] == {"acc": "accN"}
    errors = rec["per_step"]["accN"]["max_abs"]
    assert len(errors) == STEPS and len(rec["per_step"]["accN"]["cosine"]) == STEPS  # one figure per step
    assert rec["per_step"]["level"]["cosine"] is None and len(rec["per_step"]["level"]["max_abs"]) == STEPS
    first, last = np.mean(errors[:5]), np.mean(errors[-5:])
    assert last > 10 * first > 0, errors  # fp16 state: the error grows with the step count
    assert rec["growth"]["accN"]["ratio"] > 10
    # the loop really fed its outputs back: the CPU loop's state is the running sum of x @ W
    reference = np.load(stream.path(rec["reference_file"]))["accN"]
    assert reference[-1].mean() > 30 * reference[0].mean()
    agreement = next(c for c in rec["checks"] if c["kind"] == "agreement")
    assert agreement["passed"] and rec["first_differing_step"] is None
    assert rec["timing"]["steps_per_second"] > 0 and "not phone latency" in rec["timing"]["label"]
    assert stream.path(rec["plot"]).stat().st_size > 10_000
    report = json.loads(stream.path("build/report/report.json").read_text())
    assert [(e["name"], e["status"]) for e in report["loops"]] == [("acc-SM8650", "passed")]
    step = report["loops"][0]["latency_ms"]  # the phone time of one step of the loop, estimated
    assert step["per"] == "step" and step["basis"].startswith(("estimated from ", "not estimated"))
    assert report["summary"]["loops_failed"] == 0
    md = stream.path("build/report/report.md").read_text()
    assert "## Loops" in md and "| acc-SM8650 | 60 | passed |" in md
    html = stream.path("build/report/index.html").read_text()
    assert "per-step error of the loop acc-SM8650" in html
    assert stream.doit("loop").executed == set()


def test_the_package_of_a_loop_graph_carries_its_loop_verdict(stream, tmp_path):
    shipped = stream.doit("dist", env={"QNN_DIST": str(tmp_path)})
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    (binary,) = json.loads((tmp_path / "acc" / "manifest.json").read_text())["graphs"]["acc"]["binaries"]
    loop = binary["verification"]["loop"]
    assert loop["measured_on"] == "x86 HTP simulator" and loop["status"] == "passed"
    assert loop["steps"] == loop_record(stream)["steps"] and loop["metrics"]
    # ONNX Runtime's ModelPackage: the state tensors the app feeds back, on the component and the package
    (declared,) = agreement(tmp_path / "acc")["loops"]
    assert declared["components"] == ["acc"] and declared["feed"], declared


def test_a_task_check_that_breaks_names_the_first_differing_step(stream, tmp_path):
    """The same loop judged by a decision the fp16 state flips: the failure says at which step it first differed."""
    project = copy_project(tmp_path / "project", source=stream.root, with_build=True)
    reference = np.load(project.path(loop_record(stream)["reference_file"]))["level"].reshape(-1)
    npu = np.load(project.path(loop_record(stream)["outputs_file"]))["level"].reshape(-1)
    step = STEPS // 2
    assert npu[step] != reference[step], "the NPU loop matched the CPU loop exactly there"
    assert (np.diff(reference) > 0).all() and (np.diff(npu) > 0).all()  # the level rises at every step
    # a threshold between the two loops' values at that step: the decisions differ there, and only there
    threshold = float((npu[step] + reference[step]) / 2)
    project.edit(YAML, "threshold: 0.0", f"threshold: {threshold!r}")
    result = project.doit("loop:acc-SM8650")
    line = result.failure_line("loop:acc-SM8650")
    assert "check agreement on 'level'" in line and f"a task result first differed at step {step}" in line, line
    rec = loop_record(project)
    assert rec["status"] == "failed" and rec["first_differing_step"] == step


def test_a_step_function_drives_the_loop(tmp_path):
    project = acc_project(tmp_path / "project", extra="  step: step\n", code=STEP_CODE)
    result = project.doit("loop:acc-SM8650")
    assert result.returncode == 0, result.stdout + result.stderr
    rec = loop_record(project)
    assert rec["status"] == "passed" and rec["steps"] == rec["steps_cpu"] == 12 and rec["step_function"] == "step"
    outputs = np.load(project.path(rec["reference_file"]))
    assert outputs["accN"].shape == (12, 1, DIM)


@pytest.mark.parametrize("returned, fragments", [
    ('{"x": np.zeros((1, 8), np.float32)}', ["loop: step 1: input 'x' is [1, 8], model.yaml declares [1, 16]"]),
    ('{"y": outputs["accN"]}', ["step 1 was given ['y']", "has no input for"]),
    ('[outputs["accN"]]', ["step() returned list, not a dict"]),
    ('__import__("sys").exit()', ["step() called sys.exit(None) for graph 'acc'"]),  # not "exit None, native code"
])
def test_a_broken_step_function_fails_the_loop_with_one_line(tmp_path, returned, fragments):
    code = f"import numpy as np\n\n\ndef step(ctx, inputs, outputs):\n    return {returned}\n"
    project = acc_project(tmp_path / "project", extra="  step: step\n", code=code)
    line = project.doit("loop:acc-SM8650").failure_line("loop:acc-SM8650")
    for fragment in fragments:
        assert fragment in line, line


@pytest.mark.parametrize("returned, fragments", [
    ('{"x": outputs["accN"] * (1 + 1j)}', ["step 1: input 'x' holds complex values (imaginary parts up to",
                                           "model.yaml declares float32 (fix: return float32 values"]),
    ('{"x": np.full((1, 16), "0.5")}', ["step 1: input 'x' holds str96 values, not numbers"]),
    ('__import__("sys").exit()', ["step() called sys.exit(None) for graph 'acc'", "(at export.py:5)",
                                  "returning None"]),
    ('__import__("sys").exit(3)', ["step() called sys.exit(3)"]),
])
def test_a_step_function_that_changes_values_or_exits_is_one_line(tmp_path, returned, fragments):
    """The step function's values are refused when the declared dtype would change them (a complex part dropped,
    text parsed), and sys.exit() in it is the step function's doing (it ended the stage's worker: "exit None")."""
    import onnxruntime as ort

    from qnn_tasks.errors import StageError
    from qnn_tasks.judge import sample_store
    from qnn_tasks.modelspec.load import load_model, load_socs
    from qnn_tasks.stages import loop as loop_stage

    code = f"import numpy as np\n\n\ndef step(ctx, inputs, outputs):\n    return {returned}\n"
    project = acc_project(tmp_path / "project", extra="  step: step\n", code=code)
    model = load_model(project.path("models/acc"), load_socs(project.path("socs/socs.yaml")))
    graph, settings = model.graphs[0], model.loop.settings("fp16")
    session = ort.InferenceSession(str(project.path("models/acc/acc.onnx")), providers=["CPUExecutionProvider"])

    def cpu(inputs):
        return dict(zip(["accN", "level"], session.run(None, inputs)))

    np.savez(tmp_path / "stream.npz", **np.load(project.path("models/acc/samples.npz")))
    stream = sample_store.load(tmp_path / "stream.npz")
    with pytest.raises(StageError) as info:
        loop_stage.drive(graph, settings, stream, 5, cpu, "cpu", "models/acc/model.yaml: loop", lambda i: None)
    line = str(info.value)
    assert "\n" not in line and all(fragment in line for fragment in fragments), line


@pytest.mark.parametrize("edit, fragments", [
    (("feed: {acc: accN}", "feed: {acc: accM}"), ["loop.feed.acc", "'accM' is not an output of graph 'acc'", "accN"]),
    (("feed: {acc: accN}", "feed: {state: accN}"), ["loop.feed.state", "'state' is not an input"]),
    (("feed: {acc: accN}", "feed: {acc: level}"), ["loop.feed.acc", "output 'level' is [1, 1]", "is [1, 16]"]),
    (("graph: acc", "graph: decoder"), ["loop.graph", "'decoder' is not a graph of this model"]),
    (("feed: {acc: accN}", "feed: {}"), ["loop.feed", "feeds nothing back"]),
    (("feed: {acc: accN}", "feed: {acc: accN}\n  steps: 0"), ["loop.steps"]),
    (("feed: {acc: accN}", "feed: {acc: accN}\n  step: step"), ["loop.step", "export.py"]),
    (("feed: {acc: accN}", "feed: {acc: accN}\n  unroll: 2"), ["loop.unroll"]),
    (("output: level, threshold", "output: levels, threshold"), ["loop.verify.checks[0].agreement"]),
])
def test_wrong_loop_declarations_stop_doit_with_one_line(tmp_path, edit, fragments):
    project = acc_project(tmp_path / "project")
    project.edit(YAML, *edit)
    result = project.doit("list")
    assert result.returncode == 0 and "spec " in result.stdout, result.stdout + result.stderr  # this model is not buildable
    line = result.stderr.strip()
    assert "\n" not in line and str(project.path(YAML)) in line and "(fix: " in line, line
    for fragment in fragments:
        assert fragment in line, line


VAD_LOOP = """\
loop:
  graph: vad
  feed: {state: stateN}
  verify:
    per_output:
      output: {max_abs: 0.05}
    checks:
      - agreement: {output: output, threshold: 0.5, min: 0.99}
"""  # as in models/silero-vad/model.yaml


@pytest.mark.slow
def test_the_vads_state_carried_by_the_npu_over_the_whole_stream(tmp_path):
    """The Silero VAD over its 231 real audio frames with the NPU's own state, against the same loop on CPU."""
    from conftest import restrict_socs

    project = copy_project(tmp_path / "project")
    shutil.rmtree(project.path("models/minilm"))
    restrict_socs(project, ["SM8650"])
    project.edit("models/silero-vad/model.yaml", "frames_per_clip: 6", "frames_per_clip: 40")  # the whole stream
    yaml = project.path("models/silero-vad/model.yaml")
    yaml.write_text(yaml.read_text() + VAD_LOOP)
    result = project.doit("loop:vad-SM8650", "simverify:vad-SM8650")
    assert result.returncode == 0, result.stdout + result.stderr
    rec = project.one_json("build/silero-vad/vad/*/fp16/SM8650/loop/loop.json")
    per_frame = project.one_json("build/silero-vad/vad/*/fp16/SM8650/simverify/simverify.json")
    assert rec["status"] == "passed" and rec["steps"] == per_frame["samples"] == 231
    agreement = next(c for c in rec["checks"] if c["kind"] == "agreement")
    assert agreement["value"] >= 0.99
    assert len(rec["per_step"]["stateN"]["max_abs"]) == 231 and rec["per_step"]["output"]["cosine"] is None
    # the state the NPU carries drifts from the CPU's: what feeding the CPU's state to every frame never shows
    assert rec["growth"]["stateN"]["ratio"] > 3
    assert rec["metrics"]["stateN"]["max_abs"] > per_frame["metrics"]["stateN"]["max_abs"]
    assert rec["timing"]["steps_per_second"] > 0


CHAIN_YAML = """\
licence: test fixture
source: {{file: pre.onnx}}
graphs:
  pre:
    inputs: {{z: {{shape: [1, {d}], dtype: float32}}}}
    outputs: {{h: {{shape: [1, {d}]}}}}
    samples: {{files: pre.npz}}
    socs: [SM8650]
  post:
    source: {{file: post.onnx}}
    inputs: {{h: {{shape: [1, {d}], dtype: float32}}}}
    outputs: {{y: {{shape: [1, {d}]}}}}
    samples: {{files: post.npz}}
    socs: [SM8650]
  dec:
    source: {{file: dec.onnx}}
    inputs:
      x: {{shape: [1, {d}], dtype: float32}}
      acc: {{shape: [1, {d}], dtype: float32}}
      b: {{shape: [1, {d}], dtype: float32}}
    outputs:
      accN: {{shape: [1, {d}]}}
    samples: {{files: dec.npz}}
    socs: [SM8650]
pipeline:
  graphs: [pre, post]
loop:
  graph: dec
  feed: {{acc: accN}}
  start: {{b: post.y}}
  verify:
    thresholds: {{min_cosine: 0.99, min_snr_db: 10}}
"""


def _graph(name: str, nodes: list, inputs: list[str], outputs: list[str], weights: dict) -> onnx.ModelProto:
    return _seq_graph(name, nodes, {i: [1, DIM] for i in inputs}, {o: [1, DIM] for o in outputs}, weights)


def chain_loop_project(root: Path) -> Project:
    project = copy_project(root)
    for model in ("silero-vad", "minilm"):
        shutil.rmtree(project.path(f"models/{model}"))
    folder = project.path("models/chained")
    folder.mkdir(parents=True)
    half, one = np.full((1, DIM), 0.5, np.float32), np.ones((1, DIM), np.float32)
    weights = (np.random.default_rng(9).standard_normal((DIM, DIM)) * 0.5).astype(np.float32)
    onnx.save(_graph("pre", [helper.make_node("Mul", ["z", "half"], ["h"])], ["z"], ["h"], {"half": half}),
              str(folder / "pre.onnx"))
    onnx.save(_graph("post", [helper.make_node("Add", ["h", "one"], ["y"])], ["h"], ["y"], {"one": one}),
              str(folder / "post.onnx"))
    onnx.save(_graph("dec", [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["acc", "xw"], ["s"]),
                             helper.make_node("Add", ["s", "b"], ["accN"])], ["x", "acc", "b"], ["accN"], {"w": weights}),
              str(folder / "dec.onnx"))
    rng = np.random.default_rng(10)
    np.savez(folder / "pre.npz", z=rng.standard_normal((3, 1, DIM)).astype(np.float32))
    np.savez(folder / "post.npz", h=rng.standard_normal((2, 1, DIM)).astype(np.float32))
    np.savez(folder / "dec.npz", x=rng.standard_normal((10, 1, DIM)).astype(np.float32),
             acc=np.zeros((10, 1, DIM), np.float32), b=np.zeros((10, 1, DIM), np.float32))
    (folder / "model.yaml").write_text(CHAIN_YAML.format(d=DIM))
    project.weights = weights
    return project


def test_a_loop_started_by_a_pipeline_runs_once_per_pipeline_sample(tmp_path):
    """Encoder once -> decoder loop: each run of the loop holds an input at the pipeline's outputs (NPU or CPU chain)."""
    project = chain_loop_project(tmp_path / "project")
    result = project.doit("loop:dec-SM8650")
    project.doit("report")  # fails its gate: the chip targets themselves were not simulated (only the chain was)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {"pipeline:chained-SM8650", "loop:dec-SM8650"} <= result.executed
    rec = project.one_json("build/chained/dec/*/fp16/SM8650/loop/loop.json")
    assert rec["status"] == "passed" and rec["start"] == {"b": "y"}
    assert [(r["first"], r["steps"], r["steps_cpu"]) for r in rec["runs"]] == [(0, 10, 10), (10, 10, 10), (20, 10, 10)]
    assert len(rec["per_step"]["accN"]["max_abs"]) == 30
    chain_cpu = np.load(next(project.root.glob("build/chained/pipeline/*/SM8650/pipeline/reference.npz")))["y"]
    x0 = np.load(project.path("build/chained/dec/cpucheck/inputs.npz"))["x"][0]
    loop_cpu = np.load(project.path(rec["reference_file"]))["accN"]
    for run in range(3):  # step 0 of each run: acc 0 + x0 @ W + the CPU chain's y of that sample, held
        np.testing.assert_allclose(loop_cpu[run * 10], x0 @ project.weights + chain_cpu[run], rtol=1e-5, atol=1e-5)
    report = json.loads(project.path("build/report/report.json").read_text())
    assert [e["name"] for e in report["loops"]] == ["dec-SM8650"]


@pytest.mark.parametrize("edit, fragments", [
    (("pipeline:\n  graphs: [pre, post]\n", ""), ["loop.start", "has none"]),
    (("start: {b: post.y}", "start: {b: pre.h}"), ["loop.start.b", "last graph 'post'"]),
    (("start: {b: post.y}", "start: {acc: post.y}"), ["loop.start.acc", "not fed back"]),
])
def test_wrong_loop_starts_stop_doit_with_one_line(tmp_path, edit, fragments):
    project = chain_loop_project(tmp_path / "project")
    project.edit("models/chained/model.yaml", *edit)
    result = project.doit("list")
    assert result.returncode == 0 and "spec " in result.stdout, result.stdout + result.stderr  # this model is not buildable
    line = result.stderr.strip()
    assert "\n" not in line and "models/chained/model.yaml" in line and "(fix: " in line, line
    for fragment in fragments:
        assert fragment in line, line


SIZED_CHAIN_YAML = """\
licence: test fixture
source: {{file: embed.onnx}}
graphs:
  embed:
    dims: {{seq: {{sizes: {sizes}, longer: truncate}}}}
    inputs: {{x: {{shape: [1, seq, {d}], dtype: float32}}}}
    outputs: {{h: {{shape: [1, seq, {d}]}}}}
    samples: {{files: embed.npz}}
    socs: [SM8650]
  enc:
    source: {{file: enc.onnx}}
    dims: {{seq: {{sizes: {sizes}, longer: truncate}}}}
    inputs: {{h: {{shape: [1, seq, {d}], dtype: float32}}}}
    outputs: {{hidden: {{shape: [1, seq, {d}]}}}}
    samples: {{files: enc.npz}}
    socs: [SM8650]
  dec:
    source: {{file: dec.onnx}}
    dims: {{seq: {{sizes: {sizes}, longer: truncate}}}}
    inputs:
      tok: {{shape: [1, {d}], dtype: float32}}
      st: {{shape: [1, {d}], dtype: float32}}
      cross: {{shape: [1, seq, {d}], dtype: float32}}
    outputs:
      stN: {{shape: [1, {d}]}}
    samples: {{files: dec.npz}}
    socs: [SM8650]
pipeline:
  graphs: [embed, enc]
loop:
  graph: dec
  feed: {{st: stN}}
  start: {{cross: enc.hidden}}
  verify:
    thresholds: {{min_cosine: 0.99, min_snr_db: 10}}
"""
SEQ = 8  # the samples' padded length (the largest size)


def _seq_graph(name: str, nodes: list, inputs: dict[str, list], outputs: dict[str, list], weights: dict) -> onnx.ModelProto:
    """A graph whose shapes may name the symbolic dim 'seq' (the built-in export fixes it to each size)."""
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in inputs.items()],
                              [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in outputs.items()],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def sized_chain_loop_project(root: Path) -> Project:
    """Encoder once per sample at every length, then a decoder loop at the same length: embed (x * 0.5) -> enc
    (h @ We, its output `hidden` [1, seq, D] carries the length) chained as the pipeline, one per size; dec
    `stN = st + tok @ Wd + sum over seq of cross`, its state fed back and `cross` held at the pipeline's `hidden`.
    Zero padding stays zero through the chain, so every size's sum is the same for a sample that fits."""
    project = copy_project(root)
    for model in ("silero-vad", "minilm"):
        shutil.rmtree(project.path(f"models/{model}"))
    folder = project.path("models/seqloop")
    folder.mkdir(parents=True)
    rng = np.random.default_rng(12)
    enc_w, dec_w = [(rng.standard_normal((DIM, DIM)) * 0.3).astype(np.float32) for _ in range(2)]
    seq = [1, "seq", DIM]
    onnx.save(_seq_graph("embed", [helper.make_node("Mul", ["x", "half"], ["h"])], {"x": seq}, {"h": seq},
                         {"half": np.full((1, DIM), 0.5, np.float32)}), str(folder / "embed.onnx"))
    onnx.save(_seq_graph("enc", [helper.make_node("MatMul", ["h", "we"], ["hidden"])], {"h": seq}, {"hidden": seq},
                         {"we": enc_w}), str(folder / "enc.onnx"))
    onnx.save(_seq_graph("dec", [helper.make_node("MatMul", ["tok", "wd"], ["tw"]),
                                 helper.make_node("ReduceSum", ["cross", "axis"], ["pooled"], keepdims=0),
                                 helper.make_node("Add", ["st", "tw"], ["s"]), helper.make_node("Add", ["s", "pooled"], ["stN"])],
                         {"tok": [1, DIM], "st": [1, DIM], "cross": seq}, {"stN": [1, DIM]},
                         {"wd": dec_w, "axis": np.array([1], np.int64)}), str(folder / "dec.onnx"))
    xs = np.zeros((3, 1, SEQ, DIM), np.float32)  # the pipeline's samples: 3, 6 and 8 positions (truncated to 4)
    for i, length in enumerate((3, 6, 8)):
        xs[i, 0, :length] = rng.standard_normal((length, DIM))
    np.savez(folder / "embed.npz", x=xs)
    np.savez(folder / "enc.npz", h=rng.standard_normal((2, 1, SEQ, DIM)).astype(np.float32))
    cross = np.zeros((5, 1, SEQ, DIM), np.float32)
    cross[:, :, :3] = rng.standard_normal((5, 1, 3, DIM))
    np.savez(folder / "dec.npz", tok=rng.standard_normal((5, 1, DIM)).astype(np.float32),
             st=np.zeros((5, 1, DIM), np.float32), cross=cross)
    (folder / "model.yaml").write_text(SIZED_CHAIN_YAML.format(d=DIM, sizes="[4, 8]"))
    project.weights = dec_w
    return project


def test_a_loop_started_by_a_pipeline_with_sizes_runs_per_size_from_that_size(tmp_path):
    """Encoder per length -> decoder loop at that length: the loop at each size holds `cross` at the outputs of
    the pipeline at the same size (NPU chain for the NPU loop, CPU chain for the CPU loop), says which pipeline
    started it (record and report), and a new size builds only its own chain and loop."""
    project = sized_chain_loop_project(tmp_path / "project")
    result = project.doit("loop")
    assert result.returncode == 0, result.stdout + result.stderr
    assert {"pipeline:seqloop.seq4-SM8650", "pipeline:seqloop.seq8-SM8650", "loop:dec.seq4-SM8650",
            "loop:dec.seq8-SM8650"} <= result.executed
    assert "[recurrent]" not in result.stdout  # lint knows each size of dec runs in the declared loop
    for size in (4, 8):
        rec = project.one_json(f"build/seqloop/dec.seq{size}/*/fp16/SM8650/loop/loop.json")
        assert rec["status"] == "passed", rec.get("error")
        assert rec["started_by"] == f"seqloop.seq{size}-SM8650" and rec["start"] == {"cross": "hidden"}
        assert [(r["first"], r["steps"], r["steps_cpu"]) for r in rec["runs"]] == [(0, 5, 5), (5, 5, 5), (10, 5, 5)]
        chain = next(project.root.glob(f"build/seqloop/pipeline.seq{size}/*/SM8650/pipeline"))
        tok0 = np.load(project.path(f"build/seqloop/dec.seq{size}/cpucheck/inputs.npz"))["tok"][0]
        for side, file in (("cpu", "reference"), ("npu", "outputs")):
            hidden = np.load(chain / f"{file}.npz")["hidden"]  # this size's chain: [samples, 1, size, D]
            assert hidden.shape == (3, 1, size, DIM)
            first = np.load(project.path(rec[f"{file}_file"]))["stN"][::5]  # step 0 of each run: state 0
            tol = 1e-5 if side == "cpu" else 0.05
            np.testing.assert_allclose(first, tok0 @ project.weights + hidden.sum(axis=2), rtol=tol, atol=tol)
    assert project.doit("report").returncode != 0  # its gate: the chip targets were not simulated, only the chains
    report = project.path("build/report/report.md").read_text()
    assert "dec.seq4-SM8650 (started by pipeline:seqloop.seq4-SM8650)" in report
    assert "dec.seq8-SM8650 (started by pipeline:seqloop.seq8-SM8650)" in report
    html = project.path("build/report/index.html").read_text()
    assert '<div class="muted">started by pipeline:seqloop.seq4-SM8650</div>' in html

    project.edit("models/seqloop/model.yaml", "[4, 8]", "[4, 8, 12]")
    project.edit("models/seqloop/model.yaml", "[4, 8]", "[4, 8, 12]")
    project.edit("models/seqloop/model.yaml", "[4, 8]", "[4, 8, 12]")
    again = project.doit("loop")
    assert again.returncode == 0, again.stdout + again.stderr
    built = {t for t in again.executed if t.split(":")[0] in ("export", "context", "pipeline", "loop")}
    assert built == {"export:embed.seq12", "export:enc.seq12", "export:dec.seq12", "context:embed.seq12-SM8650",
                     "context:enc.seq12-SM8650", "context:dec.seq12-SM8650", "pipeline:seqloop.seq12-SM8650",
                     "loop:dec.seq12-SM8650"}, again.executed
    assert project.one_json("build/seqloop/dec.seq12/*/fp16/SM8650/loop/loop.json")["started_by"] == \
        "seqloop.seq12-SM8650"
