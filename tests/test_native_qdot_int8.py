"""qdot.c's q8_0 product with int8 activations (qtype 108, numpy_quant.QDOT_INT8 /
EMBER_QDOT_INT8: llama.cpp's numerics, AVX-512 VNNI builds only): against a float64 emulation of its
int8 rounding (the same int8 activation and exact integer block sums; float32 accumulation within
rounding), within the int8 activation's bound of gguf's dequantized float64 product, odd row
counts, k = 32..4096, m = 1..4, one thread and the team (the same bits), non-finite blocks, the
switch and the parts job."""
import ctypes

import numpy as np
import pytest

import ember.native as nat
from ember.backends import numpy_quant as nq
from tests.test_native_qdot import _parts_weight, weights
from tests.test_quant import gguf_reference, same_bits

P, I64 = ctypes.c_void_p, ctypes.c_int64


@pytest.fixture(scope="module")
def fn():
    dll = nat.lib()
    if dll is None:
        pytest.skip(f"ember.native not in use: {nat.info()['reason']}")
    if not hasattr(dll, "ember_qdot_i8") or not dll.ember_qdot_i8():
        pytest.skip("no AVX-512 VNNI code in this build")
    f = dll.ember_qdot_linear
    f.restype, f.argtypes = I64, [P, P, P, I64, P, I64, I64, I64, I64]
    return f


def _raw(n, k, seed):
    """n rows of k q8_0 weights (random blocks, finite scales), and its float64 dequantization."""
    raw = weights("q8_0", n, k, seed=seed)
    return raw, gguf_reference(raw, "q8_0").astype(np.float64).reshape(n, k)


def _emulate(x, wd):
    """float64 of the kernel's arithmetic: x rounded per block to int8 (dx = amax / 127 and q =
    nearest-even of x * (127 / amax), both float32), the block sums of q * w exact; returns (y, the
    sum of the terms' magnitudes: the float32 accumulation's scale)."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=2, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        idv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        q = np.rint((xb * idv).astype(np.float32)).astype(np.float64)
    dx = (amax / np.float32(127)).astype(np.float32).astype(np.float64)[..., 0]       # (m, nb)
    n = wd.shape[0]
    wb = wd.reshape(n, k // 32, 32)
    d = np.abs(wb).max(axis=2) / 127.0      # (the block scale d: |w| <= 127 d) -- only for the bound
    terms = np.einsum("mbi,nbi->mnb", q, wb) * dx[:, None, :]
    return terms.sum(axis=2), np.abs(terms).sum(axis=2), d


def _call(fn, raw, x, n, k):
    m = x.shape[0]
    y = np.full((m, n), np.nan, np.float32)
    scratch = np.zeros(nat_scratch(m, k), np.uint8)
    rc = fn(raw.ctypes.data, x.ctypes.data, y.ctypes.data, n, scratch.ctypes.data, 108, m, n, k)
    assert rc == 0
    return y


def nat_scratch(m, k):
    return m * k * 2 + m * (k // 32) * 16 + 64


@pytest.mark.parametrize("k", [32, 64, 96, 576, 1536, 4096])
@pytest.mark.parametrize("n", [1, 7, 16, 17, 33, 100])
def test_against_float64(fn, n, k):
    rng = np.random.default_rng(n * 7919 + k)
    raw, wd = _raw(n, k, seed=n + k)
    for m in (1, 2, 3, 4):
        x = (rng.normal(size=(m, k)) * rng.choice([1e-3, 1.0, 50.0], size=(m, k // 32)).repeat(32, axis=1))
        x = x.astype(np.float32)
        y = _call(fn, raw, x, n, k)
        ref, scale, _ = _emulate(x, wd)
        np.testing.assert_array_less(np.abs(y - ref), 4 * (k // 32 + 4) * 6e-8 * scale + 1e-30)
        # against the true float64 product: the int8 activation's error, half a step per element
        true = x.astype(np.float64) @ wd.T
        xb = np.abs(x.astype(np.float64)).reshape(m, k // 32, 32).max(axis=2)
        bound = (xb / 127 / 2)[:, None, :] * np.abs(wd).reshape(n, k // 32, 32).sum(axis=2)[None]
        np.testing.assert_array_less(np.abs(y - true), bound.sum(axis=2) * 1.001 + 1e-3 * scale + 1e-30)


def test_nonfinite_and_zero_blocks(fn):
    n, k = 19, 128
    raw, wd = _raw(n, k, seed=3)
    x = np.random.default_rng(1).normal(size=(3, k)).astype(np.float32)
    x[0, 32:64] = 0.0          # a zero block adds nothing
    x[1, 70] = np.inf          # a non-finite block: NaN out
    x[2, 100] = np.nan
    y = _call(fn, raw, x, n, k)
    ref, _, _ = _emulate(np.where(np.isfinite(x), x, 0).astype(np.float32), wd)
    np.testing.assert_allclose(y[0], ref[0], rtol=1e-5, atol=1e-5)
    assert np.isnan(y[1]).all() and np.isnan(y[2]).all()


@pytest.mark.parametrize("n,k", [(17, 576), (100, 576), (576, 576), (1536, 576), (576, 1536), (48, 4096)])
def test_numpy_quant_switch_team_and_one_thread(fn, n, k, monkeypatch):
    raw, wd = _raw(n, k, seed=11)
    rng = np.random.default_rng(5)
    for m in (1, 2, 4):
        x = rng.normal(size=(m, k)).astype(np.float32)
        qd = nq._qdot_for("q8_0", m, n, k)
        assert qd is not None
        monkeypatch.setattr(nq, "QDOT_INT8", False)
        y16 = nq._native_qdot(qd, x, raw, "q8_0", n, k)
        monkeypatch.setattr(nq, "QDOT_INT8", True)
        direct = _call(fn, raw, x, n, k)
        outs = []
        for th in (1 << 62, 0):          # one thread, then the team (job 7)
            monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_BYTES", th)
            outs.append(nq._native_qdot(qd, x, raw, "q8_0", n, k))
        assert same_bits(outs[0], direct) and same_bits(outs[1], direct)
        assert not same_bits(y16, direct)       # (the switch does change the path)
        ref, scale, _ = _emulate(x, wd)
        np.testing.assert_array_less(np.abs(direct - ref), 4 * (k // 32 + 4) * 6e-8 * scale + 1e-30)


def test_parts_job(fn, monkeypatch):
    """team.c job 8 (q/k/v as parts of separate buffers) with the int8 path: each part's columns are
    its own product's bits, on one thread and on the team."""
    k = 576
    pt_raws, _, pw = _parts_weight("q8_0", (33, 17, 47), k, seed=2)
    pt = nq._PARTS[id(pw.data._buf)]
    monkeypatch.setattr(nq, "QDOT_INT8", True)
    rows = 33 + 17 + 47
    x = np.random.default_rng(9).normal(size=(1, k)).astype(np.float32)
    qd = nq._qdot_for("q8_0", 1, rows, k)
    outs = []
    for th in (1 << 62, 0):
        monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_BYTES", th)
        outs.append(nq._native_qdot_parts(qd, x, pt, "q8_0", rows, k))
    sep = np.concatenate([_call(fn, r, x, n, k) for r, n in zip(pt_raws, (33, 17, 47))], axis=1)
    assert same_bits(outs[0], sep) and same_bits(outs[1], sep)
