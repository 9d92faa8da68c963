"""The report's sizes section: the sizes of one graph (model.yaml `dims:`) side by side per chip, with the
cross-size check that vouches for "the smallest size that fits"."""
from __future__ import annotations

from typing import Any

from qnn_tasks.plan.stages import CROSSSIZE, crosssize_chips, size_chips


def entries(planner, targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per graph with sizes, precision, chip and toolchain: each size's figures and the cross-size verdict."""
    from qnn_tasks.report.gather import combine, read_checked
    from qnn_tasks.report.upgrade_diff import target_figures

    by_name = {t["name"]: t for t in targets}
    found = []
    for ct in crosssize_chips(planner):
        record = read_checked(CROSSSIZE.record_of(ct))
        cells = []
        for sized in size_chips(planner, ct):
            target = by_name[sized.name]
            figures = target_figures(target)
            cells.append({"size": sized.graph.size.size, "graph": sized.graph.name, "target": sized.name,
                          "status": target["status"], "bin_size": figures["bin_size"],
                          "sim_median_s": figures["sim_median_s"], "min_cosine": figures["min_cosine"]})
        status = combine([record])
        found.append({"name": f"{CROSSSIZE.name}:{ct.name}", "graph": ct.graph.size.graph, "model": ct.graph.model, "dim": ct.graph.size.dim,
                      "soc": ct.soc.name, "precision": ct.precision, "toolchain_id": ct.toolchain_id, "sizes": cells,
                      "status": status, "reason": record.get("error") if record and status != "passed" else None,
                      "record": record})
    return found


def markdown(data: dict[str, Any]) -> list[str]:
    from qnn_tasks.report.render import duration, num, size

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
