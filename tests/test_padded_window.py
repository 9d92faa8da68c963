"""A padded audio window is what the NPU and the CPU disagree on: diagnose and simverify say so, and name pad_min.

The front end (built here) normalises per window as many keyword spotters do (CMVN): the log-energy of 25 sub-frames
minus their mean, divided by their spread. The clip is the last 1.27 s of a real speech recording (its quiet fade-out
at the end), so with `pad: true` the last 4000-sample window holds 244 samples of audio and 3756 zeros: 23 sub-frames
have the same log(eps), and `loge - mean` is a difference of near-equal values that fp16 rounds to 0 (measured on
SM8650: the NPU gives 0 for every feature of that window, the CPU -0.006 to 0.13, cosine 0.91 over the six windows).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import soundfile
from onnx import TensorProto, helper, numpy_helper
from test_pipeline_glue import _model, packaged_project

from qnn_tasks.judge import media
from qnn_tasks.modelspec.load import load_model, load_socs

SPEECH = Path("/usr/share/sounds/alsa/Front_Center.wav")  # "front centre", spoken; 48 kHz, 1.4 s
FRAME, TAIL = 4000, 244  # five whole windows at 16 kHz and a last one of 244 real samples
TARGET = "cmvn-SM8650"
MODEL_YAML_EXP = """\
licence: test fixture
source: {file: exp.onnx}
graphs:
  exp:
    inputs: {x: {shape: [1, 8], dtype: float32}}
    outputs: {y: {shape: [1, 8]}}
    samples: {raw: {files: "samples/x.bin"}}
    socs: [SM8650]
"""
MODEL_YAML = """\
licence: test fixture
source: {file: cmvn.onnx}
graphs:
  cmvn:
    inputs: {audio: {shape: [1, 4000], dtype: float32}}
    outputs: {y: {shape: [1, 25]}}
    samples: {audio: {files: clips, rate: 16000, pad: true}}
    socs: [SM8650]
"""


def cmvn_model() -> onnx.ModelProto:
    """log(energy + eps) of 25 sub-frames of 160 samples, minus their mean, over their standard deviation."""
    node = helper.make_node
    nodes = [node("Reshape", ["audio", "subframes"], ["sub"]), node("Mul", ["sub", "sub"], ["squares"]),
             node("ReduceSum", ["squares", "last"], ["energy"], keepdims=0), node("Add", ["energy", "eps"], ["floored"]),
             node("Log", ["floored"], ["loge"]), node("ReduceMean", ["loge"], ["mean"], axes=[1], keepdims=1),
             node("Sub", ["loge", "mean"], ["centred"]), node("Mul", ["centred", "centred"], ["c2"]),
             node("ReduceMean", ["c2"], ["var"], axes=[1], keepdims=1), node("Add", ["var", "eps"], ["var_eps"]),
             node("Sqrt", ["var_eps"], ["std"]), node("Div", ["centred", "std"], ["y"])]
    inits = [numpy_helper.from_array(np.array([1, 25, 160], np.int64), "subframes"),
             numpy_helper.from_array(np.array([2], np.int64), "last"), numpy_helper.from_array(np.array(1e-6, np.float32), "eps")]
    return _model(nodes, "cmvn", [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, FRAME])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 25])], inits)


def cmvn_project(root: Path):
    project = packaged_project(root, "front", {"cmvn.onnx": cmvn_model()}, {}, MODEL_YAML)
    clip, rate = soundfile.read(str(SPEECH), dtype="int16")
    keep = (5 * FRAME + TAIL) * rate // 16000  # at 16 kHz: 5 windows and 244 samples
    clips = project.path("models/front/clips")
    clips.mkdir()
    soundfile.write(str(clips / "speech.wav"), clip[-keep:], rate, subtype="PCM_16")
    return project


@pytest.mark.skipif(not SPEECH.is_file(), reason="needs the alsa-utils speech clip")
def test_the_samples_record_says_which_windows_are_padded(tmp_path):
    project = cmvn_project(tmp_path / "project")
    graph = load_model(project.path("models/front"), load_socs(project.path("socs/socs.yaml"))).graphs[0]
    notes: dict = {}
    samples = media.load(graph, notes)  # what cpucheck's record keeps of the samples it read
    assert len(samples) == 6
    assert notes["audio"]["padded"] == [{"sample": 5, "file": "speech.wav", "real": TAIL, "values": FRAME,
                                         "only": False}]
    assert samples[5]["audio"][0, :TAIL].any() and not samples[5]["audio"][0, TAIL:].any()


@pytest.mark.slow
@pytest.mark.skipif(not SPEECH.is_file(), reason="needs the alsa-utils speech clip")
def test_a_failure_on_the_padded_window_is_named_with_pad_min_as_the_fix(tmp_path):
    project = cmvn_project(tmp_path / "project")
    failed = project.doit(f"simverify:{TARGET}")
    assert failed.returncode != 0
    said = failed.stdout + failed.stderr
    assert "without sample 5 (speech.wav's last window: 244 of 4000 values are audio, the rest padding) it passes" in said
    assert "graphs.cmvn.samples.audio.pad_min: 245 in models/front/model.yaml (drops windows of fewer than 245 real " \
           "samples: keeps 5 of 6 samples), or pad: false" in said

    result = project.doit(f"diagnose:{TARGET}")
    assert result.returncode == 0, result.stdout + result.stderr
    hint = ("padded audio window: sample 5 is speech.wav's last window: 244 of 4000 values are audio, the rest padding "
            "(zeros); Sub 'Sub_6' subtracts near-equal values there")
    assert "first divergence at Sub node 'Sub_6'" in result.stderr and hint in result.stderr, result.stderr
    assert "pad_min: 245" in result.stderr and "or pad: false" in result.stderr
    record = project.one_json("build/front/cmvn/*/fp16/SM8650/diagnose/diagnose.json")
    first = record["first_divergence"]
    assert first["op_type"] == "Sub" and first["padded_samples"] == [5]
    assert first["hazards"][0]["hazard"].startswith("padded audio window: sample 5")
    summary = next(project.root.glob("build/front/cmvn/*/fp16/SM8650/diagnose/diagnose.md")).read_text()
    assert hint in summary and "pad_min: 245" in summary

    # the fix as the hint says it: the tiny trailing window is dropped and the target verifies
    project.edit("models/front/model.yaml", "pad: true}", "pad: true, pad_min: 245}")
    result = project.doit(f"simverify:{TARGET}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert project.one_json("build/front/cmvn/*/fp16/SM8650/simverify/simverify.json")["samples"] == 5


def _rows(*specs: tuple[int, str, int, bool]) -> list[dict]:
    return [{"sample": s, "file": f, "real": r, "values": FRAME, "only": only} for s, f, r, only in specs]


@pytest.mark.skipif(not SPEECH.is_file(), reason="needs the alsa-utils speech clip")
def test_the_padding_is_blamed_only_when_every_failing_sample_is_padded(tmp_path):
    """The rule on the numbers diagnose measures: the node's per-sample error, and the samples cpucheck padded."""
    from qnn_tasks.stages.diagnose import blame_padding

    graph = load_model(cmvn_project(tmp_path / "project").path("models/front"),
                       load_socs(Path(tmp_path / "project/socs/socs.yaml"))).graphs[0]
    record = {"samples_read": {"audio": {"padded": _rows((2, "speech.wav", 244, False))}}}
    cpu = [{"t": np.array([[4.0, -3.0]])}, {"t": np.array([[2.0, 1.0]])}, {"t": np.array([[0.125, -0.006]])}]
    npu = [{"t": np.array([[4.001, -3.0]])}, {"t": np.array([[2.0, 1.001]])}, {"t": np.array([[0.0, 0.0]])}]

    def blamed(npu_values):
        detail = {"tensor": "t", "op_type": "Sub", "node": "centre", "hazards": [{"hazard": "other", "fix": "x"}]}
        blame_padding(graph, detail, cpu, npu_values, 0.05, record)
        return detail

    detail = blamed(npu)
    assert detail["padded_samples"] == [2] and len(detail["hazards"]) == 2
    assert detail["hazards"][0]["hazard"].startswith("padded audio window: sample 2 is speech.wav's last window")
    assert "on sample 2 at [0, 0] the CPU has 0.125, the NPU 0" in detail["hazards"][0]["why"]
    assert detail["hazards"][0]["fix"].endswith("(drops windows of fewer than 245 real samples: keeps 2 of 3 samples), "
                                                "or pad: false")
    # a loud window fails too: the padding is not the whole story, so it is not named
    loud = [{"t": np.array([[1.0, -3.0]])}] + npu[1:]
    assert "padded_samples" not in blamed(loud) and len(blamed(loud)["hazards"]) == 1
    assert "padded_samples" not in blamed(cpu)  # nothing fails


@pytest.mark.skipif(not SPEECH.is_file(), reason="needs the alsa-utils speech clip")
def test_many_padded_windows_are_one_grouped_hint(tmp_path):
    from qnn_tasks.judge import padding

    graph = load_model(cmvn_project(tmp_path / "project").path("models/front"),
                       load_socs(Path(tmp_path / "project/socs/socs.yaml"))).graphs[0]
    rows = _rows((2, "a.wav", 100, False), (5, "b.wav", 900, False), (8, "c.wav", 300, True), (9, "d.wav", 120, False),
                 (12, "d.wav", 120, False))
    said = padding.hazard(graph, rows, rows, 14, "Log", "log_energy")
    assert said["hazard"] == ("padded audio window: samples 2, 5, 8 and 2 more are the last (or only) windows of a.wav, "
                              "b.wav, c.wav and 1 more: 100 to 900 of 4000 values are audio, the rest padding (zeros); "
                              "Log 'log_energy' computes on near-zero values there")
    # c.wav is shorter than a frame: pad: false would refuse it, so only pad_min is offered
    assert said["fix"] == ("set graphs.cmvn.samples.audio.pad_min: 901 in models/front/model.yaml (drops windows of "
                           "fewer than 901 real samples: keeps 9 of 14 samples)")
    last = _rows((5, "speech.wav", 244, False))
    one = padding.passes_without(graph, last, last, last, 6)
    assert one.startswith("without sample 5 (speech.wav's last window: 244 of 4000 values are audio, the rest padding)")
    assert one.endswith("(drops windows of fewer than 245 real samples: keeps 5 of 6 samples), or pad: false)")


def noise_project(root: Path, model: onnx.ModelProto):
    """The cmvn project on a clip of noise made here: five whole windows and a last one of 244 real samples."""
    project = packaged_project(root, "front", {"cmvn.onnx": model}, {}, MODEL_YAML)
    clips = project.path("models/front/clips")
    clips.mkdir()
    noise = np.random.default_rng(5).standard_normal(5 * FRAME + TAIL) * 3000
    soundfile.write(str(clips / "noise.wav"), noise.astype(np.int16), 16000, subtype="PCM_16")
    return project


def _judged(tmp_path, failing: set[int], padded: list[dict]) -> tuple[str, dict]:
    """simverify's padded-window clause on ten samples whose NPU outputs are zero on `failing` (the rest agree)."""
    from qnn_tasks.stages.simverify import padded_windows

    project = noise_project(tmp_path / "project", cmvn_model())
    graph = load_model(project.path("models/front"), load_socs(project.path("socs/socs.yaml"))).graphs[0]
    rng = np.random.default_rng(3)
    reference = [{"y": rng.standard_normal((1, 25)).astype(np.float32)} for _ in range(10)]
    outputs = [{"y": np.zeros_like(r["y"]) if i in failing else r["y"] + np.float32(1e-4)}
               for i, r in enumerate(reference)]
    record: dict = {}
    said = padded_windows(graph, graph.verify["fp16"], reference, outputs,
                          {"samples_read": {"audio": {"padded": padded}}}, record)
    return said, record


def test_simverify_names_the_least_pad_min_that_drops_only_the_failing_windows(tmp_path):
    """Eight of ten samples are padded windows, one of them (244 real samples) fails: pad_min 245 drops it alone;
    dropping every padded window (pad_min 4000, what the hint said before) would keep 2 of the 10."""
    padded = _rows((2, "a.wav", 3999, False), (3, "b.wav", 2000, False), (4, "c.wav", 1200, False),
                   (5, "d.wav", 900, False), (6, "e.wav", 244, False), (7, "f.wav", 3000, False),
                   (8, "g.wav", 1500, False), (9, "h.wav", 2500, False))
    said, record = _judged(tmp_path, {6}, padded)
    assert said == ("; without sample 6 (e.wav's last window: 244 of 4000 values are audio, the rest padding) it "
                    "passes: the NPU and the CPU disagree on the zero padding (fix: set "
                    "graphs.cmvn.samples.audio.pad_min: 245 in models/front/model.yaml (drops windows of fewer than "
                    "245 real samples: keeps 9 of 10 samples))")
    assert record["padded_windows"] == {"samples": [6], "passes_without": True, "pad_min": 245, "keeps": 9}


def test_a_passing_window_shorter_than_a_failing_one_is_said_to_go_too(tmp_path):
    """No pad_min drops sample 6 (244 real samples, failing) but not sample 3 (100, passing): the least one that
    drops the failing window is named, with what it costs."""
    padded = _rows((3, "b.wav", 100, False), (6, "e.wav", 244, False), (8, "g.wav", 1500, False))
    said, record = _judged(tmp_path, {6}, padded)
    assert "without samples 3, 6 (the last windows of b.wav, e.wav: 100 to 244 of 4000 values" in said
    assert said.endswith("pad_min: 245 in models/front/model.yaml (drops windows of fewer than 245 real samples: keeps "
                         "8 of 10 samples; no pad_min drops only the failing samples: sample 3 passes with 100 real "
                         "samples, fewer than failing sample 6's 244, so this least value drops it too))")
    assert record["padded_windows"]["pad_min"] == 245 and record["padded_windows"]["keeps"] == 8


def test_cpucheck_says_the_original_model_fails_on_a_padded_window(tmp_path):
    """Without its epsilon the front end takes log(0) on the padded window's silent sub-frames: the original model
    itself returns NaN there, which cpucheck names (sample, how much is audio) with the pad_min that drops it."""
    model = cmvn_model()
    eps = next(i for i in model.graph.initializer if i.name == "eps")
    eps.CopyFrom(numpy_helper.from_array(np.array(0.0, np.float32), "eps"))
    project = noise_project(tmp_path / "project", model)
    line = project.doit("cpucheck:cmvn").failure_line("cpucheck:cmvn")
    assert ("the original model fails, not the simplification: the original cmvn.onnx on CPU returns non-finite "
            "values (NaN/Inf) in output 'y' on sample 5 (noise.wav's last window: 244 of 4000 values are audio, the "
            "rest padding)") in line, line
    assert "simplified ONNX differs" not in line and "loosen" not in line
    assert ("(fix: set graphs.cmvn.samples.audio.pad_min: 245 in models/front/model.yaml (drops windows of fewer than "
            "245 real samples: keeps 5 of 6 samples), or pad: false; or make the model finite") in line


def test_cpucheck_names_a_sample_the_original_model_overflows_on(tmp_path):
    """An unpadded sample: its index, and the fix is the model or the samples."""
    model = _model([helper.make_node("Exp", ["x"], ["y"])], "exp",
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [])
    values = np.random.default_rng(4).uniform(-1, 1, (4, 8))
    values[2, 3] = 200.0  # exp(200) is past float32 (and float64 holds it: the float64 check is made too)
    project = packaged_project(tmp_path / "project", "grow", {"exp.onnx": model}, {"x.bin": values},
                               MODEL_YAML_EXP)
    line = project.doit("cpucheck:exp").failure_line("cpucheck:exp")
    assert ("the original exp.onnx on CPU returns non-finite values (NaN/Inf) in output 'y' on sample 2, so there is "
            "nothing to compare the simplified ONNX with") in line, line
    assert line.endswith("(fix: make the model finite on such inputs (e.g. an epsilon where it takes a log or "
                         "divides), or leave those samples out of graphs.exp.samples)")
