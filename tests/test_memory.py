"""Will it fit (issue 41, item 3): the memory a loaded context holds, read from real binaries compiled here and
estimated from the ONNX before compile; a graph over a chip's memory limit refused by lint before any compile.

Real: onnxruntime-qnn's compiler (the HTP prepare library writes each graph's memory figures into the binary) and
libQnnSystem reading them back. Not checked here: what a phone actually allocates (no phone): the figures are the
prepare library's own, and the 2 GiB limit is the one users report (docs/load-and-fit.md#will-it-fit).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from test_split import YAML, stack_model, stack_project

from qnn_tasks.graphs import memory
from qnn_tasks.qnn.binary import read_binary_info

OPTIONS = {"soc_model": "57", "vtcm_mb": "8"}  # SM8650


def conv_net(side: int, channels: int, layers: int) -> onnx.ModelProto:
    """3x3 convolutions on [1, 3, side, side]: activation-heavy, where the I/O and the spill buffer dominate."""
    rng = np.random.default_rng(5)
    nodes, inits, x, cin = [], [], "x", 3
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((channels, cin, 3, 3)) * 0.1).astype(np.float32),
                                             f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x, cin = f"r{i}", channels
    graph = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, side, side])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, channels, side, side])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def compiled_memory(model: onnx.ModelProto, folder: Path) -> dict:
    from qnn_tasks.toolchains.ort_qnn import compile_context

    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "m.onnx"))
    compile_context(folder / "m.onnx", folder / "m_ctx.onnx", OPTIONS, folder / "compile.log")
    return read_binary_info(folder / "m_ctx_qnn.bin").to_dict()


def test_the_binary_says_what_its_load_holds_and_the_estimate_is_within_ten_percent(tmp_path):
    model = stack_model()
    info = compiled_memory(model, tmp_path / "stack")
    (graph,) = info["graphs"]
    figures = graph["memory"]
    assert figures["io"] == 2 * 16 * 256 * 4  # x and y, float32 at the QNN boundary
    assert figures["vtcm"] == 8 << 20 and figures["spill_fill"] == 0
    read = memory.measured(info)
    assert read["resident"] == sum(figures[k] for k in memory.MEASURED_PARTS) and read["graphs"] == 1
    est = memory.estimate(model, "fp16", 8)
    assert est["io"] == figures["io"] and est["spill_fill"] == 0
    assert abs(memory.error(est["resident"], read["resident"])) <= 0.10, (est, read)
    shown = memory.figure(est, read)
    assert shown["resident_bytes"] == read["resident"] and shown["basis"].startswith("read from the context binary")
    assert shown["estimate"]["basis"].startswith("estimated at lint") and shown["estimate"]["error"] is not None


def test_an_activation_heavy_graph_spills_and_the_estimate_bounds_it_from_above(tmp_path):
    """Activations past VTCM go through a spill buffer; the estimate counts the largest one whole (an upper
    bound: the prepare library tiles where it can)."""
    model = conv_net(512, 64, 3)
    read = memory.measured(compiled_memory(model, tmp_path / "convs"))
    est = memory.estimate(model, "fp16", 8)
    assert read["spill_fill"] > 0 and est["spill_fill"] >= read["spill_fill"]
    assert est["io"] == read["io"] == (3 + 64) * 512 * 512 * 4
    assert est["resident"] >= read["resident"]


def test_a_binary_without_the_figures_gives_none():
    assert memory.measured({"graphs": [{"name": "g", "memory": None}]}) is None
    assert memory.measured(None) is None and memory.figure(None, None) is None
    est = memory.estimate(stack_model(), "w8a16", 8)
    alone = memory.figure(est, None)  # before compile: the estimate, said as one
    assert alone["basis"].startswith("estimated at lint") and "measured" not in alone


def test_a_graph_over_the_memory_limit_is_refused_before_compile_then_split_fits(tmp_path):
    project = stack_project(tmp_path / "p")
    own = project.path("socs/socs.yaml")  # the stack's 2.1 MB of weights fit context_mb, not a 1 MiB memory_mb
    own.write_text(own.read_text().replace("context_mb: 2,", "memory_mb: 1,"))
    refused = project.doit("context:net-SM8650")
    assert refused.returncode != 0
    line = refused.failure_line("lint:net")
    assert "[memory] graph 'net' (fp16): needs about 2.0 MiB resident when loaded (estimated: weights 2.0 MiB" in line
    assert "I/O 0.031 MiB, spill 0.000 MiB), over the 1 MiB limit of v75 (SM8650; memory_mb in the SM8650 row of " \
        f"{project.path('socs/socs.yaml')})" in line, line
    assert "(fix: split: {parts: 4}, or smaller inputs" in line, line  # the fewest parts whose largest fits
    assert not list(project.root.glob("build/stack/net/**/*.bin"))  # stopped before compile

    project.edit(YAML, "    socs: [SM8650]\n", "    socs: [SM8650]\n    split: {parts: 4}\n")
    fits = project.doit("lint")
    assert fits.returncode == 0, fits.stdout + fits.stderr
