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
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, copy_project

from qnn_tasks.errors import SpecError
from qnn_tasks.modelspec import keys as speckeys
from qnn_tasks.modelspec import schema
from qnn_tasks.modelspec.load import load_model, load_project, load_soc_table
from qnn_tasks.modelspec.yamlread import load_yaml

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
    lint: {allow: [batch]}
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
    for fixture in (EXAMPLES / "speech" / "whisper-tiny-en", EXAMPLES.parent / "models" / "gelu-conv"):
        shutil.copytree(fixture, root / "models" / fixture.name, ignore=shutil.ignore_patterns("__pycache__"))
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

@pytest.mark.parametrize("model", ["minilm", "silero-vad", "chain", "whisper-tiny-en", "gelu-conv"])
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


@pytest.mark.parametrize("file", ["socs/socs.yaml", "toolchain/ort-qnn.yaml"])
def test_mutated_soc_tables_and_profiles_load_or_are_one_line(project, file):
    """The project-wide files: loaded and planned, or one line naming the file (every command then stops, exit 78)."""
    from qnn_tasks.errors import QnnTasksError
    from qnn_tasks.plan.planner import Planner

    path = project / file
    original = path.read_text()
    base, rng = load_yaml(path), random.Random(f"{SEED}:{file}")
    refused = 0
    try:
        for _ in range(40):
            what, text = mutate(base, original, rng)
            path.write_text(text)
            try:
                Planner(load_project(project))
            except QnnTasksError as err:
                assert "\n" not in str(err) and str(err).startswith(f"{path}: ") and "(fix: " in str(err), (what, err)
                refused += 1
            except Exception as err:  # noqa: BLE001 - name the variant that escaped
                pytest.fail(f"{what}: {type(err).__name__}: {err}"[:500])
    finally:
        path.write_text(original)
        (project / ".qnn-specs.cache").unlink(missing_ok=True)
    assert refused > 10, refused


def test_a_broken_model_leaves_the_others_listed_and_planned(project):
    """A sample of variants, each with the whole project: the other models load and plan as before."""
    from qnn_tasks.plan.planner import Planner
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
            exported = {task["name"] for task in tasks["task_export"]()}
            assert {"minilm", "vad"} <= exported, what
            for name, make in tasks.items():  # every stage's tasks are made: a value planning trips on shows here
                if name.startswith("task_") and callable(make):
                    list(make())
    finally:
        path.write_text(original)


def test_a_loader_bug_still_costs_one_model_only(tmp_path, monkeypatch):
    """The net under the schema: an exception the loader did not expect is that model's one line, not the project's."""
    from qnn_tasks.modelspec import load as specload

    root = copy_project(tmp_path / "p").root
    real = specload.load_model

    def flaky(model_dir, socs):
        if model_dir.name == "minilm":
            raise TypeError("unhashable type: 'list'\nsecond line")
        return real(model_dir, socs)

    monkeypatch.setattr(specload, "load_model", flaky)
    loaded = load_project(root)
    assert [m.name for m in loaded.models] == ["silero-vad"]
    [(name, line)] = loaded.broken
    assert name == "minilm" and line == (f"{root / 'models/minilm/model.yaml'}: the loader failed on this file: "
                                         "TypeError: unhashable type: 'list' (fix: a bug of qnn-npu-compile: please "
                                         "report it with this file)")


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


# ---------------------------------------------------------------- hostile specs: types, bounds, confinement

@pytest.fixture
def chain(tmp_path) -> Path:
    """A fresh copy of the project with the chain model: (its folder)."""
    root = copy_project(tmp_path / "project").root
    return add_chain_model(root)


def load_chain(folder: Path, old: str = "", new: str = ""):
    path = folder / "model.yaml"
    if old:
        assert old in path.read_text(), old
        path.write_text(path.read_text().replace(old, new, 1))
    socs, _ = load_soc_table(folder.parents[1])
    return load_model(folder, socs)


def refused(folder: Path, old: str, new: str, *fragments: str) -> str:
    with pytest.raises(SpecError) as info:
        load_chain(folder, old, new)
    message = str(info.value)
    assert_one_line(message, folder / "model.yaml")
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_numbers_are_read_as_users_write_them(chain, tmp_path):
    """YAML 1.1 read 1e7 and -1.0e4 as text, so `{finite-mask: {value: -1.0e4}}` (the lint's own hint) was refused."""
    (tmp_path / "n.yaml").write_text("a: [1e7, 1.0e-4, -1.0e4, .5, 1.0e+9, 2E-3, 7, 0x10, 1_000, 1e400]\n")
    assert load_yaml(tmp_path / "n.yaml")["a"] == [1.0e7, 1.0e-4, -1.0e4, 0.5, 1.0e9, 2.0e-3, 7, 16, 1000, float("inf")]
    graph = {g.name: g for g in load_chain(chain).graphs}["embed"]  # CHAIN_YAML writes value: -1.0e4
    assert graph.rewrites["finite-mask"]["value"] == -1.0e4
    assert {g.name: g for g in load_chain(chain, "gain: [1.0, 0.5]", "gain: [1e3, 5e-1]").graphs}[
        "head"].samples["audio"]["gain"] == [1000.0, 0.5]
    refused(chain, "gain: [1e3, 5e-1]", "gain: 1.0e7", "graphs.head.samples.audio.gain: 10000000.0 is out of range")
    refused(chain, "gain: 1.0e7", "gain: 1e400", "graphs.head.samples.audio.gain: expected a number, got inf")


@pytest.mark.parametrize("old, new, fragments", [
    pytest.param("graph: step", "graph: [step]", ["loop.graph: expected text, got a list of 1"], id="loop-graph-list"),
    pytest.param("graphs: [embed, head]", "graphs: [[embed], head]", ["pipeline.graphs[0]: expected text"],
                 id="pipeline-graphs-nested"),
    pytest.param("input: x,", "input: [x],", ["graphs.embed.samples.image.input: expected text"], id="samples-input"),
    pytest.param("verify: {thresholds: {min_cosine: 0.99}}", "verify: {thresholds: [x]}",
                 ["pipeline.verify.thresholds: expected a mapping, got a list of 1"], id="thresholds-list"),
    pytest.param("checks: [{ctc:", "checks: 5\n      zz: [{ctc:", ["graphs.head.verify.checks: expected a list"],
                 id="checks-number"),
    pytest.param("socs: [SM8650]", "socs: [[SM8650]]", ["graphs.embed.socs[0]: expected text"], id="socs-nested"),
    pytest.param("steps: 5", "steps: " + "9" * 5000, ["line 55, column 10", "an integer of 5000 digits", "write a smaller number"], id="5000-digits"),
    pytest.param("z: {shape: [1, 4, 16]", "z: {shape: [1, 1000000000000000000000000000000, 16]",
                 ["graphs.head.inputs.z.shape[1]: 1000000000000000000000000000000 is out of range"], id="dim-1e30"),
    pytest.param("z: {shape: [1, 4, 16]", "z: {shape: [1, 65536, 65536]",
                 ["graphs.head.inputs.z.shape: [1, 65536, 65536] holds 4.29e+09 values"], id="tensor-too-big"),
    pytest.param("options: {keep: [1, 2.5, text, true]}", "options: {when: 2024-01-01}",
                 ["graphs.embed.options.when: a date (2024-01-01) is not a plain value", "quote it"], id="date-option"),
    pytest.param("licence: MIT", "licence: {name: MIT}", ["licence: expected text, got a mapping"], id="licence-map"),
])
def test_a_wrong_type_is_one_line_naming_the_key(chain, old, new, fragments):
    """Each of these crashed the loader (a traceback, exit 3 for every model) on the issue's starting commit."""
    if old == "checks: [{ctc:":
        new, old = "checks: 5", "checks: [{ctc: {output: logits, alphabet: alphabet.txt, blank: 0}}]"
    refused(chain, old, new, *fragments)


def test_a_scale_input_power_is_bounded_before_it_is_computed(chain):
    """`2^1000000000` took 12.5 s and 441 MB in `doit list`: now refused at once, like any factor out of range."""
    start = time.perf_counter()
    refused(chain, 'factor: "2^-6"', 'factor: "2^1000000000"', "graphs.embed.rewrites", "outside fp16's range")
    refused(chain, 'factor: "2^1000000000"', 'factor: "1e999999999"', "graphs.embed.rewrites", "power of two")
    assert time.perf_counter() - start < 1.0
    assert {g.name: g for g in load_chain(chain, 'factor: "1e999999999"', 'factor: "1/64"').graphs}[
        "embed"].rewrites["scale-input"]["factor"] == 1 / 64


def test_a_scale_input_factor_out_of_range_is_told_the_range_it_accepts(chain):
    """A factor fp16 cannot hold, or one not a power of two, got the list of rewrite names as its fix; the fix now
    gives the range, and an unknown option is told the rewrite's options."""
    for bad, problem in (('"2^40"', "scale-input factor '2^40' (2^40) is outside fp16's range"),
                         ("0.3", "scale-input factor must be a power of two other than 1, got 0.3"),
                         ("1", "scale-input factor must be a power of two other than 1, got 1")):
        line = refused(chain, 'factor: "2^-6"', f"factor: {bad}", "graphs.embed.rewrites", problem)
        assert "(fix: give a power of two from 2^-14 to 2^15" in line and "e.g. factor: 1/64" in line, line
        assert "use names from" not in line, line
        load_chain(chain, f"factor: {bad}", 'factor: "2^-6"')
    line = refused(chain, 'factor: "2^-6"', 'factor: "2^-6", gain: 2', "unknown option 'gain' for rewrite 'scale-input'")
    assert line.endswith("(fix: use its options: input, factor)"), line


def test_a_recursive_pattern_does_not_follow_symlinked_folders(chain):
    """`**` through two symlinks back into the model folder was an endless walk: now symlinked folders are not
    entered by `**` (each file is found once), in a subprocess bounded by a timeout."""
    (chain / "images" / "deep").mkdir()
    (chain / "images" / "deep" / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (chain / "images" / "back").symlink_to(chain, target_is_directory=True)
    (chain / "images" / "deep" / "again").symlink_to(chain / "images", target_is_directory=True)
    (chain / "model.yaml").write_text(CHAIN_YAML.replace('files: "images/*.png"', 'files: "**/*.png"'))
    code = ("import sys; from pathlib import Path; from qnn_tasks.modelspec.load import load_model, load_soc_table\n"
            f"folder = Path({str(chain)!r}); socs, _ = load_soc_table(folder.parents[1])\n"
            "graph = {g.name: g for g in load_model(folder, socs).graphs}['embed']\n"
            "print(sorted(str(p.relative_to(folder)) for p in graph.sample_files()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['images/a.png', 'images/deep/b.png']"


def test_a_pattern_that_walks_too_much_is_one_line(chain, monkeypatch):
    from qnn_tasks.modelspec import specport

    monkeypatch.setattr(specport, "MAX_WALKED", 50)
    for i in range(60):
        (chain / "raw" / f"{i}.bin").write_bytes(bytes(64))
    refused(chain, 'files: "raw/*.bin"', 'files: "**/*.bin"', "graphs.step.samples.raw.files: '**/*.bin' walks more "
            "than 50 files and folders", "more narrowly")


def test_a_ctc_alphabet_is_confined_to_the_model_folder(chain, tmp_path):
    """A symlinked alphabet would put another file's lines into failure messages."""
    from qnn_tasks.errors import StageError
    from qnn_tasks.judge.taskchecks import read_alphabet

    secret = tmp_path / "secret.txt"
    secret.write_text("password\n")
    (chain / "alphabet.txt").unlink()
    (chain / "alphabet.txt").symlink_to(secret)
    refused(chain, "", "", "graphs.head.verify.checks[0].ctc.alphabet: alphabet.txt leads through a symlink",
            "outside the model folder")
    with pytest.raises(StageError, match="outside the model folder"):  # swapped after the spec was loaded
        read_alphabet(chain, "alphabet.txt")


def test_cli_socs_of_a_missing_folder_and_explain_of_a_code(tmp_path, capsys):
    from qnn_tasks.cli import main

    assert main(["socs", str(tmp_path / "nope")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert out.err.startswith(f"error: {tmp_path / 'nope'}: no such folder (fix: ")
    assert main(["explain", "3110"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("QNN error 3110 (QNN_OP_PACKAGE_ERROR_VALIDATION_FAILURE): ") and out.count("\n") == 1
    assert main(["explain", "QNN_CONTEXT_ERROR_INVALID_ARGUMENT"]) == 0
    assert capsys.readouterr().out.startswith("QNN error 5000 ")
    assert main(["explain", "1234"]) == 2
    assert "not a QNN error code of the catalogue" in capsys.readouterr().err


@pytest.mark.parametrize("name, raw, fragment", [
    ("QNN_LOCK_WAIT", "abc", "'abc' is not a number"),
    ("QNN_LOCK_WAIT", "-5", "-5 is out of range"),
    ("QNN_PROGRESS_SECONDS", "nan", "nan is out of range"),
    ("QNN_COMPAT_SAMPLES", "2.5", "'2.5' is not a whole number"),
    ("QNN_VERIFY_ROUNDS", "lots", "'lots' is not a whole number"),
    ("QNN_POWER_SECONDS", "1e999", "1e999 is out of range"),
    ("QNN_KEEP_DEVICE_FILES", "maybe", "'maybe' is not a yes or no"),
    ("QNN_UPGRADE_GATE", "abc", "'abc' is not a yes or no"),
    ("ANDROID_ADB_SERVER_PORT", "99999", "99999 is out of range"),
    ("QNN_EXECUTOR", "dask://", "unknown value 'dask://'"),
])
def test_environment_values_are_one_line(name, raw, fragment):
    """Each was read with int()/float() where it was used (a traceback mid-run), or silently taken as "no"."""
    from qnn_tasks import envvalues

    with pytest.raises(SpecError) as info:
        envvalues.check_all({name: raw})
    message = str(info.value)
    assert message.startswith(f"${name}: ") and fragment in message and "(fix: " in message
    assert "\n" not in message
    envvalues.check_all({name: ""})  # empty is unset: the default


def test_a_bad_environment_value_stops_doit_with_one_line(tmp_path):
    """QNN_LOCK_WAIT=abc was a traceback (exit 3) when a build took the lock; now every command refuses with one line
    and exit 78 before anything runs or is written."""
    from qnn_tasks.errors import EXIT_SPEC

    root = copy_project(tmp_path / "p").root
    proc = subprocess.run([sys.executable, "-m", "doit", "export:vad"], cwd=root, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "QNN_LOCK_WAIT": "abc"})
    assert proc.returncode == EXIT_SPEC, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: $QNN_LOCK_WAIT: 'abc' is not a number of seconds (fix: "), line
    assert not (root / "build").exists()
