"""The stand-in phone (tests/standins/adbd.py) against the real adb server 1.0.41 and real adbutils.

No mocks: a private `adb` server on a free port in 15000-16000, stand-in adbds on loopback
connected with `adb connect`, and adbutils talking to that server.  Nothing here was checked
against a real phone.
"""
from __future__ import annotations

import hashlib
import os
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

adbutils = pytest.importorskip("adbutils")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from standins.phone import ADB, adb_server, standin_phone  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(ADB), reason="needs the adb binary")

CHIPS = {"a": "SM8650", "b": "SM8550"}


@pytest.fixture(scope="module")
def server():
    with adb_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def phones(server, tmp_path_factory):
    """Two stand-in phones with different chips, connected at once."""
    root = tmp_path_factory.mktemp("phones")
    with standin_phone(root / "a", {"ro.soc.model": CHIPS["a"], "ro.product.model": "Pixel-Standin"},
                       server, battery_level=77) as a, \
         standin_phone(root / "b", {"ro.soc.model": CHIPS["b"]}, server) as b:
        yield {"a": a, "b": b}


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def dev(client, phone):
    return client.device(phone.serial)


def test_private_server_sees_both_phones(server, client, phones):
    serials = {d.serial for d in client.device_list()}
    assert {phones["a"].serial, phones["b"].serial} <= serials
    assert server.port in range(15000, 16000)
    listing = server.adb("devices", "-l").stdout
    # adb 1.0.41 takes product/model/device from the CNXN banner (and turns '-' into '_').
    assert f"{phones['a'].serial}" in listing and "model:Pixel_Standin" in listing
    features = set(dev(client, phones["a"]).get_features().split(","))
    assert {"shell_v2", "stat_v2", "ls_v2", "fixed_push_mkdir"} <= features


def test_getprop_answers_each_chip(client, phones):
    for key, phone in phones.items():
        d = dev(client, phone)
        assert d.getprop("ro.soc.model") == CHIPS[key]
        assert d.getprop("ro.product.cpu.abi") == "arm64-v8a"
        assert d.getprop("no.such.prop") == ""
        assert d.shell("getprop no.such.prop fallback") == "fallback"
    d = dev(client, phones["a"])
    assert d.getprop("ro.product.model") == "Pixel-Standin"
    assert d.prop.model == "Pixel-Standin"
    listing = d.shell("getprop").splitlines()
    assert f"[ro.soc.model]: [{CHIPS['a']}]" in listing
    assert listing == sorted(listing)
    assert all(line.startswith("[") and "]: [" in line for line in listing)
    # getprop is a real command on the device PATH: it works inside compound commands too
    assert d.shell("echo chip=$(getprop ro.soc.model)") == f"chip={CHIPS['a']}"


def test_shell_runs_in_the_sandbox(client, phones):
    phone = phones["a"]
    (phone.sandbox / "already-there.txt").write_text("x")
    out = dev(client, phone).shell("echo hi; ls /data/local/tmp")
    lines = out.splitlines()
    assert lines[0] == "hi" and "already-there.txt" in lines[1:]
    assert dev(client, phones["b"]).shell("ls /data/local/tmp/already-there.txt 2>&1; echo end").endswith("end")
    assert "No such file" in dev(client, phones["b"]).shell("ls /data/local/tmp/already-there.txt 2>&1")


def test_shell_exit_codes_and_stderr(server, client, phones):
    d = dev(client, phones["b"])
    # legacy raw shell (what d.shell uses): stdout+stderr merged, no exit code on the wire
    assert d.shell("echo out; echo err >&2") == "out\nerr"
    r = d.shell2("echo out; echo err >&2; false")  # adbutils appends `echo X4EXIT:$?`
    assert r.returncode == 1 and r.output == "out\nerr\n"
    # shell protocol v2 carries the exit code and keeps stderr apart
    r = d.shell2("echo out; echo err >&2; exit 7", v2=True)
    assert (r.returncode, r.stdout, r.stderr) == (7, "out\n", "err\n")
    # the adb command line client picks shell_v2 itself (the device advertises it)
    p = server.adb("-s", phones["b"].serial, "shell", "echo cli; exit 3", check=False)
    assert p.returncode == 3 and p.stdout == "cli\n"


def test_push_pull_round_trip(client, phones, tmp_path):
    phone = phones["a"]
    d = dev(client, phone)
    blob = os.urandom(1024 * 1024) + b"tail"
    src = tmp_path / "blob.bin"
    src.write_bytes(blob)
    assert d.sync.push(src, "/data/local/tmp/models/blob.bin", mode=0o644) == len(blob)
    assert d.sync.push(b"hello device\n", "/data/local/tmp/x") == 13
    # on the device side (the sandbox) the bytes are there, parent dir created, mode applied
    host = phone.host_path("/data/local/tmp/models/blob.bin")
    assert host.read_bytes() == blob
    assert stat.S_IMODE(host.stat().st_mode) == 0o644
    # and they come back byte-identical
    back = tmp_path / "back.bin"
    assert d.sync.pull("/data/local/tmp/models/blob.bin", back) == len(blob)
    assert back.read_bytes() == blob
    assert d.sync.read_text("/data/local/tmp/x") == "hello device\n"
    assert d.shell("cat /data/local/tmp/x") == "hello device"
    assert d.shell("md5sum < /data/local/tmp/models/blob.bin").split()[0] == hashlib.md5(blob).hexdigest()
    # the other phone does not see it
    assert not dev(client, phones["b"]).sync.exists("/data/local/tmp/x")


def test_stat_and_list(client, phones):
    d = dev(client, phones["a"])
    d.sync.push(b"12345", "/data/local/tmp/listing/five.txt")
    d.shell("mkdir -p /data/local/tmp/listing/sub")
    st = d.sync.stat("/data/local/tmp/listing/five.txt")
    assert st.size == 5 and stat.S_ISREG(st.mode) and st.mtime is not None
    assert stat.S_ISDIR(d.sync.stat("/data/local/tmp/listing").mode)
    missing = d.sync.stat("/data/local/tmp/listing/nope")
    assert missing.mode == 0 and missing.mtime is None and not d.sync.exists("/data/local/tmp/listing/nope")
    entries = {e.path: e for e in d.sync.list("/data/local/tmp/listing")}
    assert set(entries) == {".", "..", "five.txt", "sub"}
    assert entries["five.txt"].size == 5 and stat.S_ISDIR(entries["sub"].mode)


def test_paths_outside_data_local_tmp_are_refused(client, phones):
    d = dev(client, phones["a"])
    with pytest.raises(adbutils.AdbError):
        d.sync.push(b"x", "/system/bin/evil")
    with pytest.raises(adbutils.AdbError, match="Permission denied"):
        d.sync.read_bytes("/system/build.prop")
    with pytest.raises(adbutils.AdbError, match="No such file"):
        d.sync.read_bytes("/data/local/tmp/does-not-exist")
    assert d.sync.list("/data") == []  # like a real device: the shell user cannot list /data
    assert d.sync.stat("/etc/passwd").mode == 0


def test_adb_command_line_sync_uses_v2_requests(server, phones, tmp_path):
    """`adb push/pull/ls` (the C++ client) use STA2/LST2 and the ls path of the device."""
    serial = phones["b"].serial
    src = tmp_path / "cli.bin"
    src.write_bytes(os.urandom(200_000))
    server.adb("-s", serial, "shell", "mkdir /data/local/tmp/cli")
    server.adb("-s", serial, "push", str(src), "/data/local/tmp/cli/")  # into the directory
    assert phones["b"].host_path("/data/local/tmp/cli/cli.bin").read_bytes() == src.read_bytes()
    server.adb("-s", serial, "pull", "/data/local/tmp/cli/cli.bin", str(tmp_path / "cli.back"))
    assert (tmp_path / "cli.back").read_bytes() == src.read_bytes()
    assert "cli.bin" in server.adb("-s", serial, "ls", "/data/local/tmp/cli").stdout
    p = server.adb("-s", serial, "push", str(src), "/system/cli.bin", check=False)
    assert p.returncode != 0 and "Permission denied" in p.stdout + p.stderr  # 1.0.41: on stdout


def test_dumpsys_battery(client, phones):
    phone = phones["a"]
    d = dev(client, phone)
    text = d.shell("dumpsys battery")
    assert text.startswith("Current Battery Service state:")
    fields = dict(line.strip().split(": ", 1) for line in text.splitlines()[1:])
    assert fields["level"] == "77" and fields["scale"] == "100"
    assert {"temperature", "voltage", "status", "USB powered"} <= set(fields)
    phone.set_battery(level=41, temperature=355)
    assert "level: 41" in d.shell("dumpsys battery")
    d.shell("dumpsys battery unplug")
    text = d.shell("dumpsys battery")
    assert "USB powered: false" in text and "status: 3" in text
    d.shell("dumpsys battery reset")
    assert "level: 77" in d.shell("dumpsys battery")


def test_standin_bin_hook_is_first_on_path(client, phones):
    """Other stand-ins (qnn-net-run) go into <sandbox>/.standin-bin; device paths are rewritten."""
    phone = phones["b"]
    hook = phone.sandbox / ".standin-bin"
    hook.mkdir(exist_ok=True)
    tool = hook / "qnn-net-run"
    tool.write_text('#!/bin/sh\necho "fake qnn-net-run $*"; echo "soc=$(getprop ro.soc.model)"\n')
    tool.chmod(0o755)
    out = dev(client, phone).shell("cd /data/local/tmp && qnn-net-run --retrieve_context /data/local/tmp/m.bin")
    assert out.splitlines() == [f"fake qnn-net-run --retrieve_context {phone.sandbox}/m.bin",
                                f"soc={CHIPS['b']}"]
    env = dev(client, phone).shell("echo $STANDIN_ADBD_SANDBOX; pwd")
    assert env.splitlines() == [str(phone.sandbox)] * 2


def test_unplug_mid_run(server, client, tmp_path):
    """Unplugging one phone fails what runs on it and what comes after; the other keeps going."""
    with standin_phone(tmp_path / "u1", {"ro.soc.model": "SM8750"}, server) as gone, \
         standin_phone(tmp_path / "u2", {"ro.soc.model": "SM8450"}, server) as stays:
        dg, ds = client.device(gone.serial), client.device(stays.serial)
        assert dg.getprop("ro.soc.model") == "SM8750"

        errors: list[BaseException] = []
        started = threading.Event()

        def long_job():
            try:
                started.set()
                dg.shell2("sleep 20; echo finished", timeout=30)
            except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
                errors.append(exc)

        job = threading.Thread(target=long_job)
        job.start()
        started.wait()
        time.sleep(0.5)  # let the command start on the "device"
        t0 = time.monotonic()
        gone.unplug()
        job.join(10)
        assert not job.is_alive(), "operation on the unplugged phone did not end"
        assert time.monotonic() - t0 < 10
        assert errors and isinstance(errors[0], adbutils.AdbError)

        # adb 1.0.41 keeps an `adb connect`ed device as 'offline' while it retries (~10 s apart)
        assert server.states().get(gone.serial) in (None, "offline")
        assert gone.serial not in {d.serial for d in client.device_list()}
        with pytest.raises(adbutils.AdbError, match="offline|not found"):
            dg.shell("echo hi")
        with pytest.raises(adbutils.AdbError):
            dg.sync.push(b"x", "/data/local/tmp/x")

        # the other phone is unaffected
        assert ds.getprop("ro.soc.model") == "SM8450"
        assert ds.sync.push(b"still here", "/data/local/tmp/s") == 10
        assert ds.shell("cat /data/local/tmp/s") == "still here"

        # plugging it back in works too
        gone.replug()
        assert dg.shell("echo back") == "back"
