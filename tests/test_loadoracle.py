"""The offline load oracle (issue 41, item 2): its rule table from the binary's own fields, the generated device table
the Python selector, the Java selector (tests/test_ship_select.py) and the oracle agree on, and the simulator fact
that decides which cases `doit compat` can measure (tests/test_toolchains.py measures them on real binaries).
"""
from __future__ import annotations

import json

import pytest
from device_table import DEVICE_CASES, FREE_MEMORY, RUNTIMES, generate, soc_rows, text

from qnn_tasks.qnn import loadoracle as oracle
from qnn_tasks.qnn import select

SM8650 = {"name": "SM8650", "soc_id": 57, "dsp_arch": "v75", "vtcm_mb": 8}
ISSUE = "v2:6:2.51.0:5.51.0:0:57:8:0"  # what every _ctx.onnx built here for SM8650 carries


def row(name: str) -> dict:
    return next(r for r in soc_rows() if r["name"] == name)


def built(ep: str = ISSUE, arch: str = "v75") -> oracle.BinaryFacts:
    return oracle.facts(ep, {"dsp_arch": arch, "soc_model": 57, "build_id": "v2.51.0.251023"}, "test")


def test_the_compatibility_string_is_read_field_by_field():
    fields = oracle.parse_compat_info(ISSUE)
    assert fields == {"backend_id": 6, "sdk": "2.51.0", "backend_api": "5.51.0", "archs": (0,), "soc_models": (57,),
                      "vtcm_mbs": (8,), "user_driver": False}
    assert oracle.parse_compat_info("v2:6:2.51.0:5.51.0:73,75:43,57:8:0") is None  # unequal lists: the EP refuses
    assert oracle.parse_compat_info("6:2.51.0:5.51.0:0.0.0:75:0") is None  # v1 carries no soc_model or VTCM
    assert oracle.parse_compat_info(None) is None
    f = built()
    assert (f.qnn_version, f.soc_models, f.archs, f.vtcm_mbs, f.bin_arch) == ("2.51.0", (57,), (0,), (8,), 75)


@pytest.mark.parametrize("soc, runtime, outcome, rule, code", [
    ("SM8650", "2.51.0", oracle.LOADS, "match", None),
    ("SM8650", "v2.52.0.260101", oracle.LOADS, "match", None),
    ("SM8650", "2.47.0", oracle.REFUSED, "runtime-older", "5000/5005"),
    ("SM8650", None, oracle.REFUSED, "runtime-unknown", "14001"),
    ("SM8550", "2.51.0", oracle.REFUSED, "arch-newer", "5005"),       # v75 binary, v73 chip
    ("SM8350", "2.51.0", oracle.REFUSED, "arch-newer", "5005"),
    ("SM8750", "2.51.0", oracle.RECOMPILE, "arch-older", None),        # v75 binary, v79 chip
    ("QCS8300", "2.51.0", oracle.RECOMPILE, "soc-model", None),        # another v75 chip
])
def test_a_built_binary_on_each_kind_of_device(soc, runtime, outcome, rule, code):
    p = oracle.predict(built(), row(soc), runtime, "vad_ctx_qnn.bin")
    assert (p.outcome, p.rule, p.code) == (outcome, rule, code), p.reason
    assert p.reason and "\n" not in p.reason and (soc in p.reason)
    assert oracle.RULE[rule].outcome == outcome and oracle.RULE[rule].code == code


def test_the_v6x_v7x_boundary_and_vtcm_are_the_eps_rules():
    v69 = oracle.facts("v2:6:2.51.0:5.51.0:69:36:8:0", {"dsp_arch": "v69"}, "test")
    p = oracle.predict(v69, row("SM8550"), "2.51.0")
    assert (p.rule, p.outcome, p.ort_score) == ("arch-generation", oracle.REFUSED, "UNSUPPORTED")
    big = oracle.facts("v2:6:2.51.0:5.51.0:68:30:8:0", {"dsp_arch": "v68"}, "test")
    p = oracle.predict(big, row("SM8350"), "2.51.0")  # 4 MB of VTCM on SM8350
    assert (p.rule, p.outcome, p.ort_score) == ("vtcm", oracle.REFUSED, "UNSUPPORTED") and "8 MB" in p.reason
    small = oracle.facts("v2:6:2.51.0:5.51.0:81:97:4:0", {"dsp_arch": "v81"}, "test")
    assert oracle.predict(small, row("SM8845"), "2.51.0").rule == "vtcm-smaller"
    other = oracle.facts("v2:7:2.51.0:5.51.0:75:57:8:0", {"dsp_arch": "v75"}, "test")
    assert oracle.predict(other, SM8650, "2.51.0").rule == "backend"
    assert oracle.predict(oracle.facts(None, {}, "test"), SM8650, "2.51.0").rule == "unreadable"


def test_ort_scores_a_binary_built_with_soc_model_only_as_prefer_recompilation():
    # the EP skips its arch check for an arch of 0 and never finds it equal to the device's: PREFER_RECOMPILATION
    # even on its own chip; with the arch written, OPTIMAL (ValidateCompatibilityInfoV2, onnxruntime-qnn #482/#806)
    assert oracle.predict(built(), SM8650, "2.51.0").ort_score == "PREFER_RECOMPILATION"
    explicit = oracle.facts("v2:6:2.51.0:5.51.0:75:57:8:0", {"dsp_arch": "v75"}, "test")
    assert oracle.predict(explicit, SM8650, "2.51.0").ort_score == "OPTIMAL"
    # and so the EP's own score misses a v75 binary on a v73 chip that the binary's dsp_arch catches
    p = oracle.predict(built(), row("SM8550"), "2.51.0")
    assert p.ort_score == "PREFER_RECOMPILATION" and p.outcome == oracle.REFUSED


def test_the_version_rule_is_the_selectors_own():
    p = oracle.predict(built(), SM8650, "2.47.0", "x.bin")
    binary = {"min_runtime_qnn": "2.51.0", "min_runtime_from": "the binary's test", "precision": "", "path": "x.bin"}
    assert select.runtime_refusal(binary, select.version("2.47.0")).strip() in p.reason
    assert oracle.RULE[select.RUNTIME_OLDER].code == select.CODE
    # the manifest's copy of the binary's fields says the same as the binary
    manifest_binary = {"qnn_version": "2.51.0", "soc_model": 57, "dsp_arch": "v75", "ep_compatibility_info": ISSUE}
    assert oracle.manifest_facts(manifest_binary).as_dict() | {"source": "test"} == built().as_dict()


def test_every_rule_names_its_source():
    assert [r.name for r in oracle.RULES][-1] == "match"
    for rule in oracle.RULES:
        assert rule.source and rule.when and rule.outcome in (oracle.LOADS, oracle.RECOMPILE, oracle.REFUSED)
    chip_rules = [r for r in oracle.RULES if r.name.startswith(("arch", "vtcm"))]
    assert chip_rules and all("#482" in r.source for r in chip_rules)


def test_the_committed_device_table_is_the_generated_one():
    assert DEVICE_CASES.read_text() == text(generate()), "regenerate: python3 tests/device_table.py"


def test_the_device_table_covers_every_dimension():
    cases = json.loads(DEVICE_CASES.read_text())["cases"]
    assert len(cases) >= 200
    assert {c["soc"] for c in cases} == {r["name"] for r in soc_rows()}
    assert {c["runtime_qnn"] for c in cases} == set(RUNTIMES)  # None: libraries absent
    assert {c["manifest"] for c in cases} == {"fp16-first", "w8a16-first"}
    assert {c["length"] for c in cases} == {None, 10, 40, 100}
    assert {c["free_memory_mb"] for c in cases} == set(FREE_MEMORY)
    rules = {c["expect"]["rule"] for c in cases if c["expect"]} | {c["size"]["rule"] for c in cases if c["size"]}
    assert rules >= {select.NPU, select.NO_BUILD, select.RUNTIME_OLDER, select.RUNTIME_UNKNOWN, select.LOAD_FAILED,
                     select.OUT_OF_MEMORY, select.FITS, select.TOO_LONG}
    # a device with room for the w8a16 binary only takes it, naming the fp16 one it skipped and why
    roomy = [c["expect"] for c in cases if c["free_memory_mb"] == 40 and c["soc"] == "SM8650" and c["graph"] == "enc"]
    assert len(roomy) == 2 and all(e["precision"] == "w8a16" and "skipped: fp16 SM8650/enc.fp16.bin needs 49 MiB "
                                   "resident, the device has 40 MiB free (QNN error 1002)" in e["reason"] for e in roomy)
    refused = " ".join(e for c in cases for e in c["load_errors"].values())
    assert "VTCM" in refused and "arch is newer" in refused
    precisions = {(c["soc"], c["expect"]["precision"]) for c in cases if c["expect"] and c["expect"]["target"] == "npu"}
    assert ("SM8650", "fp16") in precisions and ("SM8650", "w8a16") in precisions


def test_the_python_selector_and_the_oracle_choose_the_same_in_every_case():
    table = json.loads(DEVICE_CASES.read_text())
    wrong = []
    for c in table["cases"]:
        manifest, graph = table["manifests"][c["manifest"]], c["graph"]
        if c["length"] is not None:
            size = select.choose_size(manifest, graph, c["length"])
            if (size.graph, size.rule, size.reason) != (c["size"]["graph"], c["size"]["rule"], c["size"]["reason"]):
                wrong.append((c["name"], "size", size.reason))
            graph = size.graph
        if graph is None:
            if c["expect"] is not None:
                wrong.append((c["name"], "no graph"))
            continue
        tried: list[str] = []

        def load(b, errors=c["load_errors"], tried=tried):
            tried.append(b["path"])
            return errors.get(b["path"])

        d = select.choose(manifest, graph, c["soc"], c["runtime_qnn"], load, c["free_memory_mb"])
        e = c["expect"]
        if (d.target, d.path, d.precision, d.rule, d.reason, tried) != (e["target"], e["path"], e["precision"],
                                                                         e["rule"], e["reason"], e["loaded"]):
            wrong.append((c["name"], "selector", d.reason))
        device = {"name": c["soc"], **c["device"]}
        o = oracle.choose(manifest, graph, device, c["runtime_qnn"], c["free_memory_mb"])
        if (o.target, o.path, o.precision, o.rule, o.reason) != (e["target"], e["path"], e["precision"], e["rule"],
                                                                  e["reason"]):
            wrong.append((c["name"], "oracle", o.reason))
    assert wrong == [], wrong[:5]


def test_agreement_compares_loads_and_the_refusal_code():
    refused = {"loads": False, "code": "5000/5005"}
    assert oracle.agrees(refused, {"loads": False, "error_code": "5000"})
    assert oracle.agrees(refused, {"loads": False, "error_code": "QNN_CONTEXT_ERROR_INVALID_ARGUMENT"})  # = 5000
    assert not oracle.agrees(refused, {"loads": False, "error_code": "1002"})
    assert not oracle.agrees(refused, {"loads": True, "matches": True})
    assert not oracle.agrees({"loads": True, "code": None}, {"loads": False, "error_code": "5000"})


def test_the_simulator_loads_a_binary_under_any_chip_it_is_told(tmp_path):
    """Why doit compat measures only the version rule: the x86 HTP simulator loads a binary built for SM8650 (v75)
    when told an SM8550 (v73), an SM8350 (v68, 4 MB VTCM) or an htp_arch of 79, where a phone would refuse the first
    two. Measured with onnxruntime-qnn 2.7.0 (QNN 2.51); if a QNN starts checking, this test says so."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from qnn_tasks.qnn.binary import read_binary_info
    from qnn_tasks.stages.socscheck import tiny_model
    from qnn_tasks.toolchains.ort_qnn import compile_context, session_options

    tiny_model(tmp_path / "t.onnx")
    out = tmp_path / "b" / "t_ctx.onnx"
    out.parent.mkdir()
    compile_context(tmp_path / "t.onnx", out, {"soc_model": "57", "vtcm_mb": "8"}, tmp_path / "c.log")
    meta = {p.key: p.value for p in onnx.load(str(out), load_external_data=False).metadata_props}
    info = read_binary_info(out.with_name("t_ctx_qnn.bin")).to_dict()
    f = oracle.facts(meta[oracle.EP_KEY], info, "t_ctx.onnx")
    assert (f.soc_models, f.vtcm_mbs, f.bin_arch, f.backend_id) == ((57,), (8,), 75, 6)
    sample = {"x": np.zeros((1, 8, 16, 16), np.float32)}
    for told, soc in (({"soc_model": "43", "vtcm_mb": "8"}, "SM8550"), ({"soc_model": "30", "vtcm_mb": "4"}, "SM8350"),
                      ({"htp_arch": "79"}, None)):
        session = ort.InferenceSession(str(out), session_options(told, disable_cpu_fallback=True))
        assert session.run(None, sample)[0].shape == (1, 8, 16, 16)
        if soc:  # what the oracle says a phone of that chip would do
            assert oracle.predict(f, row(soc), "2.51.0").outcome == oracle.REFUSED
