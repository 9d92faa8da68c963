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
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

from qnn_tasks.errors import SpecError
from qnn_tasks.fileio import _finite

ENV = "QNN_CACHE"
SCHEMA = "qnn-npu-compile/cache/v1"


def configured(profile_cache: str | None = None) -> "Store | None":
    """The store named by $QNN_CACHE, else the toolchain profile's `cache:`; None when neither is set."""
    url = os.environ.get(ENV) or profile_cache
    return Store(url) if url else None


class Store:
    def __init__(self, url: str) -> None:
        import fsspec

        if "://" not in url:
            url = Path(url).expanduser().resolve().as_uri()
        self.url = url
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as err:
            raise SpecError(f"${ENV}", "", f"cannot open cache store '{url}': {err}",
                            "use a folder, file://, or an fsspec URL whose backend is installed (e.g. s3fs for s3://)")
        self.root = self.root.rstrip("/")

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
        if not self.fs.exists(self.blob(sha)):
            self._publish(lambda tmp: self.fs.put_file(str(path), tmp), self.blob(sha))
        return sha

    def download(self, sha: str, dest: Path) -> None:
        """Fetch a blob to `dest` (atomically), checking its digest; a corrupted blob is dropped and an error raised."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
        try:
            self.fs.get_file(self.blob(sha), str(tmp))
            if sha256(tmp) != sha:
                self.fs.rm(self.blob(sha))
                raise OSError(f"blob {sha[:12]} in {self.url} is corrupted (dropped from the store)")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    # ------------------------------------------------------------ entries
    def lookup(self, key: str) -> dict[str, Any] | None:
        try:
            with self.fs.open(self.manifest(key), "rb") as fh:
                manifest = json.loads(fh.read())
        except (FileNotFoundError, ValueError, OSError):
            return None
        return manifest if manifest.get("schema") == SCHEMA else None

    def put(self, key: str, stage: str, target: str, out_dir: Path, record: dict[str, Any],
            root: Path = Path(".")) -> dict[str, Any]:
        """Store every file of the stage's folder (not the record itself) and the record under `key`.

        `out_dir` is project-relative; files are read under `root` (a worker's scratch copy of the project).
        """
        files = {}
        for path in stage_files(root / out_dir, record_name=f"{stage}.json"):
            files[os.path.relpath(path, root)] = {"sha256": self.upload(path), "size": path.stat().st_size}
        manifest = {"schema": SCHEMA, "key": key, "stage": stage, "target": target, "files": files,
                    "record": record, "built_at": _now(), "built_by": socket.gethostname()}
        data = json.dumps(_finite(manifest), allow_nan=False, default=str).encode()

        def write(tmp: str) -> None:
            with self.fs.open(tmp, "wb") as fh:
                fh.write(data)

        self._publish(write, self.manifest(key))
        return manifest

    def restore(self, manifest: dict[str, Any], out_dir: Path, root: Path = Path(".")) -> bool:
        """Bring the entry's files into place byte-identical; False (and the bad blob dropped) on any mismatch."""
        staging = root / out_dir / f".cache-restore-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            fetched = []
            for index, (name, facts) in enumerate(sorted(manifest["files"].items())):
                local = staging / str(index)
                try:
                    self.fs.get_file(self.blob(facts["sha256"]), str(local))
                except (FileNotFoundError, OSError):
                    return False
                if sha256(local) != facts["sha256"]:
                    self._drop(facts["sha256"], manifest["key"])
                    return False
                fetched.append((local, root / name))
            for local, final in fetched:
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(local, final)
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
        found = []
        for path in self.fs.glob(f"{self.root}/ac/*/*.json"):
            try:
                with self.fs.open(path, "rb") as fh:
                    manifest = json.loads(fh.read())
                found.append({**manifest, "_path": path})
            except (ValueError, OSError):
                continue
        return found

    def stats(self) -> dict[str, Any]:
        entries = self.entries()
        blobs = self.fs.glob(f"{self.root}/cas/*/*")
        sizes = [self.fs.size(b) for b in blobs]
        by_stage: dict[str, int] = {}
        for e in entries:
            by_stage[e.get("stage", "?")] = by_stage.get(e.get("stage", "?"), 0) + 1
        built = sorted(e.get("built_at", "") for e in entries)
        return {"store": self.url, "entries": len(entries), "by_stage": dict(sorted(by_stage.items())),
                "blobs": len(blobs), "bytes": int(sum(sizes)), "oldest": built[0] if built else None,
                "newest": built[-1] if built else None}

    def gc(self, keep_days: float) -> dict[str, int]:
        """Drop entries built more than `keep_days` ago, then every blob no remaining entry names."""
        cutoff = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(days=keep_days)
        kept, dropped = [], 0
        for entry in self.entries():
            try:
                built = _dt.datetime.fromisoformat(entry.get("built_at", ""))
            except ValueError:
                built = None
            if built is None or built < cutoff:
                self.fs.rm(entry["_path"])
                dropped += 1
            else:
                kept.append(entry)
        live = {f["sha256"] for e in kept for f in e.get("files", {}).values()}
        freed = removed = 0
        for blob in self.fs.glob(f"{self.root}/cas/*/*"):
            if blob.rsplit("/", 1)[-1] not in live:
                freed += self.fs.size(blob)
                self.fs.rm(blob)
                removed += 1
        return {"entries_dropped": dropped, "entries_kept": len(kept), "blobs_removed": removed, "bytes_freed": freed}


def action_key(stage: str, key: str, out_dir: str, inputs: list[str]) -> str:
    """The cache key: the stage's key and folder (the target) plus the content of every input file."""
    digests = {name: sha256(name) for name in sorted(set(inputs))}
    text = json.dumps({"stage": stage, "key": key, "out_dir": out_dir, "inputs": digests}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def stage_files(out_dir: Path, record_name: str) -> list[Path]:
    """Every file the stage left in its folder, except its record and hidden work files."""
    found = []
    for dirpath, dirnames, filenames in os.walk(out_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.startswith(".") or name.endswith(".part") or path == out_dir / record_name:
                continue
            found.append(path)
    return found


def sha256(path: Path | str) -> str:
    from qnn_tasks.run.records import sha256 as digest

    return digest(path)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
