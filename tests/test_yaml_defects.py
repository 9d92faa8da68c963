"""Defects seen porting real packaged models with model.yaml alone (issue 22), each on a small model built in code.

Real onnx, onnxruntime and doit; the one simulator run is the variance test (marked slow only if it must be).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qnn_tasks import rewrites
from qnn_tasks.errors import StageError
from qnn_tasks.rewrites import boundary
from qnn_tasks.spec import GraphSpec, Source, TensorSpec
from qnn_tasks.stages import export as export_stage

F = TensorProto.FLOAT
RNG = np.random.default_rng(22)


def model_of(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def packaged_graph(model_dir: Path, inputs, outputs, name="g", **extra) -> GraphSpec:
    """The GraphSpec spec.py makes for a YAML-only graph whose source is `model_dir/m.onnx`."""
    fields = dict(name=name, model=model_dir.name, model_dir=model_dir, inputs=tuple(inputs), outputs=tuple(outputs),
                  precisions=("fp16",), socs=None, export="export", options={}, simplify={}, cpucheck={}, lint={},
                  verify={}, allow_cpu_fallback=False, calibration={}, source=Source(None, "m.onnx", None),
                  has_code=False)
    fields.update(extra)
    return GraphSpec(**fields)


# ================================================================ 1. -1 dims are dynamic

def minus_one_model():
    """A conv-net input as many exporters write it: [-1, 3, -1, -1] (dim_value -1, no dim_param)."""
    nodes = [helper.make_node("Mul", ["x", "two"], ["y"])]
    return model_of(nodes, [helper.make_tensor_value_info("x", F, [-1, 3, -1, -1])],
                    [helper.make_tensor_value_info("y", F, [-1, 3, -1, -1])], [const("two", 2.0)])


def test_minus_one_dims_take_the_declared_values():
    model = minus_one_model()
    report = boundary.fix_io(model, [TensorSpec("x", (1, 3, 48, 192), "float32")],
                             [TensorSpec("y", (1, 3, 48, 192), "float32")])
    onnx.checker.check_model(model, full_check=True)
    dims = [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in (model.graph.input[0], model.graph.output[0])]
    assert dims == [[1, 3, 48, 192], [1, 3, 48, 192]]
    assert report["dims"]["input 'x'"] == {"onnx": ["?", 3, "?", "?"], "declared": [1, 3, 48, 192]}


def test_a_fixed_dim_next_to_minus_one_still_must_agree_and_the_message_says_which_are_dynamic():
    with pytest.raises(boundary.BoundaryError) as info:
        boundary.fix_io(minus_one_model(), [TensorSpec("x", (1, 4, 48, 192), "float32")],
                        [TensorSpec("y", (1, 4, 48, 192), "float32")])
    assert str(info.value) == "input 'x' is ['?', 3, '?', '?'] in the ONNX, model.yaml says [1, 4, 48, 192]"
    assert info.value.fix == "keep the ONNX's fixed dims; only its dynamic ones can be chosen"


# ================================================================ 2. stale output metadata: the CPU run is the truth

def stale_output_model():
    """Declares its output [1, seqlen] (what the exporter was traced with) but computes [seqlen, 1, 8]."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),          # [seqlen, 1]
             helper.make_node("Unsqueeze", ["t", "axis"], ["u"]),             # [seqlen, 1, 1]
             helper.make_node("Mul", ["u", "row"], ["y"])]                    # [seqlen, 1, 8]
    return model_of(nodes, [helper.make_tensor_value_info("x", F, [1, "seqlen"])],
                    [helper.make_tensor_value_info("y", F, [1, "seqlen"])],
                    [const("axis", [2], np.int64), const("row", RNG.standard_normal((1, 1, 8)))])


def _export(tmp_path: Path, outputs) -> dict:
    model_dir = tmp_path / "models" / "stale"
    model_dir.mkdir(parents=True, exist_ok=True)
    onnx.save(stale_output_model(), str(model_dir / "m.onnx"))
    graph = packaged_graph(model_dir, [TensorSpec("x", (1, 16), "float32")], outputs)
    return export_stage.run(graph, model_dir / "m.onnx", tmp_path / "build" / "g.onnx")


def test_stale_output_metadata_gives_one_truthful_error_then_is_replaced(tmp_path):
    # first run: the metadata's shape, as declared: the CPU run says what it really is
    with pytest.raises(StageError) as info:
        _export(tmp_path, [TensorSpec("y", (1, 16), "float32")])
    assert "output 'y' is [16, 1, 8] when run on CPU, model.yaml says [1, 16]" in str(info.value)
    assert not (tmp_path / "build" / "g.onnx").exists()
    # corrected to what it computes: no rank complaint from the stale metadata, the record says it was replaced
    record = _export(tmp_path, [TensorSpec("y", (16, 1, 8), "float32")])
    assert record["boundary"]["stale_output_metadata"] == {"output 'y'": {"onnx": [1, "seqlen"], "computed": [16, 1, 8]}}
    assert record["io"]["outputs"] == [{"name": "y", "shape": [16, 1, 8], "dtype": "float32"}]
    [warning] = [w for w in record["warnings"] if "metadata" in w]
    assert "output 'y'" in warning and "[1, 'seqlen']" in warning and "[16, 1, 8]" in warning
    # a declaration that is neither the metadata nor the truth is refused by the CPU run, one line
    with pytest.raises(StageError) as info:
        _export(tmp_path, [TensorSpec("y", (16, 8), "float32")])
    assert "output 'y' is [16, 1, 8] when run on CPU, model.yaml says [16, 8]" in str(info.value)
    assert "rank" not in str(info.value) and "\n" not in str(info.value)


# ================================================================ 5. the int8-in-ONNX refusal: one line per rule

def int8_model():
    """20 QuantizeLinear/DequantizeLinear pairs, then onnxruntime contrib quantized ops (com.microsoft): 44 nodes."""
    ms = "com.microsoft"
    nodes, a = [], "x"
    for i in range(20):
        nodes += [helper.make_node("QuantizeLinear", [a, "s", "zp"], [f"q{i}"], name=f"quant_{i}"),
                  helper.make_node("DequantizeLinear", [f"q{i}", "s", "zp"], [f"dq{i}"], name=f"dequant_{i}")]
        a = f"dq{i}"
    nodes += [helper.make_node("DynamicQuantizeMatMul", [a, "w8", "ws"], ["mm"], name="dqmm", domain=ms),
              helper.make_node("MatMulIntegerToFloat", ["mm_q", "w8", "s", "ws"], ["mm2"], name="mmitf", domain=ms),
              helper.make_node("DynamicQuantizeLSTM", ["mm", "lw", "lr", "", "", "", "", "", "ws", "zp", "ws", "zp"],
                               ["lstm"], name="lstm", domain=ms, hidden_size=8),
              helper.make_node("QGemm", ["mm_q", "s", "zp", "w8", "ws", "zp"], ["gemm"], name="qgemm", domain=ms),
              helper.make_node("Sum", ["lstm", "mm2", "gemm"], ["y"], name="sum")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 8]),
                                           helper.make_tensor_value_info("mm_q", TensorProto.UINT8, [1, 8])],
                              [helper.make_tensor_value_info("y", F, [1, 8])],
                              [const("s", 0.1), const("zp", 0, np.uint8), const("w8", np.ones((8, 8)), np.int8),
                               const("ws", 0.1), const("lw", np.ones((1, 8, 32)), np.int8),
                               const("lr", np.ones((1, 8, 32)), np.int8)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)])
    model.ir_version = 10
    return model


def test_every_contrib_quantized_op_is_int8_in_onnx():
    from qnn_tasks import onnxinfo

    for op in ("DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "DynamicQuantizeLinear", "QLinearConv", "QLinearSigmoid",
               "QLinearSoftmax", "QLinearConcat", "QLinearGlobalAveragePool", "QLinearLeakyRelu", "QLinearWhere",
               "MatMulInteger", "MatMulIntegerToFloat", "ConvInteger", "QAttention", "QGemm", "QOrderedMatMul",
               "QEmbedLayerNormalization", "QuantizeLinear", "DequantizeLinear", "MatMulNBits"):
        assert onnxinfo.is_quantized(helper.make_node(op, ["a"], ["b"])), op
    for op in ("MatMul", "Conv", "LSTM", "Gemm", "Attention", "Quantize"):
        assert not onnxinfo.is_quantized(helper.make_node(op, ["a"], ["b"])), op


def test_int8_refusal_is_one_line_per_rule_with_a_count_and_the_first_nodes(tmp_path):
    model_dir = tmp_path / "models" / "q"
    model_dir.mkdir(parents=True)
    onnx.save(int8_model(), str(model_dir / "m.onnx"))
    graph = packaged_graph(model_dir, [TensorSpec("x", (1, 8), "float32"), TensorSpec("mm_q", (1, 8), "uint8")],
                           [TensorSpec("y", (1, 8), "float32")])
    with pytest.raises(StageError) as info:
        export_stage.run(graph, model_dir / "m.onnx", tmp_path / "build" / "g.onnx")
    message = str(info.value)
    assert message.count("[int8-in-onnx]") == 1 and message.count("(fix: export the float model") == 1
    assert "44 sites (QuantizeLinear node 'quant_0', DequantizeLinear node 'dequant_0', QuantizeLinear node " \
           "'quant_1' and 41 more)" in message
    assert "\n" not in message and len(message) < 600
    # every contrib op was found (the record of lint lists each node)
    from qnn_tasks.stages.lint import find_problems

    found = {f.where for f in find_problems(int8_model(), graph) if f.rule == "int8-in-onnx"}
    assert {"DynamicQuantizeLSTM node 'lstm'", "DynamicQuantizeMatMul node 'dqmm'", "MatMulIntegerToFloat node 'mmitf'",
            "QGemm node 'qgemm'"} <= found and len(found) == 44


# ================================================================ 6. advice reads the target's own settings

def test_w8a16_failure_hint_never_suggests_what_is_already_set(tmp_path):
    from qnn_tasks.stages.simverify import quantized_hint

    graph = packaged_graph(tmp_path, [TensorSpec("x", (1, 8), "float32")], [TensorSpec("y", (1, 8), "float32")],
                           precisions=("w8a16",), calibration={"samples": 32, "function": "samples", "per_channel": True})
    hint = quantized_hint(graph)
    assert "per_channel" not in hint and "calibration.samples is 32" in hint
    per_tensor = packaged_graph(tmp_path, graph.inputs, graph.outputs, precisions=("w8a16",),
                                calibration={"samples": 8, "function": "samples", "per_channel": False})
    assert "try calibration.per_channel: true" in quantized_hint(per_tensor)


def test_diagnose_on_a_w8a16_build_does_not_advise_w8a16():
    """The overflow seen in an STFT conv (CPU -670882, NPU -65536): fp16 is told of w8a16, a w8a16 build is not."""
    from qnn_tasks.stages.diagnose import hazards

    node = helper.make_node("Conv", ["x", "w"], ["y"], name="stft")
    detail = {"cpu_value": -670882.0, "npu_value": -65536.0, "input_values": {"x": 3.0}}
    [fp16] = hazards(node, detail, {}, "fp16")
    [w8a16] = hazards(node, detail, {}, "w8a16")
    assert fp16["hazard"] == w8a16["hazard"] == "fp16 overflow"
    assert "use w8a16" in fp16["fix"]
    assert "use w8a16" not in w8a16["fix"] and "w8a16 already" in w8a16["fix"]


# ================================================================ a small YAML-only project (items 7 and 8)

GOOD_YAML = """\
licence: test
source: {file: m.onnx}
graphs:
  scale:
    inputs: {x: {shape: [1, 8], dtype: float32}}
    outputs: {y: {shape: [1, 8]}}
    precision: w8a16
    calibration: {samples: 8}
    samples: {files: "samples/*.npz"}
"""


def small_project(root: Path, models: dict[str, str]):
    """dodo.py, one chip (SM8650), the toolchain profiles, and a folder per model: m.onnx (y = 2x), samples/, model.yaml."""
    import shutil

    from conftest import ROOT, Project

    root.mkdir(parents=True)
    shutil.copy2(ROOT / "dodo.py", root / "dodo.py")
    shutil.copytree(ROOT / "toolchain", root / "toolchain")
    (root / "socs").mkdir()
    (root / "socs" / "socs.yaml").write_text("socs:\n  SM8650: {soc_id: 57, dsp_arch: v75, vtcm_mb: 8, fp16: true}\n")
    for name, text in models.items():
        folder = root / "models" / name
        (folder / "samples").mkdir(parents=True)
        onnx.save(model_of([helper.make_node("Mul", ["x", "two"], ["y"])], [helper.make_tensor_value_info("x", F, [1, 8])],
                           [helper.make_tensor_value_info("y", F, [1, 8])], [const("two", 2.0)]), str(folder / "m.onnx"))
        np.savez(folder / "samples" / "a.npz", x=RNG.standard_normal((8, 1, 8)).astype(np.float32))
        (folder / "model.yaml").write_text(text)
    return Project(root)


# ================================================================ 8. task names: the docs, and the nearest names for a typo

def test_w8a16_alone_names_its_targets_without_a_suffix(tmp_path):
    project = small_project(tmp_path / "p", {"good": GOOD_YAML})
    listing = project.doit("list", "--all", check=True).stdout
    names = {line.split()[0] for line in listing.splitlines() if line.strip()}
    assert {"quantize:scale", "context:scale-SM8650", "simverify:scale-SM8650"} <= names
    assert not any("w8a16" in n for n in names)


def test_a_mistyped_target_names_the_nearest_tasks(tmp_path):
    project = small_project(tmp_path / "p", {"good": GOOD_YAML})
    for typo, nearest in (("simverify:scale-SM8560", "simverify:scale-SM8650"), ("contxt:scale-SM8650", "context:scale-SM8650"),
                          ("quantize:scale-w8a16", "quantize:scale")):
        result = project.doit(typo)
        assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
        assert f'Invalid parameter: "{typo}"' in result.stderr
        [hint] = [line for line in result.stderr.splitlines() if line.startswith("Did you mean: ")]
        assert nearest in hint.split(": ", 1)[1].rstrip("?").split(", "), hint
    # an on-demand group (created only when asked for): doit itself would run nothing and exit 0
    result = project.doit("diagnose:scale-SM865")
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output, output
    assert 'Invalid parameter: "diagnose:scale-SM865"' in output and "Did you mean: diagnose:scale-SM8650?" in output
    assert not (project.root / "build" / "good").exists()  # nothing was built


# ================================================================ 7. one model's bad spec does not stop the others

def test_a_bad_model_is_not_buildable_and_the_rest_builds(tmp_path):
    good = GOOD_YAML.replace("    precision: w8a16\n    calibration: {samples: 8}\n", "    socs: [SM8650]\n")
    bad = GOOD_YAML.replace("scale:", "other:").replace("samples/*.npz", "recordings/*.npz")  # no such folder
    project = small_project(tmp_path / "p", {"good": good, "bad": bad})
    listing = project.doit("list", "--all")
    assert listing.returncode == 0, listing.stderr
    [line] = [line for line in listing.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: {project.root / 'models/bad/model.yaml'}: graphs.other.samples.files: ") \
        and "(fix: " in line, line
    names = {row.split()[0] for row in listing.stdout.splitlines() if row.strip()}
    assert {"export:scale", "simverify:scale-SM8650", "spec:bad"} <= names and not any("other" in n for n in names)
    # `doit` builds and verifies the good model, fails on the bad one (non-zero), and the report says why
    result = project.doit()
    assert result.returncode != 0 and "Traceback" not in result.stdout + result.stderr
    assert "simverify:scale-SM8650: passed" in result.stdout + result.stderr
    assert any(row.startswith("spec:bad: ") and "recordings/*.npz" in row
               for row in (result.stdout + result.stderr).splitlines()), result.stdout + result.stderr
    import json

    report = json.loads((project.root / "build/report/report.json").read_text())
    assert report["summary"]["models_not_buildable"] == 1 and report["summary"]["passed"] == 1
    [entry] = report["models_not_buildable"]
    assert entry["model"] == "bad" and entry["error"] == line.removeprefix("error: ")
    assert "## Models not buildable" in (project.root / "build/report/report.md").read_text()
    assert "not-buildable" in (project.root / "build/report/index.html").read_text()
    # fixed: the model is loaded again (no stale spec cache), and builds
    (project.root / "models/bad/recordings").mkdir()
    (project.root / "models/bad/samples/a.npz").rename(project.root / "models/bad/recordings/a.npz")
    listing = project.doit("list")
    assert listing.returncode == 0 and listing.stderr == "" and "spec" not in listing.stdout.split()
