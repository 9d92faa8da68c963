"""Was this context binary built for this chip: the one comparison, read from the binary itself.

The context stage checks the binary it just compiled (toolchains' `check_chip`); the simulate
stage checks again before it runs anything, since a file can be replaced after its record was
written (a `cp -p` from another chip's folder keeps size and mtime).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.spec.project import Soc


def mismatch(info: dict[str, Any], soc: Soc) -> list[str]:
    """What in the binary's facts (qnnbin's info dict) says another chip than `soc`; empty: this chip."""
    problems = []
    if info.get("soc_model") != soc.soc_id:
        problems.append(f"socModel {info.get('soc_model')} != soc_id {soc.soc_id}")
    if info.get("dsp_arch") != soc.dsp_arch:
        problems.append(f"arch {info.get('dsp_arch')} != dsp_arch {soc.dsp_arch}")
    return problems


def refuse_other_chip(binary: Path, soc: Soc, target: str) -> dict[str, Any]:
    """The binary's facts, or one line refusing a binary that is not for `soc` (or cannot be read)."""
    from qnn_tasks.qnn import binary as qnnbin

    try:
        info = qnnbin.read_binary_info(binary).to_dict()
    except qnnbin.QnnBinError as err:
        raise StageError(f"{err} (fix: rebuild it: doit context:{target})") from None
    problems = mismatch(info, soc)
    if problems:
        raise StageError(f"{binary}: not a binary for {soc.name}: {', '.join(problems)}; refused before running it "
                         f"(fix: rebuild it: doit context:{target})")
    return info
