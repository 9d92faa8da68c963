"""quantize (ort-qnn, w8a16): the QDQ flow of onnxruntime.quantization for QNN.

Preprocess for QNN, then static QDQ quantization calibrated on the graph's real calibration
set: 8-bit weights (per channel where the op allows), 16-bit activations. The QDQ model is
compiled like an fp16 one; `offload_graph_io_quantization=0` keeps the I/O quantization on HTP.
"""
from __future__ import annotations

import logging
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.fileio import atomic_path
from qnn_tasks.judge import samples as sample_store
from qnn_tasks.toolchains.base import StageInput, quantized_outputs


def run(si: StageInput) -> dict[str, Any]:
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    calibration = sample_store.load(si.calibration)
    out = quantized_outputs(si.graph, si.precision, si.out_dir)[0]
    log = si.out_dir / "quantize.log"
    work = si.out_dir / ".work"
    work.mkdir(parents=True, exist_ok=True)

    # QNN preprocessing crashes on models carrying metadata_props (onnxsim adds them): drop them first.
    model = onnx.load(str(si.source))
    del model.metadata_props[:]
    plain = work / "float.onnx"
    onnx.save(model, str(plain))
    preprocessed = work / "preprocessed.onnx"
    changed = qnn_preprocess_model(str(plain), str(preprocessed))
    source = preprocessed if changed else plain

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._samples = iter(calibration)

        def get_next(self):
            return next(self._samples, None)

    per_channel = bool(si.graph.calibration["per_channel"])
    handler = logging.FileHandler(log, mode="w")
    logging.getLogger().addHandler(handler)
    try:
        config = get_qnn_qdq_config(str(source), Reader(), activation_type=QuantType.QUInt16,
                                    weight_type=QuantType.QUInt8, per_channel=per_channel)
        with atomic_path(out) as tmp:
            quantize(str(source), str(tmp), config)
    except Exception as err:
        raise StageError(f"quantizing '{si.graph.name}' to w8a16 failed: {type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0] if str(err).strip() else ''} (log: {log})") from None
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    qdq = onnx.load(str(out), load_external_data=False)
    warnings = [line.strip() for line in log.read_text().splitlines() if "WARNING" in line.upper()]
    return {"calibration_samples": len(calibration), "activation_type": "uint16", "weight_type": "uint8",
            "per_channel": per_channel, "preprocessed": bool(changed), "nodes": len(qdq.graph.node),
            "quantize_ops": sum(1 for n in qdq.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")),
            "log": str(log), "notes": warnings}
