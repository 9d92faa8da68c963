"""quantize (ort-qnn, w8a16 and w4a16): the QDQ flow of onnxruntime.quantization for QNN.

Preprocess for QNN, then static QDQ quantization calibrated on the graph's real calibration
set: 8-bit weights (per channel where the op allows), 16-bit activations. w4a16 overrides the weights of
Conv, ConvTranspose, MatMul and Gemm to 4-bit (signed, symmetric, per output channel: the quantizer's per-tensor
overrides); every other weight stays 8-bit (the HTP refuses a 4-bit LayerNorm scale: QNN error 3110). The QDQ model
is compiled like an fp16 one; `offload_graph_io_quantization=0` keeps the I/O quantization on HTP.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from qnn_tasks import fileio
from qnn_tasks.errors import StageError
from qnn_tasks.fileio import atomic_path
from qnn_tasks.graphs.weights import weight_axes
from qnn_tasks.judge import sample_store
from qnn_tasks.modelspec import precision_table
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.toolchains import repairstep
from qnn_tasks.toolchains.base import StageInput, quantized_outputs


def run(si: StageInput) -> dict[str, Any]:
    """The quantize stage: the variant's QDQ model; a repaired precision's with the weights its repair promoted,
    adopted from the repair's chosen step, which quantized exactly this (toolchains/repairstep.py)."""
    promoted = fileio.read_json(si.promoted)["promoted"] if si.promoted else []
    out = quantized_outputs(si.graph, si.precision, si.out_dir)[0]
    adopted = repairstep.qdq(si.promoted)
    if adopted:
        fileio.place(adopted["path"], out)
        record = {**adopted["record"], "adopted_from_repair": str(adopted["path"])}
    else:
        record = quantize_model(si.graph, si.precision, si.source, sample_store.load(si.calibration), out,
                                si.out_dir, promoted=[p["weight"] for p in promoted])
    if si.promoted:
        record["promoted"] = promoted
    return record


PREPROCESSED = "preprocessed.onnx"  # the quantizer's fused model, when its preprocessing changed anything


def preprocessed(source: Path, work: Path) -> Path:
    """`source` as the QNN quantizer sees it: its fusions (an Erf GELU into one Gelu node...) in a new file under
    `work`, or `source` hard-linked there when they change nothing (a copy if it keeps external data: onnx refuses
    to read external data with more than one link). Never `source` itself: the quantizer writes a
    `<name>-inferred.onnx` beside the model it reads, so two quantizations of one source (the repair and the plain
    variant, side by side under doit -n 2) must not read it from one folder. A graph whose intermediates are exposed
    must be exposed after this, or a fused-away tensor is an output nothing makes."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model

    work.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(source), load_external_data=False)  # the file read once, whether its data is inside or not
    external = any(uses_external_data(t) for t in model.graph.initializer)
    if external:
        load_external_data_for_model(model, str(source.parent))
    del model.metadata_props[:]  # the preprocessing crashes on onnxsim's
    out = work / PREPROCESSED
    if qnn_preprocess_model(model, str(out)):
        return out
    if external:
        return _saved(source, work)
    fileio.place(source, work / source.name)
    return work / source.name


def _saved(source: Path, work: Path) -> Path:
    """A copy of `source` in one file under `work` (read again: the preprocessing may have moved the model's
    tensors it was handed to external data of its own)."""
    import onnx

    model = onnx.load(str(source))
    del model.metadata_props[:]
    path = work / "float.onnx"
    onnx.save(model, str(path))
    return path


def quantize_model(graph: GraphSpec, precision: str, source: Path, calibration: list, out: Path, log_dir: Path,
                   promoted: list[str] = (), prepared: bool = False) -> dict[str, Any]:
    """Quantize `source` to `out` at `precision` on `calibration`; `promoted` weights are kept at 16 bits (signed,
    symmetric, per output channel): what the repair promotes; `prepared`: `source` is preprocessed() already (the
    repair's steps share one). Returns the record's fields."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    log = log_dir / "quantize.log"
    if not prepared:
        source = preprocessed(source, log_dir / ".work")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._samples = iter(calibration)

        def get_next(self):
            return next(self._samples, None)

    per_channel = bool(graph.section("calibration")["per_channel"])
    bits = precision_table.BY_NAME[precision].weight_bits
    light = onnx.load(str(source), load_external_data=False)
    axes = weight_axes(light)
    four = axes if bits == 4 else {}
    overrides = {name: [{"quant_type": QuantType.QInt4, "symmetric": True, **({"axis": axis} if per_channel else {})}]
                 for name, axis in four.items()}
    overrides.update({name: [{"quant_type": QuantType.QInt16, "symmetric": True,
                              **({"axis": axes[name]} if per_channel and name in axes else {})}] for name in promoted})
    handler = logging.FileHandler(log, mode="w")
    logging.getLogger().addHandler(handler)
    try:
        config = get_qnn_qdq_config(str(source), Reader(), activation_type=QuantType.QUInt16,
                                    weight_type=QuantType.QUInt8, per_channel=per_channel,
                                    **({"init_overrides": overrides} if overrides else {}))
        with atomic_path(out) as tmp:
            quantize(str(source), str(tmp), config)
    except Exception as err:
        raise StageError(f"quantizing '{graph.name}' to {precision} failed: {type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0] if str(err).strip() else ''} (log: {log})") from None
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    qdq = onnx.load(str(out), load_external_data=False)
    warnings = [line.strip() for line in log.read_text().splitlines() if "WARNING" in line.upper()]
    return {"calibration_samples": len(calibration), "activation_type": "uint16",
            "weight_type": "int4 (Conv/MatMul/Gemm weights), uint8 (the rest)" if four else "uint8",
            **({"four_bit_weights": len(four)} if bits == 4 else {}), "per_channel": per_channel,
            "preprocessed": source.name == PREPROCESSED, "nodes": len(qdq.graph.node),
            "quantize_ops": sum(1 for n in qdq.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")),
            "log": str(log), "notes": warnings}
