"""The device-side choice (issue 32, item 5): qnn_tasks/qnn/select.py and the Java reference for apps agree; and the
size of a graph with sizes an input runs at (issue 33, "chosen at run time"): the table's size_cases, through both.

One decision table (qnn_tasks/ship/java/src/test/resources/selector_cases.json: stand-in phones of SM8650, SM7550,
an Exynos chip, an SM8650 with older runtime libraries, one whose load fails, ...) runs through the Python selector
here and through Selector.java, compiled with Debian's JDK and run under JUnit 4 (Debian's junit4) against Android's
own org.json (Debian's libandroid-json-java): the same target, path, precision, rule and reason string per case.
No phone: the "did the context load" callback is the table's (which loads fail is part of each case).
Bad manifests (issue 40, item 5): a sibling table (manifest_cases.json) of broken manifests and builds dist left out
runs through both the same way: the CPU with the same reason naming the field, never a guess or a traceback.
"""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from qnn_tasks.qnn import select

JAVA = Path(str(resources.files("qnn_tasks.ship") / "java"))
CASES = JAVA / "src" / "test" / "resources" / "selector_cases.json"
MANIFEST_CASES = CASES.with_name("manifest_cases.json")
JARS = [Path("/usr/share/java/com.android.json.jar"), Path("/usr/share/java/junit4.jar"),
        Path("/usr/share/java/hamcrest.jar")]


def table() -> dict:
    return json.loads(CASES.read_text())


def manifest_table() -> dict:
    return json.loads(MANIFEST_CASES.read_text())


def manifest_of(case: dict) -> dict | str:
    """A manifest_cases.json case's manifest: its text, or its base with `set` and `delete` applied."""
    if "text" in case:
        return case["text"]
    manifest = copy.deepcopy(table()["manifests"][case["base"]])
    for path, value in case.get("set", []):
        *parents, last = path
        holder = manifest
        for step in parents:
            holder = holder[step]
        holder[last] = value
    for path in case.get("delete", []):
        *parents, last = path
        holder = manifest
        for step in parents:
            holder = holder[step]
        del holder[last]
    return manifest


def run_choose(manifest, case: dict) -> tuple[select.Decision, list[str]]:
    asked: list[str] = []

    def load(binary) -> str | None:
        asked.append(binary["path"])
        return case["load_errors"].get(binary["path"])

    return select.choose(manifest, case["graph"], case["soc"], case["runtime_qnn"], load), asked


@pytest.mark.parametrize("case", table()["cases"], ids=lambda c: c["name"])
def test_python_selector_follows_the_table(case):
    manifest = table()["manifests"][case["manifest"]]
    asked: list[str] = []

    def load(binary) -> str | None:
        asked.append(binary["path"])
        return case["load_errors"].get(binary["path"])

    decision = select.choose(manifest, case["graph"], case["soc"], case["runtime_qnn"], load)
    expect = case["expect"]
    assert decision.as_dict() == {k: expect[k] for k in ("target", "path", "precision", "reason", "rule")}
    assert asked == expect["loaded"]


@pytest.mark.parametrize("case", manifest_table()["bad"], ids=lambda c: c["name"])
def test_python_selector_chooses_the_cpu_on_a_bad_manifest_naming_the_field(case):
    """Issue 40, item 5: the same cases SelectorTest passes; no guess (a substring of socs), no raw TypeError."""
    decision, asked = run_choose(manifest_of(case), case)
    expect = case["expect"]
    assert decision.as_dict() == {k: expect[k] for k in ("target", "path", "precision", "reason", "rule")}
    assert asked == expect["loaded"] == []
    assert select.read_manifest(manifest_of(case))[1] == case["problem"]
    size = select.choose_size(manifest_of(case), case["graph"], 5)
    assert size.as_dict() == {"graph": None, "size": None, "pad": 0, "truncate": 0, "reason": case["problem"],
                              "rule": select.BAD_MANIFEST, "pad_values": {}}


@pytest.mark.parametrize("case", manifest_table()["left_out"], ids=lambda c: c["name"])
def test_python_selector_says_why_a_chip_was_left_out(case):
    decision, asked = run_choose(manifest_of(case), case)
    expect = case["expect"]
    assert decision.as_dict() == {k: expect[k] for k in ("target", "path", "precision", "reason", "rule")}
    assert asked == expect["loaded"]


def test_the_bad_manifest_table_holds_the_cases_issue_40_names():
    """The probes of the issue, with the outcome it asks for: the CPU, the field named, one line."""
    cases = {c["name"]: c for c in manifest_table()["bad"]}
    substring = cases["socs-a-string-is-no-substring-match"]
    assert substring["soc"] == "SM8" and substring["expect"]["target"] == "cpu"
    assert "graphs.minilm.binaries[0].socs: expected a non-empty list, got a string" in substring["problem"]
    assert "graphs.minilm: expected a mapping, got a list" in cases["a-graph-a-list"]["problem"]
    assert "selection.sizes[0].sizes: expected a non-empty list, got a string" in cases["size-list-a-string"]["problem"]
    assert "NaN" in cases["pad-nan"]["text"] and "truncated" in cases["truncated-file"]["problem"]
    for case in cases.values():
        problem = case["problem"]
        assert problem.startswith("manifest.json: ") and problem.endswith("(fix: rebuild the package with doit dist)")
        assert case["expect"]["rule"] == "bad-manifest" and "\n" not in problem
    told = {c["name"]: c["expect"] for c in manifest_table()["left_out"]}
    assert told["sm8650-failed-verification"]["reason"].startswith("the build for SM8650 failed verification (")
    assert told["sm8650-failed-verification"]["rule"] == select.UNVERIFIED
    assert "no build" not in told["sm8650-failed-verification"]["reason"]


def _schema_key(error) -> str:
    """A jsonschema error's place in the selector's words: graphs.minilm.binaries[0].socs; a missing property is
    named itself."""
    key = ""
    for step in error.absolute_path:
        key += f"[{step}]" if isinstance(step, int) else (f".{step}" if key else step)
    if error.validator == "required":
        missing = error.message.split("'")[1]
        key = f"{key}.{missing}" if key else missing
    return key or "(root)"


def test_every_field_the_selectors_refuse_the_schema_refuses_too():
    """The selectors' checks are the schema's rules (manifest.schema.json, by jsonschema), not new ones: each bad
    case's field is one the schema names an error at (its manifest, partial as the table's are, has others too)."""
    jsonschema = pytest.importorskip("jsonschema")
    from qnn_tasks.ship import manifest as mf

    validator = jsonschema.Draft202012Validator(mf.schema())
    checked = 0
    for case in manifest_table()["bad"]:
        if case["problem"] == select.NOT_JSON:
            continue  # not JSON: nothing for a schema to read
        found = manifest_of(case)
        found = json.loads(found) if isinstance(found, str) else found
        key = case["problem"].removeprefix("manifest.json: ").split(": ")[0]
        keys = {_schema_key(e) for e in validator.iter_errors(found)}
        assert key in keys, (case["name"], key, sorted(keys))
        checked += 1
    assert checked >= 40


def test_chip_names_are_compared_whole_never_as_substrings():
    assert select.candidates([{"socs": "SM8650"}], "SM8") == []
    assert select.candidates([{"socs": ["SM8650"]}], "SM8") == []
    assert select.candidates([{"socs": ["SM8650"]}], "SM8650") == [{"socs": ["SM8650"]}]


def test_a_nan_or_infinite_pad_in_a_parsed_manifest_is_named():
    """json.load reads NaN (org.json's parser does not: in a text both say "not valid JSON"); in a mapping the
    field is named, as Selector.validate names it in a JSONObject built from a Map."""
    for value in (float("nan"), float("inf"), 10**400):
        manifest = copy.deepcopy(table()["manifests"]["sized"])
        manifest["selection"]["sizes"][0]["pad"]["input_ids"] = value
        expected = ("manifest.json: selection.sizes[0].pad.input_ids: expected a finite number (fix: rebuild the "
                    "package with doit dist)")
        assert select.validate_manifest(manifest) == expected
        decision = select.choose(manifest, "minilm.seq16", "SM8650", "2.41.0", lambda b: None)
        assert (decision.target, decision.rule, decision.path) == ("cpu", "bad-manifest", "cpu/minilm.seq16.onnx")
        assert select.choose_size(manifest, "minilm", 5).reason == expected


def test_the_table_manifests_are_good_and_dist_writes_what_the_selector_reads():
    """Every manifest of the decision table passes the check (else its cases would test the check instead); a
    manifest's text reads as its mapping does."""
    for name, manifest in table()["manifests"].items():
        assert select.validate_manifest(manifest) is None, name
    text = json.dumps(table()["manifests"]["main"])
    assert select.choose(text, "minilm", "SM8650", "2.41.0", lambda b: None) == select.choose(
        table()["manifests"]["main"], "minilm", "SM8650", "2.41.0", lambda b: None)
    assert select.choose_size(text.encode(), "minilm", 5).rule == select.NO_SIZES


@pytest.mark.parametrize("case", table()["size_cases"], ids=lambda c: c["name"])
def test_python_size_choice_follows_the_table(case):
    """choose_size (issue 33, "chosen at run time"): the same cases Selector.chooseSize passes."""
    manifest = table()["manifests"][case["manifest"]]
    if "error" in case:
        with pytest.raises((KeyError, ValueError)) as raised:
            select.choose_size(manifest, case["graph"], case["length"])
        message = str(raised.value.args[0])
        assert case["error"] in message and "\n" not in message and message.startswith("manifest of ")
        return
    assert select.choose_size(manifest, case["graph"], case["length"]).as_dict() == case["expect"]


def test_the_size_table_holds_the_cases_issue_33_asks_for():
    """Each situation the app meets has a case, with the outcome asked for (not only what the code happens to do)."""
    cases = {c["name"]: c for c in table()["size_cases"]}
    expect = {name: c.get("expect") for name, c in cases.items()}
    assert (expect["fits-the-smallest"]["graph"], expect["fits-the-smallest"]["pad"]) == ("minilm.seq16", 11)
    assert (expect["exactly-the-smallest"]["graph"], expect["exactly-the-smallest"]["pad"]) == ("minilm.seq16", 0)
    assert (expect["between-sizes"]["graph"], expect["between-sizes"]["pad"]) == ("minilm.seq128", 91)
    assert (expect["longer-truncate"]["graph"], expect["longer-truncate"]["truncate"]) == ("pool.seq32", 8)
    assert expect["longer-skip"]["graph"] is None and "refuse or split" in expect["longer-skip"]["reason"]
    missing = expect["a-size-missing-from-the-package"]
    assert missing["graph"] == "minilm.seq128" and "not in the package: 64" in missing["reason"]
    assert expect["a-graph-without-sizes"]["graph"] == "head"
    assert "length 0" in cases["length-0"]["error"]


def test_a_size_choice_composes_with_the_device_choice():
    """The two calls in the app's order: choose_size, then choose on the graph it named."""
    manifest = table()["manifests"]["sized"]
    size = select.choose_size(manifest, "minilm", 37)
    decision = select.choose(manifest, size.graph, "SM8650", "2.41.0", lambda b: None)
    assert (decision.target, decision.path) == ("npu", "SM8650/minilm.seq128.fp16.bin")
    assert select.choose(manifest, size.graph, "SM7550", "2.41.0", lambda b: None).path == "cpu/minilm.seq128.onnx"


def test_pad_values_read_the_same_in_both_languages_and_a_length_is_an_integer():
    assert [select.number(v) for v in (0.0, -0.0, -10000.0, 0.25, 1e-05, 1e20, 3)] == [
        "0", "0", "-10000", "0.25", "0.00001", "100000000000000000000", "3"]
    sized = table()["manifests"]["sized"]
    with pytest.raises(ValueError, match="length True"):
        select.choose_size(sized, "minilm", True)
    with pytest.raises(ValueError, match="length 3.0"):
        select.choose_size(sized, "minilm", 3.0)
    import numpy as np  # an app's length is often a numpy count (e.g. a mask's sum)

    assert select.choose_size(sized, "minilm", np.int64(37)) == select.choose_size(sized, "minilm", 37)


def test_the_table_holds_the_issue_phones():
    """The stand-in phones issue 32 names, with the outcome it asks for (not only what the code happens to do)."""
    cases = {c["name"]: c["expect"] for c in table()["cases"]}
    assert (cases["sm8650-fp16"]["target"], cases["sm8650-fp16"]["precision"]) == ("npu", "fp16")
    assert (cases["sm7550-quantized-only"]["target"], cases["sm7550-quantized-only"]["precision"]) == ("npu", "w8a16")
    assert cases["sm7550-no-build"]["reason"].startswith("no build for SM7550")
    assert cases["exynos"]["target"] == "cpu" and cases["exynos"]["reason"].startswith("no build for s5e9945")
    older = cases["sm8650-runtime-older"]
    assert older["target"] == "cpu" and "5000/5005" in older["reason"] and "2.40.0" in older["reason"]
    failed = cases["sm8650-load-fails"]
    assert failed["target"] == "cpu" and "err 14001" in failed["reason"] and failed["loaded"] == ["SM8650/minilm.fp16.bin"]
    assert cases["same-arch-not-a-match"]["target"] == "cpu"  # SM8635 is v73 like SM7550: not a match
    assert cases["sm7675-verified-on"]["target"] == "npu"     # listed in the binary's socs: verified there


def test_versions_are_numbers_not_strings():
    assert select.older(select.version("2.9"), select.version("2.10"))
    assert not select.older(select.version("2.10"), select.version("2.9.9"))
    assert not select.older(select.version("2.41"), select.version("2.41.0"))
    assert select.version("v2.41.0.251023") == (2, 41, 0, 251023)
    assert select.version("unknown") is None and select.version(None) is None


def test_a_graph_the_manifest_lacks_or_a_newer_schema_is_an_error():
    with pytest.raises(KeyError, match="no graph 'nope'"):
        select.choose(table()["manifests"]["main"], "nope", "SM8650", "2.41.0", lambda b: None)
    newer = {**table()["manifests"]["main"], "schema_version": 2}
    with pytest.raises(ValueError, match="schema_version 2, this selector reads 1"):
        select.choose(newer, "minilm", "SM8650", "2.41.0", lambda b: None)


def test_java_reference_compiles_and_passes_the_same_table(tmp_path):
    """javac 17 + JUnit 4 from Debian (scripts/install.sh installs junit4 and libandroid-json-java)."""
    missing = [str(j) for j in JARS if not j.is_file()] + ([] if shutil.which("javac") else ["javac"])
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (bash scripts/install.sh installs default-jdk-headless, junit4, "
                    f"libandroid-json-java)")
    classpath = ":".join(map(str, JARS))
    sources = sorted(str(p) for p in JAVA.rglob("*.java"))
    assert any(s.endswith("Selector.java") for s in sources) and any(s.endswith("SelectorTest.java") for s in sources)
    # --release 8: the language level every Android toolchain takes (Android itself provides org.json)
    compiled = subprocess.run(["javac", "--release", "8", "-Xlint:all,-options", "-Werror", "-d", str(tmp_path),
                               "-cp", classpath, *sources],
                              capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    run = subprocess.run(["java", f"-Dselector.cases={CASES}", f"-Dselector.manifest_cases={MANIFEST_CASES}",
                          f"-Dselector.device_cases={CASES.with_name('device_cases.json')}",
                          "-cp", f"{tmp_path}:{classpath}", "org.junit.runner.JUnitCore", "qnntasks.ship.SelectorTest"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "OK (11 tests)" in run.stdout, run.stdout + run.stderr


def test_java_logic_has_no_android_dependency():
    source = (JAVA / "src" / "main" / "java" / "qnntasks" / "ship" / "Selector.java").read_text()
    imports = [line for line in source.splitlines() if line.startswith("import ")]
    assert imports and all(i.startswith(("import java.", "import org.json.")) for i in imports), imports


def test_dist_names_the_build_it_left_out_and_the_selector_tells_that_chip(tmp_path):
    """A failed target is in `omitted` with its graph, chip and precision (the schema takes them); a phone of that chip
    is told "the build for SM8650 failed verification", a skipped or unbuilt one still "no build"."""
    from qnn_tasks.ship import manifest as mf
    from qnn_tasks.ship import verified

    failed = tmp_path / "simverify.json"
    failed.write_text(json.dumps({"status": "failed", "error": "failed: snr_db 12.4 is below min_snr_db 30.0"}))

    def chip(soc: str, skip: str | None = None, records: dict | None = None) -> dict:
        return {"target": f"minilm-{soc}", "graph": "minilm", "precision": "fp16", "soc": {"name": soc},
                "skip": skip, "records": records or {}}

    inventory = {"graphs": [{"name": "minilm", "records": {}}], "pipelines": [],
                 "chips": [chip("SM8650", records={"simverify": str(failed)}), chip("SM7550", skip="no fp16 on v73"),
                           chip("SM8550", records={"context": str(tmp_path / "context.json")})]}
    ship, omitted, _ = verified.sort_out(inventory)
    assert ship == [] and [(o["graph"], o["soc"], o["precision"]) for o in omitted] == [
        ("minilm", soc, "fp16") for soc in ("SM8650", "SM7550", "SM8550")]
    jsonschema = pytest.importorskip("jsonschema")
    schema = mf.schema()
    jsonschema.Draft202012Validator({"$defs": schema["$defs"], **schema["properties"]["omitted"]}).validate(omitted)

    manifest = copy.deepcopy(table()["manifests"]["main"])
    manifest["graphs"]["minilm"]["binaries"] = [b for b in manifest["graphs"]["minilm"]["binaries"]
                                                if b["soc"] == "SM8750"]
    manifest["omitted"] = omitted
    told = select.choose(manifest, "minilm", "SM8650", "2.41.0", lambda b: None)
    assert (told.target, told.rule) == ("cpu", select.UNVERIFIED)
    assert told.reason == ("the build for SM8650 failed verification (minilm-SM8650: failed: simverify: snr_db 12.4 "
                           "is below min_snr_db 30.0); the CPU runs cpu/minilm.onnx")
    for soc in ("SM7550", "SM8550"):
        decision = select.choose(manifest, "minilm", soc, "2.41.0", lambda b: None)
        assert decision.rule == select.NO_BUILD and decision.reason.startswith(f"no build for {soc} ")
