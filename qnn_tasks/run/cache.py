"""A shared, content-addressed artifact cache on any fsspec store (a folder, file://, s3://, gs://, ...).

Shaped like Bazel's remote cache: an *action key* (the stage's key — settings, code version,
toolchain fingerprint, SoC row — plus the content digest of every input file) names a small
manifest; the manifest lists the stage's output files by SHA-256, stored once as blobs:

    <store>/cas/<sha[:2]>/<sha>            file contents
    <store>/ac/<key[:2]>/<key>.json        {stage, target, files: {path: {sha256, size}}, record, built_at, built_by}

Writes go to a temporary name first and are then moved into place, blobs before the manifest, so a
reader never sees a partial entry and concurrent writers of one key are harmless (same bytes).
A restore checks every blob's digest: a corrupted blob is removed from the store and the stage is
rebuilt, never restored. Failed stages are not cached.

Whatever is read from the store is untrusted (anyone who can write to a shared bucket wrote it): a
manifest of the wrong shape, or one naming a file outside the stage's folder (`..`, an absolute
path, a symlink on the way), is refused with one line and counts as a miss; `gc` drops such
entries (the checks: run/cacheentry.py). A store that cannot be reached costs the cache, never the build: one line, and the run
goes on without it. Only what a stage vouches for (its record's `files`) and the files its record
names (logs, plots) are stored, never a user's own file that sits in the stage's folder.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import hashlib
import json
import os
import shutil
import socket
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

from qnn_tasks.errors import QnnTasksError, SpecError
from qnn_tasks.fileio import finite
from qnn_tasks.run import console
from qnn_tasks.run.cacheentry import (
    MANIFEST_LIMIT,
    SCHEMA,
    SHA256,
    parse_manifest,
    stage_files,
    symlink_on_the_way,
    unsafe_name,
)

__all__ = ["SCHEMA", "BadEntry", "Store", "StoreUnreachable", "action_key", "configured", "for_build",
           "parse_manifest", "stage_files", "unsafe_name"]

ENV = "QNN_CACHE"
# errno values that mean "the store is not there" (a refused, reset or timed-out connection, no route)
_CONNECTION_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH,
                      errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN, errno.EPIPE}


class StoreUnreachable(QnnTasksError):
    """The store cannot be reached (connection refused, reset, timed out, name unknown): a run goes on without it."""

    @classmethod
    def of(cls, url: str, err: BaseException, source: str = f"${ENV}") -> "StoreUnreachable":
        return cls(f"{source}: cache store {url} is unreachable ({type(err).__name__}: {err})")  # picklable (Dask)

    def offline_line(self) -> str:
        return (f"{self}: building without the cache in this run (fix: check the store's address and the network, "
                f"or unset {ENV})")


class BadEntry(QnnTasksError):
    """A manifest that cannot be used (wrong shape, unsafe file names): refused, counted as a miss."""


def configured(profile_cache: str | None = None, profile_file: object = "toolchain profile") -> "Store | None":
    """The store named by $QNN_CACHE, else the toolchain profile's `cache:`; None when neither is set.

    Raises StoreUnreachable when a store's backend connects on opening (ftp://, sftp://) and cannot.
    """
    url = os.environ.get(ENV) or profile_cache
    return Store(url, f"${ENV}" if os.environ.get(ENV) else f"{profile_file}: cache") if url else None


def for_build(profile_cache: str | None = None, profile_file: object = "toolchain profile") -> "Store | None":
    """The store a build uses: as `configured`, but an unreachable one is said in one line and the build goes on."""
    try:
        return configured(profile_cache, profile_file)
    except StoreUnreachable as err:
        console.note(err.offline_line())
        return None


def _is_connection_error(err: BaseException | None) -> bool:
    """A refused, reset or timed-out connection or an unknown host, whichever library raised it.

    Builtin socket errors, or the backends' own (requests, urllib3, aiohttp and botocore name theirs
    `*Connection*`, `*Connect*`, `*Timeout*`), also as the cause of what the backend raised.
    """
    for _ in range(8):  # the chain of causes, bounded
        if err is None:
            return False
        if (isinstance(err, (ConnectionError, TimeoutError, EOFError, socket.gaierror, socket.herror))
                or (isinstance(err, OSError) and err.errno in _CONNECTION_ERRNOS)
                or any("Connect" in cls.__name__ or "Timeout" in cls.__name__ for cls in type(err).__mro__)):
            return True
        err = err.__cause__ or err.__context__
    return False


class Store:
    def __init__(self, url: str, source: str = f"${ENV}") -> None:
        import fsspec

        if "://" not in url:
            url = Path(url).expanduser().resolve().as_uri()
        self.url = url
        self.source = source
        self.offline = False            # set once the store stopped answering in this run
        self._write_failed = False      # set once a put failed in this run: said once, then no more puts
        self._lock = threading.Lock()
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as err:
            raise SpecError(f"${ENV}", "", f"cannot open cache store '{url}': {err}",
                            "use a folder, file://, or an fsspec URL whose backend is installed (e.g. s3fs for s3://)")
        except Exception as err:  # a backend that connects on opening (ftp, sftp): whatever it raises means "not there"
            raise StoreUnreachable.of(url, err, source) from None
        self.root = self.root.rstrip("/")

    # ------------------------------------------------------------ reaching it
    @contextlib.contextmanager
    def _reaching(self) -> Iterator[None]:
        """Turn a backend's connection failure into StoreUnreachable; other errors pass through."""
        try:
            yield
        except Exception as err:  # backends raise their own types (botocore's are no OSError)
            if _is_connection_error(err):
                raise StoreUnreachable.of(self.url, err, self.source) from None
            raise

    def go_offline(self, err: StoreUnreachable) -> None:
        """Stop using the store for the rest of this run, saying so once."""
        with self._lock:
            said, self.offline = self.offline, True
        if not said:
            console.note(err.offline_line())

    @property
    def writable(self) -> bool:
        return not self.offline and not self._write_failed

    def write_failed(self, err: OSError) -> None:
        """A put failed (a read-only or full store): say it once, and put nothing more in this run."""
        with self._lock:
            said, self._write_failed = self._write_failed, True
        if not said:
            kind = "is read-only here" if isinstance(err, PermissionError) or err.errno == errno.EROFS else "cannot store"
            console.note(f"{self.source}: cache store {self.url} {kind} ({type(err).__name__}: {err}): this run's "
                         f"results are not cached, builds go on (fix: give this user write access to the store, or "
                         f"free space in it)")

    def _where(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    # ------------------------------------------------------------ layout
    def blob(self, sha: str) -> str:
        return f"{self.root}/cas/{sha[:2]}/{sha}"

    def manifest(self, key: str) -> str:
        return f"{self.root}/ac/{key[:2]}/{key}.json"

    def _publish(self, write_tmp, final: str) -> None:
        """Write to a temporary name beside `final` with `write_tmp(tmp)`, then move it into place."""
        tmp = f"{final}.tmp-{uuid.uuid4().hex}"
        self.fs.makedirs(final.rsplit("/", 1)[0], exist_ok=True)
        try:
            write_tmp(tmp)
            self.fs.mv(tmp, final)
        finally:
            if self.fs.exists(tmp):
                self.fs.rm(tmp)

    # ------------------------------------------------------------ blobs
    def upload(self, path: Path | str) -> str:
        """Put one file's content in the store (once); return its digest."""
        sha = sha256(path)
        with self._reaching():
            if not self.fs.exists(self.blob(sha)):
                self._publish(lambda tmp: self.fs.put_file(str(path), tmp), self.blob(sha))
        return sha

    def download(self, sha: str, dest: Path) -> None:
        """Fetch a blob to `dest` (atomically), checking its digest; a corrupted blob is dropped and an error raised."""
        if not SHA256.fullmatch(str(sha)):
            raise OSError(f"'{sha}' is not a SHA-256 digest")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
        try:
            with self._reaching():
                self.fs.get_file(self.blob(sha), str(tmp))
                if sha256(tmp) != sha:
                    self.fs.rm(self.blob(sha))
                    raise OSError(f"blob {sha[:12]} in {self.url} is corrupted (dropped from the store)")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------ entries
    def lookup(self, key: str) -> dict[str, Any] | None:
        """The entry under `key`: None when there is none (or it is another version's); BadEntry when it is unusable."""
        path = self.manifest(key)
        try:
            with self._reaching(), self.fs.open(path, "rb") as fh:
                data = fh.read(MANIFEST_LIMIT + 1)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as err:
            raise BadEntry(f"{self._where(path)}: cannot be read ({type(err).__name__}: {err})") from None
        manifest, problem = parse_manifest(data, key)
        if problem:
            raise BadEntry(f"{self._where(path)}: {problem}")
        return manifest

    def put(self, key: str, stage: str, target: str, out_dir: Path, record: dict[str, Any],
            root: Path = Path("."), record_file: str | None = None) -> dict[str, Any]:
        """Store what the stage vouches for and the files its record names (not the record itself) under `key`.

        `out_dir` is project-relative; files are read under `root` (a worker's scratch copy of the project);
        `record_file` is the record's own path (the call's, as the plan names it): never stored as a file.
        """
        files = {}
        record_name = Path(record_file).name if record_file else ""
        for name in stage_files(root, out_dir, record, record_name=record_name):
            files[name] = {"sha256": self.upload(root / name), "size": (root / name).stat().st_size}
        manifest = {"schema": SCHEMA, "key": key, "stage": stage, "target": target, "files": files,
                    "record": record, "built_at": _now(), "built_by": socket.gethostname()}
        data = json.dumps(finite(manifest), allow_nan=False, default=str).encode()

        def write(tmp: str) -> None:
            with self.fs.open(tmp, "wb") as fh:
                fh.write(data)

        with self._reaching():
            self._publish(write, self.manifest(key))
        return manifest

    def restore(self, manifest: dict[str, Any], out_dir: Path, root: Path = Path(".")) -> bool:
        """Bring the entry's files into place byte-identical; False (and the bad blob dropped) on any mismatch.

        Every name must be a plain relative path inside the stage's folder with no symlink on the way;
        otherwise the entry is refused (BadEntry) before anything is fetched or written.
        """
        where = self._where(self.manifest(manifest["key"]))
        for name in manifest["files"]:
            problem = unsafe_name(name, str(out_dir)) or symlink_on_the_way(root, name, str(out_dir))
            if problem:
                raise BadEntry(f"{where}: files: {name[:200]!r} {problem}")
        staging = root / out_dir / f".cache-restore-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            fetched = []
            for index, (name, facts) in enumerate(sorted(manifest["files"].items())):
                local = staging / str(index)
                try:
                    with self._reaching():
                        self.fs.get_file(self.blob(facts["sha256"]), str(local))
                except (FileNotFoundError, OSError):
                    return False
                if sha256(local) != facts["sha256"]:
                    self._drop(facts["sha256"], manifest["key"])
                    return False
                fetched.append((local, root / name))
            try:
                for local, final in fetched:
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(local, final)
            except OSError as err:  # e.g. one name a file, another a folder below it
                raise BadEntry(f"{where}: files: cannot be put in place ({err})") from None
            return True
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _drop(self, sha: str, key: str) -> None:
        for path in (self.blob(sha), self.manifest(key)):
            try:
                self.fs.rm(path)
            except (FileNotFoundError, OSError):
                pass

    # ------------------------------------------------------------ maintenance
    def entries(self) -> list[dict[str, Any]]:
        """Every manifest (with its `_path`); an unusable one as {`_path`, `_problem`} so that gc can drop it."""
        found = []
        with self._reaching():
            paths = self.fs.glob(f"{self.root}/ac/*/*.json")
        for path in paths:
            key = path.rsplit("/", 1)[-1][: -len(".json")]
            try:
                with self._reaching(), self.fs.open(path, "rb") as fh:
                    data = fh.read(MANIFEST_LIMIT + 1)
            except FileNotFoundError:  # dropped meanwhile
                continue
            manifest, problem = parse_manifest(data, key, other_versions=True)
            found.append({"_path": path, "_problem": problem} if problem else {**manifest, "_path": path})
        return found

    def stats(self) -> dict[str, Any]:
        entries = self.entries()
        good = [e for e in entries if "_problem" not in e]
        with self._reaching():
            blobs = self.fs.glob(f"{self.root}/cas/*/*")
            sizes = [self.fs.size(b) for b in blobs]
        by_stage: dict[str, int] = {}
        for e in good:
            by_stage[str(e.get("stage", "?"))] = by_stage.get(str(e.get("stage", "?")), 0) + 1
        built = sorted(str(e.get("built_at", "")) for e in good)
        return {"store": self.url, "entries": len(good), "bad": len(entries) - len(good),
                "by_stage": dict(sorted(by_stage.items())), "blobs": len(blobs), "bytes": int(sum(sizes)),
                "oldest": built[0] if built else None, "newest": built[-1] if built else None}

    def gc(self, keep_days: float) -> dict[str, int]:
        """Drop unusable entries and entries built more than `keep_days` ago, then every blob no remaining entry names."""
        cutoff = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(days=keep_days)
        kept, dropped, bad = [], 0, 0
        for entry in self.entries():
            try:
                built = _dt.datetime.fromisoformat(str(entry.get("built_at", "")))
            except ValueError:
                built = None
            if built is not None and built.tzinfo is None:
                built = built.replace(tzinfo=_dt.timezone.utc)
            if "_problem" in entry or built is None or built < cutoff:
                with self._reaching():
                    self.fs.rm(entry["_path"])
                bad += "_problem" in entry
                dropped += "_problem" not in entry
            else:
                kept.append(entry)
        live = {facts["sha256"] for e in kept for facts in _file_facts(e)}
        freed = removed = 0
        with self._reaching():
            for blob in self.fs.glob(f"{self.root}/cas/*/*"):
                if blob.rsplit("/", 1)[-1] not in live:
                    freed += self.fs.size(blob)
                    self.fs.rm(blob)
                    removed += 1
        return {"entries_dropped": dropped, "entries_bad": bad, "entries_kept": len(kept), "blobs_removed": removed,
                "bytes_freed": freed}


def _file_facts(entry: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The file facts of an entry (an entry of another version may be shaped otherwise: take what looks right)."""
    files = entry.get("files")
    for facts in files.values() if isinstance(files, dict) else ():
        if isinstance(facts, dict) and isinstance(facts.get("sha256"), str):
            yield facts


def action_key(stage: str, key: str, out_dir: str, inputs: list[str]) -> str:
    """The cache key: the stage's key and folder (the target) plus the content of every input file."""
    digests = {name: sha256(name) for name in sorted(set(inputs))}
    text = json.dumps({"stage": stage, "key": key, "out_dir": out_dir, "inputs": digests}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def sha256(path: Path | str) -> str:
    from qnn_tasks.run.records import sha256 as digest

    return digest(path)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
