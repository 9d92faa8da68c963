"""The user docs (README.md and the mkdocs site in docs/): the site builds with --strict, so a broken link or
anchor fails; README's links into docs/ resolve; and every YAML example loads with the spec loader `doit` uses
(`qnn_tasks.modelspec.load.load_project`) in a project of its own, so a doc that shows an invalid spec fails.

A ```yaml block says what it is in its first line:
  # models/<m>/model.yaml ...                          a whole model.yaml
  # excerpt of models/<m>/model.yaml[, under <key>]    part of one: merged into a minimal valid spec (BASES)
  # socs/socs.yaml ...                                 a project's SoC table (over the packaged one)
  # toolchain/<name>.yaml ...                          a toolchain profile (the project's, over the packaged one)
  # not a spec: <why>                                  skipped, counted (keep these few)
Blocks in other languages (bash, plain text, JSON) are not specs and are skipped by their tag.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from qnn_tasks.errors import SpecError
from qnn_tasks.modelspec.load import load_project, load_toolchain

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DOC_FILES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
MAX_SKIPS = 2

MODEL = re.compile(r"# models/([\w.-]+)/model\.yaml\b")
EXCERPT = re.compile(r"# excerpt of models/([\w.-]+)/model\.yaml(?:, under ([\w.]+))?")
SOCS = re.compile(r"# socs/socs\.yaml\b")
TOOLCHAIN = re.compile(r"# toolchain/([\w.-]+)\.yaml\b")
SKIP = re.compile(r"# not a spec: (.+)")

# Minimal valid specs the excerpts are merged into (a packaged ONNX, YAML only), by the model the excerpt names.
BASES = {
    "silero-vad": """
licence: MIT
source: {package: silero-vad, file: silero_vad/data/silero_vad_op18_ifless.onnx}
graphs:
  vad:
    inputs:
      input: {shape: [1, 576], dtype: float32}
      state: {shape: [2, 1, 128], dtype: float32}
    outputs:
      output: {shape: [1, 1]}
      stateN: {shape: [2, 1, 128]}
    constant_inputs: {sr: 16000}
    samples: {files: "samples/*.npz"}
""",
    "lstm": """
licence: Apache-2.0
source: {file: lstm.onnx}
graphs:
  lstm:
    inputs: {x: {shape: [1, 20, 32], dtype: float32}}
    outputs: {logits: {shape: [1, 10]}}
    samples: {files: "samples/*.npz"}
""",
    "classifier": """
licence: Apache-2.0
source: {file: model.onnx}
graphs:
  features:
    inputs: {x: {shape: [1, 64], dtype: float32}}
    outputs: {y: {shape: [1, 64]}}
    samples: {files: "samples/*.npz"}
  classifier:
    inputs: {y: {shape: [1, 64], dtype: float32}}
    outputs: {logits: {shape: [1, 10]}}
    samples: {files: "samples/*.npz"}
""",
    "embed-head": """
licence: Apache-2.0
source: {file: model.onnx}
graphs:
  embed:
    inputs: {x: {shape: [1, 16], dtype: float32}}
    outputs: {y: {shape: [1, 64]}}
    samples: {files: "samples/*.npz"}
  head:
    inputs: {z: {shape: [1, 8, 8], dtype: float32}}
    outputs: {logits: {shape: [1, 10]}}
    samples: {files: "samples/*.npz"}
""",
    "streaming-transducer": """
licence: Apache-2.0
source: {file: weights.pt}
graphs:
  stream_encoder:
    inputs:
      x: {shape: [1, 32, 80], dtype: float32}
      cached_key: {shape: [4, 32, 128], dtype: float32}
      cached_val: {shape: [4, 32, 128], dtype: float32}
      cached_conv: {shape: [4, 4, 128], dtype: float32}
    outputs:
      encoder_out: {shape: [1, 8, 128]}
      new_cached_key: {shape: [4, 32, 128]}
      new_cached_val: {shape: [4, 32, 128]}
      new_cached_conv: {shape: [4, 4, 128]}
    samples: {files: "samples/*.npz"}
  stream_decoder:
    inputs: {y: {shape: [1, 2], dtype: int32}}
    outputs: {decoder_out: {shape: [1, 128]}}
    samples: {files: "samples/*.npz"}
  stream_joiner:
    inputs:
      encoder_out: {shape: [1, 128], dtype: float32}
      decoder_out: {shape: [1, 128], dtype: float32}
    outputs: {logit: {shape: [1, 52]}}
    samples: {files: "samples/*.npz"}
""",
    "wakeword": """
licence: Apache-2.0
source: {file: model.onnx}
graphs:
  embed:
    inputs: {x: {shape: [1, 16], dtype: float32}}
    outputs: {y: {shape: [1, 96]}}
    samples: {files: "samples/*.npz"}
  classify:
    inputs: {x: {shape: [1, 16, 96], dtype: float32}}
    outputs: {logits: {shape: [1, 2]}}
    samples: {files: "samples/*.npz"}
""",
}


class ExampleError(AssertionError):
    """A documented example that the spec loader refuses: `<doc file>:<line>: <the loader's one line>`."""


@dataclass(frozen=True)
class Block:
    file: Path
    line: int   # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"

    @property
    def header(self) -> str:
        return self.text.split("\n", 1)[0].strip()


def code_blocks(path: Path) -> list[Block]:
    blocks, opened, body = [], None, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if opened is None:
                opened, body = (number, line[3:].strip()), []
            else:
                blocks.append(Block(path, opened[0], opened[1], "\n".join(body) + "\n"))
                opened = None
        elif opened is not None:
            body.append(line)
    assert opened is None, f"{path}: line {opened[0]}: a code block is never closed"
    return blocks


def yaml_blocks() -> list[Block]:
    return [b for f in DOC_FILES for b in code_blocks(f) if b.lang == "yaml"]


def kind_of(block: Block) -> str:
    for kind, pattern in (("model", MODEL), ("excerpt", EXCERPT), ("socs", SOCS), ("toolchain", TOOLCHAIN),
                          ("skip", SKIP)):
        if pattern.match(block.header):
            return kind
    raise ExampleError(f"{block.where}: a yaml block must say what it is in its first line, e.g. "
                       f"'# models/<m>/model.yaml' or '# excerpt of models/<m>/model.yaml' (got {block.header!r})")


def merge(base: dict, part: dict) -> dict:
    out = dict(base)
    for key, value in part.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def model_text(block: Block) -> tuple[str, str]:
    """(model folder name, the model.yaml to load) for a whole model or an excerpt merged into its base."""
    found = MODEL.match(block.header)
    if found:
        return found.group(1), block.text
    name, under = EXCERPT.match(block.header).groups()
    if name not in BASES:
        raise ExampleError(f"{block.where}: no minimal spec to merge an excerpt of models/{name} into "
                           f"(add one to tests/test_docs.py BASES, or show the whole model.yaml)")
    part = yaml.safe_load(block.text)
    for key in reversed(under.split(".") if under else []):
        part = {key: part}
    return name, yaml.safe_dump(merge(yaml.safe_load(BASES[name]), part), sort_keys=False)


def write_named_files(folder: Path, data: dict) -> None:
    """The files a model.yaml names, so a valid example loads: empty source ONNX files (the loader names
    an empty one only at export), one file per sample pattern or folder, alphabets, and export.py when a
    key names one of its functions (the loader checks that it exists, it does not run it)."""
    def touch(relative: str, content: bytes = b"") -> None:
        target = folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)

    graphs = data.get("graphs") or {}
    transducer = (data.get("loop") or {}).get("transducer") or {}
    if transducer.get("tokens"):  # the loader checks the tokens file is there (the loop stage reads its lines)
        touch(transducer["tokens"], b"<blk> 0\n")
    needs_code = bool((data.get("loop") or {}).get("step")) or bool(transducer)  # wer on tokens reads texts()
    for graph in graphs.values():
        graph = graph or {}
        for source in (data.get("source") or {}, graph.get("source") or {}):
            if source.get("file") and not source.get("package"):
                touch(source["file"])
        for kind, section in (graph.get("samples") or {}).items():
            if kind in ("fill", "from") or not isinstance(section, dict) and kind != "files":
                continue
            patterns = section if kind == "files" else section["files"]
            suffix = {"image": ".png", "audio": ".wav", "files": ".npz"}.get(kind, ".bin")
            for pattern in patterns if isinstance(patterns, list) else [patterns]:
                touch(pattern.replace("*", "a") if "*" in pattern else f"{pattern}/a{suffix}")
        for check in (graph.get("verify") or {}).get("checks", []):
            options = next(iter(check.values()))
            if isinstance(options, dict) and options.get("alphabet"):
                touch(options["alphabet"], b"a\nb\n")
        needs_code |= "export" in graph or "function" in (graph.get("calibration") or {})
    if needs_code:
        touch("export.py", b"# the model's own code: the spec loader only checks that the file exists\n")


def check_example(block: Block, tmp: Path):
    """Load one documented example in a fresh project under `tmp` with the loader `doit` uses; the loaded
    Project, or ExampleError with the loader's one-line error (None for a counted skip)."""
    kind = kind_of(block)
    if kind == "skip":
        return None
    project = tmp / "project"
    project.mkdir()
    toolchain = "ort-qnn"
    try:
        data = yaml.safe_load(block.text)
    except yaml.YAMLError as err:
        raise ExampleError(f"{block.where}: not YAML: {err}".replace("\n", " ")) from None
    if kind in ("model", "excerpt"):
        name, text = model_text(block)
        folder = project / "models" / name
        folder.mkdir(parents=True)
        (folder / "model.yaml").write_text(text)
        write_named_files(folder, yaml.safe_load(text) or {})
    elif kind == "socs":
        (project / "socs").mkdir()
        (project / "socs" / "socs.yaml").write_text(block.text)
    else:
        toolchain = TOOLCHAIN.match(block.header).group(1)
        (project / "toolchain").mkdir()
        (project / "toolchain" / f"{toolchain}.yaml").write_text(block.text)
    try:
        loaded = load_project(project, toolchain)
    except SpecError as err:
        raise ExampleError(f"{block.where}: {err}") from None
    if loaded.broken:
        raise ExampleError(f"{block.where}: {loaded.broken[0][1]}")
    if kind == "socs":
        assert set((data or {}).get("socs") or {}) <= set(loaded.socs), block.where
    return loaded


# ------------------------------------------------------------------ the site builds strictly

def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, check=False, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    run = mkdocs_build(ROOT / "mkdocs.yml", site)
    assert run.returncode == 0, run.stderr
    return site


def test_docs_build_strictly(site):
    assert (site / "index.html").is_file() and (site / "error-codes" / "index.html").is_file()
    assert not (ROOT / "site").exists(), "the docs are built into a temporary folder, never into the repository"
    for page in site.rglob("*.html"):  # readable offline: no script or style from the internet
        assert not re.search(r'(src|href)="https?://[^"]+\.(js|css)"', page.read_text()), page


def test_a_broken_link_or_anchor_fails_the_build(site, tmp_path):
    """The validation settings in mkdocs.yml, with --strict, make a missing page or anchor an error, and so does a
    page left out of nav (the unchanged docs build: see the `site` fixture)."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    page = tmp_path / "docs" / "index.md"
    broken = {"[x](socs.md#no-such-anchor)": "'socs.md' does not contain an anchor '#no-such-anchor'",
              "[x](no-such-page.md)": "'no-such-page.md', but the target is not found",
              "[x](#nowhere-here)": "'#nowhere-here', but there is no such anchor on this page"}
    page.write_text(page.read_text() + "\n" + "\n".join(broken) + "\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n\nA page no nav entry lists.\n")
    broken["orphan.md"] = "are not included in the \"nav\" configuration:\n  - orphan.md"
    run = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert run.returncode != 0, run.stderr
    for link, message in broken.items():
        assert message in run.stderr, (link, run.stderr)


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs) -> None:
        self.ids.update(value for name, value in attrs if name == "id" and value)


def test_readme_and_contributing_links_into_docs_resolve(site):
    """Relative links that work on GitHub (docs/page.md#anchor): the page exists and has the anchor."""
    links = 0
    for doc in (ROOT / "README.md", ROOT / "CONTRIBUTING.md"):
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            assert (ROOT / path).exists(), f"{doc.name}: link to {target}: no such file"
            if path.startswith("docs/") and anchor:
                parser = _Ids()
                parser.feed((site / Path(path).relative_to("docs").with_suffix("") / "index.html").read_text())
                assert anchor in parser.ids, f"{doc.name}: link to {target}: no such anchor on that page"
            links += 1
    assert links >= 20


def test_every_page_says_what_it_covers():
    """Each page: a title, then one paragraph saying what it covers, before anything else."""
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text().splitlines()
        assert lines[0].startswith("# ") and not lines[1].strip() and lines[2].strip() \
            and not lines[2].startswith(("#", "```", "|", "-", ">")), \
            f"{page.name}: starts with '# <title>', a blank line, then a paragraph saying what the page covers"


# Section numbers of documents the repository does not hold (a spec's or a design's "section 1", "rule 5": the shapes
# are in test_the_citation_finder_finds_each_shape): a comment or page cites docs/<page>.md or says the fact instead.
FOREIGN_CITATION = re.compile(r"\b(?:SPEC|DESIGN)(?:\.md\b|(?: section| rule)? ?\d+)")
DOC_CITATION = re.compile(r"\bdocs/([\w-]+\.md)\b")
CITING_FILES = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".cfg", ".txt")


def _cited_in() -> list[Path]:
    """The repository's own text: package, tests, docs, benchmarks, scripts, the example project."""
    found = [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "dodo.py", "pyproject.toml", "mkdocs.yml")]
    for top in ("qnn_tasks", "tests", "docs", "benchmarks", "scripts", "models", "socs", "toolchain", "cluster"):
        found += [p for p in sorted((ROOT / top).rglob("*")) if p.suffix in CITING_FILES and p.is_file()]
    return [p for p in found if p.is_file()]


def foreign_citations(text: str) -> list[str]:
    return [m.group(0) for m in FOREIGN_CITATION.finditer(text)]


def test_nothing_cites_sections_of_documents_the_repository_does_not_hold():
    cited = {p.relative_to(ROOT).as_posix(): foreign_citations(p.read_text(errors="replace")) for p in _cited_in()}
    cited = {name: found for name, found in cited.items() if found}
    assert not cited, f"cite docs/<page>.md or say the fact: {cited}"


def test_every_docs_page_a_file_cites_exists():
    """A comment's `docs/<page>.md` is a page (this file's own examples of the shape aside)."""
    missing = {(p.relative_to(ROOT).as_posix(), page) for p in _cited_in() if p != Path(__file__).resolve()
               for page in DOC_CITATION.findall(p.read_text(errors="replace")) if not (DOCS / page).is_file()}
    assert not missing, f"no such page: {sorted(missing)}"


def test_the_citation_finder_finds_each_shape():
    spec, design = "SP" + "EC", "DES" + "IGN"  # spelled apart, so this file does not cite them itself
    text = f"({spec} 4 and 5) ({spec} 2c) ({spec} section 1) ({design} rule 5) ({spec}.md section 14) {spec}.md"
    assert foreign_citations(text) == [f"{spec} 4", f"{spec} 2", f"{spec} section 1", f"{design} rule 5",
                                       f"{spec}.md", f"{spec}.md"]
    assert foreign_citations("EXIT_SPEC, SPEC_CASES, VARIANTS_PER_SPEC = 220, a SPECIAL case, DESIGNS 3") == []


# ------------------------------------------------------------------ every YAML example is a valid spec

@pytest.mark.parametrize("block", yaml_blocks(), ids=lambda b: b.where)
def test_documented_yaml_example_loads(block, tmp_path):
    loaded = check_example(block, tmp_path)
    if loaded is not None and kind_of(block) == "toolchain" and "(packaged" in block.header:
        shown, packaged = loaded.toolchain, load_toolchain(tmp_path / "empty", loaded.toolchain.name)
        fields = ("kind", "options", "settings", "packages", "cache", "upgrade")
        assert [getattr(shown, f) for f in fields] == [getattr(packaged, f) for f in fields], \
            f"{block.where}: says it is the packaged profile, and is not {packaged.file}"
    if loaded is not None and kind_of(block) == "model":
        data = yaml.safe_load(block.text)
        for graph in loaded.graphs():  # media sources are parsed as such (their model-fitting checks ran)
            declared = graph.size.graph if graph.size else graph.name  # a size of a graph with dims: its YAML key
            if set((data["graphs"][declared] or {}).get("samples") or {}) & {"image", "audio", "raw"}:
                assert graph.samples and "files" not in graph.samples, (block.where, graph.samples)


def test_examples_say_what_they_are_and_skips_are_few():
    blocks = yaml_blocks()
    kinds = [kind_of(b) for b in blocks]
    assert kinds.count("skip") <= MAX_SKIPS, [b.where for b, k in zip(blocks, kinds) if k == "skip"]
    assert kinds.count("model") >= 5 and kinds.count("excerpt") >= 3, kinds
    assert kinds.count("socs") >= 1 and kinds.count("toolchain") >= 2, kinds
    media = [b for b, k in zip(blocks, kinds) if k == "model" and any(
        set((g or {}).get("samples") or {}) & {"image", "audio", "raw"}
        for g in yaml.safe_load(b.text)["graphs"].values())]
    assert len(media) >= 3, [b.where for b in media]
    # a spec shown in a block without the yaml tag would escape these checks
    for doc in DOC_FILES:
        for block in code_blocks(doc):
            if block.lang != "yaml":
                assert not any(p.match(block.header) for p in (MODEL, EXCERPT, SOCS, TOOLCHAIN)), \
                    f"{block.where}: a spec example must be a ```yaml block"


def documented(pattern: str) -> Block:
    found = [b for b in yaml_blocks() if re.match(pattern, b.header)]
    assert len(found) == 1, (pattern, [b.where for b in found])
    return found[0]


@pytest.mark.parametrize("header, old, new, error", [
    (r"# models/my-classifier/", "centred-variance", "centred-varience",
     r"models/my-classifier/model.yaml: graphs.classifier.rewrites: unknown rewrite 'centred-varience'"),
    (r"# models/detector/", "resize: letterbox", "resize: letterbx", r"graphs.detector.samples.image.resize"),
    (r"# socs/socs.yaml", "vtcm_mb: 8, runs: [w8a16]", "vtcm_mb: 99, runs: [w8a16]",
     r"socs/socs.yaml: socs.SM7550.vtcm_mb"),
    (r"# toolchain/ort-qnn.yaml", "options:", "optoins:", r"toolchain/ort-qnn.yaml: optoins"),
    (r"# excerpt of models/silero-vad/model.yaml$", "{state: stateN}", "{state: stateM}", r"loop.feed.state"),
    (r"# excerpt of .*ship: section", "delivery: on-demand", "delivery: on-demnd", r"model.yaml: ship.delivery: 'on-demnd'"),
    (r"# socs/socs.yaml", "platform: automotive", "platform: car", r"socs.SA8255.platform: 'car' is not a platform"),
])
def test_a_broken_example_fails_with_the_loaders_line(tmp_path, header, old, new, error):
    """The same helper on a deliberately broken copy of a documented example: it fails with the loader's line."""
    good = documented(header)
    assert old in good.text
    broken = Block(good.file, good.line, good.lang, good.text.replace(old, new, 1))
    with pytest.raises(ExampleError, match=error) as err:
        check_example(broken, tmp_path)
    message = str(err.value)
    assert message.startswith(good.where + ": ") and "\n" not in message and "(fix: " in message, message


def test_the_soc_table_page_shows_the_packaged_table():
    """docs/socs.md's table of packaged rows and its list of default chips are the packaged socs.yaml's."""
    from qnn_tasks.modelspec.load import load_soc_file, packaged_socs_file

    socs, default, _ = load_soc_file(packaged_socs_file())
    text = (DOCS / "socs.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if re.match(r"\| [A-Z]{2,3}\d{3,4}[A-Z]* \|", line)]
    assert [(n, int(i), a, r, platform, note) for n, i, a, r, platform, note in rows] == \
        [(s.name, s.soc_id, s.dsp_arch, ", ".join(s.runs), s.platform, s.note) for s in socs.values()]
    listed = re.search(r"the packaged default, the (\d+) chips the demo builds \(([^)]+)\)", " ".join(text.split()))
    assert listed and int(listed.group(1)) == len(default) and listed.group(2).split(", ") == default


def test_an_unlabelled_block_fails_and_a_declared_non_spec_is_skipped(tmp_path):
    unlabelled = Block(DOCS / "index.md", 1, "yaml", "graphs: {}\n")
    with pytest.raises(ExampleError, match=r"docs/index.md:1: a yaml block must say what it is"):
        check_example(unlabelled, tmp_path)
    assert check_example(Block(DOCS / "index.md", 1, "yaml", "# not a spec: a CI workflow\non: push\n"), tmp_path) is None
