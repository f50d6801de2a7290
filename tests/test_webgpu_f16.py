"""float16 on webgpu in half storage (2-byte ``f16`` elements, where the device has
``shader-f16``: lavapipe does) and in the 4-byte form (``set_f16(False)``, EMBER_WEBGPU_F16=0,
a device without shader-f16). Every check runs with half storage on and off, against the same
op on device="numpy" (numpy float16): elementwise results bit for bit, reductions and matmul
within float16 rounding of a different summation order."""
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
    from ember.webgpu import fusion
    from ember.webgpu.runtime import get_runtime

    HAS_F16 = "shader-f16" in get_runtime().features
else:
    HAS_F16 = False


@pytest.fixture(params=["half", "wide"])
def mode(request):
    """Half storage on (skipped where the device has no shader-f16) or off, for the test."""
    if request.param == "half" and not HAS_F16:
        pytest.skip("this device has no shader-f16")
    old = wg.set_f16(request.param == "half")
    yield request.param
    wg.set_f16(old)


def h(a):
    return np.asarray(a, dtype=np.float16)


def both(fn, *arrays):
    """``fn`` on webgpu and on numpy tensors of ``arrays``: (webgpu result, numpy result)."""
    g = fn(*[ember.tensor(a, device="webgpu") for a in arrays])
    c = fn(*[ember.tensor(a, device="numpy") for a in arrays])
    return g.numpy(), c.numpy()


def same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype == np.float16:
        # NaNs may differ in payload; every other value bit for bit (-0 included)
        gn, wn = np.isnan(got), np.isnan(want)
        assert (gn == wn).all()
        np.testing.assert_array_equal(got.view(np.uint16)[~gn], want.view(np.uint16)[~wn])
    else:
        np.testing.assert_array_equal(got, want)


def close16(got, want, ulps=2):
    """Within ``ulps`` float16 steps of the larger magnitudes (a different summation order)."""
    assert got.dtype == np.float16 and got.shape == want.shape
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = max(np.abs(w).max(), 1e-3)
    np.testing.assert_allclose(g, w, rtol=0, atol=ulps * scale * 2.0 ** -10)


def rng(*shape, seed=0, scale=1.0):
    return h(np.random.default_rng(seed).standard_normal(shape) * scale)


SPECIAL = h([0.0, -0.0, 1.0, -1.5, 65504.0, -65504.0, np.inf, -np.inf, np.nan, 6e-8, -6e-8, 1e-5,
             2.0 ** -14, 0.1, 1 / 3, 1000.0, 3.0])


# ---- storage -----------------------------------------------------------------------------------

def test_round_trip_special_values(mode):
    t = ember.tensor(SPECIAL, device="webgpu")
    same_bits(t.numpy(), SPECIAL)
    assert fusion.is_half(t._buf) == (mode == "half")
    # views at odd element offsets read back as they are
    for sl in (slice(1, None), slice(3, 8), slice(None, None, 2), slice(5, 6)):
        same_bits(t[sl].numpy(), SPECIAL[sl])


def test_half_storage_is_two_bytes_an_element(mode):
    rt = get_runtime()
    n = 1 << 16
    before = rt.stats["bytes_in_use"]
    t = ember.tensor(np.ones(n, np.float16), device="webgpu")
    used = rt.stats["bytes_in_use"] - before
    per = 2 if mode == "half" else 4
    assert t._buf.storage.nbytes == per * n == used
    y = t * 3.0           # a fused result of a float16 expression: half storage too
    wg.evaluate(y)
    assert y._buf.storage.nbytes == per * n and fusion.is_half(y._buf) == (mode == "half")
    assert (y.numpy() == 3).all()


def test_odd_sizes_round_up_to_a_word(mode):
    for n in (1, 3, 5, 17):
        a = rng(n, seed=n)
        same_bits(ember.tensor(a, device="webgpu").numpy(), a)
        g, c = both(lambda x: x * 2.0 - 1.0, a)
        same_bits(g, c)


# ---- elementwise, casts ------------------------------------------------------------------------

def test_elementwise_chain(mode):
    a, b = rng(37, 19), rng(37, 19, seed=1)
    g, c = both(lambda x, y: ember.exp(x * 0.5) + y * y - ember.tanh(x - y) / 3.0, a, b)
    same_bits(g, c)
    g, c = both(lambda x, y: ember.where(x > y, x, ember.sqrt(ember.abs(y))), a, b)
    same_bits(g, c)


def test_special_values_through_ops(mode):
    g, c = both(lambda x: x * 2.0 + 1.0, SPECIAL)
    same_bits(g, c)
    g, c = both(lambda x: -x, SPECIAL)
    same_bits(g, c)


def test_broadcasts_and_transposed_views(mode):
    a, b, r = rng(8, 1, 5), rng(1, 6, 5, seed=1), rng(5, seed=2)
    g, c = both(lambda x, y, z: x * y + z, a, b, r)
    same_bits(g, c)
    m = rng(12, 7, seed=3)
    g, c = both(lambda x: ember.permute_dims(x, (1, 0)) * 2.0 + 1.0, m)
    same_bits(g, c)


def test_casts(mode):
    a = h([0.5, -2.75, 3.0, 1000.5, -0.0, 7.9, 250.0])
    for dt in (ember.float32, ember.int32, ember.int64, ember.uint8, ember.bool):
        g, c = both(lambda x: ember.astype(x, dt), a)
        same_bits(g, c)
    f = np.array([1e-8, 65519.0, 65520.0, 1 / 3, -7.25, 1e5], np.float32)
    g, c = both(lambda x: ember.astype(x, ember.float16), f)
    same_bits(g, c)
    i = np.array([3, -70000, 2048, 2049, 65504], np.int32)
    g, c = both(lambda x: ember.astype(x, ember.float16), i)
    same_bits(g, c)
    # a mixed float16/float32 expression promotes to float32
    g, c = both(lambda x, y: x + y, a, a.astype(np.float32) * 3)
    same_bits(g, c)


# ---- hand-written kernels: reductions, softmax, norms, conv, concat/pad/index ------------------

def test_reductions(mode):
    a = rng(33, 70, seed=4)
    for fn in (lambda x: ember.sum(x, axis=1), lambda x: ember.mean(x, axis=0), lambda x: ember.sum(x)):
        g, c = both(fn, a)
        close16(g, c)
    for fn in (lambda x: ember.max(x, axis=1), lambda x: ember.argmax(x, axis=0)):
        g, c = both(fn, a)
        same_bits(g, c)
    g, c = both(lambda x: ember.sum(x * 2.0 + 1.0, axis=1), a)   # a lazy operand fused into it
    close16(g, c)


def test_softmax_and_layer_norm(mode):
    a = rng(9, 50, seed=5, scale=3)
    w, b = rng(50, seed=6), rng(50, seed=7)
    g, c = both(lambda x: ember.softmax(x, axis=-1), a)
    close16(g, c)
    g, c = both(lambda x, y, z: ember.layer_norm(x, (50,), y, z), a, w, b)
    close16(g, c, ulps=4)


def test_conv2d(mode):
    x, w, b = rng(2, 3, 9, 9, seed=8), rng(4, 3, 3, 3, seed=9, scale=0.3), rng(4, seed=10)
    g, c = both(lambda x, w, b: ember.conv2d(x, w, b, padding=1), x, w, b)
    close16(g, c, ulps=4)
    x, w = rng(1, 8, 6, 6, seed=11), rng(40, 8, 1, 1, seed=12, scale=0.3)   # the matmul form
    g, c = both(lambda x, w: ember.conv2d(x, w), x, w)
    close16(g, c, ulps=4)


def test_concat_pad_take(mode):
    a, b = rng(4, 5), rng(3, 5, seed=1)
    g, c = both(lambda x, y: ember.concat([x, y * 2.0], axis=0), a, b)
    same_bits(g, c)
    g, c = both(lambda x: ember.pad(x, ((1, 2), (0, 3)), value=1.5), a)
    same_bits(g, c)
    g, c = both(lambda x: ember.pad(x[1:], ((1, 0), (2, 1)), mode="edge"), a)
    same_bits(g, c)
    idx = np.array([3, 0, 0, 2], np.int64)
    g, c = both(lambda x, i: ember.take(x, i, axis=0), a, idx)
    same_bits(g, c)


def test_chunked_elementwise(mode):
    """An expression over tensors larger than one binding runs in aligned chunks."""
    rt = get_runtime()
    a = rng(3000, seed=13)
    old = wg.set_limits(max_binding_bytes=1024)
    try:
        ta = ember.tensor(a, device="webgpu")
        got = (ta[7:] * 2.0 + ta[:-7]).numpy()
        got2 = (ember.astype(ta, ember.float32)[5:] * 3.0).numpy()   # half leaves, a 4-byte output
    finally:
        wg.set_limits(old["max_binding"], old["max_buffer"])
    want = (ember.tensor(a, device="numpy")[7:] * 2.0 + ember.tensor(a, device="numpy")[:-7]).numpy()
    same_bits(got, want)
    np.testing.assert_array_equal(got2, a[5:].astype(np.float32) * 3)
    assert rt.max_binding == old["max_binding"]


# ---- matmul --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shapes", [((1, 7), (7, 5)), ((33, 65), (65, 17)), ((64, 128), (128, 64)),
                                    ((130, 70), (70, 129)), ((3, 20, 30), (30, 10)),
                                    ((2, 17, 9), (2, 9, 33)), ((40,), (40, 6)), ((6, 40), (40,))])
def test_matmul(mode, shapes):
    a, b = rng(*shapes[0], seed=14, scale=0.5), rng(*shapes[1], seed=15, scale=0.5)
    g, c = both(ember.matmul, a, b)
    close16(g, c)


def test_matmul_transposed_views(mode):
    a, b = rng(40, 24, seed=16), rng(33, 40, seed=17)
    g, c = both(lambda x, y: ember.matmul(ember.permute_dims(x, (1, 0)), ember.permute_dims(y, (1, 0))), a, b)
    close16(g, c)


def test_linear_bias_gelu(mode):
    x, w, b = rng(10, 48, seed=18), rng(72, 48, seed=19, scale=0.2), rng(72, seed=20)
    g, c = both(lambda x, w, b: ember.gelu(ember.linear(x, w, b)), x, w, b)
    close16(g, c, ulps=4)


def test_mixed_f16_f32_matmul(mode):
    a, b = rng(20, 30, seed=21), np.random.default_rng(22).standard_normal((30, 11)).astype(np.float32)
    g, c = both(ember.matmul, a, b)
    np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-5)


# ---- plans, switches ---------------------------------------------------------------------------

def test_compiled_plan(mode):
    w = ember.tensor(rng(16, 16, seed=23, scale=0.3), device="webgpu")
    f = ember.compile(lambda x: ember.softmax(ember.matmul(x, w) + 1.0, axis=-1) * 2.0)
    xs = [rng(4, 16, seed=s) for s in range(4)]
    wn = ember.tensor(w.numpy(), device="numpy")
    for x in xs:
        got = f(ember.tensor(x, device="webgpu")).numpy()
        want = (ember.softmax(ember.matmul(ember.tensor(x, device="numpy"), wn) + 1.0, axis=-1) * 2.0).numpy()
        close16(got, want, ulps=4)


def test_set_f16_without_the_feature_stays_off(monkeypatch):
    rt = get_runtime()
    old = rt.half
    monkeypatch.setattr(rt, "features", frozenset(f for f in rt.features if f != "shader-f16"))
    try:
        wg.set_f16(True)
        assert rt.half is False
        t = ember.tensor(SPECIAL, device="webgpu")
        assert not fusion.is_half(t._buf) and t._buf.storage.nbytes >= 4 * SPECIAL.size
        same_bits(t.numpy(), SPECIAL)
    finally:
        rt.half = old


def test_env_switch_off_gives_the_four_byte_form():
    """EMBER_WEBGPU_F16=0: float16 in 4-byte storage, and no kernel source enables f16."""
    code = """
import numpy as np, ember
from ember.webgpu.runtime import get_runtime
import ember.webgpu.runtime as r
rt = get_runtime()
assert rt.half is False
srcs = []
real = rt.driver.pipeline
rt.driver.pipeline = lambda src, entry="main": (srcs.append(src), real(src, entry))[1]
a = np.arange(10, dtype=np.float16)
t = ember.tensor(a, device="webgpu")
assert t._buf.storage.nbytes >= 40 and not t._buf.storage.half
y = ember.matmul((t * 2.0).reshape(2, 5), ember.ones((5, 3), dtype=ember.float16, device="webgpu"))
assert y.dtype == ember.float16
print(y.numpy().tolist())
# every matmul variant's template and the other kernels of a float32 model (the page's SwiftShader
# refuses `enable f16;`: a template that merely names f16 in a comment once asked for it)
from ember.webgpu import autotune, linalg
x = ember.tensor(np.ones((128, 128), np.float32), device="webgpu")
for v in linalg.VARIANTS:
    autotune.force("matmul", v)
    (ember.gelu(x @ x + 1.0)).numpy()
autotune.force("matmul", None)
img = ember.tensor(np.ones((1, 3, 16, 16), np.float32), device="webgpu")
k = ember.tensor(np.ones((4, 3, 3, 3), np.float32), device="webgpu")
ember.softmax(ember.conv2d(img, k), axis=-1).numpy()
assert not any("enable f16" in s or "array<f16>" in s for s in srcs), "an f16 kernel without half storage"
print("ok")
"""
    env = dict(os.environ, EMBER_WEBGPU_F16="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_matmul_reads_and_writes_half_storage(mode, monkeypatch):
    """Half operands go straight into the matmul kernel (no 4-byte copies) and a float16 result,
    bias and GELU included (EMBER_WEBGPU_HEAVY_EPILOGUE=1), comes out of its epilogue in half
    storage: one dispatch."""
    monkeypatch.setattr(fusion, "_HEAVY_OFF", False)
    rt = get_runtime()
    x, w, b = rng(24, 40, seed=24), rng(56, 40, seed=25, scale=0.2), rng(56, seed=26)
    tx, tw, tb = (ember.tensor(v, device="webgpu") for v in (x, w, b))
    rt.driver.flush()
    d0 = rt.stats["dispatches"]
    y = ember.gelu(ember.linear(tx, tw, tb))
    wg.evaluate(y)
    assert rt.stats["dispatches"] - d0 == 1
    assert fusion.is_half(y._buf) == (mode == "half")
    c = ember.gelu(ember.linear(*(ember.tensor(v, device="numpy") for v in (x, w, b))))
    close16(y.numpy(), c.numpy(), ulps=4)


def test_sum_reads_half_storage_in_place(mode):
    """A reduction of a half tensor loads its f16 elements itself: no 4-byte copy first."""
    rt = get_runtime()
    t = ember.tensor(rng(16, 300, seed=27), device="webgpu")
    rt.driver.flush()
    d0 = rt.stats["dispatches"]
    s = ember.sum(t, axis=1)
    wg.evaluate(s)
    assert rt.stats["dispatches"] - d0 == 2      # the reduction, the rounding to float16
    close16(s.numpy(), ember.sum(ember.tensor(t.numpy(), device="numpy"), axis=1).numpy())


@pytest.mark.parametrize("variant", ["tiled", "rb32", "rb64", "rb128", "sk", "sg", "mv", "bare", "bare2"])
def test_every_matmul_variant(mode, variant):
    """Each kernel variant forced (those a shape is not eligible for fall back to the default),
    with and without an epilogue, plain and transposed A: half operands read as f16, a float16
    result written half."""
    from ember.webgpu import autotune

    shapes = [((33, 65), (65, 17)), ((4, 300), (300, 64)), ((130, 300), (300, 129)), ((256, 512), (512, 256))]
    old = autotune.forced("matmul")
    autotune.force("matmul", variant)
    try:
        for sa, sb in shapes:
            a, b = rng(*sa, seed=30, scale=0.5), rng(*sb, seed=31, scale=0.5)
            for fn in (lambda x, y: ember.matmul(x, y), lambda x, y: ember.matmul(x, y) * 0.5 + 1.0,
                       lambda x, y: ember.matmul(ember.permute_dims(ember.permute_dims(x, (1, 0)) * 1.0, (1, 0)), y)):
                g, c = both(fn, a, b)
                close16(g, c)
    finally:
        autotune.force("matmul", old)


def test_chunked_matmul(mode):
    """Operands over one binding: the matmul by row blocks, binding windows of half storage."""
    a, b = rng(300, 64, seed=32, scale=0.5), rng(64, 12, seed=33, scale=0.5)
    old = wg.set_limits(max_binding_bytes=4096)
    try:
        g, c = both(lambda x, y: ember.matmul(x, y) + 1.0, a, b)
        g2, c2 = both(lambda x, y: ember.matmul(x[3:], y), a, b)
    finally:
        wg.set_limits(old["max_binding"], old["max_buffer"])
    close16(g, c)
    close16(g2, c2)
