"""Whisper's text decoder in PyTorch for the NPU: one step with a static self-attention cache.

Built from a CTranslate2 model's `decoder/...` variables (docs/whisper.md). Two graphs:
  crosskv: encoder features [1, 1500, d] -> every layer's cross-attention K and V
           [layers, 1, heads, 1500, head_dim], computed once per 30 s window.
  decoder: one token -> its logits and its own self-attention K/V. Inputs: token [1, 1] int32,
           the position row [1, 1, d] (the host picks row `offset` of the position encodings),
           mask [1, 1, 1, T] (0 where the cache holds a past token, -60000 elsewhere: finite for fp16),
           the self-attention caches [layers, 1, heads, T, head_dim] and the cross K/V. The step attends
           over cat(cache, its own k/v); the host writes the new k/v into the cache (the loop's step()).
The tied embedding is one parameter, used by the Gather and by the output projection (a Gemm with
transB, so the exported ONNX holds the [vocab, d] matrix once). The HTP compiler still stores it twice
(measured, docs/whisper.md): the Gather's table and a second copy as the projection's static weight. With
`projection_from_table` the projection reads a run-time copy of the Gather's table instead (all rows
gathered with indices the compiler cannot fold), so the binary holds the table once.
"""
from __future__ import annotations

import math
import re

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

LAYER_NORM_EPS = 1e-5
MASKED = -60000.0  # masked attention logit: finite in fp16, exp() underflows to 0


def _param(array: np.ndarray) -> nn.Parameter:
    return nn.Parameter(torch.from_numpy(np.array(array, dtype=np.float32)), requires_grad=False)


def _norm(weights, scope: str) -> tuple[nn.Parameter, nn.Parameter]:
    return _param(weights[f"{scope}/gamma"]), _param(weights[f"{scope}/beta"])


def _linear(weights, scope: str) -> tuple[nn.Parameter, nn.Parameter]:
    return _param(weights[f"{scope}/weight"]), _param(weights[f"{scope}/bias"])


def layer_count(weights) -> int:
    return len({m.group(1) for m in map(re.compile(r"decoder/layer_(\d+)/").match, weights) if m})


class CrossKV(nn.Module):
    """features [1, frames, d] -> (k, v), each [layers, 1, heads, frames, head_dim]."""

    def __init__(self, weights, heads: int) -> None:
        super().__init__()
        self.layers = layer_count(weights)
        self.kv = nn.ParameterList()
        for i in range(self.layers):
            self.kv.extend(_linear(weights, f"decoder/layer_{i}/attention/linear_1"))  # [2d, d]: k then v
        self.heads = heads
        self.width = int(weights["decoder/layer_0/attention/linear_0/weight"].shape[0])

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        frames, h, d = features.shape[1], self.heads, self.width // self.heads
        ks, vs = [], []
        for i in range(self.layers):
            k, v = F.linear(features, self.kv[2 * i], self.kv[2 * i + 1]).split(self.width, dim=-1)
            ks.append(k.reshape(1, frames, h, d).transpose(1, 2))
            vs.append(v.reshape(1, frames, h, d).transpose(1, 2))
        return torch.stack(ks), torch.stack(vs)


class DecoderStep(nn.Module):
    """(token, position, mask, self_k, self_v, cross_k, cross_v) -> (logits, new_k, new_v)."""

    def __init__(self, weights, heads: int, temperature: float = 1.0, projection_from_table: bool = False) -> None:
        super().__init__()
        self.temperature = temperature  # 1: no node; else the logits are divided by it inside the graph
        self.projection_from_table = projection_from_table
        self.layers = layer_count(weights)
        self.embedding = _param(weights["decoder/embeddings/weight"])  # tied: also the output projection
        self.vocab, self.width = (int(n) for n in self.embedding.shape)
        self.heads, self.head_dim = heads, self.width // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.params = nn.ParameterList()
        for i in range(self.layers):
            scope = f"decoder/layer_{i}"
            for name in ("self_attention/layer_norm", "attention/layer_norm", "ffn/layer_norm"):
                self.params.extend(_norm(weights, f"{scope}/{name}"))
            for name in ("self_attention/linear_0", "self_attention/linear_1", "attention/linear_0",
                         "attention/linear_2", "ffn/linear_0", "ffn/linear_1"):
                self.params.extend(_linear(weights, f"{scope}/{name}"))
        self.final = nn.ParameterList(_norm(weights, "decoder/layer_norm"))
        self.register_buffer("rows", torch.arange(self.vocab, dtype=torch.int32), persistent=False)

    def _layer(self, i: int) -> list[nn.Parameter]:
        per = 18  # 3 norms x 2 + 6 linears x 2
        return list(self.params[i * per:(i + 1) * per])

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        scores = torch.matmul(q * self.scale, k.transpose(-1, -2))
        if mask is not None:
            scores = scores + mask
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    def forward(self, token, position, mask, self_k, self_v, cross_k, cross_v):
        h, d, width = self.heads, self.head_dim, self.width
        x = F.embedding(token.reshape(1).long(), self.embedding).reshape(1, 1, width) + position
        full_mask = torch.cat([mask, torch.zeros_like(mask[..., :1])], dim=-1)  # the new token sees itself
        new_k, new_v = [], []
        for i in range(self.layers):
            (sa_g, sa_b, ca_g, ca_b, ff_g, ff_b, qkv_w, qkv_b, sa_ow, sa_ob, cq_w, cq_b, ca_ow, ca_ob,
             fc1_w, fc1_b, fc2_w, fc2_b) = self._layer(i)
            y = F.layer_norm(x, (width,), sa_g, sa_b, LAYER_NORM_EPS)
            q, k, v = F.linear(y, qkv_w, qkv_b).split(width, dim=-1)
            q, k, v = (t.reshape(1, 1, h, d).transpose(1, 2) for t in (q, k, v))
            new_k.append(k)
            new_v.append(v)
            keys = torch.cat([self_k[i], k], dim=2)
            values = torch.cat([self_v[i], v], dim=2)
            x = x + F.linear(self._attend(q, keys, values, full_mask).transpose(1, 2).reshape(1, 1, width), sa_ow, sa_ob)
            y = F.layer_norm(x, (width,), ca_g, ca_b, LAYER_NORM_EPS)
            q = F.linear(y, cq_w, cq_b).reshape(1, 1, h, d).transpose(1, 2)
            x = x + F.linear(self._attend(q, cross_k[i], cross_v[i], None).transpose(1, 2).reshape(1, 1, width),
                             ca_ow, ca_ob)
            y = F.layer_norm(x, (width,), ff_g, ff_b, LAYER_NORM_EPS)
            x = x + F.linear(F.gelu(F.linear(y, fc1_w, fc1_b)), fc2_w, fc2_b)
        x = F.layer_norm(x, (width,), self.final[0], self.final[1], LAYER_NORM_EPS)
        weight = self.embedding
        if self.projection_from_table:  # every row, by indices that depend on an input (token x 0): not foldable
            weight = torch.index_select(self.embedding, 0, self.rows + token.reshape(1) * 0)
        logits = F.linear(x.reshape(1, width), weight).reshape(1, 1, self.vocab)  # Gemm(transB): shared weight
        if self.temperature != 1.0:
            logits = logits / self.temperature
        return logits, torch.stack(new_k), torch.stack(new_v)
