"""Small helpers the rewrites share: constants, producers/consumers, names, dead-node removal, a constant evaluator.

Everything works on onnx protobufs in place. Only the main graph is rewritten; subgraphs (If/Loop
bodies) count as users of the outer tensors they read, so nothing they need is removed.
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

STANDARD_DOMAINS = ("", "ai.onnx")


def opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in STANDARD_DOMAINS), default=1)


def label(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


def subgraphs(node: onnx.NodeProto) -> list:
    graphs = []
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            graphs.append(attr.g)
        graphs.extend(attr.graphs)
    return graphs


def outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads without defining them: the outer-scope tensors it depends on."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(i for i in node.input if i)
        for sub in subgraphs(node):
            used |= outer_names(sub)
        defined.update(node.output)
    used.update(o.name for o in graph.output)
    return used - defined


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """Explicit inputs plus the outer tensors its subgraphs read."""
    names = [i for i in node.input if i]
    for sub in subgraphs(node):
        names += sorted(outer_names(sub))
    return names


def producers(graph: onnx.GraphProto) -> dict[str, Any]:
    return {out: node for node in graph.node for out in node.output if out}


def consumers(graph: onnx.GraphProto) -> dict[str, list]:
    users: dict[str, list] = {}
    for node in graph.node:
        for name in node_inputs(node):
            users.setdefault(name, []).append(node)
    return users


def all_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor and node name in the graph and its subgraphs (for collision-free new names)."""
    names = {i.name for i in graph.input} | {o.name for o in graph.output} | {t.name for t in graph.initializer}
    names |= {v.name for v in graph.value_info}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        names.add(node.name)
        for sub in subgraphs(node):
            names |= all_names(sub)
    return names


class Sites(list):
    """The sites a rewrite changed (a list of names), plus the sites it looked at and refused, with the reason.

    A rewrite that declines a site it matched says why (the export record and lint show it).
    """

    def __init__(self, changed=(), refused=()) -> None:
        super().__init__(changed)
        self.refused: list[str] = list(refused)


class Names:
    """Fresh names that collide with nothing in the model."""

    def __init__(self, graph) -> None:
        self.taken = all_names(graph)

    def __call__(self, base: str) -> str:
        name = base
        for i in itertools.count(1):
            if name not in self.taken:
                break
            name = f"{base}_{i}"
        self.taken.add(name)
        return name


def constant_tensors(graph: onnx.GraphProto) -> dict[str, Any]:
    """name -> TensorProto for initializers and Constant nodes with a `value` tensor (converted on demand)."""
    found = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in STANDARD_DOMAINS:
            for attr in node.attribute:
                if attr.name == "value" and attr.type == AttributeProto.TENSOR:
                    found[node.output[0]] = attr.t
    return found


def splice(graph: onnx.GraphProto, replacements: dict[int, list]) -> None:
    """Replace the node at each index by its list of new nodes, in one pass (keeps the order topological).

    Indices, not node objects: protobuf copies messages on extend, so references go stale after an edit.
    """
    if not replacements:
        return
    nodes = []
    for index, node in enumerate(graph.node):
        nodes.extend(replacements.get(index, [node]))
    nodes = [_copy(n) for n in nodes]
    del graph.node[:]
    graph.node.extend(nodes)


def _copy(node: onnx.NodeProto):
    copy = type(node)()
    copy.CopyFrom(node)
    return copy


def add_initializer(graph: onnx.GraphProto, name: str, value: np.ndarray) -> str:
    graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def tensor_elem_type(model: onnx.ModelProto, name: str) -> int | None:
    """Element type of a tensor from the graph's inputs, outputs, value_info or initializers."""
    graph = model.graph
    for value in itertools.chain(graph.input, graph.output, graph.value_info):
        if value.name == name and value.type.HasField("tensor_type"):
            return value.type.tensor_type.elem_type or None
    for tensor in graph.initializer:
        if tensor.name == name:
            return tensor.data_type
    return None


def static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Fully static shapes known for tensors (inputs, outputs, value_info after shape inference).

    A non-positive dim_value (the -1 many exporters write) is dynamic, like a dim_param.
    """
    graph = model.graph
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    for value in itertools.chain(graph.input, graph.value_info, graph.output):
        tensor = value.type.tensor_type
        if value.type.HasField("tensor_type") and tensor.HasField("shape") and \
                all(d.HasField("dim_value") and d.dim_value > 0 for d in tensor.shape.dim):
            shapes[value.name] = tuple(d.dim_value for d in tensor.shape.dim)
    return shapes


def remove_dead(graph: onnx.GraphProto) -> int:
    """Drop nodes whose outputs reach no graph output, then unused initializers; returns nodes removed."""
    needed = {o.name for o in graph.output}
    live = []
    for node in reversed(list(graph.node)):
        if any(out in needed for out in node.output):
            live.append(node)
            needed.update(node_inputs(node))
    removed = len(graph.node) - len(live)
    if removed:
        del graph.node[:]
        graph.node.extend(reversed(live))
    used = needed | {i.name for i in graph.input}
    keep = [t for t in graph.initializer if t.name in used]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)
    return removed


def infer_shapes(model: onnx.ModelProto) -> None:
    """Re-infer every intermediate shape from scratch (stale value_info would hold old symbolic dims)."""
    del model.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    model.graph.value_info.extend(inferred.graph.value_info)
    # inference may refine outputs (e.g. their dtype) but never overrides the declared shapes
    for declared, refined in zip(model.graph.output, inferred.graph.output):
        if not declared.type.tensor_type.elem_type:
            declared.type.tensor_type.elem_type = refined.type.tensor_type.elem_type


class Evaluator:
    """Values of tensors computable from constants alone: initializers, Constant nodes and static shapes.

    Demand-driven (only the cone of the asked tensor is evaluated), with onnx's reference
    implementation per node. `blockers` collects the graph inputs that stopped an evaluation.
    """
    MAX_ELEMENTS = 1_000_000  # don't fold weight-sized computations just to learn a condition

    def __init__(self, model) -> None:
        self.graph = model.graph
        self.opset = opset(model)
        self.tensors = constant_tensors(self.graph)
        self.values: dict[str, np.ndarray | None] = {}
        self.producer = producers(self.graph)
        self.shapes = static_shapes(model)
        self.inputs = {i.name for i in self.graph.input} - set(self.tensors)
        self.blockers: set[str] = set()

    def is_constant(self, name: str) -> bool:
        return self.value(name) is not None

    def value(self, name: str) -> np.ndarray | None:
        if name not in self.values:
            self.values[name] = None  # also guards against cycles
            try:
                self.values[name] = self._compute(name)
            except RecursionError:
                self.values[name] = None
        return self.values[name]

    def _compute(self, name: str) -> np.ndarray | None:
        if name in self.tensors:
            return numpy_helper.to_array(self.tensors[name])
        if name in self.inputs:
            self.blockers.add(name)
            return None
        node = self.producer.get(name)
        if node is None or node.domain not in STANDARD_DOMAINS or subgraphs(node):
            return None
        if node.op_type in ("Shape", "Size"):
            return self._shape_value(node, name)
        feeds = {}
        for i in node.input:
            if i:
                value = self.value(i)
                if value is None or value.size > self.MAX_ELEMENTS:
                    return None
                feeds[i] = value
        from onnx.reference import ReferenceEvaluator

        try:
            results = ReferenceEvaluator(node, opsets={"": self.opset}).run(None, feeds)
        except Exception:  # an op the reference runtime can't evaluate: not a constant for us
            return None
        for out, value in zip(node.output, results):
            self.values[out] = np.asarray(value)
        return self.values.get(name)

    def _shape_value(self, node, name: str) -> np.ndarray | None:
        shape = self.shapes.get(node.input[0])
        if shape is None:
            self.blockers |= {node.input[0]} & self.inputs
            return None
        if node.op_type == "Size":
            return np.array(int(np.prod(shape)), np.int64)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        start, end = attrs.get("start", 0), attrs.get("end", len(shape))
        return np.array(shape[slice(start, end)], np.int64)
