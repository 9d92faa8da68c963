"""Whisper's audio encoder in PyTorch, built from a CTranslate2 model's `encoder/...` variables.

Two convolutions with GELU, the fixed positional embedding, pre-LayerNorm transformer blocks
(self-attention with one fused QKV projection, GELU MLP) and a final LayerNorm. Sizes come from
the weights as Python ints: reading head sizes from `x.shape` while tracing put shape
arithmetic (and 4 `Pow` ops) into the ONNX graph.
"""
from __future__ import annotations

import math
import re

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

LAYER_NORM_EPS = 1e-5


def _param(array: np.ndarray) -> nn.Parameter:
    return nn.Parameter(torch.from_numpy(np.array(array, dtype=np.float32)), requires_grad=False)


class _LayerNorm(nn.Module):
    def __init__(self, weights: dict[str, np.ndarray], scope: str) -> None:
        super().__init__()
        self.gamma, self.beta = _param(weights[f"{scope}/gamma"]), _param(weights[f"{scope}/beta"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.gamma, self.beta, LAYER_NORM_EPS)


class _Linear(nn.Module):
    def __init__(self, weights: dict[str, np.ndarray], scope: str) -> None:
        super().__init__()
        self.weight, self.bias = _param(weights[f"{scope}/weight"]), _param(weights[f"{scope}/bias"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _Block(nn.Module):
    """x + attention(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, weights: dict[str, np.ndarray], scope: str, heads: int, frames: int) -> None:
        super().__init__()
        self.attn_norm = _LayerNorm(weights, f"{scope}/self_attention/layer_norm")
        self.qkv = _Linear(weights, f"{scope}/self_attention/linear_0")  # [3 * d, d]: q, k, v stacked
        self.out = _Linear(weights, f"{scope}/self_attention/linear_1")
        self.mlp_norm = _LayerNorm(weights, f"{scope}/ffn/layer_norm")
        self.fc1 = _Linear(weights, f"{scope}/ffn/linear_0")
        self.fc2 = _Linear(weights, f"{scope}/ffn/linear_1")
        self.heads, self.frames = heads, frames
        self.width = self.out.weight.shape[0]
        self.head_dim = self.width // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, h, d = self.frames, self.heads, self.head_dim
        q, k, v = self.qkv(self.attn_norm(x)).split(self.width, dim=-1)
        q = q.reshape(1, t, h, d).transpose(1, 2)
        k = k.reshape(1, t, h, d).transpose(1, 2)
        v = v.reshape(1, t, h, d).transpose(1, 2)
        weights = torch.softmax(torch.matmul(q * self.scale, k.transpose(-1, -2)), dim=-1)
        attended = torch.matmul(weights, v).transpose(1, 2).reshape(1, t, self.width)
        x = x + self.out(attended)
        return x + self.fc2(F.gelu(self.fc1(self.mlp_norm(x))))


class WhisperEncoder(nn.Module):
    """mel [1, n_mels, 2 * frames] -> features [1, frames, d] (batch 1, fixed length)."""

    def __init__(self, weights: dict[str, np.ndarray], heads: int) -> None:
        super().__init__()
        conv1, conv2 = weights["encoder/conv1/weight"], weights["encoder/conv2/weight"]
        self.conv1 = nn.Conv1d(conv1.shape[1], conv1.shape[0], conv1.shape[2], padding=1)
        self.conv2 = nn.Conv1d(conv2.shape[1], conv2.shape[0], conv2.shape[2], stride=2, padding=1)
        for conv, scope in ((self.conv1, "encoder/conv1"), (self.conv2, "encoder/conv2")):
            conv.weight, conv.bias = _param(weights[f"{scope}/weight"]), _param(weights[f"{scope}/bias"])
        self.positions = _param(weights["encoder/position_encodings/encodings"])
        frames = int(self.positions.shape[0])
        count = len({m.group(1) for m in map(re.compile(r"encoder/layer_(\d+)/").match, weights) if m})
        self.blocks = nn.ModuleList(_Block(weights, f"encoder/layer_{i}", heads, frames) for i in range(count))
        self.norm = _LayerNorm(weights, "encoder/layer_norm")

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel))))
        x = x.transpose(1, 2) + self.positions
        for block in self.blocks:
            x = block(x)
        return self.norm(x)
