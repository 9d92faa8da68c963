"""diagnose: find the first node where the NPU diverges from the CPU, and say why.

Every floating-point intermediate tensor becomes an extra graph output; that diagnostic graph
is compiled for the same chip with the same options and run on the simulator and on the CPU
with identical inputs (recurrent state included, taken from the CPU run), so each tensor's
error is per-step error only. Nodes are ranked in graph order by relative max-abs error; the
first past the threshold is explained with its op, attributes, worst element and known hazards.

Exposing intermediates can change how QNN fuses nodes. When the diagnostic graph does not
reproduce the failure, the graph is cut instead (prefix up to node k, compiled as is) and the
first diverging cut is found by bisection.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks import fileio
from qnn_tasks.devices import simulator
from qnn_tasks.graphs.cpu import run_onnx_cpu
from qnn_tasks.graphs.intermediates import expose_intermediates
from qnn_tasks.judge import metrics, padding, sample_store, verification
from qnn_tasks.modelspec import precision_table
from qnn_tasks.modelspec.project import GraphSpec, Soc
from qnn_tasks.run import calls, records
from qnn_tasks.run.calls import StageCall
from qnn_tasks.toolchains import calltoolchain

DEFAULT_THRESHOLD = 0.05  # relative error (see relative_error) that counts as diverged
JUMP = 10.0               # ... and that is this many times its inputs' error (error created here, not carried)
FP16_TINY = 6.1e-5        # below this fp16 loses precision (subnormal), below 6e-8 it underflows to 0
FP16_MAX = 65504.0
CAVEAT = ("Exposing every intermediate tensor as an output can change how QNN fuses nodes, so the "
          "diagnostic graph may not behave exactly like the shipped one.")

def run(graph: GraphSpec, verify: dict[str, Any], soc: Soc, toolchain, simplified: Path, provider_options_file: Path, inputs_file: Path,
        reference_file: Path, out_dir: Path, shipped_failed: bool | None = None,
        threshold: float = DEFAULT_THRESHOLD, limit: int | None = None, binary: str | None = None,
        precision: str = "fp16", cpucheck_record: Path | None = None) -> dict[str, Any]:
    """Diagnose `graph` on `soc`; `toolchain` compiles variants with the chip's provider options.

    `shipped_failed` is the shipped binary's simverify verdict when known: if it failed and the
    diagnostic graph does not reproduce that, the graph is bisected by cutting instead.
    """
    import onnx

    inputs = sample_store.load(inputs_file, limit=limit)
    reference = sample_store.load(reference_file, limit=limit)
    options = fileio.read_json(provider_options_file)
    model = onnx.load(str(simplified))
    diag_model, tensors = expose_intermediates(model)
    diag_path = out_dir / f"{graph.name}_diagnostic.onnx"
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(diag_model, str(diag_path))

    cpu = run_onnx_cpu(diag_path, inputs)
    compiled = toolchain.compile_variant(diag_path, options, out_dir / "compiled")
    npu, _, _ = simulator.run(compiled, options, inputs, out_dir / "simulator.log", allow_cpu_fallback=True)

    nodes = rank_nodes(model, tensors, cpu, npu)
    final, final_violations = verification.judge(graph, verify, reference, [
        {o.name: n[o.name] for o in graph.outputs} for n in npu])
    reproduced = bool(final_violations)
    method = "all-intermediates"
    first = first_jump(model, nodes, threshold)
    if shipped_failed and not reproduced:
        # The diagnostic graph compiled differently and hides the failure: cut the graph instead.
        method = "bisect"
        first = bisect(model, tensors, inputs, toolchain, options, out_dir, threshold) or first
    if first and method != "bisect":
        first = cancellation_source(model, nodes, first, cpu, threshold) or first
    detail = explain(model, first, cpu, npu, inputs, precision, graph) if first else None
    if detail and precision == "fp16":
        advise_scale_input(model, detail, [{**i, **c} for i, c in zip(inputs, cpu)], graph)
    if detail:
        blame_padding(graph, detail, cpu, npu, threshold, records.read(cpucheck_record) if cpucheck_record else None)
    record = {"threshold_rel_max_abs": threshold, "jump_factor": JUMP, "samples": len(inputs), "method": method,
              "shipped_binary_failed": shipped_failed,
              "diagnostic_reproduces_failure": reproduced, "final_output_violations": final_violations,
              "caveat": CAVEAT, "first_divergence": detail, "nodes": nodes,
              "verdict": verdict(detail, nodes, threshold, final, verify),
              "diagnosed": {"binary": binary, "binary_sha256": records.sha256(binary) if binary and Path(binary).is_file()
                            else None, "inputs_sha256": records.sha256(inputs_file)}}
    plot = out_dir / "error_along_graph.png"
    plot_errors(nodes, threshold, first, plot, f"{graph.name} on {soc.name}")
    record["plot"] = str(plot)
    md = out_dir / "diagnose.md"
    with fileio.atomic_path(md) as tmp:
        tmp.write_text(markdown(graph, soc, record))
    record["summary"] = str(md)
    record["console"] = [record["verdict"]["text"], f"details: {md}"]
    return record


# ------------------------------------------------------------------ diagnostic graph

def first_jump(model, nodes: list[dict[str, Any]], threshold: float) -> dict[str, Any] | None:
    """First node (graph order) whose error passes `threshold` AND is JUMP x its inputs' worst error.

    The jump separates a node that creates error (Pow giving -4) from fp16 rounding that
    accumulates gradually through a deep stack of Convs.
    """
    error = {n["tensor"]: n["rel_max_abs"] for n in nodes}
    for n in nodes:
        node = model.graph.node[n["index"]]
        upstream = max((error.get(i, 0.0) for i in node.input), default=0.0)
        if n["rel_max_abs"] > threshold and n["rel_max_abs"] > JUMP * upstream:
            return n
    return None


def rank_nodes(model, tensors: list[dict[str, Any]], cpu: list[dict[str, np.ndarray]],
               npu: list[dict[str, np.ndarray]]) -> list[dict[str, Any]]:
    """Error of every exposed tensor, in graph order."""
    rows = []
    for t in tensors:
        ref = np.stack([c[t["tensor"]] for c in cpu]).astype(np.float64)
        got = np.stack([n[t["tensor"]] for n in npu]).astype(np.float64)
        m = metrics.compare(ref, got)
        rows.append({**t, "rel_max_abs": relative_error(ref, got), "max_abs": m["max_abs"], "cosine": m["cosine"],
                     "cpu_abs_max": float(np.abs(ref).max(initial=0.0)), "non_finite": m["non_finite"]})
    return rows


def relative_error(ref: np.ndarray, got: np.ndarray) -> float:
    """Worst per-sample max |NPU - CPU| relative to that sample's own scale (see sample_errors)."""
    return float(sample_errors(ref, got).max(initial=0.0))


def sample_errors(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """Each sample's max |NPU - CPU| relative to that sample's own scale (inf where the NPU gave a non-finite value).

    Per sample, because garbage on a quiet frame (Pow giving -4 where the CPU has 1e-13) is
    invisible next to a loud frame's scale; the scale is floored at 1e-3 of the tensor's overall
    scale so fp16 rounding of near-zero samples does not count as divergence.
    """
    axes = tuple(range(1, ref.ndim))
    overall = float(np.abs(ref).max(initial=0.0))
    scale = np.maximum(np.abs(ref).max(axis=axes, initial=0.0), 1e-3 * overall)
    with np.errstate(invalid="ignore"):
        diff = np.abs(got - ref).max(axis=axes, initial=0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1), np.where(diff > 0, np.inf, 0.0))
    return np.where(np.isfinite(got).all(axis=axes), rel, np.inf)


# ------------------------------------------------------------------ bisection fallback

def bisect(model, tensors, inputs, toolchain, options: dict[str, str], out_dir: Path,
           threshold: float) -> dict[str, Any] | None:
    """First tensor whose prefix graph, compiled as is, diverges (assumes divergence persists downstream)."""
    import onnx
    from onnx.utils import Extractor

    input_names = [i.name for i in model.graph.input if i.name not in {x.name for x in model.graph.initializer}]
    extractor = Extractor(model)

    def diverges(k: int) -> tuple[bool, dict[str, Any]]:
        t = tensors[k]
        cut = extractor.extract_model(input_names, [t["tensor"]])
        path = out_dir / "bisect" / f"cut_{k}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(cut, str(path))
        cpu = run_onnx_cpu(path, inputs)
        npu, _, _ = simulator.run(toolchain.compile_variant(path, options, path.parent / f"cut_{k}"), options, inputs,
                                  out_dir / "bisect" / "simulator.log", allow_cpu_fallback=True)
        row = rank_nodes(model, [t], cpu, npu)[0]
        return row["rel_max_abs"] > threshold, row

    lo, hi, found = 0, len(tensors) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        bad, row = diverges(mid)
        if bad:
            found, hi = row, mid - 1
        else:
            lo = mid + 1
    return found


# ------------------------------------------------------------------ verdicts

CANCELLATION_RATIO = 1e-2  # a Sub whose output is this much smaller than its inputs cancels


def cancellation_source(model, nodes: list[dict[str, Any]], first: dict[str, Any], cpu,
                        threshold: float) -> dict[str, Any] | None:
    """An upstream Sub of nearly equal values that already carries error, where the error was born.

    Variance as E[x^2] - E[x]^2 cancels in fp16: the Sub's result is tiny next to its inputs and
    mostly rounding noise, yet that shows as a jump only at a later Reciprocal or Div.
    """
    by_tensor = {n["tensor"]: n for n in nodes}
    producers = {o: i for i, node in enumerate(model.graph.node) for o in node.output}
    frontier, seen, quiet = [model.graph.node[first["index"]]], set(), None
    for _ in range(4):  # a few hops up: Sub -> Add(eps) -> Sqrt -> Reciprocal
        nxt = []
        for node in frontier:
            for name in node.input:
                index = producers.get(name)
                if index is None or index in seen:
                    continue
                seen.add(index)
                upstream = model.graph.node[index]
                row = by_tensor.get(upstream.output[0])
                if upstream.op_type == "Sub" and row and cancels(upstream, cpu):
                    if row["rel_max_abs"] > threshold / JUMP:
                        return {**row, "cancellation": True}
                    # its own error looks small (its output is tiny), yet a difference of two large nearly equal
                    # values feeding the diverging node is the known cause: named if nothing carries more error
                    quiet = quiet or {**row, "cancellation": True}
                nxt.append(upstream)
        frontier = nxt
    return quiet


def cancels(node, cpu) -> bool:
    a, b, out = (np.abs(np.stack([c[t] for c in cpu])) if t in cpu[0] else None for t in (*node.input[:2], node.output[0]))
    if a is None or b is None or out is None:
        return False
    scale = np.maximum(a, b) if a.shape == b.shape else np.maximum(a.max(), b.max())
    return float(np.median(out / np.maximum(scale, 1e-30))) < CANCELLATION_RATIO


def verdict(first: dict[str, Any] | None, nodes: list[dict[str, Any]], threshold: float, final: dict[str, Any],
            verify: dict[str, Any]) -> dict[str, Any]:
    """What a person should conclude, in words that agree with the table and the plot."""
    over = [n for n in nodes if n["rel_max_abs"] > threshold]
    cosines = [m["cosine"] for m in final["metrics"].values() if m.get("cosine") is not None and np.isfinite(m["cosine"])]
    if first:
        hazard = "; ".join(f"{h['hazard']}: {h['fix']}" for h in first.get("hazards") or [])
        return {"kind": "node", "text": f"first divergence at {first['op_type']} node '{first['node']}' (relative error "
                f"{first['rel_max_abs']:.3g})" + (f" — {hazard}" if hazard else "")}
    if over:
        worst = min(cosines) if cosines else None
        kinds = dict.fromkeys(c["kind"] for c in verify.get("checks") or [])  # each kind once, in declared order
        checks = ", ".join(kinds) or "a task-level check (agreement, ranking, top1, wer)"
        suggestion = (f"; outputs reach cosine {worst:.4f}: gate on {checks} and set min_cosine to about "
                      f"{np.floor(worst * 1000) / 1000 - 0.001:.3f}" if worst is not None else "")
        return {"kind": "gradual", "text": f"{len(over)} of {len(nodes)} nodes are past the {threshold} threshold, but "
                f"none creates its error (each stays within {JUMP:g}x of its inputs' error): the error accumulates "
                f"gradually through the graph (typical of recurrent stacks), with no single node to blame{suggestion}"}
    return {"kind": "clean", "text": f"no node's error passes {threshold} (relative); the NPU follows the CPU closely"}


# ------------------------------------------------------------------ explanation

def explain(model, first: dict[str, Any], cpu, npu, inputs, precision: str = "fp16",
            graph: GraphSpec | None = None) -> dict[str, Any]:
    """The diverging node: op, inputs, attributes, worst element with CPU/NPU/input values, hazards (a fix that
    names a rewrite names the model.yaml line of `graph`)."""
    from onnx import helper, numpy_helper

    from qnn_tasks import rewrites

    node = model.graph.node[first["index"]]
    tensor = first["tensor"]
    ref = np.stack([c[tensor] for c in cpu])
    got = np.stack([n[tensor] for n in npu]) if tensor in npu[0] else None
    worst = None
    input_values = {}
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    if got is not None:
        diff = np.abs(got.astype(np.float64) - ref)
        flat = int(np.nanargmax(np.where(np.isfinite(diff), diff, np.inf)))
        worst = tuple(int(i) for i in np.unravel_index(flat, diff.shape))
        for name in node.input:
            value = _value_at(name, worst, ref.shape, cpu, inputs, initializers)
            if value is not None:
                input_values[name] = value
    attributes = {a.name: _attr(helper.get_attribute_value(a)) for a in node.attribute}
    detail = {"node": first["node"], "op_type": node.op_type, "index": first["index"], "inputs": list(node.input),
              "outputs": list(node.output), "attributes": attributes, "tensor": tensor,
              "rel_max_abs": first["rel_max_abs"], "cosine": first["cosine"],
              "cancellation": bool(first.get("cancellation"))}
    if worst is not None:
        detail.update(worst_element={"sample": worst[0], "index": list(worst[1:])},
                      cpu_value=float(ref[worst]), npu_value=float(got[worst]), input_values=input_values)
    detail["hazards"] = hazards(node, detail, {**initializers, **constant_values(model)}, precision,
                                rewrites.find(model, HAZARD_REWRITES), graph)
    return detail


HAZARD_REWRITES = ("pow-square", "centred-variance", "finite-mask")  # the rewrites a hazard's fix may name


def constant_values(model) -> dict[str, np.ndarray]:
    """The values of Constant nodes and ConstantOfShape fills (a mask need not be an initializer)."""
    from onnx import numpy_helper

    return {n.output[0]: numpy_helper.to_array(a.t) for n in model.graph.node
            if n.op_type in ("Constant", "ConstantOfShape") for a in n.attribute
            if a.name == "value" and a.HasField("t")}


def rewrite_fix(name: str, graph: GraphSpec | None) -> str:
    """The fix naming rewrite `name`: the one lint gives (the model.yaml line of `graph` that enables it)."""
    from qnn_tasks.rewrites import advice

    return advice(name, graph) if graph is not None else f'add "rewrites: [{name}]" to the graph in its model.yaml'


def hazards(node, detail: dict[str, Any], constants: dict[str, np.ndarray], precision: str = "fp16",
            sites: dict[str, list[str]] | None = None, graph: GraphSpec | None = None) -> list[dict[str, Any]]:
    """Known fp16/HTP hazards that fit what was observed, each with its export-time fix.

    The fixes read the target's own precision: a w8a16 build is never told to use w8a16. A fix names a built-in
    rewrite only where that rewrite's own matcher finds this node or constant (`sites`: rewrites.find, as lint uses
    it), so the rewrite it names changes it; `constants`: initializers and constant values by name.
    """
    from qnn_tasks.rewrites.graphtools import label

    found = []
    op = node.op_type
    sites = sites or {}
    values = [abs(v) for v in detail.get("input_values", {}).values() if isinstance(v, float)]
    cpu_value = detail.get("cpu_value")
    if cpu_value is not None and abs(cpu_value) > FP16_MAX:
        found.append({"hazard": "fp16 overflow",
                      "why": f"the CPU value here is {cpu_value:.3g}, beyond fp16's range (65504): the NPU saturates "
                             f"(got {detail.get('npu_value', float('nan')):.6g})",
                      "fix": "scale the input down at export, or move the scale before the square/product"
                             + (", or use w8a16 with a calibrated range" if not precision_table.is_quantized(precision)
                                else f" (this target is {precision} already: its 16-bit activations need the same "
                                     "rescaling)")})
    if detail.get("cancellation") or (op == "Sub" and cpu_value is not None and values
                                      and abs(cpu_value) < CANCELLATION_RATIO * max(values)):
        centred = label(node) in sites.get("centred-variance", ())
        found.append({"hazard": "cancellation in fp16",
                      "why": "this subtraction of nearly equal values (e.g. variance as E[x^2] - E[x]^2) leaves mostly "
                             "rounding noise in fp16; the error shows downstream (a Reciprocal, a Div)",
                      "fix": "compute the centred form E[(x - E[x])^2] at export; built in: "
                             f"{rewrite_fix('centred-variance', graph)}" if centred else
                             "compute it at export without subtracting nearly equal values (a variance as "
                             "E[(x - E[x])^2]); the built-in centred-variance does not match this Sub",
                      **({"rewrite": {"centred-variance": {}}} if centred else {})})
    tiny = any(0 < v < FP16_TINY for v in values)
    if op == "Pow":
        square = label(node) in sites.get("pow-square", ())
        found.append({"hazard": "fp16 Pow on tiny inputs",
                      "why": "HTP's fp16 Pow returns garbage (e.g. -4) when its input underflows fp16"
                             + (f" (|x| = {min(values):.2g} here, fp16's normal range starts at 6.1e-5)" if tiny else ""),
                      "fix": f"write Mul(x, x) at export; built in: {rewrite_fix('pow-square', graph)}" if square
                             else "avoid Pow at export (Mul chains, or Exp/Log in fp32)",
                      **({"rewrite": {"pow-square": {}}} if square else {})})
    elif op in ("Sqrt", "Log", "Reciprocal", "Div") and tiny:
        found.append({"hazard": f"{op} of a value in fp16's underflow range",
                      "why": f"an input of {min(values):.2g} is below fp16's normal range (6.1e-5): it flushes to 0 or "
                             f"loses precision, and {op} magnifies that", "fix": "add an epsilon before it at export "
                             "(e.g. sqrt(x + 1e-6)), or scale the values up"})
    elif op in ("Exp", "Softmax") and any(v > 11 for v in values):
        found.append({"hazard": f"{op} overflow in fp16", "why": "exp(x) for x > 11 exceeds fp16's max 65504",
                      "fix": "subtract the max before Exp at export (Softmax does this), or clamp"})
    for name in dict.fromkeys(node.input):  # finite-mask's own rule: not a -inf that only seeds a Max (harmless)
        if name in sites.get("finite-mask", ()) and name in constants:
            found.append({"hazard": "mask constant overflows fp16",
                          "why": f"constant '{name}' holds {float(constants[name].min()):.3g}, beyond fp16's -65504 "
                                 "(becomes -inf)",
                          "fix": "use a finite mask constant such as -1e4 at export; built in: "
                                 f"{rewrite_fix('finite-mask', graph)}",
                          "rewrite": {"finite-mask": {}}})
    if not found and tiny:
        found.append({"hazard": "fp16 underflow", "why": f"inputs at the worst element are tiny ({min(values):.2g}) for fp16",
                      "fix": "rescale at export, or keep this part of the graph out of fp16"})
    return found


def blame_padding(graph: GraphSpec, detail: dict[str, Any], cpu, npu, threshold: float,
                  cpucheck_record: dict[str, Any] | None) -> None:
    """When every sample the diverging node fails on is a zero-padded audio window, that padding is the cause:
    named first among the hazards, with the least pad_min that drops those windows."""
    padded = padding.recorded(cpucheck_record)
    tensor = detail["tensor"]
    if not padded or tensor not in npu[0]:
        return
    ref = np.stack([c[tensor] for c in cpu]).astype(np.float64)
    got = np.stack([n[tensor] for n in npu]).astype(np.float64)
    failing = [int(i) for i in np.flatnonzero(sample_errors(ref, got) > threshold)]
    if not failing or not all(i in padded for i in failing):
        return
    # the worst element already shown may sit on a loud window: show one on the padding too
    diff = np.abs(got[failing] - ref[failing])
    at = np.unravel_index(int(np.nanargmax(np.where(np.isfinite(diff), diff, np.inf))), diff.shape)
    where = (failing[at[0]],) + tuple(int(i) for i in at[1:])
    seen = f"on sample {where[0]} at {list(where[1:])} the CPU has {ref[where]:.3g}, the NPU {got[where]:.3g}"
    detail["padded_samples"] = failing
    judged = [padded[i] for i in range(len(cpu)) if i in padded]
    detail["hazards"].insert(0, padding.hazard(graph, [padded[i] for i in failing], judged, len(cpu),
                                               detail["op_type"], detail["node"], seen))


def advise_scale_input(model, detail: dict[str, Any], values: list[dict[str, np.ndarray]], graph: GraphSpec) -> None:
    """An fp16 overflow that a graph input's scale reaches exactly: advise scale-input with a computed factor.

    Not w8a16: its calibrated 16-bit range made the STFT conv this was seen in worse. `values` are the CPU
    tensors (inputs included) per sample; the factor fits every scaled tensor they show. A graph that declares
    scale-input already is diagnosed scaled: the factor advised in its place is the declared one times what it
    still needs.
    """
    from fractions import Fraction

    from qnn_tasks.rewrites import entry_yaml, inputscale, yaml_fix

    overflow = next((h for h in detail["hazards"] if h["hazard"] == "fp16 overflow"), None)
    if overflow is None:
        return
    declared = graph.rewrites.get("scale-input")
    candidates = inputscale.float_inputs(model)
    scaled = (declared.get("input") or (candidates[0] if len(candidates) == 1 else None)) if declared else None
    for name in candidates:
        found = inputscale.plan(model, name)
        if detail["tensor"] not in found.degrees:
            continue
        if found.refusal:
            overflow["fix"] = (f"scaling input '{name}' by a power of two would keep this node in range, but the scale "
                               f"cannot be undone exactly ({found.refusal}): scale it at export where it can be undone")
            return
        if declared and name != scaled:  # the rewrite scales one input
            overflow["fix"] = (f"scaling input '{name}' by a power of two would keep this node in range, but "
                               f"{graph.key}.rewrites scales input '{scaled}' already (scale-input scales one input): "
                               f"scale '{name}' at export")
            return
        maxima = {t: max(float(np.abs(v[t]).max(initial=0.0)) for v in values) for t in found.degrees if t in values[0]}
        applied = Fraction(declared["factor"]) if declared else Fraction(1)
        factor = inputscale.advised_factor(model, found, maxima, applied)
        if factor is None:
            return
        options = {"input": name, "factor": str(factor)}
        where = (f"set scale-input to {entry_yaml('scale-input', options)} in {graph.key}.rewrites in "
                 f"models/{graph.model}/model.yaml" if "scale-input" in graph.rewrites
                 else yaml_fix("scale-input", graph.name, graph.model, graph.rewrites, options))
        overflow["fix"] = (f"{where}: input '{name}' times {factor} keeps every tensor it reaches under "
                           f"{FP16_MAX / inputscale.HEADROOM:g} on these samples, and the scale is undone exactly "
                           "(after a Log, or at the outputs)")
        overflow["rewrite"] = {"scale-input": options}
        return


def _value_at(name: str, worst: tuple[int, ...], shape: tuple[int, ...], cpu, inputs, initializers) -> float | None:
    """The value of input `name` at the worst element, when its shape lines up with the output's."""
    if name in initializers:
        value = initializers[name]
        return float(value.reshape(-1)[0]) if value.size == 1 else None
    source = cpu[worst[0]] if name in cpu[worst[0]] else inputs[worst[0]] if name in inputs[worst[0]] else None
    if source is None:
        return None
    value = np.asarray(source[name])
    if value.shape == tuple(shape[1:]):
        return float(value[worst[1:]])
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def _attr(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [_attr(v) for v in value]
    if hasattr(value, "dims"):
        return f"tensor{list(value.dims)}"
    return value


# ------------------------------------------------------------------ outputs for people

def plot_errors(nodes: list[dict[str, Any]], threshold: float, first: dict[str, Any] | None, png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.2))
    xs = [n["index"] for n in nodes]
    ys = [max(n["rel_max_abs"], 1e-9) if np.isfinite(n["rel_max_abs"]) else 1e3 for n in nodes]
    ax.semilogy(xs, ys, marker=".", linewidth=0.8, label="error at each node")
    ax.axhline(threshold, color="#aa3333", linestyle="--", linewidth=0.8,
               label=f"threshold {threshold} (a node is named only if it is also {JUMP:g}x its inputs' error)")
    carried = [(x, y) for x, y, n in zip(xs, ys, nodes) if y > threshold and (not first or n["index"] != first["index"])]
    if carried:
        ax.scatter(*zip(*carried), s=12, color="#999999", zorder=3, label="past threshold, carried from its inputs")
    if first:
        ax.annotate(f"{first['op_type']} {first['node']}", (first["index"], max(first["rel_max_abs"], 1e-9)),
                    textcoords="offset points", xytext=(8, 8), fontsize=8, color="#aa3333")
    ax.set_xlabel("node index (graph order)")
    ax.set_ylabel("relative max-abs error")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with fileio.atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)


def markdown(graph: GraphSpec, soc: Soc, record: dict[str, Any]) -> str:
    first = record["first_divergence"]
    lines = [f"# Where {graph.name} diverges on {soc.name}", ""]
    if not first:
        lines.append(record["verdict"]["text"][0].upper() + record["verdict"]["text"][1:] + ".")
        lines.append(f"(A node is named only when its relative error passes {record['threshold_rel_max_abs']} AND is "
                     f"{record['jump_factor']:g}x its inputs' error: it creates the error rather than carrying it.)")
    else:
        lines += [f"First divergence: **{first['op_type']} node '{first['node']}'** (node #{first['index']}, "
                  f"tensor '{first['tensor']}'), relative max-abs {first['rel_max_abs']:.3g}, cosine {first['cosine']:.5f}.",
                  f"- inputs: {', '.join(first['inputs'])}; attributes: {first['attributes'] or 'none'}"]
        if "worst_element" in first:
            lines.append(f"- worst element: sample {first['worst_element']['sample']}, index {first['worst_element']['index']}: "
                         f"CPU {first['cpu_value']:.6g}, NPU {first['npu_value']:.6g}; input values there: {first['input_values']}")
        for h in first["hazards"]:
            lines.append(f"- known hazard: {h['hazard']}: {h['why']}. Fix: {h['fix']}.")
    lines += ["", f"Method: {record['method']} ({record['caveat']})", "",
              "| # | node | op | rel max-abs | cosine |", "|---|---|---|---|---|"]
    worst = sorted(record["nodes"], key=lambda n: -n["rel_max_abs"] if np.isfinite(n["rel_max_abs"]) else -1e30)[:15]
    for n in sorted(worst, key=lambda n: n["index"]):
        lines.append(f"| {n['index']} | {n['node']} | {n['op_type']} | {n['rel_max_abs']:.3g} | {n['cosine']:.5f} |")
    return "\n".join(lines) + "\n"


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), a["verify"], calls.soc(a), calltoolchain.toolchain(call), Path(a["model"]),
               Path(a["provider_options"]), Path(a["inputs"]), Path(a["reference"]), Path(call.out_dir),
               shipped_failed=a["shipped_failed"], binary=a.get("binary"), precision=a.get("precision", "fp16"),
               cpucheck_record=calls.path(a, "cpucheck"))
