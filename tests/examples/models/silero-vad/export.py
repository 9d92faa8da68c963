"""Silero VAD (package `silero-vad`): real audio inputs for the packaged ONNX.

The package ships `silero_vad_op18_ifless.onnx`, whose top level still branches on the
sample rate with an `If`. The export is the built-in one (model.yaml): it fixes `sr` to 16000
and every shape (batch 1, 576 samples = 64 context + 512 new, state [2,1,128]), `fold-if` keeps
the 16 kHz branch only, and `pow-square` rewrites `Pow(x, 2)` as `Mul(x, x)`: HTP's fp16 Pow
returns -4 when x underflows fp16 (quiet audio), which made the VAD disagree with the CPU on a
third of the frames (docs/rewrites.md: 63% -> 100% of speech decisions). The reference is the built-in
one too: the original ONNX on CPU,
`sr` fed as 16000. What stays here is the audio: real clips, chunked, with the recurrent state.
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
    """The built-in export of the packaged ONNX, as model.yaml declares it: shapes fixed, `sr` fixed to
    16000 (constant_inputs) so `fold-if` keeps the 16 kHz branch, and `pow-square`. Only here to honour
    options.keep_pow, which keeps Pow(x, 2) to reproduce the fp16 hazard (diagnose's test case)."""
    ctx.default_export(skip=["pow-square"] if ctx.options.get("keep_pow", False) else [])


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
