"""The architecture's promises, checked in seconds: no import cycles, code keys that cover every module a stage
imports, a stage added as one row plus one module, a stage call that survives JSON."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import copy_project, plans_of

from qnn_tasks import codekeys
from qnn_tasks.plan import rows
from qnn_tasks.plan.stagedef import StageDef
from qnn_tasks.run.calls import StageCall, execute

ROOT = Path(__file__).resolve().parent.parent
ROWS = rows.GRAPH_STAGES + rows.CHIP_STAGES + (rows.PIPELINE,) + rows.ON_DEMAND


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, [])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, []))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    """Imports inside functions count: a cycle hidden behind one is still a cycle."""
    assert _cycles(codekeys.imports()) == []


# The floors of qnn_tasks, bottom first: each entry is a subpackage or a top-level module. A module imports modules of
# its own package and of lower floors only (imports inside functions count); packages on one floor do not import each
# other. This is the order of what uses what, not the order data flows in: the run layer carries calls the plan made,
# but the plan reads records through it (freshness), so it stands above it; toolchains stand below run (an executor
# runs a call in its toolchain's interpreter and checks a worker's toolchain fingerprint) and below devices (the
# simulator opens its sessions with the ort-qnn toolchain's options); every stage's runner is in stages/, whichever
# package does its work. CONTRIBUTING.md repeats the floors (tested).
FLOORS = (
    ("errors", "fileio", "latency", "codekeys", "nativelog"),
    ("envvalues", "rewrites"),
    ("modelspec",),
    ("graphs", "qnn"),
    ("judge",),
    ("toolchains",),
    ("run",),
    ("plan", "devices"),
    ("stages",),
    ("report",),
    ("ship",),
    ("tasks", "scaffold"),
    ("cli",),
    ("__main__",),
)
# (importer, imported) -> why it has to go up, for an import that cannot move to its floor. None has to today.
UPWARD: dict[tuple[str, str], str] = {}


def _unit(module: str) -> str | None:
    """The floor entry a module belongs to: its subpackage or top-level module (None: the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(graph: dict[str, list[str]], floors: tuple[tuple[str, ...], ...]) -> list[str]:
    """`importer -> imported` for every import between packages that does not go down the floors."""
    floor_of = {unit: index for index, floor in enumerate(floors) for unit in floor}
    found = []
    for module, imported in sorted(graph.items()):
        for other in imported:
            mine, theirs = _unit(module), _unit(other)
            if mine and theirs and mine != theirs and floor_of[theirs] >= floor_of[mine]:
                found.append(f"{module} -> {other}")
    return found


def test_every_package_stands_on_one_floor() -> None:
    units = [unit for floor in FLOORS for unit in floor]
    assert len(units) == len(set(units))
    assert {_unit(m) for m in codekeys.imports()} - {None} == set(units)


def test_imports_only_go_down() -> None:
    """Imports inside functions count. An upward import that must stay is an UPWARD entry saying why."""
    allowed = {f"{a} -> {b}" for a, b in UPWARD}
    assert sorted(set(upward_imports(codekeys.imports(), FLOORS)) - allowed) == []
    assert sorted(allowed - set(upward_imports(codekeys.imports(), FLOORS))) == []  # an entry nothing needs goes


def test_upward_import_finder() -> None:
    graph = {"q.low.a": ["q.high.b", "q.low.c"], "q.high.b": ["q.low.a"], "q.side.d": ["q.low.a", "q.mid.e"],
             "q.mid.e": ["q.side.d"], "q": ["q.high.b"]}
    assert upward_imports(graph, (("low",), ("mid", "side"), ("high",))) == [
        "q.low.a -> q.high.b", "q.mid.e -> q.side.d", "q.side.d -> q.mid.e"]


def test_no_module_imports_a_stage_runner() -> None:
    """A stage's runner module is the task layer's to call (executors find it by name): a piece two stages share is a
    module of judge/ or graphs/ (or of stages/ that is no runner), so a stage's code key holds no other stage's code."""
    every = ROWS + (rows.CROSSSIZE, rows.LOOP, rows.REPAIR)
    runners = {r.runner.partition(":")[0] for r in every} | {rows.VARIANT_RUNNER.partition(":")[0]}
    found = [f"{module} -> {other}" for module, imported in sorted(codekeys.imports().items())
             if not module.startswith("qnn_tasks.tasks.") for other in imported if other in runners and other != module]
    assert found == []


def test_contributing_states_the_floors() -> None:
    """CONTRIBUTING.md's line of floors is FLOORS, bottom first."""
    line = " < ".join(", ".join(f"`{unit}`" for unit in floor) for floor in FLOORS)
    assert line in (ROOT / "CONTRIBUTING.md").read_text().replace("\n", " ")



def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_of(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module an `from ... import` names, with relative levels resolved against `module`."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def private_uses(package: Path) -> list[str]:
    """`from x import _name` of another module's private name, and `m._name` on an imported module of the
    package: each as `file:line: what`."""
    modules = {_module_of(p, package) for p in package.rglob("*.py")}
    found = []
    for path in sorted(package.rglob("*.py")):
        me = _module_of(path, package)
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}  # local name -> a module of the package
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(node, me, path.name == "__init__.py")
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{source}.{alias.name}"
                    elif _private(alias.name) and source in modules and source != me:
                        found.append(f"{path.relative_to(package.parent)}:{node.lineno}: "
                                     f"from {source} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        bound[alias.asname or alias.name.partition(".")[0]] = alias.name if alias.asname else ""
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            owner, dotted = node.value, []
            while isinstance(owner, ast.Attribute):
                dotted.insert(0, owner.attr)
                owner = owner.value
            if not isinstance(owner, ast.Name) or owner.id not in bound:
                continue
            target = ".".join([bound[owner.id] or owner.id] + dotted)
            if target in modules and target != me:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {target}.{node.attr}")
    return found


def test_no_private_name_is_used_across_modules() -> None:
    """A name used by another module is part of its API: drop the underscore, or move the function to its user."""
    assert private_uses(ROOT / "qnn_tasks") == []


def test_private_use_finder_finds_both_shapes(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "lib.py").write_text("def _helper():\n    return 1\n\n\ndef ok():\n    return _helper()\n")
    (package / "user.py").write_text("from pkg.sub.lib import _helper, ok\nfrom pkg.sub import lib\n"
                                     "import pkg.sub.lib\n\n\ndef f():\n"
                                     "    return _helper() + lib._helper() + pkg.sub.lib._helper() + ok()\n")
    (package / "sub" / "rel.py").write_text("from .lib import _helper\n")
    assert private_uses(package) == ["pkg/sub/rel.py:1: from pkg.sub.lib import _helper",
                                     "pkg/user.py:1: from pkg.sub.lib import _helper",
                                     "pkg/user.py:7: pkg.sub.lib._helper", "pkg/user.py:7: pkg.sub.lib._helper"]


# Every stage's name (the built-in rows, the toolchains' variant stages, the project-wide on-demand ones)
STAGE_NAMES = {r.name for r in rows.GRAPH_STAGES + rows.CHIP_STAGES + rows.ON_DEMAND} | {
    rows.PIPELINE.name, rows.LOOP.name, rows.CROSSSIZE.name, "quantize", "convert", "modellib"}


def hand_built_records(package: Path, names: set[str] = STAGE_NAMES) -> list[str]:
    """Strings outside plan/ that make a stage record's path themselves, as `file:line: text`: a literal ending in
    `<stage>.json` (e.g. "cpucheck.json", "build/x/simverify/simverify.json"), or an f-string ending in `{E}.json`
    whose E names a stage (`{stage}.json`, `{s.name}.json`) or repeats the folder before it (`{x}/{x}.json`).
    Docstrings are prose, not paths: they are not read."""
    literal = re.compile(rf"(^|/)({'|'.join(sorted(map(re.escape, names)))})\.json$")
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] == "plan":
            continue
        tree = ast.parse(path.read_text(), str(path))
        prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
        inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            text = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose | inner:
                text = node.value if literal.search(node.value) else None
            elif isinstance(node, ast.JoinedStr) and len(node.values) >= 2:
                last, named = node.values[-1], node.values[-2]
                if isinstance(last, ast.Constant) and literal.search(last.value):
                    text = ast.unparse(node)
                elif isinstance(last, ast.Constant) and last.value == ".json" and isinstance(named, ast.FormattedValue):
                    expr = ast.unparse(named.value)
                    before = [ast.unparse(v.value) for v in node.values[:-2] if isinstance(v, ast.FormattedValue)]
                    text = ast.unparse(node) if ("stage" in expr or expr.endswith(".name") or expr in before) else None
            if text:
                found.append((str(path.relative_to(package.parent)), node.lineno, text))
    return [f"{file}:{line}: {text}" for file, line, text in sorted(found)]


def test_record_paths_are_made_only_by_the_plan() -> None:
    """A stage record's path is plan/stagedef.py `record_path` (or a row's `record_of`): a split part's export ..
    cpucheck facts are its graph's split record, and a module that builds `<dir>/<stage>/<stage>.json` itself
    looks for a record that is not there (dist once listed every part as unbuilt)."""
    assert hand_built_records(ROOT / "qnn_tasks") == []


def test_hand_built_record_finder_finds_each_shape(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "plan").mkdir(parents=True)
    (package / "plan" / "ok.py").write_text('A = f"{d}/{stage}/{stage}.json"\n')  # the plan may
    (package / "user.py").write_text(textwrap.dedent('''\
        """Reads <dir>/cpucheck/cpucheck.json (prose)."""
        A = d / "cpucheck.json"
        B = f"{ct.dir_str}/simverify/simverify.json"
        C = f"{d}/{stage}/{stage}.json"
        D = f"{d}/{s.name}/{s.name}.json"
        E = f"{folder}/{x}/{x}.json"
        F = f"{root}/ac/{key[:2]}/{key}.json"
        G = "provider_options.json"
        H = f"{stem}.provider_options.json"
        '''))
    assert hand_built_records(package) == [
        "pkg/user.py:2: cpucheck.json", "pkg/user.py:3: f'{ct.dir_str}/simverify/simverify.json'",
        "pkg/user.py:4: f'{d}/{stage}/{stage}.json'", "pkg/user.py:5: f'{d}/{s.name}/{s.name}.json'",
        "pkg/user.py:6: f'{folder}/{x}/{x}.json'"]


def test_every_on_demand_row_is_planned_and_run_like_a_stage() -> None:
    """An on-demand stage is a row with a plan function and a runner, its tasks made from them like a built stage's;
    one whose runner writes its own records instead of the funnel's names why on its row, and CONTRIBUTING.md says
    so."""
    from qnn_tasks.run.calls import runner

    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    for row in rows.ON_DEMAND:
        assert callable(row.plan), f"{row.name}: no plan function"
        assert callable(runner(row.runner)), f"{row.name}: runner {row.runner!r} is not a function"
        if row.own_record:
            assert len(row.own_record.split()) >= 5, f"{row.name}: own_record must say why, in words"
            assert f"`{row.name}`" in contributing, f"{row.name} writes its own records: CONTRIBUTING.md must say why"


def stage_lookups_by_name(package: Path, names: set[str] = STAGE_NAMES) -> list[str]:
    """`file:line: code` in the task layer (package/tasks) that finds or singles out a stage by its name: a getattr
    whose attribute name is built from another (`getattr(x, f"{name}_tasks")`, `name + "_tasks"`), or a comparison
    with a stage's name (`row.name == "compat"`, `name != "compat"`). What sets a stage apart belongs on its row."""
    found = []
    for path in sorted((package / "tasks").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                    and len(node.args) >= 2 and any(isinstance(n, (ast.JoinedStr, ast.BinOp)) for n in ast.walk(node.args[1])):
                found.append((path.name, node.lineno, ast.unparse(node)))
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Constant) and s.value in names for s in sides):
                    found.append((path.name, node.lineno, ast.unparse(node)))
    return [f"{package.name}/tasks/{file}:{line}: {code}" for file, line, code in sorted(found)]


def test_the_task_layer_never_finds_a_stage_by_its_name() -> None:
    assert stage_lookups_by_name(ROOT / "qnn_tasks") == []


def test_stage_lookup_finder_finds_each_shape(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "tasks").mkdir(parents=True)
    (tmp_path / "pkg" / "tasks" / "t.py").write_text(textwrap.dedent('''\
        a = getattr(OnDemand(f), f"{name}_tasks" if name != "compat" else "compat_task")()
        b = getattr(task, "name", None) or getattr(hooks, name) or getattr(x, name + "_task")
        c = row.name == "compat"
        d = "verify" != stage
        e = row.name == "devices"
        '''))
    assert stage_lookups_by_name(tmp_path / "pkg") == [
        "pkg/tasks/t.py:1: getattr(OnDemand(f), f'{name}_tasks' if name != 'compat' else 'compat_task')",
        "pkg/tasks/t.py:1: name != 'compat'", "pkg/tasks/t.py:2: getattr(x, name + '_task')",
        "pkg/tasks/t.py:3: row.name == 'compat'",
        "pkg/tasks/t.py:4: 'verify' != stage"]


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_stage_key_covers_what_its_runner_imports(row: StageDef) -> None:
    """Import the runner in a fresh interpreter: every qnn_tasks module it loaded is in the stage's code key."""
    module = row.runner.partition(":")[0]
    probe = (f"import importlib, sys; importlib.import_module({module!r}); "
             "print('\\n'.join(m for m in sys.modules if m.startswith('qnn_tasks')))")
    loaded = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                cwd=ROOT).stdout.split())
    assert module in loaded
    assert loaded - set(codekeys.closure((row.runner,))) == set()


def test_key_changes_with_an_imported_module_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the package: editing a module simplify imports changes simplify's key, not export's peers'."""
    import shutil

    package = tmp_path / "qnn_tasks"
    shutil.copytree(ROOT / "qnn_tasks", package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(codekeys, "PACKAGE", package)
    monkeypatch.setattr(codekeys, "MEMO_DIR", tmp_path / "memo")
    codekeys.import_graph.cache_clear()
    codekeys.digest.cache_clear()
    before = {r.name: codekeys.digest((r.runner,)) for r in ROWS}
    onnxinfo = package / "graphs" / "onnxinfo.py"  # imported by export, simplify and lint; not by simulate
    onnxinfo.write_text(onnxinfo.read_text() + "\n# a change\n")
    codekeys.import_graph.cache_clear()
    codekeys.digest.cache_clear()
    after = {r.name: codekeys.digest((r.runner,)) for r in ROWS}
    changed = {name for name in before if before[name] != after[name]}
    assert {"export", "simplify", "lint"} <= changed
    assert "simulate" not in changed and "config" not in changed
    codekeys.import_graph.cache_clear()
    codekeys.digest.cache_clear()


# how YAML is read, not what it means (a stage's section reaches its key as data: its plan digests it)
LOADER_ONLY = ("modelspec/load.py", "modelspec/speccache.py", "modelspec/keys.py", "modelspec/schema.py", "modelspec/stagesettings.py")


def test_no_stage_key_holds_the_spec_loaders() -> None:
    """Stages get their slice of the spec as data (modelspec/specjson.py): how YAML is read is in no stage's key, so a loader
    edit reruns nothing whose inputs did not change."""
    loaders = {"qnn_tasks." + m.removesuffix(".py").replace("/", ".") for m in LOADER_ONLY}
    variant = StageDef("quantize", "variant", "", rows.VARIANT_RUNNER, None)
    for row in ROWS + (rows.CROSSSIZE, rows.LOOP, variant):
        if row.name in ("socscheck", "dist"):
            continue  # they read the spec files themselves: the SoC tables checked, today's spec a package must meet
        assert loaders.isdisjoint(codekeys.closure((row.runner,))), (row.name, loaders & set(codekeys.closure((row.runner,))))


@pytest.mark.slow
def test_a_loader_edit_reruns_nothing(tmp_path: Path) -> None:
    """Real doit on a copy of the package: build, edit a loader-only module, and a second doit runs no task."""
    import os
    import shutil

    from tiny_project import tiny_project

    code = tmp_path / "code"
    shutil.copytree(ROOT / "qnn_tasks", code / "qnn_tasks", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": f"{code}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "XDG_CACHE_HOME": str(tmp_path / "xdg")}  # code-key memos of this copy apart from the suite's
    project = tiny_project(tmp_path / "p", samples=2)
    first = project.doit("simverify", env=env, check=True)
    assert "simverify:tiny-SM8650" in first.executed
    for rel in LOADER_ONLY:
        path = code / "qnn_tasks" / rel
        path.write_text(path.read_text() + "\n# an edit of how YAML is read\n")
    second = project.doit("simverify", env=env, check=True)
    assert second.executed == set(), second.stdout


def test_damaged_memo_is_derived_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codekeys, "MEMO_DIR", tmp_path)
    codekeys.import_graph.cache_clear()
    first = codekeys.import_graph()
    (memo,) = tmp_path.glob("codekeys-*.json")
    memo.write_text("{not json")
    codekeys.import_graph.cache_clear()
    assert codekeys.import_graph() == first
    json.loads(memo.read_text())  # rewritten whole
    codekeys.import_graph.cache_clear()


def test_stage_call_round_trips_through_json() -> None:
    call = StageCall(stage="lint", target="g", args={"graph": {"x": [1, 2]}, "simplified": "build/m/g/s.onnx"},
                     inputs=["a"], out_dir="build/m/g/lint", outputs=[], record="build/m/g/lint/lint.json", key="k",
                     toolchain=None, heavy=False, remote=False, env={"A": "1"}, runner="qnn_tasks.stages.lint:run_call")
    assert StageCall.from_json(call.to_json()) == call


def test_call_without_runner_is_refused() -> None:
    call = StageCall(stage="x", target="t", args={}, inputs=[], out_dir="o", outputs=[], record="o/x.json", key="")
    with pytest.raises(ValueError, match="has no runner"):
        execute(call)


TINY_STAGE = '''
"""A test-only stage: counts the nodes of each simplified graph (one row + this module)."""
from pathlib import Path

from qnn_tasks.plan.rows import register
from qnn_tasks.plan.stagedef import StageDef
from qnn_tasks.plan.stageplans import graph_plan


def plan(p, stage, gt):
    return graph_plan(p, stage, gt, [str(gt.simplified)], [], {}, lambda: {"simplified": str(gt.simplified)},
                      f"count the nodes of {gt.simplified}")


def run_call(call):
    import onnx

    return {"nodes": len(onnx.load(call.args["simplified"]).graph.node)}


register(StageDef("nodecount", "graph", "Count each simplified graph's nodes.", "nodecount:run_call", plan,
                  heavy=False, column=False))
'''


def test_a_stage_is_one_row_and_one_module(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "p")
    for model in (project.root / "models").iterdir():
        if model.name != "silero-vad":
            import shutil

            shutil.rmtree(model)
    (project.root / "nodecount.py").write_text(textwrap.dedent(TINY_STAGE))
    dodo = project.root / "dodo.py"
    dodo.write_text("import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\nimport nodecount"
                    "  # noqa: F401\n" + dodo.read_text())
    listed = project.doit("list")
    assert "nodecount" in listed.stdout and "Count each simplified graph's nodes." in listed.stdout
    result = project.doit("nodecount", check=True)
    assert "nodecount:vad" in result.executed
    record = project.one_json("build/silero-vad/vad/nodecount/nodecount.json")
    assert record["status"] == "passed" and record["nodes"] > 10
    again = project.doit("nodecount", check=True)
    assert "nodecount:vad" in again.uptodate


BUDGET_STAGE = '''
"""A test-only stage with a report column and a model.yaml section of its own: the simplified graph must have at
most `nodebudget: {limit: N}` nodes (10 where the graph does not say)."""
from qnn_tasks.errors import StageError
from qnn_tasks.plan.rows import register
from qnn_tasks.plan.stagedef import StageDef
from qnn_tasks.plan.stageplans import graph_plan
from qnn_tasks.modelspec.stagesettings import StageSettings


def fields():
    from qnn_tasks.modelspec.schema import Fields, Int

    return Fields({"limit": Int(1, 10_000)})


def plan(p, stage, gt):
    limit = gt.graph.section("nodebudget")["limit"]  # graph_plan puts the section into the key
    return graph_plan(p, stage, gt, [str(gt.simplified)], [], {},
                      lambda: {"simplified": str(gt.simplified), "limit": limit},
                      f"at most {limit} nodes in {gt.simplified}")


def run_call(call):
    import onnx

    nodes, limit = len(onnx.load(call.args["simplified"]).graph.node), call.args["limit"]
    if nodes > limit:
        raise StageError(f"{nodes} nodes, more than {limit} (fix: raise nodebudget.limit)")
    return {"nodes": nodes, "limit": limit}


register(StageDef("nodebudget", "graph", "Refuse a graph of more nodes than its nodebudget: {limit: N}.",
                  "nodebudget:run_call", plan, heavy=False,
                  settings=StageSettings("nodebudget", fields, defaults={"limit": 10})))
'''


def test_a_registered_stage_brings_its_own_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A project's stage with a model.yaml section (`register` of a row with `settings`), planned in this process:
    the loader checks the section against the row's schema (one line naming the key and the fix) and fills its
    default, and the stage's key holds it, so an edit of it rekeys that stage and no other. The slow test below
    builds it with doit."""
    import importlib

    from tiny_project import tiny_project

    from qnn_tasks.modelspec import stagesettings
    from qnn_tasks.modelspec.load import load_project
    from qnn_tasks.modelspec.schema import Fields
    from qnn_tasks.modelspec.stagesettings import StageSettings
    from qnn_tasks.plan.planner import Planner

    project = tiny_project(tmp_path / "p")
    yaml = project.path("models/tiny/model.yaml")
    written = yaml.read_text()

    def load(section: str = ""):
        yaml.write_text(written + section)
        return load_project(project.root)

    [(model, line)] = load("    nodebudget: {limit: 3}\n").broken  # no stage has that section yet
    assert model == "tiny" and line.startswith(f"{yaml}: graphs.tiny.nodebudget: unknown key (fix: remove it or use "
                                               "one of: allow_cpu_fallback, calibration, "), line
    monkeypatch.setattr(rows, "_REGISTERED", [])  # the row and its section stay this test's
    monkeypatch.setattr(stagesettings, "_registered", [])
    (tmp_path / "nodebudget.py").write_text(textwrap.dedent(BUDGET_STAGE))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module("nodebudget")  # registers the stage, and its section with it
    finally:
        sys.modules.pop("nodebudget", None)
    for section, problem in (("{limit: 0}", "graphs.tiny.nodebudget.limit: 0 is out of range (fix: use a value "
                                            "between 1 and 10000)"),
                             ("{limt: 3}", "graphs.tiny.nodebudget.limt: unknown key (fix: remove it or use one of: "
                                           "limit)"),
                             ("3", "graphs.tiny.nodebudget: expected a mapping, got 3 (fix: write `key: value` pairs "
                                   "there)")):
        assert load(f"    nodebudget: {section}\n").broken == (("tiny", f"{yaml}: {problem}"),)

    keys, limits = {}, {}
    for case, section in (("default", ""), ("10", "    nodebudget: {limit: 10}\n"),
                          ("3", "    nodebudget: {limit: 3}\n"), ("40", "    nodebudget: {limit: 40}\n")):
        spec = load(section)
        assert not spec.broken, spec.broken
        plans = plans_of(Planner(spec))
        keys[case] = {name: plan.key for name, plan in plans.items()}
        limits[case] = plans["nodebudget:tiny"].args()["limit"]
    assert limits == {"default": 10, "10": 10, "3": 3, "40": 40}
    assert keys["10"] == keys["default"]  # the default written out is the same setting
    for case in ("3", "40"):
        assert {name for name in keys[case] if keys[case][name] != keys["default"][name]} == {"nodebudget:tiny"}
    assert keys["3"]["nodebudget:tiny"] != keys["40"]["nodebudget:tiny"]

    clash = StageDef("verify2", "graph", "", "nodebudget:run_call", None,
                     settings=StageSettings("verify", lambda: Fields({})))
    with pytest.raises(ValueError, match=r"graphs.<graph>.verify is a model.yaml key already \(fix: name its section"):
        rows.register(clash)


@pytest.mark.slow
def test_a_registered_stage_reaches_the_report_and_dist(tmp_path: Path) -> None:
    """A project's own stage (register) with a model.yaml section of its own: a section its schema refuses is the
    model's one-line spec error; the stage is a column of the report, and its verdict is the graph's; an edit of its
    section reruns it and nothing else, and a failing one fails the report and keeps the graph's binaries out of the
    package."""
    from tiny_project import tiny_project

    project = tiny_project(tmp_path / "p", samples=2)
    (project.root / "nodebudget.py").write_text(textwrap.dedent(BUDGET_STAGE))
    dodo = project.root / "dodo.py"
    dodo.write_text("import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent))\nimport nodebudget"
                    "  # noqa: F401\n" + dodo.read_text())
    yaml = project.path("models/tiny/model.yaml")
    written = yaml.read_text()
    yaml.write_text(written + "    nodebudget: {limt: 3}\n")
    refused = project.doit("list")
    assert refused.returncode == 0 and refused.stderr.strip() == (  # the model is unbuildable, not the project
        f"error: {yaml}: graphs.tiny.nodebudget.limt: unknown key (fix: remove it or use one of: limit)"), refused.stderr
    yaml.write_text(written)

    assert project.doit().returncode == 0
    report = project.one_json("build/report/report.json")
    [graph] = report["graphs"]
    assert graph["stages"]["nodebudget"]["status"] == "passed" and report["summary"]["ok"]
    assert graph["stages"]["nodebudget"]["limit"] == 10  # the section's default
    assert "<th>nodebudget</th>" in project.path("build/report/index.html").read_text()
    assert project.doit("dist").returncode == 0
    assert project.path("dist/tiny/manifest.json").is_file()

    yaml.write_text(written + "    nodebudget: {limit: 2}\n")  # its setting changed: it runs again, alone, and fails
    result = project.doit()
    assert result.returncode == 1 and result.executed - {"report"} == {"nodebudget:tiny"}, result.stdout
    report = project.one_json("build/report/report.json")
    [graph] = report["graphs"]
    assert graph["stages"]["nodebudget"]["status"] == "failed" and not report["summary"]["ok"]
    assert "more than 2" in graph["stages"]["nodebudget"]["error"]
    assert report["targets"][0]["status"] == "failed"
    refused = project.doit("dist")
    assert refused.returncode != 0 and "nodebudget" in refused.stdout + refused.stderr
