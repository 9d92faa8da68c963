"""Wrap a QNN context binary in an ONNX model with one EPContext node, so onnxruntime-qnn can load it.

A context binary built by the SDK (qnn-context-binary-generator) is what a phone loads; onnxruntime's
QNN execution provider loads the same binary through an ONNX model holding one `com.microsoft`
EPContext node (the format ORT's own compile API writes, see docs/toolchains.md). With it, `simverify` runs an
SDK-built binary on the x86 HTP simulator exactly as it runs an ort-qnn build.

The node: name and `partition_name` = the QNN graph's name in the binary (how the EP finds the
graph), `main_context=1`, `embed_mode=0` with `ep_cache_context` = the binary's path relative to the
ONNX file (the EP refuses absolute paths and '..'), `source="QNN"`, `ep_sdk_version` = the binary's QNN
build id. Its inputs/outputs are the graph's declared tensors (model.yaml names, order, shapes).

When the binary's I/O dtypes differ from model.yaml's (the converter may make graph I/O float16 or
8/16-bit quantized), Cast / QuantizeLinear / DequantizeLinear adapters are put around the node; those
run on CPU, which verification (CPU fallback disabled) refuses: the caller reports that. A different
layout (shape) cannot be adapted and is an error.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.fileio import atomic_path
from qnn_tasks.modelspec.project import GraphSpec, TensorSpec

ONNX_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "bool": 9,
              "float16": 10}
# QNN dtype (qnnbin's names) -> (ONNX element type name, quantized?)
QNN_TYPES = {"float32": ("float32", False), "float16": ("float16", False), "int32": ("int32", False),
             "int8": ("int8", False), "int16": ("int16", False), "uint8": ("uint8", False), "uint16": ("uint16", False),
             "bool": ("bool", False), "int64": ("int64", False),
             "ufixed_point_8": ("uint8", True), "ufixed_point_16": ("uint16", True),
             "sfixed_point_8": ("int8", True), "sfixed_point_16": ("int16", True)}
OPSET = 21          # QuantizeLinear/DequantizeLinear with 16-bit types
IR_VERSION = 10


def write_wrapper(out: Path, binary_path: Path, graph: GraphSpec, binary: dict[str, Any],
                  graph_name: str | None = None) -> dict[str, Any]:
    """Write `out` (<graph>_ctx.onnx) around `binary_path`; `binary` is qnnbin's info dict for it."""
    import onnx
    from onnx import helper

    graphs = binary.get("graphs") or []
    if not graphs:
        raise StageError(f"{binary_path}: the context binary holds no graph")
    qnn_graph = next((g for g in graphs if g["name"] == graph_name), graphs[0])
    relative = Path(os.path.relpath(binary_path, out.parent)).as_posix()
    if relative.startswith(".."):
        raise StageError(f"{binary_path}: must sit in or below {out.parent} (the EPContext path may not leave it)")

    before, after, initializers, value_info, adapters = [], [], [], [], []
    node_inputs = _bind(graph.inputs, qnn_graph["inputs"], "input", binary_path, before, initializers, value_info,
                        adapters)
    node_outputs = _bind(graph.outputs, qnn_graph["outputs"], "output", binary_path, after, initializers, value_info,
                         adapters)
    context = helper.make_node(
        "EPContext", node_inputs, node_outputs, name=qnn_graph["name"], domain="com.microsoft",
        main_context=1, embed_mode=0, ep_cache_context=relative, source="QNN",
        partition_name=qnn_graph["name"], ep_sdk_version=binary.get("build_id") or "")
    onnx_graph = helper.make_graph(
        before + [context] + after, f"{graph.name}_ctx",
        [helper.make_tensor_value_info(t.name, ONNX_TYPES[t.dtype], list(t.shape)) for t in graph.inputs],
        [helper.make_tensor_value_info(t.name, ONNX_TYPES[t.dtype], list(t.shape)) for t in graph.outputs],
        initializer=initializers, value_info=value_info)
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                         helper.make_opsetid("com.microsoft", 1)],
                              producer_name="qnn-npu-compile", ir_version=IR_VERSION)
    for key, value in (("qnn_tasks.wrapper", "EPContext around an SDK-built QNN context binary"),
                       ("qnn_tasks.binary", relative), ("qnn_tasks.qnn_graph", qnn_graph["name"])):
        model.metadata_props.add(key=key, value=value)
    with atomic_path(out) as tmp:
        onnx.save(model, str(tmp))
    return {"path": str(out), "ep_cache_context": relative, "qnn_graph": qnn_graph["name"], "adapters": adapters}


def _bind(declared: tuple[TensorSpec, ...], qnn: list[dict[str, Any]], kind: str, binary_path: Path, nodes: list,
          initializers: list, value_info: list, adapters: list) -> list[str]:
    """Names the EPContext node uses for each declared tensor, adding adapters where the dtype differs."""
    import numpy as np
    from onnx import helper, numpy_helper

    names = []
    for spec, tensor in pair_tensors(declared, qnn, kind, binary_path):
        if list(tensor["shape"]) != list(spec.shape):
            raise StageError(
                f"{binary_path}: {kind} '{spec.name}' is {tensor['shape']} in the binary (tensor '{tensor['name']}'), "
                f"model.yaml says {list(spec.shape)}: the converter changed its layout, so the simulator cannot be "
                f"fed model.yaml's tensors (fix: add --preserve_io layout to options.converter_args in "
                f"toolchain/qairt.yaml, or export the graph in the layout the converter keeps)")
        onnx_type, quantized = QNN_TYPES.get(tensor["dtype"], (None, False))
        if onnx_type is None:
            raise StageError(f"{binary_path}: {kind} '{spec.name}' has QNN dtype {tensor['dtype']}, which the "
                             f"EPContext wrapper cannot map to ONNX")
        if onnx_type == spec.dtype and not quantized:
            names.append(spec.name)
            continue
        inner = f"{spec.name}__qnn"
        names.append(inner)
        value_info.append(helper.make_tensor_value_info(inner, ONNX_TYPES[onnx_type], list(spec.shape)))
        source, target = (spec.name, inner) if kind == "input" else (inner, spec.name)
        if quantized:
            q = tensor.get("quantization") or {}
            if "scale" not in q:
                raise StageError(f"{binary_path}: {kind} '{spec.name}' is {tensor['dtype']} without a per-tensor "
                                 f"scale/offset: the wrapper cannot (de)quantize it")
            scale = numpy_helper.from_array(np.array(q["scale"], np.float32), f"{spec.name}__scale")
            zero = numpy_helper.from_array(np.array(-int(q.get("offset", 0)), np.dtype(onnx_type)),
                                           f"{spec.name}__zero_point")  # QNN: real = scale * (q + offset)
            initializers += [scale, zero]
            op = "QuantizeLinear" if kind == "input" else "DequantizeLinear"
            nodes.append(helper.make_node(op, [source, scale.name, zero.name], [target], name=f"{op}_{spec.name}"))
            adapters.append({"tensor": spec.name, "op": op, "qnn_dtype": tensor["dtype"], "scale": q["scale"],
                             "offset": q.get("offset", 0)})
        else:
            to = ONNX_TYPES[onnx_type] if kind == "input" else ONNX_TYPES[spec.dtype]
            nodes.append(helper.make_node("Cast", [source], [target], name=f"Cast_{spec.name}", to=to))
            adapters.append({"tensor": spec.name, "op": "Cast", "qnn_dtype": tensor["dtype"], "declared": spec.dtype})
    return names


def pair_tensors(declared: tuple[TensorSpec, ...], qnn: list[dict[str, Any]], kind: str,
                 binary: Path) -> list[tuple[TensorSpec, dict[str, Any]]]:
    """Each declared tensor with the binary's (same name, converter-style name, else same position)."""
    if len(declared) != len(qnn):
        raise StageError(f"{binary}: the graph has {len(qnn)} {kind}s {[t['name'] for t in qnn]}, model.yaml "
                         f"declares {len(declared)} {[t.name for t in declared]} (rebuild the context)")
    by_name = {plain_name(t["name"]): t for t in qnn}
    return [(spec, by_name.get(plain_name(spec.name)) or qnn[position]) for position, spec in enumerate(declared)]


def plain_name(name: str) -> str:
    """Tensor names as the converter writes them (anything but [A-Za-z0-9_] becomes _)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)
