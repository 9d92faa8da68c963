"""A packaged ONNX with only model.yaml (no Python): real doit, real onnxruntime-qnn compiles and simulator runs.

The model (tests/packaged_fixture.py) has dynamic dims, int64 I/O and four hazards; with the
built-in rewrites it builds and verifies on SM8650 and SM8750. Without them, each failure names
the rewrite to enable: export (fold-if), the CPU-fallback check (reduce-sum-square,
clip-computed), verification (centred-variance). Then: spec errors for the new keys, export.py's
errors pointing at the user's line, its chatter kept in export.log, and a wrong declared output
shape caught at export.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import EXAMPLES, Project
from packaged_fixture import ALL_REWRITES, write_model_folder

from qnn_tasks.errors import StageError
from qnn_tasks.judge.sample_store import read_declared
from qnn_tasks.modelspec.project import GraphSpec, TensorSpec

YAML = "models/hazards/model.yaml"
GRAPH_DIR = "build/hazards/hazards"
SOCS = ("SM8650", "SM8750")


def packaged_project(root: Path, rewrites: str = ALL_REWRITES) -> Project:
    """dodo.py, socs, toolchain and one model folder: model.yaml + hazards.onnx + samples/*.npz (no export.py)."""
    root.mkdir(parents=True)
    for name in ("dodo.py", "socs", "toolchain"):
        (shutil.copytree if (EXAMPLES / name).is_dir() else shutil.copy2)(EXAMPLES / name, root / name)
    write_model_folder(root / "models" / "hazards", rewrites)
    return Project(root)


def record(project: Project, stage: str) -> dict:
    return json.loads(project.path(f"{GRAPH_DIR}/{stage}/{stage}.json").read_text())


def set_rewrites(project: Project, rewrites: str | None) -> None:
    project.edit(YAML, f"    rewrites: {ALL_REWRITES}\n", f"    rewrites: {rewrites}\n" if rewrites else "")


@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> Project:
    project = packaged_project(tmp_path_factory.mktemp("packaged") / "project")
    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    project.build_run = result
    return project


# ================================================================ the YAML-only model, with its rewrites

def test_yaml_only_model_builds_and_verifies_on_two_chips(verified):
    assert not verified.path("models/hazards/export.py").exists()
    expected = {f"{stage}:hazards" for stage in ("export", "simplify", "lint", "cpucheck")}
    expected |= {f"{stage}:hazards-{soc}" for stage in ("config", "context", "simverify") for soc in SOCS}
    assert expected | {"report"} <= verified.build_run.executed
    for soc in SOCS:
        sim = verified.one_json(f"{GRAPH_DIR}/*/fp16/{soc}/simverify/simverify.json")
        assert sim["status"] == "passed", sim
        assert sim["metrics"]["y"]["cosine"] > 0.999 and sim["metrics"]["next_ids"]["max_abs"] == 0
        context = verified.one_json(f"{GRAPH_DIR}/*/fp16/{soc}/context/context.json")
        assert context["partition"]["cpu_nodes"] == []  # nothing falls back
    report = json.loads(verified.path("build/report/report.json").read_text())
    assert report["summary"]["passed"] == 2 and report["summary"]["failed"] == 0


def test_export_record_says_what_was_fixed_and_rewritten(verified):
    export = record(verified, "export")
    assert export["exported_by"] == "built-in" and export["status"] == "passed"
    assert [(r["name"], r["count"], r["sites"]) for r in export["rewrites"]] == [
        ("fold-if", 1, ["mode_branch (then)"]), ("centred-variance", 1, ["layernorm_variance"]),
        ("reduce-sum-square", 1, ["energy"]), ("clip-computed", 1, ["clip_at_half_peak"])]
    assert export["boundary"]["casts"] == ["input 'ids': int32 -> int64", "output 'next_ids': int64 -> int32"]
    assert export["boundary"]["constant_inputs"] == {"mode": 1}
    assert export["boundary"]["dims"]["input 'x'"] == {"onnx": ["batch", "time", 64], "declared": [1, 16, 64]}
    model = onnx.load(str(verified.path(f"{GRAPH_DIR}/export/hazards.onnx")))
    ops = {n.op_type for n in model.graph.node}
    assert not ops & {"If", "ReduceSumSquare", "Clip", "Pow"}
    io = [(v.name, v.type.tensor_type.elem_type) for v in list(model.graph.input) + list(model.graph.output)]
    assert io == [("x", onnx.TensorProto.FLOAT), ("ids", onnx.TensorProto.INT32),
                  ("y", onnx.TensorProto.FLOAT), ("next_ids", onnx.TensorProto.INT32)]


def test_cpucheck_uses_the_declared_samples_and_the_original_onnx(verified):
    cpucheck = record(verified, "cpucheck")
    assert cpucheck["samples"] == 4  # a_stacked.npz holds 3, b_single.npz 1
    assert cpucheck["reference_from"] == "the original hazards.onnx on CPU"
    assert cpucheck["samples_from"].endswith("model.yaml: graphs.hazards.samples")
    assert cpucheck["metrics"]["y"]["max_abs"] < 1e-5  # the rewrites are exact up to float rounding on CPU
    with np.load(verified.path(f"{GRAPH_DIR}/cpucheck/inputs.npz")) as inputs:
        assert inputs["ids"].dtype == np.int32 and inputs["x"].shape == (4, 1, 16, 64)  # saved int64, cast


def test_lint_has_nothing_left_and_ignores_the_max_seed(verified):
    lint = record(verified, "lint")
    assert lint["findings"] == [] and lint["status"] == "passed"  # the -inf only seeds a Max: not flagged


def test_no_op_rebuild_and_a_changed_sample_reruns_only_what_reads_it(verified, tmp_path):
    project = Project(tmp_path / "project")
    shutil.copytree(verified.root, project.root)
    assert project.doit().executed == set()  # a copied build (mtimes kept) is up to date
    rng = np.random.default_rng(5)
    np.savez(project.path("models/hazards/samples/b_single.npz"),
             x=(20 + 0.3 * rng.standard_normal((1, 16, 64))).astype(np.float32), ids=rng.integers(0, 100, (1, 16)))
    executed = project.doit("simverify:hazards-SM8650", check=True).executed
    assert executed == {"cpucheck:hazards", "simulate:hazards-SM8650", "simverify:hazards-SM8650"}


# ================================================================ without the rewrites: each failure names its rewrite

def test_without_fold_if_export_fails_naming_it(tmp_path):
    project = packaged_project(tmp_path / "project", rewrites="[]")
    line = project.doit("export:hazards").failure_line("export:hazards")
    assert "[control-flow] If node 'mode_branch'" in line
    assert 'add "rewrites: [fold-if]" to graphs.hazards in models/hazards/model.yaml' in line
    project.edit(YAML, "    constant_inputs: {mode: 1}\n", "")
    line = project.doit("export:hazards").failure_line("export:hazards")
    assert f"{YAML}: source.file: hazards.onnx: input 'mode' of the ONNX is not declared" in line
    assert "graphs.hazards.constant_inputs" in line


def test_without_the_fallback_rewrites_context_fails_naming_them(tmp_path):
    project = packaged_project(tmp_path / "project", rewrites="[fold-if]")
    line = project.doit("context:hazards-SM8650").failure_line("context:hazards-SM8650")
    assert "2 node(s) of graph 'hazards' fall back to CPU on SM8650" in line
    assert "ReduceSumSquare 'energy' (add reduce-sum-square to graphs.hazards.rewrites in models/hazards/model.yaml" in line
    assert "Clip 'clip_at_half_peak' (its min/max is computed: add clip-computed to graphs.hazards.rewrites" in line
    lint = record(project, "lint")
    by_rule = {f["rule"]: f for f in lint["findings"]}
    assert set(by_rule) == {"variance-cancellation", "reduce-sum-square", "clip-computed", "pow-square"}
    assert by_rule["variance-cancellation"]["why"].startswith("accuracy")
    assert by_rule["reduce-sum-square"]["why"].startswith("speed")
    assert "add centred-variance to graphs.hazards.rewrites" in by_rule["variance-cancellation"]["fix"]
    assert lint["status"] == "warning"


def test_without_centred_variance_verification_fails_naming_it(tmp_path):
    project = packaged_project(tmp_path / "project", rewrites="[fold-if, reduce-sum-square, clip-computed]")
    line = project.doit("simverify:hazards-SM8650").failure_line("simverify:hazards-SM8650")
    assert "output 'y': cosine = " in line
    assert "lint warned of fp16 accuracy hazards: add centred-variance to graphs.hazards.rewrites" in line
    cosine = project.one_json(f"{GRAPH_DIR}/*/fp16/SM8650/simverify/simverify.json")["metrics"]["y"]["cosine"]
    assert cosine < 0.95  # measured 0.846: E[x^2] - E[x]^2 of values around 30 cancels in fp16


# ================================================================ graph-level sources, rewrites after an export.py

def test_two_graphs_from_two_files_of_one_package(tmp_path):
    """`source.file` per graph: a second graph of the same model folder takes another ONNX."""
    project = packaged_project(tmp_path / "project")
    folder = project.path("models/hazards")
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 4])
    neg = onnx.helper.make_graph([onnx.helper.make_node("Neg", ["x"], ["y"], name="flip")], "plain", [x], [y])
    onnx.save(onnx.helper.make_model(neg, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(folder / "plain.onnx"))
    np.save(folder / "plain_x.npy", np.arange(12, dtype=np.float32).reshape(3, 1, 4))  # a .npy: one input, 3 samples
    with open(folder / "model.yaml", "a") as fh:
        fh.write("  plain:\n"
                 "    source: {file: plain.onnx}\n"
                 "    inputs: {x: {shape: [1, 4], dtype: float32}}\n"
                 "    outputs: {y: {shape: [1, 4]}}\n"
                 "    rewrites: [neg]\n"
                 "    samples: {files: plain_x.npy}\n"
                 "    socs: [SM8650]\n")
    result = project.doit("cpucheck:plain", "export:hazards")
    assert result.returncode == 0, result.stdout + result.stderr
    export = json.loads(project.path("build/hazards/plain/export/export.json").read_text())
    assert export["source"]["file"] == "plain.onnx" and export["rewrites"][0]["sites"] == ["flip"]
    assert json.loads(project.path("build/hazards/plain/cpucheck/cpucheck.json").read_text())["samples"] == 3


def test_declared_rewrites_also_apply_to_an_export_py_graph(tmp_path):
    project = tiny_project(tmp_path / "p", EXPORT_POW, extra="    rewrites: [pow-square]\n")
    result = project.doit("export:tiny")
    assert result.returncode == 0, result.stdout + result.stderr
    export = json.loads(project.path("build/tinym/tiny/export/export.json").read_text())
    assert export["exported_by"] == "export.py" and export["rewrites"][0]["count"] == 1
    model = onnx.load(str(project.path("build/tinym/tiny/export/tiny.onnx")))
    assert [n.op_type for n in model.graph.node] == ["Mul"]


# ================================================================ spec errors

@pytest.fixture
def fresh(tmp_path) -> Project:
    return packaged_project(tmp_path / "project")


def assert_spec_error(project: Project, *fragments: str) -> str:
    result = project.doit("list")
    assert result.returncode == 0, (result.stdout, result.stderr)  # the model is unbuildable, not the project
    assert "spec " in result.stdout, result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    line = lines[0]
    assert line.startswith(f"error: {project.path(YAML)}: ") and "(fix: " in line, line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in: {line}"
    assert not project.path("build").exists()
    return line


SPEC_CASES = [
    pytest.param(f"    rewrites: {ALL_REWRITES}", "    rewrites: [fold-if, pow-squared]",
                 ["graphs.hazards.rewrites: unknown rewrite 'pow-squared'", "known rewrites: fold-if, if-to-where, centred-variance",
                  "pow-square"], id="unknown-rewrite"),
    pytest.param(f"    rewrites: {ALL_REWRITES}", "    rewrites: [{finite-mask: {value: -1.0e9}}]",
                 ["graphs.hazards.rewrites", "finite-mask value must be a negative number >= -65504"], id="bad-rewrite-option"),
    pytest.param('samples: {files: "samples/*.npz"}', 'samples: {files: "recordings/*.npz"}',
                 ["graphs.hazards.samples.files", "'recordings/*.npz' matches no .npz/.npy file"], id="samples-match-nothing"),
    pytest.param('samples: {files: "samples/*.npz"}', 'samples: "samples/*.npz"',
                 ["graphs.hazards.samples: expected a mapping, got 'samples/*.npz'", 'samples: {files: "samples/*.npz"}'],
                 id="samples-not-a-mapping"),
    pytest.param('samples: {files: "samples/*.npz"}', 'samples: {file: "samples/*.npz"}',
                 ["graphs.hazards.samples.file: unknown key"], id="samples-unknown-key"),
    pytest.param('samples: {files: "samples/*.npz"}', 'samples: {files: "../../socs/*.npz"}',
                 ["graphs.hazards.samples.files", "'../../socs/*.npz' leaves the model folder", "without '..'"],
                 id="samples-escape"),
    pytest.param("source: {file: hazards.onnx}", "source: {file: ../hazards.onnx}",
                 ["source.file: '../hazards.onnx' leaves the model folder"], id="source-file-dotdot"),
    pytest.param("source: {file: hazards.onnx}", "source: {file: /etc/hazards.onnx}",
                 ["source.file: '/etc/hazards.onnx' leaves the model folder"], id="source-file-absolute"),
    pytest.param("    constant_inputs:", "    source: {file: ../../x.onnx}\n    constant_inputs:",
                 ["graphs.hazards.source.file: '../../x.onnx' leaves the model folder"], id="graph-source-escape"),
    pytest.param("source: {file: hazards.onnx}", "source: {package: numpy, file: ../../etc/passwd.onnx}",
                 ["source.file: '../../etc/passwd.onnx' leaves package 'numpy'"], id="package-file-escape"),
    pytest.param("source: {file: hazards.onnx}", "source: {file: hazards.safetensors}",
                 ["source.file: 'hazards.safetensors' is not an .onnx file, and there is no export.py",
                  "add export.py whose export() converts it"], id="source-not-onnx"),
    pytest.param("    constant_inputs:", "    simplify: {skip_optimizers: [fuse_preceeding_mul_into_conv]}\n    constant_inputs:",
                 ["graphs.hazards.simplify.skip_optimizers: unknown onnxsim optimizer 'fuse_preceeding_mul_into_conv'",
                  "did you mean fuse_preceding_mul_into_conv?"], id="unknown-skip-optimizer"),
    pytest.param("    constant_inputs:", "    simplify: {skip_optimizers: [no_such_pass]}\n    constant_inputs:",
                 ["unknown onnxsim optimizer 'no_such_pass'", "use one of: eliminate_common_subexpression"],
                 id="unknown-skip-optimizer-no-close-match"),
    pytest.param("    constant_inputs:", "    export: export_encoder\n    constant_inputs:",
                 ["graphs.hazards.export: names function 'export_encoder' of an export.py, but there is no export.py"],
                 id="export-function-without-export-py"),
    pytest.param("constant_inputs: {mode: 1}", "constant_inputs: {x: 1}",
                 ["graphs.hazards.constant_inputs.x: is also declared under inputs"], id="constant-input-also-input"),
    pytest.param("constant_inputs: {mode: 1}", "constant_inputs: {mode: one}",
                 ["graphs.hazards.constant_inputs.mode: expected a number or a list of numbers"], id="constant-input-nan"),
]


@pytest.mark.parametrize("old, new, fragments", SPEC_CASES)
def test_spec_errors(fresh, old, new, fragments):
    fresh.edit(YAML, old, new)
    assert_spec_error(fresh, *fragments)


def test_non_onnx_source_file_named_at_export(fresh):
    """An .onnx that is not ONNX: the stage names the file and its model.yaml key (not a bare DecodeError)."""
    fresh.path("models/hazards/hazards.onnx").write_bytes(b"\x08\x07 not protobuf at all \xff\xfe" * 8)
    line = fresh.doit("export:hazards").failure_line("export:hazards")
    assert f"{YAML}: source.file: models/hazards/hazards.onnx is not an ONNX model" in line
    assert "(fix: point it at an .onnx file" in line


def test_source_file_symlink_outside_the_model_folder(fresh, tmp_path):
    """`source.file: hazards.onnx` that is a symlink to a file elsewhere: the path looks inside, the file is not."""
    onnx_file = fresh.path("models/hazards/hazards.onnx")
    outside = tmp_path / "elsewhere.onnx"
    onnx_file.rename(outside)
    onnx_file.symlink_to(outside)
    assert_spec_error(fresh, f"source.file: hazards.onnx leads through a symlink to {outside}, outside the model "
                      "folder", "copy the file into the model folder")


def test_sample_file_symlink_outside_the_model_folder(fresh, tmp_path):
    sample = min(fresh.path("models/hazards/samples").glob("*.npz"))
    outside = tmp_path / "elsewhere.npz"
    sample.rename(outside)
    sample.symlink_to(outside)
    assert_spec_error(fresh, f"graphs.hazards.samples.files: samples/{sample.name} leads through a symlink "
                      f"to {outside}, outside the model folder")


@pytest.mark.parametrize("content, problem", [
    pytest.param(b"", "is empty (0 bytes), not an ONNX model", id="empty"),
    pytest.param(b"\x78\x01", "is not an ONNX model (it holds no graph or IR version)", id="protobuf-but-no-model"),
])
def test_empty_or_foreign_source_file_is_named(tmp_path, content, problem):
    """main: a 0-byte ONNX loads as an empty model, then 'input x ... is not an input of the ONNX; its inputs: none'."""
    from qnn_tasks.graphs.packaged import load_source

    source = tmp_path / "model.onnx"
    source.write_bytes(content)
    with pytest.raises(StageError) as info:
        load_source(sample_graph(tmp_path, ["*.npz"]), source)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'model.yaml'}: source.file: {source} {problem}"), message
    assert "(fix: point it at an .onnx file" in message and "\n" not in message


def test_symlinks_out_of_the_model_folder_are_refused_when_read_too(tmp_path):
    """The spec cache does not see a symlink made after it was written: the stages check again when they read."""
    from qnn_tasks.graphs.packaged import load_source

    folder, outside = tmp_path / "model", tmp_path / "elsewhere"
    folder.mkdir()
    outside.mkdir()
    np.savez(outside / "s.npz", x=np.zeros((1, 4), np.float32), ids=np.zeros((1, 4), np.int32))
    (outside / "m.onnx").write_bytes(b"\x08\x07")
    (folder / "s.npz").symlink_to(outside / "s.npz")
    (folder / "m.onnx").symlink_to(outside / "m.onnx")
    graph = sample_graph(folder, ["*.npz"])
    with pytest.raises(StageError, match=r"s\.npz leads through a symlink to .*elsewhere/s\.npz, outside the model"):
        read_declared(graph)
    with pytest.raises(StageError, match=r"m\.onnx leads through a symlink to .*elsewhere/m\.onnx, outside the model"):
        load_source(graph, folder / "m.onnx")


def test_non_finite_samples_from_export_py_name_the_sample():
    from qnn_tasks.judge.sample_store import check

    specs = (TensorSpec("x", (1, 4), "float32"),)
    with pytest.raises(StageError, match=r"^export.py:samples\(\): sample 1 'x' holds 1 NaN/Inf values \(fix: "):
        check([{"x": np.zeros((1, 4), np.float32)}, {"x": np.array([[0, 0, np.nan, 0]], np.float32)}], specs,
              "export.py:samples()")


def test_spec_loading_imports_no_onnx(fresh):
    code = ("import sys; from pathlib import Path; from qnn_tasks.modelspec.load import load_project; "
            f"p = load_project(Path({str(fresh.root)!r})); g = p.graphs()[0]; "
            "assert g.rewrites and g.samples and not g.has_code, g; "
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxruntime', 'torch', 'numpy')]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=fresh.root)


# ================================================================ export.py: errors at the user's line, chatter in export.log

MODEL_YAML = """\
licence: MIT
source: {package: numpy}
graphs:
  tiny:
    inputs:
      x: {shape: [1, 4], dtype: float32}
    outputs:
      y: {shape: [1, OUT]}
    socs: [SM8650]
"""
EXPORT_COMMON = '''\
import os
import numpy as np
import onnx
from onnx import TensorProto, helper


def samples(ctx):
    return [{"x": np.full((1, 4), i, np.float32)} for i in range(2)]


def reference(ctx, inputs):
    return [{"y": s["x"].copy()} for s in inputs]
'''
EXPORT_POW = '''
def export(ctx):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Pow", ["x", "two"], ["y"])], "tiny", [x], [y], [two])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(ctx.out_path))
'''
EXPORT_INTO_ONNX = '''
def export(ctx):
    model = onnx.load(str(ctx.out_path) + ".missing")  # USER LINE: fails deep inside onnx
'''
EXPORT_WRONG_SHAPE = '''
def export(ctx):
    # y is declared [1, 213] (as model.yaml says) but the graph computes [1, 1]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 213])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=1), helper.make_node("Div", ["s", "two"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [two])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(ctx.out_path))
'''
EXPORT_CHATTY = '''
def export(ctx):
    import torch

    for i in range(150):
        print(f"exporter chatter {i}")
    os.write(2, b"native stderr chatter\\n")
    with torch.no_grad():
        torch.onnx.export(torch.nn.Linear(4, 4), (torch.zeros(1, 4),), str(ctx.out_path), input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False, verbose=True)
'''


def tiny_project(root: Path, export: str, out: int = 4, extra: str = "") -> Project:
    root.mkdir(parents=True)
    for name in ("dodo.py", "socs", "toolchain"):
        (shutil.copytree if (EXAMPLES / name).is_dir() else shutil.copy2)(EXAMPLES / name, root / name)
    model = root / "models" / "tinym"
    model.mkdir(parents=True)
    (model / "model.yaml").write_text(MODEL_YAML.replace("OUT", str(out)) + extra)
    (model / "export.py").write_text(EXPORT_COMMON + export)
    return Project(root)


def test_export_error_points_at_the_users_line(tmp_path):
    project = tiny_project(tmp_path / "p", EXPORT_INTO_ONNX)
    line = project.doit("export:tiny").failure_line("export:tiny")
    text = project.path("models/tinym/export.py").read_text().splitlines()
    user_line = next(i for i, t in enumerate(text, 1) if "USER LINE" in t)
    assert f"(at export.py:{user_line})" in line, line  # not a frame inside onnx
    assert "FileNotFoundError" in line
    log = project.path("build/tinym/tiny/export/export.log")
    assert "exporter output and traceback: build/tinym/tiny/export/export.log" in line
    assert "Traceback" in log.read_text() and "onnx" in log.read_text()


def test_wrong_declared_output_shape_caught_at_export(tmp_path):
    project = tiny_project(tmp_path / "p", EXPORT_WRONG_SHAPE, out=213)
    line = project.doit("export:tiny").failure_line("export:tiny")
    assert "output 'y' is [1, 1] when run on CPU, model.yaml says [1, 213]" in line
    assert "graphs.tiny.outputs.y.shape in models/tinym/model.yaml" in line
    assert not project.path("build/tinym/tiny/export/tiny.onnx").exists()


def test_exporter_chatter_goes_to_export_log(tmp_path):
    project = tiny_project(tmp_path / "p", EXPORT_CHATTY)
    result = project.doit("export:tiny")
    assert result.returncode == 0, result.stdout + result.stderr
    console = result.stdout + result.stderr
    assert "exporter chatter" not in console and "native stderr chatter" not in console
    assert "graph(" not in console.lower()  # torch's verbose IR dump
    log = project.path("build/tinym/tiny/export/export.log").read_text()
    assert "exporter chatter 149" in log and "native stderr chatter" in log
    assert "%y" in log or "graph(" in log.lower()  # the verbose IR dump landed here
    assert json.loads(project.path("build/tinym/tiny/export/export.json").read_text())["log"].endswith("export.log")


# ================================================================ the sample-file format

def sample_graph(folder: Path, files: list[str]) -> GraphSpec:
    return GraphSpec(name="g", model="m", model_dir=folder, precisions=("fp16",), socs=None, export="export",
                     inputs=(TensorSpec("x", (1, 4), "float32"), TensorSpec("ids", (1, 4), "int32")),
                     outputs=(TensorSpec("y", (1, 4), "float32"),), options={}, verify={},
                     allow_cpu_fallback=False, samples={"files": files}, has_code=False)


def test_sample_files_a_folder_stacks_singles_and_casts(tmp_path):
    folder = tmp_path / "samples"
    folder.mkdir()
    np.savez(folder / "b.npz", x=np.ones((2, 1, 4), np.float64), ids=np.arange(8).reshape(2, 1, 4))  # a stack of 2
    np.savez(folder / "a.npz", x=np.zeros((1, 4), np.float32), ids=np.zeros((1, 4), np.int32))     # one sample
    (folder / "notes.txt").write_text("not a sample")
    loaded = read_declared(sample_graph(tmp_path, ["samples"]))  # a folder: its .npz/.npy files, by name
    assert len(loaded) == 3 and loaded[0]["x"].sum() == 0 and loaded[1]["x"].sum() == 4
    assert all(s["x"].dtype == np.float32 and s["ids"].dtype == np.int32 and s["ids"].shape == (1, 4) for s in loaded)


@pytest.mark.parametrize("arrays, problem", [
    ({"x": np.zeros((1, 5), np.float32), "ids": np.zeros((1, 4), np.int32)}, "'x' has shape [1, 5]; model.yaml declares [1, 4]"),
    ({"x": np.zeros((1, 4), np.float32)}, "holds arrays ['x'], model.yaml declares inputs ['ids', 'x']"),
    ({"x": np.zeros((1, 4), np.float32), "ids": np.full((1, 4), 2**40)}, "'ids' has dtype int64, model.yaml declares int32"),
    ({"x": np.zeros((2, 1, 4), np.float32), "ids": np.zeros((3, 1, 4), np.int32)}, "stack different numbers of samples [2, 3]"),
    ({"x": np.zeros((1, 4), np.complex64), "ids": np.zeros((1, 4), np.int32)}, "'x' has dtype complex64"),
    ({"x": np.array([[[0, 0, 0, 0]], [[0, np.nan, np.inf, 0]]], np.float32), "ids": np.zeros((2, 1, 4), np.int32)},
     "'x' holds 2 NaN/Inf values (first in sample 1)"),
])
def test_sample_files_bad_content_is_one_line(tmp_path, arrays, problem):
    np.savez(tmp_path / "s.npz", **arrays)
    with pytest.raises(StageError) as info:
        read_declared(sample_graph(tmp_path, ["*.npz"]))
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'model.yaml'}: graphs.g.samples: s.npz: ") and problem in message, message
    assert "(fix: " in message and "\n" not in message
