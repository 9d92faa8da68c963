"""Atomic file writes: an interrupted build never leaves a half file that looks finished; a file's digest; and
unpacking an archive safely (a phone's outputs, runtime libraries), nothing landing outside its folder."""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import tarfile

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside `final`; rename it onto `final` only if the block succeeds."""
    final = Path(final)
    tmp = None
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".part", dir=final.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; results should read like any other file
        yield tmp
        os.replace(tmp, final)
    except OSError as err:
        if err.filename is None:  # a refused write() names no file: name the one being written (full disk ...)
            err.filename = str(final)
        raise
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()


def place(source: Path, dest: Path) -> None:
    """`dest` becomes `source`'s content, whole or not at all: a hard link (build files are replaced, never edited
    in place), a copy where the file system has none."""
    import shutil

    with atomic_path(dest) as tmp:
        tmp.unlink()  # os.link makes the name
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)


def sha256(path: Path | str) -> str:
    """The file's SHA-256 (hex), read once in chunks (run/digests.py caches it per file stamp for the records)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_json(path: Path, data: Any) -> None:
    """Strict JSON (no NaN/Infinity tokens): non-finite numbers are written as null."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(finite(data), indent=2, sort_keys=False, default=_jsonable, allow_nan=False) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if hasattr(value, "item") and hasattr(value, "dtype"):  # numpy scalar
        return finite(value.item())
    return value


def _jsonable(value: Any) -> Any:
    """numpy scalars and Paths in records become plain JSON values."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def extract_safely(archive: Path, dest: Path) -> list[str]:
    """Unpack a tar archive (any compression) into dest: no absolute paths, no '..', no links or
    devices that point outside dest. Raises ValueError naming the bad member."""
    import tarfile  # here: planning imports this module on every doit

    dest = dest.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for m in members:
            problem = unsafe_member(m, dest)
            if problem:
                raise ValueError(f"{archive}: refusing to extract '{m.name}': {problem}")
            names.append(m.name)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # Python < 3.11.4: members were checked above
            tar.extractall(dest, members=members)
    return names


def unsafe_member(m: tarfile.TarInfo, dest: Path) -> str | None:
    name = m.name
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    if ".." in Path(name).parts:
        return "'..' in the path"
    target = (dest / name).resolve()
    if target != dest and dest not in target.parents:
        return "leaves the destination folder"
    if m.issym() or m.islnk():
        link = Path(m.linkname)
        if link.is_absolute():
            return f"link to an absolute path ({m.linkname})"
        base = (dest / name).parent if m.issym() else dest
        resolved = (base / link).resolve()
        if resolved != dest and dest not in resolved.parents:
            return f"link escapes the destination ({m.linkname})"
    if m.ischr() or m.isblk() or m.isfifo():
        return "device or fifo entry"
    return None
