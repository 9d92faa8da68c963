"""What one stage call costs beyond its own work, per executor, and what that means for a cluster.

    python benchmarks/bench_cluster_cost.py [--calls N] [--tree BUILT_PROJECT]

1. Per-call overhead: N trivial calls (the `config` stage: a few KB of JSON written) run in-process, through the
   child executor (a persistent child process), and through the Dask executor on a local cluster started with
   Dask's own CLI on 127.0.0.1 (2 workers, cluster/dask.yaml, a folder as the shared store). Overhead = the
   executor's median wall time per call minus the in-process one: for Dask that is the scheduler round trip,
   uploading inputs, the worker's scratch copy, storing and restoring outputs, and the digests on both sides.
2. Bytes shipped per call, per stage kind of the example matrix: inputs up + outputs down, from a built tree
   (`--tree`, default: the test examples built once in a temp folder, which takes minutes).
3. Expected speedup for 2, 8, 32 workers (Amdahl, with the critical path as a floor): the measured stage times
   of that tree, the per-call Dask overhead, and the serial part (planning = one no-op doit, the report).
   A model from one machine's measurements, not a measured cluster.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(tmp: Path, workers: int = 2) -> tuple[str, list[subprocess.Popen]]:
    env = {**os.environ, "DASK_CONFIG": str(REPO / "cluster"), "PYTHONPATH": str(REPO)}
    port = free_port()
    logs = tmp / "dask-logs"
    logs.mkdir()
    procs = [subprocess.Popen(["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                              env=env, stdout=open(logs / "scheduler.log", "w"), stderr=subprocess.STDOUT)]
    address = f"tcp://127.0.0.1:{port}"
    for i in range(workers):
        procs.append(subprocess.Popen(["dask", "worker", address, "--nthreads", "1", "--nworkers", "1",
                                       "--host", "127.0.0.1", "--no-dashboard", "--name", f"w{i}"], env=env,
                                      stdout=open(logs / f"w{i}.log", "w"), stderr=subprocess.STDOUT))
    from distributed import Client

    with Client(address, timeout=60) as client:
        client.wait_for_workers(workers, timeout=120)
    return address, procs


def stop_cluster(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def config_calls(root: Path, n: int) -> list:
    """n `config` calls for the example project (distinct targets), heavy and remote so executors take them."""
    from qnn_tasks.plan.stages import CHIP_STAGES, Planner
    from qnn_tasks.run.calls import StageCall
    from qnn_tasks.spec.project import load_project

    planner = Planner(load_project(root))
    row = next(r for r in CHIP_STAGES if r.name == "config")
    ct = planner.chips[0]
    plan = row.plan(planner, row, ct)
    profile = planner.binding(ct).profile_dict(root)
    return [StageCall(stage="config", target=f"{plan.name}-{i}", args=plan.args(), inputs=[],
                      out_dir=f"build/bench/{i}/config", outputs=[f"build/bench/{i}/config/{Path(o).name}"
                                                                  for o in plan.outputs],
                      record=f"build/bench/{i}/config/config.json", key=f"bench-{i}-{time.time_ns()}",
                      toolchain=profile, heavy=True, remote=True, runner=row.runner) for i in range(n)]


def per_call(executor, calls: list) -> list[float]:
    times = []
    for call in calls:
        start = time.perf_counter()
        outcome = executor.run(call, None)
        times.append(time.perf_counter() - start)
        if not outcome.get("ok"):
            raise SystemExit(f"{call.stage}:{call.target} failed: {outcome.get('error')}")
    return times


def overheads(root: Path, n: int, tmp: Path) -> dict[str, float]:
    from qnn_tasks.run.cache import Store
    from qnn_tasks.run.executors.dask import DaskExecutor
    from qnn_tasks.run.executors.local import Child, InProcess

    os.chdir(root)
    medians = {}
    inproc = InProcess()
    per_call(inproc, config_calls(root, 2))  # warm: imports
    medians["in-process"] = statistics.median(per_call(inproc, config_calls(root, n)))
    child = Child(str(root))
    per_call(child, config_calls(root, 2))
    medians["child"] = statistics.median(per_call(child, config_calls(root, n)))
    child.stop()
    address, procs = start_cluster(tmp)
    try:
        store = Store(str(tmp / "store"))
        dask = DaskExecutor(address.replace("tcp://", "dask://"), str(root), store)
        per_call(dask, config_calls(root, 2))
        medians["dask"] = statistics.median(per_call(dask, config_calls(root, n)))
        dask.stop()
    finally:
        stop_cluster(procs)
    return medians


def built_tree(tmp: Path) -> Path:
    from conftest import copy_project

    project = copy_project(tmp / "examples")
    subprocess.run([sys.executable, "-m", "doit", "-n", "2"], cwd=project.root, check=True, capture_output=True)
    return project.root


def stage_table(root: Path) -> dict[str, dict[str, float]]:
    """Per stage kind: calls, median seconds, bytes in (inputs) and out (outputs) per call, from the records."""
    from qnn_tasks.plan.stages import Planner, build_stage_defs, targets_of
    from qnn_tasks.spec.project import load_project

    os.chdir(root)
    planner = Planner(load_project(root))
    kinds: dict[str, dict[str, list[float]]] = {}
    for row in build_stage_defs(planner):
        for target in targets_of(planner, row):
            plan = row.plan(planner, row, target)
            if plan is None or plan.skip or not Path(plan.record).is_file():
                continue
            record = json.loads(Path(plan.record).read_text())
            size = lambda paths: sum(Path(p).stat().st_size for p in paths if Path(p).is_file())  # noqa: E731
            k = kinds.setdefault(row.name, {"seconds": [], "in": [], "out": [], "remote": row.remote})
            k["seconds"].append(float(record.get("seconds") or 0))
            k["in"].append(size(plan.file_dep))
            k["out"].append(size(plan.outputs))
    return {name: {"calls": len(v["seconds"]), "seconds": sum(v["seconds"]), "median_s": statistics.median(v["seconds"]),
                   "in_kib": statistics.median(v["in"]) / 1024, "out_kib": statistics.median(v["out"]) / 1024,
                   "remote": v["remote"]} for name, v in kinds.items()}


def serial_seconds(root: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "doit"], cwd=root, check=True, capture_output=True)  # planning, no-op
    planning = time.perf_counter() - start
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "doit", "forget", "report"], cwd=root, check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "doit", "report"], cwd=root, check=True, capture_output=True)
    return planning + (time.perf_counter() - start)


def critical_path(table: dict[str, dict[str, float]]) -> float:
    """The longest chain one target waits for: its graph stages, then its chip stages (median each)."""
    return sum(v["median_s"] for v in table.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--tree", type=Path, help="a project built already (default: build the test examples)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_cluster_") as tmp_name:
        tmp = Path(tmp_name)
        root = opts.tree.resolve() if opts.tree else built_tree(tmp)
        scratch = tmp / "calls"
        shutil.copytree(root, scratch, ignore=shutil.ignore_patterns("build", ".doit.db*"))
        medians = overheads(scratch, opts.calls, tmp)
        base = medians["in-process"]
        print(f"per call ({opts.calls} `config` calls each, median): in-process {base * 1000:.1f} ms; "
              + "; ".join(f"{k} {v * 1000:.1f} ms (+{(v - base) * 1000:.1f} ms)" for k, v in medians.items()
                          if k != "in-process"))
        table = stage_table(root)
        dask_overhead = medians["dask"] - base
        print(f"\n{'stage':<11}{'calls':>6}{'total s':>9}{'median s':>10}{'in KiB':>9}{'out KiB':>9}{'remote':>8}")
        for name, v in table.items():
            print(f"{name:<11}{v['calls']:>6}{v['seconds']:>9.1f}{v['median_s']:>10.2f}{v['in_kib']:>9.0f}"
                  f"{v['out_kib']:>9.0f}{'yes' if v['remote'] else 'no':>8}")
        serial = serial_seconds(root)
        local = sum(v["seconds"] for v in table.values())
        remote = sum(v["seconds"] + v["calls"] * dask_overhead for v in table.values() if v["remote"])
        client = sum(v["seconds"] for v in table.values() if not v["remote"])  # light stages stay on the client
        floor = critical_path(table)
        print(f"\nserial part: {serial:.1f} s (planning + report); stage work {local:.1f} s, of it {remote:.1f} s "
              f"on workers incl. {dask_overhead * 1000:.0f} ms per call; critical path {floor:.1f} s")
        print(f"{'workers':>8}{'expected wall s':>17}{'speedup vs 1 local':>20}")
        for workers in (1, 2, 8, 32):
            wall = serial + client + max(remote / workers, floor)
            print(f"{workers:>8}{wall:>17.1f}{(serial + local) / wall:>19.2f}x")
        print("(a model from this machine's measurements: Amdahl with the measured serial part, never below the "
              "critical path; not a measured cluster)")


if __name__ == "__main__":
    main()
