"""A measured runtime-compatibility table: which QNN runtimes load each built binary, and do outputs match?

`doit compat` takes every context binary built in this run's trees and runs it on every configured
ort-qnn runtime's x86 HTP simulator (each toolchain's own interpreter: pinned environments
included), on the first few verification inputs, judged by the graph's own thresholds. An ONNX
Runtime older than the one that wrote the `_ctx.onnx` wrapper refuses its IR version before QNN
ever sees the binary, so the wrapper is lowered to IR 10 in a temporary copy beside it. Measured
here (docs/toolchains.md): newer runtimes load older binaries, not the reverse. The table goes to
build/compat/compat.json and into the report; `doit verify` refuses phone runtime libs older than
a binary's measured minimum runtime.

Beside each measurement stands the load oracle's prediction (qnn/loadoracle.py) for the same binary on the same
runtime, on its own chip's row (the simulator loads a binary under any soc_model it is told, so only the version
rule is measured here), and the line `predicted vs measured: N cases, K disagree`; the oracle's predictions for
every SoC row x every known runtime QNN version go into the table too (`oracle.matrix`), unmeasured.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path
from typing import Any

from qnn_tasks import envvalues
from qnn_tasks.errors import QnnTasksError, StageError
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.plan.paths import COMPAT_RECORD
from qnn_tasks.qnn import loadoracle, runtimelibs
from qnn_tasks.run import calls, records
from qnn_tasks.run.calls import StageCall
from qnn_tasks.run.status import good

TABLE_VERSIONS = ("2.47.0", "2.51.0")  # socs.yaml's measurements (QNN 2.51) and toolchain/ort-qnn-2.47.yaml
BINARY_RUNNER = "qnn_tasks.stages.compat:run_binary_call"  # one binary on one runtime (a child per runtime)
WRAPPER_IR = 10  # every onnxruntime-qnn 2.x era runtime reads IR 10; the EPContext node needs nothing newer


def run_binary(graph: GraphSpec, verify: dict[str, Any], ctx_onnx: Path, provider_options_file: Path, inputs_file: Path,
               reference_file: Path, samples: int, out_dir: Path) -> dict[str, Any]:
    """In the runtime's own interpreter: load the binary, run `samples` inputs, judge. Never raises for a refusal."""
    import onnx

    from qnn_tasks import fileio
    from qnn_tasks.devices import simulator
    from qnn_tasks.judge import sample_store, verification

    inputs = sample_store.load(inputs_file, limit=samples)
    reference = sample_store.load(reference_file, limit=samples)
    wrapper = onnx.load(str(ctx_onnx), load_external_data=False)
    wrapper.ir_version = min(wrapper.ir_version, WRAPPER_IR)
    lowered = ctx_onnx.with_name(f".{ctx_onnx.stem}.compat-{os.getpid()}.onnx")  # beside the .bin it points at
    onnx.save(wrapper, str(lowered))
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "simulator.log"
    try:
        outputs, _, _ = simulator.run(lowered, fileio.read_json(provider_options_file), inputs, log)
    except StageError as err:
        text = str(err)
        code = re.search(r"\b(5\d{3})\b", text) or re.search(r"(QNN_\w+ERROR\w*)", text)
        return {"loads": False, "error": text.replace(str(lowered), str(ctx_onnx)),
                "error_code": code.group(1) if code else None}
    finally:
        lowered.unlink(missing_ok=True)
    result, violations = verification.judge(graph, verify, reference, outputs)
    cosines = [m.get("cosine") for m in result["metrics"].values() if m.get("cosine") is not None]
    return {"loads": True, "matches": not violations, "min_cosine": min(cosines) if cosines else None,
            "violations": violations, "samples": len(inputs)}


def measure(args: dict[str, Any]) -> dict[str, Any]:
    """Every built binary x every ort-qnn runtime of this run (plan/ondemandplans.py's plan_compat says which): the table
    the funnel writes to build/compat/compat.json."""
    from qnn_tasks.run.executors import for_call

    runtimes = args["runtimes"]
    if not runtimes:
        raise QnnTasksError("no ort-qnn toolchain in this run: the compatibility table runs binaries on onnxruntime-qnn "
                            "simulators (fix: QNN_TOOLCHAIN=ort-qnn,<other profile>)")
    samples = int(envvalues.number(envvalues.COMPAT_SAMPLES))
    table: dict[str, Any] = {"measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                             "samples": samples, "runtimes": runtimes, "binaries": []}
    versions = known_versions(table["runtimes"])
    cases: list[dict[str, Any]] = []
    for target in args["binaries"]:
        context = target["context_record"]
        record = records.read(context)
        if not record or not good(record.get("status")) or records.problems(record, context):
            continue
        ctx_onnx = target["ctx_onnx"]
        entry = {"target": target["target"], "toolchain": target["toolchain"], "built_with": (record.get("binary") or {}).get(
                     "build_id"), "binary_sha256": next((f["sha256"] for n, f in record.get("files", {}).items()
                                                         if n.endswith(".bin")), None), "runs": {}}
        facts = binary_facts(Path(ctx_onnx), record.get("binary") or {})
        entry["facts"] = facts.as_dict()
        for runtime in runtimes:
            call = StageCall(stage="compat", target=target["target"], args={
                "graph": target["graph"], "verify": target["verify"], "ctx_onnx": ctx_onnx,
                "provider_options": target["provider_options"], "inputs": target["inputs"],
                "reference": target["reference"], "samples": samples},
                inputs=[], out_dir=f"build/compat/{target['target']}/{runtime['profile']}", outputs=[], record="",
                key="", toolchain=args["profiles"][runtime["profile"]], runner=BINARY_RUNNER)
            outcome = for_call(call, args["root"]).run(call, None)
            run = outcome.record if outcome.ok else {"loads": False, "error": outcome.error}
            qnn = runtime["qnn"]
            predicted = loadoracle.predict(facts, target["soc"], qnn, Path(ctx_onnx).name).as_dict()
            measured = entry["runs"][runtime["profile"]] = {**run, "runtime_qnn": qnn, "predicted": predicted}
            agree = loadoracle.agrees(predicted, measured)
            cases.append({"target": target["target"], "runtime": runtime["profile"], "runtime_qnn": qnn, "agree": agree,
                          "measured": _verdict(measured), "predicted": _predicted(predicted)})
            print(f"compat: {target['target']} ({entry['built_with']}) on runtime QNN {qnn}: {_verdict(measured)}; "
                  f"predicted {_predicted(predicted)}{'' if agree else ' DISAGREE'}", flush=True)
        entry["minimum_runtime"] = minimum_runtime(entry["runs"])
        entry["matrix"] = loadoracle.matrix(facts, args["socs"], versions, Path(ctx_onnx).name)
        table["binaries"].append(entry)
    table["oracle"] = {"cases": len(cases), "disagree": sum(not c["agree"] for c in cases), "versions": versions,
                       "disagreements": [c for c in cases if not c["agree"]],
                       "note": "measured: version ordering on the simulator, each binary on its own chip's row; "
                               "the chip rules (arch, VTCM, soc_model) are predictions (the simulator loads a "
                               "binary under any soc_model it is told)"}
    return table


def binary_facts(ctx_onnx: Path, binary_info: dict[str, Any]) -> loadoracle.BinaryFacts:
    """The oracle's facts of a built binary: its `_ctx.onnx`'s ep_compatibility_info over the context record's
    reading of the `.bin` (qnn/binary.py)."""
    import onnx

    model = onnx.load(str(ctx_onnx), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    return loadoracle.facts(meta.get(loadoracle.EP_KEY), binary_info, f"{ctx_onnx.name} ep_compatibility_info")


def known_versions(runtimes: list[dict[str, Any]]) -> list[str]:
    """The runtime QNN versions the oracle predicts for: the installed runtimes', then the SoC table's (measured with
    QNN 2.51) and the pinned older toolchain's, oldest first."""
    found = {str(r["qnn"]) for r in runtimes if r.get("qnn")} | set(TABLE_VERSIONS)
    return sorted(found, key=lambda v: runtimelibs.version_tuple(v) or (0, 0, 0))



def oracle_line(table: dict[str, Any]) -> str | None:
    """`predicted vs measured: N cases, K disagree`, or None when the table predates the oracle."""
    oracle = table.get("oracle")
    if not oracle:
        return None
    return f"predicted vs measured: {oracle['cases']} cases, {oracle['disagree']} disagree"


def _predicted(p: dict[str, Any]) -> str:
    return p["outcome"] + (f" ({p['code']})" if p.get("code") else "") + f" [{p['rule']}]"


def minimum_runtime(runs: dict[str, dict[str, Any]]) -> str | None:
    """The oldest runtime QNN version measured to load the binary with matching outputs."""
    good = [runtimelibs.version_tuple(r.get("runtime_qnn")) for r in runs.values() if r.get("loads") and r.get("matches")]
    good = [v for v in good if v is not None]
    return ".".join(map(str, min(good))) if good else None


def summary(table: dict[str, Any]) -> str:
    lines = [f"compat: {len(table['binaries'])} binaries x {len(table['runtimes'])} runtimes "
             f"({', '.join('QNN ' + str(r['qnn']) for r in table['runtimes'])}) -> {COMPAT_RECORD}"]
    for entry in table["binaries"]:
        lines.append(f"  {entry['target']}: minimum runtime {entry['minimum_runtime'] or 'none measured to work'}")
    line = oracle_line(table)
    if line:
        counts = loadoracle.tally([e.get("matrix") or {} for e in table["binaries"]])
        rows = len(next((e["matrix"] for e in table["binaries"] if e.get("matrix")), {}))
        lines.append(f"  oracle, unmeasured: {len(table['binaries'])} binaries x {rows} SoC rows x runtime QNN "
                     f"{', '.join(table['oracle']['versions'])}: {counts[loadoracle.LOADS]} load, "
                     f"{counts[loadoracle.RECOMPILE]} load with recompilation preferred, "
                     f"{counts[loadoracle.REFUSED]} refused")
        lines.append(line)
        for c in table["oracle"]["disagreements"]:
            lines.append(f"  DISAGREE {c['target']} on runtime QNN {c['runtime_qnn']}: measured {c['measured']}; "
                         f"predicted {c['predicted']}")
    return "\n".join(lines)


def _verdict(run: dict[str, Any]) -> str:
    if not run.get("loads"):
        return f"refused ({run.get('error_code') or run.get('error', '')[:120]})"
    return "loads, outputs match" if run.get("matches") else f"loads, outputs differ ({'; '.join(run.get('violations', []))})"


def run_call(call: StageCall) -> dict[str, Any]:
    """`doit compat`: the table (the funnel writes it as build/compat/compat.json), its summary printed."""
    table = measure(call.args)
    print(summary(table), flush=True)
    return table


def run_binary_call(call: StageCall) -> dict[str, Any]:
    """One binary on one runtime, in that runtime's own interpreter."""
    a = call.args
    return run_binary(calls.graph(a), a["verify"], Path(a["ctx_onnx"]), Path(a["provider_options"]), Path(a["inputs"]),
                      Path(a["reference"]), a["samples"], Path(call.out_dir))
