"""The numpy backend's quantized ops on the wasm backend's kernels compiled natively (ember.native
with SIMDe, core/native/wasm_*.c): dequantize and qembedding bit for bit against ``gguf``'s
dequantization for every format, qlinear against a float64 product of gguf's values, one row and
many, odd n, with the native kernels on and off (``ember.native.disabled()``); the same bits on
any split over threads; the build's names and source hash."""
import ctypes
import os
import shutil

import numpy as np
import pytest

import ember
import ember.native as nat
from ember import quant
from ember.backends import numpy_quant as nq
from ember.errors import IndexingError
from tests.test_quant import int16_bound, make_weight, same_bits

FORMATS = tuple(quant.FORMATS)


@pytest.fixture(params=["native", "numpy"])
def mode(request):
    """Each test once with quant.c natively (skipped where it is not built) and once without."""
    if request.param == "native":
        if nq._native_fn("ember_wasm_q_linear") is None:
            pytest.skip(f"wasm kernels not in ember.native: {nat.info()['wasm_kernels']}")
        yield "native"
    else:
        with nat.disabled():
            yield "numpy"


def _k(qtype: str) -> int:
    return {1: 96, 32: 96, 256: 512}[quant.FORMATS[qtype].block]


def _on(monkeypatch, mode: str):
    """The switch of ``mode`` for code that runs in helper threads too (disabled() is per thread)."""
    if mode == "numpy":
        monkeypatch.setattr(nq, "_native_fn", lambda name: None)


@pytest.mark.parametrize("qtype", FORMATS)
def test_dequantize_and_embedding_match_gguf(mode, qtype, monkeypatch):
    _on(monkeypatch, mode)
    k = _k(qtype)
    for n in (1, 37):
        w, ref = make_weight(qtype, n, k, "numpy", seed=n)
        assert same_bits(ember.dequantize(w.data, qtype=qtype, n=n, k=k).numpy(), ref), (mode, n)
        ids = [n - 1, 0, n // 2, n - 1]
        for dt in (ember.int32, ember.int64):
            got = quant.embedding(ember.tensor(ids, dtype=dt, device="numpy"), w).numpy()
            assert same_bits(got, ref[ids]), (mode, n, dt)


def test_dequantize_split_over_threads_and_pieces(monkeypatch):
    if nq._native_fn("ember_wasm_q_dequantize") is None:
        pytest.skip(nat.info()["wasm_kernels"])
    w, ref = make_weight("q4_k", 203, 512, "numpy", seed=3)
    monkeypatch.setattr(nq, "NATIVE_SPLIT_BYTES", 0)
    monkeypatch.setattr(nq, "_NATIVE_PIECES", 7)
    assert same_bits(ember.dequantize(w.data, qtype="q4_k", n=203, k=512).numpy(), ref)


def _reference(x, ref):
    return (x.astype(np.float64) @ ref.astype(np.float64).T), np.abs(x).astype(np.float64) @ np.abs(ref).T


@pytest.mark.parametrize("qtype", FORMATS)
def test_qlinear_against_float64(mode, qtype, monkeypatch):
    _on(monkeypatch, mode)
    k = _k(qtype)
    n = 37                     # not a multiple of quant.c's four rows
    w, ref = make_weight(qtype, n, k, "numpy", seed=4)
    rng = np.random.default_rng(5)
    for m in (1, 2, 3, 4, 9):   # the fused path (m <= 3) and the tiles
        x = rng.normal(size=(m, k)).astype(np.float32)
        y = quant.linear(ember.from_numpy(x, device="numpy"), w).numpy()
        want, scale = _reference(x, ref)
        err = np.abs(y - want)
        assert y.shape == (m, n), (mode, m)
        if mode == "native" and qtype not in ("f32", "f16", "bf16"):
            # int16 activation: half a step (amax / 32767 of x's block) per element, times |w|
            assert (err <= int16_bound(x, ref)).all(), (mode, m)
        else:   # float products: float32 roundings
            assert (err <= 2e-6 * scale).all(), (mode, m, float((err / scale).max()))


@pytest.mark.parametrize("qtype", ["q4_1", "q8_0", "q4_k", "q6_k", "iq4_xs", "q5_0", "f16"])
def test_qlinear_same_bits_any_split_and_m(qtype, monkeypatch):
    """Whole output rows per piece: one piece or many, 1 or 2 threads, the same bits; a row of x
    gives the same bits alone (decode) as inside a prompt (quant.c's fused and tiled paths)."""
    if nq._native_fn("ember_wasm_q_linear") is None:
        pytest.skip(nat.info()["wasm_kernels"])
    k = _k(qtype)
    w, _ = make_weight(qtype, 301, k, "numpy", seed=6)
    x = np.random.default_rng(7).normal(size=(6, k)).astype(np.float32)
    xt = ember.from_numpy(x, device="numpy")
    monkeypatch.setattr(nq, "NATIVE_SPLIT_BYTES", 1 << 60)
    one = quant.linear(xt, w).numpy()
    monkeypatch.setattr(nq, "NATIVE_SPLIT_BYTES", 0)
    monkeypatch.setattr(nq, "_NATIVE_PIECES", 5)
    assert same_bits(quant.linear(xt, w).numpy(), one)
    if quant.FORMATS[qtype].block > 1:   # (the float path's GEMM blocks by m)
        for i in (0, 5):
            row = quant.linear(ember.from_numpy(x[i:i + 1], device="numpy"), w).numpy()
            assert same_bits(row, one[i:i + 1]), i


def test_qlinear_odd_shapes_and_batches(mode, monkeypatch):
    _on(monkeypatch, mode)
    w, ref = make_weight("q4_0", 5, 32, "numpy", seed=8)
    x = np.random.default_rng(9).normal(size=(2, 3, 32)).astype(np.float32)
    y = quant.linear(ember.from_numpy(x, device="numpy"), w).numpy()
    want, _ = _reference(x.reshape(6, 32), ref)
    assert y.shape == (2, 3, 5) and (np.abs(y.reshape(6, 5) - want) <= int16_bound(x, ref)).all()


def test_qembedding_bad_ids_raise(mode, monkeypatch):
    _on(monkeypatch, mode)
    w, _ = make_weight("q8_0", 4, 32, "numpy")
    for bad in (4, -1):
        with pytest.raises(IndexingError, match=f"id {bad} is out of range"):
            quant.embedding(ember.tensor([0, bad], device="numpy"), w).numpy()


def test_native_qlinear_inf_and_nan_activation():
    """A block of x holding inf or NaN: every output it feeds is NaN (quant.c's rule); the others
    finite."""
    if nq._native_fn("ember_wasm_q_linear") is None:
        pytest.skip(nat.info()["wasm_kernels"])
    w, _ = make_weight("q8_0", 8, 64, "numpy", seed=2)
    x = np.ones((2, 64), np.float32)
    x[0, 3] = np.inf
    y = quant.linear(ember.from_numpy(x, device="numpy"), w).numpy()
    assert np.isnan(y[0]).all() and np.isfinite(y[1]).all()


def test_scratch_size_matches_the_wasm_backend():
    from ember.wasm.ops_quant import scratch_floats

    for qtype in FORMATS:
        for m, k in ((1, 512), (7, 1536)):
            assert nq.scratch_floats(qtype, m, k) == scratch_floats(qtype, m, k), qtype


def test_library_names_and_source_hash(tmp_path, monkeypatch):
    """quant.c's entry points carry the ember_wasm_ prefix (never a bare wasm name); the hash
    changes with a wasm source and with SIMDe's presence, and a build without SIMDe leaves the
    wasm kernels out (numpy_quant then runs its numpy paths)."""
    if nat.find_compiler() is None or nat.simde_dir() is None:
        pytest.skip("no C compiler or no SIMDe here")
    dll = nat.lib()
    if dll is None:
        pytest.skip(nat.info()["reason"])
    for name in ("q_linear", "q_dequantize", "q_embedding", "gemm"):
        assert getattr(dll, "ember_wasm_" + name, None) is not None and getattr(dll, name, None) is None, name
    assert nat.info()["wasm_kernels"].startswith("built")
    try:
        _hash_and_plain_build(tmp_path, monkeypatch)
    finally:   # build() forgot the loaded library: load it again with the real sources
        monkeypatch.undo()
        nat._state.clear()
    assert nat.lib() is not None


def _hash_and_plain_build(tmp_path, monkeypatch):
    h = nat.source_hash()
    kdir = tmp_path / "wasm" / "kernels"
    shutil.copytree(nat.wasm_kernels_dir(), kdir)
    monkeypatch.setattr(nat, "wasm_kernels_dir", lambda: str(kdir))
    assert nat.source_hash() == h
    with open(kdir / "quant.c", "a") as f:
        f.write("\n/* changed */\n")
    assert nat.source_hash() != h
    monkeypatch.setattr(nat, "simde_dir", lambda: None)
    h0 = nat.source_hash()
    assert h0 != h and nat.wasm_sources()[0] == ()
    out = str(tmp_path / "plain.so")
    nat.build(out=out)
    plain = ctypes.CDLL(out)
    assert getattr(plain, "ember_wasm_q_linear", None) is None and plain.ember_native_axpy
    assert os.path.exists(out)
