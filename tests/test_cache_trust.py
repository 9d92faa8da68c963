"""A shared cache a team can trust: what is read from a store is untrusted, and a store that is gone costs only itself.

Real stores only (folders, and an ftp:// URL whose port refuses the connection), real doit runs on
copies of the session's built examples. Entries are crafted the way anyone with write access to a
shared bucket could: valid blobs, a manifest that names files outside the stage's folder, manifests
of the wrong shape.
"""
from __future__ import annotations

import io
import json
import shutil
import socket
from pathlib import Path

import pytest
from conftest import Project, copy_project

from qnn_tasks.run import console, records
from qnn_tasks.run.cache import SCHEMA, BadEntry, Store, StoreUnreachable, for_build, stage_files

STAGE = "build/m/g/export"  # a stage folder of a made-up project (unit tests)


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on: connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_manifest(store: Path, key: str, data: bytes) -> Path:
    path = store / "ac" / key[:2] / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def add_blob(store: Path, content: bytes) -> str:
    """A blob with its correct digest, as the store's own upload writes it."""
    import hashlib

    sha = hashlib.sha256(content).hexdigest()
    path = store / "cas" / sha[:2] / sha
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return sha


def entry(key: str, files: dict, record: dict | None = None) -> dict:
    return {"schema": SCHEMA, "key": key, "stage": "export", "target": "g", "files": files,
            "record": record if record is not None else {"stage": "export", "target": "g", "status": "passed"},
            "built_at": "2026-12-01T08:00:00+00:00", "built_by": "somewhere"}


KEY = "ab" * 32


# ------------------------------------------------------------------ item 1: nothing is written outside the stage folder

UP = "../" * 30  # more than enough to climb from any tmp folder to /


@pytest.mark.parametrize("name", [
    UP + "{outside}/owned.txt",                       # the probe: relative to the project, climbing out
    "/{outside}/owned.txt",                            # absolute
    f"{STAGE}/{UP}{{outside}}/owned.txt",             # starts in the stage folder, climbs out
    "build/m/g/simplify/owned.txt",                    # inside the project, but another stage's folder
    f"{STAGE}//owned.txt", f"{STAGE}/./owned.txt",     # odd parts
    f"{STAGE}/.owned.txt",                             # hidden (where the restore stages its files)
    f"{STAGE}\\..\\owned.txt",                        # a backslash
])
def test_restore_refuses_a_name_outside_the_stage_folder_and_writes_nothing(tmp_path, name):
    project, store_dir, outside = tmp_path / "project", tmp_path / "store", tmp_path / "outside"
    project.mkdir()
    outside.mkdir()
    name = name.format(outside=str(outside).lstrip("/"))
    legit = f"{STAGE}/g.onnx"
    files = {legit: {"sha256": add_blob(store_dir, b"onnx"), "size": 4},
             name: {"sha256": add_blob(store_dir, b"owned"), "size": 5}}
    write_manifest(store_dir, KEY, json.dumps(entry(KEY, files)).encode())
    store = Store(str(store_dir))
    with pytest.raises(BadEntry) as err:  # by its shape (any entry), or on restore (this stage's folder)
        store.restore(store.lookup(KEY), Path(STAGE), root=project)
    line = str(err.value)
    assert "\n" not in line and f"ac/ab/{KEY}.json: files: {name!r} " in line, line
    assert not (outside / "owned.txt").exists() and not list(tmp_path.rglob("owned.txt"))
    assert not (project / legit).exists()  # refused as a whole: nothing of it is put in place
    assert not list(project.rglob(".cache-restore*"))


def test_restore_refuses_a_symlink_in_the_stage_folder(tmp_path):
    project, store_dir, outside = tmp_path / "project", tmp_path / "store", tmp_path / "outside"
    (project / STAGE).mkdir(parents=True)
    outside.mkdir()
    (project / STAGE / "logs").symlink_to(outside)  # e.g. left by a user; writing through it lands outside
    files = {f"{STAGE}/logs/owned.txt": {"sha256": add_blob(store_dir, b"owned"), "size": 5}}
    write_manifest(store_dir, KEY, json.dumps(entry(KEY, files)).encode())
    store = Store(str(store_dir))
    with pytest.raises(BadEntry, match="passes the symlink build/m/g/export/logs"):
        store.restore(store.lookup(KEY), Path(STAGE), root=project)
    assert list(outside.iterdir()) == []


def test_restore_of_a_plain_entry_still_works(tmp_path):
    project, store_dir = tmp_path / "project", tmp_path / "store"
    project.mkdir()
    files = {f"{STAGE}/g.onnx": {"sha256": add_blob(store_dir, b"onnx"), "size": 4},
             f"{STAGE}/sub/export.log": {"sha256": add_blob(store_dir, b"log"), "size": 3}}
    write_manifest(store_dir, KEY, json.dumps(entry(KEY, files)).encode())
    store = Store(str(store_dir))
    assert store.restore(store.lookup(KEY), Path(STAGE), root=project) is True
    assert (project / STAGE / "g.onnx").read_bytes() == b"onnx"
    assert (project / STAGE / "sub" / "export.log").read_bytes() == b"log"


# ------------------------------------------------------------------ item 8: manifests of the wrong shape are a miss

GOOD_SHA = "0" * 64
WRONG_SHAPES = {
    "a list": b"[]",
    "no files": json.dumps({k: v for k, v in entry(KEY, {}).items() if k != "files"}).encode(),
    "files a list": json.dumps(entry(KEY, [f"{STAGE}/g.onnx"])).encode(),  # type: ignore[arg-type]
    "a file without digest": json.dumps(entry(KEY, {f"{STAGE}/g.onnx": {"size": 4}})).encode(),
    "a digest that is a path": json.dumps(entry(KEY, {f"{STAGE}/g.onnx": {"sha256": "../../../etc/passwd",
                                                                           "size": 4}})).encode(),
    "a size that is text": json.dumps(entry(KEY, {f"{STAGE}/g.onnx": {"sha256": GOOD_SHA, "size": "4"}})).encode(),
    "record not an object": json.dumps(entry(KEY, {}, record=[])).encode(),  # type: ignore[arg-type]
    "another key": json.dumps(entry("cd" * 32, {})).encode(),
    "no schema": json.dumps({"files": {}}).encode(),
    "not UTF-8": b'{"schema": "' + SCHEMA.encode() + b'", "files": "\xff\xfe"}',
    "truncated": json.dumps(entry(KEY, {}))[:40].encode(),
}


@pytest.mark.parametrize("shape", sorted(WRONG_SHAPES))
def test_a_manifest_of_the_wrong_shape_is_refused_in_one_line(tmp_path, shape):
    store_dir = tmp_path / "store"
    path = write_manifest(store_dir, KEY, WRONG_SHAPES[shape])
    with pytest.raises(BadEntry) as err:
        Store(str(store_dir)).lookup(KEY)
    line = str(err.value)
    assert "\n" not in line and line.startswith(path.resolve().as_uri()), line


def test_an_entry_of_another_schema_version_is_a_plain_miss(tmp_path):
    store_dir = tmp_path / "store"
    write_manifest(store_dir, KEY, json.dumps({**entry(KEY, {}), "schema": "qnn-npu-compile/cache/v2"}).encode())
    assert Store(str(store_dir)).lookup(KEY) is None


def test_gc_drops_unusable_entries_and_only_their_blobs(tmp_path):
    project, store_dir = tmp_path / "project", tmp_path / "store"
    (project / STAGE).mkdir(parents=True)
    (project / STAGE / "g.onnx").write_bytes(b"onnx")
    store = Store(str(store_dir))
    record = {"stage": "export", "target": "g", "files": records.vouch([f"{STAGE}/g.onnx"], project)}
    store.put(KEY, "export", "g", Path(STAGE), record, root=project)
    orphan = add_blob(store_dir, b"named only by a bad entry")
    bad = [write_manifest(store_dir, key * 32, data) for key, data in
           (("cd", b"[]"), ("ef", b"\xff\xfe not utf-8"),
            ("12", json.dumps({k: v for k, v in entry("12" * 32, {}).items() if k != "files"}).encode()),
            ("34", json.dumps(entry("34" * 32, {f"{STAGE}/x": {"sha256": orphan, "size": 25}}, record=[])).encode()),
            ("56", json.dumps(entry("56" * 32, {"../../x": {"sha256": orphan, "size": 25}})).encode()))]
    stats = store.stats()
    assert stats["entries"] == 1 and stats["bad"] == 5, stats
    result = store.gc(keep_days=30)
    assert result == {"entries_dropped": 0, "entries_bad": 5, "entries_kept": 1, "blobs_removed": 1,
                      "bytes_freed": 25}, result
    assert not any(p.exists() for p in bad)
    assert store.lookup(KEY)["files"] == record["files"]  # the good entry and its blob are kept
    assert store.restore(store.lookup(KEY), Path(STAGE), root=tmp_path / "clone") is True


def test_doit_cache_gc_drops_an_unusable_entry(tmp_path):
    project = copy_project(tmp_path / "project")  # no build needed: cache:gc reads only the store
    store_dir = tmp_path / "store"
    bad = write_manifest(store_dir, KEY, b"[]")
    stats = project.doit("cache:stats", env={"QNN_CACHE": str(store_dir)})
    assert stats.returncode == 0 and "0 entries (none) (+ 1 unusable: `doit cache:gc` drops them)" in stats.stdout, \
        stats.stdout + stats.stderr
    result = project.doit("cache:gc", env={"QNN_CACHE": str(store_dir)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dropped 0 older than 30 days and 1 unusable" in result.stdout and not bad.exists(), result.stdout


# ------------------------------------------------------------------ minor: only what the stage vouches for is shared

def test_put_stores_the_stage_outputs_and_the_files_its_record_names_never_a_users_file(tmp_path):
    project, store_dir = tmp_path / "project", tmp_path / "store"
    folder = project / STAGE
    (folder / "logs").mkdir(parents=True)
    (folder / "g.onnx").write_bytes(b"onnx")
    (folder / "logs" / "export.log").write_text("log")
    (folder / "my-notes.txt").write_text("a user's own file, perhaps a secret")
    (folder / "export.json").write_text("{}")
    record = {"stage": "export", "target": "g", "files": records.vouch([f"{STAGE}/g.onnx"], project),
              "log": f"{STAGE}/logs/export.log", "elsewhere": "build/m/g/simplify/g.onnx", "note": "a/b c"}
    assert stage_files(project, STAGE, record, "export.json") == [f"{STAGE}/g.onnx", f"{STAGE}/logs/export.log"]
    manifest = Store(str(store_dir)).put(KEY, "export", "g", Path(STAGE), record, root=project)
    assert sorted(manifest["files"]) == [f"{STAGE}/g.onnx", f"{STAGE}/logs/export.log"]
    assert not any(b.read_bytes().startswith(b"a user's") for b in store_dir.rglob("cas/*/*"))


# ------------------------------------------------------------------ item 7: an unreachable store costs only the cache

def test_an_unreachable_store_is_one_line_and_no_cache(monkeypatch):
    url = f"ftp://127.0.0.1:{closed_port()}/cache"
    with pytest.raises(StoreUnreachable, match=r"^\$QNN_CACHE: cache store .* is unreachable \(ConnectionRefused"):
        Store(url)
    monkeypatch.setenv("QNN_CACHE", url)
    monkeypatch.setattr(console, "OUT", io.StringIO())
    assert for_build(None) is None
    err = console.OUT.getvalue().strip().splitlines()
    assert len(err) == 1 and "building without the cache in this run" in err[0] and url in err[0], err


def stage_record(project: Project, glob: str) -> dict:
    paths = list(project.root.glob(glob))
    assert len(paths) == 1, paths
    return json.loads(paths[0].read_text())


LINT = ("build/silero-vad/vad/lint/lint.json", "build/minilm/minilm/lint/lint.json")


@pytest.mark.parametrize("backend", ["ftp", "webhdfs"])
def test_doit_with_an_unreachable_store_builds_without_it_saying_so_once(project_copy, backend):
    """ftp:// connects on opening (the issue's probe); webhdfs:// (over requests) on first use, from inside a stage.
    dbfs:// takes the webhdfs path after its client's 10 retries with backoff (measured: 53 s, the same one line);
    it is not in the suite because those 53 s are all waiting."""
    project_copy.doit("forget", "lint:vad", "lint:minilm", check=True)
    port = closed_port()
    url = {"ftp": f"ftp://127.0.0.1:{port}/cache", "webhdfs": f"webhdfs://127.0.0.1:{port}/cache"}[backend]
    result = project_copy.doit("lint", env={"QNN_CACHE": url})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "unreachable" in line or "cache entry" in line or "cach" in line]
    assert len(lines) == 1, output
    assert lines[0].startswith(f"$QNN_CACHE: cache store {url} is unreachable (") and lines[0].endswith(
        "): building without the cache in this run (fix: check the store's address and the network, or unset "
        "QNN_CACHE)"), lines
    if backend == "ftp":
        assert "(ConnectionRefusedError: [Errno 111] Connection refused)" in lines[0]
    else:
        assert "Connection refused" in lines[0]
    assert result.executed == {"lint:vad", "lint:minilm"}, result.executed
    for path in LINT:
        record = stage_record(project_copy, path)
        assert record["status"] in ("passed", "warning") and "from_cache" not in record, record


def test_a_store_that_cannot_be_written_says_so_once_per_run(project_copy, tmp_path):
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    (store_dir / "ac").write_text("not a folder")  # nothing can be stored here (as root, chmod would not stop us)
    (store_dir / "cas").write_text("not a folder")
    project_copy.doit("forget", "lint:vad", "lint:minilm", check=True)
    result = project_copy.doit("lint", env={"QNN_CACHE": str(store_dir)})
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, output
    lines = [line for line in output.splitlines() if "cannot store" in line or "not cached" in line]
    assert len(lines) == 1 and "this run's results are not cached" in lines[0], output
    assert result.executed == {"lint:vad", "lint:minilm"}, result.executed


# ------------------------------------------------------------------ items 1 and 8 end to end: a crafted entry in a shared store

def session_entry(store: Path, stage: str, target: str) -> Path:
    """The manifest the session's base build put in its store for `stage:target`."""
    for path in store.glob("ac/*/*.json"):
        data = json.loads(path.read_text())
        if data.get("stage") == stage and data.get("target") == target:
            return path
    raise AssertionError(f"no {stage}:{target} in {store}")


@pytest.mark.parametrize("tamper", ["escape", "a list", "no files"])
def test_doit_refuses_a_tampered_entry_and_builds_the_stage(built_graphs, session_store, project_copy, tmp_path,
                                                            tamper):
    store = tmp_path / "store"
    shutil.copytree(session_store, store)  # the session's store is shared by other tests: never edit it
    manifest_path = session_entry(store, "export", "vad")
    manifest = json.loads(manifest_path.read_text())
    owned = tmp_path / "outside" / "owned.txt"
    if tamper == "escape":  # a blob with the right digest, named by a path that climbs out of the project
        name = UP + str(owned).lstrip("/")
        manifest["files"][name] = {"sha256": add_blob(store, b"owned\n"), "size": 6}
        manifest_path.write_text(json.dumps(manifest))
    elif tamper == "a list":
        manifest_path.write_text("[]")
    else:
        del manifest["files"]
        manifest_path.write_text(json.dumps(manifest))
    project_copy.doit("forget", "export:vad", check=True)
    result = project_copy.doit("export:vad", env={"QNN_CACHE": str(store)})
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, output
    assert not owned.exists() and not (tmp_path / "outside").exists()
    lines = [line for line in output.splitlines() if "cache entry not used" in line]
    assert len(lines) == 1 and lines[0].startswith("export:vad: cache entry not used: "), output
    assert manifest_path.resolve().as_uri() in lines[0]
    if tamper == "escape":
        assert f"files: {name!r} has an empty, '.' or '..' part: refused, the stage is built instead" in lines[0]
    record = stage_record(project_copy, "build/silero-vad/vad/export/export.json")
    assert record["status"] in ("passed", "warning") and "from_cache" not in record, record  # built, not restored
    assert records.problems(record, project_copy.path("build/silero-vad/vad/export/export.json"),
                            project_copy.root) == []
    repaired = Store(str(store)).lookup(manifest_path.stem)  # the build put a good entry in its place
    assert sorted(repaired["files"]) == [f"build/silero-vad/vad/export/{n}" for n in ("export.log", "vad.onnx")]


def test_a_dask_workers_inputs_must_be_plain_project_relative_names():
    """The worker writes each input under its scratch folder by name: `models/../../x` must not pass (it did)."""
    from qnn_tasks.run.cacheentry import unsafe_name

    assert unsafe_name("models/m/.data/x.onnx", "", hidden_ok=True) is None
    for name in ("models/../../../etc/cron.d/x", "/etc/passwd", "../x", "models//x", "models\\..\\x"):
        assert unsafe_name(name, "", hidden_ok=True), name
