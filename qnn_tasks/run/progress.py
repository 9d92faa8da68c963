"""Progress of a long stage (e.g. one simulated sample after another), reported to whoever runs it.

A stage calls `step(done, total)`; the executor running it decides where that goes: the console
in this process, or a message to the parent when the stage runs in a child process.
"""
from __future__ import annotations

from typing import Callable

_sink: Callable[[int, int, str], None] | None = None


def set_sink(sink: Callable[[int, int, str], None] | None) -> None:
    global _sink
    _sink = sink


def step(done: int, total: int, unit: str = "sample") -> None:
    if _sink is not None:
        _sink(done, total, unit)
