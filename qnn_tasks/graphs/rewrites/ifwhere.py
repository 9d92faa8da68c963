"""if-to-where: an If with a data-dependent condition computes both branches and picks with Where(cond, then, else).

HTP has no control flow: such an If runs on CPU (or fails the build). When both branches are pure
(no nested If/Loop/Scan, no random or non-standard ops) and cheap (at most MAX_BRANCH_NODES nodes
each), computing both costs little and is exact: Where selects the taken branch's values element
for element. Each output pair must have the same static shape and dtype; the condition (one
element) is reshaped to the outputs' rank so Where never broadcasts the result to a new shape.
Ifs with a constant condition are fold-if's; anything else is refused with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qnn_tasks.graphs.rewrites.graphtools import (
    STANDARD_DOMAINS,
    Evaluator,
    Names,
    Sites,
    infer_shapes,
    label,
    splice,
    subgraphs,
)

MAX_BRANCH_NODES = 16  # both branches always run: bounded so the rewrite never makes a graph much slower
IMPURE_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
              "Dropout"}


@dataclass
class Candidate:
    index: int
    node: str                                  # the If node's label
    nodes: list = field(default_factory=list)  # what replaces it (both branches + Where per output)
    initializers: list = field(default_factory=list)
    pairs: list = field(default_factory=list)  # (then tensor, else tensor) per If output
    reason: str = ""                           # why it is refused ("" = it can be rewritten)


def candidates(model: onnx.ModelProto) -> list[Candidate]:
    """Every top-level If with a data-dependent condition: its replacement, or the reason it has none."""
    evaluator = Evaluator(model)
    names = Names(model.graph)
    found = []
    for index, node in enumerate(model.graph.node):
        if node.op_type != "If":
            continue
        candidate = Candidate(index, label(node))
        if evaluator.value(node.input[0]) is not None:
            candidate.reason = "its condition is a constant (fold-if keeps the taken branch)"
        else:
            candidate.reason = _impure(node) or _build(model, node, candidate, names)
        found.append(candidate)
    return found


def if_to_where(model: onnx.ModelProto, dry_run: bool = False) -> Sites:
    """Replace each eligible If by both branches and a Where per output; sites are the If nodes' labels."""
    found = candidates(model)
    sites = Sites([c.node for c in found if not c.reason],
                  [f"If node '{c.node}': {c.reason}" for c in found if c.reason])
    if dry_run or not sites:
        return sites
    replacements = {}
    for c in found:
        if not c.reason:
            replacements[c.index] = c.nodes
            model.graph.initializer.extend(c.initializers)
    splice(model.graph, replacements)
    infer_shapes(model)
    return sites


def _impure(node) -> str:
    branches = {a.name: a.g for a in node.attribute if a.name in ("then_branch", "else_branch")}
    for which, branch in branches.items():
        side = which.split("_")[0]
        if len(branch.node) > MAX_BRANCH_NODES:
            return f"its {side} branch has {len(branch.node)} nodes (at most {MAX_BRANCH_NODES} are computed both ways)"
        for inner in branch.node:
            if subgraphs(inner):
                return f"its {side} branch holds control flow ({inner.op_type} node '{label(inner)}')"
            if inner.op_type in IMPURE_OPS or inner.domain not in STANDARD_DOMAINS:
                return f"its {side} branch is not pure ({inner.op_type} node '{label(inner)}')"
    return ""


def _build(model: onnx.ModelProto, node, candidate: Candidate, names: Names) -> str:
    """Fill `candidate` with the replacement nodes; return why not if the branches' outputs do not line up."""
    branches = {a.name: a.g for a in node.attribute}
    outputs = {}
    for side in ("then", "else"):
        nodes, initializers, outs = _copy_branch(branches[f"{side}_branch"], names, side)
        candidate.nodes += nodes
        candidate.initializers += initializers
        outputs[side] = outs
    candidate.pairs = list(zip(outputs["then"], outputs["else"]))
    types = _inferred_types(model, candidate)
    cond = node.input[0]
    flat = {}  # output rank -> the condition reshaped to it
    for (then_out, else_out), final in zip(candidate.pairs, node.output):
        a, b = types.get(then_out), types.get(else_out)
        if a is None or b is None:
            return f"the shape of output '{final}' is not static in both branches (fix the dims first)"
        if a != b:
            return (f"output '{final}' differs between the branches: then {_text(a)}, else {_text(b)} "
                    "(Where needs the same shape and dtype)")
        rank = len(a[1])
        if rank not in flat:
            shape = names(f"{candidate.node}_cond_shape")
            candidate.initializers.append(numpy_helper.from_array(np.ones(rank, np.int64), shape))
            flat[rank] = names(f"{cond}_rank{rank}")
            candidate.nodes.append(helper.make_node("Reshape", [cond, shape], [flat[rank]],
                                                    name=names(f"{candidate.node}_cond_rank{rank}")))
        candidate.nodes.append(helper.make_node("Where", [flat[rank], then_out, else_out], [final],
                                                name=names(f"{candidate.node}_where")))
    return ""


def _copy_branch(branch, names: Names, side: str) -> tuple[list, list, list[str]]:
    """The branch's nodes and initializers with every name it defines made fresh; its outputs' new names.

    Outer-scope tensors the branch reads keep their names; an output that is an outer tensor is used as is.
    """
    renames = {t.name: names(f"{t.name}_{side}") for t in branch.initializer}
    renames.update({o: names(f"{o}_{side}") for n in branch.node for o in n.output if o})
    initializers = []
    for tensor in branch.initializer:
        copy = type(tensor)()
        copy.CopyFrom(tensor)
        copy.name = renames[tensor.name]
        initializers.append(copy)
    nodes = []
    for inner in branch.node:
        copy = type(inner)()
        copy.CopyFrom(inner)
        copy.input[:] = [renames.get(i, i) for i in copy.input]
        copy.output[:] = [renames.get(o, o) for o in copy.output]
        copy.name = names(f"{inner.name or inner.output[0]}_{side}")
        nodes.append(copy)
    return nodes, initializers, [renames.get(o.name, o.name) for o in branch.output]


def _inferred_types(model: onnx.ModelProto, candidate: Candidate) -> dict[str, tuple[int, tuple[int, ...]]]:
    """(dtype, static shape) of the branch outputs, by shape inference on a copy with the branches inlined."""
    trial = onnx.ModelProto()
    trial.CopyFrom(model)
    trial.graph.initializer.extend(candidate.initializers)
    stand_in = [helper.make_node("Identity", [then_out], [final])  # the If's outputs stay made: a valid graph
                for (then_out, _), final in zip(candidate.pairs, trial.graph.node[candidate.index].output)]
    splice(trial.graph, {candidate.index: candidate.nodes + stand_in})
    wanted = {t for pair in candidate.pairs for t in pair}
    try:
        infer_shapes(trial)
    except Exception:  # inference gives up on the graph: the shapes are not known
        return {}
    values = {v.name: v for v in list(trial.graph.value_info) + list(trial.graph.input)}
    values.update({t.name: helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in trial.graph.initializer})
    types = {}
    for name in wanted:
        value = values.get(name)
        tensor = value.type.tensor_type if value is not None else None
        if tensor is None or not tensor.elem_type or not tensor.HasField("shape"):
            continue
        dims = tensor.shape.dim
        if all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
            types[name] = (tensor.elem_type, tuple(d.dim_value for d in dims))
    return types


def _text(dtype_shape: tuple[int, tuple[int, ...]]) -> str:
    dtype, shape = dtype_shape
    return f"{helper.tensor_dtype_to_np_dtype(dtype)} {list(shape)}"
