"""ONNX Runtime's own package format, written from a package's manifest: `dist/<model>/onnxruntime/`.

    onnxruntime/
      manifest.json                              ONNX Runtime's ModelPackage manifest (schema_version "1.0")
      <graph>/<SOC>.<precision>/                 one variant per verified binary (EP QNNExecutionProvider, npu):
        <graph>.<precision>_ctx.onnx               its EPContext wrapper and the binary it names, beside it
        <graph>.<precision>.bin
      <graph>/cpu/<graph>.onnx                   the CPU fallback (EP CPUExecutionProvider, cpu) and its data files

One component per graph of the manifest (a size of a graph with sizes and a part of a split graph are graphs of
their own), its variants in the model's precision order, then by chip, then the CPU; ONNX Runtime breaks a tie
between equal scores by that order. What the app needs beyond one graph (sizes, chains, split parts, loops) goes
into `additional_metadata`. Every file is the package's own, hard-linked (copied where the file system has no hard
links), checked against the SHA-256 the manifest gives it. Layout and how an app opens it: docs/shipping.md.

The JSON is written here rather than by `onnxruntime.ModelPackage`'s writer: the writer resolves variant folders
against the process's working directory, places no file itself (a commit to a new folder fails on the missing
variant folders) and copies shared assets; written here, the bytes are fixed (fixed key order, no paths of this
machine) and every file is a link. ONNX Runtime then opens the result strictly (`check`), so its parser, not ours,
is the judge of the format.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

from qnn_tasks.errors import StageError
from qnn_tasks.ship.aipack import place

FOLDER = "onnxruntime"
SCHEMA_VERSION = "1.0"
QNN_EP = "QNNExecutionProvider"
CPU_EP = "CPUExecutionProvider"
CPU_VARIANT = "cpu"
NAMESPACE = "ort"  # executor_info's key for ONNX Runtime's own payload (model_file, provider/session options)
SESSION = {"session.disable_cpu_ep_fallback": "1"}  # a QNN variant runs its binary, nothing else (the docs' snippet)


def write(manifest: Mapping[str, Any], inventory: Mapping[str, Any], package_root: Path,
          dest: Path) -> dict[str, Any]:
    """Write the ModelPackage of the package at `package_root` (its manifest `manifest`) into `dest` (not there yet);
    `inventory` gives what the manifest does not hold: the chains' feeds and the loop. Returns the facts."""
    root, files = Path(package_root), manifest["files"]
    dest.mkdir(parents=True)
    order = list((manifest.get("selection") or {}).get("precision_order") or ())
    components: dict[str, Any] = {}
    for name, graph in (manifest.get("graphs") or {}).items():
        variants: dict[str, Any] = {}
        binaries = sorted(graph["binaries"], key=lambda b: (_rank(order, b["precision"]), b["soc"]))
        for binary in binaries:
            variants[f"{binary['soc']}.{binary['precision']}"] = _npu_variant(name, binary, root, dest, files)
        variants[CPU_VARIANT] = _cpu_variant(name, graph["fallback"], root, dest, files)
        components[name] = {"variants": variants, "additional_metadata": _sorted(_graph_facts(name, graph, manifest,
                                                                                               inventory))}
    data = {"schema_version": SCHEMA_VERSION, "package_name": manifest["model"],
            **({"package_version": v} if (v := (manifest.get("source") or {}).get("version")) else {}),
            "description": manifest.get("description") or manifest["model"], "layout": "portable",
            "components": components, "additional_metadata": _sorted(_package_facts(manifest, inventory))}
    text = (json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()
    (dest / "manifest.json").write_bytes(text)
    return {"dir": str(dest), "components": len(components),
            "variants": sum(len(c["variants"]) for c in components.values()),
            "sha256": hashlib.sha256(text).hexdigest()}


def summary(facts: Mapping[str, Any]) -> str:
    """The one line dist prints about it."""
    return (f"ONNX Runtime ModelPackage {FOLDER}/: {facts['components']} component(s), {facts['variants']} "
            f"variant(s) (QNN per chip and precision, and the CPU)" + (f"; {facts['check']}" if facts.get("check") else ""))


def check(dest: Path) -> str:
    """Open the written package as ONNX Runtime does, strictly (unknown fields refused); the line that says how, or
    why not (an onnxruntime without ModelPackage: before 1.32)."""
    import onnxruntime as ort

    if not hasattr(ort, "ModelPackage"):
        return f"not opened here: onnxruntime {ort.__version__} has no ModelPackage (1.32 or newer opens it)"
    try:
        ort.ModelPackage.open(str(dest), strict_unknown_fields=True)
        ort.ModelPackageContext(str(dest))
    except Exception as err:  # noqa: BLE001 - whatever ONNX Runtime refuses is a bug here, named in one line
        raise StageError(f"{dest / 'manifest.json'}: ONNX Runtime {ort.__version__} refuses it: {err} (a bug in dist: "
                         "please report it)") from None
    return f"opened strictly by onnxruntime {ort.__version__}"


def _rank(order: list[str], precision: str) -> int:
    return order.index(precision) if precision in order else len(order)


def _link(root: Path, rel: str, sha: str, target: Path) -> None:
    """The package's file `rel` at `target`, the bytes the manifest vouches for."""
    source = root / rel
    if _sha256(source) != sha:
        raise StageError(f"{source}: its SHA-256 is not the manifest's: the ONNX Runtime package is not written "
                         "(fix: rerun doit dist; never edit a package by hand)")
    place(source, target)


def _sha256(path: Path) -> str:
    from qnn_tasks.run import records

    return records.sha256(path)


def _npu_variant(graph: str, binary: Mapping[str, Any], root: Path, dest: Path,
                 files: Mapping[str, Any]) -> dict[str, Any]:
    folder = f"{graph}/{binary['soc']}.{binary['precision']}"
    wrapper, options = binary["ort"]["ctx_onnx"], binary["ort"]["provider_options"]
    _link(root, binary["path"], binary["sha256"], dest / folder / Path(binary["path"]).name)
    _link(root, wrapper, files[wrapper]["sha256"], dest / folder / Path(wrapper).name)  # names the binary beside it
    provider = json.loads((root / options).read_text())
    info = {"model_file": Path(wrapper).name, "session_options": dict(SESSION), "provider_options": provider}
    variant: dict[str, Any] = {"variant_directory": folder, "ep": QNN_EP, "device": "npu"}
    if binary.get("ep_compatibility_info"):  # read from the _ctx.onnx by dist: what ORT hands the EP to score
        variant["compatibility_string"] = binary["ep_compatibility_info"]
    variant["executor_info"] = {NAMESPACE: info}
    facts = {k: binary.get(k) for k in ("soc", "socs", "soc_model", "dsp_arch", "precision", "sha256", "size",
                                        "qnn_version", "min_runtime_qnn", "min_runtime_from", "target")}
    facts.update(htp_arch=provider.get("htp_arch"), binary=Path(binary["path"]).name, manifest_path=binary["path"],
                 verification=(binary.get("verification") or {}).get("status"))
    variant["additional_metadata"] = _sorted(facts)
    return variant


def _cpu_variant(graph: str, fallback: Mapping[str, Any], root: Path, dest: Path,
                 files: Mapping[str, Any]) -> dict[str, Any]:
    folder = f"{graph}/{CPU_VARIANT}"
    _link(root, fallback["path"], fallback["sha256"], dest / folder / Path(fallback["path"]).name)
    for rel in fallback.get("data_files") or ():  # its weights, beside it as its `location` names them
        _link(root, rel, files[rel]["sha256"], dest / folder / Path(rel).name)
    return {"variant_directory": folder, "ep": CPU_EP, "device": "cpu",
            "executor_info": {NAMESPACE: {"model_file": Path(fallback["path"]).name}},
            "additional_metadata": _sorted({"sha256": fallback["sha256"], "size": fallback["size"],
                                            "manifest_path": fallback["path"], "when": fallback.get("when"),
                                            "data_files": [Path(r).name for r in fallback.get("data_files") or ()]})}


def _graph_facts(name: str, graph: Mapping[str, Any], manifest: Mapping[str, Any],
                 inventory: Mapping[str, Any]) -> dict[str, Any]:
    """A component's own facts: its tensors, which size or part it is, the loop it runs in, what was left out."""
    facts: dict[str, Any] = {"inputs": graph["inputs"], "outputs": graph["outputs"]}
    for key in ("size", "part"):
        if graph.get(key):
            facts[key] = graph[key]
    loop = _loop(inventory)
    if loop and name in loop["components"]:
        facts["loop"] = {k: loop[k] for k in ("feed", "start")}
    facts["omitted"] = [o for o in manifest.get("omitted") or () if o.get("graph") == name]
    return facts


def _package_facts(manifest: Mapping[str, Any], inventory: Mapping[str, Any]) -> dict[str, Any]:
    """What an app needs beyond one component: how to choose, the sizes, the chains, the split parts, the loop."""
    selection = manifest.get("selection") or {}
    feeds = {c["name"]: c.get("feeds") or [] for c in inventory.get("chains") or ()}
    facts: dict[str, Any] = {
        "generated_by": f"qnn-npu-compile {(manifest.get('tool') or {}).get('version')} from ../manifest.json",
        "licence": manifest.get("licence"), "qnn_version": (manifest.get("toolchain") or {}).get("qnn"),
        "variants": "<SOC>.<precision> per verified binary (its ro.soc.model and precision), in precision order, "
                    "then cpu: the graph's CPU fallback",
        "precision_order": selection.get("precision_order"), "rule": selection.get("rule"),
        "sizes": selection.get("sizes") or [], "splits": selection.get("splits") or [],
        "pipelines": [{**p, "feeds": feeds.get(p["name"], [])} for p in manifest.get("pipelines") or ()],
    }
    loop = _loop(inventory)
    facts["loops"] = [loop] if loop else []
    return facts


def _loop(inventory: Mapping[str, Any]) -> dict[str, Any] | None:
    """The model's loop, with the components it runs (its graph, or each size of it)."""
    loop = inventory.get("loop")
    if not loop:
        return None
    graphs = [g["name"] for g in inventory.get("graphs") or ()
              if g["name"] == loop["graph"] or (g.get("sizes") or {}).get("graph") == loop["graph"]]
    kept = {k: v for k, v in loop.items() if k != "tokens_file"}  # a path of the project: the package has tokens.txt
    return {**kept, "components": graphs,
            "rule": "run the component step after step; after each step feed every output named in feed back into "
                    "its input (input <- output); start holds inputs at the pipeline's last outputs"}


def _sorted(value: Any) -> Any:
    """Nested facts with their keys sorted: the bytes never depend on the order a dict was built in."""
    return json.loads(json.dumps(value, sort_keys=True, allow_nan=False))
