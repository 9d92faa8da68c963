"""Which initializers are a graph's weights, and their output-channel axis: a module of its own, so the stages that
read it (quantize, repair, lint's memory estimate) are keyed on it and nothing else is."""
from __future__ import annotations

# op -> its weight's output-channel axis (None: Gemm's follows transB)
WEIGHT_AXIS = {"Conv": 0, "ConvTranspose": 1, "MatMul": -1, "Gemm": None}


def weight_axes(model) -> dict[str, int]:
    """{weight: its output-channel axis} of every 2+-dim float initializer a Conv/ConvTranspose/MatMul/Gemm reads
    as its weight (input 1): the weights w4a16 keeps in 4 bits (toolchains/ort_quantize.py), the repair may promote
    to 16 (stages/repair.py) and the memory estimate counts at 4 bits (graphs/memory.py)."""
    floats = {t.name: len(t.dims) for t in model.graph.initializer if t.data_type in (1, 10, 11, 16)}
    found: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type not in WEIGHT_AXIS or len(node.input) < 2 or floats.get(node.input[1], 0) < 2:
            continue
        axis = WEIGHT_AXIS[node.op_type]
        if axis is None:  # Gemm: B is [K, N] unless transB
            axis = 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
        found[node.input[1]] = axis % floats[node.input[1]]
    return found
