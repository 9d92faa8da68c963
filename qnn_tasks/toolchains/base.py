"""The toolchain interface: what tasks.py needs from ort-qnn today and the QAIRT SDK later."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from ..spec import GraphSpec, Soc


class Toolchain(Protocol):
    """One way to turn a simplified ONNX graph into a QNN context binary for one chip.

    `fingerprint()` and `id()` read only package metadata / small files, never import heavy
    modules: they run at task-generation time on every `doit` invocation.
    """

    kind: str

    def id(self) -> str:
        """Directory name for this toolchain's builds; carries its version (DESIGN rule 5)."""

    def fingerprint(self) -> dict[str, Any]:
        """Versions and options: part of the key of every toolchain stage, of no other."""

    def config_files(self, graph: GraphSpec) -> list[str]:
        """Names of the files `write_config` produces."""

    def write_config(self, graph: GraphSpec, soc: Soc, out_dir: Path) -> dict[str, Any]:
        """The chip's HTP settings for this graph as file(s) in out_dir; returns the record."""

    def context_files(self, graph: GraphSpec) -> list[str]:
        """Names of the files `compile` produces in its out_dir."""

    def compile(self, graph: GraphSpec, soc: Soc, simplified: Path, config_dir: Path, out_dir: Path) -> dict[str, Any]:
        """Compile the context binary; check the CPU fallback and the chip; returns the record."""

    def compile_variant(self, model: Path, provider_options: dict[str, str], out_dir: Path) -> Path:
        """Compile a derived model (diagnostic graph, graph cut) for a chip; returns what the simulator loads."""
