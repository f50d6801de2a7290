"""ember.quant and the quantized-weight ops: every format's reference dequantization (pure
Python) and the numpy kernels bit for bit against the ``gguf`` package on random blocks;
``quantize`` bit for bit against ``gguf.quants.quantize``; qlinear / qembedding / dequantize
on each backend against a float reference; the shape and dtype rules' errors."""
import numpy as np
import pytest

import ember
from ember import quant
from ember.errors import DTypeError, IndexingError, ShapeError
from ember.registry import OPS
from tests.helpers import raises

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as gguf_dequantize, quantize as gguf_quantize  # noqa: E402

GT = gguf.GGMLQuantizationType
# The backends whose quant kernels this file checks; the wasm and webgpu kernels have their own
# tests (they compare against the same reference).
QUANT_DEVICES = ("python", "numpy")
QUANTIZABLE = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1")
FORMATS = tuple(quant.FORMATS)

# byte offsets of the float16 scale fields in each block format
_HALF_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q5_0": (0,), "q4_1": (0, 2), "q5_1": (0, 2), "q4_k": (0, 2),
                "q5_k": (0, 2), "q6_k": (208,), "q3_k": (108,), "q2_k": (80, 82), "iq4_nl": (0,), "iq4_xs": (0,)}


def random_blocks(qtype: str, n_blocks: int, seed: int = 0) -> np.ndarray:
    """Random valid blocks: random bytes, with finite float16 scales (any bit pattern is a valid
    quant, sub-scale or mask; only a NaN/inf scale would make the comparison meaningless)."""
    rng = np.random.default_rng(seed)
    f = quant.FORMATS[qtype]
    if qtype in ("f32", "f16", "bf16"):
        vals = rng.normal(size=n_blocks) * 10.0 ** rng.integers(-3, 3, size=n_blocks)
        if qtype == "bf16":
            return (vals.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_blocks, 2)
        return vals.astype(np.float32 if qtype == "f32" else np.float16).view(np.uint8).reshape(n_blocks, f.nbytes)
    raw = rng.integers(0, 256, size=(n_blocks, f.nbytes), dtype=np.uint8)
    for off in _HALF_FIELDS[qtype]:
        scales = (rng.normal(size=n_blocks) * 10.0 ** rng.integers(-4, 2, size=n_blocks)).astype(np.float16)
        raw[:, off:off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return raw


def gguf_reference(raw: np.ndarray, qtype: str) -> np.ndarray:
    return gguf_dequantize(np.ascontiguousarray(raw).reshape(-1), GT(quant.FORMATS[qtype].ggml_type)).reshape(-1)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a, np.float32).reshape(-1), np.asarray(b, np.float32).reshape(-1)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# ---- the format table --------------------------------------------------------------------------

def test_formats_match_ggml_sizes():
    for name, f in quant.FORMATS.items():
        assert f.name == name
        assert gguf.GGML_QUANT_SIZES[GT(f.ggml_type)] == (f.block, f.nbytes), name
        assert GT(f.ggml_type).name.lower() == name
    assert set(FORMATS) == {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q5_k", "q6_k",
                            "q3_k", "q2_k", "q5_1", "iq4_nl", "iq4_xs"}
    for t, name in quant.GGML_TYPES.items():
        if t not in (4, 5):                    # Q4_2 / Q4_3: removed from ggml long ago
            assert GT(t).name == name


def test_row_bytes_and_words():
    assert quant.row_bytes("q4_1", 576) == 360
    assert quant.row_bytes("q6_k", 512) == 420
    assert quant.words("q8_0", 3, 32) == 26        # 102 bytes -> 25.5 words, padded
    with raises(ShapeError, "q4_k", "256"):
        quant.row_bytes("q4_k", 576)
    with raises(DTypeError, "q9_9"):
        quant.row_bytes("q9_9", 32)


# ---- dequantization: reference and numpy against gguf ------------------------------------------

@pytest.mark.parametrize("qtype", FORMATS)
def test_reference_dequantize_matches_gguf(qtype):
    raw = random_blocks(qtype, 24, seed=1)
    want = gguf_reference(raw, qtype)
    assert same_bits(quant.FORMATS[qtype].dequantize(raw.tobytes()), want)


@pytest.mark.parametrize("qtype", FORMATS)
def test_numpy_dequantize_matches_gguf(qtype):
    from ember.backends.numpy_quant import DEQUANT

    raw = random_blocks(qtype, 300, seed=2)
    assert same_bits(DEQUANT[qtype](raw), gguf_reference(raw, qtype))


@pytest.mark.parametrize("qtype", QUANTIZABLE)
def test_dequantize_of_gguf_quantized_data(qtype):
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(8, 64)) * rng.uniform(0.01, 50, size=(8, 1))).astype(np.float32)
    raw = gguf_quantize(x, GT[qtype.upper()])
    want = gguf_reference(raw, qtype)
    assert same_bits(quant.FORMATS[qtype].dequantize(raw.tobytes()), want)
    for device in QUANT_DEVICES:
        w = quant.QTensor.from_bytes(raw.tobytes(), qtype, (8, 64), device=device)
        assert same_bits(w.dequantize().numpy(), want), device


# ---- quantize: bit for bit with gguf -------------------------------------------------------------

@pytest.mark.parametrize("qtype", QUANTIZABLE + ("f16", "bf16", "f32"))
def test_quantize_matches_gguf(qtype):
    rng = np.random.default_rng(4)
    x = (rng.normal(size=(12, 64)) * rng.uniform(1e-3, 100, size=(12, 1))).astype(np.float32)
    x[0] = 0.0                                    # an all-zero block (d = 0)
    x[1, :32] = 1.0                               # a constant block
    x[2, :32] = np.linspace(-8, 8, 32)            # exact halves: rounding ties
    x[3, 5] = -x[3, :32].__abs__().max()          # the largest magnitude negative
    x[3, 6] = -x[3, 5]                            # ... and a tie with a positive one after it
    ref = gguf_quantize(x, GT[qtype.upper()])
    got = quant.quantize(x.reshape(-1).tolist(), qtype)
    assert got == np.ascontiguousarray(ref).tobytes()


def test_quantize_errors():
    with raises(ShapeError, "31 values", "32-element"):
        quant.quantize([0.0] * 31, "q8_0")
    with raises(DTypeError, "q4_k"):
        quant.quantize([0.0] * 256, "q4_k")
    with pytest.raises(ember.errors.EmberError, match="finite"):
        quant.quantize([float("nan")] + [0.0] * 31, "q4_0")


# ---- the ops on each backend ---------------------------------------------------------------------

def make_weight(qtype, n, k, device, seed=5):
    """A QTensor of random valid blocks and its float32 values (from gguf)."""
    f = quant.FORMATS[qtype]
    raw = random_blocks(qtype, n * k // f.block, seed=seed)
    w = quant.QTensor.from_bytes(raw.tobytes(), qtype, (n, k), device=device)
    return w, gguf_reference(raw, qtype).reshape(n, k)


@pytest.mark.parametrize("device", QUANT_DEVICES)
@pytest.mark.parametrize("qtype", FORMATS)
def test_dequantize_op(device, qtype):
    k = 256 if quant.FORMATS[qtype].block == 256 else 64
    w, ref = make_weight(qtype, 3, k, device)
    got = ember.dequantize(w.data, qtype=qtype, n=3, k=k)
    assert got.device == device and got.dtype == ember.float32 and got.shape == (3, k)
    assert same_bits(got.numpy(), ref)


def _linear_ref(x, ref):
    return x.astype(np.float64) @ ref.astype(np.float64).T


def int16_bound(x, ref) -> np.ndarray:
    """The most the native qlinear's int16 activation (quant.c: per block of 32, steps of amax /
    32767, rounded) can move x @ ref.T: half a step per element times |w|, plus float32 sums."""
    x = x.reshape(-1, x.shape[-1])
    amax = np.abs(x.reshape(x.shape[0], -1, 32)).max(-1).astype(np.float64)
    mag = np.abs(x).astype(np.float64) @ np.abs(ref).astype(np.float64).T
    return np.repeat(amax / 65534.0, 32, axis=1) @ np.abs(ref).astype(np.float64).T + 2e-6 * mag


def _numpy_native_qlinear(qtype: str, m: int) -> bool:
    """Whether the numpy backend's qlinear of m rows runs quant.c natively (ember.native + SIMDe)."""
    from ember.backends import numpy_quant

    lo, hi = numpy_quant.NATIVE_QLINEAR_M.get(qtype, (1, numpy_quant.NATIVE_QLINEAR_MAX_M))
    return lo <= m <= hi and numpy_quant._native_fn("ember_wasm_q_linear") is not None


@pytest.mark.parametrize("device", QUANT_DEVICES)
@pytest.mark.parametrize("qtype", FORMATS)
def test_qlinear(device, qtype):
    k = 256 if quant.FORMATS[qtype].block == 256 else 96
    n = 7
    w, ref = make_weight(qtype, n, k, device, seed=6)
    rng = np.random.default_rng(7)
    shapes = [(k,), (1, k), (3, k), (2, 2, k)] + ([(40, k)] if device == "numpy" else [])
    for shape in shapes:
        x = rng.normal(size=shape).astype(np.float32)
        y = quant.linear(ember.from_numpy(x, device=device), w)
        assert y.shape == shape[:-1] + (n,) and y.dtype == ember.float32
        want = _linear_ref(x, ref)
        if device == "numpy" and _numpy_native_qlinear(qtype, x.size // k):
            err = np.abs(y.numpy().reshape(-1, n) - want.reshape(-1, n))
            assert (err <= int16_bound(x, ref)).all(), (qtype, shape)
            continue
        np.testing.assert_allclose(y.numpy(), want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("device", QUANT_DEVICES)
def test_qlinear_bias_float_weight_and_decomposition(device):
    w, ref = make_weight("q4_1", 5, 64, device)
    x = ember.from_numpy(np.random.default_rng(8).normal(size=(2, 64)).astype(np.float32), device=device)
    b = ember.tensor([1.0, 2.0, 3.0, 4.0, 5.0], device=device)
    y = quant.linear(x, w, b).numpy()
    # (numpy with the native kernels: plus what the int16 activation may move)
    atol = 1e-4 + (int16_bound(x.numpy(), ref).max() if device == "numpy" and _numpy_native_qlinear("q4_1", 2) else 0)
    np.testing.assert_allclose(y, _linear_ref(x.numpy(), ref) + b.numpy(), rtol=1e-5, atol=atol)
    # a float weight goes through ember.linear
    wf = ember.from_numpy(ref, device=device)
    np.testing.assert_allclose(quant.linear(x, wf, b).numpy(), y, rtol=1e-5, atol=atol)
    # the registry's decomposition (what a backend without a kernel runs) agrees
    dec = OPS["qlinear"].decompose(x, w.data, qtype="q4_1", n=5, k=64).numpy()
    np.testing.assert_allclose(dec, y - b.numpy(), rtol=1e-5, atol=atol)


def test_numpy_qlinear_chunks(monkeypatch):
    """Weights larger than one scratch chunk: the rows are decoded chunk by chunk (numpy's path:
    the native kernels off)."""
    from ember.backends import numpy_quant

    monkeypatch.setattr(numpy_quant, "_native_fn", lambda name: None)
    monkeypatch.setattr(numpy_quant, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(numpy_quant, "FAST_CHUNK_BYTES", 4096)
    # (q4_0, q5_1, iq4_nl with k=96: 54/72/54-byte rows, chunks not all 4-byte aligned)
    for qtype, k in (("q8_0", 128), ("q4_1", 128), ("q4_0", 128), ("q4_0", 96), ("q5_0", 128), ("q5_1", 96),
                     ("iq4_nl", 96), ("q6_k", 256), ("q3_k", 256), ("q2_k", 256), ("iq4_xs", 256), ("f16", 128)):
        w, ref = make_weight(qtype, 53, k, "numpy", seed=9)
        for m in (1, 3, 17, 70):
            x = np.random.default_rng(m).normal(size=(m, k)).astype(np.float32)
            y = quant.linear(ember.from_numpy(x, device="numpy"), w).numpy()
            want = _linear_ref(x, ref)
            np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5 * np.abs(want).max(), err_msg=f"{qtype} M={m}")


@pytest.mark.parametrize("qtype", ["q8_0", "q4_1", "q4_0"])
def test_numpy_qlinear_threads(monkeypatch, qtype):
    """Rows split over worker threads (each with its own scratch) give the same result (numpy's
    path: the native kernels off)."""
    from ember.backends import numpy_quant

    monkeypatch.setattr(numpy_quant, "_native_fn", lambda name: None)
    w, ref = make_weight(qtype, 301, 64, "numpy", seed=12)
    x = np.random.default_rng(13).normal(size=(3, 64)).astype(np.float32)
    xt = ember.from_numpy(x, device="numpy")
    one = quant.linear(xt, w).numpy()
    monkeypatch.setattr(numpy_quant, "THREADS", 3)
    monkeypatch.setattr(numpy_quant, "PARALLEL_MIN", 0)
    monkeypatch.setattr(numpy_quant, "FAST_CHUNK_BYTES", 4096)
    many = quant.linear(xt, w).numpy()
    np.testing.assert_allclose(many, _linear_ref(x, ref), rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-5)


def test_numpy_half_decoding_is_exact():
    """The integer-op float16 decoding of block scales equals numpy's cast for all 65536 halves
    (subnormals, signed zeros, infinities and NaNs included)."""
    from ember.backends.numpy_quant import _halves

    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    for sample in (bits[(bits & 0x7C00) != 0x7C00], bits):      # without and with inf/NaN
        raw = sample.view(np.uint8).copy()
        got = _halves(raw, 2, 0, sample.size, "test")
        assert np.array_equal(got.view(np.uint32), sample.view(np.float16).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("device", QUANT_DEVICES)
@pytest.mark.parametrize("qtype", FORMATS)
def test_qembedding(device, qtype):
    k = 256 if quant.FORMATS[qtype].block == 256 else 32   # q8_0 with k=32: 34-byte rows straddle words
    w, ref = make_weight(qtype, 6, k, device, seed=10)
    for ids in ([5, 0, 5, 2], [[1, 4], [3, 0]], [], 3):
        idt = ember.tensor(ids, dtype="int32", device=device)
        got = quant.embedding(idt, w)
        assert got.shape == np.shape(ids) + (k,)
        assert same_bits(got.numpy(), ref[np.asarray(ids, dtype=np.int64)])
    # the decomposition gives the same rows, both when rows are whole words and when not
    idt = ember.tensor([4, 1], dtype="int64", device=device)
    dec = OPS["qembedding"].decompose(idt, w.data, qtype=qtype, n=6, k=k)
    assert same_bits(dec.numpy(), ref[[4, 1]])


@pytest.mark.parametrize("device", QUANT_DEVICES)
def test_qembedding_out_of_range(device):
    w, _ = make_weight("q4_0", 4, 32, device)
    for bad in (4, -1, 100):
        with raises(IndexingError, "qembedding", str(bad), "[0, 4)"):
            quant.embedding(ember.tensor([0, bad], device=device), w).numpy()
    with pytest.raises(IndexingError):           # the decomposition refuses negative ids too
        OPS["qembedding"].decompose(ember.tensor([-1], device=device), w.data, qtype="q4_0", n=4, k=32).numpy()


# ---- shape and dtype rules -------------------------------------------------------------------

def test_shape_and_dtype_errors():
    w, _ = make_weight("q4_1", 4, 64, "python")        # 4 rows x 40 bytes = 40 words
    x = ember.ones((2, 64))
    with raises(ShapeError, "qlinear", "q4_1", "n=5", "k=64", "50"):
        ember.qlinear(x, w.data, qtype="q4_1", n=5, k=64)
    with raises(ShapeError, "qlinear", "k=48", "block size 32"):
        ember.qlinear(ember.ones((2, 48)), w.data, qtype="q4_1", n=4, k=48)
    with raises(ShapeError, "qlinear", "x has 32 features", "k=64"):
        ember.qlinear(ember.ones((2, 32)), w.data, qtype="q4_1", n=4, k=64)
    with raises(DTypeError, "qlinear", "int32"):
        ember.qlinear(ember.ones((2, 64), dtype="int32"), w.data, qtype="q4_1", n=4, k=64)
    with raises(DTypeError, "qlinear", "float32"):
        ember.qlinear(x, ember.zeros((40,)), qtype="q4_1", n=4, k=64)
    with raises(DTypeError, "dequantize", "q4_9"):
        ember.dequantize(w.data, qtype="q4_9", n=4, k=64)
    with raises(ShapeError, "dequantize", "q4_1", "n=3", "k=64"):
        ember.dequantize(w.data, qtype="q4_1", n=3, k=64)
    with raises(DTypeError, "qembedding", "float32"):
        ember.qembedding(ember.ones((2,)), w.data, qtype="q4_1", n=4, k=64)
    with raises(ShapeError, "qembedding", "q8_0", "n=4", "k=64"):
        ember.qembedding(ember.tensor([0]), w.data, qtype="q8_0", n=4, k=64)
    with raises(DTypeError, "QTensor"):
        ember.qlinear(x, w, qtype="q4_1", n=4, k=64)


def test_qtensor_api():
    w, ref = make_weight("q8_0", 3, 64, "python")
    assert (w.shape, w.n, w.k, w.qtype, w.nbytes, w.dtype, w.device) == ((3, 64), 3, 64, "q8_0", 204, ember.float32,
                                                                          "python")
    assert w.data.shape == (51,) and w.data.dtype == ember.int32
    assert repr(w) == "QTensor(q8_0, shape=(3, 64), device='python')"
    wn = w.to("numpy")
    assert wn.device == "numpy" and wn.tobytes() == w.tobytes() and w.to("python") is w
    assert same_bits(wn.dequantize().numpy(), ref)
    # a 3-D weight (experts): rows are all leading axes
    w3 = quant.QTensor.from_bytes(w.tobytes(), "q8_0", (3, 1, 64))
    assert w3.n == 3 and w3.dequantize().shape == (3, 1, 64)
    with raises(ShapeError, "from_bytes", "203 bytes"):
        quant.QTensor.from_bytes(w.tobytes()[:-1], "q8_0", (3, 64))
    with raises(ShapeError, "need 51 int32 words", "50"):
        quant.QTensor(ember.zeros((50,), dtype="int32"), "q8_0", (3, 64))
    with raises(DTypeError, "int32"):
        quant.QTensor(ember.zeros((51,)), "q8_0", (3, 64))
    with raises(ShapeError, "not a whole number"):
        quant.QTensor(ember.zeros((3,), dtype="int32"), "q8_0", (1, 5))
    q = quant.QTensor.quantize(ember.tensor([[0.5] * 32]), "q4_1")
    assert q.qtype == "q4_1"
    assert q.tobytes() == gguf_quantize(np.full((1, 32), 0.5, np.float32), GT.Q4_1).tobytes()


def test_compiled_step_replays_qlinear():
    """A captured plan replays qlinear / qembedding (weights as plain int32 inputs)."""
    w, ref = make_weight("q4_1", 6, 64, "numpy")
    e, eref = make_weight("q8_0", 10, 64, "numpy", seed=11)

    def step(ids):
        return quant.linear(quant.embedding(ids, e), w)

    f = ember.compile(step)
    for ids in ([1, 2], [9, 0], [3, 3]):
        t = ember.tensor(ids, dtype="int32", device="numpy")
        got = f(t).numpy()
        atol = 1e-4 + (int16_bound(eref[ids], ref).max() if _numpy_native_qlinear("q4_1", 2) else 0)
        np.testing.assert_allclose(got, _linear_ref(eref[ids], ref), rtol=1e-5, atol=atol)


@pytest.mark.parametrize("module", ["ember.quant", "ember.ops.quant"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    if ember.default_device() != "python":
        pytest.skip("the examples show tensors on the default 'python' device")
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0
