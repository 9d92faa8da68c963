"""User-facing errors: one line that names the file, the key or node, and the fix."""
from __future__ import annotations

import errno

# Exit codes of `doit` in a project, besides doit's own (0 done, 1 a task failed, 2 a task raised: a bug,
# 3 a bad command line or a crash loading dodo.py) and 130 for Ctrl-C (run/interrupts.py). Distinct from all of
# those, so a script can tell "fix the spec" from "try again later" from "a stage failed" (sysexits.h names).
EXIT_SPEC = 78  # EX_CONFIG: a spec file or the toolchain setup is wrong; one line names the file, key and fix
EXIT_BUSY = 75  # EX_TEMPFAIL: another doit is building this tree; try again when it has finished
EXIT_IO = 74    # EX_IOERR: the build tree cannot be written before any stage ran (full disk, read-only, I/O error)


class QnnTasksError(Exception):
    """Base of every error meant for a person (printed without a traceback)."""


class SpecError(QnnTasksError):
    """A model.yaml, socs.yaml or toolchain profile is wrong."""

    def __init__(self, file: object, key: str, problem: str, fix: str = "") -> None:
        where = f"{file}: {key}" if key else f"{file}"
        super().__init__(f"{where}: {problem}" + (f" (fix: {fix})" if fix else ""))


class StageError(QnnTasksError):
    """A build stage failed on its input (bad ONNX, unsupported op, mismatch ...).

    `record` carries what the stage measured before failing, so the report can show it.
    """

    def __init__(self, message: str, record: dict | None = None) -> None:
        super().__init__(message)
        self.record = record or {}


class RewriteError(QnnTasksError):
    """A declared rewrite cannot do what it was asked exactly (the export stage makes it one model.yaml line)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem} (fix: {fix})")
        self.problem, self.fix = problem, fix


class ToolchainError(QnnTasksError):
    """The toolchain is missing, misconfigured, or crashed."""


def one_line(err: BaseException) -> str:
    """A tool's whole message on one line: onnxruntime spreads one error over several, and its last line alone
    (" is not output of any previous nodes.") had lost the tensor and the node it was about."""
    return " ".join(str(err).split()) or type(err).__name__


# errno -> (what happened, the fix): a machine's failures, said in one line instead of a traceback
_WRITE_FAILURES = {
    errno.ENOSPC: ("no space left on the device", "free space on the filesystem that holds it, then rerun doit"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise your quota on that filesystem, then rerun doit"),
    errno.EROFS: ("the filesystem is read-only", "build on a writable filesystem (or remount it read-write), "
                                                 "then rerun doit"),
    errno.EIO: ("input/output error (a failing disk or a lost network filesystem)",
                "check the disk or the mount (dmesg), then rerun doit"),
}


def machine_failure(err: BaseException) -> str | None:
    """The one line for a write the machine refused (ENOSPC, EDQUOT, EROFS, EIO), or None for any other error."""
    if not isinstance(err, OSError) or err.errno not in _WRITE_FAILURES:
        return None
    problem, fix = _WRITE_FAILURES[err.errno]
    where = err.filename if err.filename is not None else "build/"
    return f"{where}: {problem} (fix: {fix})"


class MachineError(QnnTasksError):
    """A write the machine refused (full disk, quota, read-only filesystem, I/O error), in one line."""

    def __init__(self, err: OSError, doing: str = "") -> None:
        line = machine_failure(err) or f"{err.filename or 'build/'}: {err.strerror or err}"
        super().__init__(f"{doing}: {line}" if doing else line)
        self.errno = err.errno
