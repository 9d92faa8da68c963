"""Send native (C/C++) stderr of an in-process tool call to a log file, for the time of one call.

ONNX Runtime and QNN log from C++ straight to file descriptor 2; Python-level redirection
does not see it. The log is appended to, so one file can hold a stage's whole story.
"""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def native_stderr_to(log_path: Path) -> Iterator[None]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
