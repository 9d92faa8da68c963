"""An ONNX file run on CPU with onnxruntime: the side every stage compares with (cpucheck's reference, a split's
parts against the whole, diagnose's and the repair's per-node outputs, a pipeline's CPU chain)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def run_onnx_cpu(model_path: Path, inputs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The model's outputs for each sample, by name."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # unused-initializer notices are not for the console
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(None, sample))) for sample in inputs]
