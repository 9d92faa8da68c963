"""`doit dist`: a package per model from the session's verified build (MiniLM + VAD, SM8650 + SM8750, fp16), and
only from what was verified; whole or not at all; incremental; byte-identical; a manifest its schema accepts."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import Project, copy_project  # noqa: E402
from standins.qnn_libs import make_qnn_libs  # noqa: E402

from qnn_tasks.errors import QnnTasksError, SpecError, StageError  # noqa: E402
from qnn_tasks.modelspec.load import load_project  # noqa: E402
from qnn_tasks.plan.planner import Planner  # noqa: E402
from qnn_tasks.qnn import select  # noqa: E402
from qnn_tasks.ship import inventory, manifest, package  # noqa: E402

jsonschema = pytest.importorskip("jsonschema")


@contextmanager
def inside(root: Path):
    """Records name project-relative paths: read them from the project root, as doit does."""
    before = os.getcwd()
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(before)


def dist(project: Project, model: str, dest: Path, env: dict[str, str] | None = None) -> dict:
    """The dist stage in this process (read-only on the project: the session's build is shared)."""
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with inside(project.root):
            planner = Planner(load_project(project.root))
            return package.write(inventory.of_model(planner, model), project.root, dest, dest / ".cache")
    finally:
        for key, value in saved.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)


def tree(folder: Path) -> dict[str, str]:
    """Every file of a package (hidden ones too) -> its SHA-256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def read_manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


@pytest.fixture(scope="module")
def shipped(verified, tmp_path_factory):
    """Both models packaged twice from the session's verified build, and once into a fresh folder."""
    dest = tmp_path_factory.mktemp("dist")
    first = {m: dist(verified, m, dest) for m in ("minilm", "silero-vad")}
    snapshot = {m: tree(dest / m) for m in first}
    inodes = {m: {p: (dest / m / p).stat().st_ino for p in snapshot[m]} for m in first}
    second = {m: dist(verified, m, dest) for m in first}
    fresh = tmp_path_factory.mktemp("fresh")
    dist(verified, "silero-vad", fresh)
    return {"dest": dest, "first": first, "second": second, "snapshot": snapshot, "inodes": inodes, "fresh": fresh}


def test_package_holds_every_verified_binary_and_its_proof(shipped, verified):
    vad = shipped["dest"] / "silero-vad"
    data = read_manifest(vad)
    jsonschema.validate(data, json.loads((vad / "manifest.schema.json").read_text()))  # the schema it ships
    assert data["schema"] == "qnn-npu-compile/manifest" and data["schema_version"] == 1
    assert data["licence"] == "MIT" and data["source"]["package"] == "silero-vad" and data["source"]["version"]
    assert len(data["source"]["file_sha256"]) == 64  # the packaged ONNX it came from, by digest
    assert data["omitted"] == [] and data["selection"]["precision_order"][0] == "fp16"
    graph = data["graphs"]["vad"]
    assert [t["name"] for t in graph["inputs"]] == ["input", "state"] and graph["inputs"][0]["shape"] == [1, 576]
    assert [(b["soc"], b["precision"]) for b in graph["binaries"]] == [("SM8650", "fp16"), ("SM8750", "fp16")]
    for b in graph["binaries"]:
        target = next(verified.root.glob(f"build/silero-vad/vad/*/fp16/{b['soc']}/context/context.json"))
        record = json.loads(target.read_text())
        binary = next(v for k, v in record["files"].items() if k.endswith(".bin"))
        assert (b["sha256"], b["size"]) == (binary["sha256"], binary["size"])
        assert hashlib.sha256((vad / b["path"]).read_bytes()).hexdigest() == b["sha256"]
        assert b["qnn_build_id"] == record["binary"]["build_id"] and b["soc_model"] == record["binary"]["soc_model"]
        assert b["dsp_arch"] == record["binary"]["dsp_arch"] and b["socs"] == [b["soc"]]
        assert (b["min_runtime_qnn"], b["min_runtime_from"]) == (record["toolchain"]["qnn"], "compiler")  # no compat
        sim = b["verification"]["simulator"]
        assert sim["measured_on"] == "x86 HTP simulator" and sim["samples"] == 36
        assert sim["checks"][0]["kind"] == "agreement" and sim["checks"][0]["passed"]
        assert sim["metrics"]["output"]["cosine"] > 0.999 and b["verification"]["phone"] == []
        assert b["sherpa_onnx"]["context_binary"] == b["path"]
    fallback = graph["fallback"]
    simplified = verified.root / "build/silero-vad/vad/simplify/vad.onnx"
    assert fallback["path"] == "cpu/vad.onnx" and (vad / "cpu/vad.onnx").read_bytes() == simplified.read_bytes()
    assert fallback["verified_against"]["measured_on"] == "x86 CPU (onnxruntime)"
    # every file named, with its digest; android/ (the AI pack) and onnxruntime/ (ONNX Runtime's ModelPackage) are laid
    # out from them, each with a manifest of its own
    files = {p for p in tree(vad) if not p.startswith(("android/", "onnxruntime/"))}
    assert set(data["files"]) | {"manifest.json"} == files
    assert (vad / "android/device_targeting_configuration.xml").is_file()
    group = vad / "android/silero_vad/src/main/assets/silero-vad#group_SM8650"
    assert (group / "manifest.json").is_file() and (group / "cpu/vad.onnx").is_file()
    assert all(tree(vad)[p] == f["sha256"] for p, f in data["files"].items())
    card = (vad / "MODEL_CARD.md").read_text()
    assert "| SM8650 | v75 | fp16 | `SM8650/vad.fp16.bin`" in card and "NOT in this package" in card


def test_each_binary_carries_its_latency_estimate_never_a_measurement(shipped):
    """manifest.json's binaries[].latency_ms (docs/latency.md): an estimate from published timings, with its basis."""
    for model in ("minilm", "silero-vad"):
        data = read_manifest(shipped["dest"] / model)
        binaries = [b for g in data["graphs"].values() for b in g["binaries"]]
        assert binaries, model
        for b in binaries:
            assert b["latency_ms"]["basis"].startswith("estimated from "), (model, b["soc"])
            assert (b["latency_ms"]["estimate"] is None) == ("refused" in b["latency_ms"]), (model, b["soc"])


def test_each_binary_carries_the_memory_its_load_holds_read_from_it_beside_the_estimate(shipped):
    """manifest.json's binaries[].memory (docs/load-and-fit.md#will-it-fit): the binary's own figure, the lint
    estimate beside it with its error, what the selectors compare with a device's free memory."""
    for model in ("minilm", "silero-vad"):
        data = read_manifest(shipped["dest"] / model)
        for b in (b for g in data["graphs"].values() for b in g["binaries"]):
            memory = b["memory"]
            assert memory["basis"].startswith("read from the context binary"), (model, b["soc"])
            assert memory["resident_bytes"] == sum(v for k, v in memory["measured"].items() if k != "vtcm") > 0
            assert memory["measured"]["const"] <= memory["resident_bytes"] and memory["measured"]["io"] > 0
            assert memory["estimate"]["basis"].startswith("estimated at lint")
            # MiniLM within 10%; the VAD's 0.7 MiB is 17% over its estimate (docs/load-and-fit.md lists the misses)
            assert abs(memory["estimate"]["error"]) <= (0.10 if model == "minilm" else 0.20), (model, b["soc"], memory)


def test_runtime_libs_listed_when_no_source_is_configured(shipped):
    data = read_manifest(shipped["dest"] / "minilm")
    assert sorted(data["runtime_libs"]) == ["v75", "v79"]
    v79 = data["runtime_libs"]["v79"]
    assert v79["shipped"] is False and v79["qnn_version"] == data["toolchain"]["qnn"]
    assert [(f["name"], f["search_path"]) for f in v79["files"]] == [
        ("libQnnHtp.so", "LD_LIBRARY_PATH"), ("libQnnSystem.so", "LD_LIBRARY_PATH"),
        ("libQnnHtpV79Stub.so", "LD_LIBRARY_PATH"), ("libQnnHtpV79Skel.so", "ADSP_LIBRARY_PATH")]
    assert not (shipped["dest"] / "minilm" / "runtime-libs").exists()
    line = shipped["first"]["minilm"]["runtime_line"]
    assert "\n" not in line and line.startswith("runtime libs NOT shipped") and "libQnnHtpV79Skel.so" in line


def test_two_dists_are_byte_identical_and_the_second_copies_nothing(shipped):
    for model, before in shipped["snapshot"].items():
        assert tree(shipped["dest"] / model) == before
        second = shipped["second"][model]
        listed = [rel for rel in before if not rel.startswith(("android/", "onnxruntime/"))]  # laid out from these
        assert second["copied"] == 0 and second["linked"] == len(listed) - 1  # all but manifest.json kept
        for rel in listed:
            if rel != "manifest.json":  # an unchanged binary is linked from the last package, not copied again
                assert (shipped["dest"] / model / rel).stat().st_ino == shipped["inodes"][model][rel], rel
        package = shipped["dest"] / model
        for packed in [*(package / "android").rglob("*.bin"), *(package / "onnxruntime").rglob("*.bin")]:  # linked
            assert packed.stat().st_ino in {(package / rel).stat().st_ino for rel in listed if rel.endswith(".bin")}
    assert tree(shipped["fresh"] / "silero-vad") == shipped["snapshot"]["silero-vad"]  # linked or copied: same bytes
    assert sorted(p.name for p in shipped["dest"].iterdir()) == ["minilm", "silero-vad"]  # no temp or old folder left


def test_packaged_ctx_onnx_runs_on_the_simulator_from_the_package_folder_alone(shipped, verified, tmp_path):
    """The SM8650 folder moved anywhere: onnxruntime-qnn loads its EPContext wrapper (a relative path to the binary)
    with CPU fallback disabled and gives exactly the outputs that were verified."""
    import shutil

    import onnxruntime as ort

    from qnn_tasks.judge import sample_store
    from qnn_tasks.toolchains.ort_qnn import session_options

    chip = tmp_path / "elsewhere" / "SM8650"
    shutil.copytree(shipped["dest"] / "silero-vad" / "SM8650", chip)
    binary = read_manifest(shipped["dest"] / "silero-vad")["graphs"]["vad"]["binaries"][0]
    options = json.loads((chip.parent / binary["ort"]["provider_options"]).read_text())
    assert options["backend_path"] == "libQnnHtp.so" and options["soc_model"] == "57" and options["htp_arch"] == "75"
    with inside(tmp_path):  # nothing resolves against the project any more
        session = ort.InferenceSession(str(chip / "vad.fp16_ctx.onnx"), session_options(options, True))
        inputs = sample_store.load(verified.root / "build/silero-vad/vad/cpucheck/inputs.npz", limit=3)
        got = [dict(zip([o.name for o in session.get_outputs()], session.run(None, x))) for x in inputs]
    verified_outputs = sample_store.load(next(verified.root.glob("build/silero-vad/vad/*/fp16/SM8650/simulate/outputs.npz")),
                                    limit=3)
    for mine, theirs in zip(got, verified_outputs):
        for name in ("output", "stateN"):
            np.testing.assert_array_equal(mine[name], theirs[name])


def test_runtime_libs_from_the_configured_source(verified, tmp_path):
    """A libs folder of the compiler's QNN version is copied per arch; another version is refused in one line."""
    qnn = json.loads(next(verified.root.glob("build/silero-vad/vad/*/fp16/SM8650/context/context.json")).read_text())[
        "toolchain"]["qnn"]
    libs = make_qnn_libs(tmp_path / f"qnn-libs-{qnn}", qnn, archs=("v75", "v79"), runner=False)
    done = dist(verified, "silero-vad", tmp_path / "dist", env={"QNN_RUNTIME_LIBS": str(libs)})
    assert done["runtime_line"] is None
    package_dir = tmp_path / "dist" / "silero-vad"
    entry = read_manifest(package_dir)["runtime_libs"]["v75"]
    assert entry["shipped"] is True and entry["qnn_version"] == qnn and entry["source"] == "QNN_RUNTIME_LIBS"
    for f in entry["files"]:
        assert f["path"] == f"runtime-libs/v75/{f['name']}"
        assert (package_dir / f["path"]).read_bytes() == (libs / f["name"]).read_bytes()
    old = make_qnn_libs(tmp_path / "qnn-libs-2.40.0", "2.40.0", archs=("v75", "v79"), runner=False)
    with pytest.raises(StageError) as refused:
        dist(verified, "silero-vad", tmp_path / "dist", env={"QNN_RUNTIME_LIBS": str(old)})
    message = str(refused.value)
    assert "\n" not in message and "QNN 2.40.0" in message and f"QNN {qnn}" in message
    assert read_manifest(package_dir)["runtime_libs"]["v75"]["shipped"] is True  # the package before is kept


def test_an_interrupted_dist_leaves_no_package_that_looks_finished(verified, tmp_path, monkeypatch):
    import subprocess

    from qnn_tasks.ship import distlock

    dest = tmp_path / "dist"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = dest / f".silero-vad.dist-{distlock.host()}-{int(dead.stdout)}"  # a dead dist's folder: no manifest.json
    (killed / "SM8650").mkdir(parents=True)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(manifest, "validate", interrupted)  # the last step before manifest.json is written
    with pytest.raises(KeyboardInterrupt):
        dist(verified, "silero-vad", dest)
    assert list(dest.iterdir()) == []  # no package, and the killed run's folder was cleared too
    monkeypatch.undo()
    dist(verified, "silero-vad", dest)
    before = tree(dest / "silero-vad")
    monkeypatch.setattr(manifest, "validate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dist(verified, "silero-vad", dest)
    assert [p.name for p in dest.iterdir()] == ["silero-vad"] and tree(dest / "silero-vad") == before


@pytest.mark.slow
def test_a_dist_killed_while_copying_leaves_the_package_before_it(own_copy):
    """SIGKILL to `doit dist` once its folder exists (nothing can clean up): the package before stays as it was,
    the dead run's folder holds no manifest.json, and the next dist clears it."""
    import signal
    import subprocess
    import time

    assert own_copy.doit("dist:minilm").returncode == 0
    package_dir = own_copy.path("dist/minilm")
    first = tree(package_dir)
    (package_dir / "cpu/minilm.onnx").write_bytes(b"not the fallback")  # so the next dist copies 86 MB: time to kill
    before = tree(package_dir)
    proc = subprocess.Popen([sys.executable, "-m", "doit", "dist:minilm"], cwd=own_copy.root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(own_copy.path("dist").glob(".minilm.dist-*")) and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    (leftover,) = own_copy.path("dist").glob(".minilm.dist-*")
    assert not (leftover / "manifest.json").exists()
    assert tree(package_dir) == before
    again = own_copy.doit("dist:minilm")
    assert again.returncode == 0, again.stdout + again.stderr
    assert sorted(p.name for p in own_copy.path("dist").iterdir()) == ["minilm"] and tree(package_dir) == first


def test_a_copy_that_differs_from_its_record_is_refused(tmp_path):
    source = tmp_path / "x.bin"
    source.write_bytes(b"verified bytes")
    work = package._Assembly(tmp_path / "pkg", None)
    (tmp_path / "pkg").mkdir()
    with pytest.raises(StageError, match="not the file its record vouches for"):
        work.copy(source, "SM8650/x.bin", hashlib.sha256(b"other bytes").hexdigest())


def test_a_folder_that_is_no_package_is_never_replaced(verified, tmp_path):
    mine = tmp_path / "dist" / "silero-vad"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(StageError, match="not a package written by doit dist"):
        dist(verified, "silero-vad", tmp_path / "dist")
    assert (mine / "notes.txt").read_text() == "mine"


def test_dist_root_env_or_a_setting_inside_the_project(tmp_path):
    profile = tmp_path / "toolchain" / "ort-qnn.yaml"
    assert package.dist_root({}, profile, tmp_path, env={}) == (tmp_path / "dist").resolve()
    assert package.dist_root({"dist": "out/pk"}, profile, tmp_path, env={}) == (tmp_path / "out/pk").resolve()
    assert package.dist_root({"dist": "x"}, profile, tmp_path, env={"QNN_DIST": "/srv/p"}) == Path("/srv/p")
    for bad in ("../elsewhere", "/etc", ".", ""):
        with pytest.raises(SpecError, match=r"settings\.dist") as err:
            package.dist_root({"dist": bad}, profile, tmp_path, env={})
        assert "(fix: " in str(err.value) and "\n" not in str(err.value)


def test_a_dist_folder_that_is_a_symlink_out_of_the_project_is_named_with_qnn_dist(tmp_path):
    """dist/ -> /elsewhere: the line names the symlink and QNN_DIST, not settings.dist of a profile nobody wrote."""
    profile = tmp_path / "toolchain" / "ort-qnn.yaml"
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "dist").symlink_to(elsewhere)
    for settings in ({}, {"dist": "dist/pk"}):
        with pytest.raises(SpecError) as err:
            package.dist_root(settings, profile, project, env={})
        line = str(err.value)
        assert line.startswith(f"{project / 'dist'}: a symlink to {elsewhere}, outside the project folder"), line
        assert f"(fix: remove the symlink, or set QNN_DIST={elsewhere.resolve()}" in line and "\n" not in line, line
        assert "settings.dist" not in line and str(profile) not in line, line
    assert package.dist_root({}, profile, project, env={"QNN_DIST": str(elsewhere)}) == elsewhere.resolve()


def test_schema_refuses_what_the_selector_could_not_trust(shipped):
    data = read_manifest(shipped["dest"] / "silero-vad")
    schema = manifest.schema()
    binary = data["graphs"]["vad"]["binaries"][0]
    for broken in ({**data, "omitted": [{"target": "x", "reason": "because"}]},
                   {**data, "graphs": {"vad": {**data["graphs"]["vad"], "binaries": [{**binary, "path": "../x.bin"}]}}},
                   {**data, "graphs": {"vad": {**data["graphs"]["vad"], "binaries": [{**binary, "socs": []}]}}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)
    notes = {**data, "size_notes": [{"graph": "vad", "what": "tied embedding stored twice", "bytes": 1,
                                     "option": "host-side lookup"}]}
    jsonschema.validate(notes, schema)  # the Whisper helper's size notes fit
    from qnn_tasks.ship.card import card

    assert "- vad: tied embedding stored twice: 0.0 MiB (host-side lookup)" in card(notes)  # and the card shows them


# ------------------------------------------------------------------ what was not verified stays out

@pytest.fixture(scope="module")
def damaged(verified, tmp_path_factory) -> Project:
    """A copy whose VAD fails verification (a threshold its binaries cannot meet, judged again by real doit), whose
    MiniLM SM8750 binary was changed after it was verified, and whose MiniLM asks for a chip never built and for one
    that runs only quantized graphs (its fp16 target skipped)."""
    project = copy_project(tmp_path_factory.mktemp("damaged") / "project", source=verified.root, with_build=True)
    project.edit("models/silero-vad/model.yaml", "min_cosine: 0.999}", "min_cosine: 0.9999999}")
    project.judged = project.doit("simverify")
    project.edit("models/minilm/model.yaml", "socs: [SM8650, SM8750]", "socs: [SM8650, SM8750, SM8550, SM7550]")
    project.relint = project.doit("lint")  # SM8550's context budget is in lint's key: linted again, it is current
    binary = next(project.root.glob("build/minilm/minilm/*/fp16/SM8750/context/*.bin"))
    data = bytearray(binary.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    binary.write_bytes(bytes(data))
    project.run = project.doit("dist")
    return project


@pytest.mark.slow
def test_failed_stale_skipped_and_unbuilt_targets_are_left_out_and_named(damaged):
    assert damaged.judged.returncode != 0  # the VAD's judgement failed for real
    assert damaged.relint.executed == {"lint:minilm"}, damaged.relint.stdout
    run = damaged.run
    assert run.returncode != 0, run.stdout + run.stderr
    line = run.failure_line("dist:silero-vad")
    assert "nothing verified to ship for silero-vad" in line and "failed: simverify" in line
    assert not (damaged.root / "dist" / "silero-vad").exists()
    minilm = damaged.root / "dist" / "minilm"
    data = read_manifest(minilm)
    reasons = {o["target"]: o["reason"] for o in data["omitted"]}
    assert reasons["minilm-SM8750"].startswith("stale: context:") and "SHA-256" in reasons["minilm-SM8750"]
    assert reasons["minilm-SM8550"].startswith("unbuilt: ")
    assert reasons["minilm-SM7550"].startswith("skipped: ") and "fp16" in reasons["minilm-SM7550"]
    assert [b["soc"] for b in data["graphs"]["minilm"]["binaries"]] == ["SM8650"]
    # a phone of the stale chip is told so (omitted names the build), one of the unbuilt chip "no build"
    assert {o["target"]: (o["graph"], o["soc"]) for o in data["omitted"]}["minilm-SM8750"] == ("minilm", "SM8750")
    stale = select.choose(data, "minilm", "SM8750", "2.99.0", lambda b: None)
    assert stale.rule == select.UNVERIFIED and stale.reason.startswith("the build for SM8750 is stale (")
    assert select.choose(data, "minilm", "SM8550", "2.99.0", lambda b: None).rule == select.NO_BUILD
    assert select.validate_manifest(data) is None
    assert not (minilm / "SM8750").exists() and "minilm-SM8750" in (minilm / "MODEL_CARD.md").read_text()
    printed = [x for x in run.stdout.splitlines() if x.startswith("dist:minilm: ")]
    assert "left out 3" in printed[0] and "minilm-SM8750 (stale" in printed[0]
    assert any(x.startswith("dist:minilm: runtime libs NOT shipped") for x in printed)


def test_dist_is_on_demand_and_one_task_per_model(verified):
    listed = verified.doit("list", "--all", "dist")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert {"dist:minilm", "dist:silero-vad"} <= set(re_names(listed.stdout))


def re_names(text: str) -> list[str]:
    return [line.split()[0] for line in text.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_benchmark_runs_on_a_verified_build(own_copy):
    """benchmarks/bench_dist.py on a copy of the session's build: its figures and the machine and load it ran on."""
    import subprocess

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_dist.py"
    result = subprocess.run([sys.executable, str(bench), "--tree", str(own_copy.root), "--runs", "1"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    assert "machine: " in out and "load average (1 min) before" in out
    assert "fresh folder (all copied)" in out and "unchanged build (linked), median of 1" in out
    for line in ("silero-vad     SM8650", "silero-vad     cpu", "minilm         (whole package)",
                 "silero-vad/SM8750/vad.fp16.bin"):
        assert line in out, out
    assert not own_copy.path("dist").exists()  # the benchmark's packages went to its own folder


def test_errors_are_one_line(verified, tmp_path):
    with pytest.raises(QnnTasksError) as err:
        dist(verified, "silero-vad", tmp_path, env={"QNN_RUNTIME_LIBS": str(tmp_path / "missing")})
    assert "\n" not in str(err.value) and "does not exist" in str(err.value)


def test_quantized_binary_io_carries_the_scale_the_app_applies():
    """A binary whose I/O the converter made 16-bit (as the qairt SDK's can be): the tensor info the context stage
    records (qnn/binary.py's shape of it; no such build is made here) becomes the manifest's scale and offset."""
    context = {"binary": {"graphs": [{"name": "g", "inputs": [
        {"name": "input_ids", "dtype": "ufixed_point_16", "shape": [1, 64], "quantization": {
            "encoding": "scale_offset", "scale": 0.000152587890625, "offset": -32768}}],
        "outputs": [{"name": "embedding", "dtype": "float32", "shape": [1, 384], "quantization": None}]}]}}
    io = {"inputs": [{"name": "input_ids", "shape": [1, 64], "dtype": "float32"}],
          "outputs": [{"name": "embedding", "shape": [1, 384], "dtype": "float32"}]}
    found = manifest.binary_io(context, io)
    assert found["inputs"][0]["dtype"] == "ufixed_point_16"
    assert found["inputs"][0]["quantization"] == {"encoding": "scale_offset", "scale": 0.000152587890625,
                                                  "offset": -32768, "formula": "real = scale * (q + offset)"}
    assert found["outputs"][0]["quantization"] is None


def _external_model(folder: Path, name: str, location: str, scale: float) -> Path:
    """A real ONNX (y = x @ w) whose weight lives in a data file beside it, as a graph over 2 GB is saved."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array((np.eye(8, dtype=np.float32) * scale), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], name,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / f"{name}.onnx"), save_as_external_data=True, location=location,
              all_tensors_to_one_file=True, size_threshold=0)
    return folder / f"{name}.onnx"


def _fallback(work: "package._Assembly", root: Path, path: Path, name: str, vouch_data: bool = True) -> dict:
    """package._graph on `path` with a simplify record that vouches for the .onnx (and, as the funnel writes it
    since the stage names it in `also_wrote`, for every file beside it)."""
    g = {"name": name, "simplified": str(path.relative_to(root)), "io": {"inputs": [], "outputs": []}}
    beside = [f for f in path.parent.iterdir() if f != path] if vouch_data else []
    files = {str(f.relative_to(root)): {"sha256": package.records.sha256(f)} for f in [path, *beside]}
    return package._graph(g, {"simplify": {"files": files}}, work, root)


def test_a_fallback_with_external_data_ships_its_data_file_and_runs_from_the_package(tmp_path):
    """A graph over 2 GB keeps its weights beside its .onnx: the CPU fallback was shipped without them (an ONNX
    Runtime session on the package's cpu/ failed). Now the data file goes beside it, listed in `files`."""
    import onnxruntime as ort

    root = tmp_path / "project"
    big = _external_model(root / "build/m/big/simplify", "big", "big.onnx.data", 2.0)
    work = package._Assembly(tmp_path / "pkg", None)
    entry = _fallback(work, root, big, "big")
    assert entry["fallback"]["path"] == "cpu/big.onnx" and "cpu/big.onnx.data" in work.files
    session = ort.InferenceSession(str(tmp_path / "pkg/cpu/big.onnx"), providers=["CPUExecutionProvider"])
    [y] = session.run(None, {"x": np.ones((1, 8), np.float32)})
    assert y.tolist() == [[2.0] * 8]  # the weights came with it


def test_a_fallback_whose_data_location_leaves_its_folder_or_clashes_is_refused(tmp_path):
    root = tmp_path / "project"
    work = package._Assembly(tmp_path / "pkg", None)
    _fallback(work, root, _external_model(root / "build/m/a/simplify", "a", "weights.bin", 1.0), "a")
    clash = _external_model(root / "build/m/b/simplify", "b", "weights.bin", 3.0)  # same name, other bytes
    with pytest.raises(StageError, match="another graph of the package has a different file of that name"):
        _fallback(work, root, clash, "b")
    import onnx

    outside = _external_model(root / "build/m/c/simplify", "c", "c.data", 1.0)
    model = onnx.load(str(outside), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../../../../secret.data"  # an untrusted model folder's ONNX
    onnx.save(model, str(outside))
    with pytest.raises(StageError, match="is not a file beside it"):
        _fallback(work, root, outside, "c")
    unvouched = _external_model(root / "build/m/d/simplify", "d", "d.data", 1.0)
    with pytest.raises(StageError, match="no record vouches for that file"):
        _fallback(work, root, unvouched, "d", vouch_data=False)
    changed = _external_model(root / "build/m/e/simplify", "e", "e.data", 1.0)
    g = {"name": "e", "simplified": str(changed.relative_to(root)), "io": {"inputs": [], "outputs": []}}
    files = {g["simplified"]: {"sha256": package.records.sha256(changed)},
             "build/m/e/simplify/e.data": {"sha256": hashlib.sha256(b"what it was").hexdigest()}}
    with pytest.raises(StageError, match="not the file its record vouches for"):  # edited since it was simplified
        package._graph(g, {"simplify": {"files": files}}, work, root)
