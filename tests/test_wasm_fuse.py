"""Inference fusions of a compiled plan on device "wasm" (wasm/plan_fuse.py): an eval-mode batch
norm folded into the conv before it, a relu stored by the conv. Each case runs the compiled
function (command tables, fused) against eager (unfused kernels) and a float64 numpy reference;
relu alone keeps eager's bits; constants replaced after compiling are folded again; what must not
fuse does not. Runs on wasmtime in CPython."""
from __future__ import annotations

import pytest

import ember

np = pytest.importorskip("numpy")
pytest.importorskip("wasmtime")

from op_cases_nn import _np_conv2d  # noqa: E402

from ember.wasm import plan_fuse  # noqa: E402


def _t(a):
    a = np.ascontiguousarray(a, np.float32)
    return ember.from_bytes(a.tobytes(), a.shape, "float32", device="wasm")


def _np(t):
    return np.frombuffer(bytes(t.to("python")._buf), np.float32).reshape(t.shape)


def _params(rng, c_in, c_out, k, groups=1, bias=True):
    w = rng.standard_normal((c_out, c_in // groups, k, k)).astype(np.float32)
    b = rng.standard_normal(c_out).astype(np.float32) if bias else None
    stats = [rng.standard_normal(c_out).astype(np.float32),              # mean
             (rng.random(c_out) * 2 + 0.1).astype(np.float32),           # var
             rng.standard_normal(c_out).astype(np.float32),              # weight (gamma)
             rng.standard_normal(c_out).astype(np.float32)]              # bias (beta)
    return w, b, stats


def _ref(x, w, b, stats, pad, groups, eps, relu=True):
    y = _np_conv2d(np, x.astype(np.float64), w.astype(np.float64), None if b is None else b.astype(np.float64),
                   (1, 1), ((pad, pad), (pad, pad)), (1, 1), groups)
    m, v, g, be = (s.astype(np.float64)[None, :, None, None] for s in stats)
    y = (y - m) / np.sqrt(v + eps) * g + be
    return np.maximum(y, 0) if relu else y


def _compiled(fn, x):
    f = ember.compile(fn)
    for _ in range(3):
        out = f(x)
    return f, out


CASES = [  # (n, c_in, h, w), c_out, k, pad, groups, bias
    ((1, 16, 14, 14), 32, 3, 1, 1, True),     # MNIST conv2
    ((2, 3, 9, 7), 5, 3, 0, 1, False),        # no bias, a batch of 2
    ((1, 4, 8, 8), 8, 3, 1, 4, True),         # groups
    ((1, 6, 10, 10), 6, 3, 1, 6, True),       # depthwise (conv2d_depthwise)
]


@pytest.mark.parametrize("xs, c_out, k, pad, groups, bias", CASES)
def test_conv_batchnorm_relu_folds_and_matches(xs, c_out, k, pad, groups, bias):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(xs).astype(np.float32)
    w, b, stats = _params(rng, xs[1], c_out, k, groups, bias)
    tw, tb = _t(w), (_t(b) if bias else None)
    ts = [_t(s) for s in stats]
    eps = 1e-3

    def fn(x):
        y = ember.conv2d(x, tw, tb, padding=pad, groups=groups)
        return ember.relu(ember.batch_norm(y, *ts, eps=eps))

    f, out = _compiled(fn, _t(x))
    d = f.plan_for(_t(x)).fast.describe()
    assert d["fused"] == ["conv2d + batch_norm + relu"]
    assert d["table_steps"] == 1 and d["segments"] == 1
    eager = _np(fn(_t(x)))
    got = _np(out)
    ref = _ref(x, w, b, stats, pad, groups, eps)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-5)


def test_conv_relu_alone_keeps_eager_bits():
    """A relu in the conv's store gives the bits of the two steps, NaN included."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
    x[0, 1, 5, 5] = np.nan
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    tw, tb = _t(w), _t(np.zeros(8, np.float32))

    def fn(x):
        return ember.relu(ember.conv2d(x, tw, tb, padding=1))

    f, out = _compiled(fn, _t(x))
    assert f.plan_for(_t(x)).fast.describe()["fused"] == ["conv2d + relu"]
    got, eager = _np(out), _np(fn(_t(x)))
    assert np.isnan(got).any() and (got == 0).any() and (got > 0).any()
    assert got.tobytes() == eager.tobytes()


def test_mnist_net_fused_matches_eager():
    import os
    import sys

    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demos", "mnist")
    sys.path.insert(0, here)
    try:
        import model as mnist
    finally:
        sys.path.remove(here)
    net = mnist.load_model(os.path.join(here, "mnist.safetensors"), device="wasm")
    net.eval()
    x = _t(np.random.default_rng(3).random((1, 1, 28, 28)))
    f, out = _compiled(net, x)
    d = f.plan_for(x).fast.describe()
    assert d["fused"] == ["conv2d + batch_norm + relu"] * 2
    assert d["table_steps"] == 9     # 13 steps before: two batch norms and two relus gone
    np.testing.assert_allclose(_np(out), _np(net(x)), rtol=1e-4, atol=1e-5)


def _small_block(seed):
    """A 1x2x6x6 input and a 2 -> 3 channel 3x3 conv (with bias) + batch norm + relu on constant
    tensors: (x, w, b, stats, the weight, bias and statistics tensors, the function)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    w, b, stats = _params(rng, 2, 3, 3)
    tw, tb = _t(w), _t(b)
    ts = [_t(s) for s in stats]

    def fn(x):
        return ember.relu(ember.batch_norm(ember.conv2d(x, tw, tb, padding=1), *ts))

    return x, w, b, stats, tw, tb, ts, fn


def test_replaced_constants_are_folded_again():
    """A weight or a statistic replaced after compiling (``copy_``: a new buffer) is folded again
    before the next replay: the result follows the new values."""
    x, w, b, stats, tw, tb, ts, fn = _small_block(4)

    f, _ = _compiled(fn, _t(x))
    for t, new in [(tw, w * 2), (ts[0], stats[0] + 1), (ts[1], stats[1] * 3), (tb, -b)]:
        t.copy_(_t(new))
        got = _np(f(_t(x)))
        np.testing.assert_allclose(got, _np(fn(_t(x))), rtol=1e-5, atol=1e-5)
    w, b = w * 2, -b
    stats = [stats[0] + 1, stats[1] * 3, stats[2], stats[3]]
    np.testing.assert_allclose(got, _ref(x, w, b, stats, 1, 1, 1e-5), rtol=1e-4, atol=1e-4)
    assert f.plan_for(_t(x)).fast.describe()["fused"] == ["conv2d + batch_norm + relu"]


def test_what_must_not_fuse():
    x, _, _, _, tw, tb, ts, _ = _small_block(5)

    def both(x):   # the conv's output is read twice: nothing folds; the relu after the bn stays
        y = ember.conv2d(x, tw, tb, padding=1)
        return ember.relu(ember.batch_norm(y, *ts)) + y

    def returned(x):   # the conv's output is an output too
        y = ember.conv2d(x, tw, tb, padding=1)
        return y, ember.relu(y)

    def stats_in(x, mean):   # a statistic that is an input, not a constant: no fold (and the relu
        # reads the batch norm, not the conv)
        return ember.relu(ember.batch_norm(ember.conv2d(x, tw, tb, padding=1), mean, *ts[1:]))

    f, out = _compiled(both, _t(x))
    assert f.plan_for(_t(x)).fast.describe()["fused"] == []
    np.testing.assert_allclose(_np(out), _np(both(_t(x))), rtol=1e-6, atol=1e-6)
    f, out = _compiled(returned, _t(x))
    assert f.plan_for(_t(x)).fast.describe()["fused"] == []
    assert _np(out[1]).tobytes() == _np(returned(_t(x))[1]).tobytes()
    f = ember.compile(stats_in)
    for _ in range(3):
        out = f(_t(x), ts[0])
    assert f.plan_for(_t(x), ts[0]).fast.describe()["fused"] == []
    np.testing.assert_allclose(_np(out), _np(stats_in(_t(x), ts[0])), rtol=1e-6, atol=1e-6)


def test_fusion_off(monkeypatch):
    monkeypatch.setattr(plan_fuse, "ENABLED", False)
    x, *_, fn = _small_block(6)

    f, out = _compiled(fn, _t(x))
    d = f.plan_for(_t(x)).fast.describe()
    assert "fused" not in d and d["table_steps"] == 3
    assert _np(out).tobytes() == _np(fn(_t(x))).tobytes()   # unfused: eager's bits
