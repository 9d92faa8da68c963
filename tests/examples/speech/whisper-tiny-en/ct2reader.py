"""Read a CTranslate2 `model.bin` (binary version 6) into numpy arrays, without ctranslate2.

Layout (little-endian), as CTranslate2's `ModelSpec._serialize` writes it:
    u32 binary version, str spec name, u32 spec revision, u32 variable count,
    per variable: str name, u8 rank, u32 dim * rank, u8 dtype id, u32 byte count, raw bytes,
    u32 alias count, per alias: str alias, str target name.
A str is a u16 length (including a trailing NUL), the UTF-8 bytes and the NUL.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SUPPORTED_VERSION = 6
# CTranslate2's DataType enum order (include/ctranslate2/types.h)
DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16, None)  # 5 = bfloat16: numpy has none


@dataclass(frozen=True)
class Ct2Model:
    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]
    bytes_read: int

    def __getitem__(self, name: str) -> np.ndarray:
        return self.variables[self.aliases.get(name, name)]


class Ct2FormatError(ValueError):
    """The file is not a CTranslate2 model this reader understands."""


def read(path: Path | str) -> Ct2Model:
    """Every variable of `path` as a numpy array (a read-only view of the file's bytes), plus aliases."""
    path = Path(path)
    data = memoryview(path.read_bytes())
    pos = 0

    def unpack(fmt: str) -> int:
        nonlocal pos
        value = struct.unpack_from("<" + fmt, data, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return value

    def string() -> str:
        nonlocal pos
        length = unpack("H")
        text = bytes(data[pos:pos + length - 1]).decode("utf-8")
        pos += length
        return text

    try:
        version = unpack("I")
        if version != SUPPORTED_VERSION:
            raise Ct2FormatError(f"{path}: binary version {version}, this reader knows version {SUPPORTED_VERSION} "
                                 f"(re-convert the model with a ctranslate2 that writes version {SUPPORTED_VERSION})")
        spec, revision, count = string(), unpack("I"), unpack("I")
        variables: dict[str, np.ndarray] = {}
        for _ in range(count):
            name = string()
            shape = tuple(unpack("I") for _ in range(unpack("B")))
            type_id, size = unpack("B"), unpack("I")
            dtype = DTYPES[type_id] if type_id < len(DTYPES) else None
            if dtype is None:
                raise Ct2FormatError(f"{path}: variable '{name}' has dtype id {type_id}, which numpy cannot hold")
            if pos + size > len(data):
                raise struct.error(f"variable '{name}' needs {size} bytes, {len(data) - pos} left")
            array = np.frombuffer(data[pos:pos + size], dtype=dtype)
            if array.size != int(np.prod(shape, dtype=np.int64)):
                raise Ct2FormatError(f"{path}: variable '{name}' has {size} bytes for shape {list(shape)}")
            variables[name] = array.reshape(shape)
            pos += size
        aliases = {}
        for _ in range(unpack("I")):
            alias = string()
            aliases[alias] = string()
    except struct.error as err:
        raise Ct2FormatError(f"{path}: truncated at byte {pos} ({err})") from None
    return Ct2Model(spec=spec, revision=revision, variables=variables, aliases=aliases, bytes_read=pos)
