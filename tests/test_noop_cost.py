"""What keeps a no-op `doit` cheap at 27,000 tasks without changing what it decides: the report's check answers
from file stamps while they hold (contents only when one changed), and the tasks are frozen out of the garbage
collector as doit loads them. Files and a real doit on a project of stand-in actions (the overhead benchmark's);
seconds, no builds."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from qnn_tasks.tasks import project as taskproject
from qnn_tasks.tasks.uptodate import content_signature, content_signature_by_stamp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_doit_overhead as bench  # noqa: E402


def replace_keeping_size_and_mtime(path: Path, text: str) -> None:
    """What `cp -p` does: a new file (new inode and ctime) with the old one's size and mtime."""
    st = path.stat()
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)


def test_the_saved_content_signature_holds_only_while_every_stamp_does(tmp_path: Path) -> None:
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for f in files:
        f.write_text('{"status": "passed"}')
    paths = [str(f) for f in files] + [str(tmp_path / "absent.json")]
    stamps, content = content_signature_by_stamp(paths, None, None)
    assert content == content_signature(paths)
    # stamps as saved: the saved signature is the answer, no file is read
    assert content_signature_by_stamp(paths, stamps, "saved") == (stamps, "saved")
    # the same bytes in a new file (a copied tree): new stamp, same contents
    replace_keeping_size_and_mtime(files[1], '{"status": "passed"}')
    moved, same = content_signature_by_stamp(paths, stamps, "saved")
    assert moved != stamps and same == content
    # other bytes, size and mtime kept: the stamp tells, the contents differ
    replace_keeping_size_and_mtime(files[1], '{"status": "failed"}')
    _, changed = content_signature_by_stamp(paths, moved, same)
    assert changed != content
    # a file appearing changes the stamp too
    (tmp_path / "absent.json").write_text("{}")
    assert content_signature_by_stamp(paths, stamps, "saved")[0] != stamps


def test_tasks_are_frozen_as_they_are_made(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(taskproject.gc, "freeze", lambda: calls.append(len(made)))
    made: list[dict] = []
    for task in taskproject.frozen_as_made(iter([{"name": str(i)} for i in range(5)]), every=2):
        made.append(task)
    assert [t["name"] for t in made] == ["0", "1", "2", "3", "4"]
    assert calls == [2, 4, 5]  # every 2 tasks, and once at the end


def doit(dodo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "doit", "-f", dodo.name, *args], cwd=dodo.parent,
                          capture_output=True, text=True, timeout=300)


def test_the_report_check_sees_a_record_replaced_with_its_size_and_mtime_kept(tmp_path: Path) -> None:
    dodo = bench.make_qnn_project(tmp_path / "project", n_models=1)
    first = doit(dodo)
    assert first.returncode == 0, first.stderr
    assert ".  report" in first.stdout
    assert doit(dodo).stdout.count(".  ") == 0  # a no-op: nothing executed, the report included
    record = dodo.parent / "build" / "m0" / "m0_g0" / "lint" / "lint.json"
    assert record.is_file()
    replace_keeping_size_and_mtime(record, record.read_text())  # same bytes, new stamp
    assert "-- report" in doit(dodo, "report").stdout  # contents unchanged: still up to date
    assert "-- report" in doit(dodo, "report").stdout  # again (the stamps are saved only by a render)
    replace_keeping_size_and_mtime(record, "y" * record.stat().st_size)  # other bytes, size and mtime kept
    assert ".  report" in doit(dodo, "report").stdout
    assert "-- report" in doit(dodo, "report").stdout
