"""YAML in, checked values out: the building blocks every spec file's loader uses.

A safe YAML loader that rejects duplicate keys, and small checks that turn a wrong value into one
`<file>: <key>: <problem> (fix: <what>)` line. Imports nothing heavy (yaml only when a file is read).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from qnn_tasks.errors import SpecError


@functools.lru_cache(maxsize=1)
def _yaml_loader():
    """PyYAML's safe loader (the C one where libyaml exists) that rejects duplicate keys.

    Built on first use: with the spec cache warm (speccache.py), a no-op `doit` never imports yaml.
    """
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:  # PyYAML would silently keep the last one
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, Loader.construct_mapping)
    return yaml, Loader


def load_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(path, "", "file not found", "create it (see README: file formats)") from None
    try:
        yaml, loader = _yaml_loader()
        return yaml.load(text, Loader=loader)
    except _yaml_loader()[0].YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(path, where, f"malformed YAML: {problem}", "fix the YAML syntax there") from None


def _package_version(package: str) -> str | None:
    from qnn_tasks.spec.installed import version

    return version(package)


def _mapping(value: Any, path: Path, key: str) -> dict:
    if value is None and key:
        return {}
    if not isinstance(value, dict):
        raise SpecError(path, key or "top level", f"expected a mapping, got {type(value).__name__}",
                        "write `key: value` pairs there")
    return value


def _section(data: dict, name: str, allowed: set[str], path: Path, key: str) -> dict:
    section = _mapping(data.get(name, {}), path, f"{key}.{name}")
    _check_keys(section, allowed, path, f"{key}.{name}")
    return section


def _check_keys(data: dict, allowed: set[str], path: Path, key: str) -> None:
    for k in data:
        if k not in allowed:
            where = f"{key}.{k}" if key else str(k)
            raise SpecError(path, where, "unknown key", f"remove it or use one of: {', '.join(sorted(allowed))}")


def _require(data: dict, required: tuple[str, ...], path: Path, key: str) -> None:
    for k in required:
        if k not in data:
            where = f"{key}.{k}" if key else k
            raise SpecError(path, where, "required key is missing", "add it (see README: file formats)")


def _int(value: Any, path: Path, key: str, low: int | None = None, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(path, key, f"expected an integer, got '{value}'", f"write a whole number{_span(low, high, ' ')}")
    _in_range(value, path, key, low, high)
    return value


def _number(value: Any, path: Path, key: str, low: float | None = None, high: float | None = None) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        raise SpecError(path, key, f"expected a number, got {value!r}", f"write a number{_span(low, high, ' ')}")
    _in_range(value, path, key, low, high)
    return float(value)


def _in_range(value: float, path: Path, key: str, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        raise SpecError(path, key, f"{value!r} is out of range", f"use a value{_span(low, high, ' ')}")


def _span(low: float | None, high: float | None, lead: str = "") -> str:
    if low is not None and high is not None:
        return f"{lead}between {low:g} and {high:g}"
    if low is not None:
        return f"{lead}of at least {low:g}"
    return f"{lead}of at most {high:g}" if high is not None else ""


def _bool(value: Any, path: Path, key: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(path, key, f"expected true or false, got '{value}'", "write true or false")
    return value
