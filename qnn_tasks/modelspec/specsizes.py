"""`dims:` in model.yaml: a named dim of a graph's inputs/outputs built at several sizes, one graph per size.

    graphs:
      minilm:
        dims:
          seq:                                   # the name used in shapes below
            sizes: [32, 128]                     # one graph per size: minilm.seq32, minilm.seq128
            pad: {input_ids: 0, attention_mask: 0}   # the value a shorter sample is padded with (default 0)
            longer: skip                         # a sample longer than a size: skip (default) or truncate
        # short form: dims: {seq: [32, 128]}  (pad 0 for every input, longer: skip)
        inputs:
          input_ids: {shape: [1, seq], dtype: int32}
          attention_mask: {shape: [1, seq], dtype: int32}

Each size is a graph of its own (`<graph>.<dim><size>`) through every stage, its shapes written with the
size; its GraphSpec carries a `SizeSpec` saying which size of which graph it is. A tensor may have the dim on
several axes (an attention mask [1, 1, seq, seq], a square image [1, 3, side, side]): each is the dim, the same
size. Only YAML is read here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qnn_tasks.errors import SpecError
from qnn_tasks.modelspec.yamlread import as_mapping, as_number, check_keys

DIM_KEYS = {"sizes", "pad", "longer"}
LONGER = ("skip", "truncate")
RULE = "smallest that fits"  # how a deployment picks a size: what the cross-size check vouches for
DIM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class SizeSpec:
    """Which size of which declared graph a sized graph is, and how samples are fitted to it."""
    graph: str                       # the declared graph's name (e.g. minilm)
    dim: str                         # the dim's name in the shapes (e.g. seq)
    size: int                        # this graph's size of it
    sizes: tuple[int, ...]           # every size of the graph, ascending
    pad: dict[str, float]            # input -> the value a shorter sample is padded with
    longer: str                      # "skip" | "truncate": a sample longer than the size
    # input or output name -> the axes that are the dim, ascending (one for most; [seq, seq] masks have two)
    axes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def name_of(self, size: int) -> str:
        return sized_name(self.graph, self.dim, size)

    def as_dict(self) -> dict[str, Any]:
        return {"graph": self.graph, "dim": self.dim, "size": self.size, "sizes": list(self.sizes),
                "pad": dict(self.pad), "longer": self.longer, "axes": axes_out(self.axes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SizeSpec:
        return cls(graph=data["graph"], dim=data["dim"], size=data["size"], sizes=tuple(data["sizes"]),
                   pad=dict(data["pad"]), longer=data["longer"], axes=axes_in(data["axes"]))


def axes_out(axes: dict[str, tuple[int, ...]]) -> dict[str, int | list[int]]:
    """Axes as written in records and manifests: an integer for a tensor with the dim on one axis (what records
    before several axes were allowed hold, and what a manifest's consumers read), a list for several."""
    return {name: where[0] if len(where) == 1 else list(where) for name, where in axes.items()}


def axes_in(data: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """`axes_out`'s form (or an older record's, an integer each) read back."""
    return {name: (where,) if isinstance(where, int) else tuple(where) for name, where in data.items()}


def sized_name(graph: str, dim: str, size: int) -> str:
    """The agreed name of one size of a graph: `<graph>.<dim><size>` (minilm.seq32)."""
    return f"{graph}.{dim}{size}"


def described(graph: str, dim: str | None = None, size: int | None = None) -> str:
    """A graph as a message names it: one size of a graph with sizes as the declared graph at that size
    ("graph 'dec' at size src_len 8"), since `dec.src_len8` is a name model.yaml never writes."""
    return f"graph '{graph}'" if dim is None else f"graph '{graph}' at size {dim} {size}"


def expand(name: str, data: dict[str, Any], path: Path, key: str) -> list[tuple[str, dict[str, Any], SizeSpec | None]]:
    """The graphs one declared graph stands for: itself (no `dims:`), or one per size, shapes written out.

    Each is (name, the graph's YAML with `dims:` gone and the dim replaced in every shape, its SizeSpec).
    """
    if "dims" not in data:
        return [(name, data, None)]
    dims = as_mapping(data["dims"], path, f"{key}.dims")
    if len(dims) != 1:
        raise SpecError(path, f"{key}.dims", f"{len(dims)} dims declared: one graph takes sizes along one dim",
                        "keep one dim with sizes, e.g. dims: {seq: [32, 128]}")
    dim, section = next(iter(dims.items()))
    dkey = f"{key}.dims.{dim}"
    if not isinstance(dim, str) or not DIM_NAME.fullmatch(dim):
        raise SpecError(path, f"{key}.dims", f"{dim!r} is not a dim name", "use letters, digits and _, e.g. seq")
    section = {"sizes": section} if isinstance(section, list) else as_mapping(section, path, dkey)
    check_keys(section, DIM_KEYS, path, dkey)
    sizes = section.get("sizes")
    if not isinstance(sizes, list) or not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                                                           for s in sizes):
        raise SpecError(path, f"{dkey}.sizes", f"{sizes!r} is not a list of positive integers", "e.g. sizes: [32, 128]")
    if sorted(set(sizes)) != sizes:
        raise SpecError(path, f"{dkey}.sizes", f"{sizes} repeats a size or is not ascending", "e.g. sizes: [32, 128]")
    axes = _axes(data, dim, path, key)
    inputs = [n for n in as_mapping(data.get("inputs"), path, f"{key}.inputs") if n in axes]
    if not inputs:
        raise SpecError(path, f"{dkey}", f"no input shape uses '{dim}'", f"write it in an input's shape, e.g. [1, {dim}]")
    pad = as_mapping(section.get("pad", {}), path, f"{dkey}.pad")
    for input_name, value in pad.items():
        if input_name not in inputs:
            raise SpecError(path, f"{dkey}.pad.{input_name}", f"not an input with dim '{dim}'",
                            f"give pad values for: {', '.join(inputs)}")
        as_number(value, path, f"{dkey}.pad.{input_name}")
        dtype = (data["inputs"].get(input_name) or {}).get("dtype") if isinstance(data["inputs"], dict) else None
        problem = pad_problem(value, str(dtype))
        if problem:
            raise SpecError(path, f"{dkey}.pad.{input_name}", f"{value!r} {problem}",
                            f"give a pad value that input '{input_name}' ({dtype}) holds exactly")
    longer = section.get("longer", "skip")
    if longer not in LONGER:
        raise SpecError(path, f"{dkey}.longer", f"unknown value {longer!r}",
                        "skip (a sample longer than the size is left out of it) or truncate (cut to the size)")
    pads = {n: float(pad.get(n, 0.0)) for n in inputs}
    body = {k: v for k, v in data.items() if k != "dims"}
    return [(sized_name(name, dim, size), _written(body, dim, size),
             SizeSpec(graph=name, dim=dim, size=size, sizes=tuple(sizes), pad=pads, longer=longer, axes=axes))
            for size in sizes]


# what each declared input dtype holds: (lowest, highest, whole numbers only); numpy is not imported at spec load
FLOAT_MAX = {"float16": 65504.0, "float32": 3.4028234663852886e38}
INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
             "int32": (-2**31, 2**31 - 1), "bool": (0, 1)}


def pad_problem(value: float, dtype: str) -> str | None:
    """Why an input of `dtype` cannot hold the pad `value` (None: it can): padding with a value the input turns into
    Inf, wraps or rounds would verify a different input than the one declared."""
    if dtype in FLOAT_MAX and abs(value) > FLOAT_MAX[dtype]:
        return f"is beyond the largest {dtype} (+-{FLOAT_MAX[dtype]:g}): the input would be padded with Inf"
    if dtype in INT_RANGE:
        low, high = INT_RANGE[dtype]
        if value != int(value):
            return f"is not a whole number: a {dtype} input holds only whole numbers"
        if not low <= value <= high:
            return f"is out of the range of {dtype} ({low} to {high})"
    return None


def _axes(data: dict[str, Any], dim: str, path: Path, key: str) -> dict[str, tuple[int, ...]]:
    """input/output name -> the axes of its shape that are `dim` (every one: a [seq, seq] mask has two)."""
    axes = {}
    for side in ("inputs", "outputs"):
        for tensor, tdata in as_mapping(data.get(side), path, f"{key}.{side}").items():
            shape = tdata.get("shape") if isinstance(tdata, dict) else None
            where = tuple(i for i, d in enumerate(shape) if d == dim) if isinstance(shape, list) else ()
            if where:
                axes[str(tensor)] = where
    return axes


def _written(body: dict[str, Any], dim: str, size: int) -> dict[str, Any]:
    """The graph's YAML with `dim` replaced by `size` in every input and output shape."""
    out = dict(body)
    for side in ("inputs", "outputs"):
        out[side] = {tensor: ({**tdata, "shape": [size if d == dim else d for d in tdata["shape"]]}
                              if isinstance(tdata, dict) and isinstance(tdata.get("shape"), list) else tdata)
                     for tensor, tdata in body[side].items()}
    return out


def check_names(declared: list[str], expanded: list[tuple[str, str]], path: Path) -> None:
    """A size's generated name that is also a declared graph (or another size's) is a spec error naming both."""
    seen = {name: f"graphs.{name}" for name in declared}
    for name, origin in expanded:
        if name in seen and seen[name] != origin:
            raise SpecError(path, origin, f"its size graph '{name}' clashes with {seen[name]}",
                            "rename the graph, or change the dim's name or sizes")
        seen[name] = origin


def chain_sizes(names: list[Any], sized: dict[str, SizeSpec], path: Path, key: str) -> SizeSpec | None:
    """The sizes a pipeline or loop naming graphs with sizes runs at (one chain per size), None when it names none.
    The graphs with sizes it names must share the dim and the sizes (a chain runs one length through)."""
    found = [sized[n] for n in names if isinstance(n, str) and n in sized]
    if not found:
        return None
    first = found[0]
    for other in found[1:]:
        if (other.dim, other.sizes) != (first.dim, first.sizes):
            raise SpecError(path, key, f"graphs '{first.graph}' ({first.dim} {list(first.sizes)}) and '{other.graph}' "
                            f"({other.dim} {list(other.sizes)}) have different sizes: a chain runs one size through",
                            f"give both the same dims, or name one size of each, e.g. {first.name_of(first.sizes[0])}")
    return first


def at_size(data: dict[str, Any], sized: dict[str, SizeSpec], size: int) -> dict[str, Any]:
    """A `pipeline:` section with each graph with sizes named at `size`: in `graphs` and in the `feed` references
    (`<graph>.<tensor>`)."""
    def rename(ref: Any) -> Any:
        if not isinstance(ref, str):
            return ref
        if ref in sized:
            return sized[ref].name_of(size)
        base = next((g for g in sized if ref.startswith(f"{g}.")), None)
        return f"{sized[base].name_of(size)}{ref[len(base):]}" if base else ref

    feed = data.get("feed")
    if isinstance(feed, dict):
        feed = {rename(k): ({**v, **({"from": rename(v["from"])} if "from" in v else {})} if isinstance(v, dict)
                            else rename(v))  # a constant ({value: ...}) has no from
                for k, v in feed.items()}
    graphs = data.get("graphs")
    return {**data, **({"graphs": [rename(n) for n in graphs]} if isinstance(graphs, list) else {}),
            **({"feed": feed} if feed is not None else {})}


def facts(graph: Any) -> dict[str, Any] | None:
    """The sizes facts of a sized graph for a package's manifest (None for a graph without sizes): the declared
    graph, dim, sizes, each size's graph, the rule "smallest that fits", pad values and what happens to a longer
    input, and this graph's own size. `graph` is a GraphSpec or its call-argument dict (modelspec/specjson.py graph_to_dict)."""
    size = graph.get("size") if isinstance(graph, dict) else getattr(graph, "size", None)
    if size is None:
        return None
    size = SizeSpec.from_dict(size) if isinstance(size, dict) else size
    return {"graph": size.graph, "dim": size.dim, "size": size.size, "sizes": list(size.sizes),
            "graphs": {str(s): size.name_of(s) for s in size.sizes}, "rule": RULE, "pad": dict(size.pad),
            "longer": size.longer, "axes": axes_out(size.axes)}


def selection(graphs: Any) -> list[dict[str, Any]]:
    """The sizes facts of every graph with sizes among `graphs` (GraphSpecs, graph dicts, or facts already made),
    once per declared graph and without one size's own `size`: what a package manifest's `selection` lists."""
    found: dict[str, dict[str, Any]] = {}
    for graph in graphs:
        known = graph if isinstance(graph, dict) and "rule" in graph else facts(graph)
        if known is not None:
            found.setdefault(known["graph"], {k: v for k, v in known.items() if k != "size"})
    return list(found.values())
