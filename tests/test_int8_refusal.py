"""Issue 35, item 5: a packaged int8 model is refused in one line without anyone inventing samples for it.

Its refusal was reachable only after declaring samples (the spec demanded them before export ran, and a `fill`-only
declaration was refused about a `samples.files` key never written); its fix said "(precision: w8a16)" when that was
set; `calibrate` then added an unrelated second failure; `lint: {allow: [int8-in-onnx]}` was ignored silently.
Real ONNX models built here, real doit runs of the built-in export (no simulator: nothing gets that far).
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import Project, copy_project
from onnx import TensorProto, helper, numpy_helper

from qnn_tasks.errors import SpecError

F = TensorProto.FLOAT
YAML = """\
licence: test fixture
source: {{file: m.onnx}}
graphs:
  g:
    inputs: {{x: {{shape: [1, 16], dtype: float32}}}}
    outputs: {{y: {{shape: [1, 16]}}}}
    precision: [{precision}]
    socs: [SM8650]
{extra}"""


def int8_model() -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> y: int8 arithmetic written into the ONNX, as packaged models ship."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="quant"),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dequant")]
    return _model(nodes, [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
                          numpy_helper.from_array(np.array(0, np.uint8), "zp")])


def float_model() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [])


def _model(nodes: list, initializers: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, 16])],
                              [helper.make_tensor_value_info("y", F, [1, 16])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def project_with(root: Path, model: onnx.ModelProto, precision: str = "w8a16", extra: str = "") -> Project:
    """The example project with its models replaced by `g` (a packaged ONNX, no export.py, no samples unless `extra`)."""
    project = copy_project(root)
    for folder in project.root.glob("models/*"):
        shutil.rmtree(folder)
    folder = project.path("models/q")
    folder.mkdir(parents=True)
    onnx.save(model, str(folder / "m.onnx"))
    (folder / "model.yaml").write_text(YAML.format(precision=precision, extra=extra))
    return project


def failures(output: str) -> list[str]:
    return re.findall(r"^TaskFailed - taskid:(\S+)$", output, re.M)


@pytest.mark.parametrize("extra", ["", "    samples: {fill: {x: 0.5}}\n", "    samples: {files: x.npz}\n"],
                         ids=["no-samples", "fill-only", "one-invented-sample"])
def test_an_int8_model_is_refused_by_export_alone_whatever_samples_say(tmp_path, extra):
    project = project_with(tmp_path / "p", int8_model(), extra=extra)
    np.savez(project.path("models/q/x.npz"), x=np.zeros((1, 1, 16), np.float32))  # what a user invents today
    result = project.doit()
    output = result.stdout + result.stderr
    assert "Traceback" not in output and failures(output) == ["export:g", "report"], output  # no calibrate failure
    line = result.failure_line("export:g")
    assert "[int8-in-onnx] 2 sites (QuantizeLinear node 'quant', DequantizeLinear node 'dequant')" in line
    assert line.endswith("(fix: export the float model (before quantization) and let QNN quantize it: precision: "
                         "w8a16 is already set)"), line
    assert "(precision: w8a16)" not in line and "spec:" not in output


def test_the_fix_proposes_w8a16_only_when_it_is_not_set():
    from qnn_tasks.graphs.lintrules import find_problems
    from qnn_tasks.modelspec.project import GraphSpec, Source, TensorSpec

    for precisions, tail in ((("fp16",), "let QNN quantize it (precision: w8a16)"),
                             (("fp16", "w8a16"), "let QNN quantize it: precision: w8a16 is already set")):
        graph = GraphSpec(name="g", model="q", model_dir=Path("."), inputs=(TensorSpec("x", (1, 16), "float32"),),
                          outputs=(TensorSpec("y", (1, 16), "float32"),), precisions=precisions, socs=None,
                          export="export", options={}, verify={}, allow_cpu_fallback=False,
                          source=Source(None, "m.onnx", None), has_code=False)
        fixes = {f.fix for f in find_problems(int8_model(), graph) if f.rule == "int8-in-onnx"}
        assert fixes == {f"export the float model (before quantization) and {tail}"}


@pytest.mark.parametrize("precision, tail", [("fp16", " (precision: w8a16))"),
                                             ("w8a16", ": precision: w8a16 is already set)")])
def test_allowing_int8_in_onnx_is_refused_at_load_in_one_line(tmp_path, precision, tail):
    """issue 43: with w8a16 already set the line still told the user to add it."""
    from qnn_tasks.modelspec.load import load_model, load_socs

    project = project_with(tmp_path / "p", int8_model(), precision,
                           extra="    lint: {allow: [batch, int8-in-onnx]}\n")
    with pytest.raises(SpecError) as info:
        load_model(project.path("models/q"), load_socs(project.path("socs/socs.yaml")))
    line = str(info.value)
    assert line == (f"{project.path('models/q/model.yaml')}: graphs.g.lint.allow[1]: int8-in-onnx cannot be "
                    "acknowledged: QNN cannot compile int8 arithmetic written into the ONNX (it quantizes itself) "
                    "(fix: remove it from allow; export the float model and let QNN quantize it" + tail)


def test_without_samples_export_and_lint_run_and_cpucheck_names_the_missing_key(tmp_path):
    """Samples are required by the stages that read them, with the line the spec loader used to say."""
    project = project_with(tmp_path / "p", float_model(), precision="fp16")
    project.doit("lint:g", check=True)
    line = project.doit("cpucheck:g").failure_line("cpucheck:g")
    assert line == ("cpucheck:g: models/q/model.yaml: graphs.g.samples: there is no export.py, so verification "
                    'inputs must be declared (fix: add samples: {image: {files: "images/*.png"}}, {audio: {files: '
                    '"clips/*.wav"}}, {raw: {files: "tensors/*.bin"}}, {fill: {<input>: 0.0}}, {from: '
                    '<graph>.<output>} (a graph inside a pipeline) or {files: "samples/*.npz"}, or add export.py '
                    "with samples())"), line
    # a fill-only declaration loads (it fed the int8 refusal above); cpucheck reads it as one sample of constants
    # and says what that verifies, not that a samples.files key is missing
    project.edit("models/q/model.yaml", "    socs: [SM8650]\n", "    socs: [SM8650]\n    samples: {fill: {x: 0.5}}\n")
    line = project.doit("cpucheck:g").failure_line("cpucheck:g")
    assert "graphs.g.samples: every input is one constant over all 1 sample(s) ('x' is 0.5)" in line, line
