"""The only package that imports doit: task dicts, up-to-date checkers, on-demand tasks, the tree lock, Ctrl-C.

`qnn_tasks.tasks.project_tasks` is what a project's dodo.py calls.
"""
from qnn_tasks.tasks.project import project_tasks

__all__ = ["project_tasks"]
