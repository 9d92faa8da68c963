"""The version of the code that produced an artifact: a digest of every module a stage imports.

Part of every stage's key, so upgrading qnn-npu-compile reruns exactly the stages
whose code changed, and a shared cache never hands out a result of other code. The modules are
derived from the code, never listed by hand: a stage's entry module (its runner in the stage table)
and everything it imports inside qnn_tasks, transitively, at module level or inside functions
(imports under `if TYPE_CHECKING:` run nothing and are left out). A dynamic
`importlib.import_module(f"{__name__}.{x}")` depends on every module under that prefix.

Parsing ~100 modules costs ~100 ms, too much for a no-op `doit`: the import graph and the source
digests are remembered in one small file per package folder under ~/.cache/qnn-npu-compile/, valid
while every source file has the same size and mtime.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
NAME = "qnn_tasks"
MEMO_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qnn-npu-compile"
EXTRA_SUFFIXES = (".j2",)  # non-Python files that are code: the report's template


def _sources() -> dict[str, Path]:
    """Every module of the package by dotted name, and its file."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("").parts
        parts = rel[:-1] if rel[-1] == "__init__" else rel
        found[".".join((NAME,) + parts)] = path
    return found


def _signature(files: list[Path]) -> str:
    h = hashlib.sha256(str(PACKAGE).encode())
    for path in files:
        st = path.stat()
        h.update(f"{path}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING"
                                         or getattr(test, "attr", None) == "TYPE_CHECKING")


def _walk(tree: ast.AST):
    """ast.walk, leaving out `if TYPE_CHECKING:` bodies."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                todo.extend(child.orelse)
            else:
                todo.append(child)


def _dynamic_prefix(call: ast.Call, module: str, package: str) -> str | None:
    """`import_module(f"{__name__}.x")` / `(f"qnn_tasks.stages.{x}")`: the constant prefix it imports under."""
    func = call.func
    name = getattr(func, "attr", None) or getattr(func, "id", None)
    if name != "import_module" or not call.args or not isinstance(call.args[0], ast.JoinedStr):
        return None
    prefix = ""
    for value in call.args[0].values:
        if isinstance(value, ast.Constant):
            prefix += str(value.value)
        elif isinstance(value, ast.FormattedValue) and getattr(value.value, "id", None) in ("__name__", "__package__"):
            prefix += module if value.value.id == "__name__" else package
        else:
            break
    return prefix if prefix.startswith(NAME) else None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """The package modules one module imports (directly)."""
    tree = ast.parse(path.read_bytes(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith(NAME):
                submodules = {f"{target}.{a.name}" for a in node.names} & modules.keys()
                found.update(submodules)
                if len(submodules) < len(node.names):  # names defined in the module itself
                    found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(NAME))
        elif isinstance(node, ast.Call):
            prefix = _dynamic_prefix(node, module, package)
            if prefix:
                found.update(m for m in modules if m.startswith(prefix) and m != module)
    return sorted(m for m in found if m in modules and m != module)


def imports() -> dict[str, list[str]]:
    """module -> the package modules it names in an import (module level or in a function)."""
    return import_graph()[0]


def _extra_files() -> list[Path]:
    return sorted(p for suffix in EXTRA_SUFFIXES for p in PACKAGE.rglob(f"*{suffix}"))


@functools.lru_cache(maxsize=1)
def import_graph() -> tuple[dict[str, list[str]], dict[str, str]]:
    """(module -> modules it imports, module or extra file -> sha256), from the memo while sources are unchanged."""
    modules = _sources()
    extras = _extra_files()
    signature = _signature(list(modules.values()) + extras)
    memo = MEMO_DIR / f"codekeys-{hashlib.sha256(str(PACKAGE).encode()).hexdigest()[:16]}.json"
    try:
        data = json.loads(memo.read_text())
        if data["signature"] == signature:
            return data["imports"], data["digests"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no memo, or an old or damaged one: derive again
    found = {m: _imports(m, p, modules) for m, p in modules.items()}
    digests = {m: hashlib.sha256(p.read_bytes()).hexdigest() for m, p in modules.items()}
    digests.update({str(p.relative_to(PACKAGE)): hashlib.sha256(p.read_bytes()).hexdigest() for p in extras})
    try:
        MEMO_DIR.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"signature": signature, "imports": found, "digests": digests}))
        os.replace(tmp, memo)
    except OSError:
        pass  # a read-only home: derive every run
    return found, digests


def _outside(module: str) -> tuple[str, list[str]]:
    """(sha256, package modules it imports) of an entry module outside qnn_tasks (a project's own stage)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ValueError(f"code version: no module {module}")
    path = Path(spec.origin)
    return hashlib.sha256(path.read_bytes()).hexdigest(), _imports(module, path, _sources())


def closure(entries: tuple[str, ...]) -> tuple[str, ...]:
    """Every package module the entry modules import, transitively (the entries included), sorted.

    An entry outside qnn_tasks (a stage registered by a project) counts with the package modules it imports.
    """
    graph, _ = import_graph()
    seen: set[str] = set()
    todo = [e.partition(":")[0] for e in entries]
    todo = [m for m in todo if m.startswith(NAME)] + [d for m in todo if not m.startswith(NAME) for d in _outside(m)[1]]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        if module not in graph:
            raise ValueError(f"code version: no module {module}")
        seen.add(module)
        todo.extend(graph[module])
        # importing a module runs the __init__ of every package above it
        todo.extend(".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1))
    return tuple(sorted(seen))


@functools.lru_cache(maxsize=None)
def digest(entries: tuple[str, ...], files: tuple[str, ...] = ()) -> str:
    """One short digest of the code behind some entry modules (`module` or `module:function`), plus package
    files that are code but not Python (paths relative to qnn_tasks/, e.g. the report's template)."""
    _, digests = import_graph()
    parts = [f"{m}:{digests[m]}" for m in closure(entries)] + [f"{f}:{digests[f]}" for f in sorted(files)]
    parts += [f"{m}:{_outside(m)[0]}" for m in sorted({e.partition(':')[0] for e in entries}) if not m.startswith(NAME)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
