"""How much does qnn_tasks add to a no-op `doit` over a bare doit graph of the same shape?

Builds two throw-away projects in temp dirs, both with instant stand-in actions:
  * qnn_tasks: 20 models x 3 graphs x 6 chips, tasks from `project_tasks(root)` with every
    action replaced by "touch the targets" (real names, file_dep, targets, uptodate, docs);
  * bare:      a plain dodo whose tasks mirror those (same stages, names, counts and
    file_dep -> target chains, paths renamed) with `config_changed(small dict)`, sqlite3.
Each gets one full build, then no-op `doit` runs and `doit list` runs are timed (wall clock,
fresh interpreter each, median; bytecode caching on, Python's default). Goals: no-op ratio <= 1.2, list <= 1.3.
The load average is printed with every figure: on a shared machine, a figure without it means little.

    python benchmarks/bench_doit_overhead.py [--quick] [--reps N] [--scale N]

`--scale N` multiplies the models (N x 20 models, ~2,800 x N tasks): the ratios must hold as a team's matrix
grows. The peak memory (max RSS) of one `doit list` of each project is printed too.

It measures whichever `qnn_tasks` is importable: PYTHONPATH=/path/to/patched/copy tries a change.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
N_MODELS, GRAPHS_PER_MODEL = 20, 3
SOCS = {"SM8550": (43, "v73"), "SM8650": (57, "v75"), "SM8750": (69, "v79"),
        "SM8850": (87, "v81"), "QCS9100": (77, "v73"), "SM8450": (36, "v69")}
GOALS = {"no-op": 1.2, "`doit list`": 1.3}  # measure label prefix -> goal ratio

# Generated into the qnn_tasks project: the real task graph, stand-in actions.
BENCH_DODO = '''\
from pathlib import Path

from doit.loader import create_after

from qnn_tasks.tasks.project import project_tasks


def touch(targets):
    for t in targets:
        Path(t).parent.mkdir(parents=True, exist_ok=True)
        Path(t).write_text("x")


def instant(task_creator):
    """Same task(s) as task_creator makes, but each action only creates the targets."""
    def stub(task):
        return {**task, "actions": [(touch, [task.get("targets", [])])]}

    def task_fn():
        made = task_creator()
        return stub(made) if isinstance(made, dict) else (stub(t) for t in made)  # one task or a generator
    task_fn.__doc__ = task_creator.__doc__
    if hasattr(task_creator, "doit_create_after"):  # on-demand stages stay delayed, as in the real dodo
        task_fn = create_after()(task_fn)
    return task_fn


_ns = project_tasks(Path(__file__).resolve().parent)
globals().update({k: instant(v) if k.startswith("task_") else v for k, v in _ns.items()})
'''

# The bare graph: the plain doit a minimal user would write. Its rows (graph.json) are written
# from the qnn_tasks graph, so it stays like-for-like when stages are added there.
BARE_DODO = '''\
import json
from pathlib import Path

from doit.loader import create_after
from doit.tools import config_changed

GRAPH = json.loads(Path(__file__).with_name("graph.json").read_text())
DOIT_CONFIG = {"default_tasks": GRAPH["default_tasks"], "continue": True, "backend": "sqlite3",
               "dep_file": ".doit.db"}


def touch(targets):
    for t in targets:
        Path(t).parent.mkdir(parents=True, exist_ok=True)
        Path(t).write_text("x")


def task(name, file_dep, targets):
    return {"name": name, "actions": [(touch, [targets])], "file_dep": file_dep, "targets": targets,
            "uptodate": [config_changed({"v": 1})], "clean": True}


def make_tasks(rows):
    """A generator of named tasks, or one task when its single row has no name."""
    if len(rows) == 1 and rows[0][0] is None:
        return lambda: {k: v for k, v in task(*rows[0]).items() if k != "name"}
    return lambda: (task(*row) for row in rows)


for _stage, _rows in GRAPH["stages"].items():
    _fn = make_tasks(_rows)
    globals()[f"task_{_stage}"] = create_after()(_fn) if _stage in GRAPH["delayed"] else _fn
'''

Stages = dict[str, list[dict]]  # stage -> its task dicts


# ------------------------------------------------------------------ projects

def make_qnn_project(root: Path, n_models: int = N_MODELS) -> Path:
    """socs.yaml with 6 chips, n_models models of 3 graphs (all chips), the packaged toolchain profile as a project file."""
    (root / "socs").mkdir(parents=True)
    rows = "\n".join(f"  {n}: {{soc_id: {i}, dsp_arch: {a}, vtcm_mb: 8, fp16: true}}" for n, (i, a) in SOCS.items())
    (root / "socs" / "socs.yaml").write_text(f"socs:\n{rows}\n")
    for m in range(n_models):
        model_dir = root / "models" / f"m{m}"
        model_dir.mkdir(parents=True)
        (model_dir / "export.py").write_text("def export(): ...\n")
        graphs = "".join(f"  m{m}_g{g}:\n"
                         f"    inputs:\n      x: {{shape: [1, 16], dtype: float32}}\n"
                         f"    outputs:\n      y: {{shape: [1, 16]}}\n" for g in range(GRAPHS_PER_MODEL))
        # numpy: an installed package with no `file:`, so the spec is valid without a real model.
        (model_dir / "model.yaml").write_text(f"licence: MIT\nsource:\n  package: numpy\ngraphs:\n{graphs}")
    (root / "toolchain").mkdir()
    shutil.copy(REPO / "qnn_tasks" / "data" / "toolchain" / "ort-qnn.yaml", root / "toolchain" / "ort-qnn.yaml")
    shutil.copy(REPO / "dodo.py", root / "dodo.py")
    (root / "dodo_bench.py").write_text(BENCH_DODO)
    return root / "dodo_bench.py"


def make_bare_project(root: Path, stages: Stages, default_tasks: list[str], delayed: list[str]) -> Path:
    """The bare dodo plus graph.json: every real task with its paths renamed; source files created."""
    renamed = {t: f"out/{stage}/{task.get('name', '')}/t{k}"
               for stage, tasks in stages.items() for task in tasks for k, t in enumerate(task.get("targets", []))}
    # file_deps no task makes (each model's export.py): plain files that must exist
    sources = sorted({d for tasks in stages.values() for t in tasks for d in t.get("file_dep", [])} - set(renamed))
    renamed.update({d: f"src/s{k}" for k, d in enumerate(sources)})
    (root / "src").mkdir(parents=True)
    for d in sources:
        (root / renamed[d]).write_text("x = 1\n")
    rows = {stage: [[t.get("name"), [renamed[d] for d in t.get("file_dep", [])], [renamed[x] for x in t.get("targets", [])]]
                    for t in tasks] for stage, tasks in stages.items()}
    (root / "graph.json").write_text(json.dumps({"default_tasks": default_tasks, "stages": rows, "delayed": delayed}))
    (root / "dodo.py").write_text(BARE_DODO)
    return root / "dodo.py"


def load_graph(dodo: Path) -> tuple[Stages, list[str], list[str]]:
    """Every task the dodo yields, per stage, its default tasks and its delayed (on-demand) stages."""
    cwd, argv = os.getcwd(), sys.argv
    os.chdir(dodo.parent)  # task paths are relative to the project root
    sys.argv = ["doit", "list"]  # loading the tasks to look at them is read-only: no tree lock taken here
    try:
        ns = runpy.run_path(str(dodo), run_name="dodo")
        made = {k.removeprefix("task_"): fn() for k, fn in ns.items() if k.startswith("task_")}
        stages = {k: [m] if isinstance(m, dict) else list(m) for k, m in made.items()}  # one task or a generator
    finally:
        os.chdir(cwd)
        sys.argv = argv
    delayed = [k.removeprefix("task_") for k, fn in ns.items() if k.startswith("task_") and hasattr(fn, "doit_create_after")]
    return stages, ns["DOIT_CONFIG"]["default_tasks"], delayed


def shape(stages: Stages) -> dict[str, tuple[int, int, int]]:
    """stage -> (tasks, file_deps, targets)."""
    return {stage: (len(tasks), sum(len(t.get("file_dep", [])) for t in tasks), sum(len(t.get("targets", [])) for t in tasks))
            for stage, tasks in stages.items()}


# ------------------------------------------------------------------ timing

def doit(dodo: Path, *args: str) -> subprocess.CompletedProcess:
    """One doit run in a fresh interpreter, as a user would start it.

    With bytecode caching on, as Python has it by default: doit's own modules were byte-compiled
    when pip installed them, and an environment with PYTHONDONTWRITEBYTECODE set (CI sandboxes)
    would make only qnn_tasks (an editable install) recompile its sources on every run.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return subprocess.run([sys.executable, "-m", "doit", *args, "-f", dodo.name], cwd=dodo.parent,
                          capture_output=True, text=True, check=True, env=env)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(dodo: Path, *args: str) -> tuple[float, float]:
    """(wall, CPU) seconds of one run; CPU (user + system of the doit process) is what a loaded machine blurs least."""
    cpu, start = _children_cpu(), time.perf_counter()
    result = doit(dodo, *args)
    seconds, cpu = time.perf_counter() - start, _children_cpu() - cpu
    if not args and re.search(r"^\.  ", result.stdout, re.M):  # a no-op run must execute nothing
        raise RuntimeError(f"{dodo}: the no-op run executed tasks:\n{result.stdout[:500]}")
    return seconds, cpu


def peak_memory_mib(dodo: Path, *args: str) -> float:
    """Max resident memory of one doit run (its own process, from wait4's rusage)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.Popen([sys.executable, "-m", "doit", *args, "-f", dodo.name], cwd=dodo.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{dodo}: doit {' '.join(args)} failed ({proc.returncode})")
    return usage.ru_maxrss / 1024  # KiB on Linux


def medians(dodos: dict[str, Path], args: tuple[str, ...], reps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and CPU time per project; runs alternate so drift on the machine hits both alike."""
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in dodos}
    for _ in range(reps):
        for key, dodo in dodos.items():
            times[key].append(timed(dodo, *args))
    return ({k: statistics.median(w for w, _ in v) for k, v in times.items()},
            {k: statistics.median(c for _, c in v) for k, v in times.items()})


# ------------------------------------------------------------------ report

def print_shapes(shapes: dict[str, dict[str, tuple[int, int, int]]]) -> None:
    stages = list(next(iter(shapes.values())))
    print(f"{'stage':<10}" + "".join(f"{k + ' tasks/deps/targets':>30}" for k in shapes))
    for stage in stages:
        print(f"{stage:<10}" + "".join(f"{'%d / %d / %d' % s.get(stage, (0, 0, 0)):>30}" for s in shapes.values()))
    print(f"{'total':<10}" + "".join(f"{f'{sum(v[0] for v in s.values())} tasks':>30}" for s in shapes.values()))
    if len({tuple(sorted(s.items())) for s in shapes.values()}) != 1:
        print("WARNING: the graphs differ in shape: the comparison is not like-for-like")


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def print_times(rows: dict[str, tuple[dict[str, float], str]]) -> None:
    print(f"\n{'median time':<22}{'qnn_tasks':>11}{'bare':>9}{'ratio':>8}")
    for label, (t, loads) in rows.items():
        ratio = t["qnn_tasks"] / t["bare"]
        goal = next((g for prefix, g in GOALS.items() if label.startswith(prefix)), None)
        note = f"  (goal <= {goal}x: {'ok' if ratio <= goal else 'OVER'})" if goal else ""
        print(f"{label:<22}{t['qnn_tasks']:>10.3f}s{t['bare']:>8.3f}s{ratio:>7.2f}x{note}  [{loads}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 timed runs per measurement instead of 7")
    parser.add_argument("--reps", type=int, help="timed runs per measurement (overrides --quick)")
    parser.add_argument("--scale", type=int, default=1, help=f"models x N ({N_MODELS} x N models)")
    opts = parser.parse_args()
    reps = opts.reps or (3 if opts.quick else 7)

    with tempfile.TemporaryDirectory(prefix="bench_doit_") as tmp:
        dodos = {"qnn_tasks": make_qnn_project(Path(tmp) / "qnn", N_MODELS * opts.scale)}
        stages, default_tasks, delayed = load_graph(dodos["qnn_tasks"])
        dodos["bare"] = make_bare_project(Path(tmp) / "bare", stages, default_tasks, delayed)
        print_shapes({k: shape(load_graph(d)[0]) for k, d in dodos.items()})
        for dodo in dodos.values():
            doit(dodo)  # first full build
            doit(dodo)  # warm-up no-op: pyc files, page cache
        print(f"scale x{opts.scale}: {N_MODELS * opts.scale} models; {os.cpu_count()} cores; Python {sys.version.split()[0]}")
        rows = {}
        for label, args in ((f"no-op `doit` (x{reps})", ()), (f"`doit list` (x{reps})", ("list",))):
            before = load()
            wall, cpu = medians(dodos, args, reps)
            loads = f"{before} before, {load()} after"
            rows[label] = (wall, loads)
            rows[f"{label.split(' (')[0]}, CPU"] = (cpu, loads)
        print_times(rows)
        memory = {k: peak_memory_mib(d, "list") for k, d in dodos.items()}
        print(f"{'`doit list` peak RSS':<22}{memory['qnn_tasks']:>9.0f}MiB{memory['bare']:>6.0f}MiB"
              f"{memory['qnn_tasks'] / memory['bare']:>7.2f}x")


if __name__ == "__main__":
    main()
