"""The Whisper tiny.en encoder's w8a16 repair on the x86 HTP simulator, judged by its words (heavy: ~1.2 hours).

Real everything: the packaged CTranslate2 weights, 12 windows of espeak-ng speech (10 Harvard sentences, a quiet and
a loud copy), the ort-qnn quantizer, compiler and simulator, CTranslate2's decoder and jiwer. The encoder alone, at
`precision: w8a16-mixed`, judged by the strictest words check: every one of the 12 transcripts the CPU's.

What it showed (docs/precision.md): plain w8a16 keeps 8 of 12 transcripts while its word error rate falls (0.309
against the CPU's 0.340: it passes the model's own check, that the rate must not rise); the repair ranks all 18
weights, and promoting the top 1, 2, 4 and 8 (up to 40% of the weight bytes) moves the cosine from 0.99945 to
0.99962 but keeps at most 9 of the 12 transcripts, so the repair fails in one line within its budget: the changed
words do not come from the 8-bit weights. This test holds the repair to that: every weight ranked, every step
judged by the words, the failure saying what was tried. Each judged step simulates all 12 thirty-second windows
(~1 min each on a 2-core host), so the test is marked `heavy`, which the suite leaves out (pyproject.toml); run it
with `python3 -m pytest -m heavy tests/test_whisper_repair.py` (passed at `ef28928`: 1 h 22 min wall, ~8 min of it
paused).
"""
from __future__ import annotations

import pytest
from conftest import EXAMPLES, Project, project_with_model

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

WHISPER = "models/whisper-tiny-en/model.yaml"
SOC = "SM8650"
REPAIR = "build/whisper-tiny-en/encoder/*/w8a16-mixed/repair/repair.json"


def encoder_only_w8a16_mixed(project: Project) -> None:
    """The example's encoder alone (crosskv, the decoder, the pipeline and the loop cut off), at w8a16-mixed,
    judged on its 12 windows with every transcript required to stay the CPU's."""
    path = project.path(WHISPER)
    text = path.read_text()
    assert text.count("  crosskv:") == 1, "the example changed: update this test"
    path.write_text(text[:text.index("  crosskv:")])
    project.edit(WHISPER, "    precision: fp16\n",
                 "    precision: w8a16-mixed\n    calibration: {samples: 14, function: calibration}\n")
    project.edit(WHISPER, "      w8a16:                   #", "      w8a16-mixed:             #")
    project.edit(WHISPER, "checks: [{wer: {output: features, max_wer_increase: 0.0, min_identical: 0.0, show: 5}}]",
                 "checks: [{wer: {output: features, max_wer_increase: 0.0, min_identical: 1.0, show: 12}}]")


def check_the_repair(project: Project, returncode: int, output: str) -> None:
    """What the repair of the Whisper encoder must show (run on a real build's records and output)."""
    record = project.one_json(REPAIR)
    assert returncode != 0 and record["status"] == "failed"
    assert ("repair of 'encoder' on SM8650: no promotion within the budget of 6 compiles passes its checks: "
            "promoted 1, 2, 4, 8 of 18 ranked weights") in output
    # every weight ranked: the Gemms the quantizer fused from MatMul + bias included
    assert record["weights"] == 18 and len(record["ranked"]) == 18
    assert {r["op"] for r in record["ranked"]} == {"Conv", "Gemm"}
    steps = record["steps"]
    assert [len(s["promoted"]) for s in steps] == [0, 1, 2, 4, 8] and record["compiles"] == record["budget"] == 6
    for step in steps:  # each judged by the words of all 12 windows: near-lossless by cosine, yet words change
        assert not step["passed"] and step["min_cosine"] > 0.999
        assert [c["kind"] for c in step["checks"]] == ["wer"] and "identical transcripts" in step["violations"][0]
    # plain w8a16 lowers the word error rate while changing transcripts: only the identity check fails it
    assert steps[0]["checks"][0]["value"] < 0
    assert steps[-1]["share"] > 0.10 and steps[-1]["min_cosine"] > steps[0]["min_cosine"]


@pytest.fixture(scope="module")
def repaired(tmp_path_factory) -> Project:
    project = project_with_model(tmp_path_factory.mktemp("whisper-repair") / "project",
                                 EXAMPLES / "speech" / "whisper-tiny-en")
    encoder_only_w8a16_mixed(project)
    project.result = project.doit("-n", "1", f"simverify:encoder-{SOC}", timeout=3 * 3600)
    return project


def test_no_weight_promotion_keeps_every_transcript_and_the_repair_says_so(repaired):
    check_the_repair(repaired, repaired.result.returncode, repaired.result.stdout + repaired.result.stderr)
