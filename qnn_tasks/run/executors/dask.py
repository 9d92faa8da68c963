"""Heavy stage calls on a Dask cluster (`QNN_EXECUTOR=dask://host:8786`); doit stays the planner.

Workers share no filesystem with the client: a call's input files travel through the cache store
(content-addressed blobs), the worker runs the call in a scratch copy of the project layout, puts
the outputs and record in the store under the call's action key, and the client restores them.
So a result computed on the cluster is also in the cache for every later run and clone.

Workers must run the same code and toolchain as the client: on connect every worker reports its
code version and the fingerprints of this run's toolchains; a worker that differs is refused with
one line and never gets a call (the check is repeated on the worker for each call, for workers
that join later). A worker lost mid-call is Dask's to handle: the scheduler runs the call again
on another worker, and nothing half-written was ever put in the store. The scheduler lost
mid-run fails the calls in flight, and every later call of the run, with one line; a scheduler
that cannot be reached is tried once per run (executors._cached). `tls://host:port` connects with
Dask's TLS security from its config (distributed.comm.tls.*; cluster/tls/make-certs.sh).
"""
from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import CancelledError
from pathlib import Path

from qnn_tasks.errors import SpecError, ToolchainError
from qnn_tasks.run import console
from qnn_tasks.run.calls import StageCall
from qnn_tasks.run.executors import remote
from qnn_tasks.run.outcome import Outcome

CONNECT_TIMEOUT_S = 20  # when Dask's config does not set distributed.comm.timeouts.connect (Dask's own default: 30 s)


def connect_timeout_s() -> float:
    """Seconds to wait for the scheduler: Dask's `distributed.comm.timeouts.connect` where the user's Dask config sets
    it (DASK_CONFIG's yaml or DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT), else CONNECT_TIMEOUT_S. A value equal to
    Dask's shipped default (30 s) cannot be told from no setting, so it counts as none."""
    import dask.config
    import distributed  # noqa: F401  (registers distributed's own defaults with dask.config)
    from dask.utils import parse_timedelta

    key = "distributed.comm.timeouts.connect"
    configured = dask.config.get(key, None)
    if configured is None or configured == dask.config.get(key, None, config=dask.config.merge(*dask.config.defaults)):
        return float(CONNECT_TIMEOUT_S)
    return float(parse_timedelta(configured, default="seconds"))


def _security(address: str):
    """For a tls:// scheduler: Dask's Security from its config (distributed.comm.tls.*), which must name our cert."""
    if not address.startswith("tls://"):
        return None
    from distributed.security import Security

    security = Security()  # DASK_CONFIG's yaml or DASK_DISTRIBUTED__COMM__TLS__* variables
    if not (security.tls_ca_file and security.tls_client_cert):
        raise ToolchainError(f"{address}: a tls:// scheduler needs the cluster's CA and this client's certificate, "
                             f"and Dask's config names neither (fix: DASK_CONFIG=<the folder cluster/tls/make-certs.sh "
                             f"wrote>, or set distributed.comm.tls.ca-file and distributed.comm.tls.client.cert/key)")
    return security


class DaskExecutor:
    name = "dask"

    def __init__(self, address: str, root: str, cache) -> None:
        if cache is None:
            raise SpecError("$QNN_EXECUTOR", "", f"{address}: Dask workers need a cache store they can reach to "
                            "receive inputs and return outputs", "set QNN_CACHE to a shared folder or an s3:// / gs:// URL")
        try:
            from distributed import Client
        except ImportError:
            raise ToolchainError("the Dask executor needs dask[distributed] (fix: pip install 'dask[distributed]')") from None
        self.address = address.replace("dask://", "tcp://", 1)
        self.root = root
        self.cache = cache
        security = _security(self.address)
        try:
            self.client = Client(self.address, timeout=connect_timeout_s(), set_as_default=False, security=security)
        except (OSError, TimeoutError) as err:
            raise ToolchainError(f"cannot reach the Dask scheduler at {self.address}: {err} (fix: start it with "
                                 f"`dask scheduler`, or check QNN_EXECUTOR"
                                 + (" and that the scheduler trusts this client's certificate" if security else "")
                                 + ")") from None
        self._checked: dict[str, list[str]] = {}   # toolchain fingerprint json -> workers that match
        self._lock = threading.Lock()
        self._futures: set = set()
        self.lost: str | None = None  # the one line once the scheduler went away mid-run
        self.stopped = False

    def _workers_for(self, call: StageCall) -> list[str]:
        """Workers whose code and toolchain equal this client's; the others are refused once, with one line."""
        expected = remote.expectation(call)
        key = expected["fingerprint_json"]
        with self._lock:
            if key not in self._checked:
                reports = self.client.run(remote.worker_versions, call.toolchain)
                good, refused = [], []
                for worker, report in sorted(reports.items()):
                    problem = remote.mismatch(expected, report)
                    (refused if problem else good).append((worker, problem))
                for worker, problem in refused:
                    console.note(f"refusing Dask worker {worker}: {problem}")
                if not good:
                    raise ToolchainError(f"no Dask worker at {self.address} matches this client "
                                         f"({'; '.join(p for _, p in refused) or 'no workers connected'})")
                self._checked[key] = [w for w, _ in good]
            return self._checked[key]

    def run(self, call: StageCall, sink) -> Outcome:
        from qnn_tasks.run.cache import action_key

        if self.lost:
            raise ToolchainError(self.lost)  # once per run: every later call fails at once, not after a timeout
        workers = self._workers_for(call)
        key = action_key(call.stage, call.key, call.out_dir, call.inputs)
        inputs = {name: self.cache.upload(name) for name in sorted(set(call.inputs))}
        future = self.client.submit(remote.run_remote, call.to_json(), inputs, self.cache.url, key,
                                    remote.expectation(call), key=f"{call.stage}-{call.target}-{uuid.uuid4().hex[:8]}",
                                    workers=workers, allow_other_workers=False, pure=False)
        with self._lock:
            self._futures.add(future)
        try:
            shipped = future.result()
        except CancelledError as err:
            if self.stopped:
                raise KeyboardInterrupt from None
            raise self._lost(getattr(err, "reason", None) or "cancelled") from None
        except (OSError, TimeoutError) as err:  # the comm to the scheduler broke under the call
            if self.stopped:
                raise KeyboardInterrupt from None
            raise self._lost(f"{type(err).__name__}: {err}") from None
        finally:
            with self._lock:
                self._futures.discard(future)
        try:
            outcome = Outcome.from_dict(shipped)
        except ValueError as err:
            raise ToolchainError(f"{call.stage}:{call.target}: the Dask worker's answer is not this version's "
                                 f"({err}) (fix: install the same qnn-npu-compile on every worker)") from None
        if not outcome.ok:
            return outcome
        manifest = self.cache.lookup(key)
        if manifest is None or not self.cache.restore(manifest, Path(call.out_dir)):
            raise ToolchainError(f"{call.stage}:{call.target}: the worker stored its outputs under {key[:12]} in "
                                 f"{self.cache.url}, but they cannot be restored here")
        record = {k: v for k, v in manifest["record"].items()
                  if k not in ("stage", "target", "status", "seconds", "files", "executor")}
        return Outcome.success(record, executor=outcome.executor, stored=True)

    def _lost(self, reason: str) -> ToolchainError:
        """The scheduler went away under a call: say so once, in one line, and fail every later call with it."""
        reason = reason.replace("scheduler-connection-lost", "the connection was lost")
        self.lost = (f"lost the Dask scheduler at {self.address} ({reason}); the calls sent to it failed and none "
                     f"was kept (fix: restart `dask scheduler` and its workers, or unset QNN_EXECUTOR to build "
                     f"here; then run doit again)")
        # the line above says it: not Dask's own 'failed to reconnect' error (and traceback) 20 s later
        logging.getLogger("distributed.client").setLevel(logging.CRITICAL)
        return ToolchainError(self.lost)

    def stop(self) -> None:
        """Ctrl-C: cancel the calls in flight (their workers drop them; nothing was stored)."""
        self.stopped = True
        with self._lock:
            futures = list(self._futures)
        for future in futures:
            future.cancel()
        try:
            self.client.close(timeout=2)
        except Exception:  # closing on the way out must not hide the interrupt
            pass
