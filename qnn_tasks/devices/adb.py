"""Phones over adb: find attached devices through the adb server, read their chip, push, run, pull.

Talks to the adb server (`ANDROID_ADB_SERVER_HOST` / `ANDROID_ADB_SERVER_PORT`, default
127.0.0.1:5037) with adbutils. The server is probed with a plain socket first: adbutils would
otherwise run `adb start-server` by itself, and "no adb server" must be a clear message that says
how to start one, not a server appearing behind the user's back (adbutils' own fallback to
`adb start-server` is pointed at `false` for the same reason).

Shell commands go through shell protocol v2 (`shell2(v2=True)`: separate stdout/stderr and the exit
code; adbutils falls back to a v1 shell with an `echo $?` suffix on old devices). Every argument in a
command line built here is quoted with shlex.quote. A device that drops off mid-operation (cable
pulled, adbd killed) makes adbutils raise AdbError / EOFError / OSError; those become `DeviceGone`
when the server no longer lists the device as `device`, else `DeviceError`.

Files go up with the sync protocol (skipped when the device already has the same size and md5);
a folder of outputs comes back as one tar made on the device (toybox tar), unpacked here refusing
absolute paths, '..' and escaping links. No doit and no numpy here: stages/verify/ decides what to
push and run.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qnn_tasks.errors import QnnTasksError
from qnn_tasks.fileio import extract_safely

ENV_HOST = "ANDROID_ADB_SERVER_HOST"
ENV_PORT = "ANDROID_ADB_SERVER_PORT"
ENV_DEVICES = "QNN_DEVICES"          # serial filter: "serial1,serial2"
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 5037
DEVICE_TMP = "/data/local/tmp"
PROPS = {"soc_model": "ro.soc.model", "model": "ro.product.model", "android": "ro.build.version.release",
         "abi": "ro.product.cpu.abi", "manufacturer": "ro.product.manufacturer", "sdk": "ro.build.version.sdk"}
ATTACH_HINT = ("attach a phone with USB debugging on (Settings > Developer options) and accept its prompt, "
               "or `adb connect <phone-ip>:<port>` for one in wireless debugging; `adb devices` must list it "
               "as 'device'")
STATE_HINTS = {"unauthorized": "accept the 'Allow USB debugging?' prompt on the phone",
               "offline": "it dropped off (cable, sleep, or adbd restart): replug it or `adb reconnect`",
               "no permissions": "the host user may not open the USB device (udev rules / plugdev group)",
               "authorizing": "wait for the phone to finish authorizing, then rerun"}
ADB_ERRORS: tuple[type[BaseException], ...] = (EOFError, OSError)


class DeviceError(QnnTasksError):
    """The adb server or a device failed; one line naming the device and the fix."""


class DeviceGone(DeviceError):
    """The device disappeared mid-operation (unplugged, adbd gone)."""


def _adbutils():
    try:
        import adbutils
    except ImportError:
        raise DeviceError("the Python package adbutils is not installed: pip install adbutils") from None
    return adbutils


def _adb_errors() -> tuple[type[BaseException], ...]:
    return (_adbutils().AdbError, *ADB_ERRORS)


# ------------------------------------------------------------------ server

@dataclass(frozen=True)
class Server:
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def server_from_env(env: dict[str, str] | None = None) -> Server:
    env = os.environ if env is None else env
    host = env.get(ENV_HOST) or DEFAULT_HOST
    from qnn_tasks.envvalues import number

    port = number(ENV_PORT, env)
    return Server(host, DEFAULT_PORT if port is None else int(port))  # type: ignore[arg-type]


def probe(server: Server, timeout: float = 3.0) -> int:
    """The adb server's protocol version; a clear error when nothing answers at host:port."""
    how = ("start it with `adb start-server` (Debian/Ubuntu: apt-get install adb)"
           + (f" with {ENV_PORT}={server.port}" if server.port != DEFAULT_PORT else "")
           + f", or point {ENV_HOST}/{ENV_PORT} at a running one; then {ATTACH_HINT}")
    try:
        with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            request = b"host:version"
            sock.sendall(b"%04x" % len(request) + request)
            status = _read_exactly(sock, 4)
            if status != b"OKAY":
                raise DeviceError(f"{server.address} answered {status!r}, not like an adb server ({how})")
            length = int(_read_exactly(sock, 4), 16)
            return int(_read_exactly(sock, length), 16)
    except (ConnectionRefusedError, socket.timeout, TimeoutError) as err:
        raise DeviceError(f"no adb server at {server.address} ({type(err).__name__}): {how}") from None
    except OSError as err:
        raise DeviceError(f"cannot reach the adb server at {server.address} ({err}): {how}") from None
    except ValueError:
        raise DeviceError(f"{server.address} answered like no adb server ({how})") from None


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionRefusedError("closed")
        data += chunk
    return data


def client(server: Server):
    import shutil

    adbutils = _adbutils()
    # adbutils runs `adb start-server` by itself when it cannot connect (also mid-run, if the server
    # died). Pointing its adb at `false` turns that into the connection error we report instead; a
    # user's own ADBUTILS_ADB_PATH is left alone.
    if not os.environ.get("ADBUTILS_ADB_PATH") and shutil.which("false"):
        os.environ["ADBUTILS_ADB_PATH"] = shutil.which("false")  # type: ignore[assignment]
    return adbutils.AdbClient(host=server.host, port=server.port, socket_timeout=30)


# ------------------------------------------------------------------ discovery

@dataclass
class DeviceInfo:
    """One device the server lists, with the properties that pick its build (state 'device' only)."""
    serial: str
    state: str
    soc_model: str | None = None
    model: str | None = None
    android: str | None = None
    abi: str | None = None
    manufacturer: str | None = None
    sdk: str | None = None
    error: str | None = None

    @property
    def usable(self) -> bool:
        return self.state == "device" and self.error is None

    def label(self) -> str:
        chip = self.soc_model or "?"
        return f"{self.serial} ({self.model or 'unknown model'}, {chip})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def serial_filter(env: dict[str, str] | None = None) -> list[str] | None:
    raw = (os.environ if env is None else env).get(ENV_DEVICES, "")
    serials = [s.strip() for s in raw.split(",") if s.strip()]
    return serials or None


def list_devices(server: Server) -> list[DeviceInfo]:
    """Every device the server knows (any state); properties read from those in state 'device'."""
    errors = _adb_errors()
    adb = client(server)
    try:
        listed = adb.list()
    except errors as err:
        raise DeviceError(f"adb server at {server.address} failed to list devices: {err}") from None
    devices = []
    for item in listed:
        info = DeviceInfo(serial=item.serial, state=item.state)
        if info.state == "device":
            try:
                props = parse_getprop(adb.device(item.serial).shell("getprop", timeout=30))
                for key, prop in PROPS.items():
                    setattr(info, key, props.get(prop, "").strip() or None)
            except errors as err:
                info.error = f"could not read its properties: {err}"
        else:
            info.error = f"state '{info.state}': {STATE_HINTS.get(info.state, 'not ready')}"
        devices.append(info)
    return devices


def parse_getprop(text: str) -> dict[str, str]:
    """`getprop` without arguments prints `[name]: [value]` lines."""
    props = {}
    for line in text.splitlines():
        name, sep, value = line.strip().partition("]: [")
        if sep and name.startswith("[") and value.endswith("]"):
            props[name[1:]] = value[:-1]
    return props


# ------------------------------------------------------------------ one phone

@dataclass
class ShellResult:
    returncode: int
    stdout: str
    stderr: str


@dataclass
class PushReport:
    pushed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # same size and md5 already on the device
    bytes_pushed: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"pushed": len(self.pushed), "skipped_same_hash": len(self.skipped), "bytes_pushed": self.bytes_pushed,
                "files": self.pushed[:50]}


class Phone:
    """An attached device: shell / push / pull with errors a person can act on."""

    def __init__(self, server: Server, info: DeviceInfo) -> None:
        self.server = server
        self.info = info
        self._device = client(server).device(info.serial)

    # -------------------------------------------------------------- errors
    def _failed(self, what: str, err: BaseException) -> DeviceError:
        detail = f"{type(err).__name__}: {err}".strip().rstrip(":")
        state = self.state()
        if state != "device":
            seen = f"the adb server now lists it as '{state}'" if state else "the adb server no longer lists it"
            return DeviceGone(f"{self.info.label()} went away during {what} ({seen}; {detail}): unplugged, or "
                              f"adbd restarted? Reconnect it and rerun; results measured before are kept")
        return DeviceError(f"{self.info.label()}: {what} failed: {detail}")

    def state(self) -> str | None:
        try:
            for item in client(self.server).list():
                if item.serial == self.info.serial:
                    return item.state
        except _adb_errors():
            return None
        return None

    # -------------------------------------------------------------- shell
    def shell(self, command: str, what: str, timeout: float = 600) -> ShellResult:
        try:
            result = self._device.shell2(command, timeout=timeout, v2=True)
        except _adb_errors() as err:
            raise self._failed(what, err) from None
        return ShellResult(result.returncode, result.stdout or "", result.stderr or "")

    def check(self, command: str, what: str, timeout: float = 600) -> str:
        result = self.shell(command, what, timeout)
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise DeviceError(f"{self.info.label()}: {what} failed (exit {result.returncode}): {output[-800:]}")
        return result.stdout

    # -------------------------------------------------------------- files
    def remote_files(self, directory: str, names: list[str]) -> dict[str, tuple[int, str]]:
        """relative path -> (size, md5) of those of `names` that exist under `directory` on the device."""
        listed = " ".join(shlex.quote(n) for n in names)
        out = self.shell(f"cd {shlex.quote(directory)} 2>/dev/null || exit 0; for f in {listed}; do "
                         f"[ -f \"$f\" ] && echo \"$(wc -c < \"$f\") $(md5sum < \"$f\")\" \"$f\"; done; true",
                         f"listing {directory}").stdout
        found = {}
        for line in out.splitlines():
            parts = line.split()
            # "<size> <md5> [-] <path>"  (md5sum of stdin prints "<hash>  -")
            if len(parts) >= 3 and parts[0].isdigit():
                found[parts[-1]] = (int(parts[0]), parts[1])
        return found

    def push_tree(self, files: dict[str, Path], directory: str, executable: set[str] = frozenset()) -> PushReport:
        """Push {relative device path: local file} under `directory`; skip files already there (size + md5)."""
        existing = self.remote_files(directory, sorted(files))
        report = PushReport()
        for rel, local in sorted(files.items()):
            size = local.stat().st_size
            if existing.get(rel) == (size, md5(local)):
                report.skipped.append(rel)
                continue
            remote = f"{directory}/{rel}"
            try:
                self._device.sync.push(local, remote, mode=0o755 if rel in executable else 0o644, check=True)
            except _adb_errors() as err:
                raise self._failed(f"push of {local.name}", err) from None
            report.pushed.append(rel)
            report.bytes_pushed += size
        return report

    def pull(self, remote: str, local: Path, what: str) -> Path:
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._device.sync.pull(remote, local)
        except _adb_errors() as err:
            raise self._failed(what, err) from None
        return local

    def pull_dir_as_tar(self, directory: str, sub: str, local_dir: Path, what: str) -> Path:
        """Pack `directory/sub` on the device (toybox tar), pull one file, unpack it safely into local_dir."""
        d, s, archive = shlex.quote(directory), shlex.quote(sub), f"{sub}.tar"
        self.check(f"cd {d} && rm -f {shlex.quote(archive)} && tar -cf {shlex.quote(archive)} {s}", what)
        local_tar = self.pull(f"{directory}/{archive}", local_dir / archive, what)
        extract_safely(local_tar, local_dir)
        local_tar.unlink()
        self.shell(f"rm -f {shlex.quote(directory + '/' + archive)}", "cleanup")
        return local_dir / sub

    def remove(self, directory: str) -> bool:
        """rm -rf the folder, then its parent if now empty; False if the device is gone."""
        if not directory.startswith(DEVICE_TMP + "/"):
            raise DeviceError(f"refusing to remove {directory}: outside {DEVICE_TMP}")
        parent = directory.rsplit("/", 1)[0]
        try:
            self.shell(f"rm -rf {shlex.quote(directory)}; rmdir {shlex.quote(parent)} 2>/dev/null; true", "cleanup")
        except DeviceError:
            return False
        return True


def md5(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
