"""Which build runs on this device: the one definition of the rules (docs/shipping.md, "Choosing per device").

`choose(manifest, graph, soc, runtime_qnn, load)` reads a package's manifest.json (schema_version 1) and returns
a `Decision`: the NPU binary to use, or the CPU fallback, always with the reason. Never assumed:
1. candidates: the graph's binaries whose `socs` holds the device's ro.soc.model exactly (a binary of the same
   arch is not a match unless the manifest lists the chip: it was verified there); none -> CPU, "no build for <chip>";
2. in the model's `selection.precision_order` (fp16 before w8a16 unless the model.yaml says otherwise);
3. a binary whose `min_runtime_qnn` is newer than the device's runtime QNN is refused (the runtime would fail to
   load it: QNN error 5000/5005); an unknown runtime version (libraries absent) refuses them all;
4. the first candidate left is loaded through `load` (None: loaded, else the error text); a failed load -> CPU.
The Java reference (ship/java/.../Selector.java) follows the same rules word for word: the decision table in
ship/java/selector_cases.json is run through both (tests/test_ship_select.py).
`choose_size(manifest, graph, length)` comes first for a graph with sizes (model.yaml `dims:`): the smallest size
the package ships a graph for that holds `length` positions along the dim ("smallest that fits", what the
cross-size check vouches for), padded with the manifest's pad values; longer than every size: truncated to the
largest, or none (`longer: skip`). Its `graph` is then the one to pass to `choose`. Where the manifest's rule is
"exact length only" (the check did not pass) a shorter input takes only a size of exactly its length, else none.
No Android, no adb, no numpy here: `doit verify` calls it per phone and an app may vendor this file.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from numbers import Integral
from typing import Any, Callable, Mapping, Sequence

DEFAULT_PRECISION_ORDER = ("fp16", "w8a16")
SCHEMA_VERSION = 1  # the manifest.json these rules read
RULE_SIZES = "smallest that fits"  # the manifest's selection.sizes[].rule: what choose_size follows
RULE_EXACT = "exact length only"  # the same when padding is not vouched for (its cross-size check did not pass)
CODE = "5000/5005"  # QNN's errors for a context binary newer than the runtime libraries

# Decision.rule: which rule decided
NPU = "npu"
NO_BUILD = "no-build"
RUNTIME_UNKNOWN = "runtime-unknown"
RUNTIME_OLDER = "runtime-older"
LOAD_FAILED = "load-failed"

# SizeChoice.rule: which rule decided
FITS = "fits"              # the smallest shipped size that holds the input (padded, or exactly its size)
TRUNCATE = "truncate"      # longer than every shipped size, `longer: truncate`: cut to the largest
TOO_LONG = "too-long"      # longer than every shipped size, `longer: skip`: no graph; the app refuses or splits
NONE_SHIPPED = "none-shipped"  # the package holds no graph of any size
NO_SIZES = "no-sizes"      # a graph without sizes: run as is
NOT_EXACT = "not-exact"    # `rule: exact length only` and no shipped size is the input's length: no graph

_VERSION = re.compile(r"^v?([0-9]+(?:\.[0-9]+)*)")


@dataclass(frozen=True)
class Decision:
    target: str                 # "npu" | "cpu"
    path: str | None            # the binary (npu) or the CPU fallback (cpu), relative to the package root
    precision: str | None       # the binary's precision; None on the CPU
    reason: str                 # one line, for people and logs
    rule: str                   # npu | no-build | runtime-unknown | runtime-older | load-failed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SizeChoice:
    graph: str | None           # the graph to run (then `choose` it per device); None: no size takes this input
    size: int | None            # its size along the dim; None for a graph without sizes or when none is chosen
    pad: int                    # positions to pad along the dim (each input with its value in pad_values)
    truncate: int               # positions to cut off the end (`longer: truncate`, longer than the largest size)
    reason: str                 # one line, for people and logs
    rule: str                   # fits | truncate | too-long | none-shipped | no-sizes | not-exact
    pad_values: dict[str, float] = field(default_factory=dict)  # input -> its pad value (the manifest's `pad`)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def version(text: Any) -> tuple[int, ...] | None:
    """Numeric parts of '2.41.0', 'v2.41.0.251023' or '2.10' (2.10 > 2.9); None if it is not a version."""
    match = _VERSION.match(str(text).strip()) if text is not None else None
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def older(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """a < b with missing parts as 0 (2.41 == 2.41.0)."""
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) < b + (0,) * (width - len(b))


def candidates(binaries: Sequence[Mapping[str, Any]], soc: str | None) -> list[Mapping[str, Any]]:
    """Rule 1: the binaries whose `socs` lists this exact ro.soc.model."""
    return [b for b in binaries if soc and soc in (b.get("socs") or ())]


def in_order(found: Sequence[Mapping[str, Any]], precision_order: Sequence[str]) -> list[Mapping[str, Any]]:
    """Rule 2: the declared precision order; a precision it does not name comes after, in manifest order."""
    rank: dict[Any, int] = {}
    for i, precision in enumerate(precision_order):
        rank.setdefault(precision, i)
    return sorted(found, key=lambda b: rank.get(b.get("precision"), len(rank)))  # sorted() is stable


def runtime_refusal(binary: Mapping[str, Any], runtime: tuple[int, ...]) -> str | None:
    """Rule 3 for one binary: why this runtime cannot load it, or None."""
    needed = version(binary.get("min_runtime_qnn"))
    if needed is None:
        return f"{label(binary)} records no min_runtime_qnn"
    if older(runtime, needed):
        return (f"{label(binary)} needs QNN {text(binary, 'min_runtime_qnn')} or newer (minimum from "
                f"{text(binary, 'min_runtime_from')})")
    return None


def label(binary: Mapping[str, Any]) -> str:
    return f"{text(binary, 'precision')} {text(binary, 'path')}"


def text(binary: Mapping[str, Any], key: str) -> str:
    """A field for a reason string; "?" when absent or null (the Java reference says the same)."""
    value = binary.get(key)
    return "?" if value is None else str(value)


def number(value: Any) -> str:
    """A pad value for a reason string: 0, -10000, 0.5, 0.00001 (the Java reference writes the same)."""
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(Decimal(repr(value)).normalize(), "f")


def _schema(manifest: Mapping[str, Any]) -> None:
    if manifest.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise ValueError(f"manifest of {manifest.get('model')}: schema_version {manifest.get('schema_version')}, this "
                         f"selector reads {SCHEMA_VERSION} (fix: use the selector of the qnn-npu-compile that wrote it)")


def choose_size(manifest: Mapping[str, Any], graph: str, length: int) -> SizeChoice:
    """Which size of `graph` (a declared graph with sizes, e.g. "minilm") takes an input holding `length` positions
    along its dim: the smallest size whose graph the package ships that holds it, padded; longer than every shipped
    size: the largest, truncated (`longer: truncate`), or none (`longer: skip`). A graph without sizes as is."""
    _schema(manifest)
    graphs = manifest.get("graphs") or {}
    declared: dict[Any, Mapping[str, Any]] = {}
    for entry in (manifest.get("selection") or {}).get("sizes") or ():
        declared.setdefault(entry.get("graph"), entry)  # the first, as the Java reference reads it
    if graph not in declared and graph not in graphs:
        raise KeyError(f"manifest of {manifest.get('model')}: no graph '{graph}' (graphs: "
                       f"{', '.join([*declared, *graphs])})")
    of = (graphs.get(graph) or {}).get("size") or {}
    if graph not in declared and of.get("of") in declared:
        raise ValueError(f"manifest of {manifest.get('model')}: {graph} is size {of.get('size')} of {of['of']}: the "
                         f"size is chosen from the declared graph (fix: pass '{of['of']}', or call choose on {graph} "
                         f"directly)")
    if isinstance(length, bool) or not isinstance(length, Integral) or length < 1:  # a numpy integer is Integral
        raise ValueError(f"manifest of {manifest.get('model')}: length {length} for {graph}: an input holds at least "
                         f"1 position (fix: pass the input's content length along the dim, e.g. its token count)")
    if graph not in declared:
        return SizeChoice(graph, None, 0, 0, f"{graph} has no sizes: it runs at its one shape", NO_SIZES)
    entry, length = declared[graph], int(length)
    sizes = sorted(int(s) for s in entry.get("sizes") or ())
    by_size = entry.get("graphs") or {}
    shipped = [s for s in sizes if by_size.get(str(s)) in graphs]
    missing = [s for s in sizes if s not in shipped]
    note = f"sizes {', '.join(map(str, shipped))}" + (
        f"; not in the package: {', '.join(map(str, missing))}" if missing else "")
    what = f"{length} along {text(entry, 'dim')}"
    if not shipped:
        return SizeChoice(None, None, 0, 0, f"no size of {graph} is in the package (declared "
                                            f"{', '.join(map(str, sizes))}): {what} runs nowhere", NONE_SHIPPED)
    pad_values = {name: float(value) for name, value in (entry.get("pad") or {}).items()}
    if entry.get("rule") != RULE_SIZES and length <= shipped[-1]:  # padding not vouched for: only an exact length
        if length in shipped:
            return SizeChoice(by_size[str(length)], length, 0, 0, f"{RULE_EXACT}: {what} -> {by_size[str(length)]} "
                                                                  f"({note}; no padding)", FITS, pad_values)
        return SizeChoice(None, None, 0, 0, f"{RULE_EXACT}: {what} is no size's length ({note}): "
                                            f"{text(entry, 'why')}: the app must refuse the input", NOT_EXACT)
    fits = next((s for s in shipped if s >= length), None)
    if fits is not None:
        run = by_size[str(fits)]
        values = ", ".join(f"{n} {number(v)}" for n, v in pad_values.items())
        padding = f"pad {fits - length}" + (f" with {values}" if values else "") if fits > length else "no padding"
        return SizeChoice(run, fits, fits - length, 0, f"{RULE_SIZES}: {what} -> {run} ({note}; {padding})", FITS,
                          pad_values)
    largest = shipped[-1]
    if entry.get("longer") == "truncate":
        run = by_size[str(largest)]
        return SizeChoice(run, largest, 0, length - largest, f"longer than every size: {what} -> {run}, truncated "
                                                             f"by {length - largest} ({note}; longer: truncate)",
                          TRUNCATE, pad_values)
    return SizeChoice(None, None, 0, 0, f"longer than every size: {what}, the largest is {largest} ({note}; longer: "
                                        f"skip): the app must refuse or split the input", TOO_LONG)


def choose(manifest: Mapping[str, Any], graph: str, soc: str | None, runtime_qnn: str | None,
           load: Callable[[Mapping[str, Any]], str | None]) -> Decision:
    """The decision for `graph` on a device whose ro.soc.model is `soc` and whose runtime libraries are QNN
    `runtime_qnn` (None: unknown or absent); `load(binary)` returns None when the context loaded, else the error.
    For a graph with sizes, pass the graph `choose_size` returned."""
    _schema(manifest)
    graphs = manifest.get("graphs") or {}
    if graph not in graphs:
        raise KeyError(f"manifest of {manifest.get('model')}: no graph '{graph}' (graphs: {', '.join(graphs)})")
    entry = graphs[graph]
    fallback = (entry.get("fallback") or {}).get("path")

    def cpu(rule: str, why: str) -> Decision:
        where = f"the CPU runs {fallback}" if fallback else "no CPU fallback in the manifest"
        return Decision("cpu", fallback, None, f"{why}; {where}", rule)

    binaries = list(entry.get("binaries") or [])
    found = candidates(binaries, soc)
    if not found:
        built = sorted({s for b in binaries for s in (b.get("socs") or ())})
        return cpu(NO_BUILD, f"no build for {soc or 'an empty ro.soc.model'} (builds for: "
                             f"{', '.join(built) or 'none'})")
    order = (manifest.get("selection") or {}).get("precision_order") or DEFAULT_PRECISION_ORDER
    ordered = in_order(found, order)
    runtime = version(runtime_qnn)
    if runtime is None:
        return cpu(RUNTIME_UNKNOWN, f"runtime libraries' QNN version unknown ({runtime_qnn or 'libraries absent'}): "
                                    f"a binary newer than the runtime fails to load (QNN error {CODE}), "
                                    f"so none of {', '.join(label(b) for b in ordered)} is tried")
    refused = [(b, why) for b in ordered if (why := runtime_refusal(b, runtime))]
    left = [b for b in ordered if all(b is not r for r, _ in refused)]
    skipped = "; ".join(why for _, why in refused)
    if not left:
        return cpu(RUNTIME_OLDER, f"runtime QNN {runtime_qnn} is too old: {skipped} (it would fail to load: "
                                  f"QNN error {CODE})")
    pick = left[0]
    error = load(pick)
    if error is not None:
        return cpu(LOAD_FAILED, f"{label(pick)} did not load: {error}")
    how = "built for" if pick.get("soc") == soc else f"built for {text(pick, 'soc')}, verified on"
    reason = (f"{label(pick)}: {how} {soc}, runtime QNN {runtime_qnn} >= minimum "
              f"{text(pick, 'min_runtime_qnn')} (from {text(pick, 'min_runtime_from')}), context loaded")
    if skipped:
        reason += f"; skipped: {skipped} (QNN error {CODE})"
    return Decision("npu", pick.get("path"), pick.get("precision"), reason, NPU)
