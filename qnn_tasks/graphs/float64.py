"""An ONNX evaluated in float64: the truth a float32 CPU reference is measured against when it is in doubt.

A float32 CPU run is the reference by default, but it carries its own rounding: a variance computed as
E[x^2] - E[x]^2 on inputs of mean 100 loses ~3e-3 to cancellation in float32 (docs/verification-and-report.md),
more than a threshold of 1e-3 allows. When a comparison fails, the graph is evaluated again in float64 (a double-typed
copy under onnxruntime's CPU provider, where ops without a double kernel run in float32 between casts; onnx's
ReferenceEvaluator when onnxruntime cannot run it at all) and each float32 side is measured against it, so a
failure can be blamed on the side that is off.
It costs one more CPU run of the graph, so callers use it only after a comparison failed.
"""
from __future__ import annotations

from typing import Any

import numpy as np

FLOAT, DOUBLE = 1, 11  # onnx.TensorProto.FLOAT, DOUBLE
ORT = "a float64 copy of {name} under onnxruntime CPU"
REFERENCE_EVALUATOR = "a float64 copy of {name} under onnx's ReferenceEvaluator (onnxruntime could not run it: {why})"


def double_copy(model) -> Any:
    """A copy of `model` computing in float64 where it computed in float32 (tensors, I/O, casts, dtype attributes)."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _to_double(copy.graph)
    for function in copy.functions:
        for node in function.node:
            _node_to_double(node)
    return copy


def _to_double(graph) -> None:
    for i, tensor in enumerate(graph.initializer):
        if tensor.data_type == FLOAT:
            graph.initializer[i].CopyFrom(_tensor_to_double(tensor))
    for value in list(graph.input) + list(graph.output):
        if value.type.tensor_type.elem_type == FLOAT:
            value.type.tensor_type.elem_type = DOUBLE
    del graph.value_info[:]  # re-inferred by the runtime; a stale float entry would contradict the copy
    for node in graph.node:
        _node_to_double(node)


def _node_to_double(node) -> None:
    import onnx
    from onnx import helper

    if node.op_type == "Constant" and node.attribute and node.attribute[0].name in ("value_float", "value_floats"):
        value = helper.get_attribute_value(node.attribute[0])  # a float32 scalar or list: made a double tensor
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("value", _tensor_to_double(
            helper.make_tensor("", FLOAT, [len(value)] if isinstance(value, list) else [], np.atleast_1d(value)))))
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == FLOAT:  # Constant, ConstantOfShape
            attr.t.CopyFrom(_tensor_to_double(attr.t))
        elif attr.type == onnx.AttributeProto.INT and attr.name in ("to", "dtype") and attr.i == FLOAT:
            attr.i = DOUBLE  # Cast(to=float), RandomNormal/EyeLike(dtype=float)
        elif attr.type == onnx.AttributeProto.GRAPH:  # If/Loop/Scan bodies
            _to_double(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for sub in attr.graphs:
                _to_double(sub)


def _tensor_to_double(tensor):
    from onnx import numpy_helper

    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)


def evaluate(model, feeds: list[dict[str, np.ndarray]], name: str) -> tuple[list[dict[str, np.ndarray]], str]:
    """(outputs per sample, how they were computed) of `model` in float64; float inputs are fed as float64.

    onnxruntime's CPU provider lacks double kernels for some ops (Conv, Erf, ...): those nodes run in float32
    between casts (said in `how`): MiniLM (22 M parameters, 8 samples) took 10-13 s so against 2-2.5 s in float32,
    where onnx's ReferenceEvaluator (the fallback, all in float64) took 20-48 s. Raises RuntimeError (one line)
    when neither can run the copy.
    """
    try:
        double = double_copy(model)
    except Exception as err:  # a tensor onnx cannot convert: said, never a traceback in the stage that asked
        raise RuntimeError(f"no float64 copy of {name}: {_first_line(err)}") from None
    wide = [{k: (np.asarray(v, np.float64) if np.asarray(v).dtype == np.float32 else v) for k, v in f.items()}
            for f in feeds]
    narrow, why = _missing_kernels(double)
    if why is None:
        try:
            session = _session(_narrowed(double, narrow) if narrow else double)
            names = [o.name for o in session.get_outputs()]
            how = ORT.format(name=name) + (f" ({', '.join(narrow)} in float32: no double kernel)" if narrow else "")
            return [dict(zip(names, session.run(None, f))) for f in wide], how
        except Exception as err:  # e.g. a kernel that fails at run time: the reference evaluator may still run it
            why = _first_line(err)
    from onnx.reference import ReferenceEvaluator

    try:
        evaluator = ReferenceEvaluator(double)
        names = list(evaluator.output_names)
        return [dict(zip(names, evaluator.run(None, f))) for f in wide], REFERENCE_EVALUATOR.format(name=name, why=why)
    except Exception as err:
        raise RuntimeError(f"no float64 evaluation of {name}: onnxruntime: {why}; ReferenceEvaluator: "
                           f"{_first_line(err)}") from None


MAX_NARROWED = 8  # op types without a double kernel tried in float32 before giving up on onnxruntime


def _session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # fusions (Gelu, LayerNorm, ...) look for float kernels and cost seconds on a large model: a plain graph
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _missing_kernels(double) -> tuple[list[str], str | None]:
    """(op types onnxruntime has no double kernel for, why it cannot run the copy at all or None).

    Probed on the graph without its weights (they become inputs): a failed session of a large model costs
    seconds of serialising weights, of its skeleton milliseconds.
    """
    import re

    skeleton = _skeleton(double)
    narrow: list[str] = []
    for _ in range(MAX_NARROWED + 1):
        try:
            _session(_narrowed(skeleton, narrow) if narrow else skeleton)
            return narrow, None
        except Exception as err:  # NOT_IMPLEMENTED: an op without a double kernel
            why = _first_line(err)
            found = re.search(r"Could not find an implementation for (\w+)\(\d+\)", why)
            if not found or found.group(1) in narrow:
                return narrow, why
            narrow.append(found.group(1))
    return narrow, why


def _skeleton(model):
    """`model` with its initializers turned into graph inputs of the same type and shape (no weight data)."""
    import onnx
    from onnx import helper

    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    weights = list(skeleton.graph.initializer)
    del skeleton.graph.initializer[:]
    listed = {i.name for i in skeleton.graph.input}  # before IR 4 initializers are listed as inputs too
    skeleton.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                for t in weights if t.name not in listed)
    return skeleton


def _narrowed(double, ops: list[str]):
    """`double` with every main-graph node of `ops` run in float32: its double inputs cast down, outputs back up."""
    import onnx
    from onnx import helper

    inferred = onnx.shape_inference.infer_shapes(_skeleton(double) if double.graph.initializer else double)
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    copy = onnx.ModelProto()
    copy.CopyFrom(double)
    nodes = []
    for i, node in enumerate(copy.graph.node):
        if node.op_type not in ops:
            nodes.append(node)
            continue
        tag = f"__f32_{i}"
        for k, name in enumerate(node.input):
            if name and types.get(name) == DOUBLE:
                nodes.append(helper.make_node("Cast", [name], [name + tag], to=FLOAT))
                node.input[k] = name + tag
        after = []
        for k, name in enumerate(node.output):
            if name and types.get(name) == DOUBLE:
                node.output[k] = name + tag
                after.append(helper.make_node("Cast", [name + tag], [name], to=DOUBLE))
        nodes += [node, *after]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:200]

