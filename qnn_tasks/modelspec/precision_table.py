"""The precisions a graph variant is built at: one row each (docs/precision.md), and `auto`, the smallest of a
list that passes.

fp16 is float on the HTP, near-lossless, no data needed. A quantized precision is calibrated on the graph's real
samples and quantized in QNN (never int8 written into the ONNX): activations 16-bit, weights `weight_bits` wide.
w4a16 keeps 4-bit weights for the ops whose weights are the bulk of a graph (Conv, ConvTranspose, MatMul, Gemm: per
output channel, symmetric) and 8-bit for the rest (a LayerNorm's scale at 4 bits is refused by the HTP: QNN error
3110, measured with QNN 2.51). A chip runs a quantized precision where its SoC row runs w8a16: 4-bit weights
compiled for v68, v69, v73, v75, v79 and v81 with no op left on the CPU (QNN 2.51, onnxruntime-qnn 2.7.0).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    weight_bits: int          # 16: fp16 weights; 8 or 4: integer weights (activations 16-bit)
    quantized: bool           # calibrated and quantized in QNN
    runs_as: str              # the word a SoC row's `runs:` uses for the chips that build it
    doc: str
    repaired: bool = False    # its weights' widths are searched by the repair stage (stages/repair.py)
    base: str = ""            # a repaired precision: the plain one it repairs (its weights before any promotion)


TABLE = (
    Precision("fp16", 16, False, "fp16", "16-bit float activations and weights"),
    Precision("w8a16", 8, True, "w8a16", "8-bit weights, 16-bit activations, quantized in QNN"),
    Precision("w4a16", 4, True, "w8a16", "4-bit weights of Conv/MatMul/Gemm (per channel), 8-bit other weights, "
                                         "16-bit activations, quantized in QNN"),
    Precision("w8a16-mixed", 8, True, "w8a16", "w8a16 with the fewest weights kept at 16 bits that make the graph "
                                               "pass its checks, found on the simulator (the repair stage)",
              repaired=True, base="w8a16"),
    Precision("w4a16-mixed", 4, True, "w8a16", "w4a16 with the fewest 4-bit weights kept at 16 bits that make the graph "
                                               "pass its checks, found on the simulator (the repair stage)",
              repaired=True, base="w4a16"),
)
BY_NAME = {p.name: p for p in TABLE}
# `precision: auto`: every candidate is built and verified on every chip; per chip the smallest binary that passes
# its checks ships (stages/choose.py). Smallest expected first: a model may give its own list.
AUTO = "auto"
DEFAULT_AUTO_ORDER = ("w4a16-mixed", "w8a16-mixed", "fp16")
NAMES = tuple(BY_NAME)
QUANTIZED = tuple(p.name for p in TABLE if p.quantized)
RUNS_WORDS = tuple(dict.fromkeys(p.runs_as for p in TABLE))  # what a SoC row's `runs:` may list: fp16, w8a16


def is_quantized(name: str) -> bool:
    return name in BY_NAME and BY_NAME[name].quantized


def any_quantized(names) -> bool:
    """Whether any of these precisions needs calibration samples and a quantize step."""
    return any(is_quantized(n) for n in names)


def is_repaired(name: str) -> bool:
    return name in BY_NAME and BY_NAME[name].repaired


def repaired_names() -> str:
    """The repaired precisions, for messages: "w8a16-mixed or w4a16-mixed"."""
    return " or ".join(p.name for p in TABLE if p.repaired)


def runs_as(name: str) -> str:
    """What a SoC row's `runs:` calls the chips that build this precision."""
    return BY_NAME[name].runs_as if name in BY_NAME else name
