"""What an executor hands back for one stage call: the stage's record, or the one line that says why it failed.

Every executor (in-process, child process, Dask worker) returns an `Outcome`; the funnel
(run/funnel.py) reads it for every stage, the on-demand tables (compat, socscheck) directly. Across a process or the network it travels as a plain dict
(`to_dict` / `from_dict`): a child process answers in JSON lines, a Dask worker's result is
pickled by Dask, and neither should depend on this class being importable the same way there.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Outcome:
    ok: bool
    record: dict[str, Any] = field(default_factory=dict)  # the stage's fields (a failure may carry partial ones)
    error: str = ""            # one line for people, set on failure
    traceback: str = ""        # a bug's or a tool crash's traceback, kept for the stage's error log
    executor: dict[str, Any] | None = None  # where the call ran: kind, host, pid (python, worker)
    stored: bool = False       # outputs and record are already in the cache store (a Dask worker put them)

    @classmethod
    def success(cls, record: dict[str, Any], *, executor: dict[str, Any] | None = None,
                stored: bool = False) -> Outcome:
        return cls(True, dict(record), executor=executor, stored=stored)

    @classmethod
    def failure(cls, error: str, record: dict[str, Any] | None = None, *, traceback: str = "",
                executor: dict[str, Any] | None = None) -> Outcome:
        return cls(False, dict(record or {}), error=error, traceback=traceback, executor=executor)

    def ran_on(self, executor: dict[str, Any]) -> Outcome:
        """The same outcome, saying where it ran (each executor stamps its own)."""
        return dataclasses.replace(self, executor=executor)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data for a child's answer line or a Dask result."""
        return {name: getattr(self, name) for name in FIELDS}

    @classmethod
    def from_dict(cls, data: Any) -> Outcome:
        """Back from `to_dict`; anything else (another version's answer, a damaged line) is a ValueError."""
        if not isinstance(data, dict) or not isinstance(data.get("ok"), bool):
            raise ValueError(f"not a stage outcome: {str(data)[:200]}")
        unknown = set(data) - set(FIELDS)
        if unknown:
            raise ValueError(f"not a stage outcome: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        record, executor = data.get("record", {}), data.get("executor")
        if not isinstance(record, dict) or not (executor is None or isinstance(executor, dict)):
            raise ValueError("not a stage outcome: record and executor must be mappings")
        return cls(data["ok"], record, error=str(data.get("error") or ""), traceback=str(data.get("traceback") or ""),
                   executor=executor, stored=bool(data.get("stored")))


FIELDS = tuple(f.name for f in dataclasses.fields(Outcome))
