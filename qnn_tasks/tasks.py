"""The only module that knows doit: build targets + stage functions -> doit task dicts.

Each task has one `config_changed` key built from exactly what its stage depends on (DESIGN
rule 3): stage options, plus the toolchain fingerprint for toolchain stages, plus the SoC row
for chip stages. Files it reads are `file_dep`s; files it writes are `targets`.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from doit.exceptions import TaskFailed
from doit.loader import create_after
from doit.tools import config_changed

from . import toolchains
from .errors import QnnTasksError
from .fileio import write_json
from .matrix import ChipTarget, VariantTarget, chip_targets, graph_targets, variant_targets
from .toolchains.base import StageInput
from .spec import GraphSpec, Project, load_project

TOOLCHAIN_ENV = "QNN_TOOLCHAIN"
DEFAULT_TOOLCHAIN = "ort-qnn"
REPORT_DIR = Path("build") / "report"
DEVICES_RECORD = Path("build") / "verify" / "devices.json"


def doit_config() -> dict[str, Any]:
    # sqlite3: a second doit process (or the report) can read the state while one runs; dbm can't.
    # default_tasks is filled in by TaskFactory.namespace(): every build stage in order, `report`
    # last, so that with `continue` doit runs it after every other task, failed or not.
    return {"default_tasks": [], "continue": True, "backend": "sqlite3", "dep_file": ".doit.db"}


def project_tasks(root: Path) -> dict[str, Any]:
    """Everything dodo.py exposes to doit. A spec error prints one line and exits 2."""
    try:
        project = load_project(root, os.environ.get(TOOLCHAIN_ENV, DEFAULT_TOOLCHAIN))
        toolchain = toolchains.from_profile(project.toolchain)
    except QnnTasksError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    return TaskFactory(project, toolchain).namespace()


# ------------------------------------------------------------------ stage runner

def stage_action(stage: str, target: str, record_path: Path | str, run: Callable[[], dict[str, Any]],
                 base: dict[str, Any] | Callable[[], dict[str, Any]]) -> Callable[[], TaskFailed | None]:
    """Wrap a stage function: time it, write its record (also on failure), turn errors into one line."""
    def action() -> TaskFailed | None:
        start = time.perf_counter()
        record_file = Path(record_path)
        record = {"stage": stage, "target": target, **(base() if callable(base) else base)}
        try:
            result = run()
        except QnnTasksError as err:
            record.update(getattr(err, "record", {}) or {})
            record.update(status="failed", error=str(err), seconds=round(time.perf_counter() - start, 3))
            write_json(record_file, record)
            return TaskFailed(f"{stage}:{target}: {err}")
        except Exception as err:  # a bug or a tool crash: keep the traceback, show one line
            log = record_file.with_name(f"{stage}-error.log")
            log.write_text(traceback.format_exc())
            record.update(status="failed", error=f"{type(err).__name__}: {err}", error_log=str(log),
                          seconds=round(time.perf_counter() - start, 3))
            write_json(record_file, record)
            return TaskFailed(f"{stage}:{target}: unexpected {type(err).__name__}: {err} (traceback: {log})")
        record.update(result)
        record.update(status="warning" if record.get("warnings") else "passed",
                      seconds=round(time.perf_counter() - start, 3))
        write_json(record_file, record)
        print(f"{stage}:{target}: {record['status']} in {record['seconds']} s")
        return None
    return action


def skip_action(stage: str, target: ChipTarget, record_path: Path | str) -> Callable[[], None]:
    def action() -> None:
        write_json(record_path, {"stage": stage, "target": target.name, "graph": target.graph.name,
                                 "soc": target.soc.row(), "status": "skipped", "reason": target.skip_reason,
                                 "seconds": 0.0})
        print(f"{stage}:{target.name}: skipped: {target.skip_reason}")
    return action


def _signature(paths: list[str]) -> str:
    """Cheap change detector for many small files: (path, mtime, size) of those that exist."""
    parts = []
    for path in paths:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        parts.append(f"{path}:{st.st_mtime_ns}:{st.st_size}")
    return hashlib.md5("\n".join(parts).encode()).hexdigest()


def _task_function(name: str, doc: str, make: Callable[[], Any]) -> Callable[[], Any]:
    """A `task_<name>` function for doit: its docstring is the group's doc in `doit list`."""
    def task() -> Any:
        return make()
    task.__name__ = f"task_{name}"
    task.__doc__ = doc
    return task


def _failed(record: Path) -> bool | None:
    """A stage record's verdict: True if it failed, False if it passed, None if there is none."""
    try:
        return json.loads(record.read_text()).get("status") == "failed"
    except (FileNotFoundError, ValueError):
        return None


def _stage(name: str):
    """Stage modules import numpy/onnx: load them when a task runs, not when tasks are listed."""
    return importlib.import_module(f"{__package__}.stages.{name}")


def _device_action(stage: str, name: str, run: Callable[[], Any]) -> Callable[[], TaskFailed | None]:
    """Device stages write their own records (partial ones too); here errors become one-line task failures."""
    def action() -> TaskFailed | None:
        try:
            run()
        except QnnTasksError as err:
            return TaskFailed(f"{stage}:{name}: {err}")
        return None
    return action


def _asked_by_name(stage: str, name: str) -> bool:
    """`doit verify:<name>` (or a pattern matching it) on the command line, not just the `verify` group."""
    import fnmatch

    return any(arg.startswith(f"{stage}:") and fnmatch.fnmatchcase(f"{stage}:{name}", arg) for arg in sys.argv[1:])


def _key(data: dict[str, Any]) -> str:
    """One short string per task for config_changed (cheaper for doit than hashing a dict per task)."""
    return hashlib.md5(json.dumps(data, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------ tasks

class TaskFactory:
    def __init__(self, project: Project, toolchain: toolchains.Toolchain) -> None:
        self.project = project
        self.toolchain = toolchain
        self.graphs = graph_targets(project)
        self.variants = variant_targets(project, toolchain.id())
        self.chips = chip_targets(project, toolchain.id())
        self.fingerprint = toolchain.fingerprint()
        self._fingerprint_json = json.dumps(self.fingerprint, sort_keys=True)  # serialised once for all chip keys
        self._sources: dict[str, Path] = {}
        self._json_cache: dict[tuple, str] = {}

    def namespace(self) -> dict[str, Any]:
        """DOIT_CONFIG and one `task_<stage>` function per stage, in build order."""
        stages: list[tuple[str, str, Callable[[], Any]]] = [
            ("export", "Export each graph's NPU-ready ONNX (static shapes, int32 I/O, no If/int8) with the model's export.py.",
             self.export_tasks),
            ("simplify", "Simplify each graph with onnxsim and confirm its I/O shapes are fixed.", self.simplify_tasks),
            ("lint", "Lint each graph for what troubles the NPU (dynamic dims, int64, control flow, fp16 hazards, size).",
             self.lint_tasks),
            ("cpucheck", "Run each simplified graph on CPU against the original model on real inputs; keep the reference.",
             self.cpucheck_tasks),
        ]
        if any("w8a16" in gt.graph.precisions for gt in self.graphs):
            stages.append(("calibrate", "Make each w8a16 graph's calibration set from real inputs (once per graph).",
                           self.calibrate_tasks))
        for stage in self._graph_stages():
            stages.append((stage.name, stage.doc + ".", lambda name=stage.name: self.graph_stage_tasks(name)))
        stages += [
            ("config", "Write each chip's HTP settings for each graph (toolchain options + SoC row).", self.config_tasks),
            ("context", "Compile each graph to a QNN context binary per chip; check CPU fallback and the chip it was built for.",
             self.context_tasks),
            ("simverify", "Run each binary on the host HTP simulator and compare with the CPU reference (metrics, checks).",
             self.simverify_tasks),
            ("report", "Write build/report/index.html, report.json and report.md from the stage records.", self.report_task),
        ]
        on_demand = [
            ("diagnose", "Find the first node where the NPU diverges from the CPU, and why (on demand, not in the default run).",
             self.diagnose_tasks),
            ("socscheck", "Compile a tiny model for every SoC row and confirm the binary's socModel/arch (on demand).",
             self.socscheck_task),
            ("toolcheck", "Run the toolchain's dependency checks and say clearly what is missing (on demand).",
             lambda: {"actions": [stage_action("toolcheck", self.toolchain.id(), Path("build") / "toolcheck.json",
                                               self.toolchain.check, {"toolchain": {"id": self.toolchain.id(),
                                                                                    **self.fingerprint}})],
                      "uptodate": [False], "verbosity": 2,
                      "doc": "Run the toolchain's dependency checks and say clearly what is missing"}),
            ("verify", "Run each chip's binaries on the attached phones (adb) and compare with the CPU; latency, CPU use "
                       "(on demand).", self.verify_tasks),
            ("power", "Fixed-length run on an attached phone with battery level before/after (on demand, opt-in).",
             self.power_tasks),
        ]
        config = doit_config()
        config["default_tasks"] = [name for name, _, _ in stages]
        namespace: dict[str, Any] = {"DOIT_CONFIG": config}
        for name, doc, make in stages:
            namespace[f"task_{name}"] = _task_function(name, doc, make)
        for name, doc, make in on_demand:  # created only when asked for: `doit` and no-op runs skip them
            namespace[f"task_{name}"] = create_after()(_task_function(name, doc, make))
        return namespace

    def _variant_stage_names(self) -> dict[str, tuple[str, ...]]:
        """Variant name -> names of the toolchain's graph stages it goes through."""
        return {vt.name: tuple(stage.name for stage in self.toolchain.graph_stages(vt.precision)) for vt in self.variants}

    def _graph_stages(self) -> list:
        """The toolchain's per-variant stages over every precision in the project, each name once."""
        seen: dict[str, Any] = {}
        for precision in sorted({p for gt in self.graphs for p in gt.graph.precisions}):
            for stage in self.toolchain.graph_stages(precision):
                seen.setdefault(stage.name, stage)
        return list(seen.values())

    # ---------------------------------------------------------- per graph
    def _source(self, graph: GraphSpec) -> Path | None:
        model = next(m for m in self.project.models if m.name == graph.model)
        return (graph.source or model.source).resolve_file(model.dir)  # a graph's `source:` overrides the model's

    def _source_key(self, graph: GraphSpec) -> dict[str, Any]:
        model = next(m for m in self.project.models if m.name == graph.model)
        source = graph.source or model.source
        return {"package": source.package, "version": source.package_version(), "file": source.file}

    def _code_deps(self, graph: GraphSpec) -> list[str]:
        source = self._source(graph)
        # relative to the project root (doit's cwd), so a moved or copied project stays up to date
        code = [os.path.relpath(graph.model_code, self.project.root)] if graph.has_code else []  # export.py is optional
        if source and Path(source).is_relative_to(self.project.root):  # a source file in the model folder
            source = Path(os.path.relpath(source, self.project.root))
        return code + ([str(source)] if source else [])

    def _sample_deps(self, graph: GraphSpec) -> list[str]:
        """The declared sample files (model.yaml `samples:`), read by cpucheck and calibrate."""
        return [os.path.relpath(p, self.project.root) for p in graph.sample_files()]

    def export_tasks(self) -> Iterator[dict]:
        for gt in self.graphs:
            g = gt.graph
            record = gt.stage_dir("export") / "export.json"
            key = {"io": g.io(), "export": g.export, "options": g.options, "source": self._source_key(g),
                   "rewrites": g.rewrites, "constant_inputs": g.constant_inputs}
            yield self._task(gt.name, "export", record, [gt.exported],
                             lambda g=g, gt=gt: _stage("export").run(g, self._source(g), gt.exported),
                             file_dep=self._code_deps(g), key=key, base={"graph": g.name, "model": g.model,
                                                                          "source": self._source_key(g)},
                             doc=f"export {g.model}/{g.name} -> {gt.exported}")

    def simplify_tasks(self) -> Iterator[dict]:
        for gt in self.graphs:
            g = gt.graph
            record = gt.stage_dir("simplify") / "simplify.json"
            yield self._task(gt.name, "simplify", record, [gt.simplified],
                             lambda g=g, gt=gt: _stage("simplify").run(g, gt.exported, gt.simplified),
                             file_dep=[str(gt.exported)], key={"io": g.io(), "simplify": g.simplify},
                             base={"graph": g.name}, doc=f"onnxsim {gt.exported} -> {gt.simplified}")

    def lint_tasks(self) -> Iterator[dict]:
        for gt in self.graphs:
            g = gt.graph
            yield self._task(gt.name, "lint", gt.lint_record, [],
                             lambda g=g, gt=gt: _stage("lint").run(g, gt.simplified),
                             file_dep=[str(gt.simplified)], key={"lint": g.lint, "precision": g.precision},
                             base={"graph": g.name}, doc=f"lint {gt.simplified} -> {gt.lint_record}")

    def cpucheck_tasks(self) -> Iterator[dict]:
        for gt in self.graphs:
            g = gt.graph
            record = gt.stage_dir("cpucheck") / "cpucheck.json"
            key = {"io": g.io(), "options": g.options, "tolerance": g.cpucheck, "source": self._source_key(g),
                   "constant_inputs": g.constant_inputs, "samples": g.samples}
            yield self._task(gt.name, "cpucheck", record, [gt.inputs, gt.reference],
                             lambda g=g, gt=gt: _stage("cpucheck").run(g, self._source(g), gt.simplified, gt.inputs, gt.reference),
                             file_dep=[str(gt.simplified)] + self._code_deps(g) + self._sample_deps(g), key=key,
                             base={"graph": g.name}, doc=f"CPU check of {gt.simplified} against the original model")

    def calibrate_tasks(self) -> Iterator[dict]:
        for gt in self.graphs:
            g = gt.graph
            if "w8a16" not in g.precisions:
                continue
            record = gt.stage_dir("calibrate") / "calibrate.json"
            key = {"io": g.io(), "options": g.options, "calibration": g.calibration, "source": self._source_key(g),
                   "samples": g.samples}
            yield self._task(gt.name, "calibrate", record, [gt.calibration],
                             lambda g=g, gt=gt: _stage("calibrate").run(g, self._source(g), gt.calibration),
                             file_dep=self._code_deps(g) + self._sample_deps(g), key=key, base={"graph": g.name},
                             doc=f"{g.calibration['samples']} real calibration samples for {g.name} "
                                 f"from export.py:{g.calibration['function']}()")

    # ---------------------------------------------------------- per variant (toolchain graph stages)
    def _variant_chain(self, vt: VariantTarget) -> list[tuple[Any, Path, list[Path]]]:
        """(stage, out_dir, outputs) of the toolchain's graph stages for this variant, in order."""
        chain = []
        for stage in self.toolchain.graph_stages(vt.precision):
            out = vt.stage_dir(stage.name)
            chain.append((stage, out, stage.outputs(vt.graph, vt.precision, out)))
        return chain

    def _compile_source(self, vt: VariantTarget) -> Path:
        """What `context` compiles: the last graph stage's primary output, else the simplified ONNX."""
        if vt.name not in self._sources:
            chain = self._variant_chain(vt)
            self._sources[vt.name] = chain[-1][2][0] if chain else vt.graph_target.simplified
        return self._sources[vt.name]

    def graph_stage_tasks(self, name: str) -> Iterator[dict]:
        for vt in self.variants:
            source = vt.graph_target.simplified
            for stage, out, outputs in self._variant_chain(vt):
                if stage.name == name:
                    g, gt = vt.graph, vt.graph_target
                    calibration = gt.calibration if stage.needs_calibration else None
                    stage_input = StageInput(graph=g, precision=vt.precision, source=source, out_dir=out,
                                             calibration=calibration)
                    key = {"toolchain": self._fingerprint_json, "precision": vt.precision, "io": g.io(),
                           "calibration": g.calibration if calibration else None}
                    yield self._task(vt.name, name, out / f"{name}.json", outputs,
                                     lambda run=stage.run, si=stage_input: run(si),
                                     file_dep=[str(source)] + ([str(calibration)] if calibration else []), key=key,
                                     base={"graph": g.name, "precision": vt.precision,
                                           "toolchain": {"id": vt.toolchain_id, **self.fingerprint}},
                                     doc=f"{name} {g.name} ({vt.precision}) with {vt.toolchain_id}")
                source = outputs[0]

    # ---------------------------------------------------------- per chip
    def _chip_base(self, ct: ChipTarget) -> dict[str, Any]:
        return {"graph": ct.graph.name, "model": ct.graph.model, "precision": ct.precision,
                "soc": ct.soc.row(), "toolchain": {"id": ct.toolchain_id, **self.fingerprint}}

    def _chip_key(self, ct: ChipTarget, **extra: Any) -> str:
        """SoC row + toolchain fingerprint + precision + the stage's own settings, as one digest.

        The pieces are serialised once per SoC and per variant (they repeat across ~1,000 chip
        tasks); the digest is what config_changed stores.
        """
        soc = self._json_cache.setdefault(("soc", ct.soc.name), json.dumps(ct.soc.row(), sort_keys=True))
        settings = self._json_cache.setdefault(("extra", ct.variant.name, tuple(extra)),
                                               json.dumps(extra, sort_keys=True))
        return hashlib.md5(f"{soc}|{self._fingerprint_json}|{ct.precision}|{settings}".encode()).hexdigest()

    def _per_chip(self, stage: str, make: Callable[[ChipTarget, str, str], dict]) -> Iterator[dict]:
        """One subtask per chip target: `make(ct, out_dir, record)`, or a visible skip.

        Paths are plain strings here (and Paths only inside the actions): building ~10,000
        pathlib objects was a quarter of task-generation time in the 1,000-target benchmark.
        """
        for ct in self.chips:
            out = f"{ct.dir_str}/{stage}"
            record = f"{out}/{stage}.json"
            yield self._skip(ct, stage, record) if ct.skip_reason else make(ct, out, record)

    def _config_file(self, ct: ChipTarget) -> str:
        """The provider-options file every chip stage after config reads (the toolchain's first config file)."""
        return f"{ct.dir_str}/config/{self.toolchain.config_files(ct.graph)[0]}"

    def config_tasks(self) -> Iterator[dict]:
        def make(ct: ChipTarget, out: str, record: str) -> dict:
            files = [f"{out}/{f}" for f in self.toolchain.config_files(ct.graph)]
            return self._task(ct.name, "config", record, files,
                              lambda: self.toolchain.write_config(ct.graph, ct.precision, ct.soc, Path(out)),
                              file_dep=[], key=self._chip_key(ct), base=lambda: self._chip_base(ct),
                              doc=f"{self.toolchain.kind} HTP settings for {ct.graph.name} on {ct.soc.name} "
                                  f"(soc_id {ct.soc.soc_id}, {ct.soc.dsp_arch})")
        yield from self._per_chip("config", make)

    def context_tasks(self) -> Iterator[dict]:
        def make(ct: ChipTarget, out: str, record: str) -> dict:
            config_dir = f"{ct.dir_str}/config"
            config_files = [f"{config_dir}/{f}" for f in self.toolchain.config_files(ct.graph)]
            files = [f"{out}/{f}" for f in self.toolchain.context_files(ct.graph)]
            source = self._compile_source(ct.variant)
            return self._task(ct.name, "context", record, files,
                              lambda: self.toolchain.compile(ct.graph, ct.soc, source, Path(config_dir), Path(out)),
                              file_dep=[str(source), str(ct.graph_target.lint_record)] + config_files,
                              key=self._chip_key(ct, allow_cpu_fallback=ct.graph.allow_cpu_fallback),
                              base=lambda: self._chip_base(ct),
                              doc=f"compile {ct.graph.name} ({ct.precision}) for {ct.soc.name} with {ct.toolchain_id}")
        yield from self._per_chip("context", make)

    def simverify_tasks(self) -> Iterator[dict]:
        def make(ct: ChipTarget, out: str, record: str) -> dict:
            gt = ct.graph_target
            ctx_files = [f"{ct.dir_str}/context/{f}" for f in self.toolchain.context_files(ct.graph)]
            config = self._config_file(ct)
            return self._task(ct.name, "simverify", record, [f"{out}/outputs.npz"],
                              lambda: _stage("simverify").run(ct.graph, ct.verify, ct.soc, Path(ctx_files[0]),
                                                              Path(config), gt.inputs, gt.reference, Path(out),
                                                              ct.name, ct.precision),
                              file_dep=ctx_files + [config, str(gt.inputs), str(gt.reference)],
                              key=self._chip_key(ct, verify=ct.verify), base=lambda: self._chip_base(ct),
                              doc=f"run {ct.graph.name} for {ct.soc.name} on the HTP simulator, compare with CPU")
        yield from self._per_chip("simverify", make)

    def diagnose_tasks(self) -> Iterator[dict]:
        for ct in self.chips:
            if ct.skip_reason:
                continue
            out = ct.stage_dir("diagnose")
            gt = ct.graph_target
            config = Path(self._config_file(ct))
            verdict = ct.stage_dir("simverify") / "simverify.json"
            # w8a16: diagnose the quantized (QDQ) model the binary was compiled from
            source = self._compile_source(ct.variant)
            model = source if source.suffix == ".onnx" else gt.simplified
            yield self._task(ct.name, "diagnose", out / "diagnose.json", [out / "diagnose.md"],
                             lambda ct=ct, out=out, gt=gt, config=config, verdict=verdict, model=model: _stage("diagnose").run(
                                 ct.graph, ct.verify, ct.soc, self.toolchain, model, config, gt.inputs, gt.reference, out,
                                 shipped_failed=_failed(verdict)),
                             file_dep=[str(model), str(config), str(gt.inputs), str(gt.reference)],
                             key=self._chip_key(ct, verify=ct.verify), base=lambda: self._chip_base(ct),
                             doc=f"find where {ct.graph.name} diverges on {ct.soc.name}: per-node CPU vs NPU error")

    def socscheck_task(self) -> dict[str, Any]:
        record = Path("build") / "socscheck.json"

        def check() -> TaskFailed | None:
            from .socscheck import check_table

            results = check_table(self.project.socs)
            write_json(record, {"toolchain": {"id": self.toolchain.id(), **self.fingerprint}, "rows": results})
            bad = [r["soc"]["name"] + (f" ({r['error']})" if "error" in r else
                                       f" (binary says socModel {r['recorded_soc_model']}, {r['recorded_arch']})")
                   for r in results if not r["ok"]]
            if bad:
                return TaskFailed(f"socscheck: socs/socs.yaml rows that don't match the compiled binaries: {'; '.join(bad)}")
            print(f"socscheck: all {len(results)} rows match ({record})")
            return None

        rows = [soc.row() for soc in self.project.socs.values()]
        return {"actions": [check], "targets": [str(record)], "verbosity": 2, "clean": True,
                "uptodate": [config_changed(_key({"socs": rows, "toolchain": self._fingerprint_json}))],
                "doc": "Compile a tiny model for every SoC row and confirm the binary's socModel/arch"}

    def report_task(self) -> dict[str, Any]:
        def render() -> None:
            from . import report

            data = report.collect(self.graphs, self.chips, self._variant_stage_names())
            paths = report.write(REPORT_DIR, data)
            print(f"report: {paths['html']} ({report.summary_line(data)})")

        def records_unchanged(task, values) -> bool:
            # No file_dep on the records: a failed stage must not block the report of it.
            from .report import all_record_paths

            targets = "\n".join(f"{ct.name}:{ct.skip_reason}" for ct in self.chips)  # added/removed targets too
            renderer = [str(Path(__file__).with_name("report.py")),  # a new report version re-renders too
                        str(Path(__file__).with_name("templates") / "report.html.j2")]
            signature = (_signature(all_record_paths(self.graphs, self.chips, self._variant_stage_names()) + renderer)
                         + _key({"targets": targets}))
            task.value_savers.append(lambda: {"records": signature})
            return values.get("records") == signature and (REPORT_DIR / "report.json").is_file()

        return {"actions": [render], "uptodate": [records_unchanged], "verbosity": 2,
                "targets": [str(REPORT_DIR / n) for n in ("index.html", "report.json", "report.md")],
                "doc": "Write build/report/index.html, report.json and report.md from the stage records", "clean": True}

    # ---------------------------------------------------------- on phones (on demand; stage: stages/verify.py)
    def _device_job(self, ct: ChipTarget, stage: str) -> Any:
        names = self.toolchain.context_files(ct.graph)
        context_dir = ct.stage_dir("context")
        manifest = next((context_dir / n for n in names if n.endswith("runtime_libs.json")), None)
        return _stage("verify").Job(
            stage=stage, target=ct.name, graph=ct.graph, verify=ct.verify, soc=ct.soc, precision=ct.precision,
            binary=context_dir / next(n for n in names if n.endswith(".bin")), manifest=manifest,
            context_record=context_dir / "context.json", inputs=ct.graph_target.inputs,
            reference=ct.graph_target.reference, out_dir=ct.stage_dir(stage), profile=self.project.toolchain,
            root=self.project.root, base=self._chip_base(ct), required=_asked_by_name(stage, ct.name))

    def verify_tasks(self) -> Iterator[dict]:
        yield from self._device_tasks("verify", "run {graph} on attached {soc} phones, compare with the CPU, measure")

    def power_tasks(self) -> Iterator[dict]:
        yield from self._device_tasks("power", "run {graph} for a fixed time on an attached {soc} phone; battery before/after")

    def _device_tasks(self, stage: str, doc: str) -> Iterator[dict]:
        # Always rerun (uptodate False, no file_dep): which phones are attached changes between runs, and a
        # missing binary should say "build it", not make `doit verify` build every chip. The `devices` subtask
        # comes first: it lists the phones (build/verify/devices.json) and fails when none can run a build;
        # a target with no phone of its chip is then skipped visibly, unless it was asked for by name.
        rows = [(ct.name, ct.soc.name, ct.skip_reason) for ct in self.chips]
        survey = Path("build") / stage / DEVICES_RECORD.name  # build/verify/devices.json, build/power/devices.json
        yield {"name": "devices", "actions": [_device_action(stage, "devices", lambda: _stage("verify").survey(
                   self.project.socs, rows, survey))],
               "targets": [str(survey)], "uptodate": [False], "verbosity": 2, "clean": True,
               "doc": f"list attached phones and their chips; which targets each runs ({survey})"}
        for ct in self.chips:
            if ct.skip_reason:
                yield {"name": ct.name, "actions": [lambda ct=ct: print(f"{stage}:{ct.name}: skipped: {ct.skip_reason}")],
                       "uptodate": [False], "verbosity": 2, "doc": f"SKIPPED: {ct.skip_reason}"}
                continue
            yield {"name": ct.name, "actions": [_device_action(stage, ct.name, lambda ct=ct: getattr(
                       _stage("verify"), f"{stage}_target")(self._device_job(ct, stage)))],
                   "targets": [str(ct.stage_dir(stage) / f"{stage}.json")], "uptodate": [False], "verbosity": 2,
                   "clean": True, "doc": doc.format(graph=ct.graph.name, soc=ct.soc.name)}

    # ---------------------------------------------------------- helpers
    @staticmethod
    def _task(name: str, stage: str, record: Path | str, targets: list[Path | str], run: Callable[[], dict[str, Any]],
              file_dep: list[str], key: dict[str, Any] | str, base: dict[str, Any] | Callable[[], dict[str, Any]],
              doc: str) -> dict[str, Any]:
        return {"name": name, "actions": [stage_action(stage, name, record, run, base)],
                "file_dep": file_dep, "targets": [str(t) for t in targets] + [str(record)],
                "uptodate": [config_changed(key if isinstance(key, str) else _key(key))], "doc": doc, "clean": True}

    @staticmethod
    def _skip(ct: ChipTarget, stage: str, record: Path | str) -> dict[str, Any]:
        return {"name": ct.name, "actions": [skip_action(stage, ct, record)], "targets": [str(record)],
                "uptodate": [config_changed({"skip": ct.skip_reason})],
                "doc": f"SKIPPED: {ct.skip_reason}", "clean": True}
