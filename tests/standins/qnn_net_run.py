# Stand-in for the QNN SDK's aarch64-android `qnn-net-run`, for tests only: no phone and no Android QNN runtime exist here.
"""Runs a pushed QNN context binary the way `qnn-net-run --retrieve_context` does on a phone, but on the
x86 HTP simulator of the onnxruntime-qnn wheel, so the outputs that come back are the binary's real
outputs and the comparison with the CPU is real.

It is started by the `qnn-net-run` shell wrapper that tests/standins/qnn_libs writes into a stand-in
qnn-libs folder (pushed to the stand-in phone like the real runner; the wrapper runs this file with the
host Python). The wrapper moves LD_LIBRARY_PATH aside (STANDIN_LD_LIBRARY_PATH) so the placeholder .so
files cannot reach the host's dynamic loader.

Real CLI honoured (subset of QNN 2.x qnn-net-run):
    --retrieve_context <bin>   --backend <libQnnHtp.so>   --input_list <file>   [--output_dir <dir> (./output)]
    [--use_native_input_files] [--use_native_output_files] [--num_inferences <n>] [--keep_num_outputs <n>]
    [--perf_profile <profile>] [--log_level <level>]
  Unknown flags, a missing value, --model (model libraries) or a missing file: an error message and exit 1.
  input_list: one line per inference; space-separated `<tensor>:=<path>` or plain paths in input order,
  paths relative to the current folder; an optional first line `#<out1> <out2>` limits the outputs written.
  Inputs are float32 raw files unless --use_native_input_files (then each tensor's own type).
  Outputs: <output_dir>/Result_<i>/<output tensor>.raw, float32 unless --use_native_output_files.
  --num_inferences N loops over the input list until N inferences ran; --keep_num_outputs K writes only
  the first K results.

Runtime checks done like a phone would fail (the messages are the stand-in's own, not QNN's text):
  * --backend must be a (placeholder) libQnnHtp.so; libQnnSystem.so and libQnnHtpV<arch>Stub.so must be in
    a folder of LD_LIBRARY_PATH, libQnnHtpV<arch>Skel.so in a folder of ADSP_LIBRARY_PATH (';'-separated),
    <arch> being the binary's Hexagon arch (from its context metadata, read with qnn_tasks.qnnbin);
  * all those libs must be of one QNN version, and not older than the binary's QNN build: else an
    "err 5005"-style failure of context creation;
  * the phone's `getprop ro.soc.model` must be the chip the binary was compiled for (socModel, through the
    socs.yaml named by STANDIN_SOCS_YAML), else context creation fails.

Stand-in only (hooks for tests, never in the real tool):
  * STANDIN_QNN_NET_RUN_FAIL=<message>: print a few log lines, then <message> on stderr, exit 1;
  * STANDIN_QNN_NET_RUN_STALL=<seconds>: when --num_inferences is given, touch
    $STANDIN_ADBD_SANDBOX/.qnn-net-run-stalled and sleep that long first (lets a test unplug mid-run).
The simulator's timing is x86 simulator time; nothing here says how fast a phone is.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLACEHOLDER_MARK = b"QNN-STANDIN-PLACEHOLDER"
FLAGS = {"--retrieve_context": True, "--backend": True, "--input_list": True, "--output_dir": True,
         "--use_native_input_files": False, "--use_native_output_files": False, "--num_inferences": True,
         "--keep_num_outputs": True, "--perf_profile": True, "--log_level": True}
PERF_PROFILES = {"low_balanced", "balanced", "default", "high_performance", "sustained_high_performance", "burst",
                 "low_power_saver", "power_saver", "high_power_saver", "extreme_power_saver", "system_settings"}
NUMPY_TYPES = {"float32": "<f4", "float16": "<f2", "int32": "<i4", "int8": "i1", "uint8": "u1", "int16": "<i2",
               "uint16": "<u2", "bool": "?", "int64": "<i8"}
ONNX_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "bool": 9,
              "float16": 10}
USAGE = ("usage: qnn-net-run --retrieve_context <context.bin> --backend <libQnnHtp.so> --input_list <input_list.txt> "
         "[--output_dir <dir>] [--use_native_input_files] [--use_native_output_files] [--num_inferences <n>] "
         "[--keep_num_outputs <n>] [--perf_profile <profile>] [--log_level <level>]")


class Failure(Exception):
    pass


def fail(message: str) -> None:
    raise Failure(message)


def log(message: str) -> None:
    print(f"qnn-net-run: {message}", flush=True)


def parse_args(argv: list[str]) -> dict[str, object]:
    args: dict[str, object] = {}
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--model":
            fail("--model (a model library) is not supported by this stand-in; use --retrieve_context")
        if flag in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        if flag not in FLAGS:
            fail(f"Invalid argument: {flag}\n{USAGE}")
        if FLAGS[flag]:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                fail(f"Missing value for {flag}\n{USAGE}")
            args[flag] = argv[i + 1]
            i += 2
        else:
            args[flag] = True
            i += 1
    for required in ("--backend", "--input_list", "--retrieve_context"):
        if required not in args:
            fail(f"Missing required argument {required}\n{USAGE}")
    for number in ("--num_inferences", "--keep_num_outputs"):
        if number in args and (not str(args[number]).isdigit() or int(args[number]) < (1 if number == "--num_inferences" else 0)):
            fail(f"{number} wants a positive integer, got {args[number]}")
    if "--perf_profile" in args and args["--perf_profile"] not in PERF_PROFILES:
        fail(f"Invalid perf_profile: {args['--perf_profile']}")
    return args


def placeholder_version(path: Path) -> str:
    head = path.read_bytes()[:4096]
    if PLACEHOLDER_MARK not in head:
        fail(f"Unable to load {path}: this stand-in runs only with the placeholder libraries of "
             f"tests/standins/qnn_libs (it cannot load a real Android library on x86)")
    for line in head.decode(errors="replace").splitlines():
        if line.startswith("qnn_version="):
            return line.split("=", 1)[1].strip()
    fail(f"{path}: placeholder without a qnn_version line")
    return ""


def find_in(dirs: list[str], name: str) -> Path | None:
    for folder in dirs:
        if folder and (Path(folder) / name).is_file():
            return Path(folder) / name
    return None


def version_tuple(text: str) -> tuple[int, ...]:
    import re

    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(x) for x in match.groups()) if match else (0, 0, 0)


def check_runtime(backend: Path, info: dict) -> None:
    arch = (info.get("dsp_arch") or "").lstrip("v")
    if not arch:
        fail(f"cannot tell the Hexagon arch of the context binary (context metadata {info.get('context_metadata')})")
    ld_dirs = (os.environ.get("STANDIN_LD_LIBRARY_PATH", os.environ.get("LD_LIBRARY_PATH", ""))).split(":")
    adsp_dirs = os.environ.get("ADSP_LIBRARY_PATH", "").split(";")
    versions = {"libQnnHtp.so": placeholder_version(backend)}
    system = find_in(ld_dirs + [str(backend.parent)], "libQnnSystem.so")
    if system is None:
        fail("Unable to load the system library libQnnSystem.so (not in LD_LIBRARY_PATH): cannot read the context binary")
    versions["libQnnSystem.so"] = placeholder_version(system)
    stub = find_in(ld_dirs, f"libQnnHtpV{arch}Stub.so")
    if stub is None:
        fail(f"QnnDevice_create failed: dlopen of libQnnHtpV{arch}Stub.so failed (not in LD_LIBRARY_PATH="
             f"{':'.join(d for d in ld_dirs if d) or '<empty>'})")
    versions[stub.name] = placeholder_version(stub)
    skel = find_in(adsp_dirs, f"libQnnHtpV{arch}Skel.so")
    if skel is None:
        fail(f"QnnDevice_create failed: the DSP could not load libQnnHtpV{arch}Skel.so (not in any folder of "
             f"ADSP_LIBRARY_PATH={os.environ.get('ADSP_LIBRARY_PATH', '<unset>')}); transport error 4000")
    versions[skel.name] = placeholder_version(skel)
    if len(set(versions.values())) != 1:
        fail("runtime libraries of different QNN versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    runtime = versions["libQnnHtp.so"]
    built = info.get("build_id") or ""
    if version_tuple(built) > version_tuple(runtime):
        fail(f"QnnContext_createFromBinary failed with err 5005: the context binary was built by QNN {built} and "
             f"this runtime is QNN {runtime} (a runtime older than the compiler cannot load it)")
    log(f"runtime QNN {runtime}: libQnnHtp.so, {system.name}, {stub.name}, {skel.name} (Hexagon v{arch})")


def check_chip(info: dict) -> None:
    socs_yaml = os.environ.get("STANDIN_SOCS_YAML")
    if not socs_yaml:
        return
    try:
        chip = subprocess.run(["getprop", "ro.soc.model"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return
    import yaml

    table = (yaml.safe_load(Path(socs_yaml).read_text()) or {}).get("socs", {})
    row = table.get(chip)
    if row is None:
        fail(f"QnnContext_createFromBinary failed: this phone's SoC '{chip}' has no Hexagon HTP the binary can use")
    if row.get("soc_id") != info.get("soc_model") or row.get("dsp_arch") != info.get("dsp_arch"):
        fail(f"QnnContext_createFromBinary failed: the binary was compiled for socModel {info.get('soc_model')} "
             f"({info.get('dsp_arch')}); this phone is {chip} (soc_id {row.get('soc_id')}, {row.get('dsp_arch')})")


def read_input_list(path: Path, inputs: list[dict]) -> tuple[list[list[Path]], list[str] | None]:
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    wanted = None
    if lines and lines[0].startswith("#"):
        wanted = lines[0][1:].split()
        lines = lines[1:]
    names = [t["name"] for t in inputs]
    rows = []
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        words = line.split()
        if len(words) != len(inputs):
            fail(f"{path}:{number}: {len(words)} input file(s), the graph has {len(inputs)} inputs {names}")
        files: list[Path | None] = [None] * len(inputs)
        for position, word in enumerate(words):
            if ":=" in word:
                name, _, file = word.partition(":=")
                if name not in names:
                    fail(f"{path}:{number}: unknown input tensor '{name}' (the graph's inputs: {names})")
                files[names.index(name)] = Path(file)
            else:
                files[position] = Path(word)
        for file in files:
            if file is None or not file.is_file():
                fail(f"{path}:{number}: input file {file} not found")
        rows.append(files)  # type: ignore[arg-type]
    if not rows:
        fail(f"{path}: no inputs listed")
    return rows, wanted


def load_input(file: Path, tensor: dict, native: bool):
    import numpy as np

    dtype = NUMPY_TYPES.get(tensor["dtype"]) if native else "<f4"
    if dtype is None:
        fail(f"input '{tensor['name']}' has type {tensor['dtype']}: not supported by this stand-in")
    data = np.fromfile(file, dtype=dtype)
    if data.size != int(np.prod(tensor["shape"])):
        fail(f"input file {file}: {data.size} values of {dtype}, tensor '{tensor['name']}' {tensor['shape']} "
             f"needs {int(np.prod(tensor['shape']))}")
    return data.reshape(tensor["shape"]).astype(NUMPY_TYPES[tensor["dtype"]].replace("?", "bool"))


def simulator_session(bin_path: Path, info: dict, work: Path):
    """An EPContext ONNX model around the binary (graph I/O from its metadata) on the x86 HTP simulator."""
    import onnx
    from onnx import helper

    graph = info["graphs"][0]
    local = work / bin_path.name
    shutil.copyfile(bin_path, local)
    for t in graph["inputs"] + graph["outputs"]:
        if t["dtype"] not in ONNX_TYPES:
            fail(f"tensor '{t['name']}' has QNN type {t['dtype']}: not supported by this stand-in")
    node = helper.make_node("EPContext", [t["name"] for t in graph["inputs"]], [t["name"] for t in graph["outputs"]],
                            name=graph["name"], domain="com.microsoft", main_context=1, embed_mode=0,
                            ep_cache_context=local.name, source="QNN", partition_name=graph["name"],
                            ep_sdk_version=info.get("build_id") or "")
    model = helper.make_model(
        helper.make_graph([node], "standin_ctx",
                          [helper.make_tensor_value_info(t["name"], ONNX_TYPES[t["dtype"]], t["shape"]) for t in graph["inputs"]],
                          [helper.make_tensor_value_info(t["name"], ONNX_TYPES[t["dtype"]], t["shape"]) for t in graph["outputs"]]),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)], ir_version=10)
    wrapper = work / "standin_ctx.onnx"
    onnx.save(model, str(wrapper))
    import onnxruntime as ort

    from qnn_tasks.toolchains.ort_qnn import session_options

    options = {"soc_model": str(info.get("soc_model"))}
    try:
        return ort.InferenceSession(str(wrapper), session_options(options, disable_cpu_fallback=True))
    except Exception as err:  # the simulator refused the binary
        fail(f"QnnContext_createFromBinary failed on the simulator: {str(err).strip().splitlines()[-1]}")


def output_name(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def run(argv: list[str]) -> int:
    args = parse_args(argv)
    backend, context, input_list = (Path(str(args[k])) for k in ("--backend", "--retrieve_context", "--input_list"))
    for what, path in (("backend", backend), ("context binary", context), ("input list", input_list)):
        if not path.is_file():
            fail(f"Could not open {what} {path}: No such file or directory")
    import onnx  # noqa: F401  (before libQnnSystem is loaded: see qnn_tasks/toolchains/qairt.py)

    from qnn_tasks.qnn import binary as qnnbin

    try:
        info = qnnbin.read_binary_info(context).to_dict()
    except qnnbin.QnnBinError as err:
        fail(f"Could not read the context binary: {err}")
    if len(info["graphs"]) != 1:
        fail(f"{context}: {len(info['graphs'])} graphs; this stand-in runs binaries with one graph")
    check_runtime(backend, info)
    check_chip(info)
    log(f"context {context.name}: graph {info['graphs'][0]['name']}, QNN build {info['build_id']}, "
        f"socModel {info['soc_model']} ({info['dsp_arch']})")
    if os.environ.get("STANDIN_QNN_NET_RUN_FAIL"):
        print(os.environ["STANDIN_QNN_NET_RUN_FAIL"], file=sys.stderr, flush=True)
        return 1
    graph = info["graphs"][0]
    rows, wanted = read_input_list(input_list, graph["inputs"])
    native_in = bool(args.get("--use_native_input_files"))
    native_out = bool(args.get("--use_native_output_files"))
    count = int(str(args.get("--num_inferences", len(rows))))
    keep = int(str(args["--keep_num_outputs"])) if "--keep_num_outputs" in args else count
    if "--num_inferences" in args and os.environ.get("STANDIN_QNN_NET_RUN_STALL"):
        marker = Path(os.environ.get("STANDIN_ADBD_SANDBOX", ".")) / ".qnn-net-run-stalled"
        marker.write_text(f"{os.getpid()}\n")
        log(f"stand-in stall: sleeping {os.environ['STANDIN_QNN_NET_RUN_STALL']} s")
        time.sleep(float(os.environ["STANDIN_QNN_NET_RUN_STALL"]))
    out_dir = Path(str(args.get("--output_dir", "output")))
    out_dir.mkdir(parents=True, exist_ok=True)
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="standin-qnn-net-run-") as tmp:
        session = simulator_session(context, info, Path(tmp))
        names = [o.name for o in session.get_outputs()]
        start = time.perf_counter()
        for i in range(count):
            files = rows[i % len(rows)]
            feed = {t["name"]: load_input(f, t, native_in) for t, f in zip(graph["inputs"], files)}
            values = session.run(None, feed)
            if i >= keep:
                continue
            result = out_dir / f"Result_{i}"
            result.mkdir(parents=True, exist_ok=True)
            for name, value in zip(names, values):
                if wanted is not None and name not in wanted:
                    continue
                array = np.asarray(value)
                (result / f"{output_name(name)}.raw").write_bytes(
                    array.tobytes() if native_out else np.ascontiguousarray(array, dtype="<f4").tobytes())
        log(f"{count} inference(s) in {time.perf_counter() - start:.3f} s on the x86 HTP simulator (stand-in); "
            f"outputs in {out_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except Failure as err:
        print(f"ERROR: {err}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
