"""How many copies of a tied embedding a QNN context binary keeps: a token lookup and an output projection on one
[vocab, width] table, compiled for one chip with onnxruntime-qnn, one lone graph per way of writing them.

    python benchmarks/bench_tied_embedding.py                  # Whisper tiny.en's table: [51864, 384]
    python benchmarks/bench_tied_embedding.py --vocab 4096     # quicker (the test's size)

Each graph is token -> Gather -> + position -> LayerNorm -> projection -> logits, with the table as ONE initializer:
  twice     the projection is Gemm(x, table, transB=1)    (what the exporter writes once the tie is shared)
  once      the projection reads a run-time copy: Gather(table, rows + token x 0), indices the compiler cannot fold
  one-hot   the lookup is MatMul(one_hot(token), table)   (the converter adds a transposed copy)
  host      no lookup: the row comes in as an input       (the projection's copy alone, for scale)
Prints each binary's size and how many table copies that is (fp16). docs/whisper.md has the measured figures.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WAYS = ("twice", "once", "one-hot", "host")


def model(way: str, vocab: int, width: int) -> onnx.ModelProto:
    table = (np.random.default_rng(0).standard_normal((vocab, width)) * 0.02).astype(np.float32)
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.ones(width, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(width, np.float32), "beta"),
             numpy_helper.from_array(np.array([1, width], np.int64), "row_shape"),
             numpy_helper.from_array(np.array([1, 1, vocab], np.int64), "logits_shape"),
             numpy_helper.from_array(np.arange(vocab, dtype=np.int32).reshape(1, vocab), "rows"),
             numpy_helper.from_array(np.zeros((1, 1), np.int32), "zero")]
    first = helper.make_tensor_value_info("row" if way == "host" else "token", TensorProto.FLOAT if way == "host"
                                          else TensorProto.INT32, [1, width] if way == "host" else [1, 1])
    position = helper.make_tensor_value_info("position", TensorProto.FLOAT, [1, width])
    nodes = {
        "host": [helper.make_node("Identity", ["row"], ["embedded"])],
        "one-hot": [helper.make_node("Equal", ["token", "rows"], ["hot"]),
                    helper.make_node("Cast", ["hot"], ["one_hot"], to=TensorProto.FLOAT),
                    helper.make_node("MatMul", ["one_hot", "table"], ["embedded"])],
    }.get(way, [helper.make_node("Gather", ["table", "token"], ["gathered"]),
                helper.make_node("Reshape", ["gathered", "row_shape"], ["embedded"])])
    nodes += [helper.make_node("Add", ["embedded", "position"], ["x"]),
              helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    weight = "table"
    if way == "once":
        nodes += [helper.make_node("Mul", ["token", "zero"], ["token_x0"]),
                  helper.make_node("Add", ["rows", "token_x0"], ["every_row"]),
                  helper.make_node("Gather", ["table", "every_row"], ["table_rows"]),
                  helper.make_node("Reshape", ["table_rows", "table_shape"], ["runtime_table"])]
        inits.append(numpy_helper.from_array(np.array([vocab, width], np.int64), "table_shape"))
        weight = "runtime_table"
    nodes += [helper.make_node("Gemm", ["y", weight], ["projected"], transB=1),
              helper.make_node("Reshape", ["projected", "logits_shape"], ["logits"])]
    used = {name for node in nodes for name in node.input}
    graph = helper.make_graph(nodes, f"tied_{way}", [first, position],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 1, vocab])],
                              [i for i in inits if i.name in used])
    result = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result.ir_version = 8
    onnx.checker.check_model(result)
    return result


def measure(vocab: int, width: int, soc_model: str, folder: Path) -> list[dict]:
    from qnn_tasks.toolchains.ort_qnn import compile_context, cpu_partition

    options = {"htp_graph_finalization_optimization_mode": "3", "soc_model": soc_model, "vtcm_mb": "8"}
    table = vocab * width * 2
    rows = []
    for way in WAYS:
        source = folder / f"{way}.onnx"
        onnx.save(model(way, vocab, width), str(source))
        start = time.perf_counter()
        compile_context(source, folder / f"{way}_ctx.onnx", options, folder / f"{way}.log")
        size = (folder / f"{way}_ctx_qnn.bin").stat().st_size
        rows.append({"way": way, "bytes": size, "copies": round(size / table, 2), "seconds": time.perf_counter() - start,
                     "cpu_nodes": [n["op_type"] for n in cpu_partition(folder / f"{way}_ctx.onnx")["cpu_nodes"]]})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=51864)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--soc-model", default="57", help="QNN soc_model (57: SM8650)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args.vocab, args.width, args.soc_model, Path(tmp))
    print(f"table [{args.vocab}, {args.width}] fp16 = {args.vocab * args.width * 2} bytes; soc_model {args.soc_model}")
    print(f"{'way':8} {'binary bytes':>13} {'copies':>6} {'compile s':>9}  on CPU")
    for row in rows:
        print(f"{row['way']:8} {row['bytes']:>13} {row['copies']:>6} {row['seconds']:>9.1f}  "
              f"{', '.join(row['cpu_nodes']) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
