"""The numpy plan's prepared calls for a decode step's ops (numpy_quant.qlinear_call, numpy_llm.
rope_call / attention_cached_call / silu_mul_call / add_rms_norm_call, numpy_plan._prepared_step):
each gives the general function's answer bit for bit (None included) for the layouts, dtypes, shapes
and switch settings it meets, falls back where they change between runs, and a tiny Llama's compiled
decode step uses them with the eager forward's bits."""
import os
import sys

import numpy as np
import pytest

import ember
import ember.native as nat
from ember import quant
from ember.backends import numpy_llm as nl
from ember.backends import numpy_plan
from ember.backends import numpy_quant as nq
from ember.errors import ShapeError
from ember.plan import Plan
from ember.tensor import Tensor
from tests.test_native_qdot import _parts_weight, activations, weights
from tests.test_quant import same_bits

pytestmark = pytest.mark.skipif(nl.add_rms_norm_kernel() is None or nl.silu_mul_kernel() is None
                                or not nl.native_llm() or not nq.native_qlinear(),
                                reason=f"ember.native or its wasm kernels not in use: {nat.info()['reason']}")


def _same(a, b):
    """Both None, or arrays (or tuples of arrays) of the same shapes and bits."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and same_bits(a, b)


def _layouts(shape, seed):
    """(a, b) pairs of one float32 shape in layouts the calls take and leave: contiguous, views with
    rows apart, read-only, float64, another shape, empty."""
    rng = np.random.default_rng(seed)
    r = lambda s: rng.standard_normal(s).astype(np.float32) * 3   # noqa: E731
    a, b = r(shape), r(shape)
    wide = r(shape[:-1] + (2 * shape[-1],))
    ro = a.copy()
    ro.flags.writeable = False
    return [(a, b), (wide[..., :shape[-1]], b), (a, wide[..., shape[-1]:]), (ro, b), (a.astype(np.float64), b),
            (a.reshape(-1), b.reshape(-1)), (a[..., :0], b[..., :0])]


@pytest.mark.parametrize("shape", [(1, 576), (3, 40), (2, 3, 8)])
def test_add_rms_norm_and_silu_mul_calls_answer_as_the_general_functions(shape, monkeypatch):
    w = np.random.default_rng(1).standard_normal(shape[-1]).astype(np.float32)
    norm, glu = nl.add_rms_norm_call(shape, 1e-5), nl.silu_mul_call(shape)
    for _ in range(2):       # (the second round: the weight's checks kept)
        for a, b in _layouts(shape, sum(shape)):
            assert _same(norm(a, b, w), nl.native_add_rms_norm(a, b, w, 1e-5))
            assert _same(glu(a, b), nl.native_silu_mul(a, b))
    a, b = _layouts(shape, 0)[0]
    for w2 in (w[::-1].copy(), w.astype(np.float64), w[:-1].copy(), np.repeat(w, 2)[::2]):   # (new weight buffers)
        assert _same(norm(a, b, w2), nl.native_add_rms_norm(a, b, w2, 1e-5))
    assert _same(norm(a, b, w), nl.native_add_rms_norm(a, b, w, 1e-5))
    monkeypatch.setattr(nl, "NATIVE_ADD_RMS_NORM", False)
    monkeypatch.setattr(nl, "NATIVE_SILU_MUL", False)
    assert norm(a, b, w) is None and glu(a, b) is None
    monkeypatch.setattr(nl, "NATIVE_ADD_RMS_NORM", True)
    monkeypatch.setattr(nl, "NATIVE_SILU_MUL", True)
    with nat.disabled():
        assert norm(a, b, w) is None and glu(a, b) is None
    assert norm(a, b, w) is not None and glu(a, b) is not None


@pytest.mark.parametrize("mode", ["pairs", "halves"])
def test_rope_call_answers_as_native_rope(mode):
    T, H, D = 1, 12, 64
    rng = np.random.default_rng(3)
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    cos, sin = (rng.standard_normal((T, D // 2)).astype(np.float32) for _ in range(2))
    call = nl.rope_call((T, H, D), mode)
    t = lambda a: ember.from_numpy(np.ascontiguousarray(a), device="numpy")   # noqa: E731
    want = nl._native_rope(t(x), t(cos), t(sin), mode)
    assert _same(call(x, cos, sin), want)
    wide = np.concatenate([x, x], axis=2)[..., :D]           # (rows apart, float64, another shape: None)
    for args in ((wide, cos, sin), (x.astype(np.float64), cos, sin), (x[:, :3], cos, sin),
                 (x, np.repeat(cos, 2, axis=1)[:, ::2], sin)):
        assert call(*args) is None
    with nat.disabled():
        assert call(x, cos, sin) is None
    assert nl.rope_call((T, H, D), "other")(x, cos, sin) is None


def _attn_case(seed, hq, hkv, d, C):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, hq, d)).astype(np.float32)
    k, v = (rng.standard_normal((1, hkv, d)).astype(np.float32) for _ in range(2))
    kc, vc = (rng.standard_normal((C, hkv, d)).astype(np.float32) for _ in range(2))
    return q, k, v, kc, vc


@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (8, 2, 12), (5, 5, 64)])
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (40, 0.0), (0, 30.0), (5000, 0.0)])
def test_attention_cached_call_same_bits_and_caches(hq, hkv, d, window, softcap, monkeypatch):
    """Positions from 0 to past a team job's size, on the team and off it: the kernel's output and
    caches bit for bit; T > 1, a full cache, other dtypes: None or the kernel's error."""
    C = 400
    q, k, v, kc, vc = _attn_case(hq + d + window, hq, hkv, d, C)
    call = nl.attention_cached_call((1, hq, d), (C, hkv, d), 0.125, window, softcap)
    f32 = ember.from_numpy(q, device="numpy").dtype
    t = lambda a: Tensor._wrap(a, a.shape, f32, "numpy")   # noqa: E731  (the caches written in place)
    kc2, vc2 = kc.copy(), vc.copy()
    for team in (True, False):
        if not team:
            monkeypatch.setattr(nl, "NATIVE_ATTN_TEAM_FLOATS", 1 << 62)
        for p in (0, 1, 63, 64, 200, 399):
            pos = np.array([p], np.int32)
            got = call(q, k, v, kc, vc, pos)
            want = nl._attention_cached(None, t(q), t(k), t(v), t(kc2), t(vc2), t(pos), scale=0.125,
                                        window=window, softcap=softcap)
            assert _same(got, want), (p, team)
            assert same_bits(kc, kc2) and same_bits(vc, vc2)
    with pytest.raises(ShapeError):
        call(q, k, v, kc, vc, np.array([C], np.int32))
    pos = np.array([7], np.int32)
    assert call(q.astype(np.float64), k, v, kc, vc, pos) is None
    assert call(q, k, v, kc.astype(np.float64), vc, pos) is None
    assert call(q, k, v, np.ascontiguousarray(kc[:, :, :d]), vc, pos) is not None     # (a new cache buffer)
    assert nl.attention_cached_call((2, hq, d), (C, hkv, d), 0.125)(q, k, v, kc, vc, pos) is None
    monkeypatch.setattr(nl, "NATIVE_ATTN_DECODE", False)
    assert call(q, k, v, kc, vc, pos) is None


QTYPES = ("q8_0", "q4_1", "q4_k", "q6_k", "q5_0")


@pytest.mark.parametrize("qtype", QTYPES)
def test_qlinear_call_same_bits_as_qlinear(qtype, monkeypatch):
    """One weight and a parts weight (stack_rows of separate buffers), m = 1..4 (5: None), the team
    on and off, one piece or split: _qlinear's bits where the call answers; the switches read per
    call (a change after the first call is followed)."""
    k = 512 if quant.FORMATS[qtype].block == 256 else 224
    raws, ws, pt = _parts_weight(qtype, (40, 24, 64), k, seed=2)
    one = quant.QTensor.from_bytes(weights(qtype, 300, k, seed=4).tobytes(), qtype, (300, k), device="numpy")
    for w in (one, pt, ws[1]):
        n = w.shape[0]
        for m in (1, 2, 4, 5):
            x = activations(m, k, seed=m)
            call = nq.qlinear_call(qtype, n, k, (m, n))
            xt = ember.from_numpy(x, device="numpy")
            out = type("Meta", (), {"shape": (m, n)})()
            for setting in ({}, {"NATIVE_QDOT_TEAM_BYTES": 1 << 62}, {"NATIVE_SPLIT_BYTES": 0},
                            {"NATIVE_QDOT_TEAM_BYTES": 0}, {"NATIVE_QDOT_MAX_M": 0}):
                with monkeypatch.context() as mp:
                    for name, val in setting.items():
                        mp.setattr(nq, name, val)
                    want = nq._qlinear(out, xt, w.data, qtype=qtype, n=n, k=k)
                    got = call(x, w.data._buf)
                    if m > 4 or setting.get("NATIVE_QDOT_MAX_M") == 0:
                        assert got is None
                    elif got is not None:
                        assert same_bits(got, want), (qtype, n, m, setting)
                    if m <= 4 and not setting:
                        assert got is not None
            assert call(x.astype(np.float64), w.data._buf) is None
            apart = np.concatenate([x, x], axis=1)[:, :k]          # (rows apart where m > 1)
            got = call(apart, w.data._buf)
            if m > 1:
                assert got is None
            elif m <= 4:
                assert same_bits(got, nq._qlinear(out, xt, w.data, qtype=qtype, n=n, k=k))
            with nat.disabled():
                assert call(x, w.data._buf) is None


def _names(step):
    plans = [p for p in step.plans.values() if isinstance(p, Plan)]
    return [(op.name, op.run.__qualname__) for p in plans if p.fast is not None for op in p.fast.ops]


@pytest.mark.parametrize("prepared", [True, False])
def test_tiny_llama_compiled_decode_same_bits(tmp_path, monkeypatch, prepared):
    """A tiny Llama's compiled decode step runs its qlinear, rope and attention_cached steps through
    the prepared calls (or, with _prepared_step off, the recorded kernels): the eager forward's
    logits bit for bit either way (silu * up left as two steps: glu.c rounds otherwise)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from llm_fixtures import eager_and_compiled_decode
    monkeypatch.setattr(nl, "NATIVE_SILU_MUL", False)
    if not prepared:
        monkeypatch.setattr(numpy_plan, "_prepared_step", lambda steps, i: None)
    eager, compiled, step, model = eager_and_compiled_decode(tmp_path / "tiny.gguf", seed=11)
    for a, b in zip(eager, compiled):
        assert np.array_equal(a, b)
    names = _names(step)
    kinds = {n for n, _ in names}
    assert {"qlinear", "rope", "attention_cached"} <= kinds
    for name, run in names:
        if name in ("qlinear", "rope", "attention_cached"):
            assert run.startswith(("_prepared_step", "_attention_cached_step")) == prepared, (name, run)


def _ops(f):
    plans = [p for p in f.plans.values() if isinstance(p, Plan)]
    return plans[0].fast.ops


@pytest.mark.parametrize("also_reshaped", [False, True])
def test_slices_of_one_value_are_one_op(also_reshaped):
    """Slices of one value in a row (after a reshape that only they read: folded in as a view) run
    as one op: the eager results, each a contiguous copy of its region; a reshape read elsewhere too
    stays its own op."""
    x = ember.from_numpy(np.arange(2 * 30, dtype=np.float32).reshape(2, 30), device="numpy")

    def fn(x):
        r = x.reshape((2, 5, 6))
        a, b, c = r[:, :3], r[:, 3:], r[:, ::-2]
        out = (a * 1.0, b + 0.0, c * 2.0)
        return out + ((r * 1.0,) if also_reshaped else ())
    f = ember.compile(fn)
    want = [t.numpy() for t in fn(x)]
    for _ in range(2):
        got = [t.numpy() for t in f(x)]
        assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))
    ops = _ops(f)
    names = [op.name for op in ops]
    assert names.count("slice") == 1 and ("reshape" in names) == also_reshaped
    (sl,) = [op for op in ops if op.name == "slice"]
    assert sl.multi and len(sl.out) == 3 and sl.run.__qualname__.startswith("_slice_steps")
