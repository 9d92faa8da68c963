"""What `doit dist` costs and what a package weighs, per model and per chip.

    python benchmarks/bench_dist.py [--tree BUILT_PROJECT] [--runs N]

1. A verified tree: `--tree` (a project built and verified already, e.g. after `doit`), or by default the test
   examples (MiniLM at 64 tokens and the Silero VAD, SM8650 + SM8750, fp16) built and verified here (about a minute).
2. `doit dist` into a fresh folder (`QNN_DIST`, nothing to link from: every file copied), then N more times into
   the same folder (incremental: unchanged files hard-linked from the package before). Wall time of the whole
   command, as a user sees it (doit's start-up included); the median of N.
3. The package's size per model: per chip folder (binaries, EPContext wrappers, provider options), the CPU
   fallback, the rest (manifest, schema, card), and the whole; each binary (chip and precision); plus the
   machine and its load average.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def build_examples(dest: Path) -> Path:
    """The suite's verified matrix (tests/conftest.py: matrix_project), built and verified here."""
    from conftest import matrix_project

    project = matrix_project(dest)
    result = project.doit("simverify", "report", env={"PYTHONPATH": str(REPO)})
    if result.returncode != 0:
        raise SystemExit(f"the example build failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return project.root


def dist(tree: Path, out: Path) -> float:
    env = {**os.environ, "QNN_DIST": str(out), "PYTHONPATH": os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", "dist"], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=1800)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"doit dist failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds


def sizes(package: Path) -> dict[str, int]:
    """Bytes per top-level part of a package: each chip folder, cpu/, runtime-libs/, and the files at its root."""
    parts: dict[str, int] = {}
    for path in package.rglob("*"):
        if path.is_file():
            rel = path.relative_to(package).parts
            key = rel[0] if len(rel) > 1 else "(manifest, schema, card)"
            parts[key] = parts.get(key, 0) + path.stat().st_size
    return dict(sorted(parts.items()))


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else "?"
    system = f"{platform.system()} {platform.release()}"
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {system}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, help="a project built and verified already")
    parser.add_argument("--runs", type=int, default=5, help="incremental runs after the first (default 5)")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-dist-"))
    try:
        tree = args.tree.resolve() if args.tree else build_examples(scratch / "project")
        load_before = os.getloadavg()
        out = scratch / "dist"
        cold = dist(tree, out)
        warm = [dist(tree, out) for _ in range(args.runs)]
        load_after = os.getloadavg()
        print(f"machine: {machine()}")
        print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")
        examples = "the test examples (MiniLM 64 tokens, VAD), SM8650 + SM8750, fp16"
        print(f"tree: {'--tree ' + str(tree) if args.tree else examples}")
        print(f"doit dist, every model, fresh folder (all copied): {cold:.2f} s")
        print(f"doit dist again, unchanged build (linked), median of {len(warm)}: {statistics.median(warm):.2f} s "
              f"(min {min(warm):.2f}, max {max(warm):.2f})")
        print(f"{'model':<14} {'part':<26} {'MiB':>9}")
        for package in sorted(p for p in out.iterdir() if not p.name.startswith(".")):
            parts = sizes(package)
            for part, size in parts.items():
                print(f"{package.name:<14} {part:<26} {size / 2**20:>9.2f}")
            print(f"{package.name:<14} {'(whole package)':<26} {sum(parts.values()) / 2**20:>9.2f}")
        print(f"{'binary':<40} {'MiB':>9}")
        for package in sorted(p for p in out.iterdir() if not p.name.startswith(".")):
            for binary in sorted(package.glob("*/*.bin")):
                name = f"{package.name}/{binary.relative_to(package)}"
                print(f"{name:<40} {binary.stat().st_size / 2**20:>9.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
