"""dist/<model>/onnxruntime/: ONNX Runtime's ModelPackage of the session's verified build (MiniLM + VAD, SM8650 +
SM8750, fp16), opened strictly by onnxruntime, its CPU variant chosen and run, agreeing with our manifest."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from modelpackage_check import agreement  # noqa: E402
from test_dist import dist, inside, tree  # noqa: E402

ort = pytest.importorskip("onnxruntime")
if not hasattr(ort, "ModelPackage"):
    pytest.skip("onnxruntime without ModelPackage (1.32 or newer)", allow_module_level=True)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def packaged(verified, tmp_path_factory):
    dest = tmp_path_factory.mktemp("mpkg")
    first = {m: dist(verified, m, dest) for m in ("minilm", "silero-vad")}
    snapshot = {m: tree(dest / m / "onnxruntime") for m in first}
    again = tmp_path_factory.mktemp("mpkg-again")
    dist(verified, "silero-vad", again)
    return {"dest": dest, "first": first, "snapshot": snapshot, "again": again}


def test_the_modelpackage_opens_strictly_and_agrees_with_the_manifest(packaged):
    for model in packaged["first"]:
        agreement(packaged["dest"] / model)
    assert "opened strictly by onnxruntime" in packaged["first"]["silero-vad"]["modelpackage_line"]


def test_the_cpu_variant_is_chosen_by_onnxruntime_and_runs_a_real_input(packaged, verified, tmp_path):
    from qnn_tasks.judge import sample_store

    root = packaged["dest"] / "silero-vad" / "onnxruntime"
    with inside(tmp_path):  # nothing resolves against the project
        component = ort.ModelPackageContext(str(root)).select_component(
            "vad", ort.ModelPackageOptions(ort.SessionOptions()))
        assert component.get_selected_variant_name() == "cpu"
        session = component.create_session()
        inputs = sample_store.load(verified.root / "build/silero-vad/vad/cpucheck/inputs.npz", limit=2)
        got = [session.run(None, x) for x in inputs]
    reference = ort.InferenceSession(str(packaged["dest"] / "silero-vad" / "cpu" / "vad.onnx"))
    for x, mine in zip(inputs, got):
        for a, b in zip(mine, reference.run(None, x)):
            np.testing.assert_array_equal(a, b)


def test_the_modelpackage_is_byte_identical_across_dists(packaged):
    assert tree(packaged["again"] / "silero-vad" / "onnxruntime") == packaged["snapshot"]["silero-vad"]
    text = (packaged["dest"] / "silero-vad" / "onnxruntime" / "manifest.json").read_text()
    assert str(packaged["dest"]) not in text  # no path of this machine


def test_links_that_fail_fall_back_to_copies(verified, tmp_path, monkeypatch):
    import os

    def no_links(*_):
        raise OSError(1, "Operation not permitted")

    dest = tmp_path / "dist"
    dist(verified, "silero-vad", dest)  # a first package: the second one links nothing from it
    linked = tree(dest / "silero-vad" / "onnxruntime")
    monkeypatch.setattr(os, "link", no_links)
    fresh = tmp_path / "fresh"
    dist(verified, "silero-vad", fresh)
    assert tree(fresh / "silero-vad" / "onnxruntime") == linked
