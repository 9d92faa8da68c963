"""Host side of the files a phone gets and gives back.

`build_payload`  the runtime libs, qnn-net-run, the context binary and the verification inputs as raw
                 files + input_list.txt (packed into one deterministic inputs.tar), paired with the
                 binary's tensors and encoded as qnn-net-run reads them (float32, or native types);
`read_outputs`   the pulled Result_<i>/<output>.raw files back into the declared outputs' shapes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qnn_tasks import fileio
from qnn_tasks.errors import StageError
from qnn_tasks.qnn import runtimelibs
from qnn_tasks.stages.verify.settings import RUNNER, Job, safe_text


@dataclass
class Payload:
    files: dict[str, Path]               # device-relative path -> local file
    executable: set[str]
    bin_name: str
    input_list: str                      # device-relative
    one_sample_list: str
    native_inputs: bool
    samples: int
    outputs: list[dict[str, Any]]        # the binary's output tensors, in the graph's declared order
    extra: dict[str, Any] = field(default_factory=dict)


def build_payload(job: Job, binary: dict[str, Any], libs: runtimelibs.RuntimeLibs, limit: int | None) -> Payload:
    """The files for the phone. Inputs: raw files + input_list.txt (one line per sample, `<tensor>:=<file>`
    per input, in order), packed into one deterministic inputs.tar that is unpacked on the device (hundreds
    of small pushes would dominate the run; one file also makes the same-hash skip cheap)."""
    import io
    import tarfile

    import numpy as np

    from qnn_tasks.judge import sample_store

    samples = sample_store.load(job.inputs, limit=limit)
    qnn = binary["graph"]
    inputs = _bind(job.graph.inputs, qnn["inputs"], "input", job.binary)
    outputs = _bind(job.graph.outputs, qnn["outputs"], "output", job.binary)
    native = any(not _float_like(t["dtype"]) for _, t in inputs)
    folder = job.out_dir / "device-payload"
    folder.mkdir(parents=True, exist_ok=True)
    members: dict[str, bytes] = {}
    lines = []
    for i, sample in enumerate(samples):
        words = []
        for spec, tensor in inputs:
            rel = f"inputs/s{i:04d}_{safe_text(tensor['name'])}.raw"
            members[rel] = _encode(np.asarray(sample[spec.name]), tensor, native, job.binary)
            words.append(f"{tensor['name']}:={rel}")
        lines.append(" ".join(words))
    members["input_list.txt"] = ("\n".join(lines) + "\n").encode()
    members["input_list_1.txt"] = (lines[0] + "\n").encode()
    (folder / "input_list.txt").write_bytes(members["input_list.txt"])
    archive = folder / "inputs.tar"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    with fileio.atomic_path(archive) as tmp:
        tmp.write_bytes(buffer.getvalue())
    files: dict[str, Path] = {f"lib/{name}": path for name, path in libs.libs.items()}
    files[RUNNER] = libs.runner  # type: ignore[assignment]
    files[job.binary.name] = job.binary
    files["inputs.tar"] = archive
    return Payload(files=files, executable={RUNNER}, bin_name=job.binary.name, input_list="input_list.txt",
                   one_sample_list="input_list_1.txt", native_inputs=native, samples=len(samples),
                   outputs=[{"declared": spec.name, "shape": list(spec.shape), **tensor} for spec, tensor in outputs])


def _bind(declared, qnn: list[dict[str, Any]], kind: str, binary: Path) -> list[tuple[Any, dict[str, Any]]]:
    """Declared tensors paired with the binary's; raw files are flat, so only the element count must agree."""
    from qnn_tasks.qnn.epcontext import pair_tensors  # the same pairing as the simulator's EPContext wrapper

    pairs = pair_tensors(declared, qnn, kind, binary)
    for spec, tensor in pairs:
        if math.prod(tensor["shape"]) != math.prod(spec.shape):
            raise StageError(f"{binary}: {kind} '{spec.name}' is {tensor['shape']} in the binary (tensor "
                             f"'{tensor['name']}'), model.yaml says {list(spec.shape)}")
    return pairs


def _float_like(dtype: str) -> bool:
    return dtype in ("float32", "float16") or "fixed_point" in dtype


NATIVE = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int8": "i1", "uint8": "u1", "int16": "<i2",
          "uint16": "<u2", "bool": "u1", "int64": "<i8", "uint32": "<u4"}
FIXED = {"ufixed_point_8": "u1", "ufixed_point_16": "<u2", "sfixed_point_8": "i1", "sfixed_point_16": "<i2"}


def _encode(value, tensor: dict[str, Any], native: bool, binary: Path) -> bytes:
    """A raw file as qnn-net-run reads it: float32 unless --use_native_input_files (then the tensor's own type)."""
    import numpy as np

    dtype = tensor["dtype"]
    if not native:
        return np.ascontiguousarray(value, dtype="<f4").tobytes()
    if dtype in NATIVE:
        return np.ascontiguousarray(value, dtype=NATIVE[dtype]).tobytes()
    if dtype in FIXED:
        q = tensor.get("quantization") or {}
        if "scale" not in q:
            raise StageError(f"{binary}: input '{tensor['name']}' is {dtype} without a per-tensor scale/offset")
        info = np.iinfo(np.dtype(FIXED[dtype]))
        quantized = np.round(np.asarray(value, np.float64) / q["scale"]) - int(q.get("offset", 0))
        return np.clip(quantized, info.min, info.max).astype(FIXED[dtype]).tobytes()
    raise StageError(f"{binary}: input '{tensor['name']}' has QNN type {dtype}, which cannot be written as a raw input")


def read_outputs(out_dir: Path, payload: Payload, binary: Path) -> list[dict[str, Any]]:
    """Result_<i>/<output>.raw (float32) -> [{declared output name: array of the declared shape}]."""
    import numpy as np

    from qnn_tasks.qnn.epcontext import plain_name

    results = []
    for i in range(payload.samples):
        folder = out_dir / f"Result_{i}"
        sample = {}
        for out in payload.outputs:
            candidates = [folder / f"{out['name']}.raw", folder / f"{plain_name(out['name'])}.raw",
                          folder / f"{safe_text(out['name'])}.raw"]
            path = next((c for c in candidates if c.is_file()), None)
            if path is None:
                have = sorted(p.name for p in folder.glob("*.raw")) if folder.is_dir() else []
                raise StageError(f"{RUNNER} wrote no {candidates[0].name} in Result_{i} (found: {have or 'nothing'}); "
                                 f"{binary} output '{out['name']}'")
            data = np.fromfile(path, dtype="<f4")
            if data.size != math.prod(out["shape"]):
                raise StageError(f"{path}: {data.size} float32 values, output '{out['declared']}' has "
                                 f"{math.prod(out['shape'])} ({out['shape']})")
            sample[out["declared"]] = data.reshape(out["shape"])
        results.append(sample)
    return results
