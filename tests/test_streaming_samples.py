"""Audio samples for a streaming front end: its length input and short clips (modelspec/specsamples.py, judge/media.py).

A front end taking `waveforms` and `waveforms_lens` needs each window's count of real samples, not a constant:
`audio: {lengths: waveforms_lens}`. `pad_min: N` pads a short clip or a last partial window holding at least N real
samples and drops a tiny trailing window (a window of nearly all zeros the NPU and the CPU disagree on). WAV
clips are written here; the front end is an ONNX graph built here whose output depends on the length input.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import soundfile
from onnx import TensorProto, helper
from test_pipeline_glue import packaged_project

from qnn_tasks.errors import SpecError, StageError
from qnn_tasks.judge import media
from qnn_tasks.modelspec.load import load_model, load_socs

FRAME = 1600
MODEL_YAML = """\
licence: test fixture
source: {file: front.onnx}
graphs:
  front:
    inputs: {waveforms: {shape: [1, 1600], dtype: float32}, waveforms_lens: {shape: [1], dtype: int32}}
    outputs: {mean: {shape: [1]}}
    samples: {audio: {files: clips, input: waveforms, rate: 16000, lengths: waveforms_lens, pad_min: 500}}
    socs: [SM8650]
"""


def front_model() -> onnx.ModelProto:
    """The mean of the valid samples only: sum(waveforms[:, :lens]) / lens (wrong if the length is a constant)."""
    nodes = [helper.make_node("Range", ["zero", "frame", "one"], ["positions"]),
             helper.make_node("Less", ["positions", "waveforms_lens"], ["valid"]),
             helper.make_node("Cast", ["valid"], ["mask"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["waveforms", "mask"], ["kept"]),
             helper.make_node("ReduceSum", ["kept", "axis"], ["total"], keepdims=0),
             helper.make_node("Cast", ["waveforms_lens"], ["count"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["total", "count"], ["mean"])]
    inits = [helper.make_tensor(name, TensorProto.INT32, [], [value])
             for name, value in (("zero", 0), ("frame", FRAME), ("one", 1))]
    inits.append(helper.make_tensor("axis", TensorProto.INT64, [1], [1]))
    graph = helper.make_graph(nodes, "front", [helper.make_tensor_value_info("waveforms", TensorProto.FLOAT, [1, FRAME]),
                                               helper.make_tensor_value_info("waveforms_lens", TensorProto.INT32, [1])],
                              [helper.make_tensor_value_info("mean", TensorProto.FLOAT, [1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def front_project(root: Path):
    project = packaged_project(root, "front", {"front.onnx": front_model()}, {}, MODEL_YAML)
    rng = np.random.default_rng(7)
    clips = project.path("models/front/clips")
    clips.mkdir()
    # a: 2 whole windows and 700 samples (kept: >= 500); b: shorter than a frame (padded); c: a 300-sample tail
    for name, length in (("a", 2 * FRAME + 700), ("b", 1000), ("c", 2 * FRAME + 300)):
        soundfile.write(str(clips / f"{name}.wav"), rng.uniform(-0.5, 0.5, length).astype(np.float32) + 0.1, 16000,
                        subtype="FLOAT")
    return project


def test_a_length_input_gets_each_windows_real_samples_and_pad_min_drops_a_tiny_tail(tmp_path):
    project = front_project(tmp_path / "project")
    spec = load_model(project.path("models/front"), load_socs(project.path("socs/socs.yaml"))).graphs[0]
    samples = media.load(spec)
    lens = [int(s["waveforms_lens"][0]) for s in samples]
    assert lens == [1600, 1600, 700, 1000, 1600, 1600]  # c's 300-sample tail is dropped, b's 1000 samples padded
    assert all(s["waveforms_lens"].dtype == np.int32 and s["waveforms_lens"].shape == (1,) for s in samples)
    clip, _ = soundfile.read(str(project.path("models/front/clips/a.wav")), dtype="float32")
    np.testing.assert_array_equal(samples[2]["waveforms"][0, :700], clip[3200:])
    assert not samples[2]["waveforms"][0, 700:].any() and not samples[3]["waveforms"][0, 1000:].any()
    # the real thing: cpucheck runs the front end on those inputs, its outputs the mean of the real samples only
    result = project.doit("cpucheck")
    assert result.returncode == 0, result.stdout + result.stderr
    with np.load(project.path("build/front/front/cpucheck/inputs.npz")) as inputs:
        assert inputs["waveforms_lens"][:, 0].tolist() == lens
    with np.load(project.path("build/front/front/cpucheck/reference.npz")) as reference:
        assert reference["mean"][3, 0] == pytest.approx(float(samples[3]["waveforms"][0, :1000].mean()), rel=1e-4)


@pytest.mark.parametrize("old, new, fragment", [
    ("lengths: waveforms_lens, pad_min: 500", "pad_min: 500",
     "graphs.front.samples: no source feeds input(s) ['waveforms_lens']"),
    ("lengths: waveforms_lens", "lengths: waveforms", "samples.audio.lengths: 'waveforms' is not another input"),
    ("pad_min: 500", "pad_min: 500, pad: false", "samples.audio.pad_min: pads windows of at least pad_min real "
     "samples, but pad is false"),
    ("pad_min: 500", "pad_min: 5000", "samples.audio.pad_min: 5000 is out of range"),
])
def test_length_and_pad_min_spec_errors(tmp_path, old, new, fragment):
    project = front_project(tmp_path / "project")
    project.edit("models/front/model.yaml", old, new)
    with pytest.raises(SpecError) as info:
        load_model(project.path("models/front"), load_socs(project.path("socs/socs.yaml")))
    assert fragment in str(info.value) and "(fix: " in str(info.value), str(info.value)


def test_pad_false_names_pad_min_for_a_short_clip(tmp_path):
    project = front_project(tmp_path / "project")
    project.edit("models/front/model.yaml", "pad_min: 500", "pad: false")
    spec = load_model(project.path("models/front"), load_socs(project.path("socs/socs.yaml"))).graphs[0]
    with pytest.raises(StageError, match="b.wav: 1000 samples is shorter than one frame of 1600 .*pad_min"):
        media.load(spec)
