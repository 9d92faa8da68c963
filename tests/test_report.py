"""The report: report.json against the documented schema, report.md, index.html, a real browser.

Uses the build conftest's `verified` makes once (both example graphs simulated on
SM8650 and SM8750, then `doit report`); tests that change something work on copies of it.
"""
from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
from conftest import Project, copy_project
from markupsafe import escape
from test_simverify import GRAPHS, MINILM_YAML, SOCS, VAD_YAML

from qnn_tasks.judge import metrics
from qnn_tasks.modelspec.load import load_socs
from qnn_tasks.report import gather as report_module
from qnn_tasks.report import render as render_module

REPORT_DIR = Path("build/report")
CHROMIUM = Path("/usr/bin/chromium")
STATUSES = ["passed", "warning", "failed", "stale", "skipped", "pending", "rejected"]
# what a stage writes ("pending" = no record), or "stale": the report found its outputs changed since
RECORD_STATUSES = ["passed", "warning", "failed", "skipped", "stale", "rejected"]
GRAPH_STAGES = ["export", "simplify", "lint", "cpucheck"]
CHIP_STAGES = ["config", "context", "simulate", "simverify"]
PNG = b"\x89PNG\r\n\x1a\n"


def load_report(project: Project) -> dict:
    return json.loads((project.root / REPORT_DIR / "report.json").read_text())


# ------------------------------------------------------------------ a small JSON-schema-like validator

def _is(value, kind: str) -> bool:
    return {"object": isinstance(value, dict), "array": isinstance(value, list), "string": isinstance(value, str),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "boolean": isinstance(value, bool), "null": value is None}[kind]


def validate(value, schema: dict, where: str = "$") -> list[str]:
    """Errors of `value` against a subset of JSON Schema: type, const, enum, required, properties,
    additionalProperties (False), items, minimum. An empty list means valid."""
    kinds = schema.get("type")
    if kinds:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, k) for k in kinds):
            return [f"{where}: expected {'/'.join(kinds)}, got {type(value).__name__} {value!r:.60}"]
    errors = []
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: expected {schema['const']!r}, got {value!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        errors.append(f"{where}: {value} < {schema['minimum']}")
    if isinstance(value, dict):
        errors += [f"{where}: missing key '{k}'" for k in schema.get("required", []) if k not in value]
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            errors += [f"{where}: unexpected key '{k}'" for k in value if k not in props]
        for key, sub in props.items():
            if key in value:
                errors += validate(value[key], sub, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], f"{where}[{i}]")
    return errors


STRING_OR_NULL = {"type": ["string", "null"]}
STAGE_RECORD = {"type": ["object", "null"], "required": ["stage", "target", "status"],
                "properties": {"stage": {"type": "string"}, "target": {"type": "string"},
                               "status": {"enum": RECORD_STATUSES}, "seconds": {"type": "number", "minimum": 0},
                               "error": {"type": "string"}}}
REPORT_SCHEMA = {  # docs/verification-and-report.md
    "type": "object", "additionalProperties": False,
    "required": ["schema", "generated", "summary", "toolchains", "graphs", "splits", "variants", "targets",
                 "pipelines", "loops", "sizes", "models_not_buildable", "choices", "precision_comparison", "comparison",
                 "compatibility"],
    "properties": {
        "schema": {"const": "qnn-npu-compile/report/v1"},
        "toolchains": {"type": "array", "items": {"type": "object", "required": ["profile", "id", "suffix", "qnn",
                                                                                 "upgrade"]}},
        "comparison": {"type": "array", "items": {"type": "object", "required": ["baseline", "candidate", "qnn", "gate",
                                                                                 "margins", "rows", "regressions"]}},
        "compatibility": {"type": ["object", "null"]},
        "splits": {"type": "object"},
        "variants": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                                                "required": ["name", "model", "graph", "precision", "toolchain_id"],
                                                "properties": {k: {"type": "string"} for k in
                                                               ("name", "model", "graph", "precision", "toolchain_id")}}},
        "precision_comparison": {"type": "array", "items": {
            "type": "object", "required": ["graph", "soc", "precision", "status", "bin_size", "sim_median_s",
                                           "min_cosine", "checks_passed"]}},
        "generated": {"type": "string"},
        "summary": {"type": "object", "additionalProperties": False,
                    "required": ["targets", *STATUSES, "graphs_failed", "from_cache", "pipelines_failed", "complete",
                                 "current", "superseded_by", "models_not_buildable", "loops_failed",
                                 "crosssize_failed", "choices_failed", "upgrade_regressions", "ok"],
                    "properties": {**{k: {"type": "integer", "minimum": 0}
                                      for k in ["targets", *STATUSES, "graphs_failed", "from_cache", "pipelines_failed",
                                                "models_not_buildable", "loops_failed", "crosssize_failed",
                                                "choices_failed", "upgrade_regressions"]},
                                   "complete": {"type": "boolean"}, "current": {"type": "boolean"},
                                   "ok": {"type": "boolean"},
                                   "superseded_by": STRING_OR_NULL}},
        "models_not_buildable": {"type": "array", "items": {"type": "object", "required": ["model", "status", "error"]}},
        "pipelines": {"type": "array", "items": {"type": "object", "required": ["name", "model", "graphs", "soc",
                                                                               "toolchain_id", "status", "reason", "record"]}},
        "choices": {"type": "array", "items": {"type": "object", "required": ["name", "model", "graph", "soc",
                                                                             "toolchain_id", "order", "status",
                                                                             "reason", "chosen", "record"]}},
        "sizes": {"type": "array", "items": {"type": "object", "required": ["name", "graph", "model", "dim", "soc",
                                                                           "precision", "toolchain_id", "sizes",
                                                                           "status", "reason", "record"]}},
        "loops": {"type": "array", "items": {"type": "object", "required": ["name", "model", "graph", "soc", "precision",
                                                                           "toolchain_id", "status", "reason", "record"]}},
        "graphs": {"type": "array", "items": {
            "type": "object", "required": ["model", "graph", "precision", "source", "status", "stages"],
            "properties": {
                "model": {"type": "string"}, "graph": {"type": "string"}, "precision": {"type": "string"},
                "source": {"type": ["object", "null"], "required": ["package", "version", "file"],
                           "properties": {"package": STRING_OR_NULL, "version": STRING_OR_NULL, "file": STRING_OR_NULL}},
                "status": {"enum": STATUSES},
                "stages": {"type": "object", "required": GRAPH_STAGES, "additionalProperties": False,
                           "properties": {s: STAGE_RECORD for s in GRAPH_STAGES}}}}},
        "targets": {"type": "array", "items": {
            "type": "object",
            "required": ["name", "model", "graph", "variant", "soc", "toolchain_id", "toolchain", "precision", "status",
                         "reason", "stages", "provenance", "diagnosis"],
            "properties": {
                "name": {"type": "string"}, "model": {"type": "string"}, "graph": {"type": "string"},
                "variant": {"type": "string"}, "diagnosis": {"type": ["object", "null"]},
                "soc": {"type": "object", "additionalProperties": False,
                        "required": ["name", "soc_id", "dsp_arch", "vtcm_mb", "fp16"],
                        "properties": {"name": {"type": "string"}, "soc_id": {"type": "integer"},
                                       "dsp_arch": {"type": "string"}, "vtcm_mb": {"type": "integer"},
                                       "fp16": {"type": "boolean"}}},
                "toolchain_id": {"type": "string"}, "toolchain": {"type": "string"}, "precision": {"type": "string"},
                "provenance": {"type": "object", "required": ["from_cache", "workers"]},
                "status": {"enum": STATUSES}, "reason": STRING_OR_NULL,
                "stages": {"type": "object", "required": CHIP_STAGES, "additionalProperties": False,
                           "properties": {s: STAGE_RECORD for s in CHIP_STAGES}}}}},
    },
}


def report_problems(data: dict, project: Project) -> list[str]:
    """Schema errors plus the documented rules the schema language above cannot say."""
    errors = validate(data, REPORT_SCHEMA)
    if errors:
        return errors
    generated = dt.datetime.fromisoformat(data["generated"])
    if generated.utcoffset() != dt.timedelta(0):
        errors.append(f"generated {data['generated']} is not UTC")
    s, targets = data["summary"], data["targets"]
    if s["targets"] != len(targets) or sum(s[k] for k in STATUSES) != s["targets"]:
        errors.append(f"summary does not add up: {s}")
    for status in STATUSES:
        if s[status] != sum(t["status"] == status for t in targets):
            errors.append(f"summary.{status} = {s[status]} but {sum(t['status'] == status for t in targets)} targets")
    if s["graphs_failed"] != sum(g["status"] in ("failed", "stale") for g in data["graphs"]):
        errors.append("summary.graphs_failed does not count the failed graphs")
    no_verdict = [t["name"] for t in targets + data["pipelines"] if t["status"] in ("pending", "stale")]
    if s["complete"] != (s["current"] and not no_verdict):
        errors.append(f"summary.complete = {s['complete']} but current = {s['current']}, no verdict: {no_verdict}")
    socs = load_socs(project.path("socs/socs.yaml"))
    graph_names = [g["graph"] for g in data["graphs"]]
    if len(set(graph_names)) != len(graph_names):
        errors.append(f"graphs repeat: {graph_names}")
    for t in targets:
        if t["graph"] not in graph_names or not t["name"].startswith(t["graph"] + "-") \
                or not t["name"].endswith("-" + t["soc"]["name"]):
            errors.append(f"target {t['name']}: name/graph/soc disagree")
        if t["soc"] != socs[t["soc"]["name"]].row():
            errors.append(f"target {t['name']}: soc is not the socs.yaml row")
        if t["status"] in ("failed", "skipped") and not t["reason"]:
            errors.append(f"target {t['name']}: {t['status']} without a reason")
    records = [(g["graph"], stage, r) for g in data["graphs"] for stage, r in g["stages"].items()]
    records += [(t["name"], stage, r) for t in targets for stage, r in t["stages"].items()]
    for owner, stage, r in records:
        if r is None:
            continue
        if r["stage"] != stage or r["target"] != owner:
            errors.append(f"{owner}/{stage}: record says stage {r['stage']!r}, target {r['target']!r}")
        if r["status"] == "failed" and not r.get("error"):
            errors.append(f"{owner}/{stage}: failed without an error")
        if r["status"] in ("passed", "warning"):
            if "seconds" not in r:
                errors.append(f"{owner}/{stage}: no seconds")
            need = {"context": ["binary", "bin_size", "compile_seconds", "partition", "log"],
                    "simverify": ["metrics", "checks", "timing", "log"]}.get(stage, [])
            errors += [f"{owner}/{stage}: no '{k}'" for k in need if k not in r]
    return errors


def test_report_json_matches_the_documented_schema(verified):
    assert documented_top_level_keys() == REPORT_SCHEMA["required"]  # this test's schema is the docs'
    data = load_report(verified)
    assert report_problems(data, verified) == []
    assert data["summary"] == {"targets": 4, "passed": 4, "warning": 0, "failed": 0, "stale": 0, "skipped": 0,
                               "pending": 0, "rejected": 0, "graphs_failed": 0, "from_cache": 0, "pipelines_failed": 0,
                               "models_not_buildable": 0, "loops_failed": 0, "crosssize_failed": 0,
                               "choices_failed": 0,
                               "upgrade_regressions": 0, "complete": True, "current": True, "superseded_by": None,
                               "ok": True}
    assert {t["name"] for t in data["targets"]} == {f"{g}-{s}" for g in GRAPHS for s in SOCS}
    assert {g["graph"]: g["model"] for g in data["graphs"]} == {g: m for g, (m, _) in GRAPHS.items()}
    for t in data["targets"]:
        assert t["reason"] is None
        assert set(t["stages"]["simverify"]["metrics"]) == set(GRAPHS[t["graph"]][1])
        assert t["toolchain_id"] == t["stages"]["simverify"]["toolchain"]["id"]
    vad = next(g for g in data["graphs"] if g["graph"] == "vad")
    assert vad["source"]["package"] == "silero-vad" and vad["source"]["version"]
    # the examples' VAD feeds stateN back into state and declares no loop: marked so (lint allows the rule)
    assert vad["recurrent"]["feed"] == {"state": "stateN"} and vad["recurrent"]["loop"] is False
    assert "verified WITHOUT a loop" in vad["recurrent"]["note"]
    assert "## Recurrent graphs verified without a loop" in verified.path("build/report/report.md").read_text()
    assert "recurrent" not in next(g for g in data["graphs"] if g["graph"] == "minilm")


def test_schema_check_rejects_broken_reports(verified):
    # the validator is not vacuous: each of these breaks a documented rule
    def broken(change) -> list[str]:
        data = load_report(verified)
        change(data)
        return report_problems(data, verified)

    assert any("unexpected key 'extra'" in e for e in broken(lambda d: d.update(extra=1)))
    assert any("missing key 'reason'" in e for e in broken(lambda d: d["targets"][0].pop("reason")))
    assert any("'done' is not one of" in e for e in broken(lambda d: d["targets"][1].update(status="done")))
    assert any("expected 'qnn-npu-compile/report/v1'" in e for e in broken(lambda d: d.update(schema="v2")))
    assert any("missing key 'simverify'" in e for e in broken(lambda d: d["targets"][0]["stages"].pop("simverify")))
    assert any("expected integer" in e for e in broken(lambda d: d["summary"].update(passed="4")))
    assert any("does not add up" in e for e in broken(lambda d: d["summary"].update(passed=3)))
    assert any("without a reason" in e for e in broken(lambda d: d["targets"][0].update(status="failed")))
    assert any("not UTC" in e for e in broken(lambda d: d.update(generated="2026-01-01T10:00:00+02:00")))


def documented_top_level_keys() -> list[str]:
    """The top-level keys the docs' report.json block lists (`{ "schema": ..., "generated": ...,` then
    one `  "key":` per line)."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "verification-and-report.md").read_text()
    block = page.split("`build/report/report.json` (schema", 1)[1].split("```", 2)[1]
    keys = []
    for line in block.splitlines():
        if line.startswith("{"):
            keys += re.findall(r'"(\w+)":', line)
        elif re.match(r'^  "\w+":', line):
            keys.append(re.match(r'^  "(\w+)":', line).group(1))
    return keys


def test_report_json_keys_are_documented(verified):
    assert list(load_report(verified)) == documented_top_level_keys()


# ------------------------------------------------------------------ every chip, with a skipped one

@pytest.fixture(scope="module")
def all_socs(verified, tmp_path_factory) -> Project:
    """A copy of the build without the SoC restriction: every row of socs.yaml, SM8350 (no fp16) skipped."""
    project = copy_project(tmp_path_factory.mktemp("all-socs") / "project", source=verified.root, with_build=True)
    for yaml in (VAD_YAML, MINILM_YAML):
        text = project.path(yaml).read_text()
        restricted = f"    socs: [{', '.join(SOCS)}]\n"
        assert restricted in text
        project.path(yaml).write_text(text.replace(restricted, ""))
    project.report_only = project.doit("report")
    project.report_only_json = load_report(project)
    # the new chips' context budgets are in lint's key: its verdicts were made without them (stale) until re-linted
    project.relint = project.doit("lint")
    project.skip_run = project.doit("config:vad-SM8350", "context:vad-SM8350", "simulate:vad-SM8350",
                                    "simverify:vad-SM8350", "report")
    return project


def test_skipped_chip_is_reported_with_its_reason(all_socs):
    run = all_socs.skip_run
    # the skip tasks pass; the report fails: the other chips' targets are expected and have no verdict yet
    output = run.stdout + run.stderr
    assert run.returncode != 0 and output.count("TaskFailed") == 1 and "TaskFailed - taskid:report" in output, output
    assert re.search(r"^report: \d+ target\(s\) not verified \(no verdict", output, re.M), output
    assert run.executed == {"config:vad-SM8350", "context:vad-SM8350", "simulate:vad-SM8350", "simverify:vad-SM8350",
                            "report"}
    data = load_report(all_socs)
    assert report_problems(data, all_socs) == []

    socs = load_socs(all_socs.path("socs/socs.yaml"))
    no_fp16 = sorted(name for name, soc in socs.items() if not soc.fp16)
    assert "SM8350" in no_fp16
    targets = {t["name"]: t for t in data["targets"]}
    assert set(targets) == {f"{g}-{s}" for g in GRAPHS for s in socs}
    skipped = {n for n, t in targets.items() if t["status"] == "skipped"}
    assert skipped == {f"{g}-{s}" for g in GRAPHS for s in no_fp16}
    for name in skipped:
        assert "fp16" in targets[name]["reason"] and targets[name]["soc"]["dsp_arch"] in targets[name]["reason"]
    for stage in CHIP_STAGES:  # the tasks that ran wrote skip records; minilm's did not run
        record = targets["vad-SM8350"]["stages"][stage]
        assert record["status"] == "skipped" and record["reason"] == targets["vad-SM8350"]["reason"]
        assert targets["minilm-SM8350"]["stages"][stage] is None
    built = {f"{g}-{s}" for g in GRAPHS for s in SOCS}
    assert {n for n, t in targets.items() if t["status"] == "passed"} == built
    pending = {n for n, t in targets.items() if t["status"] == "pending"}
    assert pending == set(targets) - built - skipped and pending
    assert all(v is None for n in pending for v in targets[n]["stages"].values())
    assert data["summary"]["skipped"] == len(skipped) and data["summary"]["pending"] == len(pending)

    md = all_socs.path("build/report/report.md").read_text()
    assert f"| graph | {' | '.join(socs)} |" in md
    assert f"- **vad-SM8350** (skipped): {targets['vad-SM8350']['reason']}" in md


def test_report_rerenders_when_targets_are_added(all_socs):
    assert "report" in all_socs.report_only.executed, all_socs.report_only.stdout
    socs = load_socs(all_socs.path("socs/socs.yaml"))
    assert all_socs.report_only_json["summary"]["targets"] == len(GRAPHS) * len(socs)
    built = {t["name"]: t for t in all_socs.report_only_json["targets"]}["vad-SM8650"]
    assert built["status"] == "stale" and "context budget (context_mb) of a chip it is built for changed since it " \
        "was linted (rerun doit)" in built["reason"], built["reason"]
    assert all_socs.relint.returncode == 0 and all_socs.relint.executed == {"lint:vad", "lint:minilm"}


def test_skip_records_have_every_documented_field(all_socs):
    record = load_report(all_socs)
    vad_skip = next(t for t in record["targets"] if t["name"] == "vad-SM8350")
    for stage in CHIP_STAGES:
        assert {"stage", "target", "status", "seconds"} <= set(vad_skip["stages"][stage])


# ------------------------------------------------------------------ report.md and index.html

class Page(HTMLParser):
    """What a test needs from the report page: ids, sections' text, links, images, matrix, summary."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.sections: dict[str, list[str]] = {}
        self.links: list[dict] = []
        self.images: list[dict] = []
        self.matrix: list[list[str]] = []
        self.summary = ""
        self._section = self._link = self._row = self._cell = None
        self._matrix = self._summary = False
        self.feed(text)
        self.text = {k: " ".join("".join(v).split()) for k, v in self.sections.items()}

    BLOCKS = {"td", "th", "tr", "p", "h1", "h2", "h3", "h4", "li", "br", "table", "div", "ul"}

    def _gap(self, tag):
        if tag in self.BLOCKS and self._section:
            self.sections[self._section].append(" ")  # cells and paragraphs are separate words

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._gap(tag)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "section":
            self._section = a.get("id")
            self.sections[self._section] = []
        elif tag == "a" and "href" in a:
            self._link = {"section": self._section, "href": a["href"], "text": ""}
            self.links.append(self._link)
        elif tag == "img":
            self.images.append({"section": self._section, "src": a.get("src"), "alt": a.get("alt", "")})
        elif tag == "table" and "matrix" in (a.get("class") or "").split():
            self._matrix = True
        elif tag == "tr" and self._matrix:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "p" and a.get("id") == "summary":
            self._summary = True

    def handle_endtag(self, tag):
        self._gap(tag)
        if tag == "section":
            self._section = None
        elif tag == "a":
            self._link = None
        elif tag in ("td", "th") and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.matrix.append(self._row)
            self._row = None
        elif tag == "table":
            self._matrix = False
        elif tag == "p":
            self._summary = False

    def handle_data(self, data):
        if self._section:
            self.sections[self._section].append(data)
        if self._link is not None:
            self._link["text"] += data
        if self._cell is not None:
            self._cell.append(data)
        if self._summary:
            self.summary += data


def expected_matrix(data: dict) -> list[list[str]]:
    """Header + one row per graph (per graph variant where the report lists variants) x SoC statuses."""
    socs = list(dict.fromkeys(t["soc"]["name"] for t in data["targets"]))
    status = {(t.get("variant", t["graph"]), t["soc"]["name"]): t["status"] for t in data["targets"]}
    rows = [(v["model"], v["name"], v["precision"]) for v in data["variants"]] if "variants" in data else \
        [(g["model"], g["graph"], g["precision"]) for g in data["graphs"]]
    return [["graph", *socs]] + [[f"{model}/{name} {precision}", *(status.get((name, s), "") for s in socs)]
                                 for model, name, precision in rows]


def test_report_md_has_the_matrix(verified):
    data = load_report(verified)
    md = verified.path("build/report/report.md").read_text()
    lines = md.splitlines()
    assert lines[0] == "# NPU build report"
    assert render_module.summary_line(data) in md
    header = lines.index(f"| graph | {' | '.join(SOCS)} |")
    assert lines[header + 1] == "|---|---|---|"
    rows = lines[header + 2: header + 2 + len(GRAPHS)]
    assert sorted(rows) == sorted(f"| {model}/{graph} (fp16) | passed | passed |" for graph, (model, _) in GRAPHS.items())
    assert "Failed and skipped" not in md


def test_index_html_has_targets_metrics_logs_and_plots(verified):
    report_dir = verified.root / REPORT_DIR
    data = load_report(verified)
    page = Page((report_dir / "index.html").read_text())
    assert page.matrix == expected_matrix(data)
    assert page.summary.strip() == render_module.summary_line(data)
    figures = render_module.figure_groups(data["targets"], lambda t: t["stages"].get("simulate"), "outputs.npz")

    for t in data["targets"]:
        name = t["name"]
        assert name in page.sections, f"no section for {name}"
        text = page.text[name]
        assert f"{name} — {t['status']}" in text
        sim = t["stages"]["simverify"]
        for output, m in sim["metrics"].items():
            row = f"{output} {m['max_abs']:.4g} {m['mean_abs']:.4g} {m['cosine']:.7g} {m['snr_db']:.4g}"
            assert row in text, f"{name}: metrics row {row!r} missing"
        for check in sim["checks"]:
            assert f"check {check['kind']} on {check['output']}: {check['value']:.4g}" in text
        assert "simulator time on the build host (not phone latency)" in text
        assert f"{sim['samples']} samples" in text
        assert t["stages"]["context"]["binary"]["build_id"] in text

        links = {l["text"]: l["href"] for l in page.links if l["section"] == name}
        expected = {"compile log": t["stages"]["context"]["log"], "simulator log": sim["log"]}
        for label, record_path in expected.items():
            href = links[label]
            assert not href.startswith(("/", "file:")) and "://" not in href, href  # relative: the folder can move
            target = (report_dir / href).resolve()
            # self-contained: the linked file is a copy inside build/report/ (publishing that folder alone works)
            assert target.is_relative_to(report_dir.resolve()) and target.is_file(), href
            assert target.read_bytes() == (verified.root / record_path).read_bytes()

        images = [i for i in page.images if i["section"] == name]
        shared = figures.get(name) or {}
        if shared.get("same_as"):  # identical outputs on another chip: one figure, drawn in that chip's section
            assert images == [] and f"CPU vs NPU figure: same as {shared['soc']} (identical outputs)." in text
            continue
        assert len(images) == 1, images
        png = (report_dir / images[0]["src"]).resolve()
        assert not images[0]["src"].startswith("/") and png.is_relative_to(report_dir.resolve())
        assert png.read_bytes()[:8] == PNG
        pixels = matplotlib.image.imread(png)
        assert pixels.shape[0] > 150 and pixels.shape[1] > 300
        assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 20  # a drawing, not a blank
        # drawn once by the simulate stage (cached with its outputs); the page shows a copy
        assert png.read_bytes() == (verified.root / t["stages"]["simulate"]["plot"]).read_bytes()

    anchors = [l["href"] for l in page.links if l["href"].startswith("#") and l["section"] is None]
    assert sorted(a[1:] for a in anchors) == sorted(t["name"] for t in data["targets"])  # matrix cells link
    assert all(a[1:] in page.ids for a in anchors)
    assert set(page.sections) == {t["name"] for t in data["targets"]}


# ------------------------------------------------------------------ a real browser

def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    assert CHROMIUM.is_file(), "the report check needs Debian's chromium (scripts/install.sh installs it)"
    return subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_report_renders_in_a_headless_browser(verified, tmp_path):
    index = (verified.root / REPORT_DIR / "index.html").resolve()
    data = load_report(verified)

    dom = chromium("--dump-dom", index.as_uri(), profile=tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = Page(dom.stdout)
    assert "<tbody>" in dom.stdout  # the browser's DOM, not our file echoed back
    assert page.summary.strip() == render_module.summary_line(data)
    assert page.matrix == expected_matrix(data)
    assert set(page.sections) == {t["name"] for t in data["targets"]}

    shot = tmp_path / "report.png"
    run = chromium(f"--screenshot={shot}", "--window-size=1280,2000", index.as_uri(), profile=tmp_path / "profile-shot")
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    assert shot.read_bytes()[:8] == PNG
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (2000, 1280)
    colours = np.unique((pixels * 255).round().astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 200, f"only {len(colours)} colours: a blank or unstyled page"
    non_white = (pixels < 0.95).any(axis=-1).mean()
    assert non_white > 0.05
    rgb = (pixels * 255).round()
    passed_green = (np.abs(rgb - [0xd9, 0xf2, 0xd9]).max(axis=-1) <= 2).sum()   # .passed cells (CSS applied)
    plot_blue = (np.abs(rgb - [0x44, 0x77, 0xaa]).max(axis=-1) <= 3).sum()      # histogram bars (plots loaded)
    assert passed_green > 2000, passed_green
    assert plot_blue > 2000, plot_blue


# ------------------------------------------------------------------ up to date / re-rendered

def test_report_is_up_to_date_when_no_record_changed(own_copy):
    report_json = own_copy.path("build/report/report.json")
    before = report_json.read_bytes()
    result = own_copy.doit("report")
    assert result.returncode == 0, result.stderr
    assert result.executed == set() and result.uptodate == {"report"}
    assert report_json.read_bytes() == before  # not even the `generated` time changed


def test_report_rerenders_when_a_record_changes(own_copy):
    first = own_copy.doit("report")
    assert first.uptodate == {"report"}, first.stdout  # the relocated copy's report is current
    before = load_report(own_copy)
    own_copy.edit(VAD_YAML, "output: {max_abs: 0.05}", "output: {max_abs: 0.04}")
    result = own_copy.doit("simverify:vad-SM8650", "report")
    assert result.executed == {"simverify:vad-SM8650", "report"}
    after = load_report(own_copy)
    targets = {t["name"]: t for t in after["targets"]}
    assert targets["vad-SM8650"]["stages"]["simverify"]["metrics"]["output"]["thresholds"]["max_abs"] == 0.04
    # SM8750 was judged under the old threshold and not again: its verdict is not today's (and fails the report)
    assert targets["vad-SM8750"]["stages"]["simverify"]["metrics"]["output"]["thresholds"]["max_abs"] == 0.05
    assert result.returncode == 1 and targets["vad-SM8750"]["status"] == "stale", result.stdout
    assert targets["vad-SM8750"]["stages"]["simverify"]["stale"] == [
        f"{VAD_YAML}: graphs.vad.verify.per_output.output.max_abs changed since it was verified (rerun doit)"]
    assert after["generated"] >= before["generated"]
    page = Page(own_copy.path("build/report/index.html").read_text())
    assert "max-abs ≤ 0.04" in page.text["vad-SM8650"] and "max-abs ≤ 0.05" in page.text["vad-SM8750"]
    judged = own_copy.doit("simverify", "report")  # the other chip judged under today's threshold too
    assert judged.returncode == 0 and "simverify:vad-SM8750" in judged.executed, judged.stdout + judged.stderr
    assert "vad-SM8650" not in str(judged.executed)
    assert own_copy.doit("report").executed == set()


def test_report_json_is_strict_json(verified, tmp_path):
    data = load_report(verified)
    # an output the NPU reproduces exactly has infinite SNR (metrics.compare says so, see test_metrics)
    exact = metrics.compare(np.ones(3), np.ones(3))
    data["targets"][0]["stages"]["simverify"]["metrics"]["exact_output"] = {**exact, "thresholds": {}}
    paths = report_module.write(tmp_path / "report", data)

    def reject(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    json.loads(paths["json"].read_text(), parse_constant=reject)
    json.loads(verified.path("build/report/report.json").read_text(), parse_constant=reject)


# ------------------------------------------------------------------ a failed stage still gets reported

@pytest.fixture(scope="module")
def cpucheck_broken(verified, tmp_path_factory) -> Project:
    """`doit` on a copy whose minilm cpucheck tolerance (1e-12) the simplified graph cannot meet."""
    project = copy_project(tmp_path_factory.mktemp("broken") / "project", source=verified.root, with_build=True)
    project.edit(MINILM_YAML, "cpucheck: {max_abs: 1.0e-4}", "cpucheck: {max_abs: 1.0e-12}")
    project.run = project.doit()
    return project


@pytest.mark.slow
def test_report_runs_after_a_failed_graph_stage(cpucheck_broken):
    run = cpucheck_broken.run
    assert run.returncode != 0
    assert {"cpucheck:minilm", "report"} <= run.executed, run.stdout
    lines = run.stdout.splitlines()
    assert lines.index(".  report") > lines.index(".  cpucheck:minilm")
    assert not any(t.startswith("simverify:minilm") for t in run.executed)  # nothing built on a failed graph

    data = load_report(cpucheck_broken)
    # (the missing reasons of minilm's targets: test_targets_of_a_failed_graph_say_why)
    assert [e for e in report_problems(data, cpucheck_broken) if "without a reason" not in e] == []
    graphs = {g["graph"]: g for g in data["graphs"]}
    minilm = graphs["minilm"]
    assert minilm["status"] == "failed" and graphs["vad"]["status"] == "passed"
    error = minilm["stages"]["cpucheck"]["error"]
    assert "output 'embedding': max_abs" in error and "1e-12" in error
    assert minilm["stages"]["cpucheck"]["metrics"]["embedding"]["max_abs"] > 1e-12
    assert data["summary"]["graphs_failed"] == 1
    for t in data["targets"]:
        if t["graph"] == "minilm":
            assert t["status"] in ("failed", "pending")
        else:
            assert t["status"] == "passed"
    assert data["summary"]["passed"] == 2 and data["summary"]["failed"] + data["summary"]["pending"] == 2

    md = cpucheck_broken.path("build/report/report.md").read_text()
    assert "| minilm/minilm (fp16) | failed | failed |" in md
    html = cpucheck_broken.path("build/report/index.html").read_text()
    assert str(escape(error)) in html


@pytest.mark.slow
def test_cpucheck_impossible_tolerance(cpucheck_broken):
    """A tolerance the simplified graph cannot meet fails cpucheck in one line naming the output, the measured
    value and the key to loosen, and the record keeps what was measured."""
    line = cpucheck_broken.run.failure_line("cpucheck:minilm")
    assert "cpucheck of graph 'minilm'" in line
    assert "output 'embedding': max_abs = " in line and "above the threshold 1e-12" in line
    assert "loosen graphs.minilm.cpucheck" in line
    rec = json.loads(cpucheck_broken.path("build/minilm/minilm/cpucheck/cpucheck.json").read_text())
    assert rec["status"] == "failed"
    assert rec["thresholds"]["max_abs"] == 1e-12
    assert rec["metrics"]["embedding"]["max_abs"] > 1e-12  # what was measured is kept in the record
    assert rec["error"] in line


@pytest.mark.slow
def test_targets_of_a_failed_graph_say_why(cpucheck_broken):
    data = load_report(cpucheck_broken)
    for t in data["targets"]:
        if t["graph"] == "minilm":
            assert t["reason"] and "cpucheck" in t["reason"], t
    md = cpucheck_broken.path("build/report/report.md").read_text()
    assert "): None" not in md
