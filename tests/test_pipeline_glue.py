"""Pipeline glue declared in YAML: a reshape between tensors of one size and a fixed affine step between graphs.

Two packaged ONNX graphs built here, YAML only, fed raw float32 sample files: `embed` maps x [1, 64] to
y [1, 64]; `head` takes z [1, 8, 8]. The deployment feeds head.z = reshape(embed.y / 10 + 2): declared as
`feed: {head.z: {from: embed.y, reshape: true, scale: 0.1, offset: 2.0}}`, applied alike to the CPU and the
NPU chain. Real compiles and simulator runs on SM8650; spec errors are one line.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import EXAMPLES, Project
from onnx import TensorProto, helper, numpy_helper

YAML = "models/glued/model.yaml"
MODEL_YAML = """\
licence: test fixture
source: {file: embed.onnx}
graphs:
  embed:
    inputs: {x: {shape: [1, 64], dtype: float32}}
    outputs: {y: {shape: [1, 64]}}
    samples: {raw: {files: "samples/x.bin"}}
    socs: [SM8650]
  head:
    source: {file: head.onnx}
    inputs: {z: {shape: [1, 8, 8], dtype: float32}}
    outputs: {logits: {shape: [1, 5]}}
    samples: {raw: {files: "samples/z.bin"}}
    socs: [SM8650]
pipeline:
  graphs: [embed, head]
  feed: {head.z: {from: embed.y, reshape: true, scale: 0.1, offset: 2.0}}
  verify:
    checks:
      - top1: {output: logits, min: 1.0}
"""


def _model(nodes, name, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def embed_model() -> onnx.ModelProto:
    weights = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], "embed",
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [numpy_helper.from_array(weights, "w")])


def head_model() -> onnx.ModelProto:
    """Sensitive to the glue: a log of the fed values (positive only after + 2 on values of about +-1)."""
    weights = np.random.default_rng(1).standard_normal((8, 5)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["z"], ["positive"]),
             helper.make_node("Add", ["positive", "floor"], ["floored"]),
             helper.make_node("Log", ["floored"], ["logz"]),
             helper.make_node("ReduceMean", ["logz"], ["pooled"], axes=[-1], keepdims=0),
             helper.make_node("MatMul", ["pooled", "w"], ["logits"])]
    return _model(nodes, "head", [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 8])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])],
                  [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array(0.1, np.float32), "floor")])


def packaged_project(root: Path, model: str, models: dict[str, onnx.ModelProto], samples: dict[str, np.ndarray],
                     model_yaml: str) -> Project:
    """A project of one packaged model: its ONNX files, raw float32 sample files and model.yaml."""
    root.mkdir(parents=True)
    for name in ("dodo.py", "socs", "toolchain"):
        (shutil.copytree if (EXAMPLES / name).is_dir() else shutil.copy2)(EXAMPLES / name, root / name)
    folder = root / "models" / model
    (folder / "samples").mkdir(parents=True)
    for name, proto in models.items():
        onnx.save(proto, str(folder / name))
    for name, values in samples.items():
        (folder / "samples" / name).write_bytes(values.astype("<f4").tobytes())
    (folder / "model.yaml").write_text(model_yaml)
    return Project(root)


def glued_project(root: Path) -> Project:
    rng = np.random.default_rng(2)
    return packaged_project(root, "glued", {"embed.onnx": embed_model(), "head.onnx": head_model()},
                            {"x.bin": rng.standard_normal((6, 64)) * 0.15, "z.bin": rng.uniform(1, 3, (6, 8, 8))},
                            MODEL_YAML)


def test_glue_is_applied_to_both_chains_and_verified(tmp_path):
    project = glued_project(tmp_path / "project")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    [record_file] = project.root.glob("build/glued/pipeline/*/SM8650/pipeline/pipeline.json")
    record = json.loads(record_file.read_text())
    assert record["status"] == "passed" and record["samples"] == 6 and record["checks"][0]["value"] == 1.0
    # the CPU chain's end is head(reshape(embed(x) / 10 + 2)), computed here from the ONNX files
    x = np.frombuffer(project.path("models/glued/samples/x.bin").read_bytes(), "<f4").reshape(6, 1, 64)
    embed = ort.InferenceSession(embed_model().SerializeToString(), providers=["CPUExecutionProvider"])
    head = ort.InferenceSession(head_model().SerializeToString(), providers=["CPUExecutionProvider"])
    expected = [head.run(None, {"z": (embed.run(None, {"x": s})[0].astype(np.float64) / 10 + 2)
                                .reshape(1, 8, 8).astype(np.float32)})[0] for s in x]
    with np.load(record["reference_file"] if Path(record["reference_file"]).is_absolute()
                 else project.path(record["reference_file"])) as reference:
        np.testing.assert_allclose(reference["logits"], np.stack(expected), rtol=1e-5, atol=1e-6)
    # without the + 2 most fed values would be negative and the Relu/Log would see another input
    assert not np.allclose(np.stack(expected), np.stack([head.run(None, {"z": embed.run(None, {"x": s})[0].reshape(
        1, 8, 8) / 10})[0] for s in x]), atol=1e-3)
    # a glue that multiplies by 0 feeds head one constant: both chains agree, and nothing is verified
    from test_trust_gate import gate_passes

    project.edit(YAML, "scale: 0.1", "scale: 0.0")
    result = project.doit("pipeline:glued-SM8650", "report")
    line = result.failure_line("pipeline:glued-SM8650")
    assert ("not verified: graph 'head' gets inputs where every input is one constant over all 6 sample(s) "
            "('z' is 2), on both chains (fix: check pipeline.feed for 'head'") in line, line
    record = project.one_json("build/glued/pipeline/*/SM8650/pipeline/pipeline.json")
    assert record["status"] == "failed" and record["not_verified"].startswith("not verified: graph 'head'")
    assert record["checks"][0]["value"] == 1.0  # what the task check alone would have passed
    report = json.loads(project.path("build/report/report.json").read_text())
    assert report["summary"]["pipelines_failed"] == 1 and not gate_passes(project)
    # a scale float32 cannot hold: the glue is named, not the first graph as the weakest link
    project.edit(YAML, "scale: 0.0", "scale: 1.0e+39")
    line = project.doit("pipeline:glued-SM8650").failure_line("pipeline:glued-SM8650")
    assert ("model.yaml: pipeline.feed.head.z: the glue (scale 1e+39, offset 2, as float32) turns finite outputs "
            "of 'embed' into Inf/NaN (fix: a scale and offset") in line and "weakest link" not in line, line


@pytest.mark.parametrize("edit, fragments", [
    ("reshape: true, scale", ["pipeline: input 'z' of 'head' is [1, 8, 8], the output feeding it is [1, 64]",
                              "feed: {head.z: {from: <graph>.<output>, reshape: true}}"]),
    ("{from: embed.y, reshape: true,", ["pipeline.feed.head.z.from: required key is missing"], ),
    ("scale: 0.1", ["pipeline.feed.head.z.scale: expected a number, got 'tenth'"]),
    ("offset: 2.0", ["pipeline.feed.head.z.shift: unknown key", "use one of: from, offset, reshape, scale"]),
    ("z: {shape: [1, 8, 8]", [("pipeline.feed.head.z.reshape: input 'z' of 'head' [1, 8, 9] has 72 values, "
                              "the output feeding it [1, 64] 64"), "reshape only between tensors of one size"]),
])
def test_glue_spec_errors(tmp_path, edit, fragments):
    project = glued_project(tmp_path / "project")
    replacement = {"reshape: true, scale": "scale", "{from: embed.y, reshape: true,": "{reshape: true,",
                   "scale: 0.1": "scale: tenth", "offset: 2.0": "shift: 2.0",
                   "z: {shape: [1, 8, 8]": "z: {shape: [1, 8, 9]"}[edit]
    project.edit(YAML, edit, replacement)
    result = project.doit("list")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr  # that model is not buildable
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: {project.path(YAML)}: ") and "(fix: " in line, line
    for fragment in fragments:
        assert fragment in line, line


BOS = "    inputs:\n      z: {shape: [1, 8, 8], dtype: float32}\n      bos: {shape: [1, 2], dtype: int32}\n"


def constant_spec(tmp_path: Path, feed: str):
    """The glued model with a second input of head, `bos`, and the pipeline's feed as given."""
    from qnn_tasks.modelspec.load import load_model, load_socs

    project = glued_project(tmp_path / "project")
    project.edit(YAML, "    inputs: {z: {shape: [1, 8, 8], dtype: float32}}\n", BOS)
    project.edit(YAML, 'samples: {raw: {files: "samples/z.bin"}}', 'samples: {raw: {files: "samples/z.bin", input: z}, '
                 'fill: {bos: 1}}')
    project.edit(YAML, "  feed: {head.z: {from: embed.y, reshape: true, scale: 0.1, offset: 2.0}}", f"  feed: {feed}")
    return load_model(project.path("models/glued"), load_socs(project.path("socs/socs.yaml")))


GLUED = "head.z: {from: embed.y, reshape: true}"


def test_a_pipeline_feeds_a_constant_to_an_input_of_a_later_graph(tmp_path):
    """`feed: {head.bos: {value: 7}}`: every run of head gets bos = 7 in its dtype, on both chains alike (a start
    token); a list of the input's shape is the constant as written. A later graph's input had to be an output."""
    from qnn_tasks.judge.glue import feed_runs

    spec = constant_spec(tmp_path, "{" + GLUED + ", head.bos: {value: 7}}")
    assert spec.pipeline.values == {"head.bos": 7} and "head.bos" not in spec.pipeline.feed
    embed, head = spec.graphs
    for side in (0.5, -0.5):  # the CPU chain's outputs, then the NPU chain's: the constant is the same
        produced = {"embed": [{"y": np.full((1, 64), side * run, np.float32)} for run in range(3)]}
        runs, _ = feed_runs(head, spec.pipeline.feed, spec.pipeline.glue, [embed], produced, values=spec.pipeline.values)
        assert len(runs) == 3 and list(runs[0]) == ["z", "bos"]
        assert all(run["bos"].dtype == np.int32 and run["bos"].tolist() == [[7, 7]] for run in runs)
        assert runs[2]["z"][0, 0, 0] == np.float32(side * 2)
    listed = constant_spec(tmp_path / "list", "{" + GLUED + ", head.bos: {value: [[50257, 7]]}}").pipeline
    runs, _ = feed_runs(head, listed.feed, listed.glue, [embed], produced, values=listed.values)
    assert runs[0]["bos"].tolist() == [[50257, 7]]
    # the package tells the app what to feed: the ModelPackage's pipelines[].feeds (ship/inventory.py)
    from qnn_tasks.modelspec.load import load_project
    from qnn_tasks.plan.planner import Planner
    from qnn_tasks.ship.inventory import of_model

    [chain] = of_model(Planner(load_project(tmp_path / "project")), "glued")["chains"]
    assert {"to": "head.bos", "value": 7} in chain["feeds"] and chain["feeds"][0]["from"] == "embed.y"


@pytest.mark.parametrize("feed, expected", [
    ("head.bos: {value: bos}", "pipeline.feed.head.bos.value: expected a number or a list of numbers, got 'bos' "
                               "(fix: e.g. value: 1 (every value of the input), or a list of the input's shape)"),
    ("head.bos: {value: true}", "pipeline.feed.head.bos.value: expected a number or a list of numbers, got true"),
    ("head.bos: {value: [1, 2, 3]}", "pipeline.feed.head.bos.value: a list of shape [3], input 'bos' of graph 'head' "
                                     "is [1, 2] (fix: give one number (every value of the input), or a list of shape "
                                     "[1, 2])"),
    ("head.bos: {value: [[1, 2], [3]]}", "pipeline.feed.head.bos.value: a ragged list"),
    ("head.bos: {value: 0.5}", "pipeline.feed.head.bos.value: 0.5 is not a whole number: a int32 input holds only "
                               "whole numbers (fix: give a value that input 'bos' (int32) holds)"),
    ("head.bos: {value: 1, from: embed.y}", "pipeline.feed.head.bos.from: a constant is fed as written: it has no "
                                            "output to take"),
    ("head.bos: {value: 1}, embed.x: {value: 1}", "pipeline.feed.embed.x: graph 'embed' is the pipeline's first graph: "
                                                  "its inputs are its own samples (fix: give graphs.embed the constant "
                                                  "in its samples, e.g. samples: {fill: {x: 1}})"),
    ("head.bos: {value: 1}, head.nope: {value: 1}", "pipeline.feed.head.nope: 'head.nope' is not an input of a graph "
                                                    "of the pipeline"),
    ("head.bos: {value: 1}, head.z: {value: 1}", "pipeline.feed.head.z: every input of graph 'head' is a constant: its "
                                                 "runs would follow nothing of the chain"),
])
def test_a_constant_feed_is_checked_at_load_in_one_line(tmp_path, feed, expected):
    from qnn_tasks.errors import SpecError

    feed = feed if "head.z" in feed else GLUED + ", " + feed
    with pytest.raises(SpecError) as caught:
        constant_spec(tmp_path, "{" + feed + "}")
    line = str(caught.value)
    assert expected in line and "\n" not in line and "(fix: " in line, line


# Stacking: a streaming embedding graph run over successive windows, a classifier over the last N embeddings.
STACK_YAML = "models/stacked/model.yaml"
STACK_MODEL_YAML = """\
licence: test fixture
source: {file: embed.onnx}
graphs:
  embed:
    inputs: {x: {shape: [1, 16], dtype: float32}}
    outputs: {y: {shape: [1, 8]}}
    samples: {raw: {files: "samples/windows.bin"}}
    socs: [SM8650]
  classify:
    source: {file: classify.onnx}
    inputs: {x: {shape: [1, 4, 8], dtype: float32}}
    outputs: {logits: {shape: [1, 5]}}
    samples: {raw: {files: "samples/stack.bin"}}
    socs: [SM8650]
pipeline:
  graphs: [embed, classify]
  feed: {classify.x: {from: embed.y, stack: {runs: 4, axis: 1}}}
  verify:
    samples: 1
    checks:
      - top1: {output: logits, min: 1.0}
"""


def window_embed_model() -> onnx.ModelProto:
    """A window of 16 values -> an embedding of 8."""
    weights = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32) * 0.5
    return _model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])], "embed",
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [numpy_helper.from_array(weights, "w")])


def stack_classifier_model() -> onnx.ModelProto:
    """[1, 4, 8] -> 5 logits, with weights of its own for every position (the order of the runs matters)."""
    weights = np.random.default_rng(4).standard_normal((32, 5)).astype(np.float32)
    return _model([helper.make_node("Flatten", ["x"], ["flat"], axis=1), helper.make_node("MatMul", ["flat", "w"],
                                                                                         ["logits"])], "classify",
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 5])],
                  [numpy_helper.from_array(weights, "w")])


def stacked_project(root: Path) -> Project:
    rng = np.random.default_rng(5)
    return packaged_project(root, "stacked", {"embed.onnx": window_embed_model(), "classify.onnx": stack_classifier_model()},
                            {"windows.bin": rng.standard_normal((5, 16)), "stack.bin": rng.uniform(-1, 1, (1, 4, 8))},
                            STACK_MODEL_YAML)


def test_stack_windows_runs_and_axes():
    from qnn_tasks.judge.glue import stack

    values = [np.full((1, 3), i, np.float32) for i in range(5)]
    windows = stack(values, runs=3, axis=1, hop=2, rank=3)  # a new axis: [1, 3] x 3 -> [1, 3, 3], starts 0 and 2
    assert [w.shape for w in windows] == [(1, 3, 3), (1, 3, 3)]
    assert windows[0][0, :, 0].tolist() == [0, 1, 2] and windows[1][0, :, 0].tolist() == [2, 3, 4]
    sliding = stack(values, runs=4, axis=0, hop=1, rank=3)  # the last 4 runs after each new one
    assert len(sliding) == 2 and sliding[1].shape == (4, 1, 3) and sliding[1][:, 0, 0].tolist() == [1, 2, 3, 4]
    joined = stack(values, runs=2, axis=1, hop=2, rank=2)  # equal ranks: joined on the axis, [1, 3] x 2 -> [1, 6]
    assert [w.tolist() for w in joined] == [[[0, 0, 0, 1, 1, 1]], [[2, 2, 2, 3, 3, 3]]]
    assert stack(values, runs=6, axis=1, hop=1, rank=3) == []  # fewer runs than a window
    with pytest.raises(ValueError, match="neither stack nor join"):
        stack(values, runs=2, axis=0, hop=1, rank=4)


def _graph(name: str, inputs: dict, outputs: dict):
    from qnn_tasks.modelspec.project import GraphSpec, TensorSpec

    return GraphSpec(name, "chain", Path("models/chain"), tuple(TensorSpec(n, s, "float32") for n, s in inputs.items()),
                     tuple(TensorSpec(n, s, "float32") for n, s in outputs.items()), ("fp16",), None, "", {}, {}, False)


def test_stacks_of_stacks_follow_the_runs_of_a_three_graph_chain():
    """front end (once per window) -> embed over 3 front-end runs every 2 -> classify over the last 2 embeddings."""
    from qnn_tasks.judge.glue import feed_runs
    from qnn_tasks.modelspec.specpipeline import first_samples

    front = _graph("front", {"audio": (1, 4)}, {"mel": (1, 2)})
    embed = _graph("embed", {"frames": (1, 3, 2)}, {"y": (1, 2)})
    classify = _graph("classify", {"x": (2, 2)}, {"logits": (1, 1)})  # joined on axis 0: [1, 2] x 2 -> [2, 2]
    chain, feed = [front, embed, classify], {"embed.frames": ["front", "mel"], "classify.x": ["embed", "y"]}
    glue = {"embed.frames": {"reshape": False, "scale": 1.0, "offset": 0.0, "stack": {"runs": 3, "axis": 1, "hop": 2}},
            "classify.x": {"reshape": False, "scale": 1.0, "offset": 0.0, "stack": {"runs": 2, "axis": 0, "hop": 1}}}
    # 2 classifier runs need 3 embeddings, which need (3 - 1) * 2 + 3 = 7 front-end runs
    assert first_samples(chain, glue, feed, 2) == 7 and first_samples(chain, glue, feed, None) is None
    produced = {"front": [{"mel": np.full((1, 2), run, np.float32)} for run in range(7)]}
    inputs, stacked = feed_runs(embed, feed, glue, chain[:1], produced)
    assert [run["frames"][0, :, 0].tolist() for run in inputs] == [[0, 1, 2], [2, 3, 4], [4, 5, 6]]
    assert stacked == [{"input": "frames", "from": "front.mel", "runs": 3, "axis": 1, "hop": 2, "source_runs": 7,
                        "windows": 3}]
    produced["embed"] = [{"y": run["frames"].sum(axis=1)} for run in inputs]  # what an embedding of the 3 might be
    inputs, stacked = feed_runs(classify, feed, glue, chain[:2], produced)
    assert [run["x"][:, 0].tolist() for run in inputs] == [[3, 9], [9, 15]] and inputs[0]["x"].shape == (2, 2)
    assert stacked[0]["windows"] == 2 and stacked[0]["source_runs"] == 3


def test_a_stack_is_bounded_by_the_bytes_its_windows_take(monkeypatch):
    """Windows of `runs` runs every `hop` copy each run runs / hop times (quadratic in runs with hop 1): the
    stack is refused before it is made when its windows pass the byte bound."""
    from qnn_tasks.errors import StageError
    from qnn_tasks.judge import bounds
    from qnn_tasks.judge.glue import feed_runs

    front = _graph("front", {"audio": (1, 4)}, {"mel": (1, 256)})
    embed = _graph("embed", {"frames": (1, 64, 256)}, {"y": (1, 2)})
    feed = {"embed.frames": ["front", "mel"]}
    glue = {"embed.frames": {"reshape": False, "scale": 1.0, "offset": 0.0, "stack": {"runs": 64, "axis": 1, "hop": 1}}}
    produced = {"front": [{"mel": np.full((1, 256), run, np.float32)} for run in range(200)]}
    monkeypatch.setattr(bounds, "MAX_SAMPLE_BYTES", 8 << 20)  # 137 windows x 64 runs x 1 KiB = 8.6 MiB
    with pytest.raises(StageError) as info:
        feed_runs(embed, feed, glue, [front], produced)
    assert ("pipeline.feed.embed.frames.stack: 137 windows of 64 runs of 'front' take 8.6 MiB, more than the bound of "
            "8.0 MiB (fix: a larger hop, fewer runs, or verify.samples") in str(info.value), str(info.value)
    glue["embed.frames"]["stack"]["hop"] = 4  # 35 windows: 2.2 MiB
    inputs, _ = feed_runs(embed, feed, glue, [front], produced)
    assert len(inputs) == 35 and inputs[1]["frames"][0, 0, 0] == 4


def test_kept_first_link_outputs_are_checked_and_timed(tmp_path):
    """The first link's outputs taken from the first graph's simulate stage: its first N runs, each timed at the
    simulate record's mean; a file holding fewer runs or other outputs is one line naming it and the fix."""
    from qnn_tasks.errors import StageError
    from qnn_tasks.judge import sample_store
    from qnn_tasks.stages.pipeline import kept_outputs

    front = _graph("front", {"audio": (1, 4)}, {"mel": (1, 2)})
    kept = tmp_path / "simulate" / "outputs.npz"
    kept.parent.mkdir()
    sample_store.save(kept, [{"mel": np.full((1, 2), run, np.float32)} for run in range(3)])
    runs, seconds = kept_outputs(kept, 2, front, "chain-SM8650")
    assert [run["mel"][0, 0] for run in runs] == [0, 1] and seconds == [0.0, 0.0]  # no record: no time claimed
    (kept.parent / "simulate.json").write_text(json.dumps({"timing": {"total_s": 6.0, "runs": 3}}))
    assert kept_outputs(kept, 2, front, "chain-SM8650", kept.parent / "simulate.json")[1] == [2.0, 2.0]
    with pytest.raises(StageError, match=r"holds 3 runs of \['mel'\], not 4 runs .*\(rerun its simulate task\)"):
        kept_outputs(kept, 4, front, "chain-SM8650")
    other = _graph("front", {"audio": (1, 4)}, {"spectrum": (1, 2)})
    with pytest.raises(StageError, match="not 2 runs of the outputs of graph 'front'"):
        kept_outputs(kept, 2, other, "chain-SM8650")


def test_stack_of_runs_feeds_the_next_graph_on_both_chains(tmp_path):
    project = stacked_project(tmp_path / "project")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    record = project.one_json("build/stacked/pipeline/*/SM8650/pipeline/pipeline.json")
    assert record["status"] == "passed" and record["samples"] == 1 and record["first_samples"] == 4, record
    assert record["checks"][0]["value"] == 1.0
    stacked = {"input": "x", "from": "embed.y", "runs": 4, "axis": 1, "hop": 1, "source_runs": 4, "windows": 1}
    assert record["stacked"] == {"classify.x": stacked}
    assert [(link["graph"], link["runs"]) for link in record["links"]] == [("embed", 4), ("classify", 1)]
    assert record["links"][1]["stacked"] == [stacked]
    # the CPU chain's end is classify(stack(embed(window 0..3), axis 1)), computed here from the ONNX files
    windows = np.frombuffer(project.path("models/stacked/samples/windows.bin").read_bytes(), "<f4").reshape(5, 1, 16)
    embed = ort.InferenceSession(window_embed_model().SerializeToString(), providers=["CPUExecutionProvider"])
    classify = ort.InferenceSession(stack_classifier_model().SerializeToString(), providers=["CPUExecutionProvider"])
    embeddings = [embed.run(None, {"x": w})[0] for w in windows[:4]]
    expected = classify.run(None, {"x": np.stack(embeddings, axis=1)})[0]
    with np.load(project.path(record["reference_file"])) as reference:
        np.testing.assert_allclose(reference["logits"], expected[None], rtol=1e-5, atol=1e-6)
    with np.load(project.path(record["outputs_file"])) as outputs:  # the NPU chain stacked its own embeddings
        np.testing.assert_allclose(outputs["logits"], expected[None], rtol=0.05, atol=0.05)
    # the order of the runs matters to this classifier: a stack in another order would be another input
    assert not np.allclose(expected, classify.run(None, {"x": np.stack(embeddings[::-1], axis=1)})[0], atol=1e-3)
    assert "embed (4 runs)" in project.path("build/report/report.md").read_text()
    # a stream too short for one stack: the pipeline fails with one line naming the stack, and says so in its record
    project.path("models/stacked/samples/windows.bin").write_bytes(windows[:3].astype("<f4").tobytes())
    line = project.doit("pipeline:stacked-SM8650").failure_line("pipeline:stacked-SM8650")
    assert ("model.yaml: pipeline.feed.classify.x.stack: stacks 4 runs of 'embed', which ran only 3 times "
            "(fix: give the pipeline's first graph more samples, or stack fewer runs)") in line, line
    assert project.one_json("build/stacked/pipeline/*/SM8650/pipeline/pipeline.json")["status"] == "failed"


@pytest.mark.parametrize("old, new, fragments", [
    ("runs: 4, axis: 1", "runs: 5, axis: 1", ["pipeline.feed.classify.x.stack: output 'y' of 'embed' [1, 8] stacked "
                                              "over 5 runs on axis 1 is [1, 5, 8], input 'x' of 'classify' is [1, 4, 8]",
                                              "(fix: set runs: 4)"]),
    ("runs: 4, axis: 1", "runs: 0, axis: 1", ["pipeline.feed.classify.x.stack.runs: 0 is out of range"]),
    ("runs: 4, axis: 1", "runs: 100000, axis: 1", ["pipeline.feed.classify.x.stack.runs: 100000 is out of range",
                                                   "4096"]),
    ("runs: 4, axis: 1", "runs: 4, axis: 3", ["pipeline.feed.classify.x.stack.axis: axis 3 is out of range for input "
                                              "'x' of 'classify' [1, 4, 8]", "(fix: use an axis from -3 to 2)"]),
    ("runs: 4, axis: 1", "runs: 4, axis: 1, hop: 0", ["pipeline.feed.classify.x.stack.hop: 0 is out of range"]),
    ("runs: 4, axis: 1", "axis: 1", ["pipeline.feed.classify.x.stack.runs: required key is missing"]),
    ("runs: 4, axis: 1", "runs: 4, axis: 1, window: 2", ["pipeline.feed.classify.x.stack.window: unknown key",
                                                         "use one of: axis, hop, runs"]),
    ("stack: {runs: 4, axis: 1}", "stack: 4", ["pipeline.feed.classify.x.stack: expected a mapping, got 4"]),
    ("from: embed.y", "from: classify.logits", ["pipeline.feed.classify.x.stack: stacks runs of 'classify', which is "
                                                "not a graph earlier in the pipeline than 'classify'",
                                                "listed before it in pipeline.graphs: embed"]),
    ("inputs: {x: {shape: [1, 4, 8], dtype: float32}}\n    outputs: {logits: {shape: [1, 5]}}\n"
     '    samples: {raw: {files: "samples/stack.bin"}}',
     "inputs: {x: {shape: [1, 4, 8], dtype: float32}, y: {shape: [1, 8], dtype: float32}}\n"
     '    outputs: {logits: {shape: [1, 5]}}\n    samples: {raw: {files: "samples/stack.bin", input: x}, fill: {y: 0.0}}',
     ["pipeline.feed.classify.y: input 'y' of 'classify' comes once per sample, input 'x' from 4 runs every 1: "
      "they do not pair up run by run"]),
])
def test_stack_spec_errors(tmp_path, old, new, fragments):
    project = stacked_project(tmp_path / "project")
    project.edit(STACK_YAML, old, new)
    result = project.doit("list")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr  # that model is not buildable
    [line] = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: {project.path(STACK_YAML)}: ") and "(fix: " in line, line
    for fragment in fragments:
        assert fragment in line, line


def test_a_stack_across_ranks_is_stacked_then_reshaped(tmp_path):
    """A streaming embedding gives [1, 1, 1, 8] per window, the classifier takes [1, 4, 8]: neither a new axis nor
    a join fits the ranks, both fixed by the ONNX files; with reshape: true the 4 runs stack on a new axis, then
    reshape to the input (as the docs say), on the spec and in the glue. Without reshape the fix says to add it."""
    from qnn_tasks.judge.glue import feed_runs
    from qnn_tasks.modelspec.load import load_model, load_socs

    project = stacked_project(tmp_path / "project")
    project.edit(STACK_YAML, "outputs: {y: {shape: [1, 8]}}", "outputs: {y: {shape: [1, 1, 1, 8]}}")
    line = project.doit("list").stderr.strip()
    assert ("pipeline.feed.classify.x.stack: output 'y' of 'embed' [1, 1, 1, 8] has rank 4, input 'x' of 'classify' "
            "[1, 4, 8] rank 3 (fix: add reshape: true to stack on a new axis and reshape to the input (one size), "
            "e.g. [1, 1, 1, 8] x 4 -> [1, 4, 8])") in line, line
    project.edit(STACK_YAML, "stack: {runs: 4, axis: 1}", "stack: {runs: 4, axis: 1}, reshape: true")
    result = project.doit("list")
    assert result.returncode == 0 and "error" not in result.stderr, result.stderr
    spec = load_model(project.path("models/stacked"), load_socs(project.path("socs/socs.yaml")))
    assert spec.pipeline.glue["classify.x"]["stack"] == {"runs": 4, "axis": 1, "hop": 1}
    embed, classify = spec.graphs
    produced = {"embed": [{"y": np.arange(8, dtype=np.float32).reshape(1, 1, 1, 8) + 10 * run} for run in range(5)]}
    inputs, stacked = feed_runs(classify, spec.pipeline.feed, spec.pipeline.glue, [embed], produced)
    assert [run["x"].shape for run in inputs] == [(1, 4, 8)] * 2 and stacked[0]["windows"] == 2
    assert inputs[1]["x"][0, :, 0].tolist() == [10, 20, 30, 40] and inputs[1]["x"][0, 2].tolist() == list(range(30, 38))
    # a size that does not fit is still refused, as a reshape of the stack
    project.edit(STACK_YAML, "stack: {runs: 4, axis: 1}", "stack: {runs: 3, axis: 1}")
    line = project.doit("list").stderr.strip()
    assert "pipeline.feed.classify.x.reshape: input 'x' of 'classify' [1, 4, 8] has 32 values" in line, line


def test_a_graph_inside_a_pipeline_takes_its_samples_from_the_graph_before_it(tmp_path):
    """`samples: {from: embed.y}`: the classifier needs no media of its own; its cpucheck inputs are embed's CPU
    outputs on embed's samples, stacked as the pipeline feeds them (4 runs on axis 1, every run)."""
    project = stacked_project(tmp_path / "project")
    project.path("models/stacked/samples/stack.bin").unlink()
    project.edit(STACK_YAML, 'samples: {raw: {files: "samples/stack.bin"}}', "samples: {from: embed.y}")
    result = project.doit("cpucheck:classify")
    assert result.returncode == 0, result.stdout + result.stderr
    windows = np.frombuffer(project.path("models/stacked/samples/windows.bin").read_bytes(), "<f4").reshape(5, 1, 16)
    embed = ort.InferenceSession(window_embed_model().SerializeToString(), providers=["CPUExecutionProvider"])
    embeddings = [embed.run(None, {"x": w})[0] for w in windows]
    with np.load(project.path("build/stacked/classify/cpucheck/inputs.npz")) as inputs:
        assert inputs["x"].shape == (2, 1, 4, 8)  # 5 embeddings, windows of 4 every 1: 2 samples
        np.testing.assert_allclose(inputs["x"][1], np.stack(embeddings[1:5], axis=1), rtol=1e-6)
    # spec errors name the key: a graph not before it, an output it does not have, an input that is not there
    for bad, fragment in (("{from: classify.logits}", "samples.from: 'classify.logits' is not an output of a graph "
                           "declared before 'classify' (fix: name one of: embed)"),
                          ("{from: embed.z}", "samples.from: graph 'embed' has no output 'z' (fix: use one of: y)"),
                          ("{from: {q: embed.y}}", "samples.from.q: not an input of the graph")):
        project.edit(STACK_YAML, "samples: {from: embed.y}", f"samples: {bad}")
        line = project.doit("list").stderr.strip()
        assert fragment in line and line.count("\n") == 0, line
        project.edit(STACK_YAML, f"samples: {bad}", "samples: {from: embed.y}")


def test_fill_alone_is_samples_when_every_input_is_a_constant_and_the_missing_message_names_media(tmp_path):
    from qnn_tasks.modelspec.load import load_model, load_socs

    project = stacked_project(tmp_path / "project")
    project.edit(STACK_YAML, 'samples: {raw: {files: "samples/stack.bin"}}', "samples: {fill: {x: 0.5}}")
    spec = load_model(project.path("models/stacked"), load_socs(project.path("socs/socs.yaml")))
    assert spec.graphs[1].samples == {"fill": {"x": 0.5}}
    from qnn_tasks.judge import media

    [sample] = media.load(spec.graphs[1])
    assert sample["x"].shape == (1, 4, 8) and float(sample["x"].max()) == 0.5
    project.edit(STACK_YAML, "samples: {fill: {x: 0.5}}\n", "\n")
    # samples are required by the stages that read them (an int8 model is refused by export without any)
    line = project.doit("cpucheck:classify").failure_line("cpucheck:classify")
    assert "graphs.classify.samples: there is no export.py" in line, line
    for source in ("image:", "audio:", "raw:", "fill:", "from: <graph>.<output>", "files:"):
        assert source in line, line
