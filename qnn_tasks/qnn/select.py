"""Which build runs on this device: the one definition of the rules (docs/shipping.md, "Choosing per device").

`choose(manifest, graph, soc, runtime_qnn, load, free_memory_mb=None)` reads a package's manifest.json (schema_version 1) and returns
a `Decision`: the NPU binary to use, or the CPU fallback, always with the reason. Never assumed:
1. candidates: the graph's binaries whose `socs` holds the device's ro.soc.model exactly (a binary of the same
   arch is not a match unless the manifest lists the chip: it was verified there); none -> CPU, "no build for <chip>";
2. in the model's `selection.precision_order` (fp16 before w8a16 unless the model.yaml says otherwise);
3. a binary whose `min_runtime_qnn` is newer than the device's runtime QNN is refused (the runtime would fail to
   load it: QNN error 5000/5005); an unknown runtime version (libraries absent) refuses them all;
4. where the app declares the memory it can give (`free_memory_mb`), a binary whose manifest `memory.resident_bytes`
   is more is skipped (its load would fail to allocate: QNN error 1002); none left -> CPU, rule out-of-memory;
5. the first candidate left is loaded through `load` (None: loaded, else the error text); a failed load -> CPU.
Before any rule the manifest is checked (`validate_manifest`: the fields these rules read, with the schema's
shapes): a manifest that is no JSON, or has a field of the wrong shape, gives the CPU with the field in the reason
("manifest.json: graphs.minilm.binaries[0].socs: expected a non-empty list, got a string (fix: ...)"), never a
guess or a crash. A chip whose build `dist` left out as failed or stale (the manifest's `omitted`) is told so.
The Java reference (ship/java/.../Selector.java) follows the same rules word for word: the decision tables in
ship/java/src/test/resources (selector_cases.json, manifest_cases.json) run through both (tests/test_ship_select.py);
so does device_cases.json, generated (tests/device_table.py) with the load oracle's predictions (qnn/loadoracle.py,
whose version rule is runtime_refusal below) as the loads.
`chain(manifest, graph)` lists the graphs to choose for a split graph (model.yaml `split:`): its parts, in order.
`choose_size(manifest, graph, length)` comes first for a graph with sizes (model.yaml `dims:`): the smallest size
the package ships a graph for that holds `length` positions along the dim ("smallest that fits", what the
cross-size check vouches for), padded with the manifest's pad values; longer than every size: truncated to the
largest, or none (`longer: skip`). Its `graph` is then the one to pass to `choose`. Where the manifest's rule is
"exact length only" (the check did not pass) a shorter input takes only a size of exactly its length, else none.
No Android, no adb, no numpy here: `doit verify` calls it per phone and an app may vendor this file. It stands in
qnn/, below both dist (ship/) and verify (stages/), which follow it.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from numbers import Integral, Real
from typing import Any, Callable, Mapping, Sequence

DEFAULT_PRECISION_ORDER = ("fp16", "w8a16")
SCHEMA_VERSION = 1  # the manifest.json these rules read
RULE_SIZES = "smallest that fits"  # the manifest's selection.sizes[].rule: what choose_size follows
RULE_EXACT = "exact length only"  # the same when padding is not vouched for (its cross-size check did not pass)
CODE = "5000/5005"  # QNN's errors for a context binary newer than the runtime libraries
MEMORY_CODE = "1002"  # QNN_COMMON_ERROR_MEM_ALLOC: what a load that cannot allocate its context logs
MIB = 1 << 20

# Decision.rule: which rule decided
NPU = "npu"
NO_BUILD = "no-build"
RUNTIME_UNKNOWN = "runtime-unknown"
RUNTIME_OLDER = "runtime-older"
LOAD_FAILED = "load-failed"
OUT_OF_MEMORY = "out-of-memory"  # every binary left needs more resident memory than the device declares free
UNVERIFIED = "unverified"      # the chip's build was left out by dist: it failed verification, or is stale
BAD_MANIFEST = "bad-manifest"  # the manifest is no JSON or a field the rules read has the wrong shape (also SizeChoice)

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
    rule: str                   # npu | no-build | unverified | runtime-unknown | runtime-older | load-failed |
                                # bad-manifest

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SizeChoice:
    graph: str | None           # the graph to run (then `choose` it per device); None: no size takes this input
    size: int | None            # its size along the dim; None for a graph without sizes or when none is chosen
    pad: int                    # positions to pad along the dim (each input with its value in pad_values)
    truncate: int               # positions to cut off the end (`longer: truncate`, longer than the largest size)
    reason: str                 # one line, for people and logs
    rule: str                   # fits | truncate | too-long | none-shipped | no-sizes | not-exact | bad-manifest
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
    """Rule 1: the binaries whose `socs` lists this exact ro.soc.model (a list of names: never a substring)."""
    return [b for b in binaries if soc and isinstance(b.get("socs"), (list, tuple)) and soc in b["socs"]]


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


def memory_refusal(binary: Mapping[str, Any], free_memory_mb: int | None) -> str | None:
    """Rule 4 for one binary: why a device with `free_memory_mb` MiB free cannot hold it loaded (its manifest
    `memory.resident_bytes`), or None; a device that declares nothing, or a binary without the figure, is not
    refused here (the load itself then says)."""
    needed = (binary.get("memory") or {}).get("resident_bytes")
    if free_memory_mb is None or needed is None or needed <= free_memory_mb * MIB:
        return None
    return f"{label(binary)} needs {-(-needed // MIB)} MiB resident, the device has {free_memory_mb} MiB free"


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


# --- the manifest's shape, checked before any rule (Selector.validate says the same, word for word) ---------------
FIX = "(fix: rebuild the package with doit dist)"
NOT_JSON = f"manifest.json: not valid JSON: the file is truncated or was edited {FIX}"
MAX_SIZE = 2**31 - 1  # a size along a dim: a Java int (Selector.chooseSize takes an int length)


class _Bad(Exception):
    """The first field of the wrong shape (internal: validate_manifest returns it as its one line)."""


def read_manifest(manifest: Mapping[str, Any] | str | bytes) -> tuple[Any, str | None]:
    """(the manifest, its first problem or None): manifest.json's text is parsed as strict JSON (no NaN or
    Infinity, nothing after the object: what dist writes and org.json reads), a mapping is taken as is; a newer
    schema_version raises (this selector cannot read it: an error of the app, not of the package)."""
    if isinstance(manifest, (str, bytes, bytearray)):
        try:
            manifest = _strict_json(manifest)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return None, NOT_JSON
    if isinstance(manifest, Mapping):
        _schema(manifest)
    return manifest, validate_manifest(manifest)


def _strict_json(text: str | bytes | bytearray) -> Any:
    """json.loads as Android's org.json reads numbers: an integer beyond a long is a double, and a value that is
    no finite double (NaN, Infinity, 1e400) is refused."""
    def refuse(literal: str) -> Any:
        raise ValueError(f"not a finite number: {literal}")

    def floating(literal: str) -> float:
        value = float(literal)
        return value if math.isfinite(value) else refuse(literal)

    def integer(literal: str) -> int | float:
        value = int(literal)
        return value if -2**63 <= value < 2**63 else floating(literal)

    return json.loads(text, parse_constant=refuse, parse_float=floating, parse_int=integer)


def validate_manifest(manifest: Any) -> str | None:
    """The first field the selector reads that has the wrong shape, as one line ("manifest.json: <field>: expected
    ..., got ... (fix: ...)"); None when every one is as the schema (manifest.schema.json) says. Checked: the
    types, a non-empty `socs` of chip names, binaries' path, precision, soc and min_runtime_qnn, the fallback's
    path, `selection.precision_order`, `sizes` (whole sizes, finite pad values, `longer`) and `splits` (a graph's
    parts), `omitted`."""
    try:
        _check_manifest(manifest)
    except _Bad as bad:
        return f"manifest.json: {bad} {FIX}"
    return None


def _check_manifest(m: Any) -> None:
    _mapping(m, "(root)")
    if "schema_version" in m:
        _expect(m["schema_version"], "schema_version", "an integer", ("integer",))
    _string(_field(m, "model", "model"), "model")
    if "selection" in m:
        selection = _mapping(m["selection"], "selection")
        if "precision_order" in selection:
            order = _list(selection["precision_order"], "selection.precision_order")
            for i, precision in enumerate(order):
                _string(precision, f"selection.precision_order[{i}]")
        if "sizes" in selection:
            for i, entry in enumerate(_list(selection["sizes"], "selection.sizes", empty=True)):
                _size_entry(entry, f"selection.sizes[{i}]")
        if "splits" in selection:
            for i, entry in enumerate(_list(selection["splits"], "selection.splits", empty=True)):
                key = f"selection.splits[{i}]"
                _mapping(entry, key)
                _string(_field(entry, "graph", f"{key}.graph"), f"{key}.graph")
                for j, part in enumerate(_list(_field(entry, "parts", f"{key}.parts"), f"{key}.parts")):
                    _string(part, f"{key}.parts[{j}]")
    graphs = _mapping(_field(m, "graphs", "graphs"), "graphs")
    _expect(graphs, "graphs", "a non-empty mapping", ("mapping",), ok=len(graphs) > 0)
    for name, entry in graphs.items():
        _graph_entry(entry, f"graphs.{name}")
    if "omitted" in m:
        for i, entry in enumerate(_list(m["omitted"], "omitted", empty=True)):
            key = f"omitted[{i}]"
            _mapping(entry, key)
            for name in ("target", "reason"):
                _string(_field(entry, name, f"{key}.{name}"), f"{key}.{name}")
            for name in ("graph", "soc", "precision"):
                if name in entry:
                    _string(entry[name], f"{key}.{name}")


def _size_entry(entry: Any, key: str) -> None:
    _mapping(entry, key)
    for name in ("graph", "dim"):
        _string(_field(entry, name, f"{key}.{name}"), f"{key}.{name}")
    for i, size in enumerate(_list(_field(entry, "sizes", f"{key}.sizes"), f"{key}.sizes")):
        _size(size, f"{key}.sizes[{i}]")
    for size, graph in _mapping(_field(entry, "graphs", f"{key}.graphs"), f"{key}.graphs").items():
        _string(graph, f"{key}.graphs.{size}")
    for name, value in _mapping(_field(entry, "pad", f"{key}.pad"), f"{key}.pad").items():
        _expect(value, f"{key}.pad.{name}", "a finite number", ("integer", "number"), ok=_finite(value))
    longer = _field(entry, "longer", f"{key}.longer")
    _expect(longer, f"{key}.longer", "skip or truncate", ("string",), ok=longer in ("skip", "truncate"))


def _graph_entry(entry: Any, key: str) -> None:
    _mapping(entry, key)
    if entry.get("fallback") is not None:  # none: the decision says "no CPU fallback in the manifest"
        fallback = _mapping(entry["fallback"], f"{key}.fallback")
        _string(_field(fallback, "path", f"{key}.fallback.path"), f"{key}.fallback.path")
    for i, binary in enumerate(_list(_field(entry, "binaries", f"{key}.binaries"), f"{key}.binaries", empty=True)):
        at = f"{key}.binaries[{i}]"
        _mapping(binary, at)
        for j, soc in enumerate(_list(_field(binary, "socs", f"{at}.socs"), f"{at}.socs")):
            _string(soc, f"{at}.socs[{j}]")
        for name in ("soc", "precision", "path"):
            _string(_field(binary, name, f"{at}.{name}"), f"{at}.{name}")
        _expect(_field(binary, "min_runtime_qnn", f"{at}.min_runtime_qnn"), f"{at}.min_runtime_qnn",
                "a string or null", ("string", "null"))
        _string(_field(binary, "min_runtime_from", f"{at}.min_runtime_from"), f"{at}.min_runtime_from")
        if "memory" in binary:
            memory = _mapping(binary["memory"], f"{at}.memory")
            needed = _field(memory, "resident_bytes", f"{at}.memory.resident_bytes")
            _expect(needed, f"{at}.memory.resident_bytes", "a non-negative integer", ("integer",),
                    ok=isinstance(needed, Integral) and needed >= 0)
    if "size" in entry:
        size = _mapping(entry["size"], f"{key}.size")
        for name in ("of", "dim"):
            _string(_field(size, name, f"{key}.size.{name}"), f"{key}.size.{name}")
        _size(_field(size, "size", f"{key}.size.size"), f"{key}.size.size")


def _kind(value: Any) -> str:
    """A value's JSON kind, in the words of the reasons (Selector.kind gives the same)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, Integral):
        return "integer"
    if isinstance(value, Real):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


def _a(kind: str) -> str:
    return kind if kind == "null" else ("an " if kind[0] in "aeiou" else "a ") + kind


def _expect(value: Any, key: str, what: str, kinds: tuple[str, ...], ok: bool = True) -> Any:
    """`value` is one of `kinds` and `ok`, else the field's one line: "expected <what>[, got <kind>]"."""
    kind = _kind(value)
    if kind not in kinds:
        raise _Bad(f"{key}: expected {what}, got {_a(kind)}")
    if not ok:
        raise _Bad(f"{key}: expected {what}")
    return value


def _field(obj: Mapping[str, Any], name: str, key: str) -> Any:
    if name not in obj:
        raise _Bad(f"{key}: missing")
    return obj[name]


def _mapping(value: Any, key: str) -> Mapping[str, Any]:
    return _expect(value, key, "a mapping", ("mapping",))


def _list(value: Any, key: str, empty: bool = False) -> Sequence[Any]:
    if empty:
        return _expect(value, key, "a list", ("list",))
    return _expect(value, key, "a non-empty list", ("list",), ok=_kind(value) == "list" and len(value) > 0)


def _string(value: Any, key: str) -> str:
    return _expect(value, key, "a non-empty string", ("string",), ok=value != "")


def _size(value: Any, key: str) -> int:
    whole = _kind(value) == "integer" and 1 <= value <= MAX_SIZE
    return _expect(value, key, f"an integer from 1 to {MAX_SIZE}", ("integer",), ok=whole)


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (OverflowError, TypeError, ValueError):
        return False


def _fallback_of(manifest: Any, graph: str | None) -> str | None:
    """The graph's CPU fallback as far as a bad manifest still names one (a non-empty string), else None."""
    graphs = manifest.get("graphs") if isinstance(manifest, Mapping) else None
    entry = graphs.get(graph) if isinstance(graphs, Mapping) and isinstance(graph, str) else None
    fallback = entry.get("fallback") if isinstance(entry, Mapping) else None
    path = fallback.get("path") if isinstance(fallback, Mapping) else None
    return path if isinstance(path, str) and path else None


def cpu_decision(fallback: str | None, rule: str, why: str) -> Decision:
    """The CPU, with why and what it runs."""
    where = f"the CPU runs {fallback}" if fallback else "no CPU fallback in the manifest"
    return Decision("cpu", fallback, None, f"{why}; {where}", rule)


def unverified(manifest: Mapping[str, Any], graph: str, soc: str | None) -> str | None:
    """Why this chip has no build of `graph` when dist left it out as failed or stale (the manifest's `omitted`),
    e.g. "the build for SM8650 failed verification (minilm-SM8650: failed: simverify: ...)"; None otherwise."""
    found = [o for o in manifest.get("omitted") or () if soc and o.get("graph") == graph and o.get("soc") == soc
             and o["reason"].startswith(("failed:", "stale:"))]
    if not found:
        return None
    how = "failed verification" if any(o["reason"].startswith("failed:") for o in found) else \
        "is stale (it changed since it was verified)"
    details = "; ".join(f"{o['target']}: {o['reason']}" for o in found)
    return f"the build for {soc} {how} ({details})"


def _schema(manifest: Mapping[str, Any]) -> None:
    found = manifest.get("schema_version", SCHEMA_VERSION)
    if isinstance(found, Integral) and not isinstance(found, bool) and found != SCHEMA_VERSION:
        raise ValueError(f"manifest of {manifest.get('model')}: schema_version {manifest.get('schema_version')}, this "
                         f"selector reads {SCHEMA_VERSION} (fix: use the selector of the qnn-npu-compile that wrote it)")


def choose_size(manifest: Mapping[str, Any] | str | bytes, graph: str, length: int) -> SizeChoice:
    """Which size of `graph` (a declared graph with sizes, e.g. "minilm") takes an input holding `length` positions
    along its dim: the smallest size whose graph the package ships that holds it, padded; longer than every shipped
    size: the largest, truncated (`longer: truncate`), or none (`longer: skip`). A graph without sizes as is.
    `manifest`: the parsed manifest.json or its text; a bad one: no graph (rule bad-manifest, the field in the
    reason); `choose` then gives the CPU with the same reason."""
    manifest, problem = read_manifest(manifest)
    if problem:
        return SizeChoice(None, None, 0, 0, problem, BAD_MANIFEST)
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


def chain(manifest: Mapping[str, Any] | str | bytes, graph: str) -> list[str]:
    """The graphs that run `graph`, in order: a split graph's parts (model.yaml `split:`, the manifest's
    selection.splits), each fed the previous part's outputs by name; any other graph alone. `choose` each of them
    on the device (a part the chip has no verified build of runs its CPU fallback). A bad manifest: the graph
    alone (`choose` then gives the CPU with the field that is wrong in the reason)."""
    manifest, problem = read_manifest(manifest)
    if problem:
        return [graph]
    split = _split_of(manifest, graph)
    if split is not None:
        return [str(p) for p in split.get("parts") or ()]
    graphs = manifest.get("graphs") or {}
    if graph not in graphs:
        raise KeyError(f"manifest of {manifest.get('model')}: no graph '{graph}' (graphs: {', '.join(graphs)})")
    return [graph]


def _split_of(manifest: Mapping[str, Any], graph: str) -> Mapping[str, Any] | None:
    """The first selection.splits entry of `graph` (as the Java reference reads it), or None."""
    return next((s for s in (manifest.get("selection") or {}).get("splits") or () if s.get("graph") == graph), None)


def _split_message(manifest: Mapping[str, Any], graph: str, split: Mapping[str, Any]) -> str:
    return (f"manifest of {manifest.get('model')}: '{graph}' is split into parts "
            f"({', '.join(map(str, split.get('parts') or ()))}): choose each part, run in order (fix: "
            f"chain(manifest, \"{graph}\") lists them)")


def choose(manifest: Mapping[str, Any] | str | bytes, graph: str | None, soc: str | None, runtime_qnn: str | None,
           load: Callable[[Mapping[str, Any]], str | None], free_memory_mb: int | None = None) -> Decision:
    """The decision for `graph` on a device whose ro.soc.model is `soc` and whose runtime libraries are QNN
    `runtime_qnn` (None: unknown or absent); `load(binary)` returns None when the context loaded, else the error.
    `free_memory_mb`: the memory the app can give the model (e.g. ActivityManager.MemoryInfo.availMem), None: not
    declared; a binary needing more (its manifest memory.resident_bytes) is skipped.
    For a graph with sizes, pass the graph `choose_size` returned. `manifest`: the parsed manifest.json or its
    text; a bad one gives the CPU (rule bad-manifest) with the field that is wrong in the reason."""
    manifest, problem = read_manifest(manifest)
    if problem:
        return cpu_decision(_fallback_of(manifest, graph), BAD_MANIFEST, problem)
    graphs = manifest["graphs"]
    if graph not in graphs:
        split = _split_of(manifest, graph)
        if split is not None:
            raise KeyError(_split_message(manifest, graph, split))
        raise KeyError(f"manifest of {manifest.get('model')}: no graph '{graph}' (graphs: {', '.join(graphs)})")
    entry = graphs[graph]
    fallback = (entry.get("fallback") or {}).get("path")

    def cpu(rule: str, why: str) -> Decision:
        return cpu_decision(fallback, rule, why)

    binaries = list(entry["binaries"])
    found = candidates(binaries, soc)
    failed = unverified(manifest, graph, soc) if not found else None
    if failed:
        return cpu(UNVERIFIED, failed)
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
    short = [(b, why) for b in left if (why := memory_refusal(b, free_memory_mb))]
    fits = [b for b in left if all(b is not s for s, _ in short)]
    too_big = "; ".join(why for _, why in short)
    if not fits:
        return cpu(OUT_OF_MEMORY, f"not enough free memory: {too_big} (it would fail to load: QNN error "
                                  f"{MEMORY_CODE})" + (f"; skipped: {skipped} (QNN error {CODE})" if skipped else ""))
    pick = fits[0]
    error = load(pick)
    if error is not None:
        return cpu(LOAD_FAILED, f"{label(pick)} did not load: {error}")
    how = "built for" if pick.get("soc") == soc else f"built for {text(pick, 'soc')}, verified on"
    reason = (f"{label(pick)}: {how} {soc}, runtime QNN {runtime_qnn} >= minimum "
              f"{text(pick, 'min_runtime_qnn')} (from {text(pick, 'min_runtime_from')}), context loaded")
    if skipped:
        reason += f"; skipped: {skipped} (QNN error {CODE})"
    if short:
        reason += f"; skipped: {too_big} (QNN error {MEMORY_CODE})"
    return Decision("npu", pick.get("path"), pick.get("precision"), reason, NPU)
