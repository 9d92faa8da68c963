"""A tiny streaming transducer built in code: a chunk encoder with a cache, a stateless decoder, a joiner.

Random weights, chosen (seed) so the greedy search emits non-blank tokens on most frames and blank on some, with a
margin between the best two scores of every joiner call (at least 1.6 on the CPU) that fp16 on the NPU does not
close. sherpa-onnx's signature: encoder(x [1, 4, 8], cached_x [1, 2, 8]) -> (encoder_out [1, 2, 16],
new_cached_x), decoder(y [1, 2] int32) -> decoder_out [1, 16], joiner(encoder_out [1, 16], decoder_out [1, 16])
-> logit [1, 6]. The encoder's first output frame reads the cached frames, so a cache that is not carried changes
the tokens. `reference_search` is the same greedy search written out here, on onnxruntime's CPU provider.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from conftest import Project
from onnx import TensorProto, helper, numpy_helper
from tiny_project import only_model

T_IN, LEFT, FEAT, JOIN, VOCAB, CONTEXT, T_OUT = 4, 2, 8, 16, 6, 2, 2
RUN_STEPS, RUNS, SEED = 3, 2, 3
TOKENS = ["<blk>", "\u2581a", "b", "\u2581c", "d", "\u2581e"]
MODEL_YAML = """\
licence: test fixture
source: {{file: encoder.onnx}}
graphs:
  stream_encoder:
    inputs:
      x: {{shape: [1, {t_in}, {feat}], dtype: float32}}
      cached_x: {{shape: [1, {left}, {feat}], dtype: float32}}
    outputs:
      encoder_out: {{shape: [1, {t_out}, {join}]}}
      new_cached_x: {{shape: [1, {left}, {feat}]}}
    samples: {{files: encoder.npz}}
    socs: [SM8650]
  stream_decoder:
    source: {{file: decoder.onnx}}
    inputs: {{y: {{shape: [1, {context}], dtype: int32}}}}
    outputs: {{decoder_out: {{shape: [1, {join}]}}}}
    samples: {{files: decoder.npz}}
    socs: [SM8650]
  stream_joiner:
    source: {{file: joiner.onnx}}
    inputs:
      encoder_out: {{shape: [1, {join}], dtype: float32}}
      decoder_out: {{shape: [1, {join}], dtype: float32}}
    outputs: {{logit: {{shape: [1, {vocab}]}}}}
    samples: {{files: joiner.npz}}
    socs: [SM8650]
loop:
  graph: stream_encoder
  feed: {{cached_x: new_cached_x}}
  run_steps: {run_steps}
  transducer:
    frames: encoder_out
    decoder: stream_decoder
    joiner: stream_joiner
    blank: 0
    max_symbols: 1
    tokens: tokens.txt
  verify:
    thresholds: {{min_cosine: 0.99, min_snr_db: 20}}
    checks:
      - wer: {{output: tokens, min_identical: 1.0}}
"""


def _model(name: str, nodes: list, inputs: list, outputs: list, weights: dict) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def graphs(seed: int = SEED) -> dict[str, onnx.ModelProto]:
    rng = np.random.default_rng(seed)

    def weight(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(rows)).astype(np.float32)

    def ints(*values: int) -> np.ndarray:
        return np.array(values, np.int64)

    encoder = _model("stream_encoder", [
        helper.make_node("Concat", ["cached_x", "x"], ["h"], axis=1),                   # [1, 6, F]: cache + chunk
        helper.make_node("MatMul", ["h", "w1"], ["a"]), helper.make_node("Tanh", ["a"], ["t"]),
        helper.make_node("Reshape", ["t", "pairs"], ["p"]),                             # subsampling by 2
        helper.make_node("MatMul", ["p", "w2"], ["q"]),                                 # [1, 3, J]
        helper.make_node("Slice", ["q", "zero", "two", "axis1"], ["encoder_out"]),       # frame 0: the cached frames
        helper.make_node("Slice", ["h", "four", "six", "axis1"], ["new_cached_x"])],    # the chunk's last 2 frames
        [("x", TensorProto.FLOAT, [1, T_IN, FEAT]), ("cached_x", TensorProto.FLOAT, [1, LEFT, FEAT])],
        [("encoder_out", [1, T_OUT, JOIN]), ("new_cached_x", [1, LEFT, FEAT])],
        {"w1": weight(FEAT, JOIN, 2.0), "w2": weight(2 * JOIN, JOIN, 2.0), "pairs": ints(1, 3, 2 * JOIN),
         "zero": ints(0), "two": ints(2), "four": ints(4), "six": ints(6), "axis1": ints(1)})
    decoder = _model("stream_decoder", [
        helper.make_node("Gather", ["embedding", "y"], ["e"]),                          # [1, 2, J]
        helper.make_node("Reshape", ["e", "flat"], ["r"]),                              # the context's "conv"
        helper.make_node("MatMul", ["r", "wd"], ["c"]), helper.make_node("Relu", ["c"], ["decoder_out"])],
        [("y", TensorProto.INT32, [1, CONTEXT])], [("decoder_out", [1, JOIN])],
        {"embedding": weight(VOCAB, JOIN, np.sqrt(VOCAB)), "flat": ints(1, CONTEXT * JOIN),
         "wd": weight(CONTEXT * JOIN, JOIN, 2.0)})
    joiner = _model("stream_joiner", [
        helper.make_node("Add", ["encoder_out", "decoder_out"], ["s"]), helper.make_node("Tanh", ["s"], ["u"]),
        helper.make_node("MatMul", ["u", "wj"], ["logit"])],
        [("encoder_out", TensorProto.FLOAT, [1, JOIN]), ("decoder_out", TensorProto.FLOAT, [1, JOIN])],
        [("logit", [1, VOCAB])], {"wj": weight(JOIN, VOCAB, 8.0)})
    return {"encoder": encoder, "decoder": decoder, "joiner": joiner}


def chunks(count: int = RUN_STEPS * RUNS) -> np.ndarray:
    return np.random.default_rng(100 + SEED).standard_normal((count, 1, T_IN, FEAT)).astype(np.float32)


def reference_search(models: dict[str, onnx.ModelProto], stream: np.ndarray) -> tuple[list[list[int]], float]:
    """sherpa-onnx's greedy search (one symbol per frame at most) over runs of RUN_STEPS chunks, caches zero at each
    run: the tokens of each run and the smallest margin between the best two scores of any joiner call."""
    import onnxruntime as ort

    run = {k: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run
           for k, m in models.items()}
    runs, margins = [], []
    for first in range(0, len(stream), RUN_STEPS):
        cache, context, tokens = np.zeros((1, LEFT, FEAT), np.float32), [0] * CONTEXT, []
        state = run["decoder"](None, {"y": np.array([context], np.int32)})[0]
        for x in stream[first:first + RUN_STEPS]:
            frames, cache = run["encoder"](None, {"x": x, "cached_x": cache})
            for t in range(T_OUT):
                scores = run["joiner"](None, {"encoder_out": frames[:, t], "decoder_out": state})[0].reshape(-1)
                margins.append(float(np.diff(np.sort(scores)[-2:])[0]))
                best = int(np.argmax(scores))
                if best:
                    tokens.append(best)
                    context = context[1:] + [best]
                    state = run["decoder"](None, {"y": np.array([context], np.int32)})[0]
        runs.append(tokens)
    return runs, min(margins)


def text(tokens: list[int]) -> str:
    return " ".join("".join(TOKENS[t] for t in tokens).replace("\u2581", " ").split())


def transducer_project(root: Path) -> tuple[Project, dict[str, onnx.ModelProto]]:
    """The example project with its models replaced by `tx`, the tiny transducer (not built). Its export.py says what
    each run says (texts): the reference search's transcripts with one word changed, so the WER is not zero."""
    project, folder = only_model(root, "tx")
    models = graphs()
    for name, model in models.items():
        onnx.save(model, str(folder / f"{name}.onnx"))
    stream, rng = chunks(), np.random.default_rng(9)
    np.savez(folder / "encoder.npz", x=stream, cached_x=np.zeros((len(stream), 1, LEFT, FEAT), np.float32))
    np.savez(folder / "decoder.npz", y=rng.integers(0, VOCAB, (8, 1, CONTEXT)).astype(np.int32))
    np.savez(folder / "joiner.npz", encoder_out=rng.standard_normal((8, 1, JOIN)).astype(np.float32),
             decoder_out=np.abs(rng.standard_normal((8, 1, JOIN))).astype(np.float32))
    (folder / "tokens.txt").write_text("".join(f"{s} {i}\n" for i, s in enumerate(TOKENS)), encoding="utf-8")
    texts = [text(tokens) + " extra" for tokens in reference_search(models, stream)[0]]
    (folder / "export.py").write_text(f'"""The tiny transducer\'s reference texts (test fixture)."""\n\n\n'
                                      f"def texts(ctx):\n    return {texts!r}\n")
    (folder / "model.yaml").write_text(MODEL_YAML.format(t_in=T_IN, feat=FEAT, left=LEFT, t_out=T_OUT, join=JOIN,
                                                         context=CONTEXT, vocab=VOCAB, run_steps=RUN_STEPS))
    return project, models
