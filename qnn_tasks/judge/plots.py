"""CPU vs NPU plots of a binary's outputs, drawn where the outputs are made (the simulate stage).

Drawing them there means a plot is built once per simulation and travels with it through the
shared cache: a fresh clone's report copies plots instead of drawing them (matplotlib costs
seconds per report otherwise).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from qnn_tasks.fileio import atomic_path


def outputs_plot(png: Path, title: str, npu_label: str, npu: dict[str, np.ndarray], cpu: dict[str, np.ndarray]) -> Path:
    """A line over samples for scalar outputs, a histogram of |NPU - CPU| otherwise; one panel per output."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    names = list(npu)
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        reference = cpu[name]
        if npu[name][0].size == 1:
            ax.plot(reference.reshape(-1), label="CPU", linewidth=1.6)
            ax.plot(npu[name].reshape(-1), label=npu_label, linewidth=1, linestyle="--")
            ax.set_xlabel("sample (in order)")
            ax.set_ylabel(name)
            ax.legend(loc="best", fontsize=8)
        else:
            err = np.abs(npu[name].astype(np.float64) - reference).reshape(-1)
            ax.hist(err, bins=60, log=True, color="#4477aa")
            # plain tick labels: the default log labels go through mathtext, most of a plot's drawing time
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel(f"|NPU - CPU| of '{name}'")
            ax.set_ylabel("count (log)")
        ax.set_title(f"{title}: {name}", fontsize=9)
    # fixed margins (the labels are short and known): tight_layout measured every text, ~0.3 s a plot
    fig.subplots_adjust(left=0.6 / fig.get_figwidth(), right=1 - 0.15 / fig.get_figwidth(), bottom=0.17, top=0.9,
                        wspace=0.3)
    png.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
    return png


def loop_error_plot(png: Path, title: str, label: str, per_step: dict[str, dict[str, list[float]]],
                    first_differing: int | None, run_starts: list[int] = ()) -> Path:
    """A loop's error against the CPU loop at every step, log scale: max-abs and 1 - cosine, a line per output."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), squeeze=False)
    floor = 1e-12  # an exact step (error 0) still shows, at the bottom
    for ax, metric, ylabel in ((axes[0][0], "max_abs", "max |NPU - CPU|"), (axes[0][1], "cosine", "1 - cosine")):
        for name, series in per_step.items():
            if series.get(metric) is None:
                continue  # a one-element output has no cosine to speak of
            values = np.asarray(series[metric], dtype=np.float64)
            values = 1.0 - values if metric == "cosine" else values
            ax.plot(np.arange(len(values)), np.maximum(np.nan_to_num(values, nan=1.0, posinf=1e30), floor),
                    label=name, linewidth=1.2)
        for index, begin in enumerate(run_starts):  # several runs (one per pipeline sample) side by side
            ax.axvline(begin, color="#999999", linewidth=0.8, label="next run" if index == 0 else None)
        if first_differing is not None:
            ax.axvline(first_differing, color="#cc3311", linestyle="--", linewidth=1,
                       label=f"task result first differs (step {first_differing})")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
        ax.set_xlabel("step")
        ax.set_ylabel(f"{ylabel} (log)")
        ax.set_title(f"{title}: {label}", fontsize=9)
        ax.legend(loc="best", fontsize=7)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.9, wspace=0.25)
    png.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
    return png


def transducer_plot(png: Path, title: str, label: str, per_chunk: dict[str, list], run_starts: list[int] = ()) -> Path:
    """A transducer loop per chunk: the share of its frames where the NPU and CPU searches emitted the same symbols
    (left), and the largest |NPU - CPU| of the joiner's scores over its frames (right, log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    steps = np.asarray(per_chunk["step"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), squeeze=False)
    left, right = axes[0]
    left.step(steps, np.asarray(per_chunk["agreement"], dtype=np.float64), where="mid", color="#228833", linewidth=1.2)
    left.set_ylim(-0.05, 1.05)
    left.set_ylabel("frames with the same symbols")
    worst = np.asarray([np.nan if v is None else v for v in per_chunk["max_abs"]], dtype=np.float64)
    right.plot(steps, np.maximum(np.nan_to_num(worst, nan=1e-12), 1e-12), color="#4477aa", linewidth=1.2)
    right.set_yscale("log")
    right.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    right.set_ylabel("max |NPU - CPU| joiner scores (log)")
    for ax in (left, right):
        for index, begin in enumerate(run_starts):
            ax.axvline(begin - 0.5, color="#999999", linewidth=0.8, label="next clip" if index == 0 else None)
        ax.set_xlabel("chunk (loop step)")
        ax.set_title(f"{title}: {label}", fontsize=9)
        if run_starts:
            ax.legend(loc="best", fontsize=7)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.16, top=0.9, wspace=0.25)
    png.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
    return png
