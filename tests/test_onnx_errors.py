"""Bad ONNX input fails at load time with a typed error that says what and where: unsupported
operators / attributes / dtypes (UnsupportedOp naming op, opset, node), malformed protobuf
(OnnxError naming the byte offset and field), malformed graphs; fuzzed files never raise
anything else, never hang. Also: ``ember.onnx`` runs with numpy hidden (as in Pyodide)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ember
import ember.onnx
from ember.errors import OnnxError, UnsupportedOp
from ember.onnx.proto import parse_model
from ember.onnx.testing import make_model, node, tensor_proto, value_info

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "onnx")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model(nodes, inputs, outputs, inits=(), opset=17, domain_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domain_opsets]
    return helper.make_model(g, opset_imports=ops).SerializeToString()


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)


# ---- unsupported ----------------------------------------------------------------------------

def test_unsupported_op_names_op_opset_node():
    raw = _model([helper.make_node("Relu", ["x"], ["t"], name="first"),
                  helper.make_node("BlackmanWindow", ["t"], ["y"], name="my_window")], [X], [Y], opset=19)
    with pytest.raises(UnsupportedOp) as e:
        ember.onnx.load(raw)
    msg = str(e.value)
    assert "BlackmanWindow" in msg and "opset 19" in msg and "'my_window'" in msg


def test_unsupported_op_without_a_name_gives_its_position():
    raw = _model([helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Det", ["t"], ["y"])], [X], [Y])
    with pytest.raises(UnsupportedOp, match=r"#1 \(Det\).*Det \(opset 17\)"):
        ember.onnx.load(raw)


def test_unsupported_domain():
    raw = _model([helper.make_node("FusedGemm", ["x", "x"], ["y"], domain="com.microsoft", name="fg")], [X], [Y],
                 domain_opsets=[("com.microsoft", 1)])
    with pytest.raises(UnsupportedOp, match="'com.microsoft'.*'fg'|'fg'.*'com.microsoft'"):
        ember.onnx.load(raw)


def test_unsupported_attribute_value():
    raw = _model([helper.make_node("Pad", ["x", "p"], ["y"], mode="mirror", name="padder")], [X], [Y],
                 [numpy_helper.from_array(np.array([0, 1, 0, 1]), "p")])
    with pytest.raises(UnsupportedOp, match="'padder'.*mode='mirror'"):
        ember.onnx.load(raw)


def test_unknown_attribute_is_not_ignored():
    raw = _model([helper.make_node("Relu", ["x"], ["y"], name="r", frobnicate=3)], [X], [Y])
    with pytest.raises(UnsupportedOp, match="'r'.*frobnicate"):
        ember.onnx.load(raw)


def test_unsupported_dtypes():
    x32 = helper.make_tensor_value_info("x", TensorProto.UINT32, [2])
    with pytest.raises(UnsupportedOp, match="'x'.*UINT32"):
        ember.onnx.load(_model([helper.make_node("Neg", ["x"], ["y"])], [x32], [Y]))
    with pytest.raises(UnsupportedOp, match="'caster'.*UINT64"):
        ember.onnx.load(_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.UINT64, name="caster")],
                               [X], [Y]))
    s = helper.make_tensor("s", TensorProto.STRING, [1], [b"hi"])
    with pytest.raises(UnsupportedOp, match="'s'.*STRING"):
        ember.onnx.load(_model([helper.make_node("Identity", ["s"], ["y"])], [], [Y], [s]))


def test_double_and_bfloat16_are_read_as_float32():
    d = numpy_helper.from_array(np.array([1.5, 2.25]), "d")           # DOUBLE
    b = helper.make_tensor("b", TensorProto.BFLOAT16, [2], [1.0, -3.0])
    raw = _model([helper.make_node("Add", ["d", "b"], ["y"])], [], [Y], [d, b])
    with pytest.warns(UserWarning, match="DOUBLE read as float32"):
        m = ember.onnx.load(raw)
    assert any("DOUBLE" in n for n in m.notes)
    y = m()
    assert y.dtype == ember.float32 and y.tolist() == [2.5, -0.75]


def test_typed_initializer_fields():
    inits = [helper.make_tensor("f", TensorProto.FLOAT, [2], [1.5, -2.0]),
             helper.make_tensor("i", TensorProto.INT64, [2], [-(2 ** 40), 7]),
             helper.make_tensor("i32", TensorProto.INT32, [2], [-5, 9]),
             helper.make_tensor("u8", TensorProto.UINT8, [2], [0, 255]),
             helper.make_tensor("bo", TensorProto.BOOL, [2], [True, False]),
             helper.make_tensor("h", TensorProto.FLOAT16, [2], [0.5, -8.0])]     # int32_data: bit patterns
    assert not inits[-1].raw_data and list(inits[-1].int32_data) == [0x3800, 0xC800]
    outs = [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in ("f", "i", "i32", "u8", "bo", "h")]
    g = helper.make_graph([], "g", [], [helper.make_empty_tensor_value_info(o.name) for o in outs], inits)
    raw = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    got = ember.onnx.load(raw).run({})
    assert got["f"].tolist() == [1.5, -2.0] and got["i"].tolist() == [-(2 ** 40), 7]
    assert got["i32"].tolist() == [-5, 9] and got["i32"].dtype == ember.int32
    assert got["u8"].tolist() == [0, 255] and got["bo"].tolist() == [True, False]
    assert got["h"].dtype == ember.float16 and got["h"].tolist() == [0.5, -8.0]


# ---- malformed files ------------------------------------------------------------------------

@pytest.mark.parametrize("raw, match", [
    (b"\x08", r"truncated varint at byte 1"),                           # ir_version with no value
    (b"\x08\xff\xff", r"truncated varint at byte 1"),
    (b"\x0b", r"bad wire type 3 for field 1 at byte 0"),
    (b"\x3a\x10abc", r"length 16 of field 7 runs past the end"),
    (b"\x3a\x03\x0a\x05x", r"length 5 of field 1 runs past the end.*ModelProto.graph"),
    (b"\x08" + b"\xff" * 11, r"varint longer than 10 bytes"),
    (b"\x00\x01", r"field number 0"),
    (b"", r"no graph"),
    (b"\x3a\x04\x12\x02\xff\xfe", r"not valid UTF-8.*ModelProto.graph"),
])
def test_malformed_protobuf(raw, match):
    with pytest.raises(OnnxError, match=match):
        ember.onnx.load(raw)


def test_nested_graph_depth_is_bounded():
    inner = b""
    for _ in range(40):                       # attribute g (field 6) of a node of a graph...
        attr = b"\x0a\x01g" + b"\x32" + _len(inner) + inner
        nd = b"\x2a" + _len(attr) + attr
        inner = b"\x0a" + _len(nd) + nd
    raw = b"\x3a" + _len(inner) + inner
    with pytest.raises(OnnxError, match="nested deeper"):
        parse_model(raw)


def _len(b):
    from ember.onnx.testing import _varint
    return _varint(len(b))


def test_malformed_graphs():
    with pytest.raises(OnnxError, match="'nope' is not produced"):
        ember.onnx.load(make_model([node("Relu", ["nope"], ["y"])], [value_info("x", 1, (2,))],
                                   [value_info("y", 1, (2,))]))
    with pytest.raises(OnnxError, match="output 'z' is not produced"):
        ember.onnx.load(make_model([node("Relu", ["x"], ["y"])], [value_info("x", 1, (2,))],
                                   [value_info("z", 1, (2,))]))
    bad = tensor_proto("w", [3], 1, values=[1.0, 2.0])
    with pytest.raises(OnnxError, match="2 values for shape \\(3,\\)"):
        ember.onnx.load(make_model([node("Add", ["x", "w"], ["y"])], [value_info("x", 1, (3,))],
                                   [value_info("y", 1, (3,))], [bad]))
    with pytest.raises(OnnxError, match="ShapeError.*do not broadcast"):
        ember.onnx.load(make_model([node("Add", ["x", "w"], ["y"], name="adder")], [value_info("x", 1, (2,))],
                                   [value_info("y", 1, (2,))], [tensor_proto("w", [3], 1, values=[1, 2, 3])]))


def test_missing_required_attribute():
    with pytest.raises(OnnxError, match="'cat'.*required attribute 'axis'"):
        ember.onnx.load(make_model([node("Concat", ["x", "x"], ["y"], name="cat")], [value_info("x", 1, (2,))],
                                   [value_info("y", 1, (4,))]))


def test_huge_constant_is_not_folded_at_load():
    """A ConstantOfShape asking for 2**40 elements loads (in no time) and is left for run time."""
    shape = tensor_proto("s", [2], 7, values=[1 << 20, 1 << 20])
    m = ember.onnx.load(make_model([node("ConstantOfShape", ["s"], ["y"])], [], [value_info("y", 1, ("a", "b"))],
                                   [shape]))
    assert [n.op_type for n in m._plan] == ["ConstantOfShape"]


# ---- fuzzing: truncations and byte flips raise OnnxError/UnsupportedOp only ---------------------

with open(os.path.join(FIX, "encoder_block.onnx"), "rb") as _f:
    MODEL = _f.read()


def _load_or_typed_error(raw):
    try:
        ember.onnx.load(raw, device="python")
    except (OnnxError, UnsupportedOp):
        pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(MODEL) - 1))
def test_fuzz_truncated(n):
    _load_or_typed_error(MODEL[:n])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(MODEL) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_fuzz_byte_flips(flips):
    raw = bytearray(MODEL)
    for pos, val in flips:
        raw[pos] = val
    _load_or_typed_error(bytes(raw))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=64))
def test_fuzz_random_bytes(raw):
    try:
        parse_model(raw)
    except OnnxError:
        pass


# ---- Pyodide: no numpy ----------------------------------------------------------------------

def test_loads_and_runs_with_numpy_hidden(tmp_path):
    """ember.onnx needs neither numpy nor the onnx package: hide both and run a model on the
    pure-Python backend, as in bare Pyodide; compare with onnxruntime's output computed here."""
    x = np.random.default_rng(3).standard_normal((1, 4, 32)).astype(np.float32)
    with open(os.path.join(FIX, "encoder_block.onnx"), "rb") as f:
        from onnx_helpers import reference
        want = reference(f.read(), {"tokens": x})[0]
    script = f"""
import sys, json
sys.modules['numpy'] = None
sys.modules['onnx'] = None
import ember, ember.onnx
from ember.onnx import testing
m = ember.onnx.load({os.path.join(FIX, 'encoder_block.onnx')!r})
y = m(ember.tensor({x.tolist()!r}))
from ember.onnx.codegen import generate
r = generate({os.path.join(FIX, 'mnist_cnn.onnx')!r}, {str(tmp_path)!r}, progress=False)
assert 'numpy' not in sys.modules or sys.modules['numpy'] is None
print(json.dumps(y.tolist()))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = np.array(json.loads(out.stdout.strip().splitlines()[-1]), dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert (tmp_path / "mnist_cnn.py").exists()
