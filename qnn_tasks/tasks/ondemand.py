"""On-demand doit tasks (created only when asked for, so `doit` and no-op runs never build them):
diagnose, socscheck, toolcheck, compat, the phone stages verify / power, and dist. (cache:stats / cache:gc
are in tasks/project.py: doit parses a task's options only for tasks that exist at load.)
"""
from __future__ import annotations

import fnmatch
import importlib
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

from doit.exceptions import TaskFailed

from qnn_tasks.errors import QnnTasksError, machine_failure
from qnn_tasks.plan import paths
from qnn_tasks.plan.rows import DIAGNOSE, DIST, SOCSCHECK
from qnn_tasks.plan.stagedef import record_path
from qnn_tasks.plan.targets import ChipTarget
from qnn_tasks.run.status import Status
from qnn_tasks.tasks.uptodate import Fresh, key_of

DEVICES_RECORD = Path(paths.DEVICES_RECORD)


def _stage(name: str):
    """Stage modules import numpy/onnx: load them when a task runs, not when tasks are listed."""
    return importlib.import_module(f"qnn_tasks.stages.{name}")


def _device_action(stage: str, name: str, run: Callable[[], Any]) -> Callable[[], TaskFailed | None]:
    """Device stages write their own records (partial ones too); here errors become one-line task failures."""
    def action() -> TaskFailed | None:
        try:
            run()
        except QnnTasksError as err:
            return TaskFailed(f"{stage}:{name}: {err}")
        except OSError as err:  # a full disk, a read-only tree: one line, not a traceback
            if not machine_failure(err):
                raise
            return TaskFailed(f"{stage}:{name}: {machine_failure(err)}")
        return None
    return action


def _asked_by_name(stage: str, name: str) -> bool:
    """`doit verify:<name>` (or a pattern matching it) on the command line, not just the `verify` group."""
    return any(arg.startswith(f"{stage}:") and fnmatch.fnmatchcase(f"{stage}:{name}", arg) for arg in sys.argv[1:])


class OnDemand:
    def __init__(self, factory) -> None:
        self.factory = factory
        self.planner = factory.planner
        self.project = factory.project

    # ---------------------------------------------------------- diagnose, socscheck, toolcheck
    def diagnose_tasks(self) -> Iterator[dict]:
        for ct in self.planner.chips:
            plan = DIAGNOSE.plan(self.planner, DIAGNOSE, ct)
            if plan is not None:
                task = self.factory.task(DIAGNOSE, plan)
                task["verbosity"] = 2
                yield task

    def socscheck_tasks(self) -> Iterator[dict]:
        """One subtask per toolchain of the run (`socscheck` for the first)."""
        rows = [soc.row() for soc in self.project.socs.values()]
        for binding in self.planner.bindings:
            name = binding.profile.name
            record = Path(paths.project_record(SOCSCHECK.name, binding.suffix))

            def check(binding=binding, record=record, name=name) -> TaskFailed | None:
                from qnn_tasks.fileio import write_json
                from qnn_tasks.run.calls import StageCall
                from qnn_tasks.run.executors import for_call

                call = StageCall(stage="socscheck", target=name, args={"socs": rows}, inputs=[], out_dir="build",
                                 outputs=[], record=str(record), key="",
                                 toolchain=binding.profile_dict(self.planner.root), runner=SOCSCHECK.runner)
                outcome = for_call(call, self.factory.root).run(call, None)
                if not outcome.ok:
                    return TaskFailed(f"socscheck:{name}: {outcome.error}")
                results = outcome.record["rows"]
                write_json(record, {"toolchain": {"id": binding.id, **binding.fingerprint}, "rows": results})
                bad = [r["soc"]["name"] + (f" ({r['error']})" if "error" in r else
                                           f" (binary says socModel {r['recorded_soc_model']}, {r['recorded_arch']})")
                       for r in results if not r["ok"]]
                if bad:
                    return TaskFailed(f"socscheck:{name}: SoC table rows (socs/socs.yaml over the packaged table) that "
                                      f"don't match the binaries of {binding.id}: {'; '.join(bad)}")
                print(f"socscheck:{name}: all {len(results)} rows match with {binding.id} ({record})")
                return None

            yield {"name": name, "actions": [check], "targets": [str(record)], "verbosity": 2, "clean": True,
                   "uptodate": [Fresh(key_of({"socs": rows, "toolchain": binding.fingerprint_json}), [str(record)])],
                   "doc": f"compile a tiny model for every SoC row with {binding.id}; confirm socModel/arch"}

    def toolcheck_tasks(self) -> Iterator[dict]:
        for binding in self.planner.bindings:
            name = binding.profile.name

            def check(binding=binding, name=name) -> TaskFailed | None:
                from qnn_tasks.fileio import write_json

                record: dict[str, Any] = {"stage": "toolcheck", "target": name,
                                          "toolchain": {"id": binding.id, **binding.fingerprint}}
                try:
                    record.update(binding.toolchain.check(), status=Status.PASSED)
                except QnnTasksError as err:
                    record.update(getattr(err, "record", {}) or {}, status=Status.FAILED, error=str(err))
                try:
                    write_json(Path(paths.project_record("toolcheck", binding.suffix)), record)
                except OSError as err:
                    return TaskFailed(f"toolcheck:{name}: {machine_failure(err) or err}")
                if record["status"] == Status.FAILED:
                    return TaskFailed(f"toolcheck:{name}: {binding.id}: {record['error']}")
                print(f"toolcheck:{name}: {binding.id}: ok")
                return None

            yield {"name": name, "actions": [check], "uptodate": [False], "verbosity": 2,
                   "doc": f"dependency checks of {binding.id}"}

    # ---------------------------------------------------------- compat
    def compat_task(self) -> dict[str, Any]:
        planner = self.planner

        def run() -> TaskFailed | None:
            from qnn_tasks.stages import compat

            try:
                table = compat.measure(planner, self.factory.root)
            except QnnTasksError as err:
                return TaskFailed(f"compat: {err}")
            except OSError as err:
                if not machine_failure(err):
                    raise
                return TaskFailed(f"compat: {machine_failure(err)}")
            print(compat.summary(table))
            return None

        return {"actions": [run], "uptodate": [False], "verbosity": 2, "targets": [paths.COMPAT_RECORD],
                "doc": "load every built binary on every configured runtime's simulator (build/compat/compat.json)"}

    # ---------------------------------------------------------- dist
    def dist_tasks(self) -> Iterator[dict]:
        """One subtask per model (`dist:<model>`): its package from the verified targets of the first toolchain."""
        broken = {name for name, _ in self.project.broken}
        for model in self.project.models:
            if model.name in broken:
                continue

            def run(model=model.name) -> TaskFailed | None:
                from qnn_tasks.run import interrupts
                from qnn_tasks.run.calls import StageCall, execute
                from qnn_tasks.ship import inventory, package

                binding = self.planner.bindings[0]
                interrupts.running(f"dist:{model}")  # Ctrl-C here: "interrupted during dist:<model>" (it runs no stage)
                try:
                    dest_root = package.dist_root(binding.profile.settings, binding.profile.file, self.project.root)
                    call = StageCall(stage=DIST.name, target=model, args={
                        "inventory": inventory.of_model(self.planner, model), "root": str(self.project.root),
                        "dest_root": str(dest_root), "cache_dir": str(Path("build") / "verify" / "runtime-libs")},
                        inputs=[], out_dir=str(dest_root / model), outputs=[], record="", key="", heavy=False,
                        runner=DIST.runner)
                    done = execute(call)
                except QnnTasksError as err:
                    return TaskFailed(f"dist:{model}: {err}")
                finally:
                    interrupts.running(None)
                print(package.summary(done))
                return None

            yield {"name": model.name, "actions": [run], "uptodate": [False], "verbosity": 2,
                   "doc": f"package {model.name}'s verified binaries, manifest, CPU fallback and runtime libs "
                          f"(dist/{model.name}/)"}

    # ---------------------------------------------------------- on phones (stages/verify/)
    def _device_job(self, ct: ChipTarget, stage: str) -> Any:
        binding = self.planner.binding(ct)
        names = binding.toolchain.context_files(ct.graph)
        context_dir = ct.stage_dir("context")
        manifest = next((context_dir / n for n in names if n.endswith("runtime_libs.json")), None)
        return _stage("verify").Job(
            stage=stage, target=ct.name, graph=ct.graph, verify=ct.verify, soc=ct.soc, precision=ct.precision,
            binary=context_dir / next(n for n in names if n.endswith(".bin")), manifest=manifest,
            context_record=Path(record_path("context", ct)), inputs=ct.graph_target.inputs,
            reference=ct.graph_target.reference, out_dir=ct.stage_dir(stage), record=Path(record_path(stage, ct)),
            profile=binding.profile,
            root=self.project.root, base=self.planner.chip_base(ct), required=_asked_by_name(stage, ct.name),
            toolchains=[(b.profile.name, b.fingerprint.get("qnn")) for b in self.planner.bindings],
            fallback=ct.graph_target.simplified)

    def verify_tasks(self) -> Iterator[dict]:
        yield from self._device_tasks("verify", "run {graph} on attached {soc} phones, compare with the CPU, measure")

    def power_tasks(self) -> Iterator[dict]:
        yield from self._device_tasks("power", "run {graph} for a fixed time on an attached {soc} phone; battery before/after")

    def _device_tasks(self, stage: str, doc: str) -> Iterator[dict]:
        # Always rerun (uptodate False, no file_dep): which phones are attached changes between runs, and a
        # missing binary should say "build it", not make `doit verify` build every chip. The `devices` subtask
        # comes first: it lists the phones (build/verify/devices.json) and fails when none can run a build;
        # a target with no phone of its chip is then skipped visibly, unless it was asked for by name.
        rows = [(ct.name, ct.soc.name, ct.skip_reason) for ct in self.planner.chips]
        survey = Path("build") / stage / DEVICES_RECORD.name  # build/verify/devices.json, build/power/devices.json
        yield {"name": "devices", "actions": [_device_action(stage, "devices", lambda: _stage("verify").survey(
                   self.project.socs, rows, survey))],
               "targets": [str(survey)], "uptodate": [False], "verbosity": 2, "clean": True,
               "doc": f"list attached phones and their chips; which targets each runs ({survey})"}
        for ct in self.planner.chips:
            if ct.skip_reason:
                yield {"name": ct.name, "actions": [lambda ct=ct: print(f"{stage}:{ct.name}: skipped: {ct.skip_reason}")],
                       "uptodate": [False], "verbosity": 2, "doc": f"SKIPPED: {ct.skip_reason}"}
                continue
            yield {"name": ct.name, "actions": [_device_action(stage, ct.name, lambda ct=ct: getattr(
                       _stage("verify"), f"{stage}_target")(self._device_job(ct, stage)))],
                   "targets": [record_path(stage, ct)], "uptodate": [False], "verbosity": 2,
                   "clean": True, "doc": doc.format(graph=ct.graph.name, soc=ct.soc.name)}
