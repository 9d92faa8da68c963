"""Several lengths for one graph (`dims:`): a graph per size through every stage, samples fitted to each size,
and the cross-size check on the simulator (a short input padded into a larger size gives the same answer).

The built test model (tests/sized_project.py) is masked mean pooling exported by export.py at the size it is
told; `leaky` is the same model with its mask ignored: each size agrees with its own CPU reference, but the
padding changes its answer, which only the cross-size check sees.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from modelpackage_check import agreement
from sized_project import (
    CHAIN_LENGTHS,
    LENGTHS,
    attention_project,
    chained_sized_project,
    packaged_sized_project,
    sized_project,
)

from qnn_tasks.errors import SpecError
from qnn_tasks.judge import fitting
from qnn_tasks.modelspec import specsizes
from qnn_tasks.modelspec.load import load_model, load_project, load_soc_table
from qnn_tasks.modelspec.specjson import graph_from_dict, graph_to_dict
from qnn_tasks.plan.matrix import loop_chips
from qnn_tasks.plan.planner import Planner
from qnn_tasks.plan.rows import LOOP, PIPELINE
from qnn_tasks.plan.stageplans import plan_loop, plan_pipeline, start_pipeline
from qnn_tasks.qnn import select

SIZED_YAML = """\
licence: test
source: {url: none}
graphs:
  enc:
    dims:
      seq: {sizes: [8, 32], pad: {ids: 0, mask: 0}, longer: truncate}
    inputs:
      ids: {shape: [1, seq], dtype: int32}
      mask: {shape: [1, seq], dtype: int32}
      scale: {shape: [1, 1], dtype: float32}
    outputs:
      hidden: {shape: [1, seq, 4]}
      pooled: {shape: [1, 4]}
      level: {shape: [1, 1]}
"""


def load(tmp_path: Path, text: str):
    folder = tmp_path / "models" / "m"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.yaml").write_text(text)
    (folder / "export.py").write_text("def export(ctx):\n    pass\n")
    socs, _ = load_soc_table(tmp_path)
    return load_model(folder, socs)


def spec_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as caught:
        load(tmp_path, text)
    line = str(caught.value)
    assert "\n" not in line and "models/m/model.yaml" in line and "(fix: " in line, line
    return line


def test_dims_make_one_graph_per_size(tmp_path):
    model = load(tmp_path, SIZED_YAML)
    assert [g.name for g in model.graphs] == ["enc.seq8", "enc.seq32"]
    small, large = model.graphs
    assert [t.shape for t in small.inputs] == [(1, 8), (1, 8), (1, 1)]
    assert [t.shape for t in large.outputs] == [(1, 32, 4), (1, 4), (1, 1)]
    assert small.size.graph == "enc" and small.size.sizes == (8, 32) and small.size.longer == "truncate"
    assert small.size.pad == {"ids": 0.0, "mask": 0.0}
    assert small.size.axes == {"ids": (1,), "mask": (1,), "hidden": (1,)}
    assert small.key == "graphs.enc"  # messages name the key in model.yaml, not the size's graph
    facts = specsizes.facts(large)
    assert facts["rule"] == "smallest that fits" and facts["graphs"] == {"8": "enc.seq8", "32": "enc.seq32"}
    assert specsizes.facts(graph_to_dict(large, tmp_path)) == facts  # from a stage call's graph too
    assert specsizes.facts(graph_from_dict(graph_to_dict(large, tmp_path))) == facts
    assert facts["size"] == 32 and specsizes.facts(small)["size"] == 8
    assert specsizes.selection(model.graphs) == [{k: v for k, v in facts.items() if k != "size"}]
    # the short form: pad 0 for every input with the dim, longer inputs skipped
    short = load(tmp_path, SIZED_YAML.replace("seq: {sizes: [8, 32], pad: {ids: 0, mask: 0}, longer: truncate}",
                                              "seq: [16]"))
    assert [g.name for g in short.graphs] == ["enc.seq16"] and short.graphs[0].size.longer == "skip"


@pytest.mark.parametrize("old, new, fragments", [
    ("sizes: [8, 32]", "sizes: [32, 8]", ("graphs.enc.dims.seq.sizes", "not ascending")),
    ("sizes: [8, 32]", "sizes: [8, 0]", ("graphs.enc.dims.seq.sizes", "positive integers")),
    ("longer: truncate", "longer: drop", ("graphs.enc.dims.seq.longer", "'drop'")),
    ("pad: {ids: 0, mask: 0}", "pad: {scale: 1}", ("graphs.enc.dims.seq.pad.scale", "not an input with dim 'seq'")),
    ("scale: {shape: [1, 1]", "scale: {shape: [1, len]", ("graphs.enc.inputs.scale.shape", "'len'", "dims:")),
    ("      seq: {sizes", "      n: [2]\n      seq: {sizes", ("graphs.enc.dims", "one dim")),
    ("sizes: [8, 32]", f"sizes: {list(range(1, 66))}", ("graphs.enc.dims.seq.sizes: 65 items, more than the 64 "
                                                        "accepted (fix: keep at most 64)",)),
    ("pad: {ids: 0, mask: 0}", "pad: {ids: 0.5, mask: 0}", ("graphs.enc.dims.seq.pad.ids: 0.5 is not a whole number: a "
                                                           "int32 input holds only whole numbers",
                                                           "(fix: give a pad value that input 'ids' (int32) holds")),
    ("pad: {ids: 0, mask: 0}", "pad: {ids: 0, mask: 4294967296}", ("graphs.enc.dims.seq.pad.mask: 4294967296 is out "
                                                                  "of the range of int32 (-2147483648 to 2147483647)",)),
])
def test_bad_dims_are_one_line(tmp_path, old, new, fragments):
    text = SIZED_YAML.replace(old, new)
    assert text != SIZED_YAML
    line = spec_error(tmp_path, text)
    for fragment in fragments:
        assert fragment in line, line


def test_a_pad_a_float_input_cannot_hold_is_refused_at_load(tmp_path):
    """1e300 pads a float32 input with Inf: refused at load naming the key (it was accepted, the samples padded Inf)."""
    text = SIZED_YAML.replace("mask: {shape: [1, seq], dtype: int32}", "mask: {shape: [1, seq], dtype: float32}")
    for pad, fragment in (("1.0e300", "1e+300 is beyond the largest float32 (+-3.40282e+38)"),
                          ("-1.0e39", "-1e+39 is beyond the largest float32")):
        line = spec_error(tmp_path, text.replace("mask: 0}", f"mask: {pad}}}"))
        assert f"graphs.enc.dims.seq.pad.mask: {fragment}" in line, line
        assert "(fix: give a pad value that input 'mask' (float32) holds exactly)" in line, line
    assert load(tmp_path, text.replace("mask: 0}", "mask: -1.0e30}")).graphs[0].size.pad["mask"] == -1.0e30


def test_a_size_name_that_clashes_with_a_graph_names_both(tmp_path):
    text = SIZED_YAML + "  enc.seq8:\n    inputs: {a: {shape: [1], dtype: float32}}\n    outputs: {b: {shape: [1]}}\n"
    line = spec_error(tmp_path, text)
    assert "graphs.enc" in line and "'enc.seq8' clashes with graphs.enc.seq8" in line


def test_a_pipeline_or_loop_over_a_graph_with_sizes_runs_per_size(tmp_path):
    """A pipeline naming a graph with sizes is one chain per size (`<model>.<dim><size>-<SOC>`), a loop over it runs
    on each size's chips; naming one size chains that size alone; other sizes in one chain are one line."""
    head = "  head:\n    inputs: {pooled: {shape: [1, 4], dtype: float32}}\n    outputs: {p: {shape: [1, 2]}}\n"
    model = load(tmp_path, SIZED_YAML + head + "pipeline: {graphs: [enc, head], feed: {head.pooled: enc.pooled}}\n"
                 "loop: {graph: enc, feed: {scale: level}}\n")
    assert model.pipeline is None and [(p.graphs, p.size, p.feed) for p in model.size_pipelines] == [
        (("enc.seq8", "head"), "seq8", {"head.pooled": ("enc.seq8", "pooled")}),
        (("enc.seq32", "head"), "seq32", {"head.pooled": ("enc.seq32", "pooled")})]
    planner = Planner(load_project(tmp_path))
    assert {pt.name: [ct.name for ct in pt.chips] for pt in planner.pipelines if pt.soc.name == "SM8650"} == {
        "m.seq8-SM8650": ["enc.seq8-SM8650", "head-SM8650"], "m.seq32-SM8650": ["enc.seq32-SM8650", "head-SM8650"]}
    assert {str(pt.dir).split("/")[2] for pt in planner.pipelines} == {"pipeline.seq8", "pipeline.seq32"}
    assert [ct.name for ct in loop_chips(planner) if ct.soc.name == "SM8650"] == ["enc.seq8-SM8650", "enc.seq32-SM8650"]

    one = load(tmp_path, SIZED_YAML + head + "pipeline: {graphs: [enc.seq32, head]}\n")
    assert one.pipeline.graphs == ("enc.seq32", "head") and one.size_pipelines == ()
    other = SIZED_YAML.replace("  enc:", "  enc2:").replace("[8, 32]", "[8, 16]")
    line = spec_error(tmp_path, SIZED_YAML + other.split("graphs:\n", 1)[1] + "pipeline: {graphs: [enc, enc2]}\n")
    assert "pipeline.graphs" in line and "different sizes" in line


MID = "  mid:\n    dims: {seq: [8, 32]}\n    inputs: {hidden: {shape: [1, seq, 4], dtype: float32}}\n" \
      "    outputs: {out: {shape: [1, seq, 4]}}\n"
DEC = "  dec:\n    dims: {seq: [8, 32]}\n    inputs:\n      cross: {shape: [1, seq, 4], dtype: float32}\n" \
      "      st: {shape: [1, 4], dtype: float32}\n    outputs: {stN: {shape: [1, 4]}}\n"
STARTED = "loop: {graph: dec, feed: {st: stN}, start: {cross: mid.out}}\n"


def test_a_loop_started_by_a_pipeline_with_sizes_starts_at_each_size_from_that_size(tmp_path):
    """Loop and pipeline with the same sizes: the loop at each size starts from the pipeline at that size (its
    task depends on it); a loop graph with sizes after a pipeline without: each size from the one pipeline, its
    shapes checked per size; a loop graph without sizes after a pipeline per size, or other sizes: one line."""
    model = load(tmp_path, SIZED_YAML + MID + DEC + "pipeline: {graphs: [enc, mid]}\n" + STARTED)
    assert (model.loop.graph, model.loop.start, model.loop.feed) == ("dec", {"cross": "out"}, {"st": "stN"})
    planner = Planner(load_project(tmp_path))
    chips = [ct for ct in loop_chips(planner) if ct.soc.name == "SM8650"]
    assert [(ct.name, start_pipeline(planner, ct).name, plan_loop(planner, LOOP, ct).task_dep) for ct in chips] == [
        ("dec.seq8-SM8650", "m.seq8-SM8650", ["pipeline:m.seq8-SM8650"]),
        ("dec.seq32-SM8650", "m.seq32-SM8650", ["pipeline:m.seq32-SM8650"])]
    assert all(f"/pipeline.seq{n}/" in plan_loop(planner, LOOP, ct).file_dep[-1] for n, ct in zip((8, 32), chips))

    # (b) the pipeline names one size: every size's loop starts from it, and its shapes must fit each size
    line = spec_error(tmp_path, SIZED_YAML + MID + DEC + "pipeline: {graphs: [enc.seq8, mid.seq8]}\n" + STARTED)
    assert "loop.start.cross" in line and "'dec.seq32' is [1, 32, 4]" in line and "'mid.seq8' is [1, 8, 4]" in line
    fixed = (SIZED_YAML + MID + DEC.replace("[1, seq, 4], dtype", "[1, 8, 4], dtype").replace("st: {", "tok: "
             "{shape: [1, seq], dtype: int32}\n      st: {") + "pipeline: {graphs: [enc.seq8, mid.seq8]}\n" + STARTED)
    load(tmp_path, fixed)
    planner = Planner(load_project(tmp_path))
    assert {ct.name: start_pipeline(planner, ct).name for ct in loop_chips(planner) if ct.soc.name == "SM8650"} == {
        "dec.seq8-SM8650": "m-SM8650", "dec.seq32-SM8650": "m-SM8650"}

    # (c) a loop graph without sizes after a pipeline per size: refused, naming both fixes
    unsized = DEC.replace("    dims: {seq: [8, 32]}\n", "").replace("seq, 4]", "8, 4]")
    line = spec_error(tmp_path, SIZED_YAML + MID + unsized + "pipeline: {graphs: [enc, mid]}\n" + STARTED)
    assert "loop.start" in line and "'dec' has no sizes" in line and "dims (seq: [8, 32])" in line, line
    assert "enc.seq8" in line
    line = spec_error(tmp_path, SIZED_YAML + MID + DEC.replace("[8, 32]", "[8, 16]") + "pipeline: {graphs: [enc, mid]}\n"
                      + STARTED)
    assert "loop.graph" in line and "different sizes" in line


def test_samples_are_fitted_padded_truncated_or_skipped(tmp_path):
    model = load(tmp_path, SIZED_YAML)
    small = model.graphs[0]
    ids = np.array([[101, 7, 8, 102, 0, 0, 0, 0, 0, 0, 0, 0]], np.int32)  # 4 tokens, padded to 12 by its source
    long = np.arange(1, 11, dtype=np.int32)[None]                        # 10 tokens: longer than 8
    samples = [{"ids": ids, "mask": (ids != 0).astype(np.int32), "scale": np.ones((1, 1), np.float32)},
               {"ids": long, "mask": np.ones_like(long), "scale": np.ones((1, 1), np.float32)}]
    fitted, done = fitting.fit(samples, small, "here")
    assert fitted[0]["ids"].tolist() == [[101, 7, 8, 102, 0, 0, 0, 0]] and fitted[0]["ids"].dtype == np.int32
    assert fitted[1]["ids"].tolist() == [list(range(1, 9))] and done["truncated"] == [1] and done["kept"] == 2
    skipping = load(tmp_path, SIZED_YAML.replace("longer: truncate", "longer: skip")).graphs[0]
    fitted, done = fitting.fit(samples, skipping, "here")
    assert len(fitted) == 1 and done["skipped"] == [1]
    with pytest.raises(Exception) as caught:
        fitting.fit(samples[1:], skipping, "models/m/model.yaml: samples")
    assert "none of the 1 samples fits enc.seq8" in str(caught.value) and "longer: truncate" in str(caught.value)
    large = load(tmp_path, SIZED_YAML).graphs[1]
    padded, _ = fitting.fit(samples, large, "here")
    assert padded[1]["mask"].tolist() == [[1] * 10 + [0] * 22]


MASK_YAML = """\
licence: test
source: {url: none}
graphs:
  dec:
    dims:
      seq: {sizes: [4, 8], pad: {ids: 0, attention_mask: -10000.0}, longer: truncate}
    inputs:
      ids: {shape: [1, seq], dtype: int32}
      attention_mask: {shape: [1, 1, seq, seq], dtype: float32}
    outputs:
      probs: {shape: [1, 2, seq, seq]}
      pooled: {shape: [1, 4]}
"""
IMAGE_YAML = """\
licence: test
source: {url: none}
graphs:
  det:
    dims: {side: {sizes: [320, 640], pad: {pixel_values: 0.5}}}
    inputs:
      pixel_values: {shape: [1, 3, side, side], dtype: float32}
    outputs:
      boxes: {shape: [1, side, 4]}
"""


def causal(n: int) -> np.ndarray:
    """An additive causal mask [1, 1, n, n]: 0 on and below the diagonal, -1e4 above."""
    return np.triu(np.full((n, n), -1.0e4, np.float32), k=1)[None, None]


def test_a_dim_on_several_axes_of_one_tensor_is_every_one_of_them(tmp_path):
    """A [1, 1, seq, seq] mask and a square image [1, 3, side, side]: every axis named by the dim takes the size,
    the axes are recorded (an integer in records and manifests for a tensor with one, a list for several; an
    older record's integer is read back), and the manifest's schema accepts both forms."""
    mask = load(tmp_path, MASK_YAML)
    small, large = mask.graphs
    assert [t.shape for t in small.inputs] == [(1, 4), (1, 1, 4, 4)]
    assert [t.shape for t in large.outputs] == [(1, 2, 8, 8), (1, 4)]
    assert small.size.axes == {"ids": (1,), "attention_mask": (2, 3), "probs": (2, 3)}
    assert small.size.as_dict()["axes"] == {"ids": 1, "attention_mask": [2, 3], "probs": [2, 3]}
    assert graph_from_dict(graph_to_dict(large, tmp_path)).size == large.size
    old = {**large.size.as_dict(), "axes": {"ids": 1}}  # a record written before several axes were allowed
    assert specsizes.SizeSpec.from_dict(old).axes == {"ids": (1,)}
    facts = specsizes.facts(large)
    assert facts["axes"] == {"ids": 1, "attention_mask": [2, 3], "probs": [2, 3]}

    image = load(tmp_path, IMAGE_YAML)
    assert [g.name for g in image.graphs] == ["det.side320", "det.side640"]
    assert image.graphs[1].inputs[0].shape == (1, 3, 640, 640) and image.graphs[0].outputs[0].shape == (1, 320, 4)
    assert image.graphs[0].size.axes == {"pixel_values": (2, 3), "boxes": (1,)}

    from qnn_tasks.ship import manifest  # the package manifest's schema: an integer, or a list of two or more
    jsonschema = pytest.importorskip("jsonschema")
    schema = manifest.schema()
    item = {"$defs": schema["$defs"], **schema["properties"]["selection"]["properties"]["sizes"]["items"]}
    validator = jsonschema.Draft202012Validator(item)
    for good in specsizes.selection([*mask.graphs, *image.graphs]):
        assert not list(validator.iter_errors(good)), good
    for bad in ([3], [2, -1], "2"):
        assert list(validator.iter_errors({**facts, "axes": {"attention_mask": bad}})), bad


def test_a_mask_is_fitted_on_both_axes_and_longer_on_either_is_longer(tmp_path):
    """A causal mask at 3 positions is padded to 4 and 8 on both axes with its pad value (-1e4: the padded keys
    get no attention); a 6-position sample is cut to 4 on both axes (truncate) or left out (skip); an image
    wider than a size but not taller is longer than it."""
    small, large = load(tmp_path, MASK_YAML).graphs
    ids = np.array([[5, 6, 7]], np.int32)
    samples = [{"ids": ids, "attention_mask": causal(3)},
               {"ids": np.arange(1, 7, dtype=np.int32)[None], "attention_mask": causal(6)}]
    fitted, done = fitting.fit(samples, large, "here")
    padded = fitted[0]["attention_mask"]
    assert padded.shape == (1, 1, 8, 8) and padded.dtype == np.float32
    assert np.array_equal(padded[0, 0, :3, :3], causal(3)[0, 0])
    assert (padded[0, 0, 3:, :] == -1.0e4).all() and (padded[0, 0, :, 3:] == -1.0e4).all()
    assert fitted[0]["ids"].tolist() == [[5, 6, 7, 0, 0, 0, 0, 0]] and done["truncated"] == []
    fitted, done = fitting.fit(samples, small, "here")
    assert done["truncated"] == [1] and np.array_equal(fitted[1]["attention_mask"], causal(6)[..., :4, :4])
    assert np.array_equal(fitted[0]["attention_mask"][..., :3, :3], causal(3)) and fitted[0]["attention_mask"][
        0, 0, 3, 3] == -1.0e4
    skipping = load(tmp_path, MASK_YAML.replace("longer: truncate", "longer: skip")).graphs[0]
    fitted, done = fitting.fit(samples, skipping, "here")
    assert done["skipped"] == [1] and done["kept"] == 1

    # a sample whose mask alone is longer (ids 3 long, mask 6 x 6 holding positions): longer on the mask's axes
    wide_mask = [{"ids": ids, "attention_mask": causal(6)}]
    assert fitting.content_length(wide_mask[0], skipping) == 6
    # an image 300 tall and 400 wide: shorter than 320 on one axis, longer on the other
    det = load(tmp_path, IMAGE_YAML).graphs[0]
    image = np.ones((1, 3, 300, 400), np.float32)
    assert fitting.same_shape(image.shape, det.inputs[0], det)
    assert not fitting.same_shape((1, 1, 300, 400), det.inputs[0], det)  # channels are not the dim
    fitted, done = fitting.fit([{"pixel_values": image}, {"pixel_values": image[..., :200]}], det, "here")
    assert done["skipped"] == [0] and fitted[0]["pixel_values"].shape == (1, 3, 320, 320)
    assert (fitted[0]["pixel_values"][0, :, 300:, :] == 0.5).all() and (fitted[0]["pixel_values"][0, :, :, 200:]
                                                                         == 0.5).all()


@pytest.mark.slow
def test_sizes_build_verify_and_the_cross_size_check_catches_leaking_padding(tmp_path):
    """pool: each size verified on the simulator, the cross-size check passes, its pipeline with a head runs per
    size; leaky (mask ignored): each size verified, the cross-size check fails in one line naming both sizes.
    Then: an export change that touches one size rebuilds that size only, and a new size builds only itself."""
    project = sized_project(tmp_path / "p", {"pool": "masked", "leaky": "ignored"}, head="pool")
    first = project.doit("-n", "2")
    assert first.returncode != 0
    for name in ("pool.seq16", "pool.seq32", "leaky.seq16", "leaky.seq32"):
        verdict = project.one_json(f"build/*/{name}/*/fp16/SM8650/simverify/simverify.json")
        assert verdict["status"] == "passed", verdict
    fitted = project.one_json("build/pool/pool.seq16/cpucheck/cpucheck.json")["fitted"]
    assert fitted == {"dim": "seq", "size": 16, "samples": 8, "kept": 8, "skipped": [], "truncated": [],
                      "longer": "skip"}
    passed = project.one_json("build/pool/pool.seq32/*/fp16/SM8650/crosssize/crosssize.json")
    assert passed["status"] == "passed" and passed["pairs"][0]["samples"] == [[i, i] for i in range(8)]
    assert passed["pairs"][0]["metrics"]["y"]["cosine"] > 0.999
    for size in (16, 32):  # the pipeline pooling -> head, one per size, chained on the simulator
        chain = project.one_json(f"build/pool/pipeline.seq{size}/*/SM8650/pipeline/pipeline.json")
        assert chain["status"] == "passed" and chain["graphs"] == [f"pool.seq{size}", "head"], chain
    line = first.failure_line("crosssize:leaky.seq32-SM8650")

    assert "leaky.seq16 and leaky.seq32 differ on the same 8 samples" in line and "padding changes the answer" in line
    project.doit("report")  # with -n 2 the report may have run beside the last checks: again, after them
    report = json.loads(project.path("build/report/report.json").read_text())
    by_graph = {e["graph"]: e for e in report["sizes"]}
    assert [c["graph"] for c in by_graph["pool"]["sizes"]] == ["pool.seq16", "pool.seq32"]
    assert by_graph["pool"]["status"] == "passed" and by_graph["leaky"]["status"] == "failed"

    # the package lists the sizes and the rule; a graph whose cross-size check failed ships no size
    shipped = project.doit("dist")
    manifest = json.loads(project.path("dist/pool/manifest.json").read_text())
    sizes = manifest["selection"]["sizes"]
    assert [(f["graph"], f["sizes"], f["rule"], f["graphs"]) for f in sizes] == [
        ("pool", [16, 32], "smallest that fits", {"16": "pool.seq16", "32": "pool.seq32"})]
    assert manifest["graphs"]["pool.seq16"]["size"] == {"of": "pool", "dim": "seq", "size": 16}
    # ONNX Runtime's ModelPackage of it: a component per size, the size rule in its metadata (docs/shipping.md)
    facts = agreement(project.path("dist/pool"))
    assert [(f["graph"], f["graphs"], f["rule"]) for f in facts["sizes"]] == [
        ("pool", {"16": "pool.seq16", "32": "pool.seq32"}, "smallest that fits")]
    assert "cross-size check of leaky" in shipped.failure_line("dist:leaky")
    # the app's choice over THIS manifest (qnn/select.py; Selector.java passes the same table of cases): the size
    # first, a short input at 16 and a longer one at 32, padded with the declared values; then the device's binary
    short, longer = select.choose_size(manifest, "pool", 3), select.choose_size(manifest, "pool", 20)
    assert (short.graph, short.size, short.pad, short.pad_values) == ("pool.seq16", 16, 13, {"x": 0.0, "mask": 0.0})
    assert (longer.graph, longer.pad, longer.rule) == ("pool.seq32", 12, "fits"), longer
    assert select.choose_size(manifest, "pool", 33).graph is None  # longer: skip, the app must refuse or split it
    package = project.path("dist/pool")
    runtime = next(iter(manifest["runtime_libs"].values()))["qnn_version"]
    decision = select.choose(manifest, longer.graph, "SM8650", runtime,
                             lambda b: None if (package / b["path"]).is_file() else f"{b['path']} missing")
    assert decision.target == "npu" and decision.path == "SM8650/pool.seq32.fp16.bin", decision
    # and the package tells the app team so: the card and the Android README name chooseSize for pool
    card = (package / "MODEL_CARD.md").read_text()
    assert "- Sizes of `pool` along seq: 16, 32 (smallest that fits; pad mask 0, x 0; longer: skip)" in card
    assert 'Selector.chooseSize(manifest, "pool", length)' in card
    assert "Graphs with sizes (`pool`): call `Selector.chooseSize(" in (package / "android" / "README.md").read_text()

    # an export change that only the 32 size sees: that size rebuilds, the other stays
    project.edit("models/pool/export.py", 'nodes, "pool",', 'nodes, "pool" if ctx.size != 32 else "pool32",')
    second = project.doit("-n", "2", "--continue")  # leaky fails again; the rest goes on
    contexts = {t for t in second.executed if t.startswith("context:")}
    assert contexts == {"context:pool.seq32-SM8650"}, second.stdout
    assert not {t for t in second.executed if t.endswith("seq16-SM8650")}, second.stdout

    # a new size builds itself only; the cross-size check moves to the new largest size
    project.edit("models/pool/model.yaml", "sizes: [16, 32]", "sizes: [16, 32, 48]")
    third = project.doit("-n", "2", "--continue")
    contexts = {t for t in third.executed if t.startswith(("context:", "export:", "cpucheck:"))}
    assert contexts == {"export:pool.seq48", "cpucheck:pool.seq48", "context:pool.seq48-SM8650"}, third.stdout
    assert "pipeline:pool.seq48-SM8650" in third.executed  # and its chain
    grown = project.one_json("build/pool/pool.seq48/*/fp16/SM8650/crosssize/crosssize.json")
    assert grown["status"] == "passed" and grown["sizes"] == [16, 32, 48] and len(grown["pairs"]) == 3


def test_a_packaged_onnx_with_a_symbolic_dim_builds_per_size_from_yaml_alone(tmp_path):
    """The built-in export fixes the symbolic dim to each size; sample files padded to 12 are truncated to 8
    (longer: truncate) and padded to 16; the cross-size check compares only the samples that fit 8 untruncated."""
    project = packaged_sized_project(tmp_path / "p")
    project.doit("-n", "2", "crosssize", check=True)
    io = project.one_json("build/dyn/dyn.seq8/export/export.json")["io"]
    assert [t["shape"] for t in io["inputs"]] == [[1, 8, 16], [1, 8]] and io["inputs"][1]["dtype"] == "int32"
    truncated = [i for i, n in enumerate(LENGTHS) if n > 8]
    assert project.one_json("build/dyn/dyn.seq8/cpucheck/cpucheck.json")["fitted"]["truncated"] == truncated
    check = project.one_json("build/dyn/dyn.seq16/*/fp16/SM8650/crosssize/crosssize.json")
    fit = [i for i in range(len(LENGTHS)) if i not in truncated]
    assert check["status"] == "passed" and check["pairs"][0]["samples"] == [[i, i] for i in fit]


@pytest.mark.slow
def test_an_attention_mask_on_two_axes_builds_and_the_cross_size_check_sees_its_pad_value(tmp_path):
    """Masked self-attention with an additive [1, seq, seq] mask at seq 8 and 16 on SM8650's simulator: padded with
    -1e4 each size is verified and the cross-size check passes (probs [1, seq, seq] cropped on both axes); the
    same model with the mask padded with 0 (the padded keys are attended to) verifies per size but fails the
    cross-size check in one line naming both sizes. The package lists the mask's two axes."""
    project = attention_project(tmp_path / "p", {"attn": "-10000.0", "leaky": "0"})
    run = project.doit("-n", "2", "--continue", "simverify", "crosssize")
    assert run.returncode != 0
    for name in ("attn.seq8", "attn.seq16", "leaky.seq8", "leaky.seq16"):
        verdict = project.one_json(f"build/*/{name}/*/fp16/SM8650/simverify/simverify.json")
        assert verdict["status"] == "passed", verdict
    fitted = project.one_json("build/attn/attn.seq8/cpucheck/cpucheck.json")["fitted"]
    assert (fitted["kept"], fitted["skipped"]) == (6, [1, 5])  # lengths 12 and 10 are longer than 8
    check = project.one_json("build/attn/attn.seq16/*/fp16/SM8650/crosssize/crosssize.json")
    assert check["status"] == "passed" and check["pairs"][0]["samples"] == [[0, 0], [1, 2], [2, 3], [3, 4],
                                                                             [4, 6], [5, 7]]
    assert check["pairs"][0]["metrics"]["probs"]["cosine"] > 0.999, check
    line = run.failure_line("crosssize:leaky.seq16-SM8650")
    assert "leaky.seq8 and leaky.seq16 differ on the same 6 samples" in line and "padding changes the answer" in line

    # the package's manifest (checked against its schema as dist writes it): the mask's axes as a list
    project.doit("dist:attn", check=True)
    manifest = json.loads(project.path("dist/attn/manifest.json").read_text())
    assert manifest["selection"]["sizes"][0]["axes"] == {"x": 1, "mask": [1, 2], "probs": [1, 2], "ctx": 1}


def test_a_graph_with_sizes_takes_its_samples_from_the_same_size_of_the_graph_before_it(tmp_path):
    """`samples: {from: enc.mem}` on a decoder with the encoder's dims: each size of dec takes the CPU outputs of
    the same size of enc (the samples that fit that size); it was refused (`enc` named no graph: only its sizes)."""
    project = chained_sized_project(tmp_path / "p")
    project.doit("cpucheck:dec.seq8", "cpucheck:dec.seq16", check=True)
    for size in (8, 16):
        with np.load(project.path(f"build/chain/enc.seq{size}/cpucheck/reference.npz")) as reference, \
                np.load(project.path(f"build/chain/dec.seq{size}/cpucheck/inputs.npz")) as inputs:
            kept = sum(n <= size for n in CHAIN_LENGTHS)
            assert inputs["mem"].shape == (kept, 1, size, 4)
            np.testing.assert_array_equal(inputs["mem"], reference["mem"])
    # a graph without those sizes cannot follow them: one line saying what to write instead
    model_yaml = "models/chain/model.yaml"
    project.edit(model_yaml, "pipeline:\n  graphs: [enc, dec]\n  feed: {dec.tok: {value: 1.0}}\n", "")
    project.edit(model_yaml, "    dims: {seq: [8, 16]}\n    inputs:\n      mem: {shape: [1, seq, 4]",
                 "    inputs:\n      mem: {shape: [1, 8, 4]")
    line = project.doit("list").stderr.strip()
    assert line.count("\n") == 0 and ("graphs.dec.samples.from: 'enc.mem' names graph 'enc', which has sizes (seq "
                                      "[8, 16]), and 'dec' has none: which size's outputs? (fix: give graphs.dec the "
                                      "same dims (seq: [8, 16]) to take each size's samples from the same size of "
                                      "'enc', or name one size, e.g. from: enc.seq8.mem)") in line, line
    project.edit(model_yaml, "samples: {from: {mem: enc.mem}", "samples: {from: {mem: enc.seq8.mem}")
    assert project.doit("list").returncode == 0
    project.edit(model_yaml, "    inputs:\n      mem: {shape: [1, 8, 4]",
                 "    dims: {seq: [8, 32]}\n    inputs:\n      mem: {shape: [1, seq, 4]")
    project.edit(model_yaml, "samples: {from: {mem: enc.seq8.mem}", "samples: {from: {mem: enc.mem}")
    line = project.doit("list").stderr.strip()
    assert ("graphs.dec.samples.from: graphs 'enc' (seq [8, 16]) and 'dec' (seq [8, 32]) have different sizes: each "
            "size of 'dec' takes its samples from the same size of 'enc' (fix: give both the same dims, or name one "
            "size, e.g. from: enc.seq8.mem)") in line, line


CHAINED = "  dec:\n    dims: {seq: [8, 32]}\n    inputs: {hidden: {shape: [1, seq, 4], dtype: float32}}\n" \
          "    outputs: {out: {shape: [1, 4]}}\n"


@pytest.mark.parametrize("old, new, expected", [
    ("[1, seq, 4], dtype", "[1, seq, 8], dtype",
     "pipeline: input 'hidden' of graph 'dec' at size seq 8 is [1, 8, 8], the output feeding it is [1, 8, 4] (fix: "
     "make the shapes agree in model.yaml, or, for one size, feed: {dec.hidden: {from: <graph>.<output>, reshape: "
     "true}})"),
    ("{hidden: {shape", "{q: {shape: [1, 2], dtype: float32}, hidden: {shape",
     "pipeline: input 'q' of graph 'dec' at size seq 8 is fed by no earlier graph's output (fix: add feed: {dec.q: "
     "<graph>.<output>})"),
    ("graphs: [enc, dec]}", "graphs: [enc, dec], feed: {dec.hidden: {from: enc.hidden, stack: {runs: 3, axis: 1}}}}",
     "pipeline.feed.dec.hidden.stack: output 'hidden' of graph 'enc' at size seq 8 [1, 8, 4] stacked over 3 runs on "
     "axis 1 is [1, 24, 4], input 'hidden' of graph 'dec' at size seq 8 is [1, 8, 4]"),
    ("graphs: [enc, dec]}", "graphs: [enc, dec], feed: {enc.scale: dec.out}}",
     "pipeline.feed.enc.scale: 'enc.scale: dec.out' does not feed a later graph's input from an earlier graph's output"),
])
def test_a_pipeline_per_size_names_the_declared_graph_and_the_size_not_the_size_graph(tmp_path, old, new, expected):
    """A pipeline over graphs with sizes runs one chain per size of graphs renamed `dec.seq8`: a name model.yaml never
    writes. Its errors name the declared graph at its size and the feed key as written (they said `dec.seq8`)."""
    text = SIZED_YAML + CHAINED + "pipeline: {graphs: [enc, dec]}\n"
    assert old in text
    line = spec_error(tmp_path, text.replace(old, new))
    assert expected in line and "seq8" not in line and "seq32" not in line, line


def test_a_stage_of_a_pipeline_per_size_names_the_declared_graph_and_the_size(tmp_path):
    """The glue between a size's graphs names the declared graph at its size and the feed key as written."""
    from qnn_tasks.judge.glue import feed_runs
    from qnn_tasks.modelspec.specpipeline import Naming

    stacked = CHAINED.replace("[1, seq, 4], dtype", "[1, 3, seq, 4], dtype")  # 3 runs of enc's hidden
    model = load(tmp_path, SIZED_YAML + stacked + "pipeline: {graphs: [enc, dec], feed: {dec.hidden: {from: enc.hidden, "
                 "stack: {runs: 3, axis: 1}}}}\n")
    chain = model.size_pipelines[0]
    enc, dec = (next(g for g in model.graphs if g.name == name) for name in chain.graphs)
    produced = {"enc.seq8": [{"hidden": np.zeros((1, 8, 4), np.float32)}] * 2}
    naming = Naming({g.name: g for g in (enc, dec)}, per_size=True)
    with pytest.raises(Exception) as caught:
        feed_runs(dec, chain.feed, chain.glue, [enc], produced, naming)
    assert ("model.yaml: pipeline.feed.dec.hidden.stack: stacks 3 runs of graph 'enc' at size seq 8, which ran only 2 "
            "times (fix: give the pipeline's first graph more samples, or stack fewer runs)") in str(caught.value)
    # the stage learns that its chain is one size's from its call (and names graphs as above)
    planner = Planner(load_project(tmp_path))
    pt = next(pt for pt in planner.pipelines if pt.name == "m.seq8-SM8650")
    assert plan_pipeline(planner, PIPELINE, pt).args()["size"] == "seq8"


def test_a_decoder_fed_its_encoders_size_and_a_start_token_runs_per_size_on_the_simulator(tmp_path):
    """The encoder -> decoder chain per size on SM8650's simulator, the decoder's start token a constant
    (`feed: {dec.tok: {value: 1.0}}`): both chains give it the token on every run, so the CPU chain's end is the
    sum over the encoder's positions plus 1, and the NPU chain's agrees with it."""
    project = chained_sized_project(tmp_path / "p")
    project.doit("pipeline:chain.seq8-SM8650", check=True)
    record = project.one_json("build/chain/pipeline.seq8/*/SM8650/pipeline/pipeline.json")
    assert record["status"] == "passed" and [link["graph"] for link in record["links"]] == ["enc.seq8", "dec.seq8"]
    with np.load(project.path("build/chain/enc.seq8/cpucheck/reference.npz")) as encoded:
        expected = encoded["mem"].sum(axis=2) + 1.0  # [n, 1, 4]: the decoder's math with tok = 1
    chain = Path(record["reference_file"])
    chain = chain if chain.is_absolute() else project.path(str(chain))
    with np.load(chain) as reference, np.load(chain.with_name("outputs.npz")) as npu:
        np.testing.assert_allclose(reference["y"], expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(npu["y"], expected, rtol=1e-2, atol=1e-2)


def test_raw_records_under_dims_have_a_length_and_longer_applies_to_them(tmp_path):
    """A raw file for an input with a sized dim is records of `record_length` positions, each fitted to every size
    like any sample (padded; `longer: skip` leaves the longer ones out of the smaller size). It was cut into
    size-long chunks: at 8 the 6 records of 12 positions were 9 chunks, halves of records and pad-only tails."""
    project = chained_sized_project(tmp_path / "p")
    folder = project.path("models/chain")
    with np.load(folder / "samples.npz") as stored:
        records = stored["x"]  # [6, 1, 12, 4]: each record padded with 0 after its length
    (folder / "x.bin").write_bytes(records.astype("<f4").tobytes())
    model_yaml = "models/chain/model.yaml"
    project.edit(model_yaml, "samples: {files: samples.npz}", "samples: {raw: {files: x.bin}}")
    line = project.doit("list").stderr.strip()
    assert line.count("\n") == 0 and ("graphs.enc.samples.raw.record_length: required: input 'x' has dim 'seq' (sizes "
                                      "[8, 16]), and without it each size would cut the files into chunks of its own "
                                      "length, splitting records (fix: add record_length:") in line, line
    project.edit(model_yaml, "samples: {raw: {files: x.bin}}", "samples: {raw: {files: x.bin, record_length: 12}}")
    project.doit("cpucheck:enc.seq8", "cpucheck:enc.seq16", check=True)
    for size in (8, 16):
        fitted = project.one_json(f"build/chain/enc.seq{size}/cpucheck/cpucheck.json")["fitted"]
        longer = [i for i, n in enumerate(CHAIN_LENGTHS) if n > size]
        assert (fitted["samples"], fitted["skipped"], fitted["kept"]) == (6, longer, 6 - len(longer)), fitted
        with np.load(project.path(f"build/chain/enc.seq{size}/cpucheck/inputs.npz")) as inputs:
            kept = [i for i in range(6) if i not in longer]
            expected = np.zeros((len(kept), 1, size, 4), np.float32)
            expected[:, :, :min(size, 12)] = records[kept][:, :, :size]
            np.testing.assert_array_equal(inputs["x"], expected)
    # an input without a sized dim has no records: its chunks are its samples
    project.edit(model_yaml, "samples: {from: {mem: enc.mem}, fill: {tok: 1.0}}",
                 "samples: {from: {mem: enc.mem}, raw: {files: x.bin, input: tok, record_length: 2}}")
    line = project.doit("list").stderr.strip()
    assert ("graphs.dec.samples.raw.record_length: input 'tok' has no dim with sizes: each sample is one input-sized "
            "chunk [1, 1] (fix: remove record_length)") in line, line
