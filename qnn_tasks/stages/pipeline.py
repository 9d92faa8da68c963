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
from qnn_tasks.stages import glue as glue_step
from qnn_tasks.stages.cpucheck import run_onnx_cpu


def run(graphs: list[GraphSpec], ctx_files: list[Path], configs: list[Path], simplified: list[Path], inputs_file: Path,
        feed: dict[str, list[str]], verify: dict[str, Any], target: str, out_dir: Path,
        glue: dict[str, dict[str, Any]] | None = None,
        binaries: list[tuple[Path, str]] | None = None, soc: Soc | None = None) -> dict[str, Any]:
    if soc is not None:  # every link's binary (and its chip target) must be this chip's before any of them runs
        for binary, chip_target in binaries or []:
            binchip.refuse_other_chip(binary, soc, chip_target)
    first = sample_store.load(inputs_file, limit=first_samples(graphs, glue or {}, feed, verify["samples"]))
    produced_cpu: dict[str, glue_step.Runs] = {}
    produced_npu: dict[str, glue_step.Runs] = {}
    links, stacked, log = [], {}, out_dir / "simulator.log"
    for index, (graph, ctx, config, onnx_file) in enumerate(zip(graphs, ctx_files, configs, simplified)):
        cpu_in, npu_in, stacks = first, first, []
        if index:
            cpu_in, stacks = glue_step.feed_runs(graph, feed, glue or {}, graphs[:index], produced_cpu)
            npu_in, _ = glue_step.feed_runs(graph, feed, glue or {}, graphs[:index], produced_npu)
        if not cpu_in:
            raise StageError(f"pipeline {target}: graph '{graph.name}' has no run to make (its first graph has no "
                             "samples)")
        cpu_out = run_onnx_cpu(onnx_file, cpu_in)
        npu_out, seconds, _ = simulator.run(ctx, fileio.read_json(config), npu_in, log)
        links.append({"graph": graph.name, "runs": len(npu_in), "seconds": float(np.sum(seconds)),
                      "metrics": {t.name: metrics.compare(np.stack([c[t.name] for c in cpu_out]),
                                                          np.stack([n[t.name] for n in npu_out])) for t in graph.outputs},
                      **({"stacked": stacks} if stacks else {})})
        stacked.update({f"{graph.name}.{s['input']}": s for s in stacks})
        produced_cpu[graph.name], produced_npu[graph.name] = cpu_out, npu_out
        progress.step(index + 1, len(graphs), "graph")
    last = graphs[-1]
    reference = [{t.name: run[t.name] for t in last.outputs} for run in produced_cpu[last.name]]
    actual = [{t.name: run[t.name] for t in last.outputs} for run in produced_npu[last.name]]
    if verify["samples"] is not None:  # samples counts the end's runs: a stack ahead of it may give a few more
        reference, actual = reference[:verify["samples"]], actual[:verify["samples"]]
    result, violations = verification.judge(last, verify, reference, actual)
    sample_store.save(out_dir / "outputs.npz", actual)
    sample_store.save(out_dir / "reference.npz", reference)
    record = {"samples": len(actual), "first_samples": len(first), "links": links, **result,
              "violations": violations, "log": str(log),
              "outputs_file": str(out_dir / "outputs.npz"), "reference_file": str(out_dir / "reference.npz"),
              **({"stacked": stacked} if stacked else {})}
    if violations:
        worst = min(links, key=lambda link: min(m["cosine"] for m in link["metrics"].values()))
        raise StageError(f"pipeline {target} failed at its end: " + "; ".join(violations) + f" (the weakest link is "
                         f"graph '{worst['graph']}': check its own simverify and doit diagnose)", record)
    return record


def first_samples(graphs: list[GraphSpec], glue: dict[str, dict[str, Any]], feed: dict[str, list[str]],
                  end_samples: int | None) -> int | None:
    """How many of the first graph's samples make `end_samples` runs of the last graph (None: all of them):
    every stack on the way back to the first graph needs (runs - 1) * hop + its runs of its source."""
    if end_samples is None:
        return None
    needed, graph = end_samples, graphs[-1]
    by_name = {g.name: g for g in graphs}
    while graph is not graphs[0]:
        earlier = graphs[:graphs.index(graph)]
        tensor = graph.inputs[0]  # every input of a graph comes at one rate (checked at load): follow any
        from_graph, _ = glue_step.source(graph, tensor.name, feed, earlier)
        settings = (glue.get(f"{graph.name}.{tensor.name}") or {}).get("stack")
        if settings:
            needed = (needed - 1) * settings["hop"] + settings["runs"]
        graph = by_name[from_graph]
    return needed


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run([calls.graph({"graph": g}) for g in a["graphs"]], [Path(p) for p in a["ctx"]],
               [Path(p) for p in a["configs"]], [Path(p) for p in a["simplified"]], Path(a["inputs"]), a["feed"],
               a["verify"], call.target, Path(call.out_dir), glue=a.get("glue"),
               binaries=[(Path(b), target) for b, target in a.get("binaries") or [] if b],
               soc=calls.soc(a) if a.get("soc") else None)
