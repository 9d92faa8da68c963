"""model.yaml `samples:` from media: images, audio clips and raw bytes, with a small preprocessing vocabulary.

    samples:
      image: {files: "images/*.png", input: x, resize: letterbox, layout: NCHW, channels: RGB,  # or fit-height
              scale: 0.00392156862745098, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
      audio: {files: "clips/*.wav", input: audio, rate: 16000, hop: 512, int16_scale: false, pad: true,
              pad_min: 1600, lengths: audio_lens}   # pad only windows of >= 1600 real samples; valid length input
      raw:   {files: "tensors/*.bin", input: ids, dtype: int32, offset: 0}   # under dims: record_length: 512
      fill:  {state: 0.0}          # inputs no source feeds: a constant of the declared shape
      from:  embed.y               # a graph inside a pipeline: an earlier graph's CPU outputs (or {x: embed.y})

Validated here at spec load, against the declared inputs, with one line per problem; only YAML
values are read (no numpy, no Pillow). The files are read by judge/media.py inside the cpucheck and
calibrate actions. `files:` alone (.npz/.npy) stays the other form (specport.samples).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks.errors import SpecError
from qnn_tasks.modelspec.specsizes import pad_problem
from qnn_tasks.modelspec.yamlread import as_bool, as_int, as_number

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".aiff", ".aif")  # what libsndfile decodes
KINDS = ("image", "audio", "raw")
COMMON_KEYS = {"files", "input", "limit"}
KIND_KEYS = {"image": COMMON_KEYS | {"resize", "pad_value", "pad_normalised", "layout", "channels", "scale", "mean",
                                     "std"},
             "audio": COMMON_KEYS | {"rate", "frame", "hop", "int16_scale", "gain", "pad", "pad_min", "lengths"},
             "raw": COMMON_KEYS | {"dtype", "offset", "record_length"}}
RESIZE = ("stretch", "letterbox", "fit-height", "none")  # fit-height: height kept, aspect kept, padded right
LAYOUTS = ("NCHW", "NHWC")
CHANNELS = {"RGB": 3, "BGR": 3, "grey": 1}
RAW_DTYPES = ("float32", "float16", "float64", "int32", "int16", "int8", "uint8", "uint16", "int64", "bool")
MAX_SAMPLES = 10000  # per source: a pattern that matches a year of audio must not fill the disk
MAX_WINDOW = 1 << 24  # frame and hop of audio, in samples (17 min at 16 kHz): a larger hop skips whole clips
MAX_GAINS = 16       # copies of each clip: each gain is one more pass over every clip


def suffixes(kind: str) -> tuple[str, ...] | None:
    """The file name endings a folder of this kind stands for (None: every file, for raw bytes)."""
    return {"image": IMAGE_SUFFIXES, "audio": AUDIO_SUFFIXES}.get(kind)


def validate(data: dict[str, Any], path: Path, key: str, inputs: dict[str, tuple[tuple[int, ...], str]],
             patterns_of: Any, size: Any = None) -> dict[str, Any]:
    """The media form of `samples:`, checked against the declared inputs (name -> (shape, dtype)), defaults filled.

    `patterns_of(value, key, kind)` confines and globs a `files:` value (specport), returning the pattern list.
    `size`: the graph's SizeSpec when it is one size of a graph with `dims:` (a raw source then needs its records'
    length along the dim).
    """
    fill = data.get("fill") or {}
    if not isinstance(fill, dict):
        raise SpecError(path, f"{key}.fill", f"expected a mapping of input name to a number, got {fill!r}",
                        "e.g. fill: {state: 0.0}")
    for name, value in fill.items():
        if name not in inputs:
            raise SpecError(path, f"{key}.fill.{name}", "not an input of the graph", f"use one of: {', '.join(inputs)}")
        as_number(value, path, f"{key}.fill.{name}")
        problem = pad_problem(value, inputs[name][1])
        if problem:  # a constant the input turns into Inf, rounds or wraps is not the constant written
            raise SpecError(path, f"{key}.fill.{name}", f"{value!r} {problem}",
                            f"give a value that input '{name}' ({inputs[name][1]}) holds, e.g. fill: {{{name}: 0.0}}")
    sources = {kind: data[kind] for kind in KINDS if kind in data}
    result: dict[str, Any] = {"fill": {str(k): float(v) for k, v in fill.items()}}
    fed: dict[str, str] = {}
    if "from" in data:
        result["from"] = _upstream(data["from"], path, f"{key}.from", inputs, fill)
        fed.update({name: "from" for name in result["from"]})
    for kind, section in sources.items():
        skey = f"{key}.{kind}"
        if not isinstance(section, dict):
            raise SpecError(path, skey, f"expected a mapping, got {type(section).__name__}",
                            f'e.g. {kind}: {{files: "{kind}s/*"}}')
        for k in section:
            if k not in KIND_KEYS[kind]:
                raise SpecError(path, f"{skey}.{k}", "unknown key", f"use one of: {', '.join(sorted(KIND_KEYS[kind]))}")
        if "files" not in section:
            raise SpecError(path, f"{skey}.files", "required key is missing", f'e.g. files: "{kind}s/*"')
        name = section.get("input")
        lengths = section.get("lengths") if kind == "audio" else None
        if name is None:
            free = [n for n in inputs if n not in fill and n not in fed and n != lengths]
            if len(free) != 1:
                raise SpecError(path, f"{skey}.input", f"the graph has inputs {list(inputs)}: which one does this feed?",
                                f"add input: <name> (one of {', '.join(free or inputs)})")
            name = free[0]
        if name not in inputs:
            raise SpecError(path, f"{skey}.input", f"'{name}' is not an input of the graph", f"use one of: {', '.join(inputs)}")
        if name in fed or name in fill:
            raise SpecError(path, f"{skey}.input", f"'{name}' is already fed by {fed.get(name, 'fill')}",
                            "feed each input from one source")
        fed[name] = kind
        if lengths is not None:  # the input that gets each sample's count of real (not padded) audio samples
            if lengths not in inputs or lengths == name or lengths in fed or lengths in fill:
                raise SpecError(path, f"{skey}.lengths", f"'{lengths}' is not another input of the graph that no other "
                                "source feeds", f"name the length input, one of: "
                                f"{', '.join(n for n in inputs if n != name and n not in fed and n not in fill)}")
            fed[str(lengths)] = f"{kind}.lengths"
        shape, dtype = inputs[name]
        options = {"files": patterns_of(section["files"], f"{skey}.files", kind), "input": str(name)}
        if "limit" in section:
            options["limit"] = as_int(section["limit"], path, f"{skey}.limit", 1, MAX_SAMPLES)
        options.update(_CHECKERS[kind](section, path, skey, name, shape, dtype))
        if kind == "raw":
            options.update(_record(section, path, skey, name, shape, size))
        result[kind] = options
    missing = [n for n in inputs if n not in fed and n not in fill]
    if missing:
        raise SpecError(path, key, f"no source feeds input(s) {missing}",
                        f"add input: {missing[0]} to a source, or fill: {{{missing[0]}: 0.0}}")
    return result


def _upstream(value: Any, path: Path, key: str, inputs: dict[str, Any], fill: dict[str, Any]) -> dict[str, str]:
    """`from: <graph>.<output>` (the one input no fill feeds) or `from: {<input>: <graph>.<output>}` -> input ->
    reference; the graph and output are checked once every graph is loaded (modelspec/load.py)."""
    fix = "e.g. from: embed.y (an earlier graph's output), or from: {x: embed.y}"
    if isinstance(value, str):
        free = [n for n in inputs if n not in fill]
        if len(free) != 1:
            raise SpecError(path, key, f"the graph has inputs {list(inputs)}: which one does '{value}' feed?",
                            f"write from: {{{(free or list(inputs))[0]}: {value}}}")
        value = {free[0]: value}
    if not isinstance(value, dict) or not value:
        raise SpecError(path, key, f"expected <graph>.<output> or a mapping of input to it, got {value!r}", fix)
    for name, ref in value.items():
        if name not in inputs:
            raise SpecError(path, f"{key}.{name}", "not an input of the graph", f"use one of: {', '.join(inputs)}")
        if name in fill:
            raise SpecError(path, f"{key}.{name}", f"'{name}' is already fed by fill", "feed each input from one source")
        if not isinstance(ref, str) or "." not in ref.strip(".") :
            raise SpecError(path, f"{key}.{name}", f"{ref!r} is not <graph>.<output>", fix)
    return {str(k): str(v) for k, v in value.items()}


def _image(section: dict, path: Path, key: str, name: str, shape: tuple[int, ...], dtype: str) -> dict[str, Any]:
    layout = _choice(section.get("layout", "NCHW"), LAYOUTS, path, f"{key}.layout")
    channels = _choice(section.get("channels", "RGB"), tuple(CHANNELS), path, f"{key}.channels")
    resize = _choice(section.get("resize", "stretch"), RESIZE, path, f"{key}.resize")
    if len(shape) not in (3, 4) or (len(shape) == 4 and shape[0] != 1):
        raise SpecError(path, f"{key}.input", f"input '{name}' is {list(shape)}: an image input is [1, C, H, W], "
                        "[1, H, W, C] or rank 3 without the batch", "feed this input from an npz or samples() instead")
    chw = shape[-3:] if layout == "NCHW" else (shape[-1], shape[-3], shape[-2])
    if chw[0] != CHANNELS[channels]:
        raise SpecError(path, f"{key}.channels", f"{channels} has {CHANNELS[channels]} channel(s), input '{name}' "
                        f"{list(shape)} has {chw[0]} in layout {layout}",
                        "set channels (RGB, BGR, grey) and layout (NCHW, NHWC) to match the input")
    integer = not dtype.startswith("float")
    scale = as_number(section.get("scale", 1.0 if integer else 1.0 / 255.0), path, f"{key}.scale")
    if scale <= 0:
        raise SpecError(path, f"{key}.scale", f"{scale!r} is not positive", "e.g. scale: 0.00392156862745098 (1/255)")
    mean = _per_channel(section.get("mean", 0.0), chw[0], path, f"{key}.mean", positive=False)
    std = _per_channel(section.get("std", 1.0), chw[0], path, f"{key}.std", positive=True)
    if integer and (scale != 1.0 or any(mean) or any(s != 1.0 for s in std)):
        raise SpecError(path, f"{key}.scale", f"input '{name}' is {dtype}: pixels are fed as they are",
                        "remove scale/mean/std, or declare the input float32")
    return {"resize": resize, "pad_value": as_int(section.get("pad_value", 114), path, f"{key}.pad_value", 0, 255),
            "pad_normalised": _pad_normalised(section, path, key, name, dtype), "layout": layout, "channels": channels, "scale": scale, "mean": mean, "std": std,
            "height": chw[1], "width": chw[2]}


def _pad_normalised(section: dict, path: Path, key: str, name: str, dtype: str) -> float | None:
    """The padding's value in model units (after scale, mean and std: 0.0 is what many recognisers pad with), or
    None when it is `pad_value` in pixels."""
    if "pad_normalised" not in section:
        return None
    if "pad_value" in section:
        raise SpecError(path, f"{key}.pad_normalised", "both pad_value (pixels) and pad_normalised (model units) "
                        "are given", "keep one of them")
    if not dtype.startswith("float"):
        raise SpecError(path, f"{key}.pad_normalised", f"input '{name}' is {dtype}: pixels are fed as they are, "
                        "nothing is normalised", "give the padding in pixels with pad_value")
    value = as_number(section["pad_normalised"], path, f"{key}.pad_normalised")
    problem = pad_problem(value, dtype)
    if problem:  # 1e300 would pad a float32 input with Inf
        raise SpecError(path, f"{key}.pad_normalised", f"{value!r} {problem}",
                        f"give a padding that input '{name}' ({dtype}) holds, e.g. pad_normalised: 0.0")
    return value


def _audio(section: dict, path: Path, key: str, name: str, shape: tuple[int, ...], dtype: str) -> dict[str, Any]:
    size = 1
    for dim in shape:
        size *= dim
    frame = as_int(section.get("frame", size), path, f"{key}.frame", 1, MAX_WINDOW)
    if size % frame:
        raise SpecError(path, f"{key}.frame", f"{frame} samples do not divide input '{name}' {list(shape)} "
                        f"({size} values)", f"use a frame of {size} or a divisor of it")
    gains = section.get("gain", 1.0)
    gains = gains if isinstance(gains, list) and gains else [gains]
    if len(gains) > MAX_GAINS:
        raise SpecError(path, f"{key}.gain", f"{len(gains)} gains, more than {MAX_GAINS}",
                        "keep a few levels, e.g. gain: [1.0, 0.01]")
    rate = section.get("rate")
    pad = as_bool(section.get("pad", True), path, f"{key}.pad")
    pad_min = as_int(section.get("pad_min", 1), path, f"{key}.pad_min", 1, frame)
    if "pad_min" in section and not pad:
        raise SpecError(path, f"{key}.pad_min", "pads windows of at least pad_min real samples, but pad is false",
                        "remove pad: false (pad_min drops the shorter windows), or remove pad_min")
    extra = {"lengths": str(section["lengths"])} if section.get("lengths") is not None else {}
    extra.update({"pad_min": pad_min} if "pad_min" in section else {})  # absent: the keys of older builds stay
    return {**extra, "rate": None if rate is None else as_int(rate, path, f"{key}.rate", 1000, 384000),
            "frame": frame, "hop": as_int(section.get("hop", frame), path, f"{key}.hop", 1, MAX_WINDOW),
            "int16_scale": as_bool(section.get("int16_scale", dtype == "int16"), path, f"{key}.int16_scale"),
            "gain": [as_number(g, path, f"{key}.gain", 0.0, 1.0e6) for g in gains],
            "pad": pad}


def _raw(section: dict, path: Path, key: str, name: str, shape: tuple[int, ...], dtype: str) -> dict[str, Any]:
    return {"dtype": _choice(section.get("dtype", dtype), RAW_DTYPES, path, f"{key}.dtype"),
            "offset": as_int(section.get("offset", 0), path, f"{key}.offset", 0, None)}


def _record(section: dict, path: Path, key: str, name: str, shape: tuple[int, ...], size: Any) -> dict[str, Any]:
    """A raw file of records for an input with a sized dim: each record is `record_length` long along the dim
    (`record`: its shape), fitted to each size as any sample is (padded, or `longer` skipped or truncated). Without
    it each size would cut the file into chunks of its own length: records split in two, pad-only chunks, and
    `longer` never applied."""
    axes = size.axes.get(name) if size is not None and name in size.pad else None
    if axes is None:
        if "record_length" in section:
            raise SpecError(path, f"{key}.record_length", f"input '{name}' has no dim with sizes: each sample is one "
                            f"input-sized chunk {list(shape)}", "remove record_length")
        return {}
    if "record_length" not in section:
        raise SpecError(path, f"{key}.record_length", f"required: input '{name}' has dim '{size.dim}' (sizes "
                        f"{list(size.sizes)}), and without it each size would cut the files into chunks of its own "
                        "length, splitting records", f"add record_length: <positions per record along {size.dim}> "
                        "(records written at that length, padded with the dim's pad value; longer: then applies to "
                        "each size)")
    length = as_int(section["record_length"], path, f"{key}.record_length", 1, None)
    return {"record": [length if i in axes else d for i, d in enumerate(shape)]}


_CHECKERS = {"image": _image, "audio": _audio, "raw": _raw}


def _choice(value: Any, allowed: tuple[str, ...], path: Path, key: str) -> str:
    if value not in allowed:
        raise SpecError(path, key, f"unknown value {value!r}", f"use one of: {', '.join(allowed)}")
    return str(value)


def _per_channel(value: Any, channels: int, path: Path, key: str, positive: bool) -> list[float]:
    values = value if isinstance(value, list) else [value] * channels
    if len(values) != channels:
        raise SpecError(path, key, f"{len(values)} values for {channels} channel(s)",
                        f"give one number, or {channels} (in the model's channel order)")
    numbers = [as_number(v, path, key) for v in values]
    if positive and any(v <= 0 for v in numbers):
        raise SpecError(path, key, f"{values!r} has a value <= 0", "a std divides: give positive numbers")
    return numbers
