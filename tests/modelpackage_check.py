"""How a test reads a dist package's ONNX Runtime ModelPackage (dist/<model>/onnxruntime/) the way an app would:
opened strictly by onnxruntime, each component and variant agreeing with our manifest, and what the app needs
beyond one graph (sizes, split parts, chains, a loop) in its additional_metadata as the manifest says it."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnxruntime as ort


def agreement(package: Path) -> dict:
    """Every manifest binary is one QNN variant and every graph's fallback the CPU variant, same files by SHA-256;
    returns the ModelPackage's package-level additional_metadata."""
    data = json.loads((package / "manifest.json").read_text())
    ours = package / "onnxruntime"
    info = ort.ModelPackage.open(str(ours), strict_unknown_fields=True).get_info()
    context = ort.ModelPackageContext(str(ours))
    assert sorted(context.get_component_names()) == sorted(data["graphs"])
    for component in info["components"]:
        graph = data["graphs"][component["name"]]
        expected = {f"{b['soc']}.{b['precision']}": b for b in graph["binaries"]}
        variants = {v["name"]: v for v in component["variants"]}
        assert list(variants) == [*expected, "cpu"] or sorted(variants) == sorted([*expected, "cpu"])
        for name, binary in expected.items():
            v = variants[name]
            assert v["ep"] == "QNNExecutionProvider" and v["device"] == "npu"
            assert v["compatibility_string"] == binary["ep_compatibility_info"]
            assert binary["ep_compatibility_info"].startswith("v2:6:") and f":{binary['soc_model']}:" in \
                binary["ep_compatibility_info"]
            meta = json.loads(v["additional_metadata_json"])
            assert meta["soc_model"] == binary["soc_model"] and meta["htp_arch"] == binary["dsp_arch"].lstrip("v")
            folder = Path(v["variant_directory"])
            bin_file = folder / Path(binary["path"]).name
            assert hashlib.sha256(bin_file.read_bytes()).hexdigest() == binary["sha256"]
            assert bin_file.stat().st_ino == (package / binary["path"]).stat().st_ino  # a link, not a copy
            ort_info = json.loads(v["executor_info"]["ort"])
            assert (folder / ort_info["model_file"]).is_file()
            assert ort_info["provider_options"]["soc_model"] == str(binary["soc_model"])
        cpu = variants["cpu"]
        assert cpu["ep"] == "CPUExecutionProvider" and cpu["device"] == "cpu"
        onnx_file = Path(cpu["variant_directory"]) / json.loads(cpu["executor_info"]["ort"])["model_file"]
        assert hashlib.sha256(onnx_file.read_bytes()).hexdigest() == graph["fallback"]["sha256"]
        facts = json.loads((ours / "manifest.json").read_text())["components"][component["name"]]["additional_metadata"]
        for key in ("size", "part"):  # which size or part this component is, as the manifest says
            assert facts.get(key) == graph.get(key), (component["name"], key)
        assert (facts["inputs"], facts["outputs"]) == (graph["inputs"], graph["outputs"])
    package_facts = json.loads((ours / "manifest.json").read_text())["additional_metadata"]
    selection = data["selection"]
    assert package_facts["sizes"] == selection.get("sizes", [])
    assert package_facts["splits"] == selection.get("splits", [])
    assert package_facts["precision_order"] == selection["precision_order"]
    assert [{k: v for k, v in p.items() if k != "feeds"} for p in package_facts["pipelines"]] == \
        data.get("pipelines", [])
    return package_facts
