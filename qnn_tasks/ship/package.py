"""`doit dist`: dist/<model>/ from what was verified, and only that; whole or not at all; incremental.

The package is assembled in a hidden folder beside its final place and renamed onto it at the end: an
interrupted dist leaves a `.<model>.dist-<host>-<pid>` folder (removed by the next dist once that process is gone),
never a package that looks finished. One dist at a time writes a model's package into a folder (distlock.py): two
projects sharing QNN_DIST wait for or refuse each other, in one line, instead of removing each other's work.
A write the machine refuses is one line, the package before kept.
A file whose bytes the previous package already holds is hard-linked from it instead of copied (a binary
unchanged since the last dist costs a link). Every copy is hashed against the digest its record
vouches for: a binary that changed since it was verified is left out (read as the report reads it: stale),
and one that changes while being copied fails the dist. Package layout and fields: docs/shipping.md.
"""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from qnn_tasks.errors import MachineError, SpecError, StageError, machine_failure
from qnn_tasks.graphs import memory
from qnn_tasks.latency import shown as latency_shown
from qnn_tasks.qnn import loadoracle
from qnn_tasks.run import records
from qnn_tasks.run.calls import StageCall
from qnn_tasks.ship import aipack, claims, distlock, modelpackage, runtime, verified
from qnn_tasks.ship import manifest as mf
from qnn_tasks.ship.card import card

ENV = "QNN_DIST"              # where packages go (a folder; wins over the profile's setting)
SETTING = "dist"             # settings.dist in the first toolchain profile: a folder inside the project
DEFAULT = "dist"
STEP_FIGURES = ("share", "binary_bytes", "min_cosine", "passed")  # of each repair step, in the manifest
HTP_BACKEND = "libQnnHtp.so"
SYSTEM_LIB = "libQnnSystem.so"
FALLBACK_WHEN = ("no binary was verified for the device's chip, its runtime QNN is older than the binary's, or the "
                 "context fails to load")


def dist_root(settings: dict[str, Any], profile_file: Path, root: Path, env: dict[str, str] | None = None) -> Path:
    """$QNN_DIST (the user's own choice, anywhere), else settings.dist (confined to the project), else dist/."""
    env = os.environ if env is None else env
    if env.get(ENV):
        return Path(env[ENV]).expanduser().resolve()
    value = settings.get(SETTING, DEFAULT)
    if not isinstance(value, str) or not value or Path(value).is_absolute():
        raise SpecError(profile_file, f"settings.{SETTING}", f"expected a folder inside the project, got {value!r}",
                        f"a relative path such as {DEFAULT}, or set {ENV}=<folder> for a place outside it")
    path = (root / value).resolve()
    if path != root.resolve() and root.resolve() not in path.parents:
        _symlink_out(root, value, path)
    if path == root.resolve() or root.resolve() not in path.parents:
        raise SpecError(profile_file, f"settings.{SETTING}", f"'{value}' leaves the project folder or is the folder "
                        "itself", f"a sub-folder such as {DEFAULT}, or set {ENV}=<folder> for a place outside it")
    return path


def _symlink_out(root: Path, value: str, resolved: Path) -> None:
    """A `dist/` (or a folder on the way to it) that is a symlink out of the project is the symlink's doing, not the
    profile's: name the link and the two ways on (QNN_DIST for a place outside on purpose)."""
    link = Path(root)
    for part in Path(value).parts:
        link = link / part
        if link.is_symlink():
            raise SpecError(link, "", f"a symlink to {os.readlink(link)}, outside the project folder: packages are "
                            f"written only inside it unless {ENV} says where",
                            f"remove the symlink, or set {ENV}={resolved} to write packages there on purpose")


class _Assembly:
    """The package being written in `tmp`, linking unchanged files from the previous package `old`."""

    def __init__(self, tmp: Path, old: Path | None) -> None:
        self.tmp, self.old = tmp, old
        self.files: dict[str, dict[str, Any]] = {}
        self.copied = self.linked = 0

    def _reuse(self, rel: str, sha: str) -> bool:
        previous = self.old / rel if self.old else None
        if previous is None or not previous.is_file() or previous.is_symlink() or records.sha256(previous) != sha:
            return False
        os.link(previous, self.tmp / rel)
        self.linked += 1
        return True

    def _target(self, rel: str) -> Path:
        path = self.tmp / rel
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise StageError(f"dist: '{rel}' would leave the package (a bug in dist: please report it)")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def copy(self, src: Path, rel: str, sha: str | None = None) -> dict[str, Any]:
        """Place `src` at `rel`; with `sha`, the bytes must be the ones its record vouches for."""
        path = self._target(rel)
        expected = sha or records.sha256(src)
        if not self._reuse(rel, expected):
            shutil.copyfile(src, path)
            self.copied += 1
            if records.sha256(path) != expected:
                raise StageError(f"dist: {src} is not the file its record vouches for (its SHA-256 changed while it "
                                 "was copied): refused (fix: rerun doit, then doit dist)")
        self.files[rel] = {"size": path.stat().st_size, "sha256": expected}
        return self.files[rel]

    def put(self, data: bytes, rel: str) -> dict[str, Any]:
        import hashlib

        path = self._target(rel)
        sha = hashlib.sha256(data).hexdigest()
        if not self._reuse(rel, sha):
            write_bytes(path, data)
            self.copied += 1
        self.files[rel] = {"size": len(data), "sha256": sha}
        return self.files[rel]


def write_bytes(path: Path, data: bytes) -> None:
    """Path.write_bytes, whose error names the file (a full disk's write() error names none)."""
    try:
        path.write_bytes(data)
    except OSError as err:
        if err.filename is None:
            err.filename = str(path)
        raise


def write(inventory: dict[str, Any], root: Path, dest_root: Path, cache_dir: Path) -> dict[str, Any]:
    """Write dest_root/<model>/ from the inventory's verified targets; return what was done (for the one line).

    A write the machine refuses (ENOSPC, EDQUOT, EROFS, EIO) or the folder forbids (EACCES) anywhere here is one
    line naming the path (the package's, not the hidden folder's), the reason and the fix; the package before
    stays as it was."""
    model = inventory["model"]
    ship, omitted, graph_records = verified.sort_out(inventory)
    if not ship:
        reasons = "; ".join(f"{o['target']}: {o['reason']}" for o in omitted[:3]) or "no chip targets"
        raise StageError(f"nothing verified to ship for {model} ({reasons}) (fix: run doit until the report passes)")
    dest = dest_root / model
    _check_folder(dest_root)
    tmp = distlock.work_folder(dest_root, model, "dist")
    try:
        dest_root.mkdir(parents=True, exist_ok=True)
        with distlock.ModelLock(dest_root, model, root):
            _check_replaceable(dest)
            return _write_locked(inventory, ship, omitted, graph_records, root, dest, tmp, cache_dir)
    except OSError as err:
        raise _refused(err, tmp, dest) from None


def _write_locked(inventory, ship, omitted, graph_records, root: Path, dest: Path, tmp: Path,
                  cache_dir: Path) -> dict[str, Any]:
    """The package, written while this process holds the model's lock in its folder."""
    dest_root, model = dest.parent, dest.name
    notes = []
    for leftover, why in distlock.leftovers(dest_root, model, "dist"):  # an interrupted dist's folder: no package
        if why is None:
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            notes.append(f"{leftover.name} left in place ({why}); remove it once that dist has ended")
    previous = dest if dest.is_dir() else next((old for old, why in distlock.leftovers(dest_root, model, "old")
                                                 if why is None), None)  # killed between its two renames
    tmp.mkdir()
    try:
        work = _Assembly(tmp, previous)
        data, line = _assemble(inventory, ship, omitted, graph_records, work, root, cache_dir)
        rows = {soc: SimpleNamespace(platform=platform) for soc, platform in inventory["platforms"].items()}
        pack = aipack.write(data, tmp, tmp / "android", delivery=inventory["ship"]["delivery"], socs=rows)
        ort_package = modelpackage.write(data, inventory, tmp, tmp / modelpackage.FOLDER)  # a view of the manifest
        ort_package["check"] = modelpackage.check(tmp / modelpackage.FOLDER)
        _swap(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old, why in distlock.leftovers(dest_root, model, "old"):
        if why is None:  # a dead dist's package moved aside: this package replaces it
            shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(distlock.work_folder(dest_root, model, "old"), ignore_errors=True)
    binaries = [b for g in data["graphs"].values() for b in g["binaries"]]
    return {"model": model, "dest": str(dest), "binaries": len(binaries),
            "socs": sorted({b["soc"] for b in binaries}), "omitted": data["omitted"], "runtime_line": line,
            "bytes": sum(f["size"] for f in data["files"].values()), "copied": work.copied, "linked": work.linked,
            "aipack_line": aipack.summary(pack), "modelpackage_line": modelpackage.summary(ort_package), "notes": notes}


def _check_folder(dest_root: Path) -> None:
    """The packages' folder must be a folder, or a path where one can be made: not a file, nor below one."""
    for path in (dest_root, *dest_root.parents):
        if path.exists() or path.is_symlink():
            if not path.is_dir():
                kind = "a file" if path.exists() else "a symlink to nothing"
                below = "" if path == dest_root else f" (the packages' folder {dest_root} would be below it)"
                raise StageError(f"{path}: is {kind}, not a folder{below}: nothing was written (fix: set {ENV} to "
                                 "a folder, made if missing; or move the file away)")
            return


def _refused(err: OSError, tmp: Path, dest: Path) -> Exception:
    """A write dist could not make, as one line naming the package's path, the reason and the fix; else `err`."""
    if err.errno not in (errno.EACCES, errno.EPERM) and not machine_failure(err):
        return err  # not the machine's nor the folder's: a bug, with its traceback
    named = err.filename2 if err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) and err.filename2 else None
    where = str(named or err.filename or dest)  # shutil's copy names its source first: the full disk is the target's
    if where == str(tmp) or where.startswith(f"{tmp}{os.sep}"):
        where = str(dest / os.path.relpath(where, tmp))
    kept = "the package before is kept" if dest.is_dir() else "no package was written"
    failed = OSError(err.errno, err.strerror, where)
    if machine_failure(failed):
        return MachineError(failed, f"nothing shipped, {kept}")
    folder = dest.parent
    ours = Path(where) in (folder, *folder.parents) or folder in Path(where).parents  # the packages' folder
    fix = (f"set {ENV} to a folder you can write, or give yourself write access to this one" if ours
           else "check who may read it")
    return StageError(f"nothing shipped, {kept}: {where}: {err.strerror} (fix: {fix})")


def _assemble(inventory, ship, omitted, graph_records, work: _Assembly, root: Path, cache_dir: Path):
    """Every file of the package into `work`, manifest.json last; returns (manifest, the runtime libs' line)."""
    toolchain = inventory["toolchain"]
    compiler_qnn = compiler_version(toolchain, ship)
    splits = mf.splits(inventory["graphs"], graph_records, verified.graph_ok)
    graphs = {g["name"]: _graph(g, graph_records[g["name"]], work, root) for g in inventory["graphs"]
              if verified.graph_ok(graph_records[g["name"]]) and mf.ships_alone(g, splits)}
    # else its chips are in `omitted` with the reason; a split graph ships as its parts (selection.splits)
    archs, manifests = set(), {}
    for item in sorted(ship, key=lambda s: (s.chip["graph"], s.chip["soc"]["name"], s.chip["precision"])):
        graph = next(g for g in inventory["graphs"] if g["name"] == item.chip["graph"])
        entry = _binary(item, graph, work, root, compiler_qnn)
        latency = latency_shown.latency_ms((graph_records[graph["name"]] or {}).get("lint"), item.chip["soc"]["name"],
                                           item.chip["precision"], graph.get("audio_seconds_per_sample"))
        if latency:  # an estimate from published phone timings (docs/latency.md), never a measurement
            entry["latency_ms"] = latency
        repaired = item.records.get("repair")
        if repaired:  # what the repair kept at 16 bits and how it was found (stages/repair.py)
            entry["repair"] = {"promoted": repaired.get("promoted", []), "share": repaired.get("share"),
                               "chip": repaired.get("chip"), "steps": [
                                   {"promoted": len(s["promoted"]), **{k: s.get(k) for k in STEP_FIGURES}}
                                   for s in repaired.get("steps") or ()],
                               "budget": repaired.get("budget"), "plain": repaired.get("plain")}
        chose = item.records.get("choose")
        if chose:  # precision auto: this binary is the smallest candidate that passed (stages/choose.py)
            entry["auto"] = {"order": chose.get("order"), "chosen": chose["chosen"]["precision"],
                             "candidates": [{k: c.get(k) for k in ("precision", "status", "binary_bytes")}
                                            for c in chose.get("candidates") or ()],
                             "compiles": chose.get("compiles")}
        fit = memory.of_records((graph_records[graph["name"]] or {}).get("lint"), item.records["context"],
                                item.chip["precision"])
        if fit:  # what a load holds (docs/load-and-fit.md): the selectors refuse a device with less free
            entry["memory"] = fit
        graphs[graph["name"]]["binaries"].append(entry)
        archs.add(item.chip["soc"]["dsp_arch"])
        if item.chip.get("runtime_manifest"):
            manifests.setdefault(item.chip["soc"]["dsp_arch"], root / item.chip["runtime_manifest"])
    libs, copies, line = runtime.plan(sorted(archs), compiler_qnn, toolchain.get("settings") or {},
                                      Path(toolchain["file"]), root, manifests, cache_dir)
    for arch, files in sorted(copies.items()):
        for entry in libs[arch]["files"]:
            entry.update(work.copy(files[entry["name"]], entry["path"]))
    export = next((graph_records[g["name"]].get("export") for g in inventory["graphs"]), None)
    source_file = next((g["source_file"] for g in inventory["graphs"] if g.get("source_file")), None)
    data = {"schema": mf.SCHEMA, "schema_version": mf.SCHEMA_VERSION, "model": inventory["model"],
            "description": inventory["description"], "licence": inventory["licence"],
            "source": mf.source(export, source_read(export, source_file)),
            "tool": {"name": "qnn-npu-compile", "version": mf.tool_version()},
            "toolchain": toolchain_facts(toolchain, compiler_qnn),
            "selection": {"precision_order": mf.precision_order(inventory.get("ship") or {},
                                                                [s.chip["precision"] for s in ship]), "rule": mf.RULE,
                          **mf.sizes(inventory["graphs"], claims.unpadded(inventory)),
                          **({"splits": splits} if splits else {})},
            "graphs": graphs, "runtime_libs": libs, "omitted": sorted(omitted, key=lambda o: o["target"])}
    chains = claims.chains(inventory, [s.chip for s in ship], omitted)
    if chains:  # which chains run whole on which chip; an incomplete one says which graph is missing and why
        data["pipelines"] = chains
    size_notes = [{"graph": name, **note} for name in graphs
                  for note in (graph_records[name].get("export") or {}).get("size_notes") or ()]
    if size_notes:  # what a size of a graph comes from and which option changed it (the export record's notes)
        data["size_notes"] = size_notes
    loop = inventory.get("loop") or {}
    if loop.get("transducer"):  # the three binaries as sherpa-onnx's OnlineTransducerModelConfig takes them
        tokens = loop["tokens_file"]
        work.copy(root / tokens, mf.TOKENS_FILE)
        block = mf.sherpa_onnx(loop, inventory["graphs"], graphs)
        if block["configs"]:
            data["sherpa_onnx"] = block
    work.put(mf.dumps(mf.schema()), mf.SCHEMA_FILE)
    work.put(card(data).encode(), "MODEL_CARD.md")
    data["files"] = dict(sorted(work.files.items()))
    mf.validate(data)
    write_bytes(work.tmp / "manifest.json", mf.dumps(data))  # last: a folder without it is no package
    return data, line


def source_read(export: dict[str, Any] | None, source_file: str | None) -> str | None:
    """The source file's SHA-256 as the export read it (its record's `made_from`), never today's file's: a file
    edited since is another model than the one the binaries were made from."""
    read = ((export or {}).get("made_from") or {}).get("inputs")
    return read.get(source_file) if isinstance(read, dict) and source_file else None


def _graph(g: dict[str, Any], stages: dict[str, Any], work: _Assembly, root: Path) -> dict[str, Any]:
    """A verified graph's entry: its tensors and its CPU fallback (the simplified ONNX its binaries were judged by)."""
    simplified = stages["simplify"]["files"][g["simplified"]]
    fallback = work.copy(root / g["simplified"], f"cpu/{g['name']}.onnx", simplified["sha256"])
    data_files = external_data(root / g["simplified"])
    for name in data_files:  # a graph over 2 GB keeps its weights beside its .onnx
        vouched = stages["simplify"]["files"].get(str(Path(g["simplified"]).parent / name))
        if not vouched:
            raise StageError(f"dist: {g['simplified']} keeps its weights in {name}, and no record vouches for that "
                             "file (fix: rerun doit, then doit dist)")
        _same_bytes(work, (root / g["simplified"]).parent / name, f"cpu/{name}", g["name"], vouched["sha256"])
    return {"inputs": mf.tensors(g["io"]["inputs"]), "outputs": mf.tensors(g["io"]["outputs"]),
            "fallback": {"path": f"cpu/{g['name']}.onnx", **fallback, "runs_on": "CPU", "when": FALLBACK_WHEN,
                         "verified_against": mf.cpu_reference(stages.get("cpucheck")),
                         **({"data_files": [f"cpu/{name}" for name in data_files]} if data_files else {})},
            "binaries": [], **({"size": mf.size_of(g["sizes"])} if g.get("sizes") else {}),
            **({"part": g["part"]} if g.get("part") else {})}


def external_data(onnx_path: Path) -> list[str]:
    """The files an ONNX keeps its weights in (`location` of its external tensors), each a plain name beside it:
    the CPU fallback is unusable without them. A location that is a path (`../x`, `a/b`) is refused: an ONNX from a
    model folder is untrusted, and the package holds only files of its own."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    model = onnx.load(str(onnx_path), load_external_data=False)
    names = sorted({e.value for t in model.graph.initializer if uses_external_data(t) for e in t.external_data
                    if e.key == "location"})
    for name in names:
        if not name or Path(name).name != name or name in (".", ".."):
            raise StageError(f"dist: {onnx_path}: its weights' location '{name}' is not a file beside it: refused "
                             "(fix: save the model with its external data in one file beside the .onnx)")
    return names


def _same_bytes(work: _Assembly, src: Path, rel: str, graph: str, sha: str) -> None:
    """Copy a fallback's data file, whose bytes must be the ones its stage record vouches for (`sha`); two graphs
    naming one data file must mean the same bytes (one copy serves both)."""
    before = work.files.get(rel)
    if before is None:
        work.copy(src, rel, sha)
    elif sha != before["sha256"]:
        raise StageError(f"dist: {graph}'s CPU fallback keeps its weights in '{Path(rel).name}', and another graph "
                         "of the package has a different file of that name (fix: give each graph's external data "
                         "its own file name at export)")


def _binary(item: verified.Shippable, graph: dict[str, Any], work: _Assembly, root: Path,
            compiler_qnn: str | None) -> dict[str, Any]:
    """One verified binary into the package (with its EPContext wrapper and provider options) and its entry."""
    from qnn_tasks.stages import compattable

    chip, context = item.chip, item.records["context"]
    soc, precision = chip["soc"], chip["precision"]
    stem = f"{soc['name']}/{chip['graph']}.{precision}"
    binary = work.copy(root / chip["binary"], f"{stem}.bin", context["files"][chip["binary"]]["sha256"])
    wrapper, ep_info = _wrapper(root / chip["ctx_onnx"], context["files"][chip["ctx_onnx"]]["sha256"],
                                f"{chip['graph']}.{precision}.bin")
    work.put(wrapper, f"{stem}_ctx.onnx")
    options = records.read(root / chip["provider_options"]) or {}
    work.put(mf.dumps(provider_options(options, soc)), f"{stem}.provider_options.json")
    info = context.get("binary") or {}
    build_qnn = mf.qnn_version(info.get("build_id"), compiler_qnn)
    minimum, minimum_from = mf.min_runtime(compattable.lookup(binary["sha256"]), build_qnn)
    phone = records.read(root / chip["device_records"]["verify"])
    if phone and (phone.get("binary") or {}).get("sha256") != binary["sha256"]:
        phone = None  # results of another build of this target
    return {"soc": soc["name"], "socs": [soc["name"]], "soc_model": soc["soc_id"], "dsp_arch": soc["dsp_arch"],
            "precision": precision, "path": f"{stem}.bin", **binary,
            "qnn_build_id": info.get("build_id"), "qnn_version": build_qnn, "ep_compatibility_info": ep_info,
            "min_runtime_qnn": minimum, "min_runtime_from": minimum_from,
            "io": mf.binary_io(context, graph["io"]),
            "ort": {"ctx_onnx": f"{stem}_ctx.onnx", "provider_options": f"{stem}.provider_options.json"},
            "sherpa_onnx": {"context_binary": f"{stem}.bin", "backend_lib": HTP_BACKEND, "system_lib": SYSTEM_LIB},
            "target": chip["target"], "verification": mf.verification(item.records, item.pipelines, phone)}


def compiler_version(toolchain: dict[str, Any], ship: list[verified.Shippable]) -> str | None:
    """The QNN version that compiled the binaries, as they say themselves (their build id); else the toolchain's
    (ort-qnn) or its SDK's (qairt). What the phone's runtime libraries must match."""
    builds = sorted({v for s in ship if (v := mf.qnn_version((s.records["context"].get("binary") or {}).get(
        "build_id"), None))})
    if len(builds) > 1:
        raise StageError(f"dist: the binaries were built by several QNN versions ({', '.join(builds)}): one package "
                         "holds one (fix: rebuild them with one toolchain)")
    version = builds[0] if builds else toolchain.get("qnn") or (toolchain.get("sdk") or {}).get("version")
    found = runtime.runtimelibs.version_tuple(version)
    return ".".join(map(str, found)) if found else version


def toolchain_facts(toolchain: dict[str, Any], qnn: str | None) -> dict[str, Any]:
    """Which toolchain compiled the binaries: its id, kind, QNN and package versions, options; no local paths."""
    facts = {"id": toolchain["id"], "kind": toolchain["kind"], "qnn": qnn, "options": toolchain.get("options") or {}}
    facts.update({k: toolchain[k] for k in ("onnxruntime", "onnxruntime-qnn") if k in toolchain})
    if isinstance(toolchain.get("sdk"), dict):
        facts["sdk"] = {k: toolchain["sdk"].get(k) for k in ("version", "folder")}
    return facts


def provider_options(compiled: dict[str, Any], soc: dict[str, Any]) -> dict[str, str]:
    """onnxruntime QNN EP options for the phone: the chip's, the HTP backend by name (beside the app's libs)."""
    options = {k: str(v) for k, v in compiled.items() if k not in ("backend_path", "profiling_file_path")}
    options.update(backend_path=HTP_BACKEND, soc_model=str(soc["soc_id"]), htp_arch=soc["dsp_arch"].lstrip("v"))
    return dict(sorted(options.items()))


def _wrapper(ctx_onnx: Path, sha: str, binary_name: str) -> tuple[bytes, str | None]:
    """The EPContext wrapper pointing at the binary beside it (onnxruntime refuses '..' and absolute paths there), and
    the QNN EP's ep_compatibility_info it carries (what ONNX Runtime's variant selector hands the EP)."""
    import onnx

    if records.sha256(ctx_onnx) != sha:
        raise StageError(f"dist: {ctx_onnx} changed since its record was written: refused (fix: rerun doit)")
    model = onnx.load(str(ctx_onnx), load_external_data=False)
    for node in model.graph.node:
        for attribute in node.attribute:
            if node.op_type == "EPContext" and attribute.name == "ep_cache_context":
                attribute.s = binary_name.encode()
    for prop in model.metadata_props:
        if prop.key == "qnn_tasks.binary":
            prop.value = binary_name
    ep_info = next((p.value for p in model.metadata_props if p.key == loadoracle.EP_KEY), None)
    return model.SerializeToString(deterministic=True), ep_info


def _check_replaceable(dest: Path) -> None:
    """Only a package dist wrote is replaced: a folder of the user's own is never deleted."""
    if not dest.exists() and not dest.is_symlink():
        return
    facts = records.read(dest / "manifest.json") if dest.is_dir() and not dest.is_symlink() else None
    if not facts or facts.get("schema") != mf.SCHEMA:
        raise StageError(f"{dest}: exists and is not a package written by doit dist (no manifest.json of "
                         f"{mf.SCHEMA}): refusing to replace it (fix: move it away, or set {ENV}=<another folder>)")


def _swap(tmp: Path, dest: Path) -> None:
    """The finished folder takes the package's place; the old one is moved aside first (back again when the new one
    cannot take its place), removed after."""
    if not dest.exists():
        tmp.rename(dest)
        return
    aside = distlock.work_folder(dest.parent, dest.name, "old")
    dest.rename(aside)
    try:
        tmp.rename(dest)
    except BaseException:
        aside.rename(dest)
        raise


def run_call(call: StageCall) -> dict[str, Any]:
    """`doit dist:<model>`: the model's inventory read from today's spec and records (as the report reads them), its
    package written where the first toolchain's profile (or $QNN_DIST) says, and the summary printed."""
    from qnn_tasks.modelspec.load import load_project
    from qnn_tasks.plan.planner import Planner
    from qnn_tasks.ship import inventory

    a = call.args
    root = Path(a["root"])
    planner = Planner(load_project(root, a["toolchains"]))  # a warm spec cache: no YAML is read again
    profile = planner.bindings[0].profile
    done = write(inventory.of_model(planner, a["model"]), root, dist_root(profile.settings, profile.file, root),
                 Path("build") / "verify" / "runtime-libs")
    print(summary(done))
    return done


def summary(done: dict[str, Any]) -> str:
    """What dist prints: the package, what is in it, what was left out and why, the runtime libs' line."""
    omitted = "; ".join(f"{o['target']} ({o['reason']})" for o in done["omitted"])
    dest = Path(done["dest"])
    shown = os.path.relpath(dest) if Path.cwd() in dest.parents else str(dest)
    count = done["binaries"]
    binaries = f"{count} binar{'y' if count == 1 else 'ies'}"
    lines = [f"dist:{done['model']}: {shown}: {binaries} for {', '.join(done['socs'])}, "
             f"{done['bytes'] / 2**20:.1f} MiB (files written: {done['copied']}, unchanged and kept: {done['linked']})"
             + (f"; left out {len(done['omitted'])}: {omitted}" if done["omitted"] else "")]
    if done["runtime_line"]:
        lines.append(f"dist:{done['model']}: {done['runtime_line']}")
    if done.get("aipack_line"):
        lines.append(f"dist:{done['model']}: {done['aipack_line']}")
    if done.get("modelpackage_line"):
        lines.append(f"dist:{done['model']}: {done['modelpackage_line']}")
    lines.extend(f"dist:{done['model']}: {note}" for note in done.get("notes") or ())
    return "\n".join(lines)
