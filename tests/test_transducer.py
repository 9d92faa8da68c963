"""A streaming transducer's decoding declared in model.yaml (`loop.run_steps`, `loop.transducer`): the schema and
its bad values, and a tiny transducer built in code (tests/tiny_transducer.py) run through the loop on the HTP
simulator — encoder, decoder and joiner binaries, the caches and the decoder's context carried by the NPU's own
outputs — with the same tokens as the greedy search on the CPU."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tiny_transducer as tiny

from qnn_tasks.errors import SpecError, StageError

YAML = "models/tx/model.yaml"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    project, models = tiny.transducer_project(tmp_path_factory.mktemp("transducer") / "project")
    project.result = project.doit("loop:stream_encoder-SM8650")
    project.models = models
    return project


def loop_record(project) -> dict:
    return project.one_json("build/tx/stream_encoder/*/fp16/SM8650/loop/loop.json")


def test_the_three_binaries_on_the_simulator_emit_the_cpu_searchs_tokens(built):
    assert built.result.returncode == 0, built.result.stdout + built.result.stderr
    assert {"context:stream_decoder-SM8650", "context:stream_joiner-SM8650"} <= built.result.executed
    rec = loop_record(built)
    expected, margin = tiny.reference_search(built.models, tiny.chunks())
    assert margin > 0.5 and all(expected) and sum(map(len, expected)) < tiny.RUNS * tiny.RUN_STEPS * tiny.T_OUT
    search = rec["transducer"]
    assert [r["npu"]["tokens"] for r in search["runs"]] == expected  # some blank frames, some tokens, fp16 on HTP
    assert [r["cpu"]["tokens"] for r in search["runs"]] == expected  # the tool's CPU search is the search written out
    assert [r["npu"]["text"] for r in search["runs"]] == [tiny.text(t) for t in expected] == ["bb a", "ed"]
    assert search["identical_tokens_share"] == 1.0 and search["first_difference"] is None
    assert search["compared_frames"] == tiny.RUNS * tiny.RUN_STEPS * tiny.T_OUT == len(search["per_frame"]["max_abs"])
    assert 0 < max(search["per_frame"]["max_abs"]) < margin / 2  # the NPU's logits differ, never by the margin
    assert search["joiner_calls"] == 12 and search["decoder_calls"] == sum(map(len, expected)) + tiny.RUNS
    assert rec["status"] == "passed" and rec["run_steps"] == tiny.RUN_STEPS and rec["steps"] == 6
    assert [(r["first"], r["steps"]) for r in rec["runs"]] == [(0, 3), (3, 3)]
    (wer,) = rec["checks"]
    assert wer["kind"] == "wer" and wer["passed"] and wer["wer_cpu"] == wer["wer_npu"] > 0  # texts have one word more
    assert wer["identical_share"] == 1.0 and wer["judged"] == "per run"
    # the NPU carried its caches: step 0 of each run from zeros, the next from the NPU's own new_cached_x
    npu, cpu = np.load(built.path(rec["outputs_file"])), np.load(built.path(rec["reference_file"]))
    assert npu["new_cached_x"].shape == (6, 1, tiny.LEFT, tiny.FEAT)
    assert np.abs(npu["encoder_out"] - cpu["encoder_out"]).max() > 0  # two searches, each on its own numbers


def test_the_fixtures_encoder_reads_its_cache(built):
    """The fixture is sensitive to the cache: a chunk's first frame with the carried cache is not the one with zeros
    (so tokens that match the reference search mean the loop fed the caches back)."""
    import onnxruntime as ort

    stream = tiny.chunks()

    encoder = ort.InferenceSession(built.models["encoder"].SerializeToString(), providers=["CPUExecutionProvider"])
    zero = np.zeros((1, tiny.LEFT, tiny.FEAT), np.float32)
    carried = encoder.run(None, {"x": stream[1], "cached_x": encoder.run(None, {"x": stream[0], "cached_x": zero})[1]})
    cold = encoder.run(None, {"x": stream[1], "cached_x": zero})
    assert np.abs(carried[0][:, 0] - cold[0][:, 0]).max() > 0.1  # frame 0 of a chunk reads the cache


def _failing_search(tokens_npu: list[list[int]]) -> list[dict]:
    """Two runs' searches as stages/transducer.search returns them, the CPU's fixed, the NPU's given."""
    cpu = [[[2], [], [1]], [[5], [4], []]]

    def side(per_frame):
        tokens = [t for f in per_frame for t in f]
        return {"tokens": tokens, "token_frames": [i for i, f in enumerate(per_frame) for _ in f],
                "per_frame": per_frame, "scores": np.ones((len(per_frame), 6), np.float32),
                "calls": {"decoder": 1, "joiner": 3}, "seconds": {"decoder": 0.0, "joiner": 0.0}}

    return [{"first": 3 * i, "cpu": side(c), "npu": side(n)} for i, (c, n) in enumerate(zip(cpu, tokens_npu))]


def test_the_first_differing_frame_and_token_are_named(tmp_path):
    """compare() on two searches that part at run 1, frame 1 (step 3 + 1 // 2): the frame, the step, the token
    position and both choices, by their symbols; without a wer check the different tokens fail the loop."""
    from qnn_tasks.modelspec.load import load_model, load_socs
    from qnn_tasks.stages import transducer

    project, _ = tiny.transducer_project(tmp_path / "project")
    project.edit(YAML, "    checks:\n      - wer: {output: tokens, min_identical: 1.0}\n", "")
    model = load_model(project.path("models/tx"), load_socs(project.path("socs/socs.yaml")))
    settings = model.loop.settings("fp16")
    runs = _failing_search([[[2], [], [1]], [[5], [3], []]])
    record, checks, violations = transducer.compare(model.graphs[0], settings["transducer"], runs,
                                                    settings["verify"]["checks"], tiny.T_OUT, "x: loop.transducer")
    first = record["first_difference"]
    assert (first["run"], first["frame"], first["step"]) == (1, 1, 3) and checks == []
    assert first["npu"]["tokens"] == [3] and first["cpu"]["symbols"] == ["d"] and first["npu"]["token_index"] == 1
    assert record["identical_tokens_share"] == 5 / 6 and record["identical_runs_share"] == 0.5
    assert violations == ["the searches emitted different tokens over 2 run(s) (identical at 83.3% of frames)"]
    line = transducer.difference_line(first)
    assert "run 1 at frame 1 (step 3, token 1): NPU 3 '▁c', CPU 4 'd'" in line, line


@pytest.mark.parametrize("tokens, fragment", [
    ("<blk> 0\na 1\n", "gives 2 ids, the joiner scores 6 symbols"),
    ("<blk> 0\na 0\n", "tokens.txt:2: 'a 0' is not `<symbol> <id>`"),
    ("<blk>\n", "tokens.txt:1: '<blk>' is not"),
])
def test_a_bad_tokens_file_is_one_line(tmp_path, tokens, fragment):
    from qnn_tasks.stages import transducer

    (tmp_path / "tokens.txt").write_text(tokens)
    with pytest.raises(StageError) as info:
        transducer.read_tokens(tmp_path / "tokens.txt", 6, "models/tx/model.yaml: loop.transducer")
    assert fragment in str(info.value) and "(fix: " in str(info.value) and "\n" not in str(info.value)


TX = "  transducer:\n"
BAD = [
    (("frames: encoder_out", "frames: encoder_outs"), "loop.transducer.frames", "not an output of graph"),
    (("frames: encoder_out", "frames: new_cached_x"), "loop.transducer.joiner",  # [1, T, J], the wrong J
     "input 'encoder_out' of 'stream_joiner' is [1, 16], one frame of 'new_cached_x' is [1, 8]"),
    (("decoder: stream_decoder", "decoder: stream_encoder"), "loop.transducer.decoder", "not another graph"),
    (("decoder: stream_decoder", "decoder: nothing"), "loop.transducer.decoder", "one of stream_decoder"),
    (("joiner: stream_joiner", "joiner: stream_decoder"), "loop.transducer.joiner", "is the decoder too"),
    (("decoder: stream_decoder\n    joiner: stream_joiner", "decoder: stream_joiner\n    joiner: stream_decoder"),
     "loop.transducer.decoder", "has 2 input(s) and 1 output(s)"),
    (("y: {shape: [1, 2], dtype: int32}", "y: {shape: [1, 2], dtype: float32}"), "loop.transducer.decoder",
     "int32, or int64"),
    (("blank: 0", "blank: 6"), "loop.transducer.blank", None),
    (("blank: 0", "blank: -1"), "loop.transducer.blank", None),
    (("max_symbols: 1", "max_symbols: 0"), "loop.transducer.max_symbols", None),
    (("max_symbols: 1", "max_symbols: 33"), "loop.transducer.max_symbols", None),
    (("tokens: tokens.txt", "tokens: ../tokens.txt"), "loop.transducer.tokens", "leaves the model folder"),
    (("tokens: tokens.txt", "tokens: vocab.txt"), "loop.transducer.tokens", "is not a file in"),
    (("    tokens: tokens.txt\n", ""), "loop.transducer.tokens", "missing"),
    (("    blank: 0\n", "    blank: 0\n    beam: 4\n"), "loop.transducer.beam", None),
    (("run_steps: 3", "run_steps: 0"), "loop.run_steps", None),
    (("run_steps: 3", "run_steps: 3\n  steps: 4"), "loop.steps", "not a whole number of runs of 3"),
    (("run_steps: 3", "run_steps: 3\n  step: step"), "loop.run_steps", "a step function decides"),
    (("  run_steps: 3\n", ""), None, None),  # no run_steps: one run of the whole stream (valid)
    (("min_identical: 1.0}", "min_identical: 1.0}\n      - top1: {output: tokens}"), "loop.verify.checks[1].top1",
     "judged by words only"),
    (("    checks:\n", "    per_output: {tokens: {max_abs: 1}}\n    checks:\n"), "loop.verify.per_output.tokens",
     "symbols, not numbers"),
    (("    socs: [SM8650]\n  stream_joiner:", "    socs: [SM8750]\n  stream_joiner:"), "loop.transducer.decoder",
     "the encoder's precision and socs"),
]


@pytest.mark.parametrize("edit, key, fragment", BAD)
def test_a_bad_transducer_declaration_is_one_line_naming_the_key(tmp_path, edit, key, fragment):
    from qnn_tasks.modelspec.load import load_model, load_socs

    project, _ = tiny.transducer_project(tmp_path / "project")
    project.edit(YAML, *edit)
    socs = load_socs(project.path("socs/socs.yaml"))
    if key is None:
        assert load_model(project.path("models/tx"), socs).loop.run_steps is None
        return
    with pytest.raises(SpecError) as info:
        load_model(project.path("models/tx"), socs)
    line = str(info.value)
    assert "\n" not in line and f"{project.path(YAML)}: {key}: " in line and "(fix: " in line, line
    assert fragment is None or fragment in line, line


def test_tokens_without_a_transducer_and_texts_without_export_py_are_refused(tmp_path):
    from qnn_tasks.modelspec.load import load_model, load_socs

    project, _ = tiny.transducer_project(tmp_path / "project")
    socs = load_socs(project.path("socs/socs.yaml"))
    project.path("models/tx/export.py").unlink()
    with pytest.raises(SpecError, match=r"loop.verify.checks\[0\].wer: judges the search's transcripts against "
                                        r"texts\(ctx\).*\(fix: define texts\(ctx\)"):
        load_model(project.path("models/tx"), socs)
    text = project.path(YAML).read_text()
    start, end = text.index("  run_steps:"), text.index("  verify:")
    project.path(YAML).write_text(text[:start] + text[end:])
    with pytest.raises(SpecError, match=r"loop.verify.checks\[0\].wer: 'tokens' is the output of a transducer's "
                                        r"search, and this loop has none"):
        load_model(project.path("models/tx"), socs)


def test_doit_list_names_the_bad_declaration_and_builds_the_rest(tmp_path):
    project, _ = tiny.transducer_project(tmp_path / "project")
    project.edit(YAML, "blank: 0", "blank: 9")
    result = project.doit("list")
    assert result.returncode == 0 and "spec " in result.stdout, result.stdout + result.stderr
    line = result.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line and f"{project.path(YAML)}: loop.transducer.blank" in line
    json.dumps(line)
