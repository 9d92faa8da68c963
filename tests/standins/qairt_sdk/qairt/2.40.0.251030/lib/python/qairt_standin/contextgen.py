"""Stand-in qnn-context-binary-generator: model lib + HTP config -> <output_dir>/<binary_file>.bin.

Modelled: the real options (--model, --backend, --binary_file, --output_dir, --config_file, ...); the
native tool's error style (an "ERROR: ..." line and exit 1 for bad/missing options, unloadable libs or a
failed graph); the model library is really dlopen'ed (an aarch64 lib fails to load, as it would);
--config_file is read as the real one is (htp_backend_extensions.json -> shared_library_path must exist,
config_file_path -> htp_config.json: the device's soc_id, and the vtcm_mb / O of the graph_names entry
that names this graph; an entry for another graph is not applied, with a warning). The output is a real
QNN context binary: the ONNX carried in the model lib is compiled with the onnxruntime-qnn wheel's HTP
backend for that soc_id, through the stand-in SDK's libQnnHtp.so role played by graph_name_shim.c, so
the graph in the binary carries the model library's graph name, as with the real tool.
Not modelled: composing the graph from the model library's C++ (onnxruntime compiles the ONNX
instead), so ops onnxruntime would leave on CPU are reported as not supported by HTP; dsp_arch,
perf_profile and cores are read but only soc_id, vtcm_mb and O reach the compiler.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import native_log, read_payload, sdk_version

SHIM_SOURCE = Path(__file__).with_name("graph_name_shim.c")


class NativeStyleParser(argparse.ArgumentParser):
    """The real tool is native (getopt): an unknown or incomplete option prints an error and exits 1."""

    def error(self, message: str) -> None:  # noqa: D401
        print(f"ERROR: Invalid argument passed: {message}", file=sys.stderr)
        self.print_help(sys.stderr)
        raise SystemExit(1)


def parser() -> argparse.ArgumentParser:
    p = NativeStyleParser(prog="qnn-context-binary-generator", allow_abbrev=False,
                          description="Generates a QNN context binary from a model library (stand-in).")
    p.add_argument("--model", help="Path to the model library (.so) containing the QNN network.")
    p.add_argument("--backend", help="Path to a QNN backend library to create the context binary.")
    p.add_argument("--binary_file", help="Name of the binary file to save the context binary to, in --output_dir "
                                         "with .bin extension. If not provided, no backend binary is created.")
    p.add_argument("--model_prefix", default="QnnModel")
    p.add_argument("--output_dir", default="./output")
    p.add_argument("--op_packages")
    p.add_argument("--config_file", help="Path to a JSON config file (backend extensions).")
    p.add_argument("--profiling_level", choices=["basic", "detailed", "backend"])
    p.add_argument("--profiling_option")
    p.add_argument("--log_level", choices=["error", "warn", "info", "verbose", "debug"])
    p.add_argument("--dlc_path")
    p.add_argument("--input_output_tensor_mem_type", choices=["raw", "memhandle"])
    p.add_argument("--enable_intermediate_outputs", action="store_true")
    p.add_argument("--set_output_tensors")
    p.add_argument("--version", action="store_true")
    return p


def fail(message: str) -> int:
    native_log("error", message)
    return 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.version:
        print(f"QNN SDK v{sdk_version()} (stand-in)")
        return 0
    for option in ("model", "backend"):
        if not getattr(args, option):
            print(f"ERROR: Missing argument --{option}", file=sys.stderr)
            parser().print_help(sys.stderr)
            return 1
    native_log("info", f"qnn-context-binary-generator (stand-in for QAIRT {sdk_version()})")
    backend = Path(args.backend)
    if not backend.is_file():
        return fail(f"Unable to load backend. dlerror(): {backend}: cannot open shared object file: "
                    f"No such file or directory")
    if backend.name != "libQnnHtp.so":
        return fail(f"{backend}: the stand-in models the HTP backend (libQnnHtp.so) only")
    try:
        lib = ctypes.CDLL(str(Path(args.model).resolve()))
        graph_name = _graph_name(lib)
        payload = _payload(lib)
    except OSError as err:
        return fail(f"Unable to load model. dlerror(): {err}")
    except AttributeError:
        return fail(f"{args.model}: not a model library from the stand-in qnn-model-lib-generator")
    model_bytes, meta = read_payload(payload)
    native_log("info", f"Model library {args.model}: graph '{graph_name}'")

    options = {}
    if args.config_file:
        problem = _read_config(Path(args.config_file), graph_name, options)
        if problem:
            return fail(problem)
    else:
        native_log("warning", "No --config_file: compiling for the backend's default SoC")
    if meta.get("quantization"):
        options["offload_graph_io_quantization"] = "0"
    else:
        options["enable_htp_fp16_precision"] = "1" if meta.get("float_bitwidth") == 16 else "0"
    native_log("info", f"HTP options: {options}")
    try:
        bin_bytes = _compile(model_bytes, graph_name, options)
    except RuntimeError as err:
        return fail(f"Failed to finalize graph '{graph_name}': {err}")
    if not args.binary_file:
        native_log("info", "No --binary_file: the context binary is not saved")
        return 0
    out = Path(args.output_dir) / f"{args.binary_file}.bin"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(bin_bytes)
    native_log("info", f"Saved context binary to {out} ({len(bin_bytes)} bytes)")
    return 0


def _graph_name(lib) -> str:
    fn = lib.QnnStandin_graphName
    fn.restype = ctypes.c_char_p
    return fn().decode()


def _payload(lib) -> bytes:
    fn = lib.QnnStandin_payload
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    size = ctypes.c_size_t(0)
    return ctypes.string_at(fn(ctypes.byref(size)), size.value)


def _read_config(path: Path, graph_name: str, options: dict) -> str | None:
    try:
        extensions = json.loads(path.read_text())["backend_extensions"]
        library, htp_config = Path(extensions["shared_library_path"]), Path(extensions["config_file_path"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"Failed to read --config_file {path}: {type(err).__name__}: {err}"
    if not library.is_file():
        return f"Unable to load backend extensions library {library}: No such file or directory"
    try:
        config = json.loads(htp_config.read_text())
    except (OSError, ValueError) as err:
        return f"Failed to read backend extensions config {htp_config}: {err}"
    devices = config.get("devices") or [{}]
    if "soc_id" in devices[0]:
        options["soc_model"] = str(devices[0]["soc_id"])
    native_log("info", f"Device config: soc_id {devices[0].get('soc_id')}, dsp_arch {devices[0].get('dsp_arch')}")
    named = [g for g in config.get("graphs") or [] if graph_name in (g.get("graph_names") or [])]
    others = sorted({n for g in config.get("graphs") or [] for n in g.get("graph_names") or []} - {graph_name})
    if named:
        if "vtcm_mb" in named[0]:
            options["vtcm_mb"] = str(named[0]["vtcm_mb"])
        if "O" in named[0]:
            options["htp_graph_finalization_optimization_mode"] = str(int(named[0]["O"]))
    if others:
        native_log("warning", f"Graph config for {others} not applied: the model has no such graph "
                              f"(its graph is '{graph_name}')")
    return None


def _compile(model_bytes: bytes, graph_name: str, options: dict) -> bytes:
    import onnx
    import onnxruntime as ort
    import onnxruntime_qnn
    from qnn_tasks.toolchains.ort_qnn import ep_devices

    with tempfile.TemporaryDirectory(prefix="standin-ctxgen-") as tmp:
        backend_dir = Path(tmp) / "backend"
        backend_dir.mkdir()
        _build_shim(backend_dir)
        real_backend = Path(onnxruntime_qnn.get_qnn_htp_path())
        os.environ["QNN_STANDIN_REAL_BACKEND"] = str(real_backend)
        os.environ["QNN_STANDIN_GRAPH_NAME"] = graph_name
        model_path = Path(tmp) / f"{graph_name}.onnx"
        model_path.write_bytes(model_bytes)
        so = ort.SessionOptions()
        so.log_severity_level = 2
        so.add_provider_for_devices(ep_devices(), {**options, "backend_path": str(backend_dir / "libQnnHtp.so")})
        out = Path(tmp) / f"{graph_name}_ctx.onnx"
        try:
            ort.ModelCompiler(so, str(model_path), flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED
                              ).compile_to_file(str(out))
        except Exception as err:  # noqa: BLE001 - any compiler failure is a failed graph
            raise RuntimeError(str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__) from None
        compiled = onnx.load(str(out), load_external_data=False)
        rejected = [f"{n.op_type} '{n.name or n.output[0]}'" for n in compiled.graph.node if n.op_type != "EPContext"]
        if rejected:
            raise RuntimeError(f"op(s) not supported by the HTP backend: {', '.join(rejected)}")
        return out.with_name(f"{graph_name}_ctx_qnn.bin").read_bytes()


def _build_shim(backend_dir: Path) -> None:
    """The shim backend next to the wheel's other QNN libraries (onnxruntime loads those beside the backend)."""
    import onnxruntime_qnn

    wheel = Path(onnxruntime_qnn.get_qnn_htp_path()).parent
    for lib in wheel.glob("*.so"):
        if lib.name != "libQnnHtp.so":
            (backend_dir / lib.name).symlink_to(lib)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise RuntimeError("the stand-in needs a host C compiler (cc/gcc) for its backend shim")
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(backend_dir / "libQnnHtp.so"), str(SHIM_SOURCE),
                    "-ldl"], check=True)
