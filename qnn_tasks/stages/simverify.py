"""simverify: run the compiled binary on the host HTP simulator and judge it against the CPU.

Inputs and reference outputs come from the cpucheck stage (real inputs, CPU outputs of the
same simplified graph). NPU outputs are kept beside the record for the report's plots.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .. import fileio, samples as sample_store, verification
from ..devices import simulator
from ..errors import StageError
from ..spec import GraphSpec, Soc

QUANTIZED_HINT = ("; 8-bit weights lose accuracy here: try calibration.per_channel: true, more and more varied "
                  "calibration samples, a finite mask constant (e.g. -1e4) at export, or keep this graph fp16")
SIMULATOR_LABEL = "x86 HTP simulator time on the build host (not phone latency)"


def run(graph: GraphSpec, verify: dict[str, Any], soc: Soc, ctx_onnx: Path, provider_options_file: Path, inputs_file: Path,
        reference_file: Path, out_dir: Path, target: str, precision: str) -> dict[str, Any]:
    inputs = sample_store.load(inputs_file, limit=verify["samples"])
    reference = sample_store.load(reference_file, limit=verify["samples"])
    options = fileio.read_json(provider_options_file)
    outputs, seconds, signature = simulator.run(ctx_onnx, options, inputs, out_dir / "simulator.log")
    check_signature(graph, signature, ctx_onnx)

    result, violations = verification.judge(graph, verify, reference, outputs)
    sample_store.save(out_dir / "outputs.npz", outputs)
    record = {"device": {"kind": "simulator", "name": "x86 HTP simulator (onnxruntime-qnn)"},
              "samples": len(inputs), **result, "timing": timing(seconds), "outputs_file": str(out_dir / "outputs.npz"),
              "reference_file": str(reference_file),
              "log": str(out_dir / "simulator.log"), "violations": violations}
    if violations:
        raise StageError(f"simverify of {target} failed: " + "; ".join(violations)
                         + (QUANTIZED_HINT if precision == "w8a16" else "") + accuracy_hints(graph)
                         + f" (to find the first diverging node: doit diagnose:{target})", record)
    return record


def accuracy_hints(graph: GraphSpec) -> str:
    """Lint's accuracy warnings that a built-in rewrite fixes: the likely cause of a failed comparison, named."""
    from ..matrix import BUILD_DIR

    try:
        lint = fileio.read_json(Path(BUILD_DIR) / graph.model / graph.name / "lint" / "lint.json")
    except (OSError, ValueError):
        return ""
    fixes = sorted({f["fix"] for f in lint.get("findings", [])
                    if f.get("severity") == "warning" and str(f.get("why", "")).startswith("accuracy")
                    and "rewrites" in f.get("fix", "")})
    return f"; lint warned of fp16 accuracy hazards: {'; '.join(fixes)}" if fixes else ""


def check_signature(graph: GraphSpec, signature: dict[str, list], ctx_onnx: Path) -> None:
    """The compiled model must produce exactly the outputs model.yaml declares, with their shapes."""
    declared = {t.name: list(t.shape) for t in graph.outputs}
    if signature != declared:
        raise StageError(f"{ctx_onnx}: outputs {signature} differ from model.yaml's {declared} "
                         f"(rebuild the context, or fix graphs.{graph.name}.outputs)")


def timing(seconds: list[float]) -> dict[str, Any]:
    values = np.asarray(seconds)
    return {"label": SIMULATOR_LABEL, "per_inference_median_s": float(np.median(values)),
            "per_inference_p90_s": float(np.percentile(values, 90)), "runs": len(seconds),
            "total_s": float(values.sum())}
