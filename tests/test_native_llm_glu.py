"""silu(g) * u as one native pass (core/native/glu.c through numpy_llm.native_silu_mul), and the
numpy plan's fusion of a silu step with the multiply that alone reads it (numpy_plan._silu_mul):
against float64 (rows of a wider product's output, odd lengths, extreme values, NaN and
infinities), the layouts it leaves to numpy, the fusion's conditions, its fallback and the A/B
switch (EMBER_LLM_NATIVE_GLU=0 / NATIVE_SILU_MUL), and a tiny Llama's compiled decode step."""
import os
import sys

import numpy as np
import pytest

import ember
import ember.native as nat
from ember.backends import numpy_llm as nl
from ember.plan import Plan

pytestmark = pytest.mark.skipif(nl.silu_mul_kernel() is None, reason=f"ember.native not in use: {nat.info()['reason']}")


def ref(g, u):
    g = g.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return g / (1.0 + np.exp(-g)) * u.astype(np.float64)


@pytest.mark.parametrize("rows,n,extra", [(1, 1536, 1536), (1, 1, 0), (1, 7, 3), (3, 17, 40), (4, 33, 0),
                                          (2, 100, 5)])
def test_against_float64(rows, n, extra):
    """g and u: the two halves of one (rows, 2n + extra) array, as a SwiGLU's stacked gate/up."""
    rng = np.random.default_rng(n + rows)
    y = (rng.standard_normal((rows, 2 * n + extra)) * 4).astype(np.float32)
    g, u = y[:, :n], y[:, n + extra:]
    got = nl.native_silu_mul(g, u)
    assert got is not None and got.shape == (rows, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref(g, u), rtol=1e-6, atol=1e-30)
    flat = nl.native_silu_mul(np.ascontiguousarray(g[0]), np.ascontiguousarray(u[0]))
    assert np.array_equal(flat, got[0])


def test_extreme_values():
    g = np.array([0, -0.0, 1e-30, -1e-30, 20, -20, 87, -87, 88.5, -88.5, -89, -100, 100, 1e30, -1e30,
                  np.inf, -np.inf, np.nan], np.float32)
    u = np.full_like(g, 1.5)
    got = nl.native_silu_mul(g, u)
    want = ref(g, u)
    assert np.array_equal(np.isnan(got), np.isnan(want)), (got, want)   # (-inf: -inf * 0 = NaN, as numpy)
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-6, atol=1e-36)
    with np.errstate(all="ignore"):
        numpy_path = (g * np.where(g >= 0, 1 / (1 + np.exp(-np.abs(g))), np.exp(-np.abs(g)) / (1 + np.exp(-np.abs(g))))) * u
    assert np.array_equal(np.isnan(numpy_path), np.isnan(got))


def test_layouts_it_leaves_to_numpy(monkeypatch):
    a = np.ones((4, 8), np.float32)
    assert nl.native_silu_mul(a[:, ::2], a[:, :4]) is None            # columns apart
    assert nl.native_silu_mul(a.astype(np.float64), a) is None       # another dtype
    assert nl.native_silu_mul(a[:, :4], a[:2, :4]) is None           # shapes differ
    assert nl.native_silu_mul(a[:0], a[:0]) is None                  # empty
    assert nl.native_silu_mul(np.ones((2, 3, 4), np.float32)[:, :2], np.ones((2, 2, 4), np.float32)) is None
    assert nl.native_silu_mul(np.ones((2, 3, 4), np.float32), np.ones((2, 3, 4), np.float32)) is not None
    monkeypatch.setattr(nl, "NATIVE_SILU_MUL", False)
    assert nl.native_silu_mul(a, a) is None and nl.silu_mul_kernel() is None


def _t(a):
    return ember.from_numpy(np.ascontiguousarray(a), device="numpy")


def _replay(comp):
    plans = [p for p in comp.plans.values() if isinstance(p, Plan)]
    assert len(plans) == 1
    return plans[0].fast


def _names(comp):
    return [op.name for op in _replay(comp).ops]


def test_plan_fuses_silu_then_multiply(monkeypatch):
    rng = np.random.default_rng(1)
    y = _t(rng.standard_normal((3, 40)).astype(np.float32) * 3)
    f = ember.compile(lambda y: ember.silu(y[:, :20]) * y[:, 20:])
    want = ref(y.numpy()[:, :20], y.numpy()[:, 20:])
    for _ in range(2):
        got = f(y).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
    assert "silu_mul" in _names(f) and "silu" not in _names(f)
    eager = (ember.silu(y[:, :20]) * y[:, 20:]).numpy()
    # the A/B switch after the plan was made: the two recorded steps, numpy's bits
    monkeypatch.setattr(nl, "NATIVE_SILU_MUL", False)
    assert np.array_equal(f(y).numpy(), eager)


def test_plan_does_not_fuse_otherwise(monkeypatch):
    rng = np.random.default_rng(2)
    y = _t(rng.standard_normal((2, 16)).astype(np.float32))
    cases = [lambda y: ember.silu(y[:, :8]) * y[:, 8:] + ember.silu(y[:, :8]),   # (silu read twice: a CSE may keep one)
             lambda y: (lambda s: s * y[:, 8:] + s)(ember.silu(y[:, :8])),     # silu read by two steps
             lambda y: ember.silu(y[:, :8]) * ember.silu(y[:, :8]),             # silu * silu
             lambda y: ember.silu(y[:, :8]) + y[:, 8:]]                          # not a multiply
    for fn in cases:
        f = ember.compile(fn)
        np.testing.assert_allclose(f(y).numpy(), fn(y).numpy(), rtol=1e-6)
    f = ember.compile(cases[1])
    f(y), f(y)                     # (the replay is made on a second call)
    assert "silu_mul" not in _names(f)
    monkeypatch.setattr(nl, "NATIVE_SILU_MUL", False)                        # off when the plan is made
    f = ember.compile(lambda y: ember.silu(y[:, :8]) * y[:, 8:])
    f(y), f(y)
    assert "silu_mul" not in _names(f)


def test_broadcast_multiply_runs_the_recorded_steps():
    """u of another shape (broadcast): the fusion's run leaves it to the recorded steps."""
    rng = np.random.default_rng(3)
    g = _t(rng.standard_normal((3, 8)).astype(np.float32))
    u = _t(rng.standard_normal((1, 8)).astype(np.float32))
    f = ember.compile(lambda g, u: ember.silu(g) * u)
    eager = (ember.silu(g) * u).numpy()
    for _ in range(3):
        assert np.array_equal(f(g, u).numpy(), eager)
    assert "silu_mul" in _names(f)


def test_env_switch():
    import subprocess
    code = "from ember.backends import numpy_llm as nl; print(nl.NATIVE_SILU_MUL)"
    for val, want in (("0", "False"), ("1", "True")):
        env = dict(os.environ, EMBER_LLM_NATIVE_GLU=val)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want


@pytest.mark.parametrize("fused", [True, False])
def test_tiny_llama_compiled_decode(tmp_path, monkeypatch, fused):
    """A tiny Llama's compiled decode step fuses each layer's silu * up. Its logits: with the
    fused op's switch off (the recorded steps), the eager forward's bits; on, the same greedy
    tokens and logits within what a float32 rounding of the product's input can move them (the
    next product quantizes its input to 8 bits: a rounding can move a value a step)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from llm_fixtures import write_tiny_gguf
    from ember.nn.llama import Llama
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, seed=5)
    g = ember.load_gguf(str(path))
    T = lambda v: ember.tensor(v, dtype="int32", device="numpy")   # noqa: E731
    models = [Llama.from_gguf(g, device="numpy", context=64) for _ in range(2)]
    step = ember.compile(lambda ids, pos: models[1].forward(ids, pos))
    monkeypatch.setattr(nl, "NATIVE_SILU_MUL", fused)
    monkeypatch.setattr(nl, "silu_mul_kernel", lambda: nl._native_fn("ember_silu_mul"))   # (fused either way)
    prompt = [5, 9, 77, 3, 120, 44, 8]
    outs = [[m.forward(T(prompt), T([0])).numpy()] for m in models]
    p = len(prompt)
    for _ in range(6):
        toks = [int(o[-1].argmax()) for o in outs]
        assert toks[0] == toks[1]
        outs[0].append(models[0].forward(T([toks[0]]), T([p])).numpy())
        outs[1].append(step(T([toks[1]]), T([p])).numpy())
        p += 1
    for k, (a, b) in enumerate(zip(*outs)):
        if fused:
            np.testing.assert_allclose(b, a, rtol=0, atol=2e-3 * np.abs(a).max())
        else:
            assert np.array_equal(a, b)
    names = _names(step)
    assert names.count("silu_mul") == models[1].cfg.n_layers and "silu" not in names
