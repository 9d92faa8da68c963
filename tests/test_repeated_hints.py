"""A repeated hint is said once (issue 35, item 5): a context failure on 13 Erf nodes was one 2,394-character line
repeating the same fix 13 times, and lint printed a warning per node. Grouped by rule (op type) with a count and the
first sites, as the int8 refusal is; the [erf] warning says the next stage fails with the default
allow_cpu_fallback: false. A model with 5 stray Erf nodes, built in code; real lint, compile and doit."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import helper
from test_rewrites import const, model_of
from test_yaml_defects import small_project

ERFS = 5
YAML = """\
licence: test
source: {file: m.onnx}
graphs:
  erfs:
    inputs: {x: {shape: [1, 64], dtype: float32}}
    outputs: {y: {shape: [1, 64]}}
    samples: {files: "samples/*.npz"}
"""


def stray_erfs() -> onnx.ModelProto:
    """y = sum_k Erf(x * s_k): Erf outside a GELU, which HTP leaves to the CPU."""
    nodes, total = [], None
    for k in range(ERFS):
        nodes += [helper.make_node("Mul", ["x", f"s{k}"], [f"m{k}"]),
                  helper.make_node("Erf", [f"m{k}"], [f"e{k}"], name=f"erf_{k}")]
        if total is None:
            total = f"e{k}"
        else:
            nodes.append(helper.make_node("Add", [total, f"e{k}"], [f"sum{k}" if k < ERFS - 1 else "y"]))
            total = f"sum{k}"
    return model_of(nodes, [helper.make_tensor_value_info("x", 1, [1, 64])], [helper.make_tensor_value_info("y", 1, [1, 64])],
                    [const(f"s{k}", 0.5 + k) for k in range(ERFS)])


@pytest.mark.slow
def test_five_cpu_nodes_of_one_op_are_one_hint_in_lint_and_context(tmp_path):
    project = small_project(tmp_path / "p", {"m": YAML})
    folder = project.root / "models" / "m"
    onnx.save(stray_erfs(), str(folder / "m.onnx"))
    np.savez(folder / "samples" / "a.npz", x=np.random.default_rng(5).standard_normal((2, 1, 64)).astype(np.float32))
    result = project.doit("context:erfs-SM8650")
    output = result.stdout + result.stderr
    # lint: one warning for the five sites, saying what the default allow_cpu_fallback does next
    warnings = [line for line in output.splitlines() if line.startswith("  warning: [erf]")]
    assert warnings == [
        "  warning: [erf] 5 sites (Erf node 'erf_0', Erf node 'erf_1', Erf node 'erf_2' and 2 more): Erf outside a "
        "whole GELU (x * 0.5 * (1 + erf(x / sqrt 2))) runs on CPU on HTP; onnxsim's fuse_preceding_mul_into_conv "
        "folds GELU's x0.5 into the next Conv; matters for compatibility: the Erf needs the CPU, and with "
        "allow_cpu_fallback: false (the default) the context stage fails "
        "(fix: simplify: {skip_optimizers: [fuse_preceding_mul_into_conv]})"], output
    # context: the five nodes and their one hint, once
    line = result.failure_line("context:erfs-SM8650")
    assert re.search(r"5 node\(s\) of graph 'erfs' fall back to CPU on SM8650: 5 Erf nodes \('erf_\d', 'erf_\d', "
                     r"'erf_\d' and 2 more\) \(often left on CPU", line), line  # in the partitioner's order
    assert line.count("add simplify: {skip_optimizers") == 1 and len(line) < 600, line


def test_three_overflowing_constants_are_one_warning_naming_each_value():
    """Masks of -inf and finfo(float32).min were one warning each, their text differing only by the value."""
    from test_rewrites import graph_spec, mask_model

    from qnn_tasks.graphs.lintrules import find_problems, summary_lines

    found = [f for f in find_problems(mask_model(), graph_spec()) if f.rule == "fp16-overflow-constant"]
    [line] = summary_lines(found)
    assert line.startswith("[fp16-overflow-constant] 3 sites (constant '")
    assert "(min -inf)" in line and "(min -3.4e+38)" in line and line.count("(fix: ") == 1, line
