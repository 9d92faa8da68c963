"""What a graph costs, read from its ONNX alone (shapes inferred): MACs, parameters, activation elements, node
count and the op mix by family. The latency estimate (estimate.py) is arithmetic on these numbers."""
from __future__ import annotations

from pathlib import Path
from typing import Any

# Op families: the estimate knows a graph's mix by these; an op in none of them is "other" and is reported.
FAMILIES = {
    "conv": {"Conv", "ConvTranspose"},
    "matmul": {"MatMul", "Gemm", "Einsum"},
    "norm": {"BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
             "ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2", "LpNormalization", "SimplifiedLayerNormalization"},
    "softmax": {"Softmax", "LogSoftmax"},
    "pool": {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"},
    "elementwise": {"Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish",
                    "Erf", "Gelu", "Pow", "Sqrt", "Exp", "Log", "Neg", "Abs", "Max", "Min", "LeakyRelu", "PRelu",
                    "Elu", "Softplus", "Reciprocal", "Where", "Equal", "Less", "Greater", "Not", "And", "Cast",
                    "Floor", "Ceil", "Round", "Sin", "Cos", "Mish", "Selu", "Sign", "Mod", "IsNaN"},
    "layout": {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather",
               "Expand", "Tile", "Pad", "Identity", "Shape", "ConstantOfShape", "Range", "DepthToSpace",
               "SpaceToDepth", "GatherElements", "ScatterND", "Dropout", "Constant"},
    "resize": {"Resize", "Upsample"},
    "recurrent": {"LSTM", "GRU", "RNN"},
}
FAMILY_OF = {op: fam for fam, ops in FAMILIES.items() for op in ops}
FREE_OPS = {"Constant", "Identity", "Shape", "Dropout"}  # no work on the NPU (folded by the converter)


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def shapes(model) -> dict[str, list[int]]:
    """Every tensor's shape the ONNX knows (after shape inference). A dim inference left symbolic counts as 1: the
    exporter leaves a batch dim so where it loses track of it (fixed graphs here have batch 1)."""
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - a graph shape inference cannot walk keeps the shapes it declares
        pass
    out: dict[str, list[int]] = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else 1 for d in dims]
    for t in model.graph.initializer:
        out[t.name] = list(t.dims)
    return out


def _attr(node, name: str, default: Any) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _macs(node, shapes: dict[str, list[int]]) -> int:
    op = node.op_type
    out = shapes.get(node.output[0]) if node.output else None
    if op == "Conv" and out is not None and node.input[1] in shapes:
        return _prod(out) * _prod(shapes[node.input[1]][1:])
    if op == "ConvTranspose" and node.input[0] in shapes and node.input[1] in shapes:
        return _prod(shapes[node.input[0]]) * _prod(shapes[node.input[1]][1:])
    if op in ("MatMul", "Gemm") and out is not None and node.input[0] in shapes:
        a = shapes[node.input[0]]
        k = a[0] if op == "Gemm" and _attr(node, "transA", 0) else (a[-1] if a else 1)
        return _prod(out) * int(k)
    return 0


def graph_features(model) -> dict[str, Any]:
    """The features of an in-memory onnx.ModelProto (see module doc); every count is an int."""
    known = shapes(model)
    inits = {t.name for t in model.graph.initializer}
    params = sum(_prod(t.dims) for t in model.graph.initializer)
    macs = {"conv": 0, "matmul": 0}
    ops: dict[str, int] = {}
    activations = 0
    nodes = 0
    for node in model.graph.node:
        if node.op_type in FREE_OPS:
            continue
        nodes += 1
        fam = FAMILY_OF.get(node.op_type, "other")
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
        m = _macs(node, known)
        if m:
            macs["conv" if fam == "conv" else "matmul"] += m
        for name in node.output:
            if name and name in known and name not in inits:
                activations += _prod(known[name])
    families: dict[str, int] = {}
    for op, n in ops.items():
        fam = FAMILY_OF.get(op, "other")
        families[fam] = families.get(fam, 0) + n
    return {"macs": macs["conv"] + macs["matmul"], "conv_macs": macs["conv"], "matmul_macs": macs["matmul"],
            "params": int(params), "activations": int(activations), "nodes": nodes,
            "families": dict(sorted(families.items())), "ops": dict(sorted(ops.items()))}


def onnx_features(path: Path) -> dict[str, Any]:
    """graph_features of an ONNX file (weights kept beside it are not read: shapes are enough)."""
    import onnx

    return graph_features(onnx.load(str(path), load_external_data=False))
