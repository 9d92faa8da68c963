"""w4a16 (issue 42, item 2): 4-bit weights of the MatMuls, 8-bit LayerNorm scales, 16-bit activations, on a residual
MLP stack built in the test: calibrated, quantized, compiled for SM8650, verified on the simulator, shipped beside
fp16 and chosen by the selector after it. Real: onnxruntime's QNN quantizer and compiler, the x86 HTP simulator."""
from __future__ import annotations

import json

import pytest
from test_split import YAML, stack_project

from qnn_tasks.qnn import select

pytestmark = pytest.mark.slow
SOC = "SM8650"


@pytest.fixture(scope="module")
def four_bit(tmp_path_factory):
    project = stack_project(tmp_path_factory.mktemp("w4a16") / "p")
    own = project.path("socs/socs.yaml")  # the test-lowered weight budget of test_split is not this test's
    own.write_text(own.read_text().replace("context_mb: 2,", ""))
    project.edit(YAML, "    socs: [SM8650]\n", "    socs: [SM8650]\n    precision: [fp16, w4a16]\n"
                                               "    calibration: {samples: 8}\n")
    # 4-bit weights lose more than 8-bit: on this stack of random weights cosine 0.987 at the default 0.99 (the
    # failure names the 4-bit weights and w8a16: test_the_default_thresholds_hold_4_bit_to_account); its owner
    # accepts 0.98 for w4a16 only, as a model.yaml may
    project.edit(YAML, "    verify: {samples: 3}\n",
                 "    verify: {samples: 3, w4a16: {thresholds: {min_cosine: 0.98, min_snr_db: 12}}}\n")
    import numpy as np  # 8 calibration samples and 3 verified: more rows of the same seeded noise

    np.savez(project.path("models/stack/samples/x.npz"),
             x=np.random.default_rng(4).standard_normal((8, 1, 16, 256)).astype(np.float32))
    project.result = project.doit(f"simverify:net-{SOC}", f"simverify:net-w4a16-{SOC}")
    return project


def test_w4a16_builds_4_bit_weights_and_verifies(four_bit):
    assert four_bit.result.returncode == 0, four_bit.result.stdout + four_bit.result.stderr
    assert {"calibrate:net", "quantize:net-w4a16", f"context:net-w4a16-{SOC}"} <= four_bit.result.executed
    quant = four_bit.one_json("build/stack/net/*/w4a16/quantize/quantize.json")
    assert quant["weight_type"].startswith("int4") and quant["four_bit_weights"] == 8  # 2 MatMuls x 4 blocks
    sim = four_bit.one_json(f"build/stack/net/*/w4a16/{SOC}/simverify/simverify.json")
    assert sim["status"] == "passed" and sim["precision"] == "w4a16"
    assert sim["metrics"]["y"]["thresholds"] == {"min_cosine": 0.98, "min_snr_db": 12}
    assert 0.98 < sim["metrics"]["y"]["cosine"] < 0.9999
    w4 = four_bit.one_json(f"build/stack/net/*/w4a16/{SOC}/context/context.json")
    fp16 = four_bit.one_json(f"build/stack/net/*/fp16/{SOC}/context/context.json")
    assert w4["partition"]["cpu_nodes"] == [] and w4["provider_options"]["offload_graph_io_quantization"] == "0"
    const4, const16 = (c["binary"]["graphs"][0]["memory"]["const"] for c in (w4, fp16))
    assert const4 < 0.35 * const16  # 4-bit MatMul weights: about a quarter of fp16's (plus scales and LayerNorms)


def test_the_default_thresholds_hold_4_bit_to_account(four_bit, tmp_path):
    from conftest import copy_project

    strict = copy_project(tmp_path / "strict", source=four_bit.root, with_build=True)
    strict.edit(YAML, ", w4a16: {thresholds: {min_cosine: 0.98, min_snr_db: 12}}", "")
    result = strict.doit(f"simverify:net-w4a16-{SOC}")
    line = result.failure_line(f"simverify:net-w4a16-{SOC}")
    assert result.returncode != 0 and "is below the threshold 0.99" in line, line
    assert "4-bit weights lose accuracy here: try precision: w8a16 (8-bit weights)" in line, line
    assert result.executed == {f"simverify:net-w4a16-{SOC}"}  # a threshold keys the judgement only


def test_a_chip_that_runs_no_quantized_graph_skips_w4a16_visibly(four_bit):
    from qnn_tasks.modelspec.load import load_project

    project = load_project(four_bit.root)
    fp16_only = project.socs[SOC].__class__(**{**project.socs[SOC].__dict__, "runs": ("fp16",)})
    assert fp16_only.skip_reason("w4a16") == f"{SOC} (v75) cannot run w4a16 graphs, only fp16 (runs: ['fp16'])"
    assert project.socs[SOC].supports("w4a16")  # runs w8a16: runs every quantized precision


def test_dist_ships_w4a16_after_fp16_and_the_selector_takes_it_when_fp16_does_not_fit(four_bit):
    shipped = four_bit.doit("dist")
    assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    data = json.loads(four_bit.path("dist/stack/manifest.json").read_text())
    binaries = {b["precision"]: b for b in data["graphs"]["net"]["binaries"]}
    assert set(binaries) == {"fp16", "w4a16"} and binaries["w4a16"]["path"] == f"{SOC}/net.w4a16.bin"
    assert binaries["w4a16"]["memory"]["resident_bytes"] < binaries["fp16"]["memory"]["resident_bytes"]
    runtime = next(iter(data["runtime_libs"].values()))["qnn_version"]
    first = select.choose(data, "net", SOC, runtime, lambda b: None)
    assert (first.target, first.precision) == ("npu", "fp16")  # not named by the order: w4a16 comes after fp16
    room = -(-binaries["w4a16"]["memory"]["resident_bytes"] // select.MIB)
    small = select.choose(data, "net", SOC, runtime, lambda b: None, free_memory_mb=room)
    assert (small.target, small.precision) == ("npu", "w4a16") and "fp16 SM8650/net.fp16.bin needs" in small.reason
