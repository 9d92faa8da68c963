"""A report never looks current while a run that may change its verdict has not finished.

Before the first stage of a `doit` runs, the previous build/report/report.json is marked
superseded (`summary.ok`, `summary.current` and `summary.complete` false, `summary.superseded_by` naming the
run), so a gate that reads it after that run was killed (SIGTERM, a lost CI runner) fails. The
report task of a run that finishes writes a new, current report; a run that only builds some
stages (`doit simulate:x`) leaves the mark until `doit report` re-renders it. A no-op `doit`
runs no stage and leaves the report alone. A mark that cannot be written removes the report
instead (a full disk): the gate then fails on a missing file. The funnel marks it as a run's first stage starts,
so it stands in run/, below the report that writes the file.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import threading
from pathlib import Path

from qnn_tasks.errors import MachineError
from qnn_tasks.fileio import write_json

REPORT_JSON = Path("build") / "report" / "report.json"

_marked: list[bool] = []
_lock = threading.Lock()


def supersede(root: Path | str = ".", why: str = "") -> None:
    """Mark the previous report.json as superseded by this run (once per process; silent if there is none).

    When the mark cannot be written (a full disk, a quota, an I/O error) the report is removed instead, which
    needs no space: an old verdict must never outlive the start of a run that may change it. Only when even
    that fails (a read-only filesystem) is a MachineError raised; then this run cannot change the tree either.
    """
    with _lock:
        if _marked:
            return
        path = Path(root) / REPORT_JSON
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            _marked.append(True)
            return
        summary = data.get("summary") if isinstance(data, dict) else None
        if not isinstance(summary, dict) or summary.get("current") is False:
            _marked.append(True)
            return
        since = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        command = " ".join(["doit", *sys.argv[1:]])
        summary.update(ok=False, current=False, complete=False,
                       superseded_by=f"{command} (pid {os.getpid()}, started stages at {since}){why}; the records may "
                                     f"have changed since this report was written: rerun doit (or doit report) to "
                                     f"refresh it")
        try:
            write_json(path, data)
        except OSError as err:
            try:
                path.unlink(missing_ok=True)
            except OSError:
                raise MachineError(err, "the previous report could not be marked superseded nor removed") from None
        _marked.append(True)
