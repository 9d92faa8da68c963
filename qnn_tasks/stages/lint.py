"""lint: what will trouble the NPU, found before compiling.

Errors fail the stage (dynamic dims, batch != 1, unsupported I/O dtypes, control flow, int8
inside the ONNX, too big for one fp16 context); warnings are known HTP hazards with their fix.
A graph may acknowledge a rule with `lint: {allow: [rule]}`: its findings are then recorded as
"allowed" and neither fail nor warn.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import onnxinfo
from ..errors import StageError
from ..spec import GraphSpec

SUPPORTED_IO_DTYPES = {"float32", "float16", "int32", "uint8", "int8", "uint16", "int16", "bool"}
FP16_PARAM_LIMIT = 1_000_000_000  # ~1B params in fp16 do not fit one HTP context (SPEC 0)
FP16_MAX = 65504.0


@dataclass
class Finding:
    rule: str
    severity: str  # "error" | "warning" | "allowed"
    where: str
    message: str
    fix: str

    def line(self) -> str:
        return f"[{self.rule}] {self.where}: {self.message} (fix: {self.fix})"


def find_problems(model, graph: GraphSpec) -> list[Finding]:
    """Every finding on the model, with its severity before `allow` is applied."""
    findings = _io_findings(model) + _node_findings(model) + _size_findings(model, graph)
    allowed = set(graph.lint.get("allow", []))
    for f in findings:
        if f.rule in allowed:
            f.severity = "allowed"  # acknowledged in model.yaml: recorded, neither error nor warning
    return findings


def run(graph: GraphSpec, simplified: Path) -> dict[str, Any]:
    """Lint the simplified graph; return the record; raise StageError listing every error."""
    model = onnxinfo.load(simplified, "simplified ONNX")
    findings = find_problems(model, graph)
    record = {"parameters": onnxinfo.parameter_count(model),
              "op_counts": _op_counts(model),
              "findings": [asdict(f) for f in findings],
              "warnings": [f.line() for f in findings if f.severity == "warning"]}
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise StageError(f"lint found {len(errors)} problem(s) in graph '{graph.name}' ({simplified}): "
                         + "; ".join(f.line() for f in errors), record)
    return record


def _io_findings(model) -> list[Finding]:
    findings = []
    io = onnxinfo.graph_io(model)
    for kind in ("inputs", "outputs"):
        for t in io[kind]:
            where = f"{kind[:-1]} '{t['name']}'"
            dynamic = [d for d in t["shape"] if not isinstance(d, int) or d <= 0]
            if dynamic:
                findings.append(Finding("dynamic-dim", "error", where, f"dynamic dims {dynamic} in shape {t['shape']}",
                                        "export with fixed shapes (batch 1, fixed chunk/length)"))
            elif kind == "inputs" and len(t["shape"]) > 1 and t["shape"][0] != 1:
                findings.append(Finding("batch", "error", where, f"first dim is {t['shape'][0]}, not batch 1",
                                        "export with batch 1; if this dim is not the batch, add "
                                        "`lint: {allow: [batch]}` to the graph"))
            if t["dtype"] not in SUPPORTED_IO_DTYPES:
                fix = "export int32 instead of int64" if t["dtype"] == "int64" else "use float32/float16/int32 I/O"
                findings.append(Finding("io-dtype", "error", where, f"dtype {t['dtype']} is not supported on HTP", fix))
    return findings


def _node_findings(model) -> list[Finding]:
    from onnx import numpy_helper

    constants = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
            constants[node.output[0]] = node.attribute[0].t
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for name in n.input:
            consumers.setdefault(name, []).append(n)
    findings = []
    for node in model.graph.node:
        where = onnxinfo.node_label(node)
        if node.op_type in onnxinfo.CONTROL_FLOW_OPS:
            findings.append(Finding("control-flow", "error", where, "control flow does not run on HTP",
                                    "fix the branch/length at export (constant-fold the condition, unroll the loop)"))
        elif node.op_type in onnxinfo.INT8_OPS:
            findings.append(Finding("int8-in-onnx", "error", where, "int8 quantization inside the ONNX",
                                    "export the float model and quantize in QNN (precision: w8a16)"))
        elif node.op_type == "Pow" and _scalar(constants.get(node.input[1]), numpy_helper) == 2.0:
            findings.append(Finding("pow-square", "warning", where,
                                    "fp16 Pow(x, 2) on HTP returns garbage when x underflows fp16 (|x| < ~6e-8)",
                                    "write Mul(x, x) at export"))
        elif node.op_type == "Neg":
            findings.append(Finding("neg", "warning", where, "the QNN converter rejects Neg", "write (0 - x) or a - b at export"))
        elif node.op_type == "Erf" and not _in_gelu(node, consumers, constants, numpy_helper):
            findings.append(Finding("erf", "warning", where,
                                    "Erf outside a whole GELU (x * 0.5 * (1 + erf(x / sqrt 2))) runs on CPU on HTP; "
                                    "onnxsim's fuse_preceding_mul_into_conv folds GELU's x0.5 into the next Conv",
                                    "simplify: {skip_optimizers: [fuse_preceding_mul_into_conv]}"))
    for name, tensor in constants.items():
        value = numpy_helper.to_array(tensor)
        if value.dtype.kind == "f" and value.size and value.size <= 1_000_000:
            smallest = float(value.min())
            if smallest < -FP16_MAX:
                findings.append(Finding("fp16-overflow-constant", "warning", f"constant '{name}'",
                                        f"value {smallest:.3g} overflows fp16 (a mask of -inf/finfo.min breaks fp16 and quantization)",
                                        "use a finite mask constant such as -1e4 at export"))
    return findings


def _size_findings(model, graph: GraphSpec) -> list[Finding]:
    params = onnxinfo.parameter_count(model)
    limit = int(graph.lint.get("max_fp16_params", FP16_PARAM_LIMIT))
    if graph.precision == "fp16" and params > limit:
        return [Finding("size", "error", f"graph '{graph.name}'",
                        f"{params / 1e6:.0f}M parameters x 2 bytes (fp16) = {params * 2 / 2**30:.1f} GiB, over the "
                        f"~{limit / 1e9:.1f}B-parameter limit of one HTP context",
                        "use 8-bit weights (precision: w8a16) or split the graph into several")]
    return []


def _in_gelu(erf, consumers, constants, numpy_helper) -> bool:
    """Erf -> Add(1) -> Mul(x) -> Mul(0.5), in any order of the two Muls: the pattern HTP fuses."""
    frontier, halves = [erf], 0
    for _ in range(3):
        nxt = [c for n in frontier for c in consumers.get(n.output[0], []) if c.op_type in ("Add", "Mul")]
        halves += sum(1 for n in nxt if n.op_type == "Mul"
                      and any(_scalar(constants.get(i), numpy_helper) == 0.5 for i in n.input))
        frontier = nxt
    return halves > 0


def _scalar(tensor, numpy_helper) -> float | None:
    if tensor is None:
        return None
    value = numpy_helper.to_array(tensor)
    return float(value.reshape(-1)[0]) if value.size == 1 else None


def _op_counts(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def io_mismatches(model, graph: GraphSpec) -> list[str]:
    """Differences between the model's I/O and what model.yaml declares, one line each."""
    io = onnxinfo.graph_io(model)
    problems = []
    for kind, declared in (("inputs", graph.inputs), ("outputs", graph.outputs)):
        actual = {t["name"]: t for t in io[kind]}
        for spec in declared:
            got = actual.pop(spec.name, None)
            if got is None:
                problems.append(f"{kind[:-1]} '{spec.name}' declared in model.yaml is missing "
                                f"(the model has {', '.join(t['name'] for t in io[kind]) or 'none'})")
                continue
            if list(got["shape"]) != list(spec.shape):
                problems.append(f"{kind[:-1]} '{spec.name}' has shape {got['shape']}, model.yaml says {list(spec.shape)}")
            if kind == "inputs" and got["dtype"] != spec.dtype:
                problems.append(f"input '{spec.name}' has dtype {got['dtype']}, model.yaml says {spec.dtype}")
        problems += [f"{kind[:-1]} '{name}' is not declared in model.yaml" for name in actual]
    return problems
