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
No Android, no adb, no numpy here: `doit verify` calls it per phone and an app may vendor this file.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

DEFAULT_PRECISION_ORDER = ("fp16", "w8a16")
SCHEMA_VERSION = 1  # the manifest.json these rules read
CODE = "5000/5005"  # QNN's errors for a context binary newer than the runtime libraries

# Decision.rule: which rule decided
NPU = "npu"
NO_BUILD = "no-build"
RUNTIME_UNKNOWN = "runtime-unknown"
RUNTIME_OLDER = "runtime-older"
LOAD_FAILED = "load-failed"

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


def choose(manifest: Mapping[str, Any], graph: str, soc: str | None, runtime_qnn: str | None,
           load: Callable[[Mapping[str, Any]], str | None]) -> Decision:
    """The decision for `graph` on a device whose ro.soc.model is `soc` and whose runtime libraries are QNN
    `runtime_qnn` (None: unknown or absent); `load(binary)` returns None when the context loaded, else the error."""
    if manifest.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise ValueError(f"manifest of {manifest.get('model')}: schema_version {manifest.get('schema_version')}, this "
                         f"selector reads {SCHEMA_VERSION} (fix: use the selector of the qnn-npu-compile that wrote it)")
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
