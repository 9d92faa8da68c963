"""The architectures of AI Hub Models' published timings, rebuilt here from code with random weights (latency does
not depend on the weights' values), at AI Hub's input shapes (its
model code's get_input_spec: ImageNet classifiers 224, whatever info.yaml's "Input resolution" says). Used by bench_latency_fit.py.

Needs the `latency-bench` extra (torchvision and timm, pinned to the project's torch; install with --no-deps).
"""
from __future__ import annotations

from typing import Callable


def _torchvision():
    """torchvision's model code. PyPI's Linux wheel is a CUDA build whose C ops do not load beside a CPU torch; the
    models need none of them, so the fake-kernel registrations for those ops are skipped while it imports."""
    import sys

    import torch

    if "torchvision" not in sys.modules:
        register_fake = torch.library.register_fake
        torch.library.register_fake = lambda *a, **k: (lambda fn: fn)
        try:
            import torchvision  # noqa: F401
        finally:
            torch.library.register_fake = register_fake
    return sys.modules["torchvision"]


def _tv(name: str, size: int = 224, **kw) -> Callable:
    def build():
        import torch
        tvm = _torchvision().models

        return getattr(tvm, name)(weights=None, **kw), (torch.zeros(1, 3, size, size),)
    return build


def _tv_video(name: str) -> Callable:
    def build():
        import torch
        tvv = _torchvision().models.video

        return getattr(tvv, name)(weights=None), (torch.zeros(1, 3, 16, 112, 112),)
    return build


def _fcn():
    import torch
    seg = _torchvision().models.segmentation

    class Out(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = seg.fcn_resnet50(weights=None, weights_backbone=None, aux_loss=False)

        def forward(self, x):
            return self.m(x)["out"]
    return Out(), (torch.zeros(1, 3, 520, 520),)  # AI Hub's DeepLabV3Model input


def _timm(name: str, size: int = 224) -> Callable:
    def build():
        import torch
        _torchvision()
        import timm

        return timm.create_model(name, pretrained=False), (torch.zeros(1, 3, size, size),)
    return build


def _bert(kind: str) -> Callable:
    def build():
        import torch
        _torchvision()  # transformers imports it when it is installed
        import transformers as tf

        configs = {
            "bert": lambda: tf.BertForMaskedLM(tf.BertConfig(attn_implementation="eager")),
            "distilbert": lambda: tf.DistilBertForMaskedLM(tf.DistilBertConfig(attn_implementation="eager")),
            "albert": lambda: tf.AlbertForMaskedLM(tf.AlbertConfig(
                hidden_size=768, num_attention_heads=12, intermediate_size=3072, embedding_size=128,
                attn_implementation="eager")),
            "mobilebert": lambda: tf.MobileBertForMaskedLM(tf.MobileBertConfig(attn_implementation="eager")),
            "electra": lambda: tf.ElectraForPreTraining(tf.ElectraConfig(
                hidden_size=768, num_attention_heads=12, intermediate_size=3072, embedding_size=768,
                attn_implementation="eager")),
        }
        model = configs[kind]()

        class Logits(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, ids, mask):
                return self.m(input_ids=ids, attention_mask=mask).logits
        ids = torch.zeros(1, 384, dtype=torch.int64)
        return Logits(), (ids, torch.ones(1, 384, dtype=torch.int64))
    return build


def _whisper_encoder(d: int, layers: int, heads: int) -> Callable:
    def build():
        import torch
        _torchvision()  # transformers imports it when it is installed
        import transformers as tf

        cfg = tf.WhisperConfig(d_model=d, encoder_layers=layers, encoder_attention_heads=heads, encoder_ffn_dim=4 * d,
                               decoder_layers=1, decoder_attention_heads=heads, num_mel_bins=80, attn_implementation="eager")
        return tf.WhisperModel(cfg).encoder, (torch.zeros(1, 80, 3000),)
    return build


# AI Hub model id -> (the component its perf.yaml names, or None for its only one; builder)
ARCHS: dict[str, tuple[str | None, Callable]] = {
    "mobilenet_v2": (None, _tv("mobilenet_v2")),
    "mobilenet_v3_large": (None, _tv("mobilenet_v3_large")),
    "mobilenet_v3_small": (None, _tv("mobilenet_v3_small")),
    "resnet18": (None, _tv("resnet18")),
    "resnet50": (None, _tv("resnet50")),
    "resnet101": (None, _tv("resnet101")),
    "resnext50": (None, _tv("resnext50_32x4d")),
    "resnext101": (None, _tv("resnext101_32x8d")),
    "wideresnet50": (None, _tv("wide_resnet50_2")),
    "squeezenet1_1": (None, _tv("squeezenet1_1")),
    "shufflenet_v2": (None, _tv("shufflenet_v2_x0_5")),
    "mnasnet05": (None, _tv("mnasnet0_5")),
    "googlenet": (None, _tv("googlenet", aux_logits=False, init_weights=False)),
    "inception_v3": (None, _tv("inception_v3", aux_logits=False, init_weights=False)),
    "densenet121": (None, _tv("densenet121")),
    "efficientnet_b0": (None, _tv("efficientnet_b0")),
    "efficientnet_b4": (None, _tv("efficientnet_b4")),
    "efficientnet_v2_s": (None, _tv("efficientnet_v2_s")),
    "convnext_tiny": (None, _tv("convnext_tiny")),
    "convnext_base": (None, _tv("convnext_base")),
    "regnet": (None, _tv("regnet_x_3_2gf")),
    "regnet_y_800mf": (None, _tv("regnet_y_800mf")),
    "vit": (None, _tv("vit_b_16")),
    "fcn_resnet50": (None, _fcn),
    "resnet_3d": (None, _tv_video("r3d_18")),
    "resnet_2plus1d": (None, _tv_video("r2plus1d_18")),
    "resnet_mixed": (None, _tv_video("mc3_18")),
    "dla102x": (None, _timm("dla102x")),
    "bert_base_uncased_hf": (None, _bert("bert")),
    "distil_bert_base_uncased_hf": (None, _bert("distilbert")),
    "albert_base_v2_hf": (None, _bert("albert")),
    "mobile_bert_uncased_google": (None, _bert("mobilebert")),
    "electra_bert_base_discrim_google": (None, _bert("electra")),
    "whisper_tiny": ("HfWhisperEncoder", _whisper_encoder(384, 4, 6)),
    "whisper_base": ("HfWhisperEncoder", _whisper_encoder(512, 6, 8)),
    "whisper_small": ("HfWhisperEncoder", _whisper_encoder(768, 12, 12)),
}
