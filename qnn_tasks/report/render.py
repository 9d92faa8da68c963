"""Render report.json's content for people: report.md and index.html, in build/report/.

The folder is self-contained: every log, plot or summary a page links to is copied under
build/report/files/, so publishing build/report/ alone (a CI artifact) keeps every link working.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from qnn_tasks.fileio import atomic_path, write_json
from qnn_tasks.run.status import Status

NOT_IN_SOCS = "not in socs"


def write(report_dir: Path, data: dict[str, Any]) -> dict[str, Path]:
    """Write report.json, report.md and index.html; return their paths."""
    report_dir.mkdir(parents=True, exist_ok=True)
    # plots are drawn by the simulate stage (cached with it); the page links a copy under files/
    plots = {t["name"]: _existing((t["stages"].get("simulate") or {}).get("plot")) for t in data["targets"]}
    plots.update({f"loop:{e['name']}": _existing((e["record"] or {}).get("plot")) for e in data.get("loops") or []})
    plots.update({f"transducer:{e['name']}": _existing(((e["record"] or {}).get("transducer") or {}).get("plot"))
                  for e in data.get("loops") or []})
    # one figure per distinct result: chips whose outputs are identical share the first chip's figure
    figures = {**figure_groups(data["targets"], lambda t: t["stages"].get("simulate"), "outputs.npz"),
               **figure_groups(data.get("loops") or [], lambda e: e["record"], "outputs.npz", "loop:")}
    paths = {"json": report_dir / "report.json", "md": report_dir / "report.md", "html": report_dir / "index.html"}
    write_json(paths["json"], data)
    with atomic_path(paths["md"]) as tmp:
        tmp.write_text(markdown(data))
    with atomic_path(paths["html"]) as tmp:
        tmp.write_text(html(data, report_dir, plots, figures))
    return paths


def figure_groups(entries: list[dict[str, Any]], record_of, outputs_name: str,
                  prefix: str = "") -> dict[str, dict[str, Any]]:
    """Entries (targets or loops) whose figure would show the same numbers: the same graph, precision and toolchain
    with outputs of the same digest (as their records vouch). The first of each group keeps its figure and names the
    others (`shared_with`: chips); the others point at it (`same_as`: its name and chip). Keys are `prefix` + name."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for entry in entries:
        files = (record_of(entry) or {}).get("files") or {}
        digest = next((f.get("sha256") for path, f in files.items() if path.endswith("/" + outputs_name)), None)
        if digest and entry.get("status") not in (Status.STALE, Status.SKIPPED):
            key = (entry["model"], entry["graph"], entry.get("precision"), entry.get("toolchain_id"), digest)
            groups.setdefault(key, []).append(entry)
    shared: dict[str, dict[str, Any]] = {}
    for members in groups.values():
        first, rest = members[0], members[1:]
        if rest:
            shared[prefix + first["name"]] = {"shared_with": [e["soc"]["name"] for e in rest]}
            shared.update({prefix + e["name"]: {"same_as": first["name"], "soc": first["soc"]["name"]} for e in rest})
    return shared


# ------------------------------------------------------------------ markdown

def choices_markdown(data: dict[str, Any]) -> list[str]:
    """`precision: auto`: per graph and chip, the chosen candidate and each candidate's verdict and size."""
    if not data.get("choices"):
        return []
    lines = ["", "## Precision auto", "", "| graph | chip | status | chosen | candidates | cost |", "|---|---|---|---|---|---|"]
    for c in data["choices"]:
        record = c.get("record") or {}
        tried = "; ".join(f"{k['precision']} {k['status']} {size(k.get('binary_bytes'))}"
                          for k in record.get("candidates") or [])
        chosen = c.get("chosen") or {}
        cost = f"{record['compiles']} compiles, {num(record.get('build_seconds'))} s" if "compiles" in record else "-"
        lines.append(f"| {c['graph']} | {c['soc']['name']} | {c['status']} | {chosen.get('precision', '-')} | {tried} "
                     f"| {cost} |")
    return lines


def markdown(data: dict[str, Any]) -> str:
    socs = soc_names(data)
    lines = ["# NPU build report", "", f"Generated {data['generated']}. " + summary_line(data), "",
             "| graph | " + " | ".join(socs) + " |", "|---|" + "---|" * len(socs)]
    if data.get("models_not_buildable"):
        lines[4:4] = ["## Models not buildable", ""] + [f"- **{b['model']}**: {b['error']}"
                                                        for b in data["models_not_buildable"]] + [""]
    for variant in data["variants"]:
        cells = [cell_text(data, variant["name"], soc) for soc in socs]
        lines.append(f"| {variant['model']}/{variant['name']} ({variant['precision']}) | " + " | ".join(cells) + " |")
    if data["precision_comparison"]:
        lines += ["", "## Precisions side by side", "", "| graph | chip | precision | status | .bin size | simulator time | min cosine "
                  "| weight bytes kept at 16 bits |", "|---|---|---|---|---|---|---|---|"]
        for r in data["precision_comparison"]:
            share = r.get("promoted_share")
            chosen = " (chosen by auto)" if r.get("chosen") else ""
            tables = "".join(f"; {k['tensor']} {size(k['bytes'])} (a Gather's table)" for k in r.get("sixteen_bit") or ())
            lines.append(f"| {r['graph']} | {r['soc']} | {r['precision']}{chosen} | {r['status']} | {size(r['bin_size'])} | "
                         f"{num(r['sim_median_s'])} s | {num(r['min_cosine'], 6)} | "
                         f"{'-' if share is None else f'{100 * share:.1f}%'}{tables} |")
    lines += choices_markdown(data)
    unlooped = [g for g in data["graphs"] if g.get("recurrent") and not g["recurrent"]["loop"]]
    if unlooped:
        lines += ["", "## Recurrent graphs verified without a loop", ""]
        lines += [f"- **{g['model']}/{g['graph']}**: {g['recurrent']['note']}" for g in unlooped]
    lines += sizes_markdown(data) + pipeline_markdown(data) + loop_markdown(data) + upgrade_markdown(data) + compat_markdown(data) + device_markdown(data)
    lines += latency_markdown(data)
    lines += memory_markdown(data)
    problems = [t for t in data["targets"] if t["status"] in (Status.FAILED, Status.STALE, Status.SKIPPED)]
    if problems:
        lines += ["", "## Failed, stale and skipped", ""]
        lines += [f"- **{t['name']}** ({t['status']}): {t['reason']}" for t in problems]
    return "\n".join(lines) + "\n"


def sizes_markdown(data: dict[str, Any]) -> list[str]:
    if not data.get("sizes"):
        return []
    lines = ["", "## Sizes (one graph at several lengths: a deployment runs the smallest that fits, padded)", "",
             "| graph | chip | precision | sizes: status, .bin size, simulator time, min cosine vs CPU "
             "| cross-size check |", "|---|---|---|---|---|"]
    for entry in data["sizes"]:
        cells = "; ".join(f"{c['graph']} {c['status']}, {size(c['bin_size'])}, {duration(c['sim_median_s'])}, "
                          f"{num(c['min_cosine'], 6)}" for c in entry["sizes"])
        verdict = entry["status"] + (f": {entry['reason']}" if entry["reason"] else "")
        lines.append(f"| {entry['graph']} ({entry['dim']}) | {entry['soc']} | {entry['precision']} | {cells} | "
                     f"{verdict.replace('|', '/')} |")
    return lines


def pipeline_markdown(data: dict[str, Any]) -> list[str]:
    if not data.get("pipelines"):
        return []
    lines = ["", "## Pipelines (graphs chained on the simulator, judged at the end)", "",
             "| pipeline | graphs | status | links' min cosine | end: checks |", "|---|---|---|---|---|"]
    for p in data["pipelines"]:
        record = p["record"] or {}
        links = "; ".join(f"{link['graph']}{_runs(link, record)} {num(min(m['cosine'] for m in link['metrics'].values()), 6)}"
                          for link in record.get("links") or [])
        checks = ", ".join(f"{c['kind']} {num(c['value'])}" for c in record.get("checks") or [])
        lines.append(f"| {p['name']} | {' -> '.join(p['graphs'])} | {p['status']} | {links or '-'} | {checks or '-'} |")
    return lines


def _runs(link: dict[str, Any], record: dict[str, Any]) -> str:
    """` (16 runs)` for a link that ran more often than the pipeline has samples (its runs were stacked)."""
    runs = link.get("runs")
    return f" ({runs} runs)" if runs is not None and runs != record.get("samples") else ""


def loop_markdown(data: dict[str, Any]) -> list[str]:
    if not data.get("loops"):
        return []
    lines = ["", "## Loops (a graph's outputs fed back step after step: the NPU carries its own state, the CPU its own)",
             "", "| loop | steps | status | max-abs per step: first tenth -> last tenth (peak) | first differing step "
             "| checks | simulator: steps/s, per step, per run |", "|---|---|---|---|---|---|---|"]
    for entry in data["loops"]:
        record = entry["record"] or {}
        growth = "; ".join(f"{name} {num(g['first'])} -> {num(g['last'])} ({num(g['peak'])} at step {g['peak_step']})"
                           for name, g in (record.get("growth") or {}).items() if g.get("first") is not None)
        checks = ", ".join(f"{c['kind']} {num(c['value'])}" for c in record.get("checks") or [])
        first = first_differing(record).replace("|", "\\|")  # a token such as <|endoftext|> keeps the columns
        started = f" (started by pipeline:{record['started_by']})" if record.get("started_by") else ""
        lines.append(f"| {entry['name']}{started} | {record.get('steps', '-')} | {entry['status']} | {growth or '-'} | "
                     f"{first} | {checks or '-'} | {loop_timing(record)} |")
    lines += ["", "Simulator figures are x86 HTP simulator time on the build host, not phone latency (a decoder's "
                  "steps per second are its tokens per second; a run is one decode, e.g. one clip)."]
    for entry in data["loops"]:
        lines += transducer_markdown(entry["name"], (entry["record"] or {}).get("transducer"))
    return lines


def transducer_markdown(name: str, search: dict[str, Any] | None) -> list[str]:
    """A transducer loop's searches: each clip's reference text and both transcripts, and where they parted."""
    if not search:
        return []
    share = search.get("identical_tokens_share")
    lines = ["", f"### Transducer search of loop {name}: NPU vs CPU, clip by clip", "",
             f"Greedy search (blank {search['blank']}, context {search['context']}, at most {search['max_symbols']} "
             f"symbol(s) a frame) over {search['compared_frames']} frames: the same symbols at "
             f"{'-' if share is None else f'{100 * share:.1f}%'} of frames; " + transducer_first(search) + ".", "",
             "| clip | reference | CPU transcript | NPU transcript | same tokens |", "|---|---|---|---|---|"]
    for run in search.get("runs") or []:
        cells = [run.get("reference_text", "-"), run["cpu"]["text"] or "(nothing)", run["npu"]["text"] or "(nothing)"]
        cells = [c.replace("|", "\\|") for c in cells]
        lines.append(f"| {run['run']} | " + " | ".join(cells) + f" | {'yes' if run['identical'] else 'NO'} |")
    return lines


def transducer_first(search: dict[str, Any]) -> str:
    first = search.get("first_difference")
    if not first:
        return "no frame differed"
    return (f"first differed in clip {first['run']} at frame {first['frame']} (chunk {first['step']}): "
            f"NPU {first['npu']['text']}, CPU {first['cpu']['text']}")


def first_differing(record: dict[str, Any]) -> str:
    """The first step where a task result differed, with what each loop chose there (a decoder's tokens)."""
    if not record:
        return "-"
    first, difference = record.get("first_differing_step"), record.get("first_difference")
    if first is None:
        return "none"
    if not difference:
        return num(first)
    return f"{first} (NPU {difference['npu']['text']}, CPU {difference['cpu']['text']})"


def loop_timing(record: dict[str, Any]) -> str:
    """Steps per second, the median step and each run's simulator time (labelled as simulator time by the table)."""
    timing = record.get("timing") or {}
    if not timing.get("steps_per_second"):
        return "-"
    runs = ", ".join(duration(s) for s in (timing.get("per_run_s") or [])[:5])
    return (f"{num(timing['steps_per_second'], 3)} steps/s, {duration(timing.get('per_step_median_s'))} a step"
            + (f", {runs} a run" if runs else ""))


def upgrade_markdown(data: dict[str, Any]) -> list[str]:
    lines = []
    for block in data.get("comparison") or []:
        lines += ["", f"## Upgrade diff: {block['baseline']} (QNN {block['qnn'][0]}) vs {block['candidate']} "
                      f"(QNN {block['qnn'][1]})", "",
                  f"{len(block['regressions'])} regression(s)" + (" — gating" if block["gate"] else "") + ".", "",
                  "| target | status A / B | min cosine A / B | min SNR A / B | .bin A / B | compile A / B | simulator A / B | regression |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in block["rows"]:
            a, b = r["a"], r["b"]
            lines.append(f"| {r['target']} | {a['status']} / {b['status']} | {num(a['min_cosine'], 6)} / "
                         f"{num(b['min_cosine'], 6)} | {num(a['min_snr_db'])} / {num(b['min_snr_db'])} | "
                         f"{size(a['bin_size'])} / {size(b['bin_size'])} | {duration(a['compile_seconds'])} / "
                         f"{duration(b['compile_seconds'])} | {duration(a['sim_median_s'])} / {duration(b['sim_median_s'])} | "
                         f"{'; '.join(r['regression']) or '-'} |")
    return lines


def compat_markdown(data: dict[str, Any]) -> list[str]:
    table = data.get("compatibility")
    if not table or not table.get("binaries"):
        return []
    runtimes = table["runtimes"]
    lines = ["", "## Runtime compatibility (measured on the simulator, `doit compat`)", "",
             "| binary (built with QNN) | " + " | ".join(f"runtime QNN {r['qnn']}" for r in runtimes) + " | minimum runtime |",
             "|---|" + "---|" * (len(runtimes) + 1)]
    for entry in table["binaries"]:
        cells = [compat_cell(entry["runs"].get(r["profile"])) for r in runtimes]
        lines.append(f"| {entry['target']} ({entry['built_with']}) | " + " | ".join(cells)
                     + f" | {entry.get('minimum_runtime') or '-'} |")
    oracle = table.get("oracle")
    if oracle:  # the load oracle's prediction beside each measurement (qnn/loadoracle.py)
        lines += ["", f"predicted vs measured: {oracle['cases']} cases, {oracle['disagree']} disagree "
                      f"(each cell: measured / predicted; {oracle.get('note', '')})"]
        for c in oracle.get("disagreements") or ():
            lines.append(f"- DISAGREE {c['target']} on runtime QNN {c['runtime_qnn']}: measured {c['measured']}; "
                         f"predicted {c['predicted']}")
    return lines


def compat_cell(run: dict[str, Any] | None) -> str:
    if not run:
        return "-"
    predicted = run.get("predicted")
    guess = f" / predicted {predicted['outcome']}" + (f" ({predicted['code']})" if predicted.get("code") else "") \
        if predicted else ""
    if not run.get("loads"):
        return "refused" + (f" ({run['error_code']})" if run.get("error_code") else "") + guess
    return ("loads, matches" if run.get("matches") else "loads, DIFFERS") + guess


def latency_markdown(data: dict[str, Any]) -> list[str]:
    """Estimated phone time per target, pipeline and loop (docs/latency.md), with the phone's where it was measured."""
    rows = [(t["name"], t.get("latency_ms")) for t in data["targets"]]
    rows += [(f"pipeline {p['name']}", p.get("latency_ms")) for p in data.get("pipelines", [])]
    rows += [(f"loop {p['name']}", p.get("latency_ms")) for p in data.get("loops", [])]
    rows = [(name, lat) for name, lat in rows if lat]
    if not rows:
        return []
    lines = ["", "## Phone time, estimated before the phone (not measured: docs/latency.md)", "",
             "| target | estimate | band | per | real-time factor | measured on a phone | basis |",
             "|---|---|---|---|---|---|---|"]
    for name, lat in rows:
        phone = ", ".join(f"{p['median_ms']:g} ms ({p['device']})" for p in lat.get("phone") or []) or "-"
        rtf = (lat.get("realtime_factor") or {}).get("estimate")
        if lat.get("estimate") is None:
            lines.append(f"| {name} | refused: {lat.get('refused')} | - | - | - | {phone} | {lat.get('basis')} |")
            continue
        wide = " (widened)" if lat.get("widened") else ""
        lines.append(f"| {name} | ~{lat['estimate']:g} ms | {lat['low']:g}-{lat['high']:g} ms{wide} | "
                     f"{lat.get('per', 'inference')} | {num(rtf)} | {phone} | {lat['basis']} |")
    error = next((lat["fit_error"] for _, lat in rows if lat.get("fit_error")), None)
    if error:
        lines += ["", f"Leave-one-model-out error of the fit: median {error['median_pct']:g}%, p90 "
                      f"{error['p90_pct']:g}% over {error['models']} models x {error['chips']} chips. AI Hub's numbers "
                      "are one device each under AI Hub's settings; apps have reported 2x slower and more."]
    return lines


def memory_markdown(data: dict[str, Any]) -> list[str]:
    """The memory each binary holds when loaded (docs/load-and-fit.md#will-it-fit): read from the binary, beside
    lint's estimate and its error; the estimate alone where no binary was built."""
    rows = [(t["name"], t["memory"]) for t in data["targets"] if t.get("memory")]
    if not rows:
        return []
    lines = ["", "## Memory when loaded (docs/load-and-fit.md)", "",
             "| target | resident MiB | from | lint's estimate MiB | estimate's error |", "|---|---|---|---|---|"]
    for name, mem in rows:
        est = mem.get("estimate") or {}
        error = est.get("error")
        lines.append(f"| {name} | {num(mem['resident_bytes'] / 2**20)} | "
                     f"{'the binary' if mem.get('measured') else 'estimate'} | "
                     f"{num(est['resident_bytes'] / 2**20) if est else '-'} | "
                     f"{'-' if error is None else f'{100 * error:+.1f}%'} |")
    return lines


def device_markdown(data: dict[str, Any]) -> list[str]:
    rows = device_rows(data)
    if not rows:
        return []
    lines = ["", "## On phones (device results, `doit verify`)", "",
             "| target | phone | Android | chip | status | runs | min cosine | per inference (median / p90) | first output "
             "| RTF | CPU cores |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['target']} | {r['model']} ({r['serial']}) | {r['android']} | {r['chip']} | {r['status']} | "
                     f"{r['runs']} | {num(r['min_cosine'], 6)} | {duration(r['median_s'])} / {duration(r['p90_s'])} | "
                     f"{duration(r['first_s'])} | {num(r['rtf'])} | {num(r['cpu_cores'], 3)} |")
    return lines


def decision_text(decision: dict[str, Any] | None) -> str:
    """The package selector's decision on that phone (qnn/select.py), in a few words: "NPU fp16", "CPU (load-failed)"."""
    if not decision:
        return "-"
    return f"NPU {decision.get('precision')}" if decision.get("target") == "npu" else f"CPU ({decision.get('rule')})"


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
                         "error": d.get("error"), "runs": decision_text(d.get("decision"))})
    return rows


# ------------------------------------------------------------------ html

def html(data: dict[str, Any], report_dir: Path, plots: dict[str, str | None],
         figures: dict[str, dict[str, Any]] | None = None) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("qnn_tasks.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    env.filters["rel"] = lambda p: linked(p, report_dir)
    env.filters["num"] = num
    env.filters["size"] = size
    env.filters["duration"] = duration
    env.filters["limits"] = limits
    return env.get_template("report.html.j2").render(
        data=data, socs=soc_names(data), cell=lambda g, s: target_of(data, g, s), plots=plots, figures=figures or {},
        breaks=breaks, worst_nodes=worst_nodes, compat_cell=compat_cell, not_in_socs=NOT_IN_SOCS,
        first_differing=first_differing, loop_timing=loop_timing, transducer_first=transducer_first,
        summary=summary_line(data))


def linked(path: str | None, report_dir: Path) -> str:
    """A link from index.html to `path`: files outside the report folder are copied into files/ first."""
    if not path or not os.path.isfile(path):
        return ""
    source = Path(path)
    try:
        return str(source.resolve().relative_to(report_dir.resolve()))
    except ValueError:
        pass
    rel = Path(os.path.relpath(source, report_dir.parent)) if not source.is_absolute() else Path(source.name)
    copy = report_dir / "files" / Path(*[p for p in rel.parts if p != ".."])
    if not copy.is_file() or copy.stat().st_mtime_ns < source.stat().st_mtime_ns:
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, copy)
    return str(copy.relative_to(report_dir))


# ------------------------------------------------------------------ helpers

def _existing(path: str | None) -> str | None:
    return path if path and os.path.isfile(path) else None


def soc_names(data: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for t in data["targets"]:
        if t["soc"]["name"] not in names:
            names.append(t["soc"]["name"])
    return names


def target_of(data: dict[str, Any], variant: str, soc: str) -> dict[str, Any] | None:
    return next((t for t in data["targets"] if t["variant"] == variant and t["soc"]["name"] == soc), None)


def cell_text(data: dict[str, Any], variant: str, soc: str) -> str:
    target = target_of(data, variant, soc)
    if not target:
        return NOT_IN_SOCS
    return target["status"] + (" (cache)" if target["provenance"].get("from_cache") else "")


def num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def breaks(metrics: dict[str, Any], threshold: str) -> str:
    """'failed' when this metric breaks its threshold (the cell is shown red), else ''."""
    from qnn_tasks.judge.metrics import METRIC_OF
    from qnn_tasks.modelspec.checks import THRESHOLD_KEYS

    limit = (metrics.get("thresholds") or {}).get(threshold)
    value = metrics.get(METRIC_OF[threshold])
    if limit is None:
        return ""
    if value is None:  # non-finite (written as null): NaN breaks, an infinite SNR does not
        return "" if threshold == "min_snr_db" and not metrics.get("non_finite") else "failed"
    ok = value <= limit if THRESHOLD_KEYS[threshold] == "max" else value >= limit
    return "" if ok else "failed"


def worst_nodes(diagnosis: dict[str, Any], count: int = 12) -> list[dict[str, Any]]:
    """The nodes with the largest error, in graph order (the diagnosis table)."""
    nodes = [n for n in diagnosis.get("nodes") or []]
    worst = sorted(nodes, key=lambda n: -(n["rel_max_abs"] if n.get("rel_max_abs") is not None else float("inf")))[:count]
    return sorted(worst, key=lambda n: n["index"])


def duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "-"
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"


_LIMIT_WORDS = {"max_abs": "max-abs ≤ {}", "mean_abs": "mean-abs ≤ {}", "min_cosine": "cosine ≥ {}",
                "min_snr_db": "SNR ≥ {} dB"}


def limits(thresholds: dict[str, Any]) -> str:
    return ", ".join(_LIMIT_WORDS.get(k, k + " {}").format(f"{v:g}") for k, v in (thresholds or {}).items())


def size(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{value} B"
        value /= 1024
    return str(value)


def summary_line(data: dict[str, Any]) -> str:
    s = data["summary"]
    line = (f"{s['targets']} targets: {s['passed']} passed, {s['warning']} with warnings, {s['failed']} failed, "
            f"{s['skipped']} skipped, {s['pending']} not built yet")
    if s.get("models_not_buildable"):
        line += f"; {s['models_not_buildable']} model(s) NOT BUILDABLE (spec errors)"
    if s.get("stale"):
        line += f", {s['stale']} STALE"
    if s.get("crosssize_failed"):
        line += f"; {s['crosssize_failed']} cross-size check(s) FAILED"
    if s.get("rejected"):
        line += f"; {s['rejected']} precision-auto candidate(s) rejected (not chosen)"
    if s.get("choices_failed"):
        line += f"; {s['choices_failed']} precision-auto choice(s) FAILED (no candidate passes)"
    if s.get("upgrade_regressions"):
        line += f"; {s['upgrade_regressions']} upgrade regression(s) of a gating toolchain"
    if s.get("from_cache"):
        line += f"; {s['from_cache']} restored from the cache"
    return line + "."
