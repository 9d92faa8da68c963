"""Shared fixtures: real copies of the project in tmp dirs, real doit runs in a subprocess."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from qnn_tasks.plan.matrix import plans
from qnn_tasks.plan.rows import report_columns

ROOT = Path(__file__).resolve().parent.parent
# The suite's own copy of the example project (specs, toolchain profiles, model code): tests never read
# the working tree's models/ or socs/, so a user editing them cannot break pytest.
EXAMPLES = Path(__file__).resolve().parent / "examples"
PROJECT_FILES = ("dodo.py", "socs", "toolchain", "models")
GRAPH_STAGES = list(report_columns("graph"))  # the stage table's graph columns

# The modules that take minutes, longest first. With `-n 2` (and pyproject.toml's `--dist loadfile
# --no-loadscope-reorder`) each xdist worker takes the next module in collection order, so these start
# first and the run does not end with one worker busy for minutes and the other idle. Only the order of
# the run depends on this list (measured with --durations; a stale entry costs time, never a result).
LONGEST_FIRST = ("test_whisper_npu.py", "test_w8a16.py", "test_faults.py", "test_team.py", "test_qairt.py",
                 "test_verify.py", "test_ort_qnn.py", "test_toolchains.py", "test_loops.py",
                 "test_streaming_transducer.py", "test_cluster_trust.py", "test_cache_trust.py", "test_auto.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort: the rest keep their order


def pytest_configure(config: pytest.Config) -> None:
    pin_worker_to_a_core()


ALL_CORES: set[int] = set()  # filled when this worker is pinned


def pin_worker_to_a_core() -> None:
    """With one xdist worker per core, worker N (and every doit, simulator and Dask process it starts) runs on core N.

    The x86 HTP simulator spreads a graph over threads that gain little from a second core (measured: MiniLM
    2.29 s an inference on 2 cores, 3.34 s on 1: 2 cores spend 37% more CPU), and two workers' simulators on
    both cores crowd each other: pinned, a simulator-heavy third of the suite ran in 259 s instead of 323 s.
    A worker takes every core back once another has finished (`pytest_runtest_setup`). QNN_TESTS_PIN=0: no pins.
    """
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or os.environ.get("QNN_TESTS_PIN") == "0" or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if count.isdigit() and int(count) == len(cores) > 1:
        ALL_CORES.update(cores)
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})


def finished_marker(node: pytest.Session | pytest.Item) -> Path:
    """This worker's "no more work" file, in the folder above each worker's basetemp (shared by one run's workers)."""
    basetemp = node.config._tmp_path_factory.getbasetemp()  # what the tmp_path_factory fixture returns, in a hook
    return basetemp.parent / f"finished-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if ALL_CORES and any(finished_marker(item).parent.glob("finished-gw*")):
        os.sched_setaffinity(0, ALL_CORES)  # a peer has finished: its core would idle for the rest of the run
        ALL_CORES.clear()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
        finished_marker(session).touch()


@dataclass
class DoitResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def executed(self) -> set[str]:
        """Tasks doit ran (". name"), as opposed to up-to-date ("-- name") ones."""
        return set(re.findall(r"^\.  (\S+)$", self.stdout, re.M))

    @property
    def uptodate(self) -> set[str]:
        return set(re.findall(r"^-- (\S+)$", self.stdout, re.M))

    def failure_line(self, task: str) -> str:
        """The one line doit prints for the failed task ('<task>: <message>'); no traceback anywhere."""
        assert self.returncode != 0, self.stdout
        output = self.stdout + self.stderr
        assert "Traceback" not in output, output
        # a long stage's progress lines ('<task>: step 3/16, 45.3 s elapsed, ...') are not its verdict
        progress = re.compile(rf"{re.escape(task)}: \S+ \d+/\d+, .* elapsed")
        lines = [line for line in output.splitlines() if line.startswith(f"{task}: ") and not progress.match(line)]
        assert len(lines) == 1, output
        return lines[0]


class Project:
    """A copy of the project (specs + models) that tests may edit and build with real doit."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def doit(self, *args: str, env: dict[str, str] | None = None, check: bool = False,
             timeout: float = 1800) -> DoitResult:
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.run([sys.executable, "-m", "doit", *args], cwd=self.root, capture_output=True,
                              text=True, env=full_env, timeout=timeout)
        result = DoitResult(proc.returncode, proc.stdout, proc.stderr)
        if check and proc.returncode != 0:
            raise AssertionError(f"doit {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return result

    def path(self, rel: str) -> Path:
        return self.root / rel

    def one_json(self, pattern: str) -> dict:
        """The JSON record matching a glob under the project root; exactly one must match."""
        paths = list(self.root.glob(pattern))
        assert len(paths) == 1, paths
        return json.loads(paths[0].read_text())

    def edit(self, rel: str, old: str, new: str) -> None:
        path = self.root / rel
        text = path.read_text()
        assert old in text, f"{old!r} not in {rel}"
        path.write_text(text.replace(old, new, 1))


def project_with_model(root: Path, model: Path) -> Project:
    """A project at `root` of the examples' dodo.py, socs and toolchain profiles and the one model folder `model`
    (a speech model under tests/examples/speech: too slow to build with the rest)."""
    root.mkdir(parents=True)
    for name in ("dodo.py", "socs", "toolchain"):
        src = EXAMPLES / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, root / name)
    shutil.copytree(model, root / "models" / model.name, ignore=shutil.ignore_patterns("__pycache__"))
    return Project(root)


def copy_project(dest: Path, source: Path = EXAMPLES, with_build: bool = False) -> Project:
    """Copy specs + models (and optionally the build tree and doit state) from `source` to `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        src = source / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    if with_build:
        shutil.copytree(source / "build", dest / "build")
        for db in source.glob(".doit.db*"):
            shutil.copy2(db, dest / db.name)
    return Project(dest)


def restrict_socs(project: Project, socs: list[str]) -> None:
    """Build every graph only for `socs` (keeps compile/simulate tests short)."""
    for model_yaml in project.root.glob("models/*/model.yaml"):
        text = model_yaml.read_text()
        text = re.sub(r"^    socs: .*\n", "", text, flags=re.M)  # replaces the model's own chip list
        text = re.sub(r"^(    precision: .*)$", lambda m: f"{m.group(1)}\n    socs: [{', '.join(socs)}]", text, flags=re.M)
        model_yaml.write_text(text)


def only_fp16(project: Project) -> None:
    """Build the examples at fp16 only (the w8a16 variants have their own tests)."""
    path = project.root / "models" / "minilm" / "model.yaml"
    text = re.sub(r"^    precision: \[fp16, w8a16\].*$", "    precision: fp16", path.read_text(), flags=re.M)
    path.write_text(re.sub(r"^    calibration: .*\n", "", text, flags=re.M))


def built_once(tmp_path_factory, worker_id: str, name: str, build) -> Project:
    """A session-wide build made once for every pytest-xdist worker, and reused by the others.

    The first worker to ask builds it under the run's shared temp folder, holding a file lock; the
    others wait on the lock and load what it left (`fixture.json`: the build's wall time and doit's
    output). Without xdist (`worker_id == "master"`) it is built in this session's own temp folder.
    Tests only copy these projects (or run no-op doits in them), so sharing the folder is safe.
    """
    if worker_id == "master":
        return build(tmp_path_factory.mktemp(name) / "project")
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / name
    shared.mkdir(exist_ok=True)
    made = shared / "fixture.json"
    with FileLock(str(shared) + ".lock"):
        if made.is_file():
            facts = json.loads(made.read_text())
            project = Project(shared / "project")
            project.wall = facts["wall"]
            project.build_run = DoitResult(**facts["build_run"]) if facts["build_run"] else None
            return project
        project = build(shared / "project")
        run = getattr(project, "build_run", None)
        made.write_text(json.dumps({"wall": project.wall, "build_run": run and
                                    {"returncode": run.returncode, "stdout": run.stdout, "stderr": run.stderr}}))
        return project


@pytest.fixture(scope="session")
def session_store(tmp_path_factory, worker_id) -> Path:
    """The shared cache store the session's base builds (built_graphs, verified) put their results in.

    So the shared-cache tests clone `verified`'s matrix from it instead of building the matrix again.
    One folder for every xdist worker, like the builds that fill it.
    """
    if worker_id == "master":
        return tmp_path_factory.mktemp("session-cache") / "store"
    return tmp_path_factory.getbasetemp().parent / "session-cache" / "store"


@pytest.fixture(scope="session")
def built_graphs(tmp_path_factory, worker_id, session_store) -> Project:
    """The real example project with every graph stage built once (export..cpucheck)."""
    def build(root: Path) -> Project:
        project = copy_project(root)
        restrict_socs(project, ["SM8650", "SM8750"])
        start = time.monotonic()
        project.doit(*GRAPH_STAGES, env={"QNN_CACHE": str(session_store)}, check=True)
        project.wall = time.monotonic() - start
        return project

    return built_once(tmp_path_factory, worker_id, "built", build)


@pytest.fixture
def project_copy(built_graphs, tmp_path) -> Project:
    """A private copy of the built project, with its doit state, to edit and rebuild."""
    return copy_project(tmp_path / "project", source=built_graphs.root, with_build=True)


MINILM_SAMPLES = 1  # each simulated MiniLM run takes ~4 s (8 s beside another worker)


def matrix_edits(project: Project) -> Project:
    """`verified`'s matrix from a copy restricted to SM8650 + SM8750: fp16 only, MiniLM verified on 1 sample."""
    project.edit("models/minilm/model.yaml", "      samples: 8", f"      samples: {MINILM_SAMPLES}")
    only_fp16(project)
    return project


def matrix_project(dest: Path, graphs_from: Project | None = None) -> Project:
    """A copy with `verified`'s matrix (both graphs, SM8650 + SM8750, fp16, MiniLM on 1 sample), not built; or,
    with `graphs_from` (`built_graphs`), its graph stages built (export .. cpucheck) and its chip stages not."""
    if graphs_from is not None:
        return matrix_edits(copy_project(dest, source=graphs_from.root, with_build=True))
    project = copy_project(dest)
    restrict_socs(project, ["SM8650", "SM8750"])
    return matrix_edits(project)


@pytest.fixture(scope="session")
def verified(built_graphs, session_store, tmp_path_factory, worker_id) -> Project:
    """`built_graphs` + `doit simverify report` (both chips, fp16), built once per session.

    MiniLM's `verify: samples:` is cut to 1; the VAD keeps its 36 real audio frames (6 from each of 6 clips). Never edit
    it: copy it (`own_copy`) to change something. Its results are in `session_store` too
    (`project.store`); `project.wall` is the time both builds took; `project.build_run` that doit run.
    """
    def build(root: Path) -> Project:
        project = matrix_project(root, graphs_from=built_graphs)
        start = time.monotonic()
        result = project.doit("simverify", "report", env={"QNN_CACHE": str(session_store)})
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
        project.wall = built_graphs.wall + time.monotonic() - start
        project.build_run = result
        return project

    project = built_once(tmp_path_factory, worker_id, "verified", build)
    project.store = session_store
    return project


@pytest.fixture
def own_copy(verified, tmp_path) -> Project:
    """A private copy of the verified build, with its doit state, to edit and rebuild."""
    return copy_project(tmp_path / "project", source=verified.root, with_build=True)


def plans_of(planner) -> dict:
    """Every plan of the default run by task name (`<stage>:<target>`): planning alone, no build."""
    return {f"{row.name}:{plan.name}": plan for row, plan in plans(planner)}
