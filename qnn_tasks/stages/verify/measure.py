"""Latency, CPU use and real-time factor of a target on a phone.

`measure_latency`   rounds of (1 inference, N inferences) runs; per inference = (T_N - T_1) / (N - 1),
                    median and p90 over the rounds;
`best_cpu`          the CPU measurement over the longest run;
`real_time_factor`  per-inference time / audio seconds per inference (options.audio_seconds_per_sample);
and the console formatting of these figures.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from qnn_tasks.devices import adb
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.stages.verify.device_run import RunResult, require_ok, run_on_device, runner_args
from qnn_tasks.stages.verify.payload import Payload
from qnn_tasks.stages.verify.settings import ENV_INFERENCES, DeviceSettings, Job


def measure_latency(job: Job, phone: adb.Phone, payload: Payload, workdir: str, settings: DeviceSettings,
                    accuracy: RunResult, local: Path) -> dict[str, Any]:
    """Rounds of (1 inference, N inferences) runs; per inference = (T_N - T_1) / (N - 1)."""
    import numpy as np

    n, rounds = settings.timing_inferences, settings.timing_rounds
    timing: dict[str, Any] = {
        "label": "wall time on the phone (device clock around the qnn-net-run process)",
        "method": f"per round: T1 = a run of 1 inference (load + first output), TN = a run of {n} inferences "
                  f"(--num_inferences {n}, same sample); per inference = (TN - T1) / {n - 1}",
        "rounds": rounds, "inferences_per_round": n, "accuracy_run_s": accuracy.seconds,
        "accuracy_run_samples": payload.samples, "_cpu": []}
    firsts, per = [], []
    for r in range(rounds):
        one = run_on_device(phone, workdir, runner_args(payload.bin_name, payload.one_sample_list, f"t{r}a",
                                                         payload.native_inputs),
                            f"t{r}a.log", f"latency round {r + 1}", settings.cpu_sample_seconds, 600)
        require_ok(one, phone, f"latency round {r + 1} (1 inference)", local / f"latency-{r + 1}-single.log")
        bulk = run_on_device(phone, workdir, runner_args(payload.bin_name, payload.one_sample_list, f"t{r}b",
                                                          payload.native_inputs,
                                                          ["--num_inferences", str(n), "--keep_num_outputs", "1"]),
                             f"t{r}b.log", f"latency round {r + 1}", settings.cpu_sample_seconds, 600 + 30 * n)
        require_ok(bulk, phone, f"latency round {r + 1} ({n} inferences)", local / f"latency-{r + 1}-bulk.log")
        phone.shell(f"cd {shlex.quote(workdir)} && rm -rf t{r}a t{r}b", "cleanup of latency outputs")
        timing["_cpu"] += [one.cpu, bulk.cpu]
        if one.seconds is not None:
            firsts.append(one.seconds)
        if one.seconds is not None and bulk.seconds is not None:
            if bulk.seconds > one.seconds:
                per.append((bulk.seconds - one.seconds) / (n - 1))
            else:
                timing.setdefault("notes", []).append(
                    f"round {r + 1}: the {n}-inference run ({bulk.seconds:.3f} s) was not longer than the 1-inference "
                    f"run ({one.seconds:.3f} s): load-time noise exceeds {n - 1} inferences; raise "
                    f"settings.device.timing_inferences ({ENV_INFERENCES})")
    timing["first_output_rounds_s"] = firsts
    timing["per_inference_rounds_s"] = per
    if firsts:
        timing.update(first_output_median_s=float(np.median(firsts)), first_output_p90_s=float(np.percentile(firsts, 90)))
    if per:
        timing.update(per_inference_median_s=float(np.median(per)), per_inference_p90_s=float(np.percentile(per, 90)))
    if accuracy.seconds is not None and firsts and payload.samples > 1:
        timing["accuracy_run_per_inference_s"] = max(accuracy.seconds - float(np.median(firsts)), 0.0) / (payload.samples - 1)
    return timing


def best_cpu(runs: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The CPU measurement over the longest run (the per-period samples need runs of several seconds)."""
    measured = [c for c in runs if c and c.get("cores") is not None]
    if measured:
        return max(measured, key=lambda c: c.get("wall_s") or c.get("sampled_window_s") or 0)
    return next((c for c in runs if c), None)


def real_time_factor(graph: GraphSpec, per_inference: float | None, verify: dict[str, Any] | None = None) -> dict[str, Any]:
    """per-inference time / audio seconds per inference, where the graph gives its audio length per
    sample in `options.audio_seconds_per_sample` (the VAD example: 0.032 s)."""
    audio = (verify or {}).get("audio_seconds") or graph.options.get("audio_seconds_per_sample")
    if not isinstance(audio, (int, float)) or isinstance(audio, bool) or audio <= 0:
        return {"value": None, "note": f"graph '{graph.name}' declares no audio length per inference "
                                       f"(options.audio_seconds_per_sample)"}
    if per_inference is None:
        return {"value": None, "audio_seconds_per_sample": audio, "note": "no latency measured"}
    return {"value": per_inference / audio, "audio_seconds_per_sample": audio,
            "note": "per-inference wall time / audio seconds per inference (< 1: faster than real time)"}


def cpu_text(cpu: dict[str, Any] | None) -> str:
    cores = (cpu or {}).get("cores")
    return f"CPU {cores:.2f} cores" if cores is not None else "CPU use: not measured"


def ms_text(seconds: float | None) -> str:
    return "-" if seconds is None else (f"{seconds * 1000:.2f} ms" if seconds < 1 else f"{seconds:.2f} s")


def num_text(value: Any) -> str:
    return "-" if value is None else (f"{value:.3g}" if isinstance(value, float) else str(value))
