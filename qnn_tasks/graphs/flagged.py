"""A failure that names a node lint already flagged repeats lint's fix: the known cause, not "rewrite it at export".

QNN's compile log names the node it refused (``QNN.graphAddNode() failed for node `add_mask` ...``); lint's record
names the constant or node it warned about (``constant 'mask' (min -inf)``). The node and lint's site are matched on
the model lint read (the simplified graph: node names survive quantization, tensor names do not), through the
node's inputs and the shape-only ops that feed them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_NAMED = re.compile(r"[`'\"]([^`'\"\s]{1,200})[`'\"]")
_PASS_THROUGH = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Expand", "Transpose", "Flatten"}
_DEPTH = 4  # producers followed back from a named node's inputs


def lint_fix_for(failure: str, lint_record: Path, model_path: Path) -> str:
    """`; lint flagged <site> read by node `n`: [rule] fix: ...` for each lint finding the failure's nodes read, or ""."""
    try:
        findings = json.loads(lint_record.read_text()).get("findings", [])
    except (OSError, ValueError, AttributeError):
        return ""  # no lint record to repeat: the failure says what it says
    flagged = {name: f for f in findings if isinstance(f, dict) and f.get("fix")
               for name in _NAMED.findall(str(f.get("where", "")))}
    named = set(_NAMED.findall(failure))
    if not flagged or not named:
        return ""
    reads = _reads(model_path, named)
    said, lines = set(), []
    for node, sites in reads.items():
        for site in sorted(sites & flagged.keys()):
            finding = flagged[site]
            if id(finding) in said:
                continue
            said.add(id(finding))
            lines.append(f"lint flagged {finding['where']}, which node `{node}` reads: [{finding['rule']}] "
                         f"{finding['message']} (fix: {finding['fix']})")
    for site in sorted(named & flagged.keys()):  # lint flagged the named node itself
        if id(flagged[site]) not in said:
            said.add(id(flagged[site]))
            finding = flagged[site]
            lines.append(f"lint flagged {finding['where']}: [{finding['rule']}] {finding['message']} "
                         f"(fix: {finding['fix']})")
    return "".join(f"; {line}" for line in lines)


def _reads(model_path: Path, nodes: set[str]) -> dict[str, set[str]]:
    """For each named node of the model: the tensors it reads, through shape-only producers."""
    import onnx

    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception:  # a model that does not load has no structure to match against
        return {}
    producer: dict[str, Any] = {out: n for n in graph.node for out in n.output}
    found = {}
    for node in graph.node:
        if node.name not in nodes:
            continue
        seen, todo = set(), [(name, 0) for name in node.input if name]
        while todo:
            name, depth = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            parent = producer.get(name)
            if parent is not None:
                seen.add(parent.name)
                if parent.op_type in _PASS_THROUGH and depth < _DEPTH:
                    todo += [(i, depth + 1) for i in parent.input if i]
        found[node.name] = seen
    return found
