"""doit entry point: load this project's specs (models/, socs/, toolchain/) and hand doit the tasks.

`doit` builds everything that needs no phone; `doit list --all` shows every target.
The toolchain profile is toolchain/$QNN_TOOLCHAIN.yaml (default: ort-qnn).
"""
from pathlib import Path

from qnn_tasks.tasks.project import project_tasks

globals().update(project_tasks(Path(__file__).resolve().parent))
