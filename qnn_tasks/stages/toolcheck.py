"""`doit toolcheck`: a toolchain's own dependency checks (for qairt: the SDK's check-linux-dependency.sh and
check-python-dependency, the NDK, readelf), as a record that says what is missing."""
from __future__ import annotations

from typing import Any

from qnn_tasks.errors import QnnTasksError, StageError
from qnn_tasks.run.calls import StageCall
from qnn_tasks.toolchains.calltoolchain import toolchain


def run_call(call: StageCall) -> dict[str, Any]:
    name = call.args["toolchain_id"]
    try:
        found = toolchain(call).check()
    except QnnTasksError as err:  # what the checks found stays in the failed record
        raise StageError(f"{name}: {err}", getattr(err, "record", None)) from None
    return {**found, "console": [f"{name}: ok"]}
