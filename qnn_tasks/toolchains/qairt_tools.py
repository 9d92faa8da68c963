"""Running the QAIRT tools and reading what they say: command lines, logs, warnings, rejected ops, ELF checks.

Every tool run leaves `command.txt` (the exact command, with the environment it was given on top)
and `<tool>.log` (its whole stdout + stderr) beside its outputs.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError, ToolchainError

MAX_WARNINGS = 50
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# the converter's "Node <name>: 'No translation registered for op type onnx_<op>...'" (and the KeyError form)
REJECTED_OP = re.compile(r"No translation registered for op type onnx_(\w+?)\.?['\"]?(?:\s|$|\.)", re.I)
REJECTED_NODE = re.compile(r"Node (\S+?): .*No translation registered for op type onnx_(\w+?)[.'\"\s]", re.I)
# Python tools: "... - WARNING - msg"; native tools: "[ WARNING ] msg" / "<W> msg"; make-style "warning:"
WARNING_LINE = re.compile(r"(?: - WARNING - |\[\s*WARNING\s*\]|<W>\s|^\s*\[WARN(?:ING)?\]\s)(.*)$")
ERROR_LINE = re.compile(r"(?: - ERROR - |\[\s*ERROR\s*\]|<E>\s|^\s*ERROR:\s|^\s*\[ERROR\]\s)(.*)$")
EXPORT_HINTS = {"Neg": "write (0 - x) or a - b at export", "If": "constant-fold the condition at export",
                "Loop": "unroll at export", "Scan": "unroll at export", "IsNaN": "drop NaN checks from the graph",
                "IsInf": "drop Inf checks from the graph"}
PAGE_16K = 0x4000


def qnn_graph_name(name: str) -> tuple[str, str | None]:
    """The graph name the converter gives a .cpp named after `name`, and a problem if it can't be kept.

    The converter turns the .cpp basename into the graph name with `-` (and anything else outside
    [A-Za-z0-9_]) replaced by `_`. We name the .cpp after the graph with `-` already turned into `_`
    (a handled rename: the HTP config then names the graph exactly as the converter does); any other
    character would be mangled silently, so it is an error.
    """
    if IDENTIFIER.match(name):
        return name, None
    renamed = name.replace("-", "_")
    if IDENTIFIER.match(renamed):
        return renamed, None
    mangled = re.sub(r"[^A-Za-z0-9_]", "_", name)
    mangled = f"_{mangled}" if mangled[:1].isdigit() else mangled
    return mangled, (f"graph name '{name}' is not a valid QNN graph name: the converter would name the graph "
                     f"'{mangled}' (fix: rename the graph in model.yaml to letters, digits, '_' or '-', starting "
                     f"with a letter)")


def graph_name_in_cpp(cpp: Path) -> str | None:
    """The graph name the converter wrote into its .cpp (QnnModel_composeGraphs' graph)."""
    text = cpp.read_text(errors="replace")
    for pattern in (r'getQnnGraphConfigFromInfo\(\s*"([^"]+)"', r'\.initialize\(\s*backendHandle[^;]*?"([^"]+)"'):
        match = re.search(pattern, text)
        if match:
            return match.group(1)
    return None


def run_tool(tool: str, command: list[str], out_dir: Path, env: dict[str, str], shown_env: dict[str, str] | None = None,
             cwd: Path | None = None) -> dict[str, Any]:
    """Run one SDK tool; keep `command.txt` and `<tool>.log` in out_dir. Returns the run record (never raises on exit code)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / f"{tool}.log"
    shown = "".join(f"{k}={shlex.quote(v)} " for k, v in (shown_env or {}).items())
    line = shown + " ".join(shlex.quote(str(c)) for c in command)
    with open(out_dir / "command.txt", "a") as fh:
        fh.write(line + "\n")
    start = time.perf_counter()
    try:
        with open(log, "wb") as fh:
            proc = subprocess.run([str(c) for c in command], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                  cwd=str(cwd) if cwd else None, stdin=subprocess.DEVNULL)
    except OSError as err:
        raise ToolchainError(f"cannot run {command[0]}: {err} (log: {log})") from None
    return {"command": line, "returncode": proc.returncode, "seconds": round(time.perf_counter() - start, 3),
            "log": str(log)}


def reset_command_file(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "command.txt").write_text("")


def warnings_in(log: Path) -> list[str]:
    return _distinct_matches(log, WARNING_LINE)[:MAX_WARNINGS]


def errors_in(log: Path) -> list[str]:
    return _distinct_matches(log, ERROR_LINE)


def _distinct_matches(log: Path, pattern: re.Pattern) -> list[str]:
    """The first group of every line matching `pattern`, stripped, each once, in order."""
    found: list[str] = []
    for line in _lines(log):
        match = pattern.search(line)
        if match and match.group(1).strip() and match.group(1).strip() not in found:
            found.append(match.group(1).strip())
    return found


def rejected_ops(log: Path) -> list[dict[str, str]]:
    """Ops the converter said it cannot translate, with the node when it names one."""
    ops: dict[str, dict[str, str]] = {}
    for line in _lines(log):
        node = REJECTED_NODE.search(line)
        if node:
            op = _onnx_op(node.group(2))
            ops.setdefault(f"{op}:{node.group(1)}", {"op_type": op, "node": node.group(1), "hint": EXPORT_HINTS.get(op, "")})
            continue
        match = REJECTED_OP.search(line)
        if match:
            op = _onnx_op(match.group(1))
            if not any(o["op_type"] == op for o in ops.values()):
                ops[op] = {"op_type": op, "node": "", "hint": EXPORT_HINTS.get(op, "")}
    return list(ops.values())


def _onnx_op(lowered: str) -> str:
    """onnx_neg -> Neg, onnx_isnan -> IsNaN (the converter lowercases the ONNX op type)."""
    known = {k.lower(): k for k in ("Neg", "If", "Loop", "Scan", "IsNaN", "IsInf", "DFT", "RandomNormalLike",
                                    "RandomUniformLike", "RandomNormal", "RandomUniform", "Multinomial", "Erf",
                                    "NonZero", "Unique", "SelectiveScan", "Acos")}
    return known.get(lowered.lower(), lowered[:1].upper() + lowered[1:])


def _lines(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()
    except OSError:
        return []


def tail(log: Path, lines: int = 5) -> str:
    return " | ".join(line.strip() for line in _lines(log)[-lines:] if line.strip())


# ------------------------------------------------------------------ calibration input list

def write_input_list(graph, calibration: Path, out_dir: Path) -> tuple[Path, bool, int]:
    """The converter's --input_list from the calibration set: one line per sample, one raw file per input.

    Raw files are written in each input's own dtype; when any input is not float32 the converter must
    be told with --use_native_input_files (as sherpa-onnx does for int32 inputs). Returns (list, native, samples).
    """
    import numpy as np

    from qnn_tasks.judge import sample_store

    samples = sample_store.load(calibration)
    raw_dir = out_dir / "calibration"
    shutil.rmtree(raw_dir, ignore_errors=True)
    raw_dir.mkdir(parents=True)
    native = any(t.dtype != "float32" for t in graph.inputs)
    lines = []
    for i, sample in enumerate(samples):
        paths = []
        for tensor in graph.inputs:
            path = raw_dir / f"{i:04d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', tensor.name)}.raw"
            np.ascontiguousarray(np.asarray(sample[tensor.name], dtype=tensor.dtype)).tofile(path)
            paths.append(str(path.resolve()))
        lines.append(" ".join(paths))
    input_list = out_dir / "input_list.txt"
    input_list.write_text("\n".join(lines) + "\n")
    return input_list, native, len(samples)


# ------------------------------------------------------------------ ELF checks

def load_alignments(lib: Path) -> list[int]:
    """The Align of every LOAD program header, read with `readelf -lW` (binutils)."""
    readelf = shutil.which("readelf")
    if not readelf:
        raise ToolchainError("readelf not found: the 16 KB page check needs binutils (apt-get install binutils)")
    proc = subprocess.run([readelf, "-lW", str(lib)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise StageError(f"{lib}: readelf -lW failed: {proc.stderr.strip() or proc.stdout.strip()} "
                         f"(is it an ELF shared object?)")
    aligns = [int(line.split()[-1], 16) for line in proc.stdout.splitlines() if line.strip().startswith("LOAD")]
    if not aligns:
        raise StageError(f"{lib}: readelf -lW shows no LOAD segments (not a loadable shared object)")
    return aligns


def check_16k_pages(lib: Path) -> dict[str, Any]:
    """Android 15+ devices with 16 KB pages load only libraries whose LOAD segments are 16 KB aligned."""
    aligns = load_alignments(lib)
    record = {"path": str(lib), "load_align": [hex(a) for a in aligns], "page_16k": all(a >= PAGE_16K for a in aligns)}
    if not record["page_16k"]:
        raise StageError(f"{lib}: LOAD segments aligned to {', '.join(sorted(set(record['load_align'])))}, not 16 KB "
                         f"(0x4000): Android 15+ phones with 16 KB pages refuse to load it (fix: link it with "
                         f"LDFLAGS=-Wl,-z,max-page-size=16384 - the modellib stage passes that to "
                         f"qnn-model-lib-generator; check your NDK honours LDFLAGS, r26 or newer)",
                         {"page_check": record})
    return record
