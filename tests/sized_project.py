"""A project built in code whose graph takes several lengths (`dims:`): masked mean pooling over a sequence.

`pool`: y = sum_s(relu(x_s @ W + b) * mask_s) / sum_s(mask_s), built by export.py with onnx.helper at the
size it is told (ctx.size). With `options: {mask: ignored}` the export forgets the mask (a mean over every
position, padding included): each size agrees with its CPU reference, but a short input padded into a larger
size changes its answer, which only the cross-size check sees. Samples come at their own length (3 to 14
positions), so each fits the smallest size; reference() is the same math in numpy.

`attention_project`: masked self-attention with an additive mask [1, seq, seq] (the dim on two axes) at
seq 8 and 16, the mask's pad value given per model (-10000.0 keeps the padded keys out of the softmax, 0
lets them in).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from conftest import Project, copy_project
from onnx import TensorProto, helper, numpy_helper
from tiny_project import only_model

MODEL_YAML = """\
licence: test fixture
source: {{url: built in export.py}}
graphs:
  {name}:
    dims:
      seq: {{sizes: {sizes}, pad: {{x: 0.0, mask: 0}}, longer: skip}}
    inputs:
      x: {{shape: [1, seq, 16], dtype: float32}}
      mask: {{shape: [1, seq], dtype: int32}}
    outputs:
      y: {{shape: [1, 8]}}
    options: {{mask: {mask}}}
    socs: [SM8650]
    verify:
      samples: 8
      checks:
        - ranking: {{output: y, top: 1, min: 1.0}}
"""
HEAD_YAML = """\
  head:
    export: export_head
    inputs:
      y: {shape: [1, 8], dtype: float32}
    outputs:
      logits: {shape: [1, 2]}
    socs: [SM8650]
pipeline:
  graphs: [{name}, head]
  verify:
    checks:
      - top1: {output: logits, min: 1.0}
"""

EXPORT_PY = '''\
"""Masked mean pooling over a sequence, built at the size the tool asks for (ctx.size)."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WEIGHT_SEED = 7


def _weights():
    rng = np.random.default_rng(WEIGHT_SEED)
    return rng.standard_normal((16, 8)).astype(np.float32) / 4, rng.standard_normal(8).astype(np.float32) / 2


def export(ctx):
    size = ctx.size
    w, b = _weights()
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"])]
    if ctx.options["mask"] == "ignored":  # the padding leaks into the mean
        nodes.append(helper.make_node("ReduceMean", ["r"], ["y"], axes=[1], keepdims=0))
    else:
        nodes += [helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
                  helper.make_node("Unsqueeze", ["m", "last"], ["m3"]),
                  helper.make_node("Mul", ["r", "m3"], ["rm"]),
                  helper.make_node("ReduceSum", ["rm", "one"], ["total"], keepdims=0),
                  helper.make_node("ReduceSum", ["m", "one"], ["count"], keepdims=1),
                  helper.make_node("Max", ["count", "floor"], ["safe"]),
                  helper.make_node("Div", ["total", "safe"], ["y"])]
    graph = helper.make_graph(
        nodes, "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size, 16]),
         helper.make_tensor_value_info("mask", TensorProto.INT32, [1, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(np.array([2], np.int64), "last"), numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.array(1.0, np.float32), "floor")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(ctx.out_path))


def _head():
    return np.random.default_rng(WEIGHT_SEED + 1).standard_normal((8, 2)).astype(np.float32)


def export_head(ctx):
    """A head after the pooling (a graph without sizes): logits = y @ W2."""
    graph = helper.make_graph([helper.make_node("MatMul", ["y", "w2"], ["logits"])], "head",
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 2])],
                              [numpy_helper.from_array(_head(), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(ctx.out_path))


def samples(ctx):
    """Eight inputs at their own length (3 to 14 positions), mask 1 over each (the head: pooled vectors)."""
    rng = np.random.default_rng(11)
    if ctx.graph.name == "head":
        return [{"y": np.abs(rng.standard_normal((1, 8))).astype(np.float32)} for _ in range(8)]
    out = []
    for length in (3, 14, 5, 9, 7, 12, 4, 10):
        out.append({"x": rng.standard_normal((1, length, 16)).astype(np.float32),
                    "mask": np.ones((1, length), np.int32)})
    return out


def reference(ctx, inputs):
    if ctx.graph.name == "head":
        return [{"logits": (sample["y"] @ _head()).astype(np.float32)} for sample in inputs]
    w, b = _weights()
    result = []
    for sample in inputs:
        r = np.maximum(sample["x"][0] @ w + b, 0.0)
        m = sample["mask"][0].astype(np.float32)
        y = r.mean(axis=0) if ctx.options["mask"] == "ignored" else (r * m[:, None]).sum(0) / max(m.sum(), 1.0)
        result.append({"y": y[None].astype(np.float32)})
    return result
'''


def sized_project(root: Path, models: dict[str, str], sizes: str = "[16, 32]", head: str | None = None) -> Project:
    """The example project with its models replaced by sized pooling models: {model name: mask mode}; the model
    `head` names gets a head graph after the pooling and a pipeline of both (one per size)."""
    project = copy_project(root)
    for model in project.root.glob("models/*"):
        shutil.rmtree(model)
    for name, mask in models.items():
        folder = project.path(f"models/{name}")
        folder.mkdir(parents=True)
        (folder / "model.yaml").write_text(MODEL_YAML.format(name=name, sizes=sizes, mask=mask)
                                           + (HEAD_YAML.replace("{name}", name) if name == head else ""))
        (folder / "export.py").write_text(EXPORT_PY)
    return project


PACKAGED_YAML = """\
licence: test fixture
source: {file: dyn.onnx}
graphs:
  dyn:
    dims: {seq: {sizes: [8, 16], pad: {x: 0.0, mask: 0}, longer: truncate}}
    inputs:
      x: {shape: [1, seq, 16], dtype: float32}
      mask: {shape: [1, seq], dtype: int32}
    outputs:
      y: {shape: [1, 8]}
    samples: {files: samples.npz}
    socs: [SM8650]
    verify: {checks: [{ranking: {output: y, top: 1, min: 1.0}}]}
"""
LENGTHS = (3, 7, 5, 12, 4, 9, 6, 10)  # 12, 9 and 10 are longer than the size 8: truncated there


def packaged_sized_project(root: Path) -> Project:
    """YAML only: a packaged ONNX whose sequence dim is symbolic ('seq', int64 mask), masked mean pooling, and
    sample files padded to 12 positions (the built-in export fixes the dim to each size)."""
    project = copy_project(root)
    for model in project.root.glob("models/*"):
        shutil.rmtree(model)
    folder = project.path("models/dyn")
    folder.mkdir(parents=True)
    rng = np.random.default_rng(3)
    weights = (rng.standard_normal((16, 8)) / 4).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "last"], ["m3"]), helper.make_node("Mul", ["r", "m3"], ["rm"]),
             helper.make_node("ReduceSum", ["rm", "one"], ["total"], keepdims=0),
             helper.make_node("ReduceSum", ["m", "one"], ["count"], keepdims=1),
             helper.make_node("Div", ["total", "count"], ["y"])]
    graph = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 16]),
                                             helper.make_tensor_value_info("mask", TensorProto.INT64, [1, "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(weights, "w"),
                               numpy_helper.from_array(np.array([2], np.int64), "last"),
                               numpy_helper.from_array(np.array([1], np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(folder / "dyn.onnx"))
    xs, masks = np.zeros((len(LENGTHS), 1, 12, 16), np.float32), np.zeros((len(LENGTHS), 1, 12), np.int64)
    for i, length in enumerate(LENGTHS):
        xs[i, 0, :length] = rng.standard_normal((length, 16))
        masks[i, 0, :length] = 1
    np.savez(folder / "samples.npz", x=xs, mask=masks)
    (folder / "model.yaml").write_text(PACKAGED_YAML)
    return project


ATTENTION_YAML = """\
licence: test fixture
source: {{url: built in export.py}}
graphs:
  {name}:
    dims:
      seq: {{sizes: [8, 16], pad: {{x: 0.0, mask: {pad}}}, longer: skip}}
    inputs:
      x: {{shape: [1, seq, 16], dtype: float32}}
      mask: {{shape: [1, seq, seq], dtype: float32}}
    outputs:
      probs: {{shape: [1, seq, seq]}}
      ctx: {{shape: [1, seq, 8]}}
      pooled: {{shape: [1, 8]}}
    socs: [SM8650]
    verify:
      samples: 8
      checks:
        - ranking: {{output: pooled, top: 1, min: 1.0}}
"""

ATTENTION_PY = '''\
"""Masked self-attention, built at the size the tool asks for (ctx.size): an additive mask [1, seq, seq].

scores = q k^T / sqrt(8) + mask; probs = softmax(scores) on the rows that hold a position (a row of the mask
with a value above -1: a padded row is all pad); ctx = probs v on those rows; pooled = their mean.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WEIGHT_SEED = 5
LENGTHS = (3, 12, 5, 7, 4, 10, 6, 8)  # 12 and 10 are longer than the size 8: skipped there


def _weights():
    rng = np.random.default_rng(WEIGHT_SEED)
    wq, wk, wv = (rng.standard_normal((16, 8)).astype(np.float32) / 4 for _ in range(3))
    return wq, wk, wv, rng.standard_normal(8).astype(np.float32)


def export(ctx):
    size = ctx.size
    wq, wk, wv, bv = _weights()
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["xv"]), helper.make_node("Add", ["xv", "bv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["scores"]),
             helper.make_node("Add", ["scores", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("ReduceMax", ["mask"], ["rowmax"], axes=[2], keepdims=1),
             helper.make_node("Greater", ["rowmax", "open"], ["held"]),
             helper.make_node("Cast", ["held"], ["valid"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["p", "valid"], ["probs"]),
             helper.make_node("MatMul", ["probs", "v"], ["ctx"]),
             helper.make_node("ReduceSum", ["ctx", "one"], ["total"], keepdims=0),
             helper.make_node("ReduceSum", ["valid", "one"], ["count"], keepdims=0),
             helper.make_node("Max", ["count", "floor"], ["safe"]),
             helper.make_node("Div", ["total", "safe"], ["pooled"])]
    graph = helper.make_graph(
        nodes, "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size, 16]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, size, size])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, size, size]),
         helper.make_tensor_value_info("ctx", TensorProto.FLOAT, [1, size, 8]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(wk, "wk"), numpy_helper.from_array(wv, "wv"),
         numpy_helper.from_array(bv, "bv"), numpy_helper.from_array(np.array(8 ** -0.5, np.float32), "scale"),
         numpy_helper.from_array(np.array(-1.0, np.float32), "open"),
         numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.array(1.0, np.float32), "floor")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(ctx.out_path))


def samples(ctx):
    """Eight inputs at their own length, each with its causal mask (0 on and below the diagonal, -1e4 above)."""
    rng = np.random.default_rng(13)
    return [{"x": rng.standard_normal((1, n, 16)).astype(np.float32),
             "mask": np.triu(np.full((n, n), -1.0e4, np.float32), k=1)[None]} for n in LENGTHS]


def reference(ctx, inputs):
    wq, wk, wv, bv = _weights()
    result = []
    for sample in inputs:
        x, mask = sample["x"][0], sample["mask"][0]
        scores = (x @ wq) @ (x @ wk).T / np.sqrt(8.0) + mask
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        valid = (mask.max(axis=-1) > -1.0).astype(np.float32)[:, None]
        probs = e / e.sum(axis=-1, keepdims=True) * valid
        out = probs @ (x @ wv + bv)
        result.append({"probs": probs[None], "ctx": out[None].astype(np.float32),
                       "pooled": (out.sum(0) / max(valid.sum(), 1.0))[None].astype(np.float32)})
    return result
'''


def attention_project(root: Path, pads: dict[str, str]) -> Project:
    """The example project with its models replaced by masked self-attention models at seq 8 and 16, whose
    [1, seq, seq] mask has the dim on two axes: {model name: the mask's pad value as written in model.yaml}."""
    project = copy_project(root)
    for model in project.root.glob("models/*"):
        shutil.rmtree(model)
    for name, pad in pads.items():
        folder = project.path(f"models/{name}")
        folder.mkdir(parents=True)
        (folder / "model.yaml").write_text(ATTENTION_YAML.format(name=name, pad=pad))
        (folder / "export.py").write_text(ATTENTION_PY)
    return project


CHAIN_YAML = """\
licence: test fixture
source: {file: enc.onnx}
graphs:
  enc:
    dims: {seq: {sizes: [8, 16], pad: {x: 0.0}, longer: skip}}
    inputs: {x: {shape: [1, seq, 4], dtype: float32}}
    outputs: {mem: {shape: [1, seq, 4]}}
    samples: {files: samples.npz}
    socs: [SM8650]
  dec:
    source: {file: dec.onnx}
    dims: {seq: [8, 16]}
    inputs:
      mem: {shape: [1, seq, 4], dtype: float32}
      tok: {shape: [1, 1], dtype: float32}
    outputs: {y: {shape: [1, 4]}}
    samples: {from: {mem: enc.mem}, fill: {tok: 1.0}}
    socs: [SM8650]
pipeline:
  graphs: [enc, dec]
  feed: {dec.tok: {value: 1.0}}
"""
CHAIN_LENGTHS = (3, 12, 5, 9, 7, 4)  # 12 and 9 are longer than the size 8: skipped there


def chained_sized_project(root: Path, model_yaml: str = CHAIN_YAML) -> Project:
    """YAML only: an encoder and a decoder of one sequence dim (packaged ONNX, symbolic 'seq', sizes 8 and 16), the
    decoder fed the encoder's `mem` and a start token `tok` (a constant: `pipeline.feed: {dec.tok: {value: 1.0}}`):
    enc mem = x @ W (padding stays 0), dec y = sum over seq of mem, plus tok. The encoder's samples are files
    padded to 12 positions."""
    project, folder = only_model(root, "chain")
    rng = np.random.default_rng(5)
    weights = rng.standard_normal((4, 4)).astype(np.float32)
    enc = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["mem"])], "enc",
                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 4])],
                            [helper.make_tensor_value_info("mem", TensorProto.FLOAT, [1, "seq", 4])],
                            [numpy_helper.from_array(weights, "w")])
    dec = helper.make_graph([helper.make_node("ReduceSum", ["mem", "one"], ["total"], keepdims=0),
                             helper.make_node("Add", ["total", "tok"], ["y"])], "dec",
                            [helper.make_tensor_value_info("mem", TensorProto.FLOAT, [1, "seq", 4]),
                             helper.make_tensor_value_info("tok", TensorProto.FLOAT, [1, 1])],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                            [numpy_helper.from_array(np.array([1], np.int64), "one")])
    for name, graph in (("enc.onnx", enc), ("dec.onnx", dec)):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 10
        onnx.save(model, str(folder / name))
    xs = np.zeros((len(CHAIN_LENGTHS), 1, 12, 4), np.float32)
    for i, length in enumerate(CHAIN_LENGTHS):
        xs[i, 0, :length] = rng.standard_normal((length, 4))
    np.savez(folder / "samples.npz", x=xs)
    (folder / "model.yaml").write_text(model_yaml)
    return project
