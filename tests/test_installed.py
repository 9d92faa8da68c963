"""Installed distributions' versions remembered across runs: never stale after an install, never in the way."""
from __future__ import annotations

import importlib.metadata
import os
import sys

import pytest

from qnn_tasks.modelspec import installed


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A private memo folder; returns a site folder on sys.path and `new_process()` (forget what is in memory)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(site)] + sys.path)
    importlib.invalidate_caches()

    def new_process() -> None:
        monkeypatch.setattr(installed, "_facts", None)
        monkeypatch.setattr(installed, "_fingerprint", None)
        importlib.invalidate_caches()
    new_process()
    return site, new_process


def install(site, name: str, version: str) -> None:
    """What pip leaves: <name>-<version>.dist-info (name with underscores) replacing the old one."""
    uninstall(site, name)
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def uninstall(site, name: str) -> None:
    for old in site.glob(f"{name.replace('-', '_')}-*.dist-info"):
        (old / "METADATA").unlink()
        old.rmdir()


def test_versions_come_from_the_memo_in_the_next_process(fresh, monkeypatch):
    fresh, new_process = fresh
    install(fresh, "qnn-fake-wheel", "1.0")
    assert installed.version("qnn-fake-wheel") == "1.0"
    assert installed.version("numpy") == importlib.metadata.version("numpy")
    assert installed.version("no-such-distribution-here") is None
    assert installed.location("qnn-fake-wheel") == fresh
    new_process()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: pytest.fail(f"asked importlib for {name}"))
    assert installed.version("qnn-fake-wheel") == "1.0" and installed.version("no-such-distribution-here") is None


def test_an_upgrade_or_removal_is_seen_at_once(fresh):
    fresh, new_process = fresh
    install(fresh, "qnn-fake-wheel", "1.0")
    assert installed.version("qnn-fake-wheel") == "1.0"
    before = os.stat(fresh).st_mtime_ns
    install(fresh, "qnn-fake-wheel", "2.0")  # what pip does: the old .dist-info out, the new one in
    os.utime(fresh, ns=(before + 10**9, before + 10**9))  # (filesystems with coarse timestamps)
    new_process()
    assert installed.version("qnn-fake-wheel") == "2.0"
    uninstall(fresh, "qnn-fake-wheel")
    os.utime(fresh, ns=(before + 2 * 10**9, before + 2 * 10**9))
    new_process()
    assert installed.version("qnn-fake-wheel") is None


def test_a_damaged_memo_is_asked_again(fresh):
    fresh, new_process = fresh
    install(fresh, "qnn-fake-wheel", "1.0")
    assert installed.version("qnn-fake-wheel") == "1.0"
    installed.memo_file().write_text('{"fingerprint": ')
    new_process()
    assert installed.version("qnn-fake-wheel") == "1.0"
