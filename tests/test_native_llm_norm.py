"""A residual add and the rms_norm after it as one native call (core/native/rmsnorm.c through
numpy_llm.native_add_rms_norm) and the numpy plan's fusion of the two steps (numpy_plan.
_add_rms_norm): the bits of numpy's add then llm.c's rms_norm, against float64 too; the layouts it
leaves to the recorded steps; the fusion's conditions, its fallback, the A/B switch
(EMBER_LLM_NATIVE_ADD_NORM=0 / NATIVE_ADD_RMS_NORM), and a tiny Llama's compiled decode step
(the eager forward's bits)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import ember
import ember.native as nat
from ember.backends import numpy_llm as nl
from ember.plan import Plan

pytestmark = pytest.mark.skipif(nl.add_rms_norm_kernel() is None,
                                reason=f"ember.native or llm.c not in use: {nat.info()['wasm_kernels']}")


def _t(a):
    return ember.from_numpy(np.ascontiguousarray(a), device="numpy")


def ref(a, b, w, eps):
    s = (a + b).astype(np.float64)
    return s / np.sqrt((s * s).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


@pytest.mark.parametrize("shape", [(1, 576), (3, 17), (2, 4, 8), (5, 1), (1, 5), (7,), (4, 130)])
def test_the_two_steps_bits_and_float64(shape):
    rng = np.random.default_rng(sum(shape))
    a, b = (rng.standard_normal(shape).astype(np.float32) * 3 for _ in range(2))
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    s, y = nl.native_add_rms_norm(a, b, w, 1e-5)
    x = ember.add(_t(a), _t(b))
    want = ember.rms_norm(x, _t(w), eps=1e-5).numpy()
    assert np.array_equal(s, x.numpy()) and np.array_equal(y, want)
    np.testing.assert_allclose(y, ref(a, b, w, 1e-5), rtol=2e-7, atol=1e-7)


def test_what_it_leaves_to_the_recorded_steps(monkeypatch):
    a = np.ones((2, 8), np.float32)
    w = np.ones(8, np.float32)
    assert nl.native_add_rms_norm(a[:, ::2], a[:, :4], w[:4], 1e-5) is None        # not contiguous
    assert nl.native_add_rms_norm(a, a.astype(np.float64), w, 1e-5) is None        # another dtype
    assert nl.native_add_rms_norm(a, a[:1], w, 1e-5) is None                       # shapes differ (broadcast)
    assert nl.native_add_rms_norm(a, a, w[:4], 1e-5) is None                       # w's length
    assert nl.native_add_rms_norm(a[:0], a[:0], w, 1e-5) is None                   # empty
    assert nl.native_add_rms_norm(a, a, w, 1e-5) is not None
    monkeypatch.setattr(nl, "NATIVE_ADD_RMS_NORM", False)
    assert nl.native_add_rms_norm(a, a, w, 1e-5) is None and nl.add_rms_norm_kernel() is None


def _names(comp):
    plans = [p for p in comp.plans.values() if isinstance(p, Plan)]
    assert len(plans) == 1 and plans[0].fast is not None
    return [op.name for op in plans[0].fast.ops]


def test_plan_fuses_and_keeps_the_bits(monkeypatch):
    rng = np.random.default_rng(1)
    x, o = (_t(rng.standard_normal((2, 24)).astype(np.float32)) for _ in range(2))
    w = _t(rng.standard_normal(24).astype(np.float32))

    def layer(x, o):                      # (x is read again after the norm, as a residual is)
        s = x + o
        return ember.rms_norm(s, w, eps=1e-6) * 2.0 + s

    f = ember.compile(layer)
    eager = layer(x, o).numpy()
    for _ in range(3):
        assert np.array_equal(f(x, o).numpy(), eager)
    assert "add_rms_norm" in _names(f) and "rms_norm" not in _names(f)
    monkeypatch.setattr(nl, "NATIVE_ADD_RMS_NORM", False)      # (after the plan: the recorded steps)
    assert np.array_equal(f(x, o).numpy(), eager)


def test_plan_does_not_fuse_otherwise(monkeypatch):
    rng = np.random.default_rng(2)
    x, o = (_t(rng.standard_normal((2, 8)).astype(np.float32)) for _ in range(2))
    w = _t(rng.standard_normal(8).astype(np.float32))
    b = _t(rng.standard_normal(8).astype(np.float32))
    cases = [lambda x, o: (lambda s: ember.rms_norm(s, w) + s * 3.0)((x + o) * 1.0),   # not an add
             lambda x, o: ember.rms_norm(x + b, w),                                     # a broadcast add: fused, run as recorded
             lambda x, o: (lambda s: ember.rms_norm(ember.exp(s), w) + s)(x + o)]       # the norm reads another value
    for fn in cases:
        f = ember.compile(fn)
        for _ in range(2):
            assert np.array_equal(f(x, o).numpy(), fn(x, o).numpy())
    monkeypatch.setattr(nl, "NATIVE_ADD_RMS_NORM", False)                              # off when the plan is made
    f = ember.compile(lambda x, o: ember.rms_norm(x + o, w))
    f(x, o), f(x, o)
    assert "add_rms_norm" not in _names(f)


def test_env_switch():
    code = "from ember.backends import numpy_llm as nl; print(nl.NATIVE_ADD_RMS_NORM)"
    for val, want in (("0", "False"), ("1", "True")):
        env = dict(os.environ, EMBER_LLM_NATIVE_ADD_NORM=val)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want


def test_tiny_llama_compiled_decode_same_bits(tmp_path, monkeypatch):
    """A tiny Llama's compiled decode step (each residual add and the norm after it fused; silu *
    up left as two steps here) gives the eager forward's logits bit for bit."""
    sys.path.insert(0, os.path.dirname(__file__))
    from llm_fixtures import eager_and_compiled_decode
    monkeypatch.setattr(nl, "NATIVE_SILU_MUL", False)
    eager, compiled, step, model = eager_and_compiled_decode(tmp_path / "tiny.gguf", seed=7)
    for a, b in zip(eager, compiled):
        assert np.array_equal(a, b)
    names = _names(step)
    assert names.count("add_rms_norm") == 2 * model.cfg.n_layers
