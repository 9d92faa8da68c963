"""Wall-time ratios of real builds of the example matrix (real compiles, real simulator runs).

    python benchmarks/bench_matrix.py rejudge      # threshold edit: re-judge vs the simulation it used to cost
    python benchmarks/bench_matrix.py cache        # fresh clone with a warm shared cache vs a cold build
    python benchmarks/bench_matrix.py dask         # 2-worker local Dask cluster (cluster/dask.yaml) vs local `doit -n 2`
    python benchmarks/bench_matrix.py toolchains   # a second toolchain added to a built tree vs both from scratch
    python benchmarks/bench_matrix.py all
    python benchmarks/bench_matrix.py speech       # Whisper's full WER run (12 windows, SM8650), then again via the cache

The matrix: the repo's VAD and MiniLM examples at fp16 on --socs (default SM8650,SM8750), copied to temp folders
(MiniLM's w8a16 variant off). Each measurement is one run: the figures move with the machine's load,
so say what else ran when quoting them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


MATRIX_MODELS = ("silero-vad", "minilm")  # Whisper's windows take minutes each: it has its own benchmark


def project(dest: Path, socs: list[str], models: tuple[str, ...] = MATRIX_MODELS) -> Path:
    dest.mkdir(parents=True)
    for name in ("dodo.py", "socs", "toolchain"):
        src = REPO / name
        if not src.exists():  # toolchain/: the repo uses the packaged profiles (qnn_tasks/data/toolchain)
            continue
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest / name)
    for model in models:
        shutil.copytree(REPO / "models" / model, dest / "models" / model, ignore=shutil.ignore_patterns("__pycache__"))
    for yaml in (dest / "models").glob("*/model.yaml"):
        text = re.sub(r"^    socs: .*\n", "", yaml.read_text(), flags=re.M)
        text = re.sub(r"^(    precision: ).*$", rf"\1fp16\n    socs: [{', '.join(socs)}]", text, flags=re.M)
        yaml.write_text(re.sub(r"^    calibration: .*\n", "", text, flags=re.M))
    return dest


def doit(root: Path, *args: str, env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=root, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise SystemExit(f"doit {' '.join(args)} failed in {root}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def stage_seconds(root: Path, stage: str) -> float:
    return sum(json.loads(p.read_text()).get("seconds", 0.0) for p in root.glob(f"build/**/{stage}/{stage}.json"))


def rejudge(tmp: Path, socs: list[str]) -> None:
    root = project(tmp / "rejudge", socs)
    doit(root)
    simulated = stage_seconds(root, "simulate")
    for yaml, old, new in (("models/silero-vad/model.yaml", "output: {max_abs: 0.05}", "output: {max_abs: 0.06}"),
                           ("models/minilm/model.yaml", "top: 1, min: 1.0", "top: 1, min: 0.9")):
        path = root / yaml
        path.write_text(path.read_text().replace(old, new))
    wall = doit(root)
    print(f"threshold edit on {len(socs)} chips x 2 graphs: doit {wall:.2f} s (re-judge only) vs {simulated:.1f} s of "
          f"simulation the old simverify reran: {simulated / wall:.0f}x faster")


def cache(tmp: Path, socs: list[str]) -> None:
    store = tmp / "store"
    cold = doit(project(tmp / "cold", socs), env={"QNN_CACHE": str(store)})
    warm = doit(project(tmp / "warm", socs), env={"QNN_CACHE": str(store)})
    print(f"cold build {cold:.1f} s, fresh clone with the warm cache {warm:.1f} s: {warm / cold:.1%} of cold "
          f"(goal <= 5%)")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dask(tmp: Path, socs: list[str]) -> None:
    local = doit(project(tmp / "local", socs), "-n", "2", "-P", "thread", env={"QNN_CACHE": str(tmp / "store-local")})
    port = _port()
    # cluster/dask.yaml: the settings the README tells a team to start scheduler, workers and doit with
    env = {**os.environ, "PYTHONPATH": str(REPO), "DASK_CONFIG": str(REPO / "cluster")}
    procs = [subprocess.Popen(["dask", "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
    procs += [subprocess.Popen(["dask", "worker", f"tcp://127.0.0.1:{port}", "--nthreads", "1", "--host", "127.0.0.1",
                                "--no-dashboard", "--name", f"w{i}"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True) for i in (1, 2)]
    try:
        from distributed import Client

        with Client(f"tcp://127.0.0.1:{port}", timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        remote = doit(project(tmp / "dask", socs), "-n", "2", "-P", "thread",
                      env={"QNN_EXECUTOR": f"dask://127.0.0.1:{port}", "QNN_CACHE": str(tmp / "store-dask"),
                           "DASK_CONFIG": str(REPO / "cluster")})
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
    print(f"local doit -n 2: {local:.1f} s; through a 2-worker local Dask cluster: {remote:.1f} s: throughput "
          f"{local / remote:.2f}x of local (goal >= 0.95x)")


def toolchains(tmp: Path, socs: list[str]) -> None:
    root = project(tmp / "added", socs)
    doit(root)
    added = doit(root, env={"QNN_TOOLCHAIN": "ort-qnn,ort-qnn-2.47"})
    scratch = doit(project(tmp / "scratch", socs), env={"QNN_TOOLCHAIN": "ort-qnn,ort-qnn-2.47"})
    print(f"second toolchain added to a built tree: {added:.1f} s; both from scratch: {scratch:.1f} s: "
          f"{added / scratch:.0%} (the graph stages are not redone; this is the toolchain stages' share)")


def speech(tmp: Path, socs: list[str]) -> None:
    """Whisper judged by words on all 12 windows (10 clips + a quiet and a loud copy), then a clone via the cache."""
    def whisper(dest: Path) -> Path:
        root = project(dest, socs[:1], models=("whisper-tiny-en",))
        yaml = root / "models" / "whisper-tiny-en" / "model.yaml"
        yaml.write_text(re.sub(r"^      samples: 2 .*$", "      samples: 12", yaml.read_text(), count=1, flags=re.M))
        return root

    env = {"QNN_CACHE": str(tmp / "store")}
    first = whisper(tmp / "first")
    cold = doit(first, "-n", "2", "-P", "thread", env=env)
    record = json.loads(next(first.glob("build/**/simverify/simverify.json")).read_text())
    wer, timing = record["checks"][0], record["timing"]
    warm = doit(whisper(tmp / "clone"), "-n", "2", "-P", "thread", env=env)
    print(f"Whisper on {socs[0]}, {record['samples']} windows: doit -n 2 {cold / 60:.1f} min (simulator "
          f"{timing['per_inference_median_s']:.0f} s per 30 s window, median; {timing['total_s'] / 60:.1f} min in all); "
          f"WER CPU {wer['wer_cpu']:.4f} NPU {wer['wer_npu']:.4f}, identical {wer['identical_share']:.0%}; "
          f"a fresh clone with the warm cache: {warm:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["rejudge", "cache", "dask", "toolchains", "speech", "all"])
    parser.add_argument("--socs", default="SM8650,SM8750", help="chips of the matrix (default SM8650,SM8750)")
    args = parser.parse_args()
    socs = args.socs.split(",")
    runs = [rejudge, cache, dask, toolchains] if args.what == "all" else [globals()[args.what]]
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start")
    for run in runs:
        with tempfile.TemporaryDirectory(prefix="bench_matrix_") as tmp:
            run(Path(tmp), socs)


if __name__ == "__main__":
    main()
