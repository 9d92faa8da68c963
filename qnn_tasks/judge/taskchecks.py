"""Task checks that fit dense maps, detectors and text recognisers (registered in verification.CHECKS).

- `elements`: the share of all output elements on which CPU and NPU agree (|cpu - npu| <= tol, or the
  same side of a threshold): a segmentation or text-detection map where 0.04% of pixels flip passes
  at `min: 0.999`, while a whole-sample `agreement` fails it.
- `detection`: boxes after score threshold and per-class NMS, CPU vs NPU matched one to one by class
  and IoU; the share matched of the larger set.
- `ctc`: greedy CTC decoding (argmax, repeats collapsed, blanks dropped) of CPU and NPU outputs; the
  share of identical strings, with the character error rate of the NPU strings against the CPU's.

Each takes the stacked outputs (sample axis first) and its validated options (modelspec/checks.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks.errors import StageError

MAX_CANDIDATES = 3000  # boxes kept for NMS per sample, by score: bounded time on any output


def elements(ref: np.ndarray, got: np.ndarray, check: dict[str, Any]) -> dict[str, Any]:
    if "tol" in check:
        same = np.abs(ref.astype(np.float64) - got.astype(np.float64)) <= float(check["tol"])
        meaning = f"share of elements with |CPU - NPU| <= {check['tol']}"
    else:
        threshold = float(check["threshold"])
        same = (ref > threshold) == (got > threshold)
        meaning = f"share of elements on the same side of {threshold} on CPU and NPU"
    per_sample = same.reshape(len(same), -1).mean(axis=1)
    value, required = float(same.mean()), float(check["min"])
    return {"kind": "elements", "output": check["output"], "value": value, "min": required, "passed": value >= required,
            "meaning": meaning, "elements": int(same.size), "disagreeing_elements": int(same.size - same.sum()),
            "worst_sample_share": float(per_sample.min()),
            "disagreeing_samples": [int(i) for i in np.flatnonzero(per_sample < required)][:20]}


# ---------------------------------------------------------------- detection

def detections(output: np.ndarray, check: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes [n, 4] as x1 y1 x2 y2, scores [n], classes [n]) of one sample after threshold and per-class NMS."""
    rows = np.swapaxes(output, -1, -2) if check["transpose"] else output
    rows = rows.reshape(-1, rows.shape[-1]).astype(np.float64)
    boxes, scores = rows[:, :4], rows[:, 4:]
    if check["objectness"]:
        scores = scores[:, :1] * scores[:, 1:]
    classes, best = scores.argmax(axis=1), scores.max(axis=1)
    keep = np.flatnonzero(best >= float(check["score_threshold"]))
    keep = keep[np.argsort(-best[keep], kind="stable")][:MAX_CANDIDATES]
    boxes, best, classes = boxes[keep], best[keep], classes[keep]
    if check["box_format"] == "cxcywh":
        boxes = np.concatenate([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], axis=1)
    chosen = []
    for label in np.unique(classes):
        index = np.flatnonzero(classes == label)  # already by score, highest first
        while len(index):
            chosen.append(index[0])
            index = index[1:][iou(boxes[index[0]], boxes[index[1:]]) <= float(check["nms_iou"])]
    chosen = sorted(chosen, key=lambda i: -best[i])[: int(check["max_detections"])]
    return boxes[chosen], best[chosen], classes[chosen]


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Intersection over union of one x1y1x2y2 box with each of `others`."""
    low, high = np.maximum(box[:2], others[:, :2]), np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(high - low, 0.0, None), axis=1)
    union = _area(box) + _area(others) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _area(boxes: np.ndarray) -> np.ndarray:
    return np.prod(np.clip(boxes[..., 2:] - boxes[..., :2], 0.0, None), axis=-1)


def match(a: tuple, b: tuple, min_iou: float) -> int:
    """Detections of `a` matched one to one with `b`'s of the same class at IoU >= min_iou (greedy, by a's score)."""
    used = np.zeros(len(b[0]), bool)
    matched = 0
    for box, label in zip(a[0], a[2]):
        candidates = np.flatnonzero((b[2] == label) & ~used)
        if not len(candidates):
            continue
        overlaps = iou(box, b[0][candidates])
        if overlaps.max() >= min_iou:
            used[candidates[int(overlaps.argmax())]] = True
            matched += 1
    return matched


def detection(ref: np.ndarray, got: np.ndarray, check: dict[str, Any]) -> dict[str, Any]:
    cpu_total = npu_total = matched_total = 0
    differing = []
    for i in range(len(ref)):
        cpu, npu = detections(ref[i], check), detections(got[i], check)
        matched = match(cpu, npu, float(check["match_iou"]))
        cpu_total, npu_total, matched_total = cpu_total + len(cpu[0]), npu_total + len(npu[0]), matched_total + matched
        if matched < max(len(cpu[0]), len(npu[0])):
            differing.append(i)
    larger = max(cpu_total, npu_total)
    value, required = (matched_total / larger if larger else 1.0), float(check["min"])
    return {"kind": "detection", "output": check["output"], "value": value, "min": required, "passed": value >= required,
            "meaning": (f"share of detections (score >= {check['score_threshold']}, NMS at IoU {check['nms_iou']}) "
                        f"matched between CPU and NPU by class and IoU >= {check['match_iou']}"),
            "cpu_detections": cpu_total, "npu_detections": npu_total, "matched": matched_total,
            "disagreeing_samples": differing[:20]}


# ---------------------------------------------------------------- CTC text

def ctc_decode(output: np.ndarray, blank: int, axis: int, steps: slice | None = None,
               classes: slice | None = None) -> list[int]:
    """Greedy CTC: the best class per time step, repeats collapsed, blanks dropped. `steps` keeps a range of the
    time steps and `classes` limits the argmax to a range of classes (as a package's own decoding may, e.g. steps
    1..19, classes 1..36); class numbers stay those of the whole output, so `blank` and the alphabet keep theirs."""
    scores = np.moveaxis(output, axis, -1)
    scores = scores.reshape(-1, scores.shape[-1])[steps or slice(None)]
    ids = np.arange(scores.shape[-1])[classes or slice(None)]
    best = ids[scores[:, ids].argmax(axis=1)] if len(scores) else ids[:0]
    blank = blank % scores.shape[-1]
    keep = np.ones(len(best), bool)
    keep[1:] = best[1:] != best[:-1]
    return [int(k) for k in best[keep] if k != blank]


def _range(text: str | None) -> slice | None:
    """A `steps:`/`classes:` value ("1:20", validated at spec load) as a slice."""
    from qnn_tasks.modelspec.checkopts import parse_slice

    return None if text is None else parse_slice(text)[0]


def read_alphabet(model_dir: Path, name: str) -> list[str]:
    """One symbol per line (a line holding a single space is the space), UTF-8; only a file inside the model
    folder once symlinks are followed (checked at spec load, and again here: the link may have changed since)."""
    path = (model_dir / name).resolve()
    if not path.is_relative_to(model_dir.resolve()):
        raise StageError(f"ctc alphabet '{name}' leads through a symlink to {path}, outside the model folder "
                         "(fix: copy the file into the model folder)")
    return [line.rstrip("\r\n") for line in path.read_text(encoding="utf-8").splitlines(keepends=True)]


def text_of(indices: list[int], blank: int, classes: int, alphabet: list[str] | None) -> str:
    if alphabet is None:
        return " ".join(str(k) for k in indices)
    blank = blank % classes
    # the classes other than the blank, in order, are the alphabet's lines
    return "".join(alphabet[k - (k > blank)] if k - (k > blank) < len(alphabet) else f"[{k}]" for k in indices)


def edit_distance(a: str | list, b: str | list) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def ctc(ref: np.ndarray, got: np.ndarray, check: dict[str, Any], model_dir: Path | None = None) -> dict[str, Any]:
    blank, axis = int(check["blank"]), int(check["axis"])
    alphabet = read_alphabet(Path(model_dir or "."), check["alphabet"]) if check.get("alphabet") else None
    classes = np.moveaxis(ref[0], axis, -1).shape[-1]
    steps, kept = (_range(check.get(k)) for k in ("steps", "classes"))
    pairs = [(text_of(ctc_decode(r, blank, axis, steps, kept), blank, classes, alphabet),
              text_of(ctc_decode(g, blank, axis, steps, kept), blank, classes, alphabet)) for r, g in zip(ref, got)]
    same = [c == n for c, n in pairs]
    units = (lambda t: t) if alphabet else (lambda t: t.split())
    errors = sum(edit_distance(units(c), units(n)) for c, n in pairs)
    length = sum(len(units(c)) for c, _ in pairs)
    value, required = float(np.mean(same)), float(check["min"])
    result = {"kind": "ctc", "output": check["output"], "value": value, "min": required, "passed": value >= required,
              "meaning": "share of samples whose greedy CTC text is the same on NPU and CPU",
              "cer": errors / length if length else float(errors > 0),
              "differing": [{"sample": i, "cpu": c, "npu": n} for i, (c, n) in enumerate(pairs) if c != n][: int(check["show"])],
              # what was read, agreeing or not: a user wants to see the strings the check compared
              "decoded": [{"sample": i, "cpu": c, "npu": n} for i, (c, n) in enumerate(pairs)][: int(check["show"])],
              "disagreeing_samples": [i for i, s in enumerate(same) if not s][:20]}
    if alphabet is not None and len(alphabet) != classes - 1:
        result["note"] = (f"ctc on '{check['output']}': the alphabet {check['alphabet']} has {len(alphabet)} symbols, the "
                          f"output {classes - 1} classes besides the blank (class {blank % classes}), so the decoded "
                          "text is shifted or cut (fix: one line per class other than the blank, in class order)")
    if not result["passed"] and result["differing"]:
        first = result["differing"][0]
        result["failure"] = (f"{value:.4g} of samples decode to the same text, required {required:g}; character error "
                             f"rate {result['cer']:.4g}; first differing, sample {first['sample']}: CPU {first['cpu']!r} "
                             f"vs NPU {first['npu']!r}")
    return result
