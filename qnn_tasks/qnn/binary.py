"""Read QNN context binary (``*.bin``) metadata through ``libQnnSystem.so``.

Nothing is loaded onto a backend: the system library only parses the binary's
header (``QnnSystemContext_getBinaryInfo``), so this works on any Linux x86-64
host that has the ``onnxruntime-qnn`` wheel installed.

Usage: ``python -m qnn_tasks.qnn.binary FILE.bin [--json]``

The ctypes structures mirroring the public QNN headers are in qnn/binary_layout.py.
"""

from __future__ import annotations

import argparse
import ctypes as C
import functools
import importlib.util
import json
import mmap
import os
import struct
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qnn_tasks.qnn.binary_layout import (
    DTYPES,
    ENCODINGS,
    QNN_DEFINITION_DEFINED,
    SYSTEM_API_MAJOR,
    ErrorHandle,
    HtpGraphBlobV1,
    HtpGraphBlobV2,
    QnnBinaryInfo,
    QnnGraphInfo,
    QnnQuantizeParams,
    QnnSystemApi,
    QnnSystemInterface,
    QnnTensor,
    error_text,
)

__all__ = [
    "QnnBinError",
    "TensorInfo",
    "GraphInfo",
    "BinaryInfo",
    "find_system_library",
    "graph_memory",
    "read_binary_info",
    "main",
]

ENV_SYSTEM_LIB = "QNN_SYSTEM_LIB"
INSTALL_HINT = "pip install onnxruntime-qnn (Linux x86-64 wheel)"


class QnnBinError(Exception):
    """A one-line, user-facing error naming the file and the fix."""


# --------------------------------------------------------------------------
# Public data model
# --------------------------------------------------------------------------


@dataclass
class TensorInfo:
    """A graph input or output tensor."""

    name: str
    dtype: str
    shape: list[int]
    quantization: dict | None = None


@dataclass
class GraphInfo:
    """One graph stored in the context binary."""

    name: str
    inputs: list[TensorInfo] = field(default_factory=list)
    outputs: list[TensorInfo] = field(default_factory=list)
    # bytes the HTP prepare library says the graph holds (graph_memory), None where the binary does not say
    memory: dict[str, int] | None = None


@dataclass
class BinaryInfo:
    """What ``QnnSystemContext_getBinaryInfo`` reports about a context binary."""

    path: str
    binary_info_version: int
    build_id: str
    core_api_version: str
    backend_api_version: str
    soc_model: int | None
    dsp_arch: str | None
    context_metadata: list[int] | None
    graphs: list[GraphInfo]

    def to_dict(self) -> dict:
        """JSON-serialisable dict."""
        return asdict(self)


# --------------------------------------------------------------------------
# Library loading
# --------------------------------------------------------------------------


def find_system_library() -> Path:
    """Locate libQnnSystem.so (env QNN_SYSTEM_LIB, else the onnxruntime_qnn package dir)."""
    override = os.environ.get(ENV_SYSTEM_LIB)
    if override:
        path = Path(override)
        if not path.is_file():
            raise QnnBinError(f"{path}: {ENV_SYSTEM_LIB} points to a missing file; fix or unset it")
        return path
    try:
        spec = importlib.util.find_spec("onnxruntime_qnn")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "libQnnSystem.so"
        if path.is_file():
            return path
    raise QnnBinError(f"libQnnSystem.so not found; {INSTALL_HINT} or set {ENV_SYSTEM_LIB}")


@functools.lru_cache(maxsize=None)
def _load_api(lib_path: str) -> tuple[C.CDLL, QnnSystemApi]:
    """dlopen the system library once and pick its QNN system API provider."""
    try:
        # onnx first: a process that loads libQnnSystem before onnx/numpy and starts an
        # onnxruntime-qnn session later crashes (seen with the wheel's QNN 2.51).
        import onnx  # noqa: F401  (imported for its side effect on shared libraries)
    except ImportError:
        pass
    try:
        lib = C.CDLL(lib_path)
        get_providers = lib.QnnSystemInterface_getProviders
    except (OSError, AttributeError) as exc:
        raise QnnBinError(f"{lib_path}: cannot load QNN system library ({exc}); {INSTALL_HINT}") from None
    get_providers.restype = ErrorHandle
    get_providers.argtypes = [C.POINTER(C.POINTER(C.POINTER(QnnSystemInterface))), C.POINTER(C.c_uint32)]
    providers = C.POINTER(C.POINTER(QnnSystemInterface))()
    count = C.c_uint32(0)
    err = get_providers(C.byref(providers), C.byref(count))
    if err or not providers:
        raise QnnBinError(f"{lib_path}: QnnSystemInterface_getProviders failed ({error_text(err)}); {INSTALL_HINT}")
    for i in range(count.value):
        iface = providers[i].contents
        api = iface.api
        if (iface.systemApiVersion.major == SYSTEM_API_MAJOR and api.systemContextCreate
                and api.systemContextGetBinaryInfo and api.systemContextFree):
            return lib, api
    raise QnnBinError(f"{lib_path}: no compatible QNN system API provider (need major {SYSTEM_API_MAJOR}); "
                      f"{INSTALL_HINT}")


# --------------------------------------------------------------------------
# Conversion of C structs to dataclasses
# --------------------------------------------------------------------------


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw else ""


def _f32(value: float) -> float:
    """Shortest decimal that round-trips to the same float32 (0.019999999552965164 -> 0.02)."""
    for digits in range(1, 10):
        short = float(f"{value:.{digits}g}")
        if struct.unpack("f", struct.pack("f", short))[0] == value:
            return short
    return value


def _quantization(q: QnnQuantizeParams) -> dict | None:
    """Readable summary of Qnn_QuantizeParams_t, or None when not quantized."""
    if q.encodingDefinition != QNN_DEFINITION_DEFINED or q.quantizationEncoding >= len(ENCODINGS):
        return None
    enc = ENCODINGS[q.quantizationEncoding]
    out: dict[str, Any] = {"encoding": enc}
    if enc == "scale_offset":
        out.update(scale=_f32(q.scaleOffsetEncoding.scale), offset=q.scaleOffsetEncoding.offset)
    elif enc == "bw_scale_offset":
        e = q.bwScaleOffsetEncoding
        out.update(bitwidth=e.bitwidth, scale=_f32(e.scale), offset=e.offset)
    elif enc == "axis_scale_offset":
        e = q.axisScaleOffsetEncoding
        scales = [e.scaleOffset[i].scale for i in range(e.numScaleOffsets)] if e.scaleOffset else []
        out.update(axis=e.axis, count=e.numScaleOffsets, **_scale_range(scales))
    elif enc == "bw_axis_scale_offset":
        e = q.bwAxisScaleOffsetEncoding
        scales = e.scales[: e.numElements] if e.scales else []
        out.update(bitwidth=e.bitwidth, axis=e.axis, count=e.numElements, **_scale_range(scales))
    return out


def _scale_range(scales: list[float]) -> dict:
    return {"scale_min": _f32(min(scales)), "scale_max": _f32(max(scales))} if scales else {}


def _tensor(t: QnnTensor) -> TensorInfo:
    body = t.v2 if t.version == 2 else t.v1  # both share the leading V1 fields
    dims = [body.dimensions[i] for i in range(body.rank)] if body.dimensions else []
    return TensorInfo(
        name=_text(body.name),
        dtype=DTYPES.get(body.dataType, f"unknown_0x{body.dataType:x}"),
        shape=dims,
        quantization=_quantization(body.quantizeParams),
    )


def _tensors(array: Any, count: int) -> list[TensorInfo]:
    return [_tensor(array[i]) for i in range(count)] if array else []


def _graph(g: QnnGraphInfo) -> GraphInfo:
    body = {1: g.graphInfoV1, 2: g.graphInfoV2, 3: g.graphInfoV3}.get(g.version)
    if body is None:  # newer layouts start with the V1 fields
        body = g.graphInfoV1
    return GraphInfo(
        name=_text(body.graphName),
        inputs=_tensors(body.graphInputs, body.numGraphInputs),
        outputs=_tensors(body.graphOutputs, body.numGraphOutputs),
        memory=graph_memory(body.graphBlobInfo, body.graphBlobInfoSize) if g.version == 3 else None,
    )


def graph_memory(ptr: int | None, size: int) -> dict[str, int] | None:
    """The HTP graph blob's memory figures in bytes: `const` (weights), `io` (graph inputs and outputs), `op_data`
    (run lists), `ddr` (intermediates kept in DDR), `spill_fill` (the VTCM spill buffer), `shared_weights`, and
    `vtcm` (on-chip, not DDR). None for a blob without the V2 record (older QNN, or another backend)."""
    v1, v2 = C.sizeof(HtpGraphBlobV1), C.sizeof(HtpGraphBlobV2)
    if not ptr or size < v1 + v2:
        return None
    raw = C.string_at(ptr, v1 + v2)
    first, second = HtpGraphBlobV1.from_buffer_copy(raw[:v1]), HtpGraphBlobV2.from_buffer_copy(raw[v1:])
    if first.version != 1 or second.version != 2:
        return None
    return {"const": second.constSize, "io": second.ioTensorSize, "op_data": second.opDataSize,
            "ddr": second.ddrTensorSize, "spill_fill": first.spillFillBufferSize,
            "shared_weights": second.sharedWeightsSize, "vtcm": first.vtcmSize}


def _metadata_words(ptr: int | None, size: int) -> list[int] | None:
    """Context metadata as little-endian uint32 words (bytes if not a multiple of 4)."""
    if not ptr or not size:
        return None
    raw = C.string_at(ptr, size)
    if size % 4:
        return list(raw)
    return [int.from_bytes(raw[i:i + 4], "little") for i in range(0, size, 4)]


def _dsp_arch(metadata: list[int] | None) -> str | None:
    """HTP arch from metadata ``[1, arch]`` (e.g. 75 -> "v75"); None when unrecognised."""
    if metadata and len(metadata) >= 2 and metadata[0] == 1 and 60 <= metadata[1] < 200:
        return f"v{metadata[1]}"
    return None


def _convert(path: Path, info: QnnBinaryInfo) -> BinaryInfo:
    version = info.version
    if version == 1:
        body = info.contextBinaryInfoV1
    elif version == 2:
        body = info.contextBinaryInfoV2
    elif version == 3:
        body = info.contextBinaryInfoV3
    else:
        raise QnnBinError(f"{path}: binary info version {version}: not supported (fix: add its layout to "
                          "qnn_tasks/qnn/binary_layout.py and read it in qnn_tasks/qnn/binary.py)")
    soc_model = metadata = None
    if version == 3:
        soc_model = body.socModel or None  # 0 = QNN_SOC_MODEL_UNKNOWN (no soc_model given)
        metadata = _metadata_words(body.contextMetadata, body.contextMetadataSize)
    graphs = [_graph(body.graphs[i]) for i in range(body.numGraphs)] if body.graphs else []
    return BinaryInfo(
        path=str(path),
        binary_info_version=version,
        build_id=_text(body.buildId),
        core_api_version=str(body.coreApiVersion),
        backend_api_version=str(body.backendApiVersion),
        soc_model=soc_model,
        dsp_arch=_dsp_arch(metadata),
        context_metadata=metadata,
        graphs=graphs,
    )


# --------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------


def read_binary_info(path: str | Path, system_lib: str | Path | None = None) -> BinaryInfo:
    """Parse a QNN context binary's metadata without loading it onto a backend."""
    path = Path(path)
    if not path.is_file():
        problem = "is not a regular file" if path.exists() else "no such file"
        raise QnnBinError(f"{path}: {problem}; check the path or rebuild the context binary")
    size = path.stat().st_size
    if not size:
        raise QnnBinError(f"{path}: file is empty; rebuild the context binary")
    lib_path = Path(system_lib) if system_lib else find_system_library()
    if not lib_path.is_file():
        raise QnnBinError(f"{lib_path}: QNN system library not found; {INSTALL_HINT}")
    _lib, api = _load_api(str(lib_path.resolve()))

    handle = C.c_void_p()
    err = api.systemContextCreate(C.byref(handle))
    if err:
        raise QnnBinError(f"{path}: QnnSystemContext_create failed ({error_text(err)}); check {lib_path}")
    # A private (copy-on-write) mapping instead of reading the file: binaries run to tens of MB
    # and only their header is parsed, so only those pages are read.
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        buf = (C.c_char * size).from_buffer(mapped)
        try:
            info = C.POINTER(QnnBinaryInfo)()
            info_size = C.c_uint64(0)
            err = api.systemContextGetBinaryInfo(handle, buf, size, C.byref(info), C.byref(info_size))
            if err or not info:
                raise QnnBinError(
                    f"{path}: not a readable QNN context binary ({error_text(err)}); "
                    "pass the *_qnn.bin written next to the *_ctx.onnx, or rebuild it"
                )
            return _convert(path, info.contents)
        finally:
            api.systemContextFree(handle)
            del buf  # the mapping can only close once no ctypes view of it is left


def _summary(info: BinaryInfo) -> str:
    """Human-readable multi-line summary."""
    lines = [
        info.path,
        f"  QNN build     {info.build_id} (core API {info.core_api_version}, "
        f"backend API {info.backend_api_version}, binary info v{info.binary_info_version})",
        f"  SoC model     {info.soc_model if info.soc_model is not None else '-'}",
        f"  DSP arch      {info.dsp_arch or '-'}  (context metadata {info.context_metadata})",
    ]
    for g in info.graphs:
        lines.append(f"  graph {g.name}")
        for kind, tensors in (("in ", g.inputs), ("out", g.outputs)):
            for t in tensors:
                q = ""
                if t.quantization:
                    q = "  " + " ".join(f"{k}={v}" for k, v in t.quantization.items())
                lines.append(f"    {kind} {t.name}  {t.dtype} {t.shape}{q}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: print a summary (or JSON with --json) of a QNN context binary."""
    parser = argparse.ArgumentParser(prog="python -m qnn_tasks.qnn.binary", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="QNN context binary (*.bin)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    args = parser.parse_args(argv)
    try:
        info = read_binary_info(args.file)
    except QnnBinError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(info.to_dict(), indent=2) if args.json else _summary(info))
        sys.stdout.flush()
    except BrokenPipeError:  # `| head` closed the pipe: not an error worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
