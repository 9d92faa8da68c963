"""The packaged SoC table and toolchain profiles, and a project's own files over them (spec level, fast).

* the packaged table holds the measured rows (docs/socs.md), each with what the chip runs and its marketing name;
* a project's socs/socs.yaml adds rows and overrides rows by name; `default:` picks the chips a graph
  without `socs:` builds for; errors name the file that holds the bad value (packaged or the project's);
* the older `fp16: true/false` spelling reads as before and keys the same way (no rebuild);
* a chip that runs only quantized graphs lists its fp16 targets as SKIPPED with the reason, its w8a16 ones built;
* toolchain/<name>.yaml in a project overrides the packaged profile of that name.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, Project

from qnn_tasks.errors import EXIT_SPEC, SpecError
from qnn_tasks.modelspec.load import load_project, load_soc_table, load_socs, load_toolchain, packaged_socs_file
from qnn_tasks.modelspec.project import LEGACY_RUNS

PACKAGED = packaged_socs_file()
# the rows measured with QNN 2.51 (soc_model, arch in the binary, runs float?)
MEASURED = {"SM8845": (97, "v81", True), "QCS8550": (66, "v73", True), "SC8380XP": (60, "v73", True),
            "SC8480XP": (88, "v81", True), "SA8295": (39, "v68", False), "SA8797": (72, "v81", True),
            "QCS8300": (82, "v75", True), "SM7550": (64, "v73", False), "SM7675": (70, "v73", False),
            "SM8635": (68, "v73", False), "SM8735": (85, "v73", False), "SM7750": (86, "v73", False),
            "SM7325": (35, "v68", False)}
ORIGINAL = ["SM8550", "SM8650", "SM8750", "SM8850", "QCS9100", "SM8450", "SM8475", "SA8255", "SM8350"]


def bare_project(root: Path, socs_yaml: str | None = None) -> Project:
    """A project with one example model (the VAD, no `socs:` of its own) and no toolchain/ folder."""
    root.mkdir(parents=True)
    shutil.copy2(EXAMPLES / "dodo.py", root / "dodo.py")
    shutil.copytree(EXAMPLES / "models" / "silero-vad", root / "models" / "silero-vad",
                    ignore=shutil.ignore_patterns("__pycache__"))
    if socs_yaml is not None:
        (root / "socs").mkdir()
        (root / "socs" / "socs.yaml").write_text(socs_yaml)
    return Project(root)


def test_packaged_table_has_the_measured_rows():
    socs = load_socs(PACKAGED)
    for name, (soc_id, arch, fp16) in MEASURED.items():
        soc = socs[name]
        assert (soc.soc_id, soc.dsp_arch) == (soc_id, arch), name
        assert soc.runs == (("fp16", "w8a16") if fp16 else ("w8a16",)), name
        assert soc.note, f"{name} has no marketing name"
        assert soc.file == str(PACKAGED)
    assert set(ORIGINAL) <= set(socs) and socs["SM8350"].runs == ("w8a16",)
    assert socs["QCM6490"].soc_id == 35  # one chip, two names in the public tables
    assert socs["SM7550"].note.startswith("Snapdragon 7 Gen 3")
    # the default demo stays on the 9 original chips
    table, default = load_soc_table(Path("/nonexistent"))
    assert default == tuple(ORIGINAL) and len(table) == len(socs)


def test_the_row_is_the_one_chip_check_for_a_binary():
    """`Soc.binary_mismatch` on facts as qnnbin reads them (SM8650 is soc_model 57, v75)."""
    sm8650 = load_socs(PACKAGED)["SM8650"]
    assert sm8650.binary_mismatch({"soc_model": 57, "dsp_arch": "v75", "graphs": []}) is None
    assert sm8650.binary_mismatch({"soc_model": 69, "dsp_arch": "v79"}) == \
        "socModel 69 != soc_id 57, arch v79 != dsp_arch v75"
    assert sm8650.binary_mismatch({"soc_model": 57, "dsp_arch": "v73"}) == "arch v73 != dsp_arch v75"
    assert sm8650.binary_mismatch({}) == "socModel None != soc_id 57, arch None != dsp_arch v75"  # facts unread
    (wrong,) = sm8650.binary_mismatches({"soc_model": 43, "dsp_arch": "v75"})
    assert (wrong.fact, wrong.recorded, wrong.expected) == ("soc_model", 43, 57)


def test_fp16_key_reads_as_before_and_keys_the_same(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("socs:\n  A: {soc_id: 57, dsp_arch: v75, vtcm_mb: 8, fp16: true}\n"
                   "  B: {soc_id: 30, dsp_arch: v68, vtcm_mb: 4, fp16: false}\n")
    new = tmp_path / "new.yaml"
    new.write_text("socs:\n  A: {soc_id: 57, dsp_arch: v75, vtcm_mb: 8, runs: [w8a16, fp16]}\n"
                   "  B: {soc_id: 30, dsp_arch: v68, vtcm_mb: 4, runs: [w8a16]}\n")
    a, b = load_socs(old), load_socs(new)
    assert a["A"].runs == b["A"].runs == LEGACY_RUNS[True] and a["B"].runs == b["B"].runs == ("w8a16",)
    # the row chip stages key on is the one `fp16:` gave before `runs:` existed
    assert a["A"].row() == b["A"].row() == {"name": "A", "soc_id": 57, "dsp_arch": "v75", "vtcm_mb": 8, "fp16": True}
    assert a["B"].row() == b["B"].row() and "runs" not in b["B"].row()


@pytest.mark.parametrize("row, fragments", [
    ("{soc_id: 64, dsp_arch: v73, vtcm_mb: 8}", ["socs.X.runs: required key is missing", "runs: [w8a16]"]),
    ("{soc_id: 64, dsp_arch: v73, vtcm_mb: 8, runs: [int4]}", ["socs.X.runs: ['int4'] is not a list of precisions"]),
    ("{soc_id: 64, dsp_arch: v73, vtcm_mb: 8, runs: []}", ["socs.X.runs: [] is not a list"]),
    ("{soc_id: 64, dsp_arch: v73, vtcm_mb: 8, runs: [w8a16], fp16: true}", ["socs.X.fp16: both runs: and fp16:"]),
    # the same chip as a packaged row under another name: the message says where the other row is
    ("{soc_id: 64, dsp_arch: v73, vtcm_mb: 8, runs: [w8a16]}\ndefault: []",
     ["socs.X.soc_id: soc_id 64 with v73 is already row SM7550 (" + str(PACKAGED) + ")", "alias_of: SM7550"]),
])
def test_bad_project_row_names_the_project_file(tmp_path, row, fragments):
    project = bare_project(tmp_path / "p", f"socs:\n  X: {row}\n")
    with pytest.raises(SpecError) as err:
        load_project(project.root)
    line = str(err.value)
    assert line.startswith(str(project.root / "socs" / "socs.yaml") + ": "), line
    assert "(fix: " in line
    for fragment in fragments:
        assert fragment in line, line


def test_project_rows_add_override_and_choose_the_default(tmp_path):
    # no socs/ at all: the packaged table and its default chips
    project = load_project(bare_project(tmp_path / "none").root)
    assert project.default_socs == tuple(ORIGINAL) and "SM7550" in project.socs
    # an empty override file: the same
    empty = load_project(bare_project(tmp_path / "empty", "socs: {}\n").root)
    assert empty.default_socs == tuple(ORIGINAL)
    # rows written: a new chip and an override by name; the graph without socs: builds for those rows
    own = bare_project(tmp_path / "own", "socs:\n  SM8650: {soc_id: 57, dsp_arch: v75, vtcm_mb: 4, runs: [fp16, w8a16]}\n"
                                          "  SM9999: {soc_id: 123, dsp_arch: v81, vtcm_mb: 8, runs: [w8a16]}\n")
    project = load_project(own.root)
    assert project.socs["SM8650"].vtcm_mb == 4 and project.socs["SM8650"].file == str(own.root / "socs" / "socs.yaml")
    assert project.socs["SM8750"].file == str(PACKAGED)  # untouched rows stay packaged
    assert project.default_socs == ("SM8650", "SM9999")
    listing = own.doit("list", "--all")
    assert listing.returncode == 0, listing.stderr
    docs = dict(line.split(None, 1) for line in listing.stdout.splitlines())
    assert "context:vad-SM8650" in docs and "context:vad-SM8750" not in docs
    assert docs["context:vad-SM9999"].startswith("SKIPPED: SM9999 (v81) cannot run fp16 graphs, only w8a16")
    # default: all builds every row of the merged table
    everything = load_project(bare_project(tmp_path / "all", "default: all\nsocs: {}\n").root)
    assert everything.default_socs == tuple(everything.socs) and len(everything.socs) >= 22
    # an unknown name in default: is one line naming the project file
    with pytest.raises(SpecError, match=r"socs/socs\.yaml: default: unknown SoC 'SM0000'"):
        load_project(bare_project(tmp_path / "bad", "default: [SM0000]\nsocs: {}\n").root)


def test_quantized_only_chip_skips_fp16_visibly_and_builds_w8a16(tmp_path):
    project = bare_project(tmp_path / "p")
    project.edit("models/silero-vad/model.yaml", "    precision: fp16", "    precision: [fp16, w8a16]\n    socs: [SM7550, SM8650]")
    listing = project.doit("list", "--all")
    assert listing.returncode == 0, listing.stderr
    docs = dict(line.split(None, 1) for line in listing.stdout.splitlines())
    for stage in ("config", "context", "simulate", "simverify"):
        doc = docs[f"{stage}:vad-SM7550"]
        assert doc.startswith("SKIPPED: SM7550 (v73) cannot run fp16 graphs, only w8a16"), doc
        assert "error 3110" in doc, doc
        assert not docs[f"{stage}:vad-w8a16-SM7550"].startswith("SKIPPED"), docs[f"{stage}:vad-w8a16-SM7550"]
        assert not docs[f"{stage}:vad-SM8650"].startswith("SKIPPED")


def test_project_toolchain_overrides_the_packaged_profile(tmp_path):
    project = bare_project(tmp_path / "p")
    packaged = load_toolchain(project.root, "ort-qnn")
    assert packaged.file.parent.name == "toolchain" and "qnn_tasks" in str(packaged.file)
    assert {p.name for p in [load_toolchain(project.root, n) for n in ("ort-qnn-2.47", "qairt")]} == {"ort-qnn-2.47", "qairt"}
    (project.root / "toolchain").mkdir()
    (project.root / "toolchain" / "ort-qnn.yaml").write_text("kind: ort-qnn\noptions:\n  htp_graph_finalization_optimization_mode: 1\n")
    own = load_toolchain(project.root, "ort-qnn")
    assert own.file == project.root / "toolchain" / "ort-qnn.yaml" and own.options == {"htp_graph_finalization_optimization_mode": 1}
    # a bad value in the project's profile is one line naming that file
    (project.root / "toolchain" / "ort-qnn.yaml").write_text("kind: ort-qnn\noptions:\n  htp_bogus: 1\n")
    result = project.doit("list")
    assert result.returncode == EXIT_SPEC and "Traceback" not in result.stderr
    assert result.stderr.strip() == result.stderr.strip().splitlines()[0]
    assert f"{project.root / 'toolchain' / 'ort-qnn.yaml'}: options.htp_bogus: unknown QNN execution provider option" \
        in result.stderr
    # an unknown profile lists the packaged ones too
    with pytest.raises(SpecError, match=r"no toolchain profile 'nope' \(fix: use one of: ort-qnn, ort-qnn-2\.47, qairt"):
        load_toolchain(project.root, "nope")


def test_socscheck_compiles_what_each_row_runs(tmp_path):
    """Real compiles: SM7550 (quantized only) at w8a16, SM8650 at fp16 and w8a16; a row claiming float on
    SM7550 fails with QNN's 3110 turned into the fix."""
    table = tmp_path / "socs.yaml"
    table.write_text("socs:\n"
                     "  SM7550: {soc_id: 64, dsp_arch: v73, vtcm_mb: 8, runs: [w8a16]}\n"
                     "  SM8650: {soc_id: 57, dsp_arch: v75, vtcm_mb: 8, runs: [fp16, w8a16]}\n"
                     "  SM7550F: {soc_id: 64, dsp_arch: v73, vtcm_mb: 8, runs: [fp16, w8a16], alias_of: SM7550}\n")
    proc = subprocess.run([sys.executable, "-m", "qnn_tasks.stages.socscheck", "--socs", str(table), "--json"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    rows = {r["soc"]["name"]: r for r in json.loads(proc.stdout)}
    assert rows["SM7550"]["ok"] and list(rows["SM7550"]["precisions"]) == ["w8a16"]
    assert rows["SM7550"]["precisions"]["w8a16"] == {"recorded_soc_model": 64, "recorded_arch": "v73", "ok": True}
    assert rows["SM8650"]["ok"] and list(rows["SM8650"]["precisions"]) == ["fp16", "w8a16"]
    assert all(p["recorded_soc_model"] == 57 and p["recorded_arch"] == "v75" for p in rows["SM8650"]["precisions"].values())
    wrong = rows["SM7550F"]
    assert not wrong["ok"] and wrong["precisions"]["w8a16"]["ok"]
    assert "QNN error 3110 (QNN_OP_PACKAGE_ERROR_VALIDATION_FAILURE)" in wrong["error"]
    assert f"set runs: [w8a16] on its row ({table})" in wrong["error"]
    assert "do not match the compiled binaries: SM7550F" in proc.stderr and "Traceback" not in proc.stderr


def test_quantized_only_chip_builds_and_verifies_w8a16_with_fp16_skipped_in_the_report(tmp_path):
    """Real doit on the simulator: a YAML-only model at [fp16, w8a16] on SM7550 (packaged row, w8a16 only)."""
    from tiny_packaged import write_model

    project = Project(tmp_path / "project")
    project.root.mkdir()
    shutil.copy2(EXAMPLES / "dodo.py", project.root / "dodo.py")
    write_model(project.root / "models" / "tiny", samples=8,
                extra="    precision: [fp16, w8a16]\n    calibration: {samples: 8}\n    socs: [SM7550]\n")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "context:tiny-w8a16-SM7550" in result.executed
    assert not list(project.root.glob("build/tiny/tiny/*/fp16/SM7550/**/*.bin"))  # the skip compiled nothing
    assert list(project.root.glob("build/tiny/tiny/*/w8a16/SM7550/context/tiny_ctx_qnn.bin"))
    report = json.loads(project.path("build/report/report.json").read_text())
    status = {(t["precision"], t["soc"]["name"]): t for t in report["targets"]}
    assert status[("w8a16", "SM7550")]["status"] == "passed"
    skipped = status[("fp16", "SM7550")]
    assert skipped["status"] == "skipped" and "QNN rejects its float ops: error 3110" in skipped["reason"]
    assert "**tiny-SM7550** (skipped): SM7550 (v73) cannot run fp16 graphs" in project.path("build/report/report.md").read_text()


@pytest.mark.slow
def test_socscheck_confirms_the_packaged_table_under_both_qnn_versions(tmp_path):
    """`doit socscheck` with QNN 2.51 and QNN 2.47 (pinned environment): every packaged row, each precision it runs."""
    project = bare_project(tmp_path / "p")
    result = project.doit("socscheck", env={"QNN_TOOLCHAIN": "ort-qnn,ort-qnn-2.47"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.executed == {"socscheck:ort-qnn", "socscheck:ort-qnn-2.47"}
    table = load_soc_table(project.root)[0]
    for record in ("build/socscheck.json", "build/socscheck-ort-qnn-2.47.json"):
        rows = {r["soc"]["name"]: r for r in json.loads(project.path(record).read_text())["rows"]}
        assert list(rows) == list(table), record
        for name, soc in table.items():
            assert rows[name]["ok"] and list(rows[name]["precisions"]) == list(soc.runs), (record, rows[name])
        assert list(rows["SM7550"]["precisions"]) == ["w8a16"] and rows["SM8735"]["recorded_arch"] == "v73"


def test_messages_name_the_file_of_the_row(tmp_path):
    """A wrong packaged row is fixed by overriding it in the project; a project row, in the project's file."""
    packaged = load_socs(PACKAGED)["SM8650"]
    assert packaged.where() == (f"the SM8650 row of {PACKAGED} (the packaged table: override the row in your "
                                "socs/socs.yaml)")
    project = bare_project(tmp_path / "p", "socs:\n  SM8650: {soc_id: 57, dsp_arch: v75, vtcm_mb: 8, runs: [fp16]}\n"
                                           "default: [SM8650, SM8650]\n")
    loaded = load_project(project.root)
    own = project.root / "socs" / "socs.yaml"
    assert loaded.socs["SM8650"].where() == f"the SM8650 row of {own}"
    assert loaded.default_socs == ("SM8650",)  # listed twice, built once
    assert loaded.socs["SM8650"].row()["runs"] == ["fp16"]  # a set `fp16:` cannot say is keyed as itself
    assert loaded.socs["SM8650"].skip_reason("w8a16") == \
        "SM8650 (v75) cannot run w8a16 graphs, only fp16 (runs: ['fp16'])"
