"""scale-input on an STFT-like power spectrum whose conv overflows fp16 (issue 22), models built in code.

CPU outputs before and after the rewrite (allclose), the refusals (one line naming the node), the option
checks, and one real fp16 build for SM8650: diagnose names the overflow and advises scale-input with a computed
factor; the rewritten graph agrees with the CPU on the simulator where the raw one did not.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_rewrites import const, model_of, ops, rewritten, run

from qnn_tasks import rewrites
from qnn_tasks.errors import RewriteError, StageError
from qnn_tasks.rewrites import inputscale

F = TensorProto.FLOAT
RNG = np.random.default_rng(2022)
SAMPLES, FREQS, TAPS, HOP = 1024, 8, 64, 32
FRAMES = (SAMPLES - TAPS) // HOP + 1


def value(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def stft_basis():
    """Hann-windowed cos and sin rows for FREQS bins (x4: an unnormalised front end), [2 * FREQS, 1, TAPS]."""
    n = np.arange(TAPS)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / TAPS)
    k = np.arange(1, FREQS + 1)[:, None] * 3
    rows = np.concatenate([np.cos(2 * np.pi * k * n / TAPS), np.sin(2 * np.pi * k * n / TAPS)]) * window * 4
    return rows[:, None, :].astype(np.float32)


def power_spectrum(after_log=None, square="pow"):
    """y = log(sum over re/im of conv(x)^2 + eps): the STFT front end of an audio model, bias on the conv.

    `after_log`: a node type applied to the scaled power instead of the Log (a refusal case)."""
    square_node = (helper.make_node("Pow", ["spec", "two"], ["power2"], name="square") if square == "pow"
                   else helper.make_node("Mul", ["spec", "spec"], ["power2"], name="square"))
    nodes = [helper.make_node("Conv", ["x", "basis", "bias"], ["spec"], strides=[HOP], name="stft"),
             square_node,
             helper.make_node("Reshape", ["power2", "split_re_im"], ["power4"], name="re_im"),
             helper.make_node("ReduceSum", ["power4", "axis1"], ["power"], keepdims=0, name="bins"),
             helper.make_node("Add", ["power", "eps"], ["power_eps"], name="floor")]
    nodes.append(helper.make_node(after_log or "Log", ["power_eps"], ["y"], name="log"))
    return model_of(nodes, [value("x", (1, 1, SAMPLES))], [value("y", (1, FREQS, FRAMES))],
                    [const("basis", stft_basis()), const("bias", RNG.standard_normal(2 * FREQS) * 0.5),
                     const("two", 2.0), const("split_re_im", [1, 2, FREQS, FRAMES], np.int64),
                     const("axis1", [1], np.int64), const("eps", 1e-3)])


def audio(count=2, loudness=10000.0):
    """int16-scale audio (a few tones + noise), as a front end receives it; the same clips on every call."""
    t = np.arange(SAMPLES) / 16000
    rng = np.random.default_rng(16000)
    out = []
    for i in range(count):
        tones = sum(np.sin(2 * np.pi * f * t + i) for f in (750, 1500, 3000))
        wave = loudness * (0.5 * tones + 0.3 * rng.standard_normal(SAMPLES))
        out.append({"x": np.clip(wave, -32768, 32767).astype(np.float32).reshape(1, 1, SAMPLES)})
    return out


@pytest.mark.parametrize("square", ["pow", "mul"])
def test_scale_input_is_exact_on_cpu_through_a_log(square):
    model = power_spectrum(square=square)
    sites, after = rewritten(model, "scale-input", factor="1/1024")
    assert sites == ["input 'x'", "Log node 'log'", "constant 'bias'", "constant 'eps'"]
    assert ops(after)[0] == "Mul" and ops(after)[-1] == "Sub"  # x * 2^-10 ... log(.) - 2 log(2^-10)
    for feeds in audio(3):
        [a], [b] = run(model, feeds), run(after, feeds)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-4)


def test_scale_input_undoes_the_scale_at_a_linear_output():
    """No Log: the conv's output is multiplied back by 1/s; a Relu and a Max with a constant pass the scale."""
    nodes = [helper.make_node("Conv", ["x", "basis", "bias"], ["spec"], strides=[HOP], name="stft"),
             helper.make_node("Relu", ["spec"], ["r"]), helper.make_node("Max", ["r", "floor"], ["y"], name="clamp")]
    model = model_of(nodes, [value("x", (1, 1, SAMPLES))], [value("y", (1, 2 * FREQS, FRAMES))],
                     [const("basis", stft_basis()), const("bias", np.ones(2 * FREQS)), const("floor", 3.0)])
    sites, after = rewritten(model, "scale-input", input="x", factor=2 ** -8)
    assert sites == ["input 'x'", "output 'y'", "constant 'bias'", "constant 'floor'"]
    for feeds in audio(2):
        [a], [b] = run(model, feeds), run(after, feeds)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("op, problem", [
    ("Tanh", "Tanh node 'log' does not commute with scaling its input"),
    ("Sigmoid", "Sigmoid node 'log' does not commute with scaling its input"),
])
def test_scale_input_refuses_a_nonlinearity_naming_the_node(op, problem):
    with pytest.raises(rewrites.RewriteError) as info:
        rewrites.apply(power_spectrum(after_log=op), [{"scale-input": {"factor": "1/64"}}])
    message = str(info.value)
    assert message.startswith(f"scale-input: scaling input 'x' cannot be undone exactly: {problem}")
    assert "(fix: " in message and "\n" not in message


def test_a_refusal_in_the_export_stage_is_one_model_yaml_line(tmp_path):
    from test_yaml_defects import packaged_graph

    from qnn_tasks.graphs import packaged
    from qnn_tasks.modelspec.project import TensorSpec

    onnx.save(power_spectrum(after_log="Tanh"), str(tmp_path / "m.onnx"))
    graph = packaged_graph(tmp_path, [TensorSpec("x", (1, 1, SAMPLES), "float32")],
                           [TensorSpec("y", (1, FREQS, FRAMES), "float32")],
                           rewrites=rewrites.normalize([{"scale-input": {"factor": "1/64"}}]))
    with pytest.raises(StageError) as info:
        packaged.export(graph, tmp_path / "m.onnx", tmp_path / "out.onnx")
    assert str(info.value).startswith(f"{tmp_path / 'model.yaml'}: graphs.g.rewrites: scale-input: scaling input 'x'")
    assert "Tanh node 'log'" in str(info.value) and not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("options, problem", [
    ({}, "scale-input needs a factor"),
    ({"factor": 0.1}, "must be a power of two"),
    ({"factor": 1}, "must be a power of two"),
    ({"factor": "a/b"}, "must be a power of two"),
    ({"factor": True}, "must be a power of two"),
    ({"factor": "1/64", "input": 3}, "must be the name of a graph input"),
])
def test_scale_input_options_are_checked(options, problem):
    with pytest.raises(ValueError, match=problem):
        rewrites.normalize([{"scale-input": options}])


def test_scale_input_factor_forms():
    import yaml

    for form in ("1/64", "2^-6", 0.015625):
        assert rewrites.normalize([{"scale-input": {"factor": form}}])["scale-input"]["factor"] == 1 / 64
    # the line diagnose advises, as model.yaml parses it
    declared = yaml.safe_load("rewrites: [{scale-input: {input: x, factor: 1/4096}}]")["rewrites"]
    assert rewrites.normalize(declared) == {"scale-input": {"input": "x", "factor": 1 / 4096}}


def cpu_tensors(model, feeds):
    """Every tensor of `model` on CPU (inputs included), per sample: what diagnose measures."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = [o for n in model.graph.node for o in n.output if o not in {x.name for x in model.graph.output}]
    probe.graph.output.extend(helper.make_tensor_value_info(t, F, None) for t in names)
    outputs = [o.name for o in probe.graph.output]
    return [{**f, **dict(zip(outputs, run(probe, f)))} for f in feeds]


@pytest.mark.parametrize("after_log, advice", [
    ("Log", 'add "rewrites: [{scale-input: {input: x, factor: 1/8192}}]" to graphs.g in models/m/model.yaml'),
    ("Tanh", "scaling input 'x' by a power of two would keep this node in range, but the scale cannot be undone "
             "exactly (Tanh node 'log' does not commute"),
])
def test_diagnose_advises_scale_input_for_an_overflow_the_input_reaches(after_log, advice):
    """The rule on real CPU tensors (the simulator case is the test below): never w8a16 for it."""
    from test_rewrites import graph_spec

    from qnn_tasks.stages.diagnose import advise_scale_input, hazards

    model = power_spectrum(after_log=after_log)
    values = cpu_tensors(model, audio(2, loudness=20000.0))
    conv = model.graph.node[0]
    detail = {"tensor": "spec", "cpu_value": -670882.0, "npu_value": -65504.0, "input_values": {"x": 3.0}}
    detail["hazards"] = hazards(conv, detail, {}, "fp16")
    advise_scale_input(model, detail, values, graph_spec())
    [overflow] = detail["hazards"]
    assert advice in overflow["fix"] and "w8a16" not in overflow["fix"]
    assert ("rewrite" in overflow) == (after_log == "Log")


def test_diagnose_keeps_its_advice_for_an_overflow_no_input_reaches():
    from test_rewrites import graph_spec

    from qnn_tasks.stages.diagnose import advise_scale_input, hazards

    model = power_spectrum()
    detail = {"tensor": "big_constant_product", "cpu_value": -670882.0, "npu_value": -65504.0, "input_values": {}}
    detail["hazards"] = hazards(model.graph.node[0], detail, {}, "fp16")
    before = detail["hazards"][0]["fix"]
    advise_scale_input(model, detail, cpu_tensors(model, audio(1)), graph_spec())
    assert detail["hazards"][0]["fix"] == before and "rewrite" not in detail["hazards"][0]


def test_advised_factor_fits_every_scaled_tensor():
    model = power_spectrum()
    plan = inputscale.plan(model, "x")
    assert plan.refusal == "" and plan.degrees["spec"] == 1 and plan.degrees["power"] == 2 and "y" not in plan.degrees
    # conv values to 6.7e5 (degree 1), power to 9e11 (degree 2): s^2 * 9e11 <= 16376 needs s = 2^-13
    factor = inputscale.advised_factor(model, plan, {"x": 3e4, "spec": 6.7e5, "power2": 4.5e11, "power": 9e11})
    assert factor == Fraction(1, 2 ** 13)


def test_scale_input_fixes_the_overflowing_front_end_on_the_simulator(tmp_path):
    """fp16 on SM8650, real compiles and simulator runs, two clips: the raw graph's conv saturates at 65504 and the
    log power is wrong; diagnose names the overflow at the conv and advises scale-input with a factor it computed;
    the graph rewritten with that advice agrees with the CPU (whose outputs the rewrite keeps)."""
    import json

    from test_if_to_where import compile_and_simulate, sm8650_fp16
    from test_yaml_defects import packaged_graph

    from qnn_tasks.judge import metrics, sample_store
    from qnn_tasks.modelspec.checks import verify_section
    from qnn_tasks.modelspec.project import TensorSpec
    from qnn_tasks.stages import diagnose

    inputs, outputs = [TensorSpec("x", (1, 1, SAMPLES), "float32")], [TensorSpec("y", (1, FREQS, FRAMES), "float32")]
    toolchain, soc, options = sm8650_fp16(tmp_path, inputs, outputs)
    model = power_spectrum()
    feeds = audio(2)
    cpu = np.stack([run(model, f)[0] for f in feeds])
    raw, partition = compile_and_simulate(model, tmp_path / "raw.onnx", feeds, toolchain, options)
    assert partition["cpu_nodes"] == []
    raw = np.stack([o["y"] for o in raw])

    # diagnose on the raw graph, as `doit diagnose` runs it
    graph = packaged_graph(tmp_path, inputs, outputs)
    sample_store.save(tmp_path / "inputs.npz", feeds)
    sample_store.save(tmp_path / "reference.npz", [{"y": y} for y in cpu])
    (tmp_path / "options.json").write_text(json.dumps(options))
    verify = verify_section(None, "fp16", {"y"}, tmp_path / "model.yaml", "graphs.g.verify")
    record = diagnose.run(graph, verify, soc, toolchain, tmp_path / "raw.onnx", tmp_path / "options.json",
                          tmp_path / "inputs.npz", tmp_path / "reference.npz", tmp_path / "diagnose", shipped_failed=True)
    first = record["first_divergence"]
    print("diagnose:", record["verdict"]["text"])
    assert first["op_type"] == "Conv" and first["node"] == "stft" and abs(first["cpu_value"]) > 65504
    [overflow] = [h for h in first["hazards"] if h["hazard"] == "fp16 overflow"]
    assert "w8a16" not in overflow["fix"] and 'add "rewrites: [{scale-input: {input: x, factor: 1/' in overflow["fix"]

    _, after = rewritten(model, "scale-input", **overflow["rewrite"]["scale-input"])
    np.testing.assert_allclose(np.stack([run(after, f)[0] for f in feeds]), cpu, rtol=1e-5, atol=1e-4)
    fixed, partition = compile_and_simulate(after, tmp_path / "scaled.onnx", feeds, toolchain, options)
    assert partition["cpu_nodes"] == []
    fixed = np.stack([o["y"] for o in fixed])
    before, now = metrics.compare(cpu, raw), metrics.compare(cpu, fixed)
    print(f"scale-input {overflow['rewrite']}, fp16 SM8650, log power: raw cosine {before['cosine']:.6f} max-abs "
          f"{before['max_abs']:.3g}; rewritten cosine {now['cosine']:.6f} max-abs {now['max_abs']:.3g}")
    assert before["cosine"] < 0.99 or before["max_abs"] > 1.0
    assert now["cosine"] > 0.9999 and now["max_abs"] < 0.1


@pytest.mark.parametrize("factor, power", [("2^40", "2^40"), (2 ** 16, "2^16"), ("1/32768", "2^-15"), (2.0 ** -20, "2^-20"),
                                           ("2^1000000000", "2^1000000000")])
def test_scale_input_refuses_a_factor_fp16_cannot_hold(factor, power):
    """2^40 was accepted on main and the NPU output was all zeros; a huge exponent is refused without evaluating it."""
    import time

    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        rewrites.normalize([{"scale-input": {"factor": factor}}])
    assert time.perf_counter() - start < 1.0
    assert str(info.value) == (f"scale-input factor {factor!r} ({power}) is outside fp16's range: the NPU computes the "
                               "scaled input in fp16, which holds powers of two from 2^-14 to 2^15 (2^40 gave all-zero "
                               "outputs)")
    assert info.value.fix == "give a power of two from 2^-14 to 2^15, e.g. factor: 1/64 (doit diagnose advises one)"
    for edge in (2.0 ** -14, 2 ** 15):
        assert rewrites.normalize([{"scale-input": {"factor": edge}}])["scale-input"]["factor"] == edge


def energy(bias=1.0):
    """y = conv(x)^2 (no Log): the scale s is undone at the output by s^-2; the conv bias is scaled by s."""
    nodes = [helper.make_node("Conv", ["x", "basis", "bias"], ["spec"], strides=[HOP], name="stft"),
             helper.make_node("Mul", ["spec", "spec"], ["y"], name="square")]
    return model_of(nodes, [value("x", (1, 1, SAMPLES))], [value("y", (1, 2 * FREQS, FRAMES))],
                    [const("basis", stft_basis()), const("bias", np.full(2 * FREQS, bias))])


@pytest.mark.parametrize("model, factor, problem", [
    (energy, 2 ** -8, "undoing it at output 'y' multiplies by 2^16, outside fp16's powers of two (2^-14 .. 2^15)"),
    (lambda: energy(bias=1000.0), 2 ** 7, "constant 'bias' scaled with it reaches 1.28e+05, beyond fp16's 65504"),
])
def test_scale_input_refuses_a_factor_whose_products_leave_fp16(model, factor, problem):
    with pytest.raises(RewriteError) as info:
        rewrites.apply(model(), [{"scale-input": {"factor": factor}}])
    assert str(info.value) == (f"scale-input: scaling input 'x' by 2^{round(np.log2(factor))}: {problem} (fix: use a "
                               "factor nearer 1 (doit diagnose advises one that fits))")
    sites, after = rewritten(energy(), "scale-input", factor=2 ** -7)  # s^-2 = 2^14: fits, and exact on CPU
    assert "output 'y'" in sites
    for feeds in audio(2, loudness=100.0):
        np.testing.assert_allclose(run(after, feeds)[0], run(energy(), feeds)[0], rtol=1e-5)


def test_advised_factor_stays_where_fp16_can_undo_it():
    """At an output of degree 2 the advice stops at 2^-7 (s^-2 = 2^14); a tensor needing a smaller s gets none."""
    model = energy()
    plan = inputscale.plan(model, "x")
    assert plan.outputs == ["y"] and plan.degrees["y"] == 2
    assert inputscale.advised_factor(model, plan, {"spec": 6e5}) == Fraction(1, 2 ** 6)  # 6e5 s <= 65504 / 4
    assert inputscale.advised_factor(model, plan, {"y": 3.6e11}) is None  # would need 2^-8: s^-2 = 2^16 overflows fp16


def clipped_spectrum(low="low", high="high"):
    """power_spectrum with the conv clipped to constant bounds first (a front end's saturation): Clip commutes with the
    scale once its bounds are scaled with its input (issue 35: refused on main, "does not commute")."""
    model = power_spectrum()
    nodes = list(model.graph.node)
    nodes.insert(1, helper.make_node("Clip", ["spec", low, high], ["spec_clipped"], name="saturate"))
    nodes[2].input[0] = nodes[2].input[1] = "spec_clipped"
    nodes[2].op_type, nodes[2].input[:] = "Mul", ["spec_clipped", "spec_clipped"]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend([const("low", -20000.0), const("high", 30000.0)])
    if high == "ceiling":  # a bound fed at run time: not scaled with the input
        model.graph.input.append(value("ceiling", ()))
    onnx.checker.check_model(model)
    return model


def test_scale_input_scales_a_clips_constant_bounds():
    model = clipped_spectrum()
    sites, after = rewritten(model, "scale-input", factor="1/1024")
    assert "constant 'low'" in sites and "constant 'high'" in sites
    bounds = {t.name: float(onnx.numpy_helper.to_array(t)) for t in after.graph.initializer if t.name.startswith(("low", "high"))}
    assert sorted(bounds.values()) == [-20000.0 / 1024, 30000.0 / 1024]
    clipping = audio(3, loudness=30000.0)
    assert any(np.abs(cpu_tensors(model, [f])[0]["spec"]).max() > 30000 for f in clipping)  # the bounds bite
    for feeds in clipping:
        np.testing.assert_allclose(run(after, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-4)


def test_scale_input_refuses_a_clip_to_a_computed_bound():
    model = clipped_spectrum(high="ceiling")
    with pytest.raises(RewriteError) as info:
        rewrites.apply(model, [{"scale-input": {"input": "x", "factor": "1/64"}}])
    assert ("Clip node 'saturate' clips to a bound that is neither a constant nor scaled like its input (fix: scale the "
            "input at export where the scale can be undone, or drop scale-input)") in str(info.value)


def clamped_spectrum():
    """power_spectrum whose floor is Clip(power, 1e-3, +inf) instead of Add eps: torch.clamp(min=eps) as some
    exporters write it, with an infinite max (no bound)."""
    model = power_spectrum()
    floor = next(n for n in model.graph.node if n.name == "floor")
    floor.op_type, floor.input[:] = "Clip", ["power", "eps", "no_ceiling"]
    model.graph.initializer.append(const("no_ceiling", np.inf))
    onnx.checker.check_model(model)
    return model


def test_diagnose_advises_a_factor_the_rewrite_accepts_past_an_infinite_clip_bound():
    """issue 43: diagnose advised scale-input, and export refused every factor: "constant 'no_ceiling' scaled with it
    reaches inf". An infinite bound is no bound; diagnose's advice and the rewrite's check are one rule."""
    from test_rewrites import graph_spec

    from qnn_tasks.stages.diagnose import advise_scale_input, hazards

    model = clamped_spectrum()
    clips = audio(2, loudness=20000.0)
    detail = {"tensor": "spec", "cpu_value": -670882.0, "npu_value": -65504.0, "input_values": {"x": 3.0}}
    detail["hazards"] = hazards(model.graph.node[0], detail, {}, "fp16")
    advise_scale_input(model, detail, cpu_tensors(model, clips), graph_spec())
    [overflow] = detail["hazards"]
    advised = overflow["rewrite"]["scale-input"]
    assert advised == {"input": "x", "factor": "1/8192"}, overflow["fix"]
    sites, after = rewritten(model, "scale-input", **advised)
    assert "constant 'eps'" in sites and "constant 'no_ceiling'" in sites
    for feeds in clips:
        np.testing.assert_allclose(run(after, feeds)[0], run(model, feeds)[0], rtol=1e-5, atol=1e-4)
    # a finite bound the scale would push past fp16 is still refused, by the same rule diagnose asks
    model.graph.initializer[-1].CopyFrom(const("no_ceiling", 60000.0))
    with pytest.raises(RewriteError, match="constant 'no_ceiling' scaled with it reaches 1.007e\\+12"):
        rewrites.apply(model, [{"scale-input": {"factor": 2 ** 12}}])
