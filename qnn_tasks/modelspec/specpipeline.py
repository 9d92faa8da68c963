"""`pipeline:` in model.yaml: the model's graphs chained, verified end to end.

    pipeline:
      graphs: [features, classifier]        # in order, at least two graphs of this model
      feed: {classifier.x: features.y}      # optional: <graph>.<input>: <graph>.<output> where names differ
      # or with glue:  classifier.x: {from: features.y, reshape: true, scale: 0.1, offset: 2.0}
                                            # (split on the first dot: `classifier.x.1` is input `x.1`)
      # or stacked:    classifier.x: {from: embed.y, stack: {runs: 16, axis: 1, hop: 1}}
      # or a constant: decoder.token: {value: 1}  (every run, both chains; a number or a list of its shape)
      verify:                               # the last graph's outputs vs the same chain on CPU
        thresholds: {min_cosine: 0.99}
        checks: [{top1: {output: logits, min: 0.95}}]

Every input of a later graph is fed from an earlier graph's output of the same name (or as `feed`
says), with the same shape; a `feed` mapping may add glue the deployment does between the graphs:
`reshape: true` (an output of another shape and the same size) and a fixed affine step
`value * scale + offset`, applied alike to the CPU chain and the NPU chain. The first graph's verification inputs start the chain. Loaded from
modelspec/load.py; only YAML is read here.

`stack:` feeds an input with the outputs of several runs of an earlier graph (a streaming front end ->
embedding -> classifier over the last N frames): the first graph runs once per verification sample, in
order (its stream: successive audio windows with `samples: {audio: {hop: ...}}`); a graph fed plainly
runs once per run of the graph feeding it; a stacked input takes `runs` consecutive runs every `hop`
runs, stacked on `axis` of the input (a new axis, or joined on an existing one when the ranks are equal);
with `reshape: true` outputs of any rank stack on a new `axis` and are then reshaped to the input
(`[1, 1, 1, 96]` x 16 -> `[1, 16, 1, 1, 96]` -> `[1, 16, 96]`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # modelspec/project.py loads through this module: importing it here would be a cycle
    from qnn_tasks.modelspec.project import GraphSpec

PIPELINE_KEYS = {"graphs", "feed", "verify"}
GLUE_KEYS = {"from", "reshape", "scale", "offset", "stack", "value"}
STACK_KEYS = {"runs", "axis", "hop"}
MAX_RUNS = 4096  # runs and hop of a stack: each run of the source graph is one simulator call


@dataclass(frozen=True)
class PipelineSpec:
    model: str
    graphs: tuple[str, ...]
    feed: dict[str, tuple[str, str]]   # "<graph>.<input>" -> (graph, output)
    verify: dict[str, Any]             # validated like a graph's verify section (fp16 defaults)
    glue: dict[str, dict[str, Any]] = field(default_factory=dict)  # "<graph>.<input>" -> {reshape, scale, offset[, stack]}
    name: str = ""                     # a split graph's parts: the graph's name (the model's own pipeline: "")
    size: str = ""                     # one chain of a pipeline over graphs with sizes: "<dim><size>" (name: <model>.<it>)
    values: dict[str, Any] = field(default_factory=dict)  # "<graph>.<input>" -> a constant (number or nested list)


@dataclass(frozen=True)
class Naming:
    """How messages name a pipeline's graphs and feed keys: as model.yaml writes them. A size's pipeline renames
    each graph with sizes to that size's graph (`dec` -> `dec.seq8`), a name the user never wrote: such a graph is
    named as the declared graph at its size, and a feed key as written (`dec.mem`, not `dec.seq8.mem`)."""
    graphs: dict[str, Any]   # name -> GraphSpec (or anything with `name` and `size`)
    per_size: bool = False   # a size's pipeline (modelspec/specsizes.py at_size renamed its graphs)

    def graph(self, name: str) -> str:
        """`graph 'head'`, or `graph 'dec' at size seq 8`."""
        from qnn_tasks.modelspec.specsizes import described

        size = getattr(self.graphs.get(name), "size", None)
        return described(name) if size is None else described(size.graph, size.dim, size.size)

    def quoted(self, name: str) -> str:
        """`'head'` (as messages without sizes always said), or `graph 'dec' at size seq 8`."""
        return self.graph(name) if getattr(self.graphs.get(name), "size", None) else f"'{name}'"

    def written(self, name: str) -> str:
        """A graph's name as this pipeline's section in model.yaml writes it."""
        size = getattr(self.graphs.get(name), "size", None)
        return size.graph if self.per_size and size is not None else name

    def key(self, ref: str) -> str:
        """A `<graph>.<tensor>` as model.yaml writes it."""
        graph, *tensor = _split(ref, list(self.graphs))
        return f"{self.written(graph)}.{tensor[0]}" if tensor else ref


def load(data: Any, graphs: tuple[GraphSpec, ...], model: str, path: Path,
         per_size: bool = False) -> PipelineSpec | None:
    """The `pipeline:` section checked against the graphs; `per_size`: one size's chain of a pipeline over graphs
    with sizes, its graphs renamed to that size's (modelspec/specsizes.py at_size), which messages name as written."""
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.checks import verify_section
    from qnn_tasks.modelspec.yamlread import as_bool, as_mapping, as_number, check_keys

    if data is None:
        return None
    section = as_mapping(data, path, "pipeline")
    check_keys(section, PIPELINE_KEYS, path, "pipeline")
    names = section.get("graphs")
    by_name = {g.name: g for g in graphs}
    naming = Naming(by_name, per_size)
    if not isinstance(names, list) or len(names) < 2 or len(set(names)) != len(names):
        raise SpecError(path, "pipeline.graphs", f"needs two or more different graph names in order, got {names!r}",
                        f"e.g. graphs: [{', '.join(list(by_name)[:2]) or 'first, second'}]")
    for name in names:
        if name not in by_name:
            raise SpecError(path, "pipeline.graphs", f"'{name}' is not a graph of this model",
                            f"use graphs declared under graphs: ({', '.join(by_name)})")
    feed, glue, values = {}, {}, {}
    for key, value in as_mapping(section.get("feed"), path, "pipeline.feed").items():
        written = naming.key(str(key))  # the key in model.yaml (a size's pipeline renamed it)
        if isinstance(value, dict):  # the output, and the glue between the graphs
            check_keys(value, GLUE_KEYS, path, f"pipeline.feed.{written}")
            if "value" in value:  # a constant (a start token): checked against the input below
                values[str(key)] = _constant_target(value, str(key), written, names, naming, path)
                continue
            if "from" not in value:
                raise SpecError(path, f"pipeline.feed.{written}.from", "required key is missing",
                                "e.g. {from: features.y, reshape: true, scale: 0.1, offset: 2.0}, or {value: 1} "
                                "for a constant")
            glue[str(key)] = {"reshape": as_bool(value.get("reshape", False), path, f"pipeline.feed.{written}.reshape"),
                              "scale": as_number(value.get("scale", 1.0), path, f"pipeline.feed.{written}.scale"),
                              "offset": as_number(value.get("offset", 0.0), path, f"pipeline.feed.{written}.offset")}
            if "stack" in value:
                glue[str(key)]["stack"] = _stack_settings(value["stack"], path, f"pipeline.feed.{written}.stack")
            value = value["from"]
        target, source = _split(str(key), names), _split(str(value), names)
        if "stack" in glue.get(str(key), {}) and len(target) == 2 and target[0] in names and len(source) == 2 \
                and (source[0] not in names or names.index(source[0]) >= names.index(target[0])):
            earlier = names[:names.index(target[0])]
            raise SpecError(path, f"pipeline.feed.{written}.stack", f"stacks runs of {naming.quoted(source[0])}, which "
                            f"is not a graph earlier in the pipeline than {naming.quoted(target[0])}",
                            "stack an output of a graph listed before it in pipeline.graphs: "
                            + ", ".join(naming.written(g) for g in earlier))
        if len(target) != 2 or len(source) != 2 or target[0] not in names or source[0] not in names \
                or names.index(source[0]) >= names.index(target[0]):
            raise SpecError(path, f"pipeline.feed.{written}", f"'{written}: {naming.key(str(value))}' does not feed a "
                            "later graph's input from an earlier graph's output",
                            "write <later graph>.<input>: <earlier graph>.<output>")
        feed[str(key)] = (source[0], source[1])
    produced: dict[str, tuple[str, tuple[int, ...]]] = {}  # output name -> (graph, shape)
    rates: dict[str, tuple[tuple[int, int], ...]] = {names[0]: ()}  # graph -> (runs, hop) of the stacks before it
    for position, name in enumerate(names):
        graph = by_name[name]
        if position:
            fed_rates: dict[str, tuple[tuple[int, int], ...]] = {}
            for tensor in graph.inputs:
                if f"{name}.{tensor.name}" in values:  # a constant: every run of the graph gets it
                    _check_constant(values[f"{name}.{tensor.name}"], tensor, naming, name, path)
                    continue
                source_graph, output = feed.get(f"{name}.{tensor.name}", (None, tensor.name))
                found = produced.get(output) if source_graph is None else _output(by_name[source_graph], output)
                written = naming.key(f"{name}.{tensor.name}")
                if found is None:
                    raise SpecError(path, "pipeline", f"input '{tensor.name}' of {naming.graph(name)} is fed by no "
                                    "earlier graph's output", f"add feed: {{{written}: <graph>.<output>}}")
                stack = glue.get(f"{name}.{tensor.name}", {}).get("stack")
                fed_rates[tensor.name] = rates[found[0]] + (((stack["runs"], stack["hop"]),) if stack else ())
                reshape = glue.get(f"{name}.{tensor.name}", {}).get("reshape")
                if stack:
                    found = (found[0], _stacked_shape(found, output, stack, graph, tensor, bool(reshape), path, naming))
                if reshape and _size(found[1]) != _size(tensor.shape):
                    raise SpecError(path, f"pipeline.feed.{written}.reshape", f"input '{tensor.name}' of "
                                    f"{naming.quoted(name)} {list(tensor.shape)} has {_size(tensor.shape)} values, the "
                                    f"output feeding it {list(found[1])} {_size(found[1])}",
                                    "reshape only between tensors of one size")
                if not reshape and tuple(found[1]) != tuple(tensor.shape):
                    raise SpecError(path, "pipeline", f"input '{tensor.name}' of {naming.quoted(name)} is "
                                    f"{list(tensor.shape)}, the output feeding it is {list(found[1])}",
                                    "make the shapes agree in model.yaml, or, for one size, feed: "
                                    f"{{{written}: {{from: <graph>.<output>, reshape: true}}}}")
            if not fed_rates:
                raise SpecError(path, f"pipeline.feed.{naming.key(f'{name}.{graph.inputs[0].name}')}", "every input "
                                f"of {naming.graph(name)} is a constant: its runs would follow nothing of the chain",
                                "feed at least one input from an earlier graph's output")
            rates[name] = _one_rate(fed_rates, name, path, naming)
        for tensor in graph.outputs:
            produced[tensor.name] = (name, tensor.shape)
    last = by_name[names[-1]]
    verify = verify_section(section.get("verify"), last.precision, {t.name: t.shape for t in last.outputs}, path,
                             "pipeline.verify")
    return PipelineSpec(model=model, graphs=tuple(names), feed=feed, verify=verify, glue=glue, values=values)


def _constant_target(section: dict[str, Any], key: str, written: str, names: list, naming: Naming, path: Path) -> Any:
    """`<graph>.<input>: {value: ...}`: the value, once the key names an input of a graph after the first (whose
    inputs are its samples) and nothing else is declared with it."""
    from qnn_tasks.errors import SpecError

    others = sorted(set(section) - {"value"})
    if others:
        raise SpecError(path, f"pipeline.feed.{written}.{others[0]}", "a constant is fed as written: it has no "
                        "output to take, reshape, scale or stack", "write the value the input takes, e.g. {value: 1}")
    target = _split(key, names)
    if len(target) != 2 or target[0] not in names \
            or not any(t.name == target[1] for t in naming.graphs[target[0]].inputs):
        raise SpecError(path, f"pipeline.feed.{written}", f"'{written}' is not an input of a graph of the pipeline",
                        "write <later graph>.<input>: {value: <number>}")
    if target[0] == names[0]:
        raise SpecError(path, f"pipeline.feed.{written}", f"{naming.graph(target[0])} is the pipeline's first graph: "
                        "its inputs are its own samples", f"give {naming.graphs[target[0]].key} the constant in "
                        f"its samples, e.g. samples: {{fill: {{{target[1]}: 1}}}}")
    return section["value"]


def _check_constant(value: Any, tensor, naming: Naming, graph: str, path: Path) -> None:
    """A constant fed to an input: one number for every value of it, or a nested list of its shape; each value one
    the input's dtype holds (a token id 0.5 in an int32 input would not be the constant written)."""
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.specsizes import pad_problem

    key = f"pipeline.feed.{naming.key(f'{graph}.{tensor.name}')}.value"
    shape, level = [], [value]
    while level and isinstance(level[0], list):  # the nested list's shape, level by level
        if any(not isinstance(item, list) or len(item) != len(level[0]) for item in level):
            raise SpecError(path, key, "a ragged list: its rows differ in length or depth",
                            f"give one number, or a list of shape {list(tensor.shape)}")
        shape.append(len(level[0]))
        level = [inner for item in level for inner in item]
    if any(isinstance(item, list) for item in level):
        raise SpecError(path, key, "a ragged list: its rows differ in length or depth",
                        f"give one number, or a list of shape {list(tensor.shape)}")
    if shape and tuple(shape) != tuple(tensor.shape):
        raise SpecError(path, key, f"a list of shape {shape}, input '{tensor.name}' of {naming.graph(graph)} is "
                        f"{list(tensor.shape)}", f"give one number (every value of the input), or a list of shape "
                        f"{list(tensor.shape)}")
    for item in level:
        problem = pad_problem(item, tensor.dtype)
        if problem:
            raise SpecError(path, key, f"{item!r} {problem}",
                            f"give a value that input '{tensor.name}' ({tensor.dtype}) holds")


def _stack_settings(data: Any, path: Path, key: str) -> dict[str, int]:
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.yamlread import as_int, check_keys

    if not isinstance(data, dict):
        raise SpecError(path, key, f"expected a mapping, got {data!r}", "write e.g. stack: {runs: 16, axis: 1}")
    section = data
    check_keys(section, STACK_KEYS, path, key)
    if "runs" not in section:
        raise SpecError(path, f"{key}.runs", "required key is missing", "say how many runs are stacked, e.g. runs: 16")
    return {"runs": as_int(section["runs"], path, f"{key}.runs", 1, MAX_RUNS),
            "axis": as_int(section.get("axis", 0), path, f"{key}.axis"),
            "hop": as_int(section.get("hop", 1), path, f"{key}.hop", 1, MAX_RUNS)}


def stacked_shape(shape: tuple[int, ...], runs: int, axis: int, rank: int) -> tuple[int, ...] | None:
    """The shape of `runs` values of `shape` stacked for an input of `rank` dims: on a new `axis` (rank one more),
    or joined on an existing one (equal ranks); None when the ranks do not allow either."""
    if rank == len(shape) + 1:
        return tuple(shape[:axis]) + (runs,) + tuple(shape[axis:])
    if rank == len(shape):
        return tuple(shape[:axis]) + (shape[axis] * runs,) + tuple(shape[axis + 1:])
    return None


def _stacked_shape(found: tuple[str, tuple[int, ...]], output: str, stack: dict[str, int], graph, tensor,
                   reshape: bool, path: Path, naming: Naming) -> tuple[int, ...]:
    """The stacked shape of the feeding output, checked: an axis of the input, ranks that stack or join, and
    (without reshape) the input's own shape, else one line naming the stack."""
    from qnn_tasks.errors import SpecError

    key = f"pipeline.feed.{naming.key(f'{graph.name}.{tensor.name}')}.stack"
    rank, axis = len(tensor.shape), stack["axis"]
    this, source = naming.quoted(graph.name), naming.quoted(found[0])
    if not -rank <= axis < rank:
        raise SpecError(path, f"{key}.axis", f"axis {axis} is out of range for input '{tensor.name}' of "
                        f"{this} {list(tensor.shape)}", f"use an axis from {-rank} to {rank - 1}")
    stack["axis"] = axis % rank  # normalised, so the stage and the key see one value
    shape = stacked_shape(found[1], stack["runs"], stack["axis"], rank)
    if shape is None and reshape and stack["axis"] <= len(found[1]):  # stack on a new axis, then reshape to the input
        shape = stacked_shape(found[1], stack["runs"], stack["axis"], len(found[1]) + 1)
    if shape is None:
        raise SpecError(path, key, f"output '{output}' of {source} {list(found[1])} has rank {len(found[1])}, "
                        f"input '{tensor.name}' of {this} {list(tensor.shape)} rank {rank}",
                        "add reshape: true to stack on a new axis and reshape to the input (one size), e.g. "
                        f"{list(found[1])} x {stack['runs']} -> {list(tensor.shape)}"
                        if _size(found[1]) * stack["runs"] == _size(tensor.shape) else "stack on a new axis (the input has one dim more) or join on an existing one (equal ranks)")
    if not reshape and shape != tuple(tensor.shape):
        runs = _fitting_runs(found[1], stack["axis"], tensor.shape)
        raise SpecError(path, key, f"output '{output}' of {source} {list(found[1])} stacked over {stack['runs']} "
                        f"runs on axis {stack['axis']} is {list(shape)}, input '{tensor.name}' of {this} is "
                        f"{list(tensor.shape)}", f"set runs: {runs}" if runs else "stack on the axis where the runs go "
                        "(the other dims must be the output's), or add reshape: true for one size")
    return shape


def _fitting_runs(shape: tuple[int, ...], axis: int, target: tuple[int, ...]) -> int | None:
    """The runs that would make `shape` stack into `target` on `axis`, if any (for the fix)."""
    for runs in {target[axis], target[axis] // max(1, shape[axis] if len(shape) == len(target) else 1)}:
        if 1 <= runs <= MAX_RUNS and stacked_shape(shape, runs, axis, len(target)) == tuple(target):
            return runs
    return None


def _one_rate(fed_rates: dict[str, tuple], graph: str, path: Path, naming: Naming) -> tuple:
    """Every input of a graph must come once per run of it: from sources at one rate."""
    from qnn_tasks.errors import SpecError

    first, rate = next(iter(fed_rates.items()))
    for name, other in fed_rates.items():
        if other != rate:
            raise SpecError(path, f"pipeline.feed.{naming.key(f'{graph}.{name}')}", f"input '{name}' of "
                            f"{naming.quoted(graph)} comes "
                            f"{_describe(other)}, input '{first}' {_describe(rate)}: they do not pair up run by run",
                            "stack every input of a graph alike, or feed it from graphs that run as often")
    return rate


def _describe(rate: tuple) -> str:
    return "once per sample" if not rate else "from " + " then ".join(f"{runs} runs every {hop}" for runs, hop in rate)


def _size(shape) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _split(ref: str, graphs: list) -> list[str]:
    """`<graph>.<tensor>` -> [graph, tensor]: the graph part is a graph of the chain, the rest is the tensor's name,
    dots and all (`classifier.x.1` is input `x.1`); split on the first dot when no graph matches."""
    known = [g for g in graphs if isinstance(g, str) and ref.startswith(f"{g}.") and len(ref) > len(g) + 1]
    if known:
        graph = max(known, key=len)
        return [graph, ref[len(graph) + 1:]]
    return ref.split(".", 1)


def _output(graph, name: str) -> tuple[str, tuple[int, ...]] | None:
    tensor = next((t for t in graph.outputs if t.name == name), None)
    return (graph.name, tensor.shape) if tensor else None


def source(graph: GraphSpec, tensor: str, feed: dict[str, Any], earlier: list[GraphSpec]) -> tuple[str, str]:
    """(graph, output) feeding `graph`'s input `tensor`: the feed mapping, else the latest earlier output of that name."""
    declared = feed.get(f"{graph.name}.{tensor}")
    if declared:
        return declared[0], declared[1]
    for other in reversed(earlier):
        if any(t.name == tensor for t in other.outputs):
            return other.name, tensor
    from qnn_tasks.errors import StageError

    raise StageError(f"pipeline: nothing produced input '{tensor}' of {Naming({graph.name: graph}).graph(graph.name)}")


def first_samples(graphs: list[GraphSpec], glue: dict[str, dict[str, Any]], feed: dict[str, Any],
                  end_samples: int | None, values: dict[str, Any] | None = None) -> int | None:
    """How many of the first graph's samples make `end_samples` runs of the last graph (None: all of them):
    every stack on the way back to the first graph needs (runs - 1) * hop + its runs of its source. `values`: the
    inputs fed a constant, which follow no graph."""
    if end_samples is None:
        return None
    needed, graph = end_samples, graphs[-1]
    by_name = {g.name: g for g in graphs}
    while graph is not graphs[0]:
        earlier = graphs[:graphs.index(graph)]
        # every input of a graph fed from the chain comes at one rate (checked at load): follow any
        tensor = next(t for t in graph.inputs if f"{graph.name}.{t.name}" not in (values or {}))
        from_graph, _ = source(graph, tensor.name, feed, earlier)
        settings = (glue.get(f"{graph.name}.{tensor.name}") or {}).get("stack")
        if settings:
            needed = (needed - 1) * settings["hop"] + settings["runs"]
        graph = by_name[from_graph]
    return needed


def check_upstream(graphs: tuple[GraphSpec, ...], pipelines: list[PipelineSpec], path: Path) -> None:
    """Resolve every `samples: {from: <graph>.<output>}` once all graphs are loaded: an output of a graph declared
    before this one, fed through the glue of the pipeline (or the size's pipeline) that feeds this input from the
    same output (a stack of runs, a reshape, scale and offset), else of the input's shape or size (reshaped). A
    graph with sizes named as declared (`enc.mem`) is followed: each size of this graph takes its samples from the
    same size of that one. Here, not in modelspec/specsamples.py: it reads the pipeline's glue (samples -> pipeline ->
    checks -> samples would be a cycle)."""
    from qnn_tasks.errors import SpecError

    names = [g.name for g in graphs]
    sized = {g.size.graph: g.size for g in graphs if g.size}  # a declared graph with sizes -> (one of) its SizeSpecs
    for graph in graphs:
        upstream = (graph.samples or {}).get("from")
        if not upstream:
            continue
        shapes = {t.name: t.shape for t in graph.inputs}
        for name, ref in list(upstream.items()):
            if isinstance(ref, dict):
                continue  # resolved already (the same spec loaded twice)
            key = f"{graph.key}.samples.from" + ("" if len(upstream) == 1 else f".{name}")
            source, output = _split(ref, names + [s for s in sized if s not in names])
            declared = None
            if source in sized and source not in names:  # followed: this size takes the same size's outputs
                declared, source = source, _same_size(graph, sized[source], ref, output, path, key)
            earlier = names[:names.index(graph.name)]
            if source not in earlier:
                before = list(dict.fromkeys(g.size.graph if g.size else g.name for g in graphs[:len(earlier)]
                                            if not (g.size and graph.size and g.size.graph == graph.size.graph)))
                this = f"graph '{graph.size.graph}'" if graph.size else f"'{graph.name}'"
                raise SpecError(path, key, f"'{ref}' is not an output of a graph declared before {this}",
                                f"name one of: {', '.join(before) or '(no graph is declared before it)'}")
            found = next((t for t in graphs[names.index(source)].outputs if t.name == output), None)
            if found is None:
                outputs = ", ".join(t.name for t in graphs[names.index(source)].outputs)
                raise SpecError(path, key, f"graph '{declared or source}' has no output '{output}'",
                                f"use one of: {outputs}")
            glue = None
            for pipeline in pipelines:
                if graph.name in pipeline.graphs and source in pipeline.graphs:
                    fed = pipeline.feed.get(f"{graph.name}.{name}", (None, name))
                    if tuple(fed) == (source, output) or (fed[0] is None and output == name):
                        glue = pipeline.glue.get(f"{graph.name}.{name}")
            if glue is None:
                if _size(found.shape) != _size(shapes[name]):
                    raise SpecError(path, key, f"output '{output}' of '{source}' {list(found.shape)} has "
                                    f"{_size(found.shape)} values, input '{name}' {list(shapes[name])} "
                                    f"{_size(shapes[name])}", "feed it through pipeline.feed with a stack of runs, or "
                                    "name an output of the input's size")
                glue = {"reshape": tuple(found.shape) != tuple(shapes[name]), "scale": 1.0, "offset": 0.0}
            # `declared`: the graph as written, for messages (the size's graph is one the user never wrote)
            upstream[name] = {"graph": source, "output": output, "glue": dict(glue),
                              **({"declared": declared} if declared else {})}


def _same_size(graph: GraphSpec, sizes, ref: str, output: str, path: Path, key: str) -> str:
    """The size of the graph with sizes `sizes` that `graph` takes its samples from: its own size, when both have
    the same dim and sizes; else one line saying what to write instead."""
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.specsizes import sized_name

    named = f"from: {sized_name(sizes.graph, sizes.dim, sizes.sizes[0])}.{output}"
    if graph.size is None:
        raise SpecError(path, key, f"'{ref}' names graph '{sizes.graph}', which has sizes ({sizes.dim} "
                        f"{list(sizes.sizes)}), and '{graph.name}' has none: which size's outputs?",
                        f"give {graph.key} the same dims ({sizes.dim}: {list(sizes.sizes)}) to take each size's "
                        f"samples from the same size of '{sizes.graph}', or name one size, e.g. {named}")
    if (graph.size.dim, graph.size.sizes) != (sizes.dim, sizes.sizes):
        raise SpecError(path, key, f"graphs '{sizes.graph}' ({sizes.dim} {list(sizes.sizes)}) and "
                        f"'{graph.size.graph}' ({graph.size.dim} {list(graph.size.sizes)}) have different sizes: each "
                        f"size of '{graph.size.graph}' takes its samples from the same size of '{sizes.graph}'",
                        f"give both the same dims, or name one size, e.g. {named}")
    return sized_name(sizes.graph, sizes.dim, graph.size.size)
