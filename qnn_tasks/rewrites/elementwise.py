"""Rewrites of single elementwise nodes and constants: pow-square, clip-computed, neg, finite-mask."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from qnn_tasks.rewrites.graphtools import (
    Evaluator,
    Names,
    add_initializer,
    consumers,
    label,
    splice,
    tensor_elem_type,
)

FP16_LOWEST = -65504.0


def pow_square(model: onnx.ModelProto, dry_run: bool = False) -> list[str]:
    """Pow(x, 2) -> Mul(x, x): HTP's fp16 Pow returns -4 when x underflows fp16."""
    graph, evaluator, sites, new = model.graph, Evaluator(model), [], {}
    for index, node in enumerate(graph.node):
        if node.op_type != "Pow" or len(node.input) < 2:
            continue
        exponent = evaluator.value(node.input[1])
        if exponent is None or exponent.size != 1 or float(exponent.reshape(-1)[0]) != 2.0:
            continue
        sites.append(label(node))
        new[index] = [helper.make_node("Mul", [node.input[0], node.input[0]], list(node.output),
                                       name=label(node) + "_as_mul")]
    if not dry_run:
        splice(graph, new)
    return sites


def clip_computed(model: onnx.ModelProto, dry_run: bool = False) -> list[str]:
    """Clip(x, min, max) with a min or max that is not a constant -> Min(Max(x, min), max)."""
    graph, evaluator, sites, replacements = model.graph, Evaluator(model), [], {}
    names = Names(graph)
    for index, node in enumerate(graph.node):
        if node.op_type != "Clip" or len(node.input) < 2:  # opset < 11: min/max are attributes, always constant
            continue
        low = node.input[1] if len(node.input) > 1 else ""
        high = node.input[2] if len(node.input) > 2 else ""
        if all(not bound or evaluator.is_constant(bound) for bound in (low, high)):
            continue
        sites.append(label(node))
        new, current = [], node.input[0]
        if low:
            out = node.output[0] if not high else names(label(node) + "_max_out")
            new.append(helper.make_node("Max", [current, low], [out], name=names(label(node) + "_as_max")))
            current = out
        if high:
            new.append(helper.make_node("Min", [current, high], [node.output[0]], name=names(label(node) + "_as_min")))
        replacements[index] = new
    if not dry_run:
        splice(graph, replacements)
    return sites


def neg(model: onnx.ModelProto, dry_run: bool = False) -> list[str]:
    """Neg(x) -> Sub(0, x), with a zero of x's element type."""
    graph, sites, replacements = model.graph, [], {}
    names = Names(graph)
    zeros: dict[int, str] = {}
    for index, node in enumerate(graph.node):
        if node.op_type != "Neg":
            continue
        sites.append(label(node))
        if dry_run:
            continue
        elem = tensor_elem_type(model, node.input[0]) or TensorProto.FLOAT
        if elem not in zeros:
            dtype = helper.tensor_dtype_to_np_dtype(elem)
            zeros[elem] = add_initializer(graph, names(f"zero_{np.dtype(dtype).name}"), np.zeros((), dtype))
        replacements[index] = [helper.make_node("Sub", [zeros[elem], node.input[0]], list(node.output),
                                                name=label(node) + "_as_sub")]
    splice(graph, replacements)
    return sites


def finite_mask(model: onnx.ModelProto, dry_run: bool = False, value: float = -1.0e4) -> list[str]:
    """Float constants below fp16's lowest (-inf, finfo(float32).min) -> `value`, unless they only seed a Max.

    Covers initializers, Constant nodes and ConstantOfShape fill values. A constant whose every
    user is a Max (a running maximum's start) is representable in fp16 (-inf) and harmless.
    """
    graph, sites = model.graph, []
    users = consumers(graph)

    def hazardous(name: str, tensor) -> bool:
        if tensor.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16):
            return False
        if tensor.data_location == TensorProto.EXTERNAL:
            return False  # a weight left in external data (over onnxinfo.SMALL_TENSOR): not read, not a mask
        array = numpy_helper.to_array(tensor)
        if not array.size or float(array.min()) >= FP16_LOWEST:
            return False
        readers = users.get(name, [])
        return not (readers and all(n.op_type == "Max" for n in readers))

    def fixed(tensor):
        array = numpy_helper.to_array(tensor).copy()
        array[array < FP16_LOWEST] = value
        return numpy_helper.from_array(array.astype(array.dtype), tensor.name)

    for i, tensor in enumerate(list(graph.initializer)):
        if hazardous(tensor.name, tensor):
            sites.append(tensor.name)
            if not dry_run:
                graph.initializer[i].CopyFrom(fixed(tensor))
    for node in graph.node:
        if node.op_type not in ("Constant", "ConstantOfShape"):
            continue
        for attr in node.attribute:
            if attr.name == "value" and attr.type == AttributeProto.TENSOR and hazardous(node.output[0], attr.t):
                sites.append(node.output[0])
                if not dry_run:
                    attr.t.CopyFrom(fixed(attr.t))
    return sites
