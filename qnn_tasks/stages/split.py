"""split: a graph declared with `split:` cut into parts, each a graph of its own from here on.

Writes, per part, what the graph stages would have made for it: the part's ONNX (where `simplify` keeps a
graph's), its verification inputs and its CPU reference (where `cpucheck` keeps them: the CPU outputs of the
parts before it on the graph's own inputs, so each part is verified against the CPU on the same inputs its
binary will get), and for w8a16 its calibration set the same way. The parts chained on CPU must give the unsplit
graph's CPU outputs (the end-to-end check here; the pipeline stage chains the binaries on the simulator).
`parts.json` gives each part's inputs and outputs (the cut tensors) for the stages after it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks import fileio
from qnn_tasks.errors import StageError
from qnn_tasks.graphs import onnxinfo
from qnn_tasks.graphs import split as cutter
from qnn_tasks.graphs.cpu import run_onnx_cpu
from qnn_tasks.judge import metrics, sample_store
from qnn_tasks.judge.metrics import DEFAULT_TOLERANCE
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall

PARTS_FILE = "parts.json"


def run(graph: GraphSpec, simplified: Path, inputs: Path, reference: Path, calibration: Path | None,
        parts: list[dict[str, str]], out_dir: Path) -> dict[str, Any]:
    where = f"{graph.model_dir / 'model.yaml'}: graphs.{graph.name}.split"
    light = cutter.load_light(simplified)
    try:
        if "at" in graph.split:
            cuts = [[t] for t in graph.split["at"]]
        else:
            cuts = cutter.balanced_cuts(light, graph.split["parts"], graph.precision, f"{where}.parts")
        rows = cutter.write_parts(simplified, cuts, [p["name"] for p in parts], [Path(p["onnx"]) for p in parts],
                                  graph.precision, f"{where}.at" if "at" in graph.split else f"{where}.parts")
    except cutter.SplitError as err:
        raise StageError(str(err)) from None
    io = {}
    for part, row in zip(parts, rows):
        found = onnxinfo.graph_io(cutter.load_light(Path(part["onnx"])))
        io[part["name"]] = {kind: [{"name": t["name"], "shape": t["shape"], "dtype": t["dtype"]} for t in found[kind]]
                            for kind in ("inputs", "outputs")}
        row["io"] = io[part["name"]]
    chained = _chain(parts, sample_store.load(inputs), "reference", "inputs")
    if calibration is not None:
        _chain(parts, sample_store.load(calibration), None, "calibration")
    whole = sample_store.load(reference)
    end = {}
    problems = []
    for name in whole[0]:
        end[name] = metrics.compare(np.stack([w[name] for w in whole]), np.stack([c[name] for c in chained]))
        problems += metrics.violations(name, end[name], DEFAULT_TOLERANCE)
    record = {"cuts": cuts, "parts": rows, "end_to_end_cpu": end, "thresholds": DEFAULT_TOLERANCE,
              "also_wrote": [f"{row['file']}.data" for row in rows if row["external_data"]]}  # a large part's weights
    if problems:
        raise StageError(f"{where}: the parts chained on CPU differ from the unsplit graph: " + "; ".join(problems)
                         + " (fix: cut elsewhere; report this graph if it persists)", record)
    fileio.write_json(out_dir / PARTS_FILE, io)
    return record


def _chain(parts: list[dict[str, str]], first: list[dict[str, np.ndarray]], outputs_key: str | None,
           inputs_key: str) -> list[dict[str, np.ndarray]]:
    """Run the parts one after the other on CPU from `first`; save each part's inputs (and its outputs); return the
    last part's outputs."""
    runs = [dict(s) for s in first]
    for part in parts:
        names = [t["name"] for t in onnxinfo.graph_io(cutter.load_light(Path(part["onnx"])))["inputs"]]
        fed = [{n: run[n] for n in names} for run in runs]
        sample_store.save(Path(part[inputs_key]), fed)
        out = run_onnx_cpu(Path(part["onnx"]), fed)
        if outputs_key:
            sample_store.save(Path(part[outputs_key]), out)
        for run, values in zip(runs, out):
            run.update(values)
        last = out
    return last  # a split makes 2+ parts


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), Path(a["simplified"]), Path(a["inputs"]), Path(a["reference"]),
               calls.path(a, "calibration"), a["parts"], Path(call.out_dir))
