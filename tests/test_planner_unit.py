"""The planner (plan/: targets, matrix, stage plans, freshness) as pure functions of a spec: each test writes a tiny
model.yaml in tmp_path (empty source and sample files: planning reads YAML, never ONNX) and asks the planner, with no
doit and no build. What a spec edit re-keys across the example project is tests/test_plan_keys.py's."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import plans_of
from tiny_project import only_model

from qnn_tasks.modelspec.load import load_project
from qnn_tasks.plan import freshness, matrix, paths, rows
from qnn_tasks.plan.matrix import build_stage_defs, on_demand_targets, targets_of
from qnn_tasks.plan.ondemandplans import SURVEY
from qnn_tasks.plan.planner import Planner
from qnn_tasks.plan.stagedef import Plan, StageDef, record_path
from qnn_tasks.plan.stageplans import auto_candidates, graph_plan

GRAPH = """\
  {name}:
    inputs: {{{input}: {{shape: [1, 4], dtype: float32}}}}
    outputs: {{{output}: {{shape: [1, 4]}}}}
    samples: {{files: x.npz}}
    socs: [{socs}]
{extra}"""


def graph(name: str = "net", extra: str = "", socs: str = "SM8650", input: str = "x", output: str = "y") -> str:
    return GRAPH.format(name=name, extra=extra, socs=socs, input=input, output=output)


def planner(tmp_path: Path, graphs: str, model: str = "", toolchain: str = "ort-qnn",
            socs_edit: tuple[str, str] | None = None) -> Planner:
    """A project of one model `m` (its graphs and model-level sections as YAML) planned with `toolchain`; `socs_edit`
    replaces a text of the project's socs/socs.yaml."""
    project, folder = only_model(tmp_path / "p", "m")
    if socs_edit:
        project.edit("socs/socs.yaml", *socs_edit)
    for name in ("m.onnx", "x.npz"):
        (folder / name).write_bytes(b"")
    (folder / "model.yaml").write_text("licence: test fixture\nsource: {file: m.onnx}\ngraphs:\n" + graphs + model)
    loaded = load_project(project.root, toolchain)
    assert not loaded.broken, loaded.broken
    return Planner(loaded)


def rekeyed(before: dict[str, Plan], after: dict[str, Plan]) -> set[str]:
    assert set(before) == set(after)
    return {name for name in before if before[name].key != after[name].key}


# ------------------------------------------------------------------ targets

def test_targets_per_graph_precision_and_chip_with_a_visible_skip(tmp_path: Path) -> None:
    p = planner(tmp_path, graph(extra="    precision: [fp16, w8a16]\n", socs="SM8650, SM8350"))
    assert [gt.name for gt in p.graphs] == ["net"]
    assert [vt.name for vt in p.variants] == ["net", "net-w8a16"]  # the first precision is the plain name
    skips = {ct.name: ct.skip_reason for ct in p.chips}
    assert set(skips) == {"net-SM8650", "net-SM8350", "net-w8a16-SM8650", "net-w8a16-SM8350"}
    assert "fp16" in skips.pop("net-SM8350")  # v68 runs no fp16 graph: planned, and skipped visibly
    assert set(skips.values()) == {None}
    planned = plans_of(p)
    assert planned["simverify:net-SM8350"].skip and planned["context:net-SM8350"].skip
    assert planned["simverify:net-w8a16-SM8350"].skip is None


def test_quantized_precisions_add_calibrate_and_quantize_only_where_they_are_needed(tmp_path: Path) -> None:
    fp16 = plans_of(planner(tmp_path / "a", graph()))
    assert not [name for name in fp16 if name.startswith(("calibrate:", "quantize:"))]
    mixed = planner(tmp_path / "b", graph(extra="    precision: [fp16, w8a16]\n"))
    planned = plans_of(mixed)
    assert {n for n in planned if n.startswith(("calibrate:", "quantize:"))} == {"calibrate:net", "quantize:net-w8a16"}
    names = [row.name for row in build_stage_defs(mixed)]
    assert names.index("calibrate") < names.index("quantize") < names.index("config")  # build order
    assert str(mixed.graphs[0].calibration) in planned["quantize:net-w8a16"].file_dep


def test_a_split_graph_is_cut_once_and_its_parts_compile_on_their_own(tmp_path: Path) -> None:
    p = planner(tmp_path, graph(extra="    split: {parts: 2}\n"))
    planned = plans_of(p)
    assert [gt.name for gt in p.graphs] == ["net", "net.part1", "net.part2"]
    assert {"split:net", "lint:net.part1", "lint:net.part2", "context:net.part1-SM8650",
            "context:net.part2-SM8650", "pipeline:net-SM8650"} <= set(planned)
    assert not {"export:net.part1", "simplify:net.part1", "cpucheck:net.part1", "context:net-SM8650"} & set(planned)
    part = p.graphs[1]
    split = planned["split:net"]
    assert str(part.simplified) in split.outputs and str(part.reference) in split.outputs
    # a part's export/cpucheck facts are its whole graph's split record, for every reader
    assert record_path("cpucheck", part) == record_path("export", part) == split.record


def test_a_pipeline_chains_its_graphs_binaries_on_each_chip(tmp_path: Path) -> None:
    graphs = graph("a") + graph("b", input="y", output="z")
    p = planner(tmp_path, graphs, "pipeline:\n  graphs: [a, b]\n")
    assert [pt.name for pt in p.pipelines] == ["m-SM8650"]
    plan = plans_of(p)["pipeline:m-SM8650"]
    for ct in p.pipelines[0].chips:
        assert set(p.context_files(ct)) <= set(plan.file_dep) and p.config_files(ct)[0] in plan.file_dep
    assert plan.outputs == [f"{p.pipelines[0].stage_dir('pipeline')}/outputs.npz"]
    assert plan.record == rows.PIPELINE.record_of(p.pipelines[0])


def test_a_loop_runs_on_its_graphs_chip_targets_only(tmp_path: Path) -> None:
    graphs = graph("acc") + graph("other")
    p = planner(tmp_path, graphs.replace("outputs: {y:", "outputs: {accN:", 1).replace(
        "inputs: {x: {shape: [1, 4], dtype: float32}}", "inputs: {x: {shape: [1, 4], dtype: float32}, "
        "acc: {shape: [1, 4], dtype: float32}}", 1), "loop:\n  graph: acc\n  feed: {acc: accN}\n")
    planned = plans_of(p)
    assert [n for n in planned if n.startswith("loop:")] == ["loop:acc-SM8650"]
    assert [ct.name for ct in matrix.loop_chips(p)] == ["acc-SM8650"]
    out = f"{p.chips[0].dir_str}/loop"
    assert planned["loop:acc-SM8650"].outputs == [f"{out}/outputs.npz", f"{out}/reference.npz",
                                                   f"{out}/per_step_error.png"]


def test_sizes_make_a_graph_each_and_one_crosssize_check_on_the_largest(tmp_path: Path) -> None:
    sized = ("  net:\n    dims: {seq: [8, 16]}\n    inputs: {x: {shape: [1, seq], dtype: float32}}\n"
             "    outputs: {y: {shape: [1, seq]}}\n    samples: {files: x.npz}\n    socs: [SM8650]\n")
    p = planner(tmp_path, sized)
    assert [gt.name for gt in p.graphs] == ["net.seq8", "net.seq16"]
    planned = plans_of(p)
    assert [n for n in planned if n.startswith("crosssize:")] == ["crosssize:net.seq16-SM8650"]
    check = planned["crosssize:net.seq16-SM8650"]
    assert check.task_dep == ["simulate:net.seq8-SM8650"]
    assert {f"{ct.dir_str}/simulate/outputs.npz" for ct in p.chips} <= set(check.file_dep)


def test_precision_auto_builds_every_candidate_and_chooses_on_the_first(tmp_path: Path) -> None:
    p = planner(tmp_path, graph(extra="    precision: {auto: [w8a16, fp16]}\n", socs="SM8650, SM8350"))
    planned = plans_of(p)
    assert {n for n in planned if n.startswith("choose:")} == {"choose:net-SM8650", "choose:net-SM8350"}
    first = next(ct for ct in p.chips if ct.soc.name == "SM8650" and ct.precision == "w8a16")
    assert [c.precision for c in auto_candidates(p, first)] == ["w8a16", "fp16"]  # the model's order
    both = planned["choose:net-SM8650"]
    assert both.task_dep == [f"simverify:{c.name}" for c in auto_candidates(p, first)] and both.skip is None
    assert both.record == rows.CHOOSE.record_of(first)
    # no fp16 on v68: the fp16 candidate is skipped there, the choice waits on w8a16 alone
    v68 = planned["choose:net-SM8350"]
    assert v68.task_dep == ["simverify:net-w8a16-SM8350"] and v68.skip is None


def test_a_registered_row_runs_after_the_built_in_rows_of_its_scope(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows, "_REGISTERED", [])
    p = planner(tmp_path, graph())

    def plan_opcount(planner: Planner, stage: StageDef, gt) -> Plan:
        return graph_plan(planner, stage, gt, [str(gt.simplified)], [], {"limit": 3}, lambda: {}, "count ops")

    rows.register(StageDef("opcount", "graph", "count ops", "qnn_tasks.stages.lint:run_call", plan_opcount))
    names = [row.name for row in build_stage_defs(p)]
    assert names.index("lint") < names.index("opcount") < names.index("config")
    assert "opcount" in rows.report_columns("graph")
    plan = plans_of(p)["opcount:net"]
    assert plan.file_dep == [str(p.graphs[0].simplified)] and plan.record == record_path("opcount", p.graphs[0])
    with pytest.raises(ValueError, match="exists already"):
        rows.register(StageDef("lint", "graph", "", "mine:run_call", plan_opcount))
    with pytest.raises(ValueError, match="cannot be registered"):
        rows.register(StageDef("whole", "project", "", "mine:run_call", plan_opcount))


# ------------------------------------------------------------------ plans: files, records, keys

def test_each_stage_reads_what_the_stage_before_it_wrote(tmp_path: Path) -> None:
    p = planner(tmp_path, graph(extra="    precision: [fp16, w8a16]\n"))
    planned = plans_of(p)
    gt, ct = p.graphs[0], next(ct for ct in p.chips if ct.precision == "fp16")
    assert planned["export:net"].outputs == [str(gt.exported)]
    assert planned["simplify:net"].file_dep == [str(gt.exported)]
    assert planned["simplify:net"].outputs == [str(gt.simplified)]
    assert planned["cpucheck:net"].outputs == [str(gt.inputs), str(gt.reference)]
    assert planned["config:net-SM8650"].outputs == p.config_files(ct)
    assert planned["context:net-SM8650"].outputs == p.context_files(ct)
    assert set(p.context_files(ct)) <= set(planned["simulate:net-SM8650"].file_dep)
    assert f"{ct.dir_str}/simulate/outputs.npz" in planned["simverify:net-SM8650"].file_dep


def test_every_plan_keeps_its_record_where_its_row_says(tmp_path: Path) -> None:
    p = planner(tmp_path, graph(extra="    precision: {auto: [w8a16, fp16]}\n") + graph("big", extra="    split: {parts: 2}\n"))
    seen = 0
    for row in build_stage_defs(p):
        for target in targets_of(p, row):
            plan = row.plan(p, row, target)
            if plan is not None:
                assert plan.record == row.record_of(target), (row.name, plan.name)
                assert plan.record.endswith(f"/{row.name}/{row.name}.json"), (row.name, plan.name)
                seen += 1
    assert seen > 20


def test_a_key_changes_with_what_its_stage_reads_and_nothing_else(tmp_path: Path) -> None:
    base = plans_of(planner(tmp_path / "a", graph(extra="    precision: [fp16, w8a16]\n")))
    same = plans_of(planner(tmp_path / "b", graph(extra="    precision: [fp16, w8a16]\n")))
    assert rekeyed(base, same) == set()  # the project's folder is in no key: a clone shares the cache
    verify = "    verify: {thresholds: {min_cosine: 0.95}}\n"
    judged = plans_of(planner(tmp_path / "c", graph(extra="    precision: [fp16, w8a16]\n" + verify)))
    assert rekeyed(base, judged) == {"simverify:net-SM8650", "simverify:net-w8a16-SM8650"}
    cal = "    calibration: {samples: 12}\n"
    calibrated = plans_of(planner(tmp_path / "d", graph(extra="    precision: [fp16, w8a16]\n" + cal)))
    assert rekeyed(base, calibrated) == {"calibrate:net", "quantize:net-w8a16"}


def test_a_key_is_the_digest_of_its_row_toolchain_and_labelled_parts(tmp_path: Path) -> None:
    p = planner(tmp_path, graph())
    binding = p.bindings[0]
    chip_row, graph_row = rows.CHIP_STAGES[1], rows.GRAPH_STAGES[0]  # context (a toolchain stage), export
    key = p.key(chip_row, binding, "a", "b", labels=("one", "two"))
    assert key == p.key(chip_row, binding, "a", "b") and key != p.key(chip_row, binding, "a", "c")
    assert p.made_of(key)[1] is binding and p.made_of(key)[3] == ("a", "b")
    assert p.key(graph_row, binding, "a") == p.key(graph_row, None, "a")  # no toolchain in a graph stage's key
    assert p.made_of("not a key of this planner") is None


# ------------------------------------------------------------------ freshness

def test_freshness_names_the_setting_or_file_that_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = planner(tmp_path, graph())
    monkeypatch.chdir(p.root)  # records name project-relative files
    row = rows.GRAPH_STAGES[1]  # simplify: reads the exported ONNX
    gt = p.graphs[0]
    plan = row.plan(p, row, gt)
    facts = freshness.expected(p, plan, gt)
    assert facts["inputs"] == [str(gt.exported)] and facts["where"]["graph"] == "net"
    assert freshness.reason({"stage": "simplify"}, facts).startswith("made before this version recorded")
    gt.exported.parent.mkdir(parents=True)
    gt.exported.write_bytes(b"onnx")
    made = {**facts, "inputs": {str(gt.exported): freshness.digest(str(gt.exported))}}
    assert freshness.reason({"stage": "simplify", "made_from": made}, facts) is None
    gt.exported.write_bytes(b"other onnx")
    assert f"{gt.exported} changed since" in freshness.reason({"stage": "simplify", "made_from": made}, facts)
    gt.exported.unlink()
    assert f"{gt.exported} is missing" in freshness.reason({"stage": "simplify", "made_from": made}, facts)
    edited = {**made, "key": "old", "settings": {**facts["settings"], "simplify": {"skip": True}}}
    said = freshness.reason({"stage": "simplify", "made_from": edited}, facts)
    assert said.startswith("models/m/model.yaml: ") and "simplify" in said and said.endswith("(rerun doit)")
    assert "code of stage simplify changed" in freshness.reason(
        {"stage": "simplify", "made_from": {**edited, "code": "older"}}, facts)


def test_freshness_expects_nothing_of_a_skipped_or_unplanned_target(tmp_path: Path) -> None:
    p = planner(tmp_path, graph(socs="SM8650, SM8350"))
    expect = freshness.Expected(p)
    v68, v75 = (next(ct for ct in p.chips if ct.soc.name == soc) for soc in ("SM8350", "SM8650"))
    assert expect.of("simverify", v68) is None  # a visible skip: no record to judge
    assert expect.of("simverify", v75)["key"] == plans_of(p)["simverify:net-SM8650"].key
    assert expect.of("calibrate", p.graphs[0]) is None  # an fp16 graph has no calibrate row
    other = Plan(name="x", out_dir="x", file_dep=[], outputs=[], key="a key of another planner", doc="",
                 args=dict, base=dict)
    assert freshness.expected(p, other, v75) is None


# ------------------------------------------------------------------ on-demand rows

def test_on_demand_rows_plan_like_any_stage(tmp_path: Path) -> None:
    p = planner(tmp_path, graph(socs="SM8650, SM8350"), toolchain="ort-qnn,ort-qnn-2.47")
    first, second = p.bindings
    by_name = {row.name: row for row in rows.ON_DEMAND}
    socscheck = [by_name["socscheck"].plan(p, by_name["socscheck"], b) for b in on_demand_targets(p, by_name["socscheck"])]
    assert [(s.name, s.record) for s in socscheck] == [
        (first.profile.name, "build/socscheck.json"), (second.profile.name, "build/socscheck-ort-qnn-2.47.json")]
    assert socscheck[0].key != socscheck[1].key  # each toolchain's fingerprint is in its key
    compat = by_name["compat"]
    [whole] = [compat.plan(p, compat, t) for t in on_demand_targets(p, compat)]
    assert whole.name == "" and whole.record == paths.COMPAT_RECORD  # one task, named by the group
    verify = by_name["verify"]
    targets = on_demand_targets(p, verify)
    assert targets[0] == SURVEY and targets[1:] == p.chips
    survey = verify.plan(p, verify, SURVEY)
    assert survey.name == "devices" and survey.record == paths.DEVICES_RECORD
    skipped = {plan.name: plan.skip for plan in (verify.plan(p, verify, ct) for ct in p.chips)}
    assert skipped["net-SM8350"] and skipped["net-SM8650"] is None
    assert verify.plan(p, verify, p.chips[0]).record == record_path("verify", p.chips[0])
    assert [m.name for m in on_demand_targets(p, by_name["dist"])] == ["m"]
    assert by_name["dist"].plan(p, by_name["dist"], p.project.models[0]).record == ""  # the package is its record


def test_a_soc_table_edit_rekeys_socscheck_not_toolcheck(tmp_path: Path) -> None:
    by_name = {row.name: row for row in rows.ON_DEMAND}

    def keys(p: Planner) -> dict[str, str]:
        return {name: by_name[name].plan(p, by_name[name], p.bindings[0]).key for name in ("socscheck", "toolcheck")}

    before = keys(planner(tmp_path / "a", graph()))
    after = keys(planner(tmp_path / "b", graph(), socs_edit=("SM8650:  {soc_id: 57, dsp_arch: v75, vtcm_mb: 8",
                                                             "SM8650:  {soc_id: 57, dsp_arch: v75, vtcm_mb: 4")))
    assert after["socscheck"] != before["socscheck"] and after["toolcheck"] == before["toolcheck"]
