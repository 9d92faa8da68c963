"""Rewrites of reductions: reduce-sum-square, centred-variance."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from qnn_tasks.graphs.rewrites.graphtools import Evaluator, Names, add_initializer, label, opset, producers, splice

# Reduce ops take `axes` as an input instead of an attribute from these opsets on
AXES_AS_INPUT = {"ReduceSum": 13, "ReduceSumSquare": 18, "ReduceMean": 18}


def reduce_sum_square(model: onnx.ModelProto, dry_run: bool = False) -> list[str]:
    """ReduceSumSquare(x) -> ReduceSum(Mul(x, x)), same axes/keepdims (attribute or input, per opset)."""
    graph, version, sites, replacements = model.graph, opset(model), [], {}
    names = Names(graph)
    for index, node in enumerate(graph.node):
        if node.op_type != "ReduceSumSquare":
            continue
        sites.append(label(node))
        if dry_run:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axes_input = node.input[1] if len(node.input) > 1 and node.input[1] else None  # opset >= 18
        axes_attr = attrs.pop("axes", None)  # opset < 18
        square = names(label(node) + "_square")
        new = [helper.make_node("Mul", [node.input[0], node.input[0]], [square], name=names(label(node) + "_mul"))]
        inputs = [square]
        if version >= AXES_AS_INPUT["ReduceSum"]:
            if axes_attr is not None:
                axes_input = add_initializer(graph, names(label(node) + "_axes"), np.array(axes_attr, np.int64))
            if axes_input:
                inputs.append(axes_input)
        elif axes_attr is not None:
            attrs["axes"] = axes_attr
        if version < AXES_AS_INPUT["ReduceSum"]:
            attrs.pop("noop_with_empty_axes", None)
        new.append(helper.make_node("ReduceSum", inputs, list(node.output), name=label(node) + "_as_sum", **attrs))
        replacements[index] = new
    splice(graph, replacements)
    return sites


def centred_variance(model: onnx.ModelProto, dry_run: bool = False) -> list[str]:
    """Sub(ReduceMean(x*x), mean*mean) with mean = ReduceMean(x) -> ReduceMean((x - mean)^2).

    The squares may be Mul(a, a) or Pow(a, 2); both means must reduce the same axes and the mean
    must keep its dims (so x - mean broadcasts). The Sub's output keeps its name.
    """
    graph, sites, replacements = model.graph, [], {}
    made = producers(graph)
    evaluator = Evaluator(model)
    names = Names(graph)
    for index, node in enumerate(graph.node):
        if node.op_type != "Sub":
            continue
        match = _variance_pattern(node, made, evaluator, opset(model))
        if match is None:
            continue
        x, mean_node, square_mean = match
        sites.append(label(node))
        if dry_run:
            continue
        base = label(node)
        centred = names(base + "_centred")
        squared = names(base + "_centred_sq")
        attrs = {a.name: helper.get_attribute_value(a) for a in square_mean.attribute}
        replacements[index] = [
            helper.make_node("Sub", [x, mean_node.output[0]], [centred], name=names(base + "_centre")),
            helper.make_node("Mul", [centred, centred], [squared], name=names(base + "_square")),
            helper.make_node("ReduceMean", [squared] + list(square_mean.input[1:]), list(node.output),
                             name=base + "_as_centred_variance", **attrs)]
    splice(graph, replacements)
    return sites


def _square_of(name: str, made: dict, evaluator: Evaluator) -> str | None:
    """If `name` is Mul(a, a) or Pow(a, 2), return a."""
    node = made.get(name)
    if node is None:
        return None
    if node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
        return node.input[0]
    if node.op_type == "Pow" and len(node.input) == 2:
        exponent = evaluator.value(node.input[1])
        if exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0:
            return node.input[0]
    return None


def _axes(node, evaluator: Evaluator, version: int):
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if version >= AXES_AS_INPUT["ReduceMean"] and len(node.input) > 1 and node.input[1]:
        axes = evaluator.value(node.input[1])
        return None if axes is None else tuple(int(a) for a in axes.reshape(-1))
    return tuple(attrs.get("axes", ())) or "all"


def _variance_pattern(sub, made: dict, evaluator: Evaluator, version: int):
    """(x, the ReduceMean(x) node, the ReduceMean(x*x) node) if `sub` is E[x^2] - E[x]^2, else None."""
    square_mean = made.get(sub.input[0])
    if square_mean is None or square_mean.op_type != "ReduceMean":
        return None
    x = _square_of(square_mean.input[0], made, evaluator)
    mean = _square_of(sub.input[1], made, evaluator)
    mean_node = made.get(mean) if mean else None
    if x is None or mean_node is None or mean_node.op_type != "ReduceMean" or mean_node.input[0] != x:
        return None
    keepdims = {a.name: helper.get_attribute_value(a) for a in mean_node.attribute}.get("keepdims", 1)
    axes = _axes(mean_node, evaluator, version)
    if not keepdims or axes is None or axes != _axes(square_mean, evaluator, version):
        return None
    return x, mean_node, square_mean
