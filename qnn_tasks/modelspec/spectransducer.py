"""`loop.transducer:` in model.yaml: a streaming transducer's greedy search, declared rather than coded.

    loop:
      graph: stream_encoder          # the encoder: one chunk per step, its caches fed back (loop.feed)
      feed: {cached_key: new_cached_key}
      run_steps: 10                  # one utterance = 10 chunks; caches start at zeros at each run
      transducer:
        frames: encoder_out          # the encoder output the search reads, frame by frame (axis 1)
        decoder: stream_decoder      # y [1, context] (integer tokens) -> decoder_out [1, J]
        joiner: stream_joiner        # (one frame [1, J], decoder_out [1, J]) -> logit [1, V]
        blank: 0
        max_symbols: 1               # symbols emitted per frame at most
        tokens: tokens.txt           # `<symbol> <id>` per logit, in the model folder

The search is sherpa-onnx's greedy search: the decoder starts from the context [-1, ..., -1, blank]; at each
frame the joiner scores (frame, decoder_out), and while the best symbol is not blank (at most `max_symbols`
times) it is emitted, shifted into the context and the decoder runs again. `tokens` is the search's output name
in `loop.verify.checks` (only `wer` reads it). Checked here from YAML (names, shapes, dtypes, the file's place);
the tokens file's lines are read by the loop stage. Loaded from modelspec/specloop.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qnn_tasks.modelspec.project import GraphSpec

TRANSDUCER_KEYS = {"frames", "decoder", "joiner", "blank", "max_symbols", "tokens"}
TOKENS = "tokens"      # the search's output, as loop.verify.checks name it
MAX_SYMBOLS = 32       # per frame: sherpa-onnx's greedy search emits one; more is a bound, not a need
INTEGER_DTYPES = ("int32", "int64")


def load(data: Any, graph: GraphSpec, by_name: dict[str, GraphSpec], path: Path) -> dict[str, Any] | None:
    """The validated `loop.transducer` settings (JSON-able: the loop stage's key and call carry them), or None."""
    from qnn_tasks.errors import SpecError
    from qnn_tasks.modelspec.specport import confined, stays_in_folder
    from qnn_tasks.modelspec.yamlread import as_int, as_mapping, check_keys

    if data is None:
        return None
    key = "loop.transducer"
    section = as_mapping(data, path, key)
    check_keys(section, TRANSDUCER_KEYS, path, key)
    for required in ("frames", "decoder", "joiner", "tokens"):
        if required not in section:
            raise SpecError(path, f"{key}.{required}", "missing", "e.g. transducer: {frames: encoder_out, decoder: "
                            "stream_decoder, joiner: stream_joiner, blank: 0, max_symbols: 1, tokens: tokens.txt}")
    outputs = {t.name: t for t in graph.outputs}
    frames = section["frames"]
    if frames not in outputs:
        raise SpecError(path, f"{key}.frames", f"{frames!r} is not an output of graph '{graph.name}'",
                        f"name the encoder output the search reads: one of {', '.join(outputs)}")
    if TOKENS in outputs:
        raise SpecError(path, key, f"graph '{graph.name}' has an output named '{TOKENS}', the search's own output",
                        f"rename that output of {graph.name}")
    shape = outputs[frames].shape
    if len(shape) != 3 or shape[0] != 1:
        raise SpecError(path, f"{key}.frames", f"output '{frames}' is {list(shape)}, not [1, frames, dim]",
                        "export the encoder output as [1, T, J]: the search reads it frame by frame on axis 1")
    decoder = _partner(section["decoder"], "decoder", graph, by_name, path)
    joiner = _partner(section["joiner"], "joiner", graph, by_name, path)
    if decoder.name == joiner.name:
        raise SpecError(path, f"{key}.joiner", f"'{joiner.name}' is the decoder too", "name two different graphs")
    if len(decoder.inputs) != 1 or len(decoder.outputs) != 1:
        raise SpecError(path, f"{key}.decoder", f"graph '{decoder.name}' has {len(decoder.inputs)} input(s) and "
                        f"{len(decoder.outputs)} output(s)", "export the decoder as y [1, context] -> decoder_out [1, J]")
    y = decoder.inputs[0]
    if len(y.shape) != 2 or y.shape[0] != 1 or y.dtype not in INTEGER_DTYPES:
        raise SpecError(path, f"{key}.decoder", f"input '{y.name}' of '{decoder.name}' is {list(y.shape)} {y.dtype}",
                        "give the decoder one integer token input [1, context] (int32, or int64 as sherpa-onnx)")
    if len(joiner.inputs) != 2 or len(joiner.outputs) != 1:
        raise SpecError(path, f"{key}.joiner", f"graph '{joiner.name}' has {len(joiner.inputs)} input(s) and "
                        f"{len(joiner.outputs)} output(s)",
                        "export the joiner as (encoder_out [1, J], decoder_out [1, J]) -> logit [1, V], in that order")
    frame_shape = (shape[0], shape[2])
    for wanted, given, what in ((frame_shape, joiner.inputs[0], f"one frame of '{frames}'"),
                                (decoder.outputs[0].shape, joiner.inputs[1], f"'{decoder.outputs[0].name}' of "
                                                                             f"'{decoder.name}'")):
        if tuple(given.shape) != tuple(wanted):
            raise SpecError(path, f"{key}.joiner", f"input '{given.name}' of '{joiner.name}' is {list(given.shape)}, "
                            f"{what} is {list(wanted)}", "the joiner takes one encoder frame, then the decoder output")
    logit = joiner.outputs[0]
    if len(logit.shape) != 2 or logit.shape[0] != 1:
        raise SpecError(path, f"{key}.joiner", f"output '{logit.name}' of '{joiner.name}' is {list(logit.shape)}",
                        "export the joiner's scores as [1, vocabulary]")
    vocabulary = logit.shape[1]
    blank = as_int(section.get("blank", 0), path, f"{key}.blank", 0, vocabulary - 1)
    max_symbols = as_int(section.get("max_symbols", 1), path, f"{key}.max_symbols", 1, MAX_SYMBOLS)
    tokens = confined(section["tokens"], path, f"{key}.tokens", "the model folder")
    if not (graph.model_dir / tokens).is_file():
        raise SpecError(path, f"{key}.tokens", f"'{tokens}' is not a file in {graph.model_dir}",
                        f"write one `<symbol> <id>` line per logit ({vocabulary} lines), e.g. `<blk> {blank}`")
    stays_in_folder(graph.model_dir / tokens, graph.model_dir, path, f"{key}.tokens")  # its lines reach messages
    return {"frames": frames, "decoder": decoder.name, "joiner": joiner.name, "blank": blank,
            "max_symbols": max_symbols, "tokens": tokens, "context": int(y.shape[1]), "vocabulary": int(vocabulary)}


def _partner(name: Any, role: str, graph: GraphSpec, by_name: dict[str, GraphSpec], path: Path) -> GraphSpec:
    """The decoder or joiner graph: another graph of the model, built for the encoder's chips and precisions (the
    search runs all three on each chip the encoder's loop runs on)."""
    from qnn_tasks.errors import SpecError

    key = f"loop.transducer.{role}"
    others = [n for n in by_name if n != graph.name]
    if name not in by_name or name == graph.name:
        raise SpecError(path, key, f"{name!r} is not another graph of this model",
                        f"name the {role} graph: one of {', '.join(others) or '(none: declare it under graphs)'}")
    partner = by_name[name]
    if partner.precisions != graph.precisions or partner.socs != graph.socs:
        raise SpecError(path, key, f"graph '{name}' is built for {_built_for(partner)}, the encoder '{graph.name}' "
                        f"for {_built_for(graph)}", f"give graphs.{name} the encoder's precision and socs")
    if partner.size is not None:
        raise SpecError(path, key, f"graph '{name}' has sizes (dims:)", "give the transducer's graphs one size each")
    return partner


def _built_for(graph: GraphSpec) -> str:
    return f"{'/'.join(graph.precisions)} on {', '.join(graph.socs) if graph.socs else 'the default chips'}"


def check_verify(transducer: dict[str, Any] | None, data: Any, graph: GraphSpec, path: Path) -> None:
    """`tokens` in loop.verify.checks: only with a transducer, only for `wer`, which reads the model's texts()."""
    from qnn_tasks.errors import SpecError

    per_output = data.get("per_output") if isinstance(data, dict) else None
    if isinstance(per_output, dict) and TOKENS in per_output:
        raise SpecError(path, f"loop.verify.per_output.{TOKENS}", f"'{TOKENS}' holds symbols, not numbers to bound",
                        f"judge them with checks: [{{wer: {{output: {TOKENS}}}}}]")
    checks = data.get("checks") if isinstance(data, dict) else None
    for index, check in enumerate(checks if isinstance(checks, list) else []):
        if not isinstance(check, dict) or len(check) != 1:
            continue  # verify_section names it
        kind, options = next(iter(check.items()))
        if not isinstance(options, dict) or options.get("output") != TOKENS:
            continue
        key = f"loop.verify.checks[{index}].{kind}"
        if transducer is None:
            raise SpecError(path, key, f"'{TOKENS}' is the output of a transducer's search, and this loop has none",
                            "declare loop.transducer, or check one of the graph's outputs")
        if kind != "wer":
            raise SpecError(path, key, f"'{TOKENS}' is judged by words only", f"use wer: {{output: {TOKENS}}}")
        if not graph.has_code:
            raise SpecError(path, key, f"judges the search's transcripts against texts(ctx) of the model's export.py, "
                            f"and {graph.model_dir} has none",
                            f"define texts(ctx) -> one reference text per run in {graph.model_code}")


def verified_outputs(transducer: dict[str, Any] | None, outputs: set[str]) -> set[str]:
    """The names loop.verify may check: the graph's outputs, and the search's tokens with a transducer."""
    return outputs | {TOKENS} if transducer else outputs
