"""if-to-where: an If with a data-dependent condition computes both branches and picks with Where(cond, then, else).

HTP has no control flow: such an If runs on CPU (or fails the build). When both branches are pure
(no nested If/Loop/Scan, no random or non-standard ops) and cheap, computing both costs little and is exact: Where selects the taken branch's values element
for element - provided the branch not taken can be computed at all. The original computes a branch
only on the inputs its condition lets through (an `If` may guard a Gather whose index is out of
range otherwise); the rewrite computes both on every input. So each branch node must be *total*:
defined for every finite input (it cannot raise, and gives no NaN/Inf except by float overflow).
That is proved positively, per node: an op of TOTAL_OPS; a shape op whose shape/axes/starts are
constants (CONSTANT_PARAMS); a Gather whose constant indices are in range of the data's static dim;
a Div/Mod by a constant without zeros; Pow with a constant non-negative integer exponent (or a
constant positive base). Anything else (Log, Sqrt, a data-dependent index or divisor, an op not
listed) is refused, naming the node. Each output pair must have the same static shape and dtype; the condition (one
element) is reshaped to the outputs' rank so Where never broadcasts the result to a new shape.
Ifs with a constant condition are fold-if's; anything else is refused with its reason.

Cheap is a bound on cost, not on nodes: the branch not taken is extra work, at most MAX_EXTRA_WORK of the work
on the graph's cheaper path (or FREE_WORK, whatever the graph). Cost is counted in multiply-adds from the static
shapes (a MatMul or Conv: its own; other ops: ELEMENT_COST per element they write), plus NODE_OVERHEAD per node (each
op has a fixed cost on the NPU, whatever its size; both measured on the simulator); constant-only nodes are folded
and cost nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qnn_tasks.rewrites.graphtools import (
    STANDARD_DOMAINS,
    Evaluator,
    Names,
    Sites,
    infer_shapes,
    label,
    splice,
    static_shapes,
    subgraphs,
)

MAX_EXTRA_WORK = 0.25  # both branches always run: the one not taken may add this share of the graph's work
# A node's fixed cost, beside its work, in multiply-adds: measured by benchmarks/bench_node_cost.py on the SM8650
# simulator (fp16): a node of Add, Mul, Relu, Sub, Sigmoid or Max on [1, 128] costs as much as 11k (Max) to 154k
# (Relu) multiply-adds of a MatMul, median over the six 89,582-102,343 in five runs. The simulator is not a phone:
# cycle counts of the x86 HTP simulator (which follow the host's load: the least of 21 runs), not measured on a device
# (docs/rewrites.md, "Where the figures come from").
NODE_OVERHEAD = 100_000
MULTIPLY_ADD_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")  # their work: multiply-adds; any other op's: elements
# An element written by any other op, in multiply-adds: measured the same way (8 nodes of one op on up to 65,536
# elements): 96 (Mul) to 2,948 (Relu), median over the six 231-246 in five runs. Counted as 1 before, a branch of 4
# wide nodes after a Conv was estimated at +3% and took +163-194% on the simulator.
ELEMENT_COST = 230
FREE_WORK = 16 * (NODE_OVERHEAD + ELEMENT_COST * 128)  # cheap whatever the graph: 16 nodes on [1, 128] (the former bound)
MAX_BRANCH_NODES = 512  # and a bound on how much the graph grows, whatever the work
# defined for every finite input, whatever the values (no error, no NaN; Inf only by overflow), shapes being static
TOTAL_OPS = {
    "Identity", "Add", "Sub", "Mul", "Neg", "Abs", "Sign", "Floor", "Ceil", "Round", "Max", "Min", "Sum", "Mean",
    "Clip", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
    "Softmax", "LogSoftmax", "Exp", "Erf", "Gelu", "Softplus", "Softsign", "Sin", "Cos", "Atan", "Sinh", "Cosh", "Asinh",
    "Where", "Not", "And", "Or", "Xor", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "IsNaN", "IsInf",
    "MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
    "GlobalMaxPool", "BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization",
    "ArgMax", "ArgMin", "Transpose", "Flatten", "Concat", "Cast", "CastLike", "Shape", "Size", "Constant",
    "DepthToSpace", "SpaceToDepth"}
# total once the listed input slots are constants (data-dependent shapes, axes or starts: refused)
CONSTANT_PARAMS = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Squeeze": (1,), "Unsqueeze": (1,),
    "Pad": (1, 2, 3), "Split": (1,), "ConstantOfShape": (0,), "CumSum": (1,), "Trilu": (1,), "TopK": (1,),
    **{op: (1,) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                           "ReduceL1", "ReduceL2")}}
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
            return f"its {side} branch has {len(branch.node)} nodes (at most {MAX_BRANCH_NODES} are inlined)"
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
    origins = {}  # copied node name -> (side, the branch node's label): refusals name what the user sees
    for side in ("then", "else"):
        nodes, initializers, outs = _copy_branch(branches[f"{side}_branch"], names, side)
        origins.update({copy.name: (side, label(inner)) for copy, inner in zip(nodes, branches[f"{side}_branch"].node)})
        candidate.nodes += nodes
        candidate.initializers += initializers
        outputs[side] = outs
    candidate.pairs = list(zip(outputs["then"], outputs["else"]))
    trial = _trial(model, candidate)
    types = _static_types(trial, {t for pair in candidate.pairs for t in pair})
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
    return _partial(trial, origins) or _costly(trial, origins)


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


def _trial(model: onnx.ModelProto, candidate: Candidate) -> onnx.ModelProto:
    """A copy with the branches inlined in place of the If, shapes inferred: what the rewrite would compute."""
    trial = onnx.ModelProto()
    trial.CopyFrom(model)
    trial.graph.initializer.extend(candidate.initializers)
    stand_in = [helper.make_node("Identity", [then_out], [final])  # the If's outputs stay made: a valid graph
                for (then_out, _), final in zip(candidate.pairs, trial.graph.node[candidate.index].output)]
    splice(trial.graph, {candidate.index: candidate.nodes + stand_in})
    try:
        infer_shapes(trial)
    except Exception:  # inference gives up on the graph: the shapes are not known
        del trial.graph.value_info[:]
    return trial


def _static_types(trial: onnx.ModelProto, wanted) -> dict[str, tuple[int, tuple[int, ...]]]:
    """(dtype, static shape) of the `wanted` tensors of the trial graph, where inference knows both."""
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


def _partial(trial: onnx.ModelProto, origins: dict[str, tuple[str, str]]) -> str:
    """Why a branch node may fail (or give NaN) on an input its condition excludes; "" when every one is total."""
    evaluator = Evaluator(trial)
    shapes = static_shapes(trial)
    for node in trial.graph.node:
        if node.name not in origins:
            continue
        problem = _not_total(node, evaluator, shapes)
        if problem:
            side, where = origins[node.name]
            return (f"its {side} branch's {node.op_type} node '{where}' {problem}, and both branches would run on "
                    "inputs the condition keeps from it")
    return ""


def _costly(trial: onnx.ModelProto, origins: dict[str, tuple[str, str]]) -> str:
    """Why computing both branches would cost too much ("" when the branch not taken is cheap enough)."""
    evaluator = Evaluator(trial)
    shapes = static_shapes(trial)
    cost = {"then": 0, "else": 0, "rest": 0}
    nodes = {"then": 0, "else": 0}
    for node in trial.graph.node:
        side = origins[node.name][0] if node.name in origins else "rest"
        work = node_cost(node, evaluator, shapes)
        if work is None:
            return f"the cost of its {side} branch cannot be bounded ({node.op_type} node '{label(node)}' has no static shape)"
        cost[side] += work
        if side in nodes:
            nodes[side] += 1
    extra = max(cost["then"], cost["else"])
    cheaper = cost["rest"] + min(cost["then"], cost["else"])
    if extra <= max(FREE_WORK, MAX_EXTRA_WORK * cheaper):
        return ""
    side = "then" if cost["then"] >= cost["else"] else "else"
    return (f"its {side} branch ({nodes[side]} nodes) costs about {extra:,} multiply-adds, computed on every input beside "
            f"the {cheaper:,} of the graph's cheaper path: more than the {MAX_EXTRA_WORK:.0%} if-to-where allows "
            f"(or {FREE_WORK:,})")


def node_cost(node, evaluator: Evaluator, shapes: dict[str, tuple[int, ...]]) -> int | None:
    """A node's cost in multiply-adds: its fixed overhead plus its work (an element another op writes counts
    ELEMENT_COST); None without static shapes."""
    if all(evaluator.value(o) is not None for o in node.output if o):
        return 0  # computed from constants: folded before it runs
    ops = element_ops(node, shapes)
    if ops is None:
        return None
    return NODE_OVERHEAD + (ops if node.op_type in MULTIPLY_ADD_OPS else ELEMENT_COST * ops)


def element_ops(node, shapes: dict[str, tuple[int, ...]]) -> int | None:
    """A node's work without its overhead: the elements it writes, times the depth of a MatMul, Gemm or Conv
    (its multiply-adds); None without static shapes. benchmarks/bench_node_cost.py counts work with it too."""
    written = [shapes.get(o) for o in node.output if o]
    if any(shape is None for shape in written):
        return None
    elements = sum(int(np.prod(shape)) for shape in written)
    depth = 1
    if node.op_type in ("MatMul", "Gemm"):
        a = shapes.get(node.input[0])
        transposed = any(attr.name == "transA" and attr.i for attr in node.attribute)
        depth = (a[-2] if transposed else a[-1]) if a else None
    elif node.op_type in ("Conv", "ConvTranspose"):
        w = shapes.get(node.input[1])
        depth = int(np.prod(w[1:])) if w else None
    if depth is None:
        return None
    return elements * depth


def _not_total(node, evaluator: Evaluator, shapes: dict[str, tuple[int, ...]]) -> str:
    """What keeps this node from being defined on every input ("" when it is total)."""
    op = node.op_type

    def data_dependent(slot: int) -> bool:
        return len(node.input) > slot and bool(node.input[slot]) and evaluator.value(node.input[slot]) is None

    if op in TOTAL_OPS:
        return ""
    if op in CONSTANT_PARAMS:
        slot = next((s for s in CONSTANT_PARAMS[op] if data_dependent(s)), None)
        return "" if slot is None else f"takes a data-dependent shape, axes or bounds (input {slot})"
    if op in ("Gather", "GatherElements"):
        return _index_problem(node, evaluator, shapes)
    if op in ("Log", "Sqrt", "Reciprocal") and data_dependent(0):
        return "reads a data-dependent value (NaN or Inf outside its domain)"
    if op in ("Div", "Mod"):
        divisor = evaluator.value(node.input[1])
        if divisor is None:
            return "divides by a data-dependent value (it may be 0)"
        return "divides by a constant holding 0" if (np.asarray(divisor) == 0).any() else ""
    if op == "Pow":
        base, exponent = evaluator.value(node.input[0]), evaluator.value(node.input[1])
        if exponent is not None and (np.asarray(exponent) >= 0).all() and (np.mod(exponent, 1) == 0).all():
            return ""
        if base is not None and (np.asarray(base) > 0).all():
            return ""
        return "raises to a power that is not a constant non-negative integer (NaN or Inf on some inputs)"
    if all(evaluator.value(i) is not None for i in node.input if i):
        return ""  # every input a constant: computed once, the same either way
    return "is not among the ops known to be defined on every input (docs/rewrites.md lists them)"


def _index_problem(node, evaluator: Evaluator, shapes: dict[str, tuple[int, ...]]) -> str:
    indices = evaluator.value(node.input[1])
    if indices is None:
        return "reads data-dependent indices (out of range on some inputs)"
    shape = shapes.get(node.input[0])
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if shape is None or not -len(shape) <= axis < len(shape):
        return "reads data whose shape is not static (its indices cannot be checked)"
    size = shape[axis]
    if ((indices < -size) | (indices >= size)).any():
        return f"reads constant indices outside [-{size}, {size})"
    return ""


def _text(dtype_shape: tuple[int, tuple[int, ...]]) -> str:
    dtype, shape = dtype_shape
    return f"{helper.tensor_dtype_to_np_dtype(dtype)} {list(shape)}"
