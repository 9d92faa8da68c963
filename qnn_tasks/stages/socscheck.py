"""Confirm the SoC table: compile a tiny model for every row and compare what the binary records.

`python -m qnn_tasks.stages.socscheck [--json]` (also `doit socscheck`). QNN's own log and public
tables disagree about some soc_model numbers (QNN 2.51's log says 30 for SM8350, sherpa-onnx's table 35); the compiled
binary's socModel and arch are the ground truth for the toolchain in use. Each row is compiled at
every precision it `runs:` (a float Conv+Relu for fp16, its QDQ w8a16 form for w8a16): a chip that
runs only quantized graphs rejects the float one (QNN error 3110), so it is not asked to.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from qnn_tasks.errors import QnnTasksError, StageError
from qnn_tasks.modelspec.load import load_soc_table, load_socs
from qnn_tasks.modelspec.project import Soc
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
    # IR 10: what every onnxruntime of a pinned older toolchain reads (1.24 stops at IR 13)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))


def tiny_qdq_model(float_model: Path, path: Path) -> None:
    """The same Conv + Relu quantized as the project's w8a16 (QNN's QDQ flow: 16-bit activations, 8-bit weights)."""
    import numpy as np
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    rng = np.random.default_rng(1)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._samples = iter([{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self._samples, None)

    logging.disable(logging.WARNING)  # the quantizer's advice (opset, pre-processing) is about real models, not this one
    try:
        config = get_qnn_qdq_config(str(float_model), Reader(), activation_type=QuantType.QUInt16,
                                    weight_type=QuantType.QUInt8)
        quantize(str(float_model), str(path), config)
    finally:
        logging.disable(logging.NOTSET)


def precision_options(soc: Soc, precision: str) -> dict[str, str]:
    """Provider options for one row at one precision, as the project's config stage writes them."""
    options = {"soc_model": str(soc.soc_id), "vtcm_mb": str(soc.vtcm_mb)}
    if precision == "w8a16":
        options["offload_graph_io_quantization"] = "0"
    return options


def check_row(soc: Soc, models: dict[str, Path], work: Path) -> dict[str, Any]:
    """Compile for one row at every precision it runs; report what each binary says and whether it matches."""
    from qnn_tasks.qnn.binary import read_binary_info
    from qnn_tasks.qnn.errorcodes import explain
    from qnn_tasks.toolchains.ort_qnn import compile_context

    result: dict[str, Any] = {"soc": soc.row(), "runs": list(soc.runs), "precisions": {}}
    for precision in soc.runs:
        out = work / soc.name / precision / "socscheck_ctx.onnx"
        out.parent.mkdir(parents=True)
        log = out.with_name("compile.log")
        entry: dict[str, Any] = {}
        try:
            compile_context(models[precision], out, precision_options(soc, precision), log)
            info = read_binary_info(out.with_name("socscheck_ctx_qnn.bin"))
            entry.update(recorded_soc_model=info.soc_model, recorded_arch=info.dsp_arch,
                         ok=soc.binary_mismatch(info.to_dict()) is None)
        except Exception as err:
            message = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            hints = explain(log.read_text(errors="replace") if log.is_file() else message, "compile",
                            soc=soc, precision=precision)
            entry.update(ok=False, error=f"{precision}: {message.split(' (full log:')[0]}"
                         + "".join(f"; {h}" for h in hints))
        result["precisions"][precision] = entry
    entries = list(result["precisions"].values())
    first = next((e for e in entries if "recorded_soc_model" in e), {})
    result.update(ok=all(e["ok"] for e in entries), recorded_soc_model=first.get("recorded_soc_model"),
                  recorded_arch=first.get("recorded_arch"))
    errors = [e["error"] for e in entries if "error" in e]
    if errors:
        result["error"] = "; ".join(errors)
    return result


def check_table(socs: dict[str, Soc]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="socscheck-") as tmp:
        models = {"fp16": Path(tmp) / "socscheck.onnx", "w8a16": Path(tmp) / "socscheck_qdq.onnx"}
        tiny_model(models["fp16"])
        if any("w8a16" in soc.runs for soc in socs.values()):
            tiny_qdq_model(models["fp16"], models["w8a16"])
        return [check_row(soc, models, Path(tmp)) for soc in socs.values()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qnn_tasks.stages.socscheck", description=__doc__.splitlines()[0])
    parser.add_argument("--socs", default=None,
                        help="one socs.yaml to check on its own (default: the packaged table with ./socs/socs.yaml over it)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    try:
        socs = load_socs(Path(args.socs)) if args.socs else load_soc_table(Path.cwd())[0]
        results = check_table(socs)
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
            runs = "+".join(r["runs"])
            print(f"{row['name']:<9} soc_id {row['soc_id']:<3} {row['dsp_arch']:<4} {runs:<11} -> {got:<40} {verdict}")
    bad = [r["soc"]["name"] for r in results if not r["ok"]]
    if bad:
        print(f"socs.yaml rows that do not match the compiled binaries: {', '.join(bad)} "
              f"(fix soc_id/dsp_arch/runs in socs/socs.yaml)", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())


def run_call(call: StageCall) -> dict[str, Any]:
    """`doit socscheck`: the run's SoC table against one toolchain's binaries; a mismatch fails with every row kept."""
    results = check_table({row["name"]: calls.soc({"soc": row}) for row in call.args["socs"]})
    toolchain = call.args["toolchain_id"]
    bad = [r["soc"]["name"] + (f" ({r['error']})" if "error" in r else
                               f" (binary says socModel {r['recorded_soc_model']}, {r['recorded_arch']})")
           for r in results if not r["ok"]]
    if bad:
        raise StageError(f"SoC table rows (socs/socs.yaml over the packaged table) that don't match the binaries of "
                         f"{toolchain}: {'; '.join(bad)}", record={"rows": results})
    return {"rows": results, "console": [f"all {len(results)} rows match with {toolchain} ({call.record})"]}
