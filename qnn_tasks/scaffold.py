"""`qnn-npu-compile init [DIR]`: the files a team's own repository needs to use the installed tool.

Writes nothing when it refuses (one line): a file of these exists already (a user's files are never
overwritten), a file or a symlink stands where a folder goes, the folder is read-only, or the disk fills up
(what was written is removed). Every write stays inside the target folder. The SoC table and toolchain profiles are not copied: they come with the package, and the
project's socs/socs.yaml and toolchain/*.yaml only add to or override them.
"""
from __future__ import annotations

import os
from pathlib import Path

from qnn_tasks.errors import QnnTasksError

DODO = '''\
"""doit entry point: models/*/model.yaml x the SoC table -> tasks (`doit list --all`; qnn-npu-compile's docs/tasks.md)."""
from pathlib import Path; from qnn_tasks.tasks import project_tasks  # noqa: E702
globals().update(project_tasks(Path(__file__).resolve().parent))
'''

MODEL_YAML = '''\
## An example model: remove the single "# " of each line below and edit (a model.yaml holding only
## comments is skipped, so `doit` works before you declare a model). This is the YAML-only path for an
## ONNX file that ships inside a pip package or sits in this folder: no Python needed. One folder per
## model: models/<model>/model.yaml (qnn-npu-compile's docs/packaged-models.md).
# licence: MIT                                    # the model's licence (a compiled binary is the model)
# source: {package: silero-vad, file: silero_vad/data/silero_vad_op18_ifless.onnx}   # or {file: my.onnx}
# graphs:
#   vad:                                          # the graph's name: task names are <stage>:<graph>-<SOC>
#     inputs:                                     # every input with a fixed shape (the NPU needs static shapes)
#       input: {shape: [1, 576], dtype: float32}  # a dynamic dim in the ONNX is fixed here
#       state: {shape: [2, 1, 128], dtype: float32}
#     outputs:
#       output: {shape: [1, 1]}                   # speech probability
#       stateN: {shape: [2, 1, 128]}
#     constant_inputs: {sr: 16000}                # an ONNX input the deployment fixes becomes a constant
#     rewrites: [fold-if, pow-square]             # known HTP rewrites (docs/rewrites.md)
#     lint: {allow: [batch]}                      # state's first dim is the LSTM's (h, c), not a batch
#     samples: {files: "samples/*.npz"}           # real inputs, one array per input (docs/samples.md)
#     precision: fp16                             # or [fp16, w8a16]: w8a16 also builds for quantized-only chips
#     socs: [SM8650, SM8750]                      # omit: the table's default chips (socs/socs.yaml)
# loop: {graph: vad, feed: {state: stateN}}      # state fed back each call: verified as a stream, the error
#                                                # the state carries measured (docs/pipelines-and-loops.md)
'''

SOCS_YAML = '''\
# This project's chips, over the SoC table that comes with qnn-npu-compile (`qnn-npu-compile socs`
# lists it: 22 chips measured with QNN 2.51, each with what it runs). A row here adds a chip, or
# overrides the packaged row of the same name. A graph without `socs:` builds for `default:` here if
# set, else for the rows written here, else for the packaged default chips.
#   SM9999: {soc_id: 123, dsp_arch: v81, vtcm_mb: 8, runs: [fp16, w8a16], note: my chip}
#   SM8650: {soc_id: 57, dsp_arch: v75, vtcm_mb: 4, runs: [fp16, w8a16]}     # override: less VTCM
# default: [SM8650, SM7550]        # or: default: all (every row of the table)
# Toolchain profiles work the same way: toolchain/<name>.yaml here overrides the packaged ort-qnn,
# ort-qnn-2.47 and qairt profiles of that name, or adds one (select it with QNN_TOOLCHAIN=<name>).
socs: {}
'''

GITIGNORE = '''\
build/
dist/
.doit.db*
.qnn-specs.cache*
'''

WORKFLOW = '''\
# Build every model for the NPU and verify it on the x86 HTP simulator; publish the report.
# (onnxruntime-qnn's wheel and its simulator exist for Linux x86-64 only: run on an x86-64 Linux runner.)
name: qnn-npu-compile
on: [push, pull_request]
jobs:
  npu:
    runs-on: ubuntu-24.04
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with: {python-version: "3.11"}
      # Pin the version you built with; or install the wheel you keep (pip install ./qnn_npu_compile-*.whl).
      - run: pip install qnn-npu-compile
      # A shared artifact cache makes unchanged targets instant across runs (docs/team.md):
      #   env: {QNN_CACHE: "s3://team-bucket/qnn-cache"}
      - run: doit
      - uses: actions/upload-artifact@v4
        if: always()
        with: {name: qnn-report, path: build/report/}
'''

FILES = {
    "dodo.py": DODO,
    "models/example/model.yaml": MODEL_YAML,
    "socs/socs.yaml": SOCS_YAML,
    ".gitignore": GITIGNORE,
    ".github/workflows/qnn-npu-compile.yml": WORKFLOW,
}


class Exists(QnnTasksError):
    """init would overwrite a user's file, or cannot write the project where it was asked (nothing is written)."""


def init(target: Path) -> list[Path]:
    """Write the project files into `target` (created if missing). Returns them.

    Everything is checked before anything is written (existing files, a file or a symlink where a folder goes, a
    folder that cannot be written); a write that fails anyway (a full disk) removes what this call wrote. So a
    refusal is one line and leaves `target` as it was; every write stays inside `target`.
    """
    _check(target)
    written: list[Path] = []
    made: list[Path] = []  # folders this call created, deepest last
    try:
        for rel, text in FILES.items():
            path = target / rel
            _make_folders(target, path.parent, made)
            _write(path, text)
            written.append(path)
    except OSError as err:
        _undo(written, made)
        raise Exists(f"{target}: writing {rel} failed: {err.strerror or err} (fix: free space or init a writable "
                     f"folder; nothing was written)") from None
    return written


def _check(target: Path) -> None:
    """Refuse (one line) anything that would make init fail halfway or write outside `target`."""
    nothing = "nothing was written"
    if os.path.lexists(target):
        if not target.is_dir():
            raise Exists(f"{target}: is not a folder (fix: name a folder to create the project in; {nothing})")
        base = target
    else:
        base = next((p for p in target.parents if os.path.lexists(p)), Path("."))
        if not base.is_dir():
            raise Exists(f"{target}: {base} is a file, not a folder (fix: name a folder to create the project in; "
                         f"{nothing})")
    existing = [rel for rel in FILES if os.path.lexists(target / rel)]
    if existing:
        raise Exists(f"{target}: init would overwrite {', '.join(existing)} (fix: init an empty folder, "
                     f"or move those files away first; {nothing})")
    folders = dict.fromkeys(str(parent) for rel in FILES for parent in reversed(Path(rel).parents) if str(parent) != ".")
    for folder in folders:
        path = target / folder
        if os.path.islink(path):
            raise Exists(f"{target}: {folder} is a symlink (to {os.readlink(path)}) and init writes only inside "
                         f"{target} (fix: make {folder} a real folder, or init another folder; {nothing})")
        if os.path.lexists(path) and not path.is_dir():
            needed = next(rel for rel in FILES if rel.startswith(f"{folder}/"))
            raise Exists(f"{target}: {folder} is a file, but init writes {needed} (fix: move {folder} away, or init "
                         f"another folder; {nothing})")
    writable = [base] + [target / f for f in folders if (target / f).is_dir()]
    for folder in writable:
        if not os.access(folder, os.W_OK | os.X_OK):
            why = "read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else "permission denied"
            raise Exists(f"{target}: cannot write in {folder}: {why} (fix: init a writable folder; {nothing})")


def _make_folders(target: Path, folder: Path, made: list[Path]) -> None:
    """Create `folder` and its missing parents, adding each to `made` as soon as it exists (outermost first)."""
    for path in [p for p in [*reversed(folder.parents), folder] if not os.path.lexists(p)]:
        path.mkdir()
        made.append(path)
    if not folder.resolve().is_relative_to(target.resolve()):  # a link made since _check
        raise OSError(f"{folder} leads outside {target}")


def _write(path: Path, text: str) -> None:
    """Temp + rename; the temp is created exclusively (never through a link someone left there)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _undo(written: list[Path], made: list[Path]) -> None:
    """Remove what this call wrote: its files, then the folders it created (deepest first)."""
    for path in [*written, *reversed(made)]:
        try:
            path.rmdir() if path in made else path.unlink()
        except OSError:  # a folder something else wrote into meanwhile: kept
            pass
