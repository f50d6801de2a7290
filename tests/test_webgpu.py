"""The WebGPU backend's own machinery: fusion, the buffer pool, views, autotune, the driver
protocol, limits and errors. (Every op's numbers are checked by the shared op suites, which run
on webgpu through the ``device`` fixture.) Skipped where no adapter exists."""
import asyncio
import gc
import json
import math

import numpy as np
import pytest

import ember
from ember.errors import DeviceError, DTypeError, IndexingError
from ember.registry import OPS

from conftest import gpu, rand, webgpu_only

_REASON, pytestmark = webgpu_only()   # skips every test here where no adapter exists

if _REASON is None:
    import ember.webgpu as wg
    from ember.webgpu import autotune, linalg
    from ember.webgpu.runtime import get_runtime


# ---- fusion ------------------------------------------------------------------------------------

def test_gelu_chain_runs_as_one_dispatch():
    a = rand(1 << 18)
    x = gpu(a)
    wg.reset_stats()
    y = x * ((x / math.sqrt(2)).erf() + 1) / 2
    assert wg.stats()["dispatches"] == 0            # recorded, not run
    wg.evaluate(y)
    s = wg.stats()
    assert s["dispatches"] == 1 and s["fused_kernels"] == 1 and s["fused_ops"] == 5
    want = np.array([v * (math.erf(v / math.sqrt(2)) + 1) / 2 for v in a[:2000].tolist()])
    np.testing.assert_allclose(y.numpy()[:2000], want, rtol=1e-5, atol=1e-6)


def test_fusion_off_runs_one_kernel_per_op():
    x = gpu(rand(1000))
    old = wg.set_fusion(False)
    try:
        wg.reset_stats()
        y = x * ((x / math.sqrt(2)).erf() + 1) / 2
        assert wg.stats()["dispatches"] == 5
    finally:
        wg.set_fusion(old)
    wg.reset_stats()
    z = x * ((x / math.sqrt(2)).erf() + 1) / 2
    np.testing.assert_array_equal(z.numpy(), y.numpy())


def test_reduction_ends_a_chain_and_fusion_keeps_the_pipeline_count_flat():
    x = gpu(rand(64, 33))
    (x * 2 + 1).sum(axis=1).numpy()                 # compile both kernels once
    wg.reset_stats()
    for k in range(5):
        y = gpu(rand(64, 33, seed=k))
        got = (y * 2 + 1).sum(axis=1).numpy()
        np.testing.assert_allclose(got, (rand(64, 33, seed=k) * 2 + 1).sum(axis=1), rtol=1e-5, atol=1e-5)
    s = wg.stats()
    assert s["pipelines_compiled"] == 0             # constants are uniforms: no recompiles
    assert s["dispatches"] == 5                     # the reduction computes the chain itself
    assert s["fused_ops"] == 10 and s["fused_kernels"] == 0
    # a chain that is also read on its own afterwards is computed again there; both are right
    z = gpu(rand(64, 33, seed=9)) * 2 + 1
    zs = z.sum(axis=1).numpy()
    np.testing.assert_allclose(zs, z.numpy().sum(axis=1), rtol=1e-5)


def test_broadcast_lazy_input_is_computed_once_and_right():
    a, b = rand(7, 1), rand(1, 5, seed=1)
    got = ((gpu(a) * 3).exp() + gpu(b)).numpy()
    np.testing.assert_allclose(got, np.exp(a * 3) + b, rtol=1e-5)


# ---- views and the pool ------------------------------------------------------------------------

def test_movement_ops_are_views():
    a = rand(4, 6, 5)
    x = gpu(a)
    wg.reset_stats()
    v = x.permute_dims((2, 0, 1))[1:, ::-2, 3]
    w = ember.broadcast_to(gpu(a[:1]), (3, 6, 5))
    assert wg.stats()["dispatches"] == 0
    np.testing.assert_array_equal(v.numpy(), a.transpose(2, 0, 1)[1:, ::-2, 3])
    np.testing.assert_array_equal((w + 0).numpy(), np.broadcast_to(a[:1], (3, 6, 5)))
    np.testing.assert_allclose((x.permute_dims((0, 2, 1)) @ gpu(rand(4, 6, 2))).numpy(),
                               a.transpose(0, 2, 1) @ rand(4, 6, 2), rtol=1e-5, atol=1e-5)


def test_pool_reuses_freed_buffers():
    rt = get_runtime()
    x = gpu(rand(1000))
    (x + 1).numpy()
    wg.reset_stats()
    before = wg.stats()["bytes_allocated"]
    for _ in range(20):
        (x * 2 + 1).numpy()
    s = wg.stats()
    assert s["pool_hits"] >= 20 and s["pool_misses"] == 0
    assert s["bytes_allocated"] == before
    assert rt.pool.pooled_bytes > 0


def test_pool_is_safe_when_tensors_die_in_reference_cycles():
    class Holder:
        pass

    for _ in range(3):
        h = Holder()
        h.self = h                                  # a cycle: only the cyclic GC frees it
        h.t = gpu(rand(50)) * 3
        wg.evaluate(h.t)
        del h
        gc.collect()
        for _ in range(10):                         # reuse whatever came back to the pool
            np.testing.assert_allclose((gpu(np.ones(50, np.float32)) + 1).numpy(), 2.0)


def test_buffer_size_limit_raises_device_error(monkeypatch):
    # (tensors over maxStorageBufferBindingSize run in chunks: tests/test_webgpu_limits.py)
    rt = get_runtime()
    monkeypatch.setattr(rt.pool, "max_buffer", 1024)
    with pytest.raises(DeviceError, match="maxBufferSize"):
        gpu(rand(1000))


def test_grids_past_the_workgroup_limit(monkeypatch):
    rt = get_runtime()
    monkeypatch.setattr(rt, "max_groups", 3)        # forces 2-D grids on small tensors
    a = rand(40, 70)
    x = gpu(a)
    np.testing.assert_allclose((x * 2 - 1).numpy(), a * 2 - 1, rtol=1e-6)
    np.testing.assert_allclose(x.sum(axis=0).numpy(), a.sum(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ember.softmax(x, axis=1).numpy(),
                               np.exp(a - a.max(1, keepdims=True)) / np.exp(a - a.max(1, keepdims=True)).sum(1, keepdims=True),
                               rtol=1e-5, atol=1e-6)


# ---- dtypes and errors -------------------------------------------------------------------------

def test_int64_outside_int32_fails_on_upload():
    with pytest.raises(DTypeError, match="int32 range"):
        ember.tensor([1, 2 ** 40], device="webgpu")
    with pytest.raises(DTypeError, match="32-bit"):
        ember.full((2,), 2 ** 33, dtype="int64", device="webgpu")
    t = ember.tensor([-(2 ** 31), 2 ** 31 - 1], device="webgpu")
    assert t.tolist() == [-(2 ** 31), 2 ** 31 - 1] and t.dtype is ember.int64


def test_float16_is_rounded_like_the_python_backend():
    vals = [0.1, 1.0 / 3, 1000.7, 65000.0, -2.5e-5]
    for dev in ("python", "webgpu"):
        h = ember.tensor(vals, dtype="float16", device=dev)
        out = ((h * 3 + 0.1) * 0.5).tolist()
        if dev == "python":
            want = out
    assert out == want


def test_computed_indices_are_range_checked():
    x = gpu(rand(5, 3))
    idx = ember.argmax(gpu(rand(4, 9)), axis=1) + 5   # computed on the GPU: values 5..13
    with pytest.raises(IndexingError, match="out of range"):
        ember.take(x, idx, axis=0)
    ok = ember.argmax(gpu(rand(4, 5)), axis=1)
    np.testing.assert_array_equal(ember.take(x, ok, axis=0).numpy(), rand(5, 3)[np.argmax(rand(4, 5), 1)])


def test_shader_compile_error_is_a_device_error():
    rt = get_runtime()
    with pytest.raises(DeviceError, match="failed to compile"):
        rt.driver.pipeline("@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }")


# ---- driver protocol, info, async --------------------------------------------------------------

def test_driver_protocol_round_trip():
    d = get_runtime().driver
    for name in ("alloc", "free", "write", "read", "read_async", "pipeline", "dispatch", "flush"):
        assert callable(getattr(d, name))
    assert {"max_storage_buffer_binding_size", "max_buffer_size"} <= set(d.limits)
    src = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<uniform> info: vec4<u32>;
@compute @workgroup_size(4) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  out[g.x] = g.x * info.x + info.y;
}"""
    buf = d.alloc(16)
    d.write(buf, bytes(16))
    pipe = d.pipeline(src, "main")
    d.dispatch(pipe, [buf], np.array([10, 7, 0, 0], np.uint32).tobytes(), (1, 1, 1))
    assert np.frombuffer(d.read(buf, 16), np.uint32).tolist() == [7, 17, 27, 37]
    assert asyncio.run(d.read_async(buf, 8)) == d.read(buf, 8)
    d.free(buf)


def test_info_stats_devices_and_init():
    assert "webgpu" in ember.devices()
    i = wg.info()
    assert i["limits"]["max_storage_buffer_binding_size"] > 0 and i["backend"]
    assert set(wg.stats()) >= {"dispatches", "pipelines_compiled", "bytes_allocated", "pool_hits", "fused_kernels"}
    assert asyncio.run(wg.init())["device"] == i["device"]
    x = gpu(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert asyncio.run((x * 2).data_async()) == [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]


# ---- matmul variants and autotune --------------------------------------------------------------

@pytest.mark.parametrize("variant", ["tiled", "rb32", "rb64", "rb128", "sk", "sg", "mv"])
def test_matmul_variants_match_numpy(variant):
    rt = get_runtime()
    cases = [((3, 5), (5, 7)), ((130, 70), (70, 129)), ((2, 1, 9, 20), (3, 20, 4)), ((1, 300), (300, 33)),
             ((130, 520), (520, 129)), ((2, 1, 9, 300), (3, 300, 4))]   # ragged and batched deep k
    for sa, sb in cases:
        m, k, n = sa[-2], sa[-1], sb[-1]
        if not linalg.eligible(rt, variant, m, n, k, "f32"):
            continue
        a, b = rand(*sa), rand(*sb, seed=1)
        autotune.force("matmul", variant)
        try:
            got = (gpu(a) @ gpu(b)).numpy()
            bt = gpu(np.ascontiguousarray(np.swapaxes(b, -1, -2)))
            got_t = (gpu(a) @ ember.matrix_transpose(bt)).numpy()   # w.T read through strides
        finally:
            autotune.force("matmul", None)
        np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(got_t, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", ["rb32", "rb64", "rb128", "sk"])
def test_register_blocked_matmuls_read_every_layout(variant):
    """The generated register-blocked kernels (and split-K over them) on operands read through
    strides: A transposed (its rows along the buffer), both transposed, views starting at an
    unaligned element (scalar loads instead of vec4), k shorter than a k tile and k that ends
    mid-tile, whole tiles (the pipeline without bounds checks), a broadcast batch axis, with and
    without an epilogue."""
    rt = get_runtime()
    autotune.force("matmul", variant)
    try:
        # ragged, whole tiles (128x512x128: no bounds checks compiled in), whole tiles but a ragged k
        for (m, k, n) in [(70, 5, 33), (67, 1000, 130), (129, 300, 65), (40, 97, 200), (128, 512, 128), (128, 200, 128)]:
            if not linalg.eligible(rt, variant, m, n, k, "f32"):
                continue
            a, b, bias = rand(m, k), rand(k, n, seed=1), rand(n, seed=2)
            at, bt = np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)
            ref = a @ b
            got = {
                "A.T": (ember.matrix_transpose(gpu(at)) @ gpu(b)).numpy(),
                "both.T": (ember.matrix_transpose(gpu(at)) @ ember.matrix_transpose(gpu(bt))).numpy(),
                "unaligned": (gpu(np.pad(a, ((0, 0), (1, 0))))[:, 1:] @ gpu(np.pad(b, ((1, 0), (3, 0))))[1:, 3:]).numpy(),
                "epilogue": ember.relu(gpu(a) @ gpu(b) + gpu(bias)).numpy() - np.maximum(ref + bias, 0) + ref,
                # rows 16-byte aligned but k (n) not a multiple of 4: a row's last vec4 is partial
                "narrow": (gpu(np.pad(a, ((0, 0), (0, 8 - k % 4)), constant_values=7))[:, :k]
                           @ gpu(np.pad(b, ((0, 0), (0, 8 - n % 4)), constant_values=7))[:, :n]).numpy(),
            }
            for name, g in got.items():
                np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-4, err_msg=f"{variant} {m}x{k}x{n} {name}")
        a, b = rand(3, 1, 40, 70), rand(2, 70, 48, seed=1)        # batch axes broadcast both ways
        if linalg.eligible(rt, variant, 40, 48, 70, "f32"):
            np.testing.assert_allclose((gpu(a) @ gpu(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    finally:
        autotune.force("matmul", None)


def test_mv_matmul_reads_b_along_its_columns(monkeypatch):
    """``mv`` (few rows times a B stored (K, N)): every row count 1..16 (groups of up to 4 rows,
    a last group cut short), k ragged against the k groups (16 to 256 of them) and shorter than
    them, A read through strides, a broadcast batch, an epilogue; B views that are not 16-byte
    aligned or N not a multiple of 4 go to another variant with the same results."""
    ran = []
    record = linalg.MatmulPlan._record
    monkeypatch.setattr(linalg.MatmulPlan, "_record", lambda self, v, *a, **k: (ran.append(v), record(self, v, *a, **k))[1])
    mv = lambda: ran.count("mv")   # noqa: E731
    autotune.force("matmul", "mv")
    try:
        for m, k, n in [(1, 384, 384), (2, 3, 8), (3, 250, 36), (4, 1025, 12), (5, 700, 20), (6, 33, 4), (7, 64, 8),
                        (8, 1500, 24), (9, 129, 40), (10, 5, 4), (11, 300, 16), (12, 257, 28), (13, 90, 8),
                        (14, 1030, 44), (15, 17, 12), (16, 384, 1536)]:
            a, b, bias = rand(m, k), rand(k, n, seed=1), rand(n, seed=2)
            before = mv()
            ref = a @ b
            np.testing.assert_allclose((gpu(a) @ gpu(b)).numpy(), ref, rtol=1e-4, atol=1e-4, err_msg=f"{m}x{k}x{n}")
            assert mv() == before + 1, f"{m}x{k}x{n} did not run mv"
            at = ember.matrix_transpose(gpu(np.ascontiguousarray(a.T)))
            np.testing.assert_allclose((at @ gpu(b)).numpy(), ref, rtol=1e-4, atol=1e-4, err_msg=f"A.T {m}x{k}x{n}")
            got = ember.relu(gpu(a) @ gpu(b) + gpu(bias)).numpy()
            np.testing.assert_allclose(got, np.maximum(ref + bias, 0), rtol=1e-4, atol=1e-4, err_msg=f"epilogue {m}x{k}x{n}")
        a, b = rand(3, 1, 4, 70), rand(2, 70, 48, seed=1)          # batch axes broadcast both ways
        np.testing.assert_allclose((gpu(a) @ gpu(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
        before = mv()
        a, b = rand(3, 40), rand(41, 13, seed=1)
        for bv in (gpu(b)[1:, :12], gpu(b)[:40, :]):             # unaligned rows; N = 13
            np.testing.assert_allclose((gpu(a) @ bv).numpy(), a @ bv.numpy(), rtol=1e-4, atol=1e-4)
        assert mv() == before
    finally:
        autotune.force("matmul", None)


def test_autotune_caches_the_winner_per_adapter(tmp_path, monkeypatch):
    monkeypatch.setitem(autotune._STATE, "enabled", True)   # tests/conftest.py turns it off
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(autotune, "_MEMORY", {})
    monkeypatch.setattr(autotune, "_LOADED", [False])
    a, b = rand(96, 40), rand(40, 80, seed=1)
    wg.reset_stats()
    np.testing.assert_allclose((gpu(a) @ gpu(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    assert wg.stats()["autotune_benchmarks"] == 1
    data = json.loads((tmp_path / "ember" / "autotune.json").read_text())
    (section,) = data.values()
    key = autotune.shape_key("matmul", "f32", (96, 80, 40, 1), (True, True, False, False, False))
    assert section[key] in linalg.VARIANTS
    # same shape class (dims round to the same powers of two): no second benchmark
    (gpu(rand(100, 33)) @ gpu(rand(33, 70))).numpy()
    assert wg.stats()["autotune_benchmarks"] == 1
    # a fresh process reads the file
    monkeypatch.setattr(autotune, "_MEMORY", {})
    monkeypatch.setattr(autotune, "_LOADED", [False])
    (gpu(a) @ gpu(b)).numpy()
    assert wg.stats()["autotune_benchmarks"] == 1


def test_autotune_off_uses_the_default_variant(monkeypatch):
    monkeypatch.setattr(autotune, "_MEMORY", {})
    monkeypatch.setattr(autotune, "_LOADED", [True])
    old = autotune.set_enabled(False)
    try:
        wg.reset_stats()
        (gpu(rand(70, 30)) @ gpu(rand(30, 50))).numpy()
        assert wg.stats()["autotune_benchmarks"] == 0
    finally:
        autotune.set_enabled(old)


def test_attention_longer_than_shared_memory_falls_back():
    from ember.webgpu import nn

    q, k, v = rand(1, 3, 4), rand(1, nn.SMAX + 5, 4, seed=1), rand(1, nn.SMAX + 5, 2, seed=2)
    got = ember.scaled_dot_product_attention(gpu(q), gpu(k), gpu(v)).numpy()
    s = q @ k.transpose(0, 2, 1) / 2.0
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-4, atol=1e-5)


# ---- coverage ----------------------------------------------------------------------------------

def test_every_primitive_has_a_webgpu_kernel():
    kernels = ember.get_backend("webgpu").kernels
    primitives = [n for n, d in OPS.items() if d.decompose is None]
    missing = [n for n in primitives if n not in kernels]
    assert not missing, f"webgpu has no kernel for primitives {missing}"
    for composite in ("softmax", "log_softmax", "layer_norm", "scaled_dot_product_attention", "gelu",
                      "sigmoid", "silu", "relu"):
        assert composite in kernels, f"{composite} should have a real webgpu kernel"


def test_lazy_tensor_reused_by_kernels_is_computed_once():
    w = gpu(rand(64)).astype("float16").astype("float32")    # like a float16 weight widened at load
    x = gpu(rand(3, 64))
    ember.layer_norm(x, 64, weight=w, bias=w).numpy()
    wg.reset_stats()
    ember.layer_norm(x, 64, weight=w, bias=w).numpy()
    assert wg.stats()["dispatches"] == 1                      # just the layer_norm kernel


def test_attention_heads_merge_without_a_copy():
    b, h, n, d = 2, 3, 5, 4
    q, k, v = (rand(b, h, n, d, seed=s) for s in range(3))
    o = ember.scaled_dot_product_attention(gpu(q), gpu(k), gpu(v))
    wg.reset_stats()
    merged = o.permute_dims((0, 2, 1, 3)).reshape((b, n, h * d))  # the usual merge of heads
    assert wg.stats()["dispatches"] == 0
    s = q @ k.transpose(0, 1, 3, 2) / 2.0
    p = np.exp(s - s.max(-1, keepdims=True))
    want = ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(b, n, h * d)
    np.testing.assert_allclose(merged.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["tiled", "rb32", "rb64", "rb128", "sk", "sg"])
def test_matmul_epilogue_fuses_bias_and_activation(variant, monkeypatch):
    """With EMBER_WEBGPU_HEAVY_EPILOGUE=1 (fusion._HEAVY_OFF False) a GELU joins the bias in the
    product's epilogue: one kernel."""
    from ember.webgpu import fusion

    monkeypatch.setattr(fusion, "_HEAVY_OFF", False)
    rt = get_runtime()
    k = 300 if variant == "sk" else 40       # split-k only takes deep k
    a, w, b = rand(16, k), rand(50, k, seed=1), rand(50, seed=2)
    if not linalg.eligible(rt, variant, 16, 50, k, "f32"):
        pytest.skip(f"{variant} not eligible here")
    ref = a @ w.T + b
    want = ref * 0.5 * (1 + np.vectorize(math.erf)(ref / math.sqrt(2)))
    ta, tw, tb = gpu(a), gpu(w), gpu(b)
    autotune.force("matmul", variant)
    try:
        ember.gelu(ta @ ember.matrix_transpose(tw) + tb).numpy()    # compile
        wg.reset_stats()
        got = ember.gelu(ta @ ember.matrix_transpose(tw) + tb).numpy()
        # split-k: the partial products, then one pass that adds them and applies the epilogue
        assert wg.stats()["dispatches"] == (2 if variant == "sk" else 1)
        assert wg.stats()["fused_epilogues"] == 1
    finally:
        autotune.force("matmul", None)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_transcendental_epilogues_run_as_their_own_pass_by_default(monkeypatch):
    """By default (EMBER_WEBGPU_HEAVY_EPILOGUE unset) a product followed by bias + GELU runs
    plain and the bias and GELU as one elementwise pass (an H100 measured that faster than the
    GELU in the product's stores); a bias + relu stays in the epilogue."""
    from ember.webgpu import fusion

    assert fusion._HEAVY_OFF
    a, w, b = rand(16, 40), rand(50, 40, seed=1), rand(50, seed=2)
    ta, tw, tb = gpu(a), gpu(w), gpu(b)
    ref = a @ w.T + b
    for fn, want, epilogues in ((ember.gelu, ref * 0.5 * (1 + np.vectorize(math.erf)(ref / math.sqrt(2))), 0),
                                (ember.relu, np.maximum(ref, 0), 1)):
        fn(ta @ ember.matrix_transpose(tw) + tb).numpy()      # compile
        wg.reset_stats()
        got = fn(ta @ ember.matrix_transpose(tw) + tb).numpy()
        s = wg.stats()
        assert s["fused_epilogues"] == epilogues and s["dispatches"] == 2 - epilogues, (fn, s)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_matmul_result_still_needed_is_computed_once():
    a, w, b = rand(20, 30), rand(30, 25, seed=1), rand(25, seed=2)
    ta, tw, tb = gpu(a), gpu(w), gpu(b)
    (ta @ tw + tb).numpy()
    wg.reset_stats()
    y = ta @ tw
    h = y + tb                      # y is alive: the matmul may not hide inside h's kernel
    z = (h * 2).numpy()
    yv, hv = y.numpy(), h.numpy()
    s = wg.stats()
    assert s["fused_epilogues"] == 0 and s["dispatches"] == 3   # matmul once, then two fused kernels
    np.testing.assert_allclose(yv, a @ w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(hv, a @ w + b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(z, (a @ w + b) * 2, rtol=1e-4, atol=1e-4)


def test_matmul_sg_reads_vec4s_where_rows_are_aligned():
    """``sg`` (few rows, x @ w.T): vec4 loads where both operands run along k with 16-byte
    aligned rows, scalar loads where a view's offset or K breaks that; same results."""
    rt = get_runtime()
    if not linalg.eligible(rt, "sg", 1, 8, 8, "f32"):
        pytest.skip("sg needs the subgroups feature, which this adapter lacks")
    rng = np.random.default_rng(5)
    autotune.force("matmul", "sg")
    try:
        for m, k, n, skip in ((1, 4096, 24, 0), (2, 64, 9, 1), (1, 64, 9, 2), (3, 30, 5, 0), (1, 520, 33, 4)):
            x = rng.standard_normal((m, k)).astype(np.float32)
            w = rng.standard_normal((n + skip, k)).astype(np.float32)
            got = (gpu(x) @ ember.matrix_transpose(gpu(w)[skip:])).numpy()
            np.testing.assert_allclose(got, x @ w[skip:].T, rtol=1e-4, atol=1e-4)
            # (a weight view starting skip rows in: its rows are 16-byte aligned when skip * k is a multiple of 4)
    finally:
        autotune.force("matmul", None)
    used = {dict(k[1]).get("V4") for k in rt.pipelines if isinstance(k, tuple) and k and k[0] == "matmul_sg"}
    assert used >= {"true", "false"}


def test_few_row_products_take_sg_without_timing(tmp_path, monkeypatch):
    """With autotune on, a product of 1-4 rows takes ``sg`` (one read of the weight) without
    timing the variants; 5 rows and more are timed as before."""
    rt = get_runtime()
    if not linalg.eligible(rt, "sg", 1, 8, 8, "f32"):
        pytest.skip("sg needs the subgroups feature, which this adapter lacks")
    monkeypatch.setitem(autotune._STATE, "enabled", True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(autotune, "_MEMORY", {})
    monkeypatch.setattr(autotune, "_LOADED", [False])
    w = rand(48, 64, seed=3)
    for m, timed in ((1, 0), (4, 0), (6, 1)):
        a = rand(m, 64)
        wg.reset_stats()
        np.testing.assert_allclose((gpu(a) @ ember.matrix_transpose(gpu(w))).numpy(), a @ w.T, rtol=1e-4, atol=1e-4)
        assert wg.stats()["autotune_benchmarks"] == timed, m


@pytest.mark.parametrize("variant", ["tiled", "rb32", "rb64", "rb128", "sk", "sg"])
def test_matmul_folds_a_shared_weight_over_the_batch(variant):
    """(batch, rows, k) @ W with one W for every batch is one product of batch * rows rows;
    batches that do not follow each other evenly (a sliced or broadcast batch axis) keep their
    batch axis; the results equal numpy's either way, epilogue included."""
    rt = get_runtime()
    w, bias = rand(24, 36, seed=1), rand(36, seed=2)
    cases = {"folded": rand(3, 5, 24), "one row a batch": rand(4, 1, 24), "4-d": rand(2, 3, 4, 24)}
    sliced = rand(3, 7, 24)
    for m, a in list(cases.items()):
        if not linalg.eligible(rt, variant, a.shape[-2] * (a.size // a.shape[-1] // a.shape[-2]), 36, 24, "f32"):
            cases.pop(m)
    autotune.force("matmul", variant)
    try:
        for name, a in cases.items():
            got = (gpu(a) @ gpu(w) + gpu(bias)).numpy()
            np.testing.assert_allclose(got, a @ w + bias, rtol=1e-4, atol=1e-4, err_msg=name)
        if linalg.eligible(rt, variant, 5, 36, 24, "f32"):
            got = (gpu(sliced)[:, 1:6] @ gpu(w)).numpy()           # rows 1..5 of each batch of 7: not even
            np.testing.assert_allclose(got, sliced[:, 1:6] @ w, rtol=1e-4, atol=1e-4)
    finally:
        autotune.force("matmul", None)
    plan = linalg.MatmulPlan(rt, gpu(rand(3, 5, 24))._buf, gpu(w)._buf, _meta((3, 5, 36)))
    assert (plan.M, plan.nb, plan.rank) == (15, 1, 0)
    plan = linalg.MatmulPlan(rt, gpu(sliced)[:, 1:6]._buf, gpu(w)._buf, _meta((3, 5, 36)))
    assert (plan.M, plan.nb) == (5, 3)


def _meta(shape):
    from ember.registry import Meta

    return Meta(tuple(shape), ember.float32)


def test_autotune_times_by_gpu_timestamps_where_it_can(tmp_path, monkeypatch):
    """Natively, with ``timestamp-query``, autotune sums the GPU time of the passes it timed
    (host sync noise hid 2-5x differences between ~50 us kernels) and takes its timer off after."""
    import ember.webgpu.native as native

    rt = get_runtime()
    if "timestamp-query" not in rt.features or not hasattr(rt.driver, "timer"):
        pytest.skip("this adapter has no timestamp queries (autotune times by the host's wait)")
    monkeypatch.setitem(autotune._STATE, "enabled", True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(autotune, "_MEMORY", {})
    monkeypatch.setattr(autotune, "_LOADED", [False])
    seen = []
    orig = native.PassTimer.seconds
    monkeypatch.setattr(native.PassTimer, "seconds", lambda self: seen.append(orig(self)) or seen[-1])
    a, b = rand(96, 200), rand(200, 80, seed=1)
    np.testing.assert_allclose((gpu(a) @ gpu(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    assert seen and all(s is not None and s > 0 for s in seen)
    assert rt.driver.timer is None


def test_index_ranges_survive_int64_constants_aranges_and_reshapes():
    """A BERT-style embedding sum (word ids uploaded as int64, token types ``zeros_like`` them,
    positions an int64 ``arange`` sliced) checks its indices from the ranges known on the host:
    no GPU read before the result's own, even on a compiled function's first (recording) call
    (in the page such a read fails outside runPythonAsync); same values as numpy."""
    rt = get_runtime()
    w1, w2, w3 = rand(50, 4), rand(2, 4, seed=1), rand(16, 4, seed=2)
    tw1, tw2, tw3 = gpu(w1), gpu(w2), gpu(w3)
    pos = ember.arange(16, dtype=ember.int64, device="webgpu").reshape(1, -1)

    def f(ids):
        n = ids.shape[1]
        return (ember.embedding(ids, tw1) + ember.embedding(ember.zeros_like(ids), tw2)
                + ember.embedding(pos[:, :n], tw3))
    ids = np.array([[3, 49, 0, 7, 7, 12]], dtype=np.int64)
    want = w1[ids] + w2[np.zeros_like(ids)] + w3[np.arange(6)][None]
    for fn in (f, ember.compile(f), ember.compile(f)):
        rt.reset_stats()
        out = fn(ember.from_bytes(ids.tobytes(), ids.shape, "int64", device="webgpu"))
        wg.evaluate(out)
        assert rt.stats["reads"] == 0
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    from ember.errors import IndexingError

    with pytest.raises(IndexingError):
        f(ember.from_bytes(np.array([[50]], np.int64).tobytes(), (1, 1), "int64", device="webgpu"))
