"""Words the package writes that a type or a file should back, and rot: a record's status is a `Status` member, not a
string literal (run/status.py); every `qnn_tasks/...py` a message names is a module that exists; no public function
is left that nothing calls; a planner and the spec types are typed (a `TYPE_CHECKING` import where one would cycle)."""
from __future__ import annotations

import ast
import importlib
import json
import re
import textwrap
import typing
from pathlib import Path

from qnn_tasks import fileio
from qnn_tasks.run.status import Status

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "qnn_tasks"
WORDS = {s.value for s in Status}
PACKAGE_PATH = re.compile(r"\bqnn_tasks/[\w/-]+\.(?:py|yaml|yml|json)\b")
TEXT = (".py", ".yaml", ".yml", ".json", ".md", ".html", ".j2", ".txt")
SPEC_TYPES = ("project", "specloop", "specpipeline", "specsplit", "speccache", "specship", "checks", "installed")


def _words_in(node: ast.AST) -> list[ast.Constant]:
    """The status words a value spells as string literals (`"a" if c else "b"` and tuples of words included)."""
    if isinstance(node, ast.IfExp):
        return _words_in(node.body) + _words_in(node.orelse)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [w for e in node.elts for w in _words_in(e)]
    return [node] if isinstance(node, ast.Constant) and node.value in WORDS else []


def _is_status(node: ast.AST) -> bool:
    """`x["status"]`, `x.get("status")`, `x.status` or a variable named `status`."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "status"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "status"
    if isinstance(node, ast.Attribute):
        return node.attr == "status"
    return isinstance(node, ast.Name) and node.id == "status"


def status_literals(source: str) -> list[int]:
    """Lines where a status word is written, assigned or compared as a string literal instead of a `Status`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        values: list[ast.AST] = []
        if isinstance(node, ast.keyword) and node.arg == "status":
            values = [node.value]
        elif isinstance(node, ast.Dict):
            values = [v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "status"]
        elif isinstance(node, ast.Assign) and any(_is_status(t) for t in node.targets):
            values = [node.value]
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_status(o) for o in operands):
                values = [o for o in operands if not _is_status(o)]
        elif isinstance(node, (ast.For, ast.comprehension)) and _is_status(node.target):
            values = [node.iter]
        found += [w.lineno for v in values for w in _words_in(v)]
    return sorted(set(found))


def test_status_words_are_status_members() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name == "run/status.py":
            continue
        lines = status_literals(path.read_text())
        if lines:
            offenders[name] = lines
    assert not offenders, f"status words as string literals (use qnn_tasks.run.status.Status): {offenders}"


def test_status_literal_finder_finds_each_shape() -> None:
    source = textwrap.dedent("""
        record.update(status="failed")
        entry = {"status": "warning" if warned else "passed"}
        entry["status"] = "skipped"
        if record.get("status") == "stale" or t["status"] in ("failed", "pending"):
            pass
        for status in ("failed", "stale"):
            pass
        ok = {"status": Status.PASSED, "phase": "passed", "kind": "warning"}
        severity = "warning"
    """)
    assert status_literals(source) == [2, 3, 4, 5, 7]


def test_a_record_written_with_status_members_is_the_same_bytes_as_with_words(tmp_path: Path) -> None:
    members = {"status": Status.WARNING, "devices": [{"status": s} for s in Status], Status.FAILED: 1}
    words = {"status": "warning", "devices": [{"status": s.value} for s in Status], "failed": 1}
    fileio.write_json(tmp_path / "members.json", members)
    fileio.write_json(tmp_path / "words.json", words)
    assert (tmp_path / "members.json").read_bytes() == (tmp_path / "words.json").read_bytes()
    assert json.dumps(members) == json.dumps(words) and f"{Status.STALE}" == "stale"
    assert json.loads((tmp_path / "members.json").read_text()) == members  # read back, it compares with the members


def test_every_package_file_a_message_or_comment_names_exists() -> None:
    """A `qnn_tasks/...` path in the package's code, messages, comments and data, the tests and the docs is a file
    (a module moved or renamed leaves none behind: qnn/binary.py's error once named the file it was before)."""
    texts = [p for top in ("qnn_tasks", "tests", "docs") for p in sorted((ROOT / top).rglob("*")) if p.suffix in TEXT]
    named = {(p.relative_to(ROOT).as_posix(), m) for p in texts + [ROOT / "README.md"]
             for m in PACKAGE_PATH.findall(p.read_text(errors="replace"))}
    assert len(named) > 20  # the search does find the paths the package names
    missing = sorted((where, path) for where, path in named if not (ROOT / path).is_file())
    assert not missing, f"names of package files that do not exist: {missing}"


def test_every_public_function_is_used() -> None:
    """A module-level public function is named somewhere besides its own `def`: in the package (a call, an import, a
    runner string), the tests, dodo.py, pyproject.toml's entry points or the benchmarks. One that is not is dead."""
    package = sorted(PACKAGE.rglob("*.py"))
    users = package + sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    users += [ROOT / "dodo.py", ROOT / "pyproject.toml", *PACKAGE.rglob("*.j2"), *PACKAGE.rglob("*.html")]
    words: dict[str, int] = {}
    for path in users:
        for word in re.findall(r"\w+", path.read_text(errors="replace")):
            words[word] = words.get(word, 0) + 1
    dead = [f"{path.relative_to(PACKAGE)}: {node.name}" for path in package for node in ast.parse(path.read_text()).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")
            and words.get(node.name, 0) <= 1]
    assert not dead, f"public functions nothing uses (remove them): {dead}"


def test_a_planner_parameter_is_typed() -> None:
    untyped = [f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}" for path in sorted(PACKAGE.rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
               for arg in node.args.args + node.args.kwonlyargs if arg.arg == "planner" and arg.annotation is None]
    assert not untyped, f"`planner` without a type (plan.planner.Planner): {untyped}"


def _hints_namespace(module) -> dict:
    """The module's names plus what its `if TYPE_CHECKING:` block imports, for resolving its annotations."""
    names = dict(vars(module))
    for node in ast.parse(Path(module.__file__).read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            exec(compile(ast.Module(body=node.body, type_ignores=[]), module.__file__, "exec"), names)
    return names


def test_spec_types_name_their_types() -> None:
    """A field of a spec type is a type, not `Any` or a bare `tuple`, and every annotation of the spec modules
    resolves (the `TYPE_CHECKING` imports included)."""
    loose = []
    for name in SPEC_TYPES:
        module = importlib.import_module(f"qnn_tasks.modelspec.{name}")
        namespace = _hints_namespace(module)
        for obj in vars(module).values():
            if getattr(obj, "__module__", None) != module.__name__ or not callable(obj):
                continue
            hints = typing.get_type_hints(obj, globalns=namespace)  # raises on a name that is not there
            if isinstance(obj, type) and hasattr(obj, "__dataclass_fields__"):
                loose += [f"modelspec/{name}.py {obj.__name__}.{field}" for field, hint in hints.items()
                          if hint in (typing.Any, object, tuple)]
    assert not loose, f"spec fields typed Any/object/tuple: {loose}"
