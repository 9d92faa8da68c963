"""How large a graph compiles to one QNN context here, whole and split: synthetic transformers of growing size.

    python benchmarks/bench_big_graphs.py --sizes 100M 300M          # early: minutes each
    python benchmarks/bench_big_graphs.py --sizes 1B --parts 4       # with care: see the memory cap below

Each graph is a pre-norm transformer (LayerNorm -> QKV -> single-head attention -> projection -> residual ->
LayerNorm -> MLP x4 -> residual, per block) on [1, seq, width] float32 with random weights (fixed seed), written
with external data (the weights in a .data file beside the .onnx, as any model over 2 GB must be). For one chip
(SM8650, fp16) it compiles the graph whole, then split into parts by qnn_tasks.graphs.split (`parts: N`, cut
where one tensor crosses: the residual stream between two blocks), and records per compile: seconds, peak
resident memory of the compiling process (wait4's rusage), binary size, and the simulator's seconds for one
sample; the first failure and what it says (its QNN codes explained from the catalogue).

Memory: the machine is shared. Every compile runs in its own child process, watched: above --max-gb of resident
memory (default 14) it is killed and recorded as "killed: over N GB" (systemd-run --scope is not available in this
container: no user bus; RLIMIT_AS would refuse the compiler's address-space reservations rather than its use).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

SIZES = {"1M": (128, 4), "30M": (512, 10), "100M": (1024, 8), "300M": (1024, 24), "500M": (1024, 40),  # width, blocks
         "600M": (1024, 48), "1B": (2048, 20), "1.5B": (2048, 30), "2B": (2048, 40)}
SEQ = 16


def build(path: Path, width: int, blocks: int, seq: int = SEQ, seed: int = 0, outlier: int | None = None) -> int:
    """Write the transformer to `path` (+ `path`.data); return its parameter count. Weights are streamed to the
    data file tensor by tensor, so building a 1B graph holds one tensor in memory, not four GB.

    `outlier`: the block whose feed-forward meets an outlier channel, as large language models have them (channel 7's
    LayerNorm gain 0.01, its row of the up-projection 100x): per-channel 8-bit weights then spend their range on it
    (bench_precision: a graph where plain w8a16 fails and the repair has something to find)."""
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    data_name = path.name + ".data"
    inits, nodes, params = [], [], 0
    with open(path.parent / data_name, "wb") as data:
        def weight(name: str, shape: tuple[int, ...], scale: float = 0.02, value: float | None = None,
                   row7: float = 1.0) -> str:
            nonlocal params
            array = (np.full(shape, value, np.float32) if value is not None
                     else (rng.standard_normal(shape, dtype=np.float32) * scale))
            if row7 != 1.0:  # the outlier channel
                array[7] *= row7
            offset = data.tell()
            data.write(array.tobytes())
            tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
            tensor.data_location = TensorProto.EXTERNAL
            for key, val in (("location", data_name), ("offset", str(offset)), ("length", str(array.nbytes))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, val
            inits.append(tensor)
            params += array.size
            return name

        def node(op: str, inputs: list[str], output: str, **attrs) -> str:
            nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
            return output

        x = "x"
        for b in range(blocks):
            p = f"b{b}"
            h = node("LayerNormalization", [x, weight(f"{p}.ln1.g", (width,), value=1.0),
                                            weight(f"{p}.ln1.b", (width,), value=0.0)], f"{p}.ln1", axis=-1)
            q = node("MatMul", [h, weight(f"{p}.wq", (width, width))], f"{p}.q")
            k = node("MatMul", [h, weight(f"{p}.wk", (width, width))], f"{p}.k")
            v = node("MatMul", [h, weight(f"{p}.wv", (width, width))], f"{p}.v")
            kt = node("Transpose", [k], f"{p}.kt", perm=[0, 2, 1])
            scores = node("Mul", [node("MatMul", [q, kt], f"{p}.qk"), weight(f"{p}.scale", (1,), value=width ** -0.5)],
                          f"{p}.scores")
            attn = node("MatMul", [node("Softmax", [scores], f"{p}.probs", axis=-1), v], f"{p}.attn")
            x = node("Add", [x, node("MatMul", [attn, weight(f"{p}.wo", (width, width))], f"{p}.o")], f"{p}.res1")
            odd = b == outlier
            h = node("LayerNormalization", [x, weight(f"{p}.ln2.g", (width,), value=1.0, row7=0.01 if odd else 1.0),
                                            weight(f"{p}.ln2.b", (width,), value=0.0)], f"{p}.ln2", axis=-1)
            up = node("MatMul", [h, weight(f"{p}.w1", (width, 4 * width), row7=100.0 if odd else 1.0)], f"{p}.up")
            act = node("Mul", [up, node("Sigmoid", [node("Mul", [up, weight(f"{p}.gelu", (1,), value=1.702)],
                                                         f"{p}.up_s")], f"{p}.sig")], f"{p}.act")
            x = node("Add", [x, node("MatMul", [act, weight(f"{p}.w2", (4 * width, width))], f"{p}.down")],
                     f"{p}.res2")
        nodes.append(helper.make_node("Identity", [x], ["y"], name="y"))
    graph = helper.make_graph(nodes, "transformer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path))
    return params


# ------------------------------------------------------------------ one compile / one simulation in a child

CHILD = r"""
import json, sys, time
from pathlib import Path
from qnn_tasks.toolchains.ort_qnn import compile_context
import numpy as np
job = json.loads(sys.argv[1])
src, out, log = Path(job["source"]), Path(job["out"]), Path(job["log"])
options = job["options"]
result = {}
try:
    result["compile_s"] = compile_context(src, out, options, log)
    binary = out.with_name(out.stem + "_qnn.bin")
    result["bin_bytes"] = binary.stat().st_size
    if job["simulate"]:
        from qnn_tasks.devices import simulator
        value = (np.load(job["input_file"]) if job.get("input_file")
                 else np.random.default_rng(1).standard_normal(job["shape"], dtype=np.float32))
        x = {job["input_name"]: value}
        outs, seconds, _ = simulator.run(out, options, [x], out.with_name("simulate.log"))
        result["simulate_s"] = seconds[0]
        np.save(out.with_name("y.npy"), outs[0][next(iter(outs[0]))])
except Exception as err:
    result["error"] = str(err)
print("RESULT " + json.dumps(result))
"""


def run_watched(args: list[str], max_gb: float, timeout: float, cwd: Path | None = None) -> dict:
    """Run a command, its process tree watched: killed above max_gb resident in total or after timeout seconds.
    Returns its output, exit code, the tree's peak (sampled every 0.5 s), wait4's max RSS and why it was killed."""
    proc = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    start, peak, killed = time.monotonic(), [0.0], []

    def watch() -> None:
        while proc.poll() is None:
            total = _tree_rss_gb(proc.pid)
            peak[0] = max(peak[0], total)
            if total > max_gb or time.monotonic() - start > timeout:
                killed.append(f"killed: over {max_gb} GB resident" if total > max_gb else f"killed: over {timeout:.0f} s")
                os.killpg(proc.pid, signal.SIGKILL)
                return
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    watcher.join()
    return {"output": output, "returncode": proc.returncode, "peak_tree_gb": peak[0],
            "max_rss_gb": usage.ru_maxrss / 2**20, "killed": killed[0] if killed else None,
            "seconds": time.monotonic() - start}


def run_child(job: dict, max_gb: float, timeout: float) -> dict:
    """One compile (+ one simulated sample) in a child process; peak RSS from wait4, killed above max_gb."""
    ran = run_watched([sys.executable, "-c", CHILD, json.dumps(job)], max_gb, timeout)
    output, killed = ran["output"], ran["killed"]
    result = next((json.loads(line[7:]) for line in output.splitlines() if line.startswith("RESULT ")), {})
    if killed:
        result["error"] = killed
    elif not result:
        result["error"] = f"the compiling process died (exit {ran['returncode']}): " + (output.strip().splitlines()
                                                                                         or ["no output"])[-1]
    result["peak_rss_gb"] = round(ran["max_rss_gb"], 2)
    return result


def explain(error: str, log: Path) -> str:
    """The QNN codes the log holds, explained by the catalogue (empty when none)."""
    from qnn_tasks.qnn.errorcodes import explain_file

    try:
        return "; ".join(explain_file(log, "compile")) if log.is_file() else ""
    except Exception:  # the catalogue's reader is a nicety here: the raw error is kept regardless
        return ""


def measure(size: str, parts: int, folder: Path, soc_model: str, max_gb: float, timeout: float,
            simulate: bool) -> dict:
    from qnn_tasks.graphs import split

    width, blocks = SIZES[size]
    source = folder / f"t{size}.onnx"
    start = time.perf_counter()
    params = build(source, width, blocks)
    row = {"size": size, "params": params, "width": width, "blocks": blocks, "seq": SEQ,
           "fp16_bytes": split.weight_bytes(split.load_light(source), "fp16"),
           "build_s": round(time.perf_counter() - start, 1)}
    options = {"htp_graph_finalization_optimization_mode": "3", "soc_model": soc_model, "vtcm_mb": "8"}

    def compile_one(model: Path, tag: str, input_name: str = "x", input_file: Path | None = None) -> dict:
        out = folder / tag / f"{tag}_ctx.onnx"
        out.parent.mkdir(parents=True, exist_ok=True)
        job = {"source": str(model), "out": str(out), "log": str(out.parent / "compile.log"), "options": options,
               "simulate": simulate, "shape": [1, SEQ, width],
               "input_name": input_name, "input_file": str(input_file) if input_file else None}
        result = run_child(job, max_gb, timeout)
        if "error" in result:
            result["explained"] = explain(result["error"], out.parent / "compile.log")
            result["error"] = result["error"][:400]
        print(f"  {tag}: {json.dumps(result)}", flush=True)
        return result

    print(f"{size}: {params / 1e6:.0f}M parameters, fp16 {row['fp16_bytes'] / 1e6:.0f} MB", flush=True)
    row["whole"] = compile_one(source, f"{size}-whole")
    if parts > 1:
        model = split.load_light(source)
        cuts = split.balanced_cuts(model, parts)
        names = [f"t{size}.part{k}" for k in range(1, parts + 1)]
        paths = [folder / "parts" / f"{n}.onnx" for n in names]
        start = time.perf_counter()
        described = split.write_parts(source, cuts, names, paths, "fp16", f"{size}: split.parts")
        row["split_s"] = round(time.perf_counter() - start, 1)
        row["parts"] = []
        fed = None  # each part simulated on the previous part's simulator output: the chain end to end
        for part, path in zip(described, paths):
            result = compile_one(path, f"{size}-part{part['part']}", part["inputs"][0], fed)
            fed = folder / f"{size}-part{part['part']}" / "y.npy"
            row["parts"].append({"weight_bytes": part["weight_bytes"],
                                 "cut": [o["tensor"] for o in part["outputs"]], **result})
        whole, end = folder / f"{size}-whole" / "y.npy", fed
        if simulate and whole.is_file() and end is not None and end.is_file():  # the chain's end vs the whole graph
            a, b = np.load(whole).ravel().astype(np.float64), np.load(end).ravel().astype(np.float64)
            row["chain_vs_whole_cosine"] = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return row


PROJECT_YAML = """\
licence: synthetic (bench_big_graphs.py)
source: {{file: big.onnx}}
graphs:
  big:
    inputs: {{x: {{shape: [1, {seq}, {width}], dtype: float32}}}}
    outputs: {{y: {{shape: [1, {seq}, {width}]}}}}
    samples: {{files: samples/x.npz}}
    verify: {{samples: 1}}
    socs: [SM8650]
    split: {{parts: {parts}}}
"""


def through_doit(size: str, parts: int, folder: Path, max_gb: float, timeout: float) -> dict:
    """The graph as a packaged ONNX (external data) in a scaffolded project with `split: {parts: N}`, built by doit
    from export to the parts' pipeline; doit's process tree is watched (killed above max_gb resident in total)."""
    width, blocks = SIZES[size]
    subprocess.run([sys.executable, "-m", "qnn_tasks", "init", str(folder)], check=True, capture_output=True)
    shutil.rmtree(folder / "models" / "example")
    model = folder / "models" / "big"
    (model / "samples").mkdir(parents=True)
    params = build(model / "big.onnx", width, blocks)
    np.savez(model / "samples" / "x.npz", x=np.random.default_rng(1).standard_normal((1, 1, SEQ, width), dtype=np.float32))
    (model / "model.yaml").write_text(PROJECT_YAML.format(seq=SEQ, width=width, parts=parts))
    ran = run_watched([sys.executable, "-m", "doit", "simverify", "pipeline"], max_gb, timeout, cwd=folder)
    output = ran["output"]
    seconds = {line.split(":", 2)[0] + ":" + line.split(":", 2)[1]: float(m.group(1)) for line in output.splitlines()
               if (m := re.search(r": passed in ([\d.]+) s$", line))}
    records = {}
    for name in ("big/simplify/simplify.json", "big/split/split.json", "big/lint/lint.json"):
        path = folder / "build" / "big" / name
        records[name] = json.loads(path.read_text()) if path.is_file() else None
    chains = list((folder / "build" / "big").glob("big/pipeline/*/SM8650/pipeline/pipeline.json"))
    chain = json.loads(chains[0].read_text()) if chains else None
    return {"size": size, "params": params, "returncode": ran["returncode"], "error": ran["killed"],
            "wall_s": round(ran["seconds"], 1), "peak_tree_rss_gb": round(ran["peak_tree_gb"], 2),
            "stage_seconds": seconds, "onnxsim": (records["big/simplify/simplify.json"] or {}).get("onnxsim"),
            "cuts": (records["big/split/split.json"] or {}).get("cuts"),
            "end_to_end_cpu": (records["big/split/split.json"] or {}).get("end_to_end_cpu"),
            "pipeline": None if chain is None else {"status": chain.get("status"), "metrics": chain.get("metrics")},
            "failures": [line for line in output.splitlines() if "TaskFailed" in line or line.startswith("TaskError")][:5],
            "tail": output.strip().splitlines()[-3:]}


def _tree_rss_gb(pid: int) -> float:
    """Resident memory of a process and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo += children.get(current, [])
        try:
            total += sum(int(line.split()[1]) for line in open(f"/proc/{current}/status") if line.startswith("VmRSS:"))
        except (OSError, ValueError):
            continue
    return total / 2**20


def machine() -> str:
    """Cores and memory of this host, for the record (the figures are this machine's)."""
    total = next((int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:")), 0)
    available = next((int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemAvailable:")), 0)
    return f"{os.cpu_count()} cores, {total / 2**20:.0f} GB ({available / 2**20:.0f} GB available at the end)"


def table(rows_file: Path) -> str:
    """The JSON-lines rows as the markdown table of docs/large-graphs.md."""
    lines = ["| graph | build | compile s | peak RSS GB | binary MB | simulator s / sample | chain vs whole | date, load |",
             "|---|---|---|---|---|---|---|---|"]
    for line in rows_file.read_text().splitlines():
        row = json.loads(line)
        name = f"{row['params'] / 1e6:,.0f}M params ({row['width']} x {row['blocks']}), fp16 {row['fp16_bytes'] / 1e6:,.0f} MB"

        def cells(result: dict) -> str:
            if "error" in result:
                return f"**failed**: {result['error'][:160]} | {result.get('peak_rss_gb', '?')} | | | "
            return (f"{result['compile_s']:.1f} | {result['peak_rss_gb']:.2f} | {result['bin_bytes'] / 1e6:,.1f} | "
                    f"{result['simulate_s']:.1f} | " if "simulate_s" in result else
                    f"{result['compile_s']:.1f} | {result['peak_rss_gb']:.2f} | {result['bin_bytes'] / 1e6:,.1f} | | ")

        when = f"{row['date']}, {row['load_avg']:.1f}"
        lines.append(f"| {name} | whole | {cells(row['whole'])} | {when} |")
        for k, part in enumerate(row.get("parts", []), start=1):
            chain = f"{row['chain_vs_whole_cosine']:.6f}" if k == len(row["parts"]) and "chain_vs_whole_cosine" in row else ""
            cut = f" (cut after {', '.join(part['cut'])})" if k < len(row["parts"]) else ""
            lines.append(f"| | part {k} of {len(row['parts'])}{cut} | {cells(part)}{chain} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["100M", "300M"], choices=list(SIZES))
    parser.add_argument("--parts", type=int, default=2, help="parts of the split build (1: whole only)")
    parser.add_argument("--soc-model", default="57", help="QNN soc_model (57: SM8650)")
    parser.add_argument("--max-gb", type=float, default=14.0, help="kill a compile above this resident memory")
    parser.add_argument("--timeout", type=float, default=3600.0, help="kill a compile after this many seconds")
    parser.add_argument("--no-simulate", action="store_true", help="compile only")
    parser.add_argument("--json", type=Path, help="append each size's row to this JSON-lines file")
    parser.add_argument("--keep", type=Path, help="build here instead of a temporary folder")
    parser.add_argument("--table", type=Path, help="print the rows of this JSON-lines file as a markdown table")
    parser.add_argument("--doit", action="store_true", help="build each size through doit (a packaged ONNX with "
                        "split: {parts: N}, export to the parts' pipeline) instead of compiling directly")
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if args.doit:
        for size in args.sizes:
            with tempfile.TemporaryDirectory(dir=args.keep) as tmp:
                row = through_doit(size, args.parts, Path(tmp) / "project", args.max_gb, args.timeout)
            row["date"], row["load_avg"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()[0]
            if args.json:
                with open(args.json, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
        return 0
    for size in args.sizes:
        with tempfile.TemporaryDirectory(dir=args.keep) as tmp:
            row = measure(size, args.parts, Path(tmp), args.soc_model, args.max_gb, args.timeout, not args.no_simulate)
        row["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        row["load_avg"], row["machine"] = os.getloadavg()[0], machine()
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
