"""scale-input: multiply a graph input by a power of two so early nodes stay inside fp16's +-65504, and undo it exactly.

An STFT conv on int16-scale audio computes values like -670882: fp16 saturates them at 65504.
Scaling the input by s = 2^-k first is exact in floating point, and the scale is carried through
the ops that are homogeneous in their input: a tensor of degree d holds s^d times its true value.
Linear ops keep the degree (their additive constants, e.g. a Conv bias, are scaled by s^d), Mul
adds degrees, Div subtracts them, Pow by a constant p multiplies by p, Sqrt halves, Reciprocal
negates; Relu, Abs, pooling, reductions and shape ops pass it through. A Clip with constant
bounds commutes once its bounds are scaled with its input. The scale is undone where the region ends: after a Log by subtracting d*log(s) (log(s^d x) = log x + d log s), at a graph
output by multiplying by s^-d, and nothing is needed where the degree returns to 0 (ArgMax, Shape).
Any other op reading a scaled tensor (Tanh, Exp, Softmax, a comparison ...) would see different
values: the rewrite is refused naming that node.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qnn_tasks.errors import RewriteError
from qnn_tasks.rewrites.fp16range import FP16_MAX, FP16_SCALES
from qnn_tasks.rewrites.graphtools import (
    Names,
    Sites,
    constant_tensors,
    infer_shapes,
    label,
    outer_names,
    splice,
    subgraphs,
)
from qnn_tasks.rewrites.yamlhint import entry_yaml

PASS_THROUGH = {"Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Gather", "Expand",
                "Tile", "Split", "DepthToSpace", "SpaceToDepth", "Relu", "Abs", "Neg", "MaxPool", "AveragePool",
                "GlobalAveragePool", "GlobalMaxPool", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"}
LINEAR = {"Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (1, None)}  # op -> (weight, bias) slots
# elementwise combinations (and Concat): homogeneous when every input has the same degree, a constant scaled to it
COMBINE = {"Add", "Sub", "Sum", "Max", "Min", "Concat"}
UNSCALED_RESULT = {"Shape", "Size", "ArgMax", "ArgMin"}  # what they give does not depend on a positive scale


@dataclass
class Plan:
    input: str
    degrees: dict[str, Fraction] = field(default_factory=dict)  # scaled tensor -> d (it holds s^d x its value)
    constants: list[tuple[int, int, Fraction]] = field(default_factory=list)  # (node index, input slot, d) to scale
    logs: list[int] = field(default_factory=list)      # Log nodes whose output gets - d log s
    outputs: list[str] = field(default_factory=list)   # graph outputs that get x s^-d
    refusal: str = ""                                  # the node where compensation would not be exact


def plan(model: onnx.ModelProto, input_name: str) -> Plan:
    """How scaling `input_name` propagates, and where it is undone; `refusal` names the node that prevents it."""
    graph = model.graph
    constants = constant_tensors(graph)
    found = Plan(input_name, {input_name: Fraction(1)})
    degrees = found.degrees
    for index, node in enumerate(graph.node):
        if degrees.keys() & _subgraph_reads(node):
            found.refusal = f"{node.op_type} node '{label(node)}' reads a scaled tensor inside its subgraph"
            return found
        if not any(i in degrees for i in node.input):
            continue
        outcome = _degree(node, index, degrees, constants, found)
        if isinstance(outcome, str):
            found.refusal = f"{node.op_type} node '{label(node)}' {outcome}"
            return found
        for out in node.output:
            if out and outcome != 0:
                degrees[out] = outcome
    found.outputs = [o.name for o in graph.output if degrees.get(o.name, 0) != 0]
    return found


def _subgraph_reads(node) -> set[str]:
    names: set[str] = set()
    for sub in subgraphs(node):
        names |= outer_names(sub)
    return names


def _degree(node, index: int, degrees: dict[str, Fraction], constants, found: Plan) -> Fraction | str:
    """The degree of the node's outputs, or why the scale cannot pass it exactly."""
    op = node.op_type
    d = [degrees.get(i, Fraction(0)) for i in node.input]
    if op in UNSCALED_RESULT:
        return Fraction(0)
    if op in PASS_THROUGH:
        if any(d[1:]):
            return "takes a scaled tensor as a shape, index or axis"
        return d[0]
    if op in LINEAR:
        weight, bias = LINEAR[op]
        out = d[0] + d[weight]
        if bias is not None and len(node.input) > bias and node.input[bias]:
            if d[bias] != out and not _scale_constant(node, index, bias, out, constants, found):
                return "adds a bias that is neither a constant nor scaled like its product"
        return out
    if op in COMBINE:
        if len(set(d)) == 1:
            return d[0]
        target = max(d, key=abs)
        for slot, degree in enumerate(d):
            if degree != target and (degree != 0 or not _scale_constant(node, index, slot, target, constants, found)):
                return "combines a scaled tensor with one scaled differently (not a constant)"
        return target
    if op == "Clip":  # clip(s^d x, s^d lo, s^d hi) = s^d clip(x, lo, hi) for s > 0: its constant bounds scale along
        if any(a.name in ("min", "max") for a in node.attribute):
            return "has its bounds as attributes (opset < 11; re-export with opset 11 or later)"
        for slot in (1, 2):
            if len(node.input) > slot and node.input[slot] and d[slot] != d[0] and \
                    (d[slot] != 0 or not _scale_constant(node, index, slot, d[0], constants, found)):
                return "clips to a bound that is neither a constant nor scaled like its input"
        return d[0]
    if op == "Mul":
        return sum(d, Fraction(0))
    if op == "Div":
        return d[0] - d[1]
    if op == "Pow":
        exponent = _scalar(constants.get(node.input[1]))
        if exponent is None or d[1]:
            return "raises to a power that is not a constant"
        power = Fraction(exponent).limit_denominator(64)
        if float(power) != exponent:  # s^(d p) must be a small exact fraction of powers of two to be undone
            return f"raises to the power {exponent:g}, not a simple fraction"
        return d[0] * power
    if op == "Sqrt":
        return d[0] / 2
    if op == "Reciprocal":
        return -d[0]
    if op == "Log":
        found.logs.append(index)
        return Fraction(0)
    return ("does not commute with scaling its input: the scale can only be undone after linear ops, powers, "
            "products and constant-bound Clips (at a graph output) or after a Log")


def _scale_constant(node, index: int, slot: int, degree: Fraction, constants, found: Plan) -> bool:
    """An additive constant next to a scaled tensor is scaled with it (Conv bias, Add eps)."""
    if node.input[slot] not in constants:
        return False
    found.constants.append((index, slot, degree))
    return True


def _scalar(tensor) -> float | None:
    if tensor is None:
        return None
    value = numpy_helper.to_array(tensor)
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def float_inputs(model: onnx.ModelProto) -> list[str]:
    initializers = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers
            and i.type.tensor_type.elem_type in (TensorProto.FLOAT, TensorProto.FLOAT16)]


def scale_input(model: onnx.ModelProto, dry_run: bool = False, input: str | None = None,
                factor: float | None = None) -> Sites:
    """Scale `input` by `factor` (a power of two) and undo it where the scaled region ends.

    Sites: the input, then each compensated Log, graph output and scaled constant. Raises RewriteError
    naming the node where the compensation would not be exact.
    """
    if factor is None:  # a dry run from lint: only a declared factor says what to do
        return Sites()
    name = _input(model, input)
    found = plan(model, name)
    if found.refusal:
        raise RewriteError(f"scaling input '{name}' cannot be undone exactly: {found.refusal}",
                           "scale the input at export where the scale can be undone, or drop scale-input")
    problem = fp16_products(model, found, float(factor))
    if problem:
        raise RewriteError(f"scaling input '{name}' by {_power(float(factor))}: {problem}",
                           "use a factor nearer 1 (doit diagnose advises one that fits)")
    sites = Sites([f"input '{name}'"] + [f"Log node '{label(model.graph.node[i])}'" for i in found.logs]
                  + [f"output '{o}'" for o in found.outputs]
                  + [f"constant '{model.graph.node[i].input[slot]}'" for i, slot, _ in found.constants])
    if not dry_run and model.graph.node:
        _apply(model, found, float(factor))
    return sites


FP16_POWERS = tuple(2.0 ** k for k in FP16_SCALES)  # the powers of two fp16 holds as normal numbers


def fp16_products(model: onnx.ModelProto, found: Plan, factor: float, applied: float = 1.0) -> str:
    """Why a constant the rewrite writes would leave fp16's range on the NPU ("" when every one fits): the factor
    undone at an output (s^-d), or a constant scaled with its neighbour (c s^d) beyond 65504.

    The one rule for a factor: the rewrite refuses what this names, and diagnose advises only a factor it accepts.
    A value already beyond fp16 before scaling is not the scale's doing: an infinite Clip bound (no bound) stays
    infinite, and a -inf mask is lint's fp16-overflow-constant (finite-mask). `applied`: a scale `model` already
    has (a graph scale-input rewrote: its constants are scaled, its outputs will be undone by applied * factor)."""
    low, high = FP16_POWERS
    for out in found.outputs:
        back = (applied * factor) ** -float(found.degrees[out])
        if not low <= back <= high:
            return (f"undoing it at output '{out}' multiplies by {_power(back)}, outside fp16's powers of two "
                    f"({_power(low)} .. {_power(high)})")
    constants = constant_tensors(model.graph)
    for index, slot, degree in found.constants:
        name = model.graph.node[index].input[slot]
        values = np.abs(numpy_helper.to_array(constants[name]).astype(np.float64))
        largest = float(values[values <= FP16_MAX].max(initial=0.0)) * factor ** float(degree)
        if largest > FP16_MAX:
            return f"constant '{name}' scaled with it reaches {largest:.4g}, beyond fp16's 65504"
    return ""


def _power(value: float) -> str:
    return f"2^{round(math.log2(value))}"


def _input(model: onnx.ModelProto, declared: str | None) -> str:
    candidates = float_inputs(model)
    if declared is None:
        if len(candidates) != 1:
            if not candidates:
                raise RewriteError("the graph has no float input to scale", "remove scale-input from its rewrites")
            raise RewriteError(f"the graph has {len(candidates)} float inputs ({', '.join(candidates)})",
                               "name the one to scale, e.g. rewrites: "
                               f"[{entry_yaml('scale-input', {'input': candidates[0], 'factor': '1/64'})}] (doit "
                               "diagnose advises the factor)")
        return candidates[0]
    if declared not in candidates:
        raise RewriteError(f"input {declared!r} is not a float input of the graph (its float inputs: "
                           f"{', '.join(candidates) or 'none'})", "name one of them in scale-input's input")
    return declared


def _apply(model: onnx.ModelProto, found: Plan, factor: float) -> None:
    graph = model.graph
    names = Names(graph)
    constants = constant_tensors(graph)
    elem = next(i.type.tensor_type.elem_type for i in graph.input if i.name == found.input)
    dtype = helper.tensor_dtype_to_np_dtype(elem)  # fp16 I/O gets fp16 constants

    def constant(base: str, value) -> str:
        new = names(base)
        graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype), new))
        return new

    for index, slot, degree in found.constants:  # a new copy: the original may be shared with unscaled nodes
        node = graph.node[index]
        value = numpy_helper.to_array(constants[node.input[slot]])
        node.input[slot] = constant(f"{node.input[slot]}_scaled", value * factor ** float(degree))
    degrees = found.degrees
    replacements: dict[int, list] = {}  # node index -> the nodes that take its place (itself first)
    for index in found.logs:  # log(s^d x) - d log s = log x
        node = graph.node[index]
        degree = degrees[next(i for i in node.input if i in degrees)]
        raw = names(f"{node.output[0]}_scaled")
        offset = constant(f"{label(node)}_offset", float(degree) * math.log(factor))
        unscale = helper.make_node("Sub", [raw, offset], [node.output[0]], name=names(f"{label(node)}_unscale"))
        node.output[0] = raw
        replacements[index] = [node, unscale]
    unscale_outputs = []
    for out in found.outputs:  # the graph output gets s^-d x its scaled value; nodes inside keep reading the latter
        raw = names(f"{out}_scaled")
        for node in graph.node:
            node.input[:] = [raw if i == out else i for i in node.input]
            node.output[:] = [raw if o == out else o for o in node.output]
        back = constant(f"{out}_unscale_factor", factor ** -float(degrees[out]))
        unscale_outputs.append(helper.make_node("Mul", [raw, back], [out], name=names(f"{out}_unscale")))
    scaled_input = names(f"{found.input}_scaled")
    for node in graph.node:
        node.input[:] = [scaled_input if i == found.input else i for i in node.input]
    scale = helper.make_node("Mul", [found.input, constant(f"{found.input}_factor", factor)], [scaled_input],
                             name=names(f"{found.input}_scale"))
    last = len(graph.node) - 1
    replacements[0] = [scale] + replacements.get(0, [graph.node[0]])
    replacements[last] = replacements.get(last, [graph.node[last]]) + unscale_outputs
    splice(graph, replacements)
    infer_shapes(model)


# ------------------------------------------------------------------ the factor diagnose advises

HEADROOM = 4.0  # the advised factor keeps the largest scaled value this far under fp16's max (unseen inputs)


def advised_factor(model: onnx.ModelProto, found: Plan, maxima: dict[str, float],
                   applied: Fraction = Fraction(1)) -> Fraction | None:
    """The largest power of two s <= 1/2 that brings every scaled tensor's measured max under FP16_MAX / HEADROOM
    and that the rewrite accepts (`fp16_products`, the check scale_input makes), as the factor to declare.

    `maxima`: tensor -> largest |value| seen on CPU. `applied`: the factor scale-input already applied to `model`
    (the graph declares it): the factor to declare is then applied * s, which must be one fp16 holds as well.
    None when no power of two fits every tensor.
    """
    limit = FP16_MAX / HEADROOM
    for k in range(1, 1 - FP16_SCALES[0]):  # to 2^-14, fp16's smallest normal power of two (smaller is refused)
        s = 2.0 ** -k
        if applied * Fraction(1, 2 ** k) < Fraction(2) ** FP16_SCALES[0]:
            break  # the factor to declare would be below fp16's normal powers of two (refused)
        if fp16_products(model, found, s, float(applied)):
            continue
        if all(m * s ** float(d) <= limit for t, d in found.degrees.items() if (m := maxima.get(t)) is not None):
            return applied * Fraction(1, 2 ** k)
    return None
