"""Quantized weights: the GGUF block formats as data, and ``QTensor``, a weight kept in them.

``FORMATS`` is the one table every backend works from (like ggml's type traits): for each
format its ggml type number, how many elements one block holds, how many bytes it takes, and
the pure-Python reference ``dequantize(raw) -> array('f')``, the specification every kernel
(python, numpy, wasm, webgpu) is tested against, itself tested against the ``gguf`` package.
Formats: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (blocks of 32), q2_k, q3_k, q4_k, q5_k,
q6_k, iq4_xs (super-blocks of 256); every backend has a kernel for each.

A quantized weight of ``n`` rows of ``k`` elements is stored as an **int32 tensor, 1-D, of
``ceil(n * row_bytes(qtype, k) / 4)`` words** holding the raw block bytes of its rows back to
back (little-endian, zero padded to a whole word): every backend stores int32 at 4 bytes per
element, so the weight stays as small on the device as in the file. ``QTensor`` wraps those
words with the format and the logical shape; the registry ops ``dequantize``, ``qlinear`` and
``qembedding`` (``ember.ops.quant``) consume them without expanding the weight to float.

>>> import ember
>>> from ember import quant
>>> w = quant.QTensor.quantize(ember.tensor([[1.0] * 32, [-2.0] * 32]), "q4_0")
>>> w
QTensor(q4_0, shape=(2, 32), device='python')
>>> quant.linear(ember.ones((1, 32)), w).tolist()
[[32.0, -64.0]]
>>> quant.FORMATS["q4_1"].block, quant.FORMATS["q4_1"].nbytes, quant.row_bytes("q4_1", 576)
(32, 20, 360)
"""
from __future__ import annotations

import struct
from array import array
from math import prod, trunc
from typing import Callable, NamedTuple

from . import dtypes as _dt
from .errors import DTypeError, ShapeError, WeightsError

__all__ = ["QFormat", "FORMATS", "GGML_TYPES", "row_bytes", "words", "quantize", "QTensor",
           "linear", "embedding", "dequantize"]

_HALF = struct.Struct("<e")
_HALF2 = struct.Struct("<ee")


def _half_at(raw, off: int) -> float:
    return _HALF.unpack_from(raw, off)[0]


# ---- reference dequantization, one function per format ----------------------------------------
# Every value is computed exactly in Python floats (float64) and rounded once to float32 when it
# is stored in the array('f'); the products and sums involved need at most 51 significant bits,
# so this is the value ggml's float32 arithmetic gives too (one rounding of the exact result).

def _deq_f32(raw) -> array:
    out = array("f")
    out.frombytes(bytes(raw))
    return out


def _deq_f16(raw) -> array:
    return array("f", struct.unpack(f"<{len(raw) // 2}e", raw))


def _deq_bf16(raw) -> array:
    # a bfloat16 is the high half of a float32: two zero bytes below each value
    raw = bytes(raw)
    wide = bytearray(2 * len(raw))
    wide[2::4] = raw[0::2]
    wide[3::4] = raw[1::2]
    out = array("f")
    out.frombytes(bytes(wide))
    return out


def _deq_q8_0(raw) -> array:
    # block: d (f16), 32 x int8 q; x = d * q
    out = array("f")
    for off in range(0, len(raw), 34):
        d = _half_at(raw, off)
        out.extend([d * q for q in struct.unpack_from("<32b", raw, off + 2)])
    return out


def _deq_q4_0(raw) -> array:
    # block: d (f16), 16 bytes of nibbles; element j is the low nibble of byte j, element j + 16
    # its high nibble; x = d * (nibble - 8)
    out = array("f")
    for off in range(0, len(raw), 18):
        d = _half_at(raw, off)
        qs = bytes(raw[off + 2:off + 18])
        out.extend([d * ((b & 15) - 8) for b in qs])
        out.extend([d * ((b >> 4) - 8) for b in qs])
    return out


def _deq_q4_1(raw) -> array:
    # block: d (f16), m (f16), 16 bytes of nibbles (as q4_0); x = d * nibble + m
    out = array("f")
    for off in range(0, len(raw), 20):
        d, m = _HALF2.unpack_from(raw, off)
        qs = bytes(raw[off + 4:off + 20])
        out.extend([d * (b & 15) + m for b in qs])
        out.extend([d * (b >> 4) + m for b in qs])
    return out


def _deq_q5_0(raw) -> array:
    # block: d (f16), qh (32 bits, little-endian: bit j is the 5th bit of element j), 16 bytes
    # of nibbles (as q4_0); x = d * (nibble | fifth bit << 4) - 16)
    out = array("f")
    for off in range(0, len(raw), 22):
        d = _half_at(raw, off)
        qh = int.from_bytes(raw[off + 2:off + 6], "little")
        qs = bytes(raw[off + 6:off + 22])
        out.extend([d * (((b & 15) | ((qh >> j) & 1) << 4) - 16) for j, b in enumerate(qs)])
        out.extend([d * (((b >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16) for j, b in enumerate(qs)])
    return out


def _deq_q5_1(raw) -> array:
    # block: d (f16), m (f16), qh (32 bits, as q5_0's), 16 bytes of nibbles (as q4_0);
    # x = d * (nibble | fifth bit << 4) + m
    out = array("f")
    for off in range(0, len(raw), 24):
        d, m = _HALF2.unpack_from(raw, off)
        qh = int.from_bytes(raw[off + 4:off + 8], "little")
        qs = bytes(raw[off + 8:off + 24])
        out.extend([d * ((b & 15) | ((qh >> j) & 1) << 4) + m for j, b in enumerate(qs)])
        out.extend([d * ((b >> 4) | ((qh >> (j + 16)) & 1) << 4) + m for j, b in enumerate(qs)])
    return out


def _scale_min_k4(j: int, s) -> tuple:
    """Sub-block ``j`` (0..7) of a Q4_K/Q5_K block: its 6-bit scale and 6-bit min, packed in the
    12 ``scales`` bytes (the first four pairs in the low 6 bits of bytes 0..7, the last four in
    the nibbles of bytes 8..11 plus the top 2 bits of bytes 0..7)."""
    if j < 4:
        return s[j] & 63, s[j + 4] & 63
    return (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)


def _deq_k(raw, nbytes: int, qh_at: int | None) -> array:
    # Q4_K (144-byte blocks of 256): d, dmin (f16), 12 scale bytes, 128 bytes of nibbles. Four
    # chunks of 64 elements use 32 bytes each: the low nibbles are sub-block 2c, the high
    # nibbles 2c + 1; x = d * scale * q - dmin * min. Q5_K (176 bytes) has 32 bytes qh after the
    # scales: bit s of qh[l] is the 5th bit of element l of sub-block s.
    out = array("f")
    qs_at = 16 if qh_at is None else 48
    for off in range(0, len(raw), nbytes):
        d, dmin = _HALF2.unpack_from(raw, off)
        sc = bytes(raw[off + 4:off + 16])
        qs = bytes(raw[off + qs_at:off + qs_at + 128])
        qh = bytes(32) if qh_at is None else bytes(raw[off + qh_at:off + qh_at + 32])
        for c in range(4):
            q = qs[32 * c:32 * c + 32]
            s1, m1 = _scale_min_k4(2 * c, sc)
            s2, m2 = _scale_min_k4(2 * c + 1, sc)
            d1, n1, d2, n2 = d * s1, dmin * m1, d * s2, dmin * m2
            lo, hi = 2 * c, 2 * c + 1
            out.extend([d1 * ((b & 15) | ((h >> lo) & 1) << 4) - n1 for b, h in zip(q, qh)])
            out.extend([d2 * ((b >> 4) | ((h >> hi) & 1) << 4) - n2 for b, h in zip(q, qh)])
    return out


def _deq_q4_k(raw) -> array:
    return _deq_k(raw, 144, None)


def _deq_q5_k(raw) -> array:
    return _deq_k(raw, 176, 16)


def _deq_q6_k(raw) -> array:
    # block of 256: ql (128 bytes, low 4 bits), qh (64 bytes, high 2 bits), 16 int8 scales,
    # d (f16). Two halves of 128 elements; in each, element l + 32 * i (i = 0..3, l = 0..31) takes
    # its low nibble from ql[l + 32 * (i & 1)] (low nibble for i < 2, high nibble otherwise), its
    # top 2 bits from qh[l] >> 2i, and scale 16 elements wide; x = d * scale * (q - 32)
    out = array("f")
    for off in range(0, len(raw), 210):
        d = _half_at(raw, off + 208)
        scales = struct.unpack_from("<16b", raw, off + 192)
        for h in range(2):
            ql = bytes(raw[off + 64 * h:off + 64 * h + 64])
            qh = bytes(raw[off + 128 + 32 * h:off + 128 + 32 * h + 32])
            sc = scales[8 * h:8 * h + 8]
            for i in range(4):
                low = ql[32 * (i & 1):32 * (i & 1) + 32]
                shift = 4 if i >= 2 else 0
                out.extend([d * sc[i * 2 + (l >> 4)] * ((((b >> shift) & 15) | ((qh[l] >> (2 * i)) & 3) << 4) - 32)
                            for l, b in enumerate(low)])
    return out


def _q3_k_scales(s) -> list:
    """The 16 signed scales of a Q3_K block (``s``: its 12 scale bytes): the low 4 bits of scale
    g are nibble g // 8 of byte g % 8, its top 2 bits the bit pair g // 4 of byte 8 + g % 4; the
    stored 6-bit value is offset by 32."""
    return [(((s[g % 8] >> (4 * (g // 8))) & 15) | (((s[8 + g % 4] >> (2 * (g // 4))) & 3) << 4)) - 32
            for g in range(16)]


def _deq_q3_k(raw) -> array:
    # block of 256 (110 bytes): hmask (32), qs (64), 12 scale bytes, d (f16). Element
    # e = 128h + 32j + l (h = 0..1, j = 0..3, l = 0..31) takes bits 2j..2j+1 of qs[32h + l] and
    # its high bit from bit 4h + j of hmask[l]; a clear high bit subtracts 4; scale 16 elements
    # wide; x = d * scale * q, q in -4..3
    out = array("f")
    for off in range(0, len(raw), 110):
        hm = bytes(raw[off:off + 32])
        sc = _q3_k_scales(bytes(raw[off + 96:off + 108]))
        d = _half_at(raw, off + 108)
        for i in range(8):
            q = bytes(raw[off + 32 + 32 * (i // 4):off + 64 + 32 * (i // 4)])
            sh = 2 * (i % 4)
            out.extend([d * sc[2 * i + (l >> 4)] * (((b >> sh) & 3) - (0 if (hm[l] >> i) & 1 else 4))
                        for l, b in enumerate(q)])
    return out


def _deq_q2_k(raw) -> array:
    # block of 256 (84 bytes): 16 scale bytes (low nibble a scale, high nibble a min, each for 16
    # elements), qs (64), d, dmin (f16). Element 128h + 32j + l (as q3_k) takes bits 2j of
    # qs[32h + l]; x = d * scale * q - dmin * min
    out = array("f")
    for off in range(0, len(raw), 84):
        sc = bytes(raw[off:off + 16])
        d, dmin = _HALF2.unpack_from(raw, off + 80)
        for i in range(8):
            q = bytes(raw[off + 16 + 32 * (i // 4):off + 48 + 32 * (i // 4)])
            sh = 2 * (i % 4)
            s1, s2 = sc[2 * i], sc[2 * i + 1]
            d1, n1, d2, n2 = d * (s1 & 15), dmin * (s1 >> 4), d * (s2 & 15), dmin * (s2 >> 4)
            out.extend([d1 * ((b >> sh) & 3) - n1 for b in q[:16]])
            out.extend([d2 * ((b >> sh) & 3) - n2 for b in q[16:]])
    return out


# the 16 values a 4-bit index of IQ4_NL / IQ4_XS stands for (ggml's kvalues_iq4nl)
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _deq_iq4_nl(raw) -> array:
    # block: d (f16), 16 bytes of 4-bit indices (as q4_0's nibbles); x = d * IQ4_VALUES[index]
    out = array("f")
    t = IQ4_VALUES
    for off in range(0, len(raw), 18):
        d = _half_at(raw, off)
        qs = bytes(raw[off + 2:off + 18])
        out.extend([d * t[b & 15] for b in qs])
        out.extend([d * t[b >> 4] for b in qs])
    return out


def _deq_iq4_xs(raw) -> array:
    # block of 256 (136 bytes): d (f16), scales_h (u16), scales_l (4 bytes), 128 bytes of indices.
    # Sub-block s (32 elements, indices as iq4_nl's in bytes 16s..16s+15) has the 6-bit scale
    # (nibble s % 2 of scales_l[s // 2]) | (bits 2s..2s+1 of scales_h) << 4, stored + 32;
    # x = d * (scale - 32) * IQ4_VALUES[index]
    out = array("f")
    t = IQ4_VALUES
    for off in range(0, len(raw), 136):
        d = _half_at(raw, off)
        sh = int.from_bytes(raw[off + 2:off + 4], "little")
        sl = bytes(raw[off + 4:off + 8])
        for s in range(8):
            dl = d * ((((sl[s // 2] >> (4 * (s % 2))) & 15) | (((sh >> (2 * s)) & 3) << 4)) - 32)
            qs = bytes(raw[off + 8 + 16 * s:off + 24 + 16 * s])
            out.extend([dl * t[b & 15] for b in qs])
            out.extend([dl * t[b >> 4] for b in qs])
    return out


class QFormat(NamedTuple):
    """One block format: ``name`` (the key in ``FORMATS``), ``ggml_type`` (its number in GGUF
    files), ``block`` (elements per block), ``nbytes`` (bytes per block) and ``dequantize(raw)
    -> array('f')``, the reference dequantization of whole blocks."""

    name: str
    ggml_type: int
    block: int
    nbytes: int
    dequantize: Callable


FORMATS: dict = {f.name: f for f in (
    QFormat("f32", 0, 1, 4, _deq_f32),
    QFormat("f16", 1, 1, 2, _deq_f16),
    QFormat("bf16", 30, 1, 2, _deq_bf16),
    QFormat("q8_0", 8, 32, 34, _deq_q8_0),
    QFormat("q4_0", 2, 32, 18, _deq_q4_0),
    QFormat("q4_1", 3, 32, 20, _deq_q4_1),
    QFormat("q5_0", 6, 32, 22, _deq_q5_0),
    QFormat("q5_1", 7, 32, 24, _deq_q5_1),
    QFormat("q4_k", 12, 256, 144, _deq_q4_k),
    QFormat("q5_k", 13, 256, 176, _deq_q5_k),
    QFormat("q6_k", 14, 256, 210, _deq_q6_k),
    QFormat("q3_k", 11, 256, 110, _deq_q3_k),
    QFormat("q2_k", 10, 256, 84, _deq_q2_k),
    QFormat("iq4_nl", 20, 32, 18, _deq_iq4_nl),
    QFormat("iq4_xs", 23, 256, 136, _deq_iq4_xs),
)}

# Every ggml type number -> its ggml name (GGUF files name tensor types by number; the ones ember
# does not read are here so that errors can name them).
GGML_TYPES: dict = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_2", 5: "Q4_3", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
    9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}
BY_GGML_TYPE: dict = {f.ggml_type: f for f in FORMATS.values()}


def get_format(qtype: str) -> QFormat:
    """The ``QFormat`` named ``qtype`` (DTypeError listing the known ones otherwise)."""
    f = FORMATS.get(qtype) if isinstance(qtype, str) else None
    if f is None:
        raise DTypeError(f"unknown quantization format {qtype!r}; known: {', '.join(FORMATS)}")
    return f


def row_bytes(qtype: str, k: int) -> int:
    """Bytes of one row of ``k`` elements in format ``qtype`` (``k`` a multiple of its block).

    >>> row_bytes("q8_0", 64), row_bytes("f16", 3)
    (68, 6)
    """
    f = get_format(qtype)
    if k % f.block:
        raise ShapeError(f"{qtype}: a row of {k} elements is not a whole number of {f.block}-element blocks")
    return k // f.block * f.nbytes


def slice_granule(qtype: str) -> int:
    """Elements at which rows of ``qtype`` split into whole decoding items (the GPU kernels
    decode 8 elements at a time, items grouped so that a 32-element block format's (and a flat
    format's) 4 items fill [32j, 32j + 32), a K-quant's 8 fill [64j, 64j + 64)): a slice of a row
    at a multiple of this width is read without its neighbours (webgpu's ``attention_proj``
    reads one head's slice of the output projection).

    >>> slice_granule("q4_1"), slice_granule("q6_k")
    (32, 64)
    """
    return 32 if get_format(qtype).block in (1, 32) else 64


def words(qtype: str, n: int, k: int) -> int:
    """int32 words holding ``n`` rows of ``k`` elements in ``qtype``: ``ceil(n * row_bytes / 4)``."""
    return -(-n * row_bytes(qtype, k) // 4)


# ---- reference quantization (bit-exact with ggml / the gguf package) ---------------------------
# ggml quantizes in float32: each arithmetic step below is done in float64 and rounded to float32
# (exact for a single +, -, *, / of float32 operands), in the same order as ggml does it.

def _r32(v: float) -> float:
    return array("f", (v,))[0]


def _to_half(v: float) -> bytes:
    try:
        return _HALF.pack(v)
    except OverflowError:   # past the float16 range: ggml's cast gives +-inf
        return b"\x00\x7c" if v > 0 else b"\x00\xfc"


def _recip(d: float) -> float:
    return 0.0 if d == 0 else _r32(1.0 / d)


def _absmax_signed(xs) -> float:
    # the value of largest magnitude, the first one on ties (numpy's argmax)
    best = xs[0]
    for v in xs:
        if abs(v) > abs(best):
            best = v
    return best


def _pack_nibbles(q) -> bytes:
    h = len(q) // 2
    return bytes((q[j] & 15) | ((q[j + h] & 15) << 4) for j in range(h))


def _q_q8_0(xs) -> bytes:
    d = _r32(max(abs(v) for v in xs) / 127)
    i = _recip(d)
    qs = []
    for v in xs:
        p = _r32(v * i)
        r = float(trunc(abs(p) + 0.5))   # round half away from zero (p is a float32: exact)
        qs.append(int(r if p >= 0 else -r))
    return _to_half(d) + struct.pack("<32b", *qs)


def _q_q4_0(xs) -> bytes:
    d = _r32(_absmax_signed(xs) / -8)
    i = _recip(d)
    q = [min(15, trunc(_r32(_r32(v * i) + 8.5))) for v in xs]
    return _to_half(d) + _pack_nibbles(q)


def _q_q4_1(xs) -> bytes:
    lo, hi = min(xs), max(xs)
    d = _r32(_r32(hi - lo) / 15)
    i = _recip(d)
    q = [min(15, trunc(_r32(_r32(_r32(v - lo) * i) + 0.5))) for v in xs]
    return _to_half(d) + _to_half(lo) + _pack_nibbles(q)


def _q_q5_0(xs) -> bytes:
    d = _r32(_absmax_signed(xs) / -16)
    i = _recip(d)
    q = [min(31, trunc(_r32(_r32(v * i) + 16.5))) for v in xs]
    qh = sum(((v >> 4) & 1) << j for j, v in enumerate(q))
    return _to_half(d) + qh.to_bytes(4, "little") + _pack_nibbles(q)


def _q_q5_1(xs) -> bytes:
    lo, hi = min(xs), max(xs)
    d = _r32(_r32(hi - lo) / 31)
    i = _recip(d)
    q = [min(31, trunc(_r32(_r32(_r32(v - lo) * i) + 0.5))) for v in xs]
    qh = sum(((v >> 4) & 1) << j for j, v in enumerate(q))
    return _to_half(d) + _to_half(lo) + qh.to_bytes(4, "little") + _pack_nibbles(q)


_QUANTIZERS = {"q8_0": _q_q8_0, "q4_0": _q_q4_0, "q4_1": _q_q4_1, "q5_0": _q_q5_0, "q5_1": _q_q5_1}


def quantize(values, qtype: str) -> bytes:
    """Quantize a flat sequence of floats (a multiple of the block size long) to ``qtype``'s
    raw blocks, rounding exactly as ggml (and ``gguf.quants.quantize``) do. Formats:
    ``q8_0``, ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``; ``f32``, ``f16`` and ``bf16`` (round to nearest
    even) too.

    >>> raw = quantize([127.0] * 32, "q8_0")
    >>> len(raw), list(FORMATS["q8_0"].dequantize(raw)[:3])
    (34, [127.0, 127.0, 127.0])
    """
    f = get_format(qtype)
    xs = array("f", values).tolist()   # float32 first, as ggml sees them
    if len(xs) % f.block:
        raise ShapeError(f"quantize: {len(xs)} values are not a whole number of {f.block}-element {qtype} blocks")
    if qtype == "f32":
        return array("f", xs).tobytes()
    if qtype == "f16":
        return b"".join(_to_half(v) for v in xs)
    if qtype == "bf16":
        out = bytearray()
        for (u,) in struct.iter_unpack("<I", array("f", xs).tobytes()):
            if u & 0x7FFFFFFF > 0x7F800000:            # NaN stays a (quiet) NaN
                u = (u & 0xFFFF0000) | (64 << 16)
            else:                                      # round to nearest even
                u += 0x7FFF + ((u >> 16) & 1)
            out += ((u >> 16) & 0xFFFF).to_bytes(2, "little")
        return bytes(out)
    q = _QUANTIZERS.get(qtype)
    if q is None:
        raise DTypeError(f"quantize: ember quantizes to {', '.join(list(_QUANTIZERS) + ['f32', 'f16', 'bf16'])}, "
                         f"not {qtype!r} (K-quant and iq4 weights come from GGUF files)")
    if any(v != v or v in (float("inf"), float("-inf")) for v in xs):
        raise WeightsError(f"quantize: {qtype} needs finite values (got inf or NaN)")
    b = f.block
    return b"".join(q(xs[i:i + b]) for i in range(0, len(xs), b))


# ---- QTensor ------------------------------------------------------------------------------------

def _words_tensor(raw, device):
    """int32 word tensor holding ``raw`` (zero padded to a whole word) on ``device``."""
    from .tensor import from_bytes

    raw = bytes(raw)
    raw += b"\x00" * (-len(raw) % 4)
    return from_bytes(raw, (len(raw) // 4,), _dt.int32, device=device)


class QTensor:
    """A quantized weight: ``data`` (int32 words of raw blocks, see the module doc), ``qtype``
    (a key of ``FORMATS``) and its logical ``shape`` (row-major; the last axis is ``k``, the
    elements of one row, the others multiply to ``n``, the rows).

    Use it where a float weight would go through ``quant.linear`` / ``quant.embedding``, move it
    with ``.to(device)``, expand it (only when needed) with ``.dequantize()``.

    >>> import ember
    >>> w = QTensor.quantize(ember.tensor([[1.0] * 32]), "q4_0")
    >>> w.shape, w.qtype, w.nbytes, w.data.shape, w.dtype
    ((1, 32), 'q4_0', 18, (5,), ember.float32)
    >>> w.dequantize().tolist()[0][:2]
    [1.0, 1.0]
    """

    __slots__ = ("data", "qtype", "shape", "__weakref__")

    def __init__(self, data, qtype: str, shape):
        from .tensor import Tensor

        fmt = get_format(qtype)
        shape = tuple(int(s) for s in shape)
        if not shape or min(shape) < 0:
            raise ShapeError(f"QTensor: shape must have at least one axis and no negative size, got {shape}")
        if not isinstance(data, Tensor):
            raise DTypeError(f"QTensor: data must be an int32 ember Tensor of raw block words, not "
                             f"{type(data).__name__} (QTensor.from_bytes makes one from bytes)")
        if data.dtype is not _dt.int32 or data.ndim != 1:
            raise DTypeError(f"QTensor: data must be a 1-D int32 tensor of raw block words, got "
                             f"{data.dtype.name} of shape {data.shape}")
        n, k = prod(shape[:-1]), shape[-1]
        if k % fmt.block:
            raise ShapeError(f"QTensor: {qtype} rows of {k} elements are not a whole number of "
                             f"{fmt.block}-element blocks (shape {shape})")
        want = words(qtype, n, k)
        if data.shape != (want,):
            raise ShapeError(f"QTensor: {n} rows of {k} {qtype} elements need {want} int32 words, data has "
                             f"{data.shape[0]}")
        self.data = data
        self.qtype = qtype
        self.shape = shape

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_bytes(cls, raw, qtype: str, shape, device: str | None = None) -> "QTensor":
        """Wrap raw GGUF block bytes (``n * row_bytes`` of them) of a weight of ``shape``."""
        shape = tuple(int(s) for s in shape)
        need = prod(shape[:-1]) * row_bytes(qtype, shape[-1]) if shape else -1
        if len(raw) != need:
            raise ShapeError(f"QTensor.from_bytes: {len(raw)} bytes do not hold shape {shape} in {qtype} "
                             f"({need} bytes)")
        return cls(_words_tensor(raw, device), qtype, shape)

    @classmethod
    def quantize(cls, t, qtype: str, device: str | None = None) -> "QTensor":
        """Quantize a float tensor (or nested lists) to ``qtype`` with ``quant.quantize`` (on the
        host, in pure Python: for tests and small weights). The last axis is the row."""
        from .tensor import Tensor, tensor

        if not isinstance(t, Tensor):
            t = tensor(t, dtype=_dt.float32)
        if t.ndim == 0:
            raise ShapeError("QTensor.quantize: needs a tensor of at least one axis")
        flat = t.astype(_dt.float32).reshape((-1,)).tolist()
        return cls.from_bytes(quantize(flat, qtype), qtype, t.shape, device=device or t.device)

    # ---- properties ----------------------------------------------------------------------------
    @property
    def format(self) -> QFormat:
        return FORMATS[self.qtype]

    @property
    def n(self) -> int:
        """Rows: the product of all axes but the last."""
        return prod(self.shape[:-1])

    @property
    def k(self) -> int:
        """Elements per row: the last axis."""
        return self.shape[-1]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def device(self) -> str:
        return self.data.device

    @property
    def dtype(self):
        """``float32``: the dtype of what ``dequantize`` / ``quant.linear`` produce."""
        return _dt.float32

    @property
    def nbytes(self) -> int:
        """Bytes of the raw blocks (without the padding to a whole word)."""
        return self.n * row_bytes(self.qtype, self.k)

    # ---- conversions ---------------------------------------------------------------------------
    def to(self, device: str) -> "QTensor":
        """The same weight on ``device`` (the words are copied, never expanded)."""
        return self if device == self.device else QTensor(self.data.to(device), self.qtype, self.shape)

    def dequantize(self):
        """The float32 tensor of ``shape`` (allocates ``4 * n * k`` bytes)."""
        from .ops import quant as _q
        from .ops.movement import reshape

        out = _q.dequantize(self.data, qtype=self.qtype, n=self.n, k=self.k)
        return out if len(self.shape) == 2 else reshape(out, self.shape)

    def tobytes(self) -> bytes:
        """The raw block bytes (``nbytes`` of them)."""
        return self.data._bytes()[:self.nbytes]

    def __repr__(self) -> str:
        return f"QTensor({self.qtype}, shape={self.shape}, device={self.device!r})"


# ---- helpers that take either kind of weight ---------------------------------------------------

def linear(x, w, bias=None):
    """``x @ w.T (+ bias)`` for a QTensor ``w`` (the ``qlinear`` op, weight never expanded) or a
    float Tensor ``w`` (``ember.linear``). ``w`` is ``(n_out, n_in)``, like PyTorch's.

    >>> import ember
    >>> w = QTensor.quantize(ember.tensor([[2.0] * 32]), "q4_0")
    >>> linear(ember.ones((2, 32)), w, ember.tensor([1.0])).tolist()
    [[65.0], [65.0]]
    """
    from .ops import quant as _q
    from .ops.nnops import linear as _linear

    if not isinstance(w, QTensor):
        return _linear(x, w, bias)
    if len(w.shape) != 2:
        raise ShapeError(f"quant.linear: the weight must be 2-D (n_out, n_in), got {w.shape}")
    y = _q.qlinear(x, w.data, qtype=w.qtype, n=w.n, k=w.k)
    return y if bias is None else y + bias


def embedding(ids, w):
    """Rows of ``w`` (a QTensor, or a float Tensor through ``ember.embedding``) picked by the
    integer ``ids``: ``ids.shape + (k,)`` float32. An id outside ``[0, n)`` raises IndexingError.

    >>> import ember
    >>> w = QTensor.quantize(ember.tensor([[1.0] * 32, [3.0] * 32]), "q4_0")
    >>> [r[0] for r in embedding(ember.tensor([1, 0]), w).tolist()]
    [3.0, 1.0]
    """
    from .ops import quant as _q
    from .ops.nnops import embedding as _embedding

    if not isinstance(w, QTensor):
        return _embedding(ids, w)
    if len(w.shape) != 2:
        raise ShapeError(f"quant.embedding: the weight must be 2-D (num_embeddings, dim), got {w.shape}")
    return _q.qembedding(ids, w.data, qtype=w.qtype, n=w.n, k=w.k)


def dequantize(w):
    """``w.dequantize()`` for a QTensor; a float Tensor is returned as it is."""
    return w.dequantize() if isinstance(w, QTensor) else w
