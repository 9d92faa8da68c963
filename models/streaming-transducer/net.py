"""The streaming transducer in PyTorch: a chunked causal encoder with left-context caches, a stateless decoder
(context 2: embedding + 1-D conv, as icefall/sherpa-onnx), a joiner, the RNN-T loss, and the greedy search.

Encoder: 80-bin fbank frames, normalized by the training set's mean and deviation, stacked by 4 (40 ms frames) and
projected; then LAYERS blocks of (self-attention over LEFT cached frames + the chunk, a causal depthwise conv with
KERNEL - 1 cached frames, a feed-forward), each pre-normed. One call takes CHUNK fbank frames (0.32 s) and gives
CHUNK // 4 frames; the caches carry what the next chunk needs, zeros at the start of an utterance. `forward` runs a
whole utterance at once for training with a mask that lets each chunk see exactly what it sees when streamed, so the
trained model is the streamed one (`tests/test_streaming_transducer.py` checks the two agree). Every op is one the
HTP runs in fp16 (MatMul/Gemm, Add/Sub/Mul, LayerNormalization, Softmax, Sigmoid, Tanh, Relu, Conv, Concat,
Slice, Split, Gather, Reshape, Transpose): the three graphs compile with no CPU fallback.
"""
from __future__ import annotations

import math

import torch
from torch import nn

CHUNK = 32           # fbank frames per encoder call: 0.32 s
SUBSAMPLE = 4        # fbank frames stacked into one encoder frame (40 ms)
FRAMES = CHUNK // SUBSAMPLE
CONFIG = {"dim": 128, "heads": 4, "ff": 384, "layers": 4, "left": 32, "kernel": 5, "join": 128, "decoder": 128,
          "context": 2}


class Block(nn.Module):
    """Self-attention (left cache + chunk), causal depthwise conv (its cache), feed-forward; each pre-normed."""

    def __init__(self, dim: int, heads: int, ff: int, kernel: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm_att, self.norm_conv, self.norm_ff, self.norm_out = (nn.LayerNorm(dim) for _ in range(4))
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))
        self.pw1 = nn.Linear(dim, 2 * dim)
        self.dw = nn.Conv1d(dim, dim, kernel, groups=dim)
        self.pw2 = nn.Linear(dim, dim)
        self.ff1, self.ff2 = nn.Linear(dim, ff), nn.Linear(ff, dim)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, c_cache: torch.Tensor,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        b, t, d = x.shape
        dh = d // self.heads
        h = self.norm_att(x)
        keys = torch.cat([k_cache, self.k(h)], 1)
        values = torch.cat([v_cache, self.v(h)], 1)
        q = (self.q(h) * (1.0 / math.sqrt(dh))).reshape(b, t, self.heads, dh).permute(0, 2, 1, 3)
        k = keys.reshape(b, -1, self.heads, dh).permute(0, 2, 3, 1)
        v = values.reshape(b, -1, self.heads, dh).permute(0, 2, 1, 3)
        scores = q @ k
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        att = (torch.softmax(scores, -1) @ v).permute(0, 2, 1, 3).reshape(b, t, d)
        x = x + self.out(att)
        a, g = self.pw1(self.norm_conv(x)).chunk(2, -1)
        conv_in = torch.cat([c_cache, a * torch.sigmoid(g)], 1)
        h = self.dw(conv_in.transpose(1, 2)).transpose(1, 2)
        x = x + self.pw2(h * torch.sigmoid(h))
        h = self.ff1(self.norm_ff(x))
        x = self.norm_out(x + self.ff2(h * torch.sigmoid(h)))
        left, kept = k_cache.shape[1], c_cache.shape[1]
        return x, keys[:, keys.shape[1] - left:], values[:, values.shape[1] - left:], conv_in[:, conv_in.shape[1] - kept:]


class Encoder(nn.Module):
    def __init__(self, cfg: dict = CONFIG, feature_dim: int = 80) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("mean", torch.zeros(feature_dim))
        self.register_buffer("inv_std", torch.ones(feature_dim))
        self.embed = nn.Linear(feature_dim * SUBSAMPLE, cfg["dim"])
        self.embed_norm = nn.LayerNorm(cfg["dim"])
        self.blocks = nn.ModuleList(Block(cfg["dim"], cfg["heads"], cfg["ff"], cfg["kernel"])
                                    for _ in range(cfg["layers"]))
        self.proj = nn.Linear(cfg["dim"], cfg["join"])

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        b, t, f = x.shape
        h = self.embed(((x - self.mean) * self.inv_std).reshape(b, t // SUBSAMPLE, f * SUBSAMPLE))
        return self.embed_norm(h * torch.sigmoid(h))

    def cache_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.cfg
        return {"cached_key": (c["layers"], c["left"], c["dim"]), "cached_val": (c["layers"], c["left"], c["dim"]),
                "cached_conv": (c["layers"], c["kernel"] - 1, c["dim"])}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """A whole utterance [B, T, 80] (T a multiple of CHUNK) -> [B, T / 4, join], each chunk seeing what it would
        see streamed: its own frames and `left` frames before it (zeros before the start)."""
        h = self._embed(x)
        b, t, d = h.shape
        left = self.cfg["left"]
        chunk = torch.arange(t) // FRAMES
        position = torch.arange(left + t)  # key positions: `left` zero frames, then the utterance
        first = chunk * FRAMES  # a chunk's first visible key is `left` frames before its start
        mask = (position[None, :] >= first[:, None]) & (position[None, :] < first[:, None] + left + FRAMES)
        zeros = h.new_zeros(b, left, d)
        conv_zeros = h.new_zeros(b, self.cfg["kernel"] - 1, d)
        for block in self.blocks:
            h = block(h, zeros, zeros, conv_zeros, mask)[0]
        return self.proj(h)

    def step(self, x: torch.Tensor, cached_key: torch.Tensor, cached_val: torch.Tensor,
             cached_conv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One chunk [1, CHUNK, 80] with the caches [layers, ...] -> (encoder_out [1, FRAMES, join], new caches)."""
        h = self._embed(x)
        keys, values, convs = [], [], []
        for index, block in enumerate(self.blocks):
            h, k, v, c = block(h, cached_key[index:index + 1], cached_val[index:index + 1],
                               cached_conv[index:index + 1])
            keys.append(k)
            values.append(v)
            convs.append(c)
        return self.proj(h), torch.cat(keys, 0), torch.cat(values, 0), torch.cat(convs, 0)


class StreamingEncoder(nn.Module):
    """The export's encoder: encoder(x, cached_key, cached_val, cached_conv) -> (encoder_out, new caches)."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x, cached_key, cached_val, cached_conv):
        return self.encoder.step(x, cached_key, cached_val, cached_conv)


class Decoder(nn.Module):
    """Stateless: the last `context` tokens -> embedding -> grouped 1-D conv over them -> ReLU -> projection."""

    def __init__(self, vocabulary: int, cfg: dict = CONFIG) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, cfg["decoder"], padding_idx=0)  # blank's row stays zero
        self.conv = nn.Conv1d(cfg["decoder"], cfg["decoder"], cfg["context"], groups=cfg["decoder"] // 4, bias=False)
        self.proj = nn.Linear(cfg["decoder"], cfg["join"])

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        """y [B, U + context - 1] -> [B, U, join] (each output sees `context` tokens)."""
        h = self.conv(self.embedding(y).transpose(1, 2)).transpose(1, 2)
        return self.proj(torch.relu(h))


class StepDecoder(nn.Module):
    """The export's decoder: y [1, context] int32 -> decoder_out [1, join]."""

    def __init__(self, decoder: Decoder) -> None:
        super().__init__()
        self.decoder = decoder

    def forward(self, y):
        return self.decoder(y.long())[:, 0]


class Joiner(nn.Module):
    def __init__(self, vocabulary: int, cfg: dict = CONFIG) -> None:
        super().__init__()
        self.out = nn.Linear(cfg["join"], vocabulary)

    def forward(self, encoder_out: torch.Tensor, decoder_out: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(encoder_out + decoder_out))


class Transducer(nn.Module):
    def __init__(self, vocabulary: int, cfg: dict = CONFIG) -> None:
        super().__init__()
        self.encoder, self.decoder, self.joiner = Encoder(cfg), Decoder(vocabulary, cfg), Joiner(vocabulary, cfg)
        self.context = cfg["context"]

    def losses(self, x: torch.Tensor, frames: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor,
               ctc: nn.Module | None = None, ctc_weight: float = 0.0, rnnt: bool = True) -> torch.Tensor:
        """The RNN-T loss of each utterance [B]; `frames` encoder frames and `lengths` tokens of each (targets
        0-padded). With `ctc` (a training-only head on the encoder, not part of the model), + ctc_weight x its CTC
        loss per token: it gets the encoder past the all-blank start sooner (icefall trains its transducers with
        one too). With `rnnt` False, the encoder alone: ctc_weight x that CTC loss per token (train.py's first
        passes). Per utterance, so that a batch split between processes sums to the whole batch's loss."""
        enc = self.encoder(x)
        if not rnnt:  # the encoder alone, by its CTC head
            return ctc_per_token(ctc(enc), targets, frames, lengths, ctc_weight)
        y = torch.cat([targets.new_zeros(targets.shape[0], self.context), targets], 1)  # blanks before the start
        dec = self.decoder(y)
        logits = self.joiner(enc[:, :, None, :], dec[:, None, :, :])
        loss = rnnt_loss(logits, targets, frames, lengths)
        if ctc is not None and ctc_weight:
            loss = loss + ctc_per_token(ctc(enc), targets, frames, lengths, ctc_weight)
        return loss


def ctc_per_token(scores: torch.Tensor, targets: torch.Tensor, frames: torch.Tensor, lengths: torch.Tensor,
                  weight: float) -> torch.Tensor:
    """weight x the CTC loss (blank 0) of each utterance [B] over its token count, from a head's scores [B, T, V]."""
    log_probs = torch.log_softmax(scores, -1).transpose(0, 1)
    return weight * nn.functional.ctc_loss(log_probs, targets, frames, lengths, blank=0, reduction="none",
                                           zero_infinity=True) / lengths


def rnnt_loss(logits: torch.Tensor, targets: torch.Tensor, frames: torch.Tensor, lengths: torch.Tensor,
              blank: int = 0) -> torch.Tensor:
    """The RNN-T loss (Graves 2012), -log P(targets | x) per utterance, by the forward algorithm in log space.

    logits [B, T, U + 1, V]; targets [B, U]; frames, lengths [B]. alpha[t, u] = logaddexp(alpha[t-1, u] +
    blank[t-1, u], alpha[t, u-1] + label[t, u-1]). Within one u the first term runs along t, so each column is one
    log-cumsum-exp: alpha[t, u] = S[t] + logcumsumexp_s(alpha[s, u-1] + label[s, u-1] - S[s]) with S the running
    sum of blank[:t, u]. One Python step per token (a few here), not per frame (tens): 3x faster on this model's
    batches, the same loss to float32 rounding."""
    log_probs = torch.log_softmax(logits.float(), -1)
    blanks = log_probs[..., blank]                                                    # [B, T, U + 1]
    labels = torch.gather(log_probs[:, :, :-1, :], 3, targets[:, None, :, None].expand(
        -1, log_probs.shape[1], -1, 1).long())[..., 0]                               # [B, T, U]
    b, _, u1 = blanks.shape
    waited = torch.cat([blanks.new_zeros(b, 1, u1), torch.cumsum(blanks[:, :-1], 1)], 1)  # S per token [B, T, U + 1]
    alpha = waited[:, :, 0]                                                           # u = 0: blanks only
    columns = [alpha]
    for u in range(1, u1):
        arrived = alpha + labels[:, :, u - 1]                                         # from (t, u - 1) by a label
        alpha = waited[:, :, u] + torch.logcumsumexp(arrived - waited[:, :, u], 1)
        columns.append(alpha)
    alphas = torch.stack(columns, 2)                                                  # [B, T, U + 1]
    index = torch.arange(b)
    last = (frames - 1).long()
    return -(alphas[index, last, lengths.long()] + blanks[index, last, lengths.long()])


@torch.no_grad()
def greedy(model: Transducer, encoder_out: torch.Tensor, max_symbols: int = 1) -> list[int]:
    """sherpa-onnx's greedy search over one utterance's encoder frames [T, join] (context starts as blanks)."""
    context = [0] * model.context
    dec = model.decoder(torch.tensor([context]))[0, 0]
    tokens = []
    for frame in encoder_out:
        for _ in range(max_symbols):
            best = int(model.joiner(frame, dec).argmax())
            if best == 0:
                break
            tokens.append(best)
            context = context[1:] + [best]
            dec = model.decoder(torch.tensor([context]))[0, 0]
    return tokens
