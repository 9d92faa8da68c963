"""model.yaml keys for porting a model to the NPU without Python: sources, rewrites, constant inputs, samples.

Validated at spec load with the same one-line errors as modelspec/load.py (file, key, problem, fix), and
like modelspec/load.py without importing onnx/onnxruntime/numpy: the rewrite catalogue and the onnxsim
optimizer names are static lists here (tests compare them with the installed packages).
"""
from __future__ import annotations

import fnmatch
import glob
import os
from pathlib import Path, PurePosixPath
from typing import Any

from qnn_tasks.errors import QnnTasksError, SpecError

GRAPH_SOURCE_KEYS = {"package", "file"}
SAMPLES_KEYS = {"files"}
SAMPLE_SUFFIXES = (".npz", ".npy")
# onnxsim 0.8.1's default optimizer passes (onnxoptimizer's fuse/eliminate passes plus onnxsim's own, and the
# batched MatMul+Add -> Gemm rewrite it names explicitly): the names `simplify.skip_optimizers` may skip.
# tests/test_rewrites.py checks this against the installed onnxsim.
ONNXSIM_OPTIMIZERS = (
    "eliminate_common_subexpression", "eliminate_consecutive_idempotent_ops", "eliminate_deadend",
    "eliminate_duplicate_initializer", "eliminate_identity", "eliminate_if_with_const_cond",
    "eliminate_loop_with_const_trip_count", "eliminate_nop_cast", "eliminate_nop_concat", "eliminate_nop_dropout",
    "eliminate_nop_expand", "eliminate_nop_flatten", "eliminate_nop_monotone_argmax", "eliminate_nop_pad",
    "eliminate_nop_reduce", "eliminate_nop_reshape", "eliminate_nop_softmax", "eliminate_nop_split",
    "eliminate_nop_transpose", "eliminate_nop_with_unit", "eliminate_optional_get_element",
    "eliminate_optional_has_element", "eliminate_reshape_around_elementwise",
    "eliminate_reshape_family_on_constant", "eliminate_sequence_at_construct",
    "eliminate_sequence_length_construct", "eliminate_shape_gather", "eliminate_shape_op",
    "eliminate_slice_after_shape", "eliminate_unused_initializer", "extract_constant_to_initializer",
    "fuse_add_bias_into_conv", "fuse_attention", "fuse_bn_into_conv", "fuse_concat_into_reshape",
    "fuse_consecutive_concats", "fuse_consecutive_log_softmax", "fuse_consecutive_mul", "fuse_consecutive_reduce",
    "fuse_consecutive_reduce_unsqueeze", "fuse_consecutive_reshapes", "fuse_consecutive_slices",
    "fuse_consecutive_squeeze_unsqueeze", "fuse_consecutive_squeezes", "fuse_consecutive_transposes",
    "fuse_consecutive_unsqueezes", "fuse_gelu", "fuse_gqa", "fuse_layer_norm", "fuse_lp_normalization",
    "fuse_matmul_add_bias_into_gemm", "fuse_matmul_add_bias_into_gemm_batched", "fuse_mul_into_conv",
    "fuse_pad_into_conv", "fuse_pad_into_pool",
    "fuse_preceding_mul_into_conv", "fuse_qkv", "fuse_reshape_family", "fuse_rms_norm", "fuse_rope",
    "fuse_split_gather_concat", "fuse_transpose_into_gemm", "nop", "rewrite_arg_reduce_select_last_index",
    "rewrite_bool_where", "rewrite_where",
)


def confined(file: Any, path: Path, key: str, inside: str) -> str:
    """A relative path that stays inside its folder (no absolute path, no `..`); returned as given."""
    if not isinstance(file, str) or not file.strip():
        raise SpecError(path, key, f"expected a relative file path, got {file!r}", f"e.g. {key.rsplit('.', 1)[-1]}: model.onnx")
    parts = PurePosixPath(file.replace("\\", "/"))
    if parts.is_absolute() or Path(file).is_absolute() or ".." in parts.parts:
        raise SpecError(path, key, f"'{file}' leaves {inside}",
                        f"give a path relative to {inside}, without '..' (copy the file into it if needed)")
    return file


def graph_source(model_source: dict[str, Any], data: Any, path: Path, key: str) -> tuple[dict[str, Any], str]:
    """The graph's source (model-level `source:` with the graph's `source:` keys over it) and the key naming its file."""
    if data is None:
        return dict(model_source), "source.file"
    if not isinstance(data, dict):
        raise SpecError(path, key, f"expected a mapping, got {type(data).__name__}", "e.g. source: {file: encoder.onnx}")
    for k in data:
        if k not in GRAPH_SOURCE_KEYS:
            raise SpecError(path, f"{key}.{k}", "unknown key", f"use one of: {', '.join(sorted(GRAPH_SOURCE_KEYS))}")
    merged = {**model_source, **data}
    if "package" in data and "file" not in data:
        merged["file"] = None  # another package: the model-level file is not in it
    return merged, (f"{key}.file" if "file" in data else "source.file")


def check_source_file(source: dict[str, Any], path: Path, file_key: str) -> None:
    if source.get("file") is not None:
        inside = f"package '{source['package']}'" if source.get("package") else "the model folder"
        confined(source["file"], path, file_key, inside)
        if not source.get("package"):
            stays_in_folder(path.parent / source["file"], path.parent, path, file_key)


def stays_in_folder(file: Path, folder: Path, path: Path, key: str) -> None:
    """A file named inside the model folder must be there once symlinks are followed, not merely look it."""
    real = Path(file).resolve()
    if not real.is_relative_to(Path(folder).resolve()):
        raise SpecError(path, key, f"{Path(file).relative_to(folder)} leads through a symlink to {real}, outside "
                        "the model folder", "copy the file into the model folder (paths stay in it)")


def require_packaged_onnx(source: dict[str, Any], path: Path, key: str, file_key: str,
                          graph: dict[str, Any]) -> None:
    """Without export.py the graph is the packaged ONNX itself: it needs an .onnx source file and may not name
    functions of an export.py. Its samples are required by the stages that read them (cpucheck, calibrate:
    `missing_samples`), not here: export and lint run without, so a model they refuse (int8 inside the ONNX) is
    refused before anyone has to find inputs for it."""
    no_code = "there is no export.py"
    calibration = graph.get("calibration") if isinstance(graph.get("calibration"), dict) else {}
    for name, value in (("export", graph.get("export")), ("calibration.function", calibration.get("function"))):
        if value is not None and value not in ("export", "samples"):
            raise SpecError(path, f"{key}.{name}", f"names function '{value}' of an export.py, but {no_code}",
                            "remove the key (the built-in export and the declared samples are used), or add export.py")
    if not source.get("file"):
        raise SpecError(path, file_key, f"{no_code} and no source file to export",
                        "set source.file (or graphs.<graph>.source.file) to the packaged .onnx, "
                        "or add export.py with export(), samples(), reference()")
    if not str(source["file"]).lower().endswith(".onnx"):
        raise SpecError(path, file_key, f"'{source['file']}' is not an .onnx file, and {no_code} to convert it",
                        "point it at an ONNX file, or add export.py whose export() converts it")


def missing_samples(model_dir: Path, key: str) -> str:
    """The one line of a stage that needs verification inputs a YAML-only graph does not declare (`key`: graphs.<g>)."""
    return (f"{model_dir / 'model.yaml'}: {key}.samples: there is no export.py, so verification inputs must be declared "
            '(fix: add samples: {image: {files: "images/*.png"}}, {audio: {files: "clips/*.wav"}}, '
            '{raw: {files: "tensors/*.bin"}}, {fill: {<input>: 0.0}}, {from: <graph>.<output>} (a graph inside a '
            'pipeline) or {files: "samples/*.npz"}, or add export.py with samples())')


def rewrites(data: Any, path: Path, key: str) -> dict[str, dict[str, Any]]:
    from qnn_tasks import rewrites as rewrite_catalogue  # only when YAML is parsed (not with the spec cache warm)

    try:
        return rewrite_catalogue.normalize(data)
    except rewrite_catalogue.OptionError as err:  # an option's own fix, not the list of rewrite names
        raise SpecError(path, key, str(err), err.fix) from None
    except ValueError as err:
        raise SpecError(path, key, str(err),
                        f"use names from: {', '.join(rewrite_catalogue.NAMES)} "
                        f"(e.g. {rewrite_catalogue.example()})") from None


def constant_inputs(data: Any, path: Path, key: str, inputs: set[str]) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(path, key, f"expected a mapping of input name to value, got {type(data).__name__}",
                        "e.g. constant_inputs: {sr: 16000}")
    for name, value in data.items():
        if name in inputs:
            raise SpecError(path, f"{key}.{name}", "is also declared under inputs",
                            "an input is either fed at run time (inputs) or fixed (constant_inputs), not both")
        if not _number_or_list(value):
            raise SpecError(path, f"{key}.{name}", f"expected a number or a list of numbers, got {value!r}",
                            "e.g. sr: 16000")
    return dict(data)


def _number_or_list(value: Any) -> bool:
    if isinstance(value, list):
        return bool(value) and all(_number_or_list(v) for v in value)
    return isinstance(value, (int, float, bool))


def samples(data: Any, path: Path, key: str, model_dir: Path,
            inputs: dict[str, tuple[tuple[int, ...], str]] | None = None, size: Any = None) -> dict[str, Any] | None:
    """`samples: {files: PATTERN or [PATTERNS]}`: .npz/.npy files (or folders of them) in the model folder;
    or media sources (`image:`, `audio:`, `raw:`, `fill:`; modelspec/specsamples.py) checked against the declared inputs
    (`size`: the graph's SizeSpec, for one size of a graph with `dims:`)."""
    if data is None:
        return None
    fix = 'e.g. samples: {files: "samples/*.npz"} or samples: {image: {files: "images/*.png"}} (paths relative to the model folder)'
    if not isinstance(data, dict):
        raise SpecError(path, key, f"expected a mapping, got {type(data).__name__}", fix)
    from qnn_tasks.modelspec import specsamples

    for k in data:
        if k not in SAMPLES_KEYS and k not in specsamples.KINDS and k not in ("fill", "from"):
            raise SpecError(path, f"{key}.{k}", "unknown key", fix)
    if "files" not in data:
        if not any(k in data for k in (*specsamples.KINDS, "fill", "from")):  # fill alone: every input a constant
            raise SpecError(path, f"{key}.files", "required key is missing", fix)
        return specsamples.validate(data, path, key, inputs or {},
                                    lambda value, k, kind: _patterns(value, path, k, model_dir, kind), size)
    if len(data) > 1:
        raise SpecError(path, f"{key}.{min(set(data) - {'files'})}", "files (.npz/.npy) already give every input",
                        "use either files: or media sources (image, audio, raw, fill), not both")
    return {"files": _patterns(data["files"], path, f"{key}.files", model_dir, None)}


def _patterns(value: Any, path: Path, key: str, model_dir: Path, kind: str | None) -> list[str]:
    """A `files:` value as a list of confined patterns, each matching at least one file of its kind."""
    fix = 'e.g. samples: {files: "samples/*.npz"} (paths relative to the model folder)'
    patterns = value if isinstance(value, list) else [value]
    if not patterns:
        raise SpecError(path, key, "empty list", fix)
    for pattern in patterns:
        confined(pattern, path, key, "the model folder")
        try:
            found = media_files(model_dir, [pattern], kind)
        except TooManyFiles as err:
            raise SpecError(path, key, f"'{pattern}' {err}", "name the sample files more narrowly (a folder of "
                            "them, or *.png in it), not the whole tree") from None
        if not found:
            what = "file" if kind == "raw" else (f"{kind} file ({', '.join(_suffixes(kind))})" if kind
                                                 else ".npz/.npy file")
            raise SpecError(path, key, f"'{pattern}' matches no {what} in {model_dir}",
                            "add the sample files there or fix the pattern")
        for file in found:
            stays_in_folder(file, model_dir, path, key)
    return list(patterns)


def _suffixes(kind: str | None) -> tuple[str, ...] | None:
    if kind is None:
        return SAMPLE_SUFFIXES
    from qnn_tasks.modelspec.specsamples import suffixes

    return suffixes(kind)


def sample_files(model_dir: Path, patterns: list[str]) -> list[Path]:
    """Files the patterns name, sorted, each once: a folder stands for the .npz/.npy files directly in it."""
    return media_files(model_dir, patterns, None)


def declared_files(model_dir: Path, samples: dict[str, Any] | None) -> list[Path]:
    """Every file a validated `samples:` section reads (npz files, or each media source's files)."""
    if not samples:
        return []
    if "files" in samples:
        return sample_files(model_dir, samples["files"])
    from qnn_tasks.modelspec.specsamples import KINDS

    return [f for kind in KINDS if kind in samples for f in media_files(model_dir, samples[kind]["files"], kind)]


def media_files(model_dir: Path, patterns: list[str], kind: str | None) -> list[Path]:
    """Files the patterns name, sorted, each once: a folder stands for the files of the kind directly in it
    (npz/npy for kind None, images, WAVs; any file for raw bytes). Bounded (`TooManyFiles`): at most
    MAX_WALKED folder entries are looked at, and `**` never enters a symlinked folder (one pointing back into the
    model folder would be an endless walk)."""
    wanted = _suffixes(kind)
    found: dict[str, Path] = {}
    budget = [MAX_WALKED]
    for pattern in patterns:
        for match_path in sorted(_glob(Path(model_dir), pattern, budget)):
            candidates = sorted(_entries(match_path, budget)) if match_path.is_dir() else [match_path]
            for candidate in candidates:
                if candidate.is_file() and (wanted is None or candidate.suffix.lower() in wanted):
                    found.setdefault(str(candidate), candidate)
    return list(found.values())


MAX_WALKED = 200_000  # folder entries one `files:` value may make the loader look at (each is a stat)


class TooManyFiles(QnnTasksError):
    """A `files:` pattern walks more folder entries than MAX_WALKED."""


def _entries(folder: Path, budget: list[int]) -> list[Path]:
    try:
        with os.scandir(folder) as found:
            entries = [Path(entry.path) for entry in found]
    except OSError:  # not a folder, unreadable: matches nothing (as glob)
        return []
    budget[0] -= len(entries)
    if budget[0] < 0:
        raise TooManyFiles(f"walks more than {MAX_WALKED} files and folders")
    return entries


def _glob(root: Path, pattern: str, budget: list[int]) -> set[Path]:
    """glob.glob(root / pattern, recursive=True) without following symlinked folders on `**` (as Python 3.13's
    pathlib does by default): hidden names match only a pattern part that starts with a dot."""
    parts = [part for part in PurePosixPath(pattern.replace("\\", "/")).parts if part not in ("", ".")]
    found: set[Path] = set()
    todo = [(root, 0)]
    seen = set()
    while todo:
        folder, i = todo.pop()
        if (folder, i) in seen:
            continue
        seen.add((folder, i))
        if i == len(parts):
            found.add(folder)
            continue
        part = parts[i]
        if part == "**":
            todo.append((folder, i + 1))  # no folder at all
            todo += [(entry, i) for entry in _entries(folder, budget)
                     if not entry.name.startswith(".") and entry.is_dir() and not entry.is_symlink()]
        elif not glob.has_magic(part):
            if os.path.lexists(folder / part):
                todo.append((folder / part, i + 1))
        else:
            todo += [(entry, i + 1) for entry in _entries(folder, budget) if fnmatch.fnmatchcase(entry.name, part)
                     and (part.startswith(".") or not entry.name.startswith("."))]
    return found


def skip_optimizers(simplify: dict[str, Any], path: Path, key: str) -> None:
    skipped = simplify.get("skip_optimizers", [])
    if not isinstance(skipped, list):
        raise SpecError(path, key, f"expected a list of onnxsim optimizer names, got {skipped!r}",
                        "e.g. skip_optimizers: [fuse_preceding_mul_into_conv]")
    for name in skipped:
        if name not in ONNXSIM_OPTIMIZERS:
            import difflib

            close = difflib.get_close_matches(str(name), ONNXSIM_OPTIMIZERS, n=1)
            hint = f"did you mean {close[0]}?" if close else f"use one of: {', '.join(ONNXSIM_OPTIMIZERS)}"
            raise SpecError(path, key, f"unknown onnxsim optimizer '{name}'", hint)


def onnx_name(value: Any, path: Path, key: str) -> str | None:
    """`onnx_name:` of a declared tensor: its name in the source ONNX (the declared name is the project's)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 256:
        raise SpecError(path, key, f"expected the tensor's name in the ONNX, got {value!r}", "e.g. onnx_name: x.1")
    return value


def unique_onnx_names(tensors: list, path: Path, key: str) -> None:
    """Two declared tensors may not stand for one ONNX tensor."""
    seen: dict[str, str] = {}
    for tensor in tensors:
        source = tensor.onnx_name or tensor.name
        if source in seen:
            raise SpecError(path, f"{key}.{tensor.name}", f"stands for ONNX tensor '{source}', as {key}.{seen[source]} does",
                            "give each ONNX tensor one entry (onnx_name: names the ONNX's tensor)")
        seen[source] = tensor.name
