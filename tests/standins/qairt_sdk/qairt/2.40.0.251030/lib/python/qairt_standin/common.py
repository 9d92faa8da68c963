"""Helpers shared by the stand-in QAIRT tools: their log formats, the .bin payload, graph names."""
from __future__ import annotations

import datetime as _dt
import io
import json
import re
import sys
import tarfile
import time
from pathlib import Path

SDK_ROOT = Path(__file__).resolve().parents[3]   # qairt/<version>/ (lib/python/qairt_standin/ is 3 below)
PAYLOAD_MODEL = "model.onnx"                      # inside the converter's .bin (a tar, like the real one)
PAYLOAD_META = "standin.json"
_START = time.monotonic()


def sdk_version() -> str:
    """The stand-in SDK's version: its sdk.yaml (what the real SDK ships) or its folder name."""
    meta = SDK_ROOT / "sdk.yaml"
    if meta.is_file():
        fields = dict(re.findall(r"^(\w+):\s*(\S+)\s*$", meta.read_text(), re.M))
        if "version" in fields:
            return fields["version"] + (f".{fields['build_id']}" if "build_id" in fields else "")
    return SDK_ROOT.name


class PyLog:
    """The Python converters' log lines: `2025-10-30 12:00:00,123 - 235 - INFO - message`."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout

    def _emit(self, level: str, message: str) -> None:
        now = _dt.datetime.now()
        stamp = now.strftime("%Y-%m-%d %H:%M:%S") + f",{now.microsecond // 1000:03d}"
        for line in str(message).splitlines() or [""]:
            print(f"{stamp} - 235 - {level} - {line}", file=self.stream, flush=True)

    def info(self, message: str) -> None:
        self._emit("INFO", message)

    def warning(self, message: str) -> None:
        self._emit("WARNING", message)

    def error(self, message: str) -> None:
        self._emit("ERROR", message)


def native_log(level: str, message: str, stream=None) -> None:
    """The native tools' log lines: `     12.3ms [  INFO ] message`."""
    ms = (time.monotonic() - _START) * 1000
    print(f"{ms:11.1f}ms [{level.upper():>7} ] {message}", file=stream or sys.stdout, flush=True)


def converter_graph_name(output_base: str) -> str:
    """The graph name the converter derives from the .cpp basename: anything but [A-Za-z0-9_] becomes _."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", Path(output_base).name)
    return f"_{name}" if name[:1].isdigit() else name


def graph_name_from_cpp(cpp: Path) -> str | None:
    match = re.search(r'getQnnGraphConfigFromInfo\(\s*"([^"]+)"', cpp.read_text(errors="replace"))
    return match.group(1) if match else None


def write_payload(path: Path, model_bytes: bytes, meta: dict) -> None:
    """The converter's .bin: a tar archive (the real one is a tar of raw tensor files)."""
    with tarfile.open(path, "w") as tar:
        for name, data in ((PAYLOAD_MODEL, model_bytes), (PAYLOAD_META, json.dumps(meta, indent=2).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0  # reproducible: the same model gives the same .bin
            tar.addfile(info, io.BytesIO(data))


def read_payload(data: bytes) -> tuple[bytes, dict]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        model = tar.extractfile(PAYLOAD_MODEL).read()
        meta = json.loads(tar.extractfile(PAYLOAD_META).read())
    return model, meta
