"""`qnn-npu-compile init [DIR]`: the files a team's own repository needs to use the installed tool.

Writes nothing when any of them exists already (one line naming them): a user's files are never
overwritten. The SoC table and toolchain profiles are not copied: they come with the package, and the
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
    """init would overwrite a user's file."""


def init(target: Path) -> list[Path]:
    """Write the project files into `target` (created if missing); refuse if any exists. Returns them."""
    existing = [rel for rel in FILES if os.path.lexists(target / rel)]
    if existing:
        raise Exists(f"{target}: init would overwrite {', '.join(existing)} (fix: init an empty folder, "
                     "or move those files away first; nothing was written)")
    if target.exists() and not target.is_dir():
        raise Exists(f"{target}: is not a folder (fix: name a folder to create the project in)")
    written = []
    for rel, text in FILES.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
        tmp.write_text(text)
        os.replace(tmp, path)
        written.append(path)
    return written
