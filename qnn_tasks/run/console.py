"""What a person sees while doit runs: one line per finished stage with its duration, progress of
long stages (an updating line on a terminal, a plain line every so often otherwise), warnings one
line each with their fix.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from qnn_tasks import envvalues

_lock = threading.Lock()


# stderr: doit shows it at its default verbosity (stdout of actions is captured), and keeps stdout
# for its own task lines.
OUT = sys.stderr


def _tty() -> bool:
    return OUT.isatty()


def progress_sink(task: str) -> Callable[[int, int, str], None]:
    """A sink for progress.step(): elapsed time and an estimate of what is left."""
    start = time.monotonic()
    state = {"last": start, "done": 0, "tick": start, "series": start}
    every = envvalues.number(envvalues.PROGRESS_SECONDS)  # without a terminal: a plain line at most this often

    def sink(done: int, total: int, unit: str) -> None:
        now = time.monotonic()
        elapsed = now - start
        if done <= state["done"]:  # a new series (the repair simulates step after step): estimate from its own pace
            state["series"] = state["tick"]
        state["done"], state["tick"] = done, now
        left = (now - state["series"]) / done * (total - done) if done else 0.0
        text = f"{task}: {unit} {done}/{total}, {_clock(elapsed)} elapsed" + (f", ~{_clock(left)} left" if done < total else "")
        with _lock:
            if _tty():
                OUT.write("\r\033[K" + text + ("\n" if done == total else ""))
                OUT.flush()
            elif now - state["last"] >= every and done < total:
                print(text, file=OUT, flush=True)
                state["last"] = now
    return sink


def finished(task: str, record: dict[str, Any]) -> None:
    """`<task>: passed in 3.2 s` (+ where it came from), then each warning on a line of its own."""
    cached = record.get("from_cache")
    where = (f" (from cache: built {cached.get('built_at')} on {cached.get('built_by')})" if cached
             else _where(record.get("executor")))
    lines = [f"{task}: {record['status']} in {_clock(record.get('seconds') or 0.0)}{where}"]
    lines += [f"  warning: {w}" for w in record.get("warnings") or []]
    if record.get("rejected"):
        lines.append(f"  {record['rejected']}")
    for extra in record.get("console") or []:
        lines.append(f"  {extra}")
    with _lock:
        print("\n".join(lines), file=OUT, flush=True)


def note(text: str) -> None:
    with _lock:
        print(text, file=OUT, flush=True)


def _where(executor: dict[str, Any] | None) -> str:
    if executor and executor.get("kind") == "dask":
        return f" (on Dask worker {executor.get('worker')})"
    return ""


def _clock(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s"
