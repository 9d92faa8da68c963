"""The report a person reads: build/report/{index.html, report.json, report.md} + plots.

It reads only stage records (and the NPU outputs simverify kept for plots); it never reruns a
tool. report.json has one stable schema for CI gates (README: "report.json").
"""
from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Any

from .fileio import atomic_path, read_json, write_json
from .matrix import ChipTarget, GraphTarget

SCHEMA = "qnn-npu-compile/report/v1"
GRAPH_STAGES = ("export", "simplify", "lint", "cpucheck")
CHIP_STAGES = ("config", "context", "simverify")
STATUSES = ("passed", "warning", "failed", "skipped", "pending")


def graph_record_paths(gt: GraphTarget) -> dict[str, Path]:
    return {stage: gt.stage_dir(stage) / f"{stage}.json" for stage in GRAPH_STAGES}


def chip_record_paths(ct: ChipTarget) -> dict[str, Path]:
    return {stage: ct.stage_dir(stage) / f"{stage}.json" for stage in CHIP_STAGES}


def diagnosis_path(ct: ChipTarget) -> Path:
    return ct.stage_dir("diagnose") / "diagnose.json"


def variant_record_path(ct: ChipTarget, stage: str) -> str:
    """Record of a toolchain graph stage (quantize, convert, modellib) of the target's variant."""
    return f"{ct.variant.dir}/{stage}/{stage}.json"


def all_record_paths(graphs: list[GraphTarget], chips: list[ChipTarget],
                     variant_stages: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """Every record the report reads, as strings: the report's up-to-date check stats them on each run."""
    paths = [f"{gt.dir}/{stage}/{stage}.json" for gt in graphs for stage in GRAPH_STAGES]
    paths += sorted({variant_record_path(ct, stage) for ct in chips
                     for stage in (variant_stages or {}).get(ct.variant.name, ())})
    paths += [f"{ct.dir_str}/{stage}/{stage}.json" for ct in chips for stage in (*CHIP_STAGES, "diagnose")]
    return paths + [str(DEVICE_STAMP)]  # one file for every device record (not 2 stats per target on each no-op run)


def collect(graphs: list[GraphTarget], chips: list[ChipTarget],
            variant_stages: dict[str, tuple[str, ...]] | None = None) -> dict[str, Any]:
    """Assemble report.json's content from the records on disk.

    `variant_stages`: variant name -> the toolchain's stages for it (quantize; convert, modellib).
    """
    graph_entries = []
    for gt in graphs:
        stages = {stage: _read(path) for stage, path in graph_record_paths(gt).items()}
        export = stages.get("export") or {}
        graph_entries.append({"model": gt.graph.model, "graph": gt.name, "precision": gt.graph.precision,
                              "source": export.get("source"), "status": _combine(stages.values()),
                              "stages": stages})
    graph_status = {g["graph"]: g["status"] for g in graph_entries}
    graph_errors = {g["graph"]: next((f"graph {g['graph']} failed at {stage}: {r.get('error')}"
                                      for stage, r in g["stages"].items() if r and r.get("status") == "failed"),
                                     f"graph {g['graph']} failed") for g in graph_entries}
    targets = []
    for ct in chips:
        stages = {stage: _read(path) for stage, path in chip_record_paths(ct).items()}
        toolchain_stages = {stage: _read(variant_record_path(ct, stage))
                            for stage in (variant_stages or {}).get(ct.variant.name, ())}
        status = "skipped" if ct.skip_reason else _combine([*toolchain_stages.values(), *stages.values(),
                                                            {"status": graph_status[ct.graph.name]}])
        graph_failed = graph_status[ct.graph.name] == "failed"
        reason = ct.skip_reason or (graph_errors[ct.graph.name] if graph_failed
                                    else _first_error([*toolchain_stages.values(), *stages.values()]))
        if graph_failed:
            stages = {stage: None for stage in stages}  # records of an earlier build no longer describe this one
        targets.append({"name": ct.name, "model": ct.graph.model, "graph": ct.graph.name, "variant": ct.variant.name,
                        "soc": ct.soc.row(), "toolchain_id": ct.toolchain_id, "precision": ct.precision, "status": status,
                        "reason": reason, "toolchain_stages": toolchain_stages, "stages": stages,
                        "diagnosis": _read(diagnosis_path(ct)), "device": device_results(ct)})
    summary = {s: sum(1 for t in targets if t["status"] == s) for s in STATUSES}
    variants = []
    for t in targets:
        if not any(v["name"] == t["variant"] for v in variants):
            variants.append({"name": t["variant"], "model": t["model"], "graph": t["graph"], "precision": t["precision"]})
    return {"schema": SCHEMA, "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "summary": {"targets": len(targets), **summary,
                        "graphs_failed": sum(1 for g in graph_entries if g["status"] == "failed")},
            "graphs": graph_entries, "variants": variants, "targets": targets,
            "precision_comparison": precision_comparison(targets)}


def precision_comparison(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """fp16 vs w8a16 per graph and chip: binary size, simulator time, accuracy (graphs built at >1 precision)."""
    rows = []
    by_graph_soc: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for t in targets:
        by_graph_soc.setdefault((t["graph"], t["soc"]["name"]), []).append(t)
    for (graph, soc), group in by_graph_soc.items():
        if len(group) < 2:
            continue
        for t in group:
            ctx = t["stages"].get("context") or {}
            sim = t["stages"].get("simverify") or {}
            cosines = [m.get("cosine") for m in (sim.get("metrics") or {}).values()]
            rows.append({"graph": graph, "soc": soc, "precision": t["precision"], "status": t["status"],
                         "bin_size": ctx.get("bin_size"),
                         "sim_median_s": (sim.get("timing") or {}).get("per_inference_median_s"),
                         "min_cosine": min(cosines) if cosines else None,
                         "checks_passed": all(c.get("passed") for c in sim.get("checks") or []) if sim.get("checks") else None})
    return rows


def write(report_dir: Path, data: dict[str, Any]) -> dict[str, Path]:
    """Write report.json, report.md, index.html and plots; return their paths."""
    report_dir.mkdir(parents=True, exist_ok=True)
    plots = {t["name"]: _plot(report_dir / "plots", t) for t in data["targets"]}
    paths = {"json": report_dir / "report.json", "md": report_dir / "report.md", "html": report_dir / "index.html"}
    write_json(paths["json"], data)
    with atomic_path(paths["md"]) as tmp:
        tmp.write_text(markdown(data))
    with atomic_path(paths["html"]) as tmp:
        tmp.write_text(html(data, report_dir, plots))
    return paths


# ------------------------------------------------------------------ renderers

def markdown(data: dict[str, Any]) -> str:
    socs = _soc_names(data)
    lines = ["# NPU build report", "", f"Generated {data['generated']}. " + summary_line(data), "",
             "| graph | " + " | ".join(socs) + " |", "|---|" + "---|" * len(socs)]
    for variant in data["variants"]:
        cells = [_cell(data, variant["name"], soc) for soc in socs]
        lines.append(f"| {variant['model']}/{variant['name']} ({variant['precision']}) | " + " | ".join(cells) + " |")
    if data["precision_comparison"]:
        lines += ["", "## fp16 vs w8a16", "", "| graph | chip | precision | status | .bin size | simulator time | min cosine |",
                  "|---|---|---|---|---|---|---|"]
        for r in data["precision_comparison"]:
            lines.append(f"| {r['graph']} | {r['soc']} | {r['precision']} | {r['status']} | {_size(r['bin_size'])} | "
                         f"{_num(r['sim_median_s'])} s | {_num(r['min_cosine'], 6)} |")
    lines += device_markdown(data)
    problems = [t for t in data["targets"] if t["status"] in ("failed", "skipped")]
    if problems:
        lines += ["", "## Failed and skipped", ""]
        lines += [f"- **{t['name']}** ({t['status']}): {t['reason']}" for t in problems]
    return "\n".join(lines) + "\n"


def html(data: dict[str, Any], report_dir: Path, plots: dict[str, str | None]) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("qnn_tasks", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    env.filters["rel"] = lambda p: os.path.relpath(p, report_dir) if p else ""
    env.filters["num"] = _num
    env.filters["size"] = _size
    env.filters["duration"] = _duration
    env.filters["limits"] = _limits
    return env.get_template("report.html.j2").render(
        data=data, socs=_soc_names(data), cell=lambda g, s: _target(data, g, s), plots=plots,
        breaks=_breaks, worst_nodes=_worst_nodes,
        summary=summary_line(data))


# ------------------------------------------------------------------ device results (doit verify / doit power)

DEVICE_STAGES = ("verify", "power")
DEVICE_STAMP = Path("build") / "verify" / "records.stamp"  # rewritten by stages/verify.py with every device record


def device_record_paths(ct: ChipTarget) -> dict[str, Path]:
    return {stage: ct.stage_dir(stage) / f"{stage}.json" for stage in DEVICE_STAGES}


def device_results(ct: ChipTarget) -> dict[str, Any] | None:
    """A target's records from phones (on demand: absent unless `doit verify` / `doit power` ran).

    They are reported beside the build, never folded into the target's status: a phone that was not
    attached today says nothing about the binary.
    """
    records = {stage: _read(path) for stage, path in device_record_paths(ct).items()}
    return records if any(records.values()) else None


def device_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (target, phone) with the numbers a person compares across phones."""
    rows = []
    for t in data["targets"]:
        record = (t.get("device") or {}).get("verify")
        for d in (record or {}).get("devices", []):
            timing, cpu, rtf = d.get("timing") or {}, d.get("cpu") or {}, d.get("rtf") or {}
            cosines = [m.get("cosine") for m in (d.get("metrics") or {}).values()]
            rows.append({"target": t["name"], "status": d.get("status"), "serial": d.get("serial"),
                         "model": d.get("model"), "android": d.get("android"), "chip": d.get("soc_model"),
                         "min_cosine": min((c for c in cosines if c is not None), default=None),
                         "median_s": timing.get("per_inference_median_s"), "p90_s": timing.get("per_inference_p90_s"),
                         "first_s": timing.get("first_output_median_s"), "rtf": rtf.get("value"),
                         "cpu_cores": cpu.get("cores"), "measured_at": record.get("measured_at"),
                         "error": d.get("error")})
    return rows


def device_markdown(data: dict[str, Any]) -> list[str]:
    rows = device_rows(data)
    if not rows:
        return []
    lines = ["", "## On phones (device results, `doit verify`)", "",
             "| target | phone | Android | chip | status | min cosine | per inference (median / p90) | first output | RTF | CPU cores |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['target']} | {r['model']} ({r['serial']}) | {r['android']} | {r['chip']} | {r['status']} | "
                     f"{_num(r['min_cosine'], 6)} | {_duration(r['median_s'])} / {_duration(r['p90_s'])} | "
                     f"{_duration(r['first_s'])} | {_num(r['rtf'])} | {_num(r['cpu_cores'], 3)} |")
    return lines


# ------------------------------------------------------------------ plots

def _plot(plot_dir: Path, target: dict[str, Any]) -> str | None:
    """CPU vs NPU per output: a line over samples for scalar outputs, an error histogram otherwise."""
    sim = target["stages"].get("simverify") or {}
    outputs_file, reference_file = sim.get("outputs_file"), sim.get("reference_file")
    if not outputs_file or not reference_file or not Path(outputs_file).is_file() or not Path(reference_file).is_file():
        return None
    png = plot_dir / f"{target['name']}.png"
    if png.is_file() and png.stat().st_mtime >= Path(outputs_file).stat().st_mtime:
        return str(png)  # plots are cached: redrawn only when the outputs change
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    with np.load(outputs_file) as npu_file, np.load(reference_file) as cpu_file:
        names = list(npu_file.files)
        npu = {n: npu_file[n] for n in names}
        cpu = {n: cpu_file[n][: len(npu[n])] for n in names}
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        if npu[name][0].size == 1:
            ax.plot(cpu[name].reshape(-1), label="CPU", linewidth=1.6)
            ax.plot(npu[name].reshape(-1), label=f"NPU ({target['soc']['name']})", linewidth=1, linestyle="--")
            ax.set_xlabel("sample (in order)")
            ax.set_ylabel(name)
            ax.legend(loc="best", fontsize=8)
        else:
            err = np.abs(npu[name].astype(np.float64) - cpu[name]).reshape(-1)
            ax.hist(err, bins=60, log=True, color="#4477aa")
            ax.set_xlabel(f"|NPU - CPU| of '{name}'")
            ax.set_ylabel("count (log)")
        ax.set_title(f"{target['name']}: {name}", fontsize=9)
    fig.tight_layout()
    plot_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", dpi=90)
    plt.close(fig)
    return str(png)


# ------------------------------------------------------------------ helpers

def _read(path: Path) -> dict[str, Any] | None:
    try:
        return read_json(path)
    except (FileNotFoundError, ValueError):
        return None


def _combine(records) -> str:
    """A target's status from its records: failed > pending > warning > passed."""
    statuses = [r.get("status") if r else "pending" for r in records]
    for status in ("failed", "pending", "warning"):
        if status in statuses:
            return status
    return "passed"


def _first_error(records) -> str | None:
    return next((r.get("error") for r in records if r and r.get("status") == "failed"), None)


def _soc_names(data: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for t in data["targets"]:
        if t["soc"]["name"] not in names:
            names.append(t["soc"]["name"])
    return names


def _target(data: dict[str, Any], variant: str, soc: str) -> dict[str, Any] | None:
    return next((t for t in data["targets"] if t["variant"] == variant and t["soc"]["name"] == soc), None)


def _cell(data: dict[str, Any], variant: str, soc: str) -> str:
    target = _target(data, variant, soc)
    return target["status"] if target else ""


def summary_line(data: dict[str, Any]) -> str:
    s = data["summary"]
    return (f"{s['targets']} targets: {s['passed']} passed, {s['warning']} with warnings, {s['failed']} failed, "
            f"{s['skipped']} skipped, {s['pending']} not built yet.")


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _breaks(metrics: dict[str, Any], threshold: str) -> str:
    """'failed' when this metric breaks its threshold (the cell is shown red), else ''."""
    from .metrics import METRIC_OF
    from .spec import THRESHOLD_KEYS

    limit = (metrics.get("thresholds") or {}).get(threshold)
    value = metrics.get(METRIC_OF[threshold])
    if limit is None:
        return ""
    if value is None:  # non-finite (written as null): NaN breaks, an infinite SNR does not
        return "" if threshold == "min_snr_db" and not metrics.get("non_finite") else "failed"
    ok = value <= limit if THRESHOLD_KEYS[threshold] == "max" else value >= limit
    return "" if ok else "failed"


def _worst_nodes(diagnosis: dict[str, Any], count: int = 12) -> list[dict[str, Any]]:
    """The nodes with the largest error, in graph order (the diagnosis table)."""
    nodes = [n for n in diagnosis.get("nodes") or []]
    worst = sorted(nodes, key=lambda n: -(n["rel_max_abs"] if n.get("rel_max_abs") is not None else float("inf")))[:count]
    return sorted(worst, key=lambda n: n["index"])


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"


_LIMIT_WORDS = {"max_abs": "max-abs ≤ {}", "mean_abs": "mean-abs ≤ {}", "min_cosine": "cosine ≥ {}",
                "min_snr_db": "SNR ≥ {} dB"}


def _limits(thresholds: dict[str, Any]) -> str:
    return ", ".join(_LIMIT_WORDS.get(k, k + " {}").format(f"{v:g}") for k, v in (thresholds or {}).items())


def _size(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{value} B"
        value /= 1024
    return str(value)
