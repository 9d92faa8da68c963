"""The plan as pure functions of the spec, tested in seconds without a build: which keys a spec edit changes (a
change reruns exactly what it touches), and that the graph of files the plans read and write is closed (every file
a stage reads is one a stage of the same run writes, or one of the project's own)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from conftest import copy_project, plans_of

from qnn_tasks.modelspec.load import load_project
from qnn_tasks.plan.matrix import build_stage_defs, targets_of
from qnn_tasks.plan.planner import Planner

VAD_YAML = "models/silero-vad/model.yaml"
MINILM_YAML = "models/minilm/model.yaml"
SOCS_YAML = "socs/socs.yaml"


def _plans(root: Path) -> dict[str, Any]:
    project = load_project(root)
    assert not project.broken, project.broken  # an edit that breaks a model would drop its targets, not rekey them
    return plans_of(Planner(project))


def _edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert old in text, f"{rel} no longer holds {old!r}: update the test's edit"
    path.write_text(text.replace(old, new, 1))


def _stages(names: set[str]) -> set[str]:
    """`simverify:vad-SM8650` -> `simverify:vad-*` style: stage and graph, the chip left out."""
    return {name.split("-SM")[0].split("-QCS")[0].split("-SA")[0] for name in names}


# Each edit: the file, the text replaced and its replacement, and the (stage:graph) plans whose key must change.
# Keys hold a stage's own settings only; a change upstream reaches downstream stages through their file_dep
# (doit compares the files' content), so exactly the stage that reads a setting is rerun by it.
EDITS: dict[str, tuple[str, str, str, set[str]]] = {
    "a verify threshold re-judges only": (
        VAD_YAML, "min_cosine: 0.999", "min_cosine: 0.998", {"simverify:vad"}),
    "a rewrite re-exports only": (
        VAD_YAML, "rewrites: [fold-if, pow-square]", "rewrites: [fold-if]", {"export:vad"}),
    "a cpucheck tolerance reruns the CPU check only": (
        MINILM_YAML, "cpucheck: {max_abs: 1.0e-4}", "cpucheck: {max_abs: 2.0e-4}", {"cpucheck:minilm"}),
    "calibration size re-calibrates and re-quantizes": (
        MINILM_YAML, "calibration: {samples: 8}", "calibration: {samples: 12}",
        {"calibrate:minilm", "quantize:minilm-w8a16"}),
    "the number of verified samples re-simulates and re-judges": (
        VAD_YAML, "verify:\n", "verify:\n      samples: 5\n",
        {"simulate:vad", "simverify:vad"}),
    "a comment changes nothing": (
        VAD_YAML, "# Silero VAD", "# The Silero VAD", set()),
    "a description changes nothing": (
        MINILM_YAML, "description: sentence-transformers", "description: the sentence-transformers", set()),
}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = copy_project(tmp_path_factory.mktemp("base") / "p").root
    return root, {name: plan.key for name, plan in _plans(root).items()}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_a_spec_edit_changes_exactly_the_keys_of_the_stages_that_read_it(case: str, baseline, tmp_path: Path) -> None:
    rel, old, new, expected = EDITS[case]
    root = copy_project(tmp_path / "p").root
    _edit(root, rel, old, new)
    after = {name: plan.key for name, plan in _plans(root).items()}
    assert set(after) == set(baseline[1]), "an edit of settings must not add or remove targets"
    changed = {name for name in after if after[name] != baseline[1][name]}
    assert _stages(changed) == expected


def test_a_soc_row_edit_changes_only_that_chips_stages(baseline, tmp_path: Path) -> None:
    root = copy_project(tmp_path / "p").root
    _edit(root, SOCS_YAML, "SM8650:  {soc_id: 57, dsp_arch: v75, vtcm_mb: 8",
          "SM8650:  {soc_id: 57, dsp_arch: v75, vtcm_mb: 4")
    after = {name: plan.key for name, plan in _plans(root).items()}
    changed = {name for name in after if after[name] != baseline[1][name]}
    assert changed and all(name.endswith("-SM8650") for name in changed)
    # the judgement reads no SoC field: a smaller VTCM rebuilds the binary, whose new content re-judges it
    assert {name.split(":")[0] for name in changed} == {"config", "context", "simulate"}


def test_adding_a_chip_adds_its_targets_and_changes_no_other_key(baseline, tmp_path: Path) -> None:
    root = copy_project(tmp_path / "p").root
    _edit(root, SOCS_YAML, "  SM8650:", "  SM8635:  {soc_id: 68, dsp_arch: v73, vtcm_mb: 8, fp16: true}\n  SM8650:")
    after = {name: plan.key for name, plan in _plans(root).items()}
    added = set(after) - set(baseline[1])
    # VAD builds for every row of the table; MiniLM names its chips, so the new row is none of its business
    assert added == {f"{stage}:vad-SM8635" for stage in ("config", "context", "simulate", "simverify")}
    assert all(after[name] == key for name, key in baseline[1].items())


def test_every_file_a_stage_reads_is_written_by_a_stage_or_is_the_projects_own(baseline) -> None:
    root, _ = baseline
    plans = _plans(root)
    written = {out: name for name, plan in plans.items() for out in plan.outputs}
    written |= {plan.record: name for name, plan in plans.items()}
    for name, plan in plans.items():
        for dep in plan.file_dep:
            if dep.startswith("build/"):
                assert dep in written, f"{name} reads {dep}, which no stage of the run writes"
            else:
                assert (root / dep).is_file(), f"{name} reads {dep}, which is not in the project"


def test_no_two_stages_write_one_file(baseline) -> None:
    seen: dict[str, str] = {}
    for name, plan in _plans(baseline[0]).items():
        for out in plan.outputs + [plan.record]:
            assert out not in seen, f"{out} is written by both {seen[out]} and {name}"
            seen[out] = name


def test_a_stage_reads_only_what_stages_before_it_write(baseline) -> None:
    """The plans in build order: a file read is written by a stage earlier in the order (doit needs no cycle)."""
    root, _ = baseline
    planner = Planner(load_project(root))
    order: dict[str, int] = {}
    reads: list[tuple[str, int, list[str]]] = []
    for index, row in enumerate(build_stage_defs(planner)):
        for target in targets_of(planner, row):
            plan = row.plan(planner, row, target)
            if plan is None:
                continue
            for out in plan.outputs:
                order[out] = index
            reads.append((f"{row.name}:{plan.name}", index, plan.file_dep))
    for name, index, deps in reads:
        late = [d for d in deps if order.get(d, -1) >= index]
        assert not late, f"{name} reads {late}, written by a stage at or after its own row"


def _keys(root: Path, change: Callable[[Path], None] | None = None) -> dict[str, str]:
    if change:
        change(root)
    return {name: plan.key for name, plan in _plans(root).items()}


def test_planning_twice_gives_the_same_keys(baseline) -> None:
    """Keys are a function of the spec alone: nothing of the moment (time, order of a directory) enters them."""
    root, keys = baseline
    assert _keys(root) == keys
