"""ctypes mirrors of the public QNN headers that qnn/binary.py reads a context binary with.

QnnTypes.h, QnnSystemContext.h, QnnSystemInterface.h of QNN 2.3x-2.5x, x86-64 LP64 ABI; plus the
enum names. Only layouts live here; qnn/binary.py holds the API and the data model.
"""
from __future__ import annotations

import ctypes as C

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


class QnnQuantizeParams(C.Structure):  # Qnn_QuantizeParams_t
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
    ("quantizeParams", QnnQuantizeParams),
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


class QnnTensor(C.Structure):  # Qnn_Tensor_t; arrays are strided by the full union
    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _TensorUnion)]


# --------------------------------------------------------------------------
# C layouts (QnnSystemContext.h)
# --------------------------------------------------------------------------

_GRAPH_V1_FIELDS = [
    ("graphName", C.c_char_p),
    ("numGraphInputs", C.c_uint32),
    ("graphInputs", C.POINTER(QnnTensor)),
    ("numGraphOutputs", C.c_uint32),
    ("graphOutputs", C.POINTER(QnnTensor)),
]
_GRAPH_V2_FIELDS = _GRAPH_V1_FIELDS + [
    ("numUpdateableTensors", C.c_uint32),
    ("updateableTensors", C.POINTER(QnnTensor)),
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


# QnnHtpSystemContext.h: what the HTP prepare library wrote about one graph (graphBlobInfo of GraphInfoV3). The blob
# is a V1 record (version + union) followed, from QNN 2.3x on, by a V2 record with the memory the graph holds.
class HtpGraphBlobV1(C.Structure):  # QnnHtpSystemContext_GraphBlobInfo_t with its V1 member
    _fields_ = [
        ("version", C.c_uint32),
        ("spillFillBufferSize", C.c_uint64),
        ("vtcmSize", C.c_uint32),          # bytes in the binaries read here (the header's comment says MB)
        ("optimizationLevel", C.c_uint32),
        ("htpDlbc", C.c_uint8),
        ("numHvxThreads", C.c_uint64),
    ]


class HtpGraphBlobV2(C.Structure):  # QnnHtpSystemContext_GraphBlobInfoV2_t
    _fields_ = [
        ("version", C.c_uint32),
        ("nativeKChannelSize", C.c_uint64),
        ("nativeVChannelSize", C.c_uint64),
        ("isSafeShareIO", C.c_uint32),
        ("ioTensorSize", C.c_uint64),
        ("opDataSize", C.c_uint64),
        ("constSize", C.c_uint64),
        ("ddrTensorSize", C.c_uint64),
        ("sharedWeightsSize", C.c_uint64),
    ]


class _GraphInfoUnion(C.Union):
    _fields_ = [("graphInfoV1", _GraphInfoV1), ("graphInfoV2", _GraphInfoV2), ("graphInfoV3", _GraphInfoV3)]


class QnnGraphInfo(C.Structure):  # QnnSystemContext_GraphInfo_t
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
    ("contextTensors", C.POINTER(QnnTensor)),
    ("numGraphs", C.c_uint32),
    ("graphs", C.POINTER(QnnGraphInfo)),
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


class QnnBinaryInfo(C.Structure):  # QnnSystemContext_BinaryInfo_t
    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _BinaryInfoUnion)]


# --------------------------------------------------------------------------
# C layouts (QnnSystemInterface.h)
# --------------------------------------------------------------------------

ErrorHandle = C.c_uint64  # Qnn_ErrorHandle_t; the error code is the low 16 bits
_CreateFn = C.CFUNCTYPE(ErrorHandle, C.POINTER(C.c_void_p))
_GetBinaryInfoFn = C.CFUNCTYPE(
    ErrorHandle, C.c_void_p, C.c_void_p, C.c_uint64,
    C.POINTER(C.POINTER(QnnBinaryInfo)), C.POINTER(C.c_uint64),
)
_FreeFn = C.CFUNCTYPE(ErrorHandle, C.c_void_p)


class QnnSystemApi(C.Structure):  # QNN_SYSTEM_INTERFACE_VER_TYPE (leading members only)
    _fields_ = [
        ("systemContextCreate", _CreateFn),
        ("systemContextGetBinaryInfo", _GetBinaryInfoFn),
        ("systemContextGetMetaData", C.c_void_p),
        ("systemContextFree", _FreeFn),
    ]


class QnnSystemInterface(C.Structure):  # QnnSystemInterface_t
    _fields_ = [
        ("backendId", C.c_uint32),
        ("providerName", C.c_char_p),
        ("systemApiVersion", _Version),
        ("api", QnnSystemApi),
    ]


# --------------------------------------------------------------------------
# Enum names
# --------------------------------------------------------------------------

DTYPES = {
    0x0008: "int8", 0x0016: "int16", 0x0032: "int32", 0x0064: "int64",
    0x0108: "uint8", 0x0116: "uint16", 0x0132: "uint32", 0x0164: "uint64",
    0x0216: "float16", 0x0226: "bfloat16", 0x0232: "float32", 0x0264: "float64",
    0x0304: "sfixed_point_4", 0x0308: "sfixed_point_8",
    0x0316: "sfixed_point_16", 0x0332: "sfixed_point_32",
    0x0404: "ufixed_point_4", 0x0408: "ufixed_point_8",
    0x0416: "ufixed_point_16", 0x0432: "ufixed_point_32",
    0x0508: "bool", 0x0608: "string",
}
ENCODINGS = [
    "scale_offset", "axis_scale_offset", "bw_scale_offset", "bw_axis_scale_offset",
    "block", "blockwise_expansion", "vector", "float_block",
    "bw_axis_scale_offset_mapped", "bw_block_mapped", "bw_blockwise_expansion_mapped",
    "bw_float_block",
]
QNN_DEFINITION_DEFINED = 1
_ERRORS = {
    1000: "NOT_SUPPORTED", 1002: "MEM_ALLOC", 1003: "SYSTEM", 1004: "INVALID_ARGUMENT",
    1100: "GENERAL", 30000: "INVALID_HANDLE", 30001: "INVALID_ARGUMENT",
    30002: "OPERATION_FAILED", 30010: "MALFORMED_BINARY",
}
SYSTEM_API_MAJOR = 1  # QNN_SYSTEM_API_VERSION_MAJOR


def error_text(handle: int) -> str:
    code = handle & 0xFFFF
    return f"error {code} {_ERRORS.get(code, 'UNKNOWN')}"
