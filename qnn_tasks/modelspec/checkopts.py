"""The options of the task checks that fit a model's output (`elements`, `detection`, `ctc`, and `slice:` on
array checks), checked at spec load against the output's declared shape. Pure Python: no numpy here.

A slice is numpy's own syntax for one sample's output, e.g. `"..., 4:"` (the score columns of a
`[1, N, 4 + classes]` tensor) or `"0, :, 0:2"`; only integers, `:` and one `...` are accepted.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from qnn_tasks.errors import SpecError

BOX_FORMATS = ("cxcywh", "xyxy")
_PART = re.compile(r"^\s*(-?\d+)?\s*(?::\s*(-?\d+)?\s*(?::\s*(-?\d+)?\s*)?)?$")


def parse_slice(text: str) -> tuple:
    """`"..., 4:"` (or `"[..., 4:]"`) -> (Ellipsis, slice(4, None)); ValueError with the reason otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"expected a slice like \"..., 4:\", got {text!r}")
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    parts: list[Any] = []
    for part in body.split(","):
        if part.strip() == "...":
            parts.append(Ellipsis)
            continue
        match = _PART.match(part)
        if not match or not part.strip():
            raise ValueError(f"'{part.strip()}' is not an integer, a start:stop:step or ...")
        if ":" not in part:
            parts.append(int(match.group(1)))
        else:
            start, stop, step = (None if g is None else int(g) for g in match.groups())
            if step == 0:
                raise ValueError("a step of 0")
            parts.append(slice(start, stop, step))
    if parts.count(Ellipsis) > 1:
        raise ValueError("more than one ...")
    return tuple(parts)


def sliced_shape(shape: tuple[int, ...], index: tuple) -> tuple[int, ...]:
    """The shape `index` leaves of an array of `shape` (numpy's rules for ints, slices and one Ellipsis)."""
    index = list(index)
    if Ellipsis in index:
        at = index.index(Ellipsis)
        fill = len(shape) - (len(index) - 1)
        if fill < 0:
            raise ValueError(f"{len(index) - 1} indices for {len(shape)} dims")
        index[at:at + 1] = [slice(None)] * fill
    if len(index) > len(shape):
        raise ValueError(f"{len(index)} indices for {len(shape)} dims")
    index += [slice(None)] * (len(shape) - len(index))
    result = []
    for dim, part in zip(shape, index):
        if isinstance(part, int):
            if not -dim <= part < dim:
                raise ValueError(f"index {part} is outside a dim of {dim}")
        else:
            result.append(len(range(*part.indices(dim))))
    return tuple(result)


def check_options(kind: str, options: dict[str, Any], shape: tuple[int, ...] | None, where: Path, key: str) -> None:
    if "slice" in options:
        try:
            index = parse_slice(options["slice"])
            left = sliced_shape(tuple(shape), index) if shape else None
        except ValueError as err:
            raise SpecError(where, f"{key}.slice", f"{options['slice']!r} does not slice output '{options['output']}'"
                            f"{' ' + str(list(shape)) if shape else ''}: {err}",
                            'write numpy\'s slice of one sample, e.g. slice: "..., 4:"') from None
        if left is not None and 0 in left:
            raise SpecError(where, f"{key}.slice", f"{options['slice']!r} leaves nothing of {list(shape)} ({list(left)})",
                            "pick a slice that keeps some elements")
    if kind == "elements" and ("tol" in options) == ("threshold" in options):
        raise SpecError(where, key, "needs exactly one of tol (|cpu - npu| <= tol) or threshold (the same side of it)",
                        "e.g. elements: {output: mask, threshold: 0.5, min: 0.999}")
    if kind == "detection":
        _detection(options, shape, where, key)
    if kind == "ctc":
        _ctc_ranges(options, shape, where, key)
    if kind == "ctc" and "alphabet" in options:
        from qnn_tasks.modelspec.specport import confined, stays_in_folder

        confined(options["alphabet"], where, f"{key}.alphabet", "the model folder")
        folder = Path(where).parent
        if not (folder / options["alphabet"]).is_file():
            raise SpecError(where, f"{key}.alphabet", f"'{options['alphabet']}' is not a file in {folder}",
                            "give a text file with one symbol per line (the classes after the blank, in order)")
        stays_in_folder(folder / options["alphabet"], folder, where, f"{key}.alphabet")  # its lines reach messages


def _detection(options: dict[str, Any], shape: tuple[int, ...] | None, where: Path, key: str) -> None:
    if options.get("box_format", "cxcywh") not in BOX_FORMATS:
        raise SpecError(where, f"{key}.box_format", f"unknown box format {options['box_format']!r}",
                        f"use one of: {', '.join(BOX_FORMATS)}")
    for flag in ("transpose", "objectness"):
        if not isinstance(options.get(flag, False), bool):
            raise SpecError(where, f"{key}.{flag}", f"expected true or false, got {options[flag]!r}", "write true or false")
    if shape:
        columns = shape[-2] if options.get("transpose") else shape[-1]
        needed = 6 if options.get("objectness") else 5
        if len(shape) < 2 or columns < needed:
            raise SpecError(where, key, f"output '{options['output']}' {list(shape)} has {columns} columns per box; "
                            f"boxes need 4 coordinates{', objectness' if needed == 6 else ''} and at least one class score",
                            "rows are [x, y, w, h, (objectness,) scores...]; for [1, 4 + classes, N] set transpose: true")


def _ctc_ranges(options: dict[str, Any], shape: tuple[int, ...] | None, where: Path, key: str) -> None:
    """`steps:` and `classes:` of a ctc check: one start:stop each, keeping some of the output's time steps/classes."""
    axis = options.get("axis", -1)
    for name in ("steps", "classes"):
        if name not in options:
            continue
        try:
            parts = parse_slice(options[name])
            if len(parts) != 1 or not isinstance(parts[0], slice):
                raise ValueError("give one start:stop range")
            if shape:
                classes = shape[axis] if -len(shape) <= axis < len(shape) else 0
                total = classes if name == "classes" else (_product(shape) // classes if classes else 0)
                if not len(range(*parts[0].indices(total))):
                    raise ValueError(f"it keeps none of the {total} {name.replace('steps', 'time steps')} of "
                                     f"output '{options['output']}' {list(shape)}")
        except ValueError as err:
            raise SpecError(where, f"{key}.{name}", f"{options[name]!r} is not a range of {name}: {err}",
                            f'write start:stop as numpy slices it, e.g. {name}: "1:20" keeps 1..19') from None


def _product(shape: tuple[int, ...]) -> int:
    result = 1
    for dim in shape:
        result *= dim
    return result
