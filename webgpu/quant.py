"""WebGPU kernels for the LLM ops: quantized weights (``qlinear``, ``qembedding``, ``dequantize``)
and the llama ops (``attention_cached``, ``rms_norm``, ``rope``). WGSL in ``kernels/quant.wgsl``
and ``kernels/llm.wgsl``; ``build_kernels`` gives the backend's kernel table its entries (the
table keeps only the ops the registry declares).

**Quantized weights.** A weight is an int32 tensor of raw GGUF block bytes (``ember.quant``):
the kernels read it as u32 words and cut out bytes, nibbles and halves; nothing is expanded to
float in memory (``dequantize`` excepted, which is asked to). Formats: q8_0, q4_0, q4_1, q5_0,
q5_1, iq4_nl, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, f16, bf16, f32.

- ``qlinear`` with few rows of x (``M <= GEMV_MAX_M``, decode): ``gemv``. Groups of LANES
  threads own RB weight rows each; each step a lane takes U 8-element items, interleaved with
  its neighbours' (large weights: at each load the lanes read consecutive words) or as a run
  (U = 4: one 32-block), each word read once; x is
  read straight from its buffer (cached: staging it in every workgroup cost as much traffic as
  the weight), each x vector serving the RB rows; one tree reduction per workgroup.
  ``gemv_shape`` picks the layout from the shape; ``EMBER_QLINEAR_LANES`` / ``_RB`` / ``_U`` /
  ``_IL`` / ``_XSH=1`` (x staged in workgroup memory) force it (``tests/bench/bench_webgpu.py --qlinear``
  sweeps them on a GPU).
- one x row and a large weight (n * k > 4M, k <= 4096) of a 32-block format (q8_0 q4_0 q4_1 q5_0
  q5_1) or a K-quant with scales per 32 or 16 elements (q4_k q5_k q6_k q3_k: a lane takes one
  32-element sub-block at a time), where the WGSL has ``packed_4x8_integer_dot_product``:
  ``gemv8``, x rounded to int8 per block of 32 in workgroup memory and each block's products
  summed by ``dot4I8Packed`` (~0.5% of the outputs' spread, as llama.cpp's int8 activations;
  ``EMBER_QLINEAR_I8=0`` keeps float).
- more rows (prompt): ``tiled4``, 64x64 output tiles, 4x4 per thread read from workgroup memory
  as vec4s, the weight tile decoded once per 64-wide slice of k (``tiled``: the same with scalar
  reads and smaller tiles, for adapters with less than 32 KiB of workgroup memory).
  ``EMBER_QLINEAR_PROMPT=dequant`` expands the weight to float32 and runs the autotuned matmul
  instead (a comparison point: it holds n x k floats while it runs).

>>> import ember, numpy as np                                      # doctest: +SKIP
>>> from gguf.quants import quantize; from gguf import GGMLQuantizationType as G   # doctest: +SKIP
>>> raw = quantize(np.ones((4, 32), np.float32), G.Q8_0)          # 4 rows of 34 bytes # doctest: +SKIP
>>> w = ember.from_numpy(np.frombuffer(raw.tobytes(), "<i4").copy(), device="webgpu")   # doctest: +SKIP
>>> x = ember.ones((1, 32), device="webgpu")                      # doctest: +SKIP
>>> ember.qlinear(x, w, qtype="q8_0", n=4, k=32).tolist()         # doctest: +SKIP
[[32.0, 32.0, 32.0, 32.0]]

**Folded decode ops** (``qlinear_rms``, ``qlinear_rms_rope``, ``qlinear_residual``: registry
composites, see ``ember.ops.llm``): for up to ``GEMV_MAX_M`` rows each is ONE ``gemv`` dispatch
whose prologue normalises x (every workgroup sums its row's squares first: 576 floats for
SmolLM2, cached) or forms silu(gate) * up from a stacked row of 2k, and whose epilogue adds a
residual or turns llama's q/k rows (a pair's partner row is always in the same workgroup). More
rows take the decompositions. ``greedy_tokens``: two dispatches (``AMAX_CH`` logits per workgroup,
then one workgroup per row).

**A decode layer in four dispatches** (``ember.ops.llm``: the residual stream in parts, rows
that sum to it). ``attention_proj``: the ``attn`` dispatch with template PROJ, whose workgroup
(one query head) keeps its head's output in workgroup memory and multiplies it by the head's
slice of every row of the output weight (``decoder()`` renders qdecode.wgsl into llm.wgsl for
that), writing the head's share; head 0 also copies the residual to row 0. No sum over the heads
needs a pass of its own: ``qlinear_rms(parts=True)`` (gate/up) sums the rows in its gemv
prologue (into workgroup memory, once per workgroup), ``qlinear_residual(parts=True)`` (down) in
its epilogue. Heads must be whole items (``ember.quant.slice_granule``); other shapes take the
composites.

**attention_cached and the caches.** ONE dispatch (``attn``, a workgroup per (query, head))
writes k, v into ``k_cache``/``v_cache`` IN PLACE at rows ``pos..pos+T-1`` and runs causal
grouped-query attention (online softmax over rows ``0..pos+t``). One workgroup per kv group
stores each new row, and every workgroup reads rows from ``pos`` on from the k, v inputs rather
than from the cache, so no workgroup reads a row that another writes in the same dispatch (a
separate write dispatch would cost one more dispatch per layer and token: the Python that
records a dispatch is the larger cost of a replayed decode step). ``pos`` is read by the
shader from its buffer, never by Python, so the dispatch is a plain recorded kernel call that an
``ember.compile`` plan replays unchanged with a new ``pos``. How the write stays in place:

- the kernels write the buffer of the cache tensor's own ``GBuf``: a lazy cache (``ember.zeros``
  is a constant expression with no storage yet) is realised in place first (``fusion.realize``
  fills that same GBuf object, so the tensor keeps the storage), and a cache that is not
  contiguous raises DTypeError/ShapeError instead of being copied (a write into a copy would be
  lost);
- the pool hands a buffer out again only when its ``Storage`` is garbage: the cache tensor holds
  it for as long as it lives, and every replay of a plan passes the same tensor objects (a plan
  holds tensors made outside the capture by reference);
- a plan never folds the call as a constant: its q, k, v (and usually pos) derive from the
  plan's inputs; the caches themselves are held by reference, not copied;
- WebGPU orders a dispatch's storage writes before the next dispatch's reads (one call's rows
  are in the cache for the next call), and each call's writes after the earlier calls' reads;
- not covered: a lazy (not yet run) elementwise expression that reads a cache, recorded before
  the call and run after it, sees the new rows (as a view would). Read caches only through
  ``attention_cached`` or after ``ember.webgpu.evaluate``.

**Split over positions** ("flash-decoding"; ``attn_splits``, ``EMBER_ATTN_SPLIT``). One
workgroup per (query, head) leaves a decode step (T = 1) with Hq workgroups (SmolLM2: 9 on an
H100's 132 SMs; ``attn`` took 30 x 12.5 us of a 1.22 ms token, ``webgpu_h200.sh smolf profile``,
2026-12-07), each walking its rows alone: per 256-row chunk a scoring pass, two tree reductions
and a value sum whose loads come in dependent rounds. Split, ``attn`` runs S workgroups per
(query, head), workgroup p over run p of the rows ``lo..pos+t``; the runs' length is worked out
on the GPU from pos (``ceil(rows / S)``, runs past the end empty), so every replay of a plan
spreads the rows it has over all S, whatever pos is. Each stores its unnormalised partial
result (max m, sum l, the weighted value sum) in a scratch buffer of the call (``rt.alloc``, as
``greedy_tokens``' partial maxima: a replayed plan owns it with its other intermediates), and a
second dispatch, ``attn_comb``, merges the runs (``m = max m_p``, ``l = sum l_p e^(m_p - m)``,
``out = sum acc_p e^(m_p - m) / l``): attention_cached's (T, Hq, D), or for attention_proj the
head's output in workgroup memory times a block of 64 of the output weight's rows (Hq * ceil(n /
64) workgroups where the unsplit dispatch has Hq). The cache write stays in ``attn`` (run 0 of
each kv group's first head) and every run reads rows from pos on from the new k, v, so the rule
above holds. A window splits the window's rows; the soft cap is per score as before.
``EMBER_ATTN_SPLIT`` unset: split on a GPU (not lavapipe, SwiftShader or a fallback adapter:
``_cpu_adapter``) when T <= 4 and the most rows a query can see (C, or the window) pass one
256-row chunk, with S = max(2, min(256 // (T Hq), rows // 32, 64)) runs: about
256 workgroups (two per SM of an H100), runs of 32 rows or more at a full cache, at most 64 (the
merge keeps a run's weight per thread); the rule's runs also hold at least 32 rows at any
position (template RMIN), so early in a long cache only the first few runs work and the rest
return at once (a forced S splits evenly, however few the rows). The cost is one more dispatch a layer (a chained
dispatch's floor is ~2.4 us on an H100, ``webgpu_h200.sh floor``); below one chunk the unsplit
kernel scores every row in one parallel pass, so small caches (ember.llm's chat replies, which
reserve the prompt and the reply rounded to 64 rows) keep one dispatch. Measured (H100, per
layer, chained, 1024-row cache, ``tests/bench/bench_attn_split.py``): the split costs 14-15.5 us
at any position up to 300 rows and 18 us at 1000, whatever S from 8 to 56; unsplit 9.9 us at 16
rows, 16.4 at 300, 39.8 at 1000. So ember.llm replays a step recorded unsplit below
``ATTN_SPLIT_FROM`` rows and the split one from there (``decode_split_from``, ``attn_unsplit``).
``EMBER_ATTN_SPLIT=0``: one dispatch always; ``1..256``: that S (on any adapter).

``pos + T > C`` (or ``pos < 0``) raises ShapeError (``ember.ops.llm.check_pos``) where ``pos``'s value is known without a
GPU read (a tensor uploaded from the host remembers its range; that is the case of the token
position fed to a plan); for a ``pos`` computed on the GPU nothing is read back, and the kernels
skip rows outside the cache (keys/values past ``C`` are dropped, attention stops at row C - 1).
``qembedding`` checks its ids the same way (an unknown range: ids outside ``[0, n)`` give rows
of zeros, no readback).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from math import prod

from .. import dtypes as _dt
from ..errors import DTypeError, IndexingError, ShapeError
from ..quant import slice_granule
from .driver import cpu_adapter, grid_1d
from .fusion import GBuf, Node, contiguous, realize, wgsl_type
from .replay import checked
from .runtime import env_on, f32_bits, kernel_source, pack_info, render

# (elements per block, bytes per block) of each format the kernels decode (GGUF's layouts)
BLOCKS = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18),
          "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "iq4_nl": (32, 18), "q2_k": (256, 84),
          "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210), "iq4_xs": (256, 136)}
_POS = {"q8_0": "pos_q8_0", "q4_0": "pos_q4", "q4_1": "pos_q4", "q5_0": "pos_q4", "q5_1": "pos_q4",
        "iq4_nl": "pos_q4", "iq4_xs": "pos_q4", "q2_k": "pos_k4", "q3_k": "pos_k4", "q4_k": "pos_k4",
        "q5_k": "pos_k4", "q6_k": "pos_q6_k", "f16": "pos_flat", "bf16": "pos_flat", "f32": "pos_flat"}

WG = 256
GEMV_MAX_M = 8      # x rows up to which qlinear runs the matrix-vector kernel


def row_bytes(qtype: str, k: int) -> int:
    """Bytes of one weight row of ``k`` elements in ``qtype``."""
    block, nbytes = BLOCKS[qtype]
    return k // block * nbytes


def section_source(name: str, entry: str) -> str:
    """``kernels/<name>.wgsl``'s prelude and the section of ``entry`` (its lines after
    ``//// entry`` up to the next ``////`` line)."""
    src = kernel_source(name)
    parts = src.split("\n//// ")
    for p in parts[1:]:
        head, _, body = p.partition("\n")
        if head.strip() == entry:
            return parts[0] + "\n" + body
    raise KeyError(f"{name}.wgsl has no section {entry!r}")


_PIPES: dict = {}


def _sg_params(rt) -> dict:
    """Template values for a kernel's reductions: by subgroup shuffles where the adapter has
    ``subgroups`` (``EMBER_WEBGPU_SUBGROUPS=0`` turns them off), else trees in workgroup memory
    alone (``sg_sum`` returns its value, the subgroup size reads 1)."""
    if "subgroups" in rt.features and os.environ.get("EMBER_WEBGPU_SUBGROUPS", "1") != "0":
        return dict(SG="true", SG_ARGS=", @builtin(subgroup_size) sgs_in: u32", SGS="sgs_in",
                    SG_SUM="fn sg_sum(v: f32, n: u32) -> f32 {\n  var s = v;\n"
                           "  for (var o = 1u; o < n; o = o * 2u) { s = s + subgroupShuffleXor(s, o); }\n"
                           "  return s;\n}\n"
                           "fn sg_max(v: f32, n: u32) -> f32 {\n  var s = v;\n"
                           "  for (var o = 1u; o < n; o = o * 2u) { s = max(s, subgroupShuffleXor(s, o)); }\n"
                           "  return s;\n}")
    return dict(SG="false", SG_ARGS="", SGS="1u", SG_SUM="fn sg_sum(v: f32, n: u32) -> f32 { return v; }\n"
                                                        "fn sg_max(v: f32, n: u32) -> f32 { return v; }")


def _pipe(rt, name: str, entry: str, params: dict):
    key = (name, entry, tuple(sorted(params.items())))
    p = _PIPES.get(key)
    if p is not None and p[0] is rt:
        return p[1]
    head = "enable subgroups;\n" if params.get("SG") == "true" else ""
    pipe = rt.pipeline(("sections",) + key, lambda: head + render(section_source(name, entry), params), entry)
    _PIPES[key] = (rt, pipe)
    return pipe


def _info(words) -> tuple:
    n = max(2, (len(words) + 3) // 4)
    return pack_info(words, n * 4), n


def _whole(g: GBuf):
    return (g.storage.buf, 0, g.storage.nbytes)


def _f32(rt, g: GBuf) -> GBuf:
    """``g`` as a realised, contiguous f32 buffer (an offset allowed)."""
    if wgsl_type(g.dtype) != "f32":
        from ..registry import Meta
        from . import fusion

        g = fusion.record(rt, "_cast", Meta(g.shape, _dt.float32), [g])
    return contiguous(realize(g))


def _copy(g: GBuf) -> GBuf:
    return realize(GBuf(g.rt, g.shape, g.dtype, expr=Node("leaf", g.dtype, buf=g)))


def _check_format(op, qtype, n, k, w):
    if qtype not in BLOCKS:
        raise DTypeError(f"{op}: webgpu has no kernel for qtype {qtype!r} (it has {', '.join(BLOCKS)})")
    block = BLOCKS[qtype][0]
    if k % block:
        raise ShapeError(f"{op}: k={k} is not a multiple of the {qtype} block of {block} elements")
    if w.dtype is not _dt.int32:
        raise DTypeError(f"{op}: the weight of a {qtype} tensor is int32 words of raw blocks, got {w.dtype.name}")
    need = (n * row_bytes(qtype, k) + 3) // 4
    if w._buf.size < need:
        raise ShapeError(f"{op}: a ({n}, {k}) {qtype} weight needs {need} int32 words, got {w._buf.size}")


def _weight(w) -> GBuf:
    return contiguous(realize(w._buf))


def _prelude_params(qtype, k, gw) -> dict:
    block, nbytes = BLOCKS[qtype]
    # every field the decoder reads starts at a multiple of 4 bytes: whole-word blocks (q4_1,
    # q4_k, q5_k, f32) or halves in rows of an even length, in rows of whole words
    al = (nbytes % 4 == 0 or block == 1) and row_bytes(qtype, k) % 4 == 0
    return {"QT": qtype, "POS": _POS[qtype], "AL": "true" if al else "false"}


def gemv_shape(n: int, k: int, mt: int) -> tuple:
    """(LANES, RB, U, IL, WG) of ``gemv`` for an (n, k) weight and ``mt`` (padded) rows of x:
    workgroups of WG threads, LANES consecutive ones sharing a group of RB weight rows; each step
    a lane takes U items, a run of consecutive ones (IL false) or interleaved with the other
    lanes' (IL true: item l + j * LANES, so each of the U loads reads consecutive words across
    the lanes). Small decode weights (n * k <= 4M, one x row) take 64 lanes of one item in
    workgroups of 256; larger ones 32 lanes (4 where k < 2048) of 4 interleaved items, 4 rows per
    group, workgroups of 64 threads.
    ``EMBER_QLINEAR_LANES`` / ``_RB`` / ``_U`` / ``_IL`` / ``_WG`` force them (benchmarks)."""
    env = os.environ
    # A decode step's small weights (a SmolLM2 layer's: n * k <= 4M) are latency-bound, not
    # bandwidth-bound (each product waits for the one before): 64 lanes of one item each finish
    # soonest (H200, one token's 450 dependent dispatches: GPU 3.30 -> 2.48 ms; a q4_1
    # 1536x576 product alone 12.3 -> 8.4 us). Large weights stream (H200, GB/s of q8_0 at
    # 4096^2: runs of 4 items 16x1u4 869; interleaved 64x1u4i 1120, 8x2u4i(w64) 1290, 4x2u4iw64
    # 1240; at 49152x576: 8x2u4iw64 987, 4x2u4iw64 1230). The workgroup size hardly matters
    # (32: 1160, 64 to 256: 1290-1300); x staged in workgroup memory reads 200-400. Since the
    # lanes' sums meet by subgroup shuffles, 32 lanes of 4 rows lead (H100, GB/s, 8x2u4iw64 ->
    # 32x4u4iw64: q8_0 4096^2 1557 -> 1740, 11008x4096 1678 -> 1810, 4096x11008 1622 -> 1830;
    # q4_1 1258 -> 1350, 1338 -> 1380, 1275 -> 1420; a plateau: 16 to 64 lanes, 2 to 8 rows, 2 to 8
    # items all give 1600-1830 for q8_0); at k = 576 few lanes still win (49152x576 q8_0: 4x4u4iw64
    # 1490, 4x2u4iw64 1430, 32x4u4iw64 840).
    small = mt == 1 and n * k <= (1 << 22)
    u = int(env.get("EMBER_QLINEAR_U") or (1 if small else 4))
    lanes, rb, il, wg = (64, 1, False, WG) if small else (32 if k >= 2048 else 4, 4, True, 64)
    if env.get("EMBER_QLINEAR_LANES"):
        lanes = int(env["EMBER_QLINEAR_LANES"])
    if env.get("EMBER_QLINEAR_RB"):
        rb = int(env["EMBER_QLINEAR_RB"])
    if env.get("EMBER_QLINEAR_IL"):
        il = env["EMBER_QLINEAR_IL"] == "1"
    if env.get("EMBER_QLINEAR_WG"):
        wg = int(env["EMBER_QLINEAR_WG"])
    # at most 8 partial sums per thread: the tree needs wg * mt * rb floats of workgroup memory
    return min(lanes, wg), max(1, min(rb, 8 // mt)), u, il, wg


# formats gemv8 reads (its QK code): blocks of 32 with one f16 scale (and q4_1's / q5_1's min),
# and the K-quants whose scales cover 32 elements (q4_k, q5_k: a scale and a min per sub-block)
# or 16 (q6_k, q3_k: two integer sums per 32-element sub-block). q2_k (a min per 16 elements)
# would need x's float sums per 16 and stays on the float gemv.
_I8_FORMATS = {"q8_0": 0, "q4_0": 1, "q4_1": 2, "q5_0": 3, "q5_1": 4, "q4_k": 5, "q5_k": 6, "q6_k": 7, "q3_k": 8}


def _use_gemv8(rt, qtype: str, n: int, k: int, wg: int, rb: int) -> bool:
    """Whether one x row's product takes ``gemv8`` (x as int8 per block, dot4I8Packed): large
    weights (n * k > 4M: bandwidth-bound; the small ones of a SmolLM2 layer are latency-bound
    and stay exact) of a 32-block format or a K-quant of ``_I8_FORMATS`` with k <= 4096 (each
    workgroup rounds all of x: at k = 11008 that costs more than it saves), where the WGSL has
    the packed 4x8 dot product and x's k bytes fit in workgroup memory; ``EMBER_QLINEAR_I8=0``
    turns it off. H100, GB/s, float gemv -> gemv8 (32 lanes of 4 rows, workgroups of 256): 4096^2 q8_0 1737 -> 1780, q4_1 1346 -> 1560,
    q4_0 1008 -> 1240; 11008x4096 q8_0 1812 -> 1860, q4_1 1379 -> 1620; 49152x576 (4 lanes of 4
    rows, 64) q8_0 1490 -> 1467, q4_1 1191 -> 1287; 4096x11008 q8_0 1820 -> 1340 (left out)."""
    if (qtype not in _I8_FORMATS or k % 32 or k > 4096 or n * k <= (1 << 22) or wg % 8
            or os.environ.get("EMBER_QLINEAR_I8") == "0"):
        return False
    if "packed_4x8_integer_dot_product" not in getattr(rt.driver, "wgsl_features", ()):
        return False
    return 3 * k + k // 4 + wg * rb * 4 <= _shared(rt)


def gemv8_shape(k: int, forced: tuple, max_wg: int = 1024) -> tuple:
    """(LANES, RB, WG) of ``gemv8``: ``EMBER_QLINEAR_I8_SHAPE`` ("<lanes>x<rows>w<threads>")
    sets them, else the EMBER_QLINEAR_LANES / _RB / _WG of ``gemv_shape`` (``forced``) where
    one is set, else the default: 16 lanes of one row in workgroups of 512 threads from k = 2048
    on, 4 lanes of one row in 256 below; workgroups at most ``max_wg`` threads (the device's
    limit: WebGPU's default is 256).

    Every workgroup rounds all of x first, so fewer, larger workgroups pay that less often, and
    a row's few lanes each take many blocks. H100, GB/s of weight read, calls independent (they
    overlap) / chained (each waits for the one before, as in a decode step), old default ->
    this one: 4096^2 q8_0 1,796/624 -> 2,159/974 (64% of HBM), q4_1 1,561/510 -> 2,112/784;
    11008x4096 q8_0 1,874/1,112 -> 2,235/1,574, q4_1 1,622/976 -> 2,160/1,418; the LM head
    49152x576 q8_0 (4 lanes of 4 rows in 64 -> 4x1w256) 1,469/643 -> 1,875/1,232, q4_1
    1,296/672 -> 1,991/1,200 (``bash tests/bench/webgpu_h200.sh qlinear`` with QL_LAYOUTS)."""
    env = os.environ
    spec = env.get("EMBER_QLINEAR_I8_SHAPE")
    if spec:
        lanes, rest = spec.split("x")
        rb, wg = rest.split("w")
        lanes, rb, wg = int(lanes), int(rb), int(wg)
    elif any(env.get("EMBER_QLINEAR_" + v) for v in ("LANES", "RB", "WG")):
        lanes, rb, wg = forced
    else:
        lanes, rb, wg = (16, 1, 512) if k >= 2048 else (4, 1, 256)
    wg = min(wg, max_wg)
    return min(lanes, wg), rb, wg


def _shared(rt) -> int:
    return int(rt.limits.get("max_compute_workgroup_storage_size", 16384))


def _gemv(rt, st, M, n, k, qtype, gx, gw, *, pro: int = 0, gnw=None, eps: float = 0.0, gres=None,
          rope=None, parts: int = 0, res_parts: int = 0) -> None:
    """One ``gemv`` dispatch into ``st``: out (M, n) = x' @ dequantize(w).T (+ residual), x'
    the x rows as they are (``pro`` 0), RMS-normalised by ``gnw`` (1) or silu(gate) * up of
    rows of 2k (2). ``gres`` (M, n): a residual added to the outputs. ``rope``: (rows, half,
    cos GBuf, sin GBuf, pos GBuf): outputs 0..rows of each x row rotated ("pairs" mode).
    ``parts`` (with ``pro`` 1 and M = 1): x is the sum of that many rows of k; ``res_parts``
    (M = 1): the residual is the sum of that many rows of n."""
    params = _prelude_params(qtype, k, gw)
    xstride = 2 * k if pro == 2 else k
    words = [M, n, k, row_bytes(qtype, k), gw.offset * 4, gx.offset, (k + 7) // 8, xstride,
             gnw.offset if gnw is not None else 0, gres.offset if gres is not None else 0, f32_bits(eps)]
    if rope is not None:
        words += [rope[0], rope[1], rope[2].offset, rope[3].offset, rope[4].offset]
    info, info_n = _info(words)
    bufs = [(st.buf, 0, M * n * 4), _whole(gw), _whole(gx)]
    decl = []
    nw4, res = "return vec4<f32>(0.0);", "return 0.0;"
    rope_cs = "return vec2<f32>(1.0, 0.0);"
    if rope is not None:
        for name, g, ty in (("cosb", rope[2], "f32"), ("sinb", rope[3], "f32"), ("posb", rope[4], "i32")):
            decl.append(f"@group(0) @binding({len(bufs)}) var<storage, read> {name}: array<{ty}>;")
            bufs.append(_whole(g))
        rope_cs = ("let j = u32(posb[u(15u)] + i32(m)) * u(12u) + i; "
                   "return vec2<f32>(cosb[u(13u) + j], sinb[u(14u) + j]);")
    if gnw is not None:
        decl.append(f"@group(0) @binding({len(bufs)}) var<storage, read> nwb: array<f32>;")
        bufs.append(_whole(gnw))
        nw4 = "let o = u(8u) + e; return vec4<f32>(nwb[o], nwb[o + 1u], nwb[o + 2u], nwb[o + 3u]);"
    if gres is not None:
        decl.append(f"@group(0) @binding({len(bufs)}) var<storage, read> resb: array<f32>;")
        bufs.append(_whole(gres))
        res = ("return resb[u(9u) + i];" if not res_parts else
               f"var s = 0.0; for (var r = 0u; r < {res_parts}u; r = r + 1u) {{ s = s + resb[u(9u) + r * u(1u) + i]; }} "
               "return s;")
    mt = 1 << (M - 1).bit_length()
    lanes, rb, u, il, wg = gemv_shape(n, k, mt)
    vec = gx.offset % 4 == 0 and k % 4 == 0
    params.update(INFO=info_n, LANES=lanes, RB=rb, XT="vec4<f32>" if vec else "f32",
                  X4="return xin[i / 4u];" if vec else
                  "return vec4<f32>(xin[i], xin[i + 1u], xin[i + 2u], xin[i + 3u]);",
                  DECL="\n".join(decl), IB=len(bufs), PRO=pro, EPI="true" if gres is not None else "false",
                  NW4=nw4, RES=res, ROPE="true" if rope is not None else "false", ROPE_CS=rope_cs,
                  XP="true" if parts else "false", XR=max(1, parts), **_sg_params(rt))
    lanes8, rb8, wg8 = gemv8_shape(k, (lanes, rb, wg), int(rt.limits.get("max_compute_invocations_per_workgroup", 256)))
    if M == 1 and _use_gemv8(rt, qtype, n, k, wg8, rb8):
        entry, lanes, rb, wg = "gemv8", lanes8, rb8, wg8
        params.update(LANES=lanes, RB=rb, WG=wg, XQ=k // 4, XB=k // 32, QK=_I8_FORMATS[qtype], BB=BLOCKS[qtype][1],
                      SB=BLOCKS[qtype][0] // 32, RED=wg * rb,
                      XV=-(-k // 4 // wg))
    else:
        entry = "gemv"
        red = wg * mt * rb
        # x straight from its buffer (cached), unless a row's last item passes k (f16/bf16/f32
        # rows of k % 8 != 0: the staged copy pads with zeros) or EMBER_QLINEAR_XSH=1
        xsh = pro == 0 and (k % 8 != 0 or os.environ.get("EMBER_QLINEAR_XSH", "") == "1")
        if xsh:
            xs = min(4096, (_shared(rt) - red * 4) // 4 // (64 * mt) * (64 * mt))
            kc = xs // mt
        else:
            xs, kc = 4, 0x7FFFFFC0
        params.update(WG=wg, U=u, IL="true" if il else "false", MT=mt, XS=xs, XS4=max(1, xs // 4), KC=kc,
                      XP4=k // 4 if parts else 1,
                      RED=red, ACC=mt * rb, XSH="true" if xsh else "false",
                      X1="return xin[i / 4u][i % 4u];" if vec else "return xin[i];")
    pipe = _pipe(rt, "quant", entry, params)
    per_wg = wg // lanes * rb
    rt.dispatch(pipe, bufs, info, grid_1d((n + per_wg - 1) // per_wg, rt.max_groups))


def qlinear(rt, out, x, w, *, qtype, n, k, **_):
    """The ``qlinear`` kernel: ``x @ dequantize(w).T`` without expanding ``w``."""
    _check_format("qlinear", qtype, n, k, w)
    if x.shape[-1] != k:
        raise ShapeError(f"qlinear: x has {x.shape[-1]} features, the weight {k}")
    M = prod(x.shape[:-1])
    st = rt.alloc(M * n * 4)
    res = GBuf(rt, out.shape, _dt.float32, storage=st)
    if M == 0 or n == 0:
        return res
    gx = _f32(rt, x._buf)
    gw = _weight(w)
    params = _prelude_params(qtype, k, gw)
    words = [M, n, k, row_bytes(qtype, k), gw.offset * 4, gx.offset, (k + 7) // 8]
    info, info_n = _info(words)
    params["INFO"] = info_n
    bufs = [(st.buf, 0, M * n * 4), _whole(gw), _whole(gx)]
    if M <= GEMV_MAX_M:
        _gemv(rt, st, M, n, k, qtype, gx, gw)
    elif os.environ.get("EMBER_QLINEAR_PROMPT") == "dequant":
        # (opt-in, for comparisons: the weight expanded to float32, then the autotuned matmul)
        from ..registry import OPS

        return realize(OPS["qlinear"].decompose(x, w, qtype=qtype, n=n, k=k)._buf)
    else:
        tm, tn = tile_sizes(rt)
        if (tm, tn) == (64, 64) and os.environ.get("EMBER_QLINEAR_PROMPT") != "tiled":
            pipe = _pipe(rt, "quant", "tiled4", params)
        else:
            params.update(TM=tm, TN=tn, TA=64 * tm, TB=64 * tn, ACC=(tm // 16) * (tn // 16), BV=tn // 16)
            pipe = _pipe(rt, "quant", "tiled", params)
        rt.dispatch(pipe, bufs, info, ((n + tn - 1) // tn, (M + tm - 1) // tm, 1))
    return res


def tile_sizes(rt) -> tuple:
    """(TM, TN) of the ``tiled`` kernel: the largest of 64x64, 32x64, 32x32 whose two 64-deep
    tiles fit the adapter's workgroup memory."""
    sh = _shared(rt)
    for tm, tn in ((64, 64), (32, 64), (32, 32)):
        if (tm + tn) * 64 * 4 <= sh:
            return tm, tn
    return 16, 16


def dequantize(rt, out, w, *, qtype, n, k, **_):
    """The ``dequantize`` kernel: the (n, k) float32 matrix."""
    _check_format("dequantize", qtype, n, k, w)
    st = rt.alloc(n * k * 4)
    res = GBuf(rt, out.shape, _dt.float32, storage=st)
    total = n * ((k + 7) // 8)
    if total == 0:
        return res
    gw = _weight(w)
    params = _prelude_params(qtype, k, gw)
    info, info_n = _info([0, n, k, row_bytes(qtype, k), gw.offset * 4, 0, (k + 7) // 8])
    params.update(INFO=info_n, WG=WG)
    pipe = _pipe(rt, "quant", "dequant", params)
    rt.dispatch(pipe, [(st.buf, 0, n * k * 4), _whole(gw)], info, grid_1d((total + WG - 1) // WG, rt.max_groups))
    return res


def qembedding(rt, out, ids, w, *, qtype, n, k, **_):
    """The ``qembedding`` kernel: rows ``ids`` of the weight, ``ids.shape + (k,)`` float32."""
    _check_format("qembedding", qtype, n, k, w)
    if ids.dtype.kind not in "iu":
        raise DTypeError(f"qembedding: ids must be integers, got {ids.dtype.name}")
    gi = ids._buf
    M = prod(ids.shape)
    st = rt.alloc(M * k * 4)
    res = GBuf(rt, out.shape, _dt.float32, storage=st)
    if M == 0 or k == 0:
        return res
    b = gi.bounds
    if b is not None:
        def check(lo, hi):
            if lo < 0 or hi >= n:
                bad = lo if lo < 0 else hi
                raise IndexingError(f"qembedding: id {bad} is out of range for a weight of {n} rows ({qtype}, k={k})")
        checked(b, check)
    gi = contiguous(realize(gi))
    if wgsl_type(gi.dtype) != "i32":      # uint8/bool ids: as i32
        from ..registry import Meta
        from . import fusion

        gi = realize(fusion.record(rt, "_cast", Meta(gi.shape, _dt.int32), [gi]))
    gw = _weight(w)
    params = _prelude_params(qtype, k, gw)
    info, info_n = _info([M, n, k, row_bytes(qtype, k), gw.offset * 4, gi.offset, (k + 7) // 8])
    params.update(INFO=info_n, WG=WG)
    pipe = _pipe(rt, "quant", "embed", params)
    total = M * ((k + 7) // 8)
    rt.dispatch(pipe, [(st.buf, 0, M * k * 4), _whole(gw), _whole(gi)], info,
                grid_1d((total + WG - 1) // WG, rt.max_groups))
    return res


# ---- llama ops -----------------------------------------------------------------------------

# threads per (query, head): a chunk of 256 cache rows scored at once (EMBER_ATTN_WG: benchmarks)
ATTN_WG = int(os.environ.get("EMBER_ATTN_WG") or 256)
# value rows read as vec4s where they can be (EMBER_ATTN_V4=0: as floats, an A/B)
ATTN_V4 = env_on("EMBER_ATTN_V4")
ATTN_COMB_WG = 64           # attn_comb's threads (a head dim each; with PROJ a weight row each)
ATTN_SPLIT_MAX_T = 4        # queries up to which attention splits over positions by itself
ATTN_SPLIT_GROUPS = 256     # workgroups the split aims at (about two per SM of an H100's 132)
ATTN_SPLIT_MIN_ROWS = 32    # rows of a run, at least, at a full cache
ATTN_SPLIT_AUTO_MAX = 64    # the rule's most runs (attn_comb keeps a weight per run and thread)
ATTN_SPLIT_MAX = 256        # EMBER_ATTN_SPLIT's largest value


def attn_splits(T: int, Hq: int, C: int, window: int = 0, cpu: bool = False) -> int:
    """Runs of positions per (query, head) of ``attention_cached`` / ``attention_proj`` on
    webgpu for T queries, Hq heads, a cache of C rows and a window (0: none): 0 (one workgroup
    per (query, head), one dispatch) or S (S workgroups each, then ``attn_comb``; the module
    docstring says why and what it costs). ``EMBER_ATTN_SPLIT``: "0" off, 1..256 forces S;
    unset: S = max(2, min(256 // (T Hq), rows // 32, 64)) where T <= 4 and the rows a query can
    see (C or the window) pass one chunk of ``ATTN_WG`` rows, on a GPU (``cpu`` False: see
    ``_cpu_adapter``), else 0."""
    env = os.environ.get("EMBER_ATTN_SPLIT", "").strip()
    if env:
        try:
            s = int(env)
        except ValueError:
            s = -1
        if not 0 <= s <= ATTN_SPLIT_MAX:
            raise ValueError(f"EMBER_ATTN_SPLIT={env!r}: 0 (no split) or the runs per (query, head), "
                             f"1..{ATTN_SPLIT_MAX}")
        return s
    if _UNSPLIT[0]:
        return 0
    rows = min(C, window) if window else C          # the most rows one query attends to
    if cpu or T > ATTN_SPLIT_MAX_T or rows <= ATTN_WG:
        return 0
    return max(2, min(ATTN_SPLIT_GROUPS // (T * Hq), rows // ATTN_SPLIT_MIN_ROWS, ATTN_SPLIT_AUTO_MAX))


# Where a one-token step's split pays: from about 290 rows on (the H100's figures are in the module
# docstring). A replayed plan cannot choose by itself (its dispatches are fixed), so ember.llm
# keeps two decode steps on webgpu and replays the one recorded unsplit (``attn_unsplit``) below
# ``ATTN_SPLIT_FROM`` (``EMBER_ATTN_SPLIT_FROM``), the split one from there (``decode_split_from``).
ATTN_SPLIT_FROM = int(os.environ.get("EMBER_ATTN_SPLIT_FROM") or 288)
_UNSPLIT = [0]


@contextmanager
def attn_unsplit():
    """Attention recorded or run inside is one dispatch (``attn_splits`` gives 0) unless
    ``EMBER_ATTN_SPLIT`` forces a split."""
    _UNSPLIT[0] += 1
    try:
        yield
    finally:
        _UNSPLIT[0] -= 1


def decode_split_from(n_heads: int, context: int, window: int = 0):
    """The position from which a one-token decode step on this adapter is better replayed with its
    attention split (``ATTN_SPLIT_FROM``), or None where the rule never splits it (a CPU adapter,
    a cache of one chunk, ``EMBER_ATTN_SPLIT`` set: one step serves every position)."""
    from .runtime import get_runtime

    if os.environ.get("EMBER_ATTN_SPLIT", "").strip():
        return None
    if not attn_splits(1, n_heads, context, window, cpu=_cpu_adapter(get_runtime())):
        return None
    return ATTN_SPLIT_FROM


def _cpu_adapter(rt) -> bool:
    """Whether the adapter runs on the CPU (lavapipe/llvmpipe, SwiftShader, a browser's fallback
    adapter): there workgroups run a few at a time and each costs its barriers in software, so
    the split's extra workgroups only add work (lavapipe, 2 busy cores: a 2-layer SmolLM2-shaped
    decode step at context 1024, 82 -> 142 ms a token split in 28 runs; the script is in
    ``/work/notes/attn-split.md``)."""
    return cpu_adapter(getattr(rt.driver, "info", None) or {})


def _cache(op, t, name, shape) -> GBuf:
    """The cache tensor's own buffer, realised in place (see the module docstring)."""
    if t.dtype is not _dt.float32:
        raise DTypeError(f"{op}: {name} must be float32 (it is written in place), got {t.dtype.name}")
    g = realize(t._buf)
    if tuple(g.shape) != tuple(shape) or not g.is_contiguous():
        raise ShapeError(f"{op}: {name} {tuple(g.shape)} must be a contiguous {tuple(shape)} tensor "
                         f"(it is written in place: a strided view cannot be)")
    return g


def attention_cached(rt, out, q, k, v, k_cache, v_cache, pos, *, scale, window=0, softcap=0.0, **_):
    """The ``attention_cached`` kernel, one dispatch (two split over positions: ``attn_splits``):
    write k, v into the caches at rows pos.., and causal grouped-query attention of q over rows
    0..pos+t (see the module docstring); a sliding window and a soft cap (Gemma) are constants
    of the pipeline (one per value)."""
    return _attention(rt, "attention_cached", out, q, k, v, k_cache, v_cache, pos, scale, window=window,
                      softcap=softcap)


def attention_proj(rt, out, q, kn, vn, k_cache, v_cache, pos, w, r, *, scale, qtype, n, k, **_):
    """The ``attention_proj`` kernel: ``attn`` whose workgroup (one query head) multiplies its
    head's output by that head's slice of the output weight (and the first copies the residual
    to row 0), one dispatch; split over positions (``attn_splits``), ``attn``'s runs and then
    ``attn_comb``, whose workgroups (head, block of 64 weight rows) merge them and multiply; the
    composite where the head's slice is not whole items or T > 1."""
    from ..registry import OPS

    T, Hq, D = q.shape
    if (T != 1 or qtype not in BLOCKS or not D or D % slice_granule(qtype) or k != Hq * D or n == 0
            or r.dtype is not _dt.float32):
        return OPS["attention_proj"].decompose(q, kn, vn, k_cache, v_cache, pos, w, r, scale=scale, qtype=qtype,
                                               n=n, k=k)._buf
    _check_format("attention_proj", qtype, n, k, w)
    return _attention(rt, "attention_proj", out, q, kn, vn, k_cache, v_cache, pos, scale,
                      proj=(w, qtype, n, k, _f32(rt, r._buf)))


def decoder(qtype: str, k: int, gw: GBuf) -> str:
    """``kernels/qdecode.wgsl`` rendered for a weight of ``qtype`` rows of ``k`` (``item``)."""
    return render(kernel_source("qdecode"), _prelude_params(qtype, k, gw))


def _attention(rt, op, out, q, k, v, k_cache, v_cache, pos, scale, proj=None, window=0, softcap=0.0):
    T, Hq, D = q.shape
    C, Hkv, Dc = k_cache.shape
    if k.shape != (T, Hkv, D) or v.shape != (T, Hkv, D) or v_cache.shape != (C, Hkv, D) or Dc != D:
        raise ShapeError(f"{op}: q {q.shape}, k {k.shape}, v {v.shape}, k_cache {k_cache.shape}, "
                         f"v_cache {v_cache.shape} do not fit (T, Hq, D), (T, Hkv, D), (C, Hkv, D)")
    if Hkv == 0 or Hq % Hkv:
        raise ShapeError(f"{op}: {Hq} query heads are not a multiple of {Hkv} key/value heads")
    gp = pos._buf
    if pos.dtype.kind != "i" or prod(pos.shape) != 1:
        raise DTypeError(f"{op}: pos must be one int32 value, got {pos.dtype.name} {pos.shape}")
    b = gp.bounds
    if b is not None:       # known at upload: the same check as every backend's, no GPU read
        from ..ops.llm import check_pos

        def check(lo, hi):
            check_pos(lo, T, C)
            check_pos(hi, T, C)
        checked(b, check)
    gkc = _cache(op, k_cache, "k_cache", (C, Hkv, D))
    gvc = _cache(op, v_cache, "v_cache", (C, Hkv, D))
    gp = realize(gp)
    nout = (T * (1 + Hq) * proj[2]) if proj is not None else T * Hq * D
    res_st = rt.alloc(nout * 4)
    res = GBuf(rt, out.shape, _dt.float32, storage=res_st)
    if nout == 0:
        return res
    gk, gv, gq = _f32(rt, k._buf), _f32(rt, v._buf), _f32(rt, q._buf)
    caches = (gkc.storage, gvc.storage)
    # (a buffer may not be bound writable and read-only in one dispatch: inputs that share a
    # cache's buffer are copied first)
    if gk.storage in caches:
        gk = _copy(gk)
    if gv.storage in caches:
        gv = _copy(gv)
    if gq.storage in caches:
        gq = _copy(gq)
    dpt = (D + ATTN_WG - 1) // ATTN_WG
    ns = max(1, ATTN_WG // D) if D else 1
    # value rows as vec4s where D and the value offsets allow and the rows are sliced (NS > 1)
    v4 = ns > 1 and D % 4 == 0 and gvc.offset % 4 == 0 and gv.offset % 4 == 0 and ATTN_V4
    if v4:
        ns = ATTN_WG // (D // 4)
    spl = attn_splits(T, Hq, C, window, cpu=_cpu_adapter(rt))
    words = [T, Hq, Hkv, D, C, f32_bits(scale), gq.offset, gkc.offset, gvc.offset, gp.offset, gk.offset, gv.offset]
    ins = [_whole(gq), _whole(gkc), _whole(gvc), _whole(gk), _whole(gv), _whole(gp)]
    emit = "out[row * u(3u) + d] = v;"
    params = dict(_KEY_CODE[D % 4 == 0 and gkc.offset % 4 == 0 and gk.offset % 4 == 0], WG=ATTN_WG, DPT=dpt,
                  QS=dpt * ATTN_WG, NS=ns, HD=D, EMIT=emit, PROJ="", TAIL="", SPL=1, SPLIT="false", ML="", RMIN=1,
                  WIN=int(window), **_val_code(v4, dpt),
                  # (tanh's argument clamped: some drivers' tanh is NaN far out, where it is +-1)
                  CAP=f"s = {float(softcap)!r} * tanh(clamp(s / {float(softcap)!r}, -15.0, 15.0));" if softcap else "",
                  **_sg_params(rt))
    out_b = (res_st.buf, 0, nout * 4)
    if not spl:
        bufs = [out_b] + ins
        if proj is not None:
            w, qtype, n, K, gr = proj
            gw = _weight(w)
            words += [n, gw.offset * 4, row_bytes(qtype, K), gr.offset]
            bufs += [_whole(gw), _whole(gr)]
            params.update(EMIT="qsh[d] = v;", TAIL="workgroupBarrier();\n  proj(row, t, 0u);",
                          PROJ=_proj_code(qtype, K, gw, D, n, ATTN_WG, n, 7))
        info, info_n = _info(words)
        params.update(INFO=info_n, IB=len(bufs))
        rt.dispatch(_pipe(rt, "llm", "attn", params), bufs, info, grid_1d(T * Hq, rt.max_groups))
        return res
    # split over positions: attn's runs into a scratch buffer of the call (the pool's, as any
    # temporary: a replayed plan owns it with its other intermediates), then attn_comb
    nslot = T * Hq * spl
    part = rt.alloc(nslot * (D + 2) * 4, "split attention's partial results")
    part_b = (part.buf, 0, nslot * (D + 2) * 4)
    words.append(nslot * D)                     # 12: the runs' (m, l) pairs
    cparams = dict(WG=ATTN_COMB_WG, QS=max(4, D), SPL=spl, NB=1, EMIT=emit, PROJ="", TAIL="")
    cbufs = [out_b, part_b]
    if proj is not None:
        w, qtype, n, K, gr = proj
        gw = _weight(w)
        words += [gw.offset * 4, row_bytes(qtype, K), gr.offset]
        cbufs += [_whole(gw), _whole(gr)]
        cparams.update(NB=-(-n // ATTN_COMB_WG), EMIT="qsh[d] = v;",
                       TAIL=f"workgroupBarrier();\n  proj(row, t, blk * {ATTN_COMB_WG}u);",
                       PROJ=_proj_code(qtype, K, gw, D, n, ATTN_COMB_WG, ATTN_COMB_WG, 2))
    info, info_n = _info(words)
    # the rule's runs hold ATTN_SPLIT_MIN_ROWS rows or more (at pos 20 of a 1024-row cache one
    # run works, the rest return at once); a forced S splits the rows evenly, however few
    rmin = 1 if os.environ.get("EMBER_ATTN_SPLIT", "").strip() else ATTN_SPLIT_MIN_ROWS
    params.update(INFO=info_n, IB=1 + len(ins), SPL=spl, SPLIT="true", RMIN=rmin,
                  ML="if (t == 0u) { out[u(12u) + 2u * orow] = m; out[u(12u) + 2u * orow + 1u] = l; }")
    rt.dispatch(_pipe(rt, "llm", "attn", params), [part_b] + ins, info, grid_1d(nslot, rt.max_groups))
    cparams.update(INFO=info_n, IB=len(cbufs))
    rt.dispatch(_pipe(rt, "llm", "attn_comb", cparams), cbufs, info,
                grid_1d(T * Hq * cparams["NB"], rt.max_groups))
    return res


def _proj_code(qtype, K, gw, D, n, wg, rbk, binding) -> str:
    """attention_proj's projection (``_PROJ``) for an (n, K) ``qtype`` weight: heads of D, ``wg``
    threads, blocks of ``rbk`` weight rows, its two buffers at bindings ``binding``, +1."""
    return (_PROJ.replace("@DECODE@", decoder(qtype, K, gw)).replace("@HL@", str(D // 8)).replace("@WG@", str(wg))
            .replace("@NP@", str(n)).replace("@RBK@", str(rbk)).replace("@BW@", str(binding))
            .replace("@BR@", str(binding + 1)))


# attention_proj's projection (llm.wgsl's attn, template PROJ)
_PROJ = """@group(0) @binding(@BW@) var<storage, read> wq: array<u32>;
@group(0) @binding(@BR@) var<storage, read> resb: array<f32>;
@DECODE@
const HL: u32 = @HL@u;            // items of one head's slice of a weight row
fn hv(e: u32) -> vec4<f32> { return vec4<f32>(qsh[e], qsh[e + 1u], qsh[e + 2u], qsh[e + 3u]); }
const NP: u32 = @NP@u;            // weight rows (n)
const RBK: u32 = @RBK@u;          // weight rows of one workgroup
fn proj(row: u32, t: u32, r0: u32) {
  let T = u(0u); let Hq = u(1u); let D = u(3u);
  let tq = row / Hq;
  let h = row % Hq;
  let e0 = h * D;
  let r1 = min(NP, r0 + RBK);
  // (constant trip counts: a thread's rows' item loads can all issue at once)
  for (var c = 0u; c < (RBK + @WG@u - 1u) / @WG@u; c = c + 1u) {
    let r = r0 + t + c * @WG@u;
    if (h == 0u && r < r1) { out[tq * NP + r] = resb[u(15u) + tq * NP + r]; }    // row 0: the residual
    if (r < r1) {
      let rb = u(13u) + r * u(14u);
      var s = 0.0;
      for (var j = 0u; j < HL; j = j + 1u) {
        let it = item(rb, h * HL + j);
        s = s + dot(it.w0, hv(it.e0 - e0)) + dot(it.w1, hv(it.e1 - e0));
      }
      out[((1u + h) * T + tq) * NP + r] = s;
    }
  }
}"""


# the attn kernel's value access (vec4s: the rows are sliced, NS > 1, and D, the offsets allow)
def _val_code(v4: bool, dpt: int) -> dict:
    if v4:
        return {"VT": "vec4<f32>", "VV": "vec4<f32>", "VW": 4, "VSUM1": "",
                "VEMIT": "emit(orow, 4u * t, a.x * inv); emit(orow, 4u * t + 1u, a.y * inv); "
                         "emit(orow, 4u * t + 2u, a.z * inv); emit(orow, 4u * t + 3u, a.w * inv);"}
    return {"VT": "f32", "VV": "f32", "VW": 1, "VEMIT": "emit(orow, t, a * inv);",
            "VSUM1": f"for (var dd = 0u; dd < {dpt}u; dd = dd + 1u) {{\n        let d = t + dd * {ATTN_WG}u;\n"
                     "        if (d < D) { acc[dd] = vsum(acc[dd] * corr, j0, 0u, cnt, pos, d, vo, vno, rs); }\n      }"}


# the attn kernel's key access, as vec4s (D and the key offsets multiples of 4) or as floats
_KEY_CODE = {
    True: {"KT": "vec4<f32>",
           "KDOT_C": "for (var e = 0u; e < HDC; e = e + 4u) { s = s + dot(vec4<f32>(qsh[e], qsh[e + 1u], qsh[e + 2u], "
                     "qsh[e + 3u]), kc[(kb + e) / 4u]); }",
           "KDOT_N": "for (var e = 0u; e < HDC; e = e + 4u) { s = s + dot(vec4<f32>(qsh[e], qsh[e + 1u], qsh[e + 2u], "
                     "qsh[e + 3u]), kin[(kb + e) / 4u]); }",
           "KIN_AT": "return kin[i / 4u][i % 4u];", "KC_SET": "kc[i / 4u][i % 4u] = v;"},
    False: {"KT": "f32",
            "KDOT_C": "for (var e = 0u; e < HDC; e = e + 1u) { s = s + qsh[e] * kc[kb + e]; }",
            "KDOT_N": "for (var e = 0u; e < HDC; e = e + 1u) { s = s + qsh[e] * kin[kb + e]; }",
            "KIN_AT": "return kin[i];", "KC_SET": "kc[i] = v;"},
}


def rms_norm(rt, out, x, w, *, eps, **_):
    """The ``rms_norm`` kernel: one dispatch (the composite is a reduction and a fused chain)."""
    from ..registry import OPS

    D = x.shape[-1] if x.shape else 1
    if x.dtype is not _dt.float32 or w.dtype is not _dt.float32 or tuple(w.shape) != (D,):
        return OPS["rms_norm"].decompose(x, w, eps=eps)._buf
    rows = prod(x.shape[:-1])
    st = rt.alloc(rows * D * 4)
    res = GBuf(rt, out.shape, _dt.float32, storage=st)
    if rows * D == 0:
        return res
    gx, gw = _f32(rt, x._buf), _f32(rt, w._buf)
    wg = 64 if D <= 256 else 256
    info, info_n = _info([rows, D, f32_bits(eps), gx.offset, gw.offset])
    pipe = _pipe(rt, "llm", "rms_norm", {"INFO": info_n, "WG": wg})
    rt.dispatch(pipe, [(st.buf, 0, rows * D * 4), _whole(gx), _whole(gw)], info, grid_1d(rows, rt.max_groups))
    return res


def rope(rt, out, x, cos, sin, *, mode="pairs", **_):
    """The ``rope`` kernel: one dispatch (x (T, H, D), cos/sin (T, D/2), float32)."""
    from ..registry import OPS

    ok = (len(x.shape) == 3 and x.dtype is _dt.float32 and cos.dtype is _dt.float32 and sin.dtype is _dt.float32
          and x.shape[2] % 2 == 0 and tuple(cos.shape) == (x.shape[0], x.shape[2] // 2)
          and tuple(sin.shape) == tuple(cos.shape) and mode in ("pairs", "halves"))
    if not ok:
        return OPS["rope"].decompose(x, cos, sin, mode=mode)._buf
    T, H, D = x.shape
    n = T * H * D
    st = rt.alloc(n * 4)
    res = GBuf(rt, out.shape, _dt.float32, storage=st)
    if n == 0:
        return res
    gx, gc, gs = _f32(rt, x._buf), _f32(rt, cos._buf), _f32(rt, sin._buf)
    pairs = n // 2
    info, info_n = _info([pairs, H, D // 2, int(mode == "halves"), gx.offset, gc.offset, gs.offset])
    pipe = _pipe(rt, "llm", "rope", {"INFO": info_n, "WG": WG})
    rt.dispatch(pipe, [(st.buf, 0, n * 4), _whole(gx), _whole(gc), _whole(gs)], info,
                grid_1d((pairs + WG - 1) // WG, rt.max_groups))
    return res


def _fusable(x, k, M) -> bool:
    """A decode-sized product whose x the gemv prologues can read (float32, k % 8 == 0)."""
    return x.dtype is _dt.float32 and k % 8 == 0 and 0 < M <= GEMV_MAX_M


def _parts_rows(rt, x, k, parts: bool) -> tuple:
    """(x rows M, parts R) of a folded product's x; R 0 where x in parts cannot be summed in
    the prologue (more than one token, or its k floats do not fit workgroup memory beside the
    reduction's): those take the composite (-1)."""
    if not parts:
        return prod(x.shape[:-1]), 0
    M = prod(x.shape[1:-1])
    if M != 1 or k % 4 or k * 4 + 4 * WG * 8 > _shared(rt):
        return M, -1
    return 1, x.shape[0]


def qlinear_rms(rt, out, x, nw, w, *, eps, qtype, n, k, parts=False, **_):
    """The ``qlinear_rms`` kernel: the RMSNorm folded into one ``gemv`` dispatch (decode; x in
    parts summed in its prologue); the composite (``rms_norm`` + ``qlinear``) for more rows."""
    from ..registry import OPS

    M, R = _parts_rows(rt, x, k, parts)
    if R < 0 or not _fusable(x, k, M) or nw.dtype is not _dt.float32 or n == 0:
        return OPS["qlinear_rms"].decompose(x, nw, w, eps=eps, qtype=qtype, n=n, k=k, parts=parts)._buf
    _check_format("qlinear_rms", qtype, n, k, w)
    st = rt.alloc(M * n * 4)
    _gemv(rt, st, M, n, k, qtype, _f32(rt, x._buf), _weight(w), pro=1, gnw=_f32(rt, nw._buf), eps=eps, parts=R)
    return GBuf(rt, out.shape, _dt.float32, storage=st)


def _rows_per_group(n, k) -> int:
    """Weight rows of one ``gemv`` workgroup at one x row (even: the rope epilogue's pairs)."""
    lanes, rb, _, _, wg = gemv_shape(n, k, 1)
    return wg // lanes * rb


def qlinear_rms_rope(rt, out, x, nw, w, cos, sin, pos, *, eps, rope_rows, head_dim, qtype, n, k, parts=False,
                     **_):
    """The ``qlinear_rms_rope`` kernel: RMSNorm, the product and the rotation of the q/k rows in
    one ``gemv`` dispatch (decode; x in parts summed in its prologue); the composite for more
    rows. The position is read on the GPU (its range checks: ``attention_cached``'s, whose cache
    is as long as the tables)."""
    from ..registry import OPS

    M, R = _parts_rows(rt, x, k, parts)
    ok = (R >= 0 and _fusable(x, k, M) and nw.dtype is _dt.float32 and n > 0 and cos.dtype is _dt.float32
          and sin.dtype is _dt.float32 and pos.dtype.kind == "i" and _rows_per_group(n, k) % 2 == 0)
    if not ok:
        return OPS["qlinear_rms_rope"].decompose(x, nw, w, cos, sin, pos, eps=eps, rope_rows=rope_rows,
                                                 head_dim=head_dim, qtype=qtype, n=n, k=k, parts=parts)._buf
    _check_format("qlinear_rms_rope", qtype, n, k, w)
    st = rt.alloc(M * n * 4)
    rope = (rope_rows, head_dim // 2, _f32(rt, cos._buf), _f32(rt, sin._buf), contiguous(realize(pos._buf)))
    _gemv(rt, st, M, n, k, qtype, _f32(rt, x._buf), _weight(w), pro=1, gnw=_f32(rt, nw._buf), eps=eps, rope=rope,
          parts=R)
    return GBuf(rt, out.shape, _dt.float32, storage=st)


def qlinear_residual(rt, out, x, w, r, *, glu, qtype, n, k, parts=False, **_):
    """The ``qlinear_residual`` kernel: silu(gate) * up (``glu``) and the residual add folded
    into one ``gemv`` dispatch (decode; a residual in parts summed in its epilogue); the
    composite for more rows."""
    from ..registry import OPS

    M = prod(x.shape[:-1])
    if not _fusable(x, k, M) or r.dtype is not _dt.float32 or n == 0 or (parts and M != 1):
        return OPS["qlinear_residual"].decompose(x, w, r, glu=glu, qtype=qtype, n=n, k=k, parts=parts)._buf
    _check_format("qlinear_residual", qtype, n, k, w)
    st = rt.alloc(M * n * 4)
    _gemv(rt, st, M, n, k, qtype, _f32(rt, x._buf), _weight(w), pro=2 if glu else 0, gres=_f32(rt, r._buf),
          res_parts=r.shape[0] if parts else 0)
    return GBuf(rt, out.shape, _dt.float32, storage=st)


AMAX_CH = 1024     # greedy_tokens: logits per workgroup of the first pass


def greedy_tokens(rt, out, x, **_):
    """The ``greedy_tokens`` kernel: two dispatches, the vocabulary split over ceil(n / AMAX_CH)
    workgroups per row, then one per row over their (value, index) pairs (a general argmax
    gives each row one workgroup: 90 us for 49,152 logits on an H200). The output carries its
    range (0..n-1), as argmax's does: a decode step fed it passes the embedding's guard."""
    from ..registry import OPS

    if len(x.shape) != 2 or x.dtype is not _dt.float32 or not x.shape[1]:
        return OPS["greedy_tokens"].decompose(x)._buf
    rows, n = x.shape
    st = rt.alloc(max(rows, 1) * 4)
    res = GBuf(rt, out.shape, out.dtype, storage=st)
    res.bounds = (0, n - 1)
    if rows == 0:
        return res
    gx = _f32(rt, x._buf)
    G = (n + AMAX_CH - 1) // AMAX_CH
    part = rt.alloc(rows * G * 8, "greedy_tokens partial maxima")
    info, info_n = _info([rows, n, G, AMAX_CH, gx.offset])
    rt.dispatch(_pipe(rt, "llm", "amax_part", {"INFO": info_n, "WG": WG}), [(part.buf, 0, rows * G * 8), _whole(gx)],
                info, grid_1d(rows * G, rt.max_groups))
    rt.dispatch(_pipe(rt, "llm", "amax_fin", {"INFO": info_n, "WG": WG}), [(st.buf, 0, rows * 4),
                (part.buf, 0, rows * G * 8)], info, grid_1d(rows, rt.max_groups))
    return res


def build_kernels(rt) -> dict:
    """Entries for the backend's kernel table (``kernel(out, *inputs, **attrs) -> GBuf``)."""
    def bind(f):
        def kernel(out, *args, **kw):
            return f(rt, out, *args, **kw)
        kernel.__name__ = f"webgpu_{f.__name__}"
        return kernel

    return {name: bind(f) for name, f in (("qlinear", qlinear), ("dequantize", dequantize),
                                          ("qembedding", qembedding), ("attention_cached", attention_cached),
                                          ("rms_norm", rms_norm), ("rope", rope),
                                          ("qlinear_rms", qlinear_rms), ("qlinear_residual", qlinear_residual),
                                          ("qlinear_rms_rope", qlinear_rms_rope), ("greedy_tokens", greedy_tokens),
                                          ("attention_proj", attention_proj))}
