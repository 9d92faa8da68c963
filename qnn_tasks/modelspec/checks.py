"""The sections of a graph that say how it is checked: `verify:` (thresholds, task checks, per
precision), validated with its defaults filled in; and what the types of `calibration:` and `lint:` cannot say
(modelspec/stagesettings.py declares those two sections).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks import rewrites
from qnn_tasks.errors import SpecError
from qnn_tasks.modelspec import precision_table
from qnn_tasks.modelspec.yamlread import as_int, as_mapping, as_number

PRECISIONS = precision_table.NAMES  # fp16, w8a16, w4a16: modelspec/precision_table.py
MIN_CALIBRATION_SAMPLES = 8
# threshold name -> whether a metric must stay at most ("max") or at least ("min") that value
THRESHOLD_KEYS = {"max_abs": "max", "mean_abs": "max", "min_cosine": "min", "min_snr_db": "min"}
THRESHOLD_RANGES = {"max_abs": (0.0, None), "mean_abs": (0.0, None), "min_cosine": (-1.0, 1.0),
                    "min_snr_db": (-200.0, 400.0)}
# Defaults per precision: fp16 activations are near-lossless on HTP.
# 8-bit weights lose more: looser defaults, and the task-level checks matter most.
DEFAULT_THRESHOLDS = {"fp16": {"min_cosine": 0.999, "min_snr_db": 25.0},
                      **{p: {"min_cosine": 0.99, "min_snr_db": 15.0} for p in precision_table.QUANTIZED}}
VERIFY_KEYS = {"samples", "thresholds", "per_output", "checks"} | {p for p in PRECISIONS if p != "fp16"}
CALIBRATION_DEFAULTS = {"samples": 32, "function": "samples", "per_channel": True}
REPAIR_BUDGET = (3, 50)  # compiles the repair may spend: plain w8a16 + the sensitivity graph + at least one step
DEFAULT_REPAIR_BUDGET = 6
CHECK_KINDS = {"agreement": {"output", "threshold", "min", "slice"}, "ranking": {"output", "top", "min", "slice"},
               "top1": {"output", "min", "axis", "slice", "score_threshold"}, "wer": {"output", "max_wer_increase", "min_identical", "show"},
               "elements": {"output", "tol", "threshold", "min", "slice"},
               "detection": {"output", "box_format", "transpose", "objectness", "score_threshold", "nms_iou",
                             "match_iou", "max_detections", "min"},
               "ctc": {"output", "blank", "alphabet", "axis", "min", "show", "steps", "classes"}}
# option -> (type, lowest, highest): shares are in [0, 1]
CHECK_RANGES = {"agreement": {"threshold": (float, None, None), "min": (float, 0.0, 1.0)},
                "ranking": {"top": (int, 1, None), "min": (float, 0.0, 1.0)},
                "top1": {"min": (float, 0.0, 1.0), "axis": (int, -8, 7), "score_threshold": (float, None, None)},
                "wer": {"max_wer_increase": (float, 0.0, None), "min_identical": (float, 0.0, 1.0),
                        "show": (int, 0, None)},
                "elements": {"tol": (float, 0.0, None), "threshold": (float, None, None), "min": (float, 0.0, 1.0)},
                "detection": {"score_threshold": (float, 0.0, None), "nms_iou": (float, 0.0, 1.0),
                              "match_iou": (float, 0.0, 1.0), "max_detections": (int, 1, 10000),
                              "min": (float, 0.0, 1.0)},
                "ctc": {"blank": (int, None, None), "axis": (int, -8, 7), "min": (float, 0.0, 1.0), "show": (int, 0, None)}}
MODEL_CHECKS = ("wer",)  # checks that call the model's own code (transcribe, texts)
# wer: fp16 must not lose a word; 8-bit weights may lose one word in a hundred, with different wording allowed
CHECK_DEFAULTS = {"wer": {"fp16": {"max_wer_increase": 0.0, "min_identical": 1.0, "show": 5},
                          **{p: {"max_wer_increase": 0.01, "min_identical": 0.0, "show": 5}
                             for p in precision_table.QUANTIZED}}}
# the same for every precision (checks.py reads them filled in)
SHARED_DEFAULTS = {"elements": {"min": 0.999},
                   "detection": {"box_format": "cxcywh", "transpose": False, "objectness": False,
                                 "score_threshold": 0.25, "nms_iou": 0.45, "match_iou": 0.5, "max_detections": 300,
                                 "min": 0.95},
                   "ctc": {"blank": 0, "axis": -1, "min": 0.99, "show": 5}}


# lint's own rules, then those a rewrite's row brings (rewrites.CATALOGUE, `lint=`)
LINT_RULES = ("dynamic-dim", "batch", "io-dtype", "control-flow", "int8-in-onnx", "size", "erf", "recurrent",
              "memory") + tuple(rewrites.LINT_ADVICE)


# rules export refuses whatever lint was told: acknowledging them would only move the refusal (rule -> why, fix)
NOT_ACKNOWLEDGEABLE = {
    "int8-in-onnx": ("QNN cannot compile int8 arithmetic written into the ONNX (it quantizes itself)",
                     "remove it from allow; export the float model and let QNN quantize it (precision: w8a16)"),
    "dynamic-dim": ("the NPU needs static shapes", "remove it from allow; give every input a fixed shape in inputs:"),
    "io-dtype": ("the NPU's inputs and outputs cannot take that dtype",
                 "remove it from allow; the built-in export casts int64 I/O to int32, other dtypes need export.py"),
}


def check_lint(lint: dict, path: Path, key: str, precisions: tuple[str, ...] | list[str] = ()) -> None:
    allow = lint.get("allow", [])
    if not isinstance(allow, list) or any(rule not in LINT_RULES for rule in allow):
        raise SpecError(path, f"{key}.allow", f"must be a list of lint rules, got {allow!r}",
                        f"use rules from: {', '.join(LINT_RULES)}")
    for i, rule in enumerate(allow):
        if rule in NOT_ACKNOWLEDGEABLE:
            why, fix = NOT_ACKNOWLEDGEABLE[rule]
            if "w8a16" in precisions:  # the graph already says what the fix would tell it to add
                fix = fix.replace(" (precision: w8a16)", ": precision: w8a16 is already set")
            raise SpecError(path, f"{key}.allow[{i}]", f"{rule} cannot be acknowledged: {why}", fix)


def check_calibration(section: dict, path: Path, key: str, precisions: tuple[str, ...]) -> None:
    """How quantized graphs (w8a16, w4a16) are calibrated: N real samples from a function of the model's export.py
    (CALIBRATION_DEFAULTS where the section does not say; modelspec/stagesettings.py fills them in)."""
    samples = section.get("samples", CALIBRATION_DEFAULTS["samples"])
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < MIN_CALIBRATION_SAMPLES:
        raise SpecError(path, f"{key}.samples", f"{samples!r} is too few calibration samples",
                        f"use at least {MIN_CALIBRATION_SAMPLES} real samples (32 or more is better)")
    function = section.get("function", CALIBRATION_DEFAULTS["function"])
    if not isinstance(function, str) or not function.isidentifier():
        raise SpecError(path, f"{key}.function", f"'{function}' is not a function name", "name a function in export.py")
    if section and not precision_table.any_quantized(precisions):
        raise SpecError(path, key, f"calibration is only used by quantized graphs ({', '.join(precision_table.QUANTIZED)})",
                        "add w8a16 to precision or remove it")
    # repair_budget stays out where not written (no default): a quantized graph's keys stay as they were without it
    if "repair_budget" in section and not any(precision_table.is_repaired(p) for p in precisions):
        raise SpecError(path, f"{key}.repair_budget", f"only the repair of precision "
                        f"{precision_table.repaired_names()} spends it", "add w8a16-mixed to precision or remove it")


def verify_section(data: Any, precision: str, outputs: set[str] | dict[str, tuple[int, ...]], where: Path,
                    key: str) -> dict[str, Any]:
    """The graph's `verify:` settings for one precision, validated, with defaults filled in.

    A `w8a16:` (or `w4a16:`) subsection overrides the base settings for that precision's targets only.
    """
    verify = dict(as_mapping(data, where, key))
    for p in PRECISIONS:
        if p != "fp16" and p in verify:
            override = as_mapping(verify.pop(p), where, f"{key}.{p}")
            if precision == p:
                bad = set(override) - {"samples", "thresholds", "per_output", "checks"}
                if bad:
                    raise SpecError(where, f"{key}.{p}.{sorted(bad)[0]}", "unknown key", "use samples, thresholds, per_output, checks")
                verify.update(override)
                key = f"{key}.{p}"
    for k in verify:
        if k not in VERIFY_KEYS:
            raise SpecError(where, f"{key}.{k}", "unknown key", f"use one of: {', '.join(sorted(VERIFY_KEYS))}")
    thresholds = {**DEFAULT_THRESHOLDS[precision], **(verify.get("thresholds") or {})}
    per_output = verify.get("per_output") or {}
    for name, limits in per_output.items():  # `y:` with nothing after it is null: no thresholds, not "as before"
        if not isinstance(limits, dict):
            raise SpecError(where, f"{key}.per_output.{name}", f"expected a mapping of thresholds, got {limits!r}",
                            f"give its thresholds, e.g. {name}: {{max_abs: 0.05}}, or remove the entry")
    for name, limits in [("thresholds", thresholds)] + [(f"per_output.{o}", v) for o, v in per_output.items()]:
        for metric in limits:
            if metric not in THRESHOLD_KEYS:
                raise SpecError(where, f"{key}.{name}.{metric}", "unknown threshold",
                                f"use one of: {', '.join(THRESHOLD_KEYS)}")
            as_number(limits[metric], where, f"{key}.{name}.{metric}", *THRESHOLD_RANGES[metric])
    for name in per_output:
        if name not in outputs:
            raise SpecError(where, f"{key}.per_output.{name}", "not an output of the graph", f"use one of: {', '.join(outputs)}")
    checks = []
    for i, check in enumerate(verify.get("checks") or []):
        if not isinstance(check, dict) or len(check) != 1:
            raise SpecError(where, f"{key}.checks[{i}]", "each check is one `kind: {options}` mapping",
                            "e.g. - agreement: {output: output, threshold: 0.5, min: 0.99}")
        kind, options = next(iter(check.items()))
        options = as_mapping(options, where, f"{key}.checks[{i}].{kind}")
        if kind not in CHECK_KINDS:
            raise SpecError(where, f"{key}.checks[{i}]", f"unknown check '{kind}'", f"use one of: {', '.join(CHECK_KINDS)}")
        unknown = set(options) - CHECK_KINDS[kind]
        if unknown or options.get("output") not in outputs:
            raise SpecError(where, f"{key}.checks[{i}].{kind}", f"needs output: one of {sorted(outputs)}"
                            + (f"; unknown keys {sorted(unknown)}" if unknown else ""), "fix the check's options")
        for option, (kind_of, low, high) in CHECK_RANGES.get(kind, {}).items():
            if option in options:
                check_key = f"{key}.checks[{i}].{kind}.{option}"
                (as_int if kind_of is int else as_number)(options[option], where, check_key, low, high)
        shape = outputs.get(options["output"]) if isinstance(outputs, dict) else None
        _check_options(kind, options, shape, where, f"{key}.checks[{i}].{kind}")
        checks.append({"kind": kind, **SHARED_DEFAULTS.get(kind, {}), **CHECK_DEFAULTS.get(kind, {}).get(precision, {}),
                       **options})
    samples = verify.get("samples")
    if samples is not None:
        as_int(samples, where, f"{key}.samples", 1, None)
    return {"samples": samples, "thresholds": thresholds, "per_output": per_output, "checks": checks}


def _check_options(kind: str, options: dict[str, Any], shape: tuple[int, ...] | None, where: Path, key: str) -> None:
    """What the ranges above cannot say: a slice that fits the output, one of tol/threshold, detection columns,
    an alphabet file inside the model folder."""
    from qnn_tasks.modelspec.checkopts import check_options

    check_options(kind, options, shape, where, key)
