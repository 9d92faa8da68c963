"""The Android AI pack of a package (docs/shipping.md, "Android AI pack"): `write(manifest, package_root, dest)`.

    dest/  (dist/<model>/android/)
      device_targeting_configuration.xml    one device group per phone chip, selectors for "QTI" and "Qualcomm"
      <pack>/build.gradle.kts               com.android.ai-pack, packName, deliveryType (model.yaml ship.delivery)
      <pack>/src/main/assets/<model>#group_<SOC>/   manifest.json, the binaries listed for that chip, the CPU fallback
      <pack>/src/main/assets/<model>#group_other/   manifest.json, the CPU fallback (every other device)
      qnn_runtime/                          an Android library module: src/main/jniLibs/arm64-v8a/ (the QNN runtime
                                            libraries when the package ships them) and the Java selector
      README.md                             what the app must do (Gradle lines, native libs extracted, ADSP_LIBRARY_PATH)
AI packs hold models only (no code, no native libraries: Play's rule), hence the separate module. Chips whose SoC row
is not a phone (`platform:` automotive, iot, pc in socs.yaml) get no group. Every group also holds the CPU fallback:
the selector may refuse the NPU on a chip that has a group (runtime too old, a failed load), and the CPU must be there.
Written into a temporary folder beside `dest` and renamed; refused before anything is written when a download would
be over Play's limit of 1.5 GB compressed for one AI pack. bundletool and Play cannot run here: nothing is built.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import textwrap
import xml.etree.ElementTree as ET
import zlib
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from qnn_tasks.errors import StageError
from qnn_tasks.modelspec.specship import DELIVERY_TYPES

NS = "http://schemas.android.com/apk/config"
MANUFACTURERS = ("QTI", "Qualcomm")  # devices report either in ro.soc.manufacturer; Play matches the string exactly
PACK_LIMIT = 1_500_000_000           # bytes: Play's limit for one AI pack's compressed download (1.5 GB)
OTHER = "other"                      # the group of every device no group names (the app's bundle defaultGroup)
RUNTIME_MODULE = "qnn_runtime"
ABI = "arm64-v8a"
JAVA_SELECTOR = "java/src/main/java/qnntasks/ship/Selector.java"
_GROUP = re.compile(r"[A-Za-z0-9_]+")


def pack_name(model: str) -> str:
    """Play's AI pack names start with a letter and hold letters, digits and underscores."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", model)
    return name if name[:1].isalpha() else f"m_{name}"


def write(manifest: Mapping[str, Any], package_root: Path, dest: Path, *, delivery: str = "install-time",
          socs: Mapping[str, Any] | None = None, limit: int = PACK_LIMIT) -> dict[str, Any]:
    """Write the AI pack and the runtime module into `dest`; return the facts (groups, files, compressed sizes).
    `socs`: the project's SoC table (name -> Soc), for the rows' `platform`; default: the packaged table."""
    if delivery not in DELIVERY_TYPES:
        raise StageError(f"AI pack: delivery '{delivery}' is not one of {', '.join(DELIVERY_TYPES)} "
                         f"(fix: model.yaml ship.delivery)")
    root = Path(package_root).resolve()
    model = str(manifest["model"])
    pack = pack_name(model)
    table = socs if socs is not None else _packaged_socs()
    scans: dict[Path, tuple[str, int]] = {}

    def scanned(path: Path) -> tuple[str, int]:  # each file read once per call
        if path not in scans:
            scans[path] = scan(path)
        return scans[path]

    groups, left_out = _groups(manifest, table, root, scanned)
    fallbacks = [_entry_file(root, g["fallback"], f"graphs.{name}.fallback", scanned)
                 for name, g in (manifest.get("graphs") or {}).items() if g.get("fallback")]
    if not fallbacks:
        raise StageError(f"{root / 'manifest.json'}: graphs.*.fallback: no CPU fallback in the manifest (fix: rerun "
                         f"doit dist: every graph ships the ONNX it was verified against on the CPU)")
    manifest_text = (json.dumps(manifest, indent=2) + "\n").encode()  # each group's copy: the manifest as given
    manifest_packed = deflated_size(manifest_text)
    sizes: dict[Path, int] = {}
    facts: dict[str, Any] = {"pack": pack, "delivery": delivery, "limit_bytes": limit, "groups": {},
                             "left_out": left_out}
    contents: dict[str, list[tuple[str, Path]]] = {}
    for group, binaries in [*groups.items(), (OTHER, [])]:
        contents[group] = sorted({*binaries, *fallbacks})
        for _, path in contents[group]:
            if path not in sizes:
                sizes[path] = scanned(path)[1]
        facts["groups"][group] = {"files": sorted(["manifest.json", *(rel for rel, _ in contents[group])]),
                                  "bytes": len(manifest_text) + sum(p.stat().st_size for _, p in contents[group]),
                                  "compressed_bytes": manifest_packed + sum(sizes[p] for _, p in contents[group])}
    largest = max(facts["groups"], key=lambda g: facts["groups"][g]["compressed_bytes"])
    facts["compressed_bytes"] = facts["groups"][largest]["compressed_bytes"]  # the largest download of the pack
    if facts["compressed_bytes"] > limit:
        raise StageError(f"{dest}: AI pack {pack}: the {largest} download is {facts['compressed_bytes']:,} bytes "
                         f"compressed, over Play's limit of {limit:,} for one AI pack (fix: ship fewer binaries "
                         f"per chip, e.g. one precision, or split the model's graphs over several packs)")
    runtime = _runtime_libs(manifest, root)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent))
    try:
        assets = work / pack / "src" / "main" / "assets"
        for group, files in contents.items():
            folder = assets / f"{model}#group_{group}"
            for rel, path in files:
                place(path, folder / rel)
            (folder / "manifest.json").write_bytes(manifest_text)
        (work / pack / "build.gradle.kts").write_text(gradle(pack, delivery))
        (work / "device_targeting_configuration.xml").write_bytes(targeting_xml(groups))
        facts["runtime_module"] = _runtime_module(work / RUNTIME_MODULE, runtime, scanned)
        sized = [s.get("graph") for s in (manifest.get("selection") or {}).get("sizes") or ()]
        (work / "README.md").write_text(readme(model, pack, delivery, facts, sized))
        _replace(work, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    facts["dir"] = str(dest)
    return facts


def summary(facts: Mapping[str, Any]) -> str:
    """The one line dist prints about the pack."""
    groups = [g for g in facts["groups"] if g != OTHER]
    runtime = facts["runtime_module"]
    libs = (f"{len(runtime['shipped'])} runtime libraries in {RUNTIME_MODULE}/" if not runtime["missing"] else
            f"runtime libraries NOT shipped: {RUNTIME_MODULE}/RUNTIME_LIBS_REQUIRED.txt lists {len(runtime['missing'])}")
    left = "; left out: " + ", ".join(f"{x['soc']} ({x['reason'].split(' in ')[0]})" for x in facts["left_out"]) \
        if facts["left_out"] else ""
    return (f"AI pack {facts['pack']} ({facts['delivery']}): {len(groups)} chip group(s) ({', '.join(groups) or 'none'})"
            f" + other; largest download {facts['compressed_bytes']:,} bytes compressed (Play's limit "
            f"{facts['limit_bytes']:,}){left}; {libs}")


def scan(path: Path) -> tuple[str, int]:
    """One read of the file: its SHA-256, and its size deflated as a zip entry (raw deflate, level 6) as app bundles
    store assets, the estimate of its download."""
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(deflate.compress(chunk))
    return digest.hexdigest(), size + len(deflate.flush())


def deflated_size(data: bytes) -> int:
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    return len(deflate.compress(data)) + len(deflate.flush())


def gradle(pack: str, delivery: str) -> str:
    return (f"// The AI pack of this package (Play for On-device AI; AGP 8.8+). Generated by qnn-npu-compile.\n"
            f"plugins {{\n    id(\"com.android.ai-pack\")\n}}\n\n"
            f"aiPack {{\n    packName = \"{pack}\"\n    dynamicDelivery {{\n"
            f"        deliveryType = \"{delivery}\"\n    }}\n}}\n")


def targeting_xml(groups: Mapping[str, Any]) -> bytes:
    """device_targeting_configuration.xml: a group per chip, one selector per manufacturer spelling (a device is in a
    group when any selector matches); devices of no group get the `other` folder (not declared: Play makes it)."""
    ET.register_namespace("config", NS)
    top = ET.Element(f"{{{NS}}}device-targeting-config")
    for soc in groups:
        group = ET.SubElement(top, f"{{{NS}}}device-group", {"name": soc})
        for maker in MANUFACTURERS:
            selector = ET.SubElement(group, f"{{{NS}}}device-selector")
            ET.SubElement(selector, f"{{{NS}}}system-on-chip", {"manufacturer": maker, "model": soc})
    ET.indent(top, space="    ")
    return ET.tostring(top, encoding="utf-8", xml_declaration=True) + b"\n"


def _groups(manifest: Mapping[str, Any], table: Mapping[str, Any], root: Path, scanned: Callable[[Path], Any]
            ) -> tuple[dict[str, list[tuple[str, Path]]], list[dict[str, str]]]:
    """Phone chip -> the binaries listed for it in `socs` (every graph), each checked against its file; the chips
    left out and why."""
    listed: dict[str, list[tuple[str, Path]]] = {}
    for name, graph in (manifest.get("graphs") or {}).items():
        for i, binary in enumerate(graph.get("binaries") or []):
            found = _entry_file(root, binary, f"graphs.{name}.binaries[{i}]", scanned)
            for soc in binary.get("socs") or [binary.get("soc")]:
                listed.setdefault(str(soc), []).append(found)
    groups: dict[str, list[tuple[str, Path]]] = {}
    left_out = []
    for soc in sorted(listed):
        row = table.get(soc)
        platform = getattr(row, "platform", "phone") if row is not None else "phone"
        if platform != "phone":
            left_out.append({"soc": soc, "reason": f"platform {platform} in the SoC table: Play serves phones"})
            continue
        if not _GROUP.fullmatch(soc) or soc == OTHER:
            raise StageError(f"{root / 'manifest.json'}: soc '{soc}' cannot name a Play device group (letters, "
                             f"digits, _) (fix: rename the SoC row)")
        groups[soc] = listed[soc]
    return groups, left_out


def _runtime_libs(manifest: Mapping[str, Any], root: Path) -> list[dict[str, Any]]:
    """Every arch's runtime libraries: name, source file (when shipped), QNN version."""
    out = []
    for arch, libs in sorted((manifest.get("runtime_libs") or {}).items()):
        for f in libs.get("files") or []:
            path = None
            if libs.get("shipped"):
                path = _confined(root, f.get("path") or f"runtime-libs/{arch}/{f['name']}", f"runtime_libs.{arch}")
            out.append({"arch": arch, "name": f["name"], "qnn_version": libs.get("qnn_version"), "source": path})
    return out


def _runtime_module(module: Path, libs: list[dict[str, Any]], scanned: Callable[[Path], Any]) -> dict[str, Any]:
    """An Android library module: the runtime libraries under src/main/jniLibs/arm64-v8a/ (when shipped) and the
    Java selector; without a source the list of what is required, never a silent gap."""
    jni = module / "src" / "main" / "jniLibs" / ABI
    java = module / "src" / "main" / "java" / "qnntasks" / "ship"
    java.mkdir(parents=True)
    (java / "Selector.java").write_text((resources.files("qnn_tasks.ship") / JAVA_SELECTOR).read_text())
    (module / "src" / "main" / "AndroidManifest.xml").write_text("<manifest />\n")
    (module / "build.gradle.kts").write_text(
        "// QNN runtime libraries + the package's selector. Generated by qnn-npu-compile.\n"
        "plugins {\n    id(\"com.android.library\")\n}\n\nandroid {\n    namespace = \"qnntasks.ship.runtime\"\n"
        "    compileSdk = 35\n    defaultConfig {\n        minSdk = 31  // ro.soc.model (Build.SOC_MODEL) is API 31+\n"
        "    }\n}\n")
    placed: dict[str, Path] = {}
    missing = []
    for lib in libs:
        if lib["source"] is None:
            missing.append(lib)
            continue
        if lib["name"] in placed:
            if scanned(placed[lib["name"]])[0] != scanned(lib["source"])[0]:
                raise StageError(f"manifest.json: runtime_libs: two different {lib['name']} files (fix: ship runtime "
                                 f"libraries of one QNN version for every arch)")
            continue
        placed[lib["name"]] = lib["source"]
        place(lib["source"], jni / lib["name"])
    if missing:
        lines = [f"{m['name']}  (QNN {m['qnn_version']}, arch {m['arch']})" for m in missing]
        (module / "RUNTIME_LIBS_REQUIRED.txt").write_text(
            f"Not shipped (no runtime library source was configured for doit dist): put these files into "
            f"src/main/jniLibs/{ABI}/ before building the app:\n" + "\n".join(lines) + "\n")
    return {"dir": RUNTIME_MODULE, "shipped": sorted(placed), "missing": sorted({m["name"] for m in missing})}


def _entry_file(root: Path, entry: Mapping[str, Any], key: str, scanned: Callable[[Path], Any]) -> tuple[str, Path]:
    """A manifest file entry checked against the file: inside the package, there, same size and SHA-256."""
    path = _confined(root, str(entry["path"]), key)
    if not path.is_file():
        raise StageError(f"{root / 'manifest.json'}: {key}: {entry['path']} is missing (fix: rerun doit dist)")
    if entry.get("size") is not None and path.stat().st_size != entry["size"]:
        raise StageError(f"{root / 'manifest.json'}: {key}: {entry['path']} is {path.stat().st_size} bytes, the "
                         f"manifest says {entry['size']} (fix: rerun doit dist; never edit a package by hand)")
    if entry.get("sha256") and scanned(path)[0] != entry["sha256"]:
        raise StageError(f"{root / 'manifest.json'}: {key}: {entry['path']} does not match its SHA-256 in the "
                         f"manifest (fix: rerun doit dist; never edit a package by hand)")
    return str(entry["path"]), path


def _confined(root: Path, rel: str, key: str) -> Path:
    path = (root / rel).resolve()
    if Path(rel).is_absolute() or not path.is_relative_to(root):
        raise StageError(f"{root / 'manifest.json'}: {key}: path '{rel}' leaves the package (fix: rerun doit dist)")
    return path


def place(source: Path, target: Path) -> None:
    """A hard link where the file system allows (a binary is not copied again), else a copy."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _replace(work: Path, dest: Path) -> None:
    """Put the finished folder in place; an older `dest` is removed only after the new one is complete."""
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
        os.replace(work, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(work, dest)


def _packaged_socs() -> Mapping[str, Any]:
    from qnn_tasks.modelspec.load import load_socs, packaged_socs_file

    return load_socs(packaged_socs_file())


def readme(model: str, pack: str, delivery: str, facts: Mapping[str, Any], sized: Sequence[str] = ()) -> str:
    groups = ", ".join(g for g in facts["groups"] if g != OTHER) or "none"
    runtime = facts["runtime_module"]
    libs = (f"holds {', '.join(runtime['shipped'])}" if runtime["shipped"] else "holds no library yet")
    if runtime["missing"]:
        libs += f"; still to add: {', '.join(runtime['missing'])} (RUNTIME_LIBS_REQUIRED.txt)"
    return f"""# Android: the AI pack `{pack}` and the module `{RUNTIME_MODULE}`

Generated by qnn-npu-compile from manifest.json. Groups: {groups}; every other device gets `{model}#group_other`
(the CPU fallback). Largest download: {facts['compressed_bytes']:,} bytes compressed (Play's limit per AI pack:
{facts['limit_bytes']:,}). Delivery: {delivery} (model.yaml `ship.delivery`).

## In the app's project
- `settings.gradle.kts`: `include(":{pack}", ":{RUNTIME_MODULE}")` (this folder's two modules).
- `gradle.properties`: `android.experimental.enableDeviceTargetingConfigApi=true` (AGP 8.10+).
- The app's `build.gradle.kts`:
  ```kotlin
  android {{
      assetPacks += listOf(":{pack}")
      bundle {{
          deviceTargetingConfig = file("<path to>/device_targeting_configuration.xml")
          deviceGroup {{
              enableSplit = true
              defaultGroup = "other"
          }}
      }}
      packaging {{ jniLibs {{ useLegacyPackaging = true }} }}  // extracted: the DSP must open the Skel as a file
  }}
  dependencies {{ implementation(project(":{RUNTIME_MODULE}")) }}
  ```
- The module `{RUNTIME_MODULE}` {libs}. AI packs may not hold native libraries, so they live here, in the base APK.

## At run time, before the first QNN context is created
```kotlin
val libDir = applicationInfo.nativeLibraryDir  // where the extracted libQnnHtpV<NN>Skel.so is
android.system.Os.setenv("ADSP_LIBRARY_PATH",
    "$libDir;/vendor/lib/rfsa/adsp;/vendor/dsp/cdsp;/system/lib/rfsa/adsp;/dsp", true)
```
Without it the DSP cannot find the Skel (QNN error 14001 and the like). Then read `{model}/manifest.json` from the
pack (install-time: the AssetManager; fast-follow/on-demand: `AiPackManager.getPackLocation("{pack}")
.assetsPath()`) as text and let `qnntasks.ship.Selector.choose(manifestText, graph, Build.SOC_MODEL, <the QNN
version of the libraries above>, loader)` decide: it returns the NPU binary or the CPU fallback, always with the
reason (a truncated or edited manifest: the CPU, with the field that is wrong). The loader must report a missing
file as a failed load: Play may put a device in another group than its chip's.
{_size_note(sized)}"""


def _size_note(sized: Sequence[str]) -> str:
    """The README's word on graphs with sizes: the selector picks the size too."""
    if not sized:
        return ""
    note = (f"Graphs with sizes ({', '.join(f'`{g}`' for g in sized)}): call `Selector.chooseSize(manifest, graph, "
            f"length)` first, with the input's length along the dim. It names the size's graph to pass to `choose` "
            f"(the smallest the package ships that fits), how many positions to pad and with which value per input, "
            f"or none when the input is longer than every size and the model says `longer: skip` (refuse or split "
            f"it). The app writes no size choice of its own.")
    return "\n" + textwrap.fill(note, 116) + "\n"
