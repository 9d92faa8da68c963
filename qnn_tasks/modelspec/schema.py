"""The typed schema of the spec files: every key of model.yaml, socs.yaml and a toolchain profile, its type and bounds.

One table per file, checked (`check`) before any loader reads a value: a wrong type or an out-of-range number
anywhere is one line naming the file and the key (`<file>: <key>: expected ..., got ... (fix: ...)`), never an
exception from deeper code, so one bad value makes only its own model unbuildable. The loaders keep what a type
cannot say (a graph that must exist, shapes that must agree, names safe as folders). The key reference of
docs/model-yaml.md is `reference(MODEL)` (tests/test_spec_fuzz.py compares them, both ways).

Our own small table rather than a schema library: it is read on every cold `doit list`, where a library's import
would be paid each time (measured on this machine: `import jsonschema` ~120 ms, `import pydantic` ~55 ms before a
model class is even built), while this module imports nothing but the standard library, and only when YAML is read
(a warm spec cache, as in a no-op `doit`, imports neither YAML nor this). Checking a model.yaml costs ~0.3 ms.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qnn_tasks.errors import SpecError

MAX_DIM = 2**31 - 1   # a tensor dim (int32, as QNN stores dims)
MAX_RANK = 16
MAX_TEXT = 4096       # characters of any text value (a path, a name, a note)
MAX_ITEMS = 10_000    # entries of any list or mapping (the YAML reader bounds the whole file at 100 000 nodes)


def show(value: Any) -> str:
    """A value as a message shows it: short, whatever its size."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (str, int, float)):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"a {type(value).__name__} ({str(value)[:40]})"  # a YAML date, timestamp, set, binary


def _mapping(value: Any, path: Path, key: str, fix: str) -> bool:
    """True for a mapping to check, False for nothing written (None), else the one line."""
    if value is None:
        return False
    if not isinstance(value, dict):
        raise SpecError(path, key, f"expected a mapping, got {show(value)}", fix)
    return True


def _at(key: str, part: str) -> str:
    return f"{key}.{part}" if key else str(part)


class Type:
    """One node of the schema: `check(value, path, key)` raises a SpecError naming the key, else returns."""
    doc = ""  # the type as the key reference shows it

    def accepts(self, value: Any) -> bool:
        """The value is of this type's outer kind (Either dispatches on it)."""
        raise NotImplementedError

    def check(self, value: Any, path: Path, key: str) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return self.doc

    def children(self) -> Iterator[tuple[str, Type]]:
        """(key part, type) of what lies inside, for the key reference."""
        return iter(())


@dataclass(frozen=True)
class Text(Type):
    max_len: int = MAX_TEXT
    doc: str = "text"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str)

    def check(self, value: Any, path: Path, key: str) -> None:
        if not isinstance(value, str):
            raise SpecError(path, key, f"expected {self.doc}, got {show(value)}",
                            "write text there (quote it if YAML reads it as something else)")
        if len(value) > self.max_len:
            raise SpecError(path, key, f"text of {len(value)} characters, more than {self.max_len}", "shorten it")


@dataclass(frozen=True)
class Int(Type):
    low: int | None = None
    high: int | None = None
    bad: str = ""   # the problem for a value that is no integer or below `low`, when a plainer word helps
    fix: str = ""

    def accepts(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def check(self, value: Any, path: Path, key: str) -> None:
        from qnn_tasks.modelspec.yamlread import as_int

        if self.bad and (not self.accepts(value) or (self.low is not None and value < self.low)):
            shown = value if self.accepts(value) else value[:40] if isinstance(value, str) else show(value)
            raise SpecError(path, key, self.bad.format(value=shown), self.fix)
        as_int(value, path, key, self.low, self.high)

    def describe(self) -> str:
        from qnn_tasks.modelspec.yamlread import span

        return "integer" + span(self.low, self.high, " ")


@dataclass(frozen=True)
class Num(Type):
    low: float | None = None
    high: float | None = None

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def check(self, value: Any, path: Path, key: str) -> None:
        from qnn_tasks.modelspec.yamlread import as_number

        as_number(value, path, key, self.low, self.high)

    def describe(self) -> str:
        from qnn_tasks.modelspec.yamlread import span

        return "number" + span(self.low, self.high, " ")


@dataclass(frozen=True)
class Bool(Type):
    doc: str = "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)

    def check(self, value: Any, path: Path, key: str) -> None:
        from qnn_tasks.modelspec.yamlread import as_bool

        as_bool(value, path, key)


@dataclass(frozen=True)
class Numbers(Type):
    """A number, or a (nested) list of numbers: a constant tensor. `bools`: true/false count as numbers (1/0)."""
    doc: str = "number or (nested) list of numbers"
    fix: str = "e.g. sr: 16000"
    bools: bool = True

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (int, float, list)) and (self.bools or not isinstance(value, bool))

    def check(self, value: Any, path: Path, key: str) -> None:
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, list) and item:
                stack.extend(item)
            elif not isinstance(item, (int, float)) or (isinstance(item, float) and not math.isfinite(item)) \
                    or (isinstance(item, bool) and not self.bools):
                raise SpecError(path, key, f"expected a number or a list of numbers, got {show(value)}", self.fix)


@dataclass(frozen=True)
class Free(Type):
    """Free-form (handed to the model's own code): any YAML that JSON can carry (no dates, sets, binary)."""
    doc: str = "free-form mapping (JSON-able values)"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, path: Path, key: str) -> None:
        if not _mapping(value, path, key, "write `key: value` pairs there"):
            return
        stack: list[tuple[Any, str]] = [(value, key)]
        while stack:
            item, where = stack.pop()
            if isinstance(item, dict):
                for k, v in item.items():
                    if not isinstance(k, (str, int)) or isinstance(k, bool):
                        raise SpecError(path, where, f"key {show(k)} is not a name", "use text keys")
                    stack.append((v, _at(where, str(k))))
            elif isinstance(item, list):
                stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
            elif item is not None and not isinstance(item, (str, int, float, bool)):
                raise SpecError(path, where, f"{show(item)} is not a plain value", "quote it to make it text")


@dataclass(frozen=True)
class ListOf(Type):
    item: Type
    min_items: int = 0
    max_items: int = MAX_ITEMS
    bad: str = ""   # the problem for a value that is not such a list (default: "expected a list of ...")
    fix: str = ""

    def accepts(self, value: Any) -> bool:
        return isinstance(value, list)

    def check(self, value: Any, path: Path, key: str) -> None:
        if value is None:  # written with no value: as if not written (the loader's default, or its message)
            return
        if not isinstance(value, list):
            raise SpecError(path, key, self.bad or f"expected a {self.describe()}, got {show(value)}",
                            self.fix or f"write a YAML list, e.g. [a, b] ({self.item.describe()} each)")
        if len(value) > self.max_items:  # the count is what is wrong: say the limit, not the type
            raise SpecError(path, key, f"{len(value)} items, more than the {self.max_items} accepted",
                            f"keep at most {self.max_items}")
        if len(value) < self.min_items:  # the field's own words where it has them ("needs two or more ...")
            count = f"{len(value)} item{'' if len(value) == 1 else 's'}"
            raise SpecError(path, key, self.bad or f"{count}, fewer than the {self.min_items} needed",
                            self.fix or f"give at least {self.min_items} ({self.item.describe()} each)")
        for i, item in enumerate(value):
            self.item.check(item, path, f"{key}[{i}]")

    def describe(self) -> str:
        return f"list of {self.item.describe()}"

    def children(self) -> Iterator[tuple[str, Type]]:
        yield from (("[]" + sub, kind) for sub, kind in _inside(self.item))


@dataclass(frozen=True)
class Fields(Type):
    """A mapping of known keys, each of its type; `required` ones must be there; `one`: exactly one of them."""
    fields: dict[str, Type]
    required: tuple[str, ...] = ()
    one: bool = False
    fix: str = "write `key: value` pairs there"
    doc: str = "mapping"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, path: Path, key: str) -> None:
        if value is None and key and not self.required:
            return
        if not isinstance(value, dict):
            raise SpecError(path, key or "top level", f"expected a mapping, got {show(value)}", self.fix)
        if self.one and len(value) != 1:
            raise SpecError(path, key, f"expected one of {', '.join(self.fields)} as its only key, got {len(value)} keys",
                            self.fix)
        for k in value:
            if k not in self.fields:
                example = "" if self.fix == Fields.fix else f"; {self.fix}"
                raise SpecError(path, _at(key, str(k)), "unknown key",
                                f"remove it or use one of: {', '.join(sorted(self.fields))}{example}")
        for k in self.required:
            if k not in value:
                raise SpecError(path, _at(key, k), "required key is missing", "add it (see docs/model-yaml.md)")
        for k, v in value.items():
            self.fields[k].check(v, path, _at(key, k))

    def children(self) -> Iterator[tuple[str, Type]]:
        for name, kind in self.fields.items():
            yield from ((f".{name}" + sub, inner) for sub, inner in _inside(kind))


@dataclass(frozen=True)
class MapOf(Type):
    """A mapping of names the user chooses (graphs, tensors, inputs) to values of one type."""
    value: Type
    name: str = "<name>"   # how the key reference writes the chosen name
    max_items: int = MAX_ITEMS
    fix: str = "write `name: value` pairs there"
    doc: str = "mapping"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, path: Path, key: str) -> None:
        if not _mapping(value, path, key, self.fix):
            return
        if len(value) > self.max_items:
            raise SpecError(path, key, f"{len(value)} entries, more than {self.max_items}", "split the model")
        for k, v in value.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise SpecError(path, key, f"{show(k)} is not a name", "use names of letters, digits, '.', '_', '-'")
            self.value.check(v, path, _at(key, str(k)))

    def children(self) -> Iterator[tuple[str, Type]]:
        yield from ((f".{self.name}" + sub, inner) for sub, inner in _inside(self.value))


@dataclass(frozen=True)
class Either(Type):
    """One of several types, chosen by the value's outer kind (text or a list; a number or a mapping)."""
    options: tuple[Type, ...] = field(default_factory=tuple)
    fix: str = ""
    doc: str = ""

    def accepts(self, value: Any) -> bool:
        return any(option.accepts(value) for option in self.options)

    def check(self, value: Any, path: Path, key: str) -> None:
        for option in self.options:
            if option.accepts(value):
                option.check(value, path, key)
                return
        raise SpecError(path, key, f"expected {self.describe()}, got {show(value)}", self.fix or "see docs/model-yaml.md")

    def describe(self) -> str:
        return self.doc or " or ".join(option.describe() for option in self.options)

    def children(self) -> Iterator[tuple[str, Type]]:
        for option in self.options:
            yield from option.children()


@dataclass(frozen=True)
class Section(Type):
    """A part used in several places (a verify section, a task check): listed once in the key reference, as
    `<name>.key`, where each place that uses it names `<name>`."""
    name: str
    inner: Type

    def accepts(self, value: Any) -> bool:
        return self.inner.accepts(value)

    def check(self, value: Any, path: Path, key: str) -> None:
        self.inner.check(value, path, key)

    def describe(self) -> str:
        return f"<{self.name}>"


def _inside(kind: Type) -> Iterator[tuple[str, Type]]:
    """The key itself, then every key below it."""
    yield "", kind
    yield from kind.children()


def check(data: Any, schema: Type, path: Path) -> None:
    """The file's data against its schema: the first wrong key, as one line (SpecError), or nothing."""
    schema.check(data, path, "")


def reference(schema: Type) -> dict[str, str]:
    """Every key path the schema knows (`graphs.<graph>.inputs.<input>.shape`, `...checks[].ctc.alphabet`) -> its type,
    as docs/model-yaml.md's key reference lists them."""
    rows: dict[str, str] = {}
    sections: dict[str, Type] = {}
    todo: list[tuple[str, Type]] = [("", schema)]
    while todo:
        prefix, top = todo.pop(0)
        for sub, kind in top.children():
            name = (prefix + sub).lstrip(".")
            if name and not name.endswith("[]"):
                rows.setdefault(name, kind.describe())
            if isinstance(kind, Section) and kind.name not in sections:
                sections[kind.name] = kind
                todo.append((f"<{kind.name}>", kind.inner))
    return rows
