"""Stand-in qnn-onnx-converter: ONNX -> <name>.cpp + <name>.bin + <name>_net.json.

Modelled: the real flag names (argparse, so unknown/wrong flags are a usage error with exit 2),
the output files and their naming (the .cpp basename, with anything but [A-Za-z0-9_] turned
into _, is the graph name), rejected ops with the real converter's message and exit 1, and
`--input_list` calibration (one line per sample, space-separated raw files in input order; float32
unless --use_native_input_files) with the bitwidth flags: the graph really is quantized (onnxruntime's
QNN QDQ flow) so the context binary built from it really is w8a16.
Not modelled: the QNN C++ graph itself. The .cpp is C++-looking but only records the graph name,
the source ONNX and its ops; the .bin is a tar that carries the (float or QDQ) ONNX to the
stand-in model-lib and context-binary generators. Layout changes, --input_layout, --out_node,
--preserve_io etc. are accepted and ignored.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from .common import PyLog, converter_graph_name, sdk_version, write_payload

# Ops the real converters reject ("No translation registered for op type onnx_<op>"): Neg (docs/rewrites.md, `neg`);
# the others were seen in public QAIRT logs. Control flow is rejected too (QNN graphs are static).
REJECTED_OPS = {"Neg", "If", "Loop", "Scan", "IsNaN", "IsInf", "DFT", "RandomNormal", "RandomNormalLike",
                "RandomUniform", "RandomUniformLike", "Multinomial"}
ONNX_TO_NUMPY = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
                 10: "float16", 11: "float64"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qnn-onnx-converter",
                                description="Script to convert ONNX model into a QNN model (stand-in).")
    required = p.add_argument_group("required arguments")
    required.add_argument("--input_network", "-i", required=True, help="Path to the source ONNX model.")
    optional = p.add_argument_group("optional arguments")
    optional.add_argument("--output_path", "-o", help="Path where the converted output model should be saved.")
    optional.add_argument("--copyright_file")
    optional.add_argument("--float_bitwidth", type=int, choices=[32, 16], default=32)
    optional.add_argument("--float_bw", type=int, choices=[32, 16], help=argparse.SUPPRESS)
    optional.add_argument("--float_bias_bitwidth", type=int, choices=[16, 32], default=0)
    optional.add_argument("--overwrite_model_prefix", action="store_true")
    optional.add_argument("--exclude_named_tensors", action="store_true")
    optional.add_argument("--model_version")
    optional.add_argument("--input_dtype", nargs=2, action="append", metavar=("INPUT_NAME", "INPUT_DTYPE"), default=[])
    optional.add_argument("--input_encoding", nargs="+", action="append", default=[])
    optional.add_argument("--input_layout", nargs=2, action="append", metavar=("INPUT_NAME", "INPUT_LAYOUT"), default=[])
    optional.add_argument("--custom_io")
    optional.add_argument("--out_node", action="append", default=[])
    optional.add_argument("--input_type", nargs=2, action="append", default=[])
    optional.add_argument("--preserve_io", nargs="*")
    optional.add_argument("--dry_run", nargs="?", const="info")
    optional.add_argument("--input_dim", "-d", nargs=2, action="append", metavar=("INPUT_NAME", "INPUT_DIM"), default=[])
    optional.add_argument("--no_simplification", "-n", action="store_true")
    optional.add_argument("--define_symbol", nargs=2, action="append", default=[])
    optional.add_argument("--batch")
    optional.add_argument("--disable_batchnorm_folding", action="store_true")
    optional.add_argument("--keep_disconnected_nodes", action="store_true")
    optional.add_argument("--debug", nargs="?", const=0, type=int)
    quant = p.add_argument_group("Quantizer Options")
    quant.add_argument("--quantization_overrides")
    quant.add_argument("--keep_quant_nodes", action="store_true")
    quant.add_argument("--input_list", help="Path to a file specifying the input data (one line per sample).")
    quant.add_argument("--param_quantizer")
    quant.add_argument("--act_quantizer")
    quant.add_argument("--algorithms", nargs="+", default=[])
    quant.add_argument("--bias_bitwidth", type=int, choices=[8, 32], default=8)
    quant.add_argument("--bias_bw", type=int, choices=[8, 32], help=argparse.SUPPRESS)
    quant.add_argument("--act_bitwidth", type=int, choices=[8, 16], default=8)
    quant.add_argument("--act_bw", type=int, choices=[8, 16], help=argparse.SUPPRESS)
    quant.add_argument("--weights_bitwidth", type=int, choices=[4, 8], default=8)
    quant.add_argument("--weight_bw", type=int, choices=[4, 8], help=argparse.SUPPRESS)
    quant.add_argument("--ignore_encodings", action="store_true")
    quant.add_argument("--use_per_channel_quantization", action="store_true")
    quant.add_argument("--use_per_row_quantization", action="store_true")
    quant.add_argument("--float_fallback", action="store_true")
    quant.add_argument("--use_native_input_files", action="store_true")
    quant.add_argument("--use_native_dtype", action="store_true", help=argparse.SUPPRESS)
    quant.add_argument("--use_native_output_files", action="store_true")
    quant.add_argument("--disable_relu_squashing", action="store_true")
    quant.add_argument("--restrict_quantization_steps")
    quant.add_argument("--act_quantizer_calibration", default="min-max")
    quant.add_argument("--param_quantizer_calibration", default="min-max")
    quant.add_argument("--act_quantizer_schema", default="asymmetric")
    quant.add_argument("--param_quantizer_schema", default="asymmetric")
    quant.add_argument("--percentile_calibration_value", type=float, default=99.99)
    ops = p.add_argument_group("Custom Op Package Options")
    ops.add_argument("--op_package_config", "-opc", nargs="+")
    ops.add_argument("--package_name", "-p")
    ops.add_argument("--converter_op_package_lib", "-cpl")
    return p


class ConversionError(Exception):
    pass


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)  # argparse: usage + "error: ..." on stderr, exit 2 (as the real tool)
    log = PyLog()
    for alias, name in (("float_bw", "float_bitwidth"), ("bias_bw", "bias_bitwidth"), ("act_bw", "act_bitwidth"),
                        ("weight_bw", "weights_bitwidth")):
        if getattr(args, alias) is not None:
            log.warning(f"--{alias} is deprecated, use --{name}")
            setattr(args, name, getattr(args, alias))
    try:
        convert(args, log)
    except ConversionError as err:
        log.error(f"Encountered Error: {err}")
        log.error("Conversion FAILED!")
        return 1
    return 0


def convert(args, log: PyLog) -> None:
    import onnx

    source = Path(args.input_network)
    if not source.is_file():
        raise ConversionError(f"Input network {source} does not exist")
    log.info(f"qnn-onnx-converter (stand-in for QAIRT {sdk_version()})")
    try:
        model = onnx.load(str(source))
    except Exception as err:  # noqa: BLE001 - the real tool reports any load failure this way
        raise ConversionError(f"Failed to load ONNX model {source}: {err}") from None
    output = Path(args.output_path) if args.output_path else source.with_suffix(".cpp")
    base = output.with_suffix("") if output.suffix == ".cpp" else output
    graph_name = converter_graph_name(str(base))
    log.info(f"Processing ONNX model {source} (opset {model.opset_import[0].version if model.opset_import else '?'})")
    for node in model.graph.node:
        if node.op_type in REJECTED_OPS:
            message = (f"'No translation registered for op type onnx_{node.op_type.lower()}. "
                       f"Op is most likely not supported by the converter.'")
            log.error(f"Node {node.name or node.output[0]}: {message}")
            raise ConversionError(message)
    ignored = [flag for flag, value in (("--input_layout", args.input_layout), ("--out_node", args.out_node),
                                        ("--input_dim", args.input_dim), ("--preserve_io", args.preserve_io),
                                        ("--input_dtype", args.input_dtype), ("--quantization_overrides",
                                                                             args.quantization_overrides)) if value]
    if ignored:
        log.info(f"stand-in: accepted and not modelled: {', '.join(ignored)}")

    quantization = None
    if args.input_list:
        model, quantization = quantize(model, Path(args.input_list), args, log)
    else:
        log.info(f"No input list: the graph stays floating point (float_bitwidth {args.float_bitwidth}); "
                 f"quantizer options are ignored")
    model_bytes = model.SerializeToString()
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    meta = {"graph_name": graph_name, "source": str(source.resolve()),
            "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
            "float_bitwidth": args.float_bitwidth, "quantization": quantization, "inputs": inputs, "outputs": outputs,
            "converter": f"stand-in qnn-onnx-converter {sdk_version()}"}
    output.parent.mkdir(parents=True, exist_ok=True)
    bin_path = Path(f"{base}.bin")
    write_payload(bin_path, model_bytes, meta)
    output.write_text(cpp_source(graph_name, meta, model, bin_path))
    Path(f"{base}_net.json").write_text(json.dumps(net_json(output, bin_path, model, meta), indent=2) + "\n")
    log.info(f"Model CPP saved at: {output}")
    log.info(f"Model BIN saved at: {bin_path}")
    log.info("Conversion complete!")


def quantize(model, input_list: Path, args, log: PyLog):
    """Calibrate on the input list's raw files and quantize to QDQ with onnxruntime's QNN flow."""
    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize as ort_quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config, qnn_preprocess_model

    if not input_list.is_file():
        raise ConversionError(f"Input list {input_list} does not exist")
    inputs = [i for i in model.graph.input]
    samples = []
    for number, line in enumerate(input_list.read_text().splitlines(), 1):
        paths = [p.split(":=", 1)[-1] for p in line.split()]
        if not paths or line.lstrip().startswith("#"):
            continue
        if len(paths) != len(inputs):
            raise ConversionError(f"{input_list}:{number}: {len(paths)} input file(s), the network has "
                                  f"{len(inputs)} input(s) ({', '.join(i.name for i in inputs)})")
        sample = {}
        for tensor, raw in zip(inputs, paths):
            dims = [d.dim_value for d in tensor.type.tensor_type.shape.dim]
            dtype = ONNX_TO_NUMPY[tensor.type.tensor_type.elem_type]
            read_as = dtype if args.use_native_input_files else "float32"
            raw_path = Path(raw) if Path(raw).is_absolute() else input_list.parent / raw
            if not raw_path.is_file():
                raise ConversionError(f"{input_list}:{number}: input file {raw_path} does not exist")
            data = np.fromfile(raw_path, dtype=read_as)
            if data.size != int(np.prod(dims)):
                raise ConversionError(f"{raw_path}: {data.size} {read_as} values, input '{tensor.name}' {dims} needs "
                                      f"{int(np.prod(dims))}" + ("" if args.use_native_input_files else
                                                                 " (raw files are read as float32 unless "
                                                                 "--use_native_input_files)"))
            sample[tensor.name] = data.reshape(dims).astype(dtype)
        samples.append(sample)
    if not samples:
        raise ConversionError(f"Input list {input_list} is empty")
    log.info(f"Quantizing with {len(samples)} calibration sample(s) from {input_list}: weights {args.weights_bitwidth}-bit, "
             f"activations {args.act_bitwidth}-bit, bias {args.bias_bitwidth}-bit")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(samples)

        def get_next(self):
            return next(self._it, None)

    with tempfile.TemporaryDirectory(prefix="standin-quant-") as tmp:
        plain = Path(tmp) / "float.onnx"
        del model.metadata_props[:]
        onnx.save(model, str(plain))
        prepared = Path(tmp) / "prepared.onnx"
        source = prepared if qnn_preprocess_model(str(plain), str(prepared)) else plain
        config = get_qnn_qdq_config(str(source), Reader(),
                                    activation_type=QuantType.QUInt16 if args.act_bitwidth == 16 else QuantType.QUInt8,
                                    weight_type=QuantType.QUInt8 if args.weights_bitwidth == 8 else QuantType.QInt4,
                                    per_channel=args.use_per_channel_quantization)
        out = Path(tmp) / "qdq.onnx"
        ort_quantize(str(source), str(out), config)
        quantized = onnx.load(str(out))
    count = sum(1 for n in quantized.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear"))
    log.info(f"Quantization complete: {count} quantize/dequantize nodes")
    return quantized, {"samples": len(samples), "weights_bitwidth": args.weights_bitwidth,
                       "act_bitwidth": args.act_bitwidth, "bias_bitwidth": args.bias_bitwidth,
                       "native_input_files": args.use_native_input_files}


def cpp_source(graph_name: str, meta: dict, model, bin_path: Path) -> str:
    ops = sorted({n.op_type for n in model.graph.node})
    nodes = "\n".join(f"//   {n.op_type:<20} {n.name or n.output[0]}" for n in model.graph.node[:200])
    return f"""//=============================================================================
// Auto generated by the STAND-IN qnn-onnx-converter (tests/standins/qairt_sdk), not by QAIRT.
// The graph itself travels in {bin_path.name} (a tar holding the ONNX); this file records what it is.
//   source ONNX : {meta['source']}
//   sha256      : {meta['source_sha256']}
//   quantization: {json.dumps(meta['quantization'])}
//   float bits  : {meta['float_bitwidth']}
//   op types    : {', '.join(ops)}
// Nodes:
{nodes}
//=============================================================================

#include "QnnModel.hpp"
#include "QnnOpDef.h"

using namespace qnn_wrapper_api;

extern "C" {{
QNN_API
ModelError_t QnnModel_composeGraphs(Qnn_BackendHandle_t backendHandle,
                                    QNN_INTERFACE_VER_TYPE interface,
                                    Qnn_ContextHandle_t contextHandle,
                                    const GraphConfigInfo_t** graphsConfigInfo,
                                    const uint32_t numGraphsConfigInfo,
                                    GraphInfoPtr_t** graphsInfo,
                                    uint32_t* numGraphsInfo,
                                    bool debug,
                                    QnnLog_Callback_t logCallback,
                                    QnnLog_Level_t maxLogLevel) {{
  ModelError_t err = MODEL_NO_ERROR;

  /* model/graph for {graph_name} */
  QnnModel {graph_name};
  const QnnGraph_Config_t** graphConfigs = nullptr;
  VALIDATE(getQnnGraphConfigFromInfo("{graph_name}", graphsConfigInfo, numGraphsConfigInfo, graphConfigs), err);
  VALIDATE({graph_name}.initialize(backendHandle, interface, contextHandle, "{graph_name}", debug, true, graphConfigs), err);
  // stand-in: the tensors and nodes are not emitted; see {bin_path.name}
  return err;
}}
}}
"""


def net_json(cpp: Path, bin_path: Path, model, meta: dict) -> dict:
    return {"model.cpp": str(cpp), "model.bin": str(bin_path), "converter_command": " ".join(sys.argv),
            "copyright_str": "", "op_types": sorted({n.op_type for n in model.graph.node}),
            "Total parameters": str(sum(_size(t) for t in model.graph.initializer)),
            "graph": {"name": meta["graph_name"], "inputs": meta["inputs"], "outputs": meta["outputs"],
                      "nodes": len(model.graph.node)},
            "stand_in": True}


def _size(tensor) -> int:
    count = 1
    for d in tensor.dims:
        count *= d
    return count
