"""pipeline: a model's graphs chained on the host HTP simulator, judged at the end.

The first graph gets its own verification inputs; each later graph gets the NPU outputs of the
graphs before it (by name, or as `pipeline.feed` says). The same chain runs on CPU with the
simplified ONNX graphs. Error carried downstream is measured, not assumed: every link's outputs
are compared, and the last graph's are judged with the pipeline's thresholds and task checks.
When the first graph's own simulate stage already ran its binary on the samples the chain starts
from (`first_outputs`), its kept outputs start the NPU chain: the same binary on the same inputs,
so a window that takes minutes on the simulator is simulated once.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks import fileio
from qnn_tasks.devices import simulator
from qnn_tasks.errors import StageError
from qnn_tasks.graphs.cpu import run_onnx_cpu
from qnn_tasks.judge import degenerate, metrics, sample_store, verification
from qnn_tasks.judge import glue as glue_step
from qnn_tasks.modelspec.project import GraphSpec, Soc
from qnn_tasks.modelspec.specpipeline import Naming, first_samples
from qnn_tasks.qnn import binchip
from qnn_tasks.run import calls, progress
from qnn_tasks.run.calls import StageCall


def run(graphs: list[GraphSpec], ctx_files: list[Path], configs: list[Path], simplified: list[Path], inputs_file: Path,
        feed: dict[str, list[str]], verify: dict[str, Any], target: str, out_dir: Path,
        glue: dict[str, dict[str, Any]] | None = None,
        binaries: list[tuple[Path, str]] | None = None, soc: Soc | None = None,
        first_outputs: Path | None = None, first_record: Path | None = None, size: str = "",
        values: dict[str, Any] | None = None) -> dict[str, Any]:
    # `size`: one size's chain of a pipeline over graphs with sizes; messages name its graphs as model.yaml does
    naming = Naming({g.name: g for g in graphs}, per_size=bool(size))
    if soc is not None:  # every link's binary (and its chip target) must be this chip's before any of them runs
        for binary, chip_target in binaries or []:
            binchip.refuse_other_chip(binary, soc, chip_target)
    first = sample_store.load(inputs_file, limit=first_samples(graphs, glue or {}, feed, verify["samples"], values))
    produced_cpu: dict[str, glue_step.Runs] = {}
    produced_npu: dict[str, glue_step.Runs] = {}
    links, stacked, log, flat_links = [], {}, out_dir / "simulator.log", []
    for index, (graph, ctx, config, onnx_file) in enumerate(zip(graphs, ctx_files, configs, simplified)):
        cpu_in, npu_in, stacks = first, first, []
        if index:
            # constants (`{value: ...}`) go to both chains alike, beside what each chain made
            cpu_in, stacks = glue_step.feed_runs(graph, feed, glue or {}, graphs[:index], produced_cpu, naming, values)
            npu_in, _ = glue_step.feed_runs(graph, feed, glue or {}, graphs[:index], produced_npu, naming, values)
            flat = degenerate.constant_inputs(cpu_in)
            if flat and flat == degenerate.constant_inputs(npu_in):  # e.g. a glue that multiplies by 0
                flat_links.append(f"not verified: {naming.graph(graph.name)} gets inputs where {flat}, on both chains "
                                  f"(fix: check pipeline.feed for '{naming.written(graph.name)}': a scale of 0, or an "
                                  "output that does not vary)")
        if not cpu_in:
            raise StageError(f"pipeline {target}: {naming.graph(graph.name)} has no run to make (its first graph has "
                             "no samples)")
        cpu_out = run_onnx_cpu(onnx_file, cpu_in)
        kept = first_outputs if index == 0 else None  # the first graph's simulate stage ran these very runs
        if kept is not None:
            npu_out, seconds = kept_outputs(kept, len(npu_in), graph, target, first_record, naming)
        else:
            npu_out, seconds = simulator.run(ctx, fileio.read_json(config), npu_in, log, graph.allow_cpu_fallback)[:2]
        links.append({"graph": graph.name, "runs": len(npu_in), "seconds": float(np.sum(seconds)),
                      **({"simulated_by": str(kept)} if kept is not None else {}),
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
    violations = flat_links + violations
    if flat_links:
        result["not_verified"] = "; ".join(flat_links + ([result["not_verified"]] if "not_verified" in result else []))
    sample_store.save(out_dir / "outputs.npz", actual)
    sample_store.save(out_dir / "reference.npz", reference)
    record = {"samples": len(actual), "first_samples": len(first), "links": links, **result,
              "violations": violations, "log": str(log),
              "outputs_file": str(out_dir / "outputs.npz"), "reference_file": str(out_dir / "reference.npz"),
              **({"stacked": stacked} if stacked else {})}
    if violations:
        worst = min(links, key=weakness)
        raise StageError(f"pipeline {target} failed at its end: " + "; ".join(violations) + " (the weakest link is "
                         f"{naming.graph(worst['graph'])}: check its own simverify and doit diagnose)", record)
    return record


def weakness(link: dict[str, Any]) -> float:
    """A link's worst cosine, a NaN one (non-finite outputs) counted as the worst of all."""
    cosines = [m["cosine"] for m in link["metrics"].values()]
    return float("-inf") if any(c != c for c in cosines) else min(cosines, default=1.0)


def kept_outputs(outputs_file: Path, runs: int, graph: GraphSpec, target: str,
                 record: Path | None = None, naming: Naming | None = None) -> tuple[glue_step.Runs, list[float]]:
    """The first `runs` outputs the first graph's simulate stage kept, and its seconds for them (from its record,
    when there is one: timing only, never a verdict)."""
    kept = sample_store.load(outputs_file, limit=runs)
    if len(kept) < runs or set(kept[0]) != {t.name for t in graph.outputs}:
        named = (naming or Naming({graph.name: graph})).graph(graph.name)
        raise StageError(f"pipeline {target}: {outputs_file} holds {len(kept)} runs of {sorted(kept[0]) if kept else []}, "
                         f"not {runs} runs of the outputs of {named} (rerun its simulate task)")
    try:
        timing = fileio.read_json(record)["timing"]
        per_run = timing["total_s"] / timing["runs"]
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        per_run = 0.0
    return kept, [per_run] * runs


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run([calls.graph({"graph": g}) for g in a["graphs"]], [Path(p) for p in a["ctx"]],
               [Path(p) for p in a["configs"]], [Path(p) for p in a["simplified"]], Path(a["inputs"]), a["feed"],
               a["verify"], call.target, Path(call.out_dir), glue=a.get("glue"),
               binaries=[(Path(b), target) for b, target in a.get("binaries") or [] if b],
               soc=calls.soc(a) if a.get("soc") else None, first_outputs=calls.path(a, "first_outputs"),
               first_record=calls.path(a, "first_record"), size=a.get("size", ""), values=a.get("values"))
