"""Read AI Hub Models' published on-device timings (every `qai_hub_models/models/<model>/perf.yaml`) out of a git
checkout of qualcomm/ai-hub-models into qnn_tasks/data/latency/aihub_perf.csv, one row per
(model, component, precision, device, runtime), with the file and commit each number was read from.

    python benchmarks/aihub_perf_table.py --git-dir /path/to/ai-hub-models/.git [--rev HEAD]

Only devices whose chip is in our SoC table are kept (DEVICE_CHIP below). The numbers are facts typed by
AI Hub: one device each, under AI Hub's own settings (its runtime, performance mode and QAIRT version).
"""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

import yaml

# AI Hub's device names -> our SoC table's row (qnn_tasks/data/socs.yaml).
DEVICE_CHIP = {
    "Samsung Galaxy S23": "SM8550",
    "Samsung Galaxy S24": "SM8650",
    "Samsung Galaxy S25": "SM8750",
    "Snapdragon 8 Elite Gen 5 QRD": "SM8850",
    "Snapdragon X Elite CRD": "SC8380XP",
    "Snapdragon X2 Elite CRD": "SC8480XP",
    "QCS8550 (Proxy)": "QCS8550",
    "SA8295P ADP": "SA8295",
    "Snapdragon 7 Gen 4 QRD": "SM7750",
}
COLUMNS = ["model", "component", "device", "chip", "runtime", "precision", "ms", "peak_mb_max", "layers_total",
           "layers_npu", "source_file", "source_commit"]
OUT = Path(__file__).resolve().parent.parent / "qnn_tasks" / "data" / "latency" / "aihub_perf.csv"


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True,
                          text=True).stdout


def rows_of(text: str, model: str, source: str, commit: str) -> list[dict]:
    doc = yaml.safe_load(text) or {}
    out = []
    for precision, block in sorted((doc.get("precisions") or {}).items()):
        for component, comp in sorted(((block or {}).get("components") or {}).items()):
            for device, runtimes in sorted((comp.get("performance_metrics") or {}).items()):
                chip = DEVICE_CHIP.get(device)
                if chip is None:
                    continue
                for runtime, m in sorted((runtimes or {}).items()):
                    ms = (m or {}).get("inference_time_milliseconds")
                    if m.get("job_status", "Passed") != "Passed" or ms is None:
                        continue
                    layers = m.get("layer_counts") or {}
                    out.append({"model": model, "component": component, "device": device, "chip": chip,
                                "runtime": runtime, "precision": precision, "ms": ms,
                                "peak_mb_max": (m.get("estimated_peak_memory_range_mb") or {}).get("max", ""),
                                "layers_total": layers.get("total", ""), "layers_npu": layers.get("npu", ""),
                                "source_file": source, "source_commit": commit})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--git-dir", required=True)
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    commit = git(a.git_dir, "rev-parse", a.rev).strip()
    files = [f for f in git(a.git_dir, "ls-tree", "-r", "--name-only", commit).splitlines()
             if f.startswith("qai_hub_models/models/") and f.endswith("/perf.yaml")]
    rows = []
    for f in files:
        rows += rows_of(git(a.git_dir, "show", f"{commit}:{f}"), f.split("/")[2], f, commit)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    models = {r["model"] for r in rows}
    print(f"{a.out}: {len(rows)} rows, {len(models)} models, from {len(files)} perf.yaml at {commit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
