"""Silero VAD (package `silero-vad`): NPU-ready export, real audio inputs, original-model reference.

The package ships `silero_vad_op18_ifless.onnx`, whose top level still branches on the
sample rate with an `If`. Export keeps the 16 kHz branch only, fixes every shape
(batch 1, 576 samples = 64 context + 512 new, state [2,1,128]) and rewrites
`Pow(x, 2)` as `Mul(x, x)`: HTP's fp16 Pow returns -4 when x underflows fp16 (quiet
audio), which made the VAD disagree with the CPU on a third of the frames (SPEC 8).
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
CONTEXT = 64
CHUNK = 512
ALSA_SOUNDS = Path("/usr/share/sounds/alsa")
SENTENCES = [
    "Turn the lights off in the kitchen, please.",
    "The quick brown fox jumps over the lazy dog.",
]


def export(ctx) -> None:
    """Write the If-free, static-shape, int32-free 16 kHz VAD graph to ctx.out_path."""
    import onnx
    from onnx import helper

    model = onnx.load(str(ctx.source_path))
    graph = model.graph
    branch_node = next((n for n in graph.node if n.op_type == "If"), None)
    if branch_node is None:
        raise ctx.error("expected the sample-rate If node in the packaged If-less model; "
                        "the package layout changed, check the silero-vad version")
    then_branch = next(a.g for a in branch_node.attribute if a.name == "then_branch")

    # Keep only the 16 kHz branch: its nodes become the graph body, its outputs the graph outputs.
    body = list(then_branch.node)
    renames = {o.name: final for o, final in zip(then_branch.output, branch_node.output)}
    for node in body:
        node.output[:] = [renames.get(o, o) for o in node.output]
        node.input[:] = [renames.get(i, i) for i in node.input]
    used = {i for n in body for i in n.input}
    initializers = [t for t in list(graph.initializer) + list(then_branch.initializer) if t.name in used]

    if not ctx.options.get("keep_pow", False):
        body = _pow2_to_mul(body, initializers)
        used = {i for n in body for i in n.input}
        initializers = [t for t in initializers if t.name in used]

    inputs = [helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, [1, CONTEXT + CHUNK]),
              helper.make_tensor_value_info("state", onnx.TensorProto.FLOAT, [2, 1, 128])]
    outputs = [helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, [1, 1]),
               helper.make_tensor_value_info("stateN", onnx.TensorProto.FLOAT, [2, 1, 128])]
    new_graph = helper.make_graph(body, "silero_vad_16k", inputs, outputs, initializers)
    new_model = helper.make_model(new_graph, opset_imports=model.opset_import)
    new_model.ir_version = model.ir_version
    new_model = onnx.shape_inference.infer_shapes(new_model)
    onnx.checker.check_model(new_model)
    onnx.save(new_model, str(ctx.out_path))


def _pow2_to_mul(nodes, initializers):
    """Replace Pow(x, 2) by Mul(x, x) (fp16-safe on HTP)."""
    import onnx
    from onnx import helper, numpy_helper

    constants = {t.name: numpy_helper.to_array(t) for t in initializers}
    rewritten = []
    for node in nodes:
        exponent = constants.get(node.input[1]) if node.op_type == "Pow" else None
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0:
            rewritten.append(helper.make_node("Mul", [node.input[0], node.input[0]], list(node.output),
                                              name=(node.name or node.output[0]) + "_as_mul"))
        else:
            rewritten.append(node)
    return rewritten


def samples(ctx) -> list[dict[str, np.ndarray]]:
    """Real 16 kHz audio, chunked as the VAD sees it, with the recurrent state of the original model.

    Clips: ALSA's recorded speech, espeak-ng sentences, a quiet copy (x 0.002, the fp16-underflow
    case) and silence with faint noise. Each sample is one 576-sample frame plus the state the
    original model carried into it, so CPU and NPU see identical inputs at every step.
    """
    clips = _clips()
    limit = int(ctx.options.get("frames_per_clip", 40))
    result: list[dict[str, np.ndarray]] = []
    for name, audio in clips:
        frames = _frames(audio)[:limit]
        state = np.zeros((2, 1, 128), np.float32)
        session = _original_session(ctx)
        for frame in frames:
            result.append({"input": frame, "state": state, "_clip": name})
            _, state = session.run(None, {"input": frame, "state": state, "sr": np.array(SAMPLE_RATE, np.int64)})
    for sample in result:
        sample.pop("_clip")
    return result


def reference(ctx, inputs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Outputs of the packaged original model (with its If and sr input) on the same frames."""
    session = _original_session(ctx)
    outs = []
    for sample in inputs:
        prob, state = session.run(None, {**sample, "sr": np.array(SAMPLE_RATE, np.int64)})
        outs.append({"output": prob, "stateN": state})
    return outs


_SESSIONS: dict = {}


def _original_session(ctx):
    import onnxruntime as ort

    key = str(ctx.source_path)
    if key not in _SESSIONS:
        _SESSIONS[key] = ort.InferenceSession(key, providers=["CPUExecutionProvider"])
    return _SESSIONS[key]


def _frames(audio: np.ndarray) -> list[np.ndarray]:
    """576-sample frames: 64 samples of context from the previous chunk + 512 new."""
    padded = np.concatenate([np.zeros(CONTEXT, np.float32), audio.astype(np.float32)])
    count = (len(padded) - CONTEXT) // CHUNK
    return [padded[i * CHUNK: i * CHUNK + CONTEXT + CHUNK][None, :].copy() for i in range(count)]


def _clips() -> list[tuple[str, np.ndarray]]:
    missing = [tool for tool in ("sox", "espeak-ng") if shutil.which(tool) is None]
    if missing or not ALSA_SOUNDS.is_dir():
        raise RuntimeError("the VAD's verification audio needs Debian packages alsa-utils, espeak-ng "
                           "and sox: apt-get install -y alsa-utils espeak-ng sox")
    clips = []
    with tempfile.TemporaryDirectory() as tmp:
        for wav in sorted(ALSA_SOUNDS.glob("Front_Center.wav")) + sorted(ALSA_SOUNDS.glob("Noise.wav")):
            clips.append((wav.stem, _load_16k(wav, Path(tmp))))
        for i, sentence in enumerate(SENTENCES):
            wav = Path(tmp) / f"tts{i}.wav"
            subprocess.run(["espeak-ng", "-w", str(wav), sentence], check=True, capture_output=True)
            clips.append((f"tts{i}", _load_16k(wav, Path(tmp))))
    speech = clips[0][1]
    clips.append(("quiet-speech", speech * 0.002))
    rng = np.random.default_rng(0)
    clips.append(("silence", (rng.standard_normal(SAMPLE_RATE) * 1e-4).astype(np.float32)))
    return clips


def _load_16k(wav: Path, tmp: Path) -> np.ndarray:
    """Resample to 16 kHz mono float32 with sox (raw output avoids a wav parser)."""
    raw = tmp / (wav.stem + ".f32")
    subprocess.run(["sox", str(wav), "-r", str(SAMPLE_RATE), "-c", "1", "-e", "floating-point",
                    "-b", "32", "-t", "raw", str(raw)], check=True, capture_output=True)
    return np.fromfile(raw, dtype=np.float32)
