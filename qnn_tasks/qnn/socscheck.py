"""Confirm the SoC table: compile a tiny model for every row and compare what the binary records.

`python -m qnn_tasks.qnn.socscheck [--json]` (also `doit socscheck`). QNN's own log and public
tables disagree about some soc_model numbers (SPEC 1: 30 vs 35 for SM8350); the compiled
binary's socModel and arch are the ground truth for the toolchain in use.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from qnn_tasks.errors import QnnTasksError
from qnn_tasks.spec.project import Soc, load_socs
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall


def tiny_model(path: Path) -> None:
    """Conv + Relu, float32 [1,8,16,16]: small enough to compile in a fraction of a second."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "socscheck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def check_row(soc: Soc, model: Path, work: Path) -> dict[str, Any]:
    """Compile for one row; report what the binary says and whether it matches."""
    import onnxruntime as ort

    from qnn_tasks.run.nativelog import native_output_to
    from qnn_tasks.qnn.binary import read_binary_info
    from qnn_tasks.toolchains.ort_qnn import session_options

    options = {"soc_model": str(soc.soc_id), "vtcm_mb": str(soc.vtcm_mb)}
    if not soc.fp16:
        options["enable_htp_fp16_precision"] = "0"
    out = work / soc.name / "socscheck_ctx.onnx"
    out.parent.mkdir(parents=True)
    result: dict[str, Any] = {"soc": soc.row()}
    try:
        with native_output_to(work / soc.name / "compile.log"):
            ort.ModelCompiler(session_options(options), str(model),
                              flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED).compile_to_file(str(out))
        info = read_binary_info(out.with_name("socscheck_ctx_qnn.bin"))
    except Exception as err:
        return {**result, "ok": False, "error": str(err).strip().splitlines()[-1]}
    result.update(recorded_soc_model=info.soc_model, recorded_arch=info.dsp_arch,
                  ok=info.soc_model == soc.soc_id and info.dsp_arch == soc.dsp_arch)
    return result


def check_table(socs: dict[str, Soc]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="socscheck-") as tmp:
        model = Path(tmp) / "socscheck.onnx"
        tiny_model(model)
        return [check_row(soc, model, Path(tmp)) for soc in socs.values()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qnn_tasks.qnn.socscheck", description=__doc__.splitlines()[0])
    parser.add_argument("--socs", default="socs/socs.yaml", help="the SoC table (default: socs/socs.yaml)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    try:
        results = check_table(load_socs(Path(args.socs)))
    except QnnTasksError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            row = r["soc"]
            got = f"socModel {r.get('recorded_soc_model')}, arch {r.get('recorded_arch')}" if "error" not in r else r["error"]
            verdict = "ok" if r["ok"] else "MISMATCH" if "error" not in r else "FAILED"
            print(f"{row['name']:<9} soc_id {row['soc_id']:<3} {row['dsp_arch']:<4} -> {got:<40} {verdict}")
    bad = [r["soc"]["name"] for r in results if not r["ok"]]
    if bad:
        print(f"socs.yaml rows that do not match the compiled binaries: {', '.join(bad)} "
              f"(fix soc_id/dsp_arch in socs/socs.yaml)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())


def run_call(call: StageCall) -> dict[str, Any]:
    return {"rows": check_table({row["name"]: calls.soc({"soc": row}) for row in call.args["socs"]})}
