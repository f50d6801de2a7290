"""A small, pure-Python reader of the ONNX protobuf wire format.

The ``onnx`` package does not exist in Pyodide, so ember reads ``.onnx`` files itself. Only the
messages a model needs are decoded (ModelProto, GraphProto, NodeProto, AttributeProto,
TensorProto, ValueInfoProto and the types inside); unknown fields are skipped, as protobuf
requires. Large tensor payloads (``raw_data``) are kept as zero-copy slices of the input buffer.

Every malformed input raises ``ember.errors.OnnxError`` naming the byte offset and the field
path (``ModelProto.graph.node[3].attribute[0]``): a truncated varint, a bad wire type, a length
past the end of its message, nesting deeper than ``MAX_DEPTH``, invalid UTF-8.

>>> from ember.onnx.proto import parse_model
>>> m = parse_model(b"\\x08\\x07\\x3a\\x03\\x12\\x01g")   # ir_version 7, graph named "g"
>>> m.ir_version, m.graph.name
(7, 'g')
"""
from __future__ import annotations

import os
import struct
from array import array
from math import prod

from .. import dtypes as _dt
from ..errors import OnnxError, UnsupportedOp

MAX_DEPTH = 32  # graphs nested in attributes (If/Loop bodies); deeper is refused, not recursed

# TensorProto.DataType
FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64, STRING, BOOL, FLOAT16, DOUBLE = range(1, 12)
UINT32, UINT64, COMPLEX64, COMPLEX128, BFLOAT16 = range(12, 17)
DTYPE_NAMES = {0: "UNDEFINED", 1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32",
               7: "INT64", 8: "STRING", 9: "BOOL", 10: "FLOAT16", 11: "DOUBLE", 12: "UINT32",
               13: "UINT64", 14: "COMPLEX64", 15: "COMPLEX128", 16: "BFLOAT16", 17: "FLOAT8E4M3FN",
               18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2", 20: "FLOAT8E5M2FNUZ", 21: "UINT4", 22: "INT4",
               23: "FLOAT4E2M1", 24: "FLOAT8E8M0", 25: "UINT2", 26: "INT2"}
# ONNX element type -> ember dtype. DOUBLE and BFLOAT16 have no ember dtype of their own and are
# read as float32 (DOUBLE loses precision: ``Model.notes`` says so). INT8, INT16 and UINT16 are
# widened to int32 (every value fits): the quantization operators know the narrow range from
# the zero point's declared type (``ember.onnx.quant``); a graph output of such a type comes
# back as int32.
EMBER_DTYPES = {FLOAT: _dt.float32, FLOAT16: _dt.float16, INT32: _dt.int32, INT64: _dt.int64,
                UINT8: _dt.uint8, BOOL: _dt.bool_, DOUBLE: _dt.float32, BFLOAT16: _dt.float32,
                INT8: _dt.int32, INT16: _dt.int32, UINT16: _dt.int32}
WIDENED = {INT8: "b", INT16: "h", UINT16: "H"}     # narrow int type -> its array typecode
ONNX_DTYPES = {_dt.float32: FLOAT, _dt.float16: FLOAT16, _dt.int32: INT32, _dt.int64: INT64,
               _dt.uint8: UINT8, _dt.bool_: BOOL}
_ITEMSIZE = {FLOAT: 4, UINT8: 1, INT8: 1, UINT16: 2, INT16: 2, INT32: 4, INT64: 8, BOOL: 1,
             FLOAT16: 2, DOUBLE: 8, UINT32: 4, UINT64: 8, BFLOAT16: 2}

# AttributeProto.AttributeType
A_FLOAT, A_INT, A_STRING, A_TENSOR, A_GRAPH, A_FLOATS, A_INTS, A_STRINGS, A_TENSORS, A_GRAPHS = range(1, 11)


def ember_dtype(code: int, what: str):
    """The ember dtype an ONNX element type is read as; UnsupportedOp naming ``what`` if none."""
    d = EMBER_DTYPES.get(code)
    if d is None:
        raise UnsupportedOp(f"{what}: ONNX element type {DTYPE_NAMES.get(code, code)} is not supported "
                            f"(ember reads FLOAT, FLOAT16, BFLOAT16, DOUBLE, INT32, INT64, UINT8, INT8, INT16, UINT16, "
                            f"BOOL)")
    return d


# ---- the messages ----------------------------------------------------------------------------

class TensorProto:
    """A tensor as stored in the file: ``dims``, ``data_type`` and one of the payload fields."""

    __slots__ = ("name", "dims", "data_type", "raw_data", "float_data", "int32_data", "int64_data",
                 "double_data", "uint64_data", "string_data", "external_data", "data_location",
                 "has_segment", "where")

    def __init__(self, where=""):
        self.name = ""
        self.dims = []
        self.data_type = 0
        self.raw_data = None
        self.float_data = None
        self.int32_data = None
        self.int64_data = None
        self.double_data = None
        self.uint64_data = None
        self.string_data = None
        self.external_data = {}
        self.data_location = 0
        self.has_segment = False
        self.where = where

    @property
    def shape(self) -> tuple:
        return tuple(self.dims)

    def __repr__(self):
        return f"<TensorProto {self.name!r} {DTYPE_NAMES.get(self.data_type, self.data_type)} {tuple(self.dims)}>"


class Attribute:
    """One node attribute: ``name``, ``type`` (AttributeProto.AttributeType) and ``value``
    (float, int, str, TensorProto, Graph or a list of them)."""

    __slots__ = ("name", "type", "value", "ref_attr_name")

    def __init__(self, name, type_, value, ref=""):
        self.name = name
        self.type = type_
        self.value = value
        self.ref_attr_name = ref

    def __repr__(self):
        return f"<Attribute {self.name}={self.value!r}>"


class Node:
    """One graph node. ``inputs``/``outputs`` are value names ('' marks an omitted optional
    input); ``attrs`` maps attribute names to ``Attribute``."""

    __slots__ = ("op_type", "domain", "name", "inputs", "outputs", "attrs", "index")

    def __init__(self):
        self.op_type = ""
        self.domain = ""
        self.name = ""
        self.inputs = []
        self.outputs = []
        self.attrs = {}
        self.index = 0

    @property
    def label(self) -> str:
        """How errors name the node: its name, or its op type and position when it has none."""
        return repr(self.name) if self.name else f"#{self.index} ({self.op_type})"

    def __repr__(self):
        return f"<Node {self.op_type} {self.name!r} {self.inputs} -> {self.outputs}>"


class ValueInfo:
    """A graph input/output/value_info: ``elem_type`` (ONNX code, 0 if unknown) and ``shape``
    (a tuple of ints and dim-parameter names/None, or None when the rank is unknown)."""

    __slots__ = ("name", "elem_type", "shape", "kind")

    def __init__(self, name="", elem_type=0, shape=None, kind="tensor"):
        self.name = name
        self.elem_type = elem_type
        self.shape = shape
        self.kind = kind

    def __repr__(self):
        return f"<ValueInfo {self.name!r} {DTYPE_NAMES.get(self.elem_type)} {self.shape}>"


class Graph:
    __slots__ = ("name", "nodes", "initializers", "inputs", "outputs", "value_info", "sparse_initializers")

    def __init__(self):
        self.name = ""
        self.nodes = []
        self.initializers = []
        self.inputs = []
        self.outputs = []
        self.value_info = []
        self.sparse_initializers = 0


class Function:
    """A model-local function (FunctionProto): called by nodes whose (domain, op_type) match."""

    __slots__ = ("name", "domain", "inputs", "outputs", "attributes", "attribute_defaults", "nodes",
                 "opset_import")

    def __init__(self):
        self.name = ""
        self.domain = ""
        self.inputs = []
        self.outputs = []
        self.attributes = []
        self.attribute_defaults = {}
        self.nodes = []
        self.opset_import = {}


class Model:
    __slots__ = ("ir_version", "opset_import", "producer_name", "producer_version", "graph",
                 "functions", "size")

    def __init__(self):
        self.ir_version = 0
        self.opset_import = {}
        self.producer_name = ""
        self.producer_version = ""
        self.graph = None
        self.functions = []
        self.size = 0


# ---- wire format -----------------------------------------------------------------------------

def _fail(msg, pos, where):
    raise OnnxError(f"malformed ONNX file: {msg} at byte {pos} (in {where or 'ModelProto'}); "
                    f"the file is truncated or not an ONNX model")


def _varint(buf, pos, end, where):
    result = 0
    shift = 0
    start = pos
    while True:
        if pos >= end:
            _fail("truncated varint", start, where)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            _fail("varint longer than 10 bytes", start, where)


def _fields(buf, pos, end, where):
    """Yield ``(field, wire_type, value, offset)``; value is an int (varint), a ``(start, stop)``
    span (length-delimited) or the raw 4/8 bytes (fixed32/fixed64)."""
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos, end, where)
        field, wt = key >> 3, key & 7
        if field == 0:
            _fail("field number 0", start, where)
        if wt == 0:
            val, pos = _varint(buf, pos, end, where)
        elif wt == 2:
            n, pos = _varint(buf, pos, end, where)
            if n > end - pos:
                _fail(f"length {n} of field {field} runs past the end of its message (ends at byte {end})",
                      start, where)
            val = (pos, pos + n)
            pos += n
        elif wt == 5:
            if pos + 4 > end:
                _fail(f"truncated fixed32 field {field}", start, where)
            val = buf[pos:pos + 4]
            pos += 4
        elif wt == 1:
            if pos + 8 > end:
                _fail(f"truncated fixed64 field {field}", start, where)
            val = buf[pos:pos + 8]
            pos += 8
        else:
            _fail(f"bad wire type {wt} for field {field}", start, where)
        yield field, wt, val, start


def _expect(wt, want, field, name, start, where):
    if wt != want:
        _fail(f"field {name} ({field}) has wire type {wt}, expected {want}", start, where)


def _int64(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def _str(buf, span, start, where, name):
    try:
        return bytes(buf[span[0]:span[1]]).decode("utf-8")
    except UnicodeDecodeError:
        _fail(f"field {name} is not valid UTF-8", start, where)


def _packed_varints(buf, wt, val, start, where, signed=True):
    """A repeated varint field: packed (one span) or one element."""
    if wt == 0:
        return [_int64(val) if signed else val]
    if wt != 2:
        _fail(f"repeated integer field has wire type {wt}", start, where)
    pos, end = val
    chunk = buf[pos:end]
    if not chunk or max(chunk) < 0x80:      # every value one byte (0..127): decoded in C
        return list(chunk)
    out = []
    append = out.append
    while pos < end:
        b = buf[pos]
        if b < 0x80:                         # the common one-byte case without a call
            append(b)
            pos += 1
            continue
        v, pos = _varint(buf, pos, end, where)
        append(_int64(v) if signed else v)
    return out


def _packed_fixed(buf, wt, val, start, where, code, size):
    """A repeated fixed-width field (float: 'f' / 4, double: 'd' / 8)."""
    a = array(code)
    if wt == 2:
        s, e = val
        if (e - s) % size:
            _fail(f"packed field length {e - s} is not a multiple of {size}", start, where)
        a.frombytes(bytes(buf[s:e]))
    elif (wt == 5 and size == 4) or (wt == 1 and size == 8):
        a.frombytes(bytes(val))
    else:
        _fail(f"repeated {'float' if size == 4 else 'double'} field has wire type {wt}", start, where)
    if struct.pack("=H", 1) != struct.pack("<H", 1):  # big-endian host: protobuf is little-endian
        a.byteswap()
    return a


def _string_map(buf, span, start, where):
    key = value = ""
    for f, wt, v, st in _fields(buf, span[0], span[1], where):
        if f in (1, 2):
            _expect(wt, 2, f, "key/value", st, where)
            s = _str(buf, v, st, where, "key/value")
            if f == 1:
                key = s
            else:
                value = s
    return key, value


# ---- message decoders ------------------------------------------------------------------------

def _tensor(buf, span, where) -> TensorProto:
    t = TensorProto(where)
    for f, wt, v, st in _fields(buf, span[0], span[1], where):
        if f == 1:
            t.dims.extend(_packed_varints(buf, wt, v, st, where + ".dims"))
        elif f == 2:
            _expect(wt, 0, f, "data_type", st, where)
            t.data_type = _int64(v)
        elif f == 3:
            t.has_segment = True
        elif f == 4:
            if t.float_data is None:
                t.float_data = array("f")
            t.float_data.extend(_packed_fixed(buf, wt, v, st, where + ".float_data", "f", 4))
        elif f == 5:
            if t.int32_data is None:
                t.int32_data = []
            t.int32_data.extend(_packed_varints(buf, wt, v, st, where + ".int32_data"))
        elif f == 6:
            _expect(wt, 2, f, "string_data", st, where)
            if t.string_data is None:
                t.string_data = []
            t.string_data.append(bytes(buf[v[0]:v[1]]))
        elif f == 7:
            if t.int64_data is None:
                t.int64_data = []
            t.int64_data.extend(_packed_varints(buf, wt, v, st, where + ".int64_data"))
        elif f == 8:
            _expect(wt, 2, f, "name", st, where)
            t.name = _str(buf, v, st, where, "name")
        elif f == 9:
            _expect(wt, 2, f, "raw_data", st, where)
            t.raw_data = memoryview(buf)[v[0]:v[1]]
        elif f == 10:
            if t.double_data is None:
                t.double_data = array("d")
            t.double_data.extend(_packed_fixed(buf, wt, v, st, where + ".double_data", "d", 8))
        elif f == 11:
            if t.uint64_data is None:
                t.uint64_data = []
            t.uint64_data.extend(_packed_varints(buf, wt, v, st, where + ".uint64_data", signed=False))
        elif f == 13:
            _expect(wt, 2, f, "external_data", st, where)
            k, val = _string_map(buf, v, st, where + ".external_data")
            t.external_data[k] = val
        elif f == 14:
            _expect(wt, 0, f, "data_location", st, where)
            t.data_location = v
    return t


def _shape(buf, span, where):
    dims = []
    for f, wt, v, st in _fields(buf, span[0], span[1], where):
        if f == 1:
            _expect(wt, 2, f, "dim", st, where)
            d = None
            for f2, wt2, v2, st2 in _fields(buf, v[0], v[1], where + ".dim"):
                if f2 == 1:
                    _expect(wt2, 0, f2, "dim_value", st2, where)
                    d = _int64(v2)
                elif f2 == 2:
                    _expect(wt2, 2, f2, "dim_param", st2, where)
                    d = _str(buf, v2, st2, where, "dim_param") or None
            dims.append(d)
    return tuple(dims)


def _value_info(buf, span, where) -> ValueInfo:
    vi = ValueInfo()
    for f, wt, v, st in _fields(buf, span[0], span[1], where):
        if f == 1:
            _expect(wt, 2, f, "name", st, where)
            vi.name = _str(buf, v, st, where, "name")
        elif f == 2:
            _expect(wt, 2, f, "type", st, where)
            for f2, wt2, v2, st2 in _fields(buf, v[0], v[1], where + ".type"):
                if f2 == 1:
                    _expect(wt2, 2, f2, "tensor_type", st2, where)
                    for f3, wt3, v3, st3 in _fields(buf, v2[0], v2[1], where + ".type.tensor_type"):
                        if f3 == 1:
                            _expect(wt3, 0, f3, "elem_type", st3, where)
                            vi.elem_type = _int64(v3)
                        elif f3 == 2:
                            _expect(wt3, 2, f3, "shape", st3, where)
                            vi.shape = _shape(buf, v3, where + ".type.tensor_type.shape")
                elif f2 in (4, 5, 8, 9):
                    vi.kind = {4: "sequence", 5: "map", 8: "sparse_tensor", 9: "optional"}[f2]
    return vi


def _attribute(buf, span, where, depth) -> Attribute:
    name, type_, ref = "", 0, ""
    vals = {}
    lists = {7: [], 8: [], 9: [], 10: [], 11: []}
    for f, wt, v, st in _fields(buf, span[0], span[1], where):
        if f == 1:
            _expect(wt, 2, f, "name", st, where)
            name = _str(buf, v, st, where, "name")
        elif f == 20:
            _expect(wt, 0, f, "type", st, where)
            type_ = v
        elif f == 21:
            _expect(wt, 2, f, "ref_attr_name", st, where)
            ref = _str(buf, v, st, where, "ref_attr_name")
        elif f == 2:
            _expect(wt, 5, f, "f", st, where)
            vals[A_FLOAT] = struct.unpack("<f", bytes(v))[0]
        elif f == 3:
            _expect(wt, 0, f, "i", st, where)
            vals[A_INT] = _int64(v)
        elif f == 4:
            _expect(wt, 2, f, "s", st, where)
            vals[A_STRING] = bytes(buf[v[0]:v[1]])
        elif f == 5:
            _expect(wt, 2, f, "t", st, where)
            vals[A_TENSOR] = v          # spans: only the last one is parsed, below
        elif f == 6:
            _expect(wt, 2, f, "g", st, where)
            vals[A_GRAPH] = v
        elif f == 7:
            lists[7].extend(_packed_fixed(buf, wt, v, st, where + ".floats", "f", 4))
        elif f == 8:
            lists[8].extend(_packed_varints(buf, wt, v, st, where + ".ints"))
        elif f == 9:
            _expect(wt, 2, f, "strings", st, where)
            lists[9].append(bytes(buf[v[0]:v[1]]))
        elif f == 10:
            _expect(wt, 2, f, "tensors", st, where)
            lists[10].append(_tensor(buf, v, f"{where}.tensors[{len(lists[10])}]"))
        elif f == 11:
            _expect(wt, 2, f, "graphs", st, where)
            lists[11].append(_graph(buf, v, f"{where}.graphs[{len(lists[11])}]", depth + 1))
    if A_TENSOR in vals:
        vals[A_TENSOR] = _tensor(buf, vals[A_TENSOR], where + ".t")
    if A_GRAPH in vals:
        vals[A_GRAPH] = _graph(buf, vals[A_GRAPH], where + ".g", depth + 1)
    # Old writers leave `type` unset: infer it from the field present.
    if type_ == 0:
        if vals:
            type_ = next(iter(vals))
        else:
            type_ = next((_LIST_TYPES[k] for k, l in lists.items() if l), 0)
    if type_ in vals:
        value = vals[type_]
    elif type_ in (A_FLOATS, A_INTS, A_STRINGS, A_TENSORS, A_GRAPHS):
        value = lists[_LIST_FIELDS[type_]]
        if type_ == A_FLOATS:
            value = list(value)
    else:
        value = None
    if type_ == A_STRING and value is not None:
        value = value.decode("utf-8", "replace")
    elif type_ == A_STRINGS:
        value = [s.decode("utf-8", "replace") for s in value]
    return Attribute(name, type_, value, ref)


_LIST_TYPES = {7: A_FLOATS, 8: A_INTS, 9: A_STRINGS, 10: A_TENSORS, 11: A_GRAPHS}
_LIST_FIELDS = {v: k for k, v in _LIST_TYPES.items()}


def _node(buf, span, where, depth) -> Node:
    n = Node()
    for f, wt, v, st in _fields(buf, span[0], span[1], where):
        if f in (1, 2, 3, 4, 7):
            _expect(wt, 2, f, "string", st, where)
            s = _str(buf, v, st, where, ("input", "output", "name", "op_type", "", "", "domain")[f - 1])
            if f == 1:
                n.inputs.append(s)
            elif f == 2:
                n.outputs.append(s)
            elif f == 3:
                n.name = s
            elif f == 4:
                n.op_type = s
            else:
                n.domain = s
        elif f == 5:
            _expect(wt, 2, f, "attribute", st, where)
            a = _attribute(buf, v, f"{where}.attribute[{len(n.attrs)}]", depth)
            n.attrs[a.name] = a
    return n


def _graph(buf, span, where, depth) -> Graph:
    if depth > MAX_DEPTH:
        _fail(f"graphs nested deeper than {MAX_DEPTH}", span[0], where)
    g = Graph()
    for f, wt, v, st in _fields(buf, span[0], span[1], where):
        if f == 1:
            _expect(wt, 2, f, "node", st, where)
            node = _node(buf, v, f"{where}.node[{len(g.nodes)}]", depth)
            node.index = len(g.nodes)
            g.nodes.append(node)
        elif f == 2:
            _expect(wt, 2, f, "name", st, where)
            g.name = _str(buf, v, st, where, "name")
        elif f == 5:
            _expect(wt, 2, f, "initializer", st, where)
            g.initializers.append(_tensor(buf, v, f"{where}.initializer[{len(g.initializers)}]"))
        elif f == 15:
            g.sparse_initializers += 1
        elif f in (11, 12, 13):
            _expect(wt, 2, f, "value info", st, where)
            lst = {11: g.inputs, 12: g.outputs, 13: g.value_info}[f]
            field = {11: "input", 12: "output", 13: "value_info"}[f]
            lst.append(_value_info(buf, v, f"{where}.{field}[{len(lst)}]"))
    return g


_MAX_OPSET_BYTES = 4096    # a domain name and a version; 500 copies of a 150 KB one cost seconds


def _opset(buf, span, where):
    if span[1] - span[0] > _MAX_OPSET_BYTES:
        _fail(f"an opset_import entry of {span[1] - span[0]} bytes (a domain and a version take a few dozen)",
              span[0], where)
    domain, version = "", 0
    for f, wt, v, st in _fields(buf, span[0], span[1], where):
        if f == 1:
            _expect(wt, 2, f, "domain", st, where)
            domain = _str(buf, v, st, where, "domain")
        elif f == 2:
            _expect(wt, 0, f, "version", st, where)
            version = _int64(v)
    return domain, version


def _function(buf, span, where) -> Function:
    fn = Function()
    for f, wt, v, st in _fields(buf, span[0], span[1], where):
        if f in (1, 4, 5, 6, 10):
            _expect(wt, 2, f, "string", st, where)
            s = _str(buf, v, st, where, "string")
            if f == 1:
                fn.name = s
            elif f == 4:
                fn.inputs.append(s)
            elif f == 5:
                fn.outputs.append(s)
            elif f == 6:
                fn.attributes.append(s)
            else:
                fn.domain = s
        elif f == 11:
            _expect(wt, 2, f, "attribute_proto", st, where)
            a = _attribute(buf, v, where + ".attribute_proto", 1)
            fn.attribute_defaults[a.name] = a
        elif f == 7:
            _expect(wt, 2, f, "node", st, where)
            node = _node(buf, v, f"{where}.node[{len(fn.nodes)}]", 1)
            node.index = len(fn.nodes)
            fn.nodes.append(node)
        elif f == 9:
            _expect(wt, 2, f, "opset_import", st, where)
            d, ver = _opset(buf, v, where + ".opset_import")
            fn.opset_import[d] = ver
    return fn


def parse_model(data) -> Model:
    """Decode a serialized ModelProto (bytes-like). Tensor payloads are not decoded yet."""
    if isinstance(data, memoryview):
        data = data.tobytes()
    elif not isinstance(data, bytes):
        data = bytes(data)
    m = Model()
    m.size = len(data)
    graph_span = None
    for f, wt, v, st in _fields(data, 0, len(data), "ModelProto"):
        if f == 1:
            _expect(wt, 0, f, "ir_version", st, "ModelProto")
            m.ir_version = _int64(v)
        elif f == 2 or f == 3:
            _expect(wt, 2, f, "producer", st, "ModelProto")
            s = _str(data, v, st, "ModelProto", "producer")
            if f == 2:
                m.producer_name = s
            else:
                m.producer_version = s
        elif f == 7:
            _expect(wt, 2, f, "graph", st, "ModelProto")
            graph_span = v      # the last one wins: parse only that one (a file repeating the
            #                     field 500 times must not cost 500 parses)
        elif f == 8:
            _expect(wt, 2, f, "opset_import", st, "ModelProto")
            d, ver = _opset(data, v, "ModelProto.opset_import")
            m.opset_import["ai.onnx" if d == "" else d] = ver
        elif f == 25:
            _expect(wt, 2, f, "functions", st, "ModelProto")
            m.functions.append(_function(data, v, f"ModelProto.functions[{len(m.functions)}]"))
    if graph_span is not None:
        m.graph = _graph(data, graph_span, "ModelProto.graph", 0)
    if m.graph is None:
        raise OnnxError("malformed ONNX file: the ModelProto has no graph (field 7); "
                        "the file is truncated or not an ONNX model")
    return m


# ---- tensor payloads -------------------------------------------------------------------------

def _read_external(t: TensorProto, base_dir, external_data) -> bytes:
    loc = t.external_data.get("location")
    if not loc:
        raise OnnxError(f"initializer {t.name!r} ({t.where}): external data without a 'location'")
    if "\0" in loc:
        raise OnnxError(f"initializer {t.name!r}: external data location {loc!r} contains a NUL byte; refused")
    try:
        offset = int(t.external_data.get("offset", "0") or 0)
        length = t.external_data.get("length")
        length = None if length in (None, "") else int(length)
    except ValueError:
        raise OnnxError(f"initializer {t.name!r}: external data offset/length are not integers "
                        f"({t.external_data})") from None
    if offset < 0 or (length is not None and length < 0):
        raise OnnxError(f"initializer {t.name!r}: negative external data offset/length ({t.external_data})")
    if external_data is not None and loc in external_data:
        blob = memoryview(external_data[loc])
        size = len(blob)
    else:
        if base_dir is None:
            raise OnnxError(f"initializer {t.name!r} keeps its data in the external file {loc!r}; load "
                            f"the model from its path, or pass base_dir= or external_data={{{loc!r}: bytes}}")
        # The location is relative to the model's folder and must stay inside it.
        norm = os.path.normpath(loc.replace("\\", "/"))
        if os.path.isabs(norm) or norm.startswith(".."):
            raise OnnxError(f"initializer {t.name!r}: external data location {loc!r} is outside the "
                            f"model's folder; refused")
        path = os.path.join(base_dir, norm)
        base_real = os.path.realpath(base_dir)
        if not os.path.realpath(path).startswith(base_real.rstrip(os.sep) + os.sep):
            raise OnnxError(f"initializer {t.name!r}: external data location {loc!r} resolves outside "
                            f"the model's folder; refused")
        if not os.path.isfile(path):
            raise OnnxError(f"initializer {t.name!r}: external data file {path!r} does not exist")
        size = os.path.getsize(path)
        blob = None
    if offset > size:
        raise OnnxError(f"initializer {t.name!r}: external data offset {offset} is past the end of {loc!r} "
                        f"({size} bytes)")
    if length is None:
        length = size - offset
    if offset + length > size:
        raise OnnxError(f"initializer {t.name!r}: external data range [{offset}, {offset + length}) is past "
                        f"the end of {loc!r} ({size} bytes)")
    if blob is not None:
        return blob[offset:offset + length]
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(length)


def tensor_bytes(t: TensorProto, base_dir=None, external_data=None, what=None):
    """Decode a TensorProto to ``(data, shape, ember_dtype)``: little-endian bytes in the ember
    dtype's layout (DOUBLE/BFLOAT16 converted to float32, BOOL normalised to 0/1)."""
    what = what or f"tensor {t.name!r}"
    dt = ember_dtype(t.data_type, what)
    if t.has_segment:
        raise UnsupportedOp(f"{what}: segmented tensors (TensorProto.segment) are not supported")
    shape = tuple(t.dims)
    if any(d < 0 for d in shape):
        raise OnnxError(f"{what}: negative dimension in shape {shape}")
    n = prod(shape)
    code = t.data_type
    size = _ITEMSIZE[code]
    if t.data_location == 1:
        raw = _read_external(t, base_dir, external_data)
    else:
        raw = t.raw_data
    if raw is not None:
        if n > 1 << 62:   # never format such a product: str() of a huge int is refused (and slow)
            raise OnnxError(f"{what}: shape {shape} has more than 2^62 elements")
        if len(raw) != n * size:
            raise OnnxError(f"{what}: {len(raw)} bytes of data for shape {shape} of "
                            f"{DTYPE_NAMES[code]} ({n * size} bytes expected)")
        if code == DOUBLE:
            a = array("d")
            a.frombytes(bytes(raw))
            return array("f", a).tobytes(), shape, dt
        if code == BFLOAT16:
            h = array("H")
            h.frombytes(bytes(raw))
            return _bf16_to_f32(h), shape, dt
        if code == BOOL:
            return bytes(1 if b else 0 for b in raw), shape, dt
        if code in WIDENED:
            a = array(WIDENED[code])
            a.frombytes(bytes(raw))
            return array("i", a).tobytes(), shape, dt
        return bytes(raw), shape, dt
    # typed fields
    if code == FLOAT:
        vals = t.float_data
    elif code == DOUBLE:
        vals = t.double_data
    elif code == INT64:
        vals = t.int64_data
    elif code in (INT32, UINT8, BOOL, FLOAT16, BFLOAT16) or code in WIDENED:
        vals = t.int32_data
    else:
        vals = None
    if vals is None:
        vals = []
    if len(vals) != n:
        expected = n if n <= 1 << 62 else "more than 2^62"   # str() of a huge int is refused (and slow)
        raise OnnxError(f"{what}: {len(vals)} values for shape {shape} ({expected} expected)")
    try:
        if code in (FLOAT, DOUBLE):
            return array("f", vals).tobytes(), shape, dt
        if code == INT64:
            return array("q", vals).tobytes(), shape, dt
        if code == INT32 or code in WIDENED:
            array(WIDENED.get(code, "i"), vals)          # range check: OverflowError below
            return array("i", vals).tobytes(), shape, dt
        if code == UINT8:
            return bytes(vals), shape, dt
        if code == BOOL:
            return bytes(1 if v else 0 for v in vals), shape, dt
        if code == FLOAT16:  # int32_data holds the 16-bit patterns
            return array("H", vals).tobytes(), shape, dt
        return _bf16_to_f32(array("H", vals)), shape, dt
    except (OverflowError, ValueError) as e:
        raise OnnxError(f"{what}: a value does not fit {DTYPE_NAMES[code]} ({e})") from None


def _bf16_to_f32(h: array) -> bytes:
    # bfloat16 is the top half of a float32
    return array("I", [v << 16 for v in h]).tobytes()
