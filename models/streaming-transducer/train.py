"""Train the streaming transducer from nothing: synthesize speech, train it (CTC, then RNN-T), write the weights.

    python3 models/streaming-transducer/train.py --data-cache DATA.npz   # ~12 min on 2 cores; writes weights.pt,
                                                                         # tokens.txt, weights.sha256, train.json here

Three passes by default (--lr, --steps, --ctc-passes): the encoder alone by the CTC loss of a training-only head
(1,200 steps at a peak of 1.5e-3, then 1,200 at 1e-3), then the whole model by the RNN-T loss + 0.5 x CTC (2,400 at
1.5e-3). Trained by the RNN-T loss from the start, the model spent ~2,200 steps on the all-blank plateau; the
encoder trained by CTC alone leaves it after ~500-900, and the RNN-T pass starts off it.

Deterministic: a fixed seed for the texts, voices, effects, noise and the initial weights, a fixed number of steps
per pass (not a time budget), and a fixed number of training processes (--workers, default 2: one per core, each one
torch thread and every other utterance of each batch, their gradients summed). The same --workers gives the same
bytes; another count gives the same training to float rounding, not the same bytes. Each pass starts a new
optimizer, CTC head and one-cycle schedule (peak --lr, one value per pass) from the previous pass's weights, exactly
as a run with --resume does. The committed weights are the one run in train-runs.json. The held-out espeak-ng voices
and the alsa-utils recordings are never trained on; their word error rates (greedy search, PyTorch on the CPU) go
into train.json. docs/streaming-transducer.md has the measured times.

--concat and --masks (off by default) were tried for the held-out goal and not kept (the doc has their figures): a
share of batches whose utterances are each followed by another one (later words heard with the left caches full of
speech, as in a stream), and SpecAugment's time and frequency masks.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"streaming_transducer_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


speech = _sibling("speech")
net = _sibling("net")


def _utterance(job: tuple[int, int]) -> tuple[str, np.ndarray]:
    """The index-th training utterance (its own generator: the same utterance whatever the pool's order)."""
    seed, index = job
    rng = np.random.default_rng([seed, index])
    text = speech.training_text(rng)
    audio = speech.speak(text, *speech.random_voice(rng, speech.TRAIN_VARIANTS))
    clip = speech.augment(rng, audio, net.CHUNK * 160)  # whole chunks of 0.32 s
    return text, speech.fbank(clip)[: len(clip) // 160]


def features_of(audio: np.ndarray, chunks: int) -> np.ndarray:
    """[chunks * CHUNK, 80] fbank of a clip padded (or cut) to that many chunks."""
    samples = chunks * net.CHUNK * 160
    audio = np.concatenate([audio, np.zeros(max(0, samples - len(audio)), np.float32)])[:samples]
    return speech.fbank(audio)[: chunks * net.CHUNK]


def transcribe(model, feats: np.ndarray) -> str:
    import torch

    with torch.no_grad():
        frames = model.encoder(torch.from_numpy(feats)[None])[0]
    return " ".join(speech.SYMBOLS[t][1:] for t in net.greedy(model, frames))


def evaluate(model, clips: list[tuple[str, np.ndarray]]) -> tuple[float, list[dict]]:
    import jiwer

    rows = []
    for text, audio in clips:
        chunks = -(-(len(audio) + 8000) // (net.CHUNK * 160))  # at least 0.5 s of silence after the speech
        rows.append({"text": text, "transcript": transcribe(model, features_of(audio, chunks))})
    return float(jiwer.wer([r["text"] for r in rows], [r["transcript"] or "<none>" for r in rows])), rows


def synthesize(args: argparse.Namespace) -> list[tuple[str, np.ndarray]]:
    """The training set: (text, fbank) per utterance; kept in --data-cache when given (the same seed and count give
    the same utterances, so a second run can skip the ~2 min of espeak-ng and sox)."""
    cache = args.data_cache
    if cache is not None and cache.is_file():
        stored = np.load(cache, allow_pickle=False)
        if int(stored["seed"]) == args.seed and len(stored["texts"]) == args.utterances:
            bounds = np.cumsum(np.concatenate([[0], stored["lengths"]]))
            features = stored["features"]  # read once: each stored["features"] decodes the whole array again
            return [(str(t), features[a:b].copy()) for t, a, b in zip(stored["texts"], bounds[:-1], bounds[1:])]
    with Pool(2) as pool:
        data = pool.map(_utterance, [(args.seed, i) for i in range(args.utterances)], chunksize=16)
    if cache is not None:
        np.savez(cache, seed=args.seed, texts=np.array([t for t, _ in data]),
                 lengths=np.array([len(f) for _, f in data]), features=np.concatenate([f for _, f in data]))
    return data


def spec_augment(rng: np.random.Generator, feats: np.ndarray, fill: np.ndarray, masks: int) -> np.ndarray:
    """SpecAugment's masks, `masks` of each kind: stretches of up to 8 fbank frames (80 ms) and bands of up to 8 of
    the 80 bins, set to `fill` (the training set's mean)."""
    if masks == 0:
        return feats
    feats = feats.copy()
    for _ in range(masks):
        width = int(rng.integers(0, 9))
        start = int(rng.integers(0, max(1, len(feats) - width)))
        feats[start:start + width] = fill
        width = int(rng.integers(0, 9))
        start = int(rng.integers(0, feats.shape[1] - width))
        feats[:, start:start + width] = fill[start:start + width]
    return feats


def one_pass(model, data: list[tuple[str, np.ndarray]], args: argparse.Namespace, lr: float, steps: int,
             ctc_only: bool, began: float, index: int, rank: int = 0, world: int = 1) -> list[float]:
    """`steps` steps of AdamW under a one-cycle schedule to `lr`, batches of similar lengths in a seeded order; the
    RNN-T loss plus args.ctc_weight x the CTC loss of a training-only head, or with `ctc_only` the encoder alone by
    that CTC loss (the decoder and joiner untouched). With `world` processes each takes
    every world-th utterance of a batch and their gradients are summed, so each step is the whole batch's (every
    process draws the same batches and augmentation, and steps the same summed gradient). Returns the losses."""
    import torch

    order = np.argsort([len(f) for _, f in data], kind="stable")
    batches = [order[i:i + args.batch] for i in range(0, len(order), args.batch)]
    ctc = torch.nn.Linear(net.CONFIG["join"], len(speech.SYMBOLS))  # training only: not saved
    trained = model.encoder if ctc_only else model
    parameters = [*trained.parameters(), *ctc.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=1e-2)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=steps, pct_start=0.1)
    rng = np.random.default_rng(args.seed)
    # the augmentation draws from a generator of its own, so the batch order is rng's as without it; the same in
    # every pass (a pass makes what a run of its own resuming the previous weights makes)
    shaping = np.random.default_rng(args.seed)
    silence = model.encoder.mean.numpy().copy()  # a masked stretch reads as the training set's mean (0 once normalized)
    losses: list[float] = []
    model.train()
    while len(losses) < steps:
        for batch in rng.permutation(len(batches)):
            chosen = [data[i] for i in batches[batch]]
            if shaping.random() < args.concat:  # a batch of pairs: later words with full caches, as a stream has
                partner = batches[int(shaping.integers(len(batches)))]
                chosen = [(f"{t} {data[j][0]}", np.concatenate([f, data[j][1]]))
                          for (t, f), j in zip(chosen, shaping.permutation(partner))]
            chosen = [(t, spec_augment(shaping, f, silence, args.masks)) for t, f in chosen]
            whole = len(chosen)
            chosen = chosen[rank::world]  # this process's share
            longest = max(len(f) for _, f in chosen)
            x = torch.zeros(len(chosen), longest, speech.FEATURE_DIM)
            ids = [speech.token_ids(t) for t, _ in chosen]
            targets = torch.zeros(len(chosen), max(map(len, ids)), dtype=torch.long)
            for row, ((_, f), tokens) in enumerate(zip(chosen, ids)):
                x[row, : len(f)] = torch.from_numpy(f)
                targets[row, : len(tokens)] = torch.tensor(tokens)
            frames = torch.tensor([len(f) // net.SUBSAMPLE for _, f in chosen])
            lengths = torch.tensor([len(t) for t in ids])
            loss = model.losses(x, frames, targets, lengths, ctc, 1.0 if ctc_only else args.ctc_weight,
                                rnnt=not ctc_only).sum() / whole
            optimizer.zero_grad()
            loss.backward()
            loss = _summed(parameters, loss.detach()) if world > 1 else loss.detach()
            torch.nn.utils.clip_grad_norm_(trained.parameters(), 5.0)
            optimizer.step()
            schedule.step()
            losses.append(float(loss))
            if len(losses) % 50 == 0 and rank == 0:
                print(f"pass {index + 1} step {len(losses)}/{steps} loss {np.mean(losses[-50:]):.3f} "
                      f"({time.time() - began:.0f} s)", flush=True)
            if len(losses) == steps:
                break
    return losses


def _summed(parameters: list, loss):
    """Every process's gradients and loss summed in place (one all-reduce of one flat buffer); the summed loss."""
    import torch
    from torch import distributed

    flat = torch.cat([*(p.grad.reshape(-1) for p in parameters), loss.reshape(1)])
    distributed.all_reduce(flat)
    offset = 0
    for p in parameters:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
    return flat[-1]


def _passes(rank: int, world: int, data: list[tuple[str, np.ndarray]], stats: tuple[np.ndarray, np.ndarray],
            args: argparse.Namespace, began: float, store: Path) -> dict:
    """Every pass in this process (rank of world); the last pass's weights and each pass's figures."""
    import datetime

    import torch

    torch.set_num_threads(1)  # one per process: two threads on a busy 2-core host ran 7x slower (oversubscribed)
    torch.use_deterministic_algorithms(True)
    if world > 1:
        torch.distributed.init_process_group("gloo", init_method=f"file://{store / 'rendezvous'}", rank=rank,
                                             world_size=world, timeout=datetime.timedelta(minutes=5))
    state = None if args.resume is None else torch.load(args.resume, map_location="cpu", weights_only=True)
    passes = []
    for index, lr in enumerate(args.lr):
        # each pass as a run of its own would make it (the seed, a new CTC head, optimizer and schedule), so that
        # one run of three passes and three runs resuming each other's weights give the same bytes
        torch.manual_seed(args.seed)
        model = net.Transducer(len(speech.SYMBOLS))
        model.encoder.mean.copy_(torch.from_numpy(stats[0]))
        model.encoder.inv_std.copy_(torch.from_numpy(stats[1]))
        if state is not None:  # the previous pass's weights
            model.load_state_dict(state)
        steps, ctc_only = args.steps[min(index, len(args.steps) - 1)], index < args.ctc_passes
        losses = one_pass(model, data, args, lr, steps, ctc_only, began, index, rank, world)
        state = model.state_dict()
        passes.append({"lr": lr, "steps": steps, "ctc_only": ctc_only, "loss_first_50": float(np.mean(losses[:50])),
                       "loss_last_50": float(np.mean(losses[-50:])), "seconds_at_end": round(time.time() - began, 1)})
    if world > 1:
        torch.distributed.destroy_process_group()
    return {"state": state, "passes": passes}


def _worker(rank: int, world: int, data, stats, args, began: float, store: Path) -> None:
    import torch

    trained = _passes(rank, world, data, stats, args, began, store)
    if rank == 0:
        torch.save(trained, store / "trained.pt")


def _in_processes(data, stats, args: argparse.Namespace, began: float) -> dict:
    """_passes in args.workers forked processes (they share the synthesized data without a copy); rank 0's result.
    A process that fails stops the others (they would wait for it at the next all-reduce)."""
    import multiprocessing
    import tempfile

    import torch

    if args.workers == 1:
        return _passes(0, 1, data, stats, args, began, Path("."))
    context = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="transducer-train-") as folder:
        store = Path(folder)
        processes = [context.Process(target=_worker, args=(rank, args.workers, data, stats, args, began, store))
                     for rank in range(args.workers)]
        for process in processes:
            process.start()
        while any(p.is_alive() for p in processes) and not any(p.exitcode for p in processes):
            processes[0].join(timeout=1.0)
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
        failed = [rank for rank, p in enumerate(processes) if p.exitcode]
        if failed:
            raise RuntimeError(f"training process(es) {failed} of {args.workers} failed (exit codes "
                               f"{[processes[r].exitcode for r in failed]}); their error is printed above")
        return torch.load(store / "trained.pt", weights_only=True)


def train(args: argparse.Namespace) -> dict:
    import torch

    began = time.time()
    cached = args.data_cache is not None and args.data_cache.is_file()
    data = synthesize(args)
    synthesized = time.time() - began
    stacked = np.concatenate([f for _, f in data])
    stats = (stacked.mean(0), (1.0 / (stacked.std(0) + 1e-3)).astype(np.float32))
    del stacked
    trained = _in_processes(data, stats, args, began)
    seconds = time.time() - began
    torch.set_num_threads(1)
    model = net.Transducer(len(speech.SYMBOLS))
    model.load_state_dict(trained["state"])
    model.eval()
    held = speech.held_out(args.held_out)
    wer_held, rows_held = evaluate(model, [(t, a) for t, _, a in held])
    wer_alsa, rows_alsa = evaluate(model, speech.alsa_clips())
    return {"model": model, "report": {
        "seed": args.seed, "utterances": args.utterances, "steps": args.steps, "batch": args.batch, "lr": args.lr,
        "ctc_weight": args.ctc_weight, "concat": args.concat, "masks": args.masks, "passes": trained["passes"],
        "resumed_from": None if args.resume is None else hashlib.sha256(args.resume.read_bytes()).hexdigest(),
        "config": net.CONFIG, "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": {"synthesis": round(synthesized, 1), "total_training": round(seconds, 1)},
        "synthesis_from_cache": cached, "threads": 1, "workers": args.workers,
        "wer_held_out_espeak": wer_held, "wer_alsa_recordings": wer_alsa,
        "held_out": rows_held, "alsa": rows_alsa}}


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all: a run killed while writing leaves the file before it, never half of a new one."""
    part = path.with_name(f".{path.name}.part")
    part.write_bytes(data)
    os.replace(part, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--utterances", type=int, default=5000)
    parser.add_argument("--steps", type=lambda v: [int(x) for x in v.split(",")], default=[1200, 1200, 2400],
                        help="steps of each pass, comma-separated (one value: every pass)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=lambda v: [float(x) for x in v.split(",")], default=[1.5e-3, 1e-3, 1.5e-3],
                        help="peak learning rate of each pass, comma-separated (default: three passes)")
    parser.add_argument("--held-out", type=int, default=100)
    parser.add_argument("--ctc-weight", type=float, default=0.5)
    parser.add_argument("--ctc-passes", type=int, default=2,
                        help="how many of the first passes train the encoder alone, by the CTC loss")
    parser.add_argument("--concat", type=float, default=0.0,
                        help="share of batches whose utterances are each followed by another's (longer streams)")
    parser.add_argument("--masks", type=int, default=0, help="SpecAugment time and frequency masks of each kind")
    parser.add_argument("--data-cache", type=Path, default=None, help="an .npz to keep the synthesized features in")
    parser.add_argument("--workers", type=int, default=2,
                        help="training processes, each one thread and a share of every batch (2: both cores)")
    parser.add_argument("--resume", type=Path, default=None, help="start from these weights (the second pass)")
    args = parser.parse_args()
    if len(args.steps) not in (1, len(args.lr)) or not 0 <= args.ctc_passes <= len(args.lr):
        parser.error(f"--steps {','.join(map(str, args.steps))} --ctc-passes {args.ctc_passes}: give one --steps "
                     f"value or one per pass, and 0 to {len(args.lr)} CTC passes (--lr lists {len(args.lr)} passes)")
    if not 1 <= args.workers <= args.batch:
        parser.error(f"--workers {args.workers}: give 1 to --batch ({args.batch}) processes (each takes a share of "
                     "every batch; 2, the default, uses both cores)")
    import torch

    result = train(args)
    args.out.mkdir(parents=True, exist_ok=True)
    weights = io.BytesIO()
    torch.save(result["model"].state_dict(), weights)
    digest = hashlib.sha256(weights.getvalue()).hexdigest()
    _write(args.out / "weights.pt", weights.getvalue())
    _write(args.out / "weights.sha256", f"{digest}  weights.pt\n".encode())
    _write(args.out / "tokens.txt", speech.tokens_text().encode("utf-8"))
    _write(args.out / "train.json", (json.dumps({**result["report"], "sha256": digest}, indent=1) + "\n").encode())
    report = result["report"]
    print(f"weights.pt sha256 {digest}; WER held-out espeak {report['wer_held_out_espeak']:.4f}, alsa-utils "
          f"recordings {report['wer_alsa_recordings']:.4f}; {report['seconds']}")


if __name__ == "__main__":
    main()
