"""How many bytes the samples of one stage may take in memory (media sources, a pipeline's stacked windows).

Read at call time (`bounds.MAX_SAMPLE_BYTES`), so a test can lower it. A source is planned, then checked against
it, then decoded: a bound that is passed is one line naming the key and the fix, never a MemoryError.
"""
from __future__ import annotations

MAX_SAMPLE_BYTES = 1 << 30  # every sample of a graph (all sources and fills, as the declared dtypes); a stack's windows


def mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"
