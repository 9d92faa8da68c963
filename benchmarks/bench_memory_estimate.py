"""How close lint's memory estimate comes to what the context binary says its load holds (docs/load-and-fit.md).

    python benchmarks/bench_memory_estimate.py --project .            # the demo's binaries (after `doit`), plus
                                                                      # the synthetic graphs below, compiled here
    python benchmarks/bench_memory_estimate.py --sizes 100M 300M 1B   # which synthetic transformers (default: these)

The graphs: every chip target of a built project (its report.json carries, per binary, the figure read from the
binary and lint's estimate: `doit report` first); synthetic pre-norm transformers of 0.1-1.5B parameters
(benchmarks/bench_big_graphs.py's, sequence 16, fp16), small transformers at longer sequences, residual MLPs and
convolution stacks, each compiled for SM8650 with the project's ort-qnn toolchain (onnxruntime-qnn) in a child
process (killed over --max-gb of resident memory), read back with qnn/binary.py and compared with
graphs/memory.py's estimate from the ONNX alone. Prints one row per graph and the summary line
`memory estimate: N graphs, K within +-10% of the binary's figure (median |error| X%, max Y%)`; writes the output to
benchmarks/results/memory_estimate.txt.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULT = ROOT / "benchmarks" / "results" / "memory_estimate.txt"
OPTIONS = {"soc_model": "57", "vtcm_mb": "8"}  # SM8650
# (name, width, blocks, seq): bench_big_graphs' transformer at other shapes
SMALL_TRANSFORMERS = [("transformer-1M-seq16", 128, 4, 16), ("transformer-3M-seq128", 256, 4, 128),
                      ("transformer-3M-seq512", 256, 4, 512), ("transformer-13M-seq256", 512, 4, 256),
                      ("transformer-0.4M-seq2048", 128, 2, 2048), ("transformer-30M-seq64", 512, 10, 64)]
CONVS = [(128, 32, 4), (256, 64, 4), (384, 64, 3), (512, 16, 2), (512, 32, 3), (512, 64, 4)]  # side, channels, layers

CHILD = r"""
import json, sys
from pathlib import Path
from qnn_tasks.toolchains.ort_qnn import compile_context
from qnn_tasks.qnn.binary import read_binary_info
job = json.loads(sys.argv[1])
out = Path(job["out"])
try:
    compile_context(Path(job["source"]), out, job["options"], Path(job["log"]))
    print("RESULT " + json.dumps(read_binary_info(out.with_name(out.stem + "_qnn.bin")).to_dict()))
except Exception as err:
    print("RESULT " + json.dumps({"error": str(err)}))
"""


def mlp(path: Path, width: int, blocks: int, seq: int) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import onnx
    from test_split import stack_model  # the residual MLP stack the tests build (width 256, seq 16)

    assert (width, seq) == (256, 16)
    onnx.save(stack_model(blocks), str(path))


def conv(path: Path, side: int, channels: int, layers: int) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import onnx
    from test_memory import conv_net

    onnx.save(conv_net(side, channels, layers), str(path))


def compiled(source: Path, max_gb: float) -> tuple[dict | None, str | None, float]:
    """The binary's info dict (or the failure) and the compile's seconds, compiled in a watched child."""
    from bench_big_graphs import run_watched

    job = {"source": str(source), "out": str(source.with_name(source.stem + "_ctx.onnx")),
           "log": str(source.with_name("compile.log")), "options": OPTIONS}
    start = time.monotonic()
    run = run_watched([sys.executable, "-c", CHILD, json.dumps(job)], max_gb, 3600)
    seconds = time.monotonic() - start
    line = next((ln for ln in run["output"].splitlines() if ln.startswith("RESULT ")), None)
    if run.get("killed") or line is None:
        return None, run.get("killed") or "no result", seconds
    result = json.loads(line[len("RESULT "):])
    return (None, result["error"], seconds) if "error" in result else (result, None, seconds)


def synthetic(work: Path, sizes: list[str], max_gb: float, quantized: bool) -> list[dict]:
    import onnx
    from bench_big_graphs import SIZES, build

    from qnn_tasks.graphs import memory

    jobs: list[tuple[str, Path, str]] = []
    for name in sizes:
        width, blocks = SIZES[name]
        folder = work / f"transformer-{name}"
        folder.mkdir()
        build(folder / "m.onnx", width, blocks)
        jobs.append((f"transformer-{name}", folder / "m.onnx", "fp16"))
    for name, width, blocks, seq in SMALL_TRANSFORMERS:
        (work / name).mkdir()
        build(work / name / "m.onnx", width, blocks, seq=seq)
        jobs.append((name, work / name / "m.onnx", "fp16"))
    for blocks in (2, 4, 8):
        name = f"mlp-stack-{blocks}"
        (work / name).mkdir()
        mlp(work / name / "m.onnx", 256, blocks, 16)
        jobs.append((name, work / name / "m.onnx", "fp16"))
    for side, channels, layers in CONVS:
        name = f"convs-{side}px-{channels}ch-{layers}"
        (work / name).mkdir()
        conv(work / name / "m.onnx", side, channels, layers)
        jobs.append((name, work / name / "m.onnx", "fp16"))
    if quantized:
        for name, _w, _b, _s in SMALL_TRANSFORMERS[1:4]:
            jobs.append((name, quantize(work / name / "m.onnx"), "w8a16"))
    rows = []
    for name, source, precision in jobs:
        model = onnx.load(str(work / name / "m.onnx"), load_external_data=False)
        est = memory.estimate(model, precision, 8)
        info, failed, seconds = compiled(source, max_gb)
        read = memory.measured(info) if info else None
        rows.append({"graph": name, "precision": precision, "params": sum(_count(t) for t in model.graph.initializer),
                     "estimate": est["resident"], "measured": read and read["resident"], "failed": failed,
                     "compile_s": round(seconds, 1), "spill_measured": read and read["spill_fill"],
                     "spill_estimate": est["spill_fill"]})
        print(_row(rows[-1]), flush=True)
    return rows


def quantize(source: Path) -> Path:
    """w8a16 the way the quantize stage does it (onnxruntime's QNN QDQ flow), on 4 random calibration samples."""
    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantType
    from onnxruntime.quantization import quantize as ort_quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    model = onnx.load(str(source))
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    name = model.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([{name: np.random.default_rng(i).standard_normal(shape).astype(np.float32)}
                                 for i in range(4)])

        def get_next(self):
            return next(self.samples, None)

    out = source.with_name("w8a16_qdq.onnx")
    config = get_qnn_qdq_config(str(source), Reader(), activation_type=QuantType.QUInt16,
                                weight_type=QuantType.QUInt8, per_channel=True)
    ort_quantize(str(source), str(out), config)
    return out


def _count(tensor) -> int:
    n = 1
    for d in tensor.dims:
        n *= d
    return n


def from_project(project: Path) -> list[dict]:
    """Every chip target of a built project whose report carries both figures."""
    report = json.loads((project / "build/report/report.json").read_text())
    rows = []
    for t in report["targets"]:
        mem = t.get("memory") or {}
        if mem.get("measured") and mem.get("estimate"):
            rows.append({"graph": f"{t['name']} (demo)", "precision": t["precision"], "params": None,
                         "estimate": mem["estimate"]["resident_bytes"], "measured": mem["resident_bytes"],
                         "failed": None, "compile_s": None, "spill_measured": mem["measured"]["spill_fill"],
                         "spill_estimate": None})
            print(_row(rows[-1]), flush=True)
    return rows


def _row(r: dict) -> str:
    mib = 1 << 20
    if r["measured"] is None:
        return f"{r['graph']:<34} {r['precision']:<6} estimate {r['estimate'] / mib:10.1f} MiB  not built: {r['failed']}"
    error = r["estimate"] / r["measured"] - 1
    return (f"{r['graph']:<34} {r['precision']:<6} binary {r['measured'] / mib:10.1f} MiB  estimate "
            f"{r['estimate'] / mib:10.1f} MiB  {100 * error:+6.1f}%  (spill {((r['spill_measured'] or 0) / mib):.1f} MiB)")


def summary(rows: list[dict]) -> str:
    return summary_line([abs(r["estimate"] / r["measured"] - 1) for r in rows if r["measured"]])


def summary_line(errors: list[float]) -> str:
    within = sum(e <= 0.10 for e in errors)
    return (f"memory estimate: {len(errors)} graphs, {within} within +-10% of the binary's figure (median |error| "
            f"{100 * statistics.median(errors):.1f}%, max {100 * max(errors):.1f}%)")


def summary_of_lines(lines: list[str]) -> str:
    """The summary line of a table's rows as printed (their error column), for --append."""
    import re

    return summary_line([abs(float(m.group(1))) / 100 for line in lines
                         if (m := re.search(r"MiB\s+([+-]\d+\.\d)%", line))])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, help="a built project (its build/report/report.json)")
    parser.add_argument("--sizes", nargs="*", default=["100M", "300M", "1B"])
    parser.add_argument("--no-w8a16", action="store_true", help="skip the quantized small transformers")
    parser.add_argument("--max-gb", type=float, default=14.0)
    parser.add_argument("--append", action="store_true",
                        help="add the project's rows to the last run's table (benchmarks/results) instead of compiling")
    args = parser.parse_args()
    rows = from_project(args.project) if args.project else []
    if args.append:  # the synthetic rows of the last run, kept as they were measured
        kept = RESULT.read_text().split("\n\n")[0].splitlines() if RESULT.is_file() else []
        lines = [line for line in kept if "(demo)" not in line] + [_row(r) for r in rows]
        lines += ["", summary_of_lines(lines)]
        print(lines[-1])
        RESULT.write_text("\n".join(lines) + "\n")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        rows += synthetic(Path(tmp), args.sizes, args.max_gb, not args.no_w8a16)
    lines = [_row(r) for r in rows] + ["", summary(rows)]
    print(lines[-1])
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
