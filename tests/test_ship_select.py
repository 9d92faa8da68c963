"""The device-side choice (issue 32, item 5): qnn_tasks/ship/select.py and the Java reference for apps agree; and the
size of a graph with sizes an input runs at (issue 33, "chosen at run time"): the table's size_cases, through both.

One decision table (qnn_tasks/ship/java/src/test/resources/selector_cases.json: stand-in phones of SM8650, SM7550,
an Exynos chip, an SM8650 with older runtime libraries, one whose load fails, ...) runs through the Python selector
here and through Selector.java, compiled with Debian's JDK and run under JUnit 4 (Debian's junit4) against Android's
own org.json (Debian's libandroid-json-java): the same target, path, precision, rule and reason string per case.
No phone: the "did the context load" callback is the table's (which loads fail is part of each case).
"""
from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path

import pytest

from qnn_tasks.ship import select

JAVA = Path(str(resources.files("qnn_tasks.ship") / "java"))
CASES = JAVA / "src" / "test" / "resources" / "selector_cases.json"
JARS = [Path("/usr/share/java/com.android.json.jar"), Path("/usr/share/java/junit4.jar"),
        Path("/usr/share/java/hamcrest.jar")]


def table() -> dict:
    return json.loads(CASES.read_text())


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
    run = subprocess.run(["java", f"-Dselector.cases={CASES}", "-cp", f"{tmp_path}:{classpath}",
                          "org.junit.runner.JUnitCore", "qnntasks.ship.SelectorTest"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "OK (6 tests)" in run.stdout, run.stdout + run.stderr


def test_java_logic_has_no_android_dependency():
    source = (JAVA / "src" / "main" / "java" / "qnntasks" / "ship" / "Selector.java").read_text()
    imports = [line for line in source.splitlines() if line.startswith("import ")]
    assert imports and all(i.startswith(("import java.", "import org.json.")) for i in imports), imports
