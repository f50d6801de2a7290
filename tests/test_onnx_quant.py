"""Quantized ONNX graphs against onnxruntime: models quantized here with onnxruntime's own
``quantize_dynamic`` / ``quantize_static`` (QDQ and QOperator formats, per tensor and per
channel) from the committed fixtures, single-node cases of every quantization operator, and the
official ``onnx.backend.test`` node cases for them (read straight from the onnx wheel's data
folders).

INT8/INT16/UINT16 values are held as int32 in ember (see ``ember.onnx.quant``): inputs are fed
widened and outputs compared by value.

Models are quantized with ``reduce_range=True`` (7-bit weights): onnxruntime's AVX2 u8s8 kernels
sum pairs of products in saturating int16, so with full-range weights *its* results drift from
the exact arithmetic (``test_full_range_weights_are_exact`` shows ember keeps the exact one).
With onnxruntime's graph optimizations on, a QDQ transformer is rewritten into fused integer
kernels that round differently; those graphs are compared with the optimizations off (the QDQ
semantics the ONNX spec defines).
"""
from __future__ import annotations

import glob
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import ember
import ember.onnx
from ember.errors import OnnxError, UnsupportedOp
from onnx_helpers import node_model

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures", "onnx")
rng = np.random.default_rng(3)
NARROW = (np.int8, np.int16, np.uint16)


def _session(model, optimize=True):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model if isinstance(model, (bytes, str)) else model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _feed(a, device):
    a = np.asarray(a)
    if a.dtype in NARROW:
        return ember.tensor(a.astype(np.int32), dtype=ember.int32, device=device)
    return ember.from_numpy(a, device=device)


def _run(model, feeds, device):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = ember.onnx.load(model if isinstance(model, (bytes, str)) else model.SerializeToString(), device=device)
        out = m.run({k: _feed(v, device) for k, v in feeds.items()})
    return [out[n].numpy() for n in m.output_names]


def _same(got, want, atol=0.0, what=""):
    want = np.asarray(want)
    if want.dtype in NARROW:
        assert got.dtype == np.int32, what
        np.testing.assert_array_equal(got, want.astype(np.int32), err_msg=what)
    elif want.dtype.kind in "iu":
        assert got.dtype == want.dtype, f"{what}: {got.dtype} vs {want.dtype}"
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        assert got.shape == want.shape, what
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-6, atol=atol or 1e-6,
                                   err_msg=what)


# ---- models quantized by onnxruntime.quantization -----------------------------------------

class _Reader:
    def __init__(self, name, shape):
        self.it = iter([{name: np.random.default_rng(i).standard_normal(shape).astype(np.float32)}
                        for i in range(4)])

    def get_next(self):
        return next(self.it, None)


SOURCES = {"mnist_cnn": (2, 1, 28, 28), "encoder_block": (2, 5, 32)}
QUANT = ["dynamic", "qdq", "qdq_per_channel", "qoperator", "qoperator_per_channel"]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    d = tmp_path_factory.mktemp("quantized")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, shape in SOURCES.items():
            src = os.path.join(FIX, f"{name}.onnx")
            inp = onnx.load(src).graph.input[0].name
            for kind in QUANT:
                dst = str(d / f"{name}_{kind}.onnx")
                if kind == "dynamic":
                    quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=True)
                else:
                    fmt = QuantFormat.QDQ if kind.startswith("qdq") else QuantFormat.QOperator
                    quantize_static(src, dst, _Reader(inp, shape), quant_format=fmt,
                                    per_channel=kind.endswith("per_channel"), reduce_range=True,
                                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
                out[(name, kind)] = (dst, inp, shape)
    return out


@pytest.mark.parametrize("kind", QUANT)
@pytest.mark.parametrize("name", list(SOURCES))
def test_quantized_model_matches_onnxruntime(quantized, name, kind, device):
    path, inp, shape = quantized[(name, kind)]
    x = np.random.default_rng(11).standard_normal(shape).astype(np.float32)
    optimize = not (name == "encoder_block" and kind.startswith("qdq"))
    want = _session(path, optimize).run(None, {inp: x})[0]
    got = _run(path, {inp: x}, device)[0]
    # the same integer arithmetic: equal up to the float rounding of the last layers
    _same(got, want, atol=2e-6, what=f"{name} {kind} on {device}")
    ops = {(n.domain, n.op_type) for n in onnx.load(path).graph.node}
    expect = {"dynamic": ("", "DynamicQuantizeLinear"), "qdq": ("", "QuantizeLinear"),
              "qoperator": ("", "QuantizeLinear")}[kind.replace("_per_channel", "")]
    assert expect in ops


def test_quantized_ops_present(quantized):
    """The quantized graphs exercise what they should: integer convs/matmuls and contrib ops."""
    seen = set()
    for path, _, _ in quantized.values():
        seen |= {n.op_type for n in onnx.load(path).graph.node}
    assert {"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "QGemm", "QLinearAdd",
            "QLinearSoftmax", "DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear"} <= seen


# ---- single nodes ---------------------------------------------------------------------------

def _model(op, inputs, attrs=None, opset=21, inits=(), n_out=1, domain=""):
    """``inputs``: name -> array (None: omitted); names in ``inits`` become initializers."""
    m, feeds = node_model(op, inputs, attrs, opset=opset, inits=inits, n_out=n_out, domain=domain)
    return m.SerializeToString(), feeds


def u8(*shape, hi=255):
    return rng.integers(0, hi + 1, shape).astype(np.uint8)


def i8(*shape, lo=-128, hi=127):
    return rng.integers(lo, hi + 1, shape).astype(np.int8)


def f32(*shape, s=1.0):
    return (rng.standard_normal(shape) * s).astype(np.float32)


def sc(v):
    return np.array(v, np.float32)


X = f32(2, 3, 4, s=3.0)
CASES = [
    ("Cast/int64_to_int8", "Cast", {"x": np.array([-300, 300, 5, 127, 128, -129], np.int64)}, {"to": T.INT8}, 13, []),
    ("Cast/float_to_int16", "Cast", {"x": np.array([-3.7, 100.2, 32767.5, -1e4], np.float32)}, {"to": T.INT16}, 13, []),
    ("Cast/int8_to_float", "Cast", {"x": i8(7)}, {"to": T.FLOAT}, 13, []),
    ("Q/uint8", "QuantizeLinear", {"x": X, "s": sc(0.02), "z": np.array(128, np.uint8)}, {}, 13, ["s", "z"]),
    ("Q/int8", "QuantizeLinear", {"x": X, "s": sc(0.03), "z": np.array(-3, np.int8)}, {}, 13, ["s", "z"]),
    ("Q/no_zp", "QuantizeLinear", {"x": X, "s": sc(0.05)}, {}, 13, ["s"]),
    ("Q/axis", "QuantizeLinear", {"x": X, "s": np.array([0.01, 0.02, 0.05], np.float32),
                                  "z": np.array([1, -2, 3], np.int8)}, {"axis": 1}, 13, ["s", "z"]),
    ("Q/axis_last", "QuantizeLinear", {"x": X, "s": np.array([0.01, 0.02, 0.05, 0.1], np.float32),
                                       "z": np.array([0, 10, 20, 255], np.uint8)}, {"axis": -1}, 13, ["s", "z"]),
    ("Q/int16", "QuantizeLinear", {"x": X, "s": sc(0.0001), "z": np.array(7, np.int16)}, {}, 21, ["s", "z"]),
    ("Q/uint16", "QuantizeLinear", {"x": X, "s": sc(0.0001), "z": np.array(30000, np.uint16)}, {}, 21, ["s", "z"]),
    ("Q/v10", "QuantizeLinear", {"x": X, "s": sc(0.02), "z": np.array(100, np.uint8)}, {}, 10, ["s", "z"]),
    ("Q/ties", "QuantizeLinear", {"x": np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300, -300], np.float32),
                                  "s": sc(1.0), "z": np.array(0, np.int8)}, {}, 13, ["s", "z"]),
    ("DQ/uint8", "DequantizeLinear", {"x": u8(2, 3, 4), "s": sc(0.02), "z": np.array(128, np.uint8)}, {}, 13, ["s", "z"]),
    ("DQ/int8_axis", "DequantizeLinear", {"x": i8(2, 3, 4), "s": np.array([0.1, 0.2, 0.3], np.float32),
                                          "z": np.array([0, 5, -5], np.int8)}, {"axis": 1}, 13, ["s", "z"]),
    ("DQ/int32", "DequantizeLinear", {"x": rng.integers(-1000, 1000, (5,)).astype(np.int32), "s": sc(0.001)}, {}, 13, ["s"]),
    ("DQ/int16", "DequantizeLinear", {"x": rng.integers(-30000, 30000, (6,)).astype(np.int16), "s": sc(0.001),
                                      "z": np.array(-12, np.int16)}, {}, 21, ["s", "z"]),
    ("DQ/blocked", "DequantizeLinear", {"x": i8(2, 6), "s": f32(2, 3, s=0.1), "z": i8(2, 3, lo=-3, hi=3)},
     {"axis": 1, "block_size": 2}, 21, ["s", "z"]),
    ("DynQ", "DynamicQuantizeLinear", {"x": f32(3, 7, s=2.0)}, {}, 13, []),
    ("DynQ/positive", "DynamicQuantizeLinear", {"x": np.abs(f32(3, 7)) + 0.5}, {}, 13, []),
    ("DynQ/zeros", "DynamicQuantizeLinear", {"x": np.zeros((2, 3), np.float32)}, {}, 13, []),
    ("MatMulInteger/u8s8", "MatMulInteger", {"a": u8(4, 6), "b": i8(6, 5, lo=-64, hi=63),
                                              "az": np.array(120, np.uint8), "bz": np.array(2, np.int8)}, {}, 13, ["bz"]),
    ("MatMulInteger/u8u8_cols", "MatMulInteger", {"a": u8(2, 4, 6), "b": u8(6, 5), "az": np.array(7, np.uint8),
                                                  "bz": u8(5)}, {}, 13, ["az", "bz"]),
    ("MatMulInteger/no_zp", "MatMulInteger", {"a": u8(3, 6), "b": u8(6, 2)}, {}, 13, []),
    ("ConvInteger", "ConvInteger", {"x": u8(1, 3, 6, 6), "w": u8(4, 3, 3, 3), "xz": np.array(100, np.uint8),
                                    "wz": np.array(3, np.uint8)}, {"pads": [1, 1, 1, 1]}, 13, ["w", "xz", "wz"]),
    ("ConvInteger/strided_group", "ConvInteger", {"x": u8(2, 4, 7, 7), "w": u8(4, 2, 3, 3)},
     {"strides": [2, 2], "group": 2}, 13, ["w"]),
    ("QLinearMatMul/u8", "QLinearMatMul", {"a": u8(3, 8), "as": sc(0.02), "az": np.array(120, np.uint8),
                                           "b": u8(8, 4), "bs": sc(0.01), "bz": np.array(130, np.uint8),
                                           "ys": sc(0.05), "yz": np.array(100, np.uint8)}, {}, 13,
     ["as", "az", "b", "bs", "bz", "ys", "yz"]),
    ("QLinearMatMul/s8_per_col", "QLinearMatMul", {"a": i8(2, 3, 8), "as": sc(0.02), "az": np.array(1, np.int8),
                                                   "b": i8(8, 4, lo=-60, hi=60),
                                                   "bs": np.array([0.01, 0.02, 0.03, 0.04], np.float32),
                                                   "bz": np.zeros(4, np.int8), "ys": sc(0.1),
                                                   "yz": np.array(-5, np.int8)}, {}, 21,
     ["as", "az", "b", "bs", "bz", "ys", "yz"]),
    ("QLinearConv/per_channel", "QLinearConv", {"x": u8(1, 4, 6, 6), "xs": sc(0.02), "xz": np.array(128, np.uint8),
                                                "w": i8(3, 4, 3, 3, lo=-63, hi=63),
                                                "ws": np.array([0.01, 0.02, 0.03], np.float32),
                                                "wz": np.zeros(3, np.int8), "ys": sc(0.3),
                                                "yz": np.array(90, np.uint8),
                                                "b": rng.integers(-300, 300, 3).astype(np.int32)},
     {"pads": [1, 1, 1, 1], "strides": [2, 1]}, 13, ["xs", "xz", "w", "ws", "wz", "ys", "yz", "b"]),
    ("QLinearConv/depthwise_int8", "QLinearConv", {"x": i8(1, 4, 5, 5), "xs": sc(0.05), "xz": np.array(0, np.int8),
                                                   "w": i8(4, 1, 3, 3, lo=-63, hi=63), "ws": sc(0.02),
                                                   "wz": np.array(0, np.int8), "ys": sc(0.2),
                                                   "yz": np.array(3, np.int8)},
     {"group": 4, "pads": [1, 1, 1, 1]}, 13, ["xs", "xz", "w", "ws", "wz", "ys", "yz"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_quant_node(case, device):
    _id, op, inputs, attrs, opset, inits = case
    n_out = 3 if op == "DynamicQuantizeLinear" else 1
    model, feeds = _model(op, inputs, attrs, opset, inits, n_out)
    want = _session(model).run(None, feeds)
    got = _run(model, feeds, device)
    for i, (g, w) in enumerate(zip(got, want)):
        _same(g, w, what=f"{_id} output {i} on {device}")


def test_full_range_weights_are_exact():
    """u8 activations x s8 weights over the full ranges: ember's result is the exact integer
    arithmetic (numpy's int64 reference), where onnxruntime's AVX2 kernel may saturate."""
    a, b = u8(8, 64), i8(64, 6)
    model, feeds = _model("MatMulInteger", {"a": a, "b": b}, {}, 13, ["b"])
    got = _run(model, feeds, "numpy")[0]
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))


def test_matmul_integer_per_row_zero_point():
    """a_zero_point per row of a (the spec allows it; onnxruntime does not): numpy reference."""
    a, b, az, bz = u8(4, 6), i8(6, 3), u8(4), i8(3)
    model, feeds = _model("MatMulInteger", {"a": a, "b": b, "az": az, "bz": bz}, {}, 13, ["az", "bz"])
    for device in ("numpy", "python"):
        got = _run(model, feeds, device)[0]
        want = (a.astype(np.int64) - az[:, None]) @ (b.astype(np.int64) - bz[None, :])
        np.testing.assert_array_equal(got, want)


def test_quant_errors():
    model, _ = _model("QuantizeLinear", {"x": X, "s": f32(5), "z": np.zeros(5, np.uint8)}, {"axis": 1}, 13, ["s", "z"])
    with pytest.raises(OnnxError, match="'QuantizeLinear_node'.*5 entries.*axis 1 has size 3 \\(input \\(2, 3, 4\\)\\)"):
        ember.onnx.load(model, device="numpy")
    raw, _ = _model("QuantizeLinear", {"x": X, "s": sc(1.0), "z": np.array(0, np.uint8)}, {}, 13, ["s", "z"])
    m = onnx.load_from_string(raw)
    m.graph.initializer[1].data_type = T.FLOAT8E4M3FN
    with pytest.raises(UnsupportedOp, match="FLOAT8E4M3FN"):
        ember.onnx.load(m.SerializeToString(), device="numpy")


def test_narrow_graph_io_is_noted():
    model, feeds = _model("QuantizeLinear", {"x": X, "s": sc(0.03), "z": np.array(-3, np.int8)}, {}, 13, ["s", "z"])
    m = onnx.load_from_string(model)
    m.graph.output[0].CopyFrom(helper.make_tensor_value_info("y0", T.INT8, None))
    with pytest.warns(UserWarning, match="INT8 held as int32"):
        loaded = ember.onnx.load(m.SerializeToString(), device="numpy")
    assert loaded(feeds["x"]).dtype is ember.int32


# ---- the official onnx.backend.test node cases ---------------------------------------------

_MODULES = ("quantizelinear", "dequantizelinear", "dynamicquantizelinear", "matmulinteger", "convinteger",
            "qlinearmatmul", "qlinearconv")


def _backend_cases():
    """The cases of just these ops: importing an op's case module runs its exports, which
    append to the package's case list (collect_testcases() would build all 1800+)."""
    import contextlib
    import importlib
    import io
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        pkg = importlib.import_module("onnx.backend.test.case.node")
        for m in _MODULES:
            importlib.import_module(f"onnx.backend.test.case.node.{m}")
    ops = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
           "QLinearMatMul", "QLinearConv"}
    return [c for c in pkg._NodeTestCases if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in ops]


# element types ember does not read (float8, 4-bit, 2-bit): the loader says so
_UNREAD = ("e4m3", "e5m2", "int4", "uint4", "int2", "uint2", "float4")


@pytest.mark.parametrize("case", _backend_cases(), ids=lambda c: c.name)
def test_backend_case(case, device):
    model = case.model
    if any(t in case.name for t in _UNREAD):
        with pytest.raises(UnsupportedOp):
            ember.onnx.load(model.SerializeToString(), device=device)
        return
    init = {t.name for t in model.graph.initializer}
    names = [vi.name for vi in model.graph.input if vi.name not in init]
    for inputs, outputs in case.data_sets:
        conv = [numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else np.asarray(a) for a in inputs]
        got = _run(model, dict(zip(names, conv)), device)
        for g, w in zip(got, outputs):
            w = numpy_helper.to_array(w) if isinstance(w, onnx.TensorProto) else np.asarray(w)
            if w.dtype == np.float16:
                np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=1e-3, atol=1e-3)
            else:
                _same(g, w, what=case.name)


# ---- onnxruntime's QOperator contrib ops, single nodes ----------------------------------------

MS = "com.microsoft"
_QA = {"a": u8(2, 3, 4, 4), "as": sc(0.05), "az": np.array(120, np.uint8)}
_QB = {"b": u8(2, 3, 4, 4), "bs": sc(0.03), "bz": np.array(100, np.uint8)}
_QY = {"ys": sc(0.04), "yz": np.array(128, np.uint8)}
QOP_CASES = [
    ("QuantizeLinear", {"x": X, "s": sc(0.02), "z": np.array(3, np.int8)}, {}, ["s", "z"]),
    ("DequantizeLinear", {"x": u8(3, 4), "s": sc(0.02), "z": np.array(128, np.uint8)}, {}, ["s", "z"]),
    ("QLinearAdd", {**_QA, **_QB, **_QY}, {}, ["as", "az", "bs", "bz", "ys", "yz"]),
    ("QLinearMul", {**_QA, **_QB, **_QY}, {}, ["as", "az", "bs", "bz", "ys", "yz"]),
    ("QLinearSigmoid", {"x": u8(2, 5), "xs": sc(0.05), "xz": np.array(128, np.uint8), "ys": sc(1 / 256),
                        "yz": np.array(0, np.uint8)}, {}, ["xs", "xz", "ys", "yz"]),
    ("QLinearLeakyRelu", {"x": u8(2, 5), "xs": sc(0.05), "xz": np.array(128, np.uint8), "ys": sc(0.03),
                          "yz": np.array(40, np.uint8)}, {"alpha": 0.1}, ["xs", "xz", "ys", "yz"]),
    ("QLinearGlobalAveragePool", {"x": u8(2, 3, 5, 5), "xs": sc(0.05), "xz": np.array(128, np.uint8), "ys": sc(0.02),
                                  "yz": np.array(128, np.uint8)}, {}, ["xs", "xz", "ys", "yz"]),
    ("QLinearConcat", {"ys": sc(0.05), "yz": np.array(128, np.uint8), "x0": u8(2, 3), "s0": sc(0.04),
                       "z0": np.array(120, np.uint8), "x1": u8(2, 2), "s1": sc(0.06), "z1": np.array(130, np.uint8)},
     {"axis": 1}, ["ys", "yz", "s0", "z0", "s1", "z1"]),
    ("QLinearSoftmax", {"x": u8(2, 6), "xs": sc(0.1), "xz": np.array(128, np.uint8), "ys": sc(1 / 256),
                        "yz": np.array(0, np.uint8)}, {"axis": -1, "opset": 13}, ["xs", "xz", "ys", "yz"]),
    ("QGemm", {"a": u8(3, 8), "as": sc(0.02), "az": np.array(120, np.uint8), "b": i8(5, 8, lo=-60, hi=60),
               "bs": sc(0.01), "bz": np.array(0, np.int8), "c": rng.integers(-500, 500, 5).astype(np.int32),
               "ys": sc(0.05), "yz": np.array(128, np.uint8)}, {"transB": 1},
     ["as", "az", "b", "bs", "bz", "c", "ys", "yz"]),
    ("QGemm", {"a": u8(3, 8), "as": sc(0.02), "az": np.array(120, np.uint8), "b": i8(8, 5, lo=-60, hi=60),
               "bs": np.linspace(0.01, 0.05, 5).astype(np.float32), "bz": np.zeros(5, np.int8)}, {"alpha": 0.5},
     ["as", "az", "b", "bs", "bz"]),
]
QOPERATOR_OPS = {f"{MS}:{c[0]}" for c in QOP_CASES}


@pytest.mark.parametrize("case", QOP_CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(QOP_CASES)])
def test_qoperator_node(case, device):
    op, inputs, attrs, inits = case
    model, feeds = _model(op, inputs, attrs, 13, inits, domain=MS)
    want = _session(model).run(None, feeds)
    got = _run(model, feeds, device)
    for g, w in zip(got, want):
        if w.dtype.kind == "f":
            _same(g, w, atol=1e-5, what=f"{op} on {device}")
        else:
            # onnxruntime computes some of these through lookup tables or fixed-point
            # multipliers: one step of the output scale at most
            assert g.dtype == (np.int32 if w.dtype in NARROW else w.dtype)
            assert np.abs(g.astype(np.int64) - w.astype(np.int64)).max() <= 1, f"{op} on {device}"


@pytest.mark.parametrize("key", [("mnist_cnn", "qoperator_per_channel"), ("mnist_cnn", "dynamic"),
                                 ("encoder_block", "qdq")])
def test_quantized_model_through_generated_code(quantized, key):
    """``ember import`` of a quantized model: the generated module gives onnxruntime's result."""
    from onnx_helpers import run_generated
    path, inp, shape = quantized[key]
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    want = _session(path, optimize=key[0] != "encoder_block").run(None, {inp: x})[0]
    with open(path, "rb") as f:
        got = run_generated(f.read(), {inp: x}, "numpy")[0].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2e-6)
