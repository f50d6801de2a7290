"""Mutation fuzzers for ember's file readers: safetensors, ONNX, PyTorch checkpoints and GGUF.

    python tests/fuzz/fuzz.py [--minutes N | --cases N] [--formats safetensors,onnx,pt,gguf,remote] [--jobs 2]
                              [--seed S] [--mem-mib 1024] [--timeout 10] [--json report.json]
    python build.py fuzz [--minutes N] ...          (the same, through the entry point)

Each case is one mutated file, run in its own forked child of this process (ember is imported
once, before forking) under an address-space cap (``RLIMIT_AS``: what the child already maps
plus ``--mem-mib``; ember's per-tensor ceiling is set to a quarter of that, as ember would
compute it in such a process) and a timeout (the child is killed past ``--timeout`` seconds,
after printing where it was). A case is run the way a user would: ``load_safetensors`` and
reading every tensor; ``load_torch``; ``ember.onnx.load`` and, when that works, one call on
zeros of the declared input shapes; ``load_gguf``, its metadata and every tensor, dequantized;
``remote``: one ember serve frame handled as the server does (tests/fuzz/fuzz_remote.py).

What counts: a case *passes* when it finishes within 2 seconds, either loading or raising an
``EmberError``. Anything else -- another exception (``TypeError``, a bare ``MemoryError``, ...),
a case over 2 seconds, a timeout, a crashed child -- is a *finding*, grouped by a signature
(format, kind, exception type and the innermost ember frame). The first input of each
signature is saved to ``--out`` (ONNX ones are shrunk first, field by field, while the
signature holds: ``--minimize``).

Mutations are structure-aware where it pays: JSON header fields for safetensors, protobuf
fields at any nesting depth for ONNX (values, lengths, repeats, deletions, splices between
seeds), pickle opcodes, storages and zip entries for checkpoints (re-zipped with valid CRCs so
the zip layer does not reject everything), GGUF's integer fields (counts, string and array
lengths, value and tensor types, ranks, dims, offsets, the alignment), plus plain byte-level
havoc on the whole file.

Seeds: tests/fuzz/seeds/* (tests/fuzz/make_seeds.py) and the committed fixtures
(tests/fixtures/onnx/*.onnx, the small tests/fixtures/**/*.safetensors and *.pt); the GGUF seeds
are built in-process (``gguf_seeds``).
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import pickletools
import random
import resource
import select
import signal
import struct
import sys
import time
import traceback
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import fuzz_remote  # noqa: E402  (the ember serve frame format)


def _import_ember():
    """ember from the environment, else straight from this tree's core/ (a bare python3: the
    fuzzers need nothing but the standard library)."""
    try:
        import ember  # noqa: F401
        return
    except ImportError:
        pass
    import importlib.util

    spec = importlib.util.spec_from_file_location("ember", os.path.join(REPO, "core", "__init__.py"),
                                                  submodule_search_locations=[os.path.join(REPO, "core")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ember"] = mod
    spec.loader.exec_module(mod)

FORMATS = ("safetensors", "onnx", "pt", "gguf", "remote")
SLOW_SECONDS = 2.0
INTERESTING_INTS = [0, 1, 2, 3, 4, 7, 8, 16, 63, 64, 65, 127, 128, 255, 256, 1000, 4096, 65535, 65536,
                    10 ** 5, 10 ** 6, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 10 ** 10, 10 ** 12,
                    2 ** 53, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1]


# ---- seeds ----------------------------------------------------------------------------------

def load_seeds() -> dict:
    def files(*patterns, limit=200_000):
        out = []
        for pat in patterns:
            for p in sorted(glob.glob(os.path.join(REPO, pat), recursive=True)):
                if os.path.isfile(p) and os.path.getsize(p) <= limit:
                    with open(p, "rb") as f:
                        out.append((os.path.relpath(p, REPO), f.read()))
        return out

    return {"safetensors": files("tests/fuzz/seeds/safetensors/*.safetensors", "tests/fixtures/**/*.safetensors",
                                 limit=20_000),
            "onnx": files("tests/fuzz/seeds/onnx/*.onnx", "tests/fixtures/onnx/*.onnx"),
            "pt": files("tests/fuzz/seeds/pt/*.pt", "tests/fixtures/**/*.pt", limit=20_000),
            "gguf": gguf_seeds(), "remote": fuzz_remote.seeds()}


# ---- byte-level havoc -------------------------------------------------------------------------

def havoc(rng: random.Random, data: bytes, n_ops: int | None = None) -> bytes:
    b = bytearray(data)
    for _ in range(n_ops or rng.choice((1, 1, 2, 3, 4, 8))):
        op = rng.randrange(9)
        if not b:
            b += bytes([rng.randrange(256)])
            continue
        i = rng.randrange(len(b))
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == 2:
            v = rng.choice(INTERESTING_INTS)
            size = rng.choice((1, 2, 4, 8))
            raw = (v % (1 << (8 * size))).to_bytes(size, "little")
            b[i:i + size] = raw
        elif op == 3:
            del b[i:i + rng.randint(1, 64)]
        elif op == 4:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 32)))
        elif op == 5:
            j = rng.randrange(len(b))
            chunk = b[j:j + rng.randint(1, 256)]
            b[i:i] = chunk * rng.randint(1, 8)
        elif op == 6:
            del b[rng.randint(0, len(b)):]
        elif op == 7:
            b[i] = (b[i] + rng.choice((-1, 1, 16, -16))) % 256
        else:
            j = rng.randrange(len(b))
            n = rng.randint(1, 16)
            b[i:i + n], b[j:j + n] = b[j:j + n], b[i:i + n]
    return bytes(b)


# ---- safetensors ----------------------------------------------------------------------------

def _weird_value(rng: random.Random):
    return rng.choice([
        lambda: rng.choice(INTERESTING_INTS) * rng.choice((1, 1, -1)),
        lambda: rng.random() * 10.0 ** rng.randint(0, 300), lambda: float(rng.choice(("inf", "nan", "-inf"))),
        lambda: True, lambda: None, lambda: "3", lambda: [], lambda: {},
        lambda: [rng.choice(INTERESTING_INTS) for _ in range(rng.randint(0, 6))],
        lambda: "x" * rng.randint(0, 300),
        lambda: [[1]] * rng.randint(1, 3),
    ])()


def mutate_safetensors(rng: random.Random, data: bytes, seeds) -> bytes:
    if rng.random() < 0.35 or len(data) < 8:
        return havoc(rng, data)
    n = int.from_bytes(data[:8], "little")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError:
        return havoc(rng, data)
    body = data[8 + n:]
    raw_text = None
    names = [k for k in header if k != "__metadata__"]
    for _ in range(rng.choice((1, 1, 2, 3))):
        op = rng.randrange(12)
        if names and op < 6:
            e = header.get(rng.choice(names))
            if not isinstance(e, dict):
                continue
            key = rng.choice(("dtype", "shape", "data_offsets", "shape", "data_offsets"))
            if op == 0:
                e[key] = _weird_value(rng)
            elif op == 1 and key == "dtype":
                e["dtype"] = rng.choice(["F32", "F16", "BF16", "I64", "I32", "U8", "BOOL", "F64", "I8", "U64", "",
                                         "f32", "F8_E4M3"])
            elif op == 1 and isinstance(e.get(key), list):
                lst = e[key]
                if lst:
                    lst[rng.randrange(len(lst))] = rng.choice(INTERESTING_INTS) * rng.choice((1, 1, -1))
                else:
                    lst.append(rng.choice(INTERESTING_INTS))
            elif op == 2 and isinstance(e.get("shape"), list):
                e["shape"] = e["shape"] + [rng.choice((0, 1, 1, 2, 10 ** 6))] * rng.choice((1, 2, 70, 1000))
            elif op == 3:
                e.pop(key, None)
            elif op == 4:
                e[rng.choice(("extra", "dtype_", "offsets"))] = _weird_value(rng)
            else:
                e["data_offsets"] = sorted(rng.randrange(len(body) + 2) for _ in range(2))
        elif op == 6:
            header[rng.choice(["new", "", "__metadata__", "w\x00", "é" * 3])] = _weird_value(rng)
        elif op == 7:
            header["__metadata__"] = rng.choice([{"a": "b"}, {"a": 1}, [], "x", {"": ""}, {"k": {"n": 1}}])
        elif op == 8 and names:
            header[rng.choice(names) + str(rng.randrange(3))] = header[rng.choice(names)]
        elif op == 9:
            body = havoc(rng, body) if body else body
        elif op == 10:
            raw_text = json.dumps(header, separators=(",", ":"))
            i = rng.randrange(len(raw_text) + 1)
            raw_text = raw_text[:i] + rng.choice(["9" * rng.choice((20, 5000)), "[" * 3000, "1e999", "-0",
                                                  '"a":', ",", "}", "\\ud800", "\x00"]) + raw_text[i:]
        else:
            header = {k: header[k] for k in rng.sample(list(header), len(header))}
    text = (raw_text if raw_text is not None else json.dumps(header, separators=(",", ":"))).encode("utf-8", "replace")
    length = len(text)
    if rng.random() < 0.1:
        length = rng.choice((length + rng.randint(-8, 8), 2 ** 63, 10 ** 8, 0, 2 ** 64 - 1)) % (1 << 64)
    return struct.pack("<Q", max(length, 0)) + text + body


# ---- GGUF -----------------------------------------------------------------------------------

def _gs(x) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def build_gguf(kv, tensors, data: bytes, *, version: int = 3, align: int = 32) -> bytes:
    """A GGUF file from parts: kv = [(key, value type, payload bytes)], tensors = [(name, dims
    (fastest first), ggml type, offset)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, vt, payload in kv:
        out += _gs(key) + struct.pack("<I", vt) + payload
    for name, dims, gt, off in tensors:
        out += _gs(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, gt, off)
    return out + b"\0" * (-len(out) % align) + data


def gguf_seeds() -> list:
    """Small valid GGUF files (built here, no gguf package needed): every metadata type, nested
    and string arrays, tensors of the types ember reads (F32, F16 1-D and 2-D, Q8_0, Q4_1,
    Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q6_K, IQ4_XS) and, in the v2 seed, one it does not
    (TQ2_0); v2 and v3, alignments 32 and 8."""
    rng = random.Random(7)

    def blocks(nbytes, n, halves=(0,)):
        out = bytearray()
        for _ in range(n):
            b = bytearray(rng.randrange(256) for _ in range(nbytes))
            for h in halves:
                b[h:h + 2] = struct.pack("<e", rng.uniform(-2, 2))
            out += b
        return bytes(out)

    def u32(v):
        return struct.pack("<I", v)

    kv = [("general.architecture", 8, _gs("llama")), ("llama.block_count", 4, u32(2)),
          ("general.alignment", 4, u32(32)), ("t.u8", 0, b"\x07"), ("t.i8", 1, b"\xf9"),
          ("t.u16", 2, struct.pack("<H", 9)), ("t.i16", 3, struct.pack("<h", -9)), ("t.i32", 5, struct.pack("<i", -5)),
          ("t.f32", 6, struct.pack("<f", 0.5)), ("t.bool", 7, b"\x01"), ("t.u64", 10, struct.pack("<Q", 2 ** 40)),
          ("t.i64", 11, struct.pack("<q", -(2 ** 40))), ("t.f64", 12, struct.pack("<d", 1e-9)),
          ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 4) + b"".join(_gs(t) for t in ("a", "b", "ab", "\u0120x"))),
          ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 4) + struct.pack("<4f", 0, -1, -2, -3)),
          ("t.nested", 9, struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 5, 1) + struct.pack("<i", 3)
           + struct.pack("<IQ", 8, 1) + _gs("s")),
          ("t.bools", 9, struct.pack("<IQ", 7, 3) + b"\x00\x01\x00")]
    parts = [("f32_norm", (8,), 0, struct.pack("<8f", *range(8))),
             ("f16_1d", (4,), 1, struct.pack("<4e", 1, 2, 3, 4)),
             ("f16_2d", (2, 2), 1, struct.pack("<4e", 1, -2, 3, -4)),
             ("q8_0_w", (32, 2), 8, blocks(34, 2)),
             ("q4_1_w", (64, 1), 3, blocks(20, 2, (0, 2))),
             ("q5_0_w", (32, 1), 6, blocks(22, 1)),
             ("q5_1_w", (32, 1), 7, blocks(24, 1, (0, 2))),
             ("iq4_nl_w", (32, 1), 20, blocks(18, 1)),
             ("iq4_xs_w", (256, 1), 23, blocks(136, 1)),
             ("q2_k_w", (256, 1), 10, blocks(84, 1, (80, 82))),
             ("q3_k_w", (256, 1), 11, blocks(110, 1, (108,))),
             ("q4_k_w", (256, 1), 12, blocks(144, 1, (0, 2))),
             ("q6_k_w", (256, 1), 14, blocks(210, 1, (208,))),
             ("tq2_0_w", (256, 1), 35, blocks(66, 1, (64,)))]
    seeds = []
    for version, align in ((3, 32), (2, 32), (3, 8)):
        tensors, data = [], b""
        for name, dims, gt, raw in parts:
            if gt == 35 and version != 2:     # the unsupported type in one seed only: the others load
                continue
            data += b"\0" * (-len(data) % align)
            tensors.append((name, dims, gt, len(data)))
            data += raw
        kvs = [(k, vt, u32(align) if k == "general.alignment" else p) for k, vt, p in kv]
        seeds.append((f"<gguf v{version} align {align}>", build_gguf(kvs, tensors, data, version=version, align=align)))
    seeds.append(("<gguf tiny>", build_gguf(kv[:2], [parts[3][:3] + (0,)], parts[3][3])))
    return seeds


def gguf_fields(data: bytes) -> list:
    """The integer fields of a (possibly damaged) GGUF file, as (offset, size, kind), found by a
    forgiving walk that stops where the file stops making sense."""
    fields = [(4, 4, "version"), (8, 8, "count"), (16, 8, "count")]
    n = len(data)
    try:
        n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
        pos = 24

        def string(pos):
            fields.append((pos, 8, "length"))
            (m,) = struct.unpack_from("<Q", data, pos)
            if m > n:
                raise ValueError
            return pos + 8 + m

        def value(pos, vt, depth=0):
            sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
            if vt in sizes:
                return pos + sizes[vt]
            if vt == 8:
                return string(pos)
            if vt != 9 or depth > 3:
                raise ValueError
            fields.append((pos, 4, "vtype"))
            fields.append((pos + 4, 8, "count"))
            et, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            if count > n:
                raise ValueError
            for _ in range(count):
                pos = value(pos, et, depth + 1)
            return pos

        for _ in range(min(n_kv, 1000)):
            pos = string(pos)
            fields.append((pos, 4, "vtype"))
            (vt,) = struct.unpack_from("<I", data, pos)
            if vt == 4 and pos + 8 <= n:
                fields.append((pos + 4, 4, "u32"))       # e.g. general.alignment, block counts
            pos = value(pos + 4, vt)
        for _ in range(min(n_tensors, 1000)):
            pos = string(pos)
            fields.append((pos, 4, "rank"))
            (nd,) = struct.unpack_from("<I", data, pos)
            if nd > 8:
                raise ValueError
            pos += 4
            for _ in range(nd):
                fields.append((pos, 8, "dim"))
                pos += 8
            fields.append((pos, 4, "ggml_type"))
            fields.append((pos + 4, 8, "offset"))
            pos += 12
    except (ValueError, struct.error):
        pass
    return [f for f in fields if f[0] + f[1] <= n]


_GGUF_VALUES = {
    "vtype": [0, 4, 7, 8, 9, 10, 12, 13, 255, 2 ** 32 - 1],
    "ggml_type": [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 15, 20, 23, 30, 31, 35, 39, 99, 2 ** 31],
    "rank": [0, 1, 2, 3, 4, 5, 64, 2 ** 32 - 1],
    "version": [0, 1, 2, 3, 4, 0x03000000],
    "dim": [0, 1, 2, 31, 32, 33, 256, 2 ** 31, 2 ** 32, 2 ** 40, 2 ** 62, 2 ** 63, 2 ** 64 - 1],
    "offset": [0, 1, 4, 8, 31, 32, 64, 96, 2 ** 32, 2 ** 63, 2 ** 64 - 1],
    "u32": [0, 1, 2, 3, 8, 16, 64, 4096, 2 ** 31, 2 ** 32 - 1],
}


def mutate_gguf(rng: random.Random, data: bytes, seeds) -> bytes:
    """Rewrite one to three of the file's integer fields (``gguf_fields``) with values that
    stress the reader, sometimes truncate or extend the file; or byte-level havoc."""
    fields = gguf_fields(data) if len(data) >= 24 else []
    if rng.random() < 0.3 or not fields:
        return havoc(rng, data)
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        off, size, kind = rng.choice(fields)
        old = int.from_bytes(b[off:off + size], "little")
        r = rng.random()
        if r < 0.5 and kind in _GGUF_VALUES:
            v = rng.choice(_GGUF_VALUES[kind])
        elif r < 0.8:
            v = old + rng.choice((-1, 1, -2, 2, 8, -8, 32, -32, 1000))
        else:
            v = rng.choice(INTERESTING_INTS)
        b[off:off + size] = (v % (1 << (8 * size))).to_bytes(size, "little")
    if rng.random() < 0.15:
        del b[rng.randint(0, len(b)):]                # truncate
    elif rng.random() < 0.1:
        b += bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 32, 300))))
    return bytes(b)

# ---- protobuf (ONNX) ------------------------------------------------------------------------

def _varint(buf, pos):
    v = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError
        c = buf[pos]
        pos += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, pos


def _enc_varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        c = v & 0x7F
        v >>= 7
        if v:
            out.append(c | 0x80)
        else:
            out.append(c)
            return bytes(out)


def pb_parse(buf: bytes):
    """[(field, wire type, value)] or None when ``buf`` is not a clean message."""
    fields, pos = [], 0
    try:
        while pos < len(buf):
            key, pos = _varint(buf, pos)
            fno, wt = key >> 3, key & 7
            if fno == 0:
                return None
            if wt == 0:
                v, pos = _varint(buf, pos)
            elif wt == 1:
                v, pos = buf[pos:pos + 8], pos + 8
            elif wt == 5:
                v, pos = buf[pos:pos + 4], pos + 4
            elif wt == 2:
                n, pos = _varint(buf, pos)
                if pos + n > len(buf):
                    return None
                v, pos = buf[pos:pos + n], pos + n
            else:
                return None
            if pos > len(buf):
                return None
            fields.append([fno, wt, v])
    except ValueError:
        return None
    return fields


def pb_serialize(fields) -> bytes:
    out = bytearray()
    for fno, wt, v in fields:
        out += _enc_varint((fno << 3) | wt)
        if wt == 0:
            out += _enc_varint(v)
        elif wt == 2:
            out += _enc_varint(len(v)) + v
        else:
            out += v
    return bytes(out)


def _submessages(rng, fields, depth=0):
    """A random path of nested messages: [(fields, index)] from the top down."""
    path = []
    cur = fields
    while cur:
        i = rng.randrange(len(cur))
        path.append((cur, i))
        f = cur[i]
        if f[1] != 2 or depth > 12 or rng.random() < 0.3:
            break
        sub = f[2] if isinstance(f[2], list) else pb_parse(f[2])
        if not sub:
            break
        f[2] = sub            # parsed in place; serialized back on the way up
        cur = sub
        depth += 1
    return path


def _reserialize(fields):
    for f in fields:
        if f[1] == 2 and isinstance(f[2], list):
            _reserialize(f[2])
            f[2] = pb_serialize(f[2])


def _random_submessage(rng, seeds) -> bytes | None:
    _, data = rng.choice(seeds)
    fields = pb_parse(data)
    for _ in range(rng.randint(1, 4)):
        if not fields:
            return None
        f = rng.choice(fields)
        if f[1] != 2:
            return None
        if rng.random() < 0.4:
            return f[2]
        fields = pb_parse(f[2])
    return None


def mutate_onnx(rng: random.Random, data: bytes, seeds) -> bytes:
    fields = pb_parse(data)
    if fields is None or rng.random() < 0.2:
        return havoc(rng, data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        path = _submessages(rng, fields)
        if not path:
            break
        level, i = path[-1]
        f = level[i]
        op = rng.randrange(10)
        if f[1] == 0 and op < 5:
            f[2] = rng.choice([rng.choice(INTERESTING_INTS), (1 << 64) - rng.randint(1, 3), f[2] + rng.randint(-3, 3),
                               f[2] * rng.choice((2, 10, 1000))]) % (1 << 64)
        elif f[1] == 2 and not isinstance(f[2], list) and op < 3:
            v = f[2]
            # packed varints: change one, or append many
            vals = _packed(v)
            if vals is not None and vals and rng.random() < 0.6:
                if rng.random() < 0.5:
                    vals[rng.randrange(len(vals))] = rng.choice(INTERESTING_INTS + [(1 << 64) - 1])
                else:
                    vals += [rng.choice(INTERESTING_INTS)] * rng.choice((1, 10, 1000, 50_000))
                f[2] = b"".join(_enc_varint(x) for x in vals)
            else:
                f[2] = havoc(rng, v) if v else bytes([rng.randrange(256)])
        elif f[1] in (1, 5) and op < 5:
            f[2] = rng.choice([b"\xff" * len(f[2]), b"\x00" * len(f[2]), havoc(rng, f[2], 1)[:len(f[2])].ljust(len(f[2]), b"\0"),
                               struct.pack("<f", rng.choice((float("nan"), float("inf"), 1e38, -0.0)))[:len(f[2])]
                               .ljust(len(f[2]), b"\0")])
        elif op == 5:
            del level[i]
        elif op == 6:
            k = rng.choice((2, 3, 8, 50, 500))
            level[i:i + 1] = [list(f) for _ in range(k)]   # repeated field amplification
        elif op == 7:
            sub = _random_submessage(rng, seeds)
            if sub is not None:
                level.insert(rng.randrange(len(level) + 1), [f[0], 2, sub])
        elif op == 8 and len(level) > 1:
            j = rng.randrange(len(level))
            level[i], level[j] = level[j], level[i]
        else:
            level.append([rng.choice((1, 2, 3, 4, 5, 7, 8, 10, 11, 12, 13, 14, 20)), rng.choice((0, 2)),
                          rng.choice(INTERESTING_INTS) if rng.random() < 0.5 else b""])
            if level[-1][1] == 2 and not isinstance(level[-1][2], bytes):
                level[-1][2] = b""
            if level[-1][1] == 0 and isinstance(level[-1][2], bytes):
                level[-1][2] = 1
    _reserialize(fields)
    out = pb_serialize(fields)
    return havoc(rng, out, 1) if rng.random() < 0.1 else out


def _packed(v: bytes):
    vals, pos = [], 0
    try:
        while pos < len(v):
            x, pos = _varint(v, pos)
            vals.append(x)
    except ValueError:
        return None
    return vals


# ---- PyTorch checkpoints ----------------------------------------------------------------------

_INT_OPS = {"BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG"}


def _pickle_int(v: int) -> bytes:
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if -(2 ** 31) <= v < 2 ** 31:
        return b"J" + struct.pack("<i", v)
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def mutate_pickle(rng: random.Random, pkl: bytes) -> bytes:
    try:
        ops = list(pickletools.genops(pkl))
    except Exception:  # noqa: BLE001 - a broken pickle: bytes only
        return havoc(rng, pkl)
    spans = []
    for k, (op, arg, pos) in enumerate(ops):
        end = ops[k + 1][2] if k + 1 < len(ops) else len(pkl)
        spans.append((op.name, arg, pos, end))
    name, arg, pos, end = rng.choice(spans)
    r = rng.random()
    ints = [s for s in spans if s[0] in _INT_OPS]
    if ints and r < 0.45:
        name, arg, pos, end = rng.choice(ints)
        v = rng.choice(INTERESTING_INTS + [-1, -(2 ** 31), 10 ** 5, 10 ** 10, (arg or 0) + rng.randint(-2, 2)])
        return pkl[:pos] + _pickle_int(v if rng.random() < 0.9 else -v) + pkl[end:]
    if r < 0.55:
        glob_spans = [s for s in spans if s[0] == "GLOBAL"]
        if glob_spans:
            name, arg, pos, end = rng.choice(glob_spans)
            repl = rng.choice(["torch._utils\n_rebuild_tensor_v2", "torch\nFloatStorage", "torch\nLongStorage",
                               "torch\nBoolStorage", "torch\nBFloat16Storage", "torch\nDoubleStorage",
                               "collections\nOrderedDict", "torch._utils\n_rebuild_parameter", "builtins\nset",
                               "torch\nUntypedStorage", "torch\nHalfStorage"])
            return pkl[:pos] + b"c" + repl.encode() + b"\n" + pkl[end:]
    if r < 0.7:   # repeat a run of opcodes (amplification), or delete one
        j = rng.randrange(len(spans))
        k = min(len(spans) - 1, j + rng.randint(0, 6))
        chunk = pkl[spans[j][2]:spans[k][3]]
        if rng.random() < 0.5:
            return pkl[:spans[j][2]] + chunk * rng.choice((2, 3, 20)) + pkl[spans[j][2]:]
        return pkl[:spans[j][2]] + pkl[spans[k][3]:]
    return havoc(rng, pkl)


def mutate_legacy_pt(rng: random.Random, data: bytes) -> bytes:
    """The pre-1.6 stream: mutate one of its five pickles (the object one most often), or the
    storage records after them (counts and bytes)."""
    stream, cuts = io.BytesIO(data), [0]
    try:
        for _ in range(5):
            for _op in pickletools.genops(stream):
                pass
            cuts.append(stream.tell())
    except Exception:  # noqa: BLE001 - already broken: bytes only
        return havoc(rng, data)
    parts = [data[a:b] for a, b in zip(cuts, cuts[1:])] + [data[cuts[-1]:]]
    r = rng.random()
    if r < 0.6:
        k = 3 if rng.random() < 0.6 else rng.randrange(5)
        parts[k] = mutate_pickle(rng, parts[k])
    elif r < 0.85 and parts[5]:
        tail = parts[5]
        if rng.random() < 0.5 and len(tail) >= 8:   # rewrite the first record's element count
            parts[5] = _pickle_int_le(rng.choice(INTERESTING_INTS + [-1, 2 ** 62])) + tail[8:]
        else:
            parts[5] = rng.choice([tail[:rng.randrange(len(tail) + 1)], tail + bytes(rng.randint(1, 16)), havoc(rng, tail)])
    else:
        del parts[rng.randrange(6)]
    return b"".join(parts)


def _pickle_int_le(v: int) -> bytes:
    return (v % (1 << 64)).to_bytes(8, "little")


def mutate_pt(rng: random.Random, data: bytes, seeds) -> bytes:
    if rng.random() < 0.2:
        return havoc(rng, data)
    if data[:1] == b"\x80":
        return mutate_legacy_pt(rng, data)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    except Exception:  # noqa: BLE001
        return havoc(rng, data)
    for _ in range(rng.choice((1, 1, 2))):
        r = rng.random()
        pk = [k for k, (n, _) in enumerate(entries) if n.endswith("data.pkl")]
        if pk and r < 0.65:
            k = pk[0]
            entries[k] = (entries[k][0], mutate_pickle(rng, entries[k][1]))
        elif r < 0.8:
            st = [k for k, (n, _) in enumerate(entries) if "/data/" in n]
            if st:
                k = rng.choice(st)
                n, v = entries[k]
                entries[k] = (n, rng.choice([v[:rng.randrange(len(v) + 1)], v + bytes(rng.randint(1, 16)), havoc(rng, v)]))
        elif r < 0.9:
            k = rng.randrange(len(entries))
            n, v = entries[k]
            entries[k] = (rng.choice([n + "x", n.replace("archive", "a/b"), "../" + n, n.upper(), "/" + n]), v)
        else:
            entries.append((rng.choice(["archive/byteorder", "archive/data/9", "archive/constants.pkl", "x/data.pkl"]),
                            rng.choice([b"big", b"little", b"", b"\x80\x02}."])))
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as z:
        warnings.simplefilter("ignore")   # duplicate names are part of the point
        for n, v in entries:
            try:
                z.writestr(n, v)
            except Exception:  # noqa: BLE001 - an odd name zipfile refuses: skip it
                pass
    return buf.getvalue()


MUTATORS = {"safetensors": mutate_safetensors, "onnx": mutate_onnx, "pt": mutate_pt, "gguf": mutate_gguf,
            "remote": lambda rng, data, seeds: fuzz_remote.mutate(rng, data, seeds, havoc)}


def mutate(fmt: str, rng: random.Random, data: bytes, seeds) -> bytes:
    """One mutant of ``data``; a structure-aware mutator that chokes on an earlier mutant (deep
    JSON, odd pickles) falls back to byte-level havoc."""
    try:
        return MUTATORS[fmt](rng, data, seeds)
    except (Exception, RecursionError):  # noqa: BLE001
        return havoc(rng, data)


# ---- running one case -----------------------------------------------------------------------

_ONNX_DTYPES = {1: "float32", 10: "float16", 6: "int32", 7: "int64", 2: "uint8", 9: "bool"}


_PHASE: dict = {"out": None, "name": "load", "t": 0.0}


def _phase(name: str) -> None:
    """Mark the start of a phase ("load", then "run" for ONNX): the parent reads it from the
    pipe, so a case killed for time says which phase it was in."""
    _PHASE["name"], _PHASE["t"] = name, time.perf_counter()
    if _PHASE["out"] is not None:
        _PHASE["out"].write(f"phase:{name}\n")
        _PHASE["out"].flush()


def run_case(fmt: str, data: bytes) -> str:
    """Run one input the way a user would; return a short description of what it gave."""
    import ember

    if fmt == "safetensors":
        sd = ember.load_safetensors(data)
        total = 0
        for name in sd:
            total += sd[name].shape.__len__()
        return f"{len(sd)} tensors"
    if fmt == "pt":
        obj = ember.load_torch(data)
        return type(obj).__name__
    if fmt == "remote":
        return fuzz_remote.run(data)
    if fmt == "gguf":
        f = ember.load_gguf(data)
        repr(f.metadata)
        for name in f.tensors:
            f.tensor(name, device="python", dequantize=True)
        return f"{len(f.tensors)} tensors"
    m = ember.onnx.load(data, base_dir=os.path.join(REPO, "tests", "fixtures", "onnx"))
    feeds = []
    for vi in m.inputs:
        shape = tuple(d if isinstance(d, int) and 0 <= d <= 64 else (1 if i == 0 else 2)
                      for i, d in enumerate(vi.shape or ()))
        dt = _ONNX_DTYPES.get(getattr(vi, "elem_type", 1), "float32")
        feeds.append(ember.zeros(shape, dtype=dt))
    _phase("run")
    m(*feeds)
    return "ran"


def _child(fmt: str, data: bytes, wfd: int, mem_bytes: int, timeout: float) -> None:
    """In the forked child: cap memory, run, report one JSON line on ``wfd``, exit."""
    import faulthandler

    import ember
    from ember.errors import EmberError

    out = os.fdopen(wfd, "w")
    try:
        vsz = _vm_size()
        cap = vsz + mem_bytes
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        ember.set_max_tensor_bytes(mem_bytes // 4)
        # Shortly before the parent kills a case, say where it is.
        faulthandler.dump_traceback_later(max(timeout - 0.7, 0.5), exit=True, file=out)
        _PHASE["out"] = out
        t0 = time.perf_counter()
        _PHASE["name"], _PHASE["t"] = "load", t0
        kind, etype, where, msg = "ok", "", "", ""
        try:
            msg = run_case(fmt, data)[:100]
        except EmberError as e:
            kind, etype, msg = "ember", type(e).__name__, str(e)[:300]
        except BaseException as e:  # noqa: BLE001 - the whole point: anything that is not ember's
            kind, etype, msg = "other", type(e).__name__, str(e)[:300]
            where = _where(e.__traceback__)
        end = time.perf_counter()
        elapsed = end - t0
        faulthandler.cancel_dump_traceback_later()
        phase = _PHASE["name"]
        load_s = (_PHASE["t"] if phase == "run" else end) - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out.write(json.dumps({"kind": kind, "etype": etype, "where": where, "msg": msg, "elapsed": elapsed,
                              "load_s": load_s, "phase": phase, "maxrss": rss}) + "\n")
        out.flush()
    finally:
        os._exit(0)


def _where(tb) -> str:
    frames = traceback.extract_tb(tb)
    ember_frames = [f for f in frames if f"{os.sep}core{os.sep}" in f.filename or f"{os.sep}ember{os.sep}" in f.filename]
    f = (ember_frames or frames or [None])[-1]
    if f is None:
        return "?"
    return f"{os.path.relpath(f.filename, REPO) if f.filename.startswith(REPO) else os.path.basename(f.filename)}:{f.lineno} ({f.name})"


def _vm_size() -> int:
    try:
        with open("/proc/self/status") as f:
            for ln in f:
                if ln.startswith("VmSize:"):
                    return int(ln.split()[1]) * 1024
    except OSError:
        pass
    return 512 << 20


def _where_from_dump(text: str) -> str:
    """The innermost ember frame of a faulthandler dump ('File "...", line N in fn')."""
    best = ""
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith("File ") and (f"{os.sep}core{os.sep}" in ln or f"{os.sep}ember{os.sep}" in ln):
            try:
                path = ln.split('"')[1]
                rest = ln.split('", line ')[1]
                lineno, _, fn = rest.partition(" in ")
                best = best or f"{os.path.relpath(path, REPO)}:{lineno} ({fn})"   # faulthandler: innermost first
            except IndexError:
                continue
    return best or "?"


class Runner:
    """Forks cases, ``jobs`` at a time, and collects their outcomes."""

    def __init__(self, jobs: int, mem_bytes: int, timeout: float):
        self.jobs, self.mem_bytes, self.timeout = jobs, mem_bytes, timeout
        self.running: dict = {}   # pid -> (rfd, started, payload, chunks)

    def submit(self, fmt: str, data: bytes, payload) -> None:
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            try:
                _child(fmt, data, wfd, self.mem_bytes, self.timeout)
            finally:
                os._exit(1)
        os.close(wfd)
        self.running[pid] = (rfd, time.monotonic(), payload, [])

    def collect(self, block: bool = True):
        """Yield (payload, outcome dict) for finished cases."""
        done = []
        while self.running and not done:
            fds = {v[0]: pid for pid, v in self.running.items()}
            ready, _, _ = select.select(list(fds), [], [], 0.05 if block else 0)
            now = time.monotonic()
            for fd in ready:
                pid = fds[fd]
                chunk = os.read(fd, 65536)
                if chunk:
                    self.running[pid][3].append(chunk)
                    continue
                done.append((pid, None))
            for pid, (fd, started, _, _) in list(self.running.items()):
                if now - started > self.timeout and all(p != pid for p, _ in done):
                    os.kill(pid, signal.SIGKILL)
                    done.append((pid, "killed"))
            if not block:
                break
        for pid, why in done:
            fd, started, payload, chunks = self.running.pop(pid)
            elapsed = time.monotonic() - started
            try:
                while True:
                    c = os.read(fd, 65536)
                    if not c:
                        break
                    chunks.append(c)
            except OSError:
                pass
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            text = b"".join(chunks).decode("utf-8", "replace")
            outcome = None
            for ln in text.splitlines():
                if ln.startswith("{"):
                    try:
                        outcome = json.loads(ln)
                    except ValueError:
                        pass
            if outcome is None:
                kind = "timeout" if (why == "killed" or "Timeout" in text or "Thread" in text) else "crash"
                phase = "run" if "phase:run" in text else "load"
                outcome = {"kind": kind, "etype": "", "where": _where_from_dump(text),
                           "msg": f"exit status {status}" if kind == "crash" else f"over {self.timeout:g} s",
                           "elapsed": elapsed, "load_s": elapsed if phase == "load" else None, "phase": phase,
                           "maxrss": 0}
            yield payload, outcome


def signature(fmt: str, o: dict):
    """What groups findings: format, kind (with the phase for ONNX), exception type, place."""
    phase = o.get("phase", "load")
    tag = (lambda k: f"{k}-{phase}") if fmt == "onnx" else (lambda k: k)
    if o["kind"] in ("ok", "ember"):
        return None if o["elapsed"] <= SLOW_SECONDS else (fmt, tag("slow"), "", "")
    return (fmt, tag(o["kind"]), o["etype"], o["where"])


# ---- shrinking an ONNX reproducer -------------------------------------------------------------

def shrink_onnx(data: bytes, sig, runner_args, budget_s: float = 20.0) -> bytes:
    """Remove protobuf fields (depth first, then byte ranges) while the case keeps ``sig``."""
    jobs_runner = Runner(1, *runner_args)
    deadline = time.monotonic() + budget_s

    def same(candidate: bytes) -> bool:
        jobs_runner.submit("onnx", candidate, None)
        for _, o in jobs_runner.collect():
            return signature("onnx", o) == sig
        return False

    def shrink_fields(msg: bytes, rebuild) -> bytes:
        fields = pb_parse(msg)
        if not fields:
            return msg
        i = 0
        while i < len(fields) and time.monotonic() < deadline:
            trial = fields[:i] + fields[i + 1:]
            if same(rebuild(pb_serialize(trial))):
                fields = trial
                continue
            i += 1
        # then inside each remaining message field
        for i in range(len(fields)):
            if time.monotonic() > deadline:
                break
            fno, wt, v = fields[i]
            if wt == 2 and pb_parse(v):
                def inner(sub, i=i, fields=fields):
                    f2 = [list(f) for f in fields]
                    f2[i][2] = sub
                    return rebuild(pb_serialize(f2))
                fields[i][2] = shrink_fields(v, inner)
        return pb_serialize(fields)

    out = shrink_fields(data, lambda b: b)
    return out if same(out) else data


# ---- the campaign ---------------------------------------------------------------------------

def _new_stats(formats) -> dict:
    return {f: {"cases": 0, "ok": 0, "ember_errors": 0, "non_ember": 0, "over_2s": 0, "timeouts": 0,
                "crashes": 0, "over_2s_at_run_time": 0, "max_seconds": 0.0, "max_load_seconds": 0.0,
                "peak_rss_mib": 0.0, "errors": {}, "findings": {}} for f in formats}


def _campaign(formats, seeds, rng, runner, jobs, cases, t_end, progress, tag=""):
    """Mutate and run cases (``cases``: {format: count}, or None to run until ``t_end``), the
    formats in turn; returns (stats, findings)."""
    stats = _new_stats(formats)
    findings: dict = {}
    submitted = 0
    started = last_print = time.monotonic()

    def handle(payload, o):
        fmt, data = payload
        s = stats[fmt]
        s["cases"] += 1
        s["max_seconds"] = max(s["max_seconds"], round(o["elapsed"], 3))
        if o.get("load_s") is not None:
            s["max_load_seconds"] = max(s["max_load_seconds"], round(o["load_s"], 3))
        s["peak_rss_mib"] = max(s["peak_rss_mib"], round(o["maxrss"] / 2 ** 20, 1))
        if o["kind"] == "ok":
            s["ok"] += 1
        elif o["kind"] == "ember":
            s["ember_errors"] += 1
            s["errors"][o["etype"]] = s["errors"].get(o["etype"], 0) + 1
        elif o["kind"] == "other":
            s["non_ember"] += 1
        elif o["kind"] == "timeout":
            s["timeouts"] += 1
        else:
            s["crashes"] += 1
        if o["elapsed"] > SLOW_SECONDS:
            s["over_2s"] += 1
            if o.get("phase") == "run":
                s["over_2s_at_run_time"] += 1
        sig = signature(fmt, o)
        if sig is not None:
            key = " | ".join(x for x in sig if x)
            s["findings"][key] = s["findings"].get(key, 0) + 1
            if key not in findings or (_slowest_wins(sig) and o["elapsed"] > findings[key]["outcome"]["elapsed"]):
                findings[key] = {"sig": sig, "data": data, "outcome": o}

    left = dict(cases) if cases is not None else None
    turn = 0
    while True:
        if left is not None and not any(left.values()):
            break
        if t_end is not None and time.monotonic() > t_end:
            break
        while len(runner.running) >= jobs:
            for payload, o in runner.collect():
                handle(payload, o)
        fmt = formats[turn % len(formats)]
        turn += 1
        if left is not None:
            if not left.get(fmt):
                continue
            left[fmt] -= 1
        _, base = rng.choice(seeds[fmt])
        data = mutate(fmt, rng, base, seeds[fmt])
        if rng.random() < 0.15:   # stack mutations now and then
            data = mutate(fmt, rng, data, seeds[fmt])
        runner.submit(fmt, data, (fmt, data))
        submitted += 1
        if progress and time.monotonic() - last_print > 10:
            last_print = time.monotonic()
            print(f"[fuzz]{tag} {submitted} cases, {submitted / (last_print - started):.0f}/s, "
                  f"findings {sum(len(s['findings']) for s in stats.values())}", flush=True)
    while runner.running:
        for payload, o in runner.collect():
            handle(payload, o)
    return stats, findings


def _slowest_wins(sig) -> bool:
    """Slow cases (no exception, no place) share one signature: keep the slowest, not the first."""
    return sig[1].startswith("slow")


def _merge(into: dict, stats: dict) -> None:
    for fmt, s in stats.items():
        t = into[fmt]
        for k, v in s.items():
            if k in ("errors", "findings"):
                for kk, n in v.items():
                    t[k][kk] = t[k].get(kk, 0) + n
            elif k.startswith(("max_", "peak_")):
                t[k] = max(t[k], v)
            else:
                t[k] += v


def _sharded(formats, seeds, jobs, seed, mem_bytes, timeout, cases, t_end, progress):
    """``jobs`` forked worker processes, each mutating and running its share of the cases (one
    forked child per case, as with one job), so the parent is no bottleneck on many cores."""
    import pickle
    import tempfile

    tmp = tempfile.mkdtemp(prefix="ember-fuzz-")
    pids = {}
    for k in range(jobs):
        share = None if cases is None else {f: cases // jobs + (k < cases % jobs) for f in formats}
        path = os.path.join(tmp, f"shard{k}.pkl")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                rng = random.Random(f"{seed}:{k}")
                # the shards start the format cycle at different formats (a time-limited run
                # stays balanced)
                order = tuple(formats[k % len(formats):]) + tuple(formats[:k % len(formats)])
                res = _campaign(order, seeds, rng, Runner(1, mem_bytes, timeout), 1, share, t_end,
                                progress and k == 0, tag=f" shard 0 of {jobs}:")
                with open(path, "wb") as fh:
                    pickle.dump(res, fh)
                code = 0
            finally:
                os._exit(code)
        pids[pid] = path
    stats, findings, lost = _new_stats(formats), {}, 0
    for pid, path in pids.items():
        os.waitpid(pid, 0)
        try:
            with open(path, "rb") as fh:
                st, fi = pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError):
            lost += 1
            continue
        _merge(stats, st)
        for key, f in fi.items():
            if key not in findings or (_slowest_wins(f["sig"]) and
                                       f["outcome"]["elapsed"] > findings[key]["outcome"]["elapsed"]):
                findings[key] = f
        os.unlink(path)
    os.rmdir(tmp) if not os.listdir(tmp) else None
    if lost:
        print(f"[fuzz] {lost} of {jobs} shards died without a report", flush=True)
    return stats, findings


def fuzz(formats=FORMATS, *, cases: int | None = None, minutes: float | None = None, jobs: int = 2, seed: int = 0,
         mem_mib: int = 1024, timeout: float = 10.0, out_dir: str | None = None, minimize: bool = True,
         onnx_findings_dir: str | None = None, progress: bool = False) -> dict:
    """Run the fuzzers; return the report (per format: cases, outcomes, findings, peak memory).
    ``cases`` is per format. With ``jobs`` > 1 the cases are split over that many forked worker
    processes (each runs its cases one at a time, every case in its own forked child)."""
    import warnings

    warnings.simplefilter("ignore")   # mutated models warn a lot (e.g. shapes checked at run time)
    _import_ember()     # imported before forking, so every child starts warm
    import ember.onnx  # noqa: F401

    seeds = load_seeds()
    for fmt in formats:
        if not seeds[fmt]:
            raise SystemExit(f"fuzz: no seeds for {fmt}")
        for _, s in seeds[fmt]:   # warm up lazily imported code paths in the parent
            try:
                run_case(fmt, s)
            except Exception:  # noqa: BLE001
                pass
    t_end = time.monotonic() + minutes * 60 if minutes else None
    started = time.monotonic()
    if jobs > 1:
        stats, findings = _sharded(tuple(formats), seeds, jobs, seed, mem_mib << 20, timeout, cases, t_end, progress)
    else:
        stats, findings = _campaign(formats, seeds, random.Random(seed), Runner(1, mem_mib << 20, timeout), 1,
                                    None if cases is None else {f: cases for f in formats}, t_end, progress)
    total_s = time.monotonic() - started

    saved = []
    for key, f in findings.items():
        fmt = f["sig"][0]
        folder = onnx_findings_dir if (fmt == "onnx" and onnx_findings_dir) else out_dir
        if not folder:
            continue
        os.makedirs(folder, exist_ok=True)
        data = f["data"]
        if fmt == "onnx" and minimize and not f["sig"][1].startswith(("slow", "timeout")):
            data = shrink_onnx(data, f["sig"], (mem_mib << 20, timeout))
        name = "_".join(x for x in f["sig"] if x)
        name = "".join(c if c.isalnum() or c in "-." else "_" for c in name)[:120]
        ext = {"safetensors": ".safetensors", "onnx": ".onnx", "pt": ".pt", "gguf": ".gguf", "remote": ".frame"}[fmt]
        path = os.path.join(folder, name + ext)
        with open(path, "wb") as fh:
            fh.write(data)
        with open(path + ".txt", "w") as fh:
            fh.write(f"{key}\n{f['outcome']['msg']}\n({len(data)} bytes; found with seed {seed})\n")
        saved.append(os.path.relpath(path, REPO))
    return {"seconds": round(total_s, 1), "jobs": jobs, "mem_mib": mem_mib, "timeout_s": timeout, "seed": seed,
            "cases_per_second": round(sum(s["cases"] for s in stats.values()) / max(total_s, 1e-9), 1),
            "formats": stats, "saved": saved}


def replay(paths, mem_mib: int = 1024, timeout: float = 10.0) -> int:
    """Run saved inputs again (e.g. tests/fuzz/onnx_findings/*.onnx) the way the fuzzer does."""
    import warnings

    warnings.simplefilter("ignore")
    _import_ember()
    import ember.onnx  # noqa: F401

    ext = {".safetensors": "safetensors", ".onnx": "onnx", ".pt": "pt", ".gguf": "gguf"}
    runner, bad = Runner(1, mem_mib << 20, timeout), 0
    for p in paths:
        fmt = ext.get(os.path.splitext(p)[1])
        if fmt is None:
            continue
        with open(p, "rb") as f:
            runner.submit(fmt, f.read(), p)
        for _, o in runner.collect():
            sig = signature(fmt, o)
            bad += sig is not None
            print(f"{p}: {'FINDING ' + ' | '.join(x for x in sig if x) if sig else 'fine'} "
                  f"({o['kind']} {o['etype']} {o['elapsed']:.2f} s) {o['msg'][:150]}", flush=True)
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fuzz", description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--minutes", type=float, help="run for this long in all (default: 1)")
    g.add_argument("--cases", type=int, help="run this many cases per format")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--jobs", type=int, default=max(1, min(os.cpu_count() or 1, 2)))
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--mem-mib", type=int, default=1024, help="address space each case may add (MiB)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds before a case is killed")
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fuzz", "findings"),
                    help="where inputs of new findings go (ONNX ones: tests/fuzz/onnx_findings/)")
    ap.add_argument("--onnx-out", default=os.path.join(HERE, "onnx_findings"),
                    help="where ONNX findings go (shrunk unless --no-minimize)")
    ap.add_argument("--no-minimize", action="store_true")
    ap.add_argument("--json", help="write the report here too")
    ap.add_argument("--replay", nargs="+", metavar="FILE",
                    help="run these files (format from the extension) and print what each gives")
    a = ap.parse_args(argv)
    if a.replay:
        return replay(a.replay, a.mem_mib, a.timeout)
    formats = tuple(f.strip() for f in a.formats.split(",") if f.strip())
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        ap.error(f"unknown format(s) {bad}; have {', '.join(FORMATS)}")
    minutes = a.minutes if a.cases is None else None
    if a.cases is None and minutes is None:
        minutes = 1.0
    report = fuzz(formats, cases=a.cases, minutes=minutes, jobs=a.jobs, seed=a.seed, mem_mib=a.mem_mib,
                  timeout=a.timeout, out_dir=a.out, minimize=not a.no_minimize,
                  onnx_findings_dir=a.onnx_out, progress=True)
    text = json.dumps(report, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    bad_total = sum(s["non_ember"] + s["timeouts"] + s["crashes"] + s["over_2s"] for s in report["formats"].values())
    print(f"[fuzz] {sum(s['cases'] for s in report['formats'].values())} cases, {bad_total} findings "
          f"(non-ember exceptions, timeouts, crashes, cases over {SLOW_SECONDS:g} s)", flush=True)
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main())
