"""The host HTP simulator: runs a compiled `<graph>_ctx.onnx` through onnxruntime-qnn on x86-64.

CPU fallback is disabled, so what runs is exactly the context binary. Times are simulator
times on this host: they say nothing about latency on a phone.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from qnn_tasks.errors import StageError, one_line
from qnn_tasks.nativelog import native_output_to
from qnn_tasks.run import progress

SIMULATOR_LABEL = "x86 HTP simulator time on the build host (not phone latency)"  # on every time measured here


def run(ctx_onnx: Path, provider_options: dict[str, str], inputs: list[dict[str, np.ndarray]],
        log: Path, allow_cpu_fallback: bool = False) -> tuple[list[dict[str, np.ndarray]], list[float], dict[str, list]]:
    """Run every sample; return outputs, seconds per inference, and the session's output signature.

    CPU fallback stays disabled for verification; diagnosis allows it (a node that fell back
    simply shows no error).
    """
    session = open_session(ctx_onnx, provider_options, log, allow_cpu_fallback)
    names = [o.name for o in session.get_outputs()]
    signature = {o.name: list(o.shape) for o in session.get_outputs()}
    outputs, seconds = [], []
    with native_output_to(log):
        for i, sample in enumerate(inputs):
            start = time.perf_counter()
            values = session.run(None, sample)
            seconds.append(time.perf_counter() - start)
            outputs.append(dict(zip(names, values)))
            progress.step(i + 1, len(inputs))
    return outputs, seconds, signature


def open_session(ctx_onnx: Path, provider_options: dict[str, str], log: Path, allow_cpu_fallback: bool = False):
    """An onnxruntime session of the compiled model on the simulator (a loop keeps one for all its steps)."""
    import onnxruntime as ort

    from qnn_tasks.toolchains.ort_qnn import session_options

    try:
        with native_output_to(log):
            return ort.InferenceSession(str(ctx_onnx), session_options(provider_options, disable_cpu_fallback=not allow_cpu_fallback))
    except Exception as err:
        message = one_line(err)  # all of it: its last line alone can lose the node and tensor names
        hint = (" (the context binary beside it is damaged or not a QNN context: rebuild it with doit context)"
                if "binary info" in message or "context cache" in message else "")
        from qnn_tasks.qnn.errorcodes import explain, explain_file, suffix

        hint += suffix(explain_file(log, "load") or explain(message, "load"))
        raise StageError(f"{ctx_onnx}: failed to load on the HTP simulator: {message}{hint} (log: {log})") from None
