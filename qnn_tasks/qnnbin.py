"""Read QNN context binary (``*.bin``) metadata through ``libQnnSystem.so``.

Nothing is loaded onto a backend: the system library only parses the binary's
header (``QnnSystemContext_getBinaryInfo``), so this works on any Linux x86-64
host that has the ``onnxruntime-qnn`` wheel installed.

Usage: ``python -m qnn_tasks.qnnbin FILE.bin [--json]``

The ctypes structures below mirror the public QNN headers (QnnTypes.h,
QnnSystemContext.h, QnnSystemInterface.h of QNN 2.3x-2.5x, x86-64 LP64 ABI).
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

__all__ = [
    "QnnBinError",
    "TensorInfo",
    "GraphInfo",
    "BinaryInfo",
    "find_system_library",
    "read_binary_info",
    "main",
]

ENV_SYSTEM_LIB = "QNN_SYSTEM_LIB"
INSTALL_HINT = "pip install onnxruntime-qnn (Linux x86-64 wheel)"


class QnnBinError(Exception):
    """A one-line, user-facing error naming the file and the fix."""


# --------------------------------------------------------------------------
# C layouts (QnnTypes.h)
# --------------------------------------------------------------------------
# C enums are 32-bit here; they are declared as c_uint32.


class _Version(C.Structure):  # Qnn_Version_t
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("patch", C.c_uint32)]

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


class _ScaleOffset(C.Structure):  # Qnn_ScaleOffset_t
    _fields_ = [("scale", C.c_float), ("offset", C.c_int32)]


class _AxisScaleOffset(C.Structure):  # Qnn_AxisScaleOffset_t
    _fields_ = [
        ("axis", C.c_int32),
        ("numScaleOffsets", C.c_uint32),
        ("scaleOffset", C.POINTER(_ScaleOffset)),
    ]


class _BwScaleOffset(C.Structure):  # Qnn_BwScaleOffset_t
    _fields_ = [("bitwidth", C.c_uint32), ("scale", C.c_float), ("offset", C.c_int32)]


class _BwAxisScaleOffset(C.Structure):  # Qnn_BwAxisScaleOffset_t
    _fields_ = [
        ("bitwidth", C.c_uint32),
        ("axis", C.c_int32),
        ("numElements", C.c_uint32),
        ("scales", C.POINTER(C.c_float)),
        ("offsets", C.POINTER(C.c_int32)),
    ]


class _BlockEncoding(C.Structure):  # Qnn_BlockEncoding_t / Qnn_FloatBlockEncoding_t
    _fields_ = [("blockSize", C.POINTER(C.c_uint32)), ("scaleOffset", C.c_void_p)]


class _BwFloatBlockEncoding(C.Structure):  # Qnn_BwFloatBlockEncoding_t
    _fields_ = [
        ("bitwidth", C.c_uint32),
        ("blockSize", C.POINTER(C.c_uint32)),
        ("floatScaleOffset", C.c_void_p),
    ]


class _QuantUnion(C.Union):
    # The remaining encodings (blockwise expansion, vector, *_mapped) are pointers.
    _fields_ = [
        ("scaleOffsetEncoding", _ScaleOffset),
        ("axisScaleOffsetEncoding", _AxisScaleOffset),
        ("bwScaleOffsetEncoding", _BwScaleOffset),
        ("bwAxisScaleOffsetEncoding", _BwAxisScaleOffset),
        ("blockEncoding", _BlockEncoding),
        ("pointerEncoding", C.c_void_p),
        ("bwFloatBlockEncoding", _BwFloatBlockEncoding),
    ]


class _QuantizeParams(C.Structure):  # Qnn_QuantizeParams_t
    _anonymous_ = ("u",)
    _fields_ = [
        ("encodingDefinition", C.c_uint32),
        ("quantizationEncoding", C.c_uint32),
        ("u", _QuantUnion),
    ]


class _ClientBuffer(C.Structure):  # Qnn_ClientBuffer_t
    _fields_ = [("data", C.c_void_p), ("dataSize", C.c_uint32)]


class _TensorMemUnion(C.Union):
    _fields_ = [("clientBuf", _ClientBuffer), ("memHandle", C.c_void_p), ("retrieveRaw", C.c_void_p)]


_TENSOR_V1_FIELDS = [
    ("id", C.c_uint32),
    ("name", C.c_char_p),
    ("type", C.c_uint32),
    ("dataFormat", C.c_uint32),
    ("dataType", C.c_uint32),
    ("quantizeParams", _QuantizeParams),
    ("rank", C.c_uint32),
    ("dimensions", C.POINTER(C.c_uint32)),
    ("memType", C.c_uint32),
    ("mem", _TensorMemUnion),
]


class _TensorV1(C.Structure):  # Qnn_TensorV1_t
    _fields_ = _TENSOR_V1_FIELDS


class _SparseParams(C.Structure):  # Qnn_SparseParams_t (hybrid COO is the only layout)
    _fields_ = [
        ("type", C.c_uint32),
        ("numSpecifiedElements", C.c_uint32),
        ("numSparseDimensions", C.c_uint32),
    ]


class _TensorV2(C.Structure):  # Qnn_TensorV2_t: V1 fields + extras
    _fields_ = _TENSOR_V1_FIELDS + [
        ("isDynamicDimensions", C.POINTER(C.c_uint8)),
        ("sparseParams", _SparseParams),
        ("isProduced", C.c_uint8),
    ]


class _TensorUnion(C.Union):
    _fields_ = [("v1", _TensorV1), ("v2", _TensorV2)]


class _Tensor(C.Structure):  # Qnn_Tensor_t; arrays are strided by the full union
    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _TensorUnion)]


# --------------------------------------------------------------------------
# C layouts (QnnSystemContext.h)
# --------------------------------------------------------------------------

_GRAPH_V1_FIELDS = [
    ("graphName", C.c_char_p),
    ("numGraphInputs", C.c_uint32),
    ("graphInputs", C.POINTER(_Tensor)),
    ("numGraphOutputs", C.c_uint32),
    ("graphOutputs", C.POINTER(_Tensor)),
]
_GRAPH_V2_FIELDS = _GRAPH_V1_FIELDS + [
    ("numUpdateableTensors", C.c_uint32),
    ("updateableTensors", C.POINTER(_Tensor)),
]


class _GraphInfoV1(C.Structure):
    _fields_ = _GRAPH_V1_FIELDS


class _GraphInfoV2(C.Structure):
    _fields_ = _GRAPH_V2_FIELDS


class _GraphInfoV3(C.Structure):
    _fields_ = _GRAPH_V2_FIELDS + [
        ("graphBlobInfoSize", C.c_uint32),
        ("graphBlobInfo", C.c_void_p),
        ("startOpIndex", C.c_uint32),
        ("endOpIndex", C.c_uint32),
    ]


class _GraphInfoUnion(C.Union):
    _fields_ = [("graphInfoV1", _GraphInfoV1), ("graphInfoV2", _GraphInfoV2), ("graphInfoV3", _GraphInfoV3)]


class _GraphInfo(C.Structure):  # QnnSystemContext_GraphInfo_t
    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _GraphInfoUnion)]


_BINARY_V1_HEAD = [
    ("backendId", C.c_uint32),
    ("buildId", C.c_char_p),
    ("coreApiVersion", _Version),
    ("backendApiVersion", _Version),
    ("socVersion", C.c_char_p),
]
_BINARY_GRAPHS = [
    ("contextBlobSize", C.c_uint64),
    ("numContextTensors", C.c_uint32),
    ("contextTensors", C.POINTER(_Tensor)),
    ("numGraphs", C.c_uint32),
    ("graphs", C.POINTER(_GraphInfo)),
]
_BINARY_V1_FIELDS = _BINARY_V1_HEAD + [
    ("hwInfoBlobVersion", _Version),
    ("contextBlobVersion", _Version),
    ("hwInfoBlobSize", C.c_uint32),
    ("hwInfoBlob", C.c_void_p),
] + _BINARY_GRAPHS


class _BinaryInfoV1(C.Structure):
    _fields_ = _BINARY_V1_FIELDS


class _BinaryInfoV2(C.Structure):
    _fields_ = _BINARY_V1_FIELDS + [("platformInfo", C.c_void_p)]


class _BinaryInfoV3(C.Structure):  # drops the hwInfoBlob fields, adds metadata + socModel
    _fields_ = _BINARY_V1_HEAD + [("contextBlobVersion", _Version)] + _BINARY_GRAPHS + [
        ("platformInfo", C.c_void_p),
        ("contextMetadataSize", C.c_uint32),
        ("contextMetadata", C.c_void_p),
        ("socModel", C.c_uint32),
    ]


class _BinaryInfoUnion(C.Union):
    _fields_ = [
        ("contextBinaryInfoV1", _BinaryInfoV1),
        ("contextBinaryInfoV2", _BinaryInfoV2),
        ("contextBinaryInfoV3", _BinaryInfoV3),
    ]


class _BinaryInfo(C.Structure):  # QnnSystemContext_BinaryInfo_t
    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _BinaryInfoUnion)]


# --------------------------------------------------------------------------
# C layouts (QnnSystemInterface.h)
# --------------------------------------------------------------------------

_ErrorHandle = C.c_uint64  # Qnn_ErrorHandle_t; the error code is the low 16 bits
_CreateFn = C.CFUNCTYPE(_ErrorHandle, C.POINTER(C.c_void_p))
_GetBinaryInfoFn = C.CFUNCTYPE(
    _ErrorHandle, C.c_void_p, C.c_void_p, C.c_uint64,
    C.POINTER(C.POINTER(_BinaryInfo)), C.POINTER(C.c_uint64),
)
_FreeFn = C.CFUNCTYPE(_ErrorHandle, C.c_void_p)


class _SystemApi(C.Structure):  # QNN_SYSTEM_INTERFACE_VER_TYPE (leading members only)
    _fields_ = [
        ("systemContextCreate", _CreateFn),
        ("systemContextGetBinaryInfo", _GetBinaryInfoFn),
        ("systemContextGetMetaData", C.c_void_p),
        ("systemContextFree", _FreeFn),
    ]


class _SystemInterface(C.Structure):  # QnnSystemInterface_t
    _fields_ = [
        ("backendId", C.c_uint32),
        ("providerName", C.c_char_p),
        ("systemApiVersion", _Version),
        ("api", _SystemApi),
    ]


# --------------------------------------------------------------------------
# Enum names
# --------------------------------------------------------------------------

_DTYPES = {
    0x0008: "int8", 0x0016: "int16", 0x0032: "int32", 0x0064: "int64",
    0x0108: "uint8", 0x0116: "uint16", 0x0132: "uint32", 0x0164: "uint64",
    0x0216: "float16", 0x0226: "bfloat16", 0x0232: "float32", 0x0264: "float64",
    0x0304: "sfixed_point_4", 0x0308: "sfixed_point_8",
    0x0316: "sfixed_point_16", 0x0332: "sfixed_point_32",
    0x0404: "ufixed_point_4", 0x0408: "ufixed_point_8",
    0x0416: "ufixed_point_16", 0x0432: "ufixed_point_32",
    0x0508: "bool", 0x0608: "string",
}
_ENCODINGS = [
    "scale_offset", "axis_scale_offset", "bw_scale_offset", "bw_axis_scale_offset",
    "block", "blockwise_expansion", "vector", "float_block",
    "bw_axis_scale_offset_mapped", "bw_block_mapped", "bw_blockwise_expansion_mapped",
    "bw_float_block",
]
_QNN_DEFINITION_DEFINED = 1
_ERRORS = {
    1000: "NOT_SUPPORTED", 1002: "MEM_ALLOC", 1003: "SYSTEM", 1004: "INVALID_ARGUMENT",
    1100: "GENERAL", 30000: "INVALID_HANDLE", 30001: "INVALID_ARGUMENT",
    30002: "OPERATION_FAILED", 30010: "MALFORMED_BINARY",
}
_SYSTEM_API_MAJOR = 1  # QNN_SYSTEM_API_VERSION_MAJOR


def _error_text(handle: int) -> str:
    code = handle & 0xFFFF
    return f"error {code} {_ERRORS.get(code, 'UNKNOWN')}"


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
def _load_api(lib_path: str) -> tuple[C.CDLL, _SystemApi]:
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
    get_providers.restype = _ErrorHandle
    get_providers.argtypes = [C.POINTER(C.POINTER(C.POINTER(_SystemInterface))), C.POINTER(C.c_uint32)]
    providers = C.POINTER(C.POINTER(_SystemInterface))()
    count = C.c_uint32(0)
    err = get_providers(C.byref(providers), C.byref(count))
    if err or not providers:
        raise QnnBinError(f"{lib_path}: QnnSystemInterface_getProviders failed ({_error_text(err)}); {INSTALL_HINT}")
    for i in range(count.value):
        iface = providers[i].contents
        api = iface.api
        if (iface.systemApiVersion.major == _SYSTEM_API_MAJOR and api.systemContextCreate
                and api.systemContextGetBinaryInfo and api.systemContextFree):
            return lib, api
    raise QnnBinError(f"{lib_path}: no compatible QNN system API provider (need major {_SYSTEM_API_MAJOR}); {INSTALL_HINT}")


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


def _quantization(q: _QuantizeParams) -> dict | None:
    """Readable summary of Qnn_QuantizeParams_t, or None when not quantized."""
    if q.encodingDefinition != _QNN_DEFINITION_DEFINED or q.quantizationEncoding >= len(_ENCODINGS):
        return None
    enc = _ENCODINGS[q.quantizationEncoding]
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


def _tensor(t: _Tensor) -> TensorInfo:
    body = t.v2 if t.version == 2 else t.v1  # both share the leading V1 fields
    dims = [body.dimensions[i] for i in range(body.rank)] if body.dimensions else []
    return TensorInfo(
        name=_text(body.name),
        dtype=_DTYPES.get(body.dataType, f"unknown_0x{body.dataType:x}"),
        shape=dims,
        quantization=_quantization(body.quantizeParams),
    )


def _tensors(array: Any, count: int) -> list[TensorInfo]:
    return [_tensor(array[i]) for i in range(count)] if array else []


def _graph(g: _GraphInfo) -> GraphInfo:
    body = {1: g.graphInfoV1, 2: g.graphInfoV2, 3: g.graphInfoV3}.get(g.version)
    if body is None:  # newer layouts start with the V1 fields
        body = g.graphInfoV1
    return GraphInfo(
        name=_text(body.graphName),
        inputs=_tensors(body.graphInputs, body.numGraphInputs),
        outputs=_tensors(body.graphOutputs, body.numGraphOutputs),
    )


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


def _convert(path: Path, info: _BinaryInfo) -> BinaryInfo:
    version = info.version
    if version == 1:
        body = info.contextBinaryInfoV1
    elif version == 2:
        body = info.contextBinaryInfoV2
    elif version == 3:
        body = info.contextBinaryInfoV3
    else:
        raise QnnBinError(f"{path}: binary info version {version} is not supported; update qnn_tasks/qnnbin.py")
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
        raise QnnBinError(f"{path}: QnnSystemContext_create failed ({_error_text(err)}); check {lib_path}")
    # A private (copy-on-write) mapping instead of reading the file: binaries run to tens of MB
    # and only their header is parsed, so only those pages are read.
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        buf = (C.c_char * size).from_buffer(mapped)
        try:
            info = C.POINTER(_BinaryInfo)()
            info_size = C.c_uint64(0)
            err = api.systemContextGetBinaryInfo(handle, buf, size, C.byref(info), C.byref(info_size))
            if err or not info:
                raise QnnBinError(
                    f"{path}: not a readable QNN context binary ({_error_text(err)}); "
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
    parser = argparse.ArgumentParser(prog="python -m qnn_tasks.qnnbin", description=__doc__.splitlines()[0])
    parser.add_argument("file", help="QNN context binary (*.bin)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    args = parser.parse_args(argv)
    try:
        info = read_binary_info(args.file)
    except QnnBinError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info.to_dict(), indent=2) if args.json else _summary(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
