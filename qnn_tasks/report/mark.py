"""A report never looks current while a run that may change its verdict has not finished.

Before the first stage of a `doit` runs, the previous build/report/report.json is marked
superseded (`summary.current` and `summary.complete` false, `summary.superseded_by` naming the
run), so a gate that reads it after that run was killed (SIGTERM, a lost CI runner) fails. The
report task of a run that finishes writes a new, current report; a run that only builds some
stages (`doit simulate:x`) leaves the mark until `doit report` re-renders it. A no-op `doit`
runs no stage and leaves the report alone.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import threading
from pathlib import Path

from qnn_tasks.fileio import write_json

REPORT_JSON = Path("build") / "report" / "report.json"

_marked: list[bool] = []
_lock = threading.Lock()


def supersede(root: Path | str = ".") -> None:
    """Mark the previous report.json as superseded by this run (once per process; silent if there is none)."""
    with _lock:
        if _marked:
            return
        _marked.append(True)
        path = Path(root) / REPORT_JSON
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        summary = data.get("summary") if isinstance(data, dict) else None
        if not isinstance(summary, dict) or summary.get("current") is False:
            return
        since = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        command = " ".join(["doit", *sys.argv[1:]])
        summary.update(current=False, complete=False,
                       superseded_by=f"{command} (pid {os.getpid()}, started stages at {since}); the records may have "
                                     f"changed since this report was written: rerun doit (or doit report) to refresh it")
        write_json(path, data)
