"""The words a record's and a report entry's `status` may hold, typed (doit's `TaskRunStatus` shape).

A `str` enum: members equal their strings, so records read back from JSON compare with them and records written
with them are plain JSON.
"""
from __future__ import annotations

from enum import Enum
from typing import Iterable


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
JUDGED = frozenset({Status.PASSED, Status.WARNING, Status.FAILED, Status.REJECTED})  # hold only under the spec made under
# what a report counts per target, in the order its summary lists them
COUNTED = (Status.PASSED, Status.WARNING, Status.FAILED, Status.STALE, Status.SKIPPED, Status.PENDING, Status.REJECTED)
# worst first: the status of several records is the first of these among theirs, else passed
PRECEDENCE = (Status.FAILED, Status.STALE, Status.PENDING, Status.REJECTED, Status.WARNING)


def good(status: object) -> bool:
    """The status passes (passed, or passed with warnings)."""
    return status in GOOD


def worst(statuses: Iterable[object]) -> Status:
    """failed > stale > pending > rejected > warning > passed: the first of PRECEDENCE among `statuses`, else passed (a skipped or
    running record adds nothing)."""
    found = list(statuses)  # compared, not hashed: a damaged record's status may be any JSON
    return next((status for status in PRECEDENCE if status in found), Status.PASSED)
