"""The one failure funnel every stage goes through, whatever executor runs it (on-demand ones too: only a row
that names why it writes its own records, `own_record` in plan/rows.py, runs beside it, in tasks/ondemand.py).

In order: the tree lock must be ours; the old record is removed (a record never outlives the run
that made it, interrupted or not; removing needs no disk space, so it is first); the previous
report is marked superseded (run/reportmark.py; not by a stage whose row says its run cannot change
the verdict, e.g. socscheck); leftovers of killed runs in the stage's folder are
swept; a cache hit restores the outputs byte-identically; otherwise the executor runs the call.
Every record says what it was made from (`made_from`: the key's labelled settings, code version,
toolchain, and each file read with its digest; plan/freshness.py compares it with today's spec).
A success writes the record last, naming the size and digest of each output it vouches for, and
puts the outputs in the cache; a failure writes a failed record and comes back as one line. A write
the machine refuses anywhere here (ENOSPC, EDQUOT, EROFS, EIO) leaves no record and one line.
Nothing here knows doit: tasks/project.py turns the returned line into a task failure.
"""
from __future__ import annotations

import datetime as _dt
import os
import time
from pathlib import Path
from typing import Any

from qnn_tasks.errors import MachineError, QnnTasksError, machine_failure
from qnn_tasks.run import console, executors, interrupts, records, reportmark, treelock
from qnn_tasks.run.calls import StageCall
from qnn_tasks.run.outcome import Outcome
from qnn_tasks.run.status import Status


def run(call: StageCall, base: dict[str, Any], root: str, cache=None) -> str | None:
    """Run one stage call end to end; None on success, else the one line to show."""
    task = f"{call.stage}:{call.target}" if call.target else call.stage  # a project-wide stage: one task
    if not treelock.owned():
        return f"{task}: this doit does not hold the build tree's lock; no record written"
    try:
        return _run(call, base, root, cache, task)
    except (OSError, MachineError) as err:  # a full disk, a quota, a read-only tree, an I/O error: at any write
        return _machine_failed(call, err, task)


def _run(call: StageCall, base: dict[str, Any], root: str, cache, task: str) -> str | None:
    start = time.perf_counter()
    out_dir = Path(call.out_dir)
    try:
        Path(call.record).unlink(missing_ok=True)  # first, needing no space: the old verdict goes before anything fails
    finally:
        if call.marks_report:  # the last report is not this run's verdict until this run writes its own
            reportmark.supersede(root)
    treelock.sweep(out_dir)
    interrupts.running(task, call.out_dir)
    record: dict[str, Any] = {"stage": call.stage, "target": call.target, **base}
    made = record.get("made_from")
    if isinstance(made, dict) and isinstance(made.get("inputs"), list):  # the files it reads, as they are now
        record["made_from"] = {**made, "inputs": records.digests(made["inputs"])}
    if cache is not None and cache.offline:  # it stopped answering earlier in this run (said then)
        cache = None
    try:
        cache_key = _restore(call, record, cache, start, task) if cache else None
        if cache_key is None and record.get("from_cache"):
            return None
        outcome = executors.for_call(call, root, cache).run(call, console.progress_sink(task))
    except KeyboardInterrupt:
        Path(call.record).unlink(missing_ok=True)
        treelock.sweep(out_dir)
        raise
    except QnnTasksError as err:
        outcome = Outcome.failure(str(err), getattr(err, "record", None))
    finally:
        interrupts.running(None)
    record.update(outcome.record)
    record["executor"] = outcome.executor
    seconds = round(time.perf_counter() - start, 3)
    if not outcome.ok:
        return _failed(call, record, outcome, seconds, task)
    missing = [p for p in call.outputs if not os.path.isfile(p)]
    if missing:
        return _failed(call, record, Outcome.failure(f"the stage finished but wrote no {', '.join(missing)}"),
                       seconds, task)
    beside = records.beside(record.pop("also_wrote", None), call.outputs)  # e.g. a > 2 GB model's weights file
    verdict = Status.REJECTED if record.get("rejected") else Status.WARNING if record.get("warnings") else Status.PASSED
    record.update(status=verdict, seconds=seconds, files=records.vouch(call.outputs + beside))
    records.write(call.record, record)
    if cache is not None and cache_key and not outcome.stored and cache.writable:
        from qnn_tasks.run.cache import StoreUnreachable

        try:  # a full, read-only or unreachable store costs the cache entry, not the build: said once per run
            cache.put(cache_key, call.stage, call.target, out_dir, record, record_file=call.record)
        except StoreUnreachable as err:
            cache.go_offline(err)
        except OSError as err:
            cache.write_failed(err)
    console.finished(task, record)
    return None


def _machine_failed(call: StageCall, err: OSError | MachineError, task: str) -> str:
    """A write refused mid-stage: no record is left that could vouch for anything (best effort), one line."""
    try:
        Path(call.record).unlink(missing_ok=True)
    except OSError:
        pass  # read-only: the record was removed before, or the stage never got as far as removing it
    treelock.sweep(Path(call.out_dir))
    line = str(err) if isinstance(err, MachineError) else (machine_failure(err) or
                                                         f"{err.filename or call.out_dir}: {err.strerror or err}")
    return f"{task}: {line}"


def _restore(call: StageCall, record: dict[str, Any], cache, start: float, task: str) -> str | None:
    """Restore the call's outputs from the cache if it has them; return the action key (None after a hit).

    An entry the store cannot give (unreachable, a manifest of the wrong shape, a file name outside
    the stage's folder) is a miss, said in one line: the stage is built as if the cache were empty.
    """
    from qnn_tasks.run.cache import BadEntry, StoreUnreachable, action_key

    key = action_key(call.stage, call.key, call.out_dir, call.inputs)
    try:
        manifest = cache.lookup(key)
        if manifest is None or not cache.restore(manifest, Path(call.out_dir)):
            return key
    except StoreUnreachable as err:
        cache.go_offline(err)
        return None
    except BadEntry as err:
        console.note(f"{task}: cache entry not used: {err}: refused, the stage is built instead (fix: check who can "
                     f"write to the store; `doit cache:gc` drops entries of the wrong shape)")
        return key
    cached = dict(manifest["record"])
    cached["from_cache"] = {"store": cache.url, "key": key, "built_at": manifest.get("built_at"),
                            "built_by": manifest.get("built_by"), "executor": cached.get("executor"),
                            "restored_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                            "restore_seconds": round(time.perf_counter() - start, 3)}
    records.write(call.record, cached)
    record.clear()
    record.update(cached)
    console.finished(task, cached)
    return None


def _failed(call: StageCall, record: dict[str, Any], outcome: Outcome, seconds: float, task: str) -> str:
    record.update(status=Status.FAILED, error=outcome.error, seconds=seconds)
    record.pop("files", None)
    if outcome.traceback:
        log = Path(call.out_dir) / f"{call.stage}-error.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(outcome.traceback)
        record["error_log"] = str(log)
    records.write(call.record, record)
    suffix = f" (traceback: {record['error_log']})" if record.get("error_log") else ""
    return f"{task}: {outcome.error}{suffix}"
