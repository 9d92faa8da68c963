"""The cluster cost benchmark at its smallest size: a real tiny build, a real local Dask cluster (Dask's CLI on
127.0.0.1), real trivial calls through every executor, and the model's table saying what it is."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_cluster_cost.py"


@pytest.mark.slow
def test_cluster_cost_runs_at_a_tiny_size_and_says_it_is_a_model() -> None:
    result = subprocess.run([sys.executable, str(BENCH), "--tiny", "--calls", "2"], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    out = result.stdout
    for stage in ("export", "simplify", "lint", "cpucheck", "config", "context", "simulate", "simverify"):
        row = re.search(rf"^{stage}\s+1\s+([\d.]+)\s+\d+\s+\d+\s+(yes|no)\s+([\d.]+)\s+([+-][\d.]+)\s+([+-][\d.]+)\s+(\d+)$",
                        out, re.M)
        assert row, f"no row for {stage}:\n{out}"
        assert float(row.group(5)) > 0, f"{stage}: a Dask call cannot cost less than an in-process one:\n{out}"
        assert int(row.group(6)) > 0, f"{stage}: a Dask call ships its record through the store at least:\n{out}"
    for workers in ("none", "2", "8", "32"):
        assert re.search(rf"^\s+{workers}\s+[\d.]+\s+[\d.]+x$", out, re.M), out
    assert "not a measured cluster" in out and "load average" in out


BENCH_TIED = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_tied_embedding.py"


def test_tied_embedding_benchmark_shows_the_compiler_keeps_one_copy_only_for_a_run_time_projection() -> None:
    """What the Whisper decoder's `embedding: once-on-npu` relies on, compiled for real at a small vocabulary: the
    lookup and the projection on one initializer give a binary with two copies of the table; the projection reading
    a run-time copy gives one, as does no lookup at all (a QNN upgrade that changes this shows here first)."""
    result = subprocess.run([sys.executable, str(BENCH_TIED), "--vocab", "4096"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = {m.group(1): (int(m.group(2)), float(m.group(3)), m.group(4))
            for m in re.finditer(r"^(twice|once|one-hot|host)\s+(\d+)\s+([\d.]+)\s+[\d.]+\s+(.+)$", result.stdout, re.M)}
    assert set(rows) == {"twice", "once", "one-hot", "host"}, result.stdout
    assert all(on_cpu == "nothing" for _, _, on_cpu in rows.values()), result.stdout
    assert 1.0 <= rows["once"][1] < 1.2 and 1.0 <= rows["host"][1] < 1.2, result.stdout
    assert rows["twice"][1] >= 2.0 and rows["one-hot"][1] >= 2.0, result.stdout
    assert "table [4096, 384] fp16 = 3145728 bytes" in result.stdout


BENCH_BIG = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_big_graphs.py"


@pytest.mark.slow
def test_big_graphs_benchmark_compiles_a_transformer_whole_and_in_two_parts_that_chain_to_the_same_output(tmp_path):
    rows = tmp_path / "rows.jsonl"
    proc = subprocess.run([sys.executable, str(BENCH_BIG), "--sizes", "1M", "--parts", "2", "--json", str(rows)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = json.loads(rows.read_text())
    assert row["params"] == 4 * 12 * 128 * 128 + 4 * (4 * 128 + 2)  # 4 blocks of 12 w^2, norms and two scalars
    assert "error" not in row["whole"] and all("error" not in part for part in row["parts"])
    assert row["parts"][0]["cut"] == ["b1.res2"]  # the residual stream between blocks 2 and 3
    assert row["whole"]["bin_bytes"] > row["fp16_bytes"] and row["whole"]["peak_rss_gb"] > 0
    assert abs(sum(p["bin_bytes"] for p in row["parts"]) - row["whole"]["bin_bytes"]) < 0.1 * row["whole"]["bin_bytes"]
    assert row["chain_vs_whole_cosine"] > 0.999


def _bench_module(name: str):
    """benchmarks/<name>.py as a module (benchmarks/ is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def node_cost_bench():
    return _bench_module("bench_node_cost")


def test_node_cost_fit_recovers_the_overhead_and_a_uniform_slowdown_cancels():
    """NODE_OVERHEAD's arithmetic on cycles made from known costs: per op a / b (less the 128 element-ops a node on
    [1, 128] is counted for); a round where the host slowed every graph alike gives the same figure, one where it
    slowed only the MatMuls shows in the spread. The graphs' work is counted as if-to-where counts it."""
    bench = node_cost_bench()
    assert bench.work(bench.chain("Add", 4)) == (4, 4 * 128) and bench.work(bench.matmul(64)) == (1, 64 ** 3)
    per_mac, graph = 0.25, 5000.0
    per_node = dict(zip(bench.OPS, (20000.0, 8000.0, 32000.0, 21000.0, 30000.0, 2500.0)))
    per_element = dict(zip(bench.OPS, (60.0, 25.0, 500.0, 55.0, 300.0, 30.0)))
    rows = []
    for op in bench.OPS:
        rows += [{"family": "chain", "op": op, "nodes": n, "element_ops": 128 * n,
                  "cycles": graph + n * per_node[op] + 128 * n * per_element[op]} for n in bench.CHAIN]
        rows += [{"family": "wide", "op": op, "nodes": 8, "element_ops": 8 * w,
                  "cycles": graph + 8 * per_node[op] + 8 * w * per_element[op]} for w in bench.WIDE]
    rows += [{"family": "matmul", "op": "MatMul", "nodes": 1, "element_ops": m ** 3, "cycles": graph + per_mac * m ** 3}
             for m in bench.MATMUL]
    summary = bench.summarize(rows)
    assert summary["cycles_per_multiply_add"] == pytest.approx(per_mac)
    for op in bench.OPS:  # a chain's slope per node holds its 128 elements' cost too, which a node is counted for
        assert summary["ops"][op]["overhead"] == pytest.approx((per_node[op] + 128 * per_element[op]) / per_mac - 128)
        assert summary["ops"][op]["element_in_multiply_adds"] == pytest.approx(per_element[op] / per_mac)
    rounds = [[r["cycles"], 1.7 * r["cycles"], r["cycles"] * (2.0 if r["family"] == "matmul" else 1.0)] for r in rows]
    spread = bench.spread([{**r, "runs": runs} for r, runs in zip(rows, rounds)])
    low, high = spread["median"]
    assert high == pytest.approx(summary["overhead"]) and low < 0.6 * summary["overhead"]


def test_compare_reports_sees_a_changed_verdict_through_timings_and_additions(tmp_path: Path) -> None:
    """benchmarks/compare_reports.py, what the demo's before/after comparison ran: timings, digests and the project's
    folder are no difference; a changed metric or status is one, named; a model or field added since is listed apart."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        from compare_reports import compare, main
    finally:
        sys.path.remove(str(BENCH.parent))

    def report(root: str, seconds: float, cosine: float, status: str = "passed", **more) -> dict:
        target = {"name": "vad-SM8650", "status": status, "stages": {"simverify": {
            "seconds": seconds, "log": f"{root}/build/x.log", "metrics": {"p": {"cosine": cosine}},
            "made_from": {"key": root}, "checks": [{"kind": "agreement", "value": 1.0}]}}}
        return {"summary": {"targets": 1 + len(more.get("targets", [])), "ok": status == "passed"},
                "targets": [target] + more.get("targets", []), "graphs": [{"name": "vad", "status": "passed", **more.get("graph", {})}]}

    before = report("/a", 1.0, 0.99991)
    same = compare(before, report("/b", 7.5, 0.99991), ("/a", "/b"))
    assert same["differ"] == [] and same["equal"] == 9 and not same["entries_added"] and not same["fields_added"]
    changed = compare(before, report("/b", 1.0, 0.998, "failed"), ("/a", "/b"))
    assert {(name, path) for name, path, _, _ in changed["differ"]} == {
        ("targets:vad-SM8650", ".status"), ("targets:vad-SM8650", ".stages.simverify.metrics.p.cosine"),
        ("summary", ".ok")}
    grown = compare(before, report("/b", 1.0, 0.99991, targets=[{"name": "kws-SM8650", "status": "passed"}],
                                   graph={"memory": {"resident": 3}}), ("/a", "/b"))
    assert grown["entries_added"] == ["targets:kws-SM8650"] and dict(grown["fields_added"]) == {".memory.resident": 1}
    assert [d[1] for d in grown["differ"]] == [".targets"]  # the summary counts the added target
    versions = compare({"targets": [{"name": "t", "toolchain": {"onnxruntime": "1.32.0"}, "compile_seconds": 1}]},
                       {"targets": [{"name": "t", "toolchain": {"onnxruntime": "1.33.0"}, "compile_seconds": 2}]})
    assert [d[1] for d in versions["differ"]] == [".toolchain.onnxruntime"]  # a version is no timing
    for name, data in (("before", before), ("after", report("/b", 2.0, 0.5))):
        (tmp_path / name / "build" / "report").mkdir(parents=True)
        (tmp_path / name / "build" / "report" / "report.json").write_text(json.dumps(data))
    assert main([str(tmp_path / n / "build" / "report" / "report.json") for n in ("before", "after")]) == 1


def test_whisper_ties_noise_has_the_signal_to_noise_ratio_asked_for() -> None:
    """benchmarks/bench_whisper_ties.py's perturbation: each window gets noise of its own power at the SNR asked,
    the same draws from the same seed, the windows themselves untouched."""
    from qnn_tasks.judge import metrics

    bench = _bench_module("bench_whisper_ties")
    rng = np.random.default_rng(3)
    windows = np.stack([rng.standard_normal((1, 50, 8)).astype(np.float32) * scale for scale in (0.01, 1.0, 30.0)])
    kept = windows.copy()
    for snr in (40.0, 24.0):
        noisy = bench.with_noise(np.random.default_rng(0), windows, snr)
        assert noisy.shape == windows.shape and noisy.dtype == np.float32
        assert [metrics.snr_db(w, n) for w, n in zip(windows, noisy)] == pytest.approx([snr] * 3, abs=1e-3)
        assert np.array_equal(noisy, bench.with_noise(np.random.default_rng(0), windows, snr))
    assert np.array_equal(windows, kept)
