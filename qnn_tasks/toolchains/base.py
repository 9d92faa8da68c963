"""The toolchain interface: what tasks/project.py needs from ort-qnn and from the QAIRT SDK.

A toolchain turns a graph variant (a simplified ONNX graph at one precision) into a QNN
context binary per chip:

    [graph stages, once per variant: e.g. quantize (ort-qnn w8a16), convert + modellib (SDK)]
        -> config (per chip) -> context (per chip)

Each graph stage reads the previous stage's `primary` output (the first reads the simplified
ONNX) and the `compile` step reads the last one's. Stages are plain functions; tasks/project.py wires
them into doit with the toolchain fingerprint in their keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from qnn_tasks.modelspec import precision_table
from qnn_tasks.modelspec.project import GraphSpec, Soc


@dataclass(frozen=True)
class StageInput:
    """What a toolchain graph stage gets: the graph, its precision, its input file, where to write."""
    graph: GraphSpec
    precision: str
    source: Path                     # the previous stage's primary output (first stage: simplified ONNX)
    out_dir: Path
    calibration: Path | None = None  # calibration.npz for quantized variants (w8a16, w4a16)
    promoted: Path | None = None     # w8a16-mixed: the repair's record, naming the weights it promoted to 16 bits


@dataclass(frozen=True)
class GraphStage:
    """A per-variant toolchain stage, e.g. `convert:<variant>`."""
    name: str
    doc: str
    outputs: Callable[[GraphSpec, str, Path], list[Path]]  # (graph, precision, out_dir) -> files; [0] is primary
    run: Callable[[StageInput], dict[str, Any]]
    needs_calibration: bool = False


class Toolchain(Protocol):
    """One way to turn a simplified ONNX graph into a QNN context binary for one chip.

    `fingerprint()`, `id()` and `graph_stages()` read only package metadata / small files and
    never import heavy modules: they run at task-generation time on every `doit` invocation.
    The code key of its stages is derived from the module that defines the class (codekeys.py).
    """

    kind: str

    def id(self) -> str:
        """Directory name for this toolchain's builds; carries its version (docs/toolchains.md: the build tree)."""

    def fingerprint(self) -> dict[str, Any]:
        """Versions and options: part of the key of every toolchain stage, of no other."""

    def graph_stages(self, precision: str) -> list[GraphStage]:
        """Per-variant stages before the per-chip ones, in order (may be empty)."""

    def config_files(self, graph: GraphSpec) -> list[str]:
        """Names of the files `write_config` produces."""

    def write_config(self, graph: GraphSpec, precision: str, soc: Soc, out_dir: Path) -> dict[str, Any]:
        """The chip's HTP settings for this graph as file(s) in out_dir; returns the record."""

    def context_files(self, graph: GraphSpec) -> list[str]:
        """Names of the files `compile` produces in its out_dir; the first is what the simulator loads."""

    def compile(self, graph: GraphSpec, soc: Soc, source: Path, config_dir: Path, out_dir: Path,
                promoted: Path | None = None) -> dict[str, Any]:
        """Compile `source` (last graph stage's primary output, or the simplified ONNX) for `soc`;
        check the CPU fallback and the chip it was built for; returns the record. `promoted`: a repaired variant's
        promoted.json, whose chosen step's binary may be adopted (a toolchain without the repair ignores it)."""

    def compile_variant(self, model: Path, provider_options: dict[str, str], out_dir: Path,
                        name: str | None = None) -> Path:
        """Compile a derived ONNX model (diagnostic graph, graph cut, repair step) for a chip; returns what the
        simulator loads (`<name>_ctx.onnx`)."""


def quantized_outputs(graph: GraphSpec, precision: str, out_dir: Path) -> list[Path]:
    """A quantize stage's output: the QDQ model that `context` compiles for a quantized precision (w8a16's keeps
    the name it always had; another's says its precision)."""
    return [out_dir / (f"{graph.name}_qdq.onnx" if precision == "w8a16" else f"{graph.name}_{precision}_qdq.onnx")]


def quantized_precision(file_name: str) -> str | None:
    """The precision a QDQ model named by `quantized_outputs` was quantized to; None for a float model."""
    if not file_name.endswith("_qdq.onnx"):
        return None
    return next((p for p in precision_table.QUANTIZED if file_name.endswith(f"_{p}_qdq.onnx")), "w8a16")
