"""The words a record's and a report entry's `status` may hold, typed (doit's `TaskRunStatus` shape).

A `str` enum: members equal their strings, so records read back from JSON compare with them and records written
with them are plain JSON.
"""
from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    PASSED = "passed"
    WARNING = "warning"     # passed, with warnings the record lists
    FAILED = "failed"
    SKIPPED = "skipped"     # visibly not built (e.g. no fp16 on this chip)
    REJECTED = "rejected"   # judged and failed its checks as a candidate of `precision: auto`: not chosen, not a
                            # failed build (the choose stage fails when no candidate passes)
    STALE = "stale"         # a record whose outputs are gone or changed since
    PENDING = "pending"     # no verdict yet: not built, or its run was interrupted
    RUNNING = "running"     # a device stage's record while its phones run (rewritten after every step)

    def __str__(self) -> str:
        return self.value


GOOD = frozenset({Status.PASSED, Status.WARNING})       # a verdict that passes
BAD = frozenset({Status.FAILED, Status.STALE})          # counted as failed
NO_VERDICT = frozenset({Status.PENDING, Status.STALE})  # what keeps a report from being complete


def good(status: object) -> bool:
    """The status passes (passed, or passed with warnings)."""
    return status in GOOD
