"""The `wer` check: speech models judged by the words they produce, not only by tensor metrics.

The model's own code turns outputs into text (`transcribe(ctx, outputs) -> list[str]`, e.g. an
NPU encoder's features decoded on the CPU) and says what each sample says (`texts(ctx)`). The CPU
reference outputs and the NPU outputs are transcribed the same way; the check bounds how much the
NPU path's word error rate may exceed the CPU path's, and how many transcripts must be identical.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.graphs import modelcode
from qnn_tasks.modelspec.project import GraphSpec

NORMALISATION = ("jiwer transforms ToLowerCase, RemovePunctuation, RemoveMultipleSpaces, Strip, "
                 "ReduceToListOfListOfWords on references and transcripts")


def _transform():
    import jiwer

    return jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.RemoveMultipleSpaces(),
                          jiwer.Strip(), jiwer.ReduceToListOfListOfWords()])


def words(text: str) -> list[str]:
    """The words WER counts: lower-cased, punctuation removed (see NORMALISATION)."""
    return _transform()(text)[0]


def word_error_rate(references: list[str], transcripts: list[str]) -> float:
    """Corpus word error rate (all errors / all reference words) after the normalisation above."""
    import jiwer

    transform = _transform()
    return float(jiwer.wer(references, transcripts, reference_transform=transform, hypothesis_transform=transform))


def wer_check(graph: GraphSpec, check: dict[str, Any], reference_outputs: list[dict[str, np.ndarray]],
              npu_outputs: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """Transcribe CPU and NPU outputs with the model's code; compare their WER against its texts.

    `check` is the validated `wer` entry of `verify.checks` (output, max_wer_increase,
    min_identical, show). Only the first len(npu_outputs) samples are judged.
    """
    name, count = check["output"], len(npu_outputs)
    ctx = modelcode.context_for(graph)
    texts = reference_texts(graph, ctx, count, f"graph '{graph.name}', check wer")
    cpu = _transcribe(graph, ctx, [r[name] for r in reference_outputs[:count]], "CPU reference")
    npu = _transcribe(graph, ctx, [o[name] for o in npu_outputs], "NPU")
    return wer_result(check, texts, cpu, npu)


def reference_texts(graph: GraphSpec, ctx: modelcode.ModelContext, count: int, what: str) -> list[str]:
    """The first `count` texts of the model's texts(ctx): what each judged sample (or loop run) says."""
    texts = modelcode.call(graph, "texts", ctx)
    if not isinstance(texts, list) or len(texts) < count or not all(isinstance(t, str) and words(t) for t in texts):
        raise StageError(f"{graph.model_code}:texts() must return one non-empty reference text per sample "
                         f"({count} judged samples) in sample order ({what})")
    return texts[:count]


def wer_result(check: dict[str, Any], texts: list[str], cpu: list[str], npu: list[str],
               transcribed_by: str = "the model's transcribe()") -> dict[str, Any]:
    """The `wer` check's result from the CPU path's and the NPU path's transcripts of the same samples."""
    name, count = check["output"], len(npu)
    wer_cpu, wer_npu = word_error_rate(texts, cpu), word_error_rate(texts, npu)
    same = [words(c) == words(n) for c, n in zip(cpu, npu)]
    differing = [{"sample": i, "reference_text": texts[i], "cpu": cpu[i], "npu": npu[i]}
                 for i in range(count) if not same[i]]
    increase, identical = wer_npu - wer_cpu, float(np.mean(same))
    allowed, required = float(check["max_wer_increase"]), float(check["min_identical"])
    passed = increase <= allowed + 1e-12 and identical >= required
    result = {"kind": "wer", "output": name, "value": increase, "max": allowed, "min_identical": required,
              "passed": passed, "wer_cpu": wer_cpu, "wer_npu": wer_npu, "identical_share": identical,
              "samples": count, "normalisation": NORMALISATION,
              "meaning": "increase in word error rate of the NPU path over the CPU path (both transcribed by "
                         f"{transcribed_by}, scored against texts() with jiwer after lower-casing and removing "
                         "punctuation)",
              "transcripts": [{"reference_text": t, "cpu": c, "npu": n} for t, c, n in zip(texts, cpu, npu)],
              "differing": differing[: int(check["show"])]}
    if not passed:
        result["failure"] = _failure_line(result, differing)
    return result


def _transcribe(graph: GraphSpec, ctx: modelcode.ModelContext, outputs: list[np.ndarray], what: str) -> list[str]:
    texts = modelcode.call(graph, "transcribe", ctx, outputs)
    if not isinstance(texts, list) or len(texts) != len(outputs) or not all(isinstance(t, str) for t in texts):
        raise StageError(f"{graph.model_code}:transcribe() must return one str per output "
                         f"({len(outputs)} {what} outputs given) for graph '{graph.name}'")
    return texts


def _failure_line(result: dict[str, Any], differing: list[dict[str, Any]]) -> str:
    """One line: both WERs, the share of identical transcripts, and the first transcript that differs."""
    line = (f"NPU word error rate {result['wer_npu']:.4f} vs CPU {result['wer_cpu']:.4f} "
            f"(increase {result['value']:+.4f}, allowed {result['max']:+g}); identical transcripts "
            f"{result['identical_share']:.0%} of {result['samples']} (required {result['min_identical']:.0%})")
    if differing:
        first = differing[0]
        line += (f"; first differing, sample {first['sample']} ({first['reference_text']!r}): "
                 f"CPU {first['cpu']!r} vs NPU {first['npu']!r}")
    return line
