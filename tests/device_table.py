"""The generated device table both selectors and the load oracle must agree on (issue 41, item 2).

Every chip of the packaged SoC table plus a non-Qualcomm phone x runtime QNN versions (libraries absent, older,
equal, newer, a build id) x two manifests (fp16 first, w8a16 first) x a graph without sizes and a graph with sizes
(three input lengths): each case's expected decision is what the Python selector gives when every load it tries
answers as the load oracle predicts (qnn/loadoracle.py, from the binary's own fields in the manifest); the oracle's
answer for each binary is in the case (`load_errors`), so Selector.java needs no oracle to run it.

Regenerate: `python3 tests/device_table.py` (writes DEVICE_CASES); tests/test_loadoracle.py checks the committed file
equals a fresh generation, and runs every case through the Python selector and the oracle; SelectorTest.java runs it
through the Java selector.
"""
from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from qnn_tasks.qnn import loadoracle, select  # noqa: E402

DEVICE_CASES = Path(str(resources.files("qnn_tasks.ship") / "java")) / "src/test/resources/device_cases.json"
RUNTIMES = (None, "2.45", "2.47.0", "2.51.0", "v2.52.0.260101")
OTHER_PHONE = {"name": "s5e9945", "soc_id": None, "dsp_arch": None, "vtcm_mb": None}  # an Exynos: no Qualcomm HTP
LENGTHS = (10, 40, 100)  # sizes 16 and 64: pads to 16, pads to 64, longer than every size (skip)
RESIDENT = {"fp16": 48 * 2**20 + 1, "w8a16": 30 * 2**20}  # a binary's memory.resident_bytes (49 and 30 MiB)
FREE_MEMORY = (None, 40, 30, 20)  # MiB the device declares: none; holds w8a16 only; w8a16 exactly; neither


def soc_rows() -> list[dict[str, Any]]:
    """The packaged SoC table's rows (docs/socs.md), in its order, then a phone without a Qualcomm HTP."""
    from qnn_tasks.modelspec.load import load_socs

    table = Path(str(resources.files("qnn_tasks") / "data" / "socs.yaml"))
    return [soc.row() for soc in load_socs(table).values()] + [OTHER_PHONE]


def _binary(soc: str, socs: list[str], soc_model: int, arch: str, precision: str, path: str, qnn: str = "2.51.0",
            minimum: str | None = None, source: str = "compiler", vtcm: int = 8) -> dict[str, Any]:
    return {"soc": soc, "socs": socs, "soc_model": soc_model, "dsp_arch": arch, "precision": precision,
            "path": path, "size": 1000, "sha256": "0" * 64, "qnn_build_id": f"v{qnn}.251023", "qnn_version": qnn,
            "min_runtime_qnn": minimum or qnn, "min_runtime_from": source,
            "ep_compatibility_info": f"v2:6:{qnn}:5.{qnn.split('.')[1]}.0:0:{soc_model}:{vtcm}:0",
            "memory": {"resident_bytes": RESIDENT[precision], "basis": "read from the context binary (test value)"}}


def _enc_binaries() -> list[dict[str, Any]]:
    return [
        _binary("SM8650", ["SM8650"], 57, "v75", "w8a16", "SM8650/enc.w8a16.bin"),
        _binary("SM8650", ["SM8650"], 57, "v75", "fp16", "SM8650/enc.fp16.bin"),
        _binary("SM8750", ["SM8750"], 69, "v79", "fp16", "SM8750/enc.fp16.bin"),
        # built with QNN 2.47, measured by doit compat to load from 2.47 on
        _binary("SM8550", ["SM8550"], 43, "v73", "w8a16", "SM8550/enc.w8a16.bin", "2.47.0", "2.47.0", "compat"),
        _binary("SM8550", ["SM8550"], 43, "v73", "fp16", "SM8550/enc.fp16.bin"),
        # one build verified on two chips of the same arch: soc_model 64 on SM7675 (70)
        _binary("SM7550", ["SM7550", "SM7675"], 64, "v73", "w8a16", "SM7550/enc.w8a16.bin"),
        _binary("SM8350", ["SM8350"], 30, "v68", "w8a16", "SM8350/enc.w8a16.bin", vtcm=4),
        # compiled asking for 8 MB of VTCM where the chip has 4: the oracle refuses it (its VTCM rule)
        _binary("SM7325", ["SM7325", "QCM6490"], 35, "v68", "w8a16", "SM7325/enc.w8a16.bin", vtcm=8),
        # a v73 build listed for a v68 chip (a hand-edited manifest): the oracle refuses it (its arch rule)
        _binary("SA8255", ["SA8255", "SA8295"], 52, "v73", "w8a16", "SA8255/enc.w8a16.bin"),
        _binary("SM8850", ["SM8850"], 87, "v81", "fp16", "SM8850/enc.fp16.bin"),
    ]


def manifest(order: list[str]) -> dict[str, Any]:
    """A two-graph package: `enc` (no sizes) and `dec` (sizes 16 and 64 along `seq`)."""
    graphs: dict[str, Any] = {"enc": {"inputs": [], "outputs": [], "fallback": {"path": "cpu/enc.onnx"},
                                      "binaries": _enc_binaries()}}
    for size in (16, 64):
        name = f"dec.seq{size}"
        binaries = [_binary("SM8650", ["SM8650"], 57, "v75", p, f"SM8650/{name}.{p}.bin") for p in ("fp16", "w8a16")]
        if size == 16:
            binaries.append(_binary("SM8750", ["SM8750"], 69, "v79", "fp16", f"SM8750/{name}.fp16.bin"))
        binaries.append(_binary("SM7550", ["SM7550", "SM7675"], 64, "v73", "w8a16", f"SM7550/{name}.w8a16.bin"))
        graphs[name] = {"inputs": [], "outputs": [], "fallback": {"path": f"cpu/{name}.onnx"}, "binaries": binaries,
                        "size": {"of": "dec", "dim": "seq", "size": size}}
    sizes = [{"graph": "dec", "dim": "seq", "sizes": [16, 64], "graphs": {"16": "dec.seq16", "64": "dec.seq64"},
              "rule": select.RULE_SIZES, "pad": {"tokens": 0.0}, "longer": "skip", "axes": {"tokens": 1}}]
    return {"schema": "qnn-npu-compile/manifest", "schema_version": select.SCHEMA_VERSION, "model": "demo",
            "selection": {"precision_order": order, "rule": "exact chip, then precision order, runtime >= binary, "
                                                            "load or CPU", "sizes": sizes},
            "graphs": graphs}


MANIFESTS = {"fp16-first": ["fp16", "w8a16"], "w8a16-first": ["w8a16", "fp16"]}
# a chip with builds: both precision orders x the graph without sizes and two lengths the sizes take;
# a chip without: one of the graph without sizes and a length longer than every size
BUILT = [(m, g, n) for m in MANIFESTS for g, n in (("enc", None), ("dec", LENGTHS[0]), ("dec", LENGTHS[1]))]
UNBUILT = [("fp16-first", "enc", None), ("w8a16-first", "dec", LENGTHS[2])]


def decide(m: dict[str, Any], graph: str, length: int | None, row: dict[str, Any], runtime: str | None,
           free_memory_mb: int | None = None
           ) -> tuple[dict[str, Any] | None, select.Decision | None, dict[str, str], list[str]]:
    """(the size choice, the decision, the oracle's load errors, the binaries tried) of one device."""
    size = None
    if length is not None:
        choice = select.choose_size(m, graph, length)
        size = {"graph": choice.graph, "size": choice.size, "rule": choice.rule, "reason": choice.reason}
        if choice.graph is None:
            return size, None, {}, []
        graph = choice.graph
    errors: dict[str, str] = {}
    for b in m["graphs"][graph]["binaries"]:
        error = loadoracle.load_callback(row, runtime)(b)
        if error is not None and row["name"] in b["socs"]:
            errors[b["path"]] = error
    tried: list[str] = []

    def load(b: Any) -> str | None:
        tried.append(b["path"])
        return errors.get(b["path"])

    return size, select.choose(m, graph, row["name"], runtime, load, free_memory_mb), errors, tried


def generate() -> dict[str, Any]:
    manifests = {name: manifest(order) for name, order in MANIFESTS.items()}
    cases = []
    built = {soc for b in manifests["fp16-first"]["graphs"]["enc"]["binaries"] for soc in b["socs"]}
    for i, row in enumerate(soc_rows()):
        for j, runtime in enumerate(RUNTIMES):
            combos = BUILT if row["name"] in built else [UNBUILT[(i + j) % len(UNBUILT)]]
            # a device that declares its free memory: each amount once per built chip, on the newest runtime
            frees = FREE_MEMORY if row["name"] in built and runtime == RUNTIMES[-1] else (None,)
            for (name, graph, length), free in ((c, f) for c in combos for f in frees):
                size, d, errors, tried = decide(manifests[name], graph, length, row, runtime, free)
                expect = None if d is None else {"target": d.target, "precision": d.precision, "path": d.path,
                                                 "rule": d.rule, "reason": d.reason, "loaded": tried}
                cases.append({"name": f"{row['name']}-{runtime or 'no-libs'}-{name}-{graph}{length or ''}"
                                      + (f"-free{free}" if free is not None else ""),
                              "manifest": name, "graph": graph, "length": length, "soc": row["name"],
                              "free_memory_mb": free,
                              "device": {key: row.get(key) for key in ("soc_id", "dsp_arch", "vtcm_mb")},
                              "runtime_qnn": runtime, "load_errors": errors, "size": size, "expect": expect})
    return {"about": "Generated by tests/device_table.py (do not edit): chip x runtime QNN (None = libraries absent) "
                     "x precision order x graph and input length (x the free memory a device declares, on the "
                     "newest runtime). load_errors = the load oracle's prediction "
                     "(qnn/loadoracle.py) for each binary listed for the chip; expect = the decision (after "
                     "choose_size for a length). tests/test_loadoracle.py (Python selector and oracle) and "
                     "SelectorTest.java (Java selector) run every case.",
            "manifests": manifests, "cases": cases}


def text(table: dict[str, Any]) -> str:
    return json.dumps(table, indent=1) + "\n"


if __name__ == "__main__":
    DEVICE_CASES.write_text(text(generate()))
    print(f"{DEVICE_CASES}: {len(generate()['cases'])} cases")
