"""`loop:` in model.yaml: one graph run repeatedly, its outputs fed back into its inputs.

    loop:
      graph: vad                    # a graph of this model
      feed: {state: stateN}         # <input>: <output> fed back after every step (same shape)
      steps: 200                    # optional: how many steps (default: one per verification sample)
      step: step                    # optional: export.py's step(ctx, inputs, outputs) -> next inputs | None
      start: {cross_k: crosskv.k}   # optional: inputs held at the model's pipeline's outputs, one run per sample
      run_steps: 10                 # optional: the stream cut into runs of 10 steps, fed inputs zero at each start
      transducer: {...}             # optional: a transducer's greedy search over each step's frames (modelspec/spectransducer.py)
      verify:                       # the NPU loop's outputs at every step vs the CPU loop's (as graph verify)
        checks: [{agreement: {output: output, threshold: 0.5, min: 0.99}}]

Step i takes the i-th verification sample's inputs (the stream), except the fed-back ones, which
come from step i-1's outputs; step 0 is the first sample as it is. With `step:`, the model's own
code decides the next inputs (and when to stop) from the step just run. With `start:`, the model's
`pipeline:` runs first (encoder once -> decoder loop): every pipeline sample starts one run of the
loop, the named inputs held at the last pipeline graph's outputs (the NPU chain's for the NPU loop,
the CPU chain's for the CPU loop). With `run_steps:`, the stream is cut into runs of that many steps (a streaming
encoder's utterances), every fed-back input zeros at each run's first step. Over a graph with sizes (`dims:`) the loop runs per size, each size
started by the pipeline at that size (`load_sized`). Loaded from modelspec/load.py; only YAML is read here.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # modelspec/project.py loads through this module: importing it here would be a cycle
    from qnn_tasks.modelspec.project import GraphSpec
    from qnn_tasks.modelspec.specpipeline import PipelineSpec
    from qnn_tasks.modelspec.specsizes import SizeSpec

LOOP_KEYS = {"graph", "feed", "steps", "step", "start", "run_steps", "transducer", "verify"}
MAX_STEPS = 100_000  # a bound on what a spec can ask the simulator for


@dataclass(frozen=True)
class LoopSpec:
    model: str
    graph: str
    feed: dict[str, str]               # input -> the output fed back into it
    steps: int | None                  # None: one step per verification sample
    step: str | None                   # a function of export.py driving the loop, or None
    verify: dict[str, dict[str, Any]]  # precision -> validated verify settings (as a graph's)
    start: dict[str, str] | None = None  # input -> output of the pipeline's last graph, held for every step
    run_steps: int | None = None       # steps per run (the stream cut into runs), None: one run
    transducer: dict[str, Any] | None = None  # the greedy search's settings (modelspec/spectransducer.py), None: no search

    def settings(self, precision: str) -> dict[str, Any]:
        """What the loop stage's key and call carry for one precision (JSON-able)."""
        optional = {k: v for k, v in (("run_steps", self.run_steps), ("transducer", self.transducer)) if v}
        return {"graph": self.graph, "feed": self.feed, "steps": self.steps, "step": self.step,
                "start": self.start, "verify": self.verify[precision], **optional}


def load(data: Any, graphs: tuple[GraphSpec, ...], model: str, path: Path,
         pipeline: PipelineSpec | None = None) -> LoopSpec | None:
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec import spectransducer
    from qnn_tasks.modelspec.checks import verify_section
    from qnn_tasks.modelspec.yamlread import as_int, as_mapping, check_keys

    if data is None:
        return None
    section = as_mapping(data, path, "loop")
    check_keys(section, LOOP_KEYS, path, "loop")
    by_name = {g.name: g for g in graphs}
    name = section.get("graph")
    if name not in by_name:
        raise SpecError(path, "loop.graph", f"{name!r} is not a graph of this model",
                        f"name the graph that runs in the loop: one of {', '.join(by_name)}")
    graph = by_name[name]
    inputs = {t.name: t for t in graph.inputs}
    outputs = {t.name: t for t in graph.outputs}
    feed: dict[str, str] = {}
    for key, value in as_mapping(section.get("feed"), path, "loop.feed").items():
        key, value = str(key), str(value)
        if key not in inputs:
            raise SpecError(path, f"loop.feed.{key}", f"'{key}' is not an input of graph '{name}'",
                            f"write <input>: <output> with an input of {name}: {', '.join(inputs)}")
        if value not in outputs:
            raise SpecError(path, f"loop.feed.{key}", f"'{value}' is not an output of graph '{name}'",
                            f"feed {key} from one of its outputs: {', '.join(outputs)}")
        if tuple(outputs[value].shape) != tuple(inputs[key].shape):
            raise SpecError(path, f"loop.feed.{key}", f"output '{value}' is {list(outputs[value].shape)}, the input "
                            f"'{key}' it feeds is {list(inputs[key].shape)}",
                            "feed an output of the input's shape, or reshape in export.py (or a step function)")
        feed[key] = value
    step = section.get("step")
    if step is not None and (not isinstance(step, str) or not step.isidentifier()):
        raise SpecError(path, "loop.step", f"{step!r} is not a function name",
                        "name a function step(ctx, inputs, outputs) of the model's export.py")
    if step is not None and not (graph.model_dir / "export.py").is_file():
        raise SpecError(path, "loop.step", f"'{step}' needs the model's export.py, and {graph.model_dir} has none",
                        f"define {step}(ctx, inputs, outputs) in {graph.model_dir / 'export.py'}")
    if not feed and step is None:
        raise SpecError(path, "loop.feed", "feeds nothing back and no step function drives the loop",
                        f"e.g. feed: {{<input>: <output>}} with an input and an output of {name} of one shape")
    start = _start(section.get("start"), graph, feed, by_name, pipeline, path)
    steps = section.get("steps")
    if steps is not None:
        steps = as_int(steps, path, "loop.steps", 1, MAX_STEPS)
    run_steps = _run_steps(section, steps, path)
    transducer = spectransducer.load(section.get("transducer"), graph, by_name, path)
    if transducer is not None:
        for other in ("step", "start"):
            if section.get(other) is not None:
                raise SpecError(path, f"loop.{other}", "a transducer's loop is driven by its declaration: each run is "
                                "`run_steps` chunks of the stream", f"remove loop.{other}")
        if graph.size is not None:
            raise SpecError(path, "loop.transducer", f"graph '{graph.size.graph}' has sizes (dims:)",
                            "give the transducer's encoder one chunk size")
    verify_data = as_mapping(section.get("verify"), path, "loop.verify")
    if "samples" in verify_data:
        raise SpecError(path, "loop.verify.samples", "a loop runs steps, not samples", "use loop.steps")
    spectransducer.check_verify(transducer, verify_data, graph, path)
    names = spectransducer.verified_outputs(transducer, set(outputs))
    verify = {p: verify_section(verify_data, p, names, path, "loop.verify") for p in graph.precisions}
    return LoopSpec(model=model, graph=str(name), feed=feed, steps=steps, step=step, verify=verify, start=start,
                    run_steps=run_steps, transducer=transducer)


def _run_steps(section: dict[str, Any], steps: int | None, path: Path) -> int | None:
    """`run_steps: N`: the stream cut into runs of N steps (a whole number of them when `steps` is given)."""
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.yamlread import as_int

    if section.get("run_steps") is None:
        return None
    run_steps = as_int(section["run_steps"], path, "loop.run_steps", 1, MAX_STEPS)
    for other, why in (("start", "each run starts from a pipeline sample"),
                       ("step", "a step function decides where a run stops")):
        if section.get(other) is not None:
            raise SpecError(path, "loop.run_steps", f"cuts the stream into runs, and with loop.{other} {why}",
                            f"use one of loop.run_steps and loop.{other}")
    if steps is not None and steps % run_steps:
        raise SpecError(path, "loop.steps", f"{steps} steps are not a whole number of runs of {run_steps}",
                        f"give a multiple of run_steps, e.g. steps: {max(1, steps // run_steps) * run_steps}")
    return run_steps


def _start(data: Any, graph: GraphSpec, feed: dict[str, str], by_name: dict[str, GraphSpec],
           pipeline: PipelineSpec | None, path: Path) -> dict[str, str] | None:
    """`start: {<input>: <pipeline's last graph>.<output>}`, checked: names, shapes, a pipeline to start from."""
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.yamlread import as_mapping

    if data is None:
        return None
    section = as_mapping(data, path, "loop.start")
    if pipeline is None:
        raise SpecError(path, "loop.start", "starts from the model's pipeline, and this model has none",
                        "declare pipeline: {graphs: [...]} whose last graph makes these inputs, or drop loop.start")
    last = by_name[pipeline.graphs[-1]]
    if graph.name in pipeline.graphs:
        raise SpecError(path, "loop.graph", f"'{graph.name}' is in the pipeline it starts from",
                        "loop a graph that comes after the pipeline")
    inputs = {t.name: t for t in graph.inputs}
    outputs = {t.name: t for t in last.outputs}
    # a size of a graph is named as the declared graph (`enc.hidden`: at each size, that size's enc)
    label = last.size.graph if last.size else last.name
    start = {}
    for key, value in section.items():
        key, value = str(key), str(value)
        output = next((value[len(n) + 1:] for n in {last.name, label} if value.startswith(f"{n}.")), None)
        if key not in inputs or key in feed:
            raise SpecError(path, f"loop.start.{key}", f"'{key}' is not an input of graph '{graph.name}' that is not "
                            "fed back", f"hold one of: {', '.join(i for i in inputs if i not in feed)}")
        if output not in outputs:
            raise SpecError(path, f"loop.start.{key}", f"'{value}' is not an output of the pipeline's last graph "
                            f"'{last.name}' (only its outputs are kept)", "use one of: "
                            + ", ".join(f"{label}.{o}" for o in outputs))
        if tuple(outputs[output].shape) != tuple(inputs[key].shape):
            raise SpecError(path, f"loop.start.{key}", f"'{value}' of the pipeline's last graph '{last.name}' is "
                            f"{list(outputs[output].shape)}, the input '{key}' of '{graph.name}' is "
                            f"{list(inputs[key].shape)}", "make the shapes agree in model.yaml"
                            + (f", or give the pipeline's graphs the dims of '{graph.size.graph}' to start each size "
                               "from its own size's pipeline" if graph.size and not pipeline.size else ""))
        start[key] = output
    return start or None


def load_sized(data: Any, graphs: tuple[GraphSpec, ...], model: str, path: Path, pipeline: PipelineSpec | None,
               sized: dict[str, SizeSpec], chain: SizeSpec | None = None,
               size_pipelines: tuple[PipelineSpec, ...] = ()) -> LoopSpec | None:
    """`loop:` in a model whose graphs may have sizes (`dims:`). A loop over a graph with sizes is checked at each
    size and runs on each size's chips (its `graph` is the declared name). With `start:`, the loop at size S starts
    from the pipeline at size S when the pipeline has sizes too (same dim and sizes), else from the one pipeline,
    its shapes checked at every size. A loop graph without sizes cannot start from a pipeline per size: refused.
    `sized`: declared graph -> a SizeSpec of it; `chain`: the SizeSpec of the pipeline's sizes, with
    `size_pipelines` its pipelines, one per size (modelspec/load.py)."""
    from dataclasses import replace

    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec import specsizes

    if not isinstance(data, dict):
        return load(data, graphs, model, path, pipeline)
    looped = specsizes.chain_sizes([data.get("graph")], sized, path, "loop.graph")
    starts = data.get("start") is not None and chain is not None
    if starts and looped is None and data.get("graph") in {g.name for g in graphs}:
        raise SpecError(path, "loop.start", f"graph '{data.get('graph')}' has no sizes and starts from a pipeline "
                        f"per size of '{chain.graph}' ({chain.dim} {list(chain.sizes)})",
                        f"give graphs.{data.get('graph')} the same dims ({chain.dim}: {list(chain.sizes)}) to loop at "
                        f"each size, or name one size in pipeline.graphs, e.g. {chain.name_of(chain.sizes[0])}")
    if looped is None:
        return load(data, graphs, model, path, pipeline)
    if starts:  # each size's loop starts from its own size's pipeline: the same dim and sizes
        specsizes.chain_sizes([chain.graph, looped.graph], sized, path, "loop.graph")
    by_size = {p.size: p for p in size_pipelines} if starts else {}
    loops = [load({**data, "graph": looped.name_of(size)}, graphs, model, path,
                  by_size.get(f"{looped.dim}{size}", pipeline)) for size in looped.sizes]
    return replace(loops[0], graph=looped.graph)
