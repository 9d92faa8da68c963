"""The packaged ONNX's boundary made NPU-ready: declared static dims, int32 for int64 I/O, constant inputs.

`fix_io` edits the model in place to the I/O model.yaml declares (names, order, shapes) and
returns what it changed; a mismatch it cannot fix (a missing tensor, another rank, a static dim
that differs) raises BoundaryError with one line naming the tensor. An output's metadata is not
trusted (the CPU run of the export is): a declared output shape replaces it, and the record says so.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qnn_tasks.rewrites.graphtools import Names, infer_shapes, subgraphs

INT64, INT32 = TensorProto.INT64, TensorProto.INT32


class BoundaryError(ValueError):
    """The packaged ONNX's I/O can't be made what model.yaml declares: the problem, and a fix (keys under `graphs.<graph>`)."""

    def __init__(self, problem: str, fix: str = "make graphs.<graph>.inputs/outputs match the ONNX") -> None:
        super().__init__(problem)
        self.fix = fix


def fix_io(model: onnx.ModelProto, inputs: Iterable, outputs: Iterable,
           constant_inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Make the graph's I/O exactly `inputs`/`outputs` (objects with .name, .shape, .dtype; outputs' dtype unused).

    Undeclared inputs must be given a value in `constant_inputs` (they become initializers).
    int64 inputs declared int32 get a Cast at the boundary; int64 outputs always become int32.
    """
    graph = model.graph
    inputs, outputs, constant_inputs = list(inputs), list(outputs), dict(constant_inputs or {})
    names = Names(graph)
    report: dict[str, Any] = {"dims": {}, "casts": [], "constant_inputs": {}}
    initializers = {t.name for t in graph.initializer}
    actual = {v.name: v for v in graph.input if v.name not in initializers}
    declared = {t.source_name for t in inputs}  # names in the ONNX (a declared `onnx_name:` renames)

    for name in constant_inputs:
        if name not in actual:
            raise BoundaryError(f"constant input '{name}' is not an input of the ONNX; its inputs: "
                                f"{', '.join(actual) or 'none'}", "fix the name in graphs.<graph>.constant_inputs")
    for name, value in list(actual.items()):
        if name in declared:
            continue
        if name not in constant_inputs:
            raise BoundaryError(f"input '{name}' of the ONNX is not declared in model.yaml",
                                "declare it under graphs.<graph>.inputs, or fix its value under "
                                "graphs.<graph>.constant_inputs")
        array = _constant(value, constant_inputs[name])
        graph.initializer.append(numpy_helper.from_array(array, name))
        report["constant_inputs"][name] = array.tolist()
        del actual[name]

    new_inputs, input_casts, output_casts = [], [], []
    for spec in inputs:
        value = actual.get(spec.source_name)
        if value is None:
            raise BoundaryError(f"input '{spec.source_name}' declared in model.yaml is not an input of the ONNX; its "
                                f"inputs: {', '.join(actual) or 'none'}",
                                "use the ONNX's input names in graphs.<graph>.inputs (or as their onnx_name:)")
        _rename(graph, names, spec, value, "input", _rename_uses, report)
        _fix_dims(value, spec.shape, f"input '{spec.name}'", report)
        elem = value.type.tensor_type.elem_type
        wanted = helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
        if elem == INT64 and wanted == INT32:
            inner = names(f"{spec.name}_int64")
            _rename_uses(graph, spec.name, inner)
            input_casts.append(helper.make_node("Cast", [spec.name], [inner], to=INT64, name=names(f"{spec.name}_to_int64")))
            value.type.tensor_type.elem_type = INT32
            report["casts"].append(f"input '{spec.name}': int32 -> int64")
        elif elem != wanted:
            raise BoundaryError(f"input '{spec.name}' is {helper.tensor_dtype_to_np_dtype(elem).name} in the ONNX, "
                                f"model.yaml says {spec.dtype}",
                                "declare the ONNX's dtype (only int64 -> int32 is converted), or convert in export.py")
        new_inputs.append(value)
    del graph.input[:]
    graph.input.extend(new_inputs)

    actual_out = {v.name: v for v in graph.output}
    extra = [name for name in actual_out if name not in {t.source_name for t in outputs}]
    if extra:
        raise BoundaryError(f"output '{extra[0]}' of the ONNX is not declared in model.yaml",
                            "declare it under graphs.<graph>.outputs")
    new_outputs = []
    for spec in outputs:
        value = actual_out.get(spec.source_name)
        if value is None:
            raise BoundaryError(f"output '{spec.source_name}' declared in model.yaml is not an output of the ONNX; its "
                                f"outputs: {', '.join(actual_out) or 'none'}",
                                "use the ONNX's output names in graphs.<graph>.outputs (or as their onnx_name:)")
        _rename(graph, names, spec, value, "output", _rename_producer, report)
        _fix_dims(value, spec.shape, f"output '{spec.name}'", report, output=True)
        if value.type.tensor_type.elem_type == INT64:
            inner = names(f"{spec.name}_int64")
            _rename_producer(graph, spec.name, inner)
            output_casts.append(helper.make_node("Cast", [inner], [spec.name], to=INT32, name=names(f"{spec.name}_to_int32")))
            value.type.tensor_type.elem_type = INT32
            report["casts"].append(f"output '{spec.name}': int64 -> int32")
        new_outputs.append(value)
    del graph.output[:]
    graph.output.extend(new_outputs)

    nodes = input_casts + list(graph.node) + output_casts
    del graph.node[:]
    graph.node.extend(nodes)
    infer_shapes(model)
    return report


def _rename(graph, names, spec, value, kind: str, rename_in_graph, report: dict[str, Any]) -> None:
    """An I/O tensor declared with `onnx_name:` takes its model.yaml name (the ONNX name stays in the record)."""
    if spec.onnx_name and spec.onnx_name != spec.name:
        _free(names, spec, kind)
        rename_in_graph(graph, spec.onnx_name, spec.name)
        value.name = spec.name
        report.setdefault("renamed", {})[f"{kind} '{spec.name}'"] = spec.onnx_name


def _free(names: Names, spec, kind: str) -> None:
    """The declared name must not already name another tensor of the ONNX."""
    if spec.name in names.taken:
        raise BoundaryError(f"{kind} '{spec.onnx_name}' is renamed to '{spec.name}', a name the ONNX already uses",
                            f"choose another name for {kind}s.{spec.name} in graphs.<graph>")
    names.taken.add(spec.name)


def _constant(value, given: Any) -> np.ndarray:
    dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    array = np.asarray(given, dtype=dtype)
    dims = value.type.tensor_type.shape.dim
    if all(d.HasField("dim_value") for d in dims) and array.size == int(np.prod([d.dim_value for d in dims])):
        array = array.reshape([d.dim_value for d in dims])  # e.g. a scalar input declared [1]
    return array


def _fix_dims(value, shape: tuple[int, ...], what: str, report: dict[str, Any], output: bool = False) -> None:
    """Give `value` the declared `shape`; only the ONNX's dynamic dims (a dim_param, none, or a non-positive
    dim_value such as the -1 many exporters write) may be chosen.

    An output's declared metadata may simply be stale (an exporter writes the dims it was traced
    with): there the declaration replaces it, rank too, and the export's CPU run (stages/export.py
    run_once) is what confirms or refuses the declared shape.
    """
    tensor = value.type.tensor_type
    before = None
    if tensor.HasField("shape"):
        dims = tensor.shape.dim
        before = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]  # -1 stays -1
        fixed_differs = len(dims) != len(shape) or any(isinstance(old, int) and old > 0 and old != new
                                                       for old, new in zip(before, shape))
        if fixed_differs and output:
            report.setdefault("stale_output_metadata", {})[what] = {"onnx": before, "computed": list(shape)}
        elif len(dims) != len(shape):
            raise BoundaryError(f"{what} has rank {len(dims)} in the ONNX, model.yaml declares {list(shape)}",
                                "give it as many dims as the ONNX has")
        elif fixed_differs:
            raise BoundaryError(f"{what} is {before} in the ONNX, model.yaml says {list(shape)}",
                                "keep the ONNX's fixed dims; only its dynamic ones can be chosen")
    if before != list(shape):
        report["dims"][what] = {"onnx": before, "declared": list(shape)}
    tensor.ClearField("shape")
    for dim in shape:
        tensor.shape.dim.add().dim_value = dim


def _rename_uses(graph, old: str, new: str) -> None:
    """Every read of `old` (also inside subgraphs) reads `new` instead."""
    for node in graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        for sub in subgraphs(node):
            if old not in {i.name for i in sub.input}:  # a subgraph input of the same name shadows it
                _rename_uses(sub, old, new)


def _rename_producer(graph, old: str, new: str) -> None:
    """The tensor `old` is produced (and read) under the name `new`; `old` is then free for a Cast."""
    for node in graph.node:
        node.output[:] = [new if o == old else o for o in node.output]
    _rename_uses(graph, old, new)
