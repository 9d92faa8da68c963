"""Send native (C/C++) output of an in-process tool call to a log file, for the time of one call.

ONNX Runtime and QNN log from C++ straight to file descriptors 1 and 2; Python-level
redirection does not see it. The log is appended to, so one file can hold a stage's story. On the bottom floor:
the toolchains, the simulator, the stages and the executors' worker all log through it.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def native_output_to(log_path: Path) -> Iterator[None]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with open(log_path, "ab") as log:
        for fd in saved:
            os.dup2(log.fileno(), fd)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)


@contextmanager
def all_output_to(log_path: Path) -> Iterator[None]:
    """Python-level prints and warnings too (sys.stdout/sys.stderr may be doit's capture, not fds 1/2).

    For user code that talks a lot: a torch exporter's IR dumps, progress bars, C++ warnings.
    """
    import contextlib

    with native_output_to(log_path):
        with open(log_path, "a", buffering=1) as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            yield
