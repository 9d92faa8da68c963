"""Child-process side of executors/local.Child: read calls, run them, answer with outcome lines.

The protocol uses the original stdout; fd 1 is then pointed at stderr, so whatever native code
prints can never corrupt it. During a call, fds 1 and 2 go to the stage's log (<out_dir>/<stage>.log).
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the parent kills its children itself
        pass


def main() -> None:
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it kills us when it stops
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    from pathlib import Path

    from qnn_tasks.nativelog import native_output_to
    from qnn_tasks.run.calls import StageCall
    from qnn_tasks.run.executors.local import run_here

    def send(message: dict) -> None:
        channel.write(json.dumps(message, allow_nan=True, default=str) + "\n")
        channel.flush()

    home = os.getcwd()
    for line in sys.stdin:
        message = json.loads(line)
        call = StageCall.from_json(message["call"])
        os.chdir(message.get("cwd") or home)  # one call at a time: changing directory is safe here
        # whatever the stage's tools and the model's code print goes to the stage's log, not the console
        log = Path(call.out_dir) / f"{call.stage}.log"
        with native_output_to(log):
            outcome = run_here(call, lambda done, total, unit: send({"progress": [done, total, unit]}))
        if log.is_file() and log.stat().st_size == 0:
            log.unlink()  # nothing was said: no empty file beside the outputs
        send({"outcome": outcome.to_dict()})


if __name__ == "__main__":
    main()
