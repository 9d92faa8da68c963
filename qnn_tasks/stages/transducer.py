"""A transducer's greedy search over a loop run's encoder frames, on the NPU and on the CPU, and their comparison.

The search is sherpa-onnx's greedy search for streaming transducers (`OnlineTransducerGreedySearchDecoder`): the
decoder's context starts as `context` blanks; at each frame the joiner scores (frame, decoder_out); while the best
symbol is not blank, at most `max_symbols` times per frame, it is emitted, shifted into the context and the decoder
runs again (sherpa-onnx: once per frame). The NPU search runs the decoder and joiner binaries on the NPU encoder's
frames, the CPU search the simplified ONNX graphs on the CPU encoder's frames: neither sees the other's numbers, so
a token the NPU's error changes sends its search its own way. The loop stage (stages/loop.py) calls `search` once
per run and side, then `compare` over every run.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.graphs import modelcode
from qnn_tasks.judge import metrics, speech
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.modelspec.spectransducer import TOKENS

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
MAX_TOKENS_FILE = 1 << 22  # bytes: a vocabulary of a few hundred thousand symbols


def read_tokens(file: Path, vocabulary: int, where: str) -> list[str]:
    """tokens.txt (`<symbol> <id>` per line, sherpa-onnx's format) as the symbol of each logit index."""
    try:
        if file.stat().st_size > MAX_TOKENS_FILE:
            raise StageError(f"{where}.tokens: {file} is over {MAX_TOKENS_FILE >> 20} MB (fix: one `<symbol> <id>` "
                             "line per logit)")
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise StageError(f"{where}.tokens: cannot read {file}: {err} (fix: a UTF-8 text file of `<symbol> <id>` "
                         "lines)") from None
    symbols: dict[int, str] = {}
    for number, line in enumerate(lines, 1):
        parts = line.rsplit(maxsplit=1)
        if not line.strip():
            continue
        if len(parts) != 2 or not parts[1].isdigit() or int(parts[1]) in symbols:
            raise StageError(f"{where}.tokens: {file}:{number}: {line[:60]!r} is not `<symbol> <id>` with an id not "
                             "given before (fix: one `<symbol> <id>` line per logit, ids 0, 1, ...)")
        symbols[int(parts[1])] = parts[0]
    if sorted(symbols) != list(range(vocabulary)):
        raise StageError(f"{where}.tokens: {file} gives {len(symbols)} ids, the joiner scores {vocabulary} symbols "
                         f"(fix: one line per logit, ids 0 to {vocabulary - 1})")
    return [symbols[i] for i in range(vocabulary)]


def text_of(symbols: list[str], tokens: list[int]) -> str:
    """A transcript as sherpa-onnx writes it: the symbols joined, '▁' a word boundary, `<...>` symbols left out."""
    pieces = [symbols[t] for t in tokens if not (symbols[t].startswith("<") and symbols[t].endswith(">"))]
    return " ".join("".join(pieces).replace("\u2581", " ").split())


def search(settings: dict[str, Any], decoder: GraphSpec, joiner: GraphSpec, frames: list[np.ndarray],
           run_decoder: Runner, run_joiner: Runner) -> dict[str, Any]:
    """Greedy search over one run's encoder outputs (`frames`: one [1, T, J] per step, in order).

    Returns the emitted tokens, the frame each came from, the symbols of each frame, and each frame's first
    joiner scores (what the two searches are compared on frame by frame)."""
    blank, limit = settings["blank"], settings["max_symbols"]
    y = decoder.inputs[0]
    frame_in, decoder_in = (t.name for t in joiner.inputs)
    decoded, scored = decoder.outputs[0].name, joiner.outputs[0].name
    context = [blank] * settings["context"]
    seconds = {"decoder": [], "joiner": []}

    def timed(which: str, run: Runner, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
        began = time.perf_counter()
        value = np.asarray(run(inputs)[output])
        seconds[which].append(time.perf_counter() - began)
        return value

    def decode() -> np.ndarray:
        return timed("decoder", run_decoder, {y.name: np.asarray([context], dtype=y.dtype)}, decoded).astype(np.float32)

    state = decode()
    tokens, token_frames, per_frame, first_scores = [], [], [], []
    for encoder_out in frames:
        for t in range(encoder_out.shape[1]):
            frame = np.ascontiguousarray(encoder_out[:, t, :], dtype=np.float32)
            emitted = []
            for attempt in range(limit):
                scores = timed("joiner", run_joiner, {frame_in: frame, decoder_in: state}, scored)
                if attempt == 0:
                    first_scores.append(scores.reshape(-1))
                best = int(np.argmax(scores.reshape(-1)))
                if best == blank:
                    break
                emitted.append(best)
                context = context[1:] + [best]
                state = decode()
            tokens += emitted
            token_frames += [len(per_frame)] * len(emitted)
            per_frame.append(emitted)
    return {"tokens": tokens, "token_frames": token_frames, "per_frame": per_frame,
            "scores": np.stack(first_scores) if first_scores else np.zeros((0, 0), np.float32),
            "calls": {k: len(v) for k, v in seconds.items()}, "seconds": {k: float(np.sum(v)) for k, v in seconds.items()}}


def compare(graph: GraphSpec, settings: dict[str, Any], runs: list[dict[str, Any]], checks: list[dict[str, Any]],
            frames_per_step: int, where: str) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """The two searches of every run side by side: (the record's `transducer`, check results, violations).

    `runs`: per run {"first": its first step in the series, "cpu": search(...), "npu": search(...)}. The first
    differing frame is where the symbols emitted first differ; the identical-tokens share is the share of frames at
    which both searches emitted the same symbols (none, or the same ones)."""
    symbols = read_tokens(graph.model_dir / settings["tokens"], settings["vocabulary"], where)
    shown, same_frames, frame_count, first = [], 0, 0, None
    cosine, worst, chunks = [], [], {"step": [], "agreement": [], "max_abs": []}
    for index, run in enumerate(runs):
        cpu, npu = run["cpu"], run["npu"]
        for t, (a, b) in enumerate(zip(cpu["per_frame"], npu["per_frame"])):
            same_frames += a == b
            if a != b and first is None:
                first = _difference(index, run, t, frames_per_step, symbols)
        frame_count += len(cpu["per_frame"])
        run_worst = []
        for ref, got in zip(cpu["scores"], npu["scores"]):
            m = metrics.compare(ref, got)
            cosine.append(m["cosine"])
            worst.append(m["max_abs"])
            run_worst.append(m["max_abs"])
        _per_chunk(chunks, run, frames_per_step, run_worst)
        shown.append({"run": index, "first_step": run["first"], "frames": len(cpu["per_frame"]),
                      "cpu": {"tokens": cpu["tokens"], "token_frames": cpu["token_frames"],
                              "text": text_of(symbols, cpu["tokens"])},
                      "npu": {"tokens": npu["tokens"], "token_frames": npu["token_frames"],
                              "text": text_of(symbols, npu["tokens"])},
                      "identical": cpu["tokens"] == npu["tokens"], "calls": npu["calls"], "npu_seconds": npu["seconds"]})
    results, violations = [], []
    for check in checks:
        if check["kind"] == "wer" and check["output"] == TOKENS:
            texts = speech.reference_texts(graph, modelcode.context_for(graph), len(runs), "loop.verify")
            for run, text in zip(shown, texts):  # the report shows each clip's words beside both transcripts
                run["reference_text"] = text
            result = speech.wer_result(check, texts, [r["cpu"]["text"] for r in shown], [r["npu"]["text"] for r in shown],
                                       f"the greedy search's tokens, as text by {settings['tokens']}")
            result["judged"] = "per run"
            results.append(result)
            if not result["passed"]:
                violations.append(f"check wer on '{TOKENS}' over {len(runs)} run(s): {result['failure']}")
    record = {"blank": settings["blank"], "max_symbols": settings["max_symbols"], "context": settings["context"],
              "frames": settings["frames"], "decoder": settings["decoder"], "joiner": settings["joiner"],
              "tokens_file": settings["tokens"], "frames_per_step": frames_per_step, "compared_frames": frame_count,
              "identical_tokens_share": same_frames / frame_count if frame_count else None,
              "identical_runs_share": float(np.mean([r["identical"] for r in shown])) if shown else None,
              "first_difference": first, "per_frame": {"cosine": cosine, "max_abs": worst}, "per_chunk": chunks,
              "runs": shown,
              "joiner_calls": sum(r["calls"]["joiner"] for r in shown),
              "decoder_calls": sum(r["calls"]["decoder"] for r in shown)}
    if first is not None and not any(r["kind"] == "wer" for r in results):  # no check judges the tokens: they must agree
        violations.append(f"the searches emitted different tokens over {len(runs)} run(s) (identical at "
                          f"{record['identical_tokens_share']:.1%} of frames)")
    return record, results, violations


def _per_chunk(chunks: dict[str, list], run: dict[str, Any], frames_per_step: int, worst: list[float]) -> None:
    """Per loop step (one encoder chunk) of a run: the share of its frames at which both searches emitted the same
    symbols, and the largest |NPU - CPU| of the joiner's first scores over its frames."""
    cpu, npu = run["cpu"]["per_frame"], run["npu"]["per_frame"]
    for begin in range(0, min(len(cpu), len(npu)), frames_per_step):
        pairs = list(zip(cpu[begin:begin + frames_per_step], npu[begin:begin + frames_per_step]))
        chunks["step"].append(run["first"] + begin // frames_per_step)
        chunks["agreement"].append(sum(a == b for a, b in pairs) / len(pairs))
        scored = [w for w in worst[begin:begin + frames_per_step] if w is not None]
        chunks["max_abs"].append(max(scored) if scored else None)


def _difference(index: int, run: dict[str, Any], t: int, frames_per_step: int, symbols: list[str]) -> dict[str, Any]:
    """Where the two searches first emitted different symbols: run, frame (and its loop step), and what each chose."""
    def side(which: str) -> dict[str, Any]:
        emitted = run[which]["per_frame"][t]
        position = run[which]["token_frames"].index(t) if t in run[which]["token_frames"] else \
            sum(1 for f in run[which]["token_frames"] if f < t)
        return {"tokens": emitted, "symbols": [symbols[s] for s in emitted], "token_index": position,
                "text": " ".join(f"{s} {symbols[s]!r}" for s in emitted) or "blank"}

    return {"run": index, "frame": t, "step": run["first"] + t // frames_per_step, "cpu": side("cpu"),
            "npu": side("npu")}


def difference_line(first: dict[str, Any] | None) -> str:
    """The first differing frame as the loop's failure line says it."""
    if first is None:
        return ""
    return (f"; the searches first differed in run {first['run']} at frame {first['frame']} (step {first['step']}, "
            f"token {first['npu']['token_index']}): NPU {first['npu']['text']}, CPU {first['cpu']['text']}")
