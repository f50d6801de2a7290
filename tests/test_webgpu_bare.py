"""The bare fp32 matmul kernel (``ember.webgpu.matmul_bare``, matmul variants ``bare`` and
``bare2``) against numpy: whole-tile shapes through ember's public matmul with the variant forced,
split-K, epilogues, autotune's table, the layouts and shapes just off its case (which must take
another variant), ``EMBER_WEBGPU_BARE=0``, and the GEMM lab running the same text. Skipped where
no adapter exists."""
import math
import os
import sys

import numpy as np
import pytest

import ember

from conftest import gpu, rand, webgpu_only

_REASON, pytestmark = webgpu_only()   # skips every test here where no adapter exists

if _REASON is None:
    import ember.webgpu as wg
    from ember.webgpu import autotune, linalg, matmul_bare
    from ember.webgpu.runtime import get_runtime


@pytest.fixture
def ran(monkeypatch):
    """The matmul kernels recorded, by name ('matmul_bare', 'matmul_bare_reduce', or the other
    variants' names)."""
    names = []
    record, record_bare = linalg.MatmulPlan._record, linalg.MatmulPlan._record_bare
    monkeypatch.setattr(linalg.MatmulPlan, "_record",
                        lambda self, v, *a, **k: (names.append(v), record(self, v, *a, **k))[1])
    monkeypatch.setattr(linalg.MatmulPlan, "_record_bare",
                        lambda self, n, *a, **k: (names.append(n), record_bare(self, n, *a, **k))[1])
    return names


def forced(variant, fn):
    autotune.force("matmul", variant)
    try:
        return fn()
    finally:
        autotune.force("matmul", None)


def close(got, want, what):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())), err_msg=what)


# (M, K, N): whole 128x128 tiles, k in tiles of 16; bare2 needs K % 32 == 0 and K >= 256
SHAPES = [(128, 16, 128), (256, 272, 384), (128, 512, 256), (384, 1024, 128)]


@pytest.mark.parametrize("variant", ["bare", "bare2"])
def test_bare_matches_numpy_on_whole_tiles(variant, ran):
    rt = get_runtime()
    for m, k, n in SHAPES:
        if variant not in linalg.bare_variants(m, n, k, "f32"):
            assert variant == "bare2" and (k % 32 or k < 256)
            continue
        a, b = rand(m, k), rand(k, n, seed=1)
        del ran[:]
        got = forced(variant, lambda: (gpu(a) @ gpu(b)).numpy())
        close(got, a @ b, f"{variant} {m}x{k}x{n}")
        # one kernel, or the partial planes and their sum
        assert ran == (["matmul_bare"] if variant == "bare" else ["matmul_bare", "matmul_bare_reduce"]), (m, k, n, ran)
    assert linalg.eligible(rt, variant, 128, 128, 512, "f32")


@pytest.mark.parametrize("variant", ["bare", "bare2"])
def test_bare_epilogue_bias_and_activation(variant, ran, monkeypatch):
    """bias + gelu after the product (with EMBER_WEBGPU_HEAVY_EPILOGUE=1): one kernel (bare: in
    its stores; bare2: in the reduction), a broadcast bias and a full residual leaf."""
    from ember.webgpu import fusion

    monkeypatch.setattr(fusion, "_HEAVY_OFF", False)
    a, w, bias, res = rand(256, 512), rand(512, 128, seed=1), rand(128, seed=2), rand(256, 128, seed=3)
    ta, tw, tb, tr = gpu(a), gpu(w), gpu(bias), gpu(res)
    ref = a @ w + bias
    want = ref * 0.5 * (1 + np.vectorize(__import__("math").erf)(ref / np.sqrt(2)))

    def run():
        out = ember.gelu(ta @ tw + tb).numpy()            # compile
        wg.reset_stats()
        out = ember.gelu(ta @ tw + tb).numpy()
        stats = wg.stats()
        return out, stats, (ta @ tw * 2 - tr).numpy()
    del ran[:]
    got, stats, got2 = forced(variant, run)
    close(got, want, f"{variant} gelu(x @ w + b)")
    close(got2, (a @ w) * 2 - res, f"{variant} x @ w * 2 - r")
    assert stats["fused_epilogues"] == 1 and stats["dispatches"] == (1 if variant == "bare" else 2)
    assert "matmul_bare" in ran and not any(n.startswith("rb") or n == "tiled" for n in ran)


def test_bare_takes_a_folded_batch_and_aligned_views(ran):
    """(batch, rows, k) @ W folds into one product of batch * rows rows: bare; a row view of A
    and a view of B starting at a binding-aligned element are bound from their offsets."""
    rt = get_runtime()
    al = max(int(rt.limits["min_storage_buffer_offset_alignment"]) // 4, 4)
    x, w = rand(2, 64, 256), rand(256, 128, seed=1)
    del ran[:]
    close(forced("bare", lambda: (gpu(x) @ gpu(w)).numpy()), x @ w, "folded batch")
    assert ran == ["matmul_bare"]
    # rows 8.. of A (offset 8 * 256 elements) and rows 16.. of B (offset 16 * 128): aligned
    big_a, big_b = rand(136, 256, seed=2), rand(272, 128, seed=3)
    va, vb = gpu(big_a)[8:], gpu(big_b)[16:]
    plan = linalg.MatmulPlan(rt, va._buf, vb._buf, _meta((128, 128)))
    assert plan.words[4] == 8 * 256 and plan.words[8] == 16 * 128 and plan.bare == ["bare", "bare2"]
    assert (8 * 256) % al == 0 and (16 * 128) % al == 0
    del ran[:]
    close(forced("bare", lambda: (va @ vb).numpy()), big_a[8:] @ big_b[16:], "offset views")
    assert ran == ["matmul_bare"]


def test_shapes_and_layouts_off_the_bare_case_take_another_variant(ran):
    """Forced bare / bare2 where the product is not its case: another variant runs, with the
    same results. Shapes one off the tiles, k off the k tiles (or the parts'), a transposed
    operand, a batch, an offset not aligned to a binding, float16."""
    rt = get_runtime()
    al = max(int(rt.limits["min_storage_buffer_offset_alignment"]) // 4, 4)
    cases = {}
    for m, k, n in [(127, 16, 128), (128, 16, 129), (129, 256, 128), (128, 24, 128), (128, 8, 256), (128, 250, 128)]:
        cases[f"{m}x{k}x{n}"] = (rand(m, k), rand(k, n, seed=1), lambda x, y: gpu(x) @ gpu(y))
    a, b = rand(128, 64), rand(64, 128, seed=1)
    cases["B.T"] = (a, b, lambda x, y: gpu(x) @ ember.matrix_transpose(gpu(np.ascontiguousarray(y.T))))
    cases["A.T"] = (a, b, lambda x, y: ember.matrix_transpose(gpu(np.ascontiguousarray(x.T))) @ gpu(y))
    cases["batch"] = (rand(2, 128, 64), rand(2, 64, 128, seed=1), lambda x, y: gpu(x) @ gpu(y))
    # A's rows start one vec4 into the buffer: 16-byte aligned but not binding-aligned (lavapipe: 32 bytes)
    off = 4 if al > 4 else None
    if off:
        flat = rand(128 * 64 + off, seed=4)
        cases["A offset"] = (flat[off:].reshape(128, 64), b, lambda x, y: gpu(flat)[off:].reshape((128, 64)) @ gpu(y))
    cases["A rows padded"] = (a, b, lambda x, y: gpu(np.pad(x, ((0, 0), (0, 4))))[:, :64] @ gpu(y))
    for variant in ("bare", "bare2"):
        for name, (x, y, f) in cases.items():
            del ran[:]
            got = forced(variant, lambda: f(x, y).numpy())
            close(got, x @ y, f"{variant} {name}")
            assert ran and not any(r.startswith("matmul_bare") for r in ran), (variant, name, ran)
    # k a multiple of 16 but not of 32: bare, never bare2
    x, y = rand(128, 272), rand(272, 128, seed=1)
    del ran[:]
    close(forced("bare2", lambda: (gpu(x) @ gpu(y)).numpy()), x @ y, "bare2 at k = 272")
    assert not any(r.startswith("matmul_bare") for r in ran)
    # float16 operands: matmul runs in f32 storage and rounds at the end, bare included
    h = (rand(128, 32) / 4).astype(np.float16), (rand(32, 128, seed=1) / 4).astype(np.float16)
    got = forced("bare", lambda: (gpu(h[0]) @ gpu(h[1])).numpy())
    ref = (h[0].astype(np.float32) @ h[1].astype(np.float32)).astype(np.float16)
    np.testing.assert_allclose(got.astype(np.float32), ref.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_bare_off_switch(monkeypatch, ran):
    """EMBER_WEBGPU_BARE=0: no bare candidates, forced or tuned, and the autotune key is the one
    without them (a choice made with them is not reused)."""
    rt = get_runtime()
    a, b = rand(128, 256), rand(256, 128, seed=1)
    on = linalg.MatmulPlan(rt, gpu(a)._buf, gpu(b)._buf, _meta((128, 128)))
    assert on.bare == ["bare", "bare2"] and on.key.endswith(",2")
    monkeypatch.setenv("EMBER_WEBGPU_BARE", "0")
    off = linalg.MatmulPlan(rt, gpu(a)._buf, gpu(b)._buf, _meta((128, 128)))
    assert off.bare == [] and off.key != on.key and off.key == linalg.plan_key("f32", 128, 128, 256)
    assert not linalg.eligible(rt, "bare", 128, 128, 256, "f32")
    for v in ("bare", "bare2"):
        del ran[:]
        close(forced(v, lambda: (gpu(a) @ gpu(b)).numpy()), a @ b, f"{v} off")
        assert ran and "matmul_bare" not in ran


def test_autotune_runs_and_reuses_bare(tmp_path, monkeypatch, ran):
    """With autotune on, the bare variants are among the candidates timed for their shapes (each
    checked against the default's result); a table entry naming bare2 is then run as is."""
    monkeypatch.setitem(autotune._STATE, "enabled", True)     # tests/conftest.py turns it off
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(autotune, "_MEMORY", {})
    monkeypatch.setattr(autotune, "_LOADED", [False])
    rt = get_runtime()
    a, b = rand(128, 256), rand(256, 128, seed=1)
    wg.reset_stats()
    close((gpu(a) @ gpu(b)).numpy(), a @ b, "autotuned")
    assert wg.stats()["autotune_benchmarks"] == 1
    assert "matmul_bare" in ran and "matmul_bare_reduce" in ran      # both timed
    key = linalg.plan_key("f32", 128, 128, 256, bare=2)
    assert autotune._table(rt)[key] in linalg.VARIANTS
    autotune._table(rt)[key] = "bare2"
    del ran[:]
    wg.reset_stats()
    close((gpu(a) @ gpu(b)).numpy(), a @ b, "from the table")
    assert wg.stats()["autotune_benchmarks"] == 0 and ran == ["matmul_bare", "matmul_bare_reduce"]


def test_render_bare_rejects_tiles_it_cannot_split():
    with pytest.raises(ValueError, match="vec4 loads"):
        matmul_bare.render_bare(128, 128, 6, 8, 16)
    with pytest.raises(ValueError, match="stages"):
        matmul_bare.render_bare(128, 128, 8, 8, 16, S=3)


def test_gemm_lab_runs_the_text_ember_runs(monkeypatch):
    """The GEMM lab's bare 128x128/8x8/k16/s1 kernel is, character for character, the kernel
    ember dispatches for ``bare`` without an epilogue (so the lab's figures are ember's)."""
    pytest.importorskip("wgpu")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "bench"))
    try:
        import webgpu_gemm_lab as lab
    finally:
        sys.path.pop(0)
    rt = get_runtime()
    seen = []
    real = matmul_bare.render_bare
    monkeypatch.setattr(matmul_bare, "render_bare", lambda *a, **k: (seen.append(real(*a, **k)), seen[-1])[1])
    for key in [k for k in rt.pipelines if isinstance(k, tuple) and k and k[0] == "matmul_bare"]:
        del rt.pipelines[key]              # compile again, through the spy
    a, b = rand(128, 32), rand(32, 128, seed=1)
    close(forced("bare", lambda: (gpu(a) @ gpu(b)).numpy()), a @ b, "bare")
    v = lab.parse_variant("128x128/8x8/k16/s1")
    assert seen == [lab.gen(dict(v, M=128, N=128, K=32))]
    assert "epilogue" not in seen[0] and "dims" in seen[0]


def _meta(shape):
    from ember.registry import Meta

    return Meta(tuple(shape), ember.float32)


@pytest.mark.parametrize("variant", ["bare", "bare2"])
def test_bare_in_a_replayed_plan(variant, ran):
    """A compiled function (matmul + bias + relu) replayed as a dispatch stream with the bare
    kernel: every replay's output against numpy (bare2's partial planes are the plan's own)."""
    w, bias = rand(256, 128, seed=1), rand(128, seed=2)
    tw, tb = gpu(w), gpu(bias)
    xs = [rand(128, 256, seed=10 + i) for i in range(4)]

    def run():
        with ember.no_grad():
            f = ember.compile(lambda x: ember.relu(x @ tw + tb))
            return [f(gpu(x)).numpy() for x in xs], f
    del ran[:]
    outs, f = forced(variant, run)
    for x, got in zip(xs, outs):
        close(got, np.maximum(x @ w + bias, 0), f"{variant} replay")
    assert "matmul_bare" in ran
    with ember.no_grad():
        fast = f.plan_for(gpu(xs[0])).fast
    d = fast.describe()
    assert d["stream"] and d["replays"] >= 2, d


def test_autotune_times_products_with_their_epilogue(tmp_path, monkeypatch, ran):
    """A product with an epilogue (here a bias and GELU fused into it) is timed with the epilogue
    (an epilogue changes the variants' order: on an H100 rb128 + GELU took 230 us where rb64 + GELU
    took 172), under a key of its own (the shape class and the epilogue's structure): a table
    entry for the same shape without an epilogue is not reused, and each candidate ran with the
    epilogue (every matmul dispatch while tuning is a fused-epilogue one); forcing bare still runs it.
    (GELU in epilogues: EMBER_WEBGPU_HEAVY_EPILOGUE=1.)"""
    from ember.webgpu import fusion

    monkeypatch.setattr(fusion, "_HEAVY_OFF", False)
    monkeypatch.setitem(autotune._STATE, "enabled", True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(autotune, "_MEMORY", {})
    monkeypatch.setattr(autotune, "_LOADED", [False])
    rt = get_runtime()
    a, b, c = rand(128, 256), rand(256, 128, seed=1), rand(128, seed=2)
    plain = linalg.plan_key("f32", 128, 128, 256, bare=2)
    autotune._table(rt)[plain] = "bare"
    want = a @ b + c
    want = 0.5 * want * (1 + np.vectorize(math.erf)(want / math.sqrt(2)))
    seen = []
    real = linalg.MatmulPlan._dispatch

    def spy(self, variant, storage, prog, epi_words, *args, **kw):
        seen.append((variant, prog is not None))
        return real(self, variant, storage, prog, epi_words, *args, **kw)
    monkeypatch.setattr(linalg.MatmulPlan, "_dispatch", spy)
    close(ember.gelu(gpu(a) @ gpu(b) + gpu(c)).numpy(), want, "epilogue, autotuned")
    keys = [k for k in autotune._table(rt) if k.startswith(plain + "|e")]
    assert len(keys) == 1 and autotune._table(rt)[keys[0]] in linalg.VARIANTS
    assert len({v for v, _ in seen}) > 1 and all(e for _, e in seen), seen
    monkeypatch.setattr(linalg.MatmulPlan, "_dispatch", real)
    del ran[:]
    close((gpu(a) @ gpu(b)).numpy(), a @ b, "no epilogue: the table's bare")
    assert ran == ["matmul_bare"]
    del ran[:]
    close(forced("bare", lambda: ember.gelu(gpu(a) @ gpu(b) + gpu(c)).numpy()), want, "epilogue, forced")
    assert ran == ["matmul_bare"]
