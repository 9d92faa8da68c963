"""The compat table (`doit compat`'s build/compat/compat.json) read back: what was measured for one binary. doit verify
and dist both ask it (a runtime older than a binary's measured minimum is refused, and the manifest says which)."""
from __future__ import annotations

from typing import Any

from qnn_tasks.plan.paths import COMPAT_RECORD
from qnn_tasks.run import records


def lookup(binary_sha256: str | None) -> dict[str, Any] | None:
    """The compatibility entry measured for this exact binary (by digest), if `doit compat` ran."""
    table = records.read(COMPAT_RECORD)
    if not table or not binary_sha256:
        return None
    return next((b for b in table.get("binaries", []) if b.get("binary_sha256") == binary_sha256), None)
