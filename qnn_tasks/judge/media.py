"""Read the media sources of model.yaml `samples:` (images, audio clips, raw bytes) into input tensors.

The one loader behind cpucheck and calibrate (and so simulate, which runs cpucheck's inputs): the
options were validated at spec load (modelspec/specsamples.py), here they are applied. Every file must
stay inside the model folder (symlinks too). Memory is bounded by bytes, not by counts: each
source is first planned from what the files say without decoding them (an image is one sample, a
clip's header gives its windows, a raw file's size its chunks), `limit` picks the samples, their
bytes are checked against judge/bounds.py, and only then are the chosen samples decoded, one file
at a time. A header that cannot be true (an audio rate no recorder makes, more frames than the file
holds) is refused before anything is decoded.

Decoders are maintained libraries: Pillow for images (EXIF orientation applied, 16-bit grey kept),
libsndfile (`soundfile`: PCM, float and WAVE_FORMAT_EXTENSIBLE WAV, FLAC, OGG, AIFF) and soxr for
resampling.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.judge import bounds
from qnn_tasks.modelspec import specport
from qnn_tasks.modelspec.project import GraphSpec, TensorSpec
from qnn_tasks.modelspec.specsamples import KINDS, MAX_SAMPLES

MAX_PIXELS = 40_000_000          # a decompression bomb is refused before it is decoded
MAX_FILE_BYTES = 1 << 30         # a clip or a raw file larger than 1 GiB is not a verification sample
MAX_CLIP_VALUES = 1 << 26        # decoded audio of one clip, every channel, before and after resampling (256 MiB)
AUDIO_RATES = (1000, 768000)     # a header claiming a rate outside this is not a recording


@dataclass
class Planned:
    """One file of a source before decoding: how many samples it gives and what decoding it needs."""
    path: Path
    count: int
    info: Any = None  # the audio header (soundfile.info), or the raw file's size


def load(graph: GraphSpec, notes: dict[str, Any] | None = None,
         upstream: dict[str, list[np.ndarray]] | None = None) -> list[dict[str, np.ndarray]]:
    """One {input: array} per sample: each source's samples zipped in file-name order, `fill` inputs constant.

    `notes` (when given) receives what reading changed or kept, per source, for the stage's record
    (orientation applied, bit depth, decoder, resampler; the samples that are zero-padded audio windows)."""
    where = f"{graph.model_dir / 'model.yaml'}: graphs.{graph.name}.samples"
    specs = {t.name: t for t in graph.inputs}
    read_as = dict(specs)  # what each sample is read as: a raw record under dims is `record`-shaped, fitted later
    plans: dict[str, tuple[str, list[Planned], list[int]]] = {}
    for kind in KINDS:
        if kind not in graph.samples:
            continue
        options = graph.samples[kind]
        if options.get("record"):
            read_as[options["input"]] = replace(specs[options["input"]], shape=tuple(options["record"]))
        spec = read_as[options["input"]]
        files = specport.media_files(graph.model_dir, options["files"], kind)
        if not files:
            raise StageError(f"{where}.{kind}.files: {options['files']} match no file now "
                             f"(fix: add the files to {graph.model_dir} or fix the pattern)")
        planned = []
        for path in files:
            _confine(path, graph.model_dir, f"{where}.{kind}.files")
            planned.append(_guarded(PLANNERS[kind], path, options, spec, f"{where}.{kind}: {path.name}", kind))
        total = sum(p.count for p in planned)
        if total == 0 and kind == "audio":  # every clip too short for one sample: say which key drops them
            raise StageError(no_audio_samples(planned, options, spec, f"{where}.{kind}"))
        if total > MAX_SAMPLES and "limit" not in options:
            raise StageError(f"{where}.{kind}: the files give {total} samples, more than {MAX_SAMPLES} "
                             f"(fix: set graphs.{graph.name}.samples.{kind}.limit, or declare fewer files)")
        plans[spec.name] = (kind, planned, picked(total, options.get("limit")))
    counts = {name: len(chosen) for name, (_, _, chosen) in plans.items()}
    counts.update({name: len(values) for name, values in (upstream or {}).items()})  # `from:` an earlier graph
    if not counts:  # `fill` alone: every input a constant, one sample
        counts = {"fill": 1}
    if len(set(counts.values())) != 1:
        raise StageError(f"{where}: the sources give different numbers of samples {counts} "
                         f"(fix: make each source give the same number, or set limit on each)")
    count = next(iter(counts.values()))
    per_sample = sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in read_as.values())
    bound = bounds.MAX_SAMPLE_BYTES
    if count * per_sample > bound:
        raise StageError(f"{where}: {count} samples of {per_sample} bytes take {bounds.mib(count * per_sample)}, "
                         f"more than the bound of {bounds.mib(bound)} (fix: set limit: {max(1, bound // per_sample)} "
                         "or less on each source)")
    columns = {name: [v.astype(specs[name].dtype, copy=False) for v in values] for name, values in (upstream or {}).items()}
    for name, (kind, planned, chosen) in plans.items():
        options = graph.samples[kind]
        seen: dict[str, Any] = {}
        columns[name] = decode(planned, chosen, lambda p, picks, options=options, kind=kind, seen=seen: _guarded(
            READERS[kind], p.path, options, read_as[name], f"{where}.{kind}: {p.path.name}", kind, p, picks, seen))
        if notes is not None:
            notes[kind] = {"files": len(planned), "samples": len(chosen), **seen}
        if kind != "audio":
            continue
        real = decode(planned, chosen, lambda p, picks, options=options, name=name:  # from the headers alone
                      [(p, n) for n in real_counts(p, options, specs[name], picks)])
        if options.get("lengths"):  # the valid length of each sample, for a front end's length input
            lens = specs[options["lengths"]]
            columns[lens.name] = [np.full(lens.shape, n, dtype=lens.dtype) for _, n in real]
        padded = padded_samples(real, options, specs[name])
        if notes is not None and padded:  # what diagnose and simverify name when a failure lives on them
            notes[kind]["padded"] = padded
    fills = {name: np.full(specs[name].shape, value, dtype=specs[name].dtype)
             for name, value in graph.samples.get("fill", {}).items()}
    return [{t.name: (columns[t.name][i] if t.name in columns else fills[t.name]) for t in graph.inputs}
            for i in range(count)]


def picked(total: int, limit: int | None) -> list[int]:
    """The indices of `limit` samples spread evenly over `total` (every file, window and gain gets a say), in order,
    computed from the count alone: a 1 GiB raw file of 16-byte samples is 67 million samples, and listing every
    index took 2.6 GB to pick 4."""
    if limit is None or total <= limit:
        return list(range(total))
    return [int(i) for i in np.linspace(0, total - 1, limit).round().astype(np.int64)]


def decode(planned: list[Planned], chosen: list[int], read: Callable[[Planned, list[int]], list[np.ndarray]]
           ) -> list[np.ndarray]:
    """The chosen samples (indices over every file's samples in order), reading only the files that hold one."""
    result, first = [], 0
    wanted = np.asarray(chosen, dtype=np.int64)
    for plan in planned:
        picks = [int(i) - first for i in wanted[(wanted >= first) & (wanted < first + plan.count)]]
        if picks:
            got = read(plan, picks)
            if len(got) != len(picks):
                raise StageError(f"{plan.path.name}: gave {len(got)} samples, its header promised {plan.count} "
                                 "(fix: replace or remove the file)")
            result += got
        first += plan.count
    return result


def _guarded(function: Callable, path: Path, options: dict[str, Any], spec: TensorSpec, where: str, kind: str,
             *args: Any) -> Any:
    try:
        return function(path, options, spec, where, *args)
    except StageError:
        raise
    except Exception as err:  # noqa: BLE001 -- a damaged file (any decoder's error): name it, no traceback
        raise StageError(f"{where}: cannot be read as {kind}: {type(err).__name__}: {str(err)[:200]} "
                         f"(fix: replace or remove the file)") from None


def _confine(path: Path, model_dir: Path, where: str) -> None:
    root = Path(model_dir).resolve()
    if not path.resolve().is_relative_to(root):
        raise StageError(f"{where}: {path} leads outside the model folder (a symlink?) "
                         f"(fix: copy the file into {model_dir})")


def _noted(seen: dict[str, Any], key: str, name: str) -> None:
    """A file name under `key` in the record's notes (the first few: a folder of a thousand files stays short)."""
    names = seen.setdefault(key, [])
    if len(names) < 20:
        names.append(name)


# ---------------------------------------------------------------- images

def plan_image(path: Path, options: dict[str, Any], spec: TensorSpec, where: str) -> Planned:
    return Planned(path, 1)


def image(path: Path, options: dict[str, Any], spec: TensorSpec, where: str, plan: Planned | None = None,
          picks: list[int] | None = None, seen: dict[str, Any] | None = None) -> list[np.ndarray]:
    """One image -> one tensor: decoded as a viewer shows it (EXIF orientation applied, 16-bit grey kept),
    colour-converted, brought to H x W, scaled, normalised, laid out."""
    from PIL import Image, ImageOps

    seen = {} if seen is None else seen
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS  # Pillow raises DecompressionBombError beyond twice this
    with Image.open(path) as img:
        if img.width * img.height > MAX_PIXELS:
            raise StageError(f"{where}: {img.width}x{img.height} pixels is more than {MAX_PIXELS} "
                             "(fix: scale the image down)")
        rawmode = img.tile[0].args if img.tile and isinstance(img.tile[0].args, str) else ""
        if img.getexif().get(0x0112, 1) not in (1, None):  # EXIF Orientation: a camera's portrait photo
            _noted(seen, "orientation_applied", path.name)
        img = ImageOps.exif_transpose(img)
        if img.mode in ("I;16", "I;16B", "I;16L", "I"):
            pixels, box = _deep_grey(img, options, where)
            _noted(seen, "16_bit", path.name)
        elif img.mode == "F":
            raise StageError(f"{where}: a floating-point image (mode F): its values have no agreed range "
                             "(fix: save it as an 8- or 16-bit image, or feed the input from .npz samples)")
        else:
            if rawmode.startswith(("RGB;16", "RGBA;16")):  # Pillow reads 16-bit colour as its high byte
                _noted(seen, "16_bit_colour_read_at_8_bits", path.name)
            img = img.convert("L" if options["channels"] == "grey" else "RGB")
            pixels, box = fit(img, options["height"], options["width"], options["resize"], options["pad_value"], where)
    if options["channels"] == "BGR":
        pixels = pixels[..., ::-1]
    if not spec.dtype.startswith("float"):
        if pixels.dtype != np.uint8:  # 16-bit kept as 0..255 floats: an integer input gets them rounded
            pixels = np.clip(np.round(pixels), 0, 255).astype(np.uint8)
            _noted(seen, "16_bit_rounded_to_8_for_an_integer_input", path.name)
        values = pixels
    else:
        values = pixels.astype(np.float32) * np.float32(options["scale"])
        values = (values - np.asarray(options["mean"], np.float32)) / np.asarray(options["std"], np.float32)
        if options.get("pad_normalised") is not None:  # the padding in model units (e.g. 0), not a pixel value
            padded = np.ones(values.shape[:2], bool)
            padded[box[1]:box[3], box[0]:box[2]] = False
            values[padded] = np.float32(options["pad_normalised"])
    if options["layout"] == "NCHW":
        values = np.moveaxis(values, -1, 0)
    return [np.ascontiguousarray(values.reshape(spec.shape)).astype(spec.dtype)]


def _deep_grey(img: Any, options: dict[str, Any], where: str) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """A 16-bit grey image as [H, W, C] float32 on the 8-bit scale (value / 257: 65535 -> 255.0), every level
    kept: resized in Pillow's float mode, grey repeated into 3 channels for an RGB input."""
    from PIL import Image

    deep = np.asarray(img, dtype=np.float64)
    if deep.min() < 0 or deep.max() > 65535:
        raise StageError(f"{where}: a 32-bit integer image with values {deep.min():g}..{deep.max():g} "
                         "(fix: save it as an 8- or 16-bit image)")
    scaled = Image.fromarray((deep / 257.0).astype(np.float32), mode="F")
    pixels, box = fit(scaled, options["height"], options["width"], options["resize"], options["pad_value"], where)
    return (np.repeat(pixels, 3, axis=-1) if options["channels"] != "grey" else pixels), box


def fit(img: Any, height: int, width: int, mode: str, pad_value: int, where: str
        ) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """The image as an [H, W, C] array of the input's size (uint8, or float32 for a 16-bit image) and the box
    (x0, y0, x1, y1) the image fills in it: stretched, letterboxed (aspect kept, centred, padded with `pad_value`,
    as YOLO-style detectors expect), brought to the height with its aspect kept and padded on the right
    (`fit-height`, as OCR recognisers are fed; an image wider than the input is squeezed to its width), or
    required to be that size already."""
    from PIL import Image

    box = (0, 0, width, height)
    if mode == "none":
        if (img.height, img.width) != (height, width):
            raise StageError(f"{where}: is {img.width}x{img.height}, the input wants {width}x{height} "
                             "(fix: resize: stretch, letterbox or fit-height, or resize the file)")
    elif mode == "stretch":
        img = img.resize((width, height), Image.BILINEAR)
    elif mode == "fit-height":
        new = (min(width, max(1, round(img.width * height / img.height))), height)
        box = (0, 0) + new
        img = _padded(img.resize(new, Image.BILINEAR), width, height, pad_value, (0, 0))
    else:
        ratio = min(width / img.width, height / img.height)
        new = (max(1, round(img.width * ratio)), max(1, round(img.height * ratio)))
        at = ((width - new[0]) // 2, (height - new[1]) // 2)
        box = at + (at[0] + new[0], at[1] + new[1])
        img = _padded(img.resize(new, Image.BILINEAR), width, height, pad_value, at)
    pixels = np.asarray(img, dtype=np.float32 if img.mode == "F" else np.uint8)
    return (pixels[..., None] if pixels.ndim == 2 else pixels), box


def _padded(img: Any, width: int, height: int, pad_value: int, at: tuple[int, int]) -> Any:
    """`img` pasted at `at` on a width x height canvas of `pad_value` (every band)."""
    from PIL import Image

    fill = (pad_value,) * len(img.getbands()) if img.mode not in ("L", "F") else pad_value
    canvas = Image.new(img.mode, (width, height), fill)
    canvas.paste(img, at)
    return canvas


# ---------------------------------------------------------------- audio

def plan_audio(path: Path, options: dict[str, Any], spec: TensorSpec, where: str) -> Planned:
    """A clip's samples from its header alone: its frames at the target rate, cut into windows, per gain."""
    import soundfile

    if path.stat().st_size > MAX_FILE_BYTES:
        raise StageError(f"{where}: larger than {MAX_FILE_BYTES >> 20} MiB (fix: cut the clip)")
    try:
        info = soundfile.info(str(path))
    except RuntimeError as err:  # libsndfile's "Format not recognised" and kin
        raise StageError(f"{where}: not an audio file libsndfile reads: {str(err).splitlines()[0][:200]} "
                         "(fix: convert it, e.g. sox in.mp4 out.wav)") from None
    rate, frames, channels = int(info.samplerate), int(info.frames), int(info.channels)
    if not AUDIO_RATES[0] <= rate <= AUDIO_RATES[1]:
        raise StageError(f"{where}: its header claims a rate of {rate} Hz, which no recording has (accepted: "
                         f"{AUDIO_RATES[0]} to {AUDIO_RATES[1]} Hz) (fix: replace the file, or re-encode it)")
    if frames * channels > MAX_CLIP_VALUES or target_length(frames, rate, options) > MAX_CLIP_VALUES:
        raise StageError(f"{where}: {frames} frames x {channels} channel(s) at {rate} Hz is more than "
                         f"{MAX_CLIP_VALUES} values (fix: cut the clip into shorter files)")
    if frames == 0:
        raise StageError(f"{where}: holds no audio (0 frames) (fix: replace or remove the file)")
    length = target_length(frames, rate, options)
    windows = window_count(length, options["frame"], options["hop"], options["pad"], where, options.get("pad_min", 1))
    per_sample = int(np.prod(spec.shape)) // options["frame"]
    return Planned(path, len(options["gain"]) * (windows // per_sample), info)


def target_length(frames: int, rate: int, options: dict[str, Any]) -> int:
    """The clip's length after resampling to `rate` (soxr's: frames x out / in, rounded)."""
    out = options["rate"] or rate
    return frames if out == rate else (2 * frames * out + rate) // (2 * rate)


def window_count(length: int, frame: int, hop: int, pad: bool, where: str, pad_min: int = 1) -> int:
    """Windows of `frame` samples every `hop`: every whole one, and with `pad` a last partial one (zero-filled)
    when samples after the last whole window would otherwise be left out (also a clip shorter than a frame),
    if it holds at least `pad_min` real samples (a tiny trailing window of zeros is dropped)."""
    if length < frame:
        if not pad:
            raise StageError(f"{where}: {length} samples is shorter than one frame of {frame} "
                             "(fix: pad: true, or pad_min: <fewest real samples> to pad short clips, or a longer clip)")
        return int(length >= pad_min)
    whole = (length - frame) // hop + 1
    return whole + int(pad and (whole - 1) * hop + frame < length and length - whole * hop >= max(1, pad_min))


def real_counts(plan: Planned, options: dict[str, Any], spec: TensorSpec, picks: list[int]) -> list[int]:
    """Each picked sample's count of real (not zero-padded) audio samples, from the clip's header alone: the sum
    over its windows (what a length input such as `waveforms_lens` gets)."""
    length = target_length(int(plan.info.frames), int(plan.info.samplerate), options)
    frame, hop = options["frame"], options["hop"]
    per_sample = int(np.prod(spec.shape)) // frame
    per_gain = plan.count // len(options["gain"])
    result = []
    for pick in picks:
        starts = hop * np.arange((pick % per_gain) * per_sample, (pick % per_gain + 1) * per_sample)
        result.append(int(np.clip(length - starts, 0, frame).sum()))
    return result


def no_audio_samples(planned: list[Planned], options: dict[str, Any], spec: TensorSpec, where: str) -> str:
    """Why the clips give no sample, from their headers: `pad_min` drops every window (and the largest pad_min that
    keeps one), or the clips are shorter than one sample's windows."""
    per_sample = int(np.prod(spec.shape)) // options["frame"]

    def samples(pad_min: int) -> int:
        lengths = (target_length(int(p.info.frames), int(p.info.samplerate), options) for p in planned)
        return sum(window_count(n, options["frame"], options["hop"], options["pad"], where, pad_min) // per_sample
                   for n in lengths)

    pad_min = options.get("pad_min", 1)
    if pad_min > 1 and samples(1):
        low, high = 1, pad_min - 1  # samples() falls as pad_min rises: the largest that keeps one
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if samples(middle) else (low, middle - 1)
        return (f"{where}.pad_min: {pad_min} drops every window: no clip has {pad_min} real samples where a window "
                f"would be padded, so no samples were produced (fix: pad_min: {low} or less keeps "
                f"{samples(low) * len(options['gain'])} sample(s), or give longer clips)")
    return (f"{where}: the clips give no sample: one takes {per_sample} window(s) of {options['frame']} every "
            f"{options['hop']}, longer than every clip (fix: give longer clips, or a smaller frame or hop)")


def padded_samples(real: list[tuple[Planned, int]], options: dict[str, Any], spec: TensorSpec) -> list[dict[str, Any]]:
    """The samples that hold padding: index, clip, real audio values of all values, and whether the window is the
    clip's only one (a clip shorter than a frame) rather than its last."""
    values = int(np.prod(spec.shape))
    return [{"sample": i, "file": plan.path.name, "real": n, "values": values,
             "only": plan.count // len(options["gain"]) == 1}
            for i, (plan, n) in enumerate(real) if n < values]


def audio(path: Path, options: dict[str, Any], spec: TensorSpec, where: str, plan: Planned,
          picks: list[int], seen: dict[str, Any] | None = None) -> list[np.ndarray]:
    """The picked samples of one clip: decoded (libsndfile), mono, resampled (soxr), gained, int16-scaled if
    asked, framed; only the picked windows are made."""
    seen = {} if seen is None else seen
    clip, rate = read_audio(path, plan, where)
    seen.setdefault("decoder", "libsndfile (soundfile)")
    if options["rate"] and options["rate"] != rate:
        clip = resample(clip, rate, options["rate"])
        seen.setdefault("resampler", "soxr (HQ)")
    frame, hop = options["frame"], options["hop"]
    per_sample = int(np.prod(spec.shape)) // frame
    per_gain = plan.count // len(options["gain"])
    padded = np.concatenate([clip, np.zeros(frame, np.float32)])  # a partial last window reads zeros
    result = []
    for pick in picks:
        gain, group = options["gain"][pick // per_gain], pick % per_gain
        starts = hop * np.arange(group * per_sample, (group + 1) * per_sample)
        signal = padded[starts[:, None] + np.arange(frame)[None, :]] * np.float32(gain)
        if options["int16_scale"]:
            signal = np.clip(np.round(signal * 32768.0), -32768, 32767)
        result.append(np.ascontiguousarray(signal.reshape(spec.shape)).astype(spec.dtype))
    return result


def read_audio(path: Path, plan: Planned, where: str) -> tuple[np.ndarray, int]:
    """The clip as float32 mono in [-1, 1] (channels averaged) and its rate, holding the header to its word."""
    import soundfile

    data, rate = soundfile.read(str(path), dtype="float32", always_2d=True, frames=plan.info.frames + 1)
    if len(data) != plan.info.frames:
        raise StageError(f"{where}: its header promises {plan.info.frames} frames, the file holds {len(data)} "
                         "(fix: re-encode it, e.g. sox in.wav out.wav)")
    return data.mean(axis=1, dtype=np.float32), int(rate)


def resample(signal: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Band-limited resampling by libsoxr (its HQ quality: a linear-phase low-pass at the lower Nyquist rate, so
    downsampling does not alias); the length is the input's x rate_out / rate_in, rounded, as planned."""
    import soxr

    if rate_in == rate_out or not len(signal):
        return np.asarray(signal, np.float32)
    out = soxr.resample(np.asarray(signal, np.float32), rate_in, rate_out, quality="HQ")
    length = (2 * len(signal) * rate_out + rate_in) // (2 * rate_in)
    return np.concatenate([out, np.zeros(max(0, length - len(out)), np.float32)])[:length].astype(np.float32)


# ---------------------------------------------------------------- raw bytes

def plan_raw(path: Path, options: dict[str, Any], spec: TensorSpec, where: str) -> Planned:
    """A raw file's samples from its size: the bytes after `offset`, in input-sized chunks."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise StageError(f"{where}: larger than {MAX_FILE_BYTES >> 20} MiB (fix: split it)")
    chunk = np.dtype(options["dtype"]).itemsize * int(np.prod(spec.shape))
    body = size - options["offset"]
    if body <= 0 or body % chunk:
        raise StageError(f"{where}: {max(body, 0)} bytes after offset {options['offset']} are not a whole number of "
                         f"{options['dtype']} {list(spec.shape)} samples ({chunk} bytes each) "
                         "(fix: check dtype and offset)")
    return Planned(path, body // chunk, size)


def raw(path: Path, options: dict[str, Any], spec: TensorSpec, where: str, plan: Planned,
        picks: list[int], seen: dict[str, Any] | None = None) -> list[np.ndarray]:
    """The picked input-sized chunks of little-endian values after `offset` header bytes, each read alone."""
    from qnn_tasks.judge.dtypes import cast_to

    dtype = np.dtype(options["dtype"]).newbyteorder("<")
    count = int(np.prod(spec.shape))
    result = []
    with open(path, "rb") as fh:
        for pick in picks:
            fh.seek(options["offset"] + pick * count * dtype.itemsize)
            values = np.fromfile(fh, dtype=dtype, count=count).astype(dtype.newbyteorder("="), copy=False)
            if len(values) != count:
                raise StageError(f"{where}: shorter than its size said (fix: replace the file)")
            result.append(cast_to(values.reshape((1,) + tuple(spec.shape)), spec, where)[0])
    return result


PLANNERS = {"image": plan_image, "audio": plan_audio, "raw": plan_raw}
READERS = {"image": image, "audio": audio, "raw": raw}
