"""Operators whose semantics changed between opsets, checked at each version where they changed
against onnxruntime (or, for versions onnxruntime no longer runs, ``onnx.reference``).

The case that started this file: before opset 13, Softmax, LogSoftmax and Hardmax flatten the
input to 2-D at ``axis`` (default 1) and normalise over everything from ``axis`` on; from 13
they work along the one ``axis`` (default -1). A legacy CNN ends in a Softmax over
``(1, 1000, 1, 1)``: 1000 classes under both readings, but a ``(2, 3, 4, 5)`` input tells them
apart.
"""
from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import ember
import ember.onnx
from onnx_helpers import node_model

rng = np.random.default_rng(9)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def i64(*v):
    return np.array(v, np.int64)


def _model(op, inputs, attrs, opset, inits, n_out):
    return node_model(op, inputs, attrs, opset=opset, inits=inits, n_out=n_out)


def _reference(m, feeds):
    """onnxruntime where it runs this opset, else onnx's reference evaluator."""
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - onnxruntime dropped (or never had) this opset: the spec's reference
        from onnx.reference import ReferenceEvaluator
        return [np.asarray(r) for r in ReferenceEvaluator(m).run(None, feeds)]
    return sess.run(None, feeds)


X4 = f32(2, 3, 4, 5)
LOGITS = f32(1, 1000, 1, 1)

# (id, op, inputs, attrs, opsets, initializer names, outputs)
CASES = []
for _op in ("Softmax", "LogSoftmax", "Hardmax"):
    for _opsets, _attrs in (((1, 11, 13), {}), ((1, 11, 13), {"axis": 0}), ((1, 11, 13), {"axis": 2}),
                            ((1, 11, 13), {"axis": 3}), ((11, 13), {"axis": -1}), ((11, 13), {"axis": -3})):
        CASES.append((f"{_op}/{_attrs.get('axis', 'default')}", _op, {"x": X4}, _attrs, _opsets, [], 1))
    CASES.append((f"{_op}/classifier", _op, {"x": LOGITS}, {}, (1, 9, 13), [], 1))
CASES += [
    ("Split/attr", "Split", {"x": f32(6, 4)}, {"axis": 0, "split": [2, 4]}, (2, 11), [], 2),
    ("Split/equal_negative_axis", "Split", {"x": f32(3, 6)}, {"axis": -1}, (11, 13, 18), [], 3),
    ("Split/input", "Split", {"x": f32(6, 4), "s": i64(1, 5)}, {"axis": 0}, (13, 18), ["s"], 2),
    ("Split/num_outputs", "Split", {"x": f32(7, 2)}, {"axis": 0, "num_outputs": 3}, (18,), [], 3),
    ("Squeeze/attr", "Squeeze", {"x": f32(1, 3, 1, 2)}, {"axes": [0, 2]}, (1, 11), [], 1),
    ("Squeeze/attr_negative", "Squeeze", {"x": f32(1, 3, 1, 2)}, {"axes": [-2]}, (11,), [], 1),
    ("Squeeze/all", "Squeeze", {"x": f32(1, 3, 1, 2)}, {}, (1, 11, 13), [], 1),
    ("Squeeze/input", "Squeeze", {"x": f32(1, 3, 1, 2), "a": i64(-4, 2)}, {}, (13,), ["a"], 1),
    ("Unsqueeze/attr", "Unsqueeze", {"x": f32(3, 2)}, {"axes": [0, 3]}, (1, 11), [], 1),
    ("Unsqueeze/attr_negative", "Unsqueeze", {"x": f32(3, 2)}, {"axes": [-1]}, (11,), [], 1),
    ("Unsqueeze/input", "Unsqueeze", {"x": f32(3, 2), "a": i64(1, -1)}, {}, (13,), ["a"], 1),
    ("ReduceSum/attr", "ReduceSum", {"x": X4}, {"axes": [1, -1], "keepdims": 0}, (1, 11), [], 1),
    ("ReduceSum/input", "ReduceSum", {"x": X4, "a": i64(1, -1)}, {"keepdims": 0}, (13,), ["a"], 1),
    ("ReduceSum/empty_noop", "ReduceSum", {"x": X4, "a": np.zeros(0, np.int64)}, {"noop_with_empty_axes": 1},
     (13,), ["a"], 1),
    ("ReduceSum/empty_all", "ReduceSum", {"x": X4, "a": np.zeros(0, np.int64)}, {}, (13,), ["a"], 1),
    ("ReduceMean/attr", "ReduceMean", {"x": X4}, {"axes": [0, 2]}, (1, 13), [], 1),
    ("ReduceMean/input", "ReduceMean", {"x": X4, "a": i64(0, 2)}, {}, (18,), ["a"], 1),
    ("ReduceMax/input_noop", "ReduceMax", {"x": X4, "a": np.zeros(0, np.int64)}, {"noop_with_empty_axes": 1},
     (18,), ["a"], 1),
    ("Pad/attr", "Pad", {"x": f32(2, 3)}, {"pads": [1, 0, 2, 1], "value": 1.5}, (2,), [], 1),
    ("Pad/attr_reflect", "Pad", {"x": f32(3, 4)}, {"pads": [0, 2, 0, 1], "mode": "reflect"}, (2,), [], 1),
    ("Pad/input", "Pad", {"x": f32(2, 3), "p": i64(1, 0, 2, 1), "v": np.array(1.5, np.float32)}, {},
     (11, 13), ["p", "v"], 1),
    ("Pad/axes", "Pad", {"x": f32(2, 3, 4), "p": i64(1, 2, 0, 1), "v": None, "a": i64(0, -1)}, {"mode": "edge"},
     (18,), ["p", "a"], 1),
    ("Pad/wrap", "Pad", {"x": f32(3, 4), "p": i64(1, 2, 1, 0)}, {"mode": "wrap"}, (19,), ["p"], 1),
    ("Clip/attr", "Clip", {"x": X4}, {"min": -0.5, "max": 0.3}, (6,), [], 1),
    ("Clip/input", "Clip", {"x": X4, "lo": np.array(-0.5, np.float32), "hi": np.array(0.3, np.float32)}, {},
     (11, 12, 13), ["lo", "hi"], 1),
    ("Clip/int", "Clip", {"x": i64(-5, 0, 3, 9), "lo": np.array(-2, np.int64), "hi": np.array(4, np.int64)}, {},
     (12, 13), ["lo", "hi"], 1),
    ("Slice/attr", "Slice", {"x": X4}, {"starts": [1, 0], "ends": [3, 2], "axes": [2, 3]}, (1,), [], 1),
    ("Slice/input_steps", "Slice", {"x": X4, "s": i64(3, -1), "e": i64(0, -6), "a": i64(2, 3), "st": i64(-1, -2)},
     {}, (10, 11, 13), ["s", "e", "a", "st"], 1),
    ("TopK/attr", "TopK", {"x": f32(3, 6)}, {"k": 2}, (1,), [], 2),
    ("TopK/input", "TopK", {"x": f32(3, 6), "k": i64(2)}, {"axis": 0}, (10,), ["k"], 2),
    ("TopK/smallest", "TopK", {"x": f32(3, 6), "k": i64(4)}, {"largest": 0}, (11,), ["k"], 2),
    ("Flatten/axis", "Flatten", {"x": X4}, {"axis": 2}, (1, 9, 11, 13), [], 1),
    ("Flatten/negative_axis", "Flatten", {"x": X4}, {"axis": -1}, (11, 13), [], 1),
    ("ArgMax/last_index", "ArgMax", {"x": np.array([[1, 3, 3], [2, 2, 0]], np.float32)},
     {"axis": 1, "select_last_index": 1}, (12, 13), [], 1),
    ("ArgMax/first_index", "ArgMax", {"x": np.array([[1, 3, 3], [2, 2, 0]], np.float32)}, {"axis": 1},
     (1, 11, 13), [], 1),
    ("Reshape/attr", "Reshape", {"x": X4}, {"shape": [6, -1]}, (1,), [], 1),
    ("Reshape/input", "Reshape", {"x": X4, "s": i64(0, -1, 5)}, {}, (5, 14), ["s"], 1),
    ("Reshape/allowzero", "Reshape", {"x": np.zeros((0, 3), np.float32), "s": i64(3, 0)}, {"allowzero": 1},
     (14,), ["s"], 1),
    ("Upsample/attr", "Upsample", {"x": f32(1, 1, 2, 3)}, {"scales": [1.0, 1.0, 2.0, 3.0]}, (7,), [], 1),
    ("Upsample/input", "Upsample", {"x": f32(1, 1, 2, 3), "s": np.array([1, 1, 2, 2], np.float32)},
     {"mode": "linear"}, (9,), ["s"], 1),
    ("Resize/v10", "Resize", {"x": f32(1, 1, 3, 4), "s": np.array([1, 1, 2, 1.5], np.float32)}, {},
     (10,), ["s"], 1),
    ("Resize/v11_sizes", "Resize", {"x": f32(1, 1, 3, 4), "r": None, "s": None, "z": i64(1, 1, 5, 7)},
     {"mode": "linear"}, (11, 13), ["z"], 1),
    ("Resize/v13_no_roi", "Resize", {"x": f32(1, 1, 3, 4), "r": None, "s": np.array([1, 1, 2, 2], np.float32)},
     {"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, (13,), ["s"], 1),
    ("Resize/v18_axes", "Resize", {"x": f32(1, 1, 3, 4), "r": None, "s": None, "z": i64(6, 6)},
     {"axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"}, (18,), ["z"], 1),
    ("Resize/v19_symmetric", "Resize", {"x": f32(1, 1, 3, 4), "r": None, "s": np.array([1, 1, 1.7, 2.3], np.float32)},
     {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, (19,), ["s"], 1),
    ("BatchNormalization/v7", "BatchNormalization", {"x": X4, "s": f32(3), "b": f32(3), "m": f32(3),
                                                     "v": np.abs(f32(3)) + 0.5},
     {"epsilon": 1e-3}, (7, 9, 14, 15), ["s", "b", "m", "v"], 1),
    ("Dropout/ratio_input", "Dropout", {"x": X4, "r": np.array(0.3, np.float32)}, {}, (12, 13), ["r"], 1),
    ("Dropout/attr", "Dropout", {"x": X4}, {"ratio": 0.3}, (7, 10), [], 1),
    ("Gather/negative_axis", "Gather", {"x": X4, "i": i64(0, 2)}, {"axis": -2}, (11, 13), ["i"], 1),
    ("Concat/negative_axis", "Concat", {"a": f32(2, 3), "b": f32(2, 1)}, {"axis": -1}, (11, 13), [], 1),
]


def _ids():
    out = []
    for c in CASES:
        for o in c[4]:
            out.append(pytest.param(c, o, id=f"{c[0]}@{o}"))
    return out


@pytest.mark.parametrize("case,opset", _ids())
def test_op_at_opset(case, opset, device):
    _id, op, inputs, attrs, _opsets, inits, n_out = case
    m, feeds = _model(op, inputs, attrs, opset, inits, n_out)
    want = _reference(m, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ember.onnx.load(m.SerializeToString(), device=device)
        out = model.run({k: ember.from_numpy(v, device=device) for k, v in feeds.items()})
    got = [out[n].numpy() for n in model.output_names]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape, f"{_id}@{opset}: shape {g.shape}, reference {w.shape}"
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w.astype(np.float32), rtol=1e-5, atol=1e-6, err_msg=f"{_id}@{opset}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{_id}@{opset}")


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_legacy_softmax_coerces_to_2d(op):
    """Before 13 the default axis 1 normalises over (C, H, W) jointly; from 13, axis -1 alone."""
    x = f32(2, 3, 4, 5)
    old, _ = _model(op, {"x": x}, {}, 11, [], 1)
    new, _ = _model(op, {"x": x}, {}, 13, [], 1)
    y_old = ember.onnx.load(old.SerializeToString(), device="numpy")(x).numpy()
    y_new = ember.onnx.load(new.SerializeToString(), device="numpy")(x).numpy()
    if op == "Softmax":
        np.testing.assert_allclose(y_old.reshape(2, -1).sum(axis=1), 1.0, rtol=1e-5)
        np.testing.assert_allclose(y_new.sum(axis=-1), 1.0, rtol=1e-5)
    elif op == "Hardmax":
        assert y_old.reshape(2, -1).sum(axis=1).tolist() == [1.0, 1.0]
        assert (y_new.sum(axis=-1) == 1).all()
    assert not np.allclose(y_old, y_new)


def test_light_squeezenet_classifier():
    """The onnx wheel's opset-9 SqueezeNet (its "light" model test, weights made by
    ConstantOfShape): every class gets the same logit, so 1/1000 everywhere; the logits are
    ~1e10, where one float32 ulp is 1024, so the numpy backend's BLAS (whose rounding differs
    per output channel) is checked on the logits, the other backends on the probabilities."""
    import os
    import onnx
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_squeezenet.onnx")
    if not os.path.exists(path):
        pytest.skip("the onnx wheel ships no light models")
    m = onnx.load(path)
    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    pre = m.graph.node[-1].input[0]
    m.graph.output.append(helper.make_empty_tensor_value_info(pre))
    raw = m.SerializeToString()
    probs, logits = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, {"data_0": x})
    np.testing.assert_allclose(probs, 1e-3, rtol=1e-5)
    got_p, got_l = ember.onnx.load(raw, device="numpy")(x)
    np.testing.assert_allclose(got_l.numpy(), logits, rtol=1e-5)
    assert got_p.shape == (1, 1000, 1, 1)
    np.testing.assert_allclose(got_p.numpy().sum(), 1.0, rtol=1e-5)
    # a backend whose conv sums every output channel in the same order: exactly uniform
    got_w = ember.onnx.load(raw, device="wasm" if "wasm" in ember.devices() else "python")
    if got_w.device == "python":
        pytest.skip("the pure-Python backend needs minutes for a 224x224 SqueezeNet")
    np.testing.assert_allclose(got_w(ember.tensor(x, device=got_w.device))[0].numpy(), 1e-3, rtol=1e-5)
