"""Team scale: complete keys (code version), the shared content-addressed cache, the matrix on Dask.

Real components only: a real fsspec store (a folder), real doit runs in fresh clones, a real Dask
scheduler and workers started with Dask's own CLI on 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, Project, copy_project, matrix_project

from qnn_tasks.run import records

HEAVY = ("export", "cpucheck", "context", "simulate")
PACKAGE = ROOT / "qnn_tasks"


def stage_records(project: Project) -> dict[str, dict]:
    """Every stage record of the build, by task name (with its file as `_path`)."""
    found = {}
    for path in (project.root / "build").rglob("*.json"):
        record = records.read(path)
        if isinstance(record, dict) and "stage" in record and "target" in record and path.parent.name == record["stage"]:
            found[f"{record['stage']}:{record['target']}"] = {**record, "_path": path}
    return found


def metrics(project: Project) -> dict[str, dict]:
    report = json.loads(project.path("build/report/report.json").read_text())
    return {t["name"]: t["stages"]["simverify"]["metrics"] for t in report["targets"] if t["status"] != "skipped"}


def patched_package(dest: Path, module: str, line: str = "\n# a change to this module's code\n") -> Path:
    """A copy of qnn_tasks with one module edited: what upgrading to other code looks like."""
    shutil.copytree(PACKAGE, dest / "qnn_tasks", ignore=shutil.ignore_patterns("__pycache__"))
    with open(dest / "qnn_tasks" / module, "a") as fh:
        fh.write(line)
    return dest


# ------------------------------------------------------------------ 1. keys carry the code version

@pytest.mark.slow
@pytest.mark.parametrize("module, reruns", [
    # lint's rules also decide which findings stop an export: both stages import them, so their code is in both
    # keys (derived from the imports), not in simplify's; their outputs come out the same, so nothing downstream runs
    ("graphs/lintrules.py", {f"{stage}:{g}" for stage in ("export", "lint") for g in ("vad", "minilm")}),
    ("stages/simverify.py", {f"simverify:{g}-{s}" for g in ("vad", "minilm") for s in ("SM8650", "SM8750")}),
    ("report/templates/report.html.j2", set()),
])
def test_editing_a_stage_module_reruns_exactly_that_stage(verified, tmp_path, module, reruns):
    project = copy_project(tmp_path / "project", source=verified.root, with_build=True)
    code = patched_package(tmp_path / "code", module, "\n{# changed #}\n" if module.endswith(".j2") else
                           "\n# a change to this module's code\n")
    result = project.doit(env={"PYTHONPATH": str(code)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.executed == reruns | {"report"}, result.executed  # the report re-renders in every case


# ------------------------------------------------------------------ 2. the shared cache

@pytest.fixture
def shared(verified):
    """Clone A: the session's `verified` matrix, built with a cache folder; returns (A, the store folder)."""
    return verified, verified.store


@pytest.mark.slow
def test_fresh_clone_with_a_warm_cache_compiles_and_simulates_nothing(shared, tmp_path):
    first, store = shared
    second = matrix_project(tmp_path / "clone-b")
    start = time.monotonic()
    result = second.doit(env={"QNN_CACHE": str(store)})
    wall = time.monotonic() - start
    assert result.returncode == 0, result.stdout + result.stderr
    made = stage_records(second)
    heavy = {task: r for task, r in made.items() if r["stage"] in HEAVY}
    assert len(heavy) == 2 * 2 + 2 * 2 + 2 * 2  # export + cpucheck per graph, context + simulate per target
    for task, record in made.items():
        assert record.get("from_cache"), f"{task} ran instead of being restored"
        assert record["from_cache"]["built_by"] == socket.gethostname()
        assert records.problems(record, record["_path"], second.root) == [], task  # restored byte-identical
    built = stage_records(first)
    for task in heavy:  # the same bytes as clone A's outputs
        assert made[task]["files"] == built[task]["files"], task
    lines = [line for line in result.stderr.splitlines() if line.startswith(("context:", "simulate:"))]
    assert lines and all("(from cache: built " in line for line in lines), lines
    assert metrics(second) == metrics(first)  # the same report numbers
    report = json.loads(second.path("build/report/report.json").read_text())
    assert report["summary"]["from_cache"] == report["summary"]["targets"]
    assert all(t["provenance"]["from_cache"] == ["context", "simulate"] for t in report["targets"])
    assert wall < first.wall * 0.5, (wall, first.wall)  # the benchmark measures the real ratio


@pytest.mark.slow
def test_cache_stats_and_gc(shared, tmp_path):
    _, store = shared
    clone = matrix_project(tmp_path / "clone")  # the session's `verified` is never written to
    stats = clone.doit("cache:stats", env={"QNN_CACHE": str(store)})
    assert stats.returncode == 0, stats.stderr
    assert f"cache {Path(store).resolve().as_uri()}: " in stats.stdout and "context 4" in stats.stdout
    kept = clone.doit("cache:gc", "--keep-days", "30", env={"QNN_CACHE": str(store)})
    assert kept.returncode == 0 and "dropped 0 older than 30 days" in kept.stdout, kept.stdout


@pytest.mark.slow
def test_corrupted_blob_is_detected_rebuilt_and_never_restored(shared, tmp_path):
    first, store = shared
    third_store = tmp_path / "store"
    shutil.copytree(store, third_store)
    binary = next(first.root.glob("build/silero-vad/vad/*/fp16/SM8650/context/vad_ctx_qnn.bin"))
    blob = third_store / "cas" / records.sha256(binary)[:2] / records.sha256(binary)
    data = bytearray(blob.read_bytes())
    data[4096] ^= 0xFF  # one flipped bit in the stored binary
    blob.write_bytes(bytes(data))
    clone = matrix_project(tmp_path / "clone-c")
    result = clone.doit(env={"QNN_CACHE": str(third_store)})
    assert result.returncode == 0, result.stdout + result.stderr
    made = stage_records(clone)
    assert "from_cache" not in made["context:vad-SM8650"]  # rebuilt, not restored
    assert made["context:vad-SM8650"]["status"] == "passed"
    downstream = {"context:vad-SM8650", "simulate:vad-SM8650", "simverify:vad-SM8650"}  # read the rebuilt bytes
    assert all(r.get("from_cache") for task, r in made.items() if task not in downstream)
    assert not blob.exists() or records.sha256(blob) == blob.name  # the bad blob was dropped
    rebuilt = next(clone.root.glob("build/silero-vad/vad/*/fp16/SM8650/context/vad_ctx_qnn.bin"))
    sha = records.sha256(rebuilt)
    assert records.sha256(third_store / "cas" / sha[:2] / sha) == sha  # and the good build was put in its place


@pytest.mark.slow
def test_toolchain_fingerprint_or_code_change_misses_the_cache(shared, tmp_path):
    first, store = shared
    clone = matrix_project(tmp_path / "clone-d")
    shutil.rmtree(clone.path("models/minilm"))  # the VAD's stages show it (MiniLM would only add compile time)
    clone.edit("toolchain/ort-qnn.yaml", "htp_graph_finalization_optimization_mode: 3",
               "htp_graph_finalization_optimization_mode: 2")
    code = patched_package(tmp_path / "code", "stages/cpucheck.py")
    result = clone.doit(env={"QNN_CACHE": str(store), "PYTHONPATH": str(code)})
    assert result.returncode == 0, result.stdout + result.stderr
    made = stage_records(clone)
    assert {r["stage"] for r in made.values()} == {"export", "simplify", "lint", "cpucheck", "config", "context",
                                                  "simulate", "simverify"}
    for task, record in made.items():
        if record["stage"] in ("export", "simplify", "lint"):
            assert record.get("from_cache"), task  # neither the toolchain nor their code changed
        elif record["stage"] != "simverify":  # cpucheck: its code changed; config, context, simulate: the toolchain
            assert not record.get("from_cache"), task
        # simverify is keyed by the content of the outputs it judges: where they came out the same, it is a hit


# ------------------------------------------------------------------ 3. the matrix on a Dask cluster

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(args, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def cluster(tmp_path):
    """`dask scheduler` + two matching `dask worker`s + one running other code, all on 127.0.0.1."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "QNN_EXECUTOR": "", "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
           "DASK_CONFIG": str(ROOT / "cluster")}  # the settings the README tells a team to start its cluster with
    procs = [start(["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], env,
                   tmp_path / "scheduler.log")]
    other = patched_package(tmp_path / "other-code", "stages/simulate.py")
    for name, path in (("w1", str(ROOT)), ("w2", str(ROOT)), ("stranger", str(other))):
        procs.append(start(["dask", "worker", address, "--name", name, "--nthreads", "1", "--nworkers", "1",
                            "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(tmp_path / name)],
                           {**env, "PYTHONPATH": path}, tmp_path / f"{name}.log"))
    from distributed import Client

    deadline = time.monotonic() + 120
    with Client(address, timeout=60) as client:
        while len(client.scheduler_info()["workers"]) < 3:
            assert time.monotonic() < deadline, (tmp_path / "scheduler.log").read_text()
            time.sleep(0.5)
        names = {w["name"]: addr for addr, w in client.scheduler_info()["workers"].items()}
    yield {"address": address, "workers": names, "procs": dict(zip(["scheduler", "w1", "w2", "stranger"], procs))}
    for proc in procs:
        stop(proc)


@pytest.mark.slow
def test_matrix_on_a_dask_cluster_matches_a_local_build_and_survives_a_lost_worker(built_graphs, verified, cluster,
                                                                                    tmp_path):
    # the chip stages on the cluster (graph stages through Dask: benchmarks/bench_cluster_cost.py and its test)
    project = matrix_project(tmp_path / "project", graphs_from=built_graphs)
    env = {"QNN_EXECUTOR": f"dask://{cluster['address'].split('://')[1]}", "QNN_CACHE": str(tmp_path / "store"),
           "DASK_CONFIG": str(ROOT / "cluster")}
    proc = subprocess.Popen([sys.executable, "-m", "doit", "-n", "2", "-P", "thread"], cwd=project.root, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env})
    w1 = cluster["workers"]["w1"]
    deadline = time.monotonic() + 900
    while True:  # once w1 has finished a call, kill it (the build must complete on w2)
        if any((r.get("executor") or {}).get("worker") == w1 for r in stage_records(project).values()):
            break
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.5)
    stop(cluster["procs"]["w1"], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=1800)
    # with -n 2 -P thread the run's own report is still its last task (docs/trust.md): a green run passes its gate
    assert proc.returncode == 0, stdout + stderr
    assert [line for line in stdout.splitlines() if line.startswith(".  ")][-1] == ".  report", stdout
    refusals = [line for line in stdout.splitlines() + stderr.splitlines() if line.startswith("refusing Dask worker")]
    assert len(refusals) >= 1 and cluster["workers"]["stranger"] in refusals[0] and "code version" in refusals[0]

    made = stage_records(project)
    workers = {(r.get("executor") or {}).get("worker") for task, r in made.items() if r["stage"] in ("context", "simulate")}
    assert workers == {w1, cluster["workers"]["w2"]}, workers  # both ran calls; the stranger none
    assert all((r["executor"] or {}).get("kind") == "dask" for r in made.values() if r["stage"] in ("context", "simulate"))
    if not project.path("build/report/report.json").is_file() or project.doit("report").returncode != 0:
        pytest.fail("report")
    ours, local = metrics(project), metrics(verified)
    assert ours.keys() == local.keys()
    for name in ours:
        for output, m in ours[name].items():
            assert m["cosine"] == pytest.approx(local[name][output]["cosine"], abs=1e-6), (name, output)
            assert m["max_abs"] == pytest.approx(local[name][output]["max_abs"], rel=1e-3, abs=1e-6), (name, output)
    report = json.loads(project.path("build/report/report.json").read_text())
    assert all(set(t["provenance"]["workers"]) == {"context", "simulate"} for t in report["targets"])
