"""The precisions of one graph side by side, built and verified by the tool itself (docs/precision.md).

    python benchmarks/bench_precision.py minilm                  # all-MiniLM-L6-v2 at 16 tokens (models/minilm)
    python benchmarks/bench_precision.py transformer --size 600M # bench_big_graphs' transformer, random weights
    python benchmarks/bench_precision.py transformer --size 100M --outlier 2 --order w8a16 w8a16-mixed  # a repair
    python benchmarks/bench_precision.py minilm --append         # add the table to benchmarks/results/precision.txt

A fresh project in a temporary folder (this repository's dodo.py and socs/, the graph's model folder) declares the
graph with `precision: {auto: [w4a16, w4a16-mixed, w8a16, w8a16-mixed, fp16]}` for one chip (SM8650), and `doit`
builds and verifies every candidate on the x86 HTP simulator (real quantizer, compiler and simulator): so each row is
what the tool measured, and the last says which one `auto` ships. Per precision: the binary's bytes, the share of
weight bytes its repair kept at 16 bits, the minimum cosine against the CPU, the task check (MiniLM: every sentence
keeps its nearest neighbour) and the seconds its build took (repair + quantize + compile + simulate + judge).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULT = ROOT / "benchmarks" / "results" / "precision.txt"
ORDER = ["w4a16", "w4a16-mixed", "w8a16", "w8a16-mixed", "fp16"]
SOC = "SM8650"


def auto(order: list[str]) -> str:
    return "precision: {auto: [" + ", ".join(order) + "]}"


def minilm(project: Path, order: list[str]) -> str:
    """models/minilm at 16 tokens only (`auto` stands alone: no dims), for SM8650."""
    shutil.copytree(ROOT / "models" / "minilm", project / "models" / "minilm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    spec = project / "models" / "minilm" / "model.yaml"
    text = spec.read_text()
    text = re.sub(r"    dims:.*\n.*\n", "", text)
    text = text.replace("[1, seq]", "[1, 16]").replace("precision: [fp16, w8a16]", auto(order))
    text = re.sub(r"    socs: \[.*\]", f"    socs: [{SOC}]", text)
    spec.write_text(text)
    with (project / "models" / "minilm" / "export.py").open("a") as code:  # what dims' padding would do, at 16
        code.write("""

_natural_samples = samples


def samples(ctx):  # the benchmark's one length: each sentence padded with token 0 / mask 0, longer ones left out
    return [{k: np.pad(v, ((0, 0), (0, 16 - v.shape[1]))) for k, v in s.items()}
            for s in _natural_samples(ctx) if s["input_ids"].shape[1] <= 16]
""")
    return "minilm"


def transformer(project: Path, size: str, order: list[str], outlier: int | None = None) -> str:
    """bench_big_graphs' pre-norm transformer (random weights, sequence 16) as a model with an ONNX source;
    `outlier`: the block with an outlier channel (bench_big_graphs.build)."""
    from bench_big_graphs import SEQ, SIZES, build

    width, blocks = SIZES[size]
    folder = project / "models" / "transformer"
    (folder / "samples").mkdir(parents=True)
    params = build(folder / "transformer.onnx", width, blocks, outlier=outlier)
    odd = "" if outlier is None else f", an outlier channel in block {outlier}"
    np.savez(folder / "samples" / "x.npz",
             x=np.random.default_rng(1).standard_normal((8, 1, SEQ, width)).astype(np.float32))
    # a repair's budget: the plain precision, the sensitivity graph and one step (each a compile of the whole graph)
    budget = ", repair_budget: 3" if any(p.endswith("-mixed") for p in order) else ""
    (folder / "model.yaml").write_text(f"""licence: MIT
description: synthetic pre-norm transformer, {params / 1e6:.0f}M parameters, random weights{odd} (benchmark)
source: {{file: transformer.onnx}}
graphs:
  transformer:
    inputs:
      x: {{shape: [1, {SEQ}, {width}], dtype: float32}}
    outputs:
      y: {{shape: [1, {SEQ}, {width}]}}
    {auto(order)}
    socs: [{SOC}]
    samples: {{files: "samples/*.npz"}}
    calibration: {{samples: 8{budget}}}
    verify: {{samples: 4}}
""")
    return "transformer"


def table(project: Path, graph: str, seconds: float, load: str, order: list[str], label: str = "") -> list[str]:
    choose = json.loads(next(project.glob(f"build/*/{graph}/*/{order[0]}/{SOC}/choose/choose.json")).read_text())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    lines = [f"{graph}{label} on {SOC} (x86 HTP simulator) at {commit.strip() or 'an unknown commit'}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, doit in {seconds:.0f} s, load before: {load}",
             "| precision | verdict | .bin bytes | kept at 16 bits | min cosine | task check | build s |",
             "|---|---|---|---|---|---|---|"]
    for c in choose["candidates"]:
        checks = ", ".join(f"{k['kind']} {k['value']:.4g}" for k in c.get("checks") or [] if k.get("value") is not None)
        share = c.get("promoted_share")
        lines.append(f"| {c['precision']} | {c['status']} | {c['binary_bytes'] or '-':,} | "
                     f"{'-' if share is None else f'{100 * share:.1f}%'} | {c.get('min_cosine')} | {checks or '-'} | "
                     f"{c['build_seconds']} |")
    chosen = choose.get("chosen") or {}
    lines.append(f"| auto | chose {chosen.get('precision', 'none')} | {chosen.get('binary_bytes') or '-':,} | | | | "
                 f"{choose['build_seconds']} ({choose['compiles']} compiles) |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("graph", choices=("minilm", "transformer"))
    parser.add_argument("--size", default="600M", help="transformer size (bench_big_graphs.SIZES)")
    parser.add_argument("--outlier", type=int, help="transformer: the block with an outlier channel (plain w8a16 "
                        "fails; the repair has something to find)")
    parser.add_argument("--order", nargs="+", default=ORDER, help="the candidates (default: all five)")
    parser.add_argument("--jobs", default="2", help="doit -n: 1 for a graph whose quantizer needs the memory twice")
    parser.add_argument("--keep", help="build in this folder and keep it (default: a temporary one)")
    parser.add_argument("--append", action="store_true", help=f"append the table to {RESULT.relative_to(ROOT)}")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-precision-"))
    project = work / "p"
    if project.exists():  # --keep of an earlier run: its build is reused, its spec written anew
        shutil.rmtree(project / "models", ignore_errors=True)
    project.mkdir(parents=True, exist_ok=True)
    for name in ("dodo.py", "socs"):
        if (project / name).exists():
            continue
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(ROOT / name, project / name)
    graph = (minilm(project, args.order) if args.graph == "minilm"
             else transformer(project, args.size, args.order, args.outlier))
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "doit", "-n", args.jobs, f"choose:{graph}-{SOC}"], cwd=project,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.monotonic() - start
    if run.returncode != 0:
        print(run.stdout[-4000:], run.stderr[-4000:], sep="\n")
        return 1
    label = "" if graph == "minilm" else f" {args.size}" + ("" if args.outlier is None else f" (outlier in block "
                                                                                          f"{args.outlier})")
    lines = table(project, graph, seconds, load, args.order, label)
    print("\n".join(lines))
    if args.append:
        with RESULT.open("a") as out:
            out.write("\n".join(lines) + "\n\n")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
