"""Unit tests of the comparison maths every verification relies on (fast, no models).

`metrics.compare` / `metrics.violations` judge each output against thresholds; `verification`
adds the task-level checks (`agreement`, `ranking`) and `judge` ties them together for a graph.
All expected values are computed by hand (or with plain numpy formulas) from small arrays.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pytest

from qnn_tasks.judge import metrics, verification
from qnn_tasks.modelspec.load import load_model

# ------------------------------------------------------------------ metrics.compare

def test_compare_known_arrays():
    ref = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    got = np.array([1.0, 2.0, 3.0, 5.0], np.float32)
    m = metrics.compare(ref, got)
    assert m["max_abs"] == pytest.approx(1.0)
    assert m["mean_abs"] == pytest.approx(0.25)
    assert m["cosine"] == pytest.approx(34.0 / math.sqrt(30.0 * 39.0), rel=1e-12)  # <r,g> / |r||g|
    assert m["snr_db"] == pytest.approx(10 * math.log10(30.0 / 1.0), rel=1e-12)   # signal 30, noise 1
    assert m["non_finite"] == 0
    assert m["worst_index"] == [3]


def test_compare_worst_index_is_multidimensional_and_values_are_python_floats():
    ref = np.zeros((3, 2, 4), np.float32)
    got = ref.copy()
    got[2, 1, 3] = -0.5
    got[0, 0, 0] = 0.25
    m = metrics.compare(ref, got)
    assert m["worst_index"] == [2, 1, 3]
    assert m["max_abs"] == pytest.approx(0.5)
    assert m["mean_abs"] == pytest.approx(0.75 / 24)
    assert all(type(m[k]) is float for k in ("max_abs", "mean_abs", "cosine", "snr_db"))


def test_compare_is_computed_in_float64():
    # In float32, 1e8 + 1 == 1e8: a float32 subtraction would report a difference of 0.
    ref = np.array([1e8], np.float64)
    got = np.array([1e8 + 4.0], np.float64)
    assert metrics.compare(ref, got)["max_abs"] == pytest.approx(4.0)
    # float16 actual against float32 reference: the fp16 rounding error is measured, not hidden.
    ref32 = np.array([0.1, 0.2, 0.3], np.float32)
    got16 = ref32.astype(np.float16)
    expected = np.abs(ref32.astype(np.float64) - got16.astype(np.float64)).max()
    assert metrics.compare(ref32, got16)["max_abs"] == pytest.approx(expected, rel=1e-12)
    assert expected > 0


def test_compare_identical_arrays():
    ref = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    m = metrics.compare(ref, ref.copy())
    assert m["max_abs"] == 0.0 and m["mean_abs"] == 0.0
    assert m["snr_db"] == float("inf")
    assert m["cosine"] == pytest.approx(1.0, abs=1e-12)
    assert m["non_finite"] == 0


def test_compare_zero_and_opposite_signals():
    zeros = np.zeros(4)
    both_zero = metrics.compare(zeros, zeros)
    assert both_zero["cosine"] == 1.0 and both_zero["snr_db"] == float("inf")
    ref_zero = metrics.compare(zeros, np.ones(4))
    assert ref_zero["cosine"] == 0.0 and ref_zero["snr_db"] == float("-inf")
    got_zero = metrics.compare(np.ones(4), zeros)
    assert got_zero["cosine"] == 0.0 and got_zero["snr_db"] == pytest.approx(0.0)  # noise == signal
    flipped = metrics.compare(np.array([1.0, -2.0]), np.array([-1.0, 2.0]))
    assert flipped["cosine"] == pytest.approx(-1.0)
    assert flipped["snr_db"] == pytest.approx(10 * math.log10(5.0 / 20.0))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_compare_counts_non_finite_and_reports_first_index(bad):
    ref = np.ones((2, 3, 4), np.float32)
    got = ref.copy()
    got[1, 2, 0] = bad
    got[1, 2, 3] = bad
    got[0, 1, 2] = bad  # first in C order
    m = metrics.compare(ref, got)
    assert m["non_finite"] == 3
    assert m["first_non_finite"] == [0, 1, 2]
    assert m["max_abs"] == float("inf")
    assert m["snr_db"] == float("-inf")


# ------------------------------------------------------------------ metrics.violations

def test_violations_name_output_metric_value_and_threshold():
    ref = np.array([1.0, 2.0, 3.0, 4.0])
    got = np.array([1.0, 2.0, 3.0, 5.0])  # max_abs 1, mean_abs 0.25, cosine 0.99398, snr 14.77 dB
    m = metrics.compare(ref, got)
    lines = metrics.violations("speech", m, {"max_abs": 0.5, "mean_abs": 0.1, "min_cosine": 0.999,
                                             "min_snr_db": 25.0})
    assert lines == [
        "output 'speech': max_abs = 1 is above the threshold 0.5",
        "output 'speech': mean_abs = 0.25 is above the threshold 0.1",
        f"output 'speech': cosine = {m['cosine']:.6g} is below the threshold 0.999",
        f"output 'speech': snr_db = {m['snr_db']:.6g} is below the threshold 25",
    ]


def test_violations_empty_when_within_thresholds_and_at_the_limit():
    ref = np.array([1.0, 2.0, 3.0, 4.0])
    got = np.array([1.0, 2.0, 3.0, 5.0])
    m = metrics.compare(ref, got)
    # a threshold equal to the value is met (max: value <= limit, min: value >= limit)
    assert metrics.violations("y", m, {"max_abs": 1.0, "mean_abs": 0.25, "min_cosine": m["cosine"],
                                       "min_snr_db": m["snr_db"]}) == []
    assert metrics.violations("y", m, {"max_abs": 0.999}) == ["output 'y': max_abs = 1 is above the threshold 0.999"]
    same = metrics.compare(ref, ref)
    assert metrics.violations("y", same, {"min_cosine": 0.999999, "min_snr_db": 200.0, "max_abs": 0.0}) == []


def test_violations_for_non_finite_outputs_mention_nan_inf_and_index():
    ref = np.zeros((2, 3))
    got = ref.copy()
    got[1, 2] = np.nan
    lines = metrics.violations("logits", metrics.compare(ref, got), {"max_abs": 1.0, "min_cosine": 0.9})
    # one line, not one per (meaningless) metric
    assert lines == ["output 'logits': 1 NaN/Inf values (first at index [1, 2])"]


def test_nan_in_reference_is_not_a_silent_pass():
    # Reachable in cpucheck, which compares the ORIGINAL model's outputs (reference) with the
    # simplified graph's (actual): an original model emitting NaN would pass any tolerance.
    ref = np.array([0.0, np.nan, 1.0])
    got = np.array([0.0, 0.5, 1.0])
    m = metrics.compare(ref, got)
    assert metrics.violations("y", m, {"max_abs": 1e-3, "min_cosine": 0.9999}) != []


# ------------------------------------------------------------------ verification checks

def test_agreement_passes_when_decisions_match():
    ref = np.array([0.9, 0.1, 0.6, 0.2]).reshape(4, 1, 1)
    got = np.array([0.7, 0.3, 0.55, 0.45]).reshape(4, 1, 1)  # different values, same side of 0.5
    r = verification.agreement(ref, got, {"output": "p", "threshold": 0.5, "min": 1.0})
    assert r["passed"] is True and r["value"] == 1.0 and r["disagreeing_samples"] == []
    assert r["kind"] == "agreement" and r["output"] == "p" and "0.5" in r["meaning"]


def test_agreement_fails_on_a_flipped_decision():
    ref = np.array([0.9, 0.1, 0.6, 0.2]).reshape(4, 1, 1)
    got = np.array([0.8, 0.2, 0.4, 0.1]).reshape(4, 1, 1)  # sample 2 flips from speech to silence
    r = verification.agreement(ref, got, {"output": "p", "threshold": 0.5, "min": 0.99})
    assert r["value"] == pytest.approx(0.75)
    assert r["passed"] is False and r["min"] == 0.99
    assert r["disagreeing_samples"] == [2]
    # the decision threshold is the check's own: at 0.3, 0.6 and 0.4 are both "speech"
    r = verification.agreement(ref, got, {"output": "p", "threshold": 0.3, "min": 0.99})
    assert r["disagreeing_samples"] == [] and r["passed"] is True and r["value"] == 1.0


def test_agreement_over_multi_value_outputs_needs_every_value_to_agree():
    ref = np.array([[0.9, 0.1], [0.9, 0.1]])
    got = np.array([[0.9, 0.1], [0.9, 0.6]])
    r = verification.agreement(ref, got, {"output": "p"})  # defaults: threshold 0.5, min 0.99
    assert r["value"] == 0.5 and r["disagreeing_samples"] == [1] and r["passed"] is False


def _embeddings():
    # Four unit-ish vectors: 0's nearest is 1, 1's is 0, 2's is 3, 3's is 2.
    return np.array([[1.0, 0.0, 0.0], [0.9, 0.2, 0.0], [0.0, 1.0, 0.1], [0.0, 0.9, 0.4]])


def test_ranking_passes_when_nearest_neighbours_are_unchanged():
    ref = _embeddings()
    got = ref * 3.0 + np.random.default_rng(1).normal(0, 1e-4, ref.shape)  # scale and small noise
    r = verification.ranking(ref.reshape(4, 1, 3), got.reshape(4, 1, 3), {"output": "e", "top": 1, "min": 1.0})
    assert r["passed"] is True and r["value"] == 1.0 and r["disagreeing_samples"] == []


def test_ranking_fails_on_a_swapped_nearest_neighbour():
    ref = _embeddings()
    got = ref.copy()
    got[2] = [0.85, 0.3, 0.0]  # sample 2 now sits right next to sample 0 and 1
    r = verification.ranking(ref, got, {"output": "e", "top": 1, "min": 1.0})
    assert r["passed"] is False
    assert 2 in r["disagreeing_samples"]
    # independent recomputation of the top-1 neighbour with plain numpy
    def nearest(x):
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        s = x @ x.T
        np.fill_diagonal(s, -np.inf)
        return s.argmax(axis=1)
    changed = np.flatnonzero(nearest(ref) != nearest(got))
    assert r["disagreeing_samples"] == changed.tolist()
    assert r["value"] == pytest.approx(1 - len(changed) / 4)


def test_ranking_top_k_looks_past_the_first_neighbour():
    # Sample 0 keeps its nearest neighbour (1) but its second one changes from 2 to 3:
    # top 1 does not see it, top 2 does.
    ref = np.array([[1.0, 0.0], [0.99, 0.141], [0.8, 0.6], [0.0, 1.0]])
    got = np.array([[1.0, 0.0], [0.99, 0.141], [0.2, 0.98], [0.7, 0.714]])
    top1 = verification.ranking(ref, got, {"output": "e", "top": 1, "min": 1.0})
    top2 = verification.ranking(ref, got, {"output": "e", "top": 2, "min": 1.0})
    assert 0 not in top1["disagreeing_samples"]
    assert 0 in top2["disagreeing_samples"] and top2["passed"] is False
    assert top2["meaning"].startswith("share of samples whose 2 nearest")


def test_top1_names_the_first_differing_prediction_and_both_classes():
    """A decoder loop's steps as samples of [1, 1, vocab] logits: step 2 is the first whose argmax differs."""
    ref = np.zeros((4, 1, 1, 6), np.float32)
    got = np.zeros((4, 1, 1, 6), np.float32)
    for step, (cpu, npu) in enumerate([(1, 1), (3, 3), (5, 0), (2, 4)]):
        ref[step, 0, 0, cpu] = got[step, 0, 0, npu] = 1.0
    result = verification.top1(ref, got, {"output": "logits", "min": 1.0})
    assert result["disagreeing_samples"] == [2, 3] and result["value"] == 0.5
    assert result["first_difference"] == {"sample": 2, "cpu": 5, "npu": 0}
    assert "first_difference" not in verification.top1(ref, ref, {"output": "logits", "min": 1.0})


# ------------------------------------------------------------------ verification.judge

TOY_MODEL = """\
licence: MIT
source: {file: toy.onnx}
graphs:
  toy:
    inputs: {x: {shape: [1, 4], dtype: float32}}
    outputs: {p: {shape: [1, 1]}, h: {shape: [1, 4]}}
    verify:
%s
"""


def _graph(tmp_path: Path, verify_yaml: str):
    """A GraphSpec loaded by the real spec loader from a toy model.yaml; returns (graph, verify settings)."""
    model_dir = tmp_path / "toy"
    model_dir.mkdir()
    (model_dir / "model.yaml").write_text(TOY_MODEL % textwrap.indent(textwrap.dedent(verify_yaml).strip(), " " * 6))
    (model_dir / "export.py").write_text("def export(ctx):\n    pass\n")
    graph = load_model(model_dir, {}).graphs[0]
    verify = graph.verify if "thresholds" in graph.verify else graph.verify[graph.precision]
    return graph, verify


def _samples(p, h):
    return [{"p": np.array([[pi]], np.float32), "h": np.asarray(hi, np.float32).reshape(1, 4)} for pi, hi in zip(p, h)]


def test_judge_pass_and_fail_with_per_output_thresholds_and_checks(tmp_path):
    graph, verify = _graph(tmp_path, """
        thresholds: {min_cosine: 0.999}
        per_output: {p: {max_abs: 0.05}}
        checks:
          - agreement: {output: p, threshold: 0.5, min: 0.99}
    """)
    h = np.random.default_rng(2).standard_normal((3, 4))
    reference = _samples([0.9, 0.1, 0.7], h)
    close = _samples([0.89, 0.12, 0.69], h + 1e-4)
    result, violations = verification.judge(graph, verify, reference, close)
    assert violations == []
    assert set(result["metrics"]) == {"p", "h"}
    # fp16 defaults (min_snr_db 25) + the graph's thresholds + the output's own
    assert result["metrics"]["p"]["thresholds"] == {"min_cosine": 0.999, "min_snr_db": 25.0, "max_abs": 0.05}
    assert result["metrics"]["h"]["thresholds"] == {"min_cosine": 0.999, "min_snr_db": 25.0}
    assert result["metrics"]["p"]["max_abs"] == pytest.approx(0.02, abs=1e-6)
    assert result["checks"][0]["passed"] is True

    flipped = _samples([0.9, 0.1, 0.3], h + 1e-4)  # sample 2: 0.7 -> 0.3
    result, violations = verification.judge(graph, verify, reference, flipped)
    assert result["checks"][0]["passed"] is False
    assert any(v.startswith("output 'p': max_abs = 0.4 is above the threshold 0.05") for v in violations), violations
    assert any(v.startswith("check agreement on 'p': 0.6667 is below the required 0.99") for v in violations), violations
    assert not any("'h'" in v for v in violations)


def test_judge_reports_nan_in_an_output_with_its_index(tmp_path):
    graph, verify = _graph(tmp_path, "thresholds: {}")
    h = np.ones((3, 4))
    reference = _samples([0.9, 0.1, 0.7], h)
    bad_h = h.copy()
    bad_h[1, 2] = np.nan
    result, violations = verification.judge(graph, verify, reference, _samples([0.9, 0.1, 0.7], bad_h))
    assert result["metrics"]["h"]["non_finite"] == 1
    assert result["metrics"]["h"]["first_non_finite"] == [1, 0, 2]  # sample 1, then the [1, 4] tensor index
    assert violations == ["output 'h': 1 NaN/Inf values (first at index [1, 0, 2])"]


def test_the_docs_detector_top1_judges_boxes_not_background_noise():
    """Issue 35: docs/samples.md's `top1` on a YOLO-style [1, 84, 8400] head scored 0.18 on a real detector (the
    argmax of 80 near-zero background scores is rounding noise) while `detection` matched 3 of 3. The head here:
    box rows, then class logits sigmoid(W x - 9) that tie to 1e-3 for every class on background candidates; three
    candidates are confident for one class each. The NPU side is the same arithmetic in fp16, as HTP computes it."""
    import yaml

    from qnn_tasks.judge import taskchecks

    rng = np.random.default_rng(35)
    classes, candidates, features = 80, 8400, 8
    weights = 1e-3 * rng.standard_normal((classes, features))
    weights[[5, 17, 42], [1, 2, 3]] = 12.0  # feature k + 1 makes candidate k a box of class 5, 17 or 42
    x = rng.standard_normal((features, candidates))
    x[1:4] = 0.0
    boxes = np.tile([[320.0], [320.0], [40.0], [40.0]], (1, candidates))
    for k, column in enumerate((7, 4107, 8007)):
        x[1 + k, column] = 1.0
        boxes[:, column] = [100.0 + 150 * k, 200.0, 60.0, 80.0]

    def head(dtype):
        logits = weights.astype(dtype) @ x.astype(dtype) - dtype(9.0)
        scores = dtype(1.0) / (dtype(1.0) + np.exp(-logits))
        return np.concatenate([boxes, scores.astype(np.float64)])[None, None].astype(np.float32)  # [1, 84, 8400] each

    cpu, npu = head(np.float32), head(np.float16)
    docs = (Path(__file__).resolve().parent.parent / "docs" / "samples.md").read_text()
    example = docs[docs.index("# models/detector/model.yaml"):]
    spec = yaml.safe_load(example[:example.index("```")])
    from qnn_tasks.modelspec.checkopts import parse_slice
    from qnn_tasks.modelspec.checks import verify_section

    verify = verify_section(spec["graphs"]["detector"]["verify"], "fp16", {"output0": (1, 84, 8400)},
                            Path("docs/samples.md"), "graphs.detector.verify")  # the loader's defaults filled in
    checks = {c["kind"]: {k: v for k, v in c.items() if k != "kind"} for c in verify["checks"]}
    top1 = checks["top1"]
    index = (slice(None),) + parse_slice(top1["slice"])
    judged = verification.top1(cpu[index], npu[index], top1)
    assert judged["passed"] and judged["value"] == 1.0 and judged["counted"] == 3 and judged["ignored"] == candidates - 3
    # without the threshold the same outputs fail on background noise
    noise = verification.top1(cpu[index], npu[index], {k: v for k, v in top1.items() if k != "score_threshold"})
    assert not noise["passed"] and noise["value"] < 0.5, noise["value"]
    found = taskchecks.detection(cpu, npu, checks["detection"])
    assert found["passed"] and found["value"] == 1.0
    # nothing above the threshold on either side: nothing compared, which is not a pass
    empty = verification.top1(cpu[index] * 0, npu[index] * 0, top1)
    assert not empty["passed"] and "no prediction scores 0.25 or more" in empty["failure"]


def test_judge_refuses_outputs_that_verify_nothing(tmp_path):
    """All-zero outputs on both sides pass every threshold (cosine 1.0, max-abs 0): the verdict is "not verified"
    with the reason, not a pass; so is an output that is the same for every sample (a glue that multiplies by 0)."""
    graph, verify = _graph(tmp_path, "thresholds: {min_cosine: 0.999}")
    zeros = _samples([0.0, 0.0, 0.0], np.zeros((3, 4)))
    result, violations = verification.judge(graph, verify, zeros, [dict(s) for s in zeros])
    assert result["metrics"]["h"]["cosine"] == 1.0  # what every threshold saw
    assert violations[0].startswith("not verified: output 'p' is all zero; output 'h' is all zero over 3 sample(s)")
    assert result["not_verified"] == violations[0] and "(fix: samples that make the outputs vary)" in violations[0]
    same = _samples([0.3, 0.3, 0.3], np.tile([1.0, 2.0, 3.0, 4.0], (3, 1)))
    result, violations = verification.judge(graph, verify, same, same)
    assert result["degenerate"] == {"p": "the one value 0.3", "h": "the same for all 3 samples"}
    assert violations and violations[0].startswith("not verified")
    # one output that varies verifies something: the constant one is named, the verdict stands
    varied = _samples([0.1, 0.5, 0.9], np.tile([1.0, 2.0, 3.0, 4.0], (3, 1)))
    result, violations = verification.judge(graph, verify, varied, varied)
    assert violations == [] and result["degenerate"] == {"h": "the same for all 3 samples"}
