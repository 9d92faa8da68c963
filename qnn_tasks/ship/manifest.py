"""manifest.json: what a package holds and why it may be trusted, as data (schema: manifest.schema.json).

Built only from records the report believes (verified.py) and from the files as copied into the package.
Every path is relative to the package root. The JSON is deterministic (fixed key order, no timestamps, no
paths of the machine that made it): two dists of the same build give the same bytes.
"""
from __future__ import annotations

import json
from importlib import metadata, resources
from typing import Any, Callable

from qnn_tasks.errors import StageError
from qnn_tasks.qnn import runtimelibs
from qnn_tasks.qnn.select import DEFAULT_PRECISION_ORDER, RULE_EXACT
from qnn_tasks.run.status import Status

SCHEMA = "qnn-npu-compile/manifest"
SCHEMA_VERSION = 1
SCHEMA_FILE = "manifest.schema.json"
RULE = "exact chip, then precision order, runtime >= binary, load or CPU"
RULE_SPLIT = "every part in order, each chosen per device; each part's outputs feed the next by name"
SIMULATOR = "x86 HTP simulator"
PHONE = "phone"
CPU = "x86 CPU (onnxruntime)"
METRIC_KEYS = ("cosine", "max_abs", "mean_abs", "snr_db", "non_finite", "thresholds")
CHECK_KEYS = ("kind", "output", "value", "min", "max", "passed", "meaning")
TOKENS_FILE = "tokens.txt"
SHERPA_KIND = "online transducer: sherpa-onnx OnlineTransducerModelConfig (encoder, decoder, joiner) + tokens"


def schema() -> dict[str, Any]:
    """The JSON Schema a manifest of this version follows (shipped in every package too)."""
    return json.loads(resources.files("qnn_tasks.ship").joinpath(SCHEMA_FILE).read_text())


def dumps(data: dict[str, Any]) -> bytes:
    """Deterministic bytes: sorted keys, two-space indent, a final newline."""
    return (json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()


def validate(data: dict[str, Any]) -> None:
    """Refuse a manifest its own schema does not accept (jsonschema, when installed: the test extra has it)."""
    try:
        import jsonschema
    except ImportError:
        return
    errors = sorted(jsonschema.Draft202012Validator(schema()).iter_errors(data), key=lambda e: list(e.path))
    if errors:
        where = "/".join(map(str, errors[0].path)) or "(root)"
        raise StageError(f"manifest.json: {where}: {errors[0].message} (a bug in dist: please report it)")


def precision_order(ship: dict[str, Any], shipped: list[str] = ()) -> list[str]:
    """The model's declared precision order (model.yaml `ship.precision_order`; modelspec/specship.py fills the default),
    then every other precision the package ships (e.g. what `precision: auto` chose), so each binary is named."""
    return list(dict.fromkeys(list(ship.get("precision_order") or ()) + list(DEFAULT_PRECISION_ORDER)
                              + list(shipped)))


def sizes(graphs: list[dict[str, Any]], unpadded: dict[str, str]) -> dict[str, Any]:
    """`selection.sizes` when the model has graphs with sizes (model.yaml `dims:`): each graph's dim, sizes, the
    graph of each size and the rule "smallest that fits" with the pad values; {} when it has none. A graph in
    `unpadded` (graph -> why its padding is not vouched for) gets the rule "exact length only" and the why."""
    from qnn_tasks.modelspec.specsizes import selection

    found = selection(g["sizes"] for g in graphs if g.get("sizes"))
    for entry in found:
        if entry["graph"] in unpadded:
            entry.update(rule=RULE_EXACT, why=f"padding is not vouched for: {unpadded[entry['graph']]}; run a size "
                                              "only on an input of exactly its length")
    return {"sizes": found} if found else {}


def splits(graphs: list[dict[str, Any]], records: dict[str, dict[str, Any]],
           verified: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """`selection.splits`: each split graph (model.yaml `split:`) whose parts all ship, as the app runs it: its
    parts in order, which tensors each part feeds the next (by name: a part's inputs are the previous part's
    outputs), and the parts chained on CPU against the unsplit graph (the split record's end_to_end_cpu)."""
    by_name = {g["name"]: g for g in graphs}
    found = []
    for g in graphs:
        names = (g.get("split") or {}).get("parts") or []
        if not names or not all(n in by_name and verified(records[n]) for n in names):
            continue  # a part not verified: none of them ships (verified.whole_chains left their binaries out)
        io = [by_name[n]["io"] for n in names]
        feeds = [{"from": a, "to": b, "tensors": [t["name"] for t in b_io["inputs"]
                                                   if t["name"] in {o["name"] for o in a_io["outputs"]}]}
                 for a, b, a_io, b_io in zip(names, names[1:], io, io[1:])]
        chained = (records[g["name"]].get("split") or {}).get("end_to_end_cpu")
        found.append({"graph": g["name"], "parts": names, "feeds": feeds, "rule": RULE_SPLIT,
                      "inputs": [t["name"] for t in io[0]["inputs"]], "outputs": [t["name"] for t in io[-1]["outputs"]],
                      "chained_on_cpu": {"measured_on": CPU, "metrics": _metrics(chained)}})
    return found


def ships_alone(graph: dict[str, Any], splits: list[dict[str, Any]]) -> bool:
    """A graph that is its own entry of `graphs`: not a split graph (its parts are), not a part of a split that does
    not ship whole."""
    if graph.get("split"):
        return False
    return not graph.get("part") or any(graph["name"] in s["parts"] for s in splits)


def size_of(facts: dict[str, Any]) -> dict[str, Any]:
    """A size graph's own entry: which declared graph it is a size of, along which dim, at which size."""
    return {"of": facts["graph"], "dim": facts["dim"], "size": facts["size"]}


def tool_version() -> str:
    try:
        return metadata.version("qnn-npu-compile")
    except metadata.PackageNotFoundError:
        return "unknown"


def source(export: dict[str, Any] | None, file_sha256: str | None) -> dict[str, Any]:
    """Where the model comes from: a package and its version, and/or a file and its digest."""
    facts = (export or {}).get("source") or {}
    return {"package": facts.get("package"), "version": facts.get("version"), "file": facts.get("file"),
            "file_sha256": file_sha256}


def tensors(declared: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The graph's tensors as the app feeds and reads them (model.yaml's names, shapes, dtypes)."""
    return [{"name": t["name"], "shape": list(t["shape"]), "dtype": t["dtype"], "quantization": None} for t in declared]


def binary_io(context: dict[str, Any], graph_io: dict[str, Any]) -> dict[str, Any]:
    """The tensors as the binary holds them: where it takes quantized I/O (w8a16), the scale/offset the app applies
    (real = scale * (q + offset), QNN's convention)."""
    qnn_graphs = (context.get("binary") or {}).get("graphs") or []
    if not qnn_graphs:
        return {"inputs": [], "outputs": []}
    qnn = qnn_graphs[0]

    def one(kind: str) -> list[dict[str, Any]]:
        found = []
        for position, declared in enumerate(graph_io[kind]):
            tensor = next((t for t in qnn[kind] if t["name"] == declared["name"]),
                          qnn[kind][position] if position < len(qnn[kind]) else None)
            if tensor is None:
                continue
            found.append({"name": declared["name"], "qnn_name": tensor["name"], "shape": list(tensor["shape"]),
                          "dtype": tensor["dtype"], "quantization": _quantization(tensor.get("quantization"))})
        return found
    return {"inputs": one("inputs"), "outputs": one("outputs")}


def _quantization(q: dict[str, Any] | None) -> dict[str, Any] | None:
    """A quantized tensor's encoding as qnn/binary.py reads it; a per-axis one has no single scale (null) but still
    says it is quantized, so an app never takes it for float."""
    if not q:
        return None
    extra = {k: q[k] for k in ("bitwidth", "axis", "count") if k in q}
    return {"encoding": q.get("encoding"), "scale": q.get("scale"), "offset": q.get("offset"), **extra,
            "formula": "real = scale * (q + offset)"}


def min_runtime(compat: dict[str, Any] | None, compiler_qnn: str | None) -> tuple[str | None, str]:
    """The oldest runtime QNN that loads the binary: measured by `doit compat`, else the compiler's own."""
    measured = (compat or {}).get("minimum_runtime")
    if measured:
        return measured, "compat"
    return compiler_qnn, "compiler"


def qnn_version(build_id: str | None, fallback: str | None) -> str | None:
    found = runtimelibs.version_tuple(build_id)
    return ".".join(map(str, found)) if found else fallback


def verification(records: dict[str, dict[str, Any]], pipelines: list[dict[str, Any]],
                 phone: dict[str, Any] | None) -> dict[str, Any]:
    """What was checked and with which numbers; each block says where it was measured."""
    sim = records.get("simverify") or {}
    statuses = [r.get("status") for r in [*records.values(), *pipelines] if r]
    warnings = sorted({w for r in [*records.values(), *pipelines] if r for w in r.get("warnings") or []})
    loop = records.get("loop")
    return {
        "status": Status.WARNING if Status.WARNING in statuses else Status.PASSED,
        "simulator": {"measured_on": SIMULATOR, "samples": sim.get("samples"), "metrics": _metrics(sim.get("metrics")),
                      "checks": _checks(sim.get("checks"))},
        "loop": None if loop is None else {"measured_on": SIMULATOR, "status": loop.get("status"),
                                           **{k: loop[k] for k in ("steps", "compared_steps", "first_differing_step")
                                              if k in loop},
                                           "metrics": _metrics(loop.get("metrics")),
                                           "checks": _checks(loop.get("checks"))},
        "pipelines": [{"measured_on": SIMULATOR, "graphs": p.get("graphs"), "status": p.get("status"),
                       "samples": p.get("samples"),
                       "metrics": _metrics(p.get("metrics")), "checks": _checks(p.get("checks"))} for p in pipelines],
        "phone": _phone(phone),
        "warnings": warnings,
    }


def _metrics(metrics: Any) -> dict[str, Any]:
    if not isinstance(metrics, dict):
        return {}
    return {name: {k: m[k] for k in METRIC_KEYS if k in m} if isinstance(m, dict) else m
            for name, m in sorted(metrics.items())}


def _checks(checks: Any) -> list[dict[str, Any]]:
    return [{k: c[k] for k in CHECK_KEYS if k in c} for c in checks or [] if isinstance(c, dict)]


def _phone(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Results from attached phones (`doit verify`), where they exist for this very binary."""
    if not record:
        return []
    found = []
    for entry in record.get("devices") or []:
        found.append({"measured_on": PHONE, "device": entry.get("model"), "soc_model": entry.get("soc_model"),
                      "status": entry.get("status"), "metrics": _metrics(entry.get("metrics")),
                      "checks": _checks(entry.get("checks")),
                      **{k: entry[k] for k in ("latency", "rtf") if k in entry}})
    return found


def cpu_reference(cpucheck: dict[str, Any] | None) -> dict[str, Any]:
    """How the CPU fallback compares with the original model (the cpucheck stage)."""
    record = cpucheck or {}
    return {"measured_on": CPU, "samples": record.get("samples"), "metrics": _metrics(record.get("metrics"))}


def sherpa_onnx(loop: dict[str, Any], declared: list[dict[str, Any]], shipped: dict[str, Any]) -> dict[str, Any]:
    """`sherpa_onnx`: a transducer loop's three graphs as an app hands them to sherpa-onnx's OnlineTransducerModelConfig
    (encoder, decoder, joiner; the EPContext ONNX each, which ONNX Runtime's QNN provider loads, and the context
    binary it wraps), one config per chip and precision where all three ship; the tokens file; the greedy search's
    parameters as the loop verified them; and the encoder's states (fed back from its outputs, zeros at the start)."""
    search = loop["transducer"]
    roles = {"encoder": loop["graph"], "decoder": search["decoder"], "joiner": search["joiner"]}
    io = {g["name"]: g["io"] for g in declared}
    encoder_io = io[roles["encoder"]]
    states = [{"input": name, "output": output, "shape": list(t["shape"]), "dtype": t["dtype"], "start": 0}
              for name, output in loop["feed"].items() for t in encoder_io["inputs"] if t["name"] == name]
    features = next(t for t in encoder_io["inputs"] if t["name"] not in loop["feed"])
    frames = next(t for t in encoder_io["outputs"] if t["name"] == search["frames"])
    configs = []
    binaries = {role: {(b["soc"], b["precision"]): b for b in (shipped.get(name) or {}).get("binaries") or []}
                for role, name in roles.items()}
    for soc, precision in sorted(binaries["encoder"]):
        found = {role: binaries[role].get((soc, precision)) for role in roles}
        if not all(found.values()):
            continue  # a graph of the three did not ship for this chip: no config there
        configs.append({"soc": soc, "precision": precision, "provider": "qnn",
                        "transducer": {role: b["ort"]["ctx_onnx"] for role, b in found.items()},
                        "context_binaries": {role: b["path"] for role, b in found.items()},
                        "provider_options": {role: b["ort"]["provider_options"] for role, b in found.items()}})
    return {"kind": SHERPA_KIND, "tokens": TOKENS_FILE, "graphs": roles, "configs": configs,
            "decoding": {"decoding_method": "greedy_search", "blank_id": search["blank"],
                         "context_size": search["context"], "max_symbols_per_frame": search["max_symbols"],
                         "vocab_size": search["vocabulary"], "chunk_size": features["shape"][1],
                         "feature_dim": features["shape"][-1], "frames_per_chunk": frames["shape"][1]},
            "tensors": {"encoder": {"features": features["name"], "encoder_out": frames["name"], "states": states},
                        "decoder": {"y": io[roles["decoder"]]["inputs"][0]["name"],
                                    "decoder_out": io[roles["decoder"]]["outputs"][0]["name"]},
                        "joiner": {"encoder_out": io[roles["joiner"]]["inputs"][0]["name"],
                                   "decoder_out": io[roles["joiner"]]["inputs"][1]["name"],
                                   "logit": io[roles["joiner"]]["outputs"][0]["name"]}}}
