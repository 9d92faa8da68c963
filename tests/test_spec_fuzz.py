"""A mutation fuzz of model.yaml (issue 34, item 2): the suite's valid specs, mutated deterministically, each loaded
through the real loader in-process.

Every variant either loads or is refused with ONE line naming the file and the key (a SpecError): never another
exception (a traceback, exit 3 under doit), and the project's other models still load and plan. Mutations: a value
swapped for another type (a list where a name is, a mapping where a list is, a date, nothing), numbers out of range
(0, -1, 10^30, 1e308, a 5000-digit integer), keys dropped, renamed or duplicated, deep nesting. Seeded: the same
variants every run. Runs in seconds (no doit subprocess but one).
"""
from __future__ import annotations

import datetime
import html
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, copy_project

from qnn_tasks.errors import SpecError
from qnn_tasks.spec import keys as speckeys
from qnn_tasks.spec import schema
from qnn_tasks.spec.project import load_model, load_project, load_soc_table
from qnn_tasks.spec.yamlread import load_yaml

SEED = 34
VARIANTS_PER_SPEC = 220
HUGE = "__huge_int__"  # replaced in the text by a 5000-digit integer (Python cannot str() one by default)

# A third valid spec that reaches the keys the two examples leave out: media samples of each kind, pipeline glue
# with a stack, a loop, rewrites with options, constant inputs, task checks with a file (ctc alphabet), w8a16.
CHAIN_YAML = """\
licence: MIT
description: a chain of small graphs reaching every section of model.yaml
source: {url: https://example.org/chain}
graphs:
  embed:
    inputs:
      x: {shape: [1, 3, 8, 8], dtype: float32}
      state: {shape: [1, 4], dtype: float32}
    outputs:
      y: {shape: [1, 16]}
    socs: [SM8650]
    samples:
      image: {files: "images/*.png", input: x, resize: letterbox, layout: NCHW, channels: RGB,
              scale: 0.00392156862745098, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], limit: 4}
      fill: {state: 0.0}
    rewrites: [pow-square, {finite-mask: {value: -1.0e4}}, {scale-input: {input: x, factor: "2^-6"}}]
    constant_inputs: {sr: [16000]}
    simplify: {skip_optimizers: [fuse_preceding_mul_into_conv]}
    lint: {allow: [batch], max_fp16_params: 1.0e+9}
    cpucheck: {max_abs: 1.0e-3, min_cosine: 0.9999}
    options: {keep: [1, 2.5, text, true]}
    verify:
      samples: 4
      per_output: {y: {max_abs: 0.05}}
      checks:
        - elements: {output: y, tol: 0.01, slice: "..., 4:"}
  head:
    inputs:
      z: {shape: [1, 4, 16], dtype: float32}
    outputs:
      logits: {shape: [1, 10]}
    precision: [fp16, w8a16]
    calibration: {samples: 8, per_channel: true}
    samples:
      audio: {files: clips, input: z, rate: 16000, hop: 16, gain: [1.0, 0.5], pad: true}
    verify:
      checks: [{ctc: {output: logits, alphabet: alphabet.txt, blank: 0}}]
      w8a16: {thresholds: {min_cosine: 0.98}}
  step:
    inputs:
      h: {shape: [1, 4, 16], dtype: float32}
    outputs:
      h2: {shape: [1, 4, 16]}
      out: {shape: [1, 2]}
    samples:
      raw: {files: "raw/*.bin", input: h, dtype: float32, offset: 0}
pipeline:
  graphs: [embed, head]
  feed:
    head.z: {from: embed.y, stack: {runs: 4, axis: 1, hop: 1}, scale: 0.5, offset: 1.0e-4}
  verify: {thresholds: {min_cosine: 0.99}}
loop:
  graph: step
  feed: {h: h2}
  steps: 5
  verify:
    checks: [{agreement: {output: out, threshold: 0.5, min: 0.9}}]
"""


def add_chain_model(root: Path) -> Path:
    folder = root / "models" / "chain"
    for sub in ("images", "clips", "raw"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "images" / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # the loader globs; the build decodes
    (folder / "clips" / "a.wav").write_bytes(b"RIFF")
    (folder / "raw" / "a.bin").write_bytes(bytes(64))
    (folder / "alphabet.txt").write_text("a\nb\n")
    (folder / "export.py").write_text("# the chain's model code (the loader only checks that it exists)\n")
    (folder / "model.yaml").write_text(CHAIN_YAML)
    return folder


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = copy_project(tmp_path_factory.mktemp("fuzz") / "project").root
    add_chain_model(root)
    return root


# ---------------------------------------------------------------- mutations

def _nodes(data: Any, path: tuple = ()) -> list[tuple]:
    """Every node's path (keys and list indices) below the top."""
    found = [path] if path else []
    if isinstance(data, dict):
        for k, v in data.items():
            found += _nodes(v, path + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            found += _nodes(v, path + (i,))
    return found


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _replacements(value: Any) -> list[Any]:
    return [[value], {"k": value}, [[value]], "text", "", 7, 0, -1, 1.5, True, None, 10**30, -(10**30), 1.0e308,
            -1.0e308, float("inf"), 2**31, 2**63, HUGE, datetime.date(2024, 1, 1), _nested(40), {"a": {"b": [value]}},
            [1, "a", None], "../../etc/passwd", "/etc/passwd", "x" * 5000]


def mutate(base: dict, text: str, rng: random.Random) -> tuple[str, str]:
    """One seeded variant of a spec: (what was done, the YAML text)."""
    import copy

    import yaml

    data = copy.deepcopy(base)
    nodes = _nodes(data)
    target = rng.choice(nodes)
    parent, last = _get(data, target[:-1]), target[-1]
    kind = rng.choice(["swap", "swap", "swap", "number", "drop", "rename", "duplicate", "nest"])
    if kind == "duplicate":  # text level: YAML keys cannot repeat in a dict
        lines = text.splitlines()
        keyed = [i for i, line in enumerate(lines) if re.match(r"^\s*[A-Za-z_][\w.-]*:", line)]
        i = rng.choice(keyed)
        return f"duplicate line {i + 1}", "\n".join(lines[:i + 1] + [lines[i]] + lines[i + 1:]) + "\n"
    if kind == "drop":
        del parent[last]
        what = f"drop {target}"
    elif kind == "rename" and isinstance(parent, dict):
        parent["zz_" + str(last)] = parent.pop(last)
        what = f"rename {target}"
    elif kind == "number":
        parent[last] = rng.choice([0, -1, 10**30, -(10**30), 1.0e308, 2**31, 2**63, HUGE, 0.5, -0.5, 1.0e-320])
        what = f"number {target} = {parent[last]!r:.30}"
    elif kind == "nest":
        parent[last] = _nested(rng.choice([30, 99, 150]))
        what = f"nest {target}"
    else:
        parent[last] = rng.choice(_replacements(parent[last]))
        what = f"swap {target} = {str(parent[last])[:30]!r}"
    dumped = yaml.safe_dump(data, sort_keys=False, width=10**6)
    return what, dumped.replace(f"'{HUGE}'", "9" * 5000).replace(HUGE, "9" * 5000)


def variants(model_yaml: Path) -> list[tuple[str, str]]:
    text = model_yaml.read_text()
    base = load_yaml(model_yaml)
    rng = random.Random(f"{SEED}:{model_yaml.parent.name}")
    return [mutate(base, text, rng) for _ in range(VARIANTS_PER_SPEC)]


def assert_one_line(message: str, path: Path) -> None:
    """`<file>: <key or line>: <problem> (fix: <what to do>)`, on one line."""
    assert "\n" not in message, message
    assert message.startswith(f"{path}: "), message
    where = message[len(f"{path}: "):].split(": ", 1)
    assert len(where) == 2 and where[0].strip(), f"no key named: {message}"
    assert "(fix: " in message, message
    assert len(message) < 2000, message[:300]


# ---------------------------------------------------------------- the fuzz

@pytest.mark.parametrize("model", ["minilm", "silero-vad", "chain"])
def test_mutated_specs_load_or_are_one_line(project, model):
    """Every variant: loaded, or one SpecError line naming the file and the key; nothing else escapes; bounded time."""
    folder = project / "models" / model
    path = folder / "model.yaml"
    original = path.read_text()
    socs, _ = load_soc_table(project)
    refused = loaded = 0
    slowest = 0.0
    try:
        for what, text in variants(path):
            path.write_text(text)
            start = time.perf_counter()
            try:
                load_model(folder, socs)
                loaded += 1
            except SpecError as err:
                assert_one_line(str(err), path)
                refused += 1
            except Exception as err:  # noqa: BLE001 - what the fuzz is for: name the variant that escaped
                pytest.fail(f"{what}: {type(err).__name__}: {err}"[:500])
            slowest = max(slowest, time.perf_counter() - start)
    finally:
        path.write_text(original)
    assert refused > VARIANTS_PER_SPEC // 2 and loaded, (refused, loaded)  # the mutations do reach the checks
    assert slowest < 2.0, slowest


def test_a_broken_model_leaves_the_others_listed_and_planned(project):
    """A sample of variants, each with the whole project: the other models load and plan as before."""
    from qnn_tasks.plan.stages import Planner
    from qnn_tasks.tasks.project import TaskFactory

    path = project / "models" / "chain" / "model.yaml"
    original = path.read_text()
    others = {"minilm", "silero-vad"}
    try:
        for what, text in variants(path)[::10]:
            path.write_text(text)
            loaded = load_project(project)
            names = {m.name for m in loaded.models}
            assert others <= names, (what, loaded.broken)
            assert ("chain" in names) != any(name == "chain" for name, _ in loaded.broken), what
            tasks = TaskFactory(Planner(loaded)).namespace()  # every task dict, as `doit list` makes them
            listed = {name for name, value in tasks.items() if name.startswith("task_")}
            assert "task_export" in listed and tasks, what
            assert all(g.model_dir.exists() for g in Planner(loaded).project.graphs()), what
    finally:
        path.write_text(original)


def test_doit_list_survives_a_wrong_type_that_crashed_the_loader(project, tmp_path):
    """The one doit subprocess: `socs: [[SM8650]]` (a list where a name is) was a traceback and exit 3 for every
    model; now the model is unbuildable and the others list."""
    root = copy_project(tmp_path / "p").root
    path = root / "models" / "minilm" / "model.yaml"
    path.write_text(path.read_text().replace("socs: [SM8550, SM8650,", "socs: [[SM8550], SM8650,"))
    proc = subprocess.run([sys.executable, "-m", "doit", "list"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.strip()]
    assert line.startswith(f"error: {path}: graphs.minilm.socs[0]: expected text, got a list of 1"), line
    assert "export" in proc.stdout and "spec" in proc.stdout


# ---------------------------------------------------------------- the schema is the docs' key reference

def documented_keys(page: Path) -> dict[str, str]:
    """The rows of the key reference table in docs/model-yaml.md: `key` | type."""
    text = page.read_text()
    table = text[text.index("## Key reference"):]
    return {m.group(1): html.unescape(m.group(2).strip())
            for m in re.finditer(r"^\| `([^`]+)` \| ([^|]+) \|", table, re.M)}


def test_every_documented_key_is_in_the_schema_and_back():
    documented = documented_keys(Path(__file__).resolve().parents[1] / "docs" / "model-yaml.md")
    assert documented == schema.reference(speckeys.MODEL)


def test_the_example_specs_pass_the_schema():
    for model_yaml in sorted((EXAMPLES / "models").glob("*/model.yaml")):
        schema.check(load_yaml(model_yaml), speckeys.MODEL, model_yaml)
