"""What a node costs for being there, and an element it writes: the figures behind if-to-where's cost bound.

    python benchmarks/bench_node_cost.py [--rounds R] [--json out.json] [--no-if-cases]

Graphs built here, each compiled for SM8650 fp16 with the project's own path (the packaged ort-qnn profile, the chip's
row of the packaged socs.yaml, `compile_variant`) and opened in a session on the x86 HTP simulator with
`profiling_level: detailed`; all run once (loading, dropped), then R rounds of one run each, in turn. The simulator
reports "Accelerator (execute) time (cycles)" per run; those cycles follow the host's load (they move with the run's
wall time), so each graph's figure is its least over the rounds, and the rounds interleave the graphs.
  chain   N = 1..64 nodes of one elementwise op (Add, Mul, Relu, Sub, Sigmoid, Max; scalar constants) on [1, 128]
  wide    8 nodes of that op on [1, W], W = 1k..64k elements
  matmul  one MatMul [1, M, M] x [M, M], M = 64..512
Work is counted as if-to-where counts it (ifwhere.element_ops: the elements a node writes, multiply-adds for a MatMul).
cost = a * nodes + b * element-ops, each term fitted (least squares on relative errors) on the graphs that isolate
it: b, a multiply-add's cycles, on the MatMuls; per op, a on its chains and an element's cycles on its wide chains.
NODE_OVERHEAD = a / b and ELEMENT_COST = an element's cycles / b, in multiply-adds, the medians over the ops;
fitted on each round's cycles alone, NODE_OVERHEAD's spread.
The if cases (tests/test_if_to_where.py's classifier, its 40-node branch beside 200 layers, its 4 wide nodes after a
Conv) compare the rewritten graph's cycles with each branch alone (the If folded to it) against the rewrite's own
estimate, whether its bound accepts the rewrite or not.
Cycles of the x86 simulator on this host, not of a phone: docs/benchmarks.md has the measured figures.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
CHIP = "SM8650"
CHAIN = (1, 2, 4, 8, 16, 32, 64)
WIDE = (1024, 8192, 65536)
MATMUL = (64, 128, 256, 384, 512)
OPS = ("Add", "Mul", "Relu", "Sub", "Sigmoid", "Max")  # common elementwise ops (their costs differ by 10x)
CONSTANTS = {"Add": 0.01, "Sub": 0.01, "Mul": 0.99, "Max": -4.0}  # the scalar an op takes, if it takes one
EXECUTE = "Accelerator (execute) time (cycles)"


# ------------------------------------------------------------------ the graphs

def _model(nodes: list, x_shape: list[int], y_shape: list[int], inits: list, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def chain(op: str, count: int, width: int = 128) -> onnx.ModelProto:
    """y = `count` nodes of `op` on [1, width], each reading the one before (and a scalar constant, if it takes one)."""
    extra = ["c"] if op in CONSTANTS else []
    nodes = [helper.make_node(op, ["x" if i == 0 else f"t{i}"] + extra, ["y" if i == count - 1 else f"t{i + 1}"],
                              name=f"{op.lower()}{i}") for i in range(count)]
    inits = [numpy_helper.from_array(np.array(CONSTANTS[op], np.float32), "c")] if extra else []
    return _model(nodes, [1, width], [1, width], inits, f"{op.lower()}{count}x{width}")


def matmul(size: int) -> onnx.ModelProto:
    """y = x @ w, x [1, size, size], w a constant [size, size]: size^3 multiply-adds in one node."""
    w = (np.random.default_rng(size).standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [1, size, size], [1, size, size],
                  [numpy_helper.from_array(w, "w")], f"matmul{size}")


def work(model: onnx.ModelProto) -> tuple[int, int]:
    """(nodes, element-ops) as if-to-where counts them: nodes computed from constants only are folded, not counted."""
    from qnn_tasks.rewrites.graphtools import Evaluator, infer_shapes, static_shapes
    from qnn_tasks.rewrites.ifwhere import element_ops

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    infer_shapes(copy)
    evaluator, shapes = Evaluator(copy), static_shapes(copy)
    nodes = ops = 0
    for node in copy.graph.node:
        if all(evaluator.value(o) is not None for o in node.output if o):
            continue
        counted = element_ops(node, shapes)
        if counted is None:
            raise SystemExit(f"{copy.graph.name}: node '{node.name}' has no static shape: its work cannot be counted")
        nodes, ops = nodes + 1, ops + counted
    return nodes, ops


def estimated(model: onnx.ModelProto) -> int:
    """The graph's cost as if-to-where estimates it (ifwhere.node_cost, summed), in multiply-adds."""
    from qnn_tasks.rewrites.graphtools import Evaluator, infer_shapes, static_shapes
    from qnn_tasks.rewrites.ifwhere import node_cost

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    infer_shapes(copy)
    evaluator, shapes = Evaluator(copy), static_shapes(copy)
    return sum(node_cost(node, evaluator, shapes) for node in copy.graph.node)


# ------------------------------------------------------------------ compile and profile

def sm8650_options(folder: Path) -> tuple[Any, dict[str, str]]:
    """(toolchain, provider options) of an fp16 SM8650 build: the packaged ort-qnn profile and socs.yaml row."""
    from qnn_tasks.modelspec.load import load_socs, load_toolchain
    from qnn_tasks.modelspec.project import PACKAGED_DATA
    from qnn_tasks.toolchains import from_profile

    soc = load_socs(PACKAGED_DATA / "socs.yaml")[CHIP]
    toolchain = from_profile(load_toolchain(folder, "ort-qnn"))
    return toolchain, toolchain.write_config(None, "fp16", soc, folder)["provider_options"]  # fp16: no graph needed


def execute_cycles(profile: Path) -> list[int]:
    """The simulator's execute cycles per run, in the order of the runs, from a profiling CSV."""
    with open(profile, newline="") as fh:
        return [int(row["Time"]) for row in csv.DictReader(fh)
                if row["Event Identifier"] == EXECUTE and row["Unit of Measurement"] == "CYCLES"]


def profile(models: list[onnx.ModelProto], folder: Path, toolchain, options: dict[str, str],
            rounds: int) -> dict[str, list[int]]:
    """Compile each model, open one profiled session each, run them all once (loading: dropped), then `rounds` times
    in turn: the simulator's cycles follow the host's load, so the graphs are measured side by side in time.
    Returns each graph's execute cycles per round."""
    import onnxruntime as ort

    from qnn_tasks.nativelog import native_output_to
    from qnn_tasks.toolchains.ort_qnn import session_options

    sessions = []
    with native_output_to(folder / "run.log"):
        for model in models:
            name = model.graph.name
            onnx.save(model, str(folder / f"{name}.onnx"))
            compiled = toolchain.compile_variant(folder / f"{name}.onnx", options, folder / f"{name}_compiled")
            feeds = {i.name: np.random.default_rng(0).standard_normal(
                [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in model.graph.input}
            profiled = {**options, "profiling_level": "detailed", "profiling_file_path": str(folder / f"{name}.csv")}
            sessions.append((ort.InferenceSession(str(compiled), session_options(profiled, disable_cpu_fallback=True)),
                             feeds))
        for _ in range(rounds + 1):
            for session, feeds in sessions:
                session.run(None, feeds)
        del sessions, session  # each CSV is written when its session ends
    return {m.graph.name: execute_cycles(folder / f"{m.graph.name}.csv")[1:] for m in models}


# ------------------------------------------------------------------ the fit

def fit(rows: list[dict[str, Any]], x: str, key: str = "cycles") -> dict[str, float]:
    """Least squares cycles = c + slope * row[x] over `rows`, on relative errors (a 1-node graph weighs as much as
    a 512 x 512 MatMul); with the worst relative error of the line."""
    measured = np.array([float(r[key]) for r in rows])
    design = np.array([[1.0, float(r[x])] for r in rows])
    (c, slope), *_ = np.linalg.lstsq(design / measured[:, None], np.ones(len(rows)), rcond=None)
    return {"c": float(c), "slope": float(slope),
            "worst_error": float(np.max(np.abs(design @ np.array([c, slope]) - measured) / measured))}


def summarize(rows: list[dict[str, Any]], key: str = "cycles") -> dict[str, Any]:
    """cost = a * nodes + b * element-ops, each term from the graphs that isolate it: b, the cycles of a multiply-add,
    from the MatMuls; per op, a from its chains on [1, 128] (less the 128 element-ops a node there is counted for) and
    the cycles of an element it writes from its wide chains. NODE_OVERHEAD = a / b (median over the ops)."""
    matmul = fit([r for r in rows if r["family"] == "matmul"], "element_ops", key)
    b = matmul["slope"]
    ops: dict[str, Any] = {}
    for op in OPS:
        chains = fit([r for r in rows if r["family"] == "chain" and r["op"] == op], "nodes", key)
        wide = fit([r for r in rows if r["family"] == "wide" and r["op"] == op], "element_ops", key)
        ops[op] = {"cycles_per_node": chains["slope"], "overhead": chains["slope"] / b - 128,
                   "chain_error": chains["worst_error"], "element_cycles": wide["slope"],
                   "element_in_multiply_adds": wide["slope"] / b, "wide_error": wide["worst_error"]}
    return {"cycles_per_multiply_add": b, "matmul_fixed": matmul["c"] / b, "matmul_error": matmul["worst_error"],
            "ops": ops, "overhead": statistics.median(o["overhead"] for o in ops.values()),
            "element_in_multiply_adds": statistics.median(o["element_in_multiply_adds"] for o in ops.values())}


def spread(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """NODE_OVERHEAD per op and overall, fitted on each round's cycles alone: [least, greatest] over the rounds."""
    rounds = min(len(r["runs"]) for r in rows)
    fits = [summarize([{**r, "round": r["runs"][i]} for r in rows], key="round") for i in range(rounds)]
    spreads = {op: [min(f["ops"][op]["overhead"] for f in fits), max(f["ops"][op]["overhead"] for f in fits)]
               for op in OPS}
    spreads["median"] = [min(f["overhead"] for f in fits), max(f["overhead"] for f in fits)]
    return spreads


# ------------------------------------------------------------------ the if cases

def if_cases() -> dict[str, onnx.ModelProto]:
    """tests/test_if_to_where.py's classifier, its 40-node branch beside 200 MatMul layers on [1, 128] and its branch of
    4 wide elementwise nodes after a Conv."""
    from test_if_to_where import classifier, deep, wide_after_conv

    return {"classifier": classifier(), "deep40x200": deep(40, 200, width=128), "wide4": wide_after_conv(4)}


def folded(model: onnx.ModelProto, taken: bool) -> onnx.ModelProto:
    """The If's graph with its condition set to `taken` and folded by fold-if: one branch alone, on the NPU (what
    computed the condition goes too, as the compiler drops it)."""
    from qnn_tasks import rewrites
    from qnn_tasks.rewrites.graphtools import remove_dead

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    [if_node] = [n for n in copy.graph.node if n.op_type == "If"]
    kept = [n for n in copy.graph.node if if_node.input[0] not in n.output]
    del copy.graph.node[:]
    copy.graph.node.extend(kept)
    copy.graph.initializer.append(numpy_helper.from_array(np.array(taken), if_node.input[0]))
    [report] = rewrites.apply(copy, ["fold-if"])
    if report["count"] != 1:
        raise SystemExit(f"{model.graph.name}: fold-if did not fold the If: {report}")
    remove_dead(copy.graph)
    return copy


def if_case(name: str, model: onnx.ModelProto, folder: Path, toolchain, options: dict[str, str],
            rounds: int) -> dict[str, Any]:
    """The rewritten graph's cycles against each branch alone; the rewrite's estimate of the same share."""
    from unittest import mock

    from qnn_tasks import rewrites
    from qnn_tasks.rewrites import ifwhere

    accepted = bool(ifwhere.if_to_where(model, dry_run=True))
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    with mock.patch.object(ifwhere, "MAX_EXTRA_WORK", float("inf")):  # what it would compute, refused or not
        [report] = rewrites.apply(rewritten, ["if-to-where"])
    if not report["sites"]:  # the If would stay, and run on the CPU: nothing to compare
        raise SystemExit(f"{name}: if-to-where cannot rewrite it: {report['refused']}")
    graphs = {"then": folded(model, True), "else": folded(model, False), "rewritten": rewritten}
    for label, graph in graphs.items():
        graph.graph.name = f"{name}_{label}"
    measured = profile(list(graphs.values()), folder, toolchain, options, rounds)
    cycles = {label: min(measured[graph.graph.name]) for label, graph in graphs.items()}
    estimate = {label: estimated(graph) for label, graph in graphs.items()}
    cheaper = min(cycles["then"], cycles["else"])
    return {"case": name, "accepted": accepted, "cycles": cycles,
            "measured_extra": cycles["rewritten"] / cheaper - 1,
            "estimated_extra": estimate["rewritten"] / min(estimate["then"], estimate["else"]) - 1}


# ------------------------------------------------------------------ main

def measure(rounds: int, with_if_cases: bool, folder: Path) -> dict[str, Any]:
    toolchain, options = sm8650_options(folder)
    graphs = [("chain", op, chain(op, n)) for op in OPS for n in CHAIN] + \
        [("wide", op, chain(op, 8, w)) for op in OPS for w in WIDE] + [("matmul", "MatMul", matmul(m)) for m in MATMUL]
    cycles = profile([model for _, _, model in graphs], folder, toolchain, options, rounds)
    rows = []
    for family, op, model in graphs:
        runs = cycles[model.graph.name]
        nodes, ops = work(model)
        rows.append({"family": family, "op": op, "graph": model.graph.name, "nodes": nodes, "element_ops": ops,
                     "cycles": min(runs), "median": statistics.median(runs), "runs": runs})
        print(f"{model.graph.name:16} {nodes:3} nodes {ops:>12,} element-ops  least {min(runs):>13,} cycles, median "
              f"{rows[-1]['median']:>13,.0f}", flush=True)
    result = {"chip": CHIP, "precision": "fp16", "rounds": rounds, "options": options, "load_average": os.getloadavg(),
              "rows": rows, **summarize(rows), "spread": spread(rows)}
    if with_if_cases:
        result["if_cases"] = [if_case(name, model, folder, toolchain, options, rounds)
                              for name, model in if_cases().items()]
    return result


def report(result: dict[str, Any]) -> str:
    spreads = result["spread"]
    lines = [f"{result['chip']} {result['precision']}, x86 HTP simulator execute cycles, the least of {result['rounds']} "
             f"rounds per graph (load average {', '.join(f'{x:.1f}' for x in result['load_average'])})",
             f"a multiply-add: {result['cycles_per_multiply_add']:.3f} cycles (MatMuls {MATMUL[0]}..{MATMUL[-1]}, worst "
             f"fit error {result['matmul_error']:.0%}); a MatMul's own fixed cost {result['matmul_fixed']:,.0f} "
             "multiply-adds",
             f"{'op':8} {'cycles/node':>11} {'overhead (mul-adds)':>19} {'rounds alone':>19} {'error':>6} "
             f"{'an element (mul-adds)':>21} {'error':>6}"]
    for op, o in result["ops"].items():
        low, high = spreads[op]
        lines.append(f"{op:8} {o['cycles_per_node']:>11,.0f} {o['overhead']:>19,.0f} {low:>9,.0f}..{high:<9,.0f} "
                     f"{o['chain_error']:>6.0%} {o['element_in_multiply_adds']:>21,.1f} {o['wide_error']:>6.0%}")
    low, high = spreads["median"]
    lines.append(f"median over the ops: NODE_OVERHEAD = {result['overhead']:,.0f} multiply-adds (rounds alone "
                 f"{low:,.0f}..{high:,.0f}); ELEMENT_COST (an element written by an elementwise op) = "
                 f"{result['element_in_multiply_adds']:,.1f} multiply-adds")
    lines += [f"{c['case']}: rewritten {c['cycles']['rewritten']:,.0f} cycles, then alone {c['cycles']['then']:,.0f}, "
              f"else alone {c['cycles']['else']:,.0f}: {c['measured_extra']:+.0%} over the cheaper, "
              f"{c['estimated_extra']:+.0%} estimated by if-to-where ({'accepted' if c['accepted'] else 'refused'})"
              for c in result.get("if_cases", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="profiled runs of every graph, in turn (the least "
                        "cycles of each is used)")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--no-if-cases", action="store_true", help="skip the rewritten-vs-branch comparison")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-node-cost-") as tmp:
        result = measure(args.rounds, not args.no_if_cases, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
