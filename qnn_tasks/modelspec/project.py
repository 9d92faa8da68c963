"""The spec's types: a SoC row, a tensor, a source, a graph, a model, a toolchain profile, the project.

Stage code imports these (a stage call carries them as JSON, modelspec/specjson.py); how YAML becomes them is
modelspec/load.py, so an edit to the loaders re-keys no stage (a stage's code key is every module it imports).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from qnn_tasks.modelspec import precision_table, specport, specship
from qnn_tasks.modelspec.installed import version as installed_version

if TYPE_CHECKING:  # annotations only: load_model imports these loaders where it uses them
    from qnn_tasks.modelspec.specloop import LoopSpec
    from qnn_tasks.modelspec.specpipeline import PipelineSpec
    from qnn_tasks.modelspec.specsizes import SizeSpec

LEGACY_RUNS = {True: ("fp16", "w8a16"), False: ("w8a16",)}  # what `fp16: true/false` meant
DEFAULT_MEMORY_MB = 2048   # a row without memory_mb: the HTP's 2 GiB allocation limit (docs/load-and-fit.md)
DEFAULT_CONTEXT_MB = 2048  # a row without context_mb: ~1B fp16 parameters per context (an estimate: docs/socs.md)
PACKAGED_DATA = Path(__file__).resolve().parents[1] / "data"


@lru_cache(maxsize=64)
def _is_packaged_table(file: str) -> bool:
    """Whether a SoC row's file is the packaged table: resolved once per file (planning asks for every row of every
    graph's budget: two realpath walks each cost 44 ms of a no-op doit at 2,800 tasks)."""
    return Path(file).resolve() == (PACKAGED_DATA / "socs.yaml").resolve()
# what a context binary records about its chip (qnnbin's info keys) -> (the binary's word, the SoC row's key)
BINARY_CHIP_FACTS = {"soc_model": ("socModel", "soc_id"), "dsp_arch": ("arch", "dsp_arch")}


class BinaryMismatch(NamedTuple):
    """One chip fact a context binary records that is not its SoC row's."""
    fact: str          # a key of BINARY_CHIP_FACTS
    recorded: Any      # what the binary says
    expected: Any      # what the row says

    def __str__(self) -> str:
        said, row_key = BINARY_CHIP_FACTS[self.fact]
        return f"{said} {self.recorded} != {row_key} {self.expected}"


@dataclass(frozen=True)
class Soc:
    name: str
    soc_id: int
    dsp_arch: str
    vtcm_mb: int
    runs: tuple[str, ...]  # the precisions this HTP compiles, e.g. ("fp16", "w8a16") or ("w8a16",)
    note: str = ""
    file: str = ""         # the socs.yaml that holds this row (the packaged table or the project's), for messages
    platform: str = "phone"  # phone | automotive | iot | pc: the Android AI pack targets phone rows only (not keyed)
    context_mb: int = DEFAULT_CONTEXT_MB  # weight MB one context may hold here (lint refuses a graph above it)
    memory_mb: int = DEFAULT_MEMORY_MB    # resident MB one loaded context may take here (lint's memory rule)

    @property
    def fp16(self) -> bool:
        return "fp16" in self.runs

    def row(self) -> dict[str, Any]:
        """The row as chip stages key on it. `runs` appears only where `fp16` alone does not say it,
        so rows written as `fp16: true/false` before `runs:` existed keep their keys (no rebuild)."""
        row = {"name": self.name, "soc_id": self.soc_id, "dsp_arch": self.dsp_arch,
               "vtcm_mb": self.vtcm_mb, "fp16": self.fp16}
        if self.runs not in LEGACY_RUNS.values():
            row["runs"] = list(self.runs)
        return row

    def supports(self, precision: str) -> bool:
        return precision_table.runs_as(precision) in self.runs  # w4a16 runs where w8a16 does

    def binary_mismatches(self, info: Mapping[str, Any]) -> tuple[BinaryMismatch, ...]:
        """The one "was this binary built for this chip" comparison: each chip fact of an already-read binary
        (qnnbin's info dict: soc_model, dsp_arch) that is not this row's; empty: built for this chip."""
        row = {"soc_model": self.soc_id, "dsp_arch": self.dsp_arch}
        return tuple(BinaryMismatch(fact, info.get(fact), row[fact]) for fact in BINARY_CHIP_FACTS
                     if info.get(fact) != row[fact])

    def binary_mismatch(self, info: Mapping[str, Any]) -> str | None:
        """Why the binary is not for this chip, in one line ("socModel 69 != soc_id 57, arch v79 != dsp_arch v75");
        None: it is."""
        return ", ".join(map(str, self.binary_mismatches(info))) or None

    def where(self) -> str:
        """The file to fix this row in, for messages: the project's socs.yaml, or the packaged table."""
        if not self.file or not _is_packaged_table(str(self.file)):
            return f"the {self.name} row of {self.file or 'socs/socs.yaml'}"
        return f"the {self.name} row of {self.file} (the packaged table: override the row in your socs/socs.yaml)"

    def skip_reason(self, precision: str) -> str | None:
        """Why this chip builds no `precision` target (None: it does)."""
        if self.supports(precision):
            return None
        if precision == "fp16" and self.dsp_arch == "v68":  # the wording before `runs:` existed (same task keys)
            return f"{self.name} ({self.dsp_arch}) cannot run fp16 graphs (no fp16 on HTP {self.dsp_arch})"
        why = "QNN rejects its float ops: error 3110" if precision == "fp16" else f"runs: {list(self.runs)}"
        return f"{self.name} ({self.dsp_arch}) cannot run {precision} graphs, only {', '.join(self.runs)} ({why})"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    onnx_name: str | None = None  # the tensor's name in the source ONNX when model.yaml renames it (`onnx_name:`)

    @property
    def source_name(self) -> str:
        return self.onnx_name or self.name

    def as_dict(self) -> dict[str, Any]:
        named = {"onnx_name": self.onnx_name} if self.onnx_name else {}
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, **named}


@dataclass(frozen=True)
class Source:
    package: str | None
    file: str | None
    url: str | None

    def package_version(self) -> str | None:
        return installed_version(self.package) if self.package else None

    def resolve_file(self, model_dir: Path) -> Path | None:
        """The source ONNX: inside the installed package, or relative to the model folder."""
        if not self.file:
            return None
        if self.package:
            from qnn_tasks.modelspec.installed import location

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
    verify: dict[str, dict[str, Any]]  # precision -> validated verify settings
    allow_cpu_fallback: bool
    source: Source | None = None          # the model's source with the graph's `source:` keys over it
    source_key: str = "source.file"       # the model.yaml key that names its file (for messages)
    rewrites: dict[str, dict[str, Any]] = field(default_factory=dict)  # rewrite name -> options
    constant_inputs: dict[str, Any] = field(default_factory=dict)      # packaged ONNX inputs fixed to a value
    samples: dict[str, Any] | None = None  # declared samples: {"files": [patterns]} or media sources (specsamples)
    has_code: bool = True                  # models/<model>/export.py exists
    size: SizeSpec | None = None           # which size of a graph with `dims:` this one is
    split: dict[str, Any] | None = None    # `split:` ({"at": [...]} | {"parts": N}); a part: {"part", "of", "parts"}
    auto: tuple[str, ...] = ()             # `precision: auto`: its candidates (= precisions), smallest expected first
    # the stages' own sections (simplify:, lint:, calibration:, a registered stage's), checked, defaults filled:
    # section -> settings, as modelspec/stagesettings.py declares them
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def precision(self) -> str:
        return self.precisions[0]

    @property
    def key(self) -> str:
        """The graph's key in model.yaml, for messages: `graphs.<name>`, the declared graph's for one of its sizes."""
        return f"graphs.{self.size.graph if self.size else self.name}"

    def section(self, name: str) -> dict[str, Any]:
        """A stage's section of this graph (`lint`, `calibration`, ...), as loaded; {} for one never loaded."""
        return self.settings.get(name, {})

    @property
    def model_code(self) -> Path:
        return self.model_dir / "export.py"

    def sample_files(self) -> list[Path]:
        """The declared sample files (npz, or the media sources' files), sorted (globbed now: files added later count)."""
        return specport.declared_files(self.model_dir, self.samples)

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
    pipeline: PipelineSpec | None = None  # the graphs chained, verified end to end
    loop: LoopSpec | None = None          # one graph run repeatedly, outputs fed back
    ship: dict[str, Any] = field(default_factory=specship.default)  # `ship:` precision_order, delivery (modelspec/specship.py)
    stage_timeout: float | None = None  # seconds any stage of this model may take (None: $QNN_STAGE_TIMEOUT or 4 h)
    size_pipelines: tuple[PipelineSpec, ...] = ()  # over graphs with sizes: one pipeline per size (`pipeline`: None)


@dataclass(frozen=True)
class ToolchainProfile:
    name: str
    file: Path
    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    packages: tuple[str, ...] = ()  # a pinned environment of its own (toolchains/envs.py); empty: this interpreter
    cache: str | None = None        # shared artifact cache (folder or fsspec URL); $QNN_CACHE wins
    upgrade: dict[str, Any] = field(default_factory=dict)  # comparison with the run's first toolchain


@dataclass(frozen=True)
class Project:
    root: Path
    socs: dict[str, Soc]
    models: tuple[ModelSpec, ...]
    toolchain: ToolchainProfile                 # the first (primary) toolchain of this run
    toolchains: tuple[ToolchainProfile, ...] = ()  # every toolchain of this run, primary first
    broken: tuple[tuple[str, str], ...] = ()       # (model, its one-line spec error): not buildable, the rest builds
    default_socs: tuple[str, ...] | None = None  # the chips a graph without `socs:` builds for (None: every row)

    def graphs(self) -> list[GraphSpec]:
        return [g for m in self.models for g in m.graphs]
