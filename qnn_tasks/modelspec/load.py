"""YAML -> the spec's types (modelspec/project.py): socs/socs.yaml, models/*/model.yaml, toolchain/*.yaml, checked.

Only YAML and package metadata are read here (no onnx/onnxruntime/torch), so `doit list` stays instant. Every
error names the file and the key, and says how to fix it. No stage imports this module: planning runs it, and a
stage gets its slice of the spec as data.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qnn_tasks.errors import SpecError
from qnn_tasks.modelspec import specport, specship, stagesettings
from qnn_tasks.modelspec.checks import PRECISIONS, verify_section
from qnn_tasks.modelspec.precision_table import AUTO, DEFAULT_AUTO_ORDER, RUNS_WORDS
from qnn_tasks.modelspec.project import (
    DEFAULT_CONTEXT_MB,
    DEFAULT_MEMORY_MB,
    LEGACY_RUNS,
    PACKAGED_DATA,
    GraphSpec,
    ModelSpec,
    Project,
    Soc,
    Source,
    TensorSpec,
    ToolchainProfile,
)
from qnn_tasks.modelspec.yamlread import (
    as_bool,
    as_int,
    as_mapping,
    as_name,
    as_number,
    installed_version,
    load_yaml,
)

if TYPE_CHECKING:
    from qnn_tasks.modelspec.specsizes import SizeSpec

MAX_ELEMENTS = 2**31 - 1  # values in one declared tensor: QNN indexes tensors with 32 bits
IO_DTYPES = ("float32", "float16", "int32", "uint8", "int8", "uint16", "int16", "bool")
PLATFORMS = ("phone", "automotive", "iot", "pc")  # what a chip ships in; Play's device targeting serves phones
UPGRADE_DEFAULTS = {"gate": False, "cosine_margin": 1.0e-4, "size_growth": 0.05}


def load_socs(path: Path, base: dict[str, Soc] | None = None) -> dict[str, Soc]:
    """One socs.yaml's rows. With `base` (the packaged table), they add to or override its rows by name."""
    return load_soc_file(path, base)[0]


def load_soc_file(path: Path, base: dict[str, Soc] | None = None
                  ) -> tuple[dict[str, Soc], list[str] | str | None, list[str]]:
    """The merged table (`base` with this file's rows over it), this file's `default:` (None if absent)
    and the names of the rows this file writes."""
    data = as_mapping(load_yaml(path), path, "")
    _check_schema(data, "SOCS", path)
    table = as_mapping(data.get("socs"), path, "socs")
    base = dict(base or {})
    socs: dict[str, Soc] = {name: soc for name, soc in base.items()}
    # (soc_id, dsp_arch) -> the row naming it; a base row this file overrides no longer counts
    chips: dict[tuple[int, str], str] = {}
    for soc in base.values():
        if soc.name not in table:
            chips.setdefault((soc.soc_id, soc.dsp_arch), soc.name)
    for name, row in table.items():
        name = as_name(name, path, "socs", "SoC name", "rename the row")
        key = f"socs.{name}"
        row = as_mapping(row, path, key)
        soc = Soc(name=str(name), soc_id=as_int(row["soc_id"], path, f"{key}.soc_id", 1, 1023),
                  dsp_arch=str(row["dsp_arch"]), vtcm_mb=as_int(row["vtcm_mb"], path, f"{key}.vtcm_mb", 1, 64),
                  runs=_runs(row, path, key), note=str(row.get("note", "")), file=str(path),
                  platform=str(row.get("platform", "phone")),
                  context_mb=as_int(row.get("context_mb", DEFAULT_CONTEXT_MB), path, f"{key}.context_mb", 1, 1 << 20),
                  memory_mb=as_int(row.get("memory_mb", DEFAULT_MEMORY_MB), path, f"{key}.memory_mb", 1, 1 << 20))
        if soc.platform not in PLATFORMS:
            raise SpecError(path, f"{key}.platform", f"'{row['platform']}' is not a platform",
                            f"use one of: {', '.join(PLATFORMS)} (default phone)")
        if not re.fullmatch(r"v\d+", soc.dsp_arch):
            raise SpecError(path, f"{key}.dsp_arch", f"'{row['dsp_arch']}' is not a Hexagon arch", "write e.g. v75")
        alias = row.get("alias_of")
        same = chips.get((soc.soc_id, soc.dsp_arch))
        where = f" ({socs[same].file})" if same is not None and socs[same].file != str(path) else ""
        if alias is not None:
            if alias not in socs or alias == soc.name:
                raise SpecError(path, f"{key}.alias_of", f"'{alias}' is not a row above this one",
                                "name the row this chip shares soc_id and dsp_arch with")
            if (socs[alias].soc_id, socs[alias].dsp_arch) != (soc.soc_id, soc.dsp_arch):
                raise SpecError(path, f"{key}.alias_of", f"{alias} has soc_id {socs[alias].soc_id}/{socs[alias].dsp_arch}, "
                                f"this row {soc.soc_id}/{soc.dsp_arch}", "an alias repeats its row's soc_id and dsp_arch")
        elif same is not None and same != soc.name:
            raise SpecError(path, f"{key}.soc_id", f"soc_id {soc.soc_id} with {soc.dsp_arch} is already row {same}{where}: "
                            "the same binary would be built twice under two names",
                            f"fix the soc_id, or add alias_of: {same} if both names are really one chip")
        chips.setdefault((soc.soc_id, soc.dsp_arch), soc.name)
        socs[soc.name] = soc
    default = data.get("default")
    if default is not None:
        if default != "all" and not (isinstance(default, list) and all(isinstance(n, str) for n in default)):
            raise SpecError(path, "default", f"must be a list of SoC names or 'all', got {default!r}",
                            "e.g. default: [SM8650, SM8750], or default: all")
        for chip in default if isinstance(default, list) else ():
            if chip not in socs:
                raise SpecError(path, "default", f"unknown SoC '{chip}'", f"use rows of the table: {', '.join(socs)}")
    return socs, default, [str(name) for name in table]


def _runs(row: dict, path: Path, key: str) -> tuple[str, ...]:
    """`runs: [fp16, w8a16]` (or the older `fp16: true/false`): what the chip's HTP compiles."""
    if "runs" in row and "fp16" in row:
        raise SpecError(path, f"{key}.fp16", "both runs: and fp16: given", "keep runs: (fp16: is the older spelling)")
    if "fp16" in row:
        return LEGACY_RUNS[as_bool(row["fp16"], path, f"{key}.fp16")]
    if "runs" not in row:
        raise SpecError(path, f"{key}.runs", "required key is missing",
                        "add runs: [fp16, w8a16], or runs: [w8a16] for a chip that runs only quantized graphs")
    runs = row["runs"]
    if not isinstance(runs, list) or not runs or len(set(map(str, runs))) != len(runs) \
            or not all(r in RUNS_WORDS for r in runs):
        raise SpecError(path, f"{key}.runs", f"{runs!r} is not a list of precisions",
                        f"a non-empty list of {', '.join(RUNS_WORDS)} without repeats, e.g. runs: [fp16, w8a16] "
                        "(a chip that runs w8a16 runs every quantized precision)")
    return tuple(r for r in RUNS_WORDS if r in runs)  # canonical order: keys do not depend on how it was written


def _check_schema(data: Any, table: str, path: Path) -> None:
    """The file against its table of modelspec/keys.py (imported only when YAML is read: a warm spec cache skips it);
    a model.yaml's with the sections of the stages this project registered."""
    from qnn_tasks.modelspec import keys, schema

    found = keys.model_table(stagesettings.registered()) if table == "MODEL" else getattr(keys, table)
    schema.check(data, found, path)


def packaged_socs_file() -> Path:
    return PACKAGED_DATA / "socs.yaml"


def load_soc_table(root: Path) -> tuple[dict[str, Soc], tuple[str, ...]]:
    """The packaged table with the project's socs/socs.yaml (if any) over it, and the default chips.

    Default chips (for graphs without `socs:`): the project file's `default:` if it has one, else the
    rows the project file writes (a table written before the packaged one existed builds as it did),
    else the packaged `default:`.
    """
    socs, default, _ = load_soc_file(packaged_socs_file())
    own = root / "socs" / "socs.yaml"
    if own.is_file():
        socs, own_default, own_rows = load_soc_file(own, socs)
        if own_default is not None:
            default = own_default
        elif own_rows:
            return socs, tuple(name for name in socs if name in set(own_rows))
    return socs, tuple(socs) if default in ("all", None) else tuple(dict.fromkeys(default))  # listed twice: built once


def load_model(model_dir: Path, socs: dict[str, Soc]) -> ModelSpec:
    path = model_dir / "model.yaml"
    as_name(model_dir.name, path, "", "the model folder name", f"rename the folder {model_dir}")
    data = as_mapping(load_yaml(path), path, "")
    _check_schema(data, "MODEL", path)  # every key's type and bounds, before any value is used
    source_data = as_mapping(data["source"], path, "source")
    source = Source(package=source_data.get("package"), file=source_data.get("file"), url=source_data.get("url"))
    specport.check_source_file(source_data, path, "source.file")
    if source.package and installed_version(source.package) is None:
        raise SpecError(path, "source.package", f"package '{source.package}' is not installed",
                        f"pip install {source.package}")
    graphs_data = as_mapping(data["graphs"], path, "graphs")
    if not graphs_data:
        raise SpecError(path, "graphs", "no graphs declared", "declare at least one graph")
    from qnn_tasks.modelspec import specloop, specpipeline, specsizes

    declared = [as_name(name, path, "graphs", "graph name", "rename the graph") for name in graphs_data]
    expanded = [(sized, g, size, f"graphs.{name}") for name in declared
                for sized, g, size in specsizes.expand(name, as_mapping(graphs_data[name], path, f"graphs.{name}"),
                                                       path, f"graphs.{name}")]
    specsizes.check_names(declared, [(sized, origin) for sized, _, _, origin in expanded], path)
    graphs = tuple(_load_graph(as_name(sized, path, origin, "size graph name", "rename the graph or its dim"), g,
                               model_dir, path, socs, source_data, size=size, key=origin)
                   for sized, g, size, origin in expanded)
    from qnn_tasks.modelspec import specsplit

    specsplit.clashes(graphs, path)
    specsplit.not_sized(graphs, path)
    sized = {g.size.graph: g.size for g in graphs if g.size}
    pipeline_data, loop_data, size_pipelines = data.get("pipeline"), data.get("loop"), ()
    chain = specsizes.chain_sizes(pipeline_data.get("graphs") or [], sized, path, "pipeline.graphs") \
        if isinstance(pipeline_data, dict) else None
    if chain is not None:  # one pipeline per size: each graph with sizes at that size
        size_pipelines = tuple(replace(specpipeline.load(specsizes.at_size(pipeline_data, sized, size), graphs,
                                                         model_dir.name, path, per_size=True),
                                       name=f"{model_dir.name}.{chain.dim}{size}", size=f"{chain.dim}{size}")
                               for size in chain.sizes)
        pipeline_data = None
    pipeline = specpipeline.load(pipeline_data, graphs, model_dir.name, path)
    loop = specloop.load_sized(loop_data, graphs, model_dir.name, path, pipeline, sized, chain,
                                size_pipelines)
    specsplit.not_chained(graphs, pipeline, loop, path)
    _auto_alone(graphs, pipeline, loop, size_pipelines, path)
    from qnn_tasks.modelspec.specpipeline import check_upstream

    check_upstream(graphs, [p for p in (pipeline, *size_pipelines) if p is not None], path)
    return ModelSpec(name=model_dir.name, dir=model_dir, file=path, licence=str(data["licence"]),
                     description=str(data.get("description", "")), source=source, graphs=graphs, pipeline=pipeline,
                     loop=loop, size_pipelines=size_pipelines,
                     ship=specship.load(data.get("ship"), path),
                     stage_timeout=_stage_timeout(data.get("stage_timeout"), path))


def _stage_timeout(value: Any, path: Path) -> float | None:
    """`stage_timeout: <seconds>`: a stage of this model that runs longer is stopped (its child process killed)."""
    from qnn_tasks.envvalues import STAGE_TIMEOUT_MAX

    return None if value is None else as_number(value, path, "stage_timeout", 1, STAGE_TIMEOUT_MAX)


def _load_graph(name: str, data: Any, model_dir: Path, path: Path, socs: dict[str, Soc],
                model_source: dict[str, Any], size: SizeSpec | None = None, key: str | None = None) -> GraphSpec:
    key = key or f"graphs.{name}"
    data = as_mapping(data, path, key)
    precisions, auto = _precisions(data.get("precision", "fp16"), path, f"{key}.precision")
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
    if source_data.get("package") and installed_version(source_data["package"]) is None:
        raise SpecError(path, f"{key}.source.package", f"package '{source_data['package']}' is not installed",
                        f"pip install {source_data['package']}")
    inputs = _tensors(data["inputs"], path, f"{key}.inputs", need_dtype=True)
    samples = specport.samples(data.get("samples"), path, f"{key}.samples", model_dir,
                               {t.name: (t.shape, t.dtype) for t in inputs}, size)
    has_code = (model_dir / "export.py").is_file()
    if not has_code:  # the YAML-only path: the packaged ONNX is the graph (docs/packaged-models.md)
        specport.require_packaged_onnx(source_data, path, key, source_key, data)
    settings = {s.section: s.load(data.get(s.section), path, f"{key}.{s.section}", precisions)
                for s in stagesettings.declared()}  # each stage's own section (simplify:, lint:, ...)
    outputs = _tensors(data["outputs"], path, f"{key}.outputs", need_dtype=False)
    return GraphSpec(
        name=name, model=model_dir.name, model_dir=model_dir,
        inputs=inputs, outputs=outputs,
        precisions=tuple(precisions), socs=chips, export=export,
        options=as_mapping(data.get("options", {}), path, f"{key}.options"), settings=settings,
        verify={p: verify_section(data.get("verify"), p, {t.name: t.shape for t in outputs}, path, f"{key}.verify")
                for p in precisions},
        allow_cpu_fallback=as_bool(data.get("allow_cpu_fallback", False), path, f"{key}.allow_cpu_fallback"),
        source=Source(package=source_data.get("package"), file=source_data.get("file"), url=source_data.get("url")),
        source_key=source_key, rewrites=specport.rewrites(data.get("rewrites"), path, f"{key}.rewrites"),
        constant_inputs=specport.constant_inputs(data.get("constant_inputs"), path, f"{key}.constant_inputs",
                                                 {t.name for t in inputs}),
        samples=samples, has_code=has_code, size=size,
        split=_split(data.get("split"), path, f"{key}.split"), auto=auto,
    )


def _auto_alone(graphs: tuple[GraphSpec, ...], pipeline: Any, loop: Any, size_pipelines: tuple, path: Path) -> None:
    """`precision: auto` picks a precision per chip after verification; a chain (pipeline, loop, split parts) or a
    graph with sizes is built at one declared precision, so an auto graph stands alone."""
    chained = {name: "pipeline.graphs" for p in (pipeline, *size_pipelines) if p for name in p.graphs}
    if loop:
        chained[loop.graph] = "loop.graph"
    for g in graphs:
        if not g.auto:
            continue
        where = chained.get(g.name) or ("split" if g.split else "dims" if g.size else None)
        if where:
            raise SpecError(path, f"{g.key}.precision", f"auto picks a precision per chip after verification; "
                            f"{g.name} is {'in ' + where if '.' in where else 'built with ' + where + ':'}, which "
                            "builds one declared precision", "name its precisions, e.g. precision: [w8a16-mixed, fp16]")


def _precisions(value: Any, path: Path, key: str) -> tuple[list[str], tuple[str, ...]]:
    """(the precisions built, `precision: auto`'s candidates in order or ()): `auto` builds every candidate and ships
    the smallest that passes, per chip."""
    auto: tuple[str, ...] = ()
    if value == AUTO or isinstance(value, dict):
        order = DEFAULT_AUTO_ORDER if value == AUTO else value.get(AUTO)
        if not isinstance(order, (list, tuple)) or (isinstance(value, dict) and set(value) != {AUTO}):
            raise SpecError(path, key, f"{value!r} is not `auto` or {{auto: [candidates]}}",
                            "e.g. precision: auto, or precision: {auto: [w8a16-mixed, fp16]}")
        value = auto = tuple(order)
        key = f"{key}.auto"
        if len(auto) < 2:
            raise SpecError(path, key, f"{list(auto)} is fewer than two candidates to choose from",
                            "e.g. [w8a16-mixed, fp16], or name the one precision: precision: fp16")
    precisions = list(value) if isinstance(value, (list, tuple)) else [value]
    for precision in precisions:
        if precision not in PRECISIONS:
            raise SpecError(path, key, f"unknown precision {precision!r}",
                            f"use one of {', '.join(PRECISIONS)}, or a list of them"
                            + ("" if auto else ", or auto"))
    if not precisions or len(set(precisions)) != len(precisions):
        raise SpecError(path, key, f"{precisions} is empty or repeats a precision", "e.g. [fp16, w8a16]")
    return precisions, auto


def _split(data: Any, path: Path, key: str) -> dict[str, Any] | None:
    from qnn_tasks.modelspec import specsplit

    return specsplit.load(data, path, key)


def _tensors(data: Any, path: Path, key: str, need_dtype: bool) -> tuple[TensorSpec, ...]:
    data = as_mapping(data, path, key)
    if not data:
        raise SpecError(path, key, "no tensors declared", "list each tensor with its shape")
    tensors = []
    for name, tdata in data.items():
        tkey = f"{key}.{name}"
        tdata = as_mapping(tdata, path, tkey)
        shape = tdata["shape"]
        if not isinstance(shape, list) or not shape:
            raise SpecError(path, f"{tkey}.shape", "must be a list of integers", "e.g. shape: [1, 128]")
        for dim in shape:
            if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0:
                raise SpecError(path, f"{tkey}.shape", f"dynamic or invalid dim '{dim}': the NPU needs static shapes",
                                "give every dim a fixed positive integer (pad or chunk variable lengths at export), "
                                "or name it under dims: with its sizes")
        elements = math.prod(shape)
        if elements > MAX_ELEMENTS:  # each dim is bounded by the schema; their product is what stages allocate
            raise SpecError(path, f"{tkey}.shape", f"{shape} holds {elements:.3g} values, more than an NPU tensor "
                            f"can ({MAX_ELEMENTS})", "check the dims (a tensor this size would not fit the NPU's memory)")
        dtype = str(tdata.get("dtype", "float32"))
        if dtype == "int64":
            raise SpecError(path, f"{tkey}.dtype", "int64 is not supported on HTP", "export int32 instead")
        if dtype not in IO_DTYPES:
            raise SpecError(path, f"{tkey}.dtype", f"unsupported dtype '{dtype}'", f"use one of {', '.join(IO_DTYPES)}")
        tensors.append(TensorSpec(name=str(name), shape=tuple(shape), dtype=dtype,
                                  onnx_name=specport.onnx_name(tdata.get("onnx_name"), path, f"{tkey}.onnx_name")))
    specport.unique_onnx_names(tensors, path, key)
    return tuple(tensors)


def toolchain_file(root: Path, name: str) -> Path:
    """The project's toolchain/<name>.yaml when it has one (it overrides), else the packaged profile."""
    own = root / "toolchain" / f"{name}.yaml"
    if own.is_file() or "/" in name or name.startswith("."):
        return own
    packaged = PACKAGED_DATA / "toolchain" / f"{name}.yaml"
    return packaged if packaged.is_file() else own


def toolchain_names(root: Path) -> list[str]:
    """Every profile name this project can select: its own toolchain/*.yaml and the packaged ones."""
    return sorted({p.stem for d in (root / "toolchain", PACKAGED_DATA / "toolchain") for p in d.glob("*.yaml")})


def load_toolchain(root: Path, name: str) -> ToolchainProfile:
    as_name(name, "$QNN_TOOLCHAIN", "", "toolchain profile name", "name a profile file toolchain/<name>.yaml")
    path = toolchain_file(root, name)
    if not path.is_file():
        raise SpecError(path, "", f"no toolchain profile '{name}'",
                        f"use one of: {', '.join(toolchain_names(root)) or 'none found'}, or write toolchain/{name}.yaml")
    data = as_mapping(load_yaml(path), path, "")
    _check_schema(data, "PROFILE", path)
    packages = data.get("packages") or []
    if not isinstance(packages, list) or not all(isinstance(p, str) and "==" in p for p in packages):
        raise SpecError(path, "packages", f"must be a list of pinned requirements, got {packages!r}",
                        "e.g. packages: [onnxruntime-qnn==2.3.0, onnxruntime==1.24.4]")
    cache = data.get("cache")
    if cache is not None and not isinstance(cache, str):
        raise SpecError(path, "cache", f"must be a folder or an fsspec URL, got {cache!r}", "e.g. cache: s3://team/qnn-cache")
    return ToolchainProfile(name=name, file=path, kind=str(data["kind"]),
                            options=as_mapping(data.get("options", {}), path, "options"),
                            settings=as_mapping(data.get("settings", {}), path, "settings"),
                            packages=tuple(packages), cache=cache,
                            upgrade=_upgrade_section(data.get("upgrade"), path))


def _upgrade_section(data: Any, path: Path) -> dict[str, Any]:
    """How this toolchain is compared with the run's first one (the upgrade diff) and whether it gates."""
    section = as_mapping(data, path, "upgrade")
    merged = {**UPGRADE_DEFAULTS, **section}
    as_bool(merged["gate"], path, "upgrade.gate")
    as_number(merged["cosine_margin"], path, "upgrade.cosine_margin", 0.0, 1.0)
    as_number(merged["size_growth"], path, "upgrade.size_growth", 0.0, None)
    return merged


def load_project(root: Path, toolchain: str = "ort-qnn") -> Project:
    """Load socs, every models/*/model.yaml and the toolchain profile; check cross-file rules.

    A warm cache (unchanged spec files) skips YAML; installed packages are still checked.
    """
    from qnn_tasks.modelspec import speccache

    cached = speccache.read(root, toolchain)
    if cached is not None:
        broken = []
        for model in cached.models:
            for source, key in [(model.source, "source.package")] + [(g.source, f"graphs.{g.name}.source.package")
                                                                     for g in model.graphs if g.source]:
                if source.package and installed_version(source.package) is None:
                    broken.append((model.name, str(SpecError(model.file, key, f"package '{source.package}' is not "
                                                             "installed", f"pip install {source.package}"))))
                    break
        if broken:
            names = {name for name, _ in broken}
            return replace(cached, models=tuple(m for m in cached.models if m.name not in names), broken=tuple(broken))
        return cached
    project = _load_project(root, toolchain)
    if not project.broken:  # a broken model is loaded again next time: its fix may be outside the spec files
        speccache.write(root, toolchain, project)
    return project


def _declares_something(model_yaml: Path) -> bool:
    """False for a model.yaml of only comments and blank lines (`init`'s example before it is uncommented)."""
    try:
        with open(model_yaml, errors="replace") as fh:
            return any(line.strip() and not line.lstrip().startswith("#") for line in fh)
    except OSError:
        return True  # let the loader report it


def _load_project(root: Path, toolchain: str) -> Project:
    names = [n.strip() for n in toolchain.split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise SpecError("$QNN_TOOLCHAIN", "", f"'{toolchain}' names no toolchain or one twice",
                        "e.g. QNN_TOOLCHAIN=ort-qnn or QNN_TOOLCHAIN=ort-qnn,ort-qnn-2.47")
    socs, default_socs = load_soc_table(root)
    model_dirs = sorted(p.parent for p in (root / "models").glob("*/model.yaml") if _declares_something(p))
    loaded, broken = [], []
    for model_dir in model_dirs:  # one model's bad spec makes that model unbuildable, not the project
        try:
            loaded.append(load_model(model_dir, socs))
        except SpecError as err:
            broken.append((model_dir.name, str(err)))
        except Exception as err:  # noqa: BLE001 - a loader bug (the fuzz finds none) still costs one model only
            problem = (str(err).splitlines() or [""])[0][:200]
            broken.append((model_dir.name, str(SpecError(model_dir / "model.yaml", "", f"the loader failed on this "
                                                         f"file: {type(err).__name__}: {problem}", "a bug of "
                                                         "qnn-npu-compile: please report it with this file"))))
    seen: dict[str, Path] = {}
    models = []
    for model in loaded:
        clash = next((g.name for g in model.graphs if g.name in seen), None)
        if clash is not None:  # the later model is the one left out
            broken.append((model.name, str(SpecError(model.file, f"graphs.{clash}",
                                                     f"graph name also used in {seen[clash]}; task names would clash",
                                                     "rename one graph (graph names are unique in a project)"))))
            continue
        seen.update((graph.name, model.file) for graph in model.graphs)
        models.append(model)
    models = tuple(models)
    profiles = tuple(load_toolchain(root, name) for name in names)
    return Project(root=root, socs=socs, models=models, toolchain=profiles[0], toolchains=profiles,
                   broken=tuple(broken), default_socs=default_socs)
