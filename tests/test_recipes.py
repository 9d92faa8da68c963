"""CONTRIBUTING.md's recipes held to what adding a stage, a rewrite, a check and a chip actually touches: each test
adds one to a copy of the package (a chip: to a project), counts the files it edited, checks that they are the
files the recipe names, and then shows the addition working through the real loader, planner and doit (the copy is
imported through PYTHONPATH, by doit and by every executor it starts)."""
from __future__ import annotations

import filecmp
import re
import shutil
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_project import tiny_project

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "qnn_tasks"
CONTRIBUTING = (ROOT / "CONTRIBUTING.md").read_text()


class PackageCopy:
    """A copy of qnn_tasks/ under `root`, edited the way a contributor would edit the package (paths inside it)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        shutil.copytree(PACKAGE, root / "qnn_tasks", ignore=shutil.ignore_patterns("__pycache__"))

    def replace(self, rel: str, old: str, new: str) -> None:
        path = self.root / "qnn_tasks" / rel
        text = path.read_text()
        assert text.count(old) == 1, f"{old!r} is not once in {rel}: the recipe test's anchor moved"
        path.write_text(text.replace(old, new))

    def add(self, rel: str, text: str) -> None:
        path = self.root / "qnn_tasks" / rel
        assert not path.exists(), rel
        path.write_text(textwrap.dedent(text).lstrip())

    def touched(self) -> set[str]:
        """The package files that differ from the package's own (new ones included)."""
        changed = set()
        for path in (self.root / "qnn_tasks").rglob("*"):
            if path.is_file():
                rel = path.relative_to(self.root).as_posix()
                original = ROOT / rel
                if not original.is_file() or not filecmp.cmp(path, original, shallow=False):
                    changed.add(rel)
        return changed

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.root)}


def recipe(label: str) -> list[str]:
    """The files CONTRIBUTING.md's recipe names: the `- <label>:` bullet of "Add a rewrite, a check, a chip", or the
    opening sentence of "Add a stage" (the paths in backticks; `<name>` stands for the file the addition makes)."""
    if label == "Stage":
        text = CONTRIBUTING.split("## Add a stage\n", 1)[1].split("\n1. ", 1)[0]
    else:
        bullets = CONTRIBUTING.split("## Add a rewrite, a check, a chip\n", 1)[1].split("\n## ", 1)[0]
        text = re.search(rf"^- {label}: (.*?)(?=^- |\Z)", bullets, re.S | re.M).group(1)
    return re.findall(r"`((?:qnn_tasks|socs)/[\w/<>.]+\.(?:py|yaml))`", text)


def assert_recipe_holds(label: str, touched: set[str]) -> None:
    """Every file the recipe names was touched, and nothing else was (`<name>`: one file the addition made)."""
    named = recipe(label)
    assert named, f"CONTRIBUTING.md names no file for: {label}"
    exact = {path for path in named if "<" not in path}
    assert exact <= touched, f"the {label} recipe names {sorted(exact - touched)}, which adding one did not touch"
    rest = touched - exact
    for path in named:
        if "<" in path:
            pattern = re.escape(path).replace(re.escape("<name>"), r"\w+")
            made = [t for t in rest if re.fullmatch(pattern, t)]
            assert len(made) == 1, f"the {label} recipe's {path}: touched {made}"
            rest -= set(made)
    assert not rest, f"touched beyond the {label} recipe: {sorted(rest)}"


def test_recipe_reader_reads_each_recipe() -> None:
    assert recipe("Stage") == ["qnn_tasks/plan/rows.py", "qnn_tasks/plan/stageplans.py",
                               "qnn_tasks/stages/<name>.py", "qnn_tasks/modelspec/stagesettings.py"]
    assert recipe("Rewrite") == ["qnn_tasks/rewrites/<name>.py", "qnn_tasks/rewrites/__init__.py"]
    assert recipe("Task check") == ["qnn_tasks/judge/verification.py", "qnn_tasks/modelspec/checks.py"]
    assert recipe("Chip") == ["socs/socs.yaml"]
    with pytest.raises(AssertionError, match="touched beyond the Rewrite recipe"):
        assert_recipe_holds("Rewrite", {"qnn_tasks/rewrites/elementwise.py", "qnn_tasks/rewrites/__init__.py",
                                        "qnn_tasks/graphs/lintrules.py"})
    with pytest.raises(AssertionError, match="which adding one did not touch"):
        assert_recipe_holds("Rewrite", {"qnn_tasks/rewrites/elementwise.py"})
    assert_recipe_holds("Rewrite", {"qnn_tasks/rewrites/elementwise.py", "qnn_tasks/rewrites/__init__.py"})


OPCOUNT = '''
"""opcount: the simplified graph's ops by type, those of `opcount: {ops: [...]}` only where the graph names some (a
stage added by tests/test_recipes.py)."""
from __future__ import annotations

from collections import Counter

from qnn_tasks.run.calls import StageCall


def run_call(call: StageCall) -> dict:
    import onnx

    ops, only = Counter(n.op_type for n in onnx.load(call.args["simplified"]).graph.node), call.args["ops"]
    return {"ops": {op: count for op, count in ops.items() if not only or op in only}}
'''

OPCOUNT_PLAN = '''

def plan_opcount(p: Planner, stage: StageDef, gt: GraphTarget) -> Plan:
    ops = gt.graph.section("opcount")["ops"]
    return graph_plan(p, stage, gt, [str(gt.simplified)], [], {},
                      lambda: {"simplified": str(gt.simplified), "ops": ops}, f"count the ops of {gt.simplified}")
'''

OPCOUNT_SETTINGS = '''

def _opcount_fields() -> Type:
    from qnn_tasks.modelspec.schema import Fields, ListOf, Text

    return Fields({"ops": ListOf(Text(max_len=100))})


OPCOUNT = StageSettings("opcount", _opcount_fields, defaults={"ops": []})
BUILT_IN = (SIMPLIFY, CPUCHECK, LINT, CALIBRATION, OPCOUNT)'''


@pytest.mark.slow
def test_a_stage_in_the_package_is_a_row_a_plan_function_a_module_and_its_settings(tmp_path: Path) -> None:
    """The stage recipe's four files, for a stage with a model.yaml section of its own: a doit task with its doc, a
    record, its section checked by the loader, and an edit of the section reruns that stage alone."""
    package = PackageCopy(tmp_path / "pkg")
    package.add("stages/opcount.py", OPCOUNT)
    package.replace("plan/stageplans.py", "\n\ndef plan_simplify(", OPCOUNT_PLAN + "\n\ndef plan_simplify(")
    package.replace("modelspec/stagesettings.py", "\nBUILT_IN = (SIMPLIFY, CPUCHECK, LINT, CALIBRATION)",
                    OPCOUNT_SETTINGS)
    package.replace("plan/rows.py", "    plan_loop,\n", "    plan_loop,\n    plan_opcount,\n")
    package.replace("plan/rows.py", "import CALIBRATION, CPUCHECK, LINT, SIMPLIFY",
                    "import CALIBRATION, CPUCHECK, LINT, OPCOUNT, SIMPLIFY")
    package.replace("plan/rows.py", "             plan_split, column=False),\n)",
                    "             plan_split, column=False),\n"
                    '    StageDef("opcount", "graph", "Count each simplified graph\'s ops by type.",\n'
                    '             "qnn_tasks.stages.opcount:run_call", plan_opcount, heavy=False, settings=OPCOUNT),\n)')
    assert_recipe_holds("Stage", package.touched())

    project = tiny_project(tmp_path / "p", samples=2)
    yaml = project.path("models/tiny/model.yaml")
    written = yaml.read_text()
    listed = project.doit("list", env=package.env)
    assert "Count each simplified graph's ops by type." in listed.stdout, listed.stdout + listed.stderr
    result = project.doit("opcount", env=package.env, check=True)
    assert "opcount:tiny" in result.executed
    record = project.one_json("build/tiny/tiny/opcount/opcount.json")
    assert record["status"] == "passed" and record["ops"] == {"MatMul": 2, "Relu": 1}
    assert "opcount:tiny" in project.doit("opcount", env=package.env, check=True).uptodate

    yaml.write_text(written + "    opcount: {opps: [Relu]}\n")
    refused = project.doit("list", env=package.env)
    assert refused.stderr.strip() == f"error: {yaml}: graphs.tiny.opcount.opps: unknown key (fix: remove it or use " \
                                     "one of: ops)", refused.stderr
    yaml.write_text(written + "    opcount: {ops: [Relu]}\n")
    again = project.doit("opcount", env=package.env, check=True)
    assert again.executed == {"opcount:tiny"}, again.stdout
    assert project.one_json("build/tiny/tiny/opcount/opcount.json")["ops"] == {"Relu": 1}


HALVE = '''
"""div-pow2: Div(x, c) by a constant power of two is Mul(x, 1/c), exactly (a rewrite added by tests/test_recipes.py)."""
from __future__ import annotations


def div_pow2(model, dry_run: bool = False) -> list[str]:
    import numpy as np
    from onnx import numpy_helper

    constants = {t.name: t for t in model.graph.initializer}
    sites = []
    for node in model.graph.node:
        divisor = constants.get(node.input[1]) if node.op_type == "Div" else None
        if divisor is None:
            continue
        values = numpy_helper.to_array(divisor)
        mantissa, _ = np.frexp(values)
        if values.dtype != np.float32 or not np.all(np.abs(mantissa) == 0.5):  # not every value a power of two
            continue
        sites.append(node.name)
        if not dry_run:
            reciprocal = numpy_helper.from_array((1 / values).astype(np.float32), f"{node.name}.reciprocal")
            model.graph.initializer.append(reciprocal)
            node.op_type, node.input[1] = "Mul", reciprocal.name
    return sites
'''

HALVE_ROW = '''
    Rewrite("div-pow2", "divpow2", "div_pow2", "Div by a constant power of two becomes Mul by its reciprocal",
            "speed: a multiply is cheaper than a divide",
            lint=LintAdvice("div-pow2", "Div", "a Div by a constant power of two is a Mul, exactly")),
)}
NAMES = tuple(CATALOGUE)'''


def halving_model(folder: Path, rows: int = 8, dim: int = 16) -> None:
    """(x @ w1) / 4 -> Relu -> @ w2, with its samples."""
    rng = np.random.default_rng(3)
    w1, w2 = (rng.standard_normal((dim, dim)).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Div", ["h", "four"], ["q"], name="quarter"),
             helper.make_node("Relu", ["q"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, dim])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                               numpy_helper.from_array(np.array(4.0, np.float32), "four")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(folder / "tiny.onnx"))
    np.savez(folder / "samples/x.npz", x=rng.standard_normal((2, 1, rows, dim)).astype(np.float32))
    text = (folder / "model.yaml").read_text()
    (folder / "model.yaml").write_text(re.sub(r"\[1, \d+, \d+\]", f"[1, {rows}, {dim}]", text))


@pytest.mark.slow
def test_a_rewrite_is_a_function_and_a_catalogue_row(tmp_path: Path) -> None:
    """Lint finds the new rewrite's sites by its own matcher and names the model.yaml line that enables it; a graph
    may acknowledge its rule; declared, it changes the exported graph, and the CPU check finds it exact."""
    package = PackageCopy(tmp_path / "pkg")
    package.add("rewrites/divpow2.py", HALVE)
    package.replace("rewrites/__init__.py", "\n)}\nNAMES = tuple(CATALOGUE)", HALVE_ROW)
    assert_recipe_holds("Rewrite", package.touched())

    project = tiny_project(tmp_path / "p", samples=2)
    halving_model(project.path("models/tiny"))
    yaml = "models/tiny/model.yaml"
    project.doit("lint", env=package.env, check=True)
    [finding] = [f for f in project.one_json("build/tiny/tiny/lint/lint.json")["findings"] if f["rule"] == "div-pow2"]
    assert finding["where"] == "Div node 'quarter'" and finding["severity"] == "warning", finding
    assert finding["fix"].startswith('add "rewrites: [div-pow2]" to graphs.tiny') and "becomes Mul by its reciprocal" in finding["fix"]

    project.edit(yaml, "    socs:", "    lint: {allow: [div-pow2]}\n    socs:")
    project.doit("lint", env=package.env, check=True)
    [allowed] = [f for f in project.one_json("build/tiny/tiny/lint/lint.json")["findings"] if f["rule"] == "div-pow2"]
    assert allowed["severity"] == "allowed"

    project.edit(yaml, "    lint: {allow: [div-pow2]}\n", "    rewrites: [div-pow2]\n")
    project.doit("cpucheck", "lint", env=package.env, check=True)
    exported = onnx.load(str(project.path("build/tiny/tiny/export/tiny.onnx")))
    assert [n.op_type for n in exported.graph.node] == ["MatMul", "Mul", "Relu", "MatMul"]
    assert project.one_json("build/tiny/tiny/export/export.json")["rewrites"] == [
        {"name": "div-pow2", "count": 1, "sites": ["quarter"]}]
    assert project.one_json("build/tiny/tiny/cpucheck/cpucheck.json")["status"] == "passed"
    assert not [f for f in project.one_json("build/tiny/tiny/lint/lint.json")["findings"] if f["rule"] == "div-pow2"]


PEAK = '''

def peak(ref: np.ndarray, got: np.ndarray, check: dict[str, Any]) -> dict[str, Any]:
    """The share of samples whose largest output the NPU keeps within `tol` of the CPU's (a check added by
    tests/test_recipes.py)."""
    axes = tuple(range(1, ref.ndim))
    kept = np.abs(got.max(axis=axes) - ref.max(axis=axes)) <= check["tol"]
    value = float(kept.mean())
    return {"kind": "peak", "output": check["output"], "value": value, "min": check["min"],
            "passed": value >= check["min"], "meaning": f"share of samples whose peak moves at most {check['tol']}"}


# (ref, got, check) -> result'''


@pytest.mark.slow
def test_a_task_check_is_its_arithmetic_and_its_keys(tmp_path: Path) -> None:
    """The loader takes the new check's keys, refuses a value out of its range in one line, fills its default, and
    simverify judges the simulator's outputs with it (a failing one fails the target)."""
    package = PackageCopy(tmp_path / "pkg")
    package.replace("judge/verification.py", "\n\n# (ref, got, check) -> result", PEAK)
    package.replace("judge/verification.py", '"detection": taskchecks.detection}',
                    '"detection": taskchecks.detection, "peak": peak}')
    package.replace("modelspec/checks.py", "CHECK_KINDS = {",
                    'CHECK_KINDS = {"peak": {"output", "tol", "min"}, ')
    package.replace("modelspec/checks.py", "CHECK_RANGES = {",
                    'CHECK_RANGES = {"peak": {"tol": (float, 0.0, None), "min": (float, 0.0, 1.0)}, ')
    package.replace("modelspec/checks.py", "SHARED_DEFAULTS = {", 'SHARED_DEFAULTS = {"peak": {"min": 1.0}, ')
    assert_recipe_holds("Task check", package.touched())

    project = tiny_project(tmp_path / "p", samples=2)
    yaml = project.path("models/tiny/model.yaml")
    written = yaml.read_text()
    yaml.write_text(written + "    verify: {checks: [{peak: {output: y, tol: -1}}]}\n")
    refused = project.doit("list", env=package.env)
    assert refused.stderr.strip() == (f"error: {yaml}: graphs.tiny.verify.checks[0].peak.tol: -1 is out of range "
                                      "(fix: use a value of at least 0)"), refused.stderr
    yaml.write_text(written + "    verify: {checks: [{peak: {output: y, tol: 0.5}}]}\n")
    project.doit("simverify", env=package.env, check=True)
    [check] = project.one_json("build/tiny/tiny/*/fp16/SM8650/simverify/simverify.json")["checks"]
    assert check == {"kind": "peak", "output": "y", "value": 1.0, "min": 1.0, "passed": True,
                     "meaning": "share of samples whose peak moves at most 0.5"}, check
    yaml.write_text(written + "    verify: {checks: [{peak: {output: y, tol: 0.0}}]}\n")  # no fp16 keeps it exactly
    failed = project.doit("simverify", env=package.env)
    assert failed.returncode == 1 and "check peak on 'y'" in failed.stdout + failed.stderr, failed.stdout


@pytest.mark.slow
def test_a_chip_is_one_row(tmp_path: Path) -> None:
    """A chip the package does not know, added as one row of the project's socs/socs.yaml: built, verified on the
    simulator and shipped for it, and chosen by the package's selector on a device of that chip only."""
    from qnn_tasks.qnn import select

    project = tiny_project(tmp_path / "p", socs=("SXR2230P",), samples=2)
    before = {p.relative_to(project.root).as_posix(): p.read_bytes() for p in project.root.rglob("*") if p.is_file()}
    project.path("socs/socs.yaml").write_text(
        "socs:\n  SXR2230P: {soc_id: 53, dsp_arch: v69, vtcm_mb: 8, runs: [fp16], note: added by a test}\n")
    touched = {rel for rel, data in before.items() if project.path(rel).read_bytes() != data}
    assert_recipe_holds("Chip", touched)

    result = project.doit()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "simverify:tiny-SXR2230P" in result.executed
    assert project.doit("dist").returncode == 0
    manifest = project.one_json("dist/tiny/manifest.json")
    [binary] = manifest["graphs"]["tiny"]["binaries"]
    assert binary["socs"] == ["SXR2230P"] and project.path(f"dist/tiny/{binary['path']}").is_file()
    chosen = select.choose(manifest, "tiny", "SXR2230P", binary["min_runtime_qnn"], lambda path: None)
    assert (chosen.target, chosen.path) == ("npu", binary["path"]), chosen
    other = select.choose(manifest, "tiny", "SM8650", binary["min_runtime_qnn"], lambda path: None)
    assert (other.target, other.rule) == ("cpu", select.NO_BUILD), other

