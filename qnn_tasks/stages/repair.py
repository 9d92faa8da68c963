"""repair: the fewest weights of a quantized graph to keep at 16 bits so that it passes its checks (precisions
w8a16-mixed and w4a16-mixed: plain w8a16 or w4a16 repaired).

Measured on the NPU's own arithmetic, on one chip's x86 HTP simulator (the first chip the variant builds for):
1. the plain precision (no weight promoted) is quantized, compiled, run on the verification inputs and judged by the
   graph's checks for the repaired precision (thresholds and task checks, as simverify judges: a task check such as
   a transcript's words stops the search, not the cosine alone); if it passes, nothing is promoted;
2. sensitivity: the plain step's quantized graph with the dequantized activations the ranking reads as outputs
   (graphs/intermediates.py), compiled and run on the simulator beside the float graph's same tensors on the CPU,
   on the first verification sample; each weight-bearing node (Conv, ConvTranspose, MatMul, Gemm, as the
   quantizer's fusions left them) is scored by the error it creates: its output's relative error less its input's.
   No second quantization: measured on a 30M transformer, the same errors to six digits as quantizing the float
   graph with its intermediates exposed, which took 22 GB on a 500M one;
3. promotion: the top 1, 2, 4, ... ranked weights are kept at 16 bits (signed, symmetric, per channel: the
   quantizer's per-tensor overrides) until the checks pass, then the fewest between the last failing and the first
   passing count is searched by halving, while the budget of compiles lasts.
Deterministic (fixed inputs, ranking ties broken by graph order). The record lists every step: the weights
promoted, their share of the graph's weight bytes, the binary's size and the judged metrics. No passing step within
the budget fails the stage in one line naming what was tried and the best result.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks import fileio
from qnn_tasks.devices import simulator
from qnn_tasks.errors import StageError
from qnn_tasks.graphs.intermediates import expose_dequantized, expose_intermediates
from qnn_tasks.graphs.weights import weight_axes
from qnn_tasks.judge import sample_store, verification
from qnn_tasks.modelspec import precision_table
from qnn_tasks.modelspec.checks import DEFAULT_REPAIR_BUDGET
from qnn_tasks.modelspec.project import GraphSpec, Soc
from qnn_tasks.plan.paths import PROMOTED_FILE
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall
from qnn_tasks.toolchains import calltoolchain, repairstep

SENSITIVITY_SAMPLES = 1  # verification samples the ranking is measured on: each costs a simulation of the graph
FOLDED = ("Relu", "Clip")   # activations onnxruntime's QDQ quantizer drops after an op, its output taking their range


def run(graph: GraphSpec, verify: dict[str, Any], soc: Soc, toolchain, simplified: Path, calibration: Path,
        inputs_file: Path, reference_file: Path, out_dir: Path, budget: int = DEFAULT_REPAIR_BUDGET,
        precision: str = "w8a16-mixed") -> dict[str, Any]:
    """Search the promotion of `precision` (a repaired one) for `graph` on `soc` with `toolchain`; write
    promoted.json; return the record."""
    from qnn_tasks.toolchains.ort_quantize import quantize_model

    if not hasattr(toolchain, "compile_variant"):
        raise StageError(f"the precision repair needs a toolchain that compiles a derived model (ort-qnn); "
                         f"{toolchain.kind} does not (fix: build this graph with an ort-qnn toolchain, or "
                         f"precision: {precision_table.BY_NAME[precision].base})")
    start = time.monotonic()
    work = out_dir / ".work"
    work.mkdir(parents=True, exist_ok=True)
    samples = sample_store.load(calibration)
    # judged on the samples simverify judges (verify.samples of them), so a step that passes here passes there
    count = verify.get("samples")
    inputs, reference = sample_store.load(inputs_file, limit=count), sample_store.load(reference_file, limit=count)
    plain_precision = precision_table.BY_NAME[precision].base
    options = toolchain.write_config(graph, plain_precision, soc, work)["provider_options"]
    prepared, weights = prepare(simplified, work, precision_table.BY_NAME[precision].weight_bits)
    total = sum(w["bytes"] for w in weights.values()) or 1
    steps: list[dict[str, Any]] = []

    made: list[dict[str, Any]] = []  # per step: its files and timings, for repairstep.keep
    inputs_sha256 = fileio.sha256(inputs_file)

    def attempt(promoted: list[str]) -> dict[str, Any]:
        began_step = time.monotonic()
        folder = work / f"step{len(steps)}"
        folder.mkdir(parents=True, exist_ok=True)
        qdq = folder / "qdq.onnx"
        quantized = quantize_model(graph, precision, prepared, samples, qdq, folder, promoted=promoted,
                                   prepared=True)
        began = time.monotonic()
        # named as the context stage names its files, so the variant's build can adopt them (toolchains/repairstep.py)
        ctx = toolchain.compile_variant(qdq, options, folder / "compiled", name=graph.name)
        compile_seconds = round(time.monotonic() - began, 3)
        outputs, seconds, _ = simulator.run(ctx, options, inputs, folder / "simulator.log")
        sample_store.save(folder / repairstep.OUTPUTS, outputs)
        made.append({"qdq": "qdq.onnx", "log": "quantize.log", "quantize": quantized, "ctx_onnx": f"compiled/{ctx.name}",
                     "bin": f"compiled/{ctx.stem}_qnn.bin", "outputs": repairstep.OUTPUTS, "chip": soc.name,
                     "options": options, "inputs_sha256": inputs_sha256, "samples": len(inputs),
                     "compile_seconds": compile_seconds, "seconds": seconds})
        result, violations = verification.judge(graph, verify, reference, outputs)
        step = {"promoted": promoted, "weight_bytes": sum(weights[w]["bytes"] for w in promoted),
                "share": round(sum(weights[w]["bytes"] for w in promoted) / total, 4),
                "binary_bytes": sum(f.stat().st_size for f in ctx.parent.glob("*.bin")),
                "min_cosine": verification.min_cosine(result), "checks": [{k: c.get(k) for k in ("kind", "value", "passed")}
                                                              for c in result.get("checks", [])],
                "passed": not violations, "violations": violations[:3],
                "seconds": round(time.monotonic() - began_step, 1)}
        steps.append(step)
        return step

    plain = attempt([])
    ranked: list[dict[str, Any]] = []
    sensitivity_seconds = None
    if not plain["passed"]:
        began = time.monotonic()
        ranked = sensitivity(work / "step0" / "qdq.onnx", prepared, inputs, options, toolchain, weights, work)
        sensitivity_seconds = round(time.monotonic() - began, 1)
    found = _search([r["weight"] for r in ranked], attempt, budget - 2) if ranked else None
    chosen = [] if plain["passed"] else found
    record = {"chip": soc.name, "budget": budget, "compiles": len(steps) + (1 if ranked else 0),
              "seconds": round(time.monotonic() - start, 1), "plain": {"precision": plain_precision, **{
                  k: plain[k] for k in ("min_cosine", "checks", "passed", "binary_bytes")}},
              "ranked": ranked[:20], "sensitivity_seconds": sensitivity_seconds, "steps": steps,
              "weights": len(weights), "weight_bytes": total}
    if chosen is None:
        best = max(steps, key=lambda s: (s["passed"], s["min_cosine"] if s["min_cosine"] is not None else -2))
        tried = ", ".join(str(len(s["promoted"])) for s in steps[1:]) or "none"
        said = (f"repair of '{graph.name}' on {soc.name}: no promotion within the budget of {budget} compiles passes "
                f"its checks: promoted {tried} of {len(ranked)} ranked weights; best: {len(best['promoted'])} "
                f"promoted ({', '.join(best['promoted'][:4]) or 'none'}), min cosine {best['min_cosine']}, "
                f"{'; '.join(best['violations'][:1])}")
        if not graph.auto:
            raise StageError(f"{said} (fix: raise calibration.repair_budget, or {_wider(precision)})", record)
        # a `precision: auto` candidate: rejected, built with its best step so its verdict is judged like any other
        record["rejected"], chosen = said, best["promoted"]
    index, final = next((i, s) for i, s in enumerate(steps) if s["promoted"] == chosen)
    promoted = [{**weights[w], "weight": w, **_score(ranked, w)} for w in chosen]
    kept = repairstep.keep(work / f"step{index}", out_dir, made[index])
    fileio.write_json(out_dir / PROMOTED_FILE, {"promoted": promoted, "share": final["share"], "chosen": kept})
    record.update(promoted=promoted, share=final["share"], weight_bytes_promoted=final["weight_bytes"],
                  binary_bytes=final["binary_bytes"], min_cosine=final["min_cosine"],
                  size_ratio=round(final["binary_bytes"] / plain["binary_bytes"], 4) if plain["binary_bytes"] else None)
    return record


def prepare(simplified: Path, work: Path, bits: int) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The graph as the quantizer sees it (preprocessed once: every step quantizes it, the sensitivity runs it) and
    its promotable weights, read from that graph: the quantizer's fusions rename what a weight's node makes (MatMul
    and its bias Add become a Gemm)."""
    import onnx

    from qnn_tasks.toolchains.ort_quantize import preprocessed

    prepared = preprocessed(simplified, work / "prepared")
    model = onnx.load(str(prepared), load_external_data=False)
    return prepared, _weights(model, weight_axes(model), bits)


def sensitivity(plain_qdq: Path, prepared: Path, inputs: list, options: dict[str, str], toolchain,
                weights: dict[str, dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """The weight-bearing nodes ranked by the error each creates on the simulator (its output's relative error less
    the worst of its inputs'), largest first, ties in graph order. `prepared`: the float graph as the quantizer saw
    it (after its fusions)."""
    import onnx

    from qnn_tasks.graphs.cpu import run_onnx_cpu

    folder = work / "sensitivity"
    folder.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(prepared))
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def chain(name: str) -> list[str]:
        """`name`, then the outputs of the Relu or Clip that alone reads it, and so on: where the quantizer dropped
        such an activation (giving the op its range), the activation's output is what was quantized and measured."""
        names = [name]
        while len(consumers.get(names[-1], ())) == 1 and consumers[names[-1]][0].op_type in FOLDED:
            names.append(consumers[names[-1]][0].output[0])
        return names

    # only the tensors the ranking reads are outputs: each weight-bearing node's output and inputs
    needed = {name for w in weights.values() for tensor in [w["output"], *w["inputs"]] for name in chain(tensor)}
    diag, _ = expose_intermediates(model, only=needed)  # the CPU side
    diag_path = folder / "intermediates.onnx"
    onnx.save(diag, str(diag_path))
    del model, diag
    picked = inputs[:SENSITIVITY_SAMPLES]
    cpu = run_onnx_cpu(diag_path, picked)
    # the NPU side: the plain step's own QDQ, saved beside it so its external data (if any) is found where it is
    exposed, stands_for = expose_dequantized(onnx.load(str(plain_qdq), load_external_data=False), only=needed)
    exposed_path = plain_qdq.with_name("sensitivity.onnx")
    onnx.save(exposed, str(exposed_path))
    try:
        ctx = toolchain.compile_variant(exposed_path, options, folder / "compiled")
    finally:  # not left in the plain step's folder, whose files the variant may adopt
        exposed_path.unlink(missing_ok=True)
    npu, _, _ = simulator.run(ctx, options, picked, folder / "simulator.log", allow_cpu_fallback=True)
    # a graph output keeps its name on the dequantized side (the quantizer renames what feeds it)
    known = set(cpu[0])
    npu = [{(stands_for[name] if stands_for.get(name) in known else name): value for name, value in sample.items()}
           for sample in npu]
    error = {name: float(np.mean([_relative(c[name], n[name]) for c, n in zip(cpu, npu)]))
             for name in cpu[0] if all(name in n for n in npu)}
    error = {name: value for name, value in error.items() if np.isfinite(value)}

    def measured(name: str) -> float | None:
        return next((error[n] for n in chain(name) if n in error), None)

    ranked = []
    for w in weights.values():
        made = measured(w["output"])
        if made is None:
            continue
        carried = max((measured(i) or 0.0 for i in w["inputs"]), default=0.0)
        ranked.append({"weight": w["name"], "node": w["node"], "op": w["op"], "error": round(made, 6),
                       "created": round(made - carried, 6), "index": w["index"]})
    ranked.sort(key=lambda r: (-r["created"], r["index"]))
    return ranked


def _search(ranked: list[str], attempt, budget: int) -> list[str] | None:
    """The fewest top-ranked weights whose promotion passes: doubling, then halving between the last failing and
    the first passing count, each try one compile of `budget`."""
    low, high, count, spent = 0, None, 1, 0
    while spent < budget and count <= len(ranked):
        spent += 1
        if attempt(ranked[:count])["passed"]:
            high = count
            break
        low = count
        if count == len(ranked):
            break
        count = min(2 * count, len(ranked))
    if high is None:
        return None
    while spent < budget and high - low > 1:
        middle = (low + high) // 2
        spent += 1
        if attempt(ranked[:middle])["passed"]:
            high = middle
        else:
            low = middle
    return ranked[:high]


def _wider(precision: str) -> str:
    """The next precision to try when a repair finds no promotion: 8-bit weights before float."""
    return "precision: w8a16-mixed or fp16" if precision_table.BY_NAME[precision].weight_bits < 8 else "precision: fp16"


def _weights(model, axes: dict[str, int], bits: int) -> dict[str, dict[str, Any]]:
    """Each promotable weight: its node, op, output, activation inputs and bytes at `bits` (the plain precision's)."""
    sizes = {t.name: int(np.prod(t.dims)) if t.dims else 1 for t in model.graph.initializer}
    found: dict[str, dict[str, Any]] = {}
    for index, node in enumerate(model.graph.node):
        if len(node.input) > 1 and node.input[1] in axes and node.input[1] not in found:
            found[node.input[1]] = {"name": node.input[1], "node": node.name or node.output[0], "op": node.op_type,
                                    "output": node.output[0], "inputs": [i for i in node.input if i not in sizes],
                                    "index": index, "bytes": sizes[node.input[1]] * bits // 8}
    return found


def _score(ranked: list[dict[str, Any]], weight: str) -> dict[str, Any]:
    found = next((r for r in ranked if r["weight"] == weight), {})
    return {k: found[k] for k in ("error", "created") if k in found}


def _relative(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = np.asarray(ref, dtype=np.float64).ravel(), np.asarray(got, dtype=np.float64).ravel()
    if ref.shape != got.shape:
        return float("nan")
    scale = np.linalg.norm(ref)
    return float(np.linalg.norm(got - ref) / scale) if scale > 0 else float(np.linalg.norm(got))


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), a["verify"], calls.soc(a), calltoolchain.toolchain(call), Path(a["simplified"]),
               Path(a["calibration"]), Path(a["inputs"]), Path(a["reference"]), Path(call.out_dir),
               budget=a["budget"], precision=a.get("precision", "w8a16-mixed"))
