"""How firm are the Whisper encoder's CPU transcripts? The CPU reference perturbed a little and decoded again.

A check that wants every transcript of an NPU build to equal the CPU's is only as firm as the CPU's transcripts:
a beam search near a tie flips on a small change. This takes a build's CPU reference of each judged window (the
`cpucheck` stage's reference.npz) and perturbs it: by a share of an NPU build's own error (its `simulate`
outputs.npz, optional) and by Gaussian noise at a given signal-to-noise ratio, several draws each. Each perturbed
output is decoded by the model's own `transcribe()` (CTranslate2's beam search with the pinned policy, what the
`wer` check runs) and scored as the check scores it: transcripts still the CPU's, and the word error rate against
`texts()`.

    python benchmarks/bench_whisper_ties.py PROJECT [--npu .../w8a16/SM8650/simulate/outputs.npz] [--snr 40 35 30]

PROJECT is a project folder whose `build/whisper-tiny-en/encoder/cpucheck` holds the reference (any `doit` of the
encoder made it). Decoding runs on the CPU: no simulator, ~1 s a window on 2 cores.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from qnn_tasks.graphs import modelcode
from qnn_tasks.judge import metrics, speech
from qnn_tasks.modelspec.load import load_project

MODEL, GRAPH, OUTPUT = "whisper-tiny-en", "encoder", "features"


def with_noise(rng: np.random.Generator, windows: np.ndarray, snr: float) -> np.ndarray:
    """Each window plus white Gaussian noise scaled to `snr` dB below that window's power."""
    noisy = []
    for window in windows:
        noise = rng.standard_normal(window.shape)
        noise *= np.sqrt(np.sum(window.astype(np.float64) ** 2) / np.sum(noise ** 2) / 10 ** (snr / 10))
        noisy.append(window + noise.astype(np.float32))
    return np.stack(noisy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("project", type=Path)
    parser.add_argument("--npu", type=Path, help="an NPU build's simulate/outputs.npz of the same windows")
    parser.add_argument("--snr", type=float, nargs="+", default=[40.0, 35.0, 30.0])
    parser.add_argument("--seeds", type=int, default=3, help="noise draws per SNR")
    args = parser.parse_args()

    project = load_project(args.project.resolve())
    graph = next((g for m in project.models if m.name == MODEL for g in m.graphs if g.name == GRAPH), None)
    reference = args.project / "build" / MODEL / GRAPH / "cpucheck" / "reference.npz"
    if graph is None or not reference.is_file():
        parser.error(f"{args.project} needs models/{MODEL} with graph '{GRAPH}' and its CPU reference {reference} "
                     f"(fix: run `doit cpucheck:{GRAPH}` there first)")
    ctx = modelcode.context_for(graph)
    cpu = np.load(reference)[OUTPUT]
    texts = speech.reference_texts(graph, ctx, len(cpu), "bench_whisper_ties")

    def transcribe(windows: np.ndarray) -> list[str]:
        return modelcode.call(graph, "transcribe", ctx, list(windows))

    base = transcribe(cpu)

    def row(what: str, windows: np.ndarray) -> None:
        heard = transcribe(windows)
        same = sum(speech.words(a) == speech.words(b) for a, b in zip(base, heard))
        snr = np.mean([metrics.snr_db(c, w) for c, w in zip(cpu, windows)])
        print(f"| {what} | {snr:.1f} | {same} of {len(cpu)} | {speech.word_error_rate(texts, heard):.4f} |",
              flush=True)

    print(f"{len(cpu)} windows; the CPU's own word error rate {speech.word_error_rate(texts, base):.4f}")
    print("| the CPU reference's encoder output ... | SNR dB | transcripts the CPU's | WER |\n|---|---|---|---|")
    if args.npu is not None:
        npu = np.load(args.npu)[OUTPUT]
        row("replaced by the NPU build's", npu)
        for share in (0.5, 0.25):
            row(f"+ {share} x the NPU build's error", cpu + share * (npu - cpu))
        row("- the NPU build's error (its mirror image)", cpu - (npu - cpu))
    rng = np.random.default_rng(0)
    for snr in args.snr:
        for draw in range(args.seeds):
            row(f"+ Gaussian noise at {snr:g} dB, draw {draw + 1}", with_noise(rng, cpu, snr))


if __name__ == "__main__":
    main()
