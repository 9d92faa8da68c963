"""The ort-qnn toolchain stages (config, context) end to end: real compiles, real doit, no mocks.

Every binary here is compiled by the installed `onnxruntime-qnn` wheel (QNN 2.51, offline HTP
compile for SM8650/v75 and SM8750/v79) and read back through libQnnSystem. Only `config` and
`context` run (never `simverify`/`report`), and only for the two restricted chips, to keep this
file short.

* the example models compile; files, records and what the binary says about itself;
* a chip that cannot run the graph's precision is skipped visibly and compiles nothing;
* CPU fallback: `tests/models/gelu-conv` (Conv1d -> GELU -> Conv1d) loses its GELU to onnxsim's
  fuse_preceding_mul_into_conv; the Erf left over runs on CPU and fails the build, until the
  optimizer is skipped (passes) or the fallback is allowed (passes with a warning);
* a toolchain version/option change reruns exactly config + context, never the graph stages,
  and a new version builds into its own tree. The version change runs doit in-process with
  `installed_versions` patched: that changes the fingerprint only; the compiles are real;
* bad input: the wheel missing, a compile that crashes (a bad soc_model);
* `socscheck` against the real SoC table and against a wrong row.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from conftest import EXAMPLES, GRAPH_STAGES, DoitResult, Project, copy_project, only_fp16
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain

import qnn_tasks.tasks
import qnn_tasks.toolchains.ort_qnn as ort_qnn
from qnn_tasks import toolchains
from qnn_tasks.modelspec.load import load_soc_table, load_socs, load_toolchain

TESTS = Path(__file__).resolve().parent
GELU_FIXTURE = TESTS / "models" / "gelu-conv"
GELU_YAML = "models/gelu-conv/model.yaml"
GELU = "gelu_conv"
GELU_CONTEXT = f"context:{GELU}-SM8650"
VAD_YAML = "models/silero-vad/model.yaml"
PROFILE = "toolchain/ort-qnn.yaml"

GRAPHS = {"vad": "silero-vad", "minilm": "minilm"}  # graph -> model folder
SOCS = {"SM8650": (57, "v75"), "SM8750": (69, "v79")}  # the chips built_graphs is restricted to
# model.yaml's I/O, in its order: (name, dtype, shape)
IO = {
    "vad": ([("input", "float32", [1, 576]), ("state", "float32", [2, 1, 128])],
            [("output", "float32", [1, 1]), ("stateN", "float32", [2, 1, 128])]),
    "minilm": ([("input_ids", "int32", [1, 64]), ("attention_mask", "int32", [1, 64])],
               [("embedding", "float32", [1, 384])]),
}
GRAPH_TASKS = {f"{stage}:{graph}" for stage in GRAPH_STAGES for graph in GRAPHS}
CHIP_TASKS = {f"{stage}:{graph}-{soc}" for stage in ("config", "context") for graph in GRAPHS for soc in SOCS}
BUILD_STAGES = [*GRAPH_STAGES, "config", "context"]  # everything but simverify and report

REAL_INSTALLED_VERSIONS = ort_qnn.installed_versions
VERSIONS = REAL_INSTALLED_VERSIONS()
TOOLCHAIN_ID = f"ort-qnn-{VERSIONS['onnxruntime-qnn']}-qnn{VERSIONS['qnn']}-ort{VERSIONS['onnxruntime']}"


# ================================================================ helpers

def chip_dir(project: Project, graph: str, soc: str, toolchain_id: str = TOOLCHAIN_ID) -> Path:
    model = GRAPHS.get(graph, "gelu-conv")
    return project.root / "build" / model / graph / toolchain_id / "fp16" / soc


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def ctx_files(context_dir: Path, graph: str) -> list[Path]:
    return [context_dir / f"{graph}_ctx.onnx", context_dir / f"{graph}_ctx_qnn.bin"]


def doit_in_process(root: Path, *args: str, out: Path) -> DoitResult:
    """doit in this process (so a test can patch what the toolchain reads), from the project's tasks.

    The report goes to a file (`--output-file`): doit's default output stream is the sys.stdout of
    the moment doit.cmd_run was imported, which pytest's capsys does not necessarily see.
    The caller must chdir to `root` first: task paths are relative to the project root.
    """
    namespace = qnn_tasks.tasks.project_tasks(root)
    code = DoitMain(ModuleTaskLoader(namespace), config_filenames=()).run(["--output-file", str(out), *args])
    return DoitResult(code, out.read_text(), "")


# ================================================================ 1. real compiles of the examples

@pytest.fixture(scope="module")
def compiled(built_graphs, tmp_path_factory) -> Project:
    """A copy of the built examples with `doit config context` run once (4 real compiles)."""
    project = copy_project(tmp_path_factory.mktemp("ort-qnn") / "project", source=built_graphs.root, with_build=True)
    only_fp16(project)
    project.first_run = project.doit("config", "context")
    return project


def test_toolchain_id_carries_the_installed_versions():
    assert VERSIONS["onnxruntime-qnn"] and VERSIONS["onnxruntime"], VERSIONS
    assert VERSIONS["qnn"].startswith("2.51"), VERSIONS  # the wheel bundles QNN 2.51
    toolchain = toolchains.from_profile(load_toolchain(EXAMPLES, "ort-qnn"))
    assert toolchain.id() == TOOLCHAIN_ID
    assert toolchain.fingerprint() == {"kind": "ort-qnn", **VERSIONS,
                                       "options": {"htp_graph_finalization_optimization_mode": "3"}}


def test_config_context_compiles_every_example_for_both_chips(compiled):
    result = compiled.first_run
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    # The graph stages were built by built_graphs: the copy's config/context are the only work.
    assert result.executed == CHIP_TASKS, result.stdout
    assert not result.executed & GRAPH_TASKS
    # Only one toolchain tree per graph.
    for graph, model in GRAPHS.items():
        trees = sorted(p.name for p in (compiled.root / "build" / model / graph).glob("ort-qnn-*"))
        assert trees == [TOOLCHAIN_ID]


def test_second_run_is_up_to_date(compiled):
    result = compiled.doit("config", "context")
    assert result.returncode == 0, result.stderr
    assert result.executed == set(), result.stdout
    assert CHIP_TASKS <= result.uptodate


@pytest.mark.parametrize("soc", sorted(SOCS))
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_context_artifacts_and_record(compiled, graph, soc):
    soc_id, arch = SOCS[soc]
    base = chip_dir(compiled, graph, soc)
    rel_context = base.relative_to(compiled.root) / "context"

    options = read_json(base / "config" / "provider_options.json")
    assert options == {"htp_graph_finalization_optimization_mode": "3", "soc_model": str(soc_id), "vtcm_mb": "8"}
    config = read_json(base / "config" / "config.json")
    assert config["status"] == "passed" and config["provider_options"] == options

    context = base / "context"
    ctx_onnx, bin_path = ctx_files(context, graph)
    assert ctx_onnx.is_file() and bin_path.is_file()
    assert (context / "compile.log").is_file()
    assert not (context / ".staging").exists()
    assert f"for {soc} (soc_model {soc_id}) with {TOOLCHAIN_ID}" in (context / "compile.log").read_text()

    rec = read_json(context / "context.json")
    assert rec["stage"] == "context" and rec["target"] == f"{graph}-{soc}"
    assert rec["status"] == "passed" and rec["warnings"] == [] and "error" not in rec
    assert rec["soc"] == {"name": soc, "soc_id": soc_id, "dsp_arch": arch, "vtcm_mb": 8, "fp16": True}
    assert rec["toolchain"] == {"id": TOOLCHAIN_ID, "profile": "ort-qnn", "kind": "ort-qnn", **VERSIONS,
                                "options": {"htp_graph_finalization_optimization_mode": "3"}}
    assert rec["provider_options"] == options
    binary = rec["binary"]
    assert binary["soc_model"] == soc_id
    assert binary["dsp_arch"] == arch
    assert binary["context_metadata"] == [1, int(arch[1:])]
    assert binary["build_id"].startswith("v2.51") and binary["build_id"].startswith(f"v{VERSIONS['qnn']}")
    assert binary["path"] == str(rel_context / bin_path.name)
    assert rec["partition"]["cpu_nodes"] == []
    assert rec["partition"]["npu_partitions"] == 1
    assert rec["bin_size"] == bin_path.stat().st_size > 0
    assert 0 < rec["compile_seconds"] <= rec["seconds"]
    assert rec["log"] == str(rel_context / "compile.log")

    # The compiled ONNX is one EPContext node pointing at the .bin beside it, with the graph's I/O.
    model = onnx.load(str(ctx_onnx), load_external_data=False)
    assert [n.op_type for n in model.graph.node] == ["EPContext"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in model.graph.node[0].attribute}
    assert attrs["ep_cache_context"] == bin_path.name.encode()
    assert attrs["embed_mode"] == 0
    inputs, outputs = IO[graph]
    assert [i.name for i in model.graph.input] == [name for name, _, _ in inputs]
    assert [o.name for o in model.graph.output] == [name for name, _, _ in outputs]


@pytest.mark.parametrize("soc", sorted(SOCS))
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_qnnbin_cli_reads_the_compiled_binary(compiled, graph, soc):
    soc_id, arch = SOCS[soc]
    bin_path = ctx_files(chip_dir(compiled, graph, soc) / "context", graph)[1]
    proc = subprocess.run([sys.executable, "-m", "qnn_tasks.qnn.binary", str(bin_path), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["soc_model"] == soc_id and info["dsp_arch"] == arch
    # One QNN graph, named by the EP after its partition (not after the ONNX graph).
    assert len(info["graphs"]) == 1
    qnn_graph = info["graphs"][0]
    assert qnn_graph["name"].startswith("QNNExecutionProvider_")
    # What is real with this EP: the ONNX I/O names, their order (model.yaml's), dtypes and shapes are
    # kept as they are -- the int32 MiniLM inputs stay int32 and the float32 I/O is not turned into
    # fp16 at the boundary (the fp16 precision is inside the graph); nothing is quantized.
    inputs, outputs = IO[graph]
    assert [(t["name"], t["dtype"], t["shape"]) for t in qnn_graph["inputs"]] == inputs
    assert [(t["name"], t["dtype"], t["shape"]) for t in qnn_graph["outputs"]] == outputs
    assert all(t["quantization"] is None for t in qnn_graph["inputs"] + qnn_graph["outputs"])
    # and the context record holds the same inspection (only the path differs: absolute here)
    rec = read_json(chip_dir(compiled, graph, soc) / "context" / "context.json")
    assert {**info, "path": None} == {**rec["binary"], "path": None}


# ================================================================ 2. skipped chips

def test_chip_without_fp16_is_skipped_visibly_and_compiles_nothing(tmp_path):
    project = copy_project(tmp_path / "fresh")  # the real table, no socs restriction
    assert load_socs(project.path("socs/socs.yaml"))["SM8350"].fp16 is False
    listing = project.doit("list", "--all")
    assert listing.returncode == 0, listing.stderr
    docs = dict(line.split(None, 1) for line in listing.stdout.splitlines())
    for stage in ("config", "context", "simulate", "simverify"):
        doc = docs[f"{stage}:vad-SM8350"]
        assert doc.startswith("SKIPPED: "), doc
        assert "fp16" in doc and "v68" in doc, doc

    result = project.doit("context:vad-SM8350")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert result.executed == {"context:vad-SM8350"}, result.stdout  # no export, simplify, config ...
    record_path = chip_dir(project, "vad", "SM8350") / "context" / "context.json"
    rec = read_json(record_path)
    assert rec["status"] == "skipped" and rec["target"] == "vad-SM8350"
    assert "fp16" in rec["reason"] and "v68" in rec["reason"]
    assert rec["soc"]["name"] == "SM8350" and "error" not in rec
    # nothing was compiled, or even exported: the record is the only file in build/ (but the tree's lock)
    assert [p for p in project.path("build").rglob("*") if p.is_file() and p.name != ".qnn-lock"] == [record_path]
    assert project.doit("context:vad-SM8350").uptodate == {"context:vad-SM8350"}


# ================================================================ 3. CPU fallback: gelu-conv

def gelu_project(root: Path, extra_graph_keys: str = "") -> Project:
    """A fresh project whose only model is tests/models/gelu-conv (socs: [SM8650] in its model.yaml).

    The example models are removed (nothing else to build); `restrict_socs` is not needed then,
    and would add a second `socs:` key to the fixture's model.yaml.
    """
    project = copy_project(root)
    for model in GRAPHS.values():
        shutil.rmtree(project.path(f"models/{model}"))
    shutil.copytree(GELU_FIXTURE, project.path("models/gelu-conv"), ignore=shutil.ignore_patterns("__pycache__"))
    if extra_graph_keys:
        project.edit(GELU_YAML, "    socs: [SM8650]\n", "    socs: [SM8650]\n" + extra_graph_keys)
    return project


@pytest.fixture(scope="module")
def gelu_failed(tmp_path_factory) -> Project:
    project = gelu_project(tmp_path_factory.mktemp("gelu-failed") / "project")
    project.result = project.doit(GELU_CONTEXT)
    return project


@pytest.fixture(scope="module")
def gelu_allowed(tmp_path_factory) -> Project:
    project = gelu_project(tmp_path_factory.mktemp("gelu-allowed") / "project", "    allow_cpu_fallback: true\n")
    project.result = project.doit(GELU_CONTEXT)
    return project


@pytest.fixture(scope="module")
def gelu_refailed(gelu_allowed, tmp_path_factory) -> Project:
    """gelu_allowed's built copy, with allow_cpu_fallback removed again and the context rebuilt."""
    project = copy_project(tmp_path_factory.mktemp("gelu-refailed") / "project", source=gelu_allowed.root,
                           with_build=True)
    project.edit(GELU_YAML, "    allow_cpu_fallback: true\n", "")
    project.result = project.doit(GELU_CONTEXT)
    return project


def test_gelu_fixture_exports_a_whole_gelu(gelu_failed):
    # What torch.onnx.export (opset 17) writes: x * 0.5 * (1 + Erf(x / sqrt 2)) between two Convs.
    exported = onnx.load(str(gelu_failed.path(f"build/gelu-conv/{GELU}/export/{GELU}.onnx")))
    ops = [n.op_type for n in exported.graph.node]
    assert ops.count("Conv") == 2 and ops.count("Erf") == 1 and ops.count("Mul") == 2, ops


def test_cpu_fallback_fails_the_build_naming_the_node_and_the_fix(gelu_failed):
    result = gelu_failed.result
    assert GELU_CONTEXT in result.executed, result.stdout
    line = result.failure_line(GELU_CONTEXT)
    assert "1 node(s) of graph 'gelu_conv' fall back to CPU on SM8650" in line
    assert "Erf '/Erf'" in line  # the op type and the node's name
    assert "add simplify: {skip_optimizers: [fuse_preceding_mul_into_conv]}" in line  # the hint for Erf
    assert "set allow_cpu_fallback: true" in line

    context = chip_dir(gelu_failed, GELU, "SM8650") / "context"
    rec = read_json(context / "context.json")
    assert rec["status"] == "failed"
    assert rec["error"] in line
    nodes = rec["partition"]["cpu_nodes"]
    assert [(n["name"], n["op_type"]) for n in nodes] == [("/Erf", "Erf")]
    assert "fuse_preceding_mul_into_conv" in nodes[0]["hint"]
    assert rec["partition"]["npu_partitions"] == 2  # the CPU Erf cuts the graph in two NPU partitions
    # no half artifacts: the compiled pair stays in the (removed) staging dir
    for path in ctx_files(context, GELU):
        assert not path.exists(), path
    assert not (context / ".staging").exists()
    assert sorted(p.name for p in context.iterdir()) == ["compile.log", "context.json"]


def test_lint_warned_about_the_erf_before_the_compile(gelu_failed):
    lint = read_json(gelu_failed.path(f"build/gelu-conv/{GELU}/lint/lint.json"))
    erf = [f for f in lint["findings"] if f["rule"] == "erf"]
    assert len(erf) == 1 and erf[0]["severity"] == "warning", lint["findings"]
    assert erf[0]["where"] == "Erf node '/Erf'"
    assert "fuse_preceding_mul_into_conv" in erf[0]["fix"]
    assert lint["status"] == "warning"
    assert lint["op_counts"]["Mul"] == 1  # onnxsim folded GELU's x0.5 Mul into the second Conv
    # on the console: the stage's line, then each warning on one line with its fix
    lines = gelu_failed.result.stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"lint:{GELU}: warning in "))
    assert lines[at + 1].startswith("  warning: [erf] Erf node '/Erf': ") and "(fix: " in lines[at + 1]


def test_failed_context_record_names_no_removed_file(gelu_failed):
    rec = read_json(chip_dir(gelu_failed, GELU, "SM8650") / "context" / "context.json")
    assert rec["status"] == "failed"
    path = rec.get("binary", {}).get("path")
    assert path is None or gelu_failed.path(path).is_file(), path


def test_skipping_the_folding_optimizer_keeps_gelu_on_the_npu(tmp_path):
    project = gelu_project(tmp_path / "project", "    simplify: {skip_optimizers: [fuse_preceding_mul_into_conv]}\n")
    result = project.doit(GELU_CONTEXT, f"cpucheck:{GELU}")  # cpucheck: the fixture's samples/reference work
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert {GELU_CONTEXT, f"cpucheck:{GELU}"} <= result.executed
    context = chip_dir(project, GELU, "SM8650") / "context"
    rec = read_json(context / "context.json")
    assert rec["status"] == "passed" and rec["warnings"] == []
    assert rec["partition"]["cpu_nodes"] == [] and rec["partition"]["npu_partitions"] == 1
    assert all(path.is_file() for path in ctx_files(context, GELU))
    assert read_json(project.path(f"build/gelu-conv/{GELU}/simplify/simplify.json"))["skipped_optimizers"] == [
        "fuse_preceding_mul_into_conv"]
    lint = read_json(project.path(f"build/gelu-conv/{GELU}/lint/lint.json"))
    assert not [f for f in lint["findings"] if f["rule"] == "erf"]
    assert lint["op_counts"]["Erf"] == 1 and lint["op_counts"]["Mul"] == 2  # the whole GELU is kept
    cpucheck = read_json(project.path(f"build/gelu-conv/{GELU}/cpucheck/cpucheck.json"))
    assert cpucheck["status"] == "passed" and cpucheck["samples"] >= 2


def test_allowed_cpu_fallback_passes_with_a_warning(gelu_allowed):
    result = gelu_allowed.result
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    context = chip_dir(gelu_allowed, GELU, "SM8650") / "context"
    rec = read_json(context / "context.json")
    assert rec["status"] == "warning" and "error" not in rec
    assert len(rec["warnings"]) == 1
    warning = rec["warnings"][0]
    assert "1 node(s) of graph 'gelu_conv' fall back to CPU on SM8650: Erf '/Erf'" in warning
    assert "fuse_preceding_mul_into_conv" in warning
    assert [n["op_type"] for n in rec["partition"]["cpu_nodes"]] == ["Erf"]
    ctx_onnx, bin_path = ctx_files(context, GELU)
    assert bin_path.is_file()
    # the compiled model really keeps the Erf outside the NPU partitions
    ops = [n.op_type for n in onnx.load(str(ctx_onnx), load_external_data=False).graph.node]
    assert sorted(ops) == ["EPContext", "EPContext", "Erf"]


def test_disallowing_the_fallback_again_reruns_only_context_and_fails(gelu_refailed):
    result = gelu_refailed.result
    # allow_cpu_fallback is in the context key only: no other stage re-runs
    assert result.executed == {GELU_CONTEXT}, result.stdout
    line = result.failure_line(GELU_CONTEXT)
    assert "Erf '/Erf'" in line
    rec = read_json(chip_dir(gelu_refailed, GELU, "SM8650") / "context" / "context.json")
    assert rec["status"] == "failed"


def test_failed_rebuild_leaves_no_previous_binary(gelu_refailed):
    context = chip_dir(gelu_refailed, GELU, "SM8650") / "context"
    assert read_json(context / "context.json")["status"] == "failed"
    for path in ctx_files(context, GELU):
        assert not path.exists(), f"{path} left from the earlier build beside a failed record"


# ================================================================ 4. toolchain changes

@pytest.fixture
def qnn_ep_in_process(monkeypatch) -> None:
    """For compiles in this process: ort_qnn.ep_devices() registers the QNN EP library on its first
    call and fails if other code in the process registered it before (tests/test_qnnbin.py does, if it
    runs first). Tell it so; the bug itself is test_ep_devices_when_the_ep_is_already_registered."""
    import onnxruntime as ort

    if any(d.ep_name == ort_qnn.EP_NAME for d in ort.get_ep_devices()):
        monkeypatch.setattr(ort_qnn, "_REGISTERED", True)


@pytest.mark.slow
@pytest.mark.usefixtures("qnn_ep_in_process")
def test_toolchain_version_change_reruns_exactly_the_toolchain_stages(compiled, tmp_path, monkeypatch):
    project = copy_project(tmp_path / "project", source=compiled.root, with_build=True)
    monkeypatch.chdir(project.root)
    old = {p: (p.stat().st_mtime_ns, md5(p))
           for g in GRAPHS for s in SOCS for p in ctx_files(chip_dir(project, g, s) / "context", g)}
    assert len(old) == 8 and all(p.is_file() for p in old)

    # A newer wheel, as far as the fingerprint can tell (the compiler itself is the installed one).
    bumped = {**VERSIONS, "onnxruntime-qnn": f"{VERSIONS['onnxruntime-qnn']}.post1"}
    new_id = f"ort-qnn-{bumped['onnxruntime-qnn']}-qnn{bumped['qnn']}-ort{bumped['onnxruntime']}"
    monkeypatch.setattr(ort_qnn, "installed_versions", lambda *_: dict(bumped))
    result = doit_in_process(project.root, *BUILD_STAGES, out=tmp_path / "bumped.txt")
    assert result.returncode == 0, result.stdout
    assert result.executed == CHIP_TASKS, result.stdout
    assert result.uptodate == GRAPH_TASKS, result.stdout

    for graph in GRAPHS:
        for soc, (soc_id, arch) in SOCS.items():
            context = chip_dir(project, graph, soc, new_id) / "context"
            assert all(p.is_file() for p in ctx_files(context, graph))
            rec = read_json(context / "context.json")
            assert rec["status"] == "passed"
            assert rec["toolchain"]["id"] == new_id and rec["toolchain"]["onnxruntime-qnn"] == bumped["onnxruntime-qnn"]
            assert rec["binary"]["soc_model"] == soc_id and rec["binary"]["dsp_arch"] == arch
            assert read_json(chip_dir(project, graph, soc, new_id) / "config" / "provider_options.json")[
                "soc_model"] == str(soc_id)
    # the old tree is untouched
    assert {p: (p.stat().st_mtime_ns, md5(p)) for p in old} == old
    for graph in GRAPHS:
        assert read_json(chip_dir(project, graph, "SM8650") / "context" / "context.json")["toolchain"]["id"] == TOOLCHAIN_ID
    assert doit_in_process(project.root, *BUILD_STAGES, out=tmp_path / "bumped-again.txt").executed == set()

    # Back to the real versions. doit's config_changed keeps ONE value per task (the last one), and
    # the task names do not carry the toolchain id, so every config/context task sees a changed key
    # and rebuilds once into the old id's tree; the graph stages stay up to date. Both trees remain.
    monkeypatch.setattr(ort_qnn, "installed_versions", REAL_INSTALLED_VERSIONS)
    result = doit_in_process(project.root, *BUILD_STAGES, out=tmp_path / "back.txt")
    assert result.returncode == 0, result.stdout
    assert result.executed == CHIP_TASKS, result.stdout
    assert result.uptodate == GRAPH_TASKS, result.stdout
    for graph, model in GRAPHS.items():
        trees = sorted(p.name for p in project.path(f"build/{model}/{graph}").glob("ort-qnn-*"))
        assert trees == sorted([TOOLCHAIN_ID, new_id])
        for soc in SOCS:
            for tree in (TOOLCHAIN_ID, new_id):
                context = chip_dir(project, graph, soc, tree) / "context"
                assert all(p.is_file() for p in ctx_files(context, graph))
                assert read_json(context / "context.json")["toolchain"]["id"] == tree
    assert doit_in_process(project.root, *BUILD_STAGES, out=tmp_path / "back-again.txt").executed == set()


def test_profile_option_change_reruns_only_config_and_context(compiled, tmp_path):
    project = copy_project(tmp_path / "project", source=compiled.root, with_build=True)
    project.edit(PROFILE, "htp_graph_finalization_optimization_mode: 3", "htp_graph_finalization_optimization_mode: 1")
    result = project.doit(*BUILD_STAGES)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert result.executed == CHIP_TASKS, result.stdout
    assert result.uptodate == GRAPH_TASKS, result.stdout
    for graph in GRAPHS:
        for soc in SOCS:
            base = chip_dir(project, graph, soc)  # options are not in the toolchain id: same tree
            assert read_json(base / "config" / "provider_options.json")["htp_graph_finalization_optimization_mode"] == "1"
            rec = read_json(base / "context" / "context.json")
            assert rec["status"] == "passed"
            assert rec["provider_options"]["htp_graph_finalization_optimization_mode"] == "1"
            assert rec["toolchain"]["options"] == {"htp_graph_finalization_optimization_mode": "1"}
    assert project.doit(*BUILD_STAGES).executed == set()


# ================================================================ 5. bad input

def test_onnxruntime_qnn_not_installed(project_copy, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(project_copy.root)
    monkeypatch.setattr(ort_qnn, "installed_versions", lambda *_: {**VERSIONS, "onnxruntime-qnn": None, "qnn": None})
    # listing the tasks needs no toolchain (`list` writes to the current sys.stdout)
    namespace = qnn_tasks.tasks.project_tasks(project_copy.root)
    assert DoitMain(ModuleTaskLoader(namespace), config_filenames=()).run(["list", "--all"]) == 0
    listed = capsys.readouterr().out
    assert "context:vad-SM8650" in listed and "with ort-qnn-not-installed" in listed

    result = doit_in_process(project_copy.root, "context:vad-SM8650", out=tmp_path / "run.txt")
    assert result.returncode != 0, result.stdout
    # config runs first (context reads its file) and stops the chain with the install hint
    line = result.failure_line("config:vad-SM8650")
    assert "onnxruntime-qnn is not installed" in line
    assert "pip install onnxruntime-qnn" in line and "Linux x86-64" in line
    assert "context:vad-SM8650" not in result.executed
    base = chip_dir(project_copy, "vad", "SM8650", "ort-qnn-not-installed")
    assert read_json(base / "config" / "config.json")["status"] == "failed"
    assert not list(project_copy.path("build").rglob("*_ctx_qnn.bin"))


def test_compile_crash_names_the_log_and_the_qnn_error(project_copy):
    project_copy.edit("socs/socs.yaml", "\nsocs:\n", "\nsocs:\n  BAD: {soc_id: 999, dsp_arch: v75, vtcm_mb: 8, fp16: true}\n")
    project_copy.edit(VAD_YAML, "socs: [SM8650, SM8750]", "socs: [BAD]")
    result = project_copy.doit("context:vad-BAD")
    line = result.failure_line("context:vad-BAD")
    # lint runs again too: its key holds the context budget of each arch the graph builds for (socs.yaml context_mb)
    assert result.executed == {"lint:vad", "config:vad-BAD", "context:vad-BAD"}, result.stdout
    context = chip_dir(project_copy, "vad", "BAD") / "context"
    log = context / "compile.log"
    assert f"(full log: {log.relative_to(project_copy.root)})" in line
    assert "QNN_DEVICE_ERROR_INVALID_CONFIG" in line
    assert "first error in the log" in line
    text = log.read_text()
    assert "soc_model 999" in text and "QNN_DEVICE_ERROR_INVALID_CONFIG" in text and "# FAILED:" in text
    rec = read_json(context / "context.json")
    assert rec["status"] == "failed" and rec["error"] in line
    for path in ctx_files(context, "vad"):
        assert not path.exists(), path
    assert not (context / ".staging").exists()


def test_ep_devices_when_the_ep_is_already_registered():
    # In a fresh interpreter: once registered, the EP stays registered for the whole process.
    code = ("import onnxruntime as ort, onnxruntime_qnn\n"
            "from qnn_tasks.toolchains import ort_qnn\n"
            "ort.register_execution_provider_library(ort_qnn.EP_NAME, onnxruntime_qnn.get_library_path())\n"
            "assert ort_qnn.ep_devices()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# ================================================================ 6. socscheck

@pytest.mark.slow
def test_socscheck_confirms_the_real_table_and_catches_a_wrong_row(tmp_path):
    project = copy_project(tmp_path / "project")
    socs = load_soc_table(project.root)[0]  # the packaged table with the project's rows over it
    result = project.doit("socscheck")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert result.executed == {"socscheck:ort-qnn"}  # one subtask per toolchain of the run
    data = read_json(project.path("build/socscheck.json"))
    assert data["toolchain"]["id"] == TOOLCHAIN_ID
    assert [r["soc"]["name"] for r in data["rows"]] == list(socs)  # one row per SoC, in table order
    for row in data["rows"]:
        soc = socs[row["soc"]["name"]]
        assert row["ok"] is True, row
        assert row["recorded_soc_model"] == soc.soc_id and row["recorded_arch"] == soc.dsp_arch
    assert project.doit("socscheck").executed == set()

    # The table is the task's key: a wrong arch re-runs it, and the binary disagrees.
    project.edit("socs/socs.yaml", "SM8650:  {soc_id: 57, dsp_arch: v75", "SM8650:  {soc_id: 57, dsp_arch: v73")
    result = project.doit("socscheck")
    line = result.failure_line("socscheck:ort-qnn")
    assert "SM8650 (binary says socModel 57, v75)" in line
    assert "SM8750" not in line
    rows = {r["soc"]["name"]: r for r in read_json(project.path("build/socscheck.json"))["rows"]}
    assert rows["SM8650"]["ok"] is False and rows["SM8650"]["recorded_arch"] == "v75"
    assert all(r["ok"] for name, r in rows.items() if name != "SM8650")


def test_socscheck_cli_fails_on_a_wrong_arch(tmp_path):
    table = tmp_path / "socs.yaml"
    table.write_text("socs:\n"
                     "  SM8650: {soc_id: 57, dsp_arch: v73, vtcm_mb: 8, fp16: true}\n"  # really v75
                     "  SM8750: {soc_id: 69, dsp_arch: v79, vtcm_mb: 8, fp16: true}\n")
    proc = subprocess.run([sys.executable, "-m", "qnn_tasks.stages.socscheck", "--socs", str(table)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = {line.split()[0]: line for line in proc.stdout.splitlines()}
    assert lines["SM8650"].endswith("MISMATCH") and "arch v75" in lines["SM8650"]
    assert lines["SM8750"].endswith("ok")
    assert "do not match the compiled binaries: SM8650 " in proc.stderr
    assert "SM8750" not in proc.stderr
