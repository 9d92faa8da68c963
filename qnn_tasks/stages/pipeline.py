"""pipeline: a model's graphs chained on the host HTP simulator, judged at the end.

The first graph gets its own verification inputs; each later graph gets the NPU outputs of the
graphs before it (by name, or as `pipeline.feed` says). The same chain runs on CPU with the
simplified ONNX graphs. Error carried downstream is measured, not assumed: every link's outputs
are compared, and the last graph's are judged with the pipeline's thresholds and task checks.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks import fileio
from qnn_tasks.devices import simulator
from qnn_tasks.errors import StageError
from qnn_tasks.judge import checks as verification
from qnn_tasks.judge import metrics
from qnn_tasks.judge import samples as sample_store
from qnn_tasks.qnn import chipcheck as binchip
from qnn_tasks.run import calls, progress
from qnn_tasks.run.calls import StageCall
from qnn_tasks.spec.project import GraphSpec, Soc
from qnn_tasks.stages.cpucheck import run_onnx_cpu


def run(graphs: list[GraphSpec], ctx_files: list[Path], configs: list[Path], simplified: list[Path], inputs_file: Path,
        feed: dict[str, list[str]], verify: dict[str, Any], target: str, out_dir: Path,
        glue: dict[str, dict[str, Any]] | None = None,
        binaries: list[tuple[Path, str]] | None = None, soc: Soc | None = None) -> dict[str, Any]:
    if soc is not None:  # every link's binary (and its chip target) must be this chip's before any of them runs
        for binary, chip_target in binaries or []:
            binchip.refuse_other_chip(binary, soc, chip_target)
    first = sample_store.load(inputs_file, limit=verify["samples"])
    cpu_in, npu_in = first, first
    produced_cpu: list[dict[str, np.ndarray]] = [{} for _ in first]
    produced_npu: list[dict[str, np.ndarray]] = [{} for _ in first]
    links, log = [], out_dir / "simulator.log"
    for index, (graph, ctx, config, onnx_file) in enumerate(zip(graphs, ctx_files, configs, simplified)):
        if index:
            cpu_in = [_fed(graph, feed, done, glue or {}) for done in produced_cpu]
            npu_in = [_fed(graph, feed, done, glue or {}) for done in produced_npu]
        cpu_out = run_onnx_cpu(onnx_file, cpu_in)
        npu_out, seconds, _ = simulator.run(ctx, fileio.read_json(config), npu_in, log)
        links.append({"graph": graph.name, "seconds": float(np.sum(seconds)),
                      "metrics": {t.name: metrics.compare(np.stack([c[t.name] for c in cpu_out]),
                                                          np.stack([n[t.name] for n in npu_out])) for t in graph.outputs}})
        for done, out in zip(produced_cpu, cpu_out):
            done.update({f"{graph.name}.{k}": v for k, v in out.items()})
        for done, out in zip(produced_npu, npu_out):
            done.update({f"{graph.name}.{k}": v for k, v in out.items()})
        progress.step(index + 1, len(graphs), "graph")
    last = graphs[-1]
    reference = [{t.name: d[f"{last.name}.{t.name}"] for t in last.outputs} for d in produced_cpu]
    actual = [{t.name: d[f"{last.name}.{t.name}"] for t in last.outputs} for d in produced_npu]
    result, violations = verification.judge(last, verify, reference, actual)
    sample_store.save(out_dir / "outputs.npz", actual)
    sample_store.save(out_dir / "reference.npz", reference)
    record = {"samples": len(first), "links": links, **result, "violations": violations, "log": str(log),
              "outputs_file": str(out_dir / "outputs.npz"), "reference_file": str(out_dir / "reference.npz")}
    if violations:
        worst = min(links, key=lambda link: min(m["cosine"] for m in link["metrics"].values()))
        raise StageError(f"pipeline {target} failed at its end: " + "; ".join(violations) + f" (the weakest link is "
                         f"graph '{worst['graph']}': check its own simverify and doit diagnose)", record)
    return record


def _fed(graph: GraphSpec, feed: dict[str, list[str]], done: dict[str, np.ndarray],
         glue: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
    """Inputs of `graph` from the outputs produced so far (feed mapping first, else the latest output of that name),
    through the declared glue: value * scale + offset (in float64), reshaped to the input's shape."""
    inputs = {}
    for tensor in graph.inputs:
        source = feed.get(f"{graph.name}.{tensor.name}")
        key = f"{source[0]}.{source[1]}" if source else next(
            (k for k in reversed(list(done)) if k.split(".", 1)[1] == tensor.name), None)
        if key is None or key not in done:
            raise StageError(f"pipeline: nothing produced input '{tensor.name}' of graph '{graph.name}'")
        value = np.asarray(done[key])
        step = glue.get(f"{graph.name}.{tensor.name}")
        if step:
            if step["scale"] != 1.0 or step["offset"] != 0.0:
                value = value.astype(np.float64) * step["scale"] + step["offset"]
            value = value.reshape(tensor.shape) if step["reshape"] else value
        inputs[tensor.name] = value.astype(tensor.dtype, copy=False)
    return inputs


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run([calls.graph({"graph": g}) for g in a["graphs"]], [Path(p) for p in a["ctx"]],
               [Path(p) for p in a["configs"]], [Path(p) for p in a["simplified"]], Path(a["inputs"]), a["feed"],
               a["verify"], call.target, Path(call.out_dir), glue=a.get("glue"),
               binaries=[(Path(b), target) for b, target in a.get("binaries") or [] if b],
               soc=calls.soc(a) if a.get("soc") else None)
