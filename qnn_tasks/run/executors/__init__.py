"""Executors run stage calls (calls.StageCall) somewhere: here, in a child process, or on a Dask worker.

`QNN_EXECUTOR` picks one for the heavy stages: `child` (default: a persistent child process per
interpreter, so Ctrl-C stops native work at once and pinned toolchain environments get their own
interpreter), `inprocess` (debugging), or `dask://host:port` (a Dask cluster; `tls://host:port` for
one that speaks TLS, with Dask's distributed.comm.tls.* config; needs a shared cache store,
QNN_CACHE). Light stages always run in this process.
"""
from __future__ import annotations

from typing import Callable, Protocol

from qnn_tasks.errors import QnnTasksError, SpecError
from qnn_tasks.run import interrupts
from qnn_tasks.run.calls import StageCall
from qnn_tasks.run.outcome import Outcome

ENV = "QNN_EXECUTOR"
Sink = Callable[[int, int, str], None]


class Executor(Protocol):
    name: str

    def run(self, call: StageCall, sink: Sink | None) -> Outcome:
        """Run the call; the stage's own errors come back as a failed Outcome (the executor's may raise)."""


_chosen: dict[str, Executor] = {}
_unusable: dict[str, QnnTasksError] = {}


def for_call(call: StageCall, root: str, cache=None) -> Executor:
    """The executor for this call: light calls in-process; heavy ones by QNN_EXECUTOR."""
    from qnn_tasks.run.executors import local

    if not call.heavy:
        return _cached("inprocess", local.InProcess)
    from qnn_tasks.envvalues import choice

    spec = choice(ENV)
    if spec == "inprocess":
        if call.toolchain and call.toolchain.get("packages"):
            return _cached("child", lambda: local.Child(root))  # a pinned interpreter is another process
        return _cached("inprocess", local.InProcess)
    if spec == "child":
        return _cached("child", lambda: local.Child(root))
    if spec.startswith(("dask://", "tcp://", "tls://")):
        if not call.remote:
            return _cached("child", lambda: local.Child(root))
        from qnn_tasks.run.executors.dask import DaskExecutor

        return _cached(spec, lambda: DaskExecutor(spec, root, cache))
    raise SpecError(f"${ENV}", "", f"unknown executor '{spec}'", "use child, inprocess, dask://host:port or tls://host:port")


def _cached(name: str, make: Callable[[], Executor]) -> Executor:
    if name in _unusable:  # an unreachable scheduler costs its timeout once per run, not once per call
        raise _unusable[name]
    if name not in _chosen:
        try:
            _chosen[name] = make()
        except QnnTasksError as err:
            _unusable[name] = err
            raise
    return _chosen[name]


def stop_all() -> None:
    """Ctrl-C: stop every child process and remote call at once."""
    for executor in list(_chosen.values()):
        stop = getattr(executor, "stop", None)
        if stop:
            stop()


interrupts.stop_with(stop_all)  # Ctrl-C / SIGTERM stops every executor (the signal code knows no executor)
