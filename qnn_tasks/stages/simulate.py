"""simulate: run the compiled binary on the host HTP simulator and keep its outputs.

The outputs are judged by the next stage (simverify), so a change to thresholds or checks
re-judges these kept outputs instead of simulating again. The binary must say it is for the
target's chip (qnn/binchip.py) before it is loaded. Only the binary, the inputs, the CPU
reference or the number of samples make this stage run again. The CPU vs NPU plot is drawn here,
once per simulation, so it is cached with the outputs it shows.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks import fileio
from qnn_tasks.devices import simulator
from qnn_tasks.devices.simulator import SIMULATOR_LABEL
from qnn_tasks.errors import StageError
from qnn_tasks.judge import plots, sample_store
from qnn_tasks.modelspec.project import GraphSpec, Soc
from qnn_tasks.qnn import binchip
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall
from qnn_tasks.toolchains import repairstep

OUTPUTS_FILE = "outputs.npz"
PLOT_FILE = "cpu_vs_npu.png"


def run(graph: GraphSpec, ctx_onnx: Path, provider_options_file: Path, inputs_file: Path, limit: int | None,
        out_dir: Path, reference_file: Path, title: str, soc_name: str, binary: Path | None = None,
        soc: Soc | None = None, target: str = "", promoted: Path | None = None) -> dict[str, Any]:
    """Simulate `ctx_onnx` on the inputs; a repaired variant's binary that its repair simulated on these very samples
    (`promoted`: the repair's promoted.json) keeps the repair's outputs (toolchains/repairstep.py)."""
    if binary is not None and soc is not None:  # before anything runs it: the file may not be the one compiled
        binchip.refuse_other_chip(binary, soc, target or title)
    inputs = sample_store.load(inputs_file, limit=limit)
    options = fileio.read_json(provider_options_file)
    log = out_dir / "simulator.log"
    adopted = repairstep.outputs(promoted, binary, inputs_file, len(inputs), options, graph.allow_cpu_fallback)
    if adopted:  # this very binary's outputs on these samples, simulated by the repair's chosen step
        outputs, seconds = sample_store.load(adopted["file"]), adopted["seconds"]
        log.write_text(f"# adopted {adopted['file']}: the repair simulated this binary on these samples\n")
        signature = {name: list(value.shape) for name, value in outputs[0].items()}
    else:
        # a CPU partition exists only where the graph allows it (the context stage refuses one otherwise)
        outputs, seconds, signature = simulator.run(ctx_onnx, options, inputs, log, graph.allow_cpu_fallback)
    check_signature(graph, signature, ctx_onnx)
    sample_store.save(out_dir / OUTPUTS_FILE, outputs)
    with np.load(reference_file) as reference:
        cpu = {name: reference[name][: len(outputs)] for name in reference.files}
    npu = {name: np.stack([o[name] for o in outputs]) for name in outputs[0]}
    plot = plots.outputs_plot(out_dir / PLOT_FILE, title, f"NPU ({soc_name})", npu, cpu)
    return {"device": {"kind": "simulator", "name": "x86 HTP simulator (onnxruntime-qnn)"}, "samples": len(inputs),
            "timing": timing(seconds), "outputs_file": str(out_dir / OUTPUTS_FILE), "log": str(log),
            "plot": str(plot), **({"adopted_from_repair": str(adopted["file"])} if adopted else {})}


def check_signature(graph: GraphSpec, signature: dict[str, list], ctx_onnx: Path) -> None:
    """The compiled model must produce exactly the outputs model.yaml declares, with their shapes."""
    declared = {t.name: list(t.shape) for t in graph.outputs}
    if signature != declared:
        raise StageError(f"{ctx_onnx}: outputs {signature} differ from model.yaml's {declared} "
                         f"(rebuild the context, or fix {graph.key}.outputs)")


def timing(seconds: list[float]) -> dict[str, Any]:
    values = np.asarray(seconds)
    return {"label": SIMULATOR_LABEL, "per_inference_median_s": float(np.median(values)),
            "per_inference_p90_s": float(np.percentile(values, 90)), "runs": len(seconds),
            "total_s": float(values.sum())}


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), Path(a["ctx_onnx"]), Path(a["provider_options"]), Path(a["inputs"]), a["samples"],
               Path(call.out_dir), Path(a["reference"]), a["title"], a["soc_name"],
               binary=calls.path(a, "binary"), soc=calls.soc(a) if a.get("soc") else None, target=call.target,
               promoted=calls.path(a, "promoted"))
