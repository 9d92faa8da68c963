"""The worker side of the Dask executor: check versions, fetch inputs, run the call, store the outputs.

These functions run inside `dask worker` processes (a worker started with the same install:
`PYTHONPATH` or `pip install` of this project). Each call runs in a scratch folder laid out like
the project (inside the worker's Dask directory), through a persistent child process
(executors/local.Child), as on the client.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from qnn_tasks.run.calls import StageCall
from qnn_tasks.run.outcome import Outcome
from qnn_tasks.run.status import Status

PACKAGE = Path(__file__).resolve().parents[2]  # qnn_tasks/


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A digest of every module of this qnn_tasks install: client and workers must agree on it."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _fingerprint(profile: dict[str, Any] | None) -> str:
    if not profile:
        return ""
    from qnn_tasks.toolchains import calltoolchain

    call = StageCall(stage="", target="", args={}, inputs=[], out_dir="", outputs=[], record="", key="",
                     toolchain=profile)
    return json.dumps(calltoolchain.toolchain(call).fingerprint(), sort_keys=True)


def expectation(call: StageCall) -> dict[str, Any]:
    """What a worker must match to run this call (computed on the client)."""
    return {"code": code_version(), "fingerprint_json": _fingerprint(call.toolchain),
            "toolchain": (call.toolchain or {}).get("name")}


def worker_versions(profile: dict[str, Any] | None) -> dict[str, Any]:
    """Run on every worker (Client.run): its code version and its fingerprint of the call's toolchain."""
    try:
        fingerprint = _fingerprint(profile)
    except Exception as err:  # a worker without the toolchain must say so, not crash the survey
        fingerprint = f"unavailable: {type(err).__name__}: {err}"
    return {"code": code_version(), "fingerprint_json": fingerprint, "host": socket.gethostname()}


def mismatch(expected: dict[str, Any], report: dict[str, Any]) -> str | None:
    """Why a worker may not run the call (None: it may)."""
    if report.get("code") != expected["code"]:
        return (f"its qnn-npu-compile code version {report.get('code')} is not the client's {expected['code']} "
                f"(install the same version on every worker)")
    if report.get("fingerprint_json") != expected["fingerprint_json"]:
        return (f"its toolchain '{expected.get('toolchain')}' is {_short(report.get('fingerprint_json'))}, the client's "
                f"is {_short(expected['fingerprint_json'])} (never mix SDK versions: install the same toolchain)")
    return None


def _short(fingerprint_json: str | None) -> str:
    try:
        data = json.loads(fingerprint_json or "")
    except ValueError:
        return str(fingerprint_json)
    return ", ".join(f"{k} {v}" for k, v in data.items() if k not in ("options", "kind")) or "empty"


_POOL: list[Any] = []


def _pool():
    from qnn_tasks.run.executors.local import Child

    if not _POOL:
        _POOL.append(Child(root=tempfile.gettempdir()))
    return _POOL[0]


def run_remote(call_json: str, inputs: dict[str, str], store_url: str, key: str,
               expected: dict[str, Any]) -> dict[str, Any]:
    """Run one call on this worker; outputs and record go to the store under `key`. Dask pickles the result back
    to the client: a plain dict (Outcome.to_dict)."""
    return _run_remote(StageCall.from_json(call_json), inputs, store_url, key, expected).to_dict()


def _run_remote(call: StageCall, inputs: dict[str, str], store_url: str, key: str,
                expected: dict[str, Any]) -> Outcome:
    from distributed import get_worker

    from qnn_tasks.run import records
    from qnn_tasks.run.cache import Store
    from qnn_tasks.run.cacheentry import unsafe_name

    here = get_worker()
    worker = here.address
    executor = {"kind": "dask", "worker": worker, "host": socket.gethostname(), "pid": os.getpid()}
    problem = mismatch(expected, worker_versions(call.toolchain))
    if problem:
        return Outcome.failure(f"refused by Dask worker {worker}: {problem}", executor=executor)
    store = Store(store_url)
    # in the worker's own Dask directory: if the worker is killed mid-call, the next worker started on that
    # --local-directory purges it with the dead worker's folder (a folder in /tmp would stay forever)
    scratch = Path(tempfile.mkdtemp(prefix="qnn-dask-", dir=here.local_directory))
    try:
        for name, sha in inputs.items():
            if unsafe_name(name, "", hidden_ok=True):  # a plain project-relative name, or it could land anywhere
                return Outcome.failure(f"input {name} lies outside the project: not shippable to a worker",
                                       executor=executor)
            store.download(sha, scratch / name)
        outcome = _pool().run(call, None, cwd=str(scratch)).ran_on(executor)
        if not outcome.ok:
            return outcome
        missing = [p for p in call.outputs if not (scratch / p).is_file()]
        if missing:
            return Outcome.failure(f"the stage finished but wrote no {', '.join(missing)}", executor=executor)
        record = {"stage": call.stage, "target": call.target, **outcome.record, "executor": executor,
                  "status": Status.WARNING if outcome.record.get("warnings") else Status.PASSED,
                  "files": records.vouch(call.outputs, scratch)}
        try:
            store.put(key, call.stage, call.target, Path(call.out_dir), json.loads(json.dumps(record, default=str)),
                      root=scratch, record_file=call.record)
        except OSError as err:  # the client restores from the store: without the entry, the call did not happen
            return Outcome.failure(f"Dask worker {worker} could not store its outputs in {store_url}: {err}",
                                   executor=executor)
        return outcome
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
