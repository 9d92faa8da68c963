"""ort-qnn: ONNX Runtime's QNN execution provider from pip (`onnxruntime-qnn`, Linux x86-64).

Compiles a QNN context binary offline with onnxruntime's compile API and the wheel's HTP
backend; the same wheel's x86 HTP simulator runs it for verification (docs/toolchains.md).
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import time
from pathlib import Path
from typing import Any

from qnn_tasks import fileio
from qnn_tasks.errors import SpecError, StageError, ToolchainError, one_line
from qnn_tasks.modelspec import precision_table
from qnn_tasks.modelspec.project import GraphSpec, Soc, ToolchainProfile
from qnn_tasks.nativelog import native_output_to
from qnn_tasks.toolchains import repairstep
from qnn_tasks.toolchains.base import GraphStage, StageInput, quantized_outputs, quantized_precision

INSTALL_HINT = "pip install onnxruntime-qnn (the wheel exists for Linux x86-64 only)"
EP_NAME = "QNNExecutionProvider"
# Provider options a profile may set; the chip's own (soc_model, vtcm_mb) come from socs.yaml.
KNOWN_OPTIONS = {
    "htp_graph_finalization_optimization_mode", "htp_performance_mode", "enable_htp_fp16_precision",
    "offload_graph_io_quantization", "profiling_level", "profiling_file_path", "dump_json_qnn_graph",
    "json_qnn_graph_dir", "qnn_context_priority", "enable_htp_spill_fill_buffer", "enable_htp_shared_memory_allocator",
    "rpc_control_latency", "device_id", "op_packages", "skip_qnn_version_check", "enable_htp_weight_sharing",
    "htp_bf16_enable",
}
MANAGED_OPTIONS = {"backend_path": "chosen from the installed wheel", "backend_type": "always htp",
                   "soc_model": "set per chip from socs/socs.yaml", "htp_arch": "implied by soc_model",
                   "vtcm_mb": "set per chip from socs/socs.yaml (vtcm_mb)"}
DEFAULT_OPTIONS = {"htp_graph_finalization_optimization_mode": "3"}
CONFIG_FILE = "provider_options.json"
FALLBACK_HINTS = {
    "Erf": "often left on CPU by onnxsim's fuse_preceding_mul_into_conv folding GELU's x0.5 into a Conv: "
           "add simplify: {skip_optimizers: [fuse_preceding_mul_into_conv]}",
    "Neg": 'add "rewrites: [neg]" to the graph in model.yaml (Sub(0, x)), or write a - b at export',
    "ReduceSumSquare": 'add "rewrites: [reduce-sum-square]" to the graph in model.yaml (ReduceSum(Mul(x, x)) runs on HTP)',
    "Clip": 'its min/max is computed: add "rewrites: [clip-computed]" to the graph in model.yaml (Max/Min run on HTP)',
    "Pow": 'for Pow(x, 2) add "rewrites: [pow-square]" to the graph in model.yaml (Mul(x, x))',
    "If": 'add "rewrites: [fold-if]" to the graph in model.yaml (with constant_inputs for what its condition reads), '
          'or for a data-dependent condition with pure, cheap branches "rewrites: [if-to-where]" (doit lint says which '
          "applies), or constant-fold the condition at export",
    "Loop": "unroll at export", "Scan": "unroll at export",
    # measured on SM7550 (w8a16 only): ReduceL2's inner multiply stays float and is refused (3110);
    # the same norm written out quantizes and runs on HTP
    "ReduceL2": "on a chip that runs only quantized graphs, write it as Sqrt(ReduceSum(Mul(x, x))) at export",
}
# ops whose fallback a built-in rewrite fixes: the message names the graph's own model.yaml line
FALLBACK_REWRITES = {"Neg": "neg", "ReduceSumSquare": "reduce-sum-square", "Clip": "clip-computed",
                     "Pow": "pow-square", "If": "fold-if"}


class OrtQnnToolchain:
    kind = "ort-qnn"

    def __init__(self, profile: ToolchainProfile) -> None:
        self.profile = profile
        self.options = self._validated_options(profile)
        self.versions = installed_versions(profile)

    # ------------------------------------------------------------ identity
    def id(self) -> str:
        if self.versions["onnxruntime-qnn"] is None:
            return "ort-qnn-not-installed"
        return f"ort-qnn-{self.versions['onnxruntime-qnn']}-qnn{self.versions['qnn']}-ort{self.versions['onnxruntime']}"

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.versions, "options": self.options}

    def graph_stages(self, precision: str) -> list[GraphStage]:
        if not precision_table.is_quantized(precision):
            return []
        return [GraphStage(name="quantize", doc="Quantize each w8a16 or w4a16 graph to QDQ (8- or 4-bit weights, "
                           "16-bit activations) with onnxruntime's QNN flow, calibrated on real inputs",
                           outputs=quantized_outputs, run=self._quantize, needs_calibration=True)]

    def _quantize(self, si: StageInput) -> dict[str, Any]:
        self.require_installed()
        from qnn_tasks.toolchains import ort_quantize  # imports numpy/onnxruntime: only when a quantize task runs

        return ort_quantize.run(si)

    # ------------------------------------------------------------ config
    def config_files(self, graph: GraphSpec) -> list[str]:
        return [CONFIG_FILE]

    def write_config(self, graph: GraphSpec, precision: str, soc: Soc, out_dir: Path) -> dict[str, Any]:
        self.require_installed()
        options = {**self.options, "soc_model": str(soc.soc_id), "vtcm_mb": str(soc.vtcm_mb)}
        if precision_table.is_quantized(precision):
            options.setdefault("offload_graph_io_quantization", "0")  # keep graph I/O quantization on HTP
        fileio.write_json(out_dir / CONFIG_FILE, options)
        return {"provider_options": options}

    # ------------------------------------------------------------ compile
    def context_files(self, graph: GraphSpec) -> list[str]:
        return [f"{graph.name}_ctx.onnx", f"{graph.name}_ctx_qnn.bin"]

    def compile(self, graph: GraphSpec, soc: Soc, source: Path, config_dir: Path, out_dir: Path,
                promoted: Path | None = None) -> dict[str, Any]:
        """Compile `source` for `soc`, or adopt the binary a repair compiled from the same QDQ with the same options
        (`promoted`: its promoted.json; toolchains/repairstep.py); the same checks either way."""
        self.require_installed()
        options = fileio.read_json(config_dir / CONFIG_FILE)
        adopted = repairstep.binary(promoted, source, soc.name, options)
        log = out_dir / "compile.log"
        out_dir.mkdir(parents=True, exist_ok=True)
        log.write_text(f"# compile {source} for {soc.name} (soc_model {soc.soc_id}) with {self.id()}\n"
                       f"# provider options: {options}\n")
        for name in self.context_files(graph):  # a failed rebuild must not leave the old binary looking current
            (out_dir / name).unlink(missing_ok=True)
        staging = out_dir / ".staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            ctx_onnx = staging / f"{graph.name}_ctx.onnx"
            precision = quantized_precision(source.name) or "fp16"  # quantized_outputs() names it
            bin_path = staging / f"{graph.name}_ctx_qnn.bin"
            if adopted:
                fileio.place(adopted["ctx_onnx"], ctx_onnx)
                fileio.place(adopted["bin"], bin_path)
                seconds = adopted["compile_seconds"]
                with open(log, "a") as fh:
                    fh.write(f"# adopted {adopted['bin']}: the repair compiled this QDQ with these options\n")
            else:
                seconds = compile_context(source, ctx_onnx, options, log,
                                          context={"soc": soc, "graph": graph, "precision": precision})
            partition = cpu_partition(ctx_onnx)
            if not bin_path.is_file():
                raise ToolchainError(f"compile of '{graph.name}' for {soc.name} wrote no {bin_path.name} (log: {log})")
            from qnn_tasks.qnn import binary as qnnbin

            info = qnnbin.read_binary_info(bin_path).to_dict()
            info["path"] = None  # set once the binary is in place; a failed check leaves no file to point at
            record = {"compile_seconds": round(seconds, 3), "provider_options": options, "partition": partition,
                      "bin_size": bin_path.stat().st_size, "binary": info, "log": str(log), "warnings": [],
                      **({"adopted_from_repair": str(adopted["bin"])} if adopted else {})}
            check_chip(info, soc, bin_path, record)
            check_fallback(graph, soc, partition, record, log, precision)
            for name in self.context_files(graph):
                (staging / name).replace(out_dir / name)
            record["binary"]["path"] = str(out_dir / f"{graph.name}_ctx_qnn.bin")
            return record
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def compile_variant(self, model: Path, provider_options: dict[str, str], out_dir: Path,
                        name: str | None = None) -> Path:
        """Compile a derived model (diagnostic graph, graph cut, repair step) with a chip's options; no checks.
        Its files are `<name>_ctx.onnx` and `<name>_ctx_qnn.bin` (`name`: the model file's stem unless given)."""
        self.require_installed()
        out_dir.mkdir(parents=True, exist_ok=True)
        out = out_dir / f"{name or model.stem}_ctx.onnx"
        compile_context(model, out, provider_options, out_dir / "compile.log")
        return out

    # ------------------------------------------------------------ helpers
    def check(self) -> dict[str, Any]:
        """`doit toolcheck`: the installed versions; fails naming what is missing."""
        self.require_installed()
        return {"versions": self.versions}

    def require_installed(self) -> None:
        if self.versions["onnxruntime-qnn"] is None:
            raise ToolchainError(f"onnxruntime-qnn is not installed: {INSTALL_HINT}")
        if self.versions["onnxruntime"] is None:
            raise ToolchainError("onnxruntime is not installed: pip install onnxruntime")

    @staticmethod
    def _validated_options(profile: ToolchainProfile) -> dict[str, str]:
        options = dict(DEFAULT_OPTIONS)
        for key, value in profile.options.items():
            if key in MANAGED_OPTIONS:
                raise SpecError(profile.file, f"options.{key}", f"is managed by the tool ({MANAGED_OPTIONS[key]})",
                                "remove it from the profile")
            if key not in KNOWN_OPTIONS:
                raise SpecError(profile.file, f"options.{key}", "unknown QNN execution provider option",
                                f"use one of: {', '.join(sorted(KNOWN_OPTIONS))}")
            options[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return options


def installed_versions(profile: ToolchainProfile | None = None) -> dict[str, str | None]:
    """onnxruntime, onnxruntime-qnn and the QNN SDK it bundles: from metadata, nothing imported.

    For a profile with pinned `packages:`, from its own environment (created on first use).
    """
    if profile is not None and profile.packages:
        from qnn_tasks.toolchains import envs

        env = envs.ensure(profile)
        versions = {package: env.version(package) for package in ("onnxruntime", "onnxruntime-qnn")}
        versions["qnn"] = _bundled_qnn(env.site_packages / "onnxruntime_qnn") if versions["onnxruntime-qnn"] else None
        return versions
    from qnn_tasks.modelspec import installed

    versions = {package: installed.version(package) for package in ("onnxruntime", "onnxruntime-qnn")}

    def bundled() -> str | None:
        spec = importlib.util.find_spec("onnxruntime_qnn")
        return _bundled_qnn(Path(spec.origin).parent) if spec and spec.origin else None
    versions["qnn"] = installed.remembered("onnxruntime-qnn:qnn", bundled) if versions["onnxruntime-qnn"] else None
    return versions


def _bundled_qnn(package_dir: Path) -> str:
    info = package_dir / "build_and_package_info.py"
    match = re.search(r"qnn_version\s*=\s*['\"]([^'\"]+)", info.read_text()) if info.is_file() else None
    return match.group(1) if match else "unknown"


_REGISTERED = False


def ep_devices() -> list:
    """The QNN EP's devices, registering the plugin library once per process."""
    global _REGISTERED
    import onnxruntime as ort
    import onnxruntime_qnn

    if not _REGISTERED:
        if not any(d.ep_name == EP_NAME for d in ort.get_ep_devices()):  # another caller may have registered it
            ort.register_execution_provider_library(EP_NAME, onnxruntime_qnn.get_library_path())
        _REGISTERED = True
    return [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]


def session_options(provider_options: dict[str, str], disable_cpu_fallback: bool = False):
    """SessionOptions with the QNN EP on the wheel's HTP backend."""
    import onnxruntime as ort
    import onnxruntime_qnn

    so = ort.SessionOptions()
    so.log_severity_level = 2
    if disable_cpu_fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(ep_devices(), {**provider_options, "backend_path": onnxruntime_qnn.get_qnn_htp_path()})
    return so


def compile_context(model: Path, out: Path, options: dict[str, str], log: Path,
             context: dict[str, Any] | None = None) -> float:
    """Compile; a failure is one line with the first logged error and what each QNN code in the log means.

    `context` (soc, graph, precision) makes the QNN error explanations name this chip and graph.
    """
    import onnxruntime as ort

    from qnn_tasks.qnn.errorcodes import explain_file, suffix
    from qnn_tasks.toolchains import ort_bodies

    start = time.perf_counter()
    copy_dir = out.parent / f".{out.stem}_source"
    try:
        source, moved = ort_bodies.staged(model, copy_dir)
        if moved:
            with open(log, "a") as fh:
                fh.write(f"# compiled from {source}: the initializers of If/Loop/Scan bodies ({', '.join(moved)}) "
                         f"kept in {ort_bodies.BODY_DATA} beside it, which onnxruntime's compile writes inline\n")
        with native_output_to(log):
            compiler = ort.ModelCompiler(session_options(options), str(source),
                                         flags=ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED)
            compiler.compile_to_file(str(out))
    except Exception as err:
        with open(log, "a") as fh:
            fh.write(f"\n# FAILED: {type(err).__name__}: {err}\n")
        message = one_line(err)
        cause = first_logged_error(log)
        hints = suffix(explain_file(log, "compile", **(context or {})))
        raise ToolchainError(f"compile of {model} failed: {message}" + dropped_constant(model, message)
                             + (f"; first error in the log: {cause}" if cause else "") + hints
                             + f" (full log: {log})") from None
    finally:
        shutil.rmtree(copy_dir, ignore_errors=True)
    return time.perf_counter() - start


# onnxruntime's words for a tensor that no earlier node makes, on one line
_DANGLING = re.compile(r"input '([^']+)' of node: name: (\S*) OpType: (\S+) is not output of any previous nodes")


def dropped_constant(model: Path, message: str) -> str:
    """Why the compile found no producer for a tensor, when the model says: a main-graph constant that only an
    If/Loop/Scan body reads, which onnxruntime's compile leaves out of the CPU part it writes; else ""."""
    match = _DANGLING.search(message)
    if not match:
        return ""
    import onnx

    from qnn_tasks.rewrites import branchweights

    try:
        graph = onnx.load(str(model), load_external_data=False).graph
    except Exception:  # a model that does not load has no structure to explain from
        return ""
    name, node, op = match.groups()
    bodies = branchweights.readers(graph).get(name)
    if not bodies:
        return ""
    return (f"; '{name}' (read by {op} node '{node}') is a constant of the main graph that only "
            f"{' and '.join(bodies)} reads: onnxruntime's compile drops those (onnxruntime issue #32131) (fix: the "
            "export stage copies such constants into the bodies that read them, unless stored as external data: keep "
            f"'{name}' inside the .onnx, or copy it into the body's initializers at export)")


def first_logged_error(log: Path) -> str | None:
    """The first error line ONNX Runtime/QNN wrote to the log (the real cause; the exception is often generic)."""
    for line in log.read_text(errors="replace").splitlines():
        match = re.search(r"\[E:onnxruntime[^\]]*\]\s*(.*?)(\x1b\[m)?$", line)
        if match:
            return match.group(1).strip()
    return None


def cpu_partition(ctx_onnx: Path) -> dict[str, Any]:
    """Nodes of the compiled model outside the EPContext (NPU) partition: they would run on CPU."""
    import onnx

    model = onnx.load(str(ctx_onnx), load_external_data=False)
    npu = [n for n in model.graph.node if n.op_type == "EPContext"]
    cpu = [{"name": n.name or n.output[0], "op_type": n.op_type, "hint": FALLBACK_HINTS.get(n.op_type, "")}
           for n in model.graph.node if n.op_type != "EPContext"]
    meta = {p.key: p.value for p in model.metadata_props}
    return {"npu_partitions": len(npu), "cpu_nodes": cpu,
            "ep_compatibility_info": meta.get(f"ep_compatibility_info.{EP_NAME}")}


def check_chip(info: dict[str, Any], soc: Soc, bin_path: Path, record: dict[str, Any]) -> None:
    """The binary must say it was built for the target row's soc_model and arch."""
    problem = soc.binary_mismatch(info)
    if problem:
        raise StageError(f"{bin_path}: built for the wrong chip for {soc.name}: {problem} (fix: check {soc.where()})",
                         record)


def check_fallback(graph: GraphSpec, soc: Soc, partition: dict[str, Any], record: dict[str, Any],
                   log: Path | None = None, precision: str | None = None) -> None:
    nodes = partition["cpu_nodes"]
    if not nodes:
        return
    groups: dict[tuple[str, str], list[str]] = {}  # one hint per op type: 13 Erf nodes once said it 13 times
    for n in nodes:
        groups.setdefault((n["op_type"], _graph_hint(graph, n) if n["hint"] else ""), []).append(n["name"])
    listing = "; ".join(_fallback_sites(op, names) + (f" ({hint})" if hint else "") for (op, hint), names in groups.items())
    message = f"{len(nodes)} node(s) of graph '{graph.name}' fall back to CPU on {soc.name}: {listing}"
    if log is not None:  # why QNN refused them (e.g. 3110: float ops inside a quantized graph on a mid-range HTP)
        from qnn_tasks.qnn.errorcodes import explain_file, suffix

        message += suffix(explain_file(log, "fallback", soc=soc, graph=graph, precision=precision))
    if graph.allow_cpu_fallback:
        record["warnings"].append(message)
        return
    raise StageError(message + " (fix them at export, or set allow_cpu_fallback: true for this graph)", record)


SHOWN_SITES = 3  # a fallback names this many nodes of an op type, then counts the rest


def _fallback_sites(op: str, names: list[str]) -> str:
    """"Erf 'a'", or "13 Erf nodes ('a', 'b', 'c' and 10 more)"."""
    if len(names) == 1:
        return f"{op} '{names[0]}'"
    more = f" and {len(names) - SHOWN_SITES} more" if len(names) > SHOWN_SITES else ""
    return f"{len(names)} {op} nodes (" + ", ".join(f"'{n}'" for n in names[:SHOWN_SITES]) + more + ")"


def _graph_hint(graph: GraphSpec, node: dict[str, Any]) -> str:
    """The node's hint, with "the graph in model.yaml" made this graph's own model.yaml key."""
    rewrite = FALLBACK_REWRITES.get(node["op_type"])
    if rewrite is None:
        return node["hint"]
    from qnn_tasks.rewrites import yaml_fix

    line = yaml_fix(rewrite, graph.name, graph.model, graph.rewrites)
    return node["hint"].replace(f'add "rewrites: [{rewrite}]" to the graph in model.yaml', line)
