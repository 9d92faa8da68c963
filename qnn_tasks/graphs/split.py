"""A graph's weight bytes per precision, and a graph cut into parts at tensors (onnx.utils.Extractor).

Parts are ancestor-closed: part k is every node the k-th cut tensors need that no earlier part computes, the
last part the rest. A part so never needs a later part's tensor unless the cuts are out of order (a "cycle":
an earlier cut computed from a later one), which is refused. `parts: N` picks its cuts along the graph's
topological order where the fewest tensors cross (a transformer's residual stream between two blocks: one),
nearest to N equal shares of the weight bytes. Files over 2 GB (external data) are read without their data
(onnx.load(load_external_data=False): sizes come from the tensors' dims), and each part loads only its own.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qnn_tasks.modelspec import precision_table

MB = 1_000_000
PROTOBUF_LIMIT = 2**31 - 1  # onnx.checker.MAXIMUM_PROTOBUF: a model over it keeps its weights in external data
EXTERNAL_ABOVE = 1_500_000_000  # a part with more initializer bytes than this is saved with external data
ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}  # onnx dtype -> bytes
FLOATS = {1, 10, 11, 16}  # float32, float16, double, bfloat16


class SplitError(ValueError):
    """A cut that cannot be made; the message is one line naming the tensor or part."""


def tensor_bytes(tensor, precision: str) -> int:
    """Bytes of one initializer as the compiled graph keeps it: fp16 stores floats in 2 bytes; w8a16 stores weights
    (float tensors of 2+ dims) in 1 byte, w4a16 in half a byte, and both keep 1-dim floats (biases -> int32, norms)
    at 4; others as they are."""
    count = math.prod(tensor.dims) if tensor.dims else 1
    if tensor.data_type in FLOATS:
        if precision_table.is_quantized(precision):
            bits = precision_table.BY_NAME[precision].weight_bits
            return (count * bits + 7) // 8 if len(tensor.dims) >= 2 else count * 4
        return count * 2
    return count * ITEMSIZE.get(tensor.data_type, 4)


def weight_bytes(model, precision: str) -> int:
    return sum(tensor_bytes(t, precision) for t in model.graph.initializer)


def size_line(model) -> dict[str, int]:
    """{precision: bytes} for the lint record and the report."""
    return {p: weight_bytes(model, p) for p in precision_table.NAMES}


def load_light(path: Path):
    """The model without its external weights (dims only): enough to plan cuts and count bytes of a > 2 GB file."""
    import onnx

    return onnx.load(str(path), load_external_data=False)


@dataclass
class Part:
    index: int                      # 1-based
    nodes: list[int]                # positions in the graph's node list
    inputs: list[str]
    outputs: list[str]
    weight_bytes: int = 0           # at the graph's primary precision
    initializers: list[str] = field(default_factory=list)


def _producers(graph) -> dict[str, int]:
    return {out: i for i, node in enumerate(graph.node) for out in node.output if out}


def _ancestors(graph, producers: dict[str, int], tensors: list[str], stop: set[int]) -> set[int]:
    """Node positions computing `tensors`, walking back until a node in `stop` (an earlier part)."""
    seen: set[int] = set()
    todo = [producers[t] for t in tensors if t in producers and producers[t] not in stop]
    while todo:
        i = todo.pop()
        if i in seen or i in stop:
            continue
        seen.add(i)
        todo += [producers[n] for n in graph.node[i].input if n in producers]
    return seen


def plan(model, at: list[list[str]], precision: str = "fp16", where: str = "split.at") -> list[Part]:
    """The parts made by cutting at each group of tensors in `at` (in order), checked: every tensor exists, no part
    needs a later part's tensor, every part holds weights."""
    graph = model.graph
    producers = _producers(graph)
    inits = {t.name: t for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input if i.name not in inits}
    for group in at:
        for name in group:
            if name not in producers:
                kind = ("is a graph input, not a tensor a node computes" if name in graph_inputs else
                        "is an initializer, not a tensor a node computes" if name in inits else
                        "is not a tensor of the graph")
                raise SplitError(f"{where}: '{name}' {kind} (fix: name a tensor computed inside the graph, e.g. "
                                 f"'{_example(graph)}')")
    done: set[int] = set()
    parts: list[Part] = []
    for k, group in enumerate(at, start=1):
        nodes = _ancestors(graph, producers, group, done)
        if not nodes:
            earlier = next(p for p in parts if producers[group[0]] in p.nodes)
            raise SplitError(f"{where}: '{group[0]}' (cut {k}) is computed in part {earlier.index}, before cut "
                             f"{earlier.index} ('{at[earlier.index - 1][0]}'), so part {earlier.index} would need part "
                             f"{k}'s tensor: a cycle (fix: list the cut tensors in the order the graph computes them)")
        parts.append(Part(index=k, nodes=sorted(nodes), inputs=[], outputs=[]))
        done |= nodes
    parts.append(Part(index=len(at) + 1, nodes=[i for i in range(len(graph.node)) if i not in done], inputs=[], outputs=[]))
    outputs = {o.name for o in graph.output}
    owner = {i: p.index for p in parts for i in p.nodes}
    for part in parts:
        produced = {o for i in part.nodes for o in graph.node[i].output}
        needed = [n for i in part.nodes for n in graph.node[i].input if n]
        part.inputs = list(dict.fromkeys(n for n in needed if n not in produced and n not in inits))
        part.initializers = list(dict.fromkeys(n for n in needed if n in inits))
        part.weight_bytes = sum(tensor_bytes(inits[n], precision) for n in part.initializers)
        later = {n for i, o in owner.items() if o > part.index for n in graph.node[i].input}
        part.outputs = [o for i in part.nodes for o in graph.node[i].output if o and (o in later or o in outputs)]
    for part in parts:
        if not any(len(inits[n].dims) >= 2 and inits[n].data_type in FLOATS for n in part.initializers):
            cuts = " and ".join(f"'{at[i][0]}'" for i in (part.index - 2, part.index - 1) if 0 <= i < len(at))
            raise SplitError(f"{where}: part {part.index} (at {cuts}) holds no weights (fix: move the cut so every "
                             "part holds some of the graph's weights)")
    for part in parts:
        for name in part.inputs:
            source = owner.get(producers[name]) if name in producers else 0
            if source and source > part.index:
                raise SplitError(f"{where}: part {part.index} needs '{name}', which part {source} computes: a cycle "
                                 "(fix: cut later, after that tensor)")
            if source and source < part.index - 1:
                raise SplitError(f"{where}: '{name}' from part {source} skips part {part.index - 1} to reach part "
                                 f"{part.index} (fix: cut where only tensors of the previous part cross)")
            if name in graph_inputs and part.index > 1:
                raise SplitError(f"{where}: part {part.index} reads the graph input '{name}' (fix: cut where every "
                                 "tensor a later part needs comes from the part before it)")
        early = [o for o in part.outputs if o in outputs]
        if part.index < len(parts) and early:  # the chain's end (the last part) must give every output
            raise SplitError(f"{where}: the graph's output '{early[0]}' is computed in part {part.index}, not the last "
                             "part (fix: cut after it)")
        if part.index < len(parts) and not part.outputs:
            raise SplitError(f"{where}: part {part.index} feeds nothing to the next part (fix: cut at a tensor the "
                             "rest of the graph reads)")
    return parts


def _example(graph) -> str:
    return graph.node[len(graph.node) // 2].output[0] if graph.node else "?"


def balanced_cuts(model, parts: int, precision: str = "fp16", where: str = "split.parts") -> list[list[str]]:
    """N - 1 cuts along the topological order, each where the fewest tensors cross, nearest to equal weight shares."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input if i.name not in inits}
    last_use: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.input:
            last_use[name] = i
    for o in graph.output:
        last_use[o.name] = len(graph.node)
    seen_inits: set[str] = set()
    cumulative, total = [], 0
    for node in graph.node:
        for name in node.input:
            if name in inits and name not in seen_inits:
                seen_inits.add(name)
                total += tensor_bytes(inits[name], precision)
        cumulative.append(total)
    live: set[str] = set()
    candidates: list[tuple[int, int, list[str]]] = []  # (position, crossing count, crossing tensors)
    for i, node in enumerate(graph.node[:-1]):
        live |= {o for o in node.output if o}
        live = {t for t in live if last_use.get(t, -1) > i}
        if any(last_use.get(t, -1) > i for t in graph_inputs) or live & {o.name for o in graph.output}:
            continue  # a later part would read a graph input, or an output would pass through
        if 0 < cumulative[i] < total:
            candidates.append((i, len(live), sorted(live)))
    if not candidates:  # "at most 1 parts" is no split at all: the fix is to build it whole
        raise SplitError(f"{where}: {parts} parts asked, the graph has no place to cut (every cut would leave a graph "
                         "input or an output to pass into a later part) (fix: remove split: from the graph: it is built whole)")
    if parts < 2 or len(candidates) < parts - 1:
        raise SplitError(f"{where}: {parts} parts asked, the graph has {len(candidates)} places to cut "
                         f"(fix: ask for at most {len(candidates) + 1} parts, or cut at named tensors with split.at)")
    fewest = min(c[1] for c in candidates)
    small = [c for c in candidates if c[1] <= fewest]
    if len(small) < parts - 1:
        small = sorted(candidates, key=lambda c: (c[1], c[0]))[:max(parts - 1, len(small))]
        small.sort()
    chosen: list[tuple[int, int, list[str]]] = []
    for k in range(1, parts):
        goal = total * k / parts
        options = [c for c in small if not chosen or c[0] > chosen[-1][0]]
        if len(options) < parts - k:
            raise SplitError(f"{where}: no {parts - k} more cuts after tensor '{chosen[-1][2][0]}' "
                             f"(fix: ask for fewer parts)")
        best = min(options[:len(options) - (parts - 1 - k)], key=lambda c: abs(cumulative[c[0]] - goal))
        chosen.append(best)
    return [c[2] for c in chosen]


def describe(model, parts: list[Part], precision: str) -> list[dict[str, Any]]:
    """Each part's cut tensors with their shapes and bytes, for the record."""
    import onnx

    shapes = {v.name: v for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
    rows = []
    for part in parts:
        crossing = []
        for name in part.outputs:
            v = shapes.get(name)
            dims = [d.dim_value for d in v.type.tensor_type.shape.dim] if v is not None else []
            elem = v.type.tensor_type.elem_type if v is not None else 1
            size = math.prod(dims) * onnx.helper.tensor_dtype_to_np_dtype(elem).itemsize if dims else None
            crossing.append({"tensor": name, "shape": dims, "bytes": size})
        rows.append({"part": part.index, "nodes": len(part.nodes), "inputs": part.inputs, "outputs": crossing,
                     "weight_bytes": part.weight_bytes})
    return rows


def write_parts(source: Path, cuts: list[list[str]], names: list[str], out_paths: list[Path], precision: str,
                where: str) -> list[dict[str, Any]]:
    """Cut `source` into len(cuts) + 1 ONNX files (onnx.utils.Extractor on the shape-inferred model), each part's
    weights loaded alone; a part over ~1.5 GB of weights keeps them as external data beside it."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model
    from onnx.utils import Extractor

    from qnn_tasks.fileio import atomic_path

    if os.path.getsize(source) > PROTOBUF_LIMIT:  # never the case with external data; infer_shapes_path is the way
        raise SplitError(f"{source}: a single ONNX file over 2 GB (fix: save it with external data)")
    light = load_light(source)
    inferred = onnx.shape_inference.infer_shapes(light)  # dims only: no weights in the proto
    parts = plan(inferred, cuts, precision, where)
    rows = describe(inferred, parts, precision)
    extractor = Extractor(inferred)
    outputs = [o.name for o in inferred.graph.output]
    for part, name, out, row in zip(parts, names, out_paths, rows):
        sub = extractor.extract_model(part.inputs, outputs if part.index == len(parts) else part.outputs)
        sub.graph.name = name
        load_external_data_for_model(sub, str(source.parent))  # no-op for tensors stored inline
        out.parent.mkdir(parents=True, exist_ok=True)
        external = sum(t.ByteSize() for t in sub.graph.initializer) > EXTERNAL_ABOVE
        with atomic_path(out) as tmp:
            if external:  # the data file is written before the .onnx is renamed into place
                data = out.with_name(out.name + ".data")
                data.unlink(missing_ok=True)
                onnx.save(sub, str(tmp), save_as_external_data=True, location=data.name, all_tensors_to_one_file=True)
            else:
                onnx.save(sub, str(tmp))
        row["file"], row["external_data"], row["name"] = str(out), external, name
        del sub
    return rows
