"""Run stage calls in this process, or in persistent child processes that Ctrl-C can stop at once.

A child is `python -m qnn_tasks.run.executors.worker` with the call's interpreter (this one, or a
pinned toolchain environment's) and the project root as working directory. It reads one call
per line and answers with progress lines and one outcome line. Children are reused (imports such
as onnxruntime are paid once), run in their own session (a terminal's Ctrl-C reaches doit, which
decides) and die with their parent (PR_SET_PDEATHSIG), so a killed doit leaves no orphans.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path

from qnn_tasks.errors import QnnTasksError, ToolchainError, machine_failure
from qnn_tasks.run import calls, interrupts, progress
from qnn_tasks.run.calls import StageCall
from qnn_tasks.run.outcome import Outcome

PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])  # the folder holding qnn_tasks/


def run_here(call: StageCall, sink) -> Outcome:
    """Execute the call in this process and turn any error into an outcome (what every executor returns)."""
    progress.set_sink(sink)
    try:
        return Outcome.success(calls.execute(call))
    except QnnTasksError as err:
        return Outcome.failure(str(err), getattr(err, "record", None))
    except Exception as err:  # a bug or a tool crash: keep the traceback for the log
        if machine_failure(err):  # a full disk, a read-only tree ...: the machine's, not a bug; one line
            return Outcome.failure(machine_failure(err))
        return Outcome.failure(f"unexpected {type(err).__name__}: {err}", traceback=traceback.format_exc())
    finally:
        progress.set_sink(None)


class InProcess:
    name = "inprocess"

    def run(self, call: StageCall, sink) -> Outcome:
        return run_here(call, sink).ran_on({"kind": "inprocess", "host": socket.gethostname(), "pid": os.getpid()})


class _Worker:
    def __init__(self, python: str, cwd: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [PACKAGE_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        env.pop("QNN_EXECUTOR", None)
        self.python = python
        self.proc = subprocess.Popen([python, "-m", "qnn_tasks.run.executors.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=cwd, env=env, start_new_session=True, text=True,
                                     bufsize=1)
        interrupts.child_started(self.proc.pid)  # its own session: pid == process group

    def call(self, call: StageCall, sink, cwd: str | None) -> Outcome:
        self.proc.stdin.write(json.dumps({"call": call.to_json(), "cwd": cwd}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            message = json.loads(line)
            if "progress" in message:
                if sink:
                    sink(*message["progress"])
                continue
            return Outcome.from_dict(message["outcome"])  # a damaged answer is a ValueError: the worker is dropped
        raise EOFError

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        interrupts.child_ended(self.proc.pid)


class Child:
    """A pool of persistent child processes per interpreter (as many as calls in flight)."""
    name = "child"

    def __init__(self, root: str) -> None:
        self.root = root
        self._idle: dict[str, list[_Worker]] = {}
        self._busy: set[_Worker] = set()
        self._lock = threading.Lock()
        self.stopped = False

    def run(self, call: StageCall, sink, cwd: str | None = None) -> Outcome:
        """Run the call in a child; `cwd` overrides the project root (a Dask worker's scratch copy)."""
        python = interpreter_for(call)
        worker = self._take(python)
        expired = threading.Event()
        timer = threading.Timer(call.time_limit, lambda: (expired.set(), worker.kill())) if call.time_limit else None
        if timer:
            timer.daemon = True
            timer.start()
        try:
            outcome = worker.call(call, sink, cwd)
        except (EOFError, BrokenPipeError, OSError, ValueError):
            try:  # its pipe closed: it is exiting; its status says how (a kill is not reaped at once)
                code = worker.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
            self._drop(worker)
            if self.stopped:
                raise KeyboardInterrupt from None
            if expired.is_set():
                return timed_out(call, Path(cwd or self.root))
            # SIGKILL that no timer sent is most often the kernel's out-of-memory killer, not a bug in the tool
            why = ("killed (signal 9): most often the kernel's out-of-memory killer (check `dmesg`; fix: fewer jobs "
                   "at once, doit -n 1, or more memory)" if code == -9 else "a crash in native code")
            raise ToolchainError(f"the worker process running {call.stage}:{call.target} died"
                                 + (f" (signal {-code})" if code and code < 0 else f" (exit {code})")
                                 + f" in {python}: {why} (its output: {call.out_dir}/{call.stage}.log)") from None
        except BaseException:
            self._drop(worker)
            raise
        finally:
            if timer:
                timer.cancel()
        self._give_back(worker)
        return outcome.ran_on({"kind": "child", "host": socket.gethostname(), "pid": worker.proc.pid, "python": python})

    def _take(self, python: str) -> _Worker:
        with self._lock:
            if self.stopped:
                raise KeyboardInterrupt
            idle = self._idle.setdefault(python, [])
            while idle:
                worker = idle.pop()
                if worker.proc.poll() is None:
                    self._busy.add(worker)
                    return worker
            worker = _Worker(python, self.root)
            self._busy.add(worker)
            return worker

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
            self._idle.setdefault(worker.python, []).append(worker)

    def _drop(self, worker: _Worker) -> None:
        with self._lock:
            self._busy.discard(worker)
        worker.kill()

    def stop(self) -> None:
        """Kill every child now (Ctrl-C): calls in flight end with EOF in their threads."""
        with self._lock:
            self.stopped = True
            workers = list(self._busy) + [w for ws in self._idle.values() for w in ws]
            self._idle.clear()
        for worker in workers:
            worker.kill()


def timed_out(call: StageCall, root: Path) -> Outcome:
    """The failure of a call whose child was killed at its time limit; what it had begun is removed (the funnel
    sweeps `.part` litter; outputs are deleted too, so nothing it wrote can pass for a finished result)."""
    from qnn_tasks.run import treelock

    for output in call.outputs:
        (root / output).unlink(missing_ok=True)
    treelock.sweep(root / call.out_dir)
    return Outcome.failure(f"stopped after {call.time_limit:g} s, the stage's time limit ({call.time_limit_from}); its "
                           f"process was killed and nothing it wrote is kept (fix: find why it does not finish, e.g. a "
                           f"loop's step function that never returns, or raise the limit)",
                           {"timed_out_after_s": call.time_limit})


def interpreter_for(call: StageCall) -> str:
    """This interpreter, or the pinned environment's for a toolchain profile with `packages:`."""
    if call.toolchain and call.toolchain.get("packages"):
        from qnn_tasks.modelspec import specjson
        from qnn_tasks.toolchains import envs

        return str(envs.ensure(specjson.profile_from_dict(call.toolchain)).python)
    return sys.executable
