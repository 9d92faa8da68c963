"""A verdict is only as current as its spec: after the source ONNX is edited, a threshold raised or a pipeline's
declaration changed, `doit report` and `doit dist` (without a rebuild) say `stale` with the reason, ship nothing
for it and never name the edited file's digest; `doit` then rebuilds or re-judges and everything is current again.
Real doit runs on the tiny packaged-ONNX project (seconds) and on the two-graph chain of test_pipeline."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import Project, copy_project
from onnx import TensorProto, helper, numpy_helper
from test_pipeline import CLASSES, YAML, chain_project
from tiny_project import tiny_project

from qnn_tasks.plan import freshness

TINY_YAML = "models/tiny/model.yaml"
TINY_ONNX = "models/tiny/tiny.onnx"


def report(project: Project) -> dict:
    return json.loads(project.path("build/report/report.json").read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def edit_weights(path: Path, factor: float) -> None:
    """Another model in the same file: the first weight scaled (a real edit of the source ONNX)."""
    model = onnx.load(str(path))
    weight = model.graph.initializer[0]
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(factor), weight.name))
    onnx.save(model, str(path))


@pytest.fixture(scope="module")
def tiny_built(tmp_path_factory) -> Project:
    project = tiny_project(tmp_path_factory.mktemp("stale-tiny") / "project")
    project.doit(check=True)
    return project


@pytest.fixture
def tiny(tiny_built, tmp_path) -> Project:
    return copy_project(tmp_path / "project", source=tiny_built.root, with_build=True)


def test_an_edited_source_makes_report_and_dist_stale_until_doit_rebuilds(tiny, tmp_path):
    dest = tmp_path / "dist"
    old_source = sha256(tiny.path(TINY_ONNX))
    edit_weights(tiny.path(TINY_ONNX), 1.5)
    new_source = sha256(tiny.path(TINY_ONNX))
    reason = "models/tiny/tiny.onnx changed since it was exported (rerun doit)"

    alone = tiny.doit("report")
    assert alone.returncode == 1 and "report" in alone.executed, alone.stdout + alone.stderr
    assert "report: 1 target(s) stale" in alone.stdout and "Traceback" not in alone.stdout + alone.stderr
    data = report(tiny)
    (target,) = data["targets"]
    assert target["status"] == "stale" and reason in target["reason"], target["reason"]
    assert data["summary"]["stale"] == 1 and data["summary"]["passed"] == 0 and not data["summary"]["complete"]
    export = data["graphs"][0]["stages"]["export"]
    assert export["status"] == "stale" and export["stale"] == [reason]

    shipped = tiny.doit("dist", env={"QNN_DIST": str(dest)})
    line = shipped.failure_line("dist:tiny")
    assert "nothing verified to ship for tiny" in line and f"tiny-SM8650: stale: graph stage export: {reason}" in line
    assert not (dest / "tiny").exists()  # nothing shipped: no manifest names the edited file

    rebuilt = tiny.doit()
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    assert {"export:tiny", "simverify:tiny-SM8650", "report"} <= rebuilt.executed
    assert report(tiny)["targets"][0]["status"] == "passed" and report(tiny)["summary"]["stale"] == 0
    assert tiny.doit("report").executed == set()  # current again: nothing to re-render
    shipped = tiny.doit("dist", env={"QNN_DIST": str(dest)})
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    manifest = json.loads((dest / "tiny" / "manifest.json").read_text())
    export = tiny.one_json("build/tiny/tiny/export/export.json")
    assert export["made_from"]["inputs"][TINY_ONNX] == new_source != old_source
    assert manifest["source"]["file_sha256"] == new_source  # what the export read: the rebuilt binary's source


def test_the_manifest_names_the_source_the_export_read_never_a_fresh_hash(tiny, tmp_path):
    """dist reads the source's digest from the export record: the file's bytes today are not the model shipped."""
    from qnn_tasks.ship import package

    export = tiny.one_json("build/tiny/tiny/export/export.json")
    read = export["made_from"]["inputs"][TINY_ONNX]
    assert read == sha256(tiny.path(TINY_ONNX))
    edit_weights(tiny.path(TINY_ONNX), 2.0)
    assert package.source_read(export, TINY_ONNX) == read != sha256(tiny.path(TINY_ONNX))
    assert package.source_read({"source": {"file": "tiny.onnx"}}, TINY_ONNX) is None  # a record of before: unknown


def test_a_raised_threshold_is_stale_naming_the_key_until_doit_judges_again(tiny, tmp_path):
    dest = tmp_path / "dist"
    tiny.edit(TINY_YAML, "    socs: [SM8650]\n", "    socs: [SM8650]\n    verify: {thresholds: {min_snr_db: 300}}\n")
    reason = ("models/tiny/model.yaml: graphs.tiny.verify.thresholds.min_snr_db changed since it was verified "
              "(rerun doit)")

    alone = tiny.doit("report")
    assert alone.returncode == 1 and "report: 1 target(s) stale" in alone.stdout, alone.stdout + alone.stderr
    (target,) = report(tiny)["targets"]
    assert target["status"] == "stale" and target["stages"]["simverify"]["stale"] == [reason]
    assert all(r["status"] == "passed" for r in report(tiny)["graphs"][0]["stages"].values())  # only the verdict
    line = tiny.doit("dist", env={"QNN_DIST": str(dest)}).failure_line("dist:tiny")
    assert f"tiny-SM8650: stale: simverify: {reason}" in line and not (dest / "tiny").exists()

    judged = tiny.doit()
    assert judged.returncode == 1 and "simverify:tiny-SM8650" in judged.executed
    assert "context:tiny-SM8650" not in judged.executed  # the binary is current: only the judgement was stale
    (target,) = report(tiny)["targets"]
    assert target["status"] == "failed" and "below the threshold 300" in target["reason"]  # judged under today's

    tiny.edit(TINY_YAML, "    verify: {thresholds: {min_snr_db: 300}}\n", "")
    again = tiny.doit()
    assert again.returncode == 0 and report(tiny)["targets"][0]["status"] == "passed", again.stdout + again.stderr


def test_a_record_made_before_records_said_what_they_were_made_from_is_stale(tiny, monkeypatch):
    """A record without `made_from` (an older version wrote it) cannot be compared with today's spec: stale, and
    its key (which names the record format) differs from today's, so doit builds it once."""
    monkeypatch.chdir(tiny.root)  # records name project-relative paths
    path = next(tiny.root.glob("build/tiny/tiny/*/fp16/SM8650/simverify/simverify.json"))
    record = json.loads(path.read_text())
    facts = record.pop("made_from")
    assert freshness.reason(record, facts) == "made before this version recorded what it was made from (rerun doit)"
    assert freshness.reason({**record, "made_from": facts}, facts) is None


def test_reasons_name_the_setting_the_code_or_the_toolchain(tiny, monkeypatch):
    monkeypatch.chdir(tiny.root)
    path = next(tiny.root.glob("build/tiny/tiny/*/fp16/SM8650/simulate/simulate.json"))
    record = json.loads(path.read_text())
    facts = json.loads(json.dumps(record["made_from"]))
    facts["inputs"] = sorted(facts["inputs"])
    assert freshness.reason(record, facts) is None
    soc = {**facts, "key": "other", "settings": {**facts["settings"], "soc": {"soc_id": 1}}}
    assert freshness.reason(record, soc).startswith("the SM8650 row of ")
    samples = {**facts, "key": "other", "settings": {**facts["settings"], "verify": {"samples": 3}}}
    assert freshness.reason(record, samples) == ("models/tiny/model.yaml: graphs.tiny.verify.samples changed since "
                                                 "it was simulated (rerun doit)")
    code = {**facts, "key": "other", "code": "0" * 16}
    assert "the code of stage simulate changed since it was simulated" in freshness.reason(record, code)
    chain = {**facts, "key": "other", "toolchain": {"id": "ort-qnn-9", "fingerprint": {}}}
    assert freshness.reason(record, chain).startswith("the toolchain changed since it was simulated (")
    cpucheck = tiny.one_json("build/tiny/tiny/cpucheck/cpucheck.json")
    facts = json.loads(json.dumps(cpucheck["made_from"]))
    facts["settings"]["io"]["inputs"][0]["shape"][1] = 64
    facts["settings"]["tolerance"] = {"max_abs": 0.5}
    assert freshness.reason(cpucheck, {**facts, "key": "other"}) == (
        "models/tiny/model.yaml: graphs.tiny.inputs, graphs.tiny.cpucheck.max_abs changed since it was checked on "
        "CPU (rerun doit)")


def scores_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["logits"], ["scores"])], "scores",
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, CLASSES])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.slow
def test_a_pipeline_declared_anew_is_stale_and_its_new_graph_not_built(tmp_path):
    project = chain_project(tmp_path / "project", "[centred-variance]")
    built = project.doit()
    assert built.returncode == 0, built.stdout + built.stderr
    folder = project.path("models/chain")
    onnx.save(scores_model(), str(folder / "scores.onnx"))
    np.savez(folder / "samples/scores.npz",
             logits=np.random.default_rng(5).standard_normal((8, 1, CLASSES)).astype(np.float32))
    project.edit(YAML, "pipeline:\n  graphs: [features, classifier]",
                 f"  scores:\n    source: {{file: scores.onnx}}\n"
                 f"    inputs: {{logits: {{shape: [1, {CLASSES}], dtype: float32}}}}\n"
                 f"    outputs: {{scores: {{shape: [1, {CLASSES}]}}}}\n"
                 "    samples: {files: samples/scores.npz}\n    socs: [SM8650]\n"
                 "pipeline:\n  graphs: [features, classifier, scores]")
    project.edit(YAML, "top1: {output: logits", "top1: {output: scores")

    alone = project.doit("report")
    assert alone.returncode == 1, alone.stdout + alone.stderr
    data = report(project)
    (chain,) = data["pipelines"]
    assert chain["graphs"] == ["features", "classifier", "scores"]
    assert chain["status"] == "stale" and chain["record"]["graphs"] == ["features", "classifier"]
    assert chain["reason"].startswith("stale: models/chain/model.yaml: pipeline.graphs") and "(rerun doit)" in \
        chain["reason"], chain["reason"]
    statuses = {t["graph"]: t["status"] for t in data["targets"]}
    assert statuses == {"features": "passed", "classifier": "passed", "scores": "pending"}, statuses  # not built

    rebuilt = project.doit()
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    (chain,) = report(project)["pipelines"]
    assert chain["status"] == "passed" and chain["record"]["graphs"] == ["features", "classifier", "scores"]
