"""Will it fit: the memory a context needs on the phone while it is loaded, estimated from the ONNX before compile
and read from the binary after (docs/load-and-fit.md#will-it-fit).

Measured: the HTP prepare library writes, per graph of a context binary, the bytes it holds (qnn/binary.py
`graph_memory`): `const` (weights as compiled), `io` (graph inputs and outputs), `op_data` (run lists), `ddr`
(intermediates kept in DDR), `spill_fill` (the buffer VTCM spills to) and `shared_weights`. Resident = their sum,
every graph of a context counted (each graph's I/O stays allocated while the context is loaded). VTCM is on-chip
memory, reported beside it and not added.

Estimated (`estimate`), from the ONNX alone:
- const: the initializers' bytes at the precision (graphs/split.py `tensor_bytes`: what the size rule counts), and at
  w8a16 what the quantizer adds: a scale and offset per output channel of an 8-bit weight, and 16 bits (not 8) for
  a table a Gather reads (an embedding: its data is quantized as an activation, measured on MiniLM);
- io: the graph inputs' and outputs' bytes (float I/O stays float32 at the QNN boundary, measured);
- op_data: OP_DATA_PER_NODE bytes a node plus OP_DATA_SHARE of the intermediate activations' fp16 bytes
  (both fitted on the synthetic graphs of benchmarks/bench_memory_estimate.py);
- spill_fill: the largest intermediate activation (16-bit) when it exceeds the chip's VTCM, else 0. The prepare
  library tiles where it can, so this is an upper bound: measured spills ranged from 0 to that tensor's size.
The estimate's measured error is the benchmark's table (docs/load-and-fit.md): an estimate, never a measurement.
"""
from __future__ import annotations

from typing import Any, Mapping

from qnn_tasks.graphs import split
from qnn_tasks.graphs.weights import weight_axes
from qnn_tasks.modelspec import precision_table

MB = 1 << 20
OP_DATA_PER_NODE = 512       # bytes of run list per node (fitted, benchmarks/bench_memory_estimate.py)
ENCODING_BYTES = 8           # a per-channel scale (float32) and offset (int32) of an 8-bit weight
OP_DATA_SHARE = 0.004        # ... plus this share of the intermediate activations' fp16 bytes (tiling metadata)
MEASURED_PARTS = ("const", "io", "op_data", "ddr", "spill_fill", "shared_weights")
ESTIMATE_BASIS = ("estimated at lint from the ONNX: weights at the precision + graph I/O + run lists + the spill "
                  "buffer of activations larger than VTCM")
MEASURED_BASIS = "read from the context binary: the HTP prepare library's per-graph memory figures"
FLOAT_IO = {1, 10, 16}        # float32, float16, bfloat16 I/O: float32 at the QNN boundary


def _elements(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= max(int(dim), 1)
    return count


def _activations(model) -> tuple[int, int, int]:
    """(nodes that do work, the intermediate activations' elements, the largest one's elements)."""
    from qnn_tasks.latency import features

    shapes = features.shapes(model)
    kept = {t.name for t in model.graph.initializer} | {o.name for o in model.graph.output}
    sizes = [_elements(shapes[name]) for node in model.graph.node if node.op_type not in features.FREE_OPS
             for name in node.output if name in shapes and name not in kept]
    nodes = sum(1 for node in model.graph.node if node.op_type not in features.FREE_OPS)
    return nodes, sum(sizes), max(sizes, default=0)


def gather_tables(model) -> list[dict[str, Any]]:
    """The weights a quantized precision keeps at 16 bits without being asked: tables a Gather reads (an embedding),
    which the quantizer treats as activations (16-bit at w8a16 and w4a16), with their bytes so."""
    tables = {node.input[0] for node in model.graph.node if node.op_type == "Gather" and node.input}
    return [{"tensor": t.name, "bytes": 2 * split.tensor_bytes(t, "w8a16"),
             "why": "read by a Gather (an embedding table): quantized as a 16-bit activation"}
            for t in model.graph.initializer if t.name in tables and len(t.dims) >= 2]


def const_bytes(model, precision: str) -> int:
    """The weights' bytes as compiled at `precision` (see the module doc). A quantized precision with 4-bit weights
    (w4a16): those of Conv/MatMul/Gemm (onnxinfo.weight_axes, what ort_quantize keeps at 4 bits), the rest as at
    w8a16."""
    if not precision_table.is_quantized(precision):
        return split.weight_bytes(model, precision)
    tables = {node.input[0] for node in model.graph.node if node.op_type == "Gather" and node.input}
    four = set(weight_axes(model)) if precision_table.BY_NAME[precision].weight_bits == 4 else set()
    total = 0
    for tensor in model.graph.initializer:
        eight = split.tensor_bytes(tensor, "w8a16")
        if tensor.name in tables and len(tensor.dims) >= 2:
            total += 2 * eight                                  # 16-bit: twice the 8-bit count
        elif len(tensor.dims) >= 2 and tensor.data_type in split.FLOATS:
            channels = tensor.dims[-1] if len(tensor.dims) == 2 else tensor.dims[0]  # MatMul [K, N]; Conv [O, ...]
            total += (split.tensor_bytes(tensor, "w4a16") if tensor.name in four else eight) \
                + ENCODING_BYTES * int(channels)
        else:
            total += eight
    return total


def io_bytes(model) -> int:
    """Bytes of the graph's inputs and outputs as the QNN graph holds them (float ones as float32)."""
    total = 0
    for value in list(model.graph.input) + list(model.graph.output):
        tensor = value.type.tensor_type
        dims = [d.dim_value for d in tensor.shape.dim]
        total += _elements(dims) * (4 if tensor.elem_type in FLOAT_IO else split.ITEMSIZE.get(tensor.elem_type, 4))
    return total


def estimate(model, precision: str, vtcm_mb: int) -> dict[str, Any]:
    """The resident bytes a context of this graph needs at `precision` on a chip with `vtcm_mb` of VTCM: each
    part and their sum, with the basis."""
    return estimates(model, (precision,), vtcm_mb)[precision]


def estimates(model, precisions, vtcm_mb: int) -> dict[str, dict[str, Any]]:
    """`estimate` at each precision; the activations (a shape inference) and the I/O are read once for all."""
    nodes, activations, largest = _activations(model)
    shared = {"io": io_bytes(model), "op_data": int(OP_DATA_PER_NODE * nodes + OP_DATA_SHARE * 2 * activations),
              "spill_fill": 2 * largest if 2 * largest > vtcm_mb * MB else 0}
    tables = gather_tables(model) if precision_table.any_quantized(precisions) else []
    found = {}
    for precision in precisions:
        parts = {"const": const_bytes(model, precision), **shared}
        found[precision] = {**parts, "resident": sum(parts.values()), "vtcm_mb": vtcm_mb, "basis": ESTIMATE_BASIS}
        if tables and precision_table.is_quantized(precision):
            found[precision]["sixteen_bit"] = tables
    return found


def measured(binary_info: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The resident bytes a built context holds, summed over its graphs, from qnn/binary.py's info dict; None when
    the binary does not give its figures (an older QNN, or a binary read by another tool)."""
    graphs = (binary_info or {}).get("graphs") or []
    figures = [g.get("memory") for g in graphs]
    if not figures or any(not isinstance(f, Mapping) for f in figures):
        return None
    parts = {key: sum(int(f.get(key) or 0) for f in figures) for key in MEASURED_PARTS}
    return {**parts, "resident": sum(parts.values()), "vtcm": max(int(f.get("vtcm") or 0) for f in figures),
            "graphs": len(figures), "basis": MEASURED_BASIS}


def error(estimated: int, actual: int) -> float | None:
    """The estimate's signed relative error against the measurement (+0.05: 5% over)."""
    return round(estimated / actual - 1, 4) if actual else None


def mb(size: float) -> str:
    """Bytes in MiB, the unit of socs.yaml memory_mb (2048 = the 2 GiB limit)."""
    value = size / MB
    if value < 1:
        return f"{value:.3f} MiB"
    return f"{value:,.1f} MiB" if value < 100 else f"{value:,.0f} MiB"


def of_records(lint: Mapping[str, Any] | None, context: Mapping[str, Any] | None,
               precision: str) -> dict[str, Any] | None:
    """`figure` of a target from its graph's lint record (the estimate) and its context record (the binary)."""
    return figure(((lint or {}).get("memory_estimate") or {}).get(precision), measured((context or {}).get("binary")))


def figure(estimated: Mapping[str, Any] | None, read: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a report row and a manifest binary say about memory: the binary's own figure where it gives one (else the
    estimate, said as one), with the lint estimate and its error beside it. None when neither is known."""
    if not estimated and not read:
        return None
    out: dict[str, Any] = {"resident_bytes": int((read or estimated)["resident"]),
                           "basis": (read or estimated)["basis"]}
    if read:
        out["measured"] = {key: int(read[key]) for key in (*MEASURED_PARTS, "vtcm")}
    if estimated:
        out["estimate"] = {"resident_bytes": int(estimated["resident"]), "basis": estimated["basis"]}
        if read:
            out["estimate"]["error"] = error(int(estimated["resident"]), int(read["resident"]))
    return out
