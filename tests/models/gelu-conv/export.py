"""gelu-conv: a tiny seeded PyTorch model, Conv1d(8,16,3) -> GELU (erf form) -> Conv1d(16,8,3).

A test fixture for the CPU-fallback check: exported to ONNX, GELU becomes
x * 0.5 * (1 + Erf(x / sqrt 2)); onnxsim's default `fuse_preceding_mul_into_conv` folds the
x0.5 into the second Conv, and the Erf left outside a whole GELU runs on CPU on QNN HTP.
"""
from __future__ import annotations

import numpy as np

SEED = 0
NUM_SAMPLES = 4


def _model():
    import torch

    class GeluConv(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv1d(8, 16, 3, padding=1)
            self.conv2 = torch.nn.Conv1d(16, 8, 3, padding=1)

        def forward(self, x):
            return self.conv2(torch.nn.functional.gelu(self.conv1(x)))  # approximate="none": the erf form

    torch.manual_seed(SEED)  # same weights in export() and reference(), in any process
    return GeluConv().eval()


def _shape(ctx) -> tuple[int, ...]:
    return tuple(ctx.graph.inputs[0].shape)


def export(ctx) -> None:
    import torch

    with torch.no_grad():
        torch.onnx.export(_model(), (torch.zeros(_shape(ctx)),), str(ctx.out_path), input_names=["x"],
                          output_names=["y"], opset_version=17, dynamo=False)


def samples(ctx) -> list[dict[str, np.ndarray]]:
    # A synthetic model has no real data: deterministic random inputs are all there is to verify with.
    rng = np.random.default_rng(SEED)
    return [{"x": rng.standard_normal(_shape(ctx)).astype(np.float32)} for _ in range(NUM_SAMPLES)]


def reference(ctx, inputs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The PyTorch model itself on the same inputs."""
    import torch

    model = _model()
    with torch.no_grad():
        return [{"y": model(torch.from_numpy(s["x"])).numpy().astype(np.float32)} for s in inputs]
