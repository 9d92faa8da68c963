"""MODEL_CARD.md: the manifest for people (the guide's step 5.4: chip, SDK version, source, quantization, the
numbers), generated from the same data, so the card cannot say what the manifest does not."""
from __future__ import annotations

from typing import Any

from qnn_tasks.qnn.select import number


def card(data: dict[str, Any]) -> str:
    source = data["source"]
    package = source.get("package") and f"package {source['package']} {source.get('version') or ''}".strip()
    origin = " ".join(filter(None, [package, source.get("file") and f"file {source['file']}",
                                    source.get("file_sha256") and f"(SHA-256 {source['file_sha256'][:16]}...)"]))
    chain = data["toolchain"]
    lines = [f"# {data['model']}", "", data.get("description") or "", "",
             f"- Licence: {data['licence']} (a compiled binary is the model: its licence applies)",
             f"- Source: {origin or 'model code in the project'}",
             f"- Compiled with: {chain['id']} (QNN {chain.get('qnn')}); packaged by {data['tool']['name']} "
             f"{data['tool']['version']}",
             f"- Choosing per device: {data['selection']['rule']}; precision order "
             f"{', '.join(data['selection']['precision_order'])}", *_sizes(data['selection'].get("sizes") or ()),
             *_splits(data['selection'].get("splits") or ()), ""]
    for name, graph in data["graphs"].items():
        part = graph.get("part")
        lines += [f"## Graph `{name}`" + (f" (part {part['index']} of {part['parts']} of `{part['of']}`)" if part else ""),
                  "",
                  "Inputs: " + ", ".join(_tensor(t) for t in graph["inputs"]),
                  "Outputs: " + ", ".join(_tensor(t) for t in graph["outputs"]), "",
                  f"CPU fallback: `{graph['fallback']['path']}` ({_mb(graph['fallback']['size'])}), checked against "
                  f"the original model on {graph['fallback']['verified_against']['measured_on']}: "
                  f"{_numbers(graph['fallback']['verified_against']['metrics'])}", ""]
        if not graph["binaries"]:
            lines += ["No NPU binary verified: every device runs the CPU fallback.", ""]
            continue
        lines += ["| chip | arch | precision | binary | size | QNN build | oldest runtime | verified on | numbers | "
                  "checks |", "|---|---|---|---|---|---|---|---|---|---|"]
        for b in graph["binaries"]:
            v = b["verification"]
            checks = ", ".join(f"{c.get('kind')} {c.get('value')} ({'passed' if c.get('passed') else 'FAILED'})"
                               for c in v["simulator"]["checks"]) or "-"
            where = v["simulator"]["measured_on"] + (f", {len(v['phone'])} phone(s)" if v["phone"] else ", no phone")
            lines.append(f"| {b['soc']} | {b['dsp_arch']} | {b['precision']} | `{b['path']}` | {_mb(b['size'])} | "
                         f"{b['qnn_build_id']} | QNN {b['min_runtime_qnn']} ({b['min_runtime_from']}) | {where} | "
                         f"{_numbers(v['simulator']['metrics'])} on {v['simulator']['samples']} samples | {checks} |")
        quantized = [(b["soc"], b["precision"], t) for b in graph["binaries"] for kind in ("inputs", "outputs")
                     for t in b["io"][kind] if t["quantization"]]
        if quantized:
            lines += ["", "Quantized I/O the app applies (real = scale * (q + offset)):"]
            lines += [f"- {soc} {precision} `{t['name']}`: {t['dtype']}, scale {t['quantization']['scale']}, "
                      f"offset {t['quantization']['offset']}" for soc, precision, t in quantized]
        loops = [b for b in graph["binaries"] if b["verification"]["loop"]]
        for b in loops:
            loop = b["verification"]["loop"]
            lines.append(f"- Loop on {b['soc']} ({loop['measured_on']}): {loop['status']}, "
                         f"{_numbers(loop['metrics'])}")
        lines.append("")
    lines += ["## Runtime libraries (per Hexagon arch)", ""]
    for arch, libs in data["runtime_libs"].items():
        state = "in this package" if libs["shipped"] else "NOT in this package: the app must ship them"
        lines.append(f"- {arch}: QNN {libs['qnn_version']} ({state}): "
                     + ", ".join(f"{f['name']} ({f['search_path']})" for f in libs["files"]))
    if data.get("pipelines"):
        lines += ["", "## Pipelines (per chip)", "", *_chains(data["pipelines"])]
    if data.get("size_notes"):
        lines += ["", "## Size notes", ""]
        lines += [f"- {n['graph']}: {n['what']}: {_mb(n['bytes'])} ({n['option']})" for n in data["size_notes"]]
    if data["omitted"]:
        lines += ["", "## Left out (not verified)", ""]
        lines += [f"- {o['target']}: {o['reason']}" for o in data["omitted"]]
    lines += ["", "Every number above was measured on the x86 HTP simulator or the CPU unless it says phone; "
              "simulator times are not phone latency. manifest.json holds the same data.", ""]
    return "\n".join(lines)


def _sizes(sizes: Any) -> list[str]:
    """A line per graph with sizes: the app picks the size with the package's selector, never its own code."""
    lines = []
    for s in sizes:
        pads = ", ".join(f"{n} {number(v)}" for n, v in sorted(s["pad"].items())) or "none"
        lines.append(f"- Sizes of `{s['graph']}` along {s['dim']}: {', '.join(map(str, s['sizes']))} ({s['rule']}; "
                     f"pad {pads}; longer: {s['longer']})" + (f"; NOT padded: {s['why']}" if s.get("why") else "")
                     + f": the app calls `Selector.chooseSize(manifest, \"{s['graph']}\", length)` (Python "
                     f"`select.choose_size`), then `choose` on the size's graph it names")
    return lines


def _chains(chains: Any) -> list[str]:
    """A line per pipeline and chip: whole there, or which graph is missing and why."""
    lines = []
    for chain in chains:
        for soc, state in chain["chips"].items():
            head = f"- `{' -> '.join(chain['graphs'])}` on {soc}: "
            if state["complete"]:
                lines.append(head + "complete (every graph's binary is here and the chain was verified on the simulator)")
                continue
            why = [state["why"], *(f"{m['graph']}: {m['reason']}" for m in state["missing"])]
            lines.append(head + "INCOMPLETE: " + "; ".join(why))
    return lines


def _splits(splits: Any) -> list[str]:
    """A line per split graph: its parts in order, the tensors each feeds the next, how the app runs them."""
    lines = []
    for s in splits:
        chain = " -> ".join(f"`{p}`" for p in s["parts"])
        feeds = "; ".join(f"{f['from']} feeds {f['to']} {', '.join(f['tensors'])}" for f in s["feeds"])
        lines.append(f"- `{s['graph']}` is split into {len(s['parts'])} parts, run in order: {chain} ({feeds}); the "
                     f"app calls `Selector.chain(manifest, \"{s['graph']}\")` (Python `select.chain`), then `choose` "
                     f"on each part (a part without a verified build for the chip runs its CPU fallback); the parts "
                     f"chained on CPU against the unsplit graph: {_numbers(s['chained_on_cpu']['metrics'])}")
    return lines


def _tensor(t: dict[str, Any]) -> str:
    return f"`{t['name']}` {t['dtype']} {list(t['shape'])}"


def _mb(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _numbers(metrics: dict[str, Any]) -> str:
    parts = []
    for output, m in metrics.items():
        if isinstance(m, dict) and m.get("cosine") is not None:
            parts.append(f"{output} cosine {m['cosine']:.6f}, max abs diff {m.get('max_abs', float('nan')):.3g}")
    return "; ".join(parts) or "-"
