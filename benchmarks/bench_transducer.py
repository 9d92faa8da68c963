"""The streaming transducer's figures from a build: training time, binary sizes, simulator time per chunk and the
phone estimate (docs/streaming-transducer.md).

    python benchmarks/bench_transducer.py            # builds loop:stream_encoder-SM8650 here if needed, then reads
    python benchmarks/bench_transducer.py --root DIR --soc SM8650 --no-build

Training figures come from models/streaming-transducer/train.json (what train.py measured), the rest from the
build's records: each context binary's size, the loop's x86 HTP simulator time (not phone latency) per encoder
chunk, per clip and per joiner/decoder call, and lint's phone-time estimate per chunk with its real-time factor
(docs/latency.md: an estimate from published timings, never a measurement). The machine's load is printed with
them: on a shared 2-core host the simulator's times follow it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRAPHS = ("stream_encoder", "stream_decoder", "stream_joiner")
CHUNK_SECONDS = 0.32


def one(root: Path, pattern: str) -> dict:
    found = sorted(root.glob(pattern))
    if not found:
        raise SystemExit(f"no {pattern} under {root} (fix: build it: doit loop:stream_encoder-<SOC>)")
    return json.loads(found[-1].read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--soc", default="SM8650")
    parser.add_argument("--no-build", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(args.root))
    if not args.no_build:
        subprocess.run([sys.executable, "-m", "doit", f"loop:stream_encoder-{args.soc}"], cwd=args.root, check=True)
    from qnn_tasks.latency import shown

    model = "build/streaming-transducer"
    runs = json.loads((args.root / "models/streaming-transducer/train-runs.json").read_text())
    trained = runs[-1]
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f} "
          f"({os.cpu_count()} cores)")
    total = sum(r["seconds"]["total_training"] for r in runs)
    each = ", ".join(f"{r['seconds']['total_training']:.0f}" for r in runs)
    synthesis = next(r["seconds"]["synthesis"] for r in runs if not r.get("synthesis_from_cache"))
    passes = [p for r in runs for p in r["passes"]]  # train.py records each pass of its run
    ends = ", ".join(f"{p['seconds_at_end']:.0f}" for p in passes)
    kinds = ", ".join(f"{p['steps']} ({'the encoder by CTC alone' if p.get('ctc_only') else 'RNN-T'})" for p in passes)
    print(f"training: {len(runs)} run(s), {len(passes)} passes of {kinds} steps of {trained['batch']} in "
          f"{trained['workers']} process(es), {trained['parameters']:,} parameters; {total:.0f} s in all "
          f"({each} s; passes end at {ends} s of their run), "
          f"of which synthesis {synthesis:.0f} s (the first run; any other reads its cache); WER held-out espeak "
          f"{trained['wer_held_out_espeak']:.4f} ({len(trained['held_out'])} clips), alsa-utils recordings "
          f"{trained['wer_alsa_recordings']:.4f} ({len(trained['alsa'])} clips)")
    print(f"{'graph':<16}{'binary':>12}  phone estimate per call")
    for graph in GRAPHS:
        context = one(args.root, f"{model}/{graph}/*/fp16/{args.soc}/context/context.json")
        size = sum(f["size"] for path, f in context["files"].items() if path.endswith(".bin"))
        lint = one(args.root, f"{model}/{graph}/lint/lint.json")
        latency = shown.latency_ms(lint, args.soc, "fp16", CHUNK_SECONDS if graph == "stream_encoder" else None)
        print(f"{graph:<16}{size:>12,}  {shown.text(latency) or '-'}"
              + (f"; real-time factor {latency['realtime_factor']['estimate']:.3g} per 0.32 s chunk"
                 if latency and latency.get("realtime_factor") else ""))
    loop = one(args.root, f"{model}/stream_encoder/*/fp16/{args.soc}/loop/loop.json")
    timing, search = loop["timing"], loop["transducer"]
    runs = search["runs"]
    decoder = sum(r["npu_seconds"]["decoder"] for r in runs) / max(1, sum(r["calls"]["decoder"] for r in runs))
    joiner = sum(r["npu_seconds"]["joiner"] for r in runs) / max(1, sum(r["calls"]["joiner"] for r in runs))
    per_run = sorted(timing["per_run_s"])
    print(f"simulator (x86, not phone latency): encoder {timing['per_step_median_s'] * 1000:.0f} ms a chunk "
          f"(median of {timing['runs']}; x{timing['per_step_median_s'] / CHUNK_SECONDS:.2f} real time), decoder "
          f"{decoder * 1000:.1f} ms a call, joiner {joiner * 1000:.1f} ms a call; a 2.56 s clip "
          f"{per_run[len(per_run) // 2]:.1f} s (median of {len(per_run)})")
    wer = next(c for c in loop["checks"] if c["kind"] == "wer")
    print(f"loop {loop['status']}: {len(runs)} clips, WER CPU {wer['wer_cpu']:.4f} NPU {wer['wer_npu']:.4f}, "
          f"identical transcripts {wer['identical_share']:.0%}, same symbols at "
          f"{search['identical_tokens_share']:.1%} of {search['compared_frames']} frames")


if __name__ == "__main__":
    main()
