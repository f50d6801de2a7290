"""webgpu's tiled scaled_dot_product_attention (``attention_tiled.wgsl``: a block of query rows
per workgroup, k and v tiles in shared memory, online softmax) against a float64 numpy
reference and against the per-row kernel (``attention.wgsl``, ``EMBER_WEBGPU_ATTN_TILED=0``):
blocks cut by L, L != S, Ev != E, E and Ev up to 128, operands as strided views (q, k, v out of
a fused QKV projection, k transposed twice, batch axes broadcast), bool / additive masks
broadcast, causal, fully masked rows, scale, every tile shape, and which kernel runs where.
Skipped where no adapter exists."""
import math

import numpy as np
import pytest

import ember

from conftest import gpu, rand, webgpu_only

_REASON, pytestmark = webgpu_only()

if _REASON is None:
    from ember.webgpu import nn
    from ember.webgpu.runtime import get_runtime


def ref(q, k, v, mask=None, causal=False, scale=None):
    """softmax(scale q k^T + mask) v in float64; rows with every key masked give zeros."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    m = s.max(axis=-1, keepdims=True)
    dead = m == -np.inf
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.where(dead, 0.0, m))
        p = e / np.where(dead, 1.0, e.sum(axis=-1, keepdims=True))
    return p @ v


def sdpa(monkeypatch, q, k, v, mask=None, *, tiled=True, tile=None, **kw):
    """ember's sdpa on webgpu as numpy, with the tiled kernel switched on or off (``tile``:
    EMBER_WEBGPU_ATTN_TILE). q, k, v, mask: numpy arrays or webgpu tensors."""
    monkeypatch.setenv("EMBER_WEBGPU_ATTN_TILED", "1" if tiled else "0")
    if tile:
        monkeypatch.setenv("EMBER_WEBGPU_ATTN_TILE", tile)
    else:
        monkeypatch.delenv("EMBER_WEBGPU_ATTN_TILE", raising=False)
    t = [x if x is None or isinstance(x, ember.Tensor) else gpu(x) for x in (q, k, v, mask)]
    args = t[:3] if mask is None else t
    return ember.scaled_dot_product_attention(*args, **kw).numpy()


def both(monkeypatch, kernels, *args, want, rtol=1e-5, atol=2e-6, **kw):
    """The tiled kernel's result (checked to have run) against ``want``, and against the
    per-row kernel's within 1e-5."""
    kernels.clear()
    tiled = sdpa(monkeypatch, *args, tiled=True, **kw)
    assert "attention_tiled" in kernels
    kernels.clear()
    rows = sdpa(monkeypatch, *args, tiled=False, **kw)
    assert "attention_tiled" not in kernels
    np.testing.assert_allclose(tiled, want, rtol=rtol, atol=atol)
    np.testing.assert_allclose(tiled, rows, rtol=1e-5, atol=1e-5)
    return tiled


# ---- shapes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("qs, ks, vs", [
    ((2, 12, 128, 32), (2, 12, 128, 32), (2, 12, 128, 32)),   # BERT-base-like block, 4 blocks of 32
    ((1, 4, 37, 64), (1, 4, 37, 64), (1, 4, 37, 64)),          # L not a multiple of the block
    ((1, 4, 37, 64), (1, 4, 50, 64), (1, 4, 50, 48)),          # L != S, Ev != E
    ((2, 3, 20, 5), (2, 3, 9, 5), (2, 3, 9, 12)),              # E, Ev not multiples of 4, S < BK
    ((1, 2, 40, 128), (1, 2, 45, 128), (1, 2, 45, 128)),       # widest heads
    ((1, 2, 24, 32), (1, 2, 24, 32), (1, 2, 24, 100)),         # Ev up to 128, not a multiple of 32
    ((33, 7), (70, 7), (70, 3)),                               # no batch axes
], ids=["bert", "ragged", "L!=S", "odd_e", "e128", "ev100", "no_batch"])
def test_shapes(monkeypatch, kernels, qs, ks, vs):
    q, k, v = rand(*qs, seed=1), rand(*ks, seed=2), rand(*vs, seed=3)
    both(monkeypatch, kernels, q, k, v, want=ref(q, k, v))


def test_keys_beyond_the_per_row_limit(monkeypatch, kernels):
    """S > nn.SMAX: the tiled kernel takes it (online softmax has no bound on S); the per-row
    kernel falls back to the decomposition."""
    q, k, v = rand(1, 9, 8, seed=1), rand(1, nn.SMAX + 50, 8, seed=2), rand(1, nn.SMAX + 50, 6, seed=3)
    both(monkeypatch, kernels, q, k, v, want=ref(q, k, v))


@pytest.mark.parametrize("tile", ["16x16", "16x32", "32x16", "32x32"])
def test_every_tile(monkeypatch, kernels, tile):
    q, k, v = rand(2, 3, 45, 16, seed=1), rand(2, 3, 70, 16, seed=2), rand(2, 3, 70, 24, seed=3)
    m = rand(2, 1, 1, 70, seed=4) > -0.8
    m[1, 0, 0, :] = False
    m[1, 0, 0, 40:44] = True       # batch 1: keys in one tile only
    both(monkeypatch, kernels, q, k, v, m, tile=tile, want=ref(q, k, v, m))
    both(monkeypatch, kernels, q, k, v, tile=tile, is_causal=True, want=ref(q, k, v, causal=True))


# ---- strided operands -----------------------------------------------------------------------

def test_fused_qkv_projection_views(monkeypatch, kernels):
    """q, k, v sliced out of a (B, L, 3 H E) projection, split into heads, heads to the front:
    views with row stride 3 H E, read in place."""
    B, L, H, E = 2, 40, 4, 16
    x = rand(B, L, 3 * H * E, seed=5)
    t = gpu(x)
    views = [t[:, :, i * H * E:(i + 1) * H * E].reshape((B, L, H, E)).permute_dims((0, 2, 1, 3))
             for i in range(3)]
    qn, kn, vn = (x[:, :, i * H * E:(i + 1) * H * E].reshape(B, L, H, E).transpose(0, 2, 1, 3) for i in range(3))
    m = rand(B, 1, 1, L, seed=6) > -0.5
    both(monkeypatch, kernels, *views, gpu(m), want=ref(qn, kn, vn, m))


def test_k_transposed_twice_and_broadcast_batch(monkeypatch, kernels):
    """k stored as (..., E, S) and given as its transpose (column stride S); k and v broadcast
    over the batch axes (stride 0) and v without the leading axis."""
    q, kT, v = rand(3, 2, 20, 8, seed=1), rand(1, 2, 8, 30, seed=2), rand(2, 30, 9, seed=3)
    k = gpu(kT).mT
    both(monkeypatch, kernels, q, k, v, want=ref(q, np.swapaxes(kT, -1, -2), v))


# ---- masks, causal, scale -------------------------------------------------------------------

def test_bool_padding_mask(monkeypatch, kernels):
    q, k, v = (rand(2, 12, 64, 32, seed=s) for s in range(3))
    m = np.ones((2, 1, 1, 64), bool)
    m[0, ..., 50:] = False                         # a BERT padding mask
    both(monkeypatch, kernels, q, k, v, m, want=ref(q, k, v, m))


def test_additive_mask(monkeypatch, kernels):
    q, k, v = (rand(2, 4, 30, 16, seed=s) for s in range(3))
    m = np.zeros((2, 1, 1, 30), np.float32)
    m[1, ..., 20:] = -10000.0                      # BERT's extended attention mask
    m[0, ..., :5] = rand(5, seed=7)
    both(monkeypatch, kernels, q, k, v, m, want=ref(q, k, v, m))
    rows = rand(30, 30, seed=8)                    # a float mask per (query, key), broadcast
    both(monkeypatch, kernels, q, k, v, rows, want=ref(q, k, v, rows))


def test_fully_masked_rows_give_zeros(monkeypatch, kernels):
    q, k, v = rand(1, 2, 20, 8, seed=1), rand(1, 2, 40, 8, seed=2), rand(1, 2, 40, 4, seed=3)
    m = rand(1, 1, 20, 40, seed=4) > 0.0
    m[..., 3, :] = False
    m[..., 17, :] = False
    got = both(monkeypatch, kernels, q, k, v, m, want=ref(q, k, v, m))
    assert not got[:, :, [3, 17]].any()
    neg = np.where(m, 0.0, -np.inf).astype(np.float32)   # the same as an additive -inf mask
    got2 = both(monkeypatch, kernels, q, k, v, neg, want=ref(q, k, v, m))
    assert not got2[:, :, [3, 17]].any()


@pytest.mark.parametrize("L, S", [(50, 50), (40, 60), (60, 40)])
def test_causal(monkeypatch, kernels, L, S):
    q, k, v = rand(2, 3, L, 16, seed=1), rand(2, 3, S, 16, seed=2), rand(2, 3, S, 16, seed=3)
    both(monkeypatch, kernels, q, k, v, is_causal=True, want=ref(q, k, v, causal=True))


def test_scale(monkeypatch, kernels):
    q, k, v = (rand(1, 3, 25, 32, seed=s) for s in range(3))
    both(monkeypatch, kernels, q, k, v, scale=0.7, want=ref(q, k, v, scale=0.7))


def test_nan_scores_give_a_nan_row(monkeypatch, kernels):
    q, k, v = (rand(1, 2, 20, 8, seed=s) for s in range(3))
    q[0, 1, 5, 2] = np.nan
    got = sdpa(monkeypatch, q, k, v)
    assert np.isnan(got[0, 1, 5]).all()
    got[0, 1, 5] = 0.0
    want = ref(q, k, v)
    want[0, 1, 5] = 0.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


def test_float16_operands(monkeypatch, kernels):
    q, k, v = (rand(1, 2, 24, 16, seed=s).astype(np.float16) for s in range(3))
    got = both(monkeypatch, kernels, q, k, v, want=ref(q, k, v), rtol=1e-2, atol=1e-3)
    assert got.dtype == np.float16


# ---- dispatch rules -------------------------------------------------------------------------

def test_deterministic(monkeypatch, kernels):
    q, k, v = (rand(2, 4, 70, 32, seed=s) for s in range(3))
    a = sdpa(monkeypatch, q, k, v)
    b = sdpa(monkeypatch, q, k, v)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("qs, ks, vs, tiled", [
    ((2, 4, 7, 16), (2, 4, 30, 16), (2, 4, 30, 16), False),     # L < ATTN_TILED_MIN_L: decode-like
    ((2, 4, 8, 16), (2, 4, 30, 16), (2, 4, 30, 16), True),
    ((1, 2, 20, 130), (1, 2, 20, 130), (1, 2, 20, 16), False),  # E > ATTN_TILED_EMAX
    ((1, 2, 20, 16), (1, 2, 20, 16), (1, 2, 20, 130), False),   # Ev > ATTN_TILED_EMAX
])
def test_which_kernel_runs(monkeypatch, kernels, qs, ks, vs, tiled):
    q, k, v = rand(*qs, seed=1), rand(*ks, seed=2), rand(*vs, seed=3)
    kernels.clear()
    got = sdpa(monkeypatch, q, k, v)
    assert ("attention_tiled" in kernels) == tiled and ("attention" in kernels) != tiled
    np.testing.assert_allclose(got, ref(q, k, v), rtol=1e-5, atol=2e-6)


def test_tile_choice():
    rt = get_runtime()
    small = nn.attn_tile(rt, (1, 12, 16, 32), 32, 16)
    big = nn.attn_tile(rt, (32, 12, 128, 32), 32, 128)
    assert small[0] == 16 and big[0] == 32
    for (BQ, BK) in (small, big):
        assert nn._attn_shared_bytes(BQ, BK, 32, 32) <= rt.limits["max_compute_workgroup_storage_size"]


def test_forced_tile_must_be_valid(monkeypatch):
    monkeypatch.setenv("EMBER_WEBGPU_ATTN_TILE", "24x32")
    with pytest.raises(ValueError, match="EMBER_WEBGPU_ATTN_TILE"):
        nn.attn_tile(get_runtime(), (1, 2, 20, 16), 16, 20)


def test_tile_fits_a_16kb_device():
    """A device with WebGPU's default 16 KB of workgroup memory (browsers) gets smaller tiles,
    and the per-row kernel where none fits."""
    class Small:
        limits = {"max_compute_workgroup_storage_size": 16384}

    assert nn.attn_tile(Small, (32, 12, 128, 32), 32, 128) == (32, 16)
    assert nn.attn_tile(Small, (1, 12, 64, 64), 64, 64) == (16, 16)
    assert nn.attn_tile(Small, (1, 12, 64, 128), 128, 64) is None


@pytest.mark.parametrize("qs, route", [
    ((2, 4, 64, 32), "composite"),      # 2 * 4 * 64 * 64 scores >= ATTN_GPU_COMPOSITE_FROM
    ((1, 4, 16, 32), "rows"),
    ((1, 2, 7, 16), "rows"),
])
def test_gpu_adapters_take_the_per_row_kernel_or_the_composite(monkeypatch, kernels, qs, route):
    """On a GPU (not a CPU adapter) the tiled kernel measured slower than both others: few scores
    take the per-row kernel, many the composite; EMBER_WEBGPU_ATTN_TILED=1 still forces the
    tiled kernel. Every route gives the reference's values."""
    monkeypatch.setattr(nn, "_cpu_adapter", lambda rt: False)
    q, k, v = (rand(*qs, seed=s) for s in range(3))
    mask = np.where(rand(qs[-2], qs[-2], seed=9) > 1.5, -1e9, 0.0).astype(np.float32)
    B, L = int(np.prod(qs[:-2])), qs[-2]
    assert (B * L * L >= nn.ATTN_GPU_COMPOSITE_FROM) == (route == "composite")
    assert nn.attn_route(get_runtime(), qs, qs[-1], L) == route
    monkeypatch.delenv("EMBER_WEBGPU_ATTN_TILED", raising=False)
    monkeypatch.delenv("EMBER_WEBGPU_ATTN_TILE", raising=False)
    kernels.clear()
    got = ember.scaled_dot_product_attention(gpu(q), gpu(k), gpu(v), gpu(mask)).numpy()
    assert "attention_tiled" not in kernels and ("attention" in kernels) == (route == "rows"), kernels
    np.testing.assert_allclose(got, ref(q, k, v, mask), rtol=1e-5, atol=2e-6)
    if L >= nn.ATTN_TILED_MIN_L:
        kernels.clear()
        forced = sdpa(monkeypatch, q, k, v, mask, tiled=True)
        assert "attention_tiled" in kernels
        np.testing.assert_allclose(forced, got, rtol=1e-5, atol=1e-5)
