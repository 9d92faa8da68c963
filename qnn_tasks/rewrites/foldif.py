"""fold-if: an If whose condition is a constant (once dims and constant_inputs are fixed) keeps only the taken branch.

The condition is constant-propagated by graphtools.Evaluator (initializers, Constant nodes, Shape
of tensors with static shapes, onnx's reference implementation for the rest). The taken branch's
nodes replace the If in place; its outputs take the If's output names. Repeats while inlined
branches expose more foldable Ifs.
"""
from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import helper

from qnn_tasks.rewrites.graphtools import Evaluator, Names, infer_shapes, label, remove_dead, splice, subgraphs


@dataclass
class Condition:
    node: str          # the If node's label
    value: bool | None  # None: not a constant
    blockers: list[str]  # graph inputs the condition depends on (fix them with constant_inputs)


def conditions(model: onnx.ModelProto) -> list[Condition]:
    """Every top-level If, with its condition's value if it is a constant."""
    found = []
    for node in model.graph.node:
        if node.op_type == "If":
            evaluator = Evaluator(model)
            value = evaluator.value(node.input[0])
            found.append(Condition(label(node), None if value is None else bool(value.reshape(-1)[0]),
                                   sorted(evaluator.blockers)))
    return found


def fold_if(model: onnx.ModelProto, dry_run: bool = False) -> list[str]:
    """Inline the taken branch of every If with a constant condition; sites are `<If node> (then|else)`."""
    sites: list[str] = []
    done: set[int] = set()  # dry run: Ifs already reported
    while True:
        evaluator = Evaluator(model)
        found = None
        for index, node in enumerate(model.graph.node):
            if node.op_type == "If" and index not in done:
                value = evaluator.value(node.input[0])
                if value is not None:
                    found = index, node, "then_branch" if bool(value.reshape(-1)[0]) else "else_branch"
                    break
        if found is None:
            return sites
        index, node, taken = found
        sites.append(f"{label(node)} ({taken.split('_')[0]})")
        if dry_run:  # nested Ifs of a branch only show up once it is inlined
            done.add(index)
            continue
        _inline(model.graph, index, node, next(a.g for a in node.attribute if a.name == taken))
        remove_dead(model.graph)  # drops the condition's nodes and the other branch's weights
        infer_shapes(model)       # an inlined branch may hold Ifs whose conditions depend on its shapes


def _inline(graph, index: int, if_node, branch) -> None:
    """Replace `if_node` by the nodes of `branch`; branch-local names that clash with the graph's are renamed."""
    names = Names(graph)
    names.taken -= _local_names(branch)  # a branch's own names are free to keep unless the graph uses them too
    outer = _outer_taken(graph, branch)
    renames: dict[str, str] = {}
    for local in sorted(_local_names(branch)):
        if local in outer:
            renames[local] = names(local + "_inlined")
    results = {out.name: final for out, final in zip(branch.output, if_node.output)}
    produced = {o for n in branch.node for o in n.output}
    # a tensor the branch makes and returns takes the If output's name, for its readers inside the branch too
    renames.update({name: final for name, final in results.items() if name in produced})
    new_nodes = []
    for tensor in branch.initializer:
        copy = type(tensor)()
        copy.CopyFrom(tensor)
        copy.name = renames.get(tensor.name, tensor.name)
        graph.initializer.append(copy)
    for node in branch.node:
        copy = type(node)()
        copy.CopyFrom(node)
        copy.input[:] = [renames.get(i, i) for i in copy.input]
        copy.output[:] = [renames.get(o, o) for o in copy.output]
        if copy.name in outer:
            copy.name = names(copy.name + "_inlined")
        _rename_in_subgraphs(copy, renames)
        new_nodes.append(copy)
    for out in branch.output:  # an output passed straight through from outside or from an initializer
        if out.name not in produced:
            source = renames.get(out.name, out.name)
            new_nodes.append(helper.make_node("Identity", [source], [results[out.name]],
                                              name=names(label(if_node) + "_passthrough")))
    splice(graph, {index: new_nodes})


def _local_names(branch) -> set[str]:
    names = {t.name for t in branch.initializer}
    for node in branch.node:
        names.update(o for o in node.output if o)
    return names


def _outer_taken(graph, branch) -> set[str]:
    """Names used in the graph outside this branch (tensor and node names)."""
    taken = {i.name for i in graph.input} | {o.name for o in graph.output} | {t.name for t in graph.initializer}
    for node in graph.node:
        taken.update(node.input)
        taken.update(node.output)
        taken.add(node.name)
        for sub in subgraphs(node):
            if sub is not branch:
                taken |= {o for n in sub.node for o in n.output} | {n.name for n in sub.node}
    return taken - {""}


def _rename_in_subgraphs(node, renames: dict[str, str]) -> None:
    """A nested If/Loop inside the inlined branch may read renamed tensors from its (now outer) scope."""
    if not renames:
        return
    for sub in subgraphs(node):
        for inner in sub.node:
            inner.input[:] = [renames.get(i, i) for i in inner.input]
            _rename_in_subgraphs(inner, renames)
        for out in sub.output:
            out.name = renames.get(out.name, out.name)
