"""How much time goes to orchestration around the real compiles, and what `doit -n 2` buys.

Copies the example models into a temp project restricted to 5 chips (fp16), builds the graph
stages once, then times real `doit config context` runs (clean toolchain tree each time):
  * overhead = wall time of the run - the sum of compile seconds the context records report
    (the onnxruntime compile call itself); both the whole-run share (process start, imports,
    doit, inspection, records) and the per-task share (stage time - compile time) are printed;
  * `-n 2` vs `-n 1`: wall time of the same run with two doit worker processes.

    python benchmarks/bench_compile_overhead.py [--reps N]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHIPS = ["SM8550", "SM8650", "SM8750", "SM8850", "QCS9100"]
GOAL = 0.03


def make_project(root: Path) -> Path:
    for name in ("dodo.py", "socs", "toolchain", "models"):
        src = REPO / name
        if not src.exists():  # toolchain/: the repo uses the packaged profiles (qnn_tasks/data/toolchain)
            continue
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / name)
    for spec in root.glob("models/*/model.yaml"):  # fp16 only, 5 chips
        text = re.sub(r"^    socs: .*\n", "", spec.read_text(), flags=re.M)  # the model's own chip list
        text = re.sub(r"^    precision: .*$", f"    precision: fp16\n    socs: [{', '.join(CHIPS)}]", text, flags=re.M)
        spec.write_text(re.sub(r"^    calibration: .*\n", "", text, flags=re.M))
    doit(root, "export", "simplify", "lint", "cpucheck")
    return root


def doit(root: Path, *args: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return time.perf_counter() - start


def compile_run(root: Path, workers: int) -> dict[str, float]:
    """One clean `doit config context` run: wall time, summed compile and stage seconds."""
    for tree in root.glob("build/*/*/ort-qnn-*"):
        shutil.rmtree(tree)
    doit(root, "forget", "config", "context")
    wall = doit(root, "-n", str(workers), "config", "context")
    records = [json.loads(p.read_text()) for p in root.glob("build/*/*/ort-qnn-*/*/*/context/context.json")]
    return {"wall": wall, "compile": sum(r["compile_seconds"] for r in records),
            "stage": sum(r["seconds"] for r in records), "tasks": len(records)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="runs per setting (median is reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as tmp:
        root = make_project(Path(tmp))
        serial = [compile_run(root, 1) for _ in range(args.reps)]
        parallel = [compile_run(root, 2) for _ in range(args.reps)]

    def med(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    wall, compile_s, stage = med(serial, "wall"), med(serial, "compile"), med(serial, "stage")
    per_task = (stage - compile_s) / stage
    whole = (wall - compile_s) / wall
    print(f"{serial[0]['tasks']} context tasks (2 example graphs x {len(CHIPS)} chips), median of {args.reps}")
    print(f"  compile calls (onnxruntime)    {compile_s:7.2f} s")
    print(f"  context stages (incl. checks)  {stage:7.2f} s   per-task orchestration {per_task:6.1%}"
          f"  (goal <= {GOAL:.0%}: {'ok' if per_task <= GOAL else 'OVER'})")
    print(f"  whole `doit config context`    {wall:7.2f} s   incl. process start, imports, doit: {whole:6.1%}")
    print(f"  `doit -n 2` vs `-n 1`          {med(parallel, 'wall'):7.2f} s vs {wall:.2f} s: "
          f"speed-up {wall / med(parallel, 'wall'):.2f}x")


if __name__ == "__main__":
    main()
