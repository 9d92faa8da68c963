"""The Android AI pack (issue 32, item 6): qnn_tasks/ship/aipack.py on a small package folder built here.

The package follows SHIP-CONTRACT.md's layout (manifest.json schema_version 1, <SOC>/<graph>.<precision>.bin,
cpu/<graph>.onnx, runtime-libs/<arch>/) with real tiny files: a real ONNX model as the CPU fallback, binaries of
deterministic bytes (no context binary is needed to lay out a pack). What cannot run here: Gradle, bundletool and
Play (nothing is built into an .aab or installed); the XML is checked against the element set Play's
device-targeting documentation gives, and the pack's compressed size against Python's own zipfile.
"""
from __future__ import annotations

import hashlib
import json
import random
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from qnn_tasks.errors import StageError
from qnn_tasks.ship import aipack

NS = "{http://schemas.android.com/apk/config}"
# Play's "Device targeting" documentation (developer.android.com/google/play/on-device-ai#device-targeting): every
# element and attribute of device_targeting_configuration.xml it documents.
DOCUMENTED = {"device-targeting-config": set(), "device-group": {"name"},
              "device-selector": {"ram-min-bytes", "ram-max-bytes"},
              "included-device-id": {"brand", "device"}, "excluded-device-id": {"brand", "device"},
              "required-system-feature": {"name"}, "forbidden-system-feature": {"name"},
              "system-on-chip": {"manufacturer", "model"}}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "kws",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def make_package(root: Path, *, shipped: bool = True, binary_bytes: int = 20_000) -> dict:
    """dist/<model>/ as the contract lays it out, for model tiny-kws (graph kws)."""
    rng = random.Random(7)
    files: dict[str, bytes] = {}
    binaries = []
    for soc, arch, sid, precision, socs in (("SM8650", "v75", 57, "fp16", ["SM8650"]),
                                             ("SM8650", "v75", 57, "w8a16", ["SM8650"]),
                                             ("SM7550", "v73", 64, "w8a16", ["SM7550", "SM7675"]),
                                             ("SA8255", "v73", 52, "fp16", ["SA8255"])):
        rel = f"{soc}/kws.{precision}.bin"
        # half noise, half a repeated pattern: compresses, but not to nothing
        data = bytes(rng.getrandbits(8) for _ in range(binary_bytes // 2)) + bytes(range(256)) * (binary_bytes // 512)
        files[rel] = data
        binaries.append({"soc": soc, "socs": socs, "soc_model": sid, "dsp_arch": arch, "precision": precision,
                         "path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                         "qnn_build_id": "v2.41.0.251023", "qnn_version": "2.41.0", "min_runtime_qnn": "2.41.0",
                         "min_runtime_from": "compiler", "verification": {}})
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "cpu").mkdir(parents=True)
    tiny_onnx(root / "cpu" / "kws.onnx")
    runtime = {}
    for arch in ("v73", "v75"):
        names = ["libQnnHtp.so", "libQnnSystem.so", f"libQnnHtp{arch.upper()}Stub.so", f"libQnnHtp{arch.upper()}Skel.so"]
        runtime[arch] = {"qnn_version": "2.41.0", "shipped": shipped,
                         "files": [{"name": n, "search_path": "ADSP_LIBRARY_PATH" if "Skel" in n else "LD_LIBRARY_PATH"}
                                   for n in names]}
        if shipped:
            for n in names:
                lib = root / "runtime-libs" / arch / n
                lib.parent.mkdir(parents=True, exist_ok=True)
                lib.write_bytes(f"stand-in {n} (QNN 2.41.0)\n".encode())  # the same libQnnHtp.so for both arches
    fallback = root / "cpu" / "kws.onnx"
    manifest = {"schema": "qnn-npu-compile/manifest", "schema_version": 1, "model": "tiny-kws",
                "selection": {"precision_order": ["fp16", "w8a16"],
                              "rule": "exact chip, then precision order, runtime >= binary, load or CPU"},
                "graphs": {"kws": {"inputs": [{"name": "x", "shape": [1, 16], "dtype": "float32", "quantization": None}],
                                   "outputs": [{"name": "y", "shape": [1, 16], "dtype": "float32",
                                                "quantization": None}],
                                   "fallback": {"path": "cpu/kws.onnx", "sha256": sha(fallback),
                                                "size": fallback.stat().st_size, "runs_on": "CPU"},
                                   "binaries": binaries}},
                "runtime_libs": runtime, "omitted": []}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


@pytest.fixture
def package(tmp_path) -> tuple[Path, dict]:
    root = tmp_path / "dist" / "tiny-kws"
    return root, make_package(root)


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_pack_layout_targeting_and_files_follow_the_manifest(package):
    root, manifest = package
    facts = aipack.write(manifest, root, root / "android")
    android = root / "android"
    assets = android / "tiny_kws" / "src" / "main" / "assets"

    # the XML: well-formed, only documented elements and attributes, a group per phone chip, both spellings
    doc = ET.parse(android / "device_targeting_configuration.xml").getroot()
    assert doc.tag == f"{NS}device-targeting-config"
    for element in doc.iter():
        assert element.tag.startswith(NS), element.tag
        name = element.tag[len(NS):]
        assert name in DOCUMENTED and set(element.attrib) <= DOCUMENTED[name], (name, element.attrib)
    groups = {g.get("name"): g for g in doc.findall(f"{NS}device-group")}
    assert list(groups) == ["SM7550", "SM7675", "SM8650"]  # SA8255: platform automotive, left out
    for soc, group in groups.items():
        selectors = group.findall(f"{NS}device-selector")
        assert len(selectors) <= 5  # Play: up to 5 selectors per group
        chips = [(s.get("manufacturer"), s.get("model")) for sel in selectors for s in sel]
        assert sorted(chips) == [("QTI", soc), ("Qualcomm", soc)]
    assert facts["left_out"] == [{"soc": "SA8255", "reason": "platform automotive in the SoC table: Play serves phones"}]

    # every group has a folder and every folder a group (+ the undeclared default "other")
    folders = {p.name.split("#group_", 1)[1] for p in assets.iterdir()}
    assert all(p.name.startswith("tiny-kws#group_") for p in assets.iterdir())
    assert folders == set(groups) | {"other"}

    # a group's files are exactly the manifest's for that chip (+ the CPU fallback + the manifest), byte for byte
    binaries = manifest["graphs"]["kws"]["binaries"]
    for group in folders:
        expected = {b["path"] for b in binaries if group in b["socs"]} | {"cpu/kws.onnx", "manifest.json"}
        got = tree(assets / f"tiny-kws#group_{group}")
        assert set(got) == expected, group
        assert json.loads(got["manifest.json"]) == manifest
        for rel in expected - {"manifest.json"}:
            assert got[rel] == (root / rel).read_bytes()
        assert facts["groups"][group]["files"] == sorted(expected)
    assert "SM8650/kws.fp16.bin" not in tree(assets / "tiny-kws#group_SM7675")  # another chip's binary never goes

    # compressed size: what Python's zipfile gets deflating the same files (level 6, as the estimate)
    for group in folders:
        folder = assets / f"tiny-kws#group_{group}"
        with zipfile.ZipFile(root / f"{group}.zip", "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
            for rel in sorted(tree(folder)):
                zf.write(folder / rel, rel)
        with zipfile.ZipFile(root / f"{group}.zip") as zf:
            packed = sum(i.compress_size for i in zf.infolist())
            raw = sum(i.file_size for i in zf.infolist())
        assert facts["groups"][group]["compressed_bytes"] == packed and facts["groups"][group]["bytes"] == raw
        assert 0 < packed < raw
    assert facts["compressed_bytes"] == max(g["compressed_bytes"] for g in facts["groups"].values())

    gradle = (android / "tiny_kws" / "build.gradle.kts").read_text()
    assert 'id("com.android.ai-pack")' in gradle and 'packName = "tiny_kws"' in gradle
    assert 'deliveryType = "install-time"' in gradle

    # the runtime libraries: a module of their own (AI packs may not hold native libraries), with the selector
    jni = android / "qnn_runtime" / "src" / "main" / "jniLibs" / "arm64-v8a"
    assert sorted(p.name for p in jni.iterdir()) == sorted(["libQnnHtp.so", "libQnnSystem.so", "libQnnHtpV73Stub.so",
                                                            "libQnnHtpV73Skel.so", "libQnnHtpV75Stub.so",
                                                            "libQnnHtpV75Skel.so"])
    assert not any(p.suffix == ".so" for p in (android / "tiny_kws").rglob("*"))
    from importlib import resources

    shipped = android / "qnn_runtime" / "src" / "main" / "java" / "qnntasks" / "ship" / "Selector.java"
    assert shipped.read_text() == (resources.files("qnn_tasks.ship") / aipack.JAVA_SELECTOR).read_text()
    readme = (android / "README.md").read_text()
    assert "useLegacyPackaging = true" in readme and "ADSP_LIBRARY_PATH" in readme and "nativeLibraryDir" in readme
    assert facts["runtime_module"]["missing"] == []
    line = aipack.summary(facts)
    assert "\n" not in line and line.startswith("AI pack tiny_kws (install-time): 3 chip group(s) (SM7550, SM7675, SM8650)")
    assert f"largest download {facts['compressed_bytes']:,} bytes compressed" in line
    assert "left out: SA8255 (platform automotive)" in line and "6 runtime libraries in qnn_runtime/" in line


def test_delivery_type_from_the_model_and_a_rewrite_is_byte_identical(package):
    root, manifest = package
    aipack.write(manifest, root, root / "android", delivery="on-demand")
    first = tree(root / "android")
    assert 'deliveryType = "on-demand"' in (root / "android" / "tiny_kws" / "build.gradle.kts").read_text()
    aipack.write(manifest, root, root / "android", delivery="on-demand")
    assert tree(root / "android") == first
    assert sorted(p.name for p in root.iterdir()) == ["SA8255", "SM7550", "SM8650", "android", "cpu", "manifest.json",
                                                      "runtime-libs"]  # no temporary folder left behind
    with pytest.raises(StageError, match="delivery 'sometimes'"):
        aipack.write(manifest, root, root / "android", delivery="sometimes")


def test_a_pack_over_the_limit_is_refused_in_one_line_and_nothing_is_written(package):
    root, manifest = package
    with pytest.raises(StageError) as err:
        aipack.write(manifest, root, root / "android", limit=15_000)
    message = str(err.value)
    assert "\n" not in message and "over Play's limit of 15,000" in message and "(fix: " in message
    assert "the SM8650 download" in message  # the largest variant: two binaries + the fallback
    assert not (root / "android").exists() and not list(root.glob(".android*"))
    assert aipack.PACK_LIMIT == 1_500_000_000


def test_a_tampered_binary_or_a_path_out_of_the_package_is_refused(package):
    root, manifest = package
    binary = root / "SM7550" / "kws.w8a16.bin"
    good = binary.read_bytes()
    data = bytearray(good)
    data[100] ^= 0xFF
    binary.write_bytes(bytes(data))
    with pytest.raises(StageError, match="SM7550/kws.w8a16.bin does not match its SHA-256"):
        aipack.write(manifest, root, root / "android")
    assert not (root / "android").exists()
    binary.write_bytes(good)
    escaping = json.loads(json.dumps(manifest))
    escaping["graphs"]["kws"]["fallback"]["path"] = "../../outside.onnx"
    with pytest.raises(StageError, match="leaves the package"):
        aipack.write(escaping, root, root / "android")


def test_runtime_libraries_not_shipped_are_listed_never_silently_missing(tmp_path):
    root = tmp_path / "tiny-kws"
    manifest = make_package(root, shipped=False)
    facts = aipack.write(manifest, root, root / "android")
    module = root / "android" / "qnn_runtime"
    assert not (module / "src" / "main" / "jniLibs").exists()
    required = (module / "RUNTIME_LIBS_REQUIRED.txt").read_text()
    assert "libQnnHtpV75Skel.so  (QNN 2.41.0, arch v75)" in required and "jniLibs/arm64-v8a/" in required
    assert facts["runtime_module"]["shipped"] == [] and "libQnnHtpV73Skel.so" in facts["runtime_module"]["missing"]
    assert "still to add" in (root / "android" / "README.md").read_text()
    assert "runtime libraries NOT shipped: qnn_runtime/RUNTIME_LIBS_REQUIRED.txt lists 6" in aipack.summary(facts)
