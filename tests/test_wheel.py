"""Installed, not forked: the wheel in a fresh venv, `init` in an empty folder, a YAML-only model, real `doit`.

qnn_tasks must come from the wheel (not this checkout, not the editable install): PYTHONPATH is unset, the
project lives outside the repository, and the imported module's path is asserted to be inside the venv.
The venv reuses the machine's heavy dependencies (--system-site-packages); the package itself is the wheel's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from tiny_packaged import write_model


def run(args: list, cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # setuptools is installed here: build without isolation (no index needed)
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", ROOT],
                tmp, env, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel, = (tmp / "dist").glob("qnn_npu_compile-*.whl")
    venv = tmp / "venv"
    made = run([sys.executable, "-m", "venv", "--system-site-packages", venv], tmp, env)
    assert made.returncode == 0, made.stderr
    # --ignore-installed: the machine's editable install of the same version must not satisfy it
    installed = run([venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--ignore-installed", "--no-index",
                     wheel], tmp, env, timeout=600)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(venv)}
    return venv, env


@pytest.mark.slow
def test_wheel_installs_inits_and_builds_a_packaged_onnx(venv, tmp_path):
    venv_dir, env = venv
    python = venv_dir / "bin" / "python"
    code = ("import qnn_tasks, qnn_tasks.modelspec.load as s, qnn_tasks.ship.aipack as a; print(qnn_tasks.__file__); "
            "print(s.packaged_socs_file().is_file()); "
            "from importlib import resources; print((resources.files('qnn_tasks.ship') / a.JAVA_SELECTOR).is_file())")
    where = run([python, "-c", code], tmp_path, env)
    assert where.returncode == 0, where.stderr
    module, data, java = where.stdout.split()
    assert Path(module).resolve().is_relative_to(venv_dir.resolve()), module  # the wheel's copy, not the repo's
    assert data == "True"  # the packaged SoC table came with it
    assert java == "True"  # and the Java selector that dist copies into android/qnn_runtime/

    # init an empty folder with the console command; a second init refuses, naming the files
    project = tmp_path / "team-models"
    made = run(["qnn-npu-compile", "init", project], tmp_path, env)
    assert made.returncode == 0, made.stdout + made.stderr
    files = sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file())
    assert files == [".github/workflows/qnn-npu-compile.yml", ".gitignore", "dodo.py", "models/example/model.yaml",
                     "socs/socs.yaml"]
    again = run([python, "-m", "qnn_tasks", "init", project], tmp_path, env)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and "init would overwrite dodo.py, models/example/model.yaml" in again.stderr

    # a YAML-only packaged-ONNX model for one chip; `doit` builds and verifies it on the simulator
    write_model(project / "models" / "tiny", extra="    socs: [SM8650]\n")
    built = run([python, "-m", "doit"], project, env)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "Traceback" not in built.stdout + built.stderr
    for stage in ("context:tiny-SM8650", "simulate:tiny-SM8650", "simverify:tiny-SM8650"):
        assert f"{stage}: passed" in built.stderr, (stage, built.stderr)
    for stage in ("export", "simplify", "lint", "cpucheck"):
        assert json.loads((project / f"build/tiny/tiny/{stage}/{stage}.json").read_text())["status"] == "passed", stage
    report = json.loads((project / "build" / "report" / "report.json").read_text())
    target, = report["targets"]
    assert target["status"] == "passed" and target["soc"]["name"] == "SM8650"
    assert (project / "build" / "report" / "index.html").is_file()
    # the stage ran the wheel's code in its child process too
    record = json.loads(next(project.glob("build/tiny/tiny/*/fp16/SM8650/context/context.json")).read_text())
    assert record["executor"]["python"] == str(python) or Path(record["executor"]["python"]).parent == python.parent

    # `doit list --all` reads well: every target with a one-line doc, the example model skipped while commented
    listing = run([python, "-m", "doit", "list", "--all"], project, env)
    assert listing.returncode == 0 and listing.stderr == "", listing.stderr
    docs = dict(line.split(None, 1) for line in listing.stdout.splitlines())
    assert docs["context:tiny-SM8650"].startswith("compile tiny (fp16) for SM8650 with ort-qnn-")
    assert "phone" in docs["context:tiny-SM8650"]  # the wheel's latency fit was read: an estimate or why none
    assert docs["simverify:tiny-SM8650"].startswith("judge tiny on SM8650")
    assert all(doc.strip() for doc in docs.values()) and not any("example" in name for name in docs)
    assert run([python, "-m", "doit"], project, env).stdout.count("passed") == 0  # a second run does nothing

    # the commented example is a valid spec once uncommented, short of the samples the user supplies
    example = project / "models" / "example" / "model.yaml"
    example.write_text("".join(line.removeprefix("# ") for line in example.read_text().splitlines(keepends=True)))
    listing = run([python, "-m", "doit", "list"], project, env)
    assert listing.returncode == 0  # the example model is not buildable until its samples exist; the rest lists
    assert "models/example/model.yaml: graphs.vad.samples.files: 'samples/*.npz' matches no .npz/.npy file" in listing.stderr
