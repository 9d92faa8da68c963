"""simverify end to end: real compiles of both example graphs, real runs on the x86 HTP simulator.

One copy of `built_graphs` is taken through `doit simverify report` for SM8650 and SM8750 once
(conftest's `verified`, shared with test_report.py) with minilm's `verify: samples:` cut to 1
(each simulated MiniLM run takes ~3 s); the VAD keeps its 36 real audio frames. Tests that
break something (a tolerance, the export, a binary) work on their own copy of that build.

Asserted: the records (metrics against thresholds, recomputed independently from the kept NPU
outputs), the checks, the timing label, that failures are caught and named (a lowered
tolerance, the real fp16 Pow hazard of the VAD, a corrupt binary, a wrong output signature,
NaN outputs), that a failed verification is not cached, that a missing or stale CPU reference
is rebuilt before use, and that `doit` fails but still writes the report.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import MINILM_SAMPLES, Project, copy_project

from qnn_tasks import fileio, toolchains
from qnn_tasks.devices import simulator
from qnn_tasks.errors import StageError
from qnn_tasks.judge import sample_store, verification
from qnn_tasks.modelspec.load import load_project, load_socs
from qnn_tasks.plan.targets import chip_targets
from qnn_tasks.stages.simulate import check_signature

SOCS = ("SM8650", "SM8750")
# graph -> (model folder, declared outputs {name: shape})
GRAPHS = {"vad": ("silero-vad", {"output": [1, 1], "stateN": [2, 1, 128]}),
          "minilm": ("minilm", {"embedding": [1, 384]})}
VAD_YAML = "models/silero-vad/model.yaml"
MINILM_YAML = "models/minilm/model.yaml"
FP16_DEFAULTS = {"min_cosine": 0.999, "min_snr_db": 25.0}
CHIP_STAGES = ("config", "context", "simulate", "simverify")


def toolchain_id(project: Project) -> str:
    return toolchains.from_profile(load_project(project.root).toolchain).id()


def chip_target(project: Project, name: str):
    """The library's own ChipTarget for `<graph>-<SOC>`: where its stages write (no layout guessed here)."""
    spec = load_project(project.root)
    return next(ct for ct in chip_targets(spec, toolchain_id(project)) if ct.name == name)


def chip_dir(project: Project, graph: str, soc: str) -> Path:
    return project.root / chip_target(project, f"{graph}-{soc}").stage_dir("simverify").parent


def verify_settings(graph) -> dict:
    """The graph's validated `verify:` settings (for its primary precision)."""
    return graph.verify if "thresholds" in graph.verify else graph.verify[graph.precision]


def graph_dir(project: Project, graph: str) -> Path:
    return project.root / "build" / GRAPHS[graph][0] / graph


def sim_record(project: Project, graph: str, soc: str) -> dict:
    return json.loads((chip_dir(project, graph, soc) / "simverify" / "simverify.json").read_text())


def graph_spec(project: Project, graph: str):
    return next(g for g in load_project(project.root).graphs() if g.name == graph)


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def corrupt(path: Path) -> None:
    """Same size, random bytes (seeded)."""
    size = path.stat().st_size
    path.write_bytes(np.random.default_rng(7).integers(0, 256, size, dtype=np.uint8).tobytes())


# ------------------------------------------------------------------ 1. real runs, records

def test_build_ran_every_chip_stage_once(verified, own_copy):
    expected = {f"{stage}:{graph}-{soc}" for stage in CHIP_STAGES for graph in GRAPHS for soc in SOCS}
    assert verified.build_run.executed == expected | {"report"}
    assert {f"cpucheck:{graph}" for graph in GRAPHS} <= verified.build_run.uptodate
    again = own_copy.doit("simverify")  # in a copy: the session's build is shared by other workers
    assert again.returncode == 0 and again.executed == set(), again.stdout


@pytest.mark.parametrize("soc", SOCS)
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_simverify_record(verified, graph, soc):
    rec = sim_record(verified, graph, soc)
    declared = GRAPHS[graph][1]
    assert rec["status"] == "passed" and rec["violations"] == [] and "error" not in rec
    assert rec["stage"] == "simverify" and rec["target"] == f"{graph}-{soc}" and rec["graph"] == graph
    assert rec["device"]["kind"] == "simulator"

    cpu_samples = json.loads((graph_dir(verified, graph) / "cpucheck" / "cpucheck.json").read_text())["samples"]
    expected_samples = MINILM_SAMPLES if graph == "minilm" else cpu_samples
    assert rec["samples"] == expected_samples
    if graph == "vad":
        assert rec["samples"] == 36  # 6 real frames of each of 6 clips (speech, noise, 2 tts, quiet, silence)

    # metrics per declared output, with the thresholds that applied
    assert set(rec["metrics"]) == set(declared)
    expected_limits = {"output": {**FP16_DEFAULTS, "max_abs": 0.05}, "stateN": FP16_DEFAULTS,
                       "embedding": FP16_DEFAULTS}
    npu_file = Path(verified.root / rec["outputs_file"])
    ref_file = Path(verified.root / rec["reference_file"])
    assert ref_file == graph_dir(verified, graph) / "cpucheck" / "reference.npz"
    with np.load(npu_file) as npu_data, np.load(ref_file) as ref_data:
        assert sorted(npu_data.files) == sorted(declared)
        for name, shape in declared.items():
            npu, ref = npu_data[name], ref_data[name][: rec["samples"]]
            assert list(npu.shape) == [rec["samples"], *shape]
            assert np.isfinite(npu).all()
            m = rec["metrics"][name]
            assert m["thresholds"] == expected_limits[name]
            assert m["non_finite"] == 0
            # recomputed here from the kept outputs, not taken from the library
            diff = np.abs(npu.astype(np.float64) - ref.astype(np.float64))
            assert m["max_abs"] == pytest.approx(diff.max(), rel=1e-9, abs=1e-12)
            assert m["mean_abs"] == pytest.approx(diff.mean(), rel=1e-9, abs=1e-12)
            a, b = ref.astype(np.float64).ravel(), npu.astype(np.float64).ravel()
            assert m["cosine"] == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), rel=1e-9)
            assert m["snr_db"] == pytest.approx(10 * np.log10((a @ a) / (diff.ravel() @ diff.ravel())), rel=1e-9)
            assert m["cosine"] >= m["thresholds"]["min_cosine"]
            assert m["snr_db"] >= m["thresholds"]["min_snr_db"]
            assert m["max_abs"] <= m["thresholds"].get("max_abs", np.inf)
            assert m["max_abs"] > 0  # fp16 on HTP is not bit-exact with the fp32 CPU: the comparison is live

    checks = {c["kind"]: c for c in rec["checks"]}
    if graph == "vad":
        assert set(checks) == {"agreement"}
        c = checks["agreement"]
        assert c["output"] == "output" and c["min"] == 0.99 and c["passed"] is True and c["value"] >= 0.99
        with np.load(npu_file) as npu_data, np.load(ref_file) as ref_data:
            cpu_speech = ref_data["output"][: rec["samples"]] > 0.5
            same = (npu_data["output"] > 0.5) == cpu_speech
        assert c["value"] == pytest.approx(same.mean())
        assert 0.1 < cpu_speech.mean() < 0.9, "the VAD samples should hold both speech and non-speech frames"
    else:
        assert set(checks) == {"ranking"}
        c = checks["ranking"]
        assert c["output"] == "embedding" and c["passed"] is True and c["value"] == 1.0 and c["min"] == 1.0

    timing = rec["timing"]
    assert "simulator" in timing["label"] and "not phone latency" in timing["label"]
    assert timing["runs"] == rec["samples"]
    assert 0 < timing["per_inference_median_s"] <= timing["per_inference_p90_s"]
    assert timing["total_s"] >= timing["per_inference_median_s"] * rec["samples"] / 2

    # where it ran and with what
    assert rec["soc"] == load_socs(verified.path("socs/socs.yaml"))[soc].row()
    assert rec["precision"] == "fp16"
    tc = rec["toolchain"]
    assert tc["id"] == toolchain_id(verified) and tc["id"] in chip_dir(verified, graph, soc).parts
    assert tc["onnxruntime"] == importlib.metadata.version("onnxruntime")
    assert tc["onnxruntime-qnn"] == importlib.metadata.version("onnxruntime-qnn")
    assert tc["qnn"] and tc["qnn"] in tc["id"]
    log = verified.root / rec["log"]
    assert log.is_file() and log.parent == chip_dir(verified, graph, soc) / "simulate"


# ------------------------------------------------------------------ 2. failures are caught

@pytest.fixture(scope="module")
def tight_vad(verified, tmp_path_factory) -> Project:
    """A copy whose VAD speech probability must match the CPU to 1e-6 (fp16 cannot)."""
    project = copy_project(tmp_path_factory.mktemp("tight") / "project", source=verified.root, with_build=True)
    project.edit(VAD_YAML, "output: {max_abs: 0.05}", "output: {max_abs: 1.0e-6}")
    return project


def test_lowered_tolerance_fails_names_the_violation_and_is_not_cached(tight_vad):
    for attempt in range(2):  # a failed task is never up to date: the second run checks again
        result = tight_vad.doit("simverify:vad-SM8650")
        assert result.returncode != 0, result.stdout
        assert "simverify:vad-SM8650" in result.executed, f"attempt {attempt}: {result.stdout}"
        rec = sim_record(tight_vad, "vad", "SM8650")
        assert rec["status"] == "failed"
        m = rec["metrics"]["output"]
        assert m["thresholds"]["max_abs"] == 1e-6
        assert 1e-6 < m["max_abs"] < 0.05  # passed at the real tolerance, fails at this one
        line = f"output 'output': max_abs = {m['max_abs']:.6g} is above the threshold 1e-06"
        assert line in result.stdout + result.stderr
        assert line in rec["error"] and rec["violations"] == [line]
        assert {"max_abs", "mean_abs", "cosine", "snr_db"} <= set(rec["metrics"]["stateN"])
        assert rec["error"].startswith("simverify of ") and "vad" in rec["error"] and "SM8650" in rec["error"]
        assert (chip_dir(tight_vad, "vad", "SM8650") / "simulate" / "outputs.npz").is_file()


def test_doit_fails_on_a_verification_and_still_writes_the_report(tight_vad):
    result = tight_vad.doit()  # the default tasks: everything, `continue` on, report last
    assert result.returncode != 0, result.stdout
    assert {"simverify:vad-SM8650", "simverify:vad-SM8750", "report"} <= result.executed, result.stdout
    assert {"simverify:minilm-SM8650", "simverify:minilm-SM8750"} <= result.uptodate
    lines = result.stdout.splitlines()
    assert lines.index(".  report") > max(lines.index(".  simverify:vad-SM8650"), lines.index(".  simverify:vad-SM8750"))
    assert "TaskFailed - taskid:simverify:vad-SM8650" in result.stdout + result.stderr

    report = json.loads(tight_vad.path("build/report/report.json").read_text())
    targets = {t["name"]: t for t in report["targets"]}
    for soc in SOCS:
        t = targets[f"vad-{soc}"]
        assert t["status"] == "failed"
        assert "output 'output': max_abs" in t["reason"] and "1e-06" in t["reason"]
        assert t["stages"]["simverify"]["status"] == "failed"
        assert targets[f"minilm-{soc}"]["status"] == "passed"
    assert report["summary"]["failed"] == 2 and report["summary"]["passed"] == 2
    assert report["summary"]["graphs_failed"] == 0
    assert "| silero-vad/vad (fp16) | failed | failed |" in tight_vad.path("build/report/report.md").read_text()
    assert "vad-SM8650 — failed" in tight_vad.path("build/report/index.html").read_text()


@pytest.mark.slow
def test_fp16_pow_hazard_is_caught_on_the_simulator(own_copy):
    # keep_pow: true exports Pow(x, 2) as the packaged model has it. On CPU that is exact; on HTP
    # in fp16 it returns garbage once x underflows fp16 (the quiet-speech clip).
    own_copy.edit(VAD_YAML, "keep_pow: false", "keep_pow: true")
    result = own_copy.doit("simverify:vad-SM8650")
    assert result.returncode != 0, result.stdout
    assert {"export:vad", "simplify:vad", "lint:vad", "cpucheck:vad", "context:vad-SM8650",
            "simverify:vad-SM8650"} <= result.executed, result.stdout
    lint = json.loads((graph_dir(own_copy, "vad") / "lint" / "lint.json").read_text())
    assert any(f["rule"] == "pow-square" for f in lint["findings"])
    cpu = json.loads((graph_dir(own_copy, "vad") / "cpucheck" / "cpucheck.json").read_text())
    assert cpu["status"] == "passed"  # the graph is right on CPU: only the NPU run shows the hazard

    rec = sim_record(own_copy, "vad", "SM8650")
    assert rec["status"] == "failed"
    m = rec["metrics"]["output"]
    agreement = next(c for c in rec["checks"] if c["kind"] == "agreement")
    assert m["max_abs"] > 0.05 or not agreement["passed"], (m, agreement)
    message = result.stdout + result.stderr
    assert ("output 'output': max_abs" in message) or ("check agreement on 'output'" in message), message
    if m["max_abs"] > 0.05:
        assert f"max_abs = {m['max_abs']:.6g} is above the threshold 0.05" in rec["error"]
    if not agreement["passed"]:
        assert agreement["value"] < 0.99 and f"check agreement on 'output': {agreement['value']:.4g}" in rec["error"]


def test_corrupt_binary_fails_to_load_on_the_simulator(verified, tmp_path):
    src = chip_dir(verified, "vad", "SM8650")
    options = fileio.read_json(src / "config" / "provider_options.json")
    inputs = sample_store.load(graph_dir(verified, "vad") / "cpucheck" / "inputs.npz", limit=3)

    # control: the intact binary, copied the same way, loads and reproduces the build's outputs
    intact = tmp_path / "intact"
    shutil.copytree(src / "context", intact)
    outputs, seconds, signature = simulator.run(intact / "vad_ctx.onnx", options, inputs, tmp_path / "intact.log")
    assert signature == GRAPHS["vad"][1] and len(seconds) == 3
    with np.load(src / "simulate" / "outputs.npz") as built:
        np.testing.assert_allclose(np.stack([o["output"] for o in outputs]), built["output"][:3], rtol=0, atol=1e-6)

    broken = tmp_path / "broken"
    shutil.copytree(src / "context", broken)
    corrupt(broken / "vad_ctx_qnn.bin")
    log = tmp_path / "logs" / "simulator.log"
    with pytest.raises(StageError) as err:
        simulator.run(broken / "vad_ctx.onnx", options, inputs, log)
    message = str(err.value)
    assert "failed to load on the HTP simulator" in message
    assert str(broken / "vad_ctx.onnx") in message
    assert str(log) in message and log.is_file()
    assert "\n" not in message  # one line, no traceback


@pytest.mark.slow
def test_corrupt_binary_in_the_build_is_rebuilt_not_simulated(own_copy):
    """A binary damaged by hand no longer matches what its context record vouches for: context runs again."""
    binary = chip_dir(own_copy, "vad", "SM8650") / "context" / "vad_ctx_qnn.bin"
    damaged = md5(corrupt(binary) or binary)
    result = own_copy.doit("simverify:vad-SM8650")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "context:vad-SM8650" in result.executed and md5(binary) != damaged
    context = json.loads((binary.parent / "context.json").read_text())
    assert context["files"][str(binary.relative_to(own_copy.root))]["sha256"] == hashlib.sha256(binary.read_bytes()).hexdigest()
    # QNN pads binaries differently from one compile to the next: whether simulate reruns follows the bytes
    assert "simverify:vad-SM8650" in result.executed | result.uptodate
    assert sim_record(own_copy, "vad", "SM8650")["status"] == "passed"


def test_output_signature_must_match_the_spec(verified):
    graph = graph_spec(verified, "vad")
    ctx = Path("build/x/vad_ctx.onnx")
    check_signature(graph, {"output": [1, 1], "stateN": [2, 1, 128]}, ctx)  # the real one passes

    with pytest.raises(StageError) as err:
        check_signature(graph, {"output": [1, 1], "stateN": [2, 1, 64]}, ctx)
    message = str(err.value)
    assert str(ctx) in message
    assert "'stateN': [2, 1, 64]" in message and "'stateN': [2, 1, 128]" in message
    assert "graphs.vad.outputs" in message

    with pytest.raises(StageError) as err:
        check_signature(graph, {"speech_prob": [1, 1], "stateN": [2, 1, 128]}, ctx)
    assert "'speech_prob'" in str(err.value) and "'output': [1, 1]" in str(err.value)

    with pytest.raises(StageError):  # an output missing altogether
        check_signature(graph, {"output": [1, 1]}, ctx)


def test_nan_in_npu_outputs_is_a_violation_with_its_index(verified):
    graph = graph_spec(verified, "vad")
    reference = sample_store.load(graph_dir(verified, "vad") / "cpucheck" / "reference.npz", limit=6)
    actual = [{k: v.copy() for k, v in sample.items()} for sample in reference]
    result, violations = verification.judge(graph, verify_settings(graph), reference, actual)
    assert violations == [] and result["metrics"]["output"]["snr_db"] == float("inf")  # identical: passes

    actual[3]["stateN"][1, 0, 7] = np.nan
    actual[4]["stateN"][0, 0, 0] = np.inf
    result, violations = verification.judge(graph, verify_settings(graph), reference, actual)
    assert result["metrics"]["stateN"]["non_finite"] == 2
    assert violations == ["output 'stateN': 2 NaN/Inf values (first at index [3, 1, 0, 7])"]


# ------------------------------------------------------------------ 3. the CPU reference is never stale

def test_missing_reference_is_rebuilt_before_simverify(own_copy):
    reference = graph_dir(own_copy, "vad") / "cpucheck" / "reference.npz"
    before = md5(reference)
    reference.unlink()
    result = own_copy.doit("simverify:vad-SM8650")
    assert result.returncode == 0, result.stderr
    # simverify's file_dep is a target of cpucheck:vad, so doit rebuilds it first. cpucheck is
    # deterministic and writes the same bytes; doit compares file_deps by content, so the
    # verification that used exactly this reference is rightly up to date.
    assert "cpucheck:vad" in result.executed
    assert reference.is_file() and md5(reference) == before
    assert "simverify:vad-SM8650" in result.uptodate
    assert not any(t.startswith(("export", "simplify", "lint", "context", "config")) for t in result.executed)


@pytest.mark.slow
def test_sample_change_reruns_verification_of_that_graph_on_every_chip(own_copy):
    before = {soc: sim_record(own_copy, "vad", soc)["samples"] for soc in SOCS}
    own_copy.edit(VAD_YAML, "frames_per_clip: 6", "frames_per_clip: 3")
    result = own_copy.doit("simverify")
    assert result.returncode == 0, result.stderr
    # export re-runs (options are in its key) but writes the same graph, so simplify/lint/context
    # are up to date; the samples changed, so cpucheck and both chips' simulate + simverify re-run; minilm untouched.
    assert result.executed == {"export:vad", "cpucheck:vad", "simulate:vad-SM8650", "simulate:vad-SM8750",
                               "simverify:vad-SM8650", "simverify:vad-SM8750"}
    cpu_samples = json.loads((graph_dir(own_copy, "vad") / "cpucheck" / "cpucheck.json").read_text())["samples"]
    with np.load(graph_dir(own_copy, "vad") / "cpucheck" / "reference.npz") as ref:
        assert len(ref["output"]) == cpu_samples
    for soc in SOCS:
        rec = sim_record(own_copy, "vad", soc)
        assert rec["samples"] == cpu_samples < before[soc]
        assert rec["status"] == "passed"
        with np.load(chip_dir(own_copy, "vad", soc) / "simulate" / "outputs.npz") as out:
            assert len(out["output"]) == cpu_samples
    assert own_copy.doit("simverify").executed == set()
