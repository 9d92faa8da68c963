"""Refuse a context binary of another chip, read from the file itself before anything runs it.

The comparison is the SoC row's (`Soc.binary_mismatch`, also used by the context stage on the
binary it just compiled and by `doit socscheck`); the simulate and pipeline stages check again
here before they run anything, since a file can be replaced after its record was written (a
`cp -p` from another chip's folder keeps size and mtime).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.modelspec.project import Soc


def refuse_other_chip(binary: Path, soc: Soc, target: str) -> dict[str, Any]:
    """The binary's facts, or one line refusing a binary that is not for `soc` (or cannot be read)."""
    from qnn_tasks.qnn import binary as qnnbin

    try:
        info = qnnbin.read_binary_info(binary).to_dict()
    except qnnbin.QnnBinError as err:
        raise StageError(f"{err} (fix: rebuild it: doit context:{target})") from None
    problem = soc.binary_mismatch(info)
    if problem:
        raise StageError(f"{binary}: not a binary for {soc.name}: {problem}; refused before running it "
                         f"(fix: rebuild it: doit context:{target})")
    return info
