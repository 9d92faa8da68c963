"""lint: what will trouble the NPU, found before compiling: the rules (graphs/lintrules.py) run on the simplified graph,
its record (parameters, weights, memory estimates, op counts, findings) written, and every error refused in one line.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from qnn_tasks.errors import StageError
from qnn_tasks.graphs import onnxinfo, split
from qnn_tasks.graphs.lintrules import find_problems, memory_estimates, recurrent_feed, summary_lines
from qnn_tasks.latency import shown as latency_shown
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall


def run(graph: GraphSpec, simplified: Path, loop_feed: dict[str, str] | None = None,
        budgets: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Lint the simplified graph; return the record; raise StageError listing every error."""
    model = onnxinfo.load(simplified, "simplified ONNX")
    estimates = memory_estimates(model, graph, budgets or {})
    findings = find_problems(model, graph, loop_feed, budgets, estimates)
    record = {"parameters": onnxinfo.parameter_count(model), "weight_bytes": split.size_line(model),
              "context_budgets": budgets or {},
              "memory_estimate": estimates,
              "op_counts": _op_counts(model),
              "findings": [asdict(f) for f in findings],
              "warnings": summary_lines([f for f in findings if f.severity == "warning"]),  # a hint once per rule
              **latency_shown.lint_fields(model)}  # MACs, op mix: the phone-time estimate before a compile
    feed = recurrent_feed(model)
    if feed:  # the report marks a recurrent graph verified without its loop
        record["recurrent"] = {"feed": feed, "loop": dict(loop_feed or {})}
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        raise StageError(f"lint found {len(errors)} problem(s) in graph '{graph.name}' ({simplified}): "
                         + "; ".join(summary_lines(errors)), record)
    return record


def _op_counts(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run(calls.graph(a), Path(a["simplified"]), a.get("loop_feed"), a.get("budgets"))
