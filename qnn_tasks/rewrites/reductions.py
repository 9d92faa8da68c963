"""Rewrites of reductions: reduce-sum-square, centred-variance."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from qnn_tasks.rewrites.graphtools import Evaluator, Names, add_initializer, label, opset, producers, splice

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
    """Sub(mean(x*x), mean(x)^2) -> ReduceMean((x - mean(x))^2), same axes and keepdims.

    A mean is ReduceMean, or ReduceSum times 1/N or divided by N (N: the reduced element count, from
    static shapes), with or without keepdims; a square is Mul(a, a) or Pow(a, 2). Both means must
    reduce the same axes. The mean is reused where it keeps its dims (so x - mean broadcasts), else
    a kept-dims ReduceMean is added. The Sub's output keeps its name.
    """
    graph, sites, replacements = model.graph, [], {}
    made = producers(graph)
    position = {out: i for i, n in enumerate(graph.node) for out in n.output}
    evaluator = Evaluator(model)
    shapes = _Shapes(model)
    names = Names(graph)
    version = opset(model)
    for index, node in enumerate(graph.node):
        if node.op_type != "Sub":
            continue
        match = _variance_pattern(node, made, evaluator, version, shapes)
        if match is None:
            continue
        x, mean, axes, keepdims = match
        sites.append(label(node))
        if dry_run:
            continue
        base = label(node)
        new = []
        written = made.get(mean) if mean else None
        if written is not None and written.op_type != "ReduceMean":
            # a mean written as ReduceSum x 1/N sums in fp16 on HTP (384 values around 30: 11520, fp16's step there
            # is 8), so x - mean loses what centring gained: the mean itself becomes a ReduceMean (for every user)
            replacements[position[mean]] = [_reduce_mean(graph, names, x, mean, axes, keepdims, version,
                                                         names(label(written) + "_as_mean"))]
        if mean is None:  # the mean was reduced without keepdims: x - mean needs a kept-dims one
            mean = names(base + "_mean")
            new.append(_reduce_mean(graph, names, x, mean, axes, 1, version, names(base + "_mean_kept")))
        centred, squared = names(base + "_centred"), names(base + "_centred_sq")
        new += [helper.make_node("Sub", [x, mean], [centred], name=names(base + "_centre")),
                helper.make_node("Mul", [centred, centred], [squared], name=names(base + "_square")),
                _reduce_mean(graph, names, squared, node.output[0], axes, keepdims, version,
                             base + "_as_centred_variance")]
        replacements[index] = new
    splice(graph, replacements)
    return sites


def _reduce_mean(graph, names: Names, x: str, out: str, axes, keepdims: int, version: int, name: str):
    """ReduceMean over `axes` ("all": every axis), axes as an input or an attribute per opset."""
    inputs, attrs = [x], {"keepdims": keepdims}
    if axes != "all":
        if version >= AXES_AS_INPUT["ReduceMean"]:
            inputs.append(add_initializer(graph, names(name + "_axes"), np.array(axes, np.int64)))
        else:
            attrs["axes"] = list(axes)
    return helper.make_node("ReduceMean", inputs, [out], name=name, **attrs)


class _Shapes:
    """Static shapes of the model; inferred (on a copy) once, the first time a tensor's shape is not known yet."""

    def __init__(self, model) -> None:
        from qnn_tasks.rewrites.graphtools import static_shapes

        self.model, self.known, self.inferred = model, static_shapes(model), False

    def get(self, name: str) -> tuple[int, ...] | None:
        if name not in self.known and not self.inferred:
            from qnn_tasks.rewrites.graphtools import static_shapes

            self.inferred = True
            try:
                self.known.update(static_shapes(onnx.shape_inference.infer_shapes(self.model, data_prop=True)))
            except Exception:  # a model onnx can't infer: means written as ReduceSum x 1/N are not recognised
                pass
        return self.known.get(name)


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
    if version >= AXES_AS_INPUT[node.op_type]:
        if len(node.input) > 1 and node.input[1]:
            axes = evaluator.value(node.input[1])
            return None if axes is None else tuple(int(a) for a in axes.reshape(-1))
        return "all"
    return tuple(attrs.get("axes", ())) or "all"


def _scalar(name: str, evaluator: Evaluator) -> float | None:
    value = evaluator.value(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _mean_of(name: str, made: dict, evaluator: Evaluator, version: int, shapes: _Shapes):
    """(tensor, normalised axes, keepdims) if `name` is the mean of a tensor, else None.

    ReduceMean(t), or ReduceSum(t) * (1/N), (1/N) * ReduceSum(t), ReduceSum(t) / N.
    """
    node = made.get(name)
    if node is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "ReduceMean":
        reduce = node
    elif node.op_type in ("Mul", "Div") and len(node.input) == 2:
        candidates = [(0, 1), (1, 0)] if node.op_type == "Mul" else [(0, 1)]
        reduce = None
        for sum_at, const_at in candidates:
            summed, factor = made.get(node.input[sum_at]), _scalar(node.input[const_at], evaluator)
            if summed is None or summed.op_type != "ReduceSum" or not factor:
                continue
            count = _count(summed, evaluator, version, shapes)
            scale = factor * count if node.op_type == "Mul" else count / factor
            if count and abs(scale - 1.0) < 1e-5:
                reduce = summed
                break
        if reduce is None:
            return None
    else:
        return None
    axes = _normalised_axes(reduce, evaluator, version, shapes)
    if axes is None:
        return None
    keepdims = {a.name: helper.get_attribute_value(a) for a in reduce.attribute}.get("keepdims", 1)
    return reduce.input[0], axes, int(keepdims)


def _normalised_axes(reduce, evaluator: Evaluator, version: int, shapes: _Shapes):
    axes = _axes(reduce, evaluator, version)
    if axes is None or axes == "all":
        return axes
    shape = shapes.get(reduce.input[0])
    if shape is None:
        return tuple(sorted(axes)) if all(a >= 0 for a in axes) else axes
    return tuple(sorted(a % len(shape) for a in axes))


def _count(reduce, evaluator: Evaluator, version: int, shapes: _Shapes) -> int | None:
    """How many elements each output of a Reduce op sums (None: shapes unknown)."""
    shape = shapes.get(reduce.input[0])
    axes = _axes(reduce, evaluator, version)
    if shape is None or axes is None:
        return None
    dims = shape if axes == "all" else [shape[a] for a in axes]
    return int(np.prod(dims)) if dims else 1


def _variance_pattern(sub, made: dict, evaluator: Evaluator, version: int, shapes: _Shapes):
    """(x, the kept-dims mean tensor or None, axes, keepdims) if `sub` is mean(x^2) - mean(x)^2, else None."""
    square_mean = _mean_of(sub.input[0], made, evaluator, version, shapes)
    mean = _square_of(sub.input[1], made, evaluator)
    mean_of_x = _mean_of(mean, made, evaluator, version, shapes) if mean else None
    if square_mean is None or mean_of_x is None:
        return None
    x = _square_of(square_mean[0], made, evaluator)
    if x is None or mean_of_x[0] != x or square_mean[1:] != mean_of_x[1:]:
        return None
    _, axes, keepdims = mean_of_x
    return x, (mean if keepdims else None), axes, keepdims
