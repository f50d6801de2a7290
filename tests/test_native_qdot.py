"""qdot.c (ember.native's AVX-512 / AVX2 quantized matrix-vector product for q8_0, q4_0, q4_1,
q5_0, q5_1, q4_k, q5_k and q6_k, the decode case m <= 4): the SAME BITS as quant.c's q_linear compiled
through SIMDe (the path it replaces) for every format, at k a multiple of 32 but not of 64 (the
k-quants: odd multiples of 256 too), odd n, m = 1..4,
random blocks with extreme scales (largest and subnormal halves, zero, inf, NaN) and extreme
activations (huge, subnormal, zero, inf, NaN blocks; a NaN output as NaN of either sign); within
the int16 activation's bound of the dequantized float64 product; the AVX2 code of an
EMBER_NATIVE_MARCH=x86-64-v3 build too; numpy_quant's wiring (one piece or many threads, qdot on
or off: the same bits); error codes for bad input."""
import ctypes
import platform

import numpy as np
import pytest

import ember
import ember.native as nat
from ember import quant
from ember.backends import numpy_quant as nq
from tests.test_quant import _HALF_FIELDS, gguf_reference, int16_bound, random_blocks, same_bits

P, I64 = ctypes.c_void_p, ctypes.c_int64
QTYPES = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")
GT = {"q8_0": 8, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q4_k": 12, "q5_k": 13, "q6_k": 14}
X86 = platform.machine() in ("x86_64", "AMD64")


def _qdot(dll):
    fn = dll.ember_qdot_linear
    fn.restype, fn.argtypes = I64, [P, P, P, I64, P, I64, I64, I64, I64]
    return fn


@pytest.fixture(scope="module")
def lib():
    dll = nat.lib()
    if dll is None:
        pytest.skip(f"ember.native not in use: {nat.info()['reason']}")
    if nq._native_fn("ember_wasm_q_linear") is None:
        pytest.skip(f"wasm kernels not in ember.native: {nat.info()['wasm_kernels']}")
    isa = dll.ember_qdot_isa
    isa.restype = I64
    if isa() == 0:
        pytest.skip("this build of ember.native has no AVX2 / AVX-512 qdot code")
    return dll


def qdot(dll, raw, qtype, x, n, k):
    m = x.shape[0]
    y = np.full((m, n), np.nan, np.float32)
    sc = np.empty(max(1, m * k * 2 + m * (k // 32) * 16), np.uint8)
    rc = _qdot(dll)(raw.ctypes.data, x.ctypes.data, y.ctypes.data, n, sc.ctypes.data, GT[qtype], m, n, k)
    assert rc == 0, rc
    return y


def simde(raw, qtype, x, n, k):
    """quant.c's q_linear through SIMDe (one call, one thread)."""
    m = x.shape[0]
    y = np.empty((m, n), np.float32)
    sc = np.empty(nq.scratch_floats(qtype, m, k) + 16, np.float32)
    prm = np.array([GT[qtype], m, n, k], np.int32)
    assert nq._native_fn("ember_wasm_q_linear")(raw.ctypes.data, x.ctypes.data, y.ctypes.data, sc.ctypes.data,
                                                  prm.ctypes.data) == 0
    return y


def same(a, b) -> bool:
    """The same bits, where b is not NaN; NaN where it is (a NaN's sign and payload are whichever
    operand's NaN x86 passes on, and the compiler may swap a commutative add's operands: the SIMDe
    path itself does not fix them, as wasm leaves NaN bits unspecified)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(b)
    return a.shape == b.shape and (np.isnan(a) == nan).all() and same_bits(a[~nan], b[~nan])


def _half(v):
    return np.array([v], np.float16).view(np.uint8)


def weights(qtype, n, k, seed, extreme=False):
    """Random blocks (finite scales spanning 1e-4..10); with ``extreme`` some scales replaced by the
    largest half, subnormal halves, +-0 and (q4_1's m too) inf / NaN."""
    f = quant.FORMATS[qtype]
    raw = random_blocks(qtype, n * k // f.block, seed=seed).reshape(-1, f.nbytes)
    if extreme:
        rng = np.random.default_rng(seed + 1)
        special = [65504.0, -65504.0, 6e-8, -6e-8, 1e-5, 0.0, -0.0, np.inf, -np.inf, np.nan]
        for off in _HALF_FIELDS[qtype]:
            pick = rng.random(raw.shape[0]) < 0.2
            vals = rng.choice(len(special), size=int(pick.sum()))
            if pick.any():
                raw[pick, off:off + 2] = np.stack([_half(special[v]) for v in vals])
    return np.ascontiguousarray(raw.reshape(-1))


def activations(m, k, seed, extreme=False):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(m, k)).astype(np.float32)
    if extreme:
        nb = k // 32
        kinds = [lambda b: b * 1e37, lambda b: b * 1e-41, lambda b: b * 0, lambda b: np.where(b > 1, np.inf, b),
                 lambda b: np.where(b > 1, np.nan, b), lambda b: b * (3e38 / float(np.abs(b).max())), lambda b: b]
        for i in range(m):
            for j in range(nb):
                blk = x[i, 32 * j:32 * j + 32]
                x[i, 32 * j:32 * j + 32] = kinds[(i + j * 3 + seed) % len(kinds)](blk)
    return x


SHAPES = [(1, 32), (7, 96), (17, 160), (33, 224), (37, 96), (61, 576)]
K_SHAPES = [(1, 256), (7, 768), (17, 256), (33, 1280), (37, 512)]   # (the k-quants: whole super-blocks)


def shapes(qtype):
    return K_SHAPES if quant.FORMATS[qtype].block == 256 else SHAPES


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("extreme", [False, True])
def test_same_bits_as_the_simde_path(lib, qtype, extreme):
    for s, (n, k) in enumerate(shapes(qtype)):
        raw = weights(qtype, n, k, seed=11 + s, extreme=extreme)
        for m in (1, 2, 3, 4):
            x = activations(m, k, seed=100 * s + m, extreme=extreme)
            got, want = qdot(lib, raw, qtype, x, n, k), simde(raw, qtype, x, n, k)
            assert same(got, want), (qtype, n, k, m, extreme)


@pytest.mark.parametrize("qtype", QTYPES)
def test_within_the_int16_bound_of_float64(lib, qtype):
    for s, (n, k) in enumerate(shapes(qtype)):
        raw = weights(qtype, n, k, seed=31 + s)
        ref = gguf_reference(raw, qtype).reshape(n, k)
        for m in (1, 4):
            x = activations(m, k, seed=7 + s)
            want = x.astype(np.float64) @ ref.astype(np.float64).T
            assert (np.abs(qdot(lib, raw, qtype, x, n, k) - want) <= int16_bound(x, ref)).all(), (qtype, n, k, m)


def test_output_rows_ldy_and_bad_input(lib):
    """y is written only in its m rows of n (ldy apart); a format it does not cover, k not a whole
    number of blocks, a negative size: an error code and nothing written."""
    n, k = 19, 96
    raw = weights("q4_1", n, k, seed=3)
    x = activations(2, k, seed=4)
    big = np.full((2, 40), 7.0, np.float32)
    sc = np.empty(4096, np.uint8)
    fn = _qdot(lib)
    assert fn(raw.ctypes.data, x.ctypes.data, big[:, 5:].ctypes.data, 40, sc.ctypes.data, 3, 2, n, k) == 0
    assert same_bits(big[:, 5:5 + n], simde(raw, "q4_1", x, n, k))
    assert (big[:, :5] == 7).all() and (big[:, 5 + n:] == 7).all()
    y = np.full(64, 7.0, np.float32)
    for qt, m, nn, kk, rc in ((11, 1, n, k, -1), (0, 1, n, k, -1), (3, 1, n, 100, -2), (12, 1, n, k, -2),
                              (3, -1, n, k, -2), (3, 1, -1, k, -2)):
        assert fn(raw.ctypes.data, x.ctypes.data, y.ctypes.data, 19, sc.ctypes.data, qt, m, nn, kk) == rc
    assert (y == 7).all()


@pytest.mark.parametrize("qtype", QTYPES)
def test_numpy_quant_uses_it_with_the_same_bits(lib, qtype, monkeypatch):
    """quant.linear on device numpy: qdot on (m <= 4), off, and split over threads in pieces: the
    same bits; m = 5 stays on q_linear."""
    n, k = 301, 768 if quant.FORMATS[qtype].block == 256 else 224
    w = quant.QTensor.from_bytes(weights(qtype, n, k, seed=5).tobytes(), qtype, (n, k), device="numpy")
    called = []
    real = nq._native_qdot
    monkeypatch.setattr(nq, "_native_qdot", lambda *a: called.append(a[0]) or real(*a))
    for m in (1, 3, 4, 5):
        xt = ember.from_numpy(activations(m, k, seed=m), device="numpy")
        called.clear()
        on = quant.linear(xt, w).numpy()
        assert bool(called) == (m <= 4), m
        monkeypatch.setattr(nq, "NATIVE_QDOT_MAX_M", 0)
        off = quant.linear(xt, w).numpy()
        monkeypatch.setattr(nq, "NATIVE_QDOT_MAX_M", 4)
        monkeypatch.setattr(nq, "NATIVE_SPLIT_BYTES", 0)
        monkeypatch.setattr(nq, "_NATIVE_PIECES", 3)
        split = quant.linear(xt, w).numpy()
        monkeypatch.setattr(nq, "NATIVE_SPLIT_BYTES", 1 << 21)
        monkeypatch.setattr(nq, "_NATIVE_PIECES", 1)
        assert same_bits(on, off) and same_bits(split, off), (qtype, m)


@pytest.mark.skipif(not X86, reason="x86-64 targets")
def test_avx2_build_same_bits(lib, tmp_path, monkeypatch):
    """The AVX2 code (8 rows at a time): a build for x86-64-v3 gives this library's SIMDe bits."""
    monkeypatch.setenv(nat.MARCH_ENV, "x86-64-v3")
    out = nat.build(out=str(tmp_path / "v3.so"))
    monkeypatch.delenv(nat.MARCH_ENV)
    v3 = ctypes.CDLL(out)
    v3.ember_qdot_isa.restype = I64
    assert v3.ember_qdot_isa() == 256
    for qtype in QTYPES:
        for s, (n, k) in enumerate(shapes(qtype)):
            raw = weights(qtype, n, k, seed=50 + s, extreme=s % 2 == 1)
            for m in (1, 3):
                x = activations(m, k, seed=s + m, extreme=s % 2 == 0)
                assert same(qdot(v3, raw, qtype, x, n, k), simde(raw, qtype, x, n, k)), (qtype, n, k, m)


@pytest.mark.parametrize("qtype", ("q4_1", "q8_0", "q5_0", "q4_k", "q6_k"))
def test_two_threads_same_bits_as_one(lib, qtype, monkeypatch):
    """numpy_quant's team.c job (NATIVE_QDOT_TEAM_BYTES: rows of w over two threads, cut at
    multiples of 16, in 1..5 items) gives the one-thread product bit for bit, at n around the
    threshold and not a multiple of 16, m = 1..4; a product under the threshold stays on one thread."""
    from ember.backends import numpy_nn
    if numpy_nn.team() is None:
        pytest.skip("one thread here (numpy_blas.threads() < 2)")
    k = 512 if quant.FORMATS[qtype].block == 256 else 224
    rb = quant.row_bytes(qtype, k)
    used = []
    real, team_bytes = nq._team, nq.NATIVE_QDOT_TEAM_BYTES
    monkeypatch.setattr(nq, "_team", lambda: used.append(1) or real())
    for n in (32, 33, 47, 161, team_bytes // rb - 1, team_bytes // rb + 17):
        raw = weights(qtype, n, k, seed=n).reshape(-1)
        for m in (1, 2, 3, 4):
            x = activations(m, k, seed=m + n)
            monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_BYTES", 1 << 62)
            one = nq._native_qlinear(x, raw, qtype, n, k)
            assert same(one, qdot(lib, raw, qtype, x, n, k)), (qtype, n, m)
            for items in (1, 2, 3, 5):
                monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_ITEMS", items)
                monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_BYTES", 0)
                used.clear()
                two = nq._native_qlinear(x, raw, qtype, n, k)
                assert used and same_bits(two, one), (qtype, n, m, items)
            monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_ITEMS", 2)
            monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_BYTES", team_bytes)
            used.clear()
            default = nq._native_qlinear(x, raw, qtype, n, k)
            assert bool(used) == (n * rb * m >= team_bytes and n >= 32) and same_bits(default, one), (qtype, n, m)


PART_ROWS = [(33, 17, 47), (5, 160, 1), (64, 16), (161, 31, 32, 2)]


def _parts_weight(qtype, rows, k, seed, adjacent=False):
    """QTensors of ``rows`` rows each (random blocks) and stack_rows' weight of them: from separate
    buffers (a parts weight), or views of one buffer, back to back (stack_rows' view)."""
    from ember.tensor import Tensor
    raws = [weights(qtype, n, k, seed=seed + i) for i, n in enumerate(rows)]
    padded = [np.concatenate([r, np.zeros(-r.size % 4, np.uint8)]) for r in raws]   # (whole int32 words)
    if adjacent:
        whole = np.concatenate(padded).view(np.int32)
        cuts = np.cumsum([0] + [r.size // 4 for r in padded])
        datas = [whole[a:b] for a, b in zip(cuts, cuts[1:])]
    else:
        datas = [r.view(np.int32).copy() for r in padded]
    i32 = ember.from_numpy(datas[0][:1], device="numpy").dtype
    ws = [quant.QTensor(Tensor._wrap(d, d.shape, i32, "numpy"), qtype, (n, k)) for d, n in zip(datas, rows)]
    return raws, ws, nq.stack_rows(ws)


@pytest.mark.parametrize("qtype", ("q4_1", "q8_0", "q4_k", "q6_k"))
def test_parts_job_same_bits_as_separate_products(lib, qtype, monkeypatch):
    """stack_rows' weight of parts (team.c job 8: every part's rows over two threads in one job, or
    part by part where the team is off or busy) through quant.linear: each part's columns are the
    bits of its own product (qdot.c's, and the op's on the part), for parts of odd rows, m = 1..4
    and 1, 2, 3 or 5 items; m = 5 and 7 (q_linear / numpy paths, part by part) too; the job ran."""
    from ember.backends import numpy_nn
    k = 512 if quant.FORMATS[qtype].block == 256 else 224
    used = []
    real = nq._team
    monkeypatch.setattr(nq, "_team", lambda: used.append(1) or real())
    for s, rows in enumerate(PART_ROWS):
        raws, ws, st = _parts_weight(qtype, rows, k, seed=10 * s)
        assert st.shape == (sum(rows), k) and id(st.data._buf) in nq._PARTS
        for m in (1, 2, 3, 4, 5, 7):
            x = activations(m, k, seed=m + s)
            xt = ember.from_numpy(x, device="numpy")
            want = np.concatenate([quant.linear(xt, w).numpy() for w in ws], axis=1)
            if m <= 4:
                assert same(want, np.concatenate([qdot(lib, r, qtype, x, n, k) for r, n in zip(raws, rows)], axis=1))
            monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_BYTES", 1 << 62)
            assert same_bits(quant.linear(xt, st).numpy(), want), (qtype, rows, m, "one thread")
            monkeypatch.setattr(nq, "NATIVE_SPLIT_BYTES", 0)          # (each part split in pieces)
            assert same_bits(quant.linear(xt, st).numpy(), want), (qtype, rows, m, "pieces")
            monkeypatch.setattr(nq, "NATIVE_SPLIT_BYTES", 1 << 21)
            monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_BYTES", 0)
            for items in (1, 2, 3, 5):
                monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_ITEMS", items)
                used.clear()
                got = quant.linear(xt, st).numpy()
                assert same_bits(got, want), (qtype, rows, m, items)
                assert bool(used) == (m <= 4 and sum(rows) >= 32 and numpy_nn.team() is not None)
            monkeypatch.setattr(nq, "NATIVE_QDOT_TEAM_ITEMS", 2)


@pytest.mark.parametrize("qtype", ("q4_1", "q6_k"))
def test_stack_rows_views_parts_and_other_kernels(lib, qtype):
    """stack_rows: weights back to back in one buffer give a view of it (no parts entry, the same
    product bits); a parts weight's dequantize and qembedding read its parts joined; the entry goes
    with the weight; mixed formats, row lengths or one weight are refused (None)."""
    import gc
    k = 256
    rows = (34, 18, 47)       # (q6_k: 210-byte rows, an even count of them whole words)
    raws, ws, st = _parts_weight(qtype, rows, k, seed=3, adjacent=True)
    assert id(st.data._buf) not in nq._PARTS and np.shares_memory(st.data._buf, ws[0].data._buf)
    x = ember.from_numpy(activations(2, k, seed=1), device="numpy")
    want = np.concatenate([quant.linear(x, w).numpy() for w in ws], axis=1)
    assert same_bits(quant.linear(x, st).numpy(), want)
    assert same_bits(quant.dequantize(st).numpy(), np.concatenate([quant.dequantize(w).numpy() for w in ws]))
    if qtype == "q6_k":       # (33 rows: padding after the first part's rows; parts, not a view)
        _, gw, gst = _parts_weight(qtype, (33, 18), k, seed=3, adjacent=True)
        assert id(gst.data._buf) in nq._PARTS
        assert same_bits(quant.linear(x, gst).numpy(), np.concatenate([quant.linear(x, w).numpy() for w in gw], 1))
    raws, ws, pt = _parts_weight(qtype, rows, k, seed=3)
    assert id(pt.data._buf) in nq._PARTS
    assert same_bits(quant.linear(x, pt).numpy(), want)
    assert same_bits(quant.dequantize(pt).numpy(), np.concatenate([quant.dequantize(w).numpy() for w in ws]))
    ids = ember.tensor([0, 40, 96, 50], dtype="int32", device="numpy")
    assert same_bits(quant.embedding(ids, pt).numpy(), quant.dequantize(st).numpy()[[0, 40, 96, 50]])
    key = id(pt.data._buf)
    del pt
    gc.collect()
    assert key not in nq._PARTS
    other = quant.QTensor.from_bytes(weights("q8_0", 32, k, seed=1).tobytes(), "q8_0", (32, k), device="numpy")
    assert nq.stack_rows([ws[0], other]) is None and nq.stack_rows(ws[:1]) is None
    longer = quant.QTensor.from_bytes(weights(qtype, 4, 512, seed=1).tobytes(), qtype, (4, 512), device="numpy")
    assert nq.stack_rows([ws[0], longer]) is None


@pytest.mark.parametrize("qtypes", [("Q4_1", "Q8_0"), ("Q8_0", "Q8_0")])
def test_llama_stacked_products_same_bits(lib, tmp_path, monkeypatch, qtypes):
    """ember.nn.llama on device numpy stacks each layer's q/k/v and gate/up (stack_rows: views
    of the map where the file has them back to back, as this one does; parts weights where
    stack_rows is made to find them apart), EMBER_LLM_STACK=0 does not: a prompt's logits and
    greedy decode steps (eager, and the compiled step the chat loop replays) are the same bits."""
    import sys
    import os
    sys.path.insert(0, os.path.dirname(__file__))
    from llm_fixtures import write_tiny_gguf
    from ember.nn.llama import Llama
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, seed=3, qtypes=qtypes)
    g = ember.load_gguf(str(path))
    models = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("EMBER_LLM_STACK", flag)
        models[flag] = Llama.from_gguf(g, device="numpy", context=64)
    with monkeypatch.context() as mp:
        mp.setattr(nq, "_root", lambda a: object())    # (no two weights in one buffer: parts)
        models["parts"] = Llama.from_gguf(g, device="numpy", context=64)
    n = 2 * models["1"].cfg.n_layers
    assert not models["0"]._stacked_plain and len(models["1"]._stacked_plain) == n
    assert not any(id(t.data._buf) in nq._PARTS for t in models["1"]._stacked_plain.values())
    assert len(models["parts"]._stacked_plain) == n
    assert all(id(t.data._buf) in nq._PARTS for t in models["parts"]._stacked_plain.values())
    T = lambda v: ember.tensor(v, dtype="int32", device="numpy")   # noqa: E731
    outs = {}
    for flag, m in models.items():
        step = ember.compile(lambda ids, pos, m=m: m.forward(ids, pos))
        got = [m.forward(T([5, 9, 77, 3, 120, 44, 8]), T([0])).numpy()]
        p = 7
        for i in range(6):
            tok = int(got[-1].argmax())
            run = step if i % 2 else m.forward
            got.append(run(T([tok]), T([p])).numpy())
            p += 1
        outs[flag] = got
    for a, b, c in zip(outs["0"], outs["1"], outs["parts"]):
        assert same_bits(a, b) and same_bits(a, c)
