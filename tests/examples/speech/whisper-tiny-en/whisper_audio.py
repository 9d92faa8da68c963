"""Whisper's input features in numpy, and real speech clips made with espeak-ng and sox.

Features follow openai-whisper: the audio is padded (or cut) to 30 s first, then a 400-point
periodic-Hann STFT with hop 160 (centred, reflect padding; the last frame dropped), power
spectrum, 80 Slaney mel filters, log10 floored at 1e-10, clamped to 8 below the maximum,
scaled as (x + 4) / 4. Padding before the log-mel matters: the clamp and the STFT's edge
frames see the silence, so every path (CPU, NPU, CTranslate2) must get the same features.
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 80
WINDOW_SECONDS = 30
N_SAMPLES = SAMPLE_RATE * WINDOW_SECONDS  # 480000 samples -> 3000 frames


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, np.float64)
    linear = hz / (200.0 / 3)
    log_part = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log_part, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, np.float64)
    return np.where(mel >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0)), mel * (200.0 / 3))


@lru_cache(maxsize=None)
def mel_filters(n_mels: int = N_MELS) -> np.ndarray:
    """[n_mels, N_FFT // 2 + 1] triangular filters, area-normalised (Slaney), 0 Hz to Nyquist."""
    fft_hz = np.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(SAMPLE_RATE / 2), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def log_mel(audio: np.ndarray) -> np.ndarray:
    """[1, 80, 3000] float32 features of a 16 kHz mono clip (padded or cut to 30 s first)."""
    audio = np.asarray(audio, np.float64).ravel()[:N_SAMPLES]
    audio = np.pad(audio, (0, N_SAMPLES - len(audio)))
    padded = np.pad(audio, N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic Hann
    power = np.abs(np.fft.rfft(frames * window, axis=1)[:-1]) ** 2  # the last frame is dropped, as whisper does
    mel = mel_filters() @ power.T
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)[None]


def speak(sentences: list[str], voices: list[str], words_per_minute: int = 175) -> list[np.ndarray]:
    """Each sentence spoken by espeak-ng (voices taken in turn), as 16 kHz mono float32 (sox resamples)."""
    missing = [tool for tool in ("espeak-ng", "sox") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(f"the Whisper example's speech clips need {' and '.join(missing)}: "
                           f"apt-get install -y espeak-ng sox")
    clips = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, sentence in enumerate(sentences):
            wav, raw = Path(tmp) / f"{i}.wav", Path(tmp) / f"{i}.f32"
            subprocess.run(["espeak-ng", "-v", voices[i % len(voices)], "-s", str(words_per_minute), "-w", str(wav),
                            sentence],
                           check=True, capture_output=True)
            subprocess.run(["sox", str(wav), "-r", str(SAMPLE_RATE), "-c", "1", "-e", "floating-point", "-b", "32",
                            "-t", "raw", str(raw)], check=True, capture_output=True)
            clips.append(np.fromfile(raw, dtype=np.float32))
    return clips
