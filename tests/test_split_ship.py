"""A split model ships (issue 40, item 3): `doit dist` packages a graph declared with `split:` as its parts, with
their chain (which part feeds which, by the cut tensors) in the manifest and the card, and both selectors (Python
and the Java reference) choose per part on the chip. Before, dist read a part's export..cpucheck records where a
whole graph keeps them, found none (they are its graph's split record), and listed every part as "unbuilt".

The model is tests/test_split.py's residual stack (x [1, 16, 256] -> 4 blocks -> y), `split: {parts: 2}`, built
for SM8650 (real compiles and simulator runs, the stand-in toolchain of the test project).
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from modelpackage_check import agreement
from test_split import SEQ, WIDTH, YAML, stack_project

from qnn_tasks.qnn import select
from qnn_tasks.ship import verified

JAVA = Path(__file__).resolve().parent.parent / "qnn_tasks" / "ship" / "java"
JARS = [Path("/usr/share/java/com.android.json.jar"), Path("/usr/share/java/junit4.jar"),
        Path("/usr/share/java/hamcrest.jar")]
PARTS = ["net.part1", "net.part2"]
SPLIT_RULE = "every part in order, each chosen per device; each part's outputs feed the next by name"

PROBE = """\
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;

import org.json.JSONArray;
import org.json.JSONObject;
import qnntasks.ship.Selector;

/** args: manifest graph runtime soc...: prints, as JSON, the chain and each part's decision on each chip. */
public class SplitProbe {
    public static void main(String[] args) throws Exception {
        JSONObject manifest = new JSONObject(new String(Files.readAllBytes(Paths.get(args[0])), StandardCharsets.UTF_8));
        JSONObject out = new JSONObject();
        out.put("chain", new JSONArray(Selector.chain(manifest, args[1])));
        JSONArray decisions = new JSONArray();
        for (String part : Selector.chain(manifest, args[1])) {
            for (int i = 3; i < args.length; i++) {
                Selector.Decision d = Selector.choose(manifest, part, args[i], args[2], binary -> null);
                decisions.put(new JSONObject().put("graph", part).put("soc", args[i]).put("target", d.target)
                        .put("path", d.path).put("precision", d.precision == null ? JSONObject.NULL : d.precision)
                        .put("reason", d.reason).put("rule", d.rule));
            }
        }
        out.put("decisions", decisions);
        try {
            Selector.choose(manifest, args[1], args[3], args[2], binary -> null);
        } catch (IllegalArgumentException e) {
            out.put("whole", e.getMessage());
        }
        System.out.println(out.toString());
    }
}
"""


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """The split stack built and packaged by `doit dist` (twice: a rebuild changes nothing)."""
    project = stack_project(tmp_path_factory.mktemp("splitship") / "p")
    project.edit(YAML, "    socs: [SM8650]\n", "    socs: [SM8650]\n    split: {parts: 2}\n")
    built = project.doit("simverify", "pipeline")
    assert built.returncode == 0, built.stdout + built.stderr
    for _ in range(2):  # issue 40: "after any number of rebuilds"
        shipped = project.doit("dist")
        assert shipped.returncode == 0, shipped.stdout + shipped.stderr
    assert "dist:stack: dist/stack: 2 binaries for SM8650" in shipped.stdout, shipped.stdout
    folder = project.root / "dist" / "stack"
    return {"project": project, "folder": folder, "manifest": json.loads((folder / "manifest.json").read_text()),
            "stdout": shipped.stdout}


def test_dist_ships_every_part_with_its_chain(package):
    jsonschema = pytest.importorskip("jsonschema")
    data, folder = package["manifest"], package["folder"]
    jsonschema.validate(data, json.loads((folder / "manifest.schema.json").read_text()))
    assert data["omitted"] == [] and "unbuilt" not in package["stdout"]
    assert sorted(data["graphs"]) == PARTS  # the whole graph is never compiled: it ships as its parts
    (parts,) = agreement(folder)["splits"]  # ONNX Runtime's ModelPackage: the parts in the order they run
    assert parts["graph"] == "net" and parts["parts"] == PARTS
    for index, name in enumerate(PARTS, start=1):
        graph = data["graphs"][name]
        assert graph["part"] == {"of": "net", "index": index, "parts": 2}
        assert [(b["soc"], b["path"]) for b in graph["binaries"]] == [("SM8650", f"SM8650/{name}.fp16.bin")]
        assert (folder / graph["fallback"]["path"]).is_file() and graph["fallback"]["path"] == f"cpu/{name}.onnx"
        pipeline = graph["binaries"][0]["verification"]["pipelines"]
        assert [p["graphs"] for p in pipeline] == [PARTS] and pipeline[0]["status"] == "passed"  # the chain, judged
    # a part's tensors are the cut ones (from the split stage), not the empty I/O its spec has before the split
    cut = {"name": "b1.res", "shape": [1, SEQ, WIDTH], "dtype": "float32", "quantization": None}
    assert data["graphs"]["net.part1"]["outputs"] == [cut] and data["graphs"]["net.part2"]["inputs"] == [cut]
    assert [t["name"] for t in data["graphs"]["net.part1"]["inputs"]] == ["x"]
    assert [t["name"] for t in data["graphs"]["net.part2"]["outputs"]] == ["y"]
    split = data["selection"]["splits"]
    assert [{k: s[k] for k in ("graph", "parts", "feeds", "rule", "inputs", "outputs")} for s in split] == [
        {"graph": "net", "parts": PARTS, "feeds": [{"from": "net.part1", "to": "net.part2", "tensors": ["b1.res"]}],
         "rule": SPLIT_RULE, "inputs": ["x"], "outputs": ["y"]}]
    assert split[0]["chained_on_cpu"]["measured_on"] == "x86 CPU (onnxruntime)"
    assert split[0]["chained_on_cpu"]["metrics"]["y"]["cosine"] > 0.9999
    assert data["source"]["file"] == "stack.onnx" and len(data["source"]["file_sha256"]) == 64  # the whole's export


def test_the_card_names_the_parts_and_their_chain(package):
    card = (package["folder"] / "MODEL_CARD.md").read_text()
    assert "- `net` is split into 2 parts, run in order: `net.part1` -> `net.part2` (net.part1 feeds net.part2 " \
           "b1.res); the app calls `Selector.chain(manifest, \"net\")` (Python `select.chain`), then `choose` on " \
           "each part" in card, card
    assert "## Graph `net.part1` (part 1 of 2 of `net`)" in card and "## Graph `net.part2` (part 2 of 2 of `net`)" in card
    assert "Inputs: `b1.res` float32 [1, 16, 256]" in card  # part 2's input: the cut tensor


def test_the_shipped_parts_chained_give_the_whole_graphs_answer(package):
    """The package's own files, run as the card says (each part's outputs fed to the next by name), on CPU."""
    from qnn_tasks.graphs.cpu import run_onnx_cpu

    project, folder, data = package["project"], package["folder"], package["manifest"]
    x = {"x": np.random.default_rng(11).standard_normal((1, SEQ, WIDTH)).astype(np.float32)}
    whole = run_onnx_cpu(project.path("models/stack/stack.onnx"), [x])[0]["y"]
    values = dict(x)
    for part in select.chain(data, "net"):
        values.update(run_onnx_cpu(folder / data["graphs"][part]["fallback"]["path"],
                                   [{t["name"]: values[t["name"]] for t in data["graphs"][part]["inputs"]}])[0])
    np.testing.assert_allclose(values["y"], whole, rtol=1e-4, atol=1e-4)


def python_choices(data: dict, runtime: str, socs: list[str]) -> dict:
    decisions = [{"graph": part, "soc": soc, **select.choose(data, part, soc, runtime, lambda b: None).as_dict()}
                 for part in select.chain(data, "net") for soc in socs]
    with pytest.raises(KeyError) as whole:
        select.choose(data, "net", socs[0], runtime, lambda b: None)
    return {"chain": select.chain(data, "net"), "decisions": decisions, "whole": whole.value.args[0]}


def test_the_python_selector_chooses_per_part_on_the_chip(package):
    data = package["manifest"]
    runtime = data["graphs"]["net.part1"]["binaries"][0]["min_runtime_qnn"]
    found = python_choices(data, runtime, ["SM8650", "SM8750"])
    assert found["chain"] == PARTS and select.chain(data, "net.part1") == ["net.part1"]
    assert [(d["graph"], d["soc"], d["target"], d["path"]) for d in found["decisions"]] == [
        ("net.part1", "SM8650", "npu", "SM8650/net.part1.fp16.bin"), ("net.part1", "SM8750", "cpu", "cpu/net.part1.onnx"),
        ("net.part2", "SM8650", "npu", "SM8650/net.part2.fp16.bin"), ("net.part2", "SM8750", "cpu", "cpu/net.part2.onnx")]
    assert found["whole"] == ("manifest of stack: 'net' is split into parts (net.part1, net.part2): choose each part, "
                              "run in order (fix: chain(manifest, \"net\") lists them)")


def test_the_java_selector_chooses_the_same_per_part(package, tmp_path):
    missing = [str(j) for j in JARS if not j.is_file()] + ([] if shutil.which("javac") else ["javac"])
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (bash scripts/install.sh installs them)")
    data = package["manifest"]
    runtime = data["graphs"]["net.part1"]["binaries"][0]["min_runtime_qnn"]
    (tmp_path / "SplitProbe.java").write_text(PROBE)
    classpath = ":".join(map(str, JARS[:1]))
    sources = [str(JAVA / "src/main/java/qnntasks/ship/Selector.java"), str(tmp_path / "SplitProbe.java")]
    compiled = subprocess.run(["javac", "--release", "8", "-d", str(tmp_path / "classes"), "-cp", classpath, *sources],
                              capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    run = subprocess.run(["java", "-cp", f"{tmp_path / 'classes'}:{classpath}", "SplitProbe",
                          str(package["folder"] / "manifest.json"), "net", runtime, "SM8650", "SM8750"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout) == python_choices(data, runtime, ["SM8650", "SM8750"])


def test_a_part_ships_on_a_chip_only_with_every_other_part():
    """One part alone runs nothing: when part 2 is not verified on SM8650, part 1's binary there stays out too."""
    chip = {"soc": {"name": "SM8650"}, "precision": "fp16"}
    inventory = {"graphs": [{"name": "net", "split": {"parts": PARTS}},
                            {"name": "net.part1", "part": {"of": "net", "index": 1, "parts": 2}},
                            {"name": "net.part2", "part": {"of": "net", "index": 2, "parts": 2}},
                            {"name": "other"}],
                 "chips": [{**chip, "target": "net.part1-SM8650", "graph": "net.part1"},
                           {**chip, "target": "net.part2-SM8650", "graph": "net.part2"},
                           {**chip, "target": "other-SM8650", "graph": "other"}]}
    ship = [verified.Shippable(chip=inventory["chips"][0], records={}),
            verified.Shippable(chip=inventory["chips"][2], records={})]
    omitted = [{"target": "net.part2-SM8650", "reason": "failed: simverify: y cosine 0.9 < 0.999"}]
    kept, left_out = verified.whole_chains(inventory, ship, omitted)
    assert [s.chip["target"] for s in kept] == ["other-SM8650"]
    assert left_out[-1] == {"target": "net.part1-SM8650", "reason": "failed: net.part2-SM8650, another part of the "
                                                                     "split graph net: simverify: y cosine 0.9 < 0.999"}
