"""conv2d_gemm's im2col from a zero-padded copy of the planes (wasm/kernels/conv.c ``pad_planes``,
``im2col_padded``; column stride 1): panels inside one output row, panels that cross into the next
row (MNIST's 14-wide rows), rows shorter than 8 (a gather), a short last panel, row strides,
dilation, uneven padding, groups and batches, each against numpy in float64; planes over
``CONV_PAD_MAX`` floats keep the old im2col. Runs on device "wasm" (wasmtime in CPython)."""
from __future__ import annotations

import pytest

import ember

np = pytest.importorskip("numpy")
pytest.importorskip("wasmtime")

from op_cases_nn import _np_conv2d  # noqa: E402

CASES = [  # x shape, weight shape, stride, padding ((top, bottom), (left, right)), dilation, groups
    ((1, 16, 14, 14), (32, 16, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),     # MNIST conv2
    ((1, 1, 28, 28), (16, 1, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),       # MNIST conv1
    ((2, 3, 5, 5), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),          # rows of 5: gather
    ((1, 2, 9, 11), (3, 2, 3, 2), (2, 1), ((0, 2), (1, 0)), (1, 2), 1),         # row stride, dilation
    ((2, 4, 7, 10), (6, 2, 5, 5), (1, 1), ((2, 2), (2, 2)), (1, 1), 2),         # groups, 5x5
    ((1, 3, 6, 13), (5, 3, 1, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 1),         # no padding
    ((1, 2, 300, 300), (3, 2, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),      # > CONV_PAD_MAX
]


def _run(xs, ws, stride, pads, dil, groups, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[:1]).astype(np.float32)
    t = [ember.from_bytes(a.tobytes(), a.shape, "float32", device="wasm") for a in (x, w, b)]
    got = ember.conv2d(*t, stride, pads, dil, groups)
    out = np.frombuffer(bytes(got.to("python")._buf), np.float32).reshape(got.shape)
    return out, _np_conv2d(np, x, w, b, stride, pads, dil, groups)


@pytest.mark.parametrize("xs, ws, stride, pads, dil, groups", CASES)
def test_conv2d_padded_im2col_matches_numpy(xs, ws, stride, pads, dil, groups):
    got, ref = _run(xs, ws, stride, pads, dil, groups)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_conv2d_padded_im2col_reads_nothing_outside_the_input():
    """Values past the input (NaN in the buffer beyond the tensor's elements would show up) and
    -0.0 inputs: the copy is exact and the padding is +0."""
    x = np.full((1, 2, 6, 9), -0.0, np.float32)
    x[0, 1, 2, 3] = 1.5
    w = np.ones((3, 2, 3, 3), np.float32)
    t = [ember.from_bytes(a.tobytes(), a.shape, "float32", device="wasm") for a in (x, w)]
    got = ember.conv2d(*t, padding=1).to("python")
    out = np.frombuffer(bytes(got._buf), np.float32).reshape(got.shape)
    ref = _np_conv2d(np, x, w, None, (1, 1), ((1, 1), (1, 1)))
    assert np.array_equal(out, ref)


DIRECT_CASES = [  # x shape, weight shape, stride, padding, dilation, groups: conv.c's direct form
    ((1, 16, 14, 14), (32, 16, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),     # MNIST conv2: ow 14
    ((1, 1, 28, 28), (16, 1, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),       # MNIST conv1: ow 28
    ((2, 48, 9, 7), (6, 48, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1),        # K 432 > GEMM_KC, ow 7
    ((1, 4, 17, 16), (6, 2, 3, 3), (2, 1), ((1, 0), (2, 1)), (2, 2), 2),        # row stride, dilation, groups
    ((1, 3, 8, 10), (5, 3, 3, 3), (1, 1), ((0, 0), (0, 0)), (1, 1), 1),         # no padding: ow 8
]


@pytest.mark.parametrize("xs, ws, stride, pads, dil, groups", DIRECT_CASES)
@pytest.mark.parametrize("relu", [False, True])
def test_conv2d_direct_form_same_bits_as_im2col(monkeypatch, xs, ws, stride, pads, dil, groups, relu):
    """The direct form (no im2col: the tile reads the padded planes) gives im2col + gemm's bits,
    relu stored or not, and numpy's values."""
    from ember.wasm import ops_linalg

    rng = np.random.default_rng(7)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[:1]).astype(np.float32)
    t = [ember.from_bytes(a.tobytes(), a.shape, "float32", device="wasm") for a in (x, w, b)]
    kern = ember.get_backend("wasm").kernels["conv2d"]
    ref = _np_conv2d(np, x, w, b, stride, pads, dil, groups)
    meta = type("Meta", (), {"shape": ref.shape, "dtype": ember.float32})()
    outs = []
    for direct in (True, False):
        monkeypatch.setattr(ops_linalg, "CONV_DIRECT", direct)
        buf = kern(meta, *t, stride=stride, padding=pads, dilation=dil, groups=groups, relu=relu)
        outs.append(np.frombuffer(bytes(buf), np.float32).reshape(ref.shape))
    assert outs[0].tobytes() == outs[1].tobytes()
    np.testing.assert_allclose(outs[0], np.maximum(ref, 0) if relu else ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("w", [8, 9, 10, 13, 14, 15, 28, 30])
def test_max_pool2d_2x2_row_tails_match_numpy(w):
    """pool.c's 2x2 stride-2 rows end with one vector over the last four outputs (recomputing
    some): every width, with a NaN in the last window of a row, against numpy."""
    rng = np.random.default_rng(w)
    x = rng.standard_normal((2, 3, 6, w)).astype(np.float32)
    x[1, 2, 3, 2 * (w // 2) - 1] = np.nan
    t = ember.from_bytes(x.tobytes(), x.shape, "float32", device="wasm")
    got = ember.max_pool2d(t, 2).to("python")
    out = np.frombuffer(bytes(got._buf), np.float32).reshape(got.shape)
    oh, ow = 3, w // 2
    ref = x[:, :, :2 * oh, :2 * ow].reshape(2, 3, oh, 2, ow, 2).max(axis=(3, 5))
    assert out.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.nan_to_num(out), np.nan_to_num(ref))
