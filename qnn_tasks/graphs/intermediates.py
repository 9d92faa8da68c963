"""Every intermediate tensor of a graph as an output of its own: what diagnose and the precision repair compare,
node by node, between the NPU (the simulator) and the CPU. The repair exposes a quantized (QDQ) graph's dequantized
activations instead, so the NPU runs the very quantization it judges, with no second quantizer run."""
from __future__ import annotations

from typing import Any


def expose_intermediates(model, only: set[str] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """A copy of `model` whose every float32 node output (of `only`, if given) is also a graph output, in graph
    order."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in
             list(inferred.graph.value_info) + list(inferred.graph.output)}
    diag = onnx.ModelProto()
    diag.CopyFrom(inferred)
    existing = {o.name for o in diag.graph.output}
    tensors = []
    for index, node in enumerate(model.graph.node):
        if node.op_type == "Constant":
            continue
        for name in node.output:
            if types.get(name) != onnx.TensorProto.FLOAT or (only is not None and name not in only):
                continue
            tensors.append({"index": index, "node": node.name or name, "op_type": node.op_type, "tensor": name})
            if name not in existing:
                diag.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
                diag.graph.output[-1].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
                existing.add(name)
    del diag.metadata_props[:]
    return diag, tensors


def expose_dequantized(qdq, only: set[str] | None = None) -> tuple[Any, dict[str, str]]:
    """`qdq` (a QDQ model, changed in place) with each activation's DequantizeLinear output also a graph output (of
    the float tensors in `only`, if given); returns it and {that output: the float tensor it stands for (the
    QuantizeLinear's input)}. Weights are left out: their DequantizeLinear reads an initializer. External data stays
    where it is (the model is not loaded with it)."""
    import onnx

    constants = {t.name for t in qdq.graph.initializer}
    producer = {out: node for node in qdq.graph.node for out in node.output}
    existing = {o.name for o in qdq.graph.output}
    stands_for: dict[str, str] = {}
    for node in qdq.graph.node:
        quantize = producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if (quantize is None or quantize.op_type != "QuantizeLinear" or quantize.input[0] in constants
                or (only is not None and quantize.input[0] not in only)):
            continue
        stands_for[node.output[0]] = quantize.input[0]
        if node.output[0] not in existing:
            output = onnx.helper.make_empty_tensor_value_info(node.output[0])
            output.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
            qdq.graph.output.append(output)
            existing.add(node.output[0])
    return qdq, stands_for
