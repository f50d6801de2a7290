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


FUSED_OPS = {"ai.ember:Linear"}     # written only by ember.onnx.fuse (tests/test_onnx_ops.py's coverage check)


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
