"""User-facing errors: one line that names the file, the key or node, and the fix."""
from __future__ import annotations

# Exit codes of `doit` in a project, besides doit's own (0 done, 1 a task failed, 2 a task raised: a bug,
# 3 a bad command line or a crash loading dodo.py) and 130 for Ctrl-C (run/interrupts.py). Distinct from all of
# those, so a script can tell "fix the spec" from "try again later" from "a stage failed" (sysexits.h names).
EXIT_SPEC = 78  # EX_CONFIG: a spec file or the toolchain setup is wrong; one line names the file, key and fix
EXIT_BUSY = 75  # EX_TEMPFAIL: another doit is building this tree; try again when it has finished


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
