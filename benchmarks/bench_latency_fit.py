"""Fit the phone-latency estimate to AI Hub Models' published timings and check it by leaving models out.

    python benchmarks/bench_latency_fit.py --rebuild     # rebuild every architecture (random weights), export ONNX,
                                                         # read its features (qnn_tasks/data/latency/features.json)
    python benchmarks/bench_latency_fit.py               # fit from the committed features; print the table

Needs for --rebuild: pip install --no-deps -e .[latency-bench] (torchvision and timm built for the pinned torch).
Data: qnn_tasks/data/latency/aihub_perf.csv (benchmarks/aihub_perf_table.py). Writes the fitted coefficients to
qnn_tasks/data/latency/fit.json (what a build applies: arithmetic) and this run's output to
benchmarks/results/latency_fit.txt (tests/test_latency.py checks docs/latency.md quotes its summary line).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
DATA = ROOT / "qnn_tasks" / "data" / "latency"
FEATURES = DATA / "features.json"
RESULT = ROOT / "benchmarks" / "results" / "latency_fit.txt"


def rebuild(work: Path, only: list[str] | None) -> None:
    """Export each architecture at AI Hub's input shape and store its ONNX features."""
    import torch
    from latency_archs import ARCHS

    from qnn_tasks.latency.features import onnx_features

    torch.manual_seed(0)
    torch.backends.mha.set_fastpath_enabled(False)  # the fused attention kernel has no ONNX export
    feats = json.loads(FEATURES.read_text()) if FEATURES.is_file() else {}
    for name, (_component, build) in ARCHS.items():
        if only and name not in only:
            continue
        t0 = time.time()
        module, example = build()
        path = work / f"{name}.onnx"
        with torch.no_grad():
            torch.onnx.export(module.eval(), example, str(path), opset_version=17, dynamo=False)
        feats[name] = onnx_features(path)
        path.unlink()
        for extra in work.glob("*"):
            extra.unlink()
        f = feats[name]
        print(f"{name:34s} {f['macs'] / 1e9:8.2f} GMAC {f['params'] / 1e6:7.1f} M params {f['nodes']:5d} nodes"
              f"  ({time.time() - t0:.0f} s)", flush=True)
        FEATURES.write_text(json.dumps(dict(sorted(feats.items())), indent=1) + "\n")


RUNTIMES = ("onnx", "precompiled_qnn_onnx", "qnn_dlc", "qnn_context_binary")  # what we ship first: ORT + QNN EP
PRECISIONS = {"fp16": "float", "w8a16": "w8a16"}  # our precision -> AI Hub's name for it
MIN_MODELS = 15  # a chip is fitted when this many rebuilt models have a published time on it


def measurements(feats: dict, precision: str) -> list[dict]:
    """One published time per (model, chip): the first runtime of RUNTIMES that has one on the NPU, of our chips
    that run the precision."""
    import yaml
    from latency_archs import ARCHS

    socs = yaml.safe_load((ROOT / "qnn_tasks" / "data" / "socs.yaml").read_text())["socs"]
    runs = {name: row.get("runs", ["fp16", "w8a16"]) for name, row in socs.items()}
    rows = list(csv.DictReader(open(DATA / "aihub_perf.csv")))
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        component = ARCHS.get(r["model"], (None, None))[0]
        if r["model"] not in feats or r["precision"] != PRECISIONS[precision] or r["runtime"] not in RUNTIMES:
            continue
        if (component and r["component"] != component) or precision not in runs.get(r["chip"], []):
            continue
        if not r["layers_npu"] or int(r["layers_npu"]) == 0:
            continue  # ran on the CPU (e.g. a w8a16 onnx graph on a 7 Gen 4): not an NPU time
        key = (r["model"], r["chip"])
        if key not in best or RUNTIMES.index(r["runtime"]) < RUNTIMES.index(best[key]["runtime"]):
            best[key] = r
    per_chip: dict[str, int] = {}
    for _, chip in best:
        per_chip[chip] = per_chip.get(chip, 0) + 1
    return [r for (m, chip), r in sorted(best.items()) if per_chip[chip] >= MIN_MODELS]


def solve(terms, y, chip_index, n_chips: int):
    """log ms = log chip_scale + log(sum_k c_k term_k), c_k > 0 (fitted as logs): least squares on log ms."""
    import numpy as np
    from scipy.optimize import least_squares

    unit = terms.mean(axis=0) + 1e-9  # fit on terms of order 1

    def residual(theta):
        return theta[:n_chips][chip_index] + np.log(terms / unit @ np.exp(theta[n_chips:]) + 1e-12) - y

    theta = least_squares(residual, np.zeros(n_chips + terms.shape[1])).x
    scale, c = np.exp(theta[:n_chips]), np.exp(theta[n_chips:]) / unit
    return scale, c


def fit(feats: dict, precision: str) -> tuple[dict, list[dict]]:
    """The coefficients on every model, and each measurement's leave-one-model-out estimate."""
    import numpy as np

    from qnn_tasks.latency.estimate import terms_of

    rows = measurements(feats, precision)
    chips = sorted({r["chip"] for r in rows})
    models = sorted({r["model"] for r in rows})
    terms = np.array([terms_of(feats[r["model"]]) for r in rows], dtype=float)
    y = np.log(np.array([float(r["ms"]) for r in rows]))
    chip_index = np.array([chips.index(r["chip"]) for r in rows])
    loo = []
    for m in models:
        held = np.array([r["model"] == m for r in rows])
        scale, c = solve(terms[~held], y[~held], chip_index[~held], len(chips))
        for i in np.flatnonzero(held):
            est = float(scale[chip_index[i]] * terms[i] @ c)
            pub = float(rows[i]["ms"])
            loo.append({"model": m, "chip": rows[i]["chip"], "runtime": rows[i]["runtime"], "published": pub,
                        "estimated": est, "error": est / pub - 1})
    scale, c = solve(terms, y, chip_index, len(chips))
    return {"chips": chips, "models": models, "rows": rows, "scale": scale, "c": c}, loo


def summarize(fitted: dict, loo: list[dict], feats: dict) -> dict:
    """What fit.json keeps for one precision: coefficients, the fitted models' ranges and ops, the LOO error."""
    import math

    from qnn_tasks.latency.estimate import TERMS, terms_of

    chips, scale, c = fitted["chips"], fitted["scale"], fitted["c"]
    reference = scale[chips.index("SM8650")] if "SM8650" in chips else scale[0]
    errs = [abs(r["error"]) for r in loo]
    logs = [abs(math.log(r["estimated"] / r["published"])) for r in loo]
    values = [terms_of(feats[m]) for m in fitted["models"]]
    return {"measurements": len(fitted["rows"]), "models": fitted["models"],
            "chip_scale": {chip: float(f"{s / reference:.6g}") for chip, s in zip(chips, scale)},
            "terms": list(TERMS), "ms_per_unit": [float(f"{k * reference:.6g}") for k in c],
            "ranges": {name: [min(v[i] for v in values), max(v[i] for v in values)] for i, name in enumerate(TERMS)},
            "macs_range": [min(feats[m]["macs"] for m in fitted["models"]),
                           max(feats[m]["macs"] for m in fitted["models"])],
            "ops_seen": sorted({op for m in fitted["models"] for op in feats[m]["ops"]}),
            "band_log": round(percentile(logs, 90), 4),
            "fit_error": {"median_pct": round(100 * percentile(errs, 50), 1),
                          "p90_pct": round(100 * percentile(errs, 90), 1),
                          "models": len(fitted["models"]), "chips": len(chips),
                          "method": "leave-one-model-out"}}


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.array(values), q))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rebuild", action="store_true", help="re-export every architecture and re-read its features")
    ap.add_argument("--only", nargs="*", help="with --rebuild: these AI Hub model ids only")
    a = ap.parse_args(argv)
    if a.rebuild:
        with tempfile.TemporaryDirectory(prefix="latency-onnx-") as work:
            rebuild(Path(work), a.only)
    feats = json.loads(FEATURES.read_text())
    out, coefficients = [], {}
    for precision in PRECISIONS:
        fitted, loo = fit(feats, precision)
        out.append(f"# {precision} (AI Hub precision {PRECISIONS[precision]!r})")
        out.append(f"{'model':34s} {'chip':9s} {'runtime':20s} {'published':>10s} {'estimated':>10s} {'error':>7s}")
        for r in loo:
            out.append(f"{r['model']:34s} {r['chip']:9s} {r['runtime']:20s} {r['published']:10.3f} "
                       f"{r['estimated']:10.3f} {100 * r['error']:+6.0f}%")
        coefficients[precision] = summarize(fitted, loo, feats)
        e = coefficients[precision]["fit_error"]
        label = "" if precision == "fp16" else f" ({precision})"
        out.append(f"leave-one-model-out{label}: median {e['median_pct']:.0f}%, p90 {e['p90_pct']:.0f}% "
                   f"over {e['models']} models x {e['chips']} chips")
        out.append("")
    commit = next(csv.DictReader(open(DATA / "aihub_perf.csv")))["source_commit"]
    (DATA / "fit.json").write_text(json.dumps({
        "schema": "qnn-npu-compile/latency-fit/v1",
        "source": {"repository": "qualcomm/ai-hub-models", "commit": commit,
                   "table": "qnn_tasks/data/latency/aihub_perf.csv", "runtimes": list(RUNTIMES)},
        "fitted_by": "benchmarks/bench_latency_fit.py", "precisions": coefficients}, indent=1) + "\n")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text("\n".join(out))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
