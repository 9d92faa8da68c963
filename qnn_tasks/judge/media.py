"""Read the media sources of model.yaml `samples:` (images, WAV clips, raw bytes) into input tensors.

The one loader behind cpucheck and calibrate (and so simulate, which runs cpucheck's inputs): the
options were validated at spec load (spec/samples.py), here they are applied. Every file must
stay inside the model folder (symlinks too), and every expansion is bounded: image pixels, clip
bytes, samples per source.
"""
from __future__ import annotations

import wave
from math import gcd
from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.spec import porting as specport
from qnn_tasks.spec.project import GraphSpec, TensorSpec
from qnn_tasks.spec.samples import KINDS, MAX_SAMPLES

MAX_PIXELS = 40_000_000          # a decompression bomb is refused before it is decoded
MAX_FILE_BYTES = 1 << 30         # a clip or a raw file larger than 1 GiB is not a verification sample
MAX_FRAME_VALUES = 1 << 26       # framed audio of one clip (256 MiB of float32)


def load(graph: GraphSpec) -> list[dict[str, np.ndarray]]:
    """One {input: array} per sample: each source's samples zipped in file-name order, `fill` inputs constant."""
    where = f"{graph.model_dir / 'model.yaml'}: graphs.{graph.name}.samples"
    specs = {t.name: t for t in graph.inputs}
    columns: dict[str, list[np.ndarray]] = {}
    for kind in KINDS:
        if kind not in graph.samples:
            continue
        options = graph.samples[kind]
        spec = specs[options["input"]]
        files = specport.media_files(graph.model_dir, options["files"], kind)
        if not files:
            raise StageError(f"{where}.{kind}.files: {options['files']} match no file now "
                             f"(fix: add the files to {graph.model_dir} or fix the pattern)")
        values: list[np.ndarray] = []
        for path in files:
            _confine(path, graph.model_dir, f"{where}.{kind}.files")
            try:
                values += READERS[kind](path, options, spec, f"{where}.{kind}: {path.name}")
            except StageError:
                raise
            except Exception as err:  # noqa: BLE001 -- a damaged file (any decoder's error): name it, no traceback
                raise StageError(f"{where}.{kind}: {path.name}: cannot be read as {kind}: {type(err).__name__}: {err} "
                                 f"(fix: replace or remove the file)") from None
            if len(values) > MAX_SAMPLES:
                if "limit" not in options:
                    raise StageError(f"{where}.{kind}: the files give more than {MAX_SAMPLES} samples "
                                     f"(fix: set graphs.{graph.name}.samples.{kind}.limit, or declare fewer files)")
                break
        columns[spec.name] = spread(values[:MAX_SAMPLES], options.get("limit"))
    counts = {name: len(v) for name, v in columns.items()}
    if len(set(counts.values())) != 1:
        raise StageError(f"{where}: the sources give different numbers of samples {counts} "
                         f"(fix: make each source give the same number, or set limit on each)")
    count = next(iter(counts.values()))
    fills = {name: np.full(specs[name].shape, value, dtype=specs[name].dtype)
             for name, value in graph.samples.get("fill", {}).items()}
    return [{t.name: (columns[t.name][i] if t.name in columns else fills[t.name]) for t in graph.inputs}
            for i in range(count)]


def spread(values: list, limit: int | None) -> list:
    """`limit` samples spread evenly over all (every file, window and gain gets a say), in order."""
    if limit is None or len(values) <= limit:
        return values
    return [values[i] for i in np.linspace(0, len(values) - 1, limit).round().astype(int)]


def _confine(path: Path, model_dir: Path, where: str) -> None:
    root = Path(model_dir).resolve()
    if not path.resolve().is_relative_to(root):
        raise StageError(f"{where}: {path} leads outside the model folder (a symlink?) "
                         f"(fix: copy the file into {model_dir})")


# ---------------------------------------------------------------- images

def image(path: Path, options: dict[str, Any], spec: TensorSpec, where: str) -> list[np.ndarray]:
    """One image -> one tensor: decoded, colour-converted, brought to H x W, scaled, normalised, laid out."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS  # Pillow raises DecompressionBombError beyond twice this
    with Image.open(path) as img:
        if img.width * img.height > MAX_PIXELS:
            raise StageError(f"{where}: {img.width}x{img.height} pixels is more than {MAX_PIXELS} "
                             "(fix: scale the image down)")
        img = img.convert("L" if options["channels"] == "grey" else "RGB")
        pixels = fit(img, options["height"], options["width"], options["resize"], options["pad_value"], where)
    if options["channels"] == "BGR":
        pixels = pixels[..., ::-1]
    if not spec.dtype.startswith("float"):
        values = pixels
    else:
        values = pixels.astype(np.float32) * np.float32(options["scale"])
        values = (values - np.asarray(options["mean"], np.float32)) / np.asarray(options["std"], np.float32)
    if options["layout"] == "NCHW":
        values = np.moveaxis(values, -1, 0)
    return [np.ascontiguousarray(values.reshape(spec.shape)).astype(spec.dtype)]


def fit(img: Any, height: int, width: int, mode: str, pad_value: int, where: str) -> np.ndarray:
    """The image as an [H, W, C] uint8 array of the input's size: stretched, letterboxed (aspect kept, centred,
    padded with `pad_value`, as YOLO-style detectors expect) or required to be that size already."""
    from PIL import Image

    if mode == "none":
        if (img.height, img.width) != (height, width):
            raise StageError(f"{where}: is {img.width}x{img.height}, the input wants {width}x{height} "
                             "(fix: resize: stretch or resize: letterbox, or resize the file)")
    elif mode == "stretch":
        img = img.resize((width, height), Image.BILINEAR)
    else:
        ratio = min(width / img.width, height / img.height)
        new = (max(1, round(img.width * ratio)), max(1, round(img.height * ratio)))
        canvas = Image.new(img.mode, (width, height), (pad_value,) * len(img.getbands()) if img.mode != "L" else pad_value)
        canvas.paste(img.resize(new, Image.BILINEAR), ((width - new[0]) // 2, (height - new[1]) // 2))
        img = canvas
    pixels = np.asarray(img, dtype=np.uint8)
    return pixels[..., None] if pixels.ndim == 2 else pixels


# ---------------------------------------------------------------- audio

def audio(path: Path, options: dict[str, Any], spec: TensorSpec, where: str) -> list[np.ndarray]:
    """One WAV -> windows of the input's size: mono, resampled, gained, int16-scaled if asked, framed."""
    clip, rate = read_wav(path, where)
    if options["rate"] and options["rate"] != rate:
        clip = resample(clip, rate, options["rate"])
    size = int(np.prod(spec.shape))
    frame, hop = options["frame"], options["hop"]
    per_sample = size // frame
    result = []
    for gain in options["gain"]:
        signal = clip * np.float32(gain)
        if options["int16_scale"]:
            signal = np.clip(np.round(signal * 32768.0), -32768, 32767)
        frames = frames_of(signal, frame, hop, options["pad"], where)
        for start in range(0, len(frames) - per_sample + 1, per_sample):
            result.append(np.ascontiguousarray(frames[start:start + per_sample].reshape(spec.shape)).astype(spec.dtype))
    return result


def read_wav(path: Path, where: str) -> tuple[np.ndarray, int]:
    """PCM WAV (8/16/24/32-bit) as float32 mono in [-1, 1) and its sample rate."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise StageError(f"{where}: larger than {MAX_FILE_BYTES >> 20} MiB (fix: cut the clip)")
    try:
        with wave.open(str(path), "rb") as wav:
            width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
            data = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as err:
        raise StageError(f"{where}: not a PCM WAV file: {err} "
                         "(fix: convert it, e.g. sox in.wav -e signed-integer -b 16 out.wav)") from None
    if width == 1:
        values = (np.frombuffer(data, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 3:
        raw = np.frombuffer(data, np.uint8).reshape(-1, 3).astype(np.int32)
        values = ((raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)) << 8 >> 8).astype(np.float32) / float(1 << 23)
    else:
        values = np.frombuffer(data, {2: "<i2", 4: "<i4"}[width]).astype(np.float32) / float(1 << (8 * width - 1))
    frames = len(values) // channels
    return values[: frames * channels].reshape(frames, channels).mean(axis=1).astype(np.float32), rate


def resample(signal: np.ndarray, rate_in: int, rate_out: int, half_width: int = 16) -> np.ndarray:
    """Band-limited resampling by windowed-sinc interpolation (a Kaiser window, 16 zero crossings each side).

    Every output sample is a weighted sum of the input samples around its position, with the low-pass
    cutoff at the lower of the two Nyquist rates (so downsampling does not alias). numpy only, deterministic.
    """
    if rate_in == rate_out or not len(signal):
        return signal.astype(np.float32)
    step = gcd(rate_in, rate_out)
    up, down = rate_out // step, rate_in // step
    cutoff = min(1.0, up / down)
    count = (len(signal) * up + down - 1) // down
    x = np.asarray(signal, np.float64)
    out = np.empty(count, np.float64)
    reach = int(np.ceil(half_width / cutoff))  # input samples each side within the window
    offsets = np.arange(-reach, reach + 1)
    beta = 8.6  # Kaiser window: ~ -80 dB side lobes
    for start in range(0, count, 8192):  # bounded memory: blocks of output samples
        t = np.arange(start, min(count, start + 8192)) * (down / up)
        taps = np.floor(t).astype(np.int64)[:, None] + offsets[None, :]
        distance = t[:, None] - taps
        inside = np.clip(1.0 - (distance / (reach + 1)) ** 2, 0.0, None)
        weights = cutoff * np.sinc(cutoff * distance) * np.i0(beta * np.sqrt(inside)) / np.i0(beta)
        valid = (taps >= 0) & (taps < len(x))
        out[start:start + len(t)] = (np.where(valid, x[np.clip(taps, 0, len(x) - 1)], 0.0) * weights).sum(axis=1)
    return out.astype(np.float32)


def frames_of(signal: np.ndarray, frame: int, hop: int, pad: bool, where: str) -> np.ndarray:
    """[count, frame] windows every `hop` samples; `pad` zero-fills a short clip or the last partial window."""
    if len(signal) < frame or (pad and (len(signal) - frame) % hop):
        if not pad:
            raise StageError(f"{where}: {len(signal)} samples is shorter than one frame of {frame} "
                             "(fix: pad: true, or a longer clip)")
        extra = frame - len(signal) if len(signal) < frame else hop - (len(signal) - frame) % hop
        signal = np.concatenate([signal, np.zeros(extra, signal.dtype)])
    count = (len(signal) - frame) // hop + 1
    if count * frame > MAX_FRAME_VALUES:
        raise StageError(f"{where}: {count} frames of {frame} samples is more than {MAX_FRAME_VALUES} values "
                         "(fix: a larger hop or a shorter clip)")
    index = np.arange(frame)[None, :] + hop * np.arange(count)[:, None]
    return signal[index]


# ---------------------------------------------------------------- raw bytes

def raw(path: Path, options: dict[str, Any], spec: TensorSpec, where: str) -> list[np.ndarray]:
    """A file of little-endian values after `offset` header bytes: one sample per input-sized chunk."""
    from qnn_tasks.judge.dtypes import cast_to

    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise StageError(f"{where}: larger than {MAX_FILE_BYTES >> 20} MiB (fix: split it)")
    dtype = np.dtype(options["dtype"]).newbyteorder("<")
    count = int(np.prod(spec.shape))
    body = size - options["offset"]
    if body <= 0 or body % (dtype.itemsize * count):
        raise StageError(f"{where}: {max(body, 0)} bytes after offset {options['offset']} are not a whole number of "
                         f"{options['dtype']} {list(spec.shape)} samples ({dtype.itemsize * count} bytes each) "
                         "(fix: check dtype and offset)")
    values = np.fromfile(path, dtype=dtype, offset=options["offset"]).astype(dtype.newbyteorder("="))
    stacked = cast_to(values.reshape((-1,) + tuple(spec.shape)), spec, where)
    return list(stacked)


READERS = {"image": image, "audio": audio, "raw": raw}
