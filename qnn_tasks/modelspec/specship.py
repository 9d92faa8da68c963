"""The `ship:` section of a model.yaml: how its package is chosen from and delivered on phones (docs/model-yaml.md).

    ship:
      precision_order: [fp16, w8a16]   # which binary a phone tries first when it has several (default fp16 first)
      delivery: install-time           # the Android AI pack's delivery type: install-time | fast-follow | on-demand

`doit dist` writes precision_order into manifest.json's `selection.precision_order` (qnn/select.py and the Java
selector read it from there); ship/aipack.py writes `delivery` into the pack's build.gradle.kts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks.errors import SpecError
from qnn_tasks.modelspec.checks import PRECISIONS
from qnn_tasks.modelspec.yamlread import as_mapping, check_keys

SHIP_KEYS = {"precision_order", "delivery"}
DELIVERY_TYPES = ("install-time", "fast-follow", "on-demand")  # Play's AI pack delivery types
# fp16 before w8a16; a precision the order does not name (w4a16) comes after it (the selectors' rule 2)
DEFAULT = {"precision_order": ["fp16", "w8a16"], "delivery": "install-time"}


def default() -> dict[str, Any]:
    return {key: (list(value) if isinstance(value, list) else value) for key, value in DEFAULT.items()}


def load(data: Any, path: Path) -> dict[str, Any]:
    """The validated section with its defaults filled in."""
    section = as_mapping(data, path, "ship")
    check_keys(section, SHIP_KEYS, path, "ship")
    result = default()
    if "precision_order" in section:
        order = section["precision_order"]
        if not isinstance(order, list) or not order or len(set(map(str, order))) != len(order) \
                or not all(p in PRECISIONS for p in order):
            raise SpecError(path, "ship.precision_order", f"{order!r} is not a list of precisions",
                            f"a non-empty list of {', '.join(PRECISIONS)} without repeats, first tried first, "
                            f"e.g. precision_order: [w8a16, fp16]")
        result["precision_order"] = list(order)
    if "delivery" in section:
        if section["delivery"] not in DELIVERY_TYPES:
            raise SpecError(path, "ship.delivery", f"{section['delivery']!r} is not an AI pack delivery type",
                            f"use one of: {', '.join(DELIVERY_TYPES)}")
        result["delivery"] = section["delivery"]
    return result
