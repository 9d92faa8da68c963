# Test helpers around the stand-in adbd (adbd.py here): a private real adb server + stand-in phones.
"""Stand-in Android phones for tests (no real phone exists here).

    from standins.phone import adb_server, standin_phone

    with adb_server() as server:                                   # private `adb` server
        with standin_phone(tmp / "p1", {"ro.soc.model": "SM8650"}, server) as phone:
            d = server.client().device(phone.serial)              # adbutils, real protocol
            d.shell("ls /data/local/tmp")                         # runs in phone.sandbox
            phone.unplug()                                         # device drops off the bus

``adb_server(port=None)`` starts ``adb -P <port> start-server`` on a free port in 15000-16000
(loopback only) with HOME and TMPDIR pointing at a private temp dir (so it makes its own adb
key and log, ``server.log_path``), and runs ``adb -P <port> kill-server`` at the end.  Every
``adb`` it runs gets ``-P <port>`` and ``ANDROID_ADB_SERVER_PORT=<port>``; ``server.env`` is
that environment for code under test that shells out to ``adb``.

``standin_phone(sandbox, props=None, adb_port=None)`` starts ``adbd.py`` on a free port,
and if ``adb_port`` (an int or an AdbServer) is given runs ``adb -P <adb_port> connect
127.0.0.1:<port>`` and waits until ``adb devices`` lists it as ``device``.  It yields a
StandinPhone: ``.serial`` ("127.0.0.1:<port>"), ``.sandbox`` (host dir = /data/local/tmp),
``.unplug()`` / ``.replug()`` / ``.kill()``, ``.set_prop()`` / ``.set_battery()``.  On exit it
disconnects and stops the adbd.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ADB = shutil.which("adb") or "/usr/bin/adb"
ADBD_SCRIPT = Path(__file__).resolve().with_name("adbd.py")
DEVICE_TMP = "/data/local/tmp"
SERVER_PORTS = (15000, 16000)


def _nobody_listens(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) != 0


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return _nobody_listens(port)


def free_port(lo: int = SERVER_PORTS[0], hi: int = SERVER_PORTS[1]) -> int:
    ports = list(range(lo, hi))
    random.shuffle(ports)
    for port in ports[:200]:
        if _port_is_free(port):
            return port
    raise RuntimeError(f"no free port in {lo}-{hi}")


def _wait(cond, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ==========================================================================================
# private adb server
# ==========================================================================================
class AdbServer:
    def __init__(self, port: int, workdir: Path):
        self.port = port
        self.workdir = workdir
        self.env = {k: v for k, v in os.environ.items() if k not in ("ANDROID_SERIAL",)}
        self.env.update(ANDROID_ADB_SERVER_PORT=str(port), HOME=str(workdir), TMPDIR=str(workdir))

    @property
    def log_path(self) -> Path:
        return self.workdir / f"adb.{os.getuid()}.log"

    def adb(self, *args: str, timeout: float = 20, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([ADB, "-P", str(self.port), *args], env=self.env, timeout=timeout,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise RuntimeError(f"adb {' '.join(args)} failed ({proc.returncode}): "
                               f"{proc.stdout}{proc.stderr}")
        return proc

    def client(self):
        import adbutils
        return adbutils.AdbClient(host="127.0.0.1", port=self.port)

    def states(self) -> dict[str, str]:
        """serial -> state ("device", "offline", ...) as `adb devices` prints it."""
        out = self.adb("devices").stdout
        states = {}
        for line in out.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2:
                states[parts[0]] = parts[1]
        return states

    def wait_for(self, serial: str, pred, timeout: float = 10, what: str = "") -> str | None:
        """Poll `adb devices` until pred(state or None) is true; returns that state."""
        result = []

        def check():
            state = self.states().get(serial)
            if pred(state):
                result.append(state)
                return True
            return False

        _wait(check, timeout, what or f"{serial} state", interval=0.1)
        return result[0]


@contextmanager
def adb_server(port: int | None = None) -> Iterator[AdbServer]:
    """A private real adb server on 127.0.0.1:<port> (random free port in 15000-16000)."""
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="standin-adb-server-"))
    server = AdbServer(port, workdir)
    try:
        server.adb("start-server", timeout=30)
        _wait(lambda: not _nobody_listens(port), 10, f"adb server on port {port}")
        yield server
    finally:
        try:
            server.adb("kill-server", timeout=10, check=False)
            _wait(lambda: _nobody_listens(port), 10, f"adb server on port {port} to exit")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


# ==========================================================================================
# stand-in phone
# ==========================================================================================
class StandinPhone:
    def __init__(self, proc: subprocess.Popen, port: int, sandbox: Path, workdir: Path,
                 server: AdbServer | None):
        self.proc = proc
        self.port = port
        self.sandbox = sandbox
        self.workdir = workdir
        self.server = server
        self.serial = f"127.0.0.1:{port}"

    # --- files ---------------------------------------------------------------------------
    @property
    def log_path(self) -> Path:
        return self.workdir / "adbd.log"

    @property
    def state_path(self) -> Path:
        return self.workdir / "state" / "state.json"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def host_path(self, device_path: str) -> Path:
        """Host file behind a device path under /data/local/tmp."""
        if device_path != DEVICE_TMP and not device_path.startswith(DEVICE_TMP + "/"):
            raise ValueError(f"{device_path} is outside {DEVICE_TMP}")
        return self.sandbox / device_path[len(DEVICE_TMP):].lstrip("/")

    # --- properties / battery (edit the live device state) --------------------------------
    def state(self) -> dict:
        return json.loads(self.state_path.read_text())

    def _save(self, state: dict) -> None:
        tmp = self.state_path.with_name(f".state-{os.getpid()}.json")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, self.state_path)

    def set_prop(self, name: str, value: str) -> None:
        state = self.state()
        state["props"][name] = value
        self._save(state)

    def set_battery(self, **fields) -> None:
        """e.g. set_battery(level=40, temperature=350, status=3, usb=False)"""
        state = self.state()
        state["battery"].update(fields)
        self._save(state)

    # --- plugging ------------------------------------------------------------------------
    def _count(self, text: str) -> int:
        return self.log().count(text)

    def connect(self, timeout: float = 10) -> None:
        assert self.server is not None, "no adb server given"
        out = self.server.adb("connect", self.serial).stdout
        if "connected to" not in out:
            raise RuntimeError(f"adb connect {self.serial}: {out}")
        self.server.wait_for(self.serial, lambda s: s == "device", timeout,
                             f"{self.serial} to be 'device'")

    def unplug(self, wait: bool = True, timeout: float = 10) -> None:
        """Pull the cable: the adbd drops every connection, stops listening and kills running
        shell commands (SIGUSR1).  With wait, returns once the adb server no longer lists the
        device as 'device' (adb 1.0.41 shows it 'offline' while it retries every ~10 s)."""
        n = self._count("unplugged")
        self.proc.send_signal(signal.SIGUSR1)
        _wait(lambda: self._count("unplugged") > n, timeout, "adbd to unplug")
        if wait and self.server is not None:
            self.server.wait_for(self.serial, lambda s: s != "device", timeout,
                                 f"{self.serial} to leave state 'device'")

    def replug(self, wait: bool = True, timeout: float = 10) -> None:
        """Plug the cable back in (SIGUSR2: listen again on the same port).  The adb server
        would find it on its next ~10 s reconnect attempt; with wait we reconnect at once."""
        n = self._count("listening on")
        self.proc.send_signal(signal.SIGUSR2)
        _wait(lambda: self._count("listening on") > n, timeout, "adbd to listen again")
        if wait and self.server is not None:
            self.server.adb("disconnect", self.serial, check=False)
            self.connect(timeout)

    def kill(self) -> None:
        """Hard stop (SIGKILL) of the adbd; shell commands it started keep running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@contextmanager
def standin_phone(sandbox, props: dict[str, str] | None = None, adb_port=None, *,
                  battery_level: int = 85, env: dict[str, str] | None = None,
                  verbose: bool = False, timeout: float = 15) -> Iterator[StandinPhone]:
    """Start a stand-in phone whose /data/local/tmp is `sandbox`; connect it to the adb server
    at `adb_port` (int port or AdbServer; None = don't connect) and wait until it is 'device'."""
    sandbox = Path(sandbox).resolve()
    sandbox.mkdir(parents=True, exist_ok=True)
    server = adb_port if isinstance(adb_port, AdbServer) else None
    if server is None and adb_port is not None:
        server = AdbServer(int(adb_port), Path(tempfile.gettempdir()))
        server.env = {k: v for k, v in os.environ.items() if k != "ANDROID_SERIAL"}
        server.env["ANDROID_ADB_SERVER_PORT"] = str(adb_port)
    workdir = Path(tempfile.mkdtemp(prefix="standin-phone-"))
    cmd = [sys.executable, str(ADBD_SCRIPT), "--port", "0", "--sandbox", str(sandbox),
           "--state-dir", str(workdir / "state"), "--battery-level", str(battery_level)]
    for name, value in (props or {}).items():
        cmd += ["--prop", f"{name}={value}"]
    for name, value in (env or {}).items():
        cmd += ["--env", f"{name}={value}"]
    if verbose:
        cmd.append("--verbose")
    with open(workdir / "adbd.log", "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    phone = None
    try:
        def ready():
            text = (workdir / "adbd.log").read_text(errors="replace")
            m = re.search(r"^listening on 127\.0\.0\.1:(\d+)$", text, re.M)
            if m:
                return int(m.group(1))
            if proc.poll() is not None:
                raise RuntimeError(f"stand-in adbd exited ({proc.returncode}):\n{text}")
            return None

        port = _wait(ready, timeout, "stand-in adbd to listen")
        phone = StandinPhone(proc, port, sandbox, workdir, server)
        if server is not None:
            phone.connect(timeout)
        yield phone
    finally:
        if server is not None and phone is not None:
            server.adb("disconnect", phone.serial, check=False)
        if phone is not None:
            phone.stop()
        elif proc.poll() is None:
            proc.kill()
            proc.wait(5)
        shutil.rmtree(workdir, ignore_errors=True)
