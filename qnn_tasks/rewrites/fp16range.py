"""What fp16 holds, as the rewrites need it (no onnx or numpy: the catalogue imports this at spec load)."""
from __future__ import annotations

FP16_MAX = 65504.0
FP16_SCALES = (-14, 15)  # the powers of two fp16 holds as normal numbers: 2^-14 .. 2^15
