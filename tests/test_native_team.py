"""The native kernels' second thread (core/native/team.c, numpy_nn.Team): jobs cut into items that
the caller and a spinning helper claim; the same bits as one thread for every kind of job, the
caller alone where the helper is busy or asleep, errors reported, parked after a plan's run."""
from __future__ import annotations

import ctypes
import math
import os
import time

import numpy as np
import pytest

import ember
import ember.native as nat
from ember.backends import numpy_nn

rng = np.random.default_rng(9)
P, I64 = ctypes.c_void_p, ctypes.c_int64


@pytest.fixture
def tm():
    if nat.lib() is None:
        pytest.skip(f"native kernels not in use: {nat.info()['reason']}")
    t = numpy_nn.team()
    if t is None:
        pytest.skip("one thread allowed here (numpy_blas.threads())")
    return t


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def alone(fn, monkeypatch):
    """fn() with the team unavailable (the caller's own path)."""
    with monkeypatch.context() as m:
        m.setattr(numpy_nn, "team", lambda: None)
        return fn()


def test_every_job_kind_same_bits_as_one_thread(tm, monkeypatch):
    """Linear (+ layer norm, GELU, residual), depthwise + activation, 1x1 product by output
    channels, one-pixel product, the direct convolution by pixel ranges, attention by heads:
    the team's result equals the one-thread result bit for bit; several runs (the helper
    spinning, then woken from sleep)."""
    monkeypatch.setattr(numpy_nn, "_CONV_TEAM_MACS", 1)
    monkeypatch.setattr(numpy_nn, "_GEMV_TEAM_MACS", 1)
    monkeypatch.setattr(numpy_nn, "_LINEAR_TEAM_MACS", 1)
    monkeypatch.setattr(numpy_nn, "_ATTENTION_TEAM_MACS", 1)
    monkeypatch.setattr(numpy_nn, "_GEMM_TEAM_MIN_ROWS", 16)
    x, w, b, res = f32(77, 48), f32(40, 48, scale=0.2), f32(40), f32(77, 40)
    lin = numpy_nn.NativeLinear(w, b, "gelu", ln=(f32(48), f32(48), 1e-5))
    q, kt, v = f32(3, 4, 9, 8), f32(3, 4, 8, 11), f32(3, 4, 11, 8)
    att = numpy_nn.NativeAttention(q, kt, v, 0.3, merge=True)
    gv = numpy_nn.NativeGemv(f32(200, 64), f32(200), "relu", (0.0, 0.0, 0.0, np.inf))
    xc = f32(1, 24, 13, 11)
    dw, dwb = f32(24, 1, 3, 3), f32(24)
    pw, pwb = f32(40, 24, 1, 1, scale=0.3), f32(40)
    x1 = f32(1, 24, 1, 1)
    geo = ((1, 1), ((1, 1), (1, 1)), (1, 1))
    numpy_nn._conv_depthwise_native(xc, dw, dwb, 1, 13, 11, 3, 3, *geo, "hard_swish", (1 / 6, 0.5, 0.0, 1.0))
    numpy_nn._conv_dense_native(xc, pw, pwb, 13, 11, 1, 1, (1, 1), ((0, 0), (0, 0)), (1, 1))
    numpy_nn._conv_dense_native(x1, pw, pwb, 1, 1, 1, 1, (1, 1), ((0, 0), (0, 0)), (1, 1), "relu", (0, 0, 0, np.inf))
    dwc = numpy_nn.native_conv_call(xc, dw, dwb, 13, 11, *geo, 24, "hard_swish", (1 / 6, 0.5, 0.0, 1.0))
    pwc = numpy_nn.native_conv_call(xc, pw, pwb, 13, 11, (1, 1), ((0, 0), (0, 0)), (1, 1), 1, None, (0, 0, 0, 0))
    p1c = numpy_nn.native_conv_call(x1, pw, pwb, 1, 1, (1, 1), ((0, 0), (0, 0)), (1, 1), 1, "relu", (0, 0, 0, np.inf))
    assert (dwc.job, pwc.job, p1c.job) == (numpy_nn._J_DEPTHWISE, numpy_nn._J_GEMM, numpy_nn._J_GEMV)
    xs, ws, bs = f32(1, 3, 40, 70), f32(16, 3, 3, 3), f32(16)
    direct = lambda: numpy_nn._conv_dense_native(xs, ws, bs, 20, 35, 3, 3, (2, 2), ((1, 1), (1, 1)), (1, 1),  # noqa
                                                 "relu", (0.0, 0.0, 0.0, np.inf))
    xg = f32(64)
    jobs = {"linear": lambda: lin(x, res), "attention": lambda: att(q.ctypes.data, kt.ctypes.data, v.ctypes.data),
            "gemv": lambda: gv(xg), "depthwise": lambda: dwc(xc), "gemm": lambda: pwc(xc),
            "one pixel": lambda: p1c(x1), "direct": direct}
    for name, fn in jobs.items():
        want = alone(fn, monkeypatch)
        for rep in range(4):
            if rep == 2:
                tm.park()
                time.sleep(0.002)
            np.testing.assert_array_equal(fn(), want, err_msg=name)


def test_busy_team_and_errors(tm):
    """Another caller holding the team: None (the caller then runs alone). A bad job: -1; a kernel's
    refusal: its code, after every item ran."""
    assert tm.lock.acquire()
    try:
        assert tm(numpy_nn._J_GEMV, 0) is None
    finally:
        tm.lock.release()
    assert tm(99, 0) == -1 and tm(numpy_nn._J_GEMV, 0, n=0) == -1
    w, xv, y = f32(16, 8), f32(8), np.zeros(16, np.float32)
    g = np.array([16, 8, 2, 8, 16, 0], np.int64)          # (N must be 1: ember_gemv refuses)
    ap = np.zeros(4, np.float32)
    args = np.array([w.ctypes.data, 0, g.ctypes.data, ap.ctypes.data, 16], np.int64)
    assert tm(numpy_nn._J_GEMV, args.ctypes.data, xv.ctypes.data, y.ctypes.data) == -1
    g[2] = 1
    assert tm(numpy_nn._J_GEMV, args.ctypes.data, xv.ctypes.data, y.ctypes.data) == 0
    np.testing.assert_allclose(y, w @ xv, rtol=1e-5, atol=1e-5)


def test_plan_wakes_and_parks_the_helper(tm):
    """A compiled linear large enough for the team: its replays use the helper, which is parked
    (no spinning) when each run ends; the result is the one-thread result."""
    w, b = ember.from_numpy(f32(256, 128, scale=0.1), device="numpy"), ember.from_numpy(f32(256), device="numpy")
    lw, lb = (ember.from_numpy(f32(128), device="numpy") for _ in range(2))
    f = ember.compile(lambda x: ember.gelu(ember.linear(ember.layer_norm(x, (128,), lw, lb), w, b)))
    x = ember.from_numpy(f32(4, 64, 128), device="numpy")
    got = [f(x).numpy() for _ in range(4)]
    assert f.plan_for(x).fast._team
    for _ in range(200):                        # (the helper leaves its loop within microseconds)
        if not tm.ctl[10]:
            break
        time.sleep(0.001)
    assert tm.ctl[10] == 0 and tm.ctl[11] == 1
    with nat.disabled():
        off = f(x).numpy()
    np.testing.assert_allclose(got[-1], off, rtol=1e-5, atol=1e-5 * math.sqrt(128))
    np.testing.assert_array_equal(got[-1], got[1])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_forked_child_gets_its_own_team(tm):
    """In a forked child (no helper thread there) the team is made anew and its jobs run."""
    x, w, b = f32(64, 32), f32(48, 32), f32(48)
    lin = numpy_nn.NativeLinear(w, b, "gelu")
    want = lin(x)
    pid = os.fork()
    if pid == 0:                                # (the child: exit status 0 when equal, never returns)
        ok = False
        try:
            t = numpy_nn.team()
            ok = t is not None and t is not tm and np.array_equal(lin(x), want)
        except BaseException:
            pass
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
