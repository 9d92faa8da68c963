"""The stage table: one row (StageDef) per stage, that the task layer, the executors, the report and the code keys
all read; and the rows a project adds (`register`). Each row names its plan function (plan/stageplans.py) and its
runner. Which rows a run has, and their targets and plans: plan/matrix.py.
"""
from __future__ import annotations

from qnn_tasks.modelspec import stagesettings
from qnn_tasks.modelspec.stagesettings import CALIBRATION, CPUCHECK, LINT, SIMPLIFY
from qnn_tasks.plan.ondemandplans import plan_compat, plan_device, plan_dist, plan_socscheck, plan_toolcheck
from qnn_tasks.plan.stagedef import StageDef
from qnn_tasks.plan.stageplans import (
    plan_calibrate,
    plan_choose,
    plan_config,
    plan_context,
    plan_cpucheck,
    plan_crosssize,
    plan_diagnose,
    plan_export,
    plan_lint,
    plan_loop,
    plan_pipeline,
    plan_repair,
    plan_simplify,
    plan_simulate,
    plan_simverify,
    plan_split,
)

GRAPH_STAGES = (
    StageDef("export", "graph", "Export each graph's NPU-ready ONNX (static shapes, int32 I/O, no If/int8): the "
             "model's export.py, or the built-in packaged-ONNX export, plus declared rewrites.",
             "qnn_tasks.stages.export:run_call", plan_export),
    StageDef("simplify", "graph", "Simplify each graph with onnxsim and confirm its I/O shapes are fixed.",
             "qnn_tasks.stages.simplify:run_call", plan_simplify, settings=SIMPLIFY),
    StageDef("lint", "graph", "Lint each graph for what troubles the NPU (dynamic dims, int64, control flow, fp16 "
             "hazards, size).", "qnn_tasks.stages.lint:run_call", plan_lint, heavy=False, settings=LINT),
    StageDef("cpucheck", "graph", "Run each simplified graph on CPU against the original model on real inputs; keep "
             "the reference.", "qnn_tasks.stages.cpucheck:run_call", plan_cpucheck, settings=CPUCHECK),
    StageDef("calibrate", "graph", "Make each quantized graph's calibration set from real inputs (once per graph).",
             "qnn_tasks.stages.calibrate:run_call", plan_calibrate, column=False, settings=CALIBRATION),
    StageDef("split", "graph", "Cut each graph declared with split: into parts (graphs <graph>.part<N> of their own) "
             "and check the parts chained on CPU against the whole graph.", "qnn_tasks.stages.split:run_call",
             plan_split, column=False),
)
CHIP_STAGES = (
    StageDef("config", "chip", "Write each chip's HTP settings for each graph (toolchain options + SoC row).",
             "qnn_tasks.stages.toolchain:config", plan_config, heavy=False, toolchain=True),
    StageDef("context", "chip", "Compile each graph to a QNN context binary per chip; check CPU fallback and the chip "
             "it was built for.", "qnn_tasks.stages.toolchain:context", plan_context, remote=True, toolchain=True),
    StageDef("simulate", "chip", "Run each binary on the host HTP simulator and keep its outputs (judged by "
             "simverify).", "qnn_tasks.stages.simulate:run_call", plan_simulate, remote=True, toolchain=True),
    StageDef("simverify", "chip", "Judge each binary's simulator outputs against the CPU reference (metrics, "
             "thresholds, checks).", "qnn_tasks.stages.simverify:run_call", plan_simverify, heavy=False),
)
PIPELINE = StageDef("pipeline", "pipeline", "Chain each model's pipeline graphs on the host simulator (each fed the "
                    "previous one's NPU outputs) and judge the end against the same chain on CPU.",
                    "qnn_tasks.stages.pipeline:run_call", plan_pipeline, remote=True, toolchain=True, column=False)
CROSSSIZE = StageDef("crosssize", "chip", "Check each graph with sizes (dims:) on each chip's simulator: a sample that "
                     "fits a smaller size gives the same result padded into every larger one.",
                     "qnn_tasks.stages.crosssize:run_call", plan_crosssize, heavy=False, column=False)
VARIANT_RUNNER = "qnn_tasks.stages.toolchain:graph_stage"  # quantize; convert, modellib: rows from the toolchain
REPAIR = StageDef("repair", "variant", "Find the fewest weights of each w8a16-mixed/w4a16-mixed graph to keep at 16 "
                  "bits so that it passes its checks, measured on the first chip's host simulator.",
                  "qnn_tasks.stages.repair:run_call", plan_repair, remote=True, toolchain=True, column=False)
CHOOSE = StageDef("choose", "chip", "precision auto: per chip, ship the smallest candidate binary that passed its "
                  "checks (every candidate built and verified; one that missed its checks is `rejected`).",
                  "qnn_tasks.stages.choose:run_call", plan_choose, heavy=False, column=False)
LOOP = StageDef("loop", "chip", "Run each model's loop: graph step after step on the host simulator (its outputs fed "
                "back, the NPU carrying its own state) and on CPU; error per step, the whole run judged.",
                "qnn_tasks.stages.loop:run_call", plan_loop, toolchain=True, column=False)
# On demand: created only when asked for (`doit diagnose`), never in the default run; tasks made from the row like any
# stage's. What sets one apart is on its row (cached, always, marks_report, devices, own_record), never in its name.
DIAGNOSE = StageDef("diagnose", "chip", "Find the first node where the NPU diverges from the CPU, and why (on demand, "
                    "not in the default run).", "qnn_tasks.stages.diagnose:run_call", plan_diagnose, remote=True,
                    toolchain=True, column=False)
# Measures the toolchain against the SoC table (keyed by both), not the build: no shared cache, the report untouched.
SOCSCHECK = StageDef("socscheck", "toolchain", "Compile a tiny model for every SoC row and confirm the binary's "
                     "socModel/arch (on demand).", "qnn_tasks.stages.socscheck:run_call", plan_socscheck,
                     toolchain=True, column=False, cached=False, marks_report=False)
TOOLCHECK = StageDef("toolcheck", "toolchain", "Run each toolchain's dependency checks and say clearly what is missing "
                     "(on demand).", "qnn_tasks.stages.toolcheck:run_call", plan_toolcheck, heavy=False,
                     toolchain=True, column=False, cached=False, always=True, marks_report=False)
# Runs in this process, each binary x runtime in that runtime's own interpreter (stages/compat.py).
COMPAT = StageDef("compat", "project", "Load every built binary on every configured runtime's simulator: which QNN "
                  "runtimes load it, and do outputs still match (on demand).", "qnn_tasks.stages.compat:run_call",
                  plan_compat, heavy=False, column=False, cached=False, always=True, marks_report=False)
# Phones: the record is rewritten after every step, so a phone unplugged mid-run leaves what was measured and the
# other phones still run; a target without a phone is skipped with its earlier record kept. The funnel's one record
# per run, removed first and written last, cannot say either.
DEVICE_RECORDS = "rewritten after every step on each phone, and kept when no phone of the chip is attached"
VERIFY = StageDef("verify", "chip", "Run each chip's binaries on the attached phones (adb) and compare with the CPU; "
                  "latency, CPU use (on demand).", "qnn_tasks.stages.verify:run_call", plan_device, heavy=False,
                  column=False, cached=False, always=True, marks_report=False, devices=True, own_record=DEVICE_RECORDS)
POWER = StageDef("power", "chip", "Fixed-length run on an attached phone with battery level before/after (on demand, "
                 "opt-in).", "qnn_tasks.stages.verify:power_call", plan_device, heavy=False, column=False, cached=False,
                 always=True, marks_report=False, devices=True, own_record=DEVICE_RECORDS)
# A release act, not a build step: it writes outside build/ (dist/<model>/, what an app ships), so a plain `doit`
# never replaces a package someone may be uploading; asked for by name once the report passes. The package is its
# record (manifest.json), whole or not at all (ship/package.py): no build record for the funnel to write.
DIST = StageDef("dist", "model", "Package what was verified for phones: dist/<model>/ with the binaries per chip, "
                "manifest.json, model card, CPU fallback, runtime libraries (on demand).",
                "qnn_tasks.ship.package:run_call", plan_dist, heavy=False, column=False, cached=False, always=True,
                marks_report=False, own_record="the package's manifest.json, outside build/ (ship/package.py)")
ON_DEMAND = (DIAGNOSE, SOCSCHECK, TOOLCHECK, COMPAT, VERIFY, POWER, DIST)


_REGISTERED: list[StageDef] = []


def register(row: StageDef) -> None:
    """Add a stage of the project's own (a row whose runner and plan live in its module), run after the built-in
    stages of its scope; with `settings`, its own section under graphs.<graph> in model.yaml. Called from dodo.py
    before `project_tasks` (which loads the model.yaml files)."""
    if row.scope not in ("graph", "chip"):
        raise ValueError(f"stage '{row.name}': scope '{row.scope}' cannot be registered (use 'graph' or 'chip')")
    if any(r.name == row.name for r in GRAPH_STAGES + CHIP_STAGES + ON_DEMAND + tuple(_REGISTERED)):
        raise ValueError(f"stage '{row.name}' exists already")
    if row.settings is not None:
        from qnn_tasks.modelspec.keys import GRAPH  # the schema, imported only by a project that brings a section

        taken = set(GRAPH.fields) | {s.section for s in stagesettings.registered()}
        if row.settings.section in taken:
            raise ValueError(f"stage '{row.name}': graphs.<graph>.{row.settings.section} is a model.yaml key already "
                             f"(fix: name its section after the stage, e.g. StageSettings({row.name!r}, ...))")
        stagesettings.declare(row.settings)
    _REGISTERED.append(row)


def registered(scope: str) -> list[StageDef]:
    return [r for r in _REGISTERED if r.scope == scope]


def report_columns(scope: str) -> tuple[str, ...]:
    """The stages the report shows a column for, per target kind ("graph" or "chip"): the built-in rows', then those
    a project registered (asked at report and dist time, after dodo.py's `register` calls)."""
    built_in = GRAPH_STAGES if scope == "graph" else CHIP_STAGES
    return tuple(row.name for row in built_in + tuple(registered(scope)) if row.column)
