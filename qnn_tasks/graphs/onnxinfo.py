"""Small read-only views of an ONNX model: I/O tensors, nodes, parameter count, its I/O against model.yaml's."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from qnn_tasks.errors import StageError

if TYPE_CHECKING:
    from qnn_tasks.modelspec.project import GraphSpec

CONTROL_FLOW_OPS = {"If", "Loop", "Scan"}
# Quantized ops, standard and onnxruntime's contrib (com.microsoft) ones: QNN quantizes itself, so none
# may be inside the ONNX. Families by prefix (QLinearConv/Add/Mul/Sigmoid/Softmax/..., QOrdered*,
# DynamicQuantize*: DynamicQuantizeLinear/MatMul/LSTM), the rest by name.
INT8_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv",
            "QLinearMatMul", "MatMulInteger", "ConvInteger", "QLinearAdd", "QLinearMul",
            "DynamicQuantizeMatMul", "DynamicQuantizeLSTM", "MatMulIntegerToFloat", "MatMulInteger16",
            "QAttention", "QGemm", "QEmbedLayerNormalization", "QMoE", "MulInteger", "ReduceSumInteger",
            "QuantizeWithOrder", "DequantizeWithOrder", "MatMulNBits", "MatMulBnb4", "GatherBlockQuantized",
            "MatMulFpQ4", "QuantizeBFP", "DequantizeBFP"}
INT8_PREFIXES = ("QLinear", "QOrdered", "DynamicQuantize")


def is_quantized(node) -> bool:
    """A node doing quantized (int8/int4) arithmetic inside the ONNX."""
    return node.op_type in INT8_OPS or node.op_type.startswith(INT8_PREFIXES)


def load(path: Path, what: str = "ONNX file", shown_as: Path | None = None):
    """Load and check an ONNX model; a missing or corrupt file is a one-line StageError.

    `shown_as` names the file in messages when `path` is a temporary file about to become it.
    """
    import onnx

    path = Path(path)
    name = shown_as or path
    if not path.is_file():
        raise StageError(f"{name}: {what} not found (rebuild it: the task that makes it was not run or failed)")
    try:
        model = onnx.load(str(path), load_external_data=False)  # all of it, unless weights are kept beside it
        if has_external_data(model):  # checked by path (a > 2 GB proto cannot be); only small tensors read
            onnx.checker.check_model(str(path))
            load_small_tensors(model, path.parent)
        else:
            onnx.checker.check_model(model)
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise StageError(f"{name}: corrupt or invalid {what}: {first} (re-export it)") from None
    return model


SMALL_TENSOR = 1 << 20  # external tensors up to this many bytes are read by `load` (constants lint looks at)


def has_external_data(model) -> bool:
    """Whether the model keeps initializers in files beside it (every model over 2 GB must)."""
    from onnx.external_data_helper import uses_external_data

    return any(uses_external_data(t) for t in model.graph.initializer)


def load_small_tensors(model, base: Path) -> None:
    """Read the data of external initializers up to SMALL_TENSOR bytes (masks, scales); the weights stay out."""
    from onnx.external_data_helper import load_external_data_for_tensor
    from onnx.external_data_helper import uses_external_data as external

    for tensor in model.graph.initializer:
        if external(tensor):
            length = next((int(e.value) for e in tensor.external_data if e.key == "length"), SMALL_TENSOR + 1)
            if length <= SMALL_TENSOR:
                load_external_data_for_tensor(tensor, str(base))
                tensor.data_location = 0  # DEFAULT: the data is inline now
                del tensor.external_data[:]


def dtype_name(elem_type: int) -> str:
    import onnx

    return onnx.helper.tensor_dtype_to_np_dtype(elem_type).name if elem_type else "undefined"


def tensors(values) -> list[dict[str, Any]]:
    """[{name, shape (ints, or strings for symbolic dims), dtype}] for graph inputs or outputs."""
    out = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
        out.append({"name": v.name, "shape": dims, "dtype": dtype_name(t.elem_type)})
    return out


def graph_io(model) -> dict[str, list[dict[str, Any]]]:
    initializer_names = {i.name for i in model.graph.initializer}
    return {"inputs": tensors([i for i in model.graph.input if i.name not in initializer_names]),
            "outputs": tensors(model.graph.output)}


def parameter_count(model) -> int:
    import numpy as np

    return int(sum(int(np.prod(t.dims)) if t.dims else 1 for t in model.graph.initializer))


def node_label(node) -> str:
    return f"{node.op_type} node '{node.name or node.output[0]}'"


def io_mismatches(model, graph: GraphSpec) -> list[str]:
    """Differences between the model's I/O and what model.yaml declares, one line each."""
    io = graph_io(model)
    problems = []
    for kind, declared in (("inputs", graph.inputs), ("outputs", graph.outputs)):
        actual = {t["name"]: t for t in io[kind]}
        for spec in declared:
            got = actual.pop(spec.name, None)
            if got is None:
                problems.append(f"{kind[:-1]} '{spec.name}' declared in model.yaml is missing "
                                f"(the model has {', '.join(t['name'] for t in io[kind]) or 'none'})")
                continue
            if list(got["shape"]) != list(spec.shape):
                problems.append(f"{kind[:-1]} '{spec.name}' has shape {got['shape']}, model.yaml says {list(spec.shape)}")
            if kind == "inputs" and got["dtype"] != spec.dtype:
                problems.append(f"input '{spec.name}' has dtype {got['dtype']}, model.yaml says {spec.dtype}")
        problems += [f"{kind[:-1]} '{name}' is not declared in model.yaml" for name in actual]
    return problems
