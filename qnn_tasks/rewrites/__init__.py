"""Known HTP rewrites, applied by name: the NPU porting every packaged model needed by hand.

Declared per graph in model.yaml (`rewrites: [pow-square, neg, fold-if]`, or a mapping with
options) or called from an export.py:

    from qnn_tasks.rewrites import apply
    report = apply(model, ["pow-square", "neg"])   # edits the onnx.ModelProto in place

Each rewrite is one small function `(model, dry_run=False, **options) -> list[str]`: the sites
(node or constant names) it changed, so its count is the list's length. With `dry_run` it only
finds them (lint uses that, so lint flags exactly what the rewrite would change).

This module only holds the catalogue (names, options, summaries): spec loading imports it, and
must stay free of onnx/numpy. The rewrites themselves are imported when applied. The package stands below
spec/ (the loader checks model.yaml's `rewrites:` against the catalogue): it imports nothing of the project.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from qnn_tasks.errors import RewriteError
from qnn_tasks.rewrites.fp16range import FP16_MAX, FP16_SCALES
from qnn_tasks.rewrites.yamlhint import entry_yaml

if TYPE_CHECKING:
    import onnx



@dataclass(frozen=True)
class LintAdvice:
    """A hazard lint flags on a graph by this rewrite's own matcher (a dry run), its fix being the rewrite."""
    rule: str           # lint's rule name: what `lint: {allow: [rule]}` acknowledges
    op: str | None      # the op it flags (None: a constant)
    problem: str        # what goes wrong, lint's message


@dataclass(frozen=True)
class Rewrite:
    name: str
    module: str    # qnn_tasks.rewrites.<module>
    function: str
    summary: str   # what it does, one line (README and errors)
    why: str       # what it fixes: "accuracy: ..." or "speed: ..." (lint's `why`)
    options: dict[str, Any] = field(default_factory=dict)  # option -> default
    lint: LintAdvice | None = None  # lint's warning where the rewrite would change something (None: lint is silent)


# In the order they are applied: fold-if first (it exposes the taken branch's nodes), if-to-where on the Ifs it
# leaves (data-dependent conditions), the variance
# pattern before pow-square (it matches Pow or Mul squares and removes them itself).
CATALOGUE: dict[str, Rewrite] = {r.name: r for r in (
    Rewrite("fold-if", "foldif", "fold_if",
            "an If whose condition is constant once the shapes and constant_inputs are fixed keeps only the taken branch",
            "compatibility: control flow does not compile for HTP"),
    Rewrite("if-to-where", "ifwhere", "if_to_where",
            "an If with a data-dependent condition and pure, cheap branches (no nested control flow or random ops, "
            "every node defined on every input, the branch not taken adding at most 25% to the graph's cost, outputs "
            "of the same shape and dtype) computes both and picks with Where",
            "compatibility: the If runs on CPU (the build fails unless allow_cpu_fallback)"),
    Rewrite("centred-variance", "reductions", "centred_variance",
            "variance as E[x^2] - E[x]^2 (means as ReduceMean or ReduceSum x 1/N) becomes E[(x - E[x])^2]",
            "accuracy: a LayerNorm computed so gave cosine 0.54 on HTP fp16, 0.99992 after the rewrite",
            lint=LintAdvice("variance-cancellation", "Sub", "variance computed as E[x^2] - E[x]^2 cancels in fp16")),
    Rewrite("pow-square", "elementwise", "pow_square", "Pow(x, 2) becomes Mul(x, x)",
            "accuracy: -4 instead of ~0 on tiny inputs (a VAD agreed with the CPU on 63% of quiet frames)",
            lint=LintAdvice("pow-square", "Pow",
                            "fp16 Pow(x, 2) on HTP returns garbage when x underflows fp16 (|x| < ~6e-8)")),
    Rewrite("reduce-sum-square", "reductions", "reduce_sum_square", "ReduceSumSquare(x) becomes ReduceSum(Mul(x, x))",
            "speed: the node runs on CPU (the build fails unless allow_cpu_fallback)",
            lint=LintAdvice("reduce-sum-square", "ReduceSumSquare", "ReduceSumSquare runs on CPU, not on HTP")),
    Rewrite("clip-computed", "elementwise", "clip_computed", "Clip with a computed (non-constant) min/max becomes Max/Min",
            "speed: the node runs on CPU (the build fails unless allow_cpu_fallback)",
            lint=LintAdvice("clip-computed", "Clip", "a Clip whose min/max is computed (not a constant) runs on CPU")),
    Rewrite("neg", "elementwise", "neg", "Neg(x) becomes Sub(0, x)",
            "compatibility: the QAIRT toolchain fails on it (ort-qnn runs it on HTP)",
            lint=LintAdvice("neg", "Neg", "the QNN converter rejects Neg")),
    Rewrite("scale-input", "inputscale", "scale_input",
            "a graph input is multiplied by a power of two (factor) and the scale undone exactly where it ends: "
            "after a Log (- d log s), at an output (x s^-d); constants beside scaled tensors are scaled with them",
            "accuracy: an early node (an STFT conv on int16-scale audio) overflows fp16's 65504 and saturates",
            {"input": None, "factor": None}),
    Rewrite("finite-mask", "elementwise", "finite_mask",
            "float constants below -65504 (-inf, finfo(float32).min) become a finite value, except where they only seed a Max",
            "accuracy: in fp16 it is -inf (0 * -inf = NaN), and it wrecks 8-bit quantization ranges",
            {"value": -1.0e4},
            lint=LintAdvice("fp16-overflow-constant", None, "overflows fp16 (a mask of -inf/finfo.min breaks fp16 "
                                                            "arithmetic and quantization)")),
)}
NAMES = tuple(CATALOGUE)
# lint rule -> the rewrite whose dry run finds it (lint's warnings, and the rules `lint: {allow: [...]}` may name)
LINT_ADVICE: dict[str, Rewrite] = {r.lint.rule: r for r in CATALOGUE.values() if r.lint}


def normalize(declared: Iterable[str] | Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """`[a, b]`, `[a, {b: {opt: v}}]` or `{a: {}, b: {opt: v}}` -> {name: options with defaults}.

    Raises ValueError naming the problem (modelspec/load.py turns it into a one-line spec error).
    """
    if declared is None:
        return {}
    items: list[tuple[Any, Any]] = []
    if isinstance(declared, Mapping):
        items = list(declared.items())
    elif isinstance(declared, (list, tuple)):
        for entry in declared:
            if isinstance(entry, Mapping) and len(entry) == 1:
                items.append(next(iter(entry.items())))
            elif isinstance(entry, str):
                items.append((entry, None))
            else:
                raise ValueError(f"entry {entry!r} is neither a rewrite name nor a one-key `name: {{options}}` mapping")
    else:
        raise ValueError(f"expected a list of rewrite names or a mapping, got {type(declared).__name__}")
    result: dict[str, dict[str, Any]] = {}
    for name, options in items:
        if name not in CATALOGUE:
            raise ValueError(f"unknown rewrite {name!r}; known rewrites: {', '.join(NAMES)}")
        if name in result:
            raise ValueError(f"rewrite {name!r} is declared twice")
        result[name] = _options(CATALOGUE[name], options)
    return result


class OptionError(ValueError):
    """A rewrite's option is wrong: its `fix` says what that option accepts (not the list of rewrite names)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.fix = fix


def _options(rewrite: Rewrite, options: Any) -> dict[str, Any]:
    options = {} if options is None else options
    if not isinstance(options, Mapping):
        shown = {k: v for k, v in rewrite.options.items() if v is not None} or {k: "..." for k in rewrite.options}
        raise OptionError(f"options of {rewrite.name!r} must be a mapping, got {options!r}",
                          f"write them as a mapping, e.g. {entry_yaml(rewrite.name, shown)}")
    unknown = set(options) - set(rewrite.options)
    if unknown:
        raise OptionError(f"unknown option {sorted(unknown)[0]!r} for rewrite {rewrite.name!r}",
                          f"use its options: {', '.join(rewrite.options)}" if rewrite.options
                          else f"remove the options: {rewrite.name} takes none")
    merged = {**rewrite.options, **options}
    if rewrite.name == "finite-mask":
        value = merged["value"]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not -FP16_MAX <= value < 0:
            raise OptionError(f"finite-mask value must be a negative number >= -65504 (fp16's lowest), got {value!r}",
                              "give a value from -65504 to just below 0, e.g. value: -10000.0")
        merged["value"] = float(value)
    if rewrite.name == "scale-input":
        merged["factor"] = power_of_two(merged["factor"])
        if merged["input"] is not None and not isinstance(merged["input"], str):
            raise OptionError(f"scale-input input must be the name of a graph input, got {merged['input']!r}",
                              "name a float input of the graph, e.g. input: x")
    return merged



def power_of_two(value: Any) -> float:
    """scale-input's factor: a number or "1/64" / "2^-6", a power of two other than 1 (scaling by it is exact)
    that fp16 holds as a normal number (2^-14 .. 2^15: the NPU computes the scaled input in fp16).

    Written forms are parsed without evaluating anything large: "2^1000000000" is refused, not computed.
    """
    from fractions import Fraction

    problem = f"scale-input factor must be a power of two other than 1, got {value!r}"
    if value is None:
        raise OptionError("scale-input needs a factor", _FACTOR_FIX)
    huge = None
    try:
        if isinstance(value, bool):
            raise OptionError(problem, _FACTOR_FIX)
        if isinstance(value, str):  # parsed within bounds: 2^1000000000 or Fraction("1e999999999") would be computed
            match = _FACTOR.fullmatch(value.strip())
            if not match:
                raise OptionError(problem, _FACTOR_FIX)
            base, exponent, top, bottom, decimal = match.groups()
            if base and abs(int(exponent)) > 64:  # far outside fp16 anyway: never evaluated (2^1000000000: 12 s, 441 MB)
                huge, number = f"{base}^{exponent}", Fraction(0)
            else:
                number = (Fraction(int(base)) ** int(exponent) if base else Fraction(decimal) if decimal
                          else Fraction(int(top), int(bottom or 1)))
        else:
            number = Fraction(float(value) if isinstance(value, str) else value)  # float("1e999") is inf: refused
    except OptionError:
        raise
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        raise OptionError(problem, _FACTOR_FIX) from None
    if huge:
        raise _outside(value, huge)
    if number <= 0 or number == 1 or not _is_power_of_two(number):
        raise OptionError(problem, _FACTOR_FIX)
    low, high = FP16_SCALES
    if not Fraction(2) ** low <= number <= Fraction(2) ** high:
        exponent = number.numerator.bit_length() - number.denominator.bit_length()
        raise _outside(value, f"2^{exponent}")
    return float(number)


def _outside(value: Any, power: str) -> OptionError:
    low, high = FP16_SCALES
    return OptionError(f"scale-input factor {value!r} ({power}) is outside fp16's range: the NPU computes the scaled "
                       f"input in fp16, which holds powers of two from 2^{low} to 2^{high} (2^40 gave all-zero outputs)",
                       f"give a power of two from 2^{low} to 2^{high}, e.g. factor: 1/64 (doit diagnose advises one)")


_FACTOR_FIX = (f"give a power of two from 2^{FP16_SCALES[0]} to 2^{FP16_SCALES[1]} other than 1, e.g. factor: 1/64 or "
               "factor: \"2^-6\" (doit diagnose advises one)")


# "2^-6" (a small base and exponent), "1/64", "64" or "0.015625": a factor written as text, bounded before anything is computed
_FACTOR = re.compile(r"(?:(\d{1,3})\s*\^\s*([-+]?\d{1,12}))|(?:(\d{1,20})\s*(?:/\s*(\d{1,20}))?)|(\d{0,20}\.\d{1,20})")


def _is_power_of_two(number) -> bool:
    top, bottom = number.numerator, number.denominator
    return (top == 1 or bottom == 1) and (top & (top - 1)) == 0 and (bottom & (bottom - 1)) == 0


def function(name: str) -> Callable[..., list[str]]:
    """The rewrite's function (imports onnx): `(model, dry_run=False, **options) -> list[str]`."""
    rewrite = CATALOGUE[name]
    return getattr(importlib.import_module(f"{__name__}.{rewrite.module}"), rewrite.function)


def apply(model: onnx.ModelProto, rewrites: Iterable[str] | Mapping[str, Any], skip: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Apply the named rewrites to `model` (an onnx.ModelProto, edited in place), in catalogue order.

    Returns one entry per rewrite: {"name", "count", "sites"} (sites: the node or constant names
    changed), plus "refused" (sites it matched and declined, each with its reason) when there are any. Dead nodes and unused initializers are removed, and shapes re-inferred, afterwards.
    """
    from qnn_tasks.rewrites import graphtools

    wanted = normalize(rewrites)
    skipped = set(skip)
    report = []
    for name in NAMES:
        if name in wanted and name not in skipped:
            try:
                sites = function(name)(model, **wanted[name])
            except RewriteError as err:
                raise RewriteError(f"{name}: {err.problem}", err.fix) from None
            entry = {"name": name, "count": len(sites), "sites": list(sites)}
            if getattr(sites, "refused", None):
                entry["refused"] = list(sites.refused)
            report.append(entry)
            graphtools.remove_dead(model.graph)  # what a rewrite replaced must not match the next one
    graphtools.infer_shapes(model)
    return report


def find(model: onnx.ModelProto, names: Iterable[str] = NAMES) -> dict[str, list[str]]:
    """Sites each rewrite would change (nothing is edited): what lint reports."""
    return {name: function(name)(model, dry_run=True) for name in names}


def example() -> str:
    """The `rewrites:` line spec errors show as an example."""
    return f"rewrites: [pow-square, {entry_yaml('finite-mask', CATALOGUE['finite-mask'].options)}]"


def advice(name: str, graph: Any) -> str:
    """The fix lint and diagnose give where rewrite `name`'s own matcher finds a site in `graph` (a GraphSpec): the
    model.yaml line that enables it, or, when the graph declares it already, that the site survived it."""
    rewrite = CATALOGUE[name]
    if name in graph.rewrites:
        return (f"rewrite '{name}' ({rewrite.summary}) is declared for graphs.{graph.name} but this site is still "
                f"there: export.py skipped it, or simplify re-created it; fix it at export")
    return f"{yaml_fix(name, graph.name, graph.model, graph.rewrites)}: {rewrite.summary}"


def yaml_fix(name: str, graph_name: str, model_name: str, declared: Iterable[str] = (),
             options: Mapping[str, Any] | None = None) -> str:
    """The model.yaml line that enables rewrite `name` (with `options`) for a graph: the `fix:` of lint, diagnose and
    fallback messages."""
    entry = entry_yaml(name, options)
    if declared:
        return f'add {entry} to graphs.{graph_name}.rewrites in models/{model_name}/model.yaml'
    return f'add "rewrites: [{entry}]" to graphs.{graph_name} in models/{model_name}/model.yaml'
