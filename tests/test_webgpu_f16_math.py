"""The ``rbh`` matmul variant: float16 products of half-stored operands with f16 multiply-adds
(``ember.webgpu.linalg``, ``kernels/matmul_rb.wgsl`` in f16), forced and checked against a float64
product of the same float16 inputs.

Error bound (``bound``): u16 = 2^-11, u32 = 2^-24, S = |A| @ |B| (float64), BK = RBH's k tile.
Within a k tile rbh sums BK f16 products in f16: at most BK roundings touch each product (its own,
unless the driver fuses it, and BK - 1 additions), so a tile's f16 sum is off by at most
~(BK + 1) u16 of its S; the tiles' sums are then added in f32 (at most K / BK + 1 roundings of
u32), the epilogue runs in f32 and the result is rounded to float16 once (u16 of the result).
Products under f16's normal range are rounded to its subnormal step (2^-24, so at most 2^-25
each). So |C - ref| <= ((BK + 1) u16 + (K / BK + 1) u32) S + u16 |ref| + (K + 1) 2^-25. Nothing
in it grows with K but S itself (and the f32 part): the f16 part is a k tile's, never K's.
That worst case is loose; the typical error is checked too (``rms_ok``): a tile's f16 sum errs
by about u16 of itself (~sqrt(BK) products), the K / BK tiles' errors add at random as their
values do, so the root mean square error is about u16 sqrt(BK) of the result's, whatever K:
allowed 2 u16 sqrt(BK) (0.39% at BK 16), which a plain f16 running sum over K = 4096 exceeds
(``test_large_k_error_does_not_grow_with_k``)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import ember

from conftest import webgpu_only

_REASON, pytestmark = webgpu_only()
if _REASON is None:
    import ember.webgpu as wg
    from ember.webgpu import autotune, fusion, linalg
    from ember.webgpu.runtime import get_runtime

    HAS_F16 = "shader-f16" in get_runtime().features
else:
    HAS_F16 = False

U16, U32 = 2.0 ** -11, 2.0 ** -24


@pytest.fixture
def half():
    """Half storage on (skipped where the device has no shader-f16) and f16 math allowed."""
    if not HAS_F16:
        pytest.skip("this device has no shader-f16")
    old = wg.set_f16(True)
    env = os.environ.pop("EMBER_WEBGPU_F16_MATH", None)
    yield
    wg.set_f16(old)
    if env is not None:
        os.environ["EMBER_WEBGPU_F16_MATH"] = env


@pytest.fixture
def variants(monkeypatch):
    """The variants dispatched during the test (names as ``MatmulPlan._record`` gets them)."""
    seen = []
    orig = linalg.MatmulPlan._record

    def spy(self, variant, *a, **k):
        seen.append(variant)
        return orig(self, variant, *a, **k)
    monkeypatch.setattr(linalg.MatmulPlan, "_record", spy)
    return seen


def forced(variant, fn):
    old = autotune.forced("matmul")
    autotune.force("matmul", variant)
    try:
        return fn()
    finally:
        autotune.force("matmul", old)


def h(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float16)


def bound(a, b, ref, bk=None):
    """The worst-case error of rbh for float16 inputs a, b (module docstring)."""
    bk = bk or linalg.RBH[4]
    K = a.shape[-1]
    S = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    return ((bk + 1) * U16 + (K / bk + 1) * U32) * S * 1.01 + U16 * np.abs(ref) + (K + 1) * 2.0 ** -25


def rms_ok(got, ref, bk=None):
    bk = bk or linalg.RBH[4]
    err = np.sqrt(np.mean((got.astype(np.float64) - ref) ** 2))
    return err <= 2 * U16 * np.sqrt(bk) * np.sqrt(np.mean(ref ** 2)), err / max(np.sqrt(np.mean(ref ** 2)), 1e-30)


def check(fn, arrays, seen, bk=None):
    """fn on webgpu float16 tensors of ``arrays`` with rbh forced, against fn in float64; rbh must
    have run. Returns the relative rms error."""
    seen.clear()
    got = forced("rbh", lambda: fn(*[ember.tensor(x, device="webgpu") for x in arrays]).numpy())
    assert "rbh" in seen, seen
    ref = fn(*[ember.tensor(x.astype(np.float64), device="numpy") for x in arrays]).numpy()
    assert got.dtype == np.float16 and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    return got, ref


SHAPES = [(1, 1, 1), (1, 5, 1), (5, 7, 3), (3, 16, 4), (33, 17, 65), (17, 33, 9), (64, 40, 200),
          (128, 128, 128), (130, 70, 131), (129, 257, 127), (256, 48, 128)]


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_forced_rbh_within_the_bound(half, variants, m, k, n):
    a, b = h((m, k), 1), h((k, n), 2)
    got, ref = check(lambda x, y: x @ y, (a, b), variants)
    err = np.abs(got.astype(np.float64) - ref)
    assert (err <= bound(a, b, ref)).all(), float((err / bound(a, b, ref)).max())
    if m * n >= 64:
        ok, rel = rms_ok(got, ref)
        assert ok, rel


def test_f16_math_is_half_precision(half, variants):
    """rbh really sums in f16 (lavapipe too): its error is larger than the f32 variants' (which
    only round the result), yet within the bound."""
    a, b = h((128, 512), 3), h((512, 128), 4)
    got, ref = check(lambda x, y: x @ y, (a, b), variants)
    f32 = forced("rb128", lambda: (ember.tensor(a, device="webgpu") @ ember.tensor(b, device="webgpu")).numpy())
    e16 = np.sqrt(np.mean((got - ref) ** 2))
    e32 = np.sqrt(np.mean((f32 - ref) ** 2))
    assert e16 > 1.5 * e32, (e16, e32)
    assert (np.abs(got - ref) <= bound(a, b, ref)).all()


def _f16_running_sum(a, b):
    """A plain f16 running sum over all of K (what rbh avoids), in numpy."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float16)
    for k in range(a.shape[1]):
        acc = (acc + (a[:, k:k + 1] * b[k:k + 1, :]).astype(np.float16)).astype(np.float16)
    return acc


def test_large_k_error_does_not_grow_with_k(half, variants):
    """K = 4096: the relative rms error stays about what it is at K = 64 (a k tile's f16 sum),
    while a plain f16 running sum over K exceeds the allowed error (it grows like sqrt(K))."""
    rels = {}
    for K in (64, 4096):
        a, b = h((32, K), 5), h((K, 48), 6)
        got, ref = check(lambda x, y: x @ y, (a, b), variants)
        assert (np.abs(got - ref) <= bound(a, b, ref)).all()
        ok, rels[K] = rms_ok(got, ref)
        assert ok, rels
        if K == 4096:
            ok_plain, rel_plain = rms_ok(_f16_running_sum(a, b), ref)
            assert not ok_plain and rel_plain > 4 * rels[K], (rel_plain, rels)
    assert rels[4096] < 2 * rels[64] + 2 * U16, rels


def test_batched_and_broadcast(half, variants):
    a, b = h((3, 2, 33, 40), 7), h((3, 2, 40, 20), 8)
    got, ref = check(lambda x, y: x @ y, (a, b), variants)
    assert (np.abs(got - ref) <= bound(a, b, ref)).all()
    # one weight for every batch (folded into one product of 3 * 33 rows), and A broadcast over B's batch
    for a, b in ((h((3, 33, 40), 9), h((40, 20), 10)), (h((33, 40), 11), h((4, 40, 20), 12)),
                 (h((2, 1, 9, 24), 13), h((1, 3, 24, 7), 14))):
        got, ref = check(lambda x, y: x @ y, (a, b), variants)
        assert (np.abs(got - ref) <= bound(a, b, ref)).all(), (a.shape, b.shape)


@pytest.mark.parametrize("m,k,n", [(33, 40, 20), (128, 64, 128), (7, 5, 9)])
def test_transposed_and_offset_views(half, variants, m, k, n):
    """A along its rows (x.T), B along k (w.T), both, and views starting at odd elements (no
    vec4 loads): read through their strides, no copies."""
    at, bt = h((k, m), 15), h((n, k), 16)
    a, b = h((m, k), 17), h((k, n), 18)
    big_a, big_b = h((m, k + 1), 19), h((k + 1, n), 20)
    T = lambda x: ember.permute_dims(x, (1, 0))        # noqa: E731
    cases = [(lambda x, y: T(x) @ y, (at, b), (at.T, b)),
             (lambda x, y: x @ T(y), (a, bt), (a, bt.T)),
             (lambda x, y: T(x) @ T(y), (at, bt), (at.T, bt.T)),
             (lambda x, y: x[:, 1:] @ y[1:], (big_a, big_b), (big_a[:, 1:], big_b[1:]))]
    for fn, arrays, (A, B) in cases:       # (A, B: the operands as the product sees them)
        got, ref = check(fn, arrays, variants)
        assert (np.abs(got - ref) <= bound(A, B, ref)).all()


def test_bias_gelu_epilogue_one_dispatch(half, variants, monkeypatch):
    """linear + bias + GELU (EMBER_WEBGPU_HEAVY_EPILOGUE=1): the f32 epilogue in rbh's stores,
    one dispatch, a half result."""
    monkeypatch.setattr(fusion, "_HEAVY_OFF", False)
    rt = get_runtime()
    x, w, bias = h((24, 40), 21), h((56, 40), 22, 0.2), h((56,), 23)

    def run():
        tx, tw, tb = (ember.tensor(v, device="webgpu") for v in (x, w, bias))
        rt.driver.flush()
        d0 = rt.stats["dispatches"]
        y = ember.gelu(ember.linear(tx, tw, tb))
        wg.evaluate(y)
        assert rt.stats["dispatches"] - d0 == 1
        assert fusion.is_half(y._buf)
        return y.numpy()
    variants.clear()
    got = forced("rbh", run)
    assert variants == ["rbh"], variants
    z = x.astype(np.float64) @ w.astype(np.float64).T
    zb = z + bias.astype(np.float64)
    ref = ember.gelu(ember.tensor(zb, device="numpy")).numpy()
    # the bound of the product; GELU's slope is at most ~1.13, plus the rounding of the result
    err_z = bound(x, w.T, z) + U16 * np.abs(zb)
    assert (np.abs(got - ref) <= 1.13 * err_z + U16 * np.abs(ref)).all()


def test_other_tile_config(half, variants, monkeypatch):
    """RBH with k tiles of 32 (64x64 tiles, 4x4 a thread): the bound with BK = 32."""
    monkeypatch.setattr(linalg, "RBH", (64, 64, 4, 4, 32))
    for m, k, n in ((65, 100, 33), (64, 64, 64), (3, 1000, 5)):
        a, b = h((m, k), 24), h((k, n), 25)
        got, ref = check(lambda x, y: x @ y, (a, b), variants)
        assert (np.abs(got - ref) <= bound(a, b, ref, bk=32)).all()


# ---- eligibility -------------------------------------------------------------------------------

def test_never_for_float32_or_mixed(half, variants):
    """rbh forced on a float32 product, a float16 @ float32 one (float32 result) and a float16
    product whose operands are not both half: another variant runs, in f32."""
    rt = get_runtime()
    assert not linalg.eligible(rt, "rbh", 64, 64, 64, "f32")
    a, b = h((40, 24), 26), h((24, 36), 27)
    cases = [(a.astype(np.float32), b.astype(np.float32)), (a, b.astype(np.float32)), (a.astype(np.float32), b)]
    for x, y in cases:
        variants.clear()
        got = forced("rbh", lambda: (ember.tensor(x, device="webgpu") @ ember.tensor(y, device="webgpu")).numpy())
        assert variants and "rbh" not in variants, variants
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, x.astype(np.float64) @ y.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_not_with_half_storage_off(variants):
    old = wg.set_f16(False)
    try:
        a, b = h((40, 24), 28), h((24, 36), 29)
        variants.clear()
        got = forced("rbh", lambda: (ember.tensor(a, device="webgpu") @ ember.tensor(b, device="webgpu")).numpy())
        assert variants and "rbh" not in variants, variants
        assert not linalg.eligible(get_runtime(), "rbh", 40, 36, 24, "f32", True)
    finally:
        wg.set_f16(old)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert (np.abs(got - ref) <= U16 * np.abs(ref) + 1e-3 * np.abs(ref).max()).all()


def test_env_switch_off(half, variants, monkeypatch):
    """EMBER_WEBGPU_F16_MATH=0: no rbh, and the autotune key is the one without it."""
    a, b = h((40, 24), 30), h((24, 36), 31)
    ta, tb = ember.tensor(a, device="webgpu"), ember.tensor(b, device="webgpu")
    out = ember.float16
    from ember.registry import Meta
    on = linalg.MatmulPlan(get_runtime(), ta._buf, tb._buf, Meta((40, 36), out))
    monkeypatch.setenv("EMBER_WEBGPU_F16_MATH", "0")
    off = linalg.MatmulPlan(get_runtime(), ta._buf, tb._buf, Meta((40, 36), out))
    assert on.rbh_ok and not off.rbh_ok
    assert "f32:hhm|" in on.key_epilogue and "f32:hh|" in off.key_epilogue
    variants.clear()
    forced("rbh", lambda: (ta @ tb).numpy())
    assert variants and "rbh" not in variants


def test_env_switch_in_a_subprocess():
    """EMBER_WEBGPU_F16_MATH=0 at start-up: a forced rbh runs in f32 (no matmul_rbh pipeline)."""
    if not HAS_F16:
        pytest.skip("this device has no shader-f16")
    code = ("import numpy as np, ember\nfrom ember.webgpu import autotune\nfrom ember.webgpu.runtime import get_runtime\n"
            "autotune.force('matmul', 'rbh')\n"
            "a = np.ones((8, 8), np.float16)\n"
            "y = (ember.tensor(a, device='webgpu') @ ember.tensor(a, device='webgpu')).numpy()\n"
            "assert (y == 8).all()\n"
            "print(sorted({k[0] for k in get_runtime().pipelines if isinstance(k, tuple) and str(k[0]).startswith('matmul')}))\n")
    env = dict(os.environ, EMBER_WEBGPU_F16_MATH="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "matmul_rbh" not in r.stdout and "matmul_" in r.stdout, r.stdout


# ---- autotune's check --------------------------------------------------------------------------

def test_close_accepts_rbh_and_rejects_wrong_results(half, variants):
    """``_close(..., half=True)`` takes rbh's result against the default's (f32 sums) at K = 64
    and 4096, and rejects: one k tile of 16 left out, a result transposed, one value 5% of the
    largest off, an inf (an f16 overflow) and a NaN. The f32 check rejects rbh's result at K = 4096
    (why the float16 key uses the other)."""
    for K in (64, 4096):
        a, b = h((64, K), 32), h((K, 64), 33)
        ta, tb = ember.tensor(a, device="webgpu"), ember.tensor(b, device="webgpu")
        got = forced("rbh", lambda: (ta @ tb).numpy()).astype(np.float64)
        ref = forced("rb64", lambda: (ta @ tb).numpy()).astype(np.float64)
        assert linalg._close(got.ravel().tolist(), ref.ravel().tolist(), True)
        if K == 4096:
            assert not linalg._close(got.ravel().tolist(), ref.ravel().tolist(), False) or \
                np.abs(got - ref).max() <= 1e-3 * np.abs(ref).max()
        bk = linalg.RBH[4]
        drop = ref - a[:, :bk].astype(np.float64) @ b[:bk].astype(np.float64)
        wrong = [drop, ref.T.copy(), ref.copy(), ref.copy(), ref.copy()]
        wrong[2][3, 5] += 0.05 * np.abs(ref).max()
        wrong[3][1, 1] = np.inf
        wrong[4][2, 7] = np.nan
        for i, w in enumerate(wrong):
            if i == 0 and K == 64:
                continue  # (a quarter of the product: certainly wrong, and caught; K = 4096 is the hard case)
            assert not linalg._close(w.ravel().tolist(), ref.ravel().tolist(), True), (K, i)


def _fresh_autotune(monkeypatch, tmp_path):
    """Autotune on, with an empty table of its own and nothing forced; returns the forced
    variant to put back."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(autotune, "_MEMORY", {})
    monkeypatch.setattr(autotune, "_LOADED", [True])
    monkeypatch.setitem(autotune._STATE, "enabled", True)
    old = autotune.forced("matmul")
    autotune.force("matmul", None)
    return old


def test_autotune_offers_rbh_for_float16(half, variants, monkeypatch, tmp_path):
    """A fresh autotune table: a float16 product times rbh among its candidates (its key ends
    in "m") and whichever wins gives a correct result; a float32 product never runs rbh."""
    old = _fresh_autotune(monkeypatch, tmp_path)
    try:
        a, b = h((128, 256), 34), h((256, 128), 35)
        variants.clear()
        got = (ember.tensor(a, device="webgpu") @ ember.tensor(b, device="webgpu")).numpy()
        assert "rbh" in variants, variants
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert (np.abs(got - ref) <= bound(a, b, ref)).all()
        table = autotune._table(get_runtime())
        keys = [k for k in table if "f32:hhm|" in k]
        assert keys and table[keys[0]] in linalg.VARIANTS, table
        variants.clear()
        (ember.tensor(a.astype(np.float32), device="webgpu") @ ember.tensor(b.astype(np.float32), device="webgpu")).numpy()
        assert "rbh" not in variants
    finally:
        autotune.force("matmul", old)


def test_f16_overflow_forced_and_autotuned(half, variants, monkeypatch, tmp_path):
    """Products past f16's 65504 (300 * 300): rbh forced overflows (its partial sums are f16: inf -
    inf is NaN where the exact result is 0), and autotune's check rejects it on such inputs, so
    the autotuned product is exact."""
    a = np.full((128, 32), 300, np.float16)
    b = np.tile(np.array([[300], [-300]], np.float16), (16, 128))
    ta, tb = ember.tensor(a, device="webgpu"), ember.tensor(b, device="webgpu")
    got = forced("rbh", lambda: (ta @ tb).numpy())
    assert not np.isfinite(got).all()
    old = _fresh_autotune(monkeypatch, tmp_path)
    try:
        variants.clear()
        out = (ta @ tb).numpy()
    finally:
        autotune.force("matmul", old)
    assert "rbh" in variants                # (timed, then rejected)
    np.testing.assert_array_equal(out, np.zeros((128, 128), np.float16))
