"""The report's sizes section (rendered by render.py): the sizes of one graph (model.yaml `dims:`) side by side per chip, with the
cross-size check that vouches for "the smallest size that fits"."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from qnn_tasks.plan.matrix import crosssize_chips
from qnn_tasks.plan.rows import CROSSSIZE
from qnn_tasks.plan.stageplans import size_chips
from qnn_tasks.report.upgrade_diff import target_figures
from qnn_tasks.run.status import Status

if TYPE_CHECKING:  # only annotated: the planner is the task layer's
    from qnn_tasks.plan.planner import Planner


def entries(planner: Planner, targets: list[dict[str, Any]], read_checked: Callable[[str], dict | None],
            combine: Callable[[list], str]) -> list[dict[str, Any]]:
    """One entry per graph with sizes, precision, chip and toolchain: each size's figures and the cross-size verdict
    (records read and combined as gather reads every other record)."""

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
                      "status": status, "reason": record.get("error") if record and status != Status.PASSED else None,
                      "record": record})
    return found
