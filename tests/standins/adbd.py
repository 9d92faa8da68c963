# Stand-in for the Android device daemon `adbd`, for tests only: no real phone exists here.
"""A small adbd that speaks the adb transport protocol over TCP on loopback.

The real adb server (Debian's /usr/bin/adb 1.0.41) connects to it exactly as to a phone in
TCP/IP mode: ``adb -P <serverport> connect 127.0.0.1:<port>``.  Clients (adbutils, the adb
command line) then talk to the server, and the server forwards services to this process.

Nothing here was checked against a real phone; it was checked against the real adb server
and adbutils (see tests/test_standin_adbd.py).

What is implemented (device side of AOSP packages/modules/adb: protocol.txt, SERVICES.TXT,
SYNC.TXT, file_sync_protocol.h, shell_protocol.h):

* transport messages: 24-byte header (command, arg0, arg1, data_length, data_check, magic =
  command ^ 0xffffffff), little endian.  CNXN handshake without AUTH (like a device with
  ``ro.adb.secure=0``), OPEN / OKAY / WRTE / CLSE with the one-WRTE-in-flight flow control.
  Outgoing packets always carry the byte-sum checksum (correct for every protocol version);
  incoming checksums are not checked (version 0x01000001 hosts send 0).
  version 0x01000001, maxdata 256 KiB.  Banner:
  ``device::ro.product.name=..;ro.product.model=..;ro.product.device=..;features=..``
* ``shell:<cmd>`` and ``exec:<cmd>`` (raw: stdout+stderr merged, no exit code, the stream is
  closed when the command ends), ``shell,v2[,raw|,pty][,TERM=..]:<cmd>`` (shell protocol v2:
  separate stdout/stderr packets, stdin/close-stdin packets, exit-code packet).  No pty is
  ever allocated (a ``pty`` request runs like ``raw``); an empty command runs ``/bin/sh``
  reading the stream as stdin.
* ``sync:`` STAT, STA2, LST2, LIST, LIS2, SEND (DATA chunks <= 64 KiB, DONE carrying mtime,
  reply OKAY or FAIL; parent directories are created = ``fixed_push_mkdir``), RECV (DATA
  chunks + DONE, or FAIL), QUIT.
* ``reconnect`` (device-side kick: closes the connection).

Not implemented: AUTH (RSA keys), STLS/TLS, USB, ptys / window size, SND2/RCV2
(sendrecv_v2 compression), ``abb``/``cmd`` (so no ``adb install``), ``jdwp``, ``tcp:``
forwarding, ``root:``/``remount:``/``reboot:``, framebuffer, logcat.  Unknown services are
refused with CLSE(0, remote-id), which adb reports to its client as ``closed``.

Sandbox (the device filesystem)
    ``--sandbox DIR`` is the phone's ``/data/local/tmp``.  sync requests map device paths
    ``/data/local/tmp[/...]`` to ``DIR[/...]``; any other path is refused like a real device
    refuses the ``shell`` user: RECV/SEND answer FAIL "...: Permission denied", STAT answers
    all zeros, LIST answers an empty listing ("/", "/data", "/data/local" stat as directories).
    Shell commands run as ``/bin/sh -c`` on *this* host with cwd = DIR, HOME = TMPDIR = DIR.
    Before running, every occurrence of the text ``/data/local/tmp`` in the command string is
    replaced by DIR (a plain textual rewrite, so DIR must be a path without shell
    metacharacters; it is checked).  Output is *not* rewritten back.  Shell commands are not
    jailed: they see the host's files and tools (GNU coreutils, not toybox).
    Environment of shell commands: a clean, device-like one: PATH = ``DIR/.standin-bin`` (a
    hook: put stand-ins for device tools such as ``qnn-net-run`` there; it need not exist),
    then this adbd's tool dir (``getprop``, ``setprop``, ``dumpsys``), then
    /usr/local/bin:/usr/bin:/bin.  Also STANDIN_ADBD_SANDBOX=DIR,
    STANDIN_ADBD_DEVICE_TMP=/data/local/tmp, STANDIN_ADBD_STATE=<state.json>,
    STANDIN_ADBD_SERIAL=<ro.serialno>, everything passed with ``--env NAME=VALUE``, and any
    STANDIN_* variable of the adbd's own environment.

Properties and battery
    ``getprop``/``setprop``/``dumpsys`` are small scripts on the shell PATH (so they work inside
    compound commands and from other scripts) that read/write ``<state-dir>/state.json``:
    ``{"props": {...}, "battery": {...}}``.  ``getprop`` behaves like Android's (no args:
    ``[name]: [value]`` lines sorted; one arg: value or empty line; two args: value or
    default).  ``dumpsys battery`` prints Android's BatteryService block; ``dumpsys battery
    set <key> <value>``, ``unplug`` and ``reset`` work like on Android.  Tests may edit
    state.json while the device runs (phone.py has helpers).

Unplug simulation (signals)
    SIGUSR1 = unplug: all adb connections are dropped, the listening socket is closed (the adb
    server's reconnect attempts are refused) and every running shell command is killed; prints
    ``unplugged``.  SIGUSR2 = plug back in: listens again on the same port; prints ``listening
    on ...`` again.  SIGTERM/SIGINT = stop.  Killing the process (SIGKILL) also works as an
    unplug, but running shell commands then outlive it.

CLI
    python tests/standins/adbd.py --port P --sandbox DIR [--state-dir DIR2]
        [--prop ro.soc.model=SM8650 --prop ro.product.model=Pixel-Standin ...]
        [--battery-level 85] [--env NAME=VALUE ...] [--verbose]
    ``--port 0`` picks a free port.  Prints ``listening on 127.0.0.1:P`` (flushed) when ready.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import posixpath
import queue
import re
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

# --- transport constants (protocol.txt) ---------------------------------------------------
A_CNXN = 0x4E584E43
A_AUTH = 0x48545541
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_STLS = 0x534C5453
A_SYNC = 0x434E5953
A_VERSION = 0x01000001
MAX_PAYLOAD = 256 * 1024
HEADER = struct.Struct("<6I")
NAMES = {A_CNXN: "CNXN", A_AUTH: "AUTH", A_OPEN: "OPEN", A_OKAY: "OKAY", A_CLSE: "CLSE",
         A_WRTE: "WRTE", A_STLS: "STLS", A_SYNC: "SYNC"}

# Features this stand-in really implements (the adb client picks protocols from these).
FEATURES = ("shell_v2", "stat_v2", "ls_v2", "fixed_push_mkdir")

# --- sync constants (file_sync_protocol.h) -----------------------------------------------
SYNC_DATA_MAX = 64 * 1024
SYNC_PATH_MAX = 1024
STAT_V2 = struct.Struct("<4sIQQIIIIQqqq")       # id error dev ino mode nlink uid gid size a m c
DENT_V2 = struct.Struct("<4sIQQIIIIQqqqI")      # ... + namelen

# --- shell protocol v2 ids (shell_protocol.h) ---------------------------------------------
SH_STDIN, SH_STDOUT, SH_STDERR, SH_EXIT, SH_CLOSE_STDIN, SH_WINSIZE = range(6)

DEVICE_TMP = "/data/local/tmp"
# Parents of /data/local/tmp: a real device lets the shell user stat them but not list them.
DEVICE_PARENTS = {"/": 0o40755, "/data": 0o40771, "/data/local": 0o40751}

SOC_PLATFORMS = {"SM8750": "sun", "SM8650": "pineapple", "SM8550": "kalama", "SM8475": "cape",
                 "SM8450": "taro", "SM8350": "lahaina", "SM7675": "cliffs", "SM7550": "crow",
                 "SM6450": "pitti", "QCS6490": "kodiak"}

VERBOSE = False


def log(msg: str) -> None:
    if VERBOSE:
        print(f"[adbd {time.monotonic():.3f}] {msg}", file=sys.stderr, flush=True)


class StreamClosed(Exception):
    pass


# ==========================================================================================
# transport
# ==========================================================================================
class Stream:
    """One adb stream (socket pair between a server-side id and our local id)."""

    def __init__(self, transport: "Transport", local_id: int, remote_id: int, service: str):
        self.transport = transport
        self.local_id = local_id
        self.remote_id = remote_id
        self.service = service
        self.inbox: queue.Queue = queue.Queue()
        self.can_write = threading.Event()
        self.can_write.set()  # "An OPEN message also implies a READY message"
        self.closed = threading.Event()
        self.wlock = threading.Lock()
        self._eof = False
        self._on_close: list = []
        self._close_lock = threading.Lock()

    # --- inbound -------------------------------------------------------------------------
    def read(self) -> bytes:
        """Next WRTE payload from the server; b'' once the stream is closed."""
        if self._eof:
            return b""
        item = self.inbox.get()
        if item is None:
            self._eof = True
            return b""
        # Deferred READY: acknowledge only once the data is consumed (back-pressure).
        self.transport.send(A_OKAY, self.local_id, self.remote_id)
        return item

    # --- outbound ------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        view = memoryview(data)
        with self.wlock:
            off = 0
            while off < len(view):
                while not self.can_write.wait(0.5):
                    if self.closed.is_set():
                        break
                if self.closed.is_set():
                    raise StreamClosed(self.service)
                chunk = bytes(view[off:off + self.transport.max_send])
                self.can_write.clear()
                if not self.transport.send(A_WRTE, self.local_id, self.remote_id, chunk):
                    raise StreamClosed(self.service)
                off += len(chunk)

    def on_close(self, fn) -> None:
        self._on_close.append(fn)

    def close(self) -> None:
        """Local close: tell the server (CLSE) and forget the stream."""
        with self._close_lock:
            if self.closed.is_set():
                return
            self.closed.set()
        self.transport.send(A_CLSE, self.local_id, self.remote_id)
        self.transport.forget(self)
        self._finish()

    def remote_closed(self) -> None:
        """The server closed the stream (CLSE) or the whole transport went away."""
        with self._close_lock:
            already = self.closed.is_set()
            self.closed.set()
        self.inbox.put(None)
        self.can_write.set()
        if not already:
            self._finish()

    def _finish(self) -> None:
        for fn in self._on_close:
            try:
                fn()
            except Exception as exc:  # pragma: no cover - best effort cleanup
                log(f"on_close failed: {exc!r}")


class Transport(threading.Thread):
    """One TCP connection from the adb server."""

    def __init__(self, daemon_: "Adbd", sock: socket.socket, peer):
        super().__init__(name=f"transport-{peer}", daemon=True)
        self.adbd = daemon_
        self.sock = sock
        self.peer = peer
        self.slock = threading.Lock()
        self.streams: dict[int, Stream] = {}
        self.ids_lock = threading.Lock()
        self.next_id = 1
        self.max_send = 4096
        self.online = False
        self.dead = False

    def send(self, cmd: int, arg0: int, arg1: int, data: bytes = b"") -> bool:
        hdr = HEADER.pack(cmd, arg0, arg1, len(data), sum(data) & 0xFFFFFFFF, cmd ^ 0xFFFFFFFF)
        log(f"{self.peer} <- {NAMES.get(cmd, hex(cmd))}({arg0}, {arg1}, {len(data)} bytes)")
        with self.slock:
            if self.dead:
                return False
            try:
                self.sock.sendall(hdr + data)
                return True
            except OSError:
                self.dead = True
        self.abort()
        return False

    def _recv_exact(self, n: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except OSError:
                return None
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def run(self) -> None:
        try:
            while True:
                hdr = self._recv_exact(HEADER.size)
                if hdr is None:
                    break
                cmd, arg0, arg1, length, _check, magic = HEADER.unpack(hdr)
                if magic != cmd ^ 0xFFFFFFFF or length > MAX_PAYLOAD:
                    log(f"{self.peer}: bad header {hdr!r}; closing (protocol.txt)")
                    break
                data = self._recv_exact(length) if length else b""
                if data is None:
                    break
                log(f"{self.peer} -> {NAMES.get(cmd, hex(cmd))}({arg0}, {arg1}, {len(data)} bytes)")
                if not self.handle(cmd, arg0, arg1, data):
                    break
        finally:
            self.abort()

    def handle(self, cmd: int, arg0: int, arg1: int, data: bytes) -> bool:
        if cmd == A_CNXN:
            if self.online:  # a new CNXN resets the connection's streams
                self._drop_streams()
            self.max_send = max(256, min(arg1, MAX_PAYLOAD))
            self.online = True
            self.send(A_CNXN, A_VERSION, MAX_PAYLOAD, self.adbd.banner().encode())
            return True
        if not self.online:
            return True  # "Any messages received before a CONNECT message MUST be ignored."
        if cmd == A_OPEN:
            service = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            handler = self.adbd.service_handler(service)
            if handler is None or arg0 == 0:
                log(f"refusing service {service!r}")
                self.send(A_CLSE, 0, arg0)
                return True
            with self.ids_lock:
                local_id = self.next_id
                self.next_id += 1
                stream = Stream(self, local_id, arg0, service)
                self.streams[local_id] = stream
            self.send(A_OKAY, local_id, arg0)
            threading.Thread(target=self.adbd.run_service, args=(handler, stream),
                             name=f"svc-{service[:30]}", daemon=True).start()
            return True
        if cmd == A_OKAY:
            stream = self.streams.get(arg1)
            if stream is not None:
                stream.can_write.set()
            return True
        if cmd == A_WRTE:
            stream = self.streams.get(arg1)
            if stream is not None:
                stream.inbox.put(data)
            return True
        if cmd == A_CLSE:
            with self.ids_lock:
                stream = self.streams.pop(arg1, None)
            if stream is not None:
                stream.remote_closed()
            return True
        if cmd in (A_AUTH, A_SYNC):
            return True  # we never asked for AUTH; SYNC is obsolete
        log(f"unknown command {cmd:#x}; closing")
        return False

    def forget(self, stream: Stream) -> None:
        with self.ids_lock:
            self.streams.pop(stream.local_id, None)

    def _drop_streams(self) -> None:
        with self.ids_lock:
            streams = list(self.streams.values())
            self.streams.clear()
        for s in streams:
            s.remote_closed()

    def abort(self) -> None:
        """Drop the connection (cable pulled / server gone)."""
        with self.slock:
            self.dead = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        self._drop_streams()
        self.adbd.transport_gone(self)


# ==========================================================================================
# the daemon
# ==========================================================================================
class Adbd:
    def __init__(self, port: int, sandbox: str, state_dir: str, props: dict[str, str],
                 battery_level: int, extra_env: dict[str, str]):
        self.port = port
        self.sandbox = sandbox
        self.state_dir = state_dir
        self.props = props
        self.battery_level = battery_level
        self.extra_env = extra_env
        self.listener: socket.socket | None = None
        self.transports: set[Transport] = set()
        self.procs: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.stopping = False

    # --- setup ---------------------------------------------------------------------------
    def listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(16)
        self.port = sock.getsockname()[1]
        self.listener = sock

    def write_state(self) -> None:
        os.makedirs(self.tools_dir, exist_ok=True)
        port = self.port
        props = dict(self.props)
        soc = props.get("ro.soc.model", "SM8650")
        defaults = {
            "ro.soc.model": soc,
            "ro.soc.manufacturer": "QTI",
            "ro.board.platform": SOC_PLATFORMS.get(soc, "unknown"),
            "ro.hardware": "qcom",
            "ro.product.model": "Standin-Phone",
            "ro.product.name": "standin",
            "ro.product.device": "standin",
            "ro.product.brand": "standin",
            "ro.product.manufacturer": "Standin",
            "ro.product.cpu.abi": "arm64-v8a",
            "ro.product.cpu.abilist": "arm64-v8a,armeabi-v7a,armeabi",
            "ro.build.version.release": "14",
            "ro.build.version.sdk": "34",
            "ro.build.type": "user",
            "ro.debuggable": "0",
            "ro.serialno": f"STANDIN{port}",
            "ro.adb.secure": "0",
            "sys.usb.state": "adb",
        }
        for k, v in defaults.items():
            props.setdefault(k, v)
        self.props = props
        battery = battery_defaults(self.battery_level)
        state = {"props": props, "battery": battery, "battery_defaults": dict(battery)}
        write_json_atomic(self.state_path, state)
        write_tools(self.tools_dir, self.state_path)

    @property
    def tools_dir(self) -> str:
        return os.path.join(self.state_dir, "bin")

    @property
    def state_path(self) -> str:
        return os.path.join(self.state_dir, "state.json")

    def banner(self) -> str:
        p = self.props
        return (f"device::ro.product.name={p['ro.product.name']};"
                f"ro.product.model={p['ro.product.model']};"
                f"ro.product.device={p['ro.product.device']};"
                f"features={','.join(FEATURES)}")

    # --- main loop -----------------------------------------------------------------------
    def serve_forever(self) -> None:
        rsock, wsock = socket.socketpair()
        wsock.setblocking(False)
        signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: None)  # real work happens below, outside the handler
        print(f"listening on 127.0.0.1:{self.port}", flush=True)
        while not self.stopping:
            watch = [rsock] + ([self.listener] if self.listener is not None else [])
            try:
                ready, _, _ = select.select(watch, [], [])
            except InterruptedError:
                continue
            if rsock in ready:
                for signum in rsock.recv(64):
                    self.on_signal(signum)
            if self.listener is not None and self.listener in ready:
                try:
                    conn, peer = self.listener.accept()
                except OSError:
                    continue
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                t = Transport(self, conn, f"{peer[0]}:{peer[1]}")
                with self.lock:
                    self.transports.add(t)
                log(f"connection from {peer}")
                t.start()
        self.unplug(announce=False)

    def on_signal(self, signum: int) -> None:
        if signum == signal.SIGUSR1:
            self.unplug()
        elif signum == signal.SIGUSR2:
            if self.listener is None:
                self.listen_same_port()
                print(f"listening on 127.0.0.1:{self.port}", flush=True)
        else:
            self.stopping = True

    def listen_same_port(self) -> None:
        for _ in range(50):
            try:
                self.listen()
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"cannot listen again on 127.0.0.1:{self.port}")

    def unplug(self, announce: bool = True) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        with self.lock:
            transports = list(self.transports)
        for t in transports:
            t.abort()
        with self.lock:
            procs = list(self.procs)
        for p in procs:
            kill_group(p)
        if announce:
            print("unplugged", flush=True)

    def transport_gone(self, t: Transport) -> None:
        with self.lock:
            self.transports.discard(t)

    # --- services ------------------------------------------------------------------------
    def service_handler(self, service: str):
        if service.startswith("shell") and (service[5:6] in (":", ",")):
            head, _, cmd = service.partition(":")
            opts = head.split(",")[1:]
            if "v2" in opts:
                return lambda s: self.shell_v2(s, cmd)
            return lambda s: self.shell_raw(s, cmd)
        if service.startswith("exec:"):
            cmd = service[5:]
            return lambda s: self.shell_raw(s, cmd)
        if service == "sync:":
            return lambda s: SyncSession(self, s).run()
        if service.startswith("reconnect"):
            return lambda s: s.transport.abort()
        return None

    def run_service(self, handler, stream: Stream) -> None:
        try:
            handler(stream)
        except StreamClosed:
            pass
        except Exception as exc:
            print(f"service {stream.service!r} failed: {exc!r}", file=sys.stderr, flush=True)
        finally:
            stream.close()

    # --- shell ---------------------------------------------------------------------------
    def shell_env(self) -> dict[str, str]:
        env = {
            "PATH": os.pathsep.join([os.path.join(self.sandbox, ".standin-bin"), self.tools_dir,
                                     "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": self.sandbox,
            "TMPDIR": self.sandbox,
            "SHELL": "/bin/sh",
            "USER": "shell",
            "LOGNAME": "shell",
            "HOSTNAME": self.props.get("ro.product.device", "standin"),
            "ANDROID_DATA": "/data",
            "ANDROID_ROOT": "/system",
            "EXTERNAL_STORAGE": "/sdcard",
            "STANDIN_ADBD_SANDBOX": self.sandbox,
            "STANDIN_ADBD_DEVICE_TMP": DEVICE_TMP,
            "STANDIN_ADBD_STATE": self.state_path,
            "STANDIN_ADBD_SERIAL": self.props.get("ro.serialno", ""),
        }
        for k in ("LANG", "LC_ALL"):
            if k in os.environ:
                env[k] = os.environ[k]
        for k, v in os.environ.items():
            if k.startswith("STANDIN_") and k not in env:
                env[k] = v
        env.update(self.extra_env)
        return env

    def spawn(self, cmd: str, merge_stderr: bool) -> subprocess.Popen:
        # Device paths in the command text are rewritten textually: /data/local/tmp -> sandbox.
        host_cmd = cmd.replace(DEVICE_TMP, self.sandbox)
        argv = ["/bin/sh", "-c", host_cmd] if host_cmd.strip() else ["/bin/sh"]
        log(f"spawn {argv!r}")
        proc = subprocess.Popen(argv, cwd=self.sandbox, env=self.shell_env(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                                start_new_session=True, bufsize=0, close_fds=True)
        with self.lock:
            self.procs.add(proc)
        return proc

    def reap(self, proc: subprocess.Popen) -> int:
        rc = proc.wait()
        with self.lock:
            self.procs.discard(proc)
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        return rc

    def shell_raw(self, stream: Stream, cmd: str) -> None:
        """Legacy shell (and exec:): bytes in = stdin, bytes out = stdout+stderr, no exit code."""
        proc = self.spawn(cmd, merge_stderr=True)
        stream.on_close(lambda: kill_group(proc))

        def feed_stdin() -> None:
            broken = False
            while True:
                data = stream.read()
                if not data:
                    break
                if broken:
                    continue
                try:
                    proc.stdin.write(data)
                except (BrokenPipeError, ValueError, OSError):
                    broken = True
            try:
                proc.stdin.close()
            except OSError:
                pass

        threading.Thread(target=feed_stdin, daemon=True).start()
        fd = proc.stdout.fileno()
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                stream.write(chunk)
        except StreamClosed:
            kill_group(proc)
        finally:
            self.reap(proc)

    def shell_v2(self, stream: Stream, cmd: str) -> None:
        """Shell protocol v2: [id:u8][len:u32le][data] packets both ways, exit code at the end."""
        proc = self.spawn(cmd, merge_stderr=False)
        stream.on_close(lambda: kill_group(proc))

        def packet(kind: int, data: bytes) -> bytes:
            return struct.pack("<BI", kind, len(data)) + data

        def feed_stdin() -> None:
            buf = bytearray()
            stdin_open = True
            while True:
                data = stream.read()
                if not data:
                    break
                buf += data
                while len(buf) >= 5:
                    kind, length = struct.unpack_from("<BI", buf)
                    if len(buf) < 5 + length:
                        break
                    payload = bytes(buf[5:5 + length])
                    del buf[:5 + length]
                    if kind == SH_STDIN and stdin_open:
                        try:
                            proc.stdin.write(payload)
                        except (BrokenPipeError, ValueError, OSError):
                            stdin_open = False
                    elif kind == SH_CLOSE_STDIN and stdin_open:
                        stdin_open = False
                        try:
                            proc.stdin.close()
                        except OSError:
                            pass
                    # SH_WINSIZE: no pty, nothing to resize
            try:
                proc.stdin.close()
            except OSError:
                pass

        def pump(f, kind: int, failed: list) -> None:
            fd = f.fileno()
            try:
                while True:
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        return
                    stream.write(packet(kind, chunk))
            except StreamClosed:
                failed.append(True)
                kill_group(proc)

        threading.Thread(target=feed_stdin, daemon=True).start()
        failed: list = []
        err = threading.Thread(target=pump, args=(proc.stderr, SH_STDERR, failed), daemon=True)
        err.start()
        pump(proc.stdout, SH_STDOUT, failed)
        err.join()
        rc = self.reap(proc)
        if failed:
            return
        code = rc if rc >= 0 else 128 + (-rc)  # killed by a signal: 128+N like adbd/sh
        stream.write(packet(SH_EXIT, bytes([code & 0xFF])))

    # --- device paths --------------------------------------------------------------------
    def host_path(self, device_path: str) -> str | None:
        """Map a device path to the sandbox, or None if it is outside /data/local/tmp."""
        p = posixpath.normpath("/" + device_path.lstrip("/")) if device_path else "/"
        if p.startswith("//"):
            p = "/" + p.lstrip("/")
        if p == DEVICE_TMP:
            return self.sandbox
        if p.startswith(DEVICE_TMP + "/"):
            return os.path.join(self.sandbox, p[len(DEVICE_TMP) + 1:])
        return None

    @staticmethod
    def device_parent(device_path: str) -> int | None:
        p = posixpath.normpath("/" + device_path.lstrip("/")) if device_path else "/"
        if p.startswith("//"):
            p = "/" + p.lstrip("/")
        return DEVICE_PARENTS.get(p)


# ==========================================================================================
# sync:
# ==========================================================================================
class SyncSession:
    def __init__(self, adbd: Adbd, stream: Stream):
        self.adbd = adbd
        self.stream = stream
        self.buf = bytearray()

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.stream.read()
            if not data:
                raise StreamClosed("sync")
            self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def fail(self, msg: str) -> None:
        data = msg.encode("utf-8", "replace")
        self.stream.write(b"FAIL" + struct.pack("<I", len(data)) + data)

    def run(self) -> None:
        while True:
            req = self.read_exact(8)
            ident, length = req[:4], struct.unpack("<I", req[4:])[0]
            if ident == b"QUIT":
                return
            if length > SYNC_PATH_MAX:
                self.fail("path too long")
                return
            path = self.read_exact(length).decode("utf-8", "surrogateescape")
            log(f"sync {ident.decode(errors='replace')} {path!r}")
            if ident == b"STAT":
                self.do_stat_v1(path)
            elif ident in (b"STA2", b"LST2"):
                self.do_stat_v2(ident, path)
            elif ident == b"LIST":
                self.do_list(path, v2=False)
            elif ident == b"LIS2":
                self.do_list(path, v2=True)
            elif ident == b"SEND":
                if not self.do_send(path):
                    return
            elif ident == b"RECV":
                if not self.do_recv(path):
                    return
            else:
                self.fail(f"unknown command {ident!r}")
                return

    # STAT (v1 uses lstat; errors are all zeros)
    def do_stat_v1(self, path: str) -> None:
        host = self.adbd.host_path(path)
        mode = size = mtime = 0
        if host is None:
            mode = Adbd.device_parent(path) or 0
        else:
            try:
                st = os.lstat(host)
                mode, size, mtime = st.st_mode, st.st_size, int(st.st_mtime)
            except OSError:
                pass
        self.stream.write(b"STAT" + struct.pack("<III", mode & 0xFFFFFFFF, size & 0xFFFFFFFF,
                                                mtime & 0xFFFFFFFF))

    def do_stat_v2(self, ident: bytes, path: str) -> None:
        host = self.adbd.host_path(path)
        if host is None:
            parent_mode = Adbd.device_parent(path)
            if parent_mode is not None:
                self.stream.write(STAT_V2.pack(ident, 0, 0, 0, parent_mode, 2, 0, 0, 4096, 0, 0, 0))
            else:
                self.stream.write(STAT_V2.pack(ident, errno.EACCES, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
            return
        try:
            st = os.stat(host) if ident == b"STA2" else os.lstat(host)
        except OSError as exc:
            self.stream.write(STAT_V2.pack(ident, exc.errno or errno.EIO, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
            return
        self.stream.write(stat_v2_fields(STAT_V2, ident, st))

    def do_list(self, path: str, v2: bool) -> None:
        host = self.adbd.host_path(path)
        out = bytearray()
        names: list[str] = []
        if host is not None and os.path.isdir(host):
            try:
                names = [".", ".."] + os.listdir(host)
            except OSError:
                names = []
        for name in names:
            try:
                st = os.lstat(os.path.join(host, name))
            except OSError:
                continue
            raw = name.encode("utf-8", "surrogateescape")
            if v2:
                out += stat_v2_fields(DENT_V2, b"DNT2", st, len(raw)) + raw
            else:
                out += b"DENT" + struct.pack("<IIII", st.st_mode & 0xFFFFFFFF,
                                             st.st_size & 0xFFFFFFFF,
                                             int(st.st_mtime) & 0xFFFFFFFF, len(raw)) + raw
            if len(out) >= SYNC_DATA_MAX:
                self.stream.write(bytes(out))
                out.clear()
        if v2:
            out += DENT_V2.pack(b"DONE", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        else:
            out += b"DONE" + bytes(16)
        self.stream.write(bytes(out))

    def _drain_send(self) -> bool:
        """After a FAIL, swallow DATA until DONE like adbd does (old clients keep writing)."""
        while True:
            ident, length = struct.unpack("<4sI", self.read_exact(8))
            if ident == b"DATA":
                self.read_exact(length)
            else:
                return False

    def do_send(self, spec: str) -> bool:
        path, comma, mode_s = spec.rpartition(",")
        if not comma:
            self.fail("missing , in ID_SEND")
            return False
        try:
            mode = int(mode_s)
        except ValueError:
            self.fail(f"bad mode {mode_s!r} in ID_SEND")
            return False
        host = self.adbd.host_path(path)
        if host is None:
            self.fail("couldn't create file: Permission denied")
            return self._drain_send()
        if path.endswith("/") or (os.path.isdir(host) and not os.path.islink(host)):
            # adbd's open(O_CREAT) of "dir/" fails with EISDIR (after mkdir -p of the parents)
            try:
                os.makedirs(host, exist_ok=True)
            except OSError:
                pass
            self.fail("couldn't create file: Is a directory")
            return self._drain_send()
        is_link = stat.S_ISLNK(mode)
        try:
            os.makedirs(os.path.dirname(host), exist_ok=True)  # fixed_push_mkdir
            if os.path.lexists(host):
                os.unlink(host)
            f = None if is_link else open(host, "wb")
        except OSError as exc:
            self.fail(f"couldn't create file: {exc.strerror}")
            return self._drain_send()
        link_target = bytearray()
        try:
            while True:
                ident, length = struct.unpack("<4sI", self.read_exact(8))
                if ident == b"DATA":
                    if length > SYNC_DATA_MAX:
                        raise ValueError("data chunk too large")
                    data = self.read_exact(length)
                    if f is not None:
                        f.write(data)
                    else:
                        link_target += data
                elif ident == b"DONE":
                    mtime = length
                    if f is not None:
                        f.close()
                        f = None
                        os.chmod(host, mode & 0o7777)
                        os.utime(host, (mtime, mtime))
                    else:
                        os.symlink(link_target.decode("utf-8", "surrogateescape"), host)
                    self.stream.write(b"OKAY" + bytes(4))
                    return True
                else:
                    raise ValueError(f"invalid data message {ident!r}")
        except StreamClosed:
            if f is not None:
                f.close()
            try:
                os.unlink(host)  # partial file of an interrupted push
            except OSError:
                pass
            raise
        except (OSError, ValueError) as exc:
            if f is not None:
                f.close()
            try:
                os.unlink(host)
            except OSError:
                pass
            self.fail(getattr(exc, "strerror", None) or str(exc))
            return False

    def do_recv(self, path: str) -> bool:
        host = self.adbd.host_path(path)
        if host is None:
            self.fail("open failed: Permission denied")
            return False
        try:
            f = open(host, "rb")
            if os.path.isdir(host):
                f.close()
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        except OSError as exc:
            self.fail(f"open failed: {exc.strerror}")
            return False
        with f:
            while True:
                chunk = f.read(SYNC_DATA_MAX)
                if not chunk:
                    break
                self.stream.write(b"DATA" + struct.pack("<I", len(chunk)) + chunk)
        self.stream.write(b"DONE" + bytes(4))
        return True


def stat_v2_fields(st_struct: struct.Struct, ident: bytes, st: os.stat_result, *extra) -> bytes:
    return st_struct.pack(ident, 0, st.st_dev & (2**64 - 1), st.st_ino & (2**64 - 1),
                          st.st_mode & 0xFFFFFFFF, st.st_nlink & 0xFFFFFFFF,
                          2000, 2000,  # uid/gid "shell", as on a device
                          st.st_size, int(st.st_atime), int(st.st_mtime), int(st.st_ctime), *extra)


# ==========================================================================================
# helpers: processes, state file, device tools
# ==========================================================================================
def kill_group(proc: subprocess.Popen) -> None:
    # The whole process group, even if its leader (/bin/sh) already exited: background
    # children keep the output pipe open and would otherwise outlive the session.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def write_json_atomic(path: str, obj) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".state-")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def battery_defaults(level: int) -> dict:
    level = max(0, min(100, int(level)))
    return {
        "ac": False, "usb": True, "wireless": False, "dock": False,
        "max_charging_current": 500000, "max_charging_voltage": 5000000,
        "counter": 4_700_000 * level // 100,
        "status": 2 if level < 100 else 5,  # BATTERY_STATUS_CHARGING / FULL
        "health": 2,                        # BATTERY_HEALTH_GOOD
        "present": True,
        "level": level, "scale": 100,
        "voltage": 3500 + 7 * level,        # mV
        "temperature": 291,                 # tenths of a degree C
        "technology": "Li-ion",
    }


TOOL_COMMON = r'''
import json, os, sys, tempfile
STATE = {state!r}

def load():
    with open(STATE) as f:
        return json.load(f)

def save(state):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(STATE), prefix=".state-")
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.replace(tmp, STATE)
'''

GETPROP = r'''
# getprop stand-in (Android toybox getprop behaviour), generated by tests/standins/adbd.py
args = [a for a in sys.argv[1:]]
props = load()["props"]
if not args:
    for k in sorted(props):
        print(f"[{k}]: [{props[k]}]")
elif len(args) <= 2:
    print(props.get(args[0], args[1] if len(args) == 2 else ""))
else:
    print("usage: getprop [NAME [DEFAULT]]", file=sys.stderr)
    sys.exit(1)
'''

SETPROP = r'''
# setprop stand-in, generated by tests/standins/adbd.py
if len(sys.argv) != 3:
    print("usage: setprop NAME VALUE", file=sys.stderr)
    sys.exit(1)
name, value = sys.argv[1], sys.argv[2]
state = load()
if name.startswith("ro.") and name in state["props"]:
    print(f"Failed to set property '{name}' to '{value}'.\nSee dmesg for error reason.",
          file=sys.stderr)
    sys.exit(1)
state["props"][name] = value
save(state)
'''

DUMPSYS = r'''
# dumpsys stand-in (only the battery service), generated by tests/standins/adbd.py
args = sys.argv[1:]
if not args or args[0] in ("-l",):
    print("Currently running services:\n  battery")
    sys.exit(0)
if args[0] != "battery":
    print(f"Can't find service: {args[0]}")
    sys.exit(0)
state = load()
b = state["battery"]
sub = args[1:]
KEYS = {"ac": "ac", "usb": "usb", "wireless": "wireless", "dock": "dock", "status": "status",
        "level": "level", "temp": "temperature", "present": "present", "counter": "counter",
        "voltage": "voltage"}
if sub and sub[0] == "set" and len(sub) == 3 and sub[1] in KEYS:
    key, val = KEYS[sub[1]], sub[2]
    b[key] = (val not in ("0", "false")) if isinstance(b.get(key), bool) else int(val)
    save(state)
    sys.exit(0)
if sub and sub[0] == "unplug":
    b["ac"] = b["usb"] = b["wireless"] = b["dock"] = False
    b["status"] = 3  # BATTERY_STATUS_DISCHARGING
    save(state)
    sys.exit(0)
if sub and sub[0] == "reset":
    state["battery"] = dict(state.get("battery_defaults", b))
    save(state)
    sys.exit(0)
if sub and sub[0] not in ("-a", "--checkin"):
    print("Battery service (battery) commands:\n  set [-f] [ac|usb|wireless|status|level|temp|present|counter|invalid] <value>\n  unplug [-f]\n  reset [-f] [ac|usb|wireless|status|level|temp|present|counter|invalid]")
    sys.exit(0)
t = lambda v: "true" if v else "false"
print("Current Battery Service state:")
print(f"  AC powered: {t(b['ac'])}")
print(f"  USB powered: {t(b['usb'])}")
print(f"  Wireless powered: {t(b['wireless'])}")
print(f"  Dock powered: {t(b['dock'])}")
print(f"  Max charging current: {b['max_charging_current']}")
print(f"  Max charging voltage: {b['max_charging_voltage']}")
print(f"  Charge counter: {b['counter']}")
print(f"  status: {b['status']}")
print(f"  health: {b['health']}")
print(f"  present: {t(b['present'])}")
print(f"  level: {b['level']}")
print(f"  scale: {b['scale']}")
print(f"  voltage: {b['voltage']}")
print(f"  temperature: {b['temperature']}")
print(f"  technology: {b['technology']}")
'''


def write_tools(tools_dir: str, state_path: str) -> None:
    exe = sys.executable
    shebang = f"#!{exe}" if len(exe) < 120 and " " not in exe else "#!/usr/bin/env python3"
    for name, body in (("getprop", GETPROP), ("setprop", SETPROP), ("dumpsys", DUMPSYS)):
        path = os.path.join(tools_dir, name)
        with open(path, "w") as f:
            f.write(shebang + "\n" + TOOL_COMMON.format(state=state_path) + body)
        os.chmod(path, 0o755)


SAFE_PATH = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def main(argv: list[str] | None = None) -> int:
    global VERBOSE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0 = any free)")
    ap.add_argument("--sandbox", required=True, help="host dir that is the device's /data/local/tmp")
    ap.add_argument("--state-dir", help="where state.json and the getprop/dumpsys tools go "
                                        "(default: a temp dir removed on exit)")
    ap.add_argument("--prop", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--battery-level", type=int, default=85)
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="extra environment variable for shell commands")
    ap.add_argument("--verbose", action="store_true", help="log every packet to stderr")
    args = ap.parse_args(argv)
    VERBOSE = args.verbose

    sandbox = os.path.realpath(args.sandbox)
    if not SAFE_PATH.fullmatch(sandbox):
        ap.error(f"sandbox path {sandbox!r} must not contain spaces or shell metacharacters "
                 "(it is substituted textually into shell commands)")
    os.makedirs(sandbox, exist_ok=True)
    def pairs(option: str, items: list[str]) -> dict[str, str]:
        parsed = {}
        for item in items:
            name, eq, value = item.partition("=")
            if not eq or not name:
                ap.error(f"{option} wants NAME=VALUE, got {item!r}")
            parsed[name] = value
        return parsed

    props = pairs("--prop", args.prop)
    extra_env = pairs("--env", args.env)
    own_state = args.state_dir is None
    state_dir = tempfile.mkdtemp(prefix="standin-adbd-") if own_state else os.path.realpath(args.state_dir)
    os.makedirs(state_dir, exist_ok=True)

    adbd = Adbd(args.port, sandbox, state_dir, props, args.battery_level, extra_env)
    try:
        adbd.listen()
        adbd.write_state()
        adbd.serve_forever()
    finally:
        if own_state:
            shutil.rmtree(state_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
