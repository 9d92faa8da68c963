"""YAML in, checked values out: the building blocks every spec file's loader uses.

A safe YAML loader that rejects duplicate keys, and small checks that turn a wrong value into one
`<file>: <key>: <problem> (fix: <what>)` line. Imports nothing heavy (yaml only when a file is read).
"""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path
from typing import Any

from qnn_tasks.errors import SpecError


@functools.lru_cache(maxsize=1)
def _yaml_loader():
    """PyYAML's safe loader (the C one where libyaml exists) that rejects duplicate keys.

    Built on first use: with the spec cache warm (modelspec/speccache.py), a no-op `doit` never imports yaml.
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

        def construct_int(self, node):
            digits = sum(c.isalnum() for c in node.value)
            if digits > MAX_INT_DIGITS:  # int() of 5000 digits is a ValueError, and nothing needs such a value
                raise yaml.constructor.ConstructorError(None, None, f"an integer of {digits} digits is larger than "
                                                        "any value a spec takes", node.start_mark)
            return super().construct_yaml_int(node)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, Loader.construct_mapping)
    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_int)
    # YAML 1.1 (PyYAML) reads 1e7, -1.0e4 and 1.0e4 as text (its floats need a dot and a signed exponent): read
    # them as the numbers a user means, as YAML 1.2 does. Registered last, so whatever is an int stays an int.
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))
    return yaml, Loader


_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$")
MAX_INT_DIGITS = 40  # far above any count, size or id (2^64 has 20 digits)


# Bounds on what a spec file may make us build in memory. Real specs are a few KB and a few hundred nodes; an
# alias bomb (a billion laughs) is a few hundred bytes that expand to 10^9 nodes wherever the data is walked
# (json.dumps of options, comparisons), and deep nesting crashes libyaml's composer (a segfault, no message).
MAX_BYTES = 4 * 2**20
MAX_NODES = 100_000   # after alias expansion: each use of an alias counts its whole node again
MAX_DEPTH = 100       # after alias expansion


def load_yaml(path: Path) -> Any:
    """The file's one YAML document, or a SpecError naming the file: missing, unreadable, too big, not UTF-8,
    malformed, or expanding past MAX_NODES / MAX_DEPTH."""
    text = read_text(path)
    try:
        yaml, loader = _yaml_loader()
        _check_expansion(text, path)
        return yaml.load(text, Loader=loader)
    except _yaml_loader()[0].YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        fix = "write a smaller number" if str(problem).startswith("an integer of") else "fix the YAML syntax there"
        raise SpecError(path, where, f"malformed YAML: {problem}", fix) from None


def read_text(path: Path) -> str:
    """A spec file's text: UTF-8, at most MAX_BYTES; anything else is one line naming the file (and the byte)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(path, "", "file not found", "create it (see docs/model-yaml.md)") from None
    except OSError as err:
        raise SpecError(path, "", f"cannot be read: {err.strerror or err}", "make it a readable file") from None
    if len(data) > MAX_BYTES:
        raise SpecError(path, "", f"is larger than {MAX_BYTES // 2**20} MiB, far more than any spec",
                        "check that this is the spec file meant; keep data in files the spec names")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise SpecError(path, f"byte {err.start} (line {line})",
                        f"not valid UTF-8 (0x{data[err.start]:02x}: {err.reason})",
                        "save the file as UTF-8") from None


def _check_expansion(text: str, path: Path) -> None:
    """Refuse YAML whose nodes, with every alias expanded, exceed MAX_NODES or MAX_DEPTH (or that refers to itself).

    One pass over libyaml's events, before anything is composed: sizes and depths of anchored nodes are
    remembered, so the expanded size is summed without expanding anything (time and memory grow with the
    file, not with the expansion). Stops at the first bound passed (libyaml slows down on deep nesting).
    """
    import yaml
    from yaml import events

    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (expanded size, expanded depth) of its node
    stack: list[list[Any]] = []               # open collections: [anchor, expanded size so far, deepest child]

    def refuse(event: Any, problem: str, fix: str) -> None:
        mark = event.start_mark
        raise SpecError(path, f"line {mark.line + 1}, column {mark.column + 1}", problem, fix)

    def add(event: Any, size: int, depth: int) -> None:
        if len(stack) + depth > MAX_DEPTH:
            refuse(event, f"nests deeper than {MAX_DEPTH} levels (aliases expanded)", "flatten the structure")
        if stack:
            stack[-1][1] += size
            stack[-1][2] = max(stack[-1][2], depth)
            size = stack[-1][1]
        if size > MAX_NODES:
            refuse(event, f"expands to more than {MAX_NODES} YAML nodes (each use of an alias counts its "
                   "whole node again: an alias bomb?)", "write the values out, or remove the aliases that repeat "
                   "big blocks")

    for event in yaml.parse(text, Loader=_yaml_loader()[1]):
        if isinstance(event, events.AliasEvent):
            if any(frame[0] == event.anchor for frame in stack):
                refuse(event, f"alias *{event.anchor} refers to the node that contains it (endless expansion)",
                       "remove the alias or point it at another node")
            size, depth = anchors.get(event.anchor, (1, 0))  # an unknown anchor: the loader says so
            add(event, size, depth)
        elif isinstance(event, events.ScalarEvent):
            if event.anchor:
                anchors[event.anchor] = (1, 0)
            add(event, 1, 0)
        elif isinstance(event, events.CollectionStartEvent):
            stack.append([event.anchor, 1, 0])
            if len(stack) > MAX_DEPTH:
                refuse(event, f"nests deeper than {MAX_DEPTH} levels", "flatten the structure")
        elif isinstance(event, events.CollectionEndEvent):
            anchor, size, deepest = stack.pop()
            if anchor:
                anchors[anchor] = (size, deepest + 1)
            add(event, size, deepest + 1)


# Names that become a folder under build/ and part of a doit task name (graphs, model folders, SoC rows,
# toolchain profiles and ids): no '/', '..', '=', ':', '*', spaces or a leading '.'/'-', so every build path
# stays inside build/ (and `doit clean` inside the project) and doit takes every task name as written.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
SAFE_NAME_FIX = "use letters, digits, '.', '_' and '-' only, starting with a letter or digit, at most 100 characters"


def as_name(value: Any, path: object, key: str, what: str, fix: str = "rename it") -> str:
    """`value` as a name that is safe as one path part and in task names, else one line naming the file and key."""
    name = str(value)
    if not SAFE_NAME.fullmatch(name):
        raise SpecError(path, key, f"{what} {name!r} is not a safe name: it becomes a folder under build/ and part of "
                        "task names", f"{fix}: {SAFE_NAME_FIX}")
    return name


def installed_version(package: str) -> str | None:
    from qnn_tasks.modelspec.installed import version

    return version(package)


def as_mapping(value: Any, path: Path, key: str) -> dict:
    if value is None and key:
        return {}
    if not isinstance(value, dict):
        raise SpecError(path, key or "top level", f"expected a mapping, got {type(value).__name__}",
                        "write `key: value` pairs there")
    return value


def check_keys(data: dict, allowed: set[str], path: Path, key: str) -> None:
    for k in data:
        if k not in allowed:
            where = f"{key}.{k}" if key else str(k)
            raise SpecError(path, where, "unknown key", f"remove it or use one of: {', '.join(sorted(allowed))}")


def as_int(value: Any, path: Path, key: str, low: int | None = None, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(path, key, f"expected an integer, got '{value}'", f"write a whole number{span(low, high, ' ')}")
    _in_range(value, path, key, low, high)
    return value


def as_number(value: Any, path: Path, key: str, low: float | None = None, high: float | None = None) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        shown = repr(value) if isinstance(value, (str, int, float)) and len(repr(value)) <= 60 else type(value).__name__
        raise SpecError(path, key, f"expected a number, got {shown}", f"write a number{span(low, high, ' ')}")
    _in_range(value, path, key, low, high)
    return float(value)


def _in_range(value: float, path: Path, key: str, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        raise SpecError(path, key, f"{value!r} is out of range", f"use a value{span(low, high, ' ')}")


def span(low: float | None, high: float | None, lead: str = "") -> str:
    """" between 1 and 64" / " of at least 0" (whole numbers written out, others as %g), for messages and docs."""
    def num(value: float) -> str:
        return str(value) if isinstance(value, int) else f"{value:g}"

    if low is not None and high is not None:
        return f"{lead}between {num(low)} and {num(high)}"
    if low is not None:
        return f"{lead}of at least {num(low)}"
    return f"{lead}of at most {num(high)}" if high is not None else ""


def as_bool(value: Any, path: Path, key: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(path, key, f"expected true or false, got '{value}'", "write true or false")
    return value
