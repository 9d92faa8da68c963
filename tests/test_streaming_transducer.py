"""The trained streaming transducer (models/streaming-transducer).

Quick: the training code's RNN-T loss against the sum over every alignment written out, the streamed encoder
against the whole-utterance one it is trained as, the committed weights against their digest, the manifest's
`sherpa_onnx` block against its schema (a bad value refused). Slow: the model built in a copy of the project (its
committed weights, nothing trained): the three binaries on SM8650's simulator, the declared greedy search over 10
clips it never trained on (the 8 alsa-utils recordings of a person and 2 held-out espeak-ng voices), the NPU path's
WER equal to the CPU path's; then `doit dist`, its manifest schema-validated, and the package used the way an app
would: the sherpa_onnx block's three files opened with their provider options, a clip decoded on the simulator.
"""
from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLES, Project, project_with_model, restrict_socs

MODEL = EXAMPLES / "speech" / "streaming-transducer"  # the tests' own copy of models/streaming-transducer
YAML = "models/streaming-transducer/model.yaml"
SOC = "SM8650"
WER_HELD_OUT = 0.1392  # the CPU path on held-out espeak-ng voices: 0.1391 as measured (the goal: <= 0.15)


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"test_streaming_transducer_{name}", MODEL / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def net():
    import torch

    torch.set_num_threads(1)
    return _module("net")


def test_the_rnnt_loss_is_minus_the_log_of_the_sum_over_every_alignment(net):
    """Every path through the lattice written out: (T - 1 + U choose U) orders of T - 1 blanks and U tokens, then
    the final blank; the loss of each utterance (own lengths, padded batch) is -log of their summed probability."""
    import torch

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 4, 6)
    targets = torch.tensor([[2, 5, 1], [4, 4, 0], [3, 0, 0]])
    frames, lengths = torch.tensor([5, 4, 3]), torch.tensor([3, 2, 1])
    got = net.rnnt_loss(logits, targets, frames, lengths)
    log_probs = torch.log_softmax(logits, -1)
    for b in range(3):
        t_len, u_len = int(frames[b]), int(lengths[b])
        total = []
        for labels_at in itertools.combinations(range(t_len - 1 + u_len), u_len):
            t = u = 0
            score = 0.0
            for move in range(t_len - 1 + u_len):
                if move in labels_at:
                    score += float(log_probs[b, t, u, targets[b, u]])
                    u += 1
                else:
                    score += float(log_probs[b, t, u, 0])
                    t += 1
            total.append(score + float(log_probs[b, t_len - 1, u_len, 0]))
        assert math.comb(t_len - 1 + u_len, u_len) == len(total)
        assert float(got[b]) == pytest.approx(-float(torch.logsumexp(torch.tensor(total), 0)), abs=1e-4)


def test_the_streamed_encoder_is_the_one_trained_and_its_caches_matter(net):
    """The committed weights: chunk by chunk with the caches carried = the whole utterance at once (what training
    computes); the same chunks with the caches reset each time differ (the caches carry the left context)."""
    import torch

    speech = _module("speech")
    model = net.Transducer(len(speech.SYMBOLS))
    model.load_state_dict(torch.load(MODEL / "weights.pt", weights_only=True))
    model.eval()
    x = torch.randn(1, 3 * net.CHUNK, speech.FEATURE_DIM) * 3
    with torch.no_grad():
        whole = model.encoder(x)[0]
        caches = [torch.zeros(s) for s in model.encoder.cache_shapes().values()]
        carried, cold = [], []
        for i in range(3):
            chunk = x[:, i * net.CHUNK:(i + 1) * net.CHUNK]
            out, *caches = model.encoder.step(chunk, *caches)
            carried.append(out[0])
            cold.append(model.encoder.step(chunk, *[torch.zeros(s) for s in model.encoder.cache_shapes().values()])[0][0])
    assert torch.allclose(torch.cat(carried), whole, atol=1e-4)
    assert (torch.cat(cold[1:]) - whole[net.FRAMES:]).abs().max() > 0.1


def test_a_batch_split_between_processes_steps_the_whole_batchs_gradient(net):
    """train.py's processes each take every world-th utterance and sum their gradients: the per-utterance losses
    over the whole batch's size, summed over the shares, are the whole batch's loss and gradient."""
    import torch

    torch.manual_seed(0)
    cfg = {**net.CONFIG, "dim": 16, "heads": 2, "ff": 32, "layers": 1, "left": 8, "join": 16, "decoder": 16}
    model = net.Transducer(7, cfg)
    ctc = torch.nn.Linear(16, 7)
    x = torch.randn(5, 2 * net.CHUNK, 80)
    targets = torch.tensor([[1, 2, 3], [4, 0, 0], [5, 6, 0], [2, 2, 2], [3, 0, 0]])
    frames, lengths = torch.tensor([16, 12, 16, 8, 10]), torch.tensor([3, 1, 2, 3, 1])
    parameters = [*model.parameters(), *ctc.parameters()]

    def gradient(rows) -> tuple[float, list]:
        loss = model.losses(x[rows], frames[rows], targets[rows], lengths[rows], ctc, 0.5).sum() / 5
        return float(loss.detach()), torch.autograd.grad(loss, parameters, allow_unused=True)

    whole, whole_grad = gradient(slice(None))
    shares = [gradient(slice(rank, None, 2)) for rank in range(2)]
    assert sum(loss for loss, _ in shares) == pytest.approx(whole, rel=1e-6)
    for index, expected in enumerate(whole_grad):
        if expected is not None:
            got = sum(g[index] for _, g in shares if g[index] is not None)
            assert torch.allclose(got, expected, atol=1e-6)


def test_a_ctc_pass_trains_the_encoder_alone_by_the_ctc_loss(net):
    """train.py's first pass (--ctc-passes): the loss is the CTC head's per token, and only the encoder and that head
    get a gradient (the decoder and joiner are left as they are for the RNN-T passes)."""
    import torch

    torch.manual_seed(0)
    cfg = {**net.CONFIG, "dim": 16, "heads": 2, "ff": 32, "layers": 1, "left": 8, "join": 16, "decoder": 16}
    model = net.Transducer(7, cfg)
    ctc = torch.nn.Linear(16, 7)
    x = torch.randn(2, 2 * net.CHUNK, 80)
    targets, frames, lengths = torch.tensor([[1, 2, 3], [4, 0, 0]]), torch.tensor([16, 12]), torch.tensor([3, 1])
    loss = model.losses(x, frames, targets, lengths, ctc, 1.0, rnnt=False)
    log_probs = torch.log_softmax(ctc(model.encoder(x)), -1).transpose(0, 1)
    expected = torch.nn.functional.ctc_loss(log_probs, targets, frames, lengths, reduction="none") / lengths
    assert torch.allclose(loss, expected)
    loss.sum().backward()
    assert all(p.grad is not None for p in [*model.encoder.parameters(), *ctc.parameters()] if p.requires_grad)
    assert all(p.grad is None for p in [*model.decoder.parameters(), *model.joiner.parameters()])


def test_train_py_refuses_a_process_count_it_cannot_split_a_batch_into():
    """--workers outside 1..--batch, or --steps not one per pass, stops at once in one line naming the flags, before
    any work."""
    import subprocess

    for workers in ("0", "17"):
        done = subprocess.run([sys.executable, str(MODEL / "train.py"), "--workers", workers, "--batch", "16"],
                              capture_output=True, text=True)
        assert done.returncode == 2
        assert f"--workers {workers}: give 1 to --batch (16) processes" in done.stderr.splitlines()[-1]
    done = subprocess.run([sys.executable, str(MODEL / "train.py"), "--lr", "1e-3,1e-3", "--steps", "1,2,3"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "--steps 1,2,3 --ctc-passes 2: give one --steps value or one per pass" in done.stderr.splitlines()[-1]


@pytest.mark.slow
def test_train_py_in_two_processes_is_deterministic_and_trains_as_one_process_does(tmp_path):
    """train.py from nothing on a small set (200 synthesized utterances; a CTC pass of 15 steps, an RNN-T pass of
    30): two processes twice give the same weights byte for byte, and the losses one process reports, to float
    rounding."""
    import subprocess

    def run(workers: int, name: str) -> dict:
        subprocess.run([sys.executable, str(MODEL / "train.py"), "--utterances", "200", "--ctc-passes", "1",
                        "--steps", "15,30", "--lr", "1e-3,1e-3", "--held-out", "2", "--workers", str(workers),
                        "--data-cache", str(tmp_path / "data.npz"), "--out", str(tmp_path / name)],
                       check=True, capture_output=True)
        return json.loads((tmp_path / name / "train.json").read_text())

    one, two, again = run(1, "one"), run(2, "two"), run(2, "again")
    assert two["workers"] == 2 and two["sha256"] == again["sha256"]
    assert [(p["steps"], p["ctc_only"]) for p in two["passes"]] == [(15, True), (30, False)]
    for mine, theirs in zip(two["passes"], one["passes"]):
        assert mine["loss_last_50"] == pytest.approx(theirs["loss_last_50"], rel=1e-5)
    assert not any(p.name.endswith(".part") for p in (tmp_path / "two").iterdir())  # written whole, then renamed


def test_the_committed_weights_are_the_ones_train_py_reported():
    """weights.pt is the last of the runs train-runs.json lists, each resuming the one before (by digest)."""
    digest = hashlib.sha256((MODEL / "weights.pt").read_bytes()).hexdigest()
    assert (MODEL / "weights.sha256").read_text().split()[0] == digest
    trained = json.loads((MODEL / "train.json").read_text())
    runs = json.loads((MODEL / "train-runs.json").read_text())
    assert trained == runs[-1] and trained["sha256"] == digest
    assert runs[0].get("resumed_from") is None
    assert [r["resumed_from"] for r in runs[1:]] == [r["sha256"] for r in runs[:-1]]
    assert trained["wer_held_out_espeak"] <= WER_HELD_OUT, trained["wer_held_out_espeak"]  # measured on 100 clips
    assert (MODEL / "tokens.txt").read_text(encoding="utf-8") == _module("speech").tokens_text()
    assert (MODEL / "weights.pt").stat().st_size < 5 << 20  # committed: a few MB at most


def _sherpa_block() -> dict:
    from qnn_tasks.ship import manifest as mf

    io = {"encoder": {"inputs": [{"name": "x", "shape": [1, 32, 80], "dtype": "float32"},
                                 {"name": "cache", "shape": [2, 4, 8], "dtype": "float32"}],
                      "outputs": [{"name": "encoder_out", "shape": [1, 8, 16], "dtype": "float32"},
                                  {"name": "new_cache", "shape": [2, 4, 8], "dtype": "float32"}]},
          "decoder": {"inputs": [{"name": "y", "shape": [1, 2], "dtype": "int32"}],
                      "outputs": [{"name": "decoder_out", "shape": [1, 16], "dtype": "float32"}]},
          "joiner": {"inputs": [{"name": "enc", "shape": [1, 16], "dtype": "float32"},
                                {"name": "dec", "shape": [1, 16], "dtype": "float32"}],
                     "outputs": [{"name": "logit", "shape": [1, 6], "dtype": "float32"}]}}
    loop = {"graph": "encoder", "feed": {"cache": "new_cache"},
            "transducer": {"frames": "encoder_out", "decoder": "decoder", "joiner": "joiner", "blank": 0,
                           "max_symbols": 1, "context": 2, "vocabulary": 6, "tokens": "tokens.txt"}}

    def binary(graph: str, soc: str) -> dict:
        return {"soc": soc, "precision": "fp16", "path": f"{soc}/{graph}.fp16.bin",
                "ort": {"ctx_onnx": f"{soc}/{graph}.fp16_ctx.onnx",
                        "provider_options": f"{soc}/{graph}.fp16.provider_options.json"}}

    shipped = {"encoder": {"binaries": [binary("encoder", "SM8650"), binary("encoder", "SM8750")]},
               "decoder": {"binaries": [binary("decoder", "SM8650"), binary("decoder", "SM8750")]},
               "joiner": {"binaries": [binary("joiner", "SM8650")]}}  # SM8750's joiner did not ship
    return mf.sherpa_onnx(loop, [{"name": n, "io": v} for n, v in io.items()], shipped)


def _validate(block: dict) -> None:
    import jsonschema

    from qnn_tasks.ship import manifest as mf

    schema = mf.schema()
    jsonschema.Draft202012Validator({"$defs": schema["$defs"], **schema["properties"]["sherpa_onnx"]}).validate(block)


def test_the_sherpa_onnx_block_has_a_config_where_all_three_ship_and_follows_its_schema():
    block = _sherpa_block()
    _validate(block)
    (config,) = block["configs"]  # SM8750 lacks its joiner: no config there
    assert config["soc"] == "SM8650" and config["transducer"] == {
        "encoder": "SM8650/encoder.fp16_ctx.onnx", "decoder": "SM8650/decoder.fp16_ctx.onnx",
        "joiner": "SM8650/joiner.fp16_ctx.onnx"}
    assert block["decoding"] == {"decoding_method": "greedy_search", "blank_id": 0, "context_size": 2,
                                 "max_symbols_per_frame": 1, "vocab_size": 6, "chunk_size": 32, "feature_dim": 80,
                                 "frames_per_chunk": 8}
    assert block["tensors"]["encoder"]["states"] == [{"input": "cache", "output": "new_cache", "shape": [2, 4, 8],
                                                      "dtype": "float32", "start": 0}]


@pytest.mark.parametrize("where, value", [(("decoding", "blank_id"), -1), (("decoding", "decoding_method"), "beam"),
                                          (("configs", 0, "transducer", "joiner"), "../joiner.onnx"),
                                          (("tokens",), "/abs/tokens.txt")])
def test_a_bad_sherpa_onnx_block_is_refused_by_the_schema(where, value):
    import jsonschema

    block = _sherpa_block()
    target = block
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        _validate(block)


# ------------------------------------------------------------------ the model built, on the simulator (slow)

@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Project:
    """The committed model in a copy of the project, 10 clips (8 recordings + 2 held-out voices), SM8650 only."""
    project = project_with_model(tmp_path_factory.mktemp("transducer") / "project", MODEL)
    text = project.path(YAML).read_text()
    assert text.count("espeak_clips: 8") == 3, "the model's clips changed: update this fixture"
    project.path(YAML).write_text(text.replace("espeak_clips: 8", "espeak_clips: 2"))
    restrict_socs(project, [SOC])  # models/ builds every default chip that runs fp16
    project.result = project.doit(f"loop:stream_encoder-{SOC}", *(f"simverify:stream_{g}-{SOC}"
                                                                 for g in ("encoder", "decoder", "joiner")))
    project.dist = project.doit("dist")
    return project


@pytest.mark.slow
def test_the_npu_search_says_the_cpu_searchs_words_on_clips_it_never_heard(built):
    result = built.result
    assert result.returncode == 0, result.stdout + result.stderr
    rec = built.one_json(f"build/streaming-transducer/stream_encoder/*/fp16/{SOC}/loop/loop.json")
    search = rec["transducer"]
    runs = search["runs"]
    assert len(runs) == 10 and rec["steps"] == 80 and rec["status"] == "passed"
    speech = _module("speech")
    texts = [r["reference_text"] for r in runs]
    assert texts[:8] == [n.replace("_", " ").lower() for n in speech.ALSA_CLIPS]  # the real recordings first
    (wer,) = rec["checks"]
    assert wer["kind"] == "wer" and wer["passed"] and wer["wer_npu"] == wer["wer_cpu"] and wer["samples"] == 10
    assert all(r["identical"] for r in runs) and search["identical_tokens_share"] == 1.0
    assert search["first_difference"] is None and len(search["per_chunk"]["agreement"]) == 80
    from qnn_tasks.judge.speech import word_error_rate

    held = word_error_rate(texts[8:], [r["cpu"]["text"] for r in runs[8:]])
    assert held <= WER_HELD_OUT, [(r["reference_text"], r["cpu"]["text"]) for r in runs[8:]]
    assert Path(built.path(search["plot"])).is_file()
    for graph in ("decoder", "joiner", "encoder"):
        verdict = built.one_json(f"build/streaming-transducer/stream_{graph}/*/fp16/{SOC}/simverify/simverify.json")
        assert verdict["status"] == "passed", verdict


@pytest.mark.slow
def test_the_package_gives_sherpa_onnx_its_three_files_and_they_decode_a_clip(built):
    """What an app does with dist/: read the manifest (schema-validated), take the sherpa_onnx config of its chip,
    open the three files with their provider options, stream a clip's chunks through the encoder (caches fed back,
    zeros at the start) and search greedily: the loop's NPU transcript of that clip."""
    from qnn_tasks.devices import simulator
    from qnn_tasks.ship import manifest as mf

    assert built.dist.returncode == 0, built.dist.stdout + built.dist.stderr
    package = built.path("dist/streaming-transducer")
    data = json.loads((package / "manifest.json").read_text())
    mf.validate(data)
    block = data["sherpa_onnx"]
    (config,) = block["configs"]
    assert config["soc"] == SOC and config["provider"] == "qnn"
    files = [block["tokens"], *config["transducer"].values(), *config["context_binaries"].values(),
             *config["provider_options"].values()]
    for rel in files:
        assert (package / rel).is_file() and rel in data["files"], rel
    assert (package / "tokens.txt").read_text(encoding="utf-8") == (MODEL / "tokens.txt").read_text(encoding="utf-8")
    decoding = block["decoding"]
    assert (decoding["blank_id"], decoding["context_size"], decoding["max_symbols_per_frame"]) == (0, 2, 1)
    symbols = [line.rsplit(maxsplit=1)[0] for line in (package / "tokens.txt").read_text(encoding="utf-8").splitlines()]
    sessions = {role: simulator.open_session(package / path, json.loads((package / config["provider_options"][role])
                                                                       .read_text()), built.path("app.log"), False)
                for role, path in config["transducer"].items()}
    names = block["tensors"]
    export = _module("export")
    ctx = type("Ctx", (), {"options": {"chunks": 8}})()
    states = {s["input"]: np.zeros(s["shape"], np.float32) for s in names["encoder"]["states"]}
    context = [decoding["blank_id"]] * decoding["context_size"]

    def decode(context):
        return sessions["decoder"].run(None, {names["decoder"]["y"]: np.array([context], np.int32)})[0]

    dec, words = decode(context), []
    _, audio = _module("speech").alsa_clips()[0]
    outputs = [o.name for o in sessions["encoder"].get_outputs()]
    for x in export.features(ctx, audio):
        got = dict(zip(outputs, sessions["encoder"].run(None, {names["encoder"]["features"]: x, **states})))
        states = {s["input"]: got[s["output"]] for s in names["encoder"]["states"]}
        for frame in got[names["encoder"]["encoder_out"]][0]:
            logit = sessions["joiner"].run(None, {names["joiner"]["encoder_out"]: frame[None],
                                                  names["joiner"]["decoder_out"]: dec})[0]
            best = int(np.argmax(logit))
            if best != decoding["blank_id"]:
                words.append(symbols[best].lstrip("\u2581"))
                context = context[1:] + [best]
                dec = decode(context)
    rec = built.one_json(f"build/streaming-transducer/stream_encoder/*/fp16/{SOC}/loop/loop.json")
    assert " ".join(words) == rec["transducer"]["runs"][0]["npu"]["text"]
