"""Whether a record still speaks for today's spec: what it was made from against what the plan says now.

A record carries `made_from` (run/funnel.py writes it from the task's plan): the key, the labelled settings
the key digests, the stage's code version, the toolchain, and every file it read with its SHA-256 when it ran.
The report and dist compare it with the plan of today's spec, so a verdict is shown or shipped only under the
settings and inputs the spec states now. Stale here means what makes doit run the stage again: its key or one
of its files changed. Planning reads only YAML; this runs only when the report or dist does (input digests
are cached by stat, run/digests.py).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from qnn_tasks.modelspec import specsplit, stagesettings
from qnn_tasks.plan.matrix import build_stage_defs, plans
from qnn_tasks.plan.planner import Planner
from qnn_tasks.plan.stagedef import Plan
from qnn_tasks.plan.targets import ChipTarget, GraphTarget, PipelineTarget, VariantTarget

# "changed since it was <verb>": what the stage did with what it read
VERBS = {"export": "exported", "simplify": "simplified", "lint": "linted", "cpucheck": "checked on CPU",
         "calibrate": "calibrated", "split": "split", "quantize": "quantized", "convert": "converted",
         "modellib": "built", "config": "configured", "context": "compiled", "simulate": "simulated",
         "simverify": "verified", "pipeline": "verified", "loop": "verified", "crosssize": "checked"}
# a graph setting's label in a key -> its model.yaml key under graphs.<graph> (a stage's own section is named in its
# key as its declaration says: modelspec/stagesettings.py)
GRAPH_KEYS = {"io": "inputs/outputs", "precision": "precision", "parts": "split"}
FIRST = 3  # settings named in one reason


def expected(planner: Planner, plan: Plan, target: Any) -> dict[str, Any] | None:
    """What a record of this plan is made from today (its `inputs` as a list of paths: the funnel digests them
    when the stage runs); None for a plan of another planner."""
    made = planner.made_of(plan.key)
    if made is None:
        return None
    code, binding, labels, parts = made
    settings: dict[str, Any] = {}
    for index, part in enumerate(parts):
        label = labels[index] if index < len(labels) else f"part{index + 1}"
        value = _parsed(part)
        if not label and isinstance(value, dict):
            settings.update(value)
        else:
            settings[label or f"part{index + 1}"] = value
    return {"key": plan.key, "code": code, "settings": settings,
            "toolchain": {"id": binding.id, "fingerprint": binding.fingerprint} if binding else None,
            "inputs": sorted(set(plan.file_dep)),
            "where": where(planner, target) if isinstance(target, (GraphTarget, VariantTarget, ChipTarget,
                                                                   PipelineTarget)) else {}}  # not a toolchain's


def where(planner: Planner, target: Any) -> dict[str, Any]:
    """The model.yaml, declared graph, precision and SoC row a target's settings come from (for messages)."""
    found: dict[str, Any] = {}
    if isinstance(target, PipelineTarget):
        found["model"], soc = target.pipeline.model, target.soc
    else:
        graph = target.graph
        soc = target.soc if isinstance(target, ChipTarget) else None
        found["model"] = graph.model
        declared = graph.size.graph if graph.size else graph.split["of"] if specsplit.is_part(graph) else graph.name
        found["graph"] = declared  # model.yaml's name: a size's or a part's settings are its declared graph's
        if isinstance(target, (ChipTarget, VariantTarget)):
            found["precision"] = target.precision
    spec = planner.model_named(found["model"])
    if spec is not None:
        found["file"] = os.path.relpath(spec.file, planner.root) if Path(spec.file).is_absolute() else str(spec.file)
    if soc is not None:
        found["soc"] = soc.where()
    return found


class Expected:
    """Today's `expected` facts of any record the report or dist reads, by stage name and target."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.rows = {row.name: row for row in build_stage_defs(planner)}
        self._graphs = {(gt.graph.model, gt.graph.name): gt for gt in planner.graphs}

    def of(self, stage: str, target: Any) -> dict[str, Any] | None:
        """None when the stage makes no record for the target today (not planned, or a visible skip)."""
        row = self.rows.get(stage)
        if row is None or row.plan is None:
            return None
        if isinstance(target, GraphTarget) and specsplit.is_part(target.graph) and stage != "lint":
            # a part's ONNX, inputs and reference are its whole graph's split record
            row, target = self.rows.get("split"), self._graphs.get((target.graph.model, target.graph.split["of"]))
            if row is None or target is None:
                return None
        plan = row.plan(self.planner, row, target)
        if plan is None or plan.skip:
            return None
        return expected(self.planner, plan, target)


def reason(record: dict[str, Any], facts: dict[str, Any]) -> str | None:
    """Why the record no longer speaks for today's spec and files (None: it does); ends in what to do."""
    verb = VERBS.get(str(record.get("stage")), "built")
    made = record.get("made_from")
    if not isinstance(made, dict) or not isinstance(made.get("inputs"), dict):
        return "made before this version recorded what it was made from (rerun doit)"
    place = facts.get("where") or {}
    if made.get("key") != facts["key"]:
        if made.get("code") != facts["code"]:  # first: new code may label its settings anew, never the user's edit
            return f"the code of stage {record.get('stage')} changed since it was {verb} (another version of " \
                   "qnn-npu-compile) (rerun doit)"
        changed = list(_changed(made.get("settings"), facts["settings"]))
        if changed:
            names = [_named(path, place) for path in changed[:FIRST]]
            more = f" and {len(changed) - FIRST} more" if len(changed) > FIRST else ""
            spec = [n for n in names if not n.startswith("the ")]
            said = ", ".join(names) + more
            return (f"{place['file']}: {said}" if spec and place.get("file") else said) \
                + f" changed since it was {verb} (rerun doit)"
        old, new = made.get("toolchain") or {}, facts.get("toolchain") or {}
        if old != new:
            ids = f" ({old.get('id')} -> {new.get('id')})" if old.get("id") != new.get("id") else ""
            return f"the toolchain changed since it was {verb}{ids} (rerun doit)"
        return f"its settings changed since it was {verb} (rerun doit)"
    read, wanted = made["inputs"], facts["inputs"]
    if set(read) != set(wanted):
        other = sorted(set(read) ^ set(wanted))
        return f"it was {verb} from other files than today's spec names ({', '.join(other[:FIRST])}) (rerun doit)"
    for path in sorted(read):
        now = digest(path)
        if now is None:
            return f"{path} is missing (it was {verb} from it) (rerun doit)"
        if now != read[path]:
            return f"{path} changed since it was {verb} (rerun doit)"
    return None


def digest(path: str) -> str | None:
    """The file's SHA-256 now (None: it is not there)."""
    from qnn_tasks.run.digests import sha256

    try:
        return sha256(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


class SpecFacts:
    """One digest of build tasks' keys and the files they read, gathered as the tasks are planned: what the
    report's verdicts are judged against, so `doit report` alone renders again when a setting or a source
    changed (a doit run plans every task once already; this adds no planning)."""

    def __init__(self) -> None:
        import hashlib

        self._keys = hashlib.md5()
        self._inputs: set[str] = set()
        self.count = 0

    def add(self, stage: str, plan: Plan) -> None:
        if plan.skip:
            return
        self._keys.update(f"{stage}:{plan.name}:{plan.key}\n".encode())
        self._inputs.update(plan.file_dep)
        self.count += 1

    def facts(self) -> tuple[str, list[str]]:
        return self._keys.hexdigest(), sorted(self._inputs)


def spec_facts(planner: Planner) -> tuple[str, list[str]]:
    """SpecFacts of every build task, planned here (when the tasks were not planned in this process)."""
    found = SpecFacts()
    for row, plan in plans(planner):
        found.add(row.name, plan)
    return found.facts()


def _parsed(part: str) -> Any:
    try:
        return json.loads(part)
    except ValueError:
        return part


def _changed(old: Any, new: Any, path: tuple = ()) -> Iterator[tuple]:
    """The paths (tuples of keys and indexes) at which two JSON values differ, leaves first-level deep."""
    if isinstance(old, dict) and isinstance(new, dict):
        for name in sorted(set(old) | set(new), key=str):
            if old.get(name) != new.get(name):
                yield from _changed(old.get(name), new.get(name), path + (name,))
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and path:
        for index, (a, b) in enumerate(zip(old, new)):
            if a != b:
                yield from _changed(a, b, path + (index,))
    elif old != new:
        yield path


def _dotted(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _named(path: tuple, place: dict[str, Any]) -> str:
    """A changed setting as the user wrote it: its model.yaml key, or the SoC row / budget it comes from."""
    if not path:
        return "its settings"
    top, rest = path[0], path[1:]
    if isinstance(top, str) and top.startswith("part") and top[4:].isdigit():  # a key part no label names
        return "the settings its key is made of"
    if top == "soc":
        return place.get("soc") or "the chip's SoC row"
    if top == "budgets":  # (budgets, arch, key): which of the chip's limits lint held the graph to
        setting = {"memory_mb": "the memory limit (memory_mb)", "memory_where": "the memory limit (memory_mb)",
                   "vtcm_mb": "the VTCM (vtcm_mb)"}.get(rest[1] if len(rest) > 1 else "",
                                                    "the context budget (context_mb)")
        return f"{setting} of a chip it is built for"
    if top in ("loop", "loop_feed"):
        return _dotted(("loop",) + (("feed",) if top == "loop_feed" else ()) + rest)
    if top == "pipeline":
        return _dotted(("pipeline",) + rest)
    graph = place.get("graph")
    if top == "io" and rest:  # model.yaml's inputs/outputs are mappings by name: the list index means nothing there
        top, rest = rest[0], ()
    sections = {s.key: s.section for s in stagesettings.declared() if s.key}  # e.g. cpucheck's "tolerance"
    name = _dotted((GRAPH_KEYS.get(top) or sections.get(top, top),) + rest)
    if top == "precision" and not rest:
        name = "precision"
    suffix = f" (for {place['precision']})" if top == "verify" and place.get("precision") not in (None, "fp16") else ""
    return (f"graphs.{graph}.{name}" if graph else name) + suffix
