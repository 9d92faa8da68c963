"""QNN error codes in a log -> one line each a person can act on (the catalogue: data/qnn_errors.yaml).

QNN reports failures as numbers ("error code 3110", "err 5000", 0x36b1) or enum names
(QNN_CONTEXT_ERROR_INVALID_ARGUMENT), usually followed by a message from onnxruntime that names
neither the cause nor the fix. `explain(text, stage=...)` finds every known code in a compile,
simulator or phone log and returns, per code (in order of first appearance), one line:
"QNN error 3110 (QNN_OP_PACKAGE_ERROR_VALIDATION_FAILURE): <meaning>: <fix for this chip/graph>".
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

CATALOGUE = Path(__file__).resolve().parents[1] / "data" / "qnn_errors.yaml"
STAGES = ("compile", "fallback", "load", "phone")
MAX_TEXT = 2_000_000  # a log is untrusted and may be huge: read at most this much of it
_NUMBER = re.compile(r"(?:error(?:\s+code)?|err|code|status|returned|returns?)\W{0,3}(?:is\s+)?(0x[0-9a-fA-F]{3,5}|\d{4,5})\b",
                     re.IGNORECASE)
_NAME = re.compile(r"\bQNN_[A-Z0-9]+_ERROR_[A-Z0-9_]+\b")


@functools.lru_cache(maxsize=1)
def catalogue() -> dict[int, dict[str, Any]]:
    """code -> entry, read once from the packaged YAML."""
    import yaml

    data = yaml.safe_load(CATALOGUE.read_text())
    return {int(code): {**entry, "code": int(code)} for code, entry in data["codes"].items()}


def find_codes(text: str) -> list[int]:
    """Known QNN codes in `text`, by number or by name, in order of first appearance."""
    text = text[:MAX_TEXT]
    by_name = {entry["name"]: code for code, entry in catalogue().items()}
    found: list[tuple[int, int]] = []
    for match in _NUMBER.finditer(text):
        raw = match.group(1)
        code = int(raw, 16) if raw.lower().startswith("0x") else int(raw)
        if code in catalogue():
            found.append((match.start(), code))
    for match in _NAME.finditer(text):
        if match.group(0) in by_name:
            found.append((match.start(), by_name[match.group(0)]))
    seen: list[int] = []
    for _, code in sorted(found):
        if code not in seen:
            seen.append(code)
    return seen


def explain(text: str, stage: str, soc: Any = None, graph: Any = None, precision: str | None = None) -> list[str]:
    """One line per known code in `text`: what it means here and the fix.

    `stage` is where the text comes from (see STAGES); `soc` (a spec.Soc), `graph` (a spec.GraphSpec)
    and `precision` fill the fix and choose among a code's fixes.
    """
    lines = []
    facts = {"stage": stage, "precision": precision, "runs_fp16": None if soc is None else "fp16" in soc.runs}
    for code in find_codes(text):
        entry = catalogue()[code]
        fix = next((f["text"] for f in entry["fixes"] if _applies(f.get("when") or {}, facts)), "")
        lines.append(f"QNN error {code} ({entry['name']}): {entry['meaning']}: {_fill(fix, soc, graph)}")
    return lines


def explain_file(path: Path, stage: str, **context: Any) -> list[str]:
    """`explain` for a log file (nothing if it is missing)."""
    try:
        with open(path, errors="replace") as fh:
            return explain(fh.read(MAX_TEXT), stage, **context)
    except OSError:
        return []


def suffix(lines: list[str]) -> str:
    """The explanations appended to a one-line stage error."""
    return "".join(f"; {line}" for line in lines)


def _applies(when: dict[str, Any], facts: dict[str, Any]) -> bool:
    return all(facts.get(key) == value for key, value in when.items())


def _fill(text: str, soc: Any, graph: Any) -> str:
    values = {"soc": "this chip", "soc_id": "?", "arch": "?", "arch_number": "<arch>", "soc_file": "socs/socs.yaml",
              "graph": "<graph>", "model_yaml": "model.yaml"}
    if soc is not None:
        values.update(soc=soc.name, soc_id=str(soc.soc_id), arch=soc.dsp_arch, arch_number=soc.dsp_arch.lstrip("v"),
                      soc_file=soc.file or "socs/socs.yaml")
    if graph is not None:
        values.update(graph=graph.name, model_yaml=str(Path(str(graph.model_dir)) / "model.yaml"))
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), text)


def table_markdown() -> str:
    """The catalogue as docs/error-codes.md's table (a test keeps the page in step with the data)."""
    rows = ["| code | name | what it means here | fix | source |", "|---|---|---|---|---|"]
    for code, entry in sorted(catalogue().items()):
        fixes = "<br>".join(_fix_cell(f) for f in entry["fixes"])
        rows.append(f"| {code} | `{entry['name']}` | {entry['meaning']} | {fixes} | {entry['source']}: {entry['evidence']} |")
    return "\n".join(rows)


def _fix_cell(fix: dict[str, Any]) -> str:
    when = ", ".join(f"{k} {str(v).lower() if isinstance(v, bool) else v}" for k, v in (fix.get("when") or {}).items())
    return (f"*{when}:* " if when else "") + fix["text"].replace("|", "\\|")
