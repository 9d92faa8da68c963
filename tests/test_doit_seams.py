"""doit through its seams (CONTRIBUTING.md, "Where things live"): the state file is a BACKEND plugin, the few patches left live
in tasks/doithooks.py only, each pinned to the doit source it was written against, so a doit release that changes
one fails here before it changes a run."""
from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from qnn_tasks.tasks import doithooks, statefile

ROOT = Path(__file__).resolve().parents[1]

# sha256 of inspect.getsource() of each function doithooks.PATCHED replaces, in doit 0.37.0. When a doit release
# changes one, read the new code, check the patch still says what docs/trust.md promises, then update the digest
# and the pin in pyproject.toml.
PATCHED_SOURCES = {
    "doit.runner.Runner._handle_task_error": "16cb95a813749054",
    "doit.runner.Runner.finish": "b1f6bc680d71054b",
    "doit.control.TaskControl.task_dispatcher": "7a1125b7f5bea9aa",
    "doit.control.ExecNode.parent_status": "017843770013f098",
    "doit.control.TaskControl._filter_tasks": "6bccc8ca64b97450",
}


def test_every_patched_doit_function_is_the_one_the_patch_was_written_against() -> None:
    code = (  # a fresh interpreter: this test session may already have installed the patches
        "import hashlib, importlib, inspect, json\n"
        f"patched = {[(m, o, n) for m, o, n, _ in doithooks.PATCHED]!r}\n"
        "print(json.dumps({f'{m}.{o}.{n}': hashlib.sha256(inspect.getsource(getattr(getattr("
        "importlib.import_module(m), o), n)).encode()).hexdigest()[:16] for m, o, n in patched}))\n")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(found) == PATCHED_SOURCES


def test_a_doit_whose_patched_function_changed_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from doit import runner

    def finish(self, report):  # a release that gave finish() a parameter
        return 0

    monkeypatch.setattr(runner.Runner, "finish", finish)
    with pytest.raises(doithooks.DoitChanged, match=r"doit\.runner\.Runner\.finish is not the function .* "
                                                     r"found \('self', 'report'\)\); install the doit pinned"):
        doithooks.check_patched()


def test_the_installed_doit_is_the_one_the_patches_were_written_against() -> None:
    doithooks.check_patched()


def test_the_state_file_backend_is_registered_and_chosen() -> None:
    registered = {point.name: point for point in entry_points(group="doit.BACKEND")}
    assert statefile.NAME in registered, "pip install -e . registers it (pyproject.toml, doit.BACKEND)"
    assert registered[statefile.NAME].load() is statefile.StateFile
    from qnn_tasks.tasks.project import doit_config

    assert doit_config()["backend"] == statefile.NAME


def test_a_full_state_file_is_one_line_and_the_run_exits_74(tmp_path: Path, capfd, monkeypatch) -> None:
    """A real sqlite refusal: the database may not grow past its first pages, as on a full disk."""
    monkeypatch.setattr(statefile, "STATE_FAILURES", [])
    db = statefile.StateFile(str(tmp_path / ".doit.db"), codec=_codec())
    db._conn.execute("PRAGMA max_page_count = 2")
    db.set("task", "dep", "x" * 100_000)
    db.dump()
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "no space left on the device" in err and "the next run checks them again" in err
    assert len(statefile.STATE_FAILURES) == 1


def test_a_state_file_error_that_is_not_the_machine_still_raises(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(statefile, "STATE_FAILURES", [])
    db = statefile.StateFile(str(tmp_path / ".doit.db"), codec=_codec())
    db._conn.execute("drop table doit")
    import sqlite3

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        db.remove("task")


def _codec():
    from doit.dependency import JSONCodec

    return JSONCodec()


def test_the_state_file_plugin_loads_nothing_of_the_project() -> None:
    """doit imports every registered backend on every command of every project: ours must stay this small."""
    code = ("import sys, qnn_tasks.tasks.statefile\n"
            "print(sorted(m for m in sys.modules if m.startswith('qnn_tasks')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert eval(loaded) == ["qnn_tasks", "qnn_tasks.errors", "qnn_tasks.tasks", "qnn_tasks.tasks.statefile"]


def doit_patches_outside_hooks(package: Path) -> list[str]:
    """`file:line: what` for an assignment to an attribute of something imported from doit, or a private doit name
    used, anywhere but tasks/doithooks.py (subclassing a doit class and overriding its methods is the seam)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "doithooks.py" and path.parent.name == "tasks":
            continue
        tree = ast.parse(path.read_text(), str(path))
        from_doit = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "doit":
                from_doit.update(alias.asname or alias.name for alias in node.names)
                found += [f"{path.relative_to(package.parent)}:{node.lineno}: from {node.module} import {a.name}"
                          for a in node.names if a.name.startswith("_")]
            elif isinstance(node, ast.Import):
                from_doit.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "doit")
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                base = target
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(target, ast.Attribute) and isinstance(base, ast.Name) and base.id in from_doit:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno}: assigns {ast.unparse(target)}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and node.args and isinstance(node.args[0], (ast.Name, ast.Attribute)):
                base = node.args[0]
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in from_doit:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno}: setattr({ast.unparse(node.args[0])})")
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in from_doit:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_only_doithooks_patches_doit_or_reads_its_private_names() -> None:
    assert doit_patches_outside_hooks(ROOT / "qnn_tasks") == []


def test_the_patch_finder_finds_each_shape(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "user.py").write_text(
        "from doit import control\nfrom doit.runner import Runner, _private\nimport doit.dependency\n\n\n"
        "def f():\n    control.TaskControl._filter_tasks = None\n    Runner.finish = None\n"
        "    setattr(doit.dependency.SqliteDB, 'dump', None)\n    return control.TaskControl._filter_tasks\n")
    assert sorted(doit_patches_outside_hooks(package)) == sorted([
        "pkg/user.py:2: from doit.runner import _private",
        "pkg/user.py:7: assigns control.TaskControl._filter_tasks",
        "pkg/user.py:8: assigns Runner.finish",
        "pkg/user.py:9: setattr(doit.dependency.SqliteDB)",
        "pkg/user.py:7: control.TaskControl._filter_tasks",
        "pkg/user.py:10: control.TaskControl._filter_tasks",
    ])


def test_every_patch_is_named_in_the_table() -> None:
    """install() replaces exactly the functions PATCHED names (and test_every_patched... pins)."""
    source = inspect.getsource(doithooks.install)
    assigned = {f"{m}.{o}.{n}" for m, o, n, _ in doithooks.PATCHED}
    written = {f"doit.{line.split('=')[0].strip()}" for line in source.splitlines()
               if line.strip().startswith(("runner.", "control.")) and "=" in line}
    assert written == assigned == set(PATCHED_SOURCES)
