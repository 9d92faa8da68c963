"""The task checks that fit dense maps, detectors and recognisers (qnn_tasks/judge/taskchecks.py), and `slice:` on array
checks: their arithmetic on arrays made here, run through verification.judge with options validated by the spec
loader; and the spec errors for their options (one line, the key, the fix). Seconds, no builds."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qnn_tasks.errors import SpecError
from qnn_tasks.judge import taskchecks, verification
from qnn_tasks.modelspec.checkopts import parse_slice, sliced_shape
from qnn_tasks.modelspec.checks import verify_section
from qnn_tasks.modelspec.project import GraphSpec, TensorSpec

YAML = Path("/project/models/m/model.yaml")


def checks(*entries: dict, outputs: dict | None = None, where: Path = YAML) -> dict:
    return verify_section({"checks": list(entries)}, "fp16", outputs or {"y": (1, 8, 7)}, where, "graphs.g.verify")


def graph_of(model_dir: Path, name: str, shape: tuple[int, ...]) -> GraphSpec:
    return GraphSpec(name="g", model="m", model_dir=model_dir, inputs=(TensorSpec("x", (1,), "float32"),),
                     outputs=(TensorSpec(name, shape, "float32"),), precisions=("fp16",), socs=None,
                     export="export", options={}, verify={}, allow_cpu_fallback=False)


def judge(verify: dict, ref: np.ndarray, got: np.ndarray, model_dir: Path = Path("."), name: str = "y") -> dict:
    graph = graph_of(model_dir, name, tuple(ref.shape[1:]))
    result, violations = verification.judge(graph, {**verify, "thresholds": {}, "per_output": {}},
                                            [{name: r} for r in ref], [{name: g} for g in got])
    result["violations"] = violations
    return result


# ================================================================ elements

def test_elements_share_passes_a_map_where_few_pixels_flip():
    rng = np.random.default_rng(0)
    ref = rng.random((2, 1, 100, 100)).astype(np.float32)
    got = ref.copy()
    got[0, 0, :2, :2] = 1 - got[0, 0, :2, :2] + 0.001  # 4 of 20000 pixels cross 0.5 (0.02%)
    flips = int(((ref > 0.5) != (got > 0.5)).sum())
    result = judge(checks({"elements": {"output": "y", "threshold": 0.5, "min": 0.999}},
                          {"agreement": {"output": "y", "threshold": 0.5, "min": 0.99}},
                          outputs={"y": (1, 100, 100)}), ref, got)
    share, whole = result["checks"]
    assert share["passed"] and share["value"] == pytest.approx(1 - flips / 20000) and share["disagreeing_elements"] == flips
    assert not whole["passed"] and whole["value"] == 0.5  # the whole-sample decision fails the same map
    assert result["violations"] == [("check agreement on 'y': 0.5 is below the required 0.99 (share of samples with the "
                                    "same decision at threshold 0.5)")]


def test_elements_tolerance_counts_elements_within_it():
    ref = np.zeros((1, 1, 10), np.float32)
    got = np.array([[[0, 0.01, 0.02, 0.03, 0, 0, 0, 0, 0, 0.5]]], np.float32)
    [result] = judge(checks({"elements": {"output": "y", "tol": 0.02, "min": 0.9}}, outputs={"y": (1, 10)}),
                     ref, got)["checks"]
    assert result["value"] == pytest.approx(0.8) and not result["passed"] and result["worst_sample_share"] == pytest.approx(0.8)


# ================================================================ slices

def test_slice_judges_only_the_score_columns():
    ref = np.zeros((3, 1, 8, 7), np.float32)
    rng = np.random.default_rng(1)
    ref[..., 4:] = rng.random((3, 1, 8, 3))
    got = ref.copy()
    got[..., :4] += 50.0  # the box columns drift: a top1 over whole rows would not notice, a check of them would fail
    verify = checks({"top1": {"output": "y", "slice": "..., 4:", "min": 1.0}},
                    {"elements": {"output": "y", "slice": "[..., :4]", "tol": 1.0, "min": 0.5}})
    scores, boxes = judge(verify, ref, got)["checks"]
    assert scores["passed"] and scores["value"] == 1.0 and scores["slice"] == "..., 4:"
    assert not boxes["passed"] and boxes["value"] == 0.0


@pytest.mark.parametrize("text, shape, left", [
    ("..., 4:", (1, 8, 7), (1, 8, 3)), ("[0, :, 0:2]", (1, 8, 7), (8, 2)), ("..., ::2", (1, 5), (1, 3)),
    ("-1", (4, 2), (2,)), (":, 1:3, ...", (2, 4, 6), (2, 2, 6)),
])
def test_parse_slice_matches_numpy(text, shape, left):
    index = parse_slice(text)
    assert sliced_shape(shape, index) == left == np.zeros(shape)[index].shape


# ================================================================ detection

def boxes_tensor(rows: list[list[float]], total: int = 8, classes: int = 2) -> np.ndarray:
    """[1, total, 4 + classes] rows of cx, cy, w, h, scores; unused rows score 0."""
    out = np.zeros((1, total, 4 + classes), np.float32)
    out[0, : len(rows)] = rows
    return out


def test_nms_keeps_the_best_of_overlapping_boxes_per_class():
    out = boxes_tensor([[50, 50, 20, 20, 0.9, 0], [52, 50, 20, 20, 0.8, 0],   # same class, IoU ~0.82: one kept
                        [52, 50, 20, 20, 0, 0.7],                             # other class: kept
                        [150, 150, 10, 10, 0.2, 0]])                          # below the score threshold
    defaults = checks({"detection": {"output": "y"}}, outputs={"y": (1, 8, 6)})["checks"][0]
    boxes, scores, classes = taskchecks.detections(out[0], defaults)
    assert scores.tolist() == pytest.approx([0.9, 0.7]) and classes.tolist() == [0, 1]
    assert boxes[0].tolist() == [40, 40, 60, 60]


def test_detection_matches_by_class_and_iou():
    cpu = np.stack([boxes_tensor([[50, 50, 20, 20, 0.9, 0], [150, 150, 30, 30, 0, 0.8]]),
                    boxes_tensor([[10, 10, 8, 8, 0.6, 0]])])
    npu = np.stack([boxes_tensor([[51, 50, 20, 20, 0.88, 0], [150, 150, 30, 30, 0.81, 0]]),  # 2nd: class changed
                    boxes_tensor([[10, 10, 8, 8, 0.61, 0], [90, 90, 5, 5, 0.3, 0]])])       # an extra box
    [result] = judge(checks({"detection": {"output": "y", "min": 0.5}}, outputs={"y": (1, 8, 6)}), cpu, npu)["checks"]
    assert (result["cpu_detections"], result["npu_detections"], result["matched"]) == (3, 4, 2)
    assert result["value"] == pytest.approx(2 / 4) and result["passed"] and result["disagreeing_samples"] == [0, 1]


def test_detection_transposed_xyxy_with_objectness():
    rows = np.array([[10, 10, 30, 30, 0.9, 0.1, 0.9], [10, 10, 30, 30, 0.2, 1.0, 0.0]], np.float32)  # obj x class
    out = np.zeros((1, 7, 4), np.float32)
    out[0, :, :2] = rows.T
    verify = checks({"detection": {"output": "y", "transpose": True, "objectness": True, "box_format": "xyxy"}},
                    outputs={"y": (1, 7, 4)})
    boxes, scores, classes = taskchecks.detections(out[0], verify["checks"][0])
    assert scores.tolist() == pytest.approx([0.81]) and classes.tolist() == [1] and boxes[0].tolist() == [10, 10, 30, 30]
    [result] = judge(verify, out[None], out[None])["checks"]
    assert result["value"] == 1.0 and result["matched"] == 1


# ================================================================ CTC text

def logits(path: list[int], classes: int = 5) -> np.ndarray:
    out = np.zeros((1, len(path), classes), np.float32)
    out[0, np.arange(len(path)), path] = 5.0
    return out


def test_ctc_greedy_decode_collapses_repeats_and_drops_blanks():
    assert taskchecks.ctc_decode(logits([1, 1, 0, 1, 2, 2, 0, 0, 3])[0], blank=0, axis=-1) == [1, 1, 2, 3]
    seq_first = np.moveaxis(logits([4, 4, 1, 4]), 1, 0)  # [T, 1, C], blank last
    assert taskchecks.ctc_decode(seq_first, blank=-1, axis=-1) == [1]


def test_ctc_check_with_an_alphabet_file(tmp_path):
    (tmp_path / "keys.txt").write_text("a\nb\n \nc\n")  # classes 1..4 after the blank 0; a line with a space
    cpu = np.stack([logits([1, 0, 2, 3, 4]), logits([4, 4, 0, 4, 0]), logits([2, 2, 2, 0, 0])])  # "ab c", "cc", "b"
    npu = np.stack([logits([1, 0, 2, 3, 4]), logits([4, 4, 4, 4, 0]), logits([2, 2, 2, 0, 0])])  # "ab c", "c", "b"
    verify = checks({"ctc": {"output": "y", "alphabet": "keys.txt", "min": 0.9}}, outputs={"y": (1, 5, 5)},
                    where=tmp_path / "model.yaml")
    result = judge(verify, cpu, npu, model_dir=tmp_path)
    [check] = result["checks"]
    assert check["value"] == pytest.approx(2 / 3) and not check["passed"]
    assert check["differing"] == [{"sample": 1, "cpu": "cc", "npu": "c"}]
    assert check["cer"] == pytest.approx(1 / 7)  # one deletion in 7 CPU characters
    assert result["violations"][0].startswith("check ctc on 'y': 0.6667 of samples decode to the same text, required 0.9;")
    assert "first differing, sample 1: CPU 'cc' vs NPU 'c'" in result["violations"][0]


def test_ctc_without_alphabet_compares_index_strings():
    [check] = judge(checks({"ctc": {"output": "y"}}, outputs={"y": (1, 4, 5)}),
                    np.stack([logits([3, 0, 3, 1])]), np.stack([logits([3, 3, 0, 1])]))["checks"]
    assert check["differing"] == [{"sample": 0, "cpu": "3 3 1", "npu": "3 1"}] and check["cer"] == pytest.approx(1 / 3)


def test_ctc_keeps_the_decoded_strings_when_every_sample_agrees(tmp_path):
    """Issue 35: a user wants to read what was decoded; the record held strings only for differing samples."""
    (tmp_path / "keys.txt").write_text("a\nb\n \nc\n")
    cpu = np.stack([logits([1, 0, 2, 3, 4]), logits([4, 4, 0, 4, 0])])
    verify = checks({"ctc": {"output": "y", "alphabet": "keys.txt", "min": 1.0}}, outputs={"y": (1, 5, 5)},
                    where=tmp_path / "model.yaml")
    [check] = judge(verify, cpu, cpu, model_dir=tmp_path)["checks"]
    assert check["passed"] and check["differing"] == []
    assert check["decoded"] == [{"sample": 0, "cpu": "ab c", "npu": "ab c"}, {"sample": 1, "cpu": "cc", "npu": "cc"}]
    assert "note" not in check


def test_a_ctc_alphabet_of_the_wrong_size_is_a_console_warning_of_simverify(tmp_path):
    """It passed with only a note in the JSON. The blank is the last class here: the alphabet is classes 0..3."""
    from qnn_tasks.judge import sample_store
    from qnn_tasks.run import records
    from qnn_tasks.stages import simverify

    (tmp_path / "keys.txt").write_text("a\nb\nc\n")  # 3 symbols, 4 classes besides the blank
    cpu = np.stack([logits([0, 4, 1, 3])])
    verify = checks({"ctc": {"output": "y", "alphabet": "keys.txt", "blank": -1}}, outputs={"y": (1, 4, 5)},
                    where=tmp_path / "model.yaml")
    sample_store.save(tmp_path / "outputs.npz", [{"y": o} for o in cpu])
    sample_store.save(tmp_path / "reference.npz", [{"y": o} for o in cpu])
    records.write(tmp_path / "simulate.json", {"status": "passed"})
    record = simverify.run(graph_of(tmp_path, "y", (1, 4, 5)), {**verify, "thresholds": {}, "per_output": {}}, tmp_path / "outputs.npz",
                           tmp_path / "reference.npz", tmp_path / "simulate.json", "g-SM8650", "fp16")
    [check] = record["checks"]
    assert check["passed"] and check["decoded"] == [{"sample": 0, "cpu": "ab[3]", "npu": "ab[3]"}]
    assert record["warnings"] == ["ctc on 'y': the alphabet keys.txt has 3 symbols, the output 4 classes besides the "
                                  "blank (class 4), so the decoded text is shifted or cut (fix: one line per class "
                                  "other than the blank, in class order)"]


def test_ctc_steps_and_classes_mirror_a_packages_own_decoding():
    """Issue 35: a package decodes steps 1..19 and classes 1..36 of a [1, 21, 38] output (step 0 a start token, step
    20 an end token, class 37 padding); a ctc check could not say so and judged the tokens it ignores."""
    rng = np.random.default_rng(3)
    text = rng.integers(1, 37, 19)
    cpu = rng.normal(0.0, 0.1, (2, 1, 21, 38)).astype(np.float32)
    cpu[:, 0, np.arange(1, 20), text] = 5.0
    cpu[:, 0, [0, 20], 37] = 9.0              # start and end tokens
    npu = cpu.copy()
    npu[:, 0, 0, 37], npu[:, 0, 0, 5] = 0.0, 9.0  # the NPU differs only on the start token ...
    npu[1, 0, 7, 0] = 6.0                     # ... and on a blank the package's argmax never looks at
    npu[1, 0, 9, 37] = 6.0                    # ... and on a padding class it never looks at either
    mirror = {"output": "y", "steps": "1:20", "classes": "1:37", "min": 1.0}
    [whole] = judge(checks({"ctc": {"output": "y", "min": 1.0}}, outputs={"y": (1, 21, 38)}), cpu, npu)["checks"]
    assert not whole["passed"]
    [check] = judge(checks({"ctc": mirror}, outputs={"y": (1, 21, 38)}), cpu, npu)["checks"]
    assert check["passed"], check
    collapsed = [int(k) for i, k in enumerate(text) if i == 0 or k != text[i - 1]]  # class numbers of the output
    assert check["decoded"][1] == {"sample": 1, "cpu": " ".join(map(str, collapsed)), "npu": " ".join(map(str, collapsed))}
    with pytest.raises(SpecError, match=r"checks\[0\]\.ctc\.classes: '40:' is not a range of classes: it keeps none of "
                                        r"the 38 classes of output 'y' \[1, 21, 38\] \(fix: .*classes: \"1:20\""):
        checks({"ctc": {**mirror, "classes": "40:"}}, outputs={"y": (1, 21, 38)})
    with pytest.raises(SpecError, match=r"ctc\.steps: '1, 2' is not a range of steps: give one start:stop range"):
        checks({"ctc": {**mirror, "steps": "1, 2"}}, outputs={"y": (1, 21, 38)})


def test_edit_distance():
    assert taskchecks.edit_distance("kitten", "sitting") == 3 and taskchecks.edit_distance("", "ab") == 2


# ================================================================ spec errors

SPEC_CASES = [
    ({"elements": {"output": "y", "min": 0.99}}, "graphs.g.verify.checks[0].elements: needs exactly one of tol", "threshold: 0.5"),
    ({"elements": {"output": "y", "tol": 0.1, "threshold": 0.5}}, "needs exactly one of tol", "elements: {output"),
    ({"top1": {"output": "y", "slice": "..., 9:"}}, "checks[0].top1.slice: '..., 9:' leaves nothing of [1, 8, 7] ([1, 8, 0])",
     "keeps some elements"),
    ({"top1": {"output": "y", "slice": "..., a:"}}, ("checks[0].top1.slice: '..., a:' does not slice output 'y' [1, 8, 7]: "
     "'a:' is not an integer"), 'slice: "..., 4:"'),
    ({"top1": {"output": "y", "slice": "0, 0, 0, 0"}}, "4 indices for 3 dims", 'slice: "..., 4:"'),
    ({"detection": {"output": "y", "box_format": "xywh"}}, "checks[0].detection.box_format: unknown box format 'xywh'",
     "cxcywh, xyxy"),
    ({"detection": {"output": "y", "nms_iou": 1.5}}, "checks[0].detection.nms_iou: 1.5 is out of range", "between 0 and 1"),
    ({"ctc": {"output": "y", "alphabet": "../keys.txt"}}, "checks[0].ctc.alphabet: '../keys.txt' leaves the model folder",
     "without '..'"),
    ({"ctc": {"output": "y", "alphabet": "missing.txt"}}, "checks[0].ctc.alphabet: 'missing.txt' is not a file",
     "one symbol per line"),
    ({"ctc": {"output": "y", "blank": 0.5}}, "checks[0].ctc.blank: expected an integer", "whole number"),
]


@pytest.mark.parametrize("check, problem, fix", SPEC_CASES)
def test_check_spec_errors(tmp_path, check, problem, fix):
    with pytest.raises(SpecError) as info:
        checks(check, where=tmp_path / "model.yaml")
    line = str(info.value)
    assert line.startswith(f"{tmp_path / 'model.yaml'}: graphs.g.verify.") and problem in line, line
    assert "(fix: " in line and fix in line.split("(fix: ", 1)[1] and "\n" not in line


def test_detection_needs_score_columns(tmp_path):
    with pytest.raises(SpecError, match=r"checks\[0\].detection: output 'y' \[1, 8, 5\] has 5 columns per box; boxes "
                                        r"need 4 coordinates, objectness and at least one class score"):
        checks({"detection": {"output": "y", "objectness": True}}, outputs={"y": (1, 8, 5)})
    with pytest.raises(SpecError, match=r"output 'y' \[1, 4, 8\] has 4 columns per box.*for \[1, 4 \+ classes, N\] "
                                        r"set transpose: true"):
        checks({"detection": {"output": "y", "transpose": True}}, outputs={"y": (1, 4, 8)})
