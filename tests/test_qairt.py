"""The qairt toolchain (QAIRT SDK) end to end against the stand-in SDK: real doit, real files, real binaries.

The SDK is proprietary, so `tests/standins/qairt_sdk/qairt/2.40.0.251030` stands in for it (see its
README): its converter, model-lib generator and context-binary generator take the real flags, write
the real files and, underneath, compile with the onnxruntime-qnn wheel, so the context binaries are
real QNN binaries that qnnbin reads and the x86 HTP simulator runs. Each test copies it to tmp.

* the example models (vad, MiniLM fp16 and w8a16) for SM8650 and SM8750: the exact command lines,
  config files as sherpa-onnx writes them, binaries inspected, 16 KB aarch64 model libs, the runtime-libs manifest,
  simverify through the EPContext wrapper;
* an SDK version change reruns exactly the SDK stages and builds under a new toolchain id;
* bad input: no/wrong SDK root, no SDK Python, no NDK, an op the converter rejects, graph names the
  converter would mangle, a library linked without 16 KB pages, wrong tool flags;
* `doit toolcheck`, profile validation, cheap identity, the default toolchain unaffected.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import onnx
import pytest
import yaml
from conftest import GRAPH_STAGES, Project, copy_project

from qnn_tasks.errors import SpecError, StageError, ToolchainError
from qnn_tasks.modelspec.load import load_project
from qnn_tasks.modelspec.project import ToolchainProfile
from qnn_tasks.qnn import binary as qnnbin
from qnn_tasks.toolchains import qairt_sdk, qairt_tools
from qnn_tasks.toolchains.base import StageInput
from qnn_tasks.toolchains.qairt import QairtToolchain

TESTS = Path(__file__).resolve().parent
STANDIN = TESTS / "standins" / "qairt_sdk"
VERSION = "2.40.0.251030"
NEW_VERSION = "2.41.0.251120"
TOOLCHAIN_ID = f"qairt-{VERSION}"
SOCS = {"SM8650": (57, "v75"), "SM8750": (69, "v79")}
GRAPHS = {"vad": "silero-vad", "minilm": "minilm"}
VARIANTS = {"vad": ("vad", "fp16"), "minilm": ("minilm", "fp16"), "minilm-w8a16": ("minilm", "w8a16")}
SIMULATED = ["vad-SM8650", "vad-SM8750", "minilm-w8a16-SM8650"]
SDK_TASKS = ["convert", "modellib", "config", "context", *(f"simverify:{t}" for t in SIMULATED)]
LDFLAGS = "LDFLAGS=-Wl,-z,max-page-size=16384"


# ================================================================ helpers

def doit_env(**extra: str) -> dict[str, str]:
    """qairt selected; this interpreter first on PATH (the stand-in native tools run `python3`); no ambient SDK/NDK."""
    return {"QNN_TOOLCHAIN": "qairt", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "QNN_SDK_ROOT": "", "ANDROID_NDK_ROOT": "", **extra}


def write_profile(project: Project, sdk_root: Path | str | None, python: Path | str | None = sys.executable,
                  ndk: Path | str | None = None, targets: list[str] | None = None, options: dict | None = None) -> None:
    settings = {k: str(v) for k, v in (("sdk_root", sdk_root), ("python", python), ("ndk", ndk)) if v is not None}
    settings["model_lib_targets"] = targets or ["x86_64-linux-clang", "aarch64-android"]
    profile = {"kind": "qairt", "settings": settings, **({"options": options} if options else {})}
    project.path("toolchain/qairt.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))


def variant_dir(project: Project, variant: str, toolchain_id: str = TOOLCHAIN_ID) -> Path:
    graph, precision = VARIANTS.get(variant, (variant, "fp16"))
    return project.root / "build" / GRAPHS.get(graph, graph) / graph / toolchain_id / precision


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def command(path: Path) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def stage_record(project: Project, variant: str, stage: str, soc: str | None = None) -> dict:
    base = variant_dir(project, variant)
    return read_json((base / soc / stage if soc else base / stage) / f"{stage}.json")


def sdk_at(root: Path) -> Path:
    return root / "qairt" / VERSION


def toolchain(sdk_root: Path, **settings) -> QairtToolchain:
    base = {"sdk_root": str(sdk_root), "python": sys.executable}
    return QairtToolchain(ToolchainProfile(name="qairt", file=Path("toolchain/qairt.yaml"), kind="qairt",
                                           settings={**base, **settings}))


def assert_failed(result, project: Project, task: str, *fragments: str) -> dict:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    stage, name = task.split(":")
    record = next(project.root.glob(f"build/**/{stage}/{stage}.json"))
    record = read_json(record)
    assert record["status"] == "failed"
    for fragment in fragments:
        assert fragment in record["error"], (fragment, record["error"])
        assert fragment in result.stdout + result.stderr
    return record


# ================================================================ fixtures

@pytest.fixture(scope="module")
def standin(tmp_path_factory) -> Path:
    """A private copy of the stand-in SDK (qairt/<version>/ and android_ndk/)."""
    dest = tmp_path_factory.mktemp("standin") / "sdk"
    shutil.copytree(STANDIN, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def sdk_built(built_graphs, standin, tmp_path_factory) -> tuple[Project, object]:
    """The example project built with the stand-in SDK for SM8650/SM8750 (MiniLM simulated on 2 samples: at w8a16
    its first sentence alone measures cosine 0.9889, under the 0.99 its owner asks for)."""
    project = copy_project(tmp_path_factory.mktemp("qairt") / "project", source=built_graphs.root, with_build=True)
    minilm = project.path("models/minilm/model.yaml")
    minilm.write_text(re.sub(r"^(      samples: )8\b", r"\g<1>2", minilm.read_text(), count=1, flags=re.M))
    write_profile(project, sdk_at(standin), ndk=standin / "android_ndk")
    result = project.doit(*SDK_TASKS, env=doit_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return project, result


@pytest.fixture
def fixture_models(project_copy) -> Project:
    """project_copy + two tiny models: `tiny` (w8a16, int32 + float inputs) and `tiny_neg` (has a Neg)."""
    for name, graph, precision, extra in (("tiny", "tiny", "w8a16", "    calibration: {samples: 8}\n"),
                                          ("tiny-neg", "tiny_neg", "fp16", "    options: {neg: true}\n")):
        folder = project_copy.path(f"models/{name}")
        folder.mkdir()
        (folder / "model.yaml").write_text(TINY_YAML.format(graph=graph, precision=precision) + extra)
        (folder / "export.py").write_text(TINY_EXPORT)
    return project_copy


TINY_YAML = """# Test fixture written by tests/test_qairt.py: Gather(int32 ids) + x -> MatMul -> Relu (or Neg).
licence: test fixture
source: {{package: numpy}}
graphs:
  {graph}:
    inputs:
      ids: {{shape: [1, 16], dtype: int32}}
      x: {{shape: [1, 16, 8], dtype: float32}}
    outputs:
      y: {{shape: [1, 16, 8]}}
    precision: {precision}
    socs: [SM8650]
"""

TINY_EXPORT = '''"""A tiny seeded graph with an int32 input (written by tests/test_qairt.py)."""
import numpy as np


def _weights():
    rng = np.random.default_rng(0)
    return rng.standard_normal((32, 8)).astype(np.float32), (rng.standard_normal((8, 8)) * 0.5).astype(np.float32)


def export(ctx):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    emb, w = _weights()
    last = "Neg" if ctx.options.get("neg") else "Relu"
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], axis=0, name="gather"),
             helper.make_node("Add", ["e", "x"], ["h"], name="add"),
             helper.make_node("MatMul", ["h", "w"], ["m"], name="matmul"),
             helper.make_node(last, ["m"], ["y"], name=last.lower())]
    graph = helper.make_graph(nodes, "tiny",
                              [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 16]),
                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8])],
                              initializer=[numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(ctx.out_path))


def samples(ctx):
    rng = np.random.default_rng(1)
    return [{"ids": rng.integers(0, 32, (1, 16)).astype(np.int32),
             "x": rng.standard_normal((1, 16, 8)).astype(np.float32)} for _ in range(8)]


def reference(ctx, inputs):
    emb, w = _weights()
    outputs = []
    for s in inputs:
        m = (emb[s["ids"]] + s["x"]) @ w
        outputs.append({"y": (-m if ctx.options.get("neg") else np.maximum(m, 0)).astype(np.float32)})
    return outputs
'''


# ================================================================ the example models through the stand-in SDK

@pytest.mark.slow
def test_sdk_stages_run_once_per_variant_and_per_chip(sdk_built):
    project, result = sdk_built
    chips = {f"{v}-{s}" for v in VARIANTS for s in SOCS}
    expected = ({f"{stage}:{v}" for stage in ("convert", "modellib") for v in VARIANTS}
                | {f"{stage}:{c}" for stage in ("config", "context") for c in chips}
                | {f"{stage}:{t}" for stage in ("simulate", "simverify") for t in SIMULATED} | {"calibrate:minilm"})
    assert result.executed == expected
    assert {f"{stage}:{g}" for stage in GRAPH_STAGES for g in GRAPHS} <= result.uptodate
    again = project.doit(*SDK_TASKS, env=doit_env())
    assert again.returncode == 0 and again.executed == set(), again.stdout


@pytest.mark.slow
def test_convert_runs_the_guides_command_and_keeps_its_log(sdk_built, standin):
    project, _ = sdk_built
    converter = str(sdk_at(standin) / "bin/x86_64-linux-clang/qnn-onnx-converter")
    fp16 = variant_dir(project, "vad").relative_to(project.root) / "convert"
    assert command(project.root / fp16 / "command.txt") == [
        sys.executable, converter, "--input_network", "build/silero-vad/vad/simplify/vad.onnx",
        "--output_path", f"{fp16}/vad.cpp", "--float_bitwidth", "16", "--act_bitwidth", "16", "--bias_bitwidth", "32"]
    w8 = variant_dir(project, "minilm-w8a16").relative_to(project.root) / "convert"
    assert command(project.root / w8 / "command.txt") == [
        sys.executable, converter, "--input_network", "build/minilm/minilm/simplify/minilm.onnx",
        "--output_path", f"{w8}/minilm.cpp", "--input_list", f"{w8}/input_list.txt", "--use_native_input_files",
        "--weights_bitwidth", "8", "--act_bitwidth", "16", "--bias_bitwidth", "32"]
    # the input list: one line per calibration sample, one raw file per input in model.yaml's order, int32 native
    lines = (project.root / w8 / "input_list.txt").read_text().splitlines()
    assert len(lines) == 8
    for line in lines:
        ids, mask = line.split()
        assert ids.endswith("_input_ids.raw") and mask.endswith("_attention_mask.raw")
        assert Path(ids).stat().st_size == 64 * 4  # [1, 64] int32
    for variant, graph in (("vad", "vad"), ("minilm", "minilm"), ("minilm-w8a16", "minilm")):
        out = variant_dir(project, variant) / "convert"
        record = read_json(out / "convert.json")
        assert record["status"] == "passed" and record["graph_name"] == graph
        assert {p.name for p in out.iterdir()} >= {f"{graph}.cpp", f"{graph}.bin", f"{graph}_net.json", "command.txt",
                                                   "qnn-onnx-converter.log", "convert.json"}
        assert "Conversion complete" in (out / "qnn-onnx-converter.log").read_text()
        assert f'"{graph}"' in (out / f"{graph}.cpp").read_text()   # the graph name the converter wrote
    # w8a16 really is quantized: the weights that travel in the .bin are a QDQ graph
    with tarfile.open(variant_dir(project, "minilm-w8a16") / "convert/minilm.bin") as tar:
        model = onnx.load_from_string(tar.extractfile("model.onnx").read())
    assert sum(n.op_type == "QuantizeLinear" for n in model.graph.node) > 10
    assert read_json(variant_dir(project, "minilm-w8a16") / "convert/convert.json")["calibration_samples"] == 8


@pytest.mark.slow
def test_modellib_builds_host_and_16k_android_libs(sdk_built, standin):
    project, _ = sdk_built
    generator = str(sdk_at(standin) / "bin/x86_64-linux-clang/qnn-model-lib-generator")
    for variant, graph in (("vad", "vad"), ("minilm-w8a16", "minilm")):
        out = variant_dir(project, variant)
        rel = out.relative_to(project.root)
        assert command(out / "modellib/command.txt") == [
            LDFLAGS, sys.executable, generator, "-c", f"{rel}/convert/{graph}.cpp", "-b", f"{rel}/convert/{graph}.bin",
            "-o", f"{rel}/modellib/model_libs", "-t", "x86_64-linux-clang", "aarch64-android"]
        host = out / f"modellib/model_libs/x86_64-linux-clang/lib{graph}.so"
        android = out / f"modellib/model_libs/aarch64-android/lib{graph}.so"
        assert host.read_bytes()[:4] == b"\x7fELF" and int.from_bytes(host.read_bytes()[18:20], "little") == 62
        assert int.from_bytes(android.read_bytes()[18:20], "little") == 183  # EM_AARCH64
        readelf = subprocess.run(["readelf", "-lW", str(android)], capture_output=True, text=True, check=True).stdout
        aligns = [line.split()[-1] for line in readelf.splitlines() if line.strip().startswith("LOAD")]
        assert aligns and set(aligns) == {"0x4000"}, readelf
        record = read_json(out / "modellib/modellib.json")
        assert record["status"] == "passed", record
        assert record["libs"]["aarch64-android"]["page_check"]["page_16k"] is True
        assert record["ndk"]["revision"] == "26.3.11579264"
        assert "qnn-model-lib-generator.log" in record["log"]


@pytest.mark.slow
@pytest.mark.parametrize("soc", SOCS)
@pytest.mark.parametrize("variant", ["vad", "minilm-w8a16"])
def test_config_files_are_spec_2c(sdk_built, standin, variant, soc):
    project, _ = sdk_built
    out = variant_dir(project, variant) / soc / "config"
    graph = VARIANTS[variant][0]
    soc_id, arch = SOCS[soc]
    assert read_json(out / "provider_options.json") == {"soc_model": str(soc_id), "vtcm_mb": "8"}
    assert read_json(out / "htp_backend_extensions.json") == {"backend_extensions": {
        "shared_library_path": str(sdk_at(standin) / "lib/x86_64-linux-clang/libQnnHtpNetRunExtensions.so"),
        "config_file_path": str(out / "htp_config.json")}}
    assert read_json(out / "htp_config.json") == {
        "graphs": [{"vtcm_mb": 8, "O": 3, "graph_names": [graph]}],
        "devices": [{"device_id": 0, "soc_id": soc_id, "dsp_arch": arch,
                     "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 200}]}]}


@pytest.mark.slow
@pytest.mark.parametrize("soc", SOCS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_context_binary_is_inspected_and_wrapped(sdk_built, standin, variant, soc):
    project, _ = sdk_built
    graph = VARIANTS[variant][0]
    out = variant_dir(project, variant) / soc
    rel = out.relative_to(project.root)
    sdk = sdk_at(standin)
    assert command(out / "context/command.txt") == [
        str(sdk / "bin/x86_64-linux-clang/qnn-context-binary-generator"),
        "--backend", str(sdk / "lib/x86_64-linux-clang/libQnnHtp.so"),
        "--model", f"{rel.parent}/modellib/model_libs/x86_64-linux-clang/lib{graph}.so",
        "--output_dir", f"{rel}/context/binary", "--binary_file", graph,
        "--config_file", f"{rel}/config/htp_backend_extensions.json"]
    binary = out / "context/binary" / f"{graph}.bin"
    info = qnnbin.read_binary_info(binary)
    assert (info.soc_model, info.dsp_arch) == SOCS[soc]
    assert [g.name for g in info.graphs] == [graph]   # named as the converter named it (the HTP config's name)
    record = read_json(out / "context/context.json")
    assert record["status"] == "passed", record
    assert record["toolchain"]["id"] == TOOLCHAIN_ID
    assert (record["binary"]["soc_model"], record["binary"]["dsp_arch"]) == SOCS[soc]
    assert record["bin_size"] == binary.stat().st_size and record["partition"]["cpu_nodes"] == []
    # the EPContext wrapper simverify loads: context_files()[0]
    wrapper = onnx.load(str(out / f"context/{graph}_ctx.onnx"))
    (node,) = wrapper.graph.node
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (node.op_type, node.domain, node.name) == ("EPContext", "com.microsoft", graph)
    assert attrs["ep_cache_context"] == f"binary/{graph}.bin".encode() and attrs["embed_mode"] == 0
    assert attrs["main_context"] == 1 and attrs["source"] == b"QNN" and attrs["partition_name"] == graph.encode()
    declared = load_project(project.root).graphs()
    spec = next(g for g in declared if g.name == graph)
    assert [i.name for i in wrapper.graph.input] == [t.name for t in spec.inputs]
    assert [o.name for o in wrapper.graph.output] == [t.name for t in spec.outputs]


@pytest.mark.slow
def test_the_w8a16_binary_is_smaller_than_the_fp16_one(sdk_built):
    project, _ = sdk_built
    fp16 = stage_record(project, "minilm", "context", "SM8650")["bin_size"]
    w8a16 = stage_record(project, "minilm-w8a16", "context", "SM8650")["bin_size"]
    assert w8a16 < 0.8 * fp16, (w8a16, fp16)


@pytest.mark.slow
@pytest.mark.parametrize("target", SIMULATED)
def test_simverify_passes_on_sdk_built_binaries(sdk_built, target):
    project, _ = sdk_built
    variant, soc = target.rsplit("-", 1)
    record = stage_record(project, variant, "simverify", soc)
    assert record["status"] == "passed", record.get("error")
    assert record["device"]["kind"] == "simulator"
    assert all(c["passed"] for c in record["checks"])
    assert min(m["cosine"] for m in record["metrics"].values()) > 0.99


@pytest.mark.slow
@pytest.mark.parametrize("soc", SOCS)
def test_runtime_libs_manifest_names_the_chips_stub_and_skel(sdk_built, standin, soc):
    project, _ = sdk_built
    arch = SOCS[soc][1]
    manifest = read_json(variant_dir(project, "vad") / soc / "context/binary/runtime_libs.json")
    sdk = sdk_at(standin)
    number = arch[1:]
    expected = {"libQnnHtp.so": sdk / "lib/aarch64-android/libQnnHtp.so",
                "libQnnSystem.so": sdk / "lib/aarch64-android/libQnnSystem.so",
                f"libQnnHtpV{number}Stub.so": sdk / f"lib/aarch64-android/libQnnHtpV{number}Stub.so",
                f"libQnnHtpV{number}Skel.so": sdk / f"lib/hexagon-{arch}/unsigned/libQnnHtpV{number}Skel.so"}
    assert {lib["name"]: Path(lib["path"]) for lib in manifest["libs"]} == expected
    assert all(lib["present"] and lib["size"] == Path(lib["path"]).stat().st_size for lib in manifest["libs"])
    assert manifest["missing"] == [] and manifest["qairt_version"] == VERSION and manifest["dsp_arch"] == arch
    skel = next(lib for lib in manifest["libs"] if lib["name"].endswith("Skel.so"))
    assert skel["device_search_path"] == "ADSP_LIBRARY_PATH"


@pytest.mark.slow
def test_dist_takes_the_sdks_runtime_libs_only_of_the_binaries_qnn_version(sdk_built, tmp_path):
    """With no QNN_RUNTIME_LIBS, dist's source is the SDK's libraries (runtime_libs.json). The stand-in SDK says QNN
    2.40 while its context generator is the 2.51 wheel's, so its binaries say 2.51: its libs are refused in one line
    naming both; libs of the binaries' version (a configured folder) ship."""
    project, _ = sdk_built
    refused = project.doit("dist:silero-vad", env=doit_env(QNN_DIST=str(tmp_path / "a")))
    line = refused.failure_line("dist:silero-vad")
    built = read_json(variant_dir(project, "vad") / "SM8650/context/context.json")["binary"]["build_id"]
    qnn = ".".join(built.lstrip("v").split(".")[:3])
    assert "QNN 2.40.0" in line and f"compiled with QNN {qnn}" in line and "(fix: " in line
    assert not (tmp_path / "a" / "silero-vad").exists()
    from standins.qnn_libs import make_qnn_libs

    libs = make_qnn_libs(tmp_path / f"qnn-libs-{qnn}", qnn, archs=("v75", "v79"), runner=False)
    shipped = project.doit("dist:silero-vad", env=doit_env(QNN_DIST=str(tmp_path / "b"), QNN_RUNTIME_LIBS=str(libs)))
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    data = read_json(tmp_path / "b" / "silero-vad" / "manifest.json")
    assert data["toolchain"]["kind"] == "qairt" and data["toolchain"]["sdk"]["version"] == VERSION
    assert {b["soc"] for b in data["graphs"]["vad"]["binaries"]} == {"SM8650", "SM8750"}
    assert all(data["runtime_libs"][arch]["shipped"] for arch in ("v75", "v79"))


def test_runtime_libs_of_an_arch_the_sdk_lacks_are_listed_missing(standin, tmp_path):
    sdk_root = tmp_path / "qairt" / VERSION
    shutil.copytree(sdk_at(standin), sdk_root)
    shutil.rmtree(sdk_root / "lib/hexagon-v81")
    manifest = qairt_sdk.runtime_libs(qairt_sdk.locate(str(sdk_root)), "v81")
    assert manifest["missing"] == ["libQnnHtpV81Skel.so"]


# ================================================================ SDK version change

@pytest.mark.slow
def test_sdk_version_change_reruns_exactly_the_sdk_stages(built_graphs, standin, tmp_path):
    project = copy_project(tmp_path / "project", source=built_graphs.root, with_build=True)
    shutil.rmtree(project.path("models/minilm"))  # vad alone keeps this short
    write_profile(project, sdk_at(standin), ndk=standin / "android_ndk")
    tasks = ["convert", "modellib", "config", "context", "simverify"]
    first = project.doit(*tasks, env=doit_env())
    assert first.returncode == 0, first.stdout + first.stderr
    sdk_tasks = {"convert:vad", "modellib:vad"} | {f"{s}:vad-{c}" for s in ("config", "context", "simulate",
                                                                             "simverify") for c in SOCS}
    assert first.executed == sdk_tasks

    new_root = tmp_path / "sdk" / "qairt" / NEW_VERSION
    shutil.copytree(sdk_at(standin), new_root, ignore=shutil.ignore_patterns("__pycache__"))
    (new_root / "sdk.yaml").write_text((new_root / "sdk.yaml").read_text().replace("version: 2.40.0", "version: 2.41.0")
                                       .replace("build_id: 251030", "build_id: 251120"))
    write_profile(project, new_root, ndk=standin / "android_ndk")
    second = project.doit(*tasks, env=doit_env())
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.executed == sdk_tasks
    assert {f"{stage}:vad" for stage in GRAPH_STAGES} <= second.uptodate
    new_id = f"qairt-{NEW_VERSION}"
    for soc in SOCS:
        record = read_json(variant_dir(project, "vad", new_id) / soc / "context/context.json")
        assert record["status"] == "passed" and record["toolchain"]["id"] == new_id
        assert record["toolchain"]["sdk"]["sdk_yaml"]["version"] == "2.41.0"
        assert read_json(variant_dir(project, "vad", new_id) / soc / "simverify/simverify.json")["status"] == "passed"
        assert (variant_dir(project, "vad") / soc / "context/binary/vad.bin").is_file()  # the old build stays
    assert str(new_root) in (variant_dir(project, "vad", new_id) / "convert/command.txt").read_text()
    third = project.doit(*tasks, env=doit_env())
    assert third.executed == set()


# ================================================================ bad input

@pytest.mark.slow
def test_page_check_fails_on_a_library_linked_without_16k_pages(sdk_built, standin, tmp_path):
    project, _ = sdk_built
    convert = variant_dir(project, "vad") / "convert"
    env = {**os.environ, "PATH": f"{standin / 'android_ndk'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("LDFLAGS", None)
    proc = subprocess.run([sys.executable, str(sdk_at(standin) / "bin/x86_64-linux-clang/qnn-model-lib-generator"),
                           "-c", str(convert / "vad.cpp"), "-b", str(convert / "vad.bin"), "-o", str(tmp_path / "libs"),
                           "-t", "aarch64-android"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lib = tmp_path / "libs/aarch64-android/libvad.so"
    assert qairt_tools.load_alignments(lib) == [0x1000, 0x1000]
    with pytest.raises(StageError, match=r"aligned to 0x1000, not 16 KB \(0x4000\).*max-page-size=16384") as info:
        qairt_tools.check_16k_pages(lib)
    assert info.value.record["page_check"]["page_16k"] is False
    good = variant_dir(project, "vad") / "modellib/model_libs/aarch64-android/libvad.so"
    assert qairt_tools.check_16k_pages(good)["page_16k"] is True


@pytest.mark.parametrize("where", ["missing", "parent"])
def test_sdk_root_missing_or_not_an_sdk(project_copy, standin, tmp_path, where):
    root = tmp_path / "nowhere" if where == "missing" else standin / "qairt"
    write_profile(project_copy, root, ndk=standin / "android_ndk")
    listed = project_copy.doit("list", "--all", env=doit_env())
    assert listed.returncode == 0 and "convert:vad" in listed.stdout   # listing never needs the SDK
    result = project_copy.doit("convert:vad", env=doit_env())
    fragments = [str(root), "(fix: point settings.sdk_root in toolchain/qairt.yaml"]
    fragments += ["does not exist"] if where == "missing" else ["is not a QAIRT SDK root", f"did you mean {sdk_at(standin)}"]
    assert_failed(result, project_copy, "convert:vad", *fragments)
    assert (project_copy.root / "build/silero-vad/vad/qairt-no-sdk").is_dir()


def test_sdk_python_missing(project_copy, standin, tmp_path):
    python = tmp_path / "py310/bin/python"
    write_profile(project_copy, sdk_at(standin), python=python, ndk=standin / "android_ndk")
    result = project_copy.doit("convert:vad", env=doit_env())
    assert_failed(result, project_copy, "convert:vad", str(python), "does not exist", "settings.python",
                  "numpy<2 onnx==1.17.0")


def test_without_an_ndk_only_the_aarch64_library_fails(project_copy, standin):
    write_profile(project_copy, sdk_at(standin), ndk=None)
    result = project_copy.doit("context:vad-SM8650", env=doit_env())
    assert result.returncode == 0, result.stdout + result.stderr
    out = variant_dir(project_copy, "vad")
    record = read_json(out / "modellib/modellib.json")
    assert record["status"] == "warning"
    assert record["libs"]["x86_64-linux-clang"]["built"] is True
    android = record["libs"]["aarch64-android"]
    assert android["built"] is False and "ndk-build not found" in android["reason"]
    (warning,) = record["warnings"]
    assert "aarch64-android model library not built" in warning and "settings.ndk" in warning
    assert "ndk-build not found" in warning and "no Android NDK" in warning
    assert not (out / "modellib/model_libs/aarch64-android/libvad.so").exists()
    assert read_json(out / "SM8650/context/context.json")["status"] == "passed"   # compile proceeds
    again = project_copy.doit("context:vad-SM8650", env=doit_env())
    assert again.executed == set()   # the missing aarch64 lib is not a target: no rebuild loop


@pytest.mark.slow
def test_converter_rejects_neg_and_w8a16_with_int32_inputs_verifies(fixture_models, standin):
    project = fixture_models
    write_profile(project, sdk_at(standin), ndk=standin / "android_ndk")
    result = project.doit("convert:tiny_neg", "simverify:tiny-SM8650", env=doit_env())
    assert result.returncode != 0
    neg = read_json(project.path("build/tiny-neg/tiny_neg") / TOOLCHAIN_ID / "fp16/convert/convert.json")
    assert neg["status"] == "failed"
    assert neg["rejected_ops"] == [{"op_type": "Neg", "node": "neg", "hint": "write (0 - x) or a - b at export"}]
    assert "the converter rejected op(s) Neg (node 'neg'): write (0 - x)" in neg["error"]
    assert "convert:tiny_neg" in result.stdout + result.stderr
    log = (project.root / neg["log"]).read_text()
    assert "No translation registered for op type onnx_neg" in log
    # the w8a16 graph with an int32 input: native raw files, quantized, verified on the simulator
    base = project.path("build/tiny/tiny") / TOOLCHAIN_ID / "w8a16"
    words = command(base / "convert/command.txt")
    assert words[words.index("--input_list") + 2] == "--use_native_input_files"
    raws = sorted((base / "convert/calibration").glob("*_ids.raw"))
    assert len(raws) == 8 and all(r.stat().st_size == 16 * 4 for r in raws)
    assert read_json(base / "SM8650/context/context.json")["status"] == "passed"
    verdict = read_json(base / "SM8650/simverify/simverify.json")
    assert verdict["status"] == "passed", verdict.get("error")


@pytest.mark.slow
def test_a_graph_name_the_converter_would_mangle_is_renamed_consistently(project_copy, standin):
    project_copy.edit("models/silero-vad/model.yaml", "\n  vad:\n", "\n  vad-v2:\n")
    write_profile(project_copy, sdk_at(standin), ndk=standin / "android_ndk")
    result = project_copy.doit("context:vad-v2-SM8650", env=doit_env())
    assert result.returncode == 0, result.stdout + result.stderr
    base = project_copy.path("build/silero-vad/vad-v2") / TOOLCHAIN_ID / "fp16"
    convert = read_json(base / "convert/convert.json")
    assert convert["graph_name"] == "vad_v2" and convert["renamed"] is True
    assert (base / "convert/vad_v2.cpp").is_file()
    assert read_json(base / "SM8650/config/htp_config.json")["graphs"][0]["graph_names"] == ["vad_v2"]
    assert [g.name for g in qnnbin.read_binary_info(base / "SM8650/context/binary/vad_v2.bin").graphs] == ["vad_v2"]
    assert (base / "SM8650/context/vad-v2_ctx.onnx").is_file()


def test_a_graph_name_that_cannot_be_kept_is_an_error(built_graphs, standin, tmp_path):
    assert qairt_tools.qnn_graph_name("vad") == ("vad", None)
    assert qairt_tools.qnn_graph_name("vad-v2") == ("vad_v2", None)
    name, problem = qairt_tools.qnn_graph_name("vad.v2")
    assert name == "vad_v2" and "would name the graph 'vad_v2'" in problem and "(fix: rename the graph" in problem
    assert qairt_tools.qnn_graph_name("2vad")[0] == "_2vad"
    spec = next(g for g in load_project(built_graphs.root).graphs() if g.name == "vad")
    chain = toolchain(sdk_at(standin))
    stage = chain.graph_stages("fp16")[0]
    with pytest.raises(StageError, match=r"graph name 'vad\.v2' is not a valid QNN graph name"):
        stage.run(StageInput(graph=replace(spec, name="vad.v2"), precision="fp16",
                             source=built_graphs.root / "build/silero-vad/vad/simplify/vad.onnx", out_dir=tmp_path))
    # ... because the converter itself mangles the .cpp basename into the graph name:
    proc = subprocess.run([sys.executable, str(sdk_at(standin) / "bin/x86_64-linux-clang/qnn-onnx-converter"),
                           "--input_network", str(built_graphs.root / "build/silero-vad/vad/simplify/vad.onnx"),
                           "--output_path", str(tmp_path / "my-graph.v2.cpp")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert qairt_tools.graph_name_in_cpp(tmp_path / "my-graph.v2.cpp") == "my_graph_v2"


def test_standin_tools_reject_wrong_flags_like_the_real_ones(standin):
    tools = sdk_at(standin) / "bin/x86_64-linux-clang"
    converter = subprocess.run([sys.executable, str(tools / "qnn-onnx-converter"), "--input_network", "x.onnx",
                                "--act_bitwidht", "16"], capture_output=True, text=True)
    assert converter.returncode == 2 and "unrecognized arguments: --act_bitwidht" in converter.stderr
    assert converter.stderr.startswith("usage: qnn-onnx-converter")
    generator = subprocess.run([sys.executable, str(tools / "qnn-model-lib-generator"), "-c", "x.cpp", "-t", "armv7"],
                               capture_output=True, text=True)
    assert generator.returncode == 2 and "invalid choice: 'armv7'" in generator.stderr
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    context = subprocess.run([str(tools / "qnn-context-binary-generator"), "--model", "x.so", "--bogus"],
                             capture_output=True, text=True, env=env)
    assert context.returncode == 1 and "ERROR: Invalid argument passed" in context.stderr
    missing = subprocess.run([str(tools / "qnn-context-binary-generator"), "--model", "x.so"],
                             capture_output=True, text=True, env=env)
    assert missing.returncode == 1 and "ERROR: Missing argument --backend" in missing.stderr
    for script in tools.iterdir():
        assert "Stand-in for QAIRT's" in script.read_text().splitlines()[1]


# ================================================================ toolcheck, profile, identity

def test_toolcheck_runs_the_sdks_checks_and_says_what_is_missing(standin, tmp_path):
    project = copy_project(tmp_path / "project")
    write_profile(project, sdk_at(standin), ndk=standin / "android_ndk")
    ok = project.doit("toolcheck", env=doit_env())
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "check-linux-dependency.sh" in ok.stdout and "check-python-dependency" in ok.stdout
    record = read_json(project.path("build/toolcheck.json"))
    assert record["status"] == "passed" and record["qairt_version"] == VERSION
    assert [c["check"] for c in record["checks"]] == ["check-linux-dependency.sh", "check-python-dependency"]
    assert all(c["returncode"] == 0 for c in record["checks"])

    write_profile(project, sdk_at(standin), python=tmp_path / "nope/python3.10", ndk=None)
    bad = project.doit("toolcheck", env=doit_env())
    assert bad.returncode != 0
    record = read_json(project.path("build/toolcheck.json"))
    assert record["status"] == "failed" and len(record["problems"]) == 2
    for fragment in (str(tmp_path / "nope/python3.10"), "settings.python", "no Android NDK", "settings.ndk"):
        assert fragment in record["error"] and fragment in bad.stdout + bad.stderr


def test_profile_is_validated(standin):
    sdk = str(sdk_at(standin))
    cases = [({"sdk_root": sdk, "sdk": "x"}, {}, "settings.sdk: unknown setting"),
             ({"sdk_root": sdk, "model_lib_targets": ["aarch64-android"]}, {}, "x86_64-linux-clang is missing"),
             ({"sdk_root": sdk, "model_lib_targets": ["armv7"]}, {}, "is not a list of model-lib targets"),
             ({"sdk_root": sdk}, {"converter_args": ["--input_list", "x.txt"]}, "--input_list is set by the tool"),
             ({"sdk_root": sdk}, {"vtcm": 4}, "options.vtcm: unknown option")]
    for settings, options, message in cases:
        with pytest.raises(SpecError, match=re.escape(message)):
            QairtToolchain(ToolchainProfile(name="qairt", file=Path("toolchain/qairt.yaml"), kind="qairt",
                                            settings=settings, options=options))


def test_identity_is_cheap_and_carries_the_sdk_version(standin, monkeypatch):
    def no_subprocess(*args, **kwargs):
        raise AssertionError("id()/fingerprint()/graph_stages() must not run anything")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    monkeypatch.setattr(subprocess, "Popen", no_subprocess)
    chain = toolchain(sdk_at(standin), ndk=str(standin / "android_ndk"))
    assert chain.id() == TOOLCHAIN_ID
    fingerprint = chain.fingerprint()
    assert fingerprint["sdk"]["version"] == VERSION and fingerprint["sdk"]["sdk_yaml"]["build_id"] == "251030"
    assert [s.name for s in chain.graph_stages("w8a16")] == ["convert", "modellib"]
    assert chain.graph_stages("w8a16")[0].needs_calibration and not chain.graph_stages("fp16")[0].needs_calibration
    assert chain.config_files(None)[0] == "provider_options.json"
    assert toolchain(Path("/nonexistent/qairt")).id() == "qairt-no-sdk"


def test_diagnose_is_not_supported_and_says_so(standin, tmp_path):
    with pytest.raises(ToolchainError, match=r"not supported yet.*QNN_TOOLCHAIN=ort-qnn"):
        toolchain(sdk_at(standin)).compile_variant(tmp_path / "x.onnx", {"soc_model": "57"}, tmp_path)


def test_default_toolchain_is_unaffected(tmp_path):
    project = copy_project(tmp_path / "project")
    result = project.doit("list", env={"QNN_TOOLCHAIN": "ort-qnn"})
    assert result.returncode == 0, result.stderr
    tasks = {line.split()[0] for line in result.stdout.splitlines()}
    assert not {"convert", "modellib"} & tasks
    assert {"export", "config", "context", "simverify", "toolcheck"} <= tasks
    check = project.doit("toolcheck", env={"QNN_TOOLCHAIN": "ort-qnn"})
    assert check.returncode == 0, check.stdout + check.stderr
    assert read_json(project.path("build/toolcheck.json"))["versions"]["onnxruntime-qnn"]


def test_warnings_errors_and_rejected_ops_are_read_from_tool_logs(tmp_path):
    log = tmp_path / "tool.log"
    log.write_text(
        "2025-10-30 12:00:00,001 - 235 - INFO - Processing ONNX model x.onnx\n"
        "2025-10-30 12:00:00,002 - 235 - WARNING - Quantization encodings for 'mask' are out of range\n"
        "2025-10-30 12:00:00,003 - 235 - ERROR - Node /Neg_1: 'No translation registered for op type onnx_neg. "
        "Op is most likely not supported by the converter.'\n"
        "KeyError: 'No translation registered for op type onnx_isnan.'\n"
        "     12.0ms [WARNING ] Graph config for ['other'] not applied\n"
        "     13.0ms [  ERROR ] Failed to finalize graph 'vad'\n")
    assert qairt_tools.warnings_in(log) == ["Quantization encodings for 'mask' are out of range",
                                            "Graph config for ['other'] not applied"]
    assert qairt_tools.errors_in(log)[-1] == "Failed to finalize graph 'vad'"
    assert qairt_tools.rejected_ops(log) == [
        {"op_type": "Neg", "node": "/Neg_1", "hint": "write (0 - x) or a - b at export"},
        {"op_type": "IsNaN", "node": "", "hint": "drop NaN checks from the graph"}]
