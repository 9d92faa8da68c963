"""The model onnxruntime's compile is given when an If/Loop/Scan body holds weights: a copy that keeps them in a file.

An If left on the CPU is written into the compiled model by onnxruntime, body and all. onnxruntime (1.24 and later)
holds an initializer over 127 bytes in memory and writes a body's as a `*/_ORT_MEM_ADDR_/*` marker, which it then
refuses itself ("Initializer 'w' references an ORT in-memory address marker"); a body weight read from an external
data file is written inline instead (measured with onnxruntime 1.32). So the compile reads a copy whose body
initializers are external data in a file beside it; the compiled model holds them inline and needs no such file.
"""
from __future__ import annotations

from pathlib import Path

import onnx
from onnx import AttributeProto, numpy_helper

from qnn_tasks import fileio

BODY_DATA = "body_weights.bin"


def staged(model: Path, staging: Path) -> tuple[Path, list[str]]:
    """(the model to compile, the body initializers moved to a file): `model` itself when no body holds one, else
    a copy in `staging` (the external data files of its main graph linked beside it)."""
    from onnx.external_data_helper import uses_external_data

    proto = onnx.load(str(model), load_external_data=False)
    bodies = [body for node in proto.graph.node for body in _bodies(node)]
    for body in bodies:
        _constants_as_initializers(body)
    weights = [t for body in bodies for t in body.initializer
               if not uses_external_data(t) and t.data_type != onnx.TensorProto.STRING]  # strings stay inline
    if not weights:
        return model, []
    staging.mkdir(parents=True, exist_ok=True)
    for name in _external_files(proto, bodies):  # the copy still reads them, relative to itself
        fileio.place(model.parent / name, staging / name)
    with open(staging / BODY_DATA, "wb") as data:
        for tensor in weights:
            _move_to_file(tensor, data)
    copy = staging / model.name
    onnx.save(proto, str(copy))
    return copy, [t.name for t in weights]


def _bodies(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The bodies of a node and of the nodes inside them, outermost first."""
    found = []
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            found.append(graph)
            found += [inner for n in graph.node for inner in _bodies(n)]
    return found


def _constants_as_initializers(body: onnx.GraphProto) -> None:
    """Constant nodes holding a tensor become initializers (onnxruntime turns them into in-memory ones too)."""
    kept = []
    for node in body.node:
        tensor = next((a.t for a in node.attribute if a.name == "value" and a.type == AttributeProto.TENSOR), None)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and tensor is not None:
            value = numpy_helper.to_array(tensor)
            body.initializer.append(numpy_helper.from_array(value, node.output[0]))
        else:
            kept.append(node)
    if len(kept) != len(body.node):
        del body.node[:]
        body.node.extend(kept)


def _move_to_file(tensor: onnx.TensorProto, data) -> None:
    from onnx.external_data_helper import set_external_data

    raw = numpy_helper.to_array(tensor).tobytes()  # whichever field held the values, as raw little-endian bytes
    offset = data.tell()
    data.write(raw)
    for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(field)
    tensor.raw_data = raw  # set_external_data wants it there
    set_external_data(tensor, BODY_DATA, offset, len(raw))
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.ClearField("raw_data")


def _external_files(proto: onnx.ModelProto, bodies: list[onnx.GraphProto]) -> list[str]:
    from onnx.external_data_helper import uses_external_data

    tensors = [t for graph in [proto.graph, *bodies] for t in graph.initializer]
    return sorted({e.value for t in tensors if uses_external_data(t) for e in t.external_data if e.key == "location"})


