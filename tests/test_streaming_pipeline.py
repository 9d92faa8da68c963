"""A streaming three-graph pipeline declared in YAML only, verified end to end on real audio (SM8650 simulator).

front (a filterbank-like front end, once per 80 ms window of a real speech clip, hop 40 ms) gives [1, 1, 1, 32];
embed takes 8 front-end runs every 4 as [1, 8, 32] and gives [1, 1, 1, 16]; classify takes the last 4 embeddings
as [1, 4, 16]. Both stacks cross ranks (stacked on a new axis, then reshaped), and the two later graphs have no
media of their own: `samples: {from: <graph>.<output>}`. The graphs are ONNX built here; the YAML is the one
docs/pipelines-and-loops.md shows.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_pipeline_glue import _model, packaged_project

SPEECH = Path("/usr/share/sounds/alsa/Front_Center.wav")  # "front centre", spoken; 48 kHz, 1.4 s
MODEL_YAML = """\
licence: test fixture
source: {file: front.onnx}
graphs:
  front:
    inputs: {audio: {shape: [1, 1280], dtype: float32}}
    outputs: {mel: {shape: [1, 1, 1, 32]}}
    samples: {audio: {files: clips, rate: 16000, hop: 640, pad_min: 640}}
    verify: {samples: 24}
    socs: [SM8650]
  embed:
    source: {file: embed.onnx}
    inputs: {frames: {shape: [1, 8, 32], dtype: float32}}
    outputs: {emb: {shape: [1, 1, 1, 16]}}
    samples: {from: front.mel}
    verify: {samples: 4}
    socs: [SM8650]
  classify:
    source: {file: classify.onnx}
    inputs: {x: {shape: [1, 4, 16], dtype: float32}}
    outputs: {logits: {shape: [1, 3]}}
    samples: {from: embed.emb}
    verify: {samples: 2}
    socs: [SM8650]
pipeline:
  graphs: [front, embed, classify]
  feed:
    embed.frames: {from: front.mel, stack: {runs: 8, axis: 1, hop: 4}, reshape: true}
    classify.x: {from: embed.emb, stack: {runs: 4, axis: 1, hop: 1}, reshape: true}
  verify:
    samples: 2
    thresholds: {min_cosine: 0.99}
"""


def _shape(name: str, dims: list[int]):
    return numpy_helper.from_array(np.array(dims, np.int64), name)


def front_model() -> onnx.ModelProto:
    """log(energy + eps) of 32 fixed band projections of the window."""
    rng = np.random.default_rng(11)
    bands = (rng.standard_normal((1280, 32)) / np.sqrt(1280)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["audio", "bands"], ["proj"]), helper.make_node("Mul", ["proj", "proj"], ["energy"]),
             helper.make_node("Add", ["energy", "eps"], ["floored"]), helper.make_node("Log", ["floored"], ["logs"]),
             helper.make_node("Reshape", ["logs", "shape"], ["mel"])]
    return _model(nodes, "front", [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1280])],
                  [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, 1, 1, 32])],
                  [numpy_helper.from_array(bands, "bands"), numpy_helper.from_array(np.array(1e-3, np.float32), "eps"),
                   _shape("shape", [1, 1, 1, 32])])


def embed_model() -> onnx.ModelProto:
    weights = (np.random.default_rng(12).standard_normal((256, 16)) * 0.02).astype(np.float32)
    nodes = [helper.make_node("Flatten", ["frames"], ["flat"], axis=1), helper.make_node("MatMul", ["flat", "w"], ["h"]),
             helper.make_node("Tanh", ["h"], ["t"]), helper.make_node("Reshape", ["t", "shape"], ["emb"])]
    return _model(nodes, "embed", [helper.make_tensor_value_info("frames", TensorProto.FLOAT, [1, 8, 32])],
                  [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 1, 1, 16])],
                  [numpy_helper.from_array(weights, "w"), _shape("shape", [1, 1, 1, 16])])


def classify_model() -> onnx.ModelProto:
    weights = np.random.default_rng(13).standard_normal((64, 3)).astype(np.float32)
    nodes = [helper.make_node("Flatten", ["x"], ["flat"], axis=1), helper.make_node("MatMul", ["flat", "w"], ["logits"])]
    return _model(nodes, "classify", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])], [numpy_helper.from_array(weights, "w")])


@pytest.mark.slow
@pytest.mark.skipif(not SPEECH.is_file(), reason="needs the alsa-utils speech clip")
def test_a_streaming_three_graph_pipeline_is_verified_end_to_end_on_real_speech(tmp_path):
    project = packaged_project(tmp_path / "project", "streaming", {"front.onnx": front_model(),
                               "embed.onnx": embed_model(), "classify.onnx": classify_model()}, {}, MODEL_YAML)
    (project.path("models/streaming/clips")).mkdir()
    shutil.copy2(SPEECH, project.path("models/streaming/clips/front_center.wav"))
    result = project.doit()  # every graph built, cpuchecked and verified on its own, then the chain
    assert result.returncode == 0, result.stdout + result.stderr
    record = project.one_json("build/streaming/pipeline/*/SM8650/pipeline/pipeline.json")
    assert record["status"] == "passed" and record["samples"] == 2 and record["first_samples"] == 24, record
    # 2 classifier runs need 4 + 1 embeddings, which need (5 - 1) * 4 + 8 = 24 front-end windows
    assert [(link["graph"], link["runs"]) for link in record["links"]] == [("front", 24), ("embed", 5), ("classify", 2)]
    assert record["stacked"]["embed.frames"]["windows"] == 5 and record["stacked"]["classify.x"]["windows"] == 2
    assert all(m["cosine"] > 0.99 for link in record["links"] for m in link["metrics"].values()), record["links"]
    for graph, samples in (("front", 24), ("embed", 4), ("classify", 2)):  # each graph verified on its own too
        own = project.one_json(f"build/streaming/{graph}/*/fp16/SM8650/simverify/simverify.json")
        assert own["status"] == "passed" and own["samples"] == samples, own
    # the CPU chain's end, recomputed here from the front end's real inputs (the clip at 16 kHz, 80 ms windows)
    with np.load(project.path("build/streaming/front/cpucheck/inputs.npz")) as inputs:
        windows = inputs["audio"][:24]
    assert windows.std() > 1e-3  # speech, not silence
    sessions = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                for m in (front_model(), embed_model(), classify_model())]
    mel = [sessions[0].run(None, {"audio": w})[0] for w in windows]
    emb = [sessions[1].run(None, {"frames": np.stack(mel[s:s + 8], axis=1).reshape(1, 8, 32)})[0]
           for s in range(0, 17, 4)]
    logits = [sessions[2].run(None, {"x": np.stack(emb[s:s + 4], axis=1).reshape(1, 4, 16)})[0] for s in range(2)]
    with np.load(project.path(record["reference_file"])) as reference:
        np.testing.assert_allclose(reference["logits"], np.stack(logits), rtol=1e-4, atol=1e-4)
    # the middle graphs' own samples came from the graph before them, stacked as the pipeline feeds them
    with np.load(project.path("build/streaming/embed/cpucheck/inputs.npz")) as inputs:
        np.testing.assert_allclose(inputs["frames"][0], np.stack(mel[:8], axis=1).reshape(1, 8, 32), rtol=1e-5, atol=1e-5)
    with np.load(project.path("build/streaming/classify/cpucheck/inputs.npz")) as inputs:
        np.testing.assert_allclose(inputs["x"][1], np.stack(emb[1:5], axis=1).reshape(1, 4, 16), rtol=1e-4, atol=1e-5)
