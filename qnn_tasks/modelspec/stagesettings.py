"""A stage's model.yaml section, declared once: its keys under `graphs.<graph>` with their types and bounds, their
defaults, what a type cannot say, and the name the stage's key gives it (StageSettings).

The stage's row points at its declaration (plan/rows.py `StageDef(settings=...)`; a row a project registers brings
its own), and everything else follows from it: the schema lists the section (modelspec/keys.py), the loader checks it and
fills its defaults (modelspec/load.py), a GraphSpec holds it in `settings` by section name (`graph.section(name)`),
modelspec/specjson.py carries it as it is, and the stage's plan digests it into its key (plan/stageplans.py `graph_plan`,
`Planner.chip_key`), so an edit of it reruns that stage. Sections every graph has whatever its stages (`verify:`,
read by six stages; `split:`, which makes graphs) stay fields of GraphSpec.

A section's schema is a function, called when YAML is read: planning with a warm spec cache (a no-op `doit`)
imports no schema (modelspec/schema.py).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from qnn_tasks.modelspec.checks import (
    CALIBRATION_DEFAULTS,
    REPAIR_BUDGET,
    THRESHOLD_RANGES,
    check_calibration,
    check_lint,
)
from qnn_tasks.modelspec.specport import skip_optimizers
from qnn_tasks.modelspec.yamlread import as_mapping

if TYPE_CHECKING:
    from qnn_tasks.modelspec.project import GraphSpec
    from qnn_tasks.modelspec.schema import Type

# (the section as written, the file, its key `graphs.<graph>.<section>`, the graph's precisions) -> the section to
# keep (None: as written); a SpecError for what the schema cannot say
Check = Callable[[dict, Path, str, tuple], "dict[str, Any] | None"]


@dataclass(frozen=True, eq=False)
class StageSettings:
    """One stage's section under `graphs.<graph>` in model.yaml."""
    section: str                                   # its key under graphs.<graph>
    fields: Callable[[], Type]                     # its schema (modelspec/schema.py's types), built when YAML is read
    key: str = ""                                  # its name in the stage's key ("": the section's)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # filled in where the section does not say
    check: Check | None = None                     # what its types cannot say

    def load(self, written: Any, path: Path, key: str, precisions: tuple[str, ...]) -> dict[str, Any]:
        """The section of one graph (already checked against `fields` with the whole file), checked, defaults filled."""
        section = dict(as_mapping(written, path, key))
        checked = self.check(section, path, key, tuple(precisions)) if self.check else None
        return {**self.defaults, **(section if checked is None else checked)}

    def keyed(self, graph: GraphSpec) -> dict[str, Any]:
        """What the stage's key holds of this section: `{<key>: <the graph's section>}`."""
        return {self.key or self.section: graph.section(self.section)}


def _simplify_fields() -> Type:
    from qnn_tasks.modelspec.schema import Bool, Fields, ListOf, Text

    return Fields({"skip": Bool(), "skip_optimizers": ListOf(Text(max_len=100))})


def _simplify_check(section: dict, path: Path, key: str, precisions: tuple) -> None:
    skip_optimizers(section, path, f"{key}.skip_optimizers")


def _cpucheck_fields() -> Type:
    from qnn_tasks.modelspec.schema import Fields, Num

    return Fields({name: Num(*THRESHOLD_RANGES[name]) for name in ("max_abs", "min_cosine")})


def _lint_fields() -> Type:
    from qnn_tasks.modelspec.schema import Fields, ListOf, Text

    return Fields({"allow": ListOf(Text(max_len=100))})


def _calibration_fields() -> Type:
    from qnn_tasks.modelspec.schema import Bool, Fields, Int, Text

    return Fields({"samples": Int(None, 100_000), "function": Text(max_len=100), "per_channel": Bool(),
                   "repair_budget": Int(*REPAIR_BUDGET)})


SIMPLIFY = StageSettings("simplify", _simplify_fields, check=_simplify_check)
CPUCHECK = StageSettings("cpucheck", _cpucheck_fields, key="tolerance")
LINT = StageSettings("lint", _lint_fields, check=check_lint)
CALIBRATION = StageSettings("calibration", _calibration_fields, defaults=CALIBRATION_DEFAULTS, check=check_calibration)
BUILT_IN = (SIMPLIFY, CPUCHECK, LINT, CALIBRATION)  # checked in this order

_registered: list[StageSettings] = []


def declare(settings: StageSettings) -> None:
    """Add the section of a stage a project registers (plan/rows.py `register`, which checks its name first)."""
    _registered.append(settings)


def declared() -> tuple[StageSettings, ...]:
    """Every section the loader reads: the built-in stages', then those of the stages a project registered."""
    return BUILT_IN + tuple(_registered)


def registered() -> tuple[StageSettings, ...]:
    return tuple(_registered)


def fingerprint() -> tuple:
    """The registered sections for the spec cache (modelspec/speccache.py): a changed declaration, or an edit of the file
    that makes it, loads the YAML again (their defaults and checks are in the loaded spec)."""
    found = []
    for settings in _registered:
        files = []
        for made_by in (settings.fields, settings.check):
            file = getattr(sys.modules.get(getattr(made_by, "__module__", "")), "__file__", None)
            if file:
                stat = os.stat(file)
                files.append((file, stat.st_mtime_ns, stat.st_size))
        found.append((settings.section, settings.key, repr(sorted(settings.defaults.items())), tuple(files)))
    return tuple(found)
