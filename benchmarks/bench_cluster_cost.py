"""What one stage call costs beyond its own work, per executor, and what that means for a cluster.

    python benchmarks/bench_cluster_cost.py [--calls N] [--tree BUILT_PROJECT | --tiny] [--client-jobs C]

1. A built tree: `--tree` (a project built already), `--tiny` (one small graph on one chip, built here in
   seconds: the smoke test's size) or, by default, the test examples built here with `doit -n 2` (minutes).
   Its records give, per stage kind, the calls, their measured seconds and the bytes each call reads and writes.
2. Per-call overhead, per stage kind: N trivial calls whose only work is to write outputs of the kind's median
   size from one input of its median size (random bytes, new for every call, as a real build's are), run
   in-process, through the child executor (a persistent child process) and through the Dask executor on a local
   cluster started with Dask's own CLI on 127.0.0.1 (2 workers, cluster/dask.yaml, a folder as the shared store).
   Overhead = the executor's median wall time per call minus the in-process one: for Dask that is the scheduler
   round trip, uploading the input, the worker's scratch copy, storing and restoring the outputs and the digests
   on both sides. Bytes shipped = what the store grew by per call (input and outputs, manifest).
3. Expected wall time for 2, 8, 32 workers: serial part (planning = one no-op `doit`, the report) + the largest of
   the critical path (the tree's own dependencies, with the overhead on each remote call), the client-side stages
   over the client's cores, and the remote stages (work + overhead) over the workers. A model from one machine's
   measurements, an optimistic bound (perfect packing, no contention), not a measured cluster.
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "tests"))
WORKERS = (2, 8, 32)
RUNNER = "bench_cluster_cost:write_outputs"  # the trivial stage: importable where calls run (PYTHONPATH below)


def _python_path() -> str:
    """REPO (qnn_tasks) and this folder (the trivial runner) for every process a call may run in."""
    return os.pathsep.join([str(REPO), str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def write_outputs(call) -> dict[str, Any]:
    """The trivial stage: read the input, write each output with the size asked for. Its record: the bytes."""
    read = sum(len(Path(p).read_bytes()) for p in call.inputs)
    for path, size in zip(call.outputs, call.args["sizes"]):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(os.urandom(size))
    return {"read": read, "written": sum(call.args["sizes"])}


# ------------------------------------------------------------------ the cluster

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(tmp: Path, workers: int = 2) -> tuple[str, list[subprocess.Popen]]:
    """`dask scheduler` and `dask worker`s on 127.0.0.1 (random free port), with the project's Dask settings."""
    env = {**os.environ, "DASK_CONFIG": str(REPO / "cluster"), "PYTHONPATH": _python_path()}
    port = free_port()
    logs = tmp / "dask-logs"
    logs.mkdir()
    procs: list[subprocess.Popen] = []

    def start(name: str, argv: list[str]) -> None:
        with open(logs / f"{name}.log", "w") as log:  # the child keeps its own descriptor
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          cwd=tmp, start_new_session=True))

    start("scheduler", ["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"])
    address = f"tcp://127.0.0.1:{port}"
    for i in range(workers):
        start(f"w{i}", ["dask", "worker", address, "--nthreads", "1", "--nworkers", "1", "--host", "127.0.0.1",
                        "--no-dashboard", "--name", f"w{i}", "--local-directory", str(tmp / f"w{i}")])
    from distributed import Client

    try:
        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
    except BaseException:
        stop_cluster(procs)
        raise
    return address, procs


def stop_cluster(procs: list[subprocess.Popen]) -> None:
    """Stop the processes this benchmark started (by their own pids), workers first."""
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------ the built tree

def built_tree(tmp: Path, tiny: bool) -> tuple[Path, float]:
    """The test examples (or the tiny project) built here with `doit -n 2`; the build's wall time."""
    from conftest import copy_project

    if tiny:
        from tiny_project import tiny_project

        project = tiny_project(tmp / "tiny", samples=2)
    else:
        project = copy_project(tmp / "examples")
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "doit", "-n", "2"], cwd=project.root, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    # under `doit -n` the run's own report may be written before its last stages finish (and then fails its gate):
    # `doit report` afterwards is the verdict
    verdict = subprocess.run([sys.executable, "-m", "doit", "report"], cwd=project.root, capture_output=True, text=True)
    if verdict.returncode:
        raise SystemExit(f"building {project.root} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
                         f"{verdict.stdout[-1000:]}")
    return project.root, seconds


def _size(paths: list[str]) -> int:
    return sum(Path(p).stat().st_size for p in paths if Path(p).is_file())


def tree_tasks(root: Path) -> tuple[dict[str, dict[str, Any]], Any]:
    """Every built task of the tree: stage, measured seconds, bytes in and out, what it waits for; and a profile."""
    from qnn_tasks.modelspec.load import load_project
    from qnn_tasks.plan.matrix import build_stage_defs, targets_of
    from qnn_tasks.plan.planner import Planner

    os.chdir(root)
    planner = Planner(load_project(root))
    tasks: dict[str, dict[str, Any]] = {}
    made_by: dict[str, str] = {}
    for row in build_stage_defs(planner):
        for target in targets_of(planner, row):
            plan = row.plan(planner, row, target)
            if plan is None or plan.skip or not Path(plan.record).is_file():
                continue
            record = json.loads(Path(plan.record).read_text())
            name = f"{row.name}:{plan.name}"
            tasks[name] = {"stage": row.name, "remote": row.remote, "seconds": float(record.get("seconds") or 0),
                           "in": _size(plan.file_dep), "out": _size(plan.outputs + [plan.record]),
                           "file_dep": plan.file_dep, "task_dep": plan.task_dep}
            for path in plan.outputs + [plan.record]:
                made_by[path] = name
    for task in tasks.values():
        task["waits"] = sorted({made_by[d] for d in task.pop("file_dep") if d in made_by}
                               | {d for d in task.pop("task_dep") if d in tasks})
    profile = planner.bindings[0].profile_dict(root)
    return tasks, profile


def stage_kinds(tasks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stage kind: calls, total and median seconds, median bytes in and out per call, remote or not."""
    kinds: dict[str, dict[str, Any]] = {}
    for task in tasks.values():
        k = kinds.setdefault(task["stage"], {"seconds": [], "in": [], "out": [], "remote": task["remote"]})
        for field in ("seconds", "in", "out"):
            k[field].append(task[field])
    return {name: {"calls": len(v["seconds"]), "total_s": sum(v["seconds"]), "median_s": statistics.median(v["seconds"]),
                   "in": int(statistics.median(v["in"])), "out": int(statistics.median(v["out"])),
                   "remote": v["remote"]} for name, v in kinds.items()}


# ------------------------------------------------------------------ per-call overhead

def trivial_calls(kind: str, facts: dict[str, Any], n: int, profile: Any, tag: str) -> list:
    """n calls of the trivial stage shaped like `kind`: one input of its median size, one output of its median size."""
    from qnn_tasks.run.calls import StageCall

    calls = []
    for i in range(n):
        folder = f"build/bench/{tag}/{kind}/{i}"
        inputs = []
        if facts["in"]:
            source = Path(folder) / "in" / "input.bin"
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_bytes(os.urandom(facts["in"]))
            inputs = [str(source)]
        out_dir = f"{folder}/{kind}"
        calls.append(StageCall(stage=kind, target=f"{tag}-{i}", args={"sizes": [max(facts["out"], 1)]}, inputs=inputs,
                               out_dir=out_dir, outputs=[f"{out_dir}/output.bin"], record=f"{out_dir}/{kind}.json",
                               key=f"bench-{tag}-{kind}-{i}-{time.time_ns()}", toolchain=profile, heavy=True,
                               remote=True, runner=RUNNER))
    return calls


def timed_calls(executor, calls: list) -> list[float]:
    times = []
    for call in calls:
        start = time.perf_counter()
        outcome = executor.run(call, None)
        times.append(time.perf_counter() - start)
        if not outcome.ok:
            raise SystemExit(f"{call.stage}:{call.target} failed on {executor.name}: {outcome.error}")
    return times


def _store_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def overheads(scratch: Path, kinds: dict[str, dict[str, Any]], n: int, profile: Any, tmp: Path) -> dict[str, dict]:
    """Per kind: median ms per call in-process, child and Dask, and store bytes per Dask call. Interleaved per kind."""
    from qnn_tasks.run.cache import Store
    from qnn_tasks.run.executors.dask import DaskExecutor
    from qnn_tasks.run.executors.local import Child, InProcess

    os.chdir(scratch)
    os.environ["PYTHONPATH"] = _python_path()  # the child executor's processes import the trivial runner
    sys.path.insert(0, str(HERE))
    address, procs = start_cluster(tmp)
    store_dir = tmp / "store"
    executors: dict[str, Any] = {"in-process": InProcess(), "child": Child(str(scratch))}
    try:
        executors["dask"] = DaskExecutor(address.replace("tcp://", "dask://"), str(scratch), Store(str(store_dir)))
        first = next(iter(kinds))
        for name, executor in executors.items():  # warm: imports, the child started, the workers' version check
            timed_calls(executor, trivial_calls(first, kinds[first], 2, profile, f"warm-{name}"))
        result = {}
        for kind, facts in kinds.items():
            times: dict[str, list[float]] = {name: [] for name in executors}
            shipped = []
            for i in range(n):  # one call per executor in turn: drift on the machine hits all of them alike
                for name, executor in executors.items():
                    before = _store_bytes(store_dir) if name == "dask" else 0
                    times[name] += timed_calls(executor, trivial_calls(kind, facts, 1, profile, f"{name}-{i}"))
                    if name == "dask":
                        shipped.append(_store_bytes(store_dir) - before)
            result[kind] = {name: statistics.median(t) for name, t in times.items()}
            result[kind]["shipped"] = int(statistics.median(shipped))
        return result
    finally:
        executors["child"].stop()
        if "dask" in executors:
            executors["dask"].stop()
        stop_cluster(procs)


# ------------------------------------------------------------------ serial part and the model

def serial_seconds(root: Path) -> tuple[float, float]:
    """(planning, report): one no-op `doit`, and re-rendering the report alone."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "doit"], cwd=root, capture_output=True)  # exit 1 if a gate fails: fine
    planning = time.perf_counter() - start
    subprocess.run([sys.executable, "-m", "doit", "forget", "report"], cwd=root, check=True, capture_output=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "doit", "report"], cwd=root, capture_output=True)
    return planning, time.perf_counter() - start


def critical_path(tasks: dict[str, dict[str, Any]], overhead: dict[str, float]) -> float:
    """The longest chain of the tree's own dependencies; a remote task pays its kind's overhead."""
    done: dict[str, float] = {}

    def finish(name: str) -> float:
        if name not in done:
            task = tasks[name]
            own = task["seconds"] + (overhead.get(task["stage"], 0.0) if task["remote"] else 0.0)
            done[name] = own + max((finish(d) for d in task["waits"]), default=0.0)
        return done[name]

    return max((finish(n) for n in tasks), default=0.0)


def expected_wall(tasks: dict[str, dict[str, Any]], serial: float, client_jobs: int, workers: int,
                  overhead: dict[str, float]) -> float:
    """serial + max(critical path, client-side work / client cores, remote work and overhead / workers).

    workers=0: everything on the client (`doit -n client_jobs`, no overhead).
    """
    if workers == 0:
        local = sum(t["seconds"] for t in tasks.values())
        return serial + max(critical_path(tasks, {}), local / client_jobs)
    client = sum(t["seconds"] for t in tasks.values() if not t["remote"])
    remote = sum(t["seconds"] + overhead.get(t["stage"], 0.0) for t in tasks.values() if t["remote"])
    return serial + max(critical_path(tasks, overhead), client / client_jobs, remote / workers)


def load_line() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10, help="trivial calls per stage kind and executor")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--tree", type=Path, help="a project built already (default: build the test examples)")
    source.add_argument("--tiny", action="store_true", help="build one small graph on one chip (seconds)")
    parser.add_argument("--client-jobs", type=int, default=os.cpu_count() or 1,
                        help="stages the client runs at once (doit -n); default: this machine's cores")
    opts = parser.parse_args()
    print(f"{socket.gethostname()}: {os.cpu_count()} cores, Python {sys.version.split()[0]}; {load_line()}")
    with tempfile.TemporaryDirectory(prefix="bench_cluster_") as tmp_name:
        tmp = Path(tmp_name)
        if opts.tree:
            root, build_s = opts.tree.resolve(), None
        else:
            root, build_s = built_tree(tmp, opts.tiny)
        tasks, profile = tree_tasks(root)
        kinds = stage_kinds(tasks)
        planning, report = serial_seconds(root)
        scratch = tmp / "calls"
        shutil.copytree(root, scratch, ignore=shutil.ignore_patterns("build", ".doit.db*"))
        cost = overheads(scratch, kinds, opts.calls, profile, tmp)
        os.chdir(REPO)

        print(f"\nper call, median of {opts.calls} trivial calls per kind and executor (interleaved); {load_line()}")
        print(f"{'stage':<11}{'calls':>6}{'median s':>10}{'in KiB':>9}{'out KiB':>9}{'remote':>8}"
              f"{'in-proc ms':>12}{'child +ms':>11}{'dask +ms':>10}{'shipped KiB':>13}")
        for name, v in kinds.items():
            c = cost[name]
            print(f"{name:<11}{v['calls']:>6}{v['median_s']:>10.2f}{v['in'] / 1024:>9.0f}{v['out'] / 1024:>9.0f}"
                  f"{'yes' if v['remote'] else 'no':>8}{c['in-process'] * 1000:>12.1f}"
                  f"{(c['child'] - c['in-process']) * 1000:>+11.1f}{(c['dask'] - c['in-process']) * 1000:>+10.1f}"
                  f"{c['shipped'] / 1024:>13.0f}")
        overhead = {k: max(c["dask"] - c["in-process"], 0.0) for k, c in cost.items()}
        serial = planning + report
        work = sum(t["seconds"] for t in tasks.values())
        remote = sum(t["seconds"] for t in tasks.values() if t["remote"])
        print(f"\nserial part {serial:.1f} s (planning: a no-op doit {planning:.1f} s; the report {report:.1f} s); "
              f"stage work {work:.1f} s, {remote:.1f} s of it in remote stages; {len(tasks)} tasks"
              + (f"; the build itself took {build_s:.1f} s with doit -n 2" if build_s is not None else ""))
        local = expected_wall(tasks, serial, opts.client_jobs, 0, overhead)
        print(f"{'workers':>8}{'expected wall s':>17}{'speedup':>9}   (vs this machine alone, doit -n {opts.client_jobs})")
        print(f"{'none':>8}{local:>17.1f}{1:>8.2f}x")
        for workers in WORKERS:
            wall = expected_wall(tasks, serial, opts.client_jobs, workers, overhead)
            print(f"{workers:>8}{wall:>17.1f}{local / wall:>8.2f}x")
        print("A model from this one machine's measurements, not a measured cluster: serial part + the largest of the "
              "critical path, the client-side stages over the client's cores and the remote stages (with the measured "
              "per-call overhead) over the workers; an optimistic bound (perfect packing, workers as fast as this "
              "machine, a store as near as a local folder).")


if __name__ == "__main__":
    main()
