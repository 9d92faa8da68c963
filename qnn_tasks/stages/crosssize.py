"""crosssize: a sample that fits a smaller size gives the same result padded into every larger size, on the simulator.

What a deployment that picks "the smallest size that fits" relies on. For each pair of sizes of one graph
(model.yaml `dims:`) on one chip, the samples both simulated with the same content (the smaller's inputs
padded to the larger size equal the larger's) are compared: the larger size's simulator outputs against
the smaller's, by the graph's own verify thresholds and checks (an output with the sized dim compared over
the smaller size's positions, on every axis that is the dim). Reads only the kept simulate outputs and
cpucheck inputs: nothing is re-run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qnn_tasks.errors import StageError
from qnn_tasks.judge import sample_store, verification
from qnn_tasks.judge.fitting import to_size
from qnn_tasks.modelspec.project import GraphSpec
from qnn_tasks.run import calls
from qnn_tasks.run.calls import StageCall

MIN_SHARED = 2  # a ranking among samples needs two


def run(graphs: list[GraphSpec], verify: dict[str, Any], inputs: list[Path], outputs: list[Path], soc_name: str,
        target: str) -> dict[str, Any]:
    """`graphs`: the sizes of one graph, ascending, with their cpucheck inputs and simulate outputs."""
    ins = [sample_store.load(path) for path in inputs]
    outs = [sample_store.load(path) for path in outputs]
    pairs, failures = [], []
    for i, small in enumerate(graphs):
        for j in range(i + 1, len(graphs)):
            large = graphs[j]
            shared = _shared(small, large, ins[i][: len(outs[i])], ins[j][: len(outs[j])])
            where = f"cross-size check of {small.size.graph} on {soc_name}: {small.name} and {large.name}"
            if len(shared) < MIN_SHARED:
                raise StageError(f"{where}: {len(shared)} sample(s) fit both and were simulated in both, "
                                 f"{MIN_SHARED} are needed (fix: samples short enough for {small.name}, at their own "
                                 f"length from samples() or the sample files, and verify.samples covering them)")
            reference = [outs[i][a] for a, _ in shared]
            actual = [_within(outs[j][b], large, small.size.size) for _, b in shared]
            result, violations = verification.judge(small, verify, reference, actual)
            pairs.append({"small": small.name, "large": large.name, "samples": [[a, b] for a, b in shared],
                          **result, "violations": violations})
            if violations:
                failures.append(f"{where} differ on the same {len(shared)} samples: {'; '.join(violations)}")
    record = {"graph": graphs[0].size.graph, "dim": graphs[0].size.dim, "sizes": [g.size.size for g in graphs],
              "soc": soc_name, "pairs": pairs}
    if failures:
        more = f" (and {len(failures) - 1} more pair(s))" if len(failures) > 1 else ""
        raise StageError(f"{failures[0]}{more}: padding changes the answer (fix: mask the padded positions in the "
                         f"export, e.g. multiply by the attention mask before pooling, or pad an additive mask with "
                         f"-10000.0 in dims: pad; to see it: doit crosssize:{target})", record)
    return record


def _shared(small: GraphSpec, large: GraphSpec, small_inputs: list[dict[str, np.ndarray]],
            large_inputs: list[dict[str, np.ndarray]]) -> list[tuple[int, int]]:
    """(index in small, index in large) of samples whose small inputs padded to the large size are the large's."""
    size = large.size
    found = []
    for a, sample in enumerate(small_inputs):
        padded = {name: (to_size(value, size.axes[name], size.size, size.pad[name]) if name in size.pad else value)
                  for name, value in sample.items()}
        b = next((b for b, other in enumerate(large_inputs)
                  if all(np.array_equal(padded[n], other[n]) for n in padded)), None)
        if b is not None:
            found.append((a, b))
    return found


def _within(sample: dict[str, np.ndarray], large: GraphSpec, length: int) -> dict[str, np.ndarray]:
    """A larger size's outputs cut to the smaller size's positions along the sized dim (every axis that is it,
    in the outputs that have it)."""
    axes = large.size.axes  # the larger size is at least `length` long on each: to_size only cuts
    return {name: (to_size(value, axes[name], length, 0.0) if name in axes else value) for name, value in sample.items()}


def run_call(call: StageCall) -> dict[str, Any]:
    a = call.args
    return run([calls.graph({"graph": g}) for g in a["graphs"]], a["verify"], [Path(p) for p in a["inputs"]],
               [Path(p) for p in a["outputs"]], a["soc_name"], call.target)
