"""webgpu kernels that a training step's backward leans on, against float64 numpy: reductions over
leading, middle and trailing axes in one pass or in parts (``ops.reduce_layout``), max-pool's
backward as one kernel, convolution weight gradients as batched matmuls. Runs on any adapter
(lavapipe here)."""
import numpy as np
import pytest

import ember


def _close(got, ref, n):
    """float32 reduction of ``n`` elements against float64."""
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), ref, rtol=1e-4, atol=1e-5 * max(1.0, np.sqrt(n)))


# ---- reductions ------------------------------------------------------------------------------

REDUCE_CASES = [
    ((25, 1, 576), (0,)),            # the latency-bound leading-axis sum (H100: 32 us, 3 workgroups)
    ((64, 16, 28, 28), (0, 2, 3)),   # BatchNorm statistics: 16 outputs of 50,176 elements
    ((64, 32, 14, 14), (0, 2, 3)),
    ((1024, 384), (0,)),             # a bias gradient: sum over the batch
    ((1031, 37), (0,)),              # odd sizes
    ((3, 4099, 5), (1,)),            # a middle axis
    ((3, 4099, 5), (0, 2)),
    ((6, 5, 7001), (2,)),            # a trailing axis
    ((6, 5, 7001), (0, 1)),
    ((200003,), (0,)),               # everything into one value, in parts
    ((9, 11), (0, 1)),
    ((64, 10), (0,)),
    ((2, 12, 17, 128), (3,)),        # attention rows: two a workgroup
    ((333, 100), (1,)),              # rows shorter than their lanes
]


@pytest.mark.parametrize("shape,axes", REDUCE_CASES)
def test_sum_max_min_over_any_axes(rt, shape, axes):
    rng = np.random.default_rng(len(shape) * 7 + sum(axes))
    x = rng.standard_normal(shape).astype(np.float32) + 0.25
    t = ember.tensor(x, device="webgpu")
    n = int(np.prod([shape[a] for a in axes]))
    _close(ember.sum(t, axis=axes).tolist(), x.astype(np.float64).sum(axis=axes), n)
    np.testing.assert_array_equal(np.asarray(ember.max(t, axis=axes).tolist(), dtype=np.float32), x.max(axis=axes))
    np.testing.assert_array_equal(np.asarray(ember.min(t, axis=axes).tolist(), dtype=np.float32), x.min(axis=axes))


@pytest.mark.parametrize("shape,axes", [((64, 16, 28, 28), (0, 2, 3)), ((1024, 384), (0,)), ((50001,), (0,))])
def test_fused_expression_summed_in_parts(rt, shape, axes):
    """A lazy elementwise expression is computed inside the partial pass (a loss's squared
    difference, BatchNorm's centred squares)."""
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    ta, tb = ember.tensor(a, device="webgpu"), ember.tensor(b, device="webgpu")
    d = a.astype(np.float64) - b
    _close(ember.sum((ta - tb) * (ta - tb), axis=axes).tolist(), (d * d).sum(axis=axes),
           int(np.prod([shape[k] for k in axes])))


@pytest.mark.parametrize("shape,axes", [((8, 128, 384), (2,)), ((64, 16, 28, 28), (0, 2, 3)), ((5, 7), (0,)),
                                        ((100003,), (0,)), ((3, 4099, 5), (1,))])
def test_mean_divides_in_the_reduction(rt, shape, axes):
    rng = np.random.default_rng(12)
    x = rng.standard_normal(shape).astype(np.float32) + 1.0
    t = ember.tensor(x, device="webgpu")
    for keepdims in (False, True):
        got = np.asarray(ember.mean(t, axis=axes, keepdims=keepdims).tolist())
        ref = x.astype(np.float64).mean(axis=axes, keepdims=keepdims)
        assert got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_mean_is_a_realised_buffer(rt):
    """x - mean(x) over the last axis: the reduction and one elementwise dispatch (the composite's
    lazy sum / count was realised on its own first); ints and empty axes keep the composite."""
    x = ember.tensor(np.random.default_rng(13).standard_normal((64, 300)).astype(np.float32), device="webgpu")
    rt.driver.flush()
    d0 = rt.stats["dispatches"]
    d = (x - ember.mean(x, axis=-1, keepdims=True)).numpy()
    assert rt.stats["dispatches"] - d0 == 2
    np.testing.assert_allclose(d.mean(axis=-1), 0, atol=1e-5)
    xi = ember.tensor(np.arange(12, dtype=np.int32).reshape(3, 4), device="webgpu")
    assert ember.mean(xi, axis=0).tolist() == [4.0, 5.0, 6.0, 7.0]
    assert all(np.isnan(ember.mean(ember.tensor(np.ones((0, 3), np.float32), device="webgpu"), axis=0).tolist()))


def test_strided_views_and_ints(rt):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((33, 70, 9)).astype(np.float32)
    t = ember.permute_dims(ember.tensor(x, device="webgpu"), (2, 0, 1))          # (9, 33, 70), strided
    xp = x.transpose(2, 0, 1).astype(np.float64)
    for axes in ((0,), (1,), (2,), (0, 2), (1, 2), (0, 1)):
        _close(ember.sum(t, axis=axes).tolist(), xp.sum(axis=axes), int(np.prod([xp.shape[a] for a in axes])))
    xi = rng.integers(-1000, 1000, (5000, 3)).astype(np.int32)
    ti = ember.tensor(xi, device="webgpu")
    for ax in (0, 1):
        np.testing.assert_array_equal(np.asarray(ember.sum(ti, axis=ax).tolist()), xi.sum(axis=ax))
        np.testing.assert_array_equal(np.asarray(ember.max(ti, axis=ax).tolist()), xi.max(axis=ax))


def test_prod_and_argmax_unchanged(rt):
    rng = np.random.default_rng(3)
    x = rng.uniform(0.9, 1.1, (2000, 6)).astype(np.float32)
    t = ember.tensor(x, device="webgpu")
    np.testing.assert_allclose(np.asarray(ember.prod(t, axis=0).tolist()), x.astype(np.float64).prod(axis=0), rtol=2e-3)
    y = rng.standard_normal((3, 5000)).astype(np.float32)
    ty = ember.tensor(y, device="webgpu")
    assert ember.argmax(ty, axis=1).tolist() == y.argmax(axis=1).tolist()
    assert ember.argmin(ty, axis=0).tolist() == y.argmin(axis=0).tolist()


def test_reduce_layout_parallelism():
    """Few outputs of many elements run in parts; a sum over leading axes has neighbouring threads
    on neighbouring outputs; small reductions stay one dispatch."""
    from ember.webgpu.ops import reduce_layout

    entry, cx, cy, parts = reduce_layout(576, 25, [(576, 1)], [(25, 576)])
    assert entry == "cols" and cx >= 32 and cy > 1 and parts == 1
    entry, cx, _, parts = reduce_layout(16, 50176, [(16, 784)], [(64, 12544), (784, 1)])
    assert cx == 1 and parts > 4                # a workgroup per output, in parts
    entry, cx, _, parts = reduce_layout(384, 1024, [(384, 1)], [(1024, 384)])
    assert entry == "cols" and cx >= 32 and parts > 1
    assert reduce_layout(10, 64, [(10, 1)], [(64, 10)])[3] == 1
    assert reduce_layout(16, 50176, [(16, 784)], [(64, 12544), (784, 1)], split=False)[3] == 1


def test_parts_pass_counts_dispatches(rt, monkeypatch):
    """BatchNorm-sized statistics: two dispatches (parts, then the parts reduced), not one
    latency-bound one; one with parts off (EMBER_WEBGPU_REDUCE_PARTS=0)."""
    from ember.webgpu import ops

    x = ember.tensor(np.ones((64, 16, 28, 28), np.float32), device="webgpu")
    for parts, dispatches in ((True, 2), (False, 1)):
        monkeypatch.setattr(ops, "PARTS", parts)
        rt.driver.flush()
        d0 = rt.stats["dispatches"]
        s = ember.sum(x, axis=(0, 2, 3))
        assert s.tolist() == [50176.0] * 16
        assert rt.stats["dispatches"] - d0 == dispatches


# ---- max-pool backward ----------------------------------------------------------------------

def _max_pool_grad_ref(x, g, k, s, p, d):
    """float64 loops: each window's gradient goes to its first tap holding the maximum (NaN the
    largest; taps outside the input are -inf and drop what they win)."""
    N, C, H, W = x.shape
    OH, OW = g.shape[2:]
    out = np.zeros(x.shape)
    for n in range(N):
        for c in range(C):
            for oy in range(OH):
                for ox in range(OW):
                    best = bi = None
                    for i in range(k[0]):
                        for j in range(k[1]):
                            iy, ix = oy * s[0] - p[0] + i * d[0], ox * s[1] - p[1] + j * d[1]
                            v = x[n, c, iy, ix] if 0 <= iy < H and 0 <= ix < W else -np.inf
                            if best is None or (np.isnan(v) and not np.isnan(best)) or v > best:
                                best, bi = v, (iy, ix)
                    if 0 <= bi[0] < H and 0 <= bi[1] < W:
                        out[n, c, bi[0], bi[1]] += g[n, c, oy, ox]
    return out


@pytest.mark.parametrize("shape,k,s,p,d,ceil", [
    ((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), (1, 1), False),      # the MNIST CNN's pooling
    ((2, 2, 9, 7), (3, 3), (2, 2), (1, 1), (1, 1), True),       # padding, ceil mode, overlaps
    ((1, 2, 10, 11), (3, 2), (1, 2), (1, 0), (2, 1), False),    # dilation, unequal strides
    ((2, 1, 5, 5), (2, 2), (1, 1), (0, 0), (1, 1), False),      # every element in several windows
])
def test_max_pool_backward_one_kernel(rt, shape, k, s, p, d, ceil):
    rng = np.random.default_rng(4)
    x = rng.integers(-3, 3, shape).astype(np.float32)     # ties: the first tap wins
    x[0, 0, 1, 1] = np.nan
    x[-1, -1] = -np.inf                                   # windows of -inf (padding may win)
    g = rng.standard_normal(ember.max_pool2d(ember.tensor(x), k, s, p, d, ceil).shape).astype(np.float32)
    xt = ember.tensor(x, device="webgpu", requires_grad=True)
    (ember.max_pool2d(xt, k, s, p, d, ceil) * ember.tensor(g, device="webgpu")).sum().backward()
    np.testing.assert_allclose(np.asarray(xt.grad.tolist()), _max_pool_grad_ref(x, g, k, s, p, d), atol=1e-5)
    assert any(isinstance(key, tuple) and key[:1] == ("pool2d_grad",) for key in rt.pipelines)


def test_max_pool_backward_dispatches(rt):
    """One dispatch for the gradient of a pooling (the composite took ~13)."""
    x = ember.tensor(np.random.default_rng(5).standard_normal((4, 8, 28, 28)).astype(np.float32), device="webgpu")
    g = ember.tensor(np.ones((4, 8, 14, 14), np.float32), device="webgpu")
    from ember.registry import apply

    rt.driver.flush()
    d0 = rt.stats["dispatches"]
    r = apply("max_pool2d_backward", g, x, kernel_size=(2, 2), stride=(2, 2), padding=((0, 0), (0, 0)),
              dilation=(1, 1), ceil_mode=False)
    assert abs(sum(r.numpy().ravel()) - 4 * 8 * 14 * 14) < 1e-3
    assert rt.stats["dispatches"] - d0 == 1


# ---- convolution weight gradients ------------------------------------------------------------

def _conv_ref(x, w, s, p, d):
    N, C, H, W = x.shape
    O, _, KH, KW = w.shape
    OH = (H + 2 * p[0] - d[0] * (KH - 1) - 1) // s[0] + 1
    OW = (W + 2 * p[1] - d[1] * (KW - 1) - 1) // s[1] + 1
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    out = np.zeros((N, O, OH, OW))
    for a in range(KH):
        for b in range(KW):
            patch = xp[:, :, a * d[0]: a * d[0] + s[0] * (OH - 1) + 1: s[0], b * d[1]: b * d[1] + s[1] * (OW - 1) + 1: s[1]]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, a, b])
    return out


@pytest.mark.parametrize("xs,ws,s,p,d", [
    ((16, 64, 14, 14), (32, 64, 14, 14), (1, 1), (1, 1), (1, 1)),   # the MNIST CNN's conv2 weight gradient
    ((1, 64, 28, 28), (16, 64, 28, 28), (1, 1), (1, 1), (1, 1)),    # conv1's: one output image
    ((3, 5, 11, 9), (4, 5, 10, 8), (1, 1), (1, 1), (1, 1)),         # odd sizes
    ((3, 2, 16, 16), (4, 2, 8, 8), (1, 1), (1, 1), (2, 2)),         # dilation (a stride-2 conv's gradient)
    ((3, 2, 12, 13), (4, 2, 12, 13), (2, 3), (2, 1), (1, 1)),       # stride (a dilated conv's gradient)
])
def test_weight_gradient_shaped_conv2d(rt, xs, ws, s, p, d):
    """A kernel plane much larger than the output plane runs as one matmul per input channel,
    summed (``nn._conv_over_channels``); transposed views are read in place."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    ref = _conv_ref(x.astype(np.float64), w.astype(np.float64), s, p, d)
    got = ember.conv2d(ember.tensor(x, device="webgpu"), ember.tensor(w, device="webgpu"), stride=s, padding=p, dilation=d)
    _close(got.tolist(), ref, xs[1] * ws[2] * ws[3])
    # the same through transposed views (how the gradient rule calls it)
    xt = ember.permute_dims(ember.tensor(np.ascontiguousarray(x.transpose(1, 0, 2, 3)), device="webgpu"), (1, 0, 2, 3))
    wt = ember.permute_dims(ember.tensor(np.ascontiguousarray(w.transpose(1, 0, 2, 3)), device="webgpu"), (1, 0, 2, 3))
    _close(ember.conv2d(xt, wt, stride=s, padding=p, dilation=d).tolist(), ref, xs[1] * ws[2] * ws[3])
    from ember.webgpu.nn import _weight_grad_shaped

    assert _weight_grad_shaped(rt, xs, ws, ref.shape)


def test_conv_gradients_match_numpy_backend(rt):
    """The MNIST CNN's convolutions + BatchNorm + max-pool: every gradient on webgpu against the
    numpy backend's."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((8, 3, 14, 14)).astype(np.float32)
    w1 = (rng.standard_normal((6, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((5, 6, 3, 3)) * 0.3).astype(np.float32)
    grads = {}
    for dev in ("numpy", "webgpu"):
        ts = [ember.tensor(a, device=dev, requires_grad=True) for a in (x, w1, w2)]
        h = ember.relu(ember.conv2d(ts[0], ts[1], padding=1))
        h = ember.max_pool2d(h, 2)
        h = h - ember.mean(h, axis=(0, 2, 3), keepdims=True)
        y = ember.conv2d(h, ts[2], padding=1)
        (y * y).sum().backward()
        grads[dev] = [np.asarray(t.grad.tolist()) for t in ts]
    for a, b in zip(grads["webgpu"], grads["numpy"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3)


# ---- training batch norm ---------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(64, 16, 28, 28), (5, 3, 7, 9), (8, 6), (4, 5, 11), (3, 7, 1, 1)])
def test_batch_norm_train_forward_and_backward(rt, shape):
    """y, the batch statistics and every gradient against float64 numpy formulas."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(shape) * 3 + 2).astype(np.float32)
    w, b = (rng.standard_normal(shape[1]).astype(np.float32) for _ in range(2))
    gy = rng.standard_normal(shape).astype(np.float32)
    axes = (0,) + tuple(range(2, len(shape)))
    cs = (1, shape[1]) + (1,) * (len(shape) - 2)
    x64, gy64 = x.astype(np.float64), gy.astype(np.float64)
    mean, var = x64.mean(axis=axes), x64.var(axis=axes)
    rstd = 1 / np.sqrt(var + 1e-5)
    xhat = (x64 - mean.reshape(cs)) * rstd.reshape(cs)
    n = x.size // shape[1]
    gsum, gxh = gy64.sum(axis=axes), (gy64 * xhat).sum(axis=axes)
    dx = (gy64 - (gsum / n).reshape(cs) - xhat * (gxh / n).reshape(cs)) * (w * rstd).reshape(cs)
    xt = ember.tensor(x, device="webgpu", requires_grad=True)
    wt, bt = (ember.tensor(a, device="webgpu", requires_grad=True) for a in (w, b))
    y, m, v = ember.batch_norm_train(xt, wt, bt, eps=1e-5)
    (y * ember.tensor(gy, device="webgpu")).sum().backward()
    tol = dict(rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(y.tolist()), xhat * w.reshape(cs) + b.reshape(cs), **tol)
    np.testing.assert_allclose(np.asarray(m.tolist()), mean, **tol)
    np.testing.assert_allclose(np.asarray(v.tolist()), var, **tol)
    np.testing.assert_allclose(np.asarray(xt.grad.tolist()), dx, **tol)
    np.testing.assert_allclose(np.asarray(wt.grad.tolist()), gxh, rtol=1e-4, atol=1e-5 * np.sqrt(n))
    np.testing.assert_allclose(np.asarray(bt.grad.tolist()), gsum, rtol=1e-4, atol=1e-5 * np.sqrt(n))


def test_batch_norm_train_dispatches(rt):
    """The statistics as two channel reductions (each in parts: 4 dispatches) and y fused into
    its consumer: the composite took 9, one more sum and the (C, 1, 1) reshapes realised."""
    x = ember.tensor(np.random.default_rng(9).standard_normal((64, 16, 28, 28)).astype(np.float32), device="webgpu")
    w, b = ember.tensor(np.ones(16, np.float32), device="webgpu"), ember.tensor(np.zeros(16, np.float32), device="webgpu")
    ember.relu(x).numpy()
    rt.driver.flush()
    d0 = rt.stats["dispatches"]
    y, m, v = ember.batch_norm_train(x, w, b)
    rt.driver.flush()
    assert rt.stats["dispatches"] - d0 == 4
    assert abs(float(np.asarray(y.tolist()).mean())) < 1e-4


# ---- the per-dispatch listing of tests/bench/bench_train.py --kernels ---------------------------

def test_kernel_listing_of_a_compiled_training_step(rt):
    """``tests/bench/webgpu_kernels.py``: every dispatch of a replayed training step is listed
    once with its op and grid (as many as the step makes), timed where the adapter has
    timestamps, and grouped into a table."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "bench"))
    import webgpu_kernels as wk
    from ember import nn
    from ember.plan import Plan

    ember.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(4 * 4 * 4, 3)).to("webgpu")
    opt = ember.optim.Adam(m.parameters(), lr=1e-3)
    X = ember.tensor(np.random.default_rng(10).standard_normal((5, 2, 8, 8)).astype(np.float32), device="webgpu")
    Y = ember.tensor(np.array([0, 1, 2, 1, 0]), device="webgpu")

    @ember.compile
    def step():
        opt.zero_grad()
        loss = ember.nn.functional.cross_entropy(m(X), Y)
        loss.backward()
        opt.step()
        return loss
    for _ in range(3):
        step().item()
    plan = next(p for p in step.plans.values() if isinstance(p, Plan))
    rt.driver.flush()
    d0 = rt.stats["dispatches"]
    step().item()
    per_step = rt.stats["dispatches"] - d0
    noted = wk.capture(rt, plan)
    assert len(noted) == per_step
    ops = {d.op for d in noted}
    assert {"conv2d", "batch_norm_train", "max_pool2d_backward"} <= ops
    assert all(d.groups >= 1 and d.kernel != "?" for d in noted)
    timed = wk.time_each(rt, noted, rounds=1)
    if timed:
        assert all(d.us is not None and d.us >= 0 for d in noted)
    text = wk.report("tiny", noted)
    assert f"== tiny: {per_step} dispatches" in text and "pool2d_grad" in text


@pytest.mark.parametrize("xs,ws,p", [((6, 32, 14, 14), (32, 16, 3, 3), (1, 1)),   # conv2's input gradient
                                      ((2, 20, 9, 7), (20, 5, 3, 3), (0, 1))])
def test_deep_few_channel_transposed_conv_as_matmul(rt, xs, ws, p):
    """A stride-1 transposed conv with few output channels but a deep sum (C*KH*KW >= 128) runs
    as im2col + matmul; same values as the numpy backend."""
    from ember.webgpu import nn as wnn

    assert ws[1] < wnn.MATMUL_MIN_CHANNELS and ws[0] * ws[2] * ws[3] >= wnn.MATMUL_MIN_DEPTH
    rng = np.random.default_rng(11)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    ref = ember.conv_transpose2d(ember.tensor(x, device="numpy", dtype=ember.float64),
                                 ember.tensor(w, device="numpy", dtype=ember.float64), padding=p).numpy()
    tx, tw = ember.tensor(x, device="webgpu"), ember.tensor(w, device="webgpu")
    rt.driver.flush()
    d0 = rt.stats["dispatches"]
    got = ember.conv_transpose2d(tx, tw, padding=p)
    _close(got.tolist(), ref, xs[1] * 9)
    assert rt.stats["dispatches"] - d0 >= 3      # flipped weight, im2col, matmul (the direct kernel: 1)
