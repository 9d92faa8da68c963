"""Samples from media, end to end: real doit, real cpucheck, compile, simulate and simverify on SM8650.

Two packaged ONNX models built here, each with a model.yaml only (no export.py), their inputs declared
as media: a small conv net fed PNG images (letterboxed, RGB, mean/std) whose outputs are a dense map and
a YOLO-style [1, N, 4 + classes] tensor (judged by `elements`, `detection` and a `top1` on the score
slice); and an audio front end (framed windowed-cosine filterbank, power, log) fed a real speech clip from
alsa-utils (or a generated chirp), resampled to 16 kHz and framed, at normal and quiet gain.
"""
from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import EXAMPLES, Project
from onnx import TensorProto, helper, numpy_helper
from PIL import Image, ImageDraw

from qnn_tasks.judge import sample_store
from qnn_tasks.modelspec.load import load_model, load_socs
from qnn_tasks.stages import calibrate

ALSA = Path("/usr/share/sounds/alsa/Front_Center.wav")
SIZE, CLASSES, BANDS, FRAME = 32, 3, 32, 400
STEPS, SYMBOLS = 32, 10  # the recogniser: 32 time steps, 10 symbols + the blank

VISION_YAML = f"""\
licence: test fixture
source: {{file: vision.onnx}}
graphs:
  vision:
    inputs:
      image: {{shape: [1, 3, {SIZE}, {SIZE}], dtype: float32}}
    outputs:
      mask: {{shape: [1, 1, {SIZE}, {SIZE}]}}
      dets: {{shape: [1, 64, {4 + CLASSES}]}}
    samples:
      image: {{files: "images/*.png", resize: letterbox, layout: NCHW, channels: RGB,
              mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}
    socs: [SM8650]
    verify:
      checks:
        - elements: {{output: mask, threshold: 0.5, min: 0.999}}
        - top1: {{output: dets, slice: "..., 4:", min: 0.95}}
        - detection: {{output: dets, score_threshold: 0.5, nms_iou: 0.45, match_iou: 0.5, min: 0.9}}
"""
FRONTEND_YAML = f"""\
licence: test fixture
source: {{file: frontend.onnx}}
graphs:
  frontend:
    inputs:
      audio: {{shape: [1, {FRAME}], dtype: float32}}
    outputs:
      logpower: {{shape: [1, {BANDS}, 1]}}
    samples:
      audio: {{files: clips, rate: 16000, hop: 320, gain: [1.0, 0.05], limit: 24}}
    socs: [SM8650]
    verify:
      thresholds: {{min_cosine: 0.999}}
      checks:
        - elements: {{output: logpower, tol: 0.05, min: 0.99}}
"""
READER_YAML = f"""\
licence: test fixture
source: {{file: reader.onnx}}
graphs:
  reader:
    inputs:
      x: {{shape: [1, 1, 32, {4 * STEPS}], dtype: float32}}
    outputs:
      probs: {{shape: [1, {STEPS}, {SYMBOLS + 1}]}}
    samples:
      image: {{files: lines, resize: stretch, channels: grey, mean: 0.5, std: 0.5}}
    socs: [SM8650]
    verify:
      checks:
        - ctc: {{output: probs, blank: 0, alphabet: keys.txt, min: 0.75}}
"""


def reader_model() -> onnx.ModelProto:
    """A CTC recogniser's shape: grey [1, 1, 32, 128] -> one column of 4 pixels per time step -> softmax over
    the blank and 10 symbols, [1, 32, 11]."""
    rng = np.random.default_rng(7)
    weights = (rng.standard_normal((SYMBOLS + 1, 1, 32, 4)) * 0.4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["columns"], strides=[32, 4]),         # [1, 11, 1, 32]
             helper.make_node("Reshape", ["columns", "shape"], ["flat"]),               # [1, 11, 32]
             helper.make_node("Transpose", ["flat"], ["steps"], perm=[0, 2, 1]),        # [1, 32, 11]
             helper.make_node("Softmax", ["steps"], ["probs"], axis=-1)]
    graph = helper.make_graph(nodes, "reader", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              [1, 1, 32, 4 * STEPS])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w"),
                               numpy_helper.from_array(np.array([1, SYMBOLS + 1, STEPS], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def write_lines(folder: Path) -> None:
    """Text lines drawn with Pillow's default font, black on white and white on grey (RGB: made grey by the loader)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, (text, colours) in enumerate([("0123 4567", ((255, 255, 255), (0, 0, 0))), ("8 90 12", ((90, 90, 90), (255,) * 3)),
                                         ("3141 5926", ((240, 230, 200), (20, 20, 60))), ("77 08", ((255,) * 3, (0, 0, 0)))]):
        img = Image.new("RGB", (160 + 20 * i, 36), colours[0])
        ImageDraw.Draw(img).text((4, 10), text, fill=colours[1])
        img.save(folder / f"line{i}.png")


def vision_model() -> onnx.ModelProto:
    """Conv-ReLU-Conv to a sigmoid mask; a stride-4 conv head decoded like YOLO's to [1, 64, 4 + classes]:
    each of the 8 x 8 cells gives a box centred in its cell (cx, cy = (cell + sigmoid) / 8, w, h up to 0.25)
    and sigmoid class scores."""
    rng = np.random.default_rng(3)
    def w(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
    cells = np.stack(np.meshgrid(np.arange(8), np.arange(8), indexing="xy"), axis=-1).reshape(64, 2)
    offset = np.zeros((1, 64, 4 + CLASSES), np.float32)
    offset[0, :, :2] = cells / 8.0
    scale = np.array([[[1 / 8, 1 / 8, 0.25, 0.25] + [1.0] * CLASSES]], np.float32)
    head = (rng.standard_normal((4 + CLASSES, 8, 4, 4)) * 0.3).astype(np.float32)
    head[4:] *= 0.6  # decisive class scores, as a trained detector's, most cells below the threshold
    bias = (rng.standard_normal(4 + CLASSES) * 0.1).astype(np.float32)
    bias[4:] -= 1.5
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c2"], ["mask"]),
        helper.make_node("Conv", ["r1", "w3", "b3"], ["c3"], strides=[4, 4]),            # [1, 4 + C, 8, 8]
        helper.make_node("Reshape", ["c3", "head_shape"], ["flat"]),                      # [1, 4 + C, 64]
        helper.make_node("Transpose", ["flat"], ["rows"], perm=[0, 2, 1]),               # [1, 64, 4 + C]
        helper.make_node("Sigmoid", ["rows"], ["squashed"]),
        helper.make_node("Mul", ["squashed", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "offset"], ["dets"]),
    ]
    inits = [w("w1", 8, 3, 3, 3), w("b1", 8, scale=0.1), w("w2", 1, 8, 3, 3), w("b2", 1, scale=0.1),
             numpy_helper.from_array(head, "w3"), numpy_helper.from_array(bias, "b3"),
             numpy_helper.from_array(np.array([1, 4 + CLASSES, 64], np.int64), "head_shape"),
             numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(offset, "offset")]
    graph = helper.make_graph(nodes, "vision", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                              ["batch", 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info("mask", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("dets", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def frontend_model() -> onnx.ModelProto:
    """A filterbank front end: [1, 400] -> Hann-windowed cosines as a Conv1d (one frame) -> power -> log."""
    t = np.arange(FRAME)
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * t / FRAME)
    bank = np.stack([hann * np.cos(2 * np.pi * (k + 1) * 6 * t / FRAME) for k in range(BANDS)])[:, None, :]
    nodes = [helper.make_node("Reshape", ["audio", "shape3"], ["x3"]),
             helper.make_node("Conv", ["x3", "bank"], ["proj"], strides=[FRAME]),        # [1, BANDS, 1]
             helper.make_node("Mul", ["proj", "proj"], ["power"]),
             helper.make_node("Add", ["power", "floor"], ["floored"]),
             helper.make_node("Log", ["floored"], ["logpower"])]
    inits = [numpy_helper.from_array(bank.astype(np.float32), "bank"),
             numpy_helper.from_array(np.array([1, 1, FRAME], np.int64), "shape3"),
             numpy_helper.from_array(np.array(1e-2, np.float32), "floor")]
    graph = helper.make_graph(nodes, "frontend", [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, FRAME])],
                              [helper.make_tensor_value_info("logpower", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def write_images(folder: Path, count: int = 4) -> None:
    """Pictures of shapes on backgrounds, of several sizes and aspect ratios (letterboxed to 32 x 32)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    for i in range(count):
        width, height = [(64, 48), (40, 80), (32, 32), (120, 90), (50, 50), (70, 30), (33, 61), (90, 90)][i % 8]
        img = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(0, 255, 3)))
        draw = ImageDraw.Draw(img)
        for _ in range(3):
            x0, y0 = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
            draw.ellipse([x0, y0, x0 + width // 3, y0 + height // 3], fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
            draw.rectangle([y0 % width, x0 % height, y0 % width + 8, x0 % height + 12], fill=(250, 250, 250))
        img.save(folder / f"scene{i}.png")


def write_clip(folder: Path) -> None:
    """Real speech (alsa-utils' Front_Center.wav, 48 kHz) if installed, else a 1 s chirp with noise at 22.05 kHz."""
    folder.mkdir(parents=True, exist_ok=True)
    if ALSA.is_file():
        shutil.copy(ALSA, folder / "speech.wav")
        return
    rate = 22050
    t = np.arange(rate) / rate
    signal = 0.4 * np.sin(2 * np.pi * (200 + 1500 * t) * t) + 0.02 * np.random.default_rng(0).standard_normal(rate)
    with wave.open(str(folder / "chirp.wav"), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(np.clip(signal * 32767, -32768, 32767).astype("<i2").tobytes())


def media_project(root: Path) -> Project:
    root.mkdir(parents=True)
    for name in ("dodo.py", "socs", "toolchain"):
        (shutil.copytree if (EXAMPLES / name).is_dir() else shutil.copy2)(EXAMPLES / name, root / name)
    vision, frontend = root / "models" / "vision", root / "models" / "frontend"
    vision.mkdir(parents=True)
    frontend.mkdir(parents=True)
    onnx.save(vision_model(), str(vision / "vision.onnx"))
    onnx.save(frontend_model(), str(frontend / "frontend.onnx"))
    reader = root / "models" / "reader"
    reader.mkdir(parents=True)
    onnx.save(reader_model(), str(reader / "reader.onnx"))
    write_lines(reader / "lines")
    (reader / "keys.txt").write_text("".join(f"{d}\n" for d in "0123456789"))
    (reader / "model.yaml").write_text(READER_YAML)
    write_images(vision / "images")
    write_clip(frontend / "clips")
    (vision / "model.yaml").write_text(VISION_YAML)
    (frontend / "model.yaml").write_text(FRONTEND_YAML)
    return Project(root)


@pytest.mark.slow
def test_image_and_audio_samples_build_and_verify_on_sm8650(tmp_path):
    project = media_project(tmp_path / "project")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    socs = load_socs(project.path("socs/socs.yaml"))
    for model, graph, count in (("vision", "vision", 4), ("frontend", "frontend", 24), ("reader", "reader", 4)):
        cpucheck = json.loads(project.path(f"build/{model}/{graph}/cpucheck/cpucheck.json").read_text())
        assert cpucheck["status"] == "passed" and cpucheck["samples"] == count
        assert cpucheck["samples_from"].endswith(f"model.yaml: graphs.{graph}.samples")
        # what cpucheck kept (and simulate ran) is exactly what the loader reads from the media
        spec = load_model(project.path(f"models/{model}"), socs).graphs[0]
        expected = sample_store.read_declared(spec)
        kept = sample_store.load(project.path(f"build/{model}/{graph}/cpucheck/inputs.npz"))
        assert len(kept) == count and all(np.array_equal(k[n], e[n]) for k, e in zip(kept, expected) for n in k)
        [simulate] = project.root.glob(f"build/{model}/{graph}/*/*/SM8650/simulate/simulate.json")
        assert json.loads(simulate.read_text())["samples"] == count
        verdict = json.loads((simulate.parent.parent / "simverify" / "simverify.json").read_text())
        assert verdict["status"] == "passed", verdict
        assert all(c["passed"] for c in verdict["checks"]), verdict["checks"]
    vision = json.loads(next(project.root.glob("build/vision/vision/*/*/SM8650/simverify/simverify.json")).read_text())
    kinds = {c["kind"]: c for c in vision["checks"]}
    assert set(kinds) == {"elements", "top1", "detection"} and kinds["top1"]["slice"] == "..., 4:"
    assert kinds["detection"]["cpu_detections"] > 0 and kinds["elements"]["elements"] == 4 * SIZE * SIZE
    # limit: 24 spreads over the loud and the quiet (x0.05) copies of the clip: both reached the simulator
    kept = sample_store.load(project.path("build/frontend/frontend/cpucheck/inputs.npz"))
    loud, quiet = (max(float(np.abs(k["audio"]).max()) for k in half) for half in (kept[:12], kept[12:]))
    assert 0 < quiet < 0.1 * loud
    reader = json.loads(next(project.root.glob("build/reader/reader/*/*/SM8650/simverify/simverify.json")).read_text())
    [ctc] = reader["checks"]
    assert ctc["kind"] == "ctc" and "note" not in ctc and ctc["cer"] <= 0.25, ctc
    second = project.doit()
    assert second.returncode == 0 and not second.executed, second.stdout
    # the alphabet is an input of the judgement only: editing it re-judges, nothing is simulated again
    project.path("models/reader/keys.txt").write_text("".join(f"{c}\n" for c in "abcdefghij"))
    relabelled = project.doit()
    assert relabelled.returncode == 0 and relabelled.executed == {"simverify:reader-SM8650", "report"}, relabelled.stdout
    # a new image reruns cpucheck and what follows for the vision graph only
    write_images(project.path("models/vision/images"), count=5)
    third = project.doit("cpucheck:vision", "cpucheck:frontend")
    assert third.executed == {"cpucheck:vision"}, third.stdout


def test_calibration_set_from_images_is_the_declared_samples(tmp_path):
    """calibrate (w8a16) reads the same media through the same loader as cpucheck, spread over the samples."""
    project = media_project(tmp_path / "project")
    write_images(project.path("models/vision/images"), count=8)
    yaml = project.path("models/vision/model.yaml")
    yaml.write_text(yaml.read_text().replace("    socs: [SM8650]\n", "    socs: [SM8650]\n    precision: [fp16, w8a16]\n"
                                             "    calibration: {samples: 8}\n"))
    spec = load_model(project.path("models/vision"), load_socs(project.path("socs/socs.yaml"))).graphs[0]
    out = tmp_path / "calibration.npz"
    record = calibrate.run(spec, None, out)
    assert record["samples"] == 8 and record["available"] == 8
    chosen, declared = sample_store.load(out), sample_store.read_declared(spec)
    assert all(np.array_equal(c["image"], d["image"]) for c, d in zip(chosen, declared))
    assert -2.2 < record["value_range"][0] < 0 < record["value_range"][1] < 2.7  # ImageNet mean/std applied


def test_silent_clips_fail_cpucheck_the_report_and_the_gate(tmp_path):
    """All-zero clips would pass everything (two zero vectors have cosine 1.0): cpucheck refuses them with the
    reason, which the record, the report and the documented CI gate carry."""
    from test_trust_gate import gate_passes

    root = tmp_path / "project"
    folder = root / "models" / "frontend"
    (folder / "clips").mkdir(parents=True)
    for name in ("dodo.py", "socs", "toolchain"):
        (shutil.copytree if (EXAMPLES / name).is_dir() else shutil.copy2)(EXAMPLES / name, root / name)
    onnx.save(frontend_model(), str(folder / "frontend.onnx"))
    (folder / "model.yaml").write_text(FRONTEND_YAML)
    for i in range(2):
        with wave.open(str(folder / "clips" / f"silence{i}.wav"), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(16000)
            wav.writeframes(bytes(2 * 8000))
    project = Project(root)
    result = project.doit("cpucheck", "report")
    assert result.returncode != 0, result.stdout + result.stderr  # its code (1 or 2) is issue 34's item 7
    line = result.failure_line("cpucheck:frontend")
    assert "graphs.frontend.samples: every input is one constant over all 24 sample(s) ('audio' is 0)" in line, line
    assert "nothing would be verified (fix: samples that vary" in line and "Traceback" not in result.stderr
    record = project.one_json("build/frontend/frontend/cpucheck/cpucheck.json")
    assert record["status"] == "failed" and record["not_verified"].startswith("every input is one constant")
    report = json.loads(project.path("build/report/report.json").read_text())
    assert report["summary"]["failed"] >= 1 and not gate_passes(project)
