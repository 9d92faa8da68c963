"""The phone-time estimate (docs/latency.md): features read from the ONNX, the committed fit applied as arithmetic,
refusals and widened bands outside the fit's families, the fields report.json and manifest.json carry, and the
leave-one-out figure the docs quote against the benchmark's committed output."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qnn_tasks.latency import estimate as est
from qnn_tasks.latency import shown
from qnn_tasks.latency.features import graph_features
from qnn_tasks.ship import manifest as mf

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "latency_fit.txt"
SUMMARY = re.compile(r"leave-one-model-out(?: \((\w+)\))?: median (\d+)%, p90 (\d+)% over (\d+) models x (\d+) chips")


def conv_stack(layers: int = 30, channels: int = 32, size: int = 56, extra: list[str] = ()) -> onnx.ModelProto:
    """Conv -> Relu `layers` times (a small CNN inside the fitted range), then one node of each op in `extra`."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x = f"r{i}"
    for j, op in enumerate(extra):
        nodes.append(helper.make_node(op, [x], [f"e{j}"]))
        x = f"e{j}"
    shape = [1, channels, size, size]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def lstm_graph() -> onnx.ModelProto:
    """A conv stack with an LSTM after it: recurrence, which no fitted model has."""
    model = conv_stack()
    g = model.graph
    hidden, steps = 16, 4
    g.initializer.extend([numpy_helper.from_array(np.zeros((1, 4 * hidden, 8), np.float32), "W"),
                          numpy_helper.from_array(np.zeros((1, 4 * hidden, hidden), np.float32), "R")])
    g.input.append(helper.make_tensor_value_info("seq", TensorProto.FLOAT, [steps, 1, 8]))
    g.node.append(helper.make_node("LSTM", ["seq", "W", "R"], ["y"], hidden_size=hidden))
    g.output.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, 1, 1, hidden]))
    return model


def test_features_count_conv_and_matrix_macs_from_shapes():
    f = graph_features(conv_stack(layers=2, channels=8, size=10))
    assert f["conv_macs"] == 2 * (10 * 10 * 8) * (8 * 3 * 3)
    assert f["matmul_macs"] == 0 and f["families"] == {"conv": 2, "elementwise": 2}
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 6, 5, 7])
    b = numpy_helper.from_array(np.zeros((7, 3), np.float32), "b")
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 5, 3])
    mm = helper.make_model(helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "m", [a], [out], [b]),
                           opset_imports=[helper.make_opsetid("", 17)])
    f = graph_features(mm)
    assert f["matmul_macs"] == 6 * 5 * 3 * 7 and f["params"] == 21 and f["activations"] == 90


def test_the_estimate_is_deterministic_and_is_the_fit_applied():
    features = graph_features(conv_stack())
    first = est.estimate(features, "SM8650", "fp16")
    again = est.estimate(graph_features(conv_stack()), "SM8650", "fp16")
    assert first == again
    p = est.load_fit()["precisions"]["fp16"]
    by_hand = p["chip_scale"]["SM8650"] * sum(k * v for k, v in zip(p["ms_per_unit"], est.terms_of(features)))
    assert first["estimate"] == pytest.approx(by_hand, rel=5e-3)
    assert first["low"] < first["estimate"] < first["high"]
    assert first["high"] / first["estimate"] == pytest.approx(math.exp(p["band_log"]), rel=1e-2)
    assert first["basis"].startswith(f"estimated from {p['measurements']} published phone measurements")
    assert "measured" not in first["basis"].replace("measurements", "")
    assert "widened" not in first and first["fit_error"] == p["fit_error"]
    # a newer chip is faster on the same graph, as AI Hub's timings say
    assert est.estimate(features, "SM8850", "fp16")["estimate"] < first["estimate"]


def test_a_few_ops_the_fit_never_saw_widen_the_band_visibly():
    plain = est.estimate(graph_features(conv_stack()), "SM8650", "fp16")
    odd = est.estimate(graph_features(conv_stack(extra=["Sin", "Cos"])), "SM8650", "fp16")
    assert odd["estimate"] is not None
    assert any("Cos" in why and "Sin" in why for why in odd["widened"])
    plain_band = math.log(plain["high"] / plain["low"])
    assert math.log(odd["high"] / odd["low"]) == pytest.approx(est.WIDEN * plain_band, rel=2e-2)


def test_a_graph_far_outside_the_fitted_families_gets_no_number():
    lstm = est.estimate(graph_features(lstm_graph()), "SM8650", "fp16")
    assert lstm["estimate"] is None and "LSTM" in lstm["refused"]
    mostly_unseen = est.estimate(graph_features(conv_stack(layers=2, channels=8, size=10, extra=["Sin"] * 40)),
                                 "SM8650", "fp16")
    assert mostly_unseen["estimate"] is None and "op mix the fit never saw" in mostly_unseen["refused"]
    tiny = est.estimate(graph_features(conv_stack(layers=30, channels=2, size=4)), "SM8650", "fp16")
    assert tiny["estimate"] is None and "outside the fitted" in tiny["refused"]
    for chip, precision in (("SM8350", "fp16"), ("SM8650", "w4a16")):
        refused = est.estimate(graph_features(conv_stack()), chip, precision)
        assert refused["estimate"] is None and refused["refused"].startswith("no published")


def test_report_and_manifest_fields_carry_the_basis_and_fit_the_schema():
    lint = shown.lint_fields(conv_stack())
    latency = shown.latency_ms(lint, "SM8650", "fp16", audio_seconds=0.5)
    assert latency["realtime_factor"] == {"estimate": pytest.approx(latency["estimate"] / 1000 / 0.5, rel=5e-3),
                                          "audio_seconds_per_inference": 0.5}
    refused = shown.latency_ms(shown.lint_fields(lstm_graph()), "SM8650", "fp16")
    schema = mf.schema()
    jsonschema = pytest.importorskip("jsonschema")
    for entry in (latency, refused):
        jsonschema.validate(entry, {"$ref": "#/$defs/latency_estimate", "$defs": schema["$defs"]})
    bad = {**latency, "basis": "measured on a phone"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, {"$ref": "#/$defs/latency_estimate", "$defs": schema["$defs"]})
    assert "latency_ms" in schema["$defs"]["binary"]["properties"]
    assert shown.latency_ms({}, "SM8650", "fp16") is None  # a lint record from before the estimate: no field
    # the phone's own time sits beside the estimate once `doit verify` measured it
    verify = {"devices": [{"model": "SM-S921B", "soc_model": "SM8650", "timing": {"per_inference_median_s": 0.0021}}]}
    both = shown.with_phone(latency, verify)
    assert both["phone"] == [{"device": "SM-S921B", "soc_model": "SM8650", "median_ms": 2.1}]
    assert both["estimate"] == latency["estimate"] and shown.with_phone(latency, None) == latency
    chained = est.chain([latency, latency])
    assert chained["estimate"] == pytest.approx(2 * latency["estimate"], rel=1e-2)
    assert est.chain([latency, refused])["estimate"] is None


def test_the_docs_quote_the_benchmarks_committed_leave_one_out_figures():
    committed = {m.group(1) or "fp16": m.groups()[1:] for m in SUMMARY.finditer(RESULT.read_text())}
    assert set(committed) == {"fp16", "w8a16"}
    fit = est.load_fit()["precisions"]
    for precision, (median, p90, models, chips) in committed.items():
        error = fit[precision]["fit_error"]
        assert round(error["median_pct"]) == int(median) and round(error["p90_pct"]) == int(p90)
        assert (error["models"], error["chips"]) == (int(models), int(chips))
    docs = {m.group(1) or "fp16": m.groups()[1:] for m in SUMMARY.finditer((ROOT / "docs" / "latency.md").read_text())}
    assert docs == committed
    readme = [m.groups()[1:] for m in SUMMARY.finditer((ROOT / "README.md").read_text())]
    assert readme == [committed["fp16"]]
    # what the docs promise of fp16 holds: median <= 25%, p90 <= 50%, >= 15 models x 3 chips
    median, p90, models, chips = map(int, committed["fp16"])
    assert median <= 25 and p90 <= 50 and models >= 15 and chips >= 3


def test_the_published_table_names_its_source_for_every_row():
    import csv

    rows = list(csv.DictReader(open(ROOT / "qnn_tasks" / "data" / "latency" / "aihub_perf.csv")))
    assert {r["source_commit"] for r in rows} == {est.load_fit()["source"]["commit"]}
    assert all(re.fullmatch(r"qai_hub_models/models/\w+/perf\.yaml", r["source_file"]) for r in rows)
    fp16 = {r["model"] for r in rows if r["precision"] == "float" and r["chip"] in ("SM8650", "SM8750", "SM8850")}
    assert len(fp16) >= 25
    mobilenet = {(r["chip"], r["runtime"]): float(r["ms"]) for r in rows if r["model"] == "mobilenet_v2"
                 and r["precision"] == "float"}
    assert mobilenet[("SM8650", "onnx")] == 0.43  # the example, typed from the public file


def test_planning_reads_the_estimate_without_numpy_or_onnx(tmp_path):
    """`doit list` applies the fit at planning time: that path must import nothing heavy."""
    import subprocess
    import sys

    record = tmp_path / "record.json"
    record.write_text(json.dumps(shown.lint_fields(conv_stack())))
    code = ("import sys; from qnn_tasks.latency.shown import doc_text; "
            f"print(doc_text({str(record)!r}, 'SM8650', 'fp16')); "
            "print(sorted(m for m in ('numpy', 'onnx', 'onnxruntime', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout.splitlines()
    assert out[0].startswith("phone ~") and "estimated" in out[0] and out[1] == "[]"
    assert shown.doc_text(tmp_path / "missing.json", "SM8650", "fp16") == ""


def test_the_report_and_doit_list_show_each_targets_estimate_before_the_phone(verified):
    data = json.loads(verified.path("build/report/report.json").read_text())
    for t in data["targets"]:
        latency = t["latency_ms"]
        assert latency["basis"].startswith("estimated from "), t["name"]
        if latency["estimate"] is None:
            assert latency["refused"], t["name"]
        else:
            assert latency["low"] < latency["estimate"] < latency["high"]
    minilm = [t["latency_ms"] for t in data["targets"] if t["graph"] == "minilm"]
    assert minilm and all(lat["estimate"] for lat in minilm)
    vad = [t["latency_ms"] for t in data["targets"] if t["graph"] == "vad"]  # declares audio_seconds_per_sample
    assert all("realtime_factor" in lat for lat in vad if lat["estimate"] is not None)
    page = verified.path("build/report/report.md").read_text()
    assert "## Phone time, estimated before the phone (not measured" in page
    listing = verified.doit("list", "--all", check=True).stdout
    compiles = [line for line in listing.splitlines() if line.startswith("context:minilm-")]
    assert compiles and all("estimated" in line and "AI Hub" in line for line in compiles), compiles
