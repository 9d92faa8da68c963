"""The repair's chosen step, kept for the variant's own build: its QDQ model, the binary compiled from it on the
repair's chip and that binary's simulator outputs on the verification samples.

The repair has made each of them already; making them again is most of a repaired variant's build time (a
quantization, a compile and a simulation). The variant's quantize, context and simulate stages take them instead, each
only when what it would have made from its own inputs is provably the same thing:
- quantize: the quantizer is deterministic (same source, calibration set, precision and promoted weights give the same
  bytes, measured), and the repair quantized with exactly those; the QDQ's SHA-256 must still be the recorded one;
- context: the compiler is not byte-reproducible, so the binary is adopted whole (the same checks run on it as on a
  fresh compile) when the QDQ to compile and the chip's provider options are the ones it was compiled from;
- simulate: the outputs are adopted when the binary to simulate is that very binary (SHA-256) and the samples and
  options are the ones it ran with.
Anything else compiles and simulates as usual. The stage records say what was adopted (`adopted_from_repair`).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from qnn_tasks import fileio
from qnn_tasks.fileio import sha256

FOLDER = "chosen"           # repair/chosen/: the chosen step's files (repair/.work is litter a later run removes)
OUTPUTS = "outputs.npz"


def files(graph: str) -> list[str]:
    """The chosen step's files in <repair>/chosen/ (the repair stage's outputs beside promoted.json)."""
    return [f"{FOLDER}/qdq.onnx", f"{FOLDER}/quantize.log", f"{FOLDER}/{graph}_ctx.onnx", f"{FOLDER}/{graph}_ctx_qnn.bin",
            f"{FOLDER}/{OUTPUTS}"]


def keep(step: Path, out_dir: Path, facts: dict[str, Any]) -> dict[str, Any]:
    """Move the chosen step's files from `step` to <repair>/chosen/; return what promoted.json records of them
    (`facts`: the qdq, its quantize log, ctx_onnx, bin and outputs file names in `step`; the quantize record, the
    chip, options, inputs_sha256, samples, compile_seconds and seconds per inference)."""
    dest = out_dir / FOLDER
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    roles = ("qdq", "log", "ctx_onnx", "bin", "outputs")
    for role in roles:
        os.replace(step / facts[role], dest / Path(facts[role]).name)
    files = {role: Path(facts[role]).name for role in roles}
    return {**facts, **files, "qdq_sha256": sha256(dest / files["qdq"]), "bin_sha256": sha256(dest / files["bin"])}


def _chosen(promoted_file: Path | None) -> tuple[dict[str, Any], Path] | None:
    if promoted_file is None or not Path(promoted_file).is_file():
        return None
    kept = fileio.read_json(promoted_file).get("chosen")
    return (kept, Path(promoted_file).parent / FOLDER) if kept else None


def qdq(promoted_file: Path | None) -> dict[str, Any] | None:
    """The chosen step's QDQ model (path) and its quantize record, if it is still the one the repair made."""
    found = _chosen(promoted_file)
    if found is None:
        return None
    kept, folder = found
    path = folder / kept["qdq"]
    if not path.is_file() or sha256(path) != kept["qdq_sha256"]:
        return None
    return {"path": path, "record": {**kept["quantize"], "log": str(folder / kept["log"])}}


def binary(promoted_file: Path | None, source: Path, soc: str, options: dict[str, str]) -> dict[str, Any] | None:
    """The chosen step's compiled files (ctx_onnx, bin, seconds), when `source` is the QDQ they were compiled from
    and `soc`'s options are the ones they were compiled with."""
    found = _chosen(promoted_file)
    if found is None:
        return None
    kept, folder = found
    files = folder / kept["ctx_onnx"], folder / kept["bin"]
    if (kept["chip"] != soc or kept["options"] != options or not all(f.is_file() for f in files)
            or sha256(source) != kept["qdq_sha256"] or sha256(files[1]) != kept["bin_sha256"]):
        return None
    return {"ctx_onnx": files[0], "bin": files[1], "compile_seconds": kept["compile_seconds"]}


def outputs(promoted_file: Path | None, bin_path: Path | None, inputs_file: Path, samples: int,
            options: dict[str, str], cpu_fallback: bool) -> dict[str, Any] | None:
    """The chosen step's simulator outputs (file, seconds per inference), when `bin_path` is the binary that made
    them, on the same samples of the same inputs file with the same options (the repair allows no CPU fallback)."""
    found = _chosen(promoted_file)
    if found is None or bin_path is None or cpu_fallback or not Path(bin_path).is_file():
        return None
    kept, folder = found
    path = folder / kept["outputs"]
    if (kept["samples"] != samples or kept["options"] != options or not path.is_file()
            or sha256(Path(inputs_file)) != kept["inputs_sha256"] or sha256(Path(bin_path)) != kept["bin_sha256"]):
        return None
    return {"file": path, "seconds": kept["seconds"]}
