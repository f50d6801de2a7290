"""A minimal ONNX *writer* in pure Python, for tests and examples that must run without the
``onnx`` package (Pyodide): enough of the protobuf encoding to build small models.

>>> from ember.onnx.testing import make_model, node, value_info, tensor_proto
>>> m = make_model([node("Relu", ["x"], ["y"])], [value_info("x", 1, (2,))], [value_info("y", 1, (2,))])
>>> import ember.onnx
>>> ember.onnx.load(m)(ember.tensor([-1.0, 2.0])).tolist()
[0.0, 2.0]
"""
from __future__ import annotations

import struct
from array import array

FLOAT, INT64, BOOL = 1, 7, 9


def _varint(v: int) -> bytes:
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int, wt: int) -> bytes:
    return _varint(field << 3 | wt)


def _len(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _int(field: int, v: int) -> bytes:
    return _key(field, 0) + _varint(v)


def _str(field: int, s: str) -> bytes:
    return _len(field, s.encode())


def tensor_proto(name: str, dims, data_type: int = FLOAT, values=None, raw: bytes | None = None,
                 external: dict | None = None) -> bytes:
    """A TensorProto: ``values`` go to the typed field (float_data / int64_data / int32_data),
    ``raw`` to raw_data; ``external`` ({'location':..., 'offset':..., 'length':...}) makes it
    external."""
    out = b"".join(_int(1, d) for d in dims) + _int(2, data_type) + _str(8, name)
    if raw is not None:
        out += _len(9, raw)
    elif values is not None:
        if data_type == FLOAT:
            out += _len(4, array("f", values).tobytes())
        elif data_type == INT64:
            out += _len(7, b"".join(_varint(int(v)) for v in values))
        else:
            out += _len(5, b"".join(_varint(int(v)) for v in values))
    if external:
        for k, v in external.items():
            out += _len(13, _str(1, k) + _str(2, str(v)))
        out += _int(14, 1)
    return out


def attribute(name: str, value) -> bytes:
    """An AttributeProto for an int, float, str, bytes (a TensorProto), or list of ints/floats."""
    out = _str(1, name)
    if isinstance(value, bool) or isinstance(value, int):
        return out + _key(3, 0) + _varint(int(value)) + _int(20, 2)
    if isinstance(value, float):
        return out + _key(2, 5) + struct.pack("<f", value) + _int(20, 1)
    if isinstance(value, str):
        return out + _str(4, value) + _int(20, 3)
    if isinstance(value, bytes):
        return out + _len(5, value) + _int(20, 4)
    if all(isinstance(v, int) for v in value):
        return out + _len(8, b"".join(_varint(v) for v in value)) + _int(20, 7)
    return out + _len(7, array("f", value).tobytes()) + _int(20, 6)


def node(op_type: str, inputs, outputs, name: str = "", **attrs) -> bytes:
    out = b"".join(_str(1, i) for i in inputs) + b"".join(_str(2, o) for o in outputs)
    if name:
        out += _str(3, name)
    out += _str(4, op_type)
    for k, v in attrs.items():
        out += _len(5, attribute(k, v))
    return out


def value_info(name: str, elem_type: int, shape) -> bytes:
    dims = b""
    for d in shape:
        dims += _len(1, _int(1, d) if isinstance(d, int) else _str(2, d))
    tensor_type = _int(1, elem_type) + _len(2, dims)
    return _str(1, name) + _len(2, _len(1, tensor_type))


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17, name: str = "g") -> bytes:
    g = b"".join(_len(1, n) for n in nodes) + _str(2, name)
    g += b"".join(_len(5, t) for t in initializers)
    g += b"".join(_len(11, i) for i in inputs) + b"".join(_len(12, o) for o in outputs)
    return _int(1, 8) + _len(8, _int(2, opset)) + _len(7, g)


def tiny_model() -> bytes:
    """``y = relu(x + 1)`` for a float32 input ``x`` of shape (N, 2)."""
    return make_model(
        [node("Add", ["x", "one"], ["t"]), node("Relu", ["t"], ["y"])],
        [value_info("x", FLOAT, ("N", 2))], [value_info("y", FLOAT, ("N", 2))],
        [tensor_proto("one", [], FLOAT, [1.0])])
