"""Every key of the spec files with its type and bounds (modelspec/schema.py's types): model.yaml, socs.yaml, profiles.

A stage's own section under `graphs.<graph>` (simplify:, lint:, ...) is its declaration's (modelspec/stagesettings.py):
GRAPH lists the built-in stages' sections, `model_table` adds those of the stages a project registered.

The loaders check a file against its table first (modelspec/load.py), then read values known to be of their type.
Ranges that are facts of the domain live beside the code that uses them (checks.THRESHOLD_RANGES, CHECK_RANGES,
loop.MAX_STEPS, pipeline.MAX_RUNS, samples.MAX_SAMPLES) and are referenced here, not repeated.
"""
from __future__ import annotations

import functools
from dataclasses import replace

from qnn_tasks.envvalues import STAGE_TIMEOUT_MAX
from qnn_tasks.modelspec import stagesettings
from qnn_tasks.modelspec.checks import CHECK_KINDS, CHECK_RANGES, THRESHOLD_KEYS, THRESHOLD_RANGES
from qnn_tasks.modelspec.precision_table import QUANTIZED
from qnn_tasks.modelspec.schema import (
    MAX_DIM,
    MAX_RANK,
    Bool,
    Either,
    Fields,
    Free,
    Int,
    ListOf,
    MapOf,
    Num,
    Numbers,
    Section,
    Text,
)
from qnn_tasks.modelspec.specloop import MAX_STEPS
from qnn_tasks.modelspec.specpipeline import MAX_RUNS
from qnn_tasks.modelspec.specsamples import MAX_SAMPLES, MAX_WINDOW
from qnn_tasks.modelspec.specsplit import MAX_PARTS
from qnn_tasks.modelspec.spectransducer import MAX_SYMBOLS

NAME = Text(max_len=100)
FILE = Text(doc="path in the model folder")
FILES = Either((FILE, ListOf(FILE)), fix='e.g. files: "samples/*.npz" or files: [a/*.png, b/*.png]')
NUMBER_OR_LIST = Either((Num(), ListOf(Num(), min_items=1)), fix="give one number, or one per channel: [0.5, 0.5, 0.5]")

DIM = Int(1, MAX_DIM, bad="dynamic or invalid dim '{value}': the NPU needs static shapes",
          fix="give every dim a fixed positive integer (pad or chunk variable lengths at export)")
SIZE = Int(1, MAX_DIM, bad="size '{value}' is not one of a list of positive integers", fix="e.g. sizes: [32, 128]")
SIZES = ListOf(SIZE, 1, 64, bad="must be a list of positive integers", fix="e.g. sizes: [32, 128]")
# a dim is a size, or the name of a dim declared under the graph's `dims:` (modelspec/specsizes.py writes its sizes in)
SIZED_DIM = Either((DIM, Text(max_len=100, doc="a dim name declared under dims:")),
                   fix="give every dim a fixed positive integer, or name it under dims: with its sizes")
SHAPE = ListOf(SIZED_DIM, 1, MAX_RANK, bad="must be a list of integers", fix="e.g. shape: [1, 128]")
INPUT = Fields({"shape": SHAPE, "dtype": Text(max_len=40), "onnx_name": Text(max_len=256)}, required=("shape", "dtype"))
OUTPUT = Fields({"shape": SHAPE, "dtype": Text(max_len=40), "onnx_name": Text(max_len=256)}, required=("shape",))

THRESHOLDS = Section("thresholds", Fields({name: Num(*THRESHOLD_RANGES[name]) for name in THRESHOLD_KEYS}))
_OPTION_TYPES = {"output": NAME, "slice": Text(max_len=200), "box_format": Text(max_len=40), "transpose": Bool(),
                 "objectness": Bool(), "alphabet": FILE,
                 "steps": Text(max_len=40), "classes": Text(max_len=40)}


def _option(kind: str, option: str):
    ranged = CHECK_RANGES.get(kind, {}).get(option)
    if ranged:
        kind_of, low, high = ranged
        return (Int if kind_of is int else Num)(low, high)
    return _OPTION_TYPES[option]


CHECK = Section("check", Fields({kind: Fields({option: _option(kind, option) for option in sorted(options)})
                                 for kind, options in CHECK_KINDS.items()}, one=True,
                                fix="each check is one `kind: {options}` mapping, e.g. - agreement: {output: output, "
                                "min: 0.99}"))
_VERIFY = {"samples": Int(1, 1_000_000), "thresholds": THRESHOLDS, "per_output": MapOf(THRESHOLDS, "<output>"),
           "checks": ListOf(CHECK, max_items=100)}
VERIFY = Section("verify", Fields({**_VERIFY, **{p: Fields(dict(_VERIFY)) for p in QUANTIZED}}))

_COMMON = {"files": FILES, "input": NAME, "limit": Int(1, MAX_SAMPLES)}
SAMPLES = Fields({
    "files": FILES,
    "image": Fields({**_COMMON, "resize": Text(max_len=40), "pad_value": Int(0, 255), "pad_normalised": Num(),
                     "layout": Text(max_len=40),
                     "channels": Text(max_len=40), "scale": Num(), "mean": NUMBER_OR_LIST, "std": NUMBER_OR_LIST},
                    required=("files",)),
    "audio": Fields({**_COMMON, "rate": Int(1000, 384000), "frame": Int(1, MAX_WINDOW), "hop": Int(1, MAX_WINDOW),
                     "int16_scale": Bool(), "gain": Either((Num(0.0, 1.0e6), ListOf(Num(0.0, 1.0e6), min_items=1))),
                     "pad": Bool(), "pad_min": Int(1, MAX_WINDOW), "lengths": NAME}, required=("files",)),
    "raw": Fields({**_COMMON, "dtype": Text(max_len=40), "offset": Int(0, None), "record_length": Int(1, MAX_DIM)},
                  required=("files",)),
    "fill": MapOf(Num(), "<input>"),
    "from": Either((Text(max_len=300), MapOf(Text(max_len=300), "<input>")), fix="e.g. from: embed.y or from: {x: embed.y}"),
}, fix='e.g. samples: {files: "samples/*.npz"} or samples: {image: {files: "images/*.png"}}')

REWRITE_OPTIONS = MapOf(Either((Text(), Num(), Bool())), "<option>")
REWRITES = Either((ListOf(Either((Text(max_len=100), MapOf(REWRITE_OPTIONS, "<rewrite>")))),
                   MapOf(REWRITE_OPTIONS, "<rewrite>")),
                  fix="e.g. rewrites: [pow-square, {finite-mask: {value: -1.0e4}}]",
                  doc="list of rewrite names or `name: {options}`, or a mapping of name to options")

GRAPH = Fields({
    "inputs": MapOf(INPUT, "<input>", max_items=1000),
    "outputs": MapOf(OUTPUT, "<output>", max_items=1000),
    "precision": Either((Text(max_len=40), ListOf(Text(max_len=40)),
                         Fields({"auto": ListOf(Text(max_len=40), min_items=2, max_items=8)})),
                        fix="e.g. precision: [fp16, w8a16], or precision: auto"),
    "socs": ListOf(NAME, min_items=1, bad="must be a non-empty list of SoC names", fix="e.g. socs: [SM8650, SM8750]"),
    "export": NAME,
    "options": Free(),
    "verify": VERIFY,
    "allow_cpu_fallback": Bool(),
    "source": Fields({"package": Text(max_len=200), "file": FILE}),
    "rewrites": REWRITES,
    "constant_inputs": MapOf(Numbers(), "<input>"),
    "samples": SAMPLES,
    "split": Fields({"at": ListOf(Text(max_len=256), 1, MAX_PARTS), "parts": Int(2, MAX_PARTS)}),  # modelspec/specsplit.py: one of
    "dims": MapOf(Either((SIZES, Fields({"sizes": SIZES, "pad": MapOf(Num(), "<input>"), "longer": Text(max_len=20)},
                                        required=("sizes",)))),
                  "<dim>", max_items=100, fix="e.g. dims: {seq: [32, 128]}"),  # modelspec/specsizes.py allows one (its message)
    **{settings.section: settings.fields() for settings in stagesettings.BUILT_IN},  # the stages' own sections
}, required=("inputs", "outputs"))

GLUE = Fields({"from": Text(max_len=300), "reshape": Bool(), "scale": Num(), "offset": Num(),
               "stack": Fields({"runs": Int(1, MAX_RUNS), "axis": Int(-MAX_RANK, MAX_RANK), "hop": Int(1, MAX_RUNS)},
                               required=("runs",), fix="write e.g. stack: {runs: 16, axis: 1}"),
               # a constant instead of an output (a start token): modelspec/specpipeline.py wants one of from and value
               "value": Numbers(fix="e.g. value: 1 (every value of the input), or a list of the input's shape",
                                bools=False)})
PIPELINE = Fields({
    "graphs": ListOf(NAME, 2, 100, bad="needs two or more different graph names in order",
                     fix="e.g. graphs: [features, classifier]"),
    "feed": MapOf(Either((Text(max_len=300), GLUE)), "<graph>.<input>"),
    "verify": VERIFY})
TRANSDUCER = Fields({"frames": NAME, "decoder": NAME, "joiner": NAME, "blank": Int(0, MAX_DIM),
                     "max_symbols": Int(1, MAX_SYMBOLS), "tokens": FILE},
                    required=("frames", "decoder", "joiner", "tokens"))
LOOP = Fields({"graph": NAME, "feed": MapOf(NAME, "<input>"), "steps": Int(1, MAX_STEPS), "step": NAME,
               "start": MapOf(Text(max_len=300), "<input>"), "run_steps": Int(1, MAX_STEPS),
               "transducer": TRANSDUCER, "verify": VERIFY})

MODEL = Fields({
    "licence": Text(max_len=200),
    "description": Text(),
    "source": Fields({"package": Text(max_len=200), "file": FILE, "url": Text()}),
    "graphs": MapOf(GRAPH, "<graph>", max_items=1000),
    "pipeline": PIPELINE,
    "loop": LOOP,
    "ship": Fields({"precision_order": ListOf(Text(max_len=40)), "delivery": Text(max_len=40)}),
    "stage_timeout": Num(1.0, STAGE_TIMEOUT_MAX),
}, required=("licence", "source", "graphs"))

SOC_ROW = Fields({"soc_id": Int(1, 1023), "dsp_arch": Text(max_len=10), "vtcm_mb": Int(1, 64),
                  "runs": ListOf(Text(max_len=40)), "fp16": Bool(), "note": Text(), "alias_of": NAME,
                  "platform": Text(max_len=40), "context_mb": Int(1, 1 << 20),
                  "memory_mb": Int(1, 1 << 20)},
                 required=("soc_id", "dsp_arch", "vtcm_mb"))
SOCS = Fields({"socs": MapOf(SOC_ROW, "<SoC>"),
               "default": Either((Text(max_len=40), ListOf(NAME)), fix="e.g. default: [SM8650, SM8750], or default: all")})

PROFILE = Fields({
    "kind": Text(max_len=40),
    "options": Free(),  # the toolchain kind checks its own options (toolchains/)
    "settings": Free(),
    "packages": ListOf(Text(max_len=300), bad="must be a list of pinned requirements",
                       fix="e.g. packages: [onnxruntime-qnn==2.3.0, onnxruntime==1.24.4]"),
    "cache": Text(doc="folder or fsspec URL"),
    "upgrade": Fields({"gate": Bool(), "cosine_margin": Num(0.0, 1.0), "size_growth": Num(0.0, None)}),
}, required=("kind",))


@functools.lru_cache(maxsize=8)
def model_table(registered: tuple[stagesettings.StageSettings, ...] = ()) -> Fields:
    """MODEL with the sections of the stages a project registered under `graphs.<graph>` (none: MODEL itself)."""
    if not registered:
        return MODEL
    graph = replace(GRAPH, fields={**GRAPH.fields, **{s.section: s.fields() for s in registered}})
    return replace(MODEL, fields={**MODEL.fields, "graphs": replace(MODEL.fields["graphs"], value=graph)})
