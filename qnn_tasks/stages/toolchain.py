"""Runners of the stages a toolchain implements: per-variant graph stages (quantize; convert, modellib), config, context.

Named in the stage table like every other runner; the toolchain object comes from the call's profile
(toolchains/calltoolchain.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks.errors import ToolchainError
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall
from qnn_tasks.toolchains.base import StageInput
from qnn_tasks.toolchains.calltoolchain import toolchain


def graph_stage(call: StageCall) -> dict[str, Any]:
    """A toolchain's per-variant stage (quantize; convert, modellib)."""
    a = call.args
    chain = toolchain(call).graph_stages(a["precision"])
    stage = next(s for s in chain if s.name == call.stage)
    return stage.run(StageInput(graph=calls.graph(a), precision=a["precision"], source=Path(a["source"]),
                                out_dir=Path(call.out_dir), calibration=calls.path(a, "calibration"),
                                promoted=calls.path(a, "promoted")))


def config(call: StageCall) -> dict[str, Any]:
    a = call.args
    return toolchain(call).write_config(calls.graph(a), a["precision"], calls.soc(a), Path(call.out_dir))


def context(call: StageCall) -> dict[str, Any]:
    """Compile; a failure naming a node lint flagged repeats lint's fix for it (graphs/flagged.py)."""
    a = call.args
    try:
        return toolchain(call).compile(calls.graph(a), calls.soc(a), Path(a["source"]), Path(a["config_dir"]),
                                       Path(call.out_dir), promoted=calls.path(a, "promoted"))
    except ToolchainError as err:
        from qnn_tasks.graphs.flagged import lint_fix_for

        known = lint_fix_for(str(err), Path(a["lint"]), Path(a["simplified"])) if a.get("lint") else ""
        if not known:
            raise
        raise ToolchainError(f"{err}{known}") from None
