"""Every intermediate tensor of a graph as an output of its own: what diagnose and the precision repair compare,
node by node, between the NPU (the simulator) and the CPU."""
from __future__ import annotations

from typing import Any


def expose_intermediates(model) -> tuple[Any, list[dict[str, Any]]]:
    """A copy of `model` whose every float32 node output is also a graph output, in graph order."""
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
            if types.get(name) != onnx.TensorProto.FLOAT:
                continue
            tensors.append({"index": index, "node": node.name or name, "op_type": node.op_type, "tensor": name})
            if name not in existing:
                diag.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
                diag.graph.output[-1].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
                existing.add(name)
    del diag.metadata_props[:]
    return diag, tensors
