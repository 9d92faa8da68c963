"""The only package that imports doit: task dicts, up-to-date checkers, on-demand tasks, the tree lock, Ctrl-C.

`qnn_tasks.tasks.project_tasks` is what a project's dodo.py calls. It is imported on first use (PEP 562): doit
imports `qnn_tasks.tasks.statefile`, its state-file plugin, on every command of every project in this environment,
and that must not load the planner.
"""
from __future__ import annotations

from typing import Any

__all__ = ["project_tasks"]


def __getattr__(name: str) -> Any:
    if name == "project_tasks":
        from qnn_tasks.tasks.project import project_tasks

        return project_tasks
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
