"""A streaming transducer trained here (train.py), exported as sherpa-onnx exports one, judged by words.

Three graphs from the committed weights (weights.pt, its sha256 in weights.sha256; `python3 train.py` made them):
  stream_encoder: x [1, 32, 80] fbank + cached_key, cached_val [4, 32, 128], cached_conv [4, 4, 128]
                  -> encoder_out [1, 8, 128] + new_cached_key, new_cached_val, new_cached_conv (one 0.32 s chunk)
  stream_decoder: y [1, 2] int32 (the last two tokens) -> decoder_out [1, 128]
  stream_joiner:  encoder_out [1, 128] (one frame), decoder_out [1, 128] -> logit [1, 52]
model.yaml's `loop.transducer` declares the greedy search; the loop runs it on the simulator and on the CPU.

The clips are speech the model never trained on: Debian alsa-utils' recordings of a person ("Front Center", ...)
and espeak-ng voices held out of training (speech.HELD_OUT), each padded with silence to `chunks` chunks (one
loop run). The encoder's samples are those chunks with the caches the PyTorch model carried into each; the decoder's
and joiner's are the inputs of their calls in the PyTorch greedy search over the same clips.
"""
from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _sibling(name: str):
    """A module next to this file, loaded by path (this file is not imported as part of a package)."""
    full, path = f"{__name__}.{name}", HERE / f"{name}.py"
    if getattr(sys.modules.get(full), "__file__", None) != str(path):
        spec = importlib.util.spec_from_file_location(full, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


_MODELS: dict[str, object] = {}


def model(ctx):
    """The trained Transducer (float32, eval mode) from model.yaml's source file."""
    import torch

    if ctx.source_path is None or not Path(ctx.source_path).is_file():
        raise ctx.error("model.yaml's source.file must name the trained weights (weights.pt; train.py writes it)")
    key = str(ctx.source_path)
    if key not in _MODELS:
        torch.set_num_threads(1)  # a small model: more threads only fought the simulator and other builds for cores
        net, speech = _sibling("net"), _sibling("speech")
        transducer = net.Transducer(len(speech.SYMBOLS))
        transducer.load_state_dict(torch.load(key, map_location="cpu", weights_only=True))
        _MODELS[key] = transducer.eval()
    return _MODELS[key]


def _modules(ctx) -> dict[str, object]:
    net = _sibling("net")
    m = model(ctx)
    return {"stream_encoder": net.StreamingEncoder(m.encoder).eval(), "stream_decoder": net.StepDecoder(m.decoder).eval(),
            "stream_joiner": m.joiner}


def _role(ctx) -> str:
    """Which of the three graphs this is, by its export function (model.yaml `export:`)."""
    return {"export": "stream_encoder", "export_decoder": "stream_decoder",
            "export_joiner": "stream_joiner"}[ctx.graph.export]


def _torch_export(ctx, role: str) -> None:
    import torch

    module = _modules(ctx)[role]
    example = tuple(torch.zeros(t.shape, dtype=torch.int32 if t.dtype == "int32" else torch.float32)
                    for t in ctx.graph.inputs)
    with torch.no_grad():
        got = module(*example)
    got = got if isinstance(got, tuple) else (got,)
    for tensor, value in zip(ctx.graph.outputs, got):
        if tuple(value.shape) != tuple(tensor.shape):
            raise ctx.error(f"output '{tensor.name}' is {list(value.shape)} from the trained model, model.yaml "
                            f"declares {list(tensor.shape)}: declare the shape the weights give")
    with torch.no_grad():
        torch.onnx.export(module, example, str(ctx.out_path), input_names=[t.name for t in ctx.graph.inputs],
                          output_names=[t.name for t in ctx.graph.outputs], opset_version=17, dynamo=False)


def export(ctx) -> None:
    """The encoder: one chunk with its caches."""
    _torch_export(ctx, "stream_encoder")


def export_decoder(ctx) -> None:
    _torch_export(ctx, "stream_decoder")


def export_joiner(ctx) -> None:
    _torch_export(ctx, "stream_joiner")


def _chunks(ctx) -> int:
    count = int(ctx.options.get("chunks", 8))
    if not 1 <= count <= 64:
        raise ctx.error(f"options.chunks is {count}: use 1..64 chunks of 0.32 s (and the same as loop.run_steps)")
    return count


_CLIPS: dict[tuple, list] = {}


def clips(ctx) -> list[tuple[str, np.ndarray]]:
    """(text, 16 kHz audio) of every loop run: `real_clips` alsa-utils recordings, then `espeak_clips` held-out
    espeak-ng utterances whose speech leaves 0.5 s of the run's `chunks` x 0.32 s for the search to finish."""
    speech = _sibling("speech")
    real, spoken, chunks = int(ctx.options.get("real_clips", 8)), int(ctx.options.get("espeak_clips", 8)), _chunks(ctx)
    if not 0 <= real <= len(speech.ALSA_CLIPS) or not 0 <= spoken <= 64 or real + spoken == 0:
        raise ctx.error(f"options.real_clips {real} / espeak_clips {spoken}: use 0..{len(speech.ALSA_CLIPS)} and "
                        "0..64, not both 0")
    key = (real, spoken, chunks)
    if key not in _CLIPS:
        fits = chunks * 0.32 - 0.5
        fitting = ((text, audio) for text, _, audio in itertools.islice(speech.held_out_stream(), 4 * spoken)
                   if len(audio) / speech.SAMPLE_RATE <= fits)
        held = list(itertools.islice(fitting, spoken))  # synthesized only until enough fit
        if len(held) < spoken:
            raise ctx.error(f"only {len(held)} held-out utterances fit {chunks} chunks: raise options.chunks "
                            "(and loop.run_steps) or lower options.espeak_clips")
        _CLIPS[key] = speech.alsa_clips()[:real] + held
    return _CLIPS[key]


def features(ctx, audio: np.ndarray) -> np.ndarray:
    """[chunks, 1, 32, 80]: the clip's fbank, padded with silence to the run's length, cut into chunks."""
    speech, net = _sibling("speech"), _sibling("net")
    chunks = _chunks(ctx)
    samples = chunks * net.CHUNK * 160
    padded = np.concatenate([audio, np.zeros(max(0, samples - len(audio)), np.float32)])[:samples]
    return speech.fbank(padded)[: chunks * net.CHUNK].reshape(chunks, 1, net.CHUNK, speech.FEATURE_DIM)


_RUNS: dict[tuple, list] = {}


def _runs(ctx) -> list[dict]:
    """Each clip streamed through the PyTorch model chunk by chunk, and its greedy search: every encoder, decoder
    and joiner call's inputs, in order."""
    import torch

    key = (str(ctx.source_path), int(ctx.options.get("real_clips", 8)), int(ctx.options.get("espeak_clips", 8)),
           _chunks(ctx))
    if key in _RUNS:
        return _RUNS[key]
    m = model(ctx)
    runs = []
    with torch.no_grad():
        for text, audio in clips(ctx):
            caches = [torch.zeros(s) for s in m.encoder.cache_shapes().values()]
            steps, frames = [], []
            for x in features(ctx, audio):
                steps.append({"x": x, **{n: c.numpy().copy() for n, c in zip(m.encoder.cache_shapes(), caches)}})
                out, *caches = m.encoder.step(torch.from_numpy(x), *caches)
                frames.append(out[0])
            context = [0] * m.context
            dec = m.decoder(torch.tensor([context]))[0, 0]
            decoder_calls, joiner_calls, tokens = [np.array([context], np.int32)], [], []
            for frame in torch.cat(frames):
                best = int(m.joiner(frame, dec).argmax())
                joiner_calls.append((frame.numpy()[None].copy(), dec.numpy()[None].copy(), best != 0))
                if best:
                    tokens.append(best)
                    context = context[1:] + [best]
                    decoder_calls.append(np.array([context], np.int32))
                    dec = m.decoder(torch.tensor([context]))[0, 0]
            runs.append({"text": text, "encoder": steps, "decoder": decoder_calls, "joiner": joiner_calls,
                         "tokens": tokens})
    _RUNS[key] = runs
    return runs


def samples(ctx) -> list[dict[str, np.ndarray]]:
    """The encoder: every chunk of every run in order (the loop's stream), each with the caches the PyTorch model
    carried into it. The decoder: the distinct contexts of the searches. The joiner: every joiner call that emitted
    a token, and as many that gave blank, in order."""
    role = _role(ctx)
    runs = _runs(ctx)
    if role == "stream_encoder":
        return [step for run in runs for step in run["encoder"]]
    if role == "stream_decoder":
        seen: dict[bytes, np.ndarray] = {}
        for run in runs:
            for y in run["decoder"]:
                seen.setdefault(y.tobytes(), y)
        return [{"y": y} for y in seen.values()]
    emitting = [(frame, dec) for run in runs for frame, dec, emitted in run["joiner"] if emitted]
    blank = [(frame, dec) for run in runs for frame, dec, emitted in run["joiner"] if not emitted]
    chosen = emitting + blank[:: max(1, len(blank) // max(1, len(emitting)))][: len(emitting)]
    return [{"encoder_out": frame, "decoder_out": dec} for frame, dec in chosen]


def reference(ctx, inputs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The PyTorch modules on the same inputs."""
    import torch

    module = _modules(ctx)[_role(ctx)]
    result = []
    with torch.no_grad():
        for sample in inputs:
            got = module(*(torch.from_numpy(np.asarray(sample[t.name])) for t in ctx.graph.inputs))
            got = got if isinstance(got, tuple) else (got,)
            result.append({t.name: v.numpy() for t, v in zip(ctx.graph.outputs, got)})
    return result


def texts(ctx) -> list[str]:
    """What each loop run says (the alsa-utils clips' names, the held-out utterances' texts)."""
    return [text for text, _ in clips(ctx)]


def label(ctx, output: str, index: int) -> str | None:
    """The word a joiner logit stands for."""
    if output != "logit":
        return None
    symbols = _sibling("speech").SYMBOLS
    return symbols[index] if 0 <= index < len(symbols) else None
