"""qairt: the QAIRT SDK's own tools, run exactly as the guide (docs/toolchains.md) and sherpa-onnx run them.

Per graph variant (once, not per chip):
    convert   python qnn-onnx-converter --input_network <simplified.onnx> --output_path <g>.cpp
              fp16:  --float_bitwidth 16 --act_bitwidth 16 --bias_bitwidth 32
              w8a16: --input_list input_list.txt [--use_native_input_files] --weights_bitwidth 8
                     --act_bitwidth 16 --bias_bitwidth 32   (w4a16: --weights_bitwidth 4)
    modellib  LDFLAGS=-Wl,-z,max-page-size=16384 python qnn-model-lib-generator -c <g>.cpp -b <g>.bin
              -o model_libs -t x86_64-linux-clang aarch64-android      (+ readelf -lW: 16 KB LOAD alignment)
Per chip:
    config    provider_options.json (simverify's ORT options), htp_backend_extensions.json, htp_config.json
    context   qnn-context-binary-generator --backend lib/x86_64-linux-clang/libQnnHtp.so --model
              model_libs/x86_64-linux-clang/lib<g>.so --output_dir binary --binary_file <g>
              --config_file htp_backend_extensions.json
              -> binary/<g>.bin (checked with qnnbin), binary/runtime_libs.json, <graph>_ctx.onnx (EPContext
                 wrapper: what simverify loads on the x86 HTP simulator)

<g> is the QNN graph name: the .cpp basename, which the converter turns into the graph name; the
model.yaml graph name with '-' turned into '_' (any other character is an error). The SDK's version
(its qairt/<version> folder, else sdk.yaml) is in id() and fingerprint(). Decisions:
* No Android NDK: the aarch64-android model lib is not built; the stage passes with a warning naming
  the reason (the context binary is built from the x86_64 lib and does not need it). With an NDK, a
  failed or non-16 KB aarch64 lib fails the stage.
* diagnose (compile_variant) is not supported with this toolchain (each variant would be a full
  convert + model lib + context run); it says so and points at QNN_TOOLCHAIN=ort-qnn.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from qnn_tasks import fileio
from qnn_tasks.errors import SpecError, StageError, ToolchainError
from qnn_tasks.modelspec import precision_table
from qnn_tasks.modelspec.project import GraphSpec, Soc, ToolchainProfile
from qnn_tasks.toolchains import qairt_sdk as sdkmod
from qnn_tasks.toolchains import qairt_tools as tools
from qnn_tasks.toolchains.base import GraphStage, StageInput

SETTINGS = {"sdk_root": "the qairt/<version> folder (default: $QNN_SDK_ROOT)",
            "python": "the SDK converter's Python 3.10 (default: python3.10 on PATH)",
            "ndk": "the Android NDK root (default: $ANDROID_NDK_ROOT, else ndk-build on PATH)",
            "model_lib_targets": "model libraries to build",
            # read by other parts of the tool (phone verification), passed through untouched:
            "device": "phone verification settings (doit verify)",
            "runtime_libs": "Android runtime libs for phone verification (doit verify)"}
PATH_SETTINGS = ("sdk_root", "python", "ndk")
OPTIONS = {"converter_args": "extra qnn-onnx-converter flags, e.g. [--input_layout, x, NTF]"}
TARGETS = (sdkmod.HOST, sdkmod.ANDROID)
LDFLAGS = "-Wl,-z,max-page-size=16384"
MANAGED_FLAGS = {"--input_network", "-i", "--output_path", "-o", "--input_list", "--float_bitwidth", "--act_bitwidth",
                 "--weights_bitwidth", "--bias_bitwidth", "--use_native_input_files", "--float_bw", "--act_bw",
                 "--weight_bw", "--bias_bw"}
CONFIG_FILES = ["provider_options.json", "htp_backend_extensions.json", "htp_config.json"]
MODEL_LIBS_RECORD = "model_libs.json"
NO_DIAGNOSE = ("diagnose compiles many derived graphs (per-node taps, graph cuts); with the qairt toolchain each one "
               "would be a full convert + model lib + context binary run, which is not supported yet (fix: run "
               "diagnose with QNN_TOOLCHAIN=ort-qnn: same simplified ONNX, same chip, on the same simulator)")


class QairtToolchain:
    kind = "qairt"

    def __init__(self, profile: ToolchainProfile) -> None:
        self.profile = profile
        self.settings = _validated_settings(profile)
        self.options = _validated_options(profile)
        self.targets: list[str] = self.settings["model_lib_targets"]
        self.sdk = sdkmod.locate(self.settings.get("sdk_root"))
        self.python, self.python_problem = sdkmod.python_for_sdk(self.settings.get("python"))
        if sdkmod.ANDROID in self.targets:
            self.ndk, self.ndk_note = sdkmod.find_ndk(self.settings.get("ndk"))
        else:
            self.ndk, self.ndk_note = None, "not needed (aarch64-android is not in settings.model_lib_targets)"

    # ------------------------------------------------------------ identity (cheap: small files only)
    def id(self) -> str:
        return f"qairt-{self.sdk.version}" if self.sdk.version else "qairt-no-sdk"

    def fingerprint(self) -> dict[str, Any]:
        return {"kind": self.kind, "sdk": self.sdk.identity(), "python": str(self.python) if self.python else None,
                "python_version": sdkmod.python_version(self.python), "model_lib_targets": self.targets,
                "options": self.options}

    # ------------------------------------------------------------ graph stages
    def graph_stages(self, precision: str) -> list[GraphStage]:
        return [
            GraphStage(name="convert", doc="Convert each graph variant to a QNN C++ graph + weights with the SDK's "
                                           "qnn-onnx-converter (once per variant; w8a16/w4a16 calibrated on real "
                                           "inputs)",
                       outputs=self._convert_outputs, run=self._convert,
                       needs_calibration=precision_table.is_quantized(precision)),
            GraphStage(name="modellib", doc="Build the x86_64 (and aarch64-android, 16 KB pages) model libraries "
                                            "with the SDK's qnn-model-lib-generator (once per variant)",
                       outputs=self._modellib_outputs, run=self._modellib),
        ]

    @staticmethod
    def _convert_outputs(graph: GraphSpec, precision: str, out_dir: Path) -> list[Path]:
        name = tools.qnn_graph_name(graph.name)[0]
        return [out_dir / f"{name}.cpp", out_dir / f"{name}.bin", out_dir / f"{name}_net.json"]

    def _modellib_outputs(self, graph: GraphSpec, precision: str, out_dir: Path) -> list[Path]:
        name = tools.qnn_graph_name(graph.name)[0]
        libs = [out_dir / "model_libs" / sdkmod.HOST / f"lib{name}.so"]
        if sdkmod.ANDROID in self.targets and self.ndk is not None:  # without an NDK it is not built (a warning)
            libs.append(out_dir / "model_libs" / sdkmod.ANDROID / f"lib{name}.so")
        return libs + [out_dir / MODEL_LIBS_RECORD]

    def _convert(self, si: StageInput) -> dict[str, Any]:
        python = self._require(python=True)
        name, problem = tools.qnn_graph_name(si.graph.name)
        if problem:
            raise StageError(problem)
        out = si.out_dir
        for path in self._convert_outputs(si.graph, si.precision, out):
            path.unlink(missing_ok=True)
        tools.reset_command_file(out)
        cpp = out / f"{name}.cpp"
        command: list[Any] = [python, self.sdk.path(sdkmod.CONVERTER), "--input_network", si.source, "--output_path", cpp]
        record: dict[str, Any] = {"graph_name": name, "renamed": name != si.graph.name}
        if precision_table.is_repaired(si.precision):
            raise StageError(f"convert of '{si.graph.name}': qairt does not build {si.precision} (its repair keeps "
                             "weights at 16 bits through onnxruntime's quantizer overrides) (fix: build it with an "
                             "ort-qnn toolchain, or precision: w8a16)")
        if precision_table.is_quantized(si.precision):
            if si.calibration is None:
                raise StageError(f"convert of '{si.graph.name}' ({si.precision}) has no calibration set")
            input_list, native, count = tools.write_input_list(si.graph, si.calibration, out)
            command += ["--input_list", input_list] + (["--use_native_input_files"] if native else [])
            bits = precision_table.BY_NAME[si.precision].weight_bits
            command += ["--weights_bitwidth", str(bits), "--act_bitwidth", "16", "--bias_bitwidth", "32"]
            record.update(input_list=str(input_list), calibration_samples=count, native_input_files=native)
        else:
            command += ["--float_bitwidth", "16", "--act_bitwidth", "16", "--bias_bitwidth", "32"]
        command += self.options["converter_args"]
        run = tools.run_tool("qnn-onnx-converter", command, out, sdkmod.environment(self.sdk))
        log = Path(run["log"])
        record.update(command=run["command"], log=run["log"], tool_seconds=run["seconds"], warnings=tools.warnings_in(log))
        if run["returncode"] != 0 or not cpp.is_file():
            ops = tools.rejected_ops(log)
            record["rejected_ops"] = ops
            if ops:
                listing = "; ".join(f"{o['op_type']}" + (f" (node '{o['node']}')" if o["node"] else "")
                                    + (f": {o['hint']}" if o["hint"] else "") for o in ops)
                cause = f"the converter rejected op(s) {listing}"
            else:
                errors = tools.errors_in(log)
                cause = f"qnn-onnx-converter exit {run['returncode']}: {errors[-1] if errors else tools.tail(log)}"
            raise StageError(f"convert of '{si.graph.name}' ({si.precision}) failed: {cause} (fix it at export; "
                             f"log: {log})", record)
        written = tools.graph_name_in_cpp(cpp)
        if written != name:
            raise StageError(f"{cpp}: the converter named the graph '{written}', expected '{name}' (the HTP config "
                             f"must name the graph exactly as the converter does; log: {log})", record)
        record.update(cpp=str(cpp), bin=str(cpp.with_suffix(".bin")), bin_size=cpp.with_suffix(".bin").stat().st_size)
        return record

    def _modellib(self, si: StageInput) -> dict[str, Any]:
        python = self._require(python=True)
        cpp = si.source
        name = tools.graph_name_in_cpp(cpp) or tools.qnn_graph_name(si.graph.name)[0]
        out = si.out_dir
        libs_dir = out / "model_libs"
        shutil.rmtree(libs_dir, ignore_errors=True)
        (out / MODEL_LIBS_RECORD).unlink(missing_ok=True)
        tools.reset_command_file(out)
        env = sdkmod.environment(self.sdk)
        env["LDFLAGS"] = LDFLAGS
        if self.ndk is not None:
            env["ANDROID_NDK_ROOT"] = str(self.ndk)
            env["PATH"] = f"{self.ndk}{os.pathsep}{env.get('PATH', '')}"
        command = [python, self.sdk.path(sdkmod.MODEL_LIB_GENERATOR), "-c", cpp, "-b", cpp.with_suffix(".bin"),
                   "-o", libs_dir, "-t", *self.targets]
        run = tools.run_tool("qnn-model-lib-generator", command, out, env, shown_env={"LDFLAGS": LDFLAGS})
        log = Path(run["log"])
        warnings = tools.warnings_in(log)
        errors = tools.errors_in(log)
        record: dict[str, Any] = {"graph_name": name, "command": run["command"], "log": run["log"],
                                  "tool_seconds": run["seconds"], "returncode": run["returncode"], "ldflags": LDFLAGS,
                                  "ndk": {"root": str(self.ndk) if self.ndk else None, "found": self.ndk_note,
                                          "revision": sdkmod.ndk_revision(self.ndk) if self.ndk else None},
                                  "libs": {}, "warnings": warnings}
        for target in self.targets:
            lib = libs_dir / target / f"lib{name}.so"
            record["libs"][target] = {"path": str(lib), "built": lib.is_file(),
                                      "size": lib.stat().st_size if lib.is_file() else None}
        host = record["libs"][sdkmod.HOST]
        if not host["built"]:
            reason = next((e for e in errors if sdkmod.HOST in e), errors[-1] if errors else tools.tail(log))
            raise StageError(f"qnn-model-lib-generator did not build the {sdkmod.HOST} library of '{name}' "
                             f"(exit {run['returncode']}): {reason} (log: {log})", record)
        android = record["libs"].get(sdkmod.ANDROID)
        if android is not None:
            if android["built"]:
                android["page_check"] = tools.check_16k_pages(Path(android["path"]))
            else:
                reason = next((e for e in errors if sdkmod.ANDROID in e or "ndk" in e.lower()),
                              errors[-1] if errors else tools.tail(log))
                android["reason"] = reason
                if self.ndk is not None:
                    raise StageError(f"qnn-model-lib-generator did not build the {sdkmod.ANDROID} library of "
                                     f"'{name}' with the NDK at {self.ndk}: {reason} (log: {log})", record)
                warnings.append(f"{sdkmod.ANDROID} model library not built: {reason}; {self.ndk_note} (fix: install "
                                f"the Android NDK r26+ and set settings.ndk in toolchain/qairt.yaml or "
                                f"ANDROID_NDK_ROOT; the context binary is built from the {sdkmod.HOST} library and "
                                f"does not need it, qnn-net-run --model on a phone does)")
        fileio.write_json(out / MODEL_LIBS_RECORD, {"graph_name": name, "cpp": str(cpp), "libs": record["libs"],
                                                    "qairt_version": self.sdk.version})
        return record

    # ------------------------------------------------------------ config
    def config_files(self, graph: GraphSpec) -> list[str]:
        return list(CONFIG_FILES)  # [0]: simverify's ORT provider options

    def write_config(self, graph: GraphSpec, precision: str, soc: Soc, out_dir: Path) -> dict[str, Any]:
        self.sdk.require()
        name, problem = tools.qnn_graph_name(graph.name)
        if problem:
            raise StageError(problem)
        provider_options = {"soc_model": str(soc.soc_id), "vtcm_mb": str(soc.vtcm_mb)}
        extensions, htp_config = self._htp_config(name, soc, out_dir)
        fileio.write_json(out_dir / CONFIG_FILES[0], provider_options)
        fileio.write_json(out_dir / CONFIG_FILES[1], extensions)
        fileio.write_json(out_dir / CONFIG_FILES[2], htp_config)
        return {"graph_name": name, "provider_options": provider_options, "htp_backend_extensions": extensions,
                "htp_config": htp_config}

    def _htp_config(self, name: str, soc: Soc, out_dir: Path) -> tuple[dict, dict]:
        """htp_backend_extensions.json and htp_config.json, as sherpa-onnx's generate_config.py writes them."""
        extensions = {"backend_extensions": {
            "shared_library_path": str(self.sdk.path(sdkmod.NETRUN_EXTENSIONS)),
            "config_file_path": str(out_dir.resolve() / CONFIG_FILES[2])}}
        htp_config = {"graphs": [{"vtcm_mb": soc.vtcm_mb, "O": 3, "graph_names": [name]}],
                      "devices": [{"device_id": 0, "soc_id": soc.soc_id, "dsp_arch": soc.dsp_arch,
                                   "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 200}]}]}
        return extensions, htp_config

    # ------------------------------------------------------------ compile
    def context_files(self, graph: GraphSpec) -> list[str]:
        name = tools.qnn_graph_name(graph.name)[0]
        return [f"{graph.name}_ctx.onnx", f"binary/{name}.bin", "binary/runtime_libs.json"]

    def compile(self, graph: GraphSpec, soc: Soc, source: Path, config_dir: Path, out_dir: Path,
                promoted: Path | None = None) -> dict[str, Any]:  # no repair runs with this toolchain
        from qnn_tasks.qnn import binary as qnnbin
        from qnn_tasks.qnn import epcontext
        from qnn_tasks.toolchains.ort_qnn import check_chip

        self.sdk.require()
        name = self._graph_name_of(source) or tools.qnn_graph_name(graph.name)[0]
        extensions_file = config_dir / CONFIG_FILES[1]
        self._check_config(name, soc, config_dir)
        produced = [out_dir / f for f in self.context_files(graph)]
        for path in produced:
            path.unlink(missing_ok=True)
        tools.reset_command_file(out_dir)
        binary_dir = out_dir / "binary"
        command = [self.sdk.path(sdkmod.CONTEXT_GENERATOR), "--backend", self.sdk.path(sdkmod.HTP_BACKEND),
                   "--model", source, "--output_dir", binary_dir, "--binary_file", name, "--config_file", extensions_file]
        start = time.perf_counter()
        run = tools.run_tool("qnn-context-binary-generator", command, out_dir, sdkmod.environment(self.sdk))
        log = Path(run["log"])
        record: dict[str, Any] = {"graph_name": name, "command": run["command"], "log": run["log"],
                                  "compile_seconds": round(time.perf_counter() - start, 3),
                                  "provider_options": fileio.read_json(config_dir / CONFIG_FILES[0]),
                                  "partition": {"npu_partitions": 1, "cpu_nodes": [],
                                                "note": "one QNN graph from the SDK converter (ops it cannot take fail convert)"},
                                  "warnings": tools.warnings_in(log)}
        bin_path = binary_dir / f"{name}.bin"
        try:
            if run["returncode"] != 0 or not bin_path.is_file():
                errors = tools.errors_in(log)
                from qnn_tasks.qnn.errorcodes import explain_file, suffix

                hints = suffix(explain_file(log, "compile", soc=soc, graph=graph))  # QNN codes in the SDK log
                raise StageError(f"qnn-context-binary-generator failed for '{name}' on {soc.name} (exit "
                                 f"{run['returncode']}): {errors[-1] if errors else tools.tail(log)}{hints} (log: {log})",
                                 record)
            try:
                info = qnnbin.read_binary_info(bin_path).to_dict()
            except qnnbin.QnnBinError as err:
                raise StageError(f"{err} (log: {log})", record) from None
            record.update(binary=info, bin_size=bin_path.stat().st_size)
            check_chip(info, soc, bin_path, record)
            graphs = [g["name"] for g in info["graphs"]]
            if graphs != [name]:
                raise StageError(f"{bin_path}: holds graph(s) {graphs}, expected exactly '{name}' (the graph the "
                                 f"converter made and htp_config.json configures; log: {log})", record)
            record["wrapper"] = epcontext.write_wrapper(out_dir / f"{graph.name}_ctx.onnx", bin_path, graph, info, name)
            if record["wrapper"]["adapters"]:
                listing = ", ".join(f"{a['tensor']} ({a['qnn_dtype']})" for a in record["wrapper"]["adapters"])
                record["warnings"].append(
                    f"the binary's I/O types differ from model.yaml's: {listing}; the EPContext wrapper converts them "
                    f"with nodes that run on CPU, so simverify (CPU fallback disabled) cannot load it (fix: add "
                    f"--preserve_io datatype to options.converter_args in toolchain/qairt.yaml)")
            libs = sdkmod.runtime_libs(self.sdk, soc.dsp_arch)
            fileio.write_json(binary_dir / "runtime_libs.json", libs)
            record["runtime_libs"] = {"path": str(binary_dir / "runtime_libs.json"), "missing": libs["missing"],
                                      "libs": [lib["name"] for lib in libs["libs"]]}
            if libs["missing"]:
                record["warnings"].append(f"QAIRT {self.sdk.version} lacks runtime libs for {soc.dsp_arch}: "
                                          f"{', '.join(libs['missing'])} (a phone needs them; see {binary_dir / 'runtime_libs.json'})")
            return record
        except Exception:
            for path in produced:  # a failed build leaves no binary that looks done
                path.unlink(missing_ok=True)
            raise

    def _graph_name_of(self, host_lib: Path) -> str | None:
        """The graph name the modellib stage recorded beside model_libs/ (from the converter's .cpp)."""
        try:
            return fileio.read_json(host_lib.parents[2] / MODEL_LIBS_RECORD).get("graph_name")
        except (OSError, ValueError, IndexError):
            return None

    def _check_config(self, name: str, soc: Soc, config_dir: Path) -> None:
        """The HTP config must name the converter's graph; its extensions file must point at this config dir."""
        htp_file = config_dir / CONFIG_FILES[2]
        try:
            htp_config = fileio.read_json(htp_file)
        except (OSError, ValueError) as err:
            raise StageError(f"{htp_file}: unreadable ({err}) (fix: rerun doit config)") from None
        named = [n for g in htp_config.get("graphs", []) for n in g.get("graph_names", [])]
        if name not in named:
            raise StageError(f"{htp_file} configures graph(s) {named}, the converter named the graph '{name}': the HTP "
                             f"settings would not apply (fix: rerun the config task)")
        extensions_file = config_dir / CONFIG_FILES[1]
        extensions, _ = self._htp_config(name, soc, config_dir)
        if fileio.read_json(extensions_file) != extensions:  # e.g. the project was moved: absolute paths changed
            fileio.write_json(extensions_file, extensions)

    def compile_variant(self, model: Path, provider_options: dict[str, str], out_dir: Path,
                        name: str | None = None) -> Path:
        raise ToolchainError(NO_DIAGNOSE)

    # ------------------------------------------------------------ checks
    def check(self) -> dict[str, Any]:
        """`doit toolcheck`: the SDK's own dependency checks plus what this toolchain needs; says what is missing."""
        problems: list[str] = []
        record: dict[str, Any] = {"sdk_root": str(self.sdk.root) if self.sdk.root else None, "sdk_from": self.sdk.source,
                                  "qairt_version": self.sdk.version, "python": str(self.python) if self.python else None,
                                  "ndk": str(self.ndk) if self.ndk else None, "ndk_found": self.ndk_note, "checks": []}
        if self.sdk.problem:
            problems.append(self.sdk.problem)
        else:
            try:
                env = sdkmod.environment(self.sdk)
            except ToolchainError as err:
                problems.append(str(err))
                env = None
            if env is not None:
                runs = [("check-linux-dependency.sh", ["bash", self.sdk.path(sdkmod.CHECK_LINUX)])]
                if self.python_problem:
                    problems.append(self.python_problem)
                else:
                    runs.append(("check-python-dependency", [self.python, self.sdk.path(sdkmod.CHECK_PYTHON)]))
                for label, command in runs:
                    result = _run_check(label, command, env)
                    record["checks"].append(result)
                    print(f"toolcheck: {result['command']} -> exit {result['returncode']}")
                    for line in result["output"]:
                        print(f"  {line}")
                    if result["returncode"] != 0:
                        said = "; ".join(result["errors"]) or " | ".join(result["output"][-3:])
                        problems.append(f"{label} reports (exit {result['returncode']}): {said}")
        if self.python_problem and self.sdk.problem:
            problems.append(self.python_problem)
        if sdkmod.ANDROID in self.targets:
            if self.ndk is None:
                problems.append(f"{self.ndk_note}: {sdkmod.ANDROID} model libraries will not be built (fix: install the "
                                f"Android NDK r26+ and set settings.ndk or ANDROID_NDK_ROOT, or drop {sdkmod.ANDROID} "
                                f"from settings.model_lib_targets)")
            if not shutil.which("readelf"):
                problems.append("readelf not found: the 16 KB page check needs it (fix: apt-get install binutils)")
        record["problems"] = problems
        if problems:
            raise StageError(f"toolcheck found {len(problems)} problem(s): "
                             + " ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)), record)
        print(f"toolcheck: QAIRT {self.sdk.version} at {self.sdk.root}, Python {self.python}, NDK {self.ndk or '-'}: ok")
        return record

    # ------------------------------------------------------------ helpers
    def _require(self, python: bool = False) -> Path | None:
        self.sdk.require()
        if python:
            if self.python_problem:
                raise ToolchainError(self.python_problem)
            return self.python
        return None


def _run_check(label: str, command: list[Any], env: dict[str, str]) -> dict[str, Any]:
    import subprocess

    try:
        proc = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, timeout=600)
        output, code = (proc.stdout + proc.stderr).splitlines(), proc.returncode
    except (OSError, subprocess.TimeoutExpired) as err:
        output, code = [f"{type(err).__name__}: {err}"], -1
    errors = [line.strip() for line in output if "ERROR" in line or "not installed" in line.lower()
              or "not found" in line.lower() or "missing" in line.lower()]
    return {"check": label, "command": " ".join(str(c) for c in command), "returncode": code,
            "output": output[-40:], "errors": errors}


def _validated_settings(profile: ToolchainProfile) -> dict[str, Any]:
    settings = dict(profile.settings)
    for key, value in settings.items():
        if key not in SETTINGS:
            raise SpecError(profile.file, f"settings.{key}", "unknown setting",
                            "use one of: " + ", ".join(f"{k} ({v})" for k, v in SETTINGS.items()))
        if key in PATH_SETTINGS and value is not None and not isinstance(value, str):
            raise SpecError(profile.file, f"settings.{key}", f"expected a path, got {value!r}")
    targets = settings.get("model_lib_targets", list(TARGETS))
    if (not isinstance(targets, list) or not targets or any(t not in TARGETS for t in targets)
            or len(set(targets)) != len(targets)):
        raise SpecError(profile.file, "settings.model_lib_targets", f"{targets!r} is not a list of model-lib targets",
                        f"use [{', '.join(TARGETS)}] or a part of it")
    if sdkmod.HOST not in targets:
        raise SpecError(profile.file, "settings.model_lib_targets", f"{sdkmod.HOST} is missing: the context binary is "
                        f"compiled on this host from that library", f"add {sdkmod.HOST}")
    settings["model_lib_targets"] = [t for t in TARGETS if t in targets]  # host first: the context stage reads it
    return settings


def _validated_options(profile: ToolchainProfile) -> dict[str, Any]:
    options = {"converter_args": []}
    for key, value in profile.options.items():
        if key not in OPTIONS:
            raise SpecError(profile.file, f"options.{key}", "unknown option",
                            "use one of: " + ", ".join(f"{k} ({v})" for k, v in OPTIONS.items()))
        if not isinstance(value, list) or any(not isinstance(v, (str, int, float)) for v in value):
            raise SpecError(profile.file, f"options.{key}", f"expected a list of command-line words, got {value!r}",
                            "e.g. converter_args: [--input_layout, x, NTF]")
        managed = sorted({str(v) for v in value} & MANAGED_FLAGS)
        if managed:
            raise SpecError(profile.file, f"options.{key}", f"{', '.join(managed)} is set by the tool (per precision)",
                            "remove it from the profile")
        options[key] = [str(v) for v in value]
    return options
