"""doit entry point: load this project's specs (models/, socs/, toolchain/) and hand doit the tasks.

`doit` builds everything that needs no phone; `doit list --all` shows every target.
The toolchain profile is $QNN_TOOLCHAIN (default: ort-qnn): the packaged one, or toolchain/<name>.yaml here.
"""
from pathlib import Path

from qnn_tasks.tasks import project_tasks

globals().update(project_tasks(Path(__file__).resolve().parent))
