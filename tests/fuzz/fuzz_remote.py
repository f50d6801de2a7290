"""The ``remote`` format of tests/fuzz/fuzz.py: ember serve's frames (``ember.remote.protocol``).

A case is one mutated BATCH frame, handled as the server handles it, without a socket:
``decode_frame`` then ``Session.run_batch`` on a fresh session of a server on numpy (python
without numpy) with small memory ceilings. The session re-raises what is not an ``EmberError``
(``reraise``) so a bug in a check shows as a finding instead of the typed RemoteError a client
would get. Seeds: valid frames (puts, ops with attributes, a plan and its runs, gets, frees);
mutations: the JSON metadata's values (ids, shapes, dtypes, op names, attributes, plan slots),
blob lengths, and byte-level havoc on the whole frame.
"""
from __future__ import annotations

import json
import random
import struct

_F32 = struct.Struct("<f")


def _f32(*vals) -> bytes:
    return b"".join(_F32.pack(v) for v in vals)


def seeds() -> list:
    from ember.remote import protocol as P

    def frame(cmds, blobs=()):
        return P.encode_frame(P.BATCH, 1, {"cmds": cmds}, list(blobs))

    put = [["put", 1, [2, 3], "float32", 0], ["put", 2, [3], "float32", 1]]
    blobs = [_f32(1, 2, 3, 4, 5, 6), _f32(0.5, -1, 2)]
    plan = {"n_slots": 5, "n_inputs": 1, "consts": [[1, 2]], "outs": [4],
            "steps": [["add", [0, 1], [2], {}], ["exp", [2], [3], {}], ["sum", [3], [4], {"axis": {"t": [1]},
                                                                                         "keepdims": False}]]}
    out = [
        ("<put add get>", frame(put + [["op", "add", [1, 2], [3], {}], ["get", 3], ["free", [1, 2]]], blobs)),
        ("<matmul reshape>", frame(put + [["op", "reshape", [1], [3], {"shape": {"t": [3, 2]}}],
                                          ["op", "matmul", [1, 3], [4], {}], ["get", 4]], blobs)),
        ("<full arange cast>", frame([["op", "full", [], [1], {"shape": {"t": [2, 2]}, "value": 1.5,
                                                               "dtype": {"dt": "float32"}}],
                                      ["op", "arange", [], [2], {"start": 0, "num": 4, "step": 1,
                                                                 "dtype": {"dt": "int64"}}],
                                      ["op", "cast", [2], [3], {"dtype": {"dt": "float32"}}], ["get", 3]])),
        ("<plan run>", frame(put + [["plan", 1, plan], ["run", 1, [1], [5]], ["run", 1, [1], [6]], ["get", 6],
                                    ["unplan", 1]], blobs)),
        ("<softmax take>", frame(put + [["op", "softmax", [1], [3], {"axis": -1}],
                                        ["put", 4, [2], "int64", 2],
                                        ["op", "take", [2, 4], [5], {"axis": 0}], ["get", 5]],
                                 blobs + [struct.pack("<2q", 0, 2)])),
    ]
    return out


_WEIRD = [0, 1, -1, 2, 3, 7, 64, 65536, 2 ** 31, 2 ** 53, 2 ** 63, -(2 ** 63), 10 ** 30, 0.5, -0.0, None, True,
          "float32", "int64", "bool", "float64", "nope", "", [], {}, [1, 2], {"t": []}, {"t": [2, 2]},
          {"dt": "uint8"}, {"dt": "x"}, {"f": "nan"}, {"s": [None, 2, None]}, {"d": [["a", 1]]}, {"e": 1},
          {"t": [1 << 20, 1 << 20]}, [[[[[]]]]]]


def _walk(obj, out, path=()):
    out.append(path)
    if isinstance(obj, list):
        for i, v in enumerate(obj):
            _walk(v, out, path + (i,))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, out, path + (k,))


def _get(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def mutate(rng: random.Random, data: bytes, seeds_, havoc) -> bytes:
    """Rewrite one to three values of the frame's JSON metadata (or a blob length), or havoc."""
    from ember import registry
    from ember.remote import protocol as P

    if rng.random() < 0.25:
        return havoc(rng, data)
    kind, rid, meta, blobs = P.decode_frame(data)
    blobs = [bytes(b) for b in blobs]
    meta.pop("blobs", None)
    names = sorted(registry.OPS)
    for _ in range(rng.randint(1, 3)):
        paths: list = []
        _walk(meta, paths)
        paths = [p for p in paths if p]
        if not paths:
            break
        # mostly values past the command's structure: attributes, ids, shapes, slots
        deep = [p for p in paths if len(p) > 3 and not (p[-1] == 0 and len(p) == 3)]
        p = rng.choice(deep if deep and rng.random() < 0.8 else paths)
        cur = _get(meta, p)
        r = rng.random()
        if type(cur) is int and r < 0.4:
            value = rng.choice((cur + 1, cur - 1, cur * 2, -cur, cur + 2 ** 31, 0))
        elif r < 0.15:
            value = rng.choice(names)
        elif r < 0.25 and blobs:
            i = rng.randrange(len(blobs))
            blobs[i] = blobs[i][:rng.randrange(len(blobs[i]) + 1)] if rng.random() < 0.5 else blobs[i] * 2
            continue
        else:
            value = rng.choice(_WEIRD)
        try:
            _set(meta, p, json.loads(json.dumps(value)))
        except (TypeError, KeyError, IndexError):
            pass
    return P.encode_frame(kind, rid, meta, blobs)


_SERVER: list = []


def run(data: bytes) -> str:
    """Handle one frame as the server does; raise what an error reply carries."""
    from ember.remote import protocol as P
    from ember.remote.server import Limits, Server, Session

    if not _SERVER:
        try:
            import numpy  # noqa: F401
            dev = "numpy"
        except ImportError:
            dev = "python"
        _SERVER.append(Server(dev, "fuzz", Limits(max_connection_bytes=64 << 20, max_total_bytes=64 << 20,
                                                   max_message=16 << 20)))
    srv = _SERVER[0]
    kind, rid, meta, blobs = P.decode_frame(data, max_message=srv.limits.max_message)
    if kind != P.BATCH:
        raise P.ProtocolError(f"expected a BATCH frame, got {P.TYPES[kind]}")
    s = Session(srv)
    s.reraise = True
    try:
        rmeta, got = s.run_batch(meta, blobs)
    finally:
        s.close()
    if got is None:
        raise P.error_from_meta(rmeta)
    return f"{len(got)} tensors back"
