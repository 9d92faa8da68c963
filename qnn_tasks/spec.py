"""Typed, validated specs loaded from YAML: socs/socs.yaml, models/*/model.yaml, toolchain/*.yaml.

Only YAML and package metadata are read here (no onnx/onnxruntime/torch), so `doit list`
stays instant. Every error names the file and the key, and says how to fix it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import specport
from .errors import SpecError
from .specverify import (PRECISIONS, THRESHOLD_RANGES,
                         _calibration, _check_lint, _verify_section)
from .specyaml import (_bool, _check_keys, _int, _mapping, _number, _package_version, _require, _section,
                       load_yaml)


IO_DTYPES = ("float32", "float16", "int32", "uint8", "int8", "uint16", "int16", "bool")
SOC_KEYS = {"soc_id", "dsp_arch", "vtcm_mb", "fp16", "note", "alias_of"}
MODEL_KEYS = {"licence", "description", "source", "graphs", "pipeline", "loop"}
SOURCE_KEYS = {"package", "file", "url"}
GRAPH_KEYS = {"inputs", "outputs", "precision", "socs", "export", "options", "simplify", "calibration",
              "cpucheck", "lint", "verify", "allow_cpu_fallback", "source", "rewrites", "constant_inputs", "samples"}
TENSOR_KEYS = {"shape", "dtype"}
SIMPLIFY_KEYS = {"skip", "skip_optimizers"}
TOLERANCE_KEYS = {"max_abs", "min_cosine"}
LINT_KEYS = {"allow", "max_fp16_params"}
PROFILE_KEYS = {"kind", "options", "settings", "packages", "cache", "upgrade"}
UPGRADE_DEFAULTS = {"gate": False, "cosine_margin": 1.0e-4, "size_growth": 0.05}


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
            from .installed import location

            base = location(self.package)
            return base / self.file if base else None
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
    source: Source | None = None          # the model's source with the graph's `source:` keys over it
    source_key: str = "source.file"       # the model.yaml key that names its file (for messages)
    rewrites: dict[str, dict[str, Any]] = field(default_factory=dict)  # rewrite name -> options
    constant_inputs: dict[str, Any] = field(default_factory=dict)      # packaged ONNX inputs fixed to a value
    samples: dict[str, Any] | None = None  # declared sample files: {"files": [patterns]}
    has_code: bool = True                  # models/<model>/export.py exists

    @property
    def precision(self) -> str:
        return self.precisions[0]

    @property
    def model_code(self) -> Path:
        return self.model_dir / "export.py"

    def sample_files(self) -> list[Path]:
        """The declared sample files, sorted (globbed now: files added later count)."""
        return specport.sample_files(self.model_dir, self.samples["files"]) if self.samples else []

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
    pipeline: Any = None  # specpipeline.PipelineSpec: the graphs chained, verified end to end
    loop: Any = None      # specloop.LoopSpec: one graph run repeatedly, outputs fed back


@dataclass(frozen=True)
class ToolchainProfile:
    name: str
    file: Path
    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    packages: tuple[str, ...] = ()  # a pinned environment of its own (envs.py); empty: this interpreter
    cache: str | None = None        # shared artifact cache (folder or fsspec URL); $QNN_CACHE wins
    upgrade: dict[str, Any] = field(default_factory=dict)  # comparison with the run's first toolchain


@dataclass(frozen=True)
class Project:
    root: Path
    socs: dict[str, Soc]
    models: tuple[ModelSpec, ...]
    toolchain: ToolchainProfile                 # the first (primary) toolchain of this run
    toolchains: tuple[ToolchainProfile, ...] = ()  # every toolchain of this run, primary first

    def graphs(self) -> list[GraphSpec]:
        return [g for m in self.models for g in m.graphs]


# ---------------------------------------------------------------- loading

def load_socs(path: Path) -> dict[str, Soc]:
    data = _mapping(load_yaml(path), path, "")
    table = _mapping(data.get("socs"), path, "socs")
    _check_keys(data, {"socs"}, path, "")
    socs: dict[str, Soc] = {}
    chips: dict[tuple[int, str], str] = {}  # (soc_id, dsp_arch) -> first row naming it
    for name, row in table.items():
        key = f"socs.{name}"
        row = _mapping(row, path, key)
        _check_keys(row, SOC_KEYS, path, key)
        _require(row, ("soc_id", "dsp_arch", "vtcm_mb", "fp16"), path, key)
        soc = Soc(name=str(name), soc_id=_int(row["soc_id"], path, f"{key}.soc_id", 1, 1023),
                  dsp_arch=str(row["dsp_arch"]), vtcm_mb=_int(row["vtcm_mb"], path, f"{key}.vtcm_mb", 1, 64),
                  fp16=_bool(row["fp16"], path, f"{key}.fp16"), note=str(row.get("note", "")))
        if not re.fullmatch(r"v\d+", soc.dsp_arch):
            raise SpecError(path, f"{key}.dsp_arch", f"'{row['dsp_arch']}' is not a Hexagon arch", "write e.g. v75")
        alias = row.get("alias_of")
        same = chips.get((soc.soc_id, soc.dsp_arch))
        if alias is not None:
            if alias not in socs:
                raise SpecError(path, f"{key}.alias_of", f"'{alias}' is not a row above this one",
                                "name the row this chip shares soc_id and dsp_arch with")
            if (socs[alias].soc_id, socs[alias].dsp_arch) != (soc.soc_id, soc.dsp_arch):
                raise SpecError(path, f"{key}.alias_of", f"{alias} has soc_id {socs[alias].soc_id}/{socs[alias].dsp_arch}, "
                                f"this row {soc.soc_id}/{soc.dsp_arch}", "an alias repeats its row's soc_id and dsp_arch")
        elif same is not None:
            raise SpecError(path, f"{key}.soc_id", f"soc_id {soc.soc_id} with {soc.dsp_arch} is already row {same}: "
                            "the same binary would be built twice under two names",
                            f"fix the soc_id, or add alias_of: {same} if both names are really one chip")
        chips.setdefault((soc.soc_id, soc.dsp_arch), soc.name)
        socs[soc.name] = soc
    return socs


def load_model(model_dir: Path, socs: dict[str, Soc]) -> ModelSpec:
    path = model_dir / "model.yaml"
    data = _mapping(load_yaml(path), path, "")
    _check_keys(data, MODEL_KEYS, path, "")
    _require(data, ("licence", "source", "graphs"), path, "")
    source_data = _mapping(data["source"], path, "source")
    _check_keys(source_data, SOURCE_KEYS, path, "source")
    source = Source(package=source_data.get("package"), file=source_data.get("file"), url=source_data.get("url"))
    specport.check_source_file(source_data, path, "source.file")
    if source.package and _package_version(source.package) is None:
        raise SpecError(path, "source.package", f"package '{source.package}' is not installed",
                        f"pip install {source.package}")
    graphs_data = _mapping(data["graphs"], path, "graphs")
    if not graphs_data:
        raise SpecError(path, "graphs", "no graphs declared", "declare at least one graph")
    graphs = tuple(_load_graph(str(name), g, model_dir, path, socs, source_data) for name, g in graphs_data.items())
    from . import specloop, specpipeline

    pipeline = specpipeline.load(data.get("pipeline"), graphs, model_dir.name, path)
    return ModelSpec(name=model_dir.name, dir=model_dir, file=path, licence=str(data["licence"]),
                     description=str(data.get("description", "")), source=source, graphs=graphs, pipeline=pipeline,
                     loop=specloop.load(data.get("loop"), graphs, model_dir.name, path, pipeline))


def _load_graph(name: str, data: Any, model_dir: Path, path: Path, socs: dict[str, Soc],
                model_source: dict[str, Any]) -> GraphSpec:
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
    source_data, source_key = specport.graph_source(model_source, data.get("source"), path, f"{key}.source")
    specport.check_source_file(source_data, path, source_key)
    if source_data.get("package") and _package_version(source_data["package"]) is None:
        raise SpecError(path, f"{key}.source.package", f"package '{source_data['package']}' is not installed",
                        f"pip install {source_data['package']}")
    samples = specport.samples(data.get("samples"), path, f"{key}.samples", model_dir)
    has_code = (model_dir / "export.py").is_file()
    if not has_code:  # the YAML-only path: the packaged ONNX is the graph (see README "Adding a packaged ONNX model")
        specport.require_packaged_onnx(source_data, path, key, source_key, samples, data)
    simplify = _section(data, "simplify", SIMPLIFY_KEYS, path, key)
    specport.skip_optimizers(simplify, path, f"{key}.simplify.skip_optimizers")
    cpucheck = _section(data, "cpucheck", TOLERANCE_KEYS, path, key)
    for metric, limit in cpucheck.items():
        _number(limit, path, f"{key}.cpucheck.{metric}", *THRESHOLD_RANGES[metric])
    lint = _section(data, "lint", LINT_KEYS, path, key)
    _check_lint(lint, path, f"{key}.lint")
    outputs = _tensors(data["outputs"], path, f"{key}.outputs", need_dtype=False)
    inputs = _tensors(data["inputs"], path, f"{key}.inputs", need_dtype=True)
    return GraphSpec(
        name=name, model=model_dir.name, model_dir=model_dir,
        inputs=inputs, outputs=outputs,
        precisions=tuple(precisions), socs=chips, export=export,
        options=_mapping(data.get("options", {}), path, f"{key}.options"),
        simplify=simplify, cpucheck=cpucheck, lint=lint,
        verify={p: _verify_section(data.get("verify"), p, {t.name for t in outputs}, path, f"{key}.verify")
                for p in precisions},
        calibration=_calibration(data.get("calibration"), precisions, path, f"{key}.calibration"),
        allow_cpu_fallback=_bool(data.get("allow_cpu_fallback", False), path, f"{key}.allow_cpu_fallback"),
        source=Source(package=source_data.get("package"), file=source_data.get("file"), url=source_data.get("url")),
        source_key=source_key, rewrites=specport.rewrites(data.get("rewrites"), path, f"{key}.rewrites"),
        constant_inputs=specport.constant_inputs(data.get("constant_inputs"), path, f"{key}.constant_inputs",
                                                 {t.name for t in inputs}),
        samples=samples, has_code=has_code,
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
    _check_keys(data, PROFILE_KEYS, path, "")
    _require(data, ("kind",), path, "")
    packages = data.get("packages") or []
    if not isinstance(packages, list) or not all(isinstance(p, str) and "==" in p for p in packages):
        raise SpecError(path, "packages", f"must be a list of pinned requirements, got {packages!r}",
                        "e.g. packages: [onnxruntime-qnn==2.3.0, onnxruntime==1.24.4]")
    cache = data.get("cache")
    if cache is not None and not isinstance(cache, str):
        raise SpecError(path, "cache", f"must be a folder or an fsspec URL, got {cache!r}", "e.g. cache: s3://team/qnn-cache")
    return ToolchainProfile(name=name, file=path, kind=str(data["kind"]),
                            options=_mapping(data.get("options", {}), path, "options"),
                            settings=_mapping(data.get("settings", {}), path, "settings"),
                            packages=tuple(packages), cache=cache,
                            upgrade=_upgrade_section(data.get("upgrade"), path))


def _upgrade_section(data: Any, path: Path) -> dict[str, Any]:
    """How this toolchain is compared with the run's first one (the upgrade diff) and whether it gates."""
    section = _mapping(data, path, "upgrade")
    _check_keys(section, set(UPGRADE_DEFAULTS), path, "upgrade")
    merged = {**UPGRADE_DEFAULTS, **section}
    _bool(merged["gate"], path, "upgrade.gate")
    _number(merged["cosine_margin"], path, "upgrade.cosine_margin", 0.0, 1.0)
    _number(merged["size_growth"], path, "upgrade.size_growth", 0.0, None)
    return merged


def load_project(root: Path, toolchain: str = "ort-qnn") -> Project:
    """Load socs, every models/*/model.yaml and the toolchain profile; check cross-file rules.

    A warm cache (unchanged spec files) skips YAML; installed packages are still checked.
    """
    from . import speccache

    cached = speccache.read(root, toolchain)
    if cached is not None:
        for model in cached.models:
            for source, key in [(model.source, "source.package")] + [(g.source, f"graphs.{g.name}.source.package")
                                                                     for g in model.graphs if g.source]:
                if source.package and _package_version(source.package) is None:
                    raise SpecError(model.file, key, f"package '{source.package}' is not installed",
                                    f"pip install {source.package}")
        return cached
    project = _load_project(root, toolchain)
    speccache.write(root, toolchain, project)
    return project


def _load_project(root: Path, toolchain: str) -> Project:
    names = [n.strip() for n in toolchain.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise SpecError("$QNN_TOOLCHAIN", "", f"'{toolchain}' names no toolchain or one twice",
                        "e.g. QNN_TOOLCHAIN=ort-qnn or QNN_TOOLCHAIN=ort-qnn,ort-qnn-2.47")
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
    profiles = tuple(load_toolchain(root, name) for name in names)
    return Project(root=root, socs=socs, models=models, toolchain=profiles[0], toolchains=profiles)
