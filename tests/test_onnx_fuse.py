"""Load-time Conv + BatchNormalization folding (ember.onnx.fuse): folded where the graph allows,
left alone where it does not, same results as onnxruntime either way."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import ember
import ember.onnx

rng = np.random.default_rng(4)


def f32(*shape, s=1.0):
    return (rng.standard_normal(shape) * s).astype(np.float32)


def _graph(conv_bias=True, extra_reader=False, stats_as_input=False, out_conv=False):
    inits = [numpy_helper.from_array(f32(4, 3, 3, 3, s=0.3), "w"),
             numpy_helper.from_array(f32(4) + 1, "g"), numpy_helper.from_array(f32(4, s=0.1), "beta"),
             numpy_helper.from_array(f32(4, s=0.2), "mean")]
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 6, 6])]
    var = np.abs(f32(4)) + 0.5
    if stats_as_input:
        inputs.append(helper.make_tensor_value_info("var", T.FLOAT, [4]))
    else:
        inits.append(numpy_helper.from_array(var, "var"))
    conv_in = ["x", "w"]
    if conv_bias:
        inits.append(numpy_helper.from_array(f32(4, s=0.1), "b"))
        conv_in.append("b")
    nodes = [helper.make_node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["y"], epsilon=1e-3)]
    outputs = [helper.make_tensor_value_info("y", T.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["c"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", T.FLOAT, None))
    if out_conv:
        outputs.append(helper.make_tensor_value_info("c", T.FLOAT, None))
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = 8
    feeds = {"x": f32(1, 3, 6, 6)}
    if stats_as_input:
        feeds["var"] = var
    return m.SerializeToString(), feeds


@pytest.mark.parametrize("kind,folds", [("plain", True), ("no_conv_bias", True), ("conv_read_twice", False),
                                        ("stats_are_inputs", False), ("conv_is_an_output", False)])
def test_fold(kind, folds, device):
    raw, feeds = _graph(conv_bias=kind != "no_conv_bias", extra_reader=kind == "conv_read_twice",
                        stats_as_input=kind == "stats_are_inputs", out_conv=kind == "conv_is_an_output")
    want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, feeds)
    m = ember.onnx.load(raw, device=device)
    ops = [n.op_type for n in m.graph.nodes]
    assert ("BatchNormalization" not in ops) == folds
    got = m.run({k: ember.from_numpy(v, device=device) for k, v in feeds.items()})
    for name, w in zip(m.output_names, want):
        np.testing.assert_allclose(got[name].numpy(), w, rtol=1e-5, atol=1e-5)


def _gelu_graph(form):
    x = "x"
    nodes, inits = [], [numpy_helper.from_array(np.array(v, np.float32), n)
                        for n, v in (("r2", 2 ** 0.5), ("ir2", 2 ** -0.5), ("one", 1.0), ("half", 0.5))]
    if form == "div_half_last":
        nodes = [helper.make_node("Div", [x, "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", [x, "a"], ["m"]),
                 helper.make_node("Mul", ["m", "half"], ["y"])]
    elif form == "mul_half_first":
        nodes = [helper.make_node("Mul", ["ir2", x], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["one", "e"], ["a"]), helper.make_node("Mul", [x, "half"], ["h"]),
                 helper.make_node("Mul", ["h", "a"], ["y"])]
    elif form == "wrong_constant":
        nodes = [helper.make_node("Div", [x, "one"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", [x, "a"], ["m"]),
                 helper.make_node("Mul", ["m", "half"], ["y"])]
    elif form == "erf_read_twice":
        nodes = [helper.make_node("Div", [x, "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", [x, "a"], ["m"]),
                 helper.make_node("Mul", ["m", "half"], ["y0"]), helper.make_node("Add", ["y0", "e"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [3, 50])],
                                            [helper.make_tensor_value_info("y", T.FLOAT, None)], inits),
                          opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.mark.parametrize("form,fused", [("div_half_last", True), ("mul_half_first", True),
                                        ("wrong_constant", False), ("erf_read_twice", False)])
def test_gelu_fusion(form, fused, device):
    raw = _gelu_graph(form)
    x = f32(3, 50, s=3.0)
    want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    m = ember.onnx.load(raw, device=device)
    assert ("Erf" not in [n.op_type for n in m.graph.nodes]) == fused
    np.testing.assert_allclose(m(ember.from_numpy(x, device=device)).numpy(), want, rtol=1e-5, atol=1e-6)


FUSED_OPS = {"ai.ember:Linear", "ai.ember:Attention"}     # written only by ember.onnx.fuse (tests/test_onnx_ops.py's coverage check)


@pytest.mark.parametrize("form,fused", [("3d", True), ("bias_first", True), ("weight_is_input", False),
                                        ("bias_wrong_shape", False), ("matmul_read_twice", False)])
def test_linear_fusion(form, fused, device):
    x = f32(2, 3, 6)
    w, b = f32(6, 5), f32(5)
    inits = [numpy_helper.from_array(b if form != "bias_wrong_shape" else f32(3, 5), "b")]
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, list(x.shape))]
    feeds = {"x": x}
    if form == "weight_is_input":
        inputs.append(helper.make_tensor_value_info("w", T.FLOAT, [6, 5]))
        feeds["w"] = w
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Add", ["b", "m"] if form == "bias_first" else ["m", "b"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", T.FLOAT, None)]
    if form == "matmul_read_twice":
        nodes.append(helper.make_node("Relu", ["m"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", T.FLOAT, None))
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = 8
    raw = m.SerializeToString()
    want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, feeds)
    model = ember.onnx.load(raw, device=device)
    assert ("MatMul" not in [n.op_type for n in model.graph.nodes]) == fused
    got = model.run({k: ember.from_numpy(v, device=device) for k, v in feeds.items()})
    for name, r in zip(model.output_names, want):
        np.testing.assert_allclose(got[name].numpy(), r, rtol=1e-5, atol=1e-5)


def test_fusion_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("EMBER_ONNX_FUSE", "off")
    m = ember.onnx.load(_gelu_graph("div_half_last"), device="numpy")
    assert "Erf" in [n.op_type for n in m.graph.nodes]


def _attention_graph(form):
    """q (2, 3, 4, 8), k (2, 3, 5, 8) -> kt by Transpose, v (2, 3, 5, 6), mask (2, 1, 1, 5):
    the scores, a scale, a mask and a softmax in the arrangement ``form`` names."""
    B, H, L, S, E, Ev = 2, 3, 4, 5, 8, 6
    opset = 11 if form == "opset11_default_axis" else 15
    inputs = [helper.make_tensor_value_info("q", T.FLOAT, [B, H, L, E]),
              helper.make_tensor_value_info("k", T.FLOAT, [B, H, S, E]),
              helper.make_tensor_value_info("v", T.FLOAT, [B, H, S, Ev])]
    mshape = [1, 2, L, S] if form == "mask_wider" else [B, 1, 1, S]
    if form == "mask_wider":
        inputs[0] = helper.make_tensor_value_info("q", T.FLOAT, [2, L, E])
        inputs[1] = helper.make_tensor_value_info("k", T.FLOAT, [2, S, E])
        inputs[2] = helper.make_tensor_value_info("v", T.FLOAT, [2, S, Ev])
    inputs.append(helper.make_tensor_value_info("mask", T.FLOAT, mshape))
    inits = [numpy_helper.from_array(np.array(E ** 0.5, np.float32), "c"),
             numpy_helper.from_array(np.array(E ** -0.5, np.float32), "ic")]
    perm = [0, 2, 1] if form == "mask_wider" else [0, 1, 3, 2]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=perm), helper.make_node("MatMul", ["q", "kt"], ["s"])]
    sm_in = "s"
    if form in ("div_mask", "mask_first", "scores_read_twice", "opset11_default_axis", "mask_wider", "dead_rows"):
        nodes.append(helper.make_node("Div", ["s", "c"], ["d"]))
        sm_in = "d"
    elif form == "mul_const_first":
        nodes.append(helper.make_node("Mul", ["ic", "s"], ["d"]))
        sm_in = "d"
    if form != "mul_const_first":
        nodes.append(helper.make_node("Add", ["mask", sm_in] if form == "mask_first" else [sm_in, "mask"], ["a"]))
        sm_in = "a"
    kw = {} if form == "opset11_default_axis" else {"axis": -1}
    nodes += [helper.make_node("Softmax", [sm_in], ["p"], **kw), helper.make_node("MatMul", ["p", "v"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", T.FLOAT, None)]
    if form == "scores_read_twice":
        outputs.append(helper.make_tensor_value_info("s", T.FLOAT, None))
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    feeds = {vi.name: f32(*[d.dim_value for d in vi.type.tensor_type.shape.dim]) for vi in inputs}
    mask = np.where(rng.random(mshape) < 0.3, -10000.0, 0.0).astype(np.float32)
    if form == "dead_rows":
        mask[0] = -10000.0           # every key of batch 0 masked (finite: a uniform softmax)
    feeds["mask"] = mask
    return m.SerializeToString(), feeds


@pytest.mark.parametrize("form,fused", [("div_mask", True), ("mask_first", True), ("mul_const_first", True),
                                        ("noscale_mask", True), ("dead_rows", True), ("mask_wider", True),
                                        ("scores_read_twice", False), ("opset11_default_axis", False)])
def test_attention_fusion(form, fused, device):
    """MatMul -> (Div | Mul) -> Add -> Softmax -> MatMul becomes one Attention node (one SDPA
    kernel), the same numbers as onnxruntime's unfused ops; a mask with more axes than the scores
    (``mask_wider``) is fused but computed by the original ops at run time."""
    raw, feeds = _attention_graph(form)
    want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, feeds)
    m = ember.onnx.load(raw, device=device)
    ops = [n.op_type for n in m.graph.nodes]
    assert ("Softmax" not in ops) == fused, ops
    got = m.run({k: ember.from_numpy(v, device=device) for k, v in feeds.items()})
    for name, w in zip(m.output_names, want):
        assert got[name].shape == w.shape
        np.testing.assert_allclose(got[name].numpy(), w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["bias", "no_bias", "one_weight_is_input", "mixed_bias"])
def test_parallel_linear_fusion(form, device):
    """Linears of one input (a BERT layer's q, k, v) become one product over their weights side
    by side, split back: the same numbers as onnxruntime, fewer products."""
    x = f32(2, 3, 6)
    widths = [5, 7, 5]
    inits, nodes, outs = [], [], []
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, list(x.shape))]
    feeds = {"x": x}
    for i, n in enumerate(widths):
        w = f32(6, n)
        if form == "one_weight_is_input" and i == 1:
            inputs.append(helper.make_tensor_value_info(f"w{i}", T.FLOAT, [6, n]))
            feeds[f"w{i}"] = w
        else:
            inits.append(numpy_helper.from_array(w, f"w{i}"))
        with_bias = form == "bias" or form == "one_weight_is_input" or (form == "mixed_bias" and i != 2)
        if with_bias:
            inits.append(numpy_helper.from_array(f32(n), f"b{i}"))
            nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
                      helper.make_node("Add", [f"m{i}", f"b{i}"], [f"l{i}"])]
        else:
            nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"l{i}"]))
        nodes.append(helper.make_node("Relu", [f"l{i}"], [f"y{i}"]))
        outs.append(helper.make_tensor_value_info(f"y{i}", T.FLOAT, None))
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outs, inits),
                          opset_imports=[helper.make_opsetid("", 15)])
    m.ir_version = 8
    raw = m.SerializeToString()
    want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, feeds)
    model = ember.onnx.load(raw, device=device)
    lin = [n for n in model.graph.nodes if n.op_type == "Linear"]
    # bias: all three in one; one_weight_is_input: that one stays a MatMul, the other two fuse;
    # no_bias: plain MatMuls (fuse_linear makes Linears of MatMul + Add only); mixed: the two with bias
    expect = {"bias": [3], "one_weight_is_input": [2], "no_bias": [], "mixed_bias": [2]}[form]
    assert sorted(len(n.outputs) for n in lin) == expect
    got = model.run({k: ember.from_numpy(v, device=device) for k, v in feeds.items()})
    for name, r in zip(model.output_names, want):
        np.testing.assert_allclose(got[name].numpy(), r, rtol=1e-5, atol=1e-5)
