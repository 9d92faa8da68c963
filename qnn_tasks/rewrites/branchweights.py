"""Constants of the main graph that only an If/Loop/Scan body reads, copied into each body that reads them.

onnxruntime's compile API (the ModelCompiler the context stage calls) writes the CPU part of a partitioned graph
without the main-graph initializers that no main-graph node reads itself, only a body (onnxruntime issue #32131),
then refuses its own output: "input 'w' of node ... is not output of any previous nodes". PyTorch and other
exporters store a branch's weights just so. A copy inside the body is the same model to every runtime, and the
body then carries what it reads. The export stage applies this to every graph that keeps control flow.
"""
from __future__ import annotations

import onnx
from onnx import AttributeProto

from qnn_tasks.rewrites import graphtools


def readers(graph: onnx.GraphProto) -> dict[str, list[str]]:
    """Constants (initializers, Constant nodes) of `graph` that only bodies read: name -> the bodies reading it
    ("the then_branch of If node 'pick'"). A graph input or output of that name is left alone."""
    constants = {t.name for t in graph.initializer} | {n.output[0] for n in graph.node if _is_constant(n)}
    main_reads = {i for n in graph.node for i in n.input} | {o.name for o in graph.output} | \
        {i.name for i in graph.input}
    found: dict[str, list[str]] = {}
    for node in graph.node:
        for attr, body in _bodies(node):
            for name in sorted(graphtools.outer_names(body) & (constants - main_reads)):
                found.setdefault(name, []).append(f"the {attr} of {node.op_type} node '{graphtools.label(node)}'")
    return found


def lift(model: onnx.ModelProto) -> graphtools.Sites:
    """Copy each constant only bodies read into those bodies, and drop it from the main graph (in place).

    Sites: "'w' into the then_branch of If node 'pick'". An initializer kept in an external data file is refused
    (moved, its file would no longer be found by the stages that copy a model's weight files: they read the main
    graph's list)."""
    from onnx.external_data_helper import uses_external_data

    graph = model.graph
    wanted = readers(graph)
    initializers = {t.name: t for t in graph.initializer}
    constant_nodes = {n.output[0]: n for n in graph.node if _is_constant(n)}
    external = {name for name in wanted if name in initializers and uses_external_data(initializers[name])}
    sites = graphtools.Sites(refused=[f"'{name}' (read by {', '.join(wanted[name])}) is stored as external data: "
                                      "left in the main graph" for name in sorted(external)])
    lifted = set(wanted) - external
    if not lifted:
        return sites
    for node in graph.node:
        for attr, body in _bodies(node):
            reads = sorted(graphtools.outer_names(body) & lifted)
            copies = [_copy(constant_nodes[name]) for name in reads if name in constant_nodes]
            if copies:  # a Constant node goes first, ahead of the body's nodes that read it
                nodes = copies + [_copy(n) for n in body.node]
                del body.node[:]
                body.node.extend(nodes)
            body.initializer.extend(_copy(initializers[name]) for name in reads if name in initializers)
            sites.extend(f"'{name}' into the {attr} of {node.op_type} node '{graphtools.label(node)}'"
                         for name in reads)
    kept_nodes = [_copy(n) for n in graph.node if not (_is_constant(n) and n.output[0] in lifted)]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    kept = [t for t in graph.initializer if t.name not in lifted]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    kept_info = [v for v in graph.value_info if v.name not in lifted]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    return sites


def _bodies(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    return [(a.name, a.g) for a in node.attribute if a.type == AttributeProto.GRAPH] + \
        [(a.name, g) for a in node.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]


def _is_constant(node: onnx.NodeProto) -> bool:
    return node.op_type == "Constant" and node.domain in graphtools.STANDARD_DOMAINS and len(node.output) == 1


def _copy(message):
    copy = type(message)()
    copy.CopyFrom(message)
    return copy
