"""loop: one graph run step after step, its outputs fed back, on the simulator and on the CPU.

The NPU loop carries its own state (each step's inputs come from the NPU's previous outputs) and
the CPU loop carries its own (the simplified ONNX on onnxruntime's CPU provider): neither is fed
the other's numbers, so the error that builds up through the state is what is measured. Every
step's outputs are compared (cosine, max-abs per output and step: where the error starts to grow),
and the whole run is judged with the loop's thresholds and task checks, the steps taking the
place of samples (the VAD's agreement is over the whole stream).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks import fileio
from qnn_tasks.devices import simulator
from qnn_tasks.devices.simulator import SIMULATOR_LABEL
from qnn_tasks.errors import StageError
from qnn_tasks.graphs import modelcode
from qnn_tasks.judge import metrics, plots, sample_store, verification
from qnn_tasks.modelspec.checks import MODEL_CHECKS
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.modelspec.spectransducer import TOKENS
from qnn_tasks.nativelog import native_output_to
from qnn_tasks.run import calls, progress
from qnn_tasks.run.calls import StageCall
from qnn_tasks.stages import transducer

OUTPUTS_FILE = "outputs.npz"
REFERENCE_FILE = "reference.npz"
PLOT_FILE = "per_step_error.png"
TRANSDUCER_PLOT_FILE = "per_chunk_agreement.png"  # a loop with a transducer search

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def run(graph: GraphSpec, loop: dict[str, Any], ctx_onnx: Path, provider_options: Path, simplified: Path,
        inputs_file: Path, target: str, soc_name: str, out_dir: Path,
        start: dict[str, Any] | None = None, partners: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    where = f"{graph.model_dir / 'model.yaml'}: loop"
    stream = sample_store.load(inputs_file)
    steps = loop["steps"] or len(stream)
    if loop["step"] is None and steps > len(stream):
        raise StageError(f"{where}.steps: {steps} steps, but the stream has only {len(stream)} samples "
                         f"(fix: lower loop.steps, give the graph more samples, or drive the loop with a step function)")
    log = out_dir / "simulator.log"
    seconds: list[float] = []
    npu = _npu_runner(ctx_onnx, provider_options, log, graph.allow_cpu_fallback, seconds)
    cpu = _cpu_runner(simplified)
    search = _searches(loop, partners or {}, log)
    runs_of = cut(graph, loop, stream, steps, start, where)
    reference, actual, runs, violations, searched = [], [], [], [], []
    whole_runs: tuple[list, list] = ([], [])  # each run's outputs stacked over its steps (CPU, NPU)
    all_steps = sum(run_steps for _, run_steps, _, _ in runs_of)
    for index, (run_stream, run_steps, cpu_held, npu_held) in enumerate(runs_of):
        done, timed = len(actual), len(seconds)
        ref = drive(graph, loop, run_stream, run_steps, cpu, "cpu", where, lambda i: None, cpu_held)
        got = drive(graph, loop, run_stream, run_steps, npu, "npu", where,
                    lambda i, done=done: progress.step(done + i, all_steps, "step"), npu_held)
        common = min(len(ref), len(got))
        # the run's simulator time: a decoder's decode time per clip
        runs.append({"run": index, "first": len(reference), "steps": len(got), "steps_cpu": len(ref),
                     "npu_seconds": float(np.sum(seconds[timed:]))})
        if search is not None:  # the transducer's greedy search over this run's frames, each side on its own
            searched.append({"first": len(reference), **{side: search(side, outputs) for side, outputs
                                                          in (("cpu", ref), ("npu", got))}})
            runs[-1]["npu_seconds"] += sum(searched[-1]["npu"]["seconds"].values())
        if len(ref) != len(got):
            runs[-1]["stopped_apart_at"] = len(reference) + common
            violations.append(f"run {index}: the NPU loop ran {len(got)} steps, the CPU loop {len(ref)} (its step "
                              f"function stopped them at different steps)")
        reference += ref[:common]
        actual += got[:common]
        for side, outputs in zip(whole_runs, (ref, got)):
            side.append({name: np.stack([o[name] for o in outputs]) for name in outputs[0]})
    per_step = per_step_errors(graph, reference, actual)
    # checks on arrays judge every step (decisions, tokens); checks that run the model's code (wer) judge each
    # run as a whole: the model's transcribe() gets a run's outputs stacked over its steps
    by_step = {**loop["verify"], "checks": [c for c in loop["verify"]["checks"] if c["kind"] not in MODEL_CHECKS]}
    result, judged = verification.judge(graph, by_step, reference, actual)
    searches = None
    if search is not None:  # the search's tokens: compared frame by frame, judged by words per run
        searches, checked, failed = transducer.compare(graph, loop["transducer"], searched, loop["verify"]["checks"],
                                                       _frames_per_step(graph, loop), where)
        result["checks"] += checked
        judged += failed
    for check in loop["verify"]["checks"]:
        if check["kind"] in MODEL_CHECKS and check["output"] != TOKENS:
            outcome = verification.run_check(graph, check, whole_runs[0], whole_runs[1])
            outcome["judged"] = "per run"
            result["checks"].append(outcome)
            if not outcome["passed"]:
                judged.append(f"check {outcome['kind']} on '{check['output']}' over {len(runs)} run(s): "
                              + (outcome.get("failure") or f"{outcome['value']:.4g}"))
    violations = judged + violations
    first = first_differing_step(result["checks"], [r["stopped_apart_at"] for r in runs if "stopped_apart_at" in r]
                                 + ([searches["first_difference"]["step"]] if (searches or {}).get("first_difference")
                                    else []))
    difference = first_difference(graph, result["checks"], first)
    sample_store.save(out_dir / OUTPUTS_FILE, actual)
    sample_store.save(out_dir / REFERENCE_FILE, reference)
    plot = plots.loop_error_plot(out_dir / PLOT_FILE, f"loop {target}", f"NPU ({soc_name}) vs CPU loop", per_step, first,
                                 [r["first"] for r in runs[1:]])
    if searches:  # the searches' agreement per chunk, beside the per-step error
        searches["plot"] = str(plots.transducer_plot(out_dir / TRANSDUCER_PLOT_FILE, f"loop {target}",
                                                     f"NPU ({soc_name}) vs CPU search", searches["per_chunk"],
                                                     [r["first"] for r in runs[1:]]))
    total = float(np.sum(seconds))
    record = {"device": {"kind": "simulator", "name": "x86 HTP simulator (onnxruntime-qnn)"},
              "steps": sum(r["steps"] for r in runs), "steps_cpu": sum(r["steps_cpu"] for r in runs),
              "compared_steps": len(actual), "runs": runs, "feed": loop["feed"], "step_function": loop["step"],
              "start": (start or {}).get("inputs"), "started_by": (start or {}).get("pipeline"),  # pipeline:<it>
              "run_steps": loop.get("run_steps"), **({"transducer": searches} if searches else {}),
              "per_step": per_step, "growth": growth(per_step), "first_differing_step": first,
              "first_difference": difference, **result,
              "violations": violations,
              "timing": {"label": SIMULATOR_LABEL, "steps_per_second": len(seconds) / total if total else None,
                         "per_step_median_s": float(np.median(seconds)), "total_s": total, "runs": len(seconds),
                         "per_run_s": [r["npu_seconds"] for r in runs]},
              "outputs_file": str(out_dir / OUTPUTS_FILE), "reference_file": str(out_dir / REFERENCE_FILE),
              "plot": str(plot), "log": str(log)}
    if violations:
        at = f"; a task result first differed at step {first}" if first is not None else ""
        if difference:
            at += (f" ({difference['check']} on '{difference['output']}': NPU {difference['npu']['text']}, "
                   f"CPU {difference['cpu']['text']})")
        at += transducer.difference_line((searches or {}).get("first_difference"))
        raise StageError(f"loop {target} failed after {record['steps']} steps: " + "; ".join(violations) + at
                         + f" (per-step error: {out_dir / PLOT_FILE})", record)
    return record


def cut(graph: GraphSpec, loop: dict[str, Any], stream: list[dict[str, np.ndarray]], steps: int,
        start: dict[str, Any] | None, where: str) -> list[tuple[list[dict[str, np.ndarray]], int, dict, dict]]:
    """The loop's runs: (stream, steps, CPU held inputs, NPU held inputs) of each. One run per pipeline sample
    (`start:`, each over the whole stream), one run per `run_steps` steps of the stream (its fed-back inputs held at
    zeros for the first step, as a streaming encoder's caches start), or one run of the whole stream."""
    per_run = loop.get("run_steps")
    if not per_run:
        return [(stream, steps, cpu, npu) for cpu, npu in starts(start)]
    if steps % per_run:
        raise StageError(f"{where}.run_steps: the stream's {steps} samples are not a whole number of runs of "
                         f"{per_run} (fix: give the graph a multiple of {per_run} samples, or set loop.steps)")
    declared = {t.name: t for t in graph.inputs}
    zeros = {name: np.zeros(declared[name].shape, np.dtype(declared[name].dtype)) for name in loop["feed"]}
    return [(stream[first:first + per_run], per_run, zeros, zeros) for first in range(0, steps, per_run)]


def _frames_per_step(graph: GraphSpec, loop: dict[str, Any]) -> int:
    return next(t.shape[1] for t in graph.outputs if t.name == loop["transducer"]["frames"])


def _searches(loop: dict[str, Any], partners: dict[str, dict[str, Any]], log: Path):
    """search(side, run's outputs) -> the greedy search of that side over a run's frames; None without a
    transducer. The NPU side runs the decoder and joiner binaries on the simulator, the CPU side their ONNX."""
    settings = loop.get("transducer")
    if not settings:
        return None
    graphs = {role: calls.graph(partners[role]) for role in ("decoder", "joiner")}
    runners = {"cpu": {role: _cpu_runner(Path(partners[role]["simplified"])) for role in graphs},
               "npu": {role: _npu_runner(Path(partners[role]["ctx_onnx"]),
                                         Path(partners[role]["provider_options"]), log,
                                         graphs[role].allow_cpu_fallback, []) for role in graphs}}

    def search(side: str, outputs: list[dict[str, np.ndarray]]) -> dict[str, Any]:
        return transducer.search(settings, graphs["decoder"], graphs["joiner"],
                                 [o[settings["frames"]] for o in outputs], runners[side]["decoder"],
                                 runners[side]["joiner"])

    return search


def _npu_runner(ctx_onnx: Path, provider_options: Path, log: Path, allow_cpu_fallback: bool,
                seconds: list[float]) -> Runner:
    """One binary on the simulator as a step function (its session kept for every call); times into `seconds`."""
    session = simulator.open_session(ctx_onnx, fileio.read_json(provider_options), log, allow_cpu_fallback)
    names = [o.name for o in session.get_outputs()]

    def npu(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        began = time.perf_counter()
        with native_output_to(log):
            values = session.run(None, inputs)
        seconds.append(time.perf_counter() - began)
        return dict(zip(names, values))

    return npu


def _cpu_runner(simplified: Path) -> Runner:
    session = _cpu_session(simplified)
    names = [o.name for o in session.get_outputs()]

    def cpu(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(None, inputs)))

    return cpu


def drive(graph: GraphSpec, loop: dict[str, Any], stream: list[dict[str, np.ndarray]], steps: int, run_step: Runner,
          side: str, where: str, tick: Callable[[int], None],
          held: dict[str, np.ndarray] | None = None) -> list[dict[str, np.ndarray]]:
    """Run one loop: step 0 is the stream's first sample (with the held inputs); each next step takes the next
    sample (or this step's inputs), the held inputs, the fed-back outputs, then what the step function returns."""
    held = held or {}
    ctx = modelcode.context_for(graph) if loop["step"] else None
    inputs = _checked(graph, {**stream[0], **held}, where, 0)
    produced: list[dict[str, np.ndarray]] = []
    for index in range(steps):
        outputs = {name: np.array(value) for name, value in run_step(inputs).items()}
        produced.append(outputs)
        tick(index + 1)
        if index + 1 == steps:
            break
        upcoming = {**(stream[index + 1] if index + 1 < len(stream) else inputs), **held}
        upcoming.update({name: outputs[source] for name, source in loop["feed"].items()})
        if ctx is not None:
            ctx.step, ctx.side = index, side
            # copies: a step function that edits its arguments in place must not change the stream the other
            # loop starts from
            chosen = modelcode.call(graph, loop["step"], ctx, {k: v.copy() for k, v in inputs.items()}, dict(outputs))
            if chosen is None:
                break
            if not isinstance(chosen, dict):
                raise StageError(f"{graph.model_code}:{loop['step']}() returned {type(chosen).__name__}, not a dict "
                                 f"of the next step's inputs or None (fix: return {{input name: array}} or None to stop)")
            upcoming.update(chosen)
        inputs = _checked(graph, upcoming, where, index + 1)
    return produced


def _checked(graph: GraphSpec, inputs: dict[str, Any], where: str, index: int) -> dict[str, np.ndarray]:
    """The next step's inputs, exactly the declared ones, each of its declared shape and dtype."""
    declared = {t.name: t for t in graph.inputs}
    unknown = sorted(set(inputs) - set(declared))
    if unknown:
        raise StageError(f"{where}: step {index} was given {unknown}, which graph '{graph.name}' has no input for "
                         f"(fix: return only its inputs: {', '.join(declared)})")
    result = {}
    for name, tensor in declared.items():
        try:
            value = np.asarray(inputs[name])
        except (ValueError, TypeError) as err:  # ragged lists and the like
            raise StageError(f"{where}: step {index}: input '{name}' is not an array: {str(err)[:120]} "
                             "(fix: return numpy arrays of the declared shape and dtype)") from None
        if tuple(value.shape) != tuple(tensor.shape):
            raise StageError(f"{where}: step {index}: input '{name}' is {list(value.shape)}, model.yaml declares "
                             f"{list(tensor.shape)} (fix: feed it a value of the declared shape)")
        result[name] = _of_kind(value, np.dtype(tensor.dtype), f"{where}: step {index}: input '{name}'")
    return result


def _of_kind(value: np.ndarray, wanted: np.dtype, where: str) -> np.ndarray:
    """`value` as the declared dtype when no value changes on the way: complex numbers keep their imaginary
    part, text and objects are no numbers, a fraction, NaN or an out-of-range number is no integer."""
    kind, problem = value.dtype.kind, None
    if kind not in "biufc":
        problem = f"holds {value.dtype.name} values, not numbers"
    elif kind == "c" and wanted.kind != "c":
        if np.any(value.imag != 0):
            problem = f"holds complex values (imaginary parts up to {float(np.abs(value.imag).max()):.3g})"
        value = value.real
    if problem is None and wanted.kind in "iu" and value.size:
        if kind == "f" and not (np.isfinite(value) & (value == np.round(value))).all():
            problem = "holds fractions or NaN/Inf"
        elif kind in "iuf" and (value.min() < np.iinfo(wanted).min or value.max() > np.iinfo(wanted).max):
            problem = f"holds values outside {wanted.name} ({value.min():g}..{value.max():g})"
    if problem:
        raise StageError(f"{where} {problem}; model.yaml declares {wanted.name} "
                         f"(fix: return {wanted.name} values of the declared shape)")
    return value.astype(wanted, copy=False)


def per_step_errors(graph: GraphSpec, reference: list[dict[str, np.ndarray]],
                    actual: list[dict[str, np.ndarray]]) -> dict[str, dict[str, list[float]]]:
    """Per output: the cosine and max-abs of the NPU loop against the CPU loop at every step.

    A one-element output has no cosine to speak of (it is 1, 0 or -1): its `cosine` is None.
    """
    found: dict[str, dict[str, list[float] | None]] = {}
    for tensor in graph.outputs:
        cos, worst = [], []
        for ref, got in zip(reference, actual):
            m = metrics.compare(ref[tensor.name], got[tensor.name])
            cos.append(m["cosine"])
            worst.append(m["max_abs"])
        found[tensor.name] = {"cosine": cos if int(np.prod(tensor.shape)) > 1 else None, "max_abs": worst}
    return found


def growth(per_step: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, Any]]:
    """How the max-abs error moved from the first tenth of the steps to the last tenth (mean of each)."""
    found = {}
    for name, series in per_step.items():
        values = np.asarray(series["max_abs"], dtype=np.float64)
        if not len(values) or not np.isfinite(values).all():
            found[name] = {"first": None, "last": None, "peak": None, "peak_step": None, "ratio": None}
            continue
        tenth = max(1, len(values) // 10)
        first, last = float(values[:tenth].mean()), float(values[-tenth:].mean())
        found[name] = {"first": first, "last": last, "peak": float(values.max()), "peak_step": int(values.argmax()),
                       "ratio": last / first if first > 0 else None}
    return found


def first_differing_step(checks: list[dict[str, Any]], stopped_apart: list[int]) -> int | None:
    """The first step where a task check's result differed between the loops (or where one of them stopped)."""
    steps = [min(c["disagreeing_samples"]) for c in checks if c.get("disagreeing_samples")] + stopped_apart
    return min(steps) if steps else None


def first_difference(graph: GraphSpec, checks: list[dict[str, Any]], first: int | None) -> dict[str, Any] | None:
    """What the two loops chose at the first differing step, from a check that names it (top1: the two classes,
    each with the text of the model's `label(ctx, output, index)` when its code has one: a decoder's token)."""
    found = next((c for c in checks if (c.get("first_difference") or {}).get("sample") == first), None)
    if first is None or found is None:
        return None
    named = graph.has_code and modelcode.has_function(graph, "label")
    ctx = modelcode.context_for(graph) if named else None

    def side(index: int) -> dict[str, Any]:
        text = modelcode.call(graph, "label", ctx, found["output"], index) if named else None
        shown = f"{index} {str(text)[:40]!r}" if text is not None else str(index)  # bounded: model code's text
        return {"index": index, "label": None if text is None else str(text)[:40], "text": shown}

    return {"step": first, "check": found["kind"], "output": found["output"],
            "npu": side(found["first_difference"]["npu"]), "cpu": side(found["first_difference"]["cpu"])}


def starts(start: dict[str, Any] | None) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """(CPU, NPU) held inputs of each run: one run per pipeline sample, or one run holding nothing."""
    if not start:
        return [({}, {})]
    sides = []
    for side in ("cpu", "npu"):
        kept = sample_store.load(Path(start[side]))
        sides.append([{name: sample[output] for name, output in start["inputs"].items()} for sample in kept])
    return list(zip(*sides))


def _cpu_session(simplified: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(simplified), options, providers=["CPUExecutionProvider"])


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), a["loop"], Path(a["ctx_onnx"]), Path(a["provider_options"]), Path(a["simplified"]),
               Path(a["inputs"]), call.target, a["soc_name"], Path(call.out_dir), a.get("start"), a.get("partners"))
