"""The wire protocol of ``ember.remote``: binary frames, JSON metadata, raw tensor bytes.

Pure Python (``struct`` and ``json``), so the same module runs natively and inside Pyodide.
Nothing is ever unpickled: a frame is a 12-byte header, a JSON document and the raw bytes of
zero or more tensors, and every length is checked against the limits before anything is
allocated for it.

Frame layout (little-endian)::

    offset 0   2 bytes   magic b"em"
    offset 2   u8        protocol version (1)
    offset 3   u8        message type (HELLO, WELCOME, BATCH, REPLY, ERROR)
    offset 4   u32       request id (a reply carries the id of its request)
    offset 8   u32       length M of the JSON metadata
    offset 12  M bytes   JSON metadata (UTF-8); its "blobs" list gives the length of each blob
    then       blobs     raw tensor bytes, one after the other (the frame ends with the last)

Attribute values (an op's ``axis``, ``dtype``, ``shape``...) travel as JSON with tags for what
JSON lacks: tuples ``{"t": [...]}``, dtypes ``{"dt": "float32"}``, slices ``{"s": [a, b, c]}``,
non-finite floats ``{"f": "nan"}``, dicts ``{"d": [[key, value], ...]}``.

>>> from ember.remote import protocol as p
>>> frame = p.encode_frame(p.BATCH, 7, {"cmds": [["get", 1]]}, [b"\\x00\\x00\\x80\\x3f"])
>>> kind, rid, meta, blobs = p.decode_frame(frame)
>>> kind == p.BATCH, rid, meta["cmds"], bytes(blobs[0])
(True, 7, [['get', 1]], b'\\x00\\x00\\x80?')
>>> p.decode_value(p.encode_value((1, 2.5, float("inf"))))
(1, 2.5, inf)
"""
from __future__ import annotations

import json
import math
import struct

from ..errors import EmberError

VERSION = 1
MAGIC = b"em"
HEADER = struct.Struct("<2sBBII")

HELLO, WELCOME, BATCH, REPLY, ERROR = 1, 2, 3, 4, 5
TYPES = {HELLO: "HELLO", WELCOME: "WELCOME", BATCH: "BATCH", REPLY: "REPLY", ERROR: "ERROR"}

# Defaults shared by both sides (the server announces its own in WELCOME).
MAX_MESSAGE = 256 << 20      # bytes in one frame
MAX_META = 8 << 20           # bytes of JSON metadata in one frame
MAX_BLOBS = 4096             # tensors in one frame
MAX_DEPTH = 32               # nesting of an attribute value


class RemoteError(EmberError, RuntimeError):
    """Remote execution failed: the connection broke, the server refused a request (busy, a
    memory ceiling, an unknown tensor id) or its answer was malformed."""


class AuthError(RemoteError, PermissionError):
    """The server refused the token (wrong or missing): check ``token=`` / ``--token-file``."""


class ProtocolError(RemoteError, ValueError):
    """A frame that does not follow the protocol: bad magic or version, a length past the end,
    an over-limit size, JSON that does not parse, an unknown command or attribute tag."""


def encode_frame(kind: int, rid: int, meta: dict, blobs=()) -> bytes:
    """One frame: header, JSON ``meta`` (its ``blobs`` entry is set to the blob lengths), blobs."""
    meta = dict(meta)
    meta["blobs"] = [len(b) for b in blobs]
    js = json.dumps(meta, separators=(",", ":"), allow_nan=False).encode()
    return b"".join([HEADER.pack(MAGIC, VERSION, kind, rid & 0xFFFFFFFF, len(js)), js, *blobs])


def decode_frame(data, *, max_message: int = MAX_MESSAGE, max_meta: int = MAX_META,
                 max_blobs: int = MAX_BLOBS):
    """``(kind, request id, meta dict, [memoryview of each blob])`` from one frame; ProtocolError
    on anything malformed or over a limit (checked before parsing or copying)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"a frame must be binary, got {type(data).__name__}")
    n = len(data)
    if n > max_message:
        raise ProtocolError(f"frame of {n} bytes is over the {max_message}-byte message limit")
    if n < HEADER.size:
        raise ProtocolError(f"frame of {n} bytes is shorter than the {HEADER.size}-byte header")
    mv = memoryview(data)
    magic, version, kind, rid, mlen = HEADER.unpack_from(mv, 0)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r}): not an ember remote frame")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version} is not supported (this side speaks {VERSION})")
    if kind not in TYPES:
        raise ProtocolError(f"unknown message type {kind}")
    if mlen > max_meta or HEADER.size + mlen > n:
        raise ProtocolError(f"metadata length {mlen} at offset {HEADER.size} runs past the frame ({n} bytes) "
                            f"or over the {max_meta}-byte limit")
    try:
        meta = json.loads(bytes(mv[HEADER.size:HEADER.size + mlen]).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ProtocolError(f"metadata at offset {HEADER.size} is not valid JSON: {str(e)[:120]}") from None
    if not isinstance(meta, dict):
        raise ProtocolError(f"metadata must be a JSON object, got {type(meta).__name__}")
    lens = meta.get("blobs", [])
    if not isinstance(lens, list) or len(lens) > max_blobs or not all(
            type(x) is int and x >= 0 for x in lens):
        raise ProtocolError(f"'blobs' must be a list of at most {max_blobs} non-negative integers")
    off = HEADER.size + mlen
    if off + sum(lens) != n:
        raise ProtocolError(f"blob lengths {sum(lens)} + header and metadata {off} != frame length {n}")
    blobs = []
    for ln in lens:
        blobs.append(mv[off:off + ln])
        off += ln
    return kind, rid, meta, blobs


# ---- attribute values ----------------------------------------------------------------------

def encode_value(v):
    """A JSON-able form of an op attribute (see the module docstring); TypeError otherwise."""
    from ..dtypes import DType

    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else {"f": repr(v)}
    if isinstance(v, DType):
        return {"dt": v.name}
    if isinstance(v, tuple):
        return {"t": [encode_value(x) for x in v]}
    if isinstance(v, list):
        return [encode_value(x) for x in v]
    if isinstance(v, slice):
        return {"s": [encode_value(v.start), encode_value(v.stop), encode_value(v.step)]}
    if isinstance(v, dict):
        return {"d": [[encode_value(k), encode_value(x)] for k, x in v.items()]}
    if v is Ellipsis:
        return {"e": 1}
    if hasattr(v, "item") and hasattr(v, "dtype") and not hasattr(v, "_buf"):   # a numpy scalar
        return encode_value(v.item())
    raise TypeError(f"cannot send an attribute of type {type(v).__name__} ({v!r:.60}) to a remote device")


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def decode_value(v, depth: int = 0):
    """The inverse of ``encode_value``; ProtocolError on an unknown tag or nesting too deep."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"attribute value nested deeper than {MAX_DEPTH}")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return [decode_value(x, depth + 1) for x in v]
    if isinstance(v, dict) and len(v) == 1:
        (tag, x), = v.items()
        if tag == "t" and isinstance(x, list):
            return tuple(decode_value(y, depth + 1) for y in x)
        if tag == "dt" and isinstance(x, str):
            from .. import dtypes

            try:
                return dtypes.get(x)
            except EmberError as e:
                raise ProtocolError(f"unknown dtype {x!r} in an attribute: {e}") from None
        if tag == "f" and x in _FLOATS:
            return _FLOATS[x]
        if tag == "s" and isinstance(x, list) and len(x) == 3 and all(y is None or type(y) is int for y in x):
            return slice(*x)
        if tag == "d" and isinstance(x, list) and all(isinstance(p, list) and len(p) == 2 for p in x):
            out = {}
            for k, y in x:
                k = decode_value(k, depth + 1)
                try:
                    out[k] = decode_value(y, depth + 1)
                except TypeError:
                    raise ProtocolError("unhashable dict key in an attribute") from None
            return out
        if tag == "e" and x == 1:
            return Ellipsis
    raise ProtocolError(f"unknown attribute encoding {json.dumps(v)[:80]}")


def encode_attrs(attrs: dict) -> dict:
    return {k: encode_value(v) for k, v in attrs.items()}


def decode_attrs(attrs) -> dict:
    if not isinstance(attrs, dict) or not all(isinstance(k, str) for k in attrs):
        raise ProtocolError("op attributes must be a JSON object")
    return {k: decode_value(v) for k, v in attrs.items()}


# ---- errors across the wire ----------------------------------------------------------------

def error_meta(exc: BaseException, **where) -> dict:
    """ERROR metadata for ``exc``: its class name (an ``ember.errors`` name when it is one of
    ours, so the client raises the same type), the message and where it happened."""
    from .. import errors

    name = type(exc).__name__
    if not (isinstance(exc, EmberError) and (getattr(errors, name, None) is type(exc) or name in _OURS)):
        msg = f"{name}: {exc}" if not isinstance(exc, EmberError) else str(exc)
        name = "RemoteError"
    else:
        msg = str(exc)
    return {"type": name, "message": msg[:4000], **where}


_OURS = {"RemoteError", "AuthError", "ProtocolError"}


def error_from_meta(meta: dict) -> EmberError:
    """The exception an ERROR frame describes, as an instance of the same ``ember.errors``
    class where there is one (else RemoteError)."""
    from .. import errors

    name = meta.get("type") if isinstance(meta.get("type"), str) else "RemoteError"
    msg = str(meta.get("message", ""))
    cls = {"RemoteError": RemoteError, "AuthError": AuthError, "ProtocolError": ProtocolError}.get(name)
    if cls is None:
        cls = getattr(errors, name, None)
        if not (isinstance(cls, type) and issubclass(cls, EmberError)):
            cls, msg = RemoteError, f"{name}: {msg}"
    try:
        return cls(msg)
    except TypeError:   # a class with required arguments
        return RemoteError(f"{name}: {msg}")
