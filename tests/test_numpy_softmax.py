"""The numpy backend's softmax over the last axis: exp(x) / sum(exp(x)) without the max shift where
each row's sum shows that changes nothing (a sum in [1, float32 max]); the other rows made again
the shifted way. Against float64 (shifted), including rows that must take the shifted route
(very negative rows, overflowing rows, NaN, +-inf, rows of -inf) and rows whose tiny
probabilities would be denormal without the shift. Where ember.native is loaded these run its
kernel (core/native/rows.c: the same routes); the spy test runs the numpy path."""
from __future__ import annotations

import numpy as np
import pytest

import ember
import ember.native
from ember.backends import numpy_nn

rng = np.random.default_rng(11)


def _ref(a):
    with np.errstate(invalid="ignore"):
        z = a.astype(np.float64)
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


def _softmax(a, axis=-1):
    return ember.softmax(ember.from_numpy(a, device="numpy"), axis=axis).numpy()


def _check(a):
    got, want = _softmax(a), _ref(a)
    assert got.dtype == np.float32 and got.shape == a.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    # (results below float32's normal range: within 2 of its smallest steps, as the shifted form)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2 * 2.0 ** -149)


def _rows(n, count):
    """Rows of n values: ordinary ones and ones that the unshifted form must not take."""
    a = (rng.standard_normal((count, n)) * 4).astype(np.float32)
    a[1] -= 100           # sum of exp far below 1: unshifted, every exp underflows
    a[2] += 100           # exp overflows
    a[3] = np.linspace(-100, -70, n)       # max -70: exp(-100) is denormal, its probability 1e-13 is not
    a[4, 0] = np.nan
    a[5, 1] = np.inf
    a[6] = -np.inf
    a[7, ::2] = -np.inf   # -inf entries in an ordinary row: probability 0
    a[8] = 1e30
    a[9] = np.linspace(-90, 10, n)         # max 10: exp(-90) underflows, and so does its probability
    a[10] = 88.0                           # each exp finite, their sum overflows (n >= 2)
    return a


@pytest.mark.parametrize("n", [2, 7, 32, 128, 129, 700, 6625])
def test_softmax_last_axis_against_float64(n):
    _check(_rows(n, 40))


def test_softmax_batched_and_strided():
    a = (rng.standard_normal((8, 4, 32, 32)) * 5).astype(np.float32)
    a[0, 0, 0] -= 120
    a[1, 2, 3, 4] = np.inf
    _check(a)
    _check(np.ascontiguousarray(a.transpose(0, 1, 3, 2))[..., ::2])   # strided view of a copy
    t = (rng.standard_normal((6, 5)) * 3).astype(np.float32)
    got = _softmax(t.T.copy(), axis=0)                                    # not the last axis: as before
    np.testing.assert_allclose(got, _ref(t).T, rtol=2e-6)


def test_softmax_takes_the_unshifted_route_for_ordinary_rows(monkeypatch):
    seen = []
    real = numpy_nn._softmax_shifted

    def spy(rows):
        seen.append(rows.shape)
        return real(rows)

    monkeypatch.setattr(numpy_nn, "_softmax_shifted", spy)
    a = (rng.standard_normal((8, 4, 32, 32)) * 3).astype(np.float32)
    with ember.native.disabled():                       # (the numpy path's routes)
        _check(a)
        assert seen == []                               # attention-like rows: no max, no subtraction
        a[2, 1, 5] -= 200
        a[3, 0, 1, 7] = np.nan
        _check(a)
    assert seen == [(2, 32)]                            # only the two rows that need the shift


def test_softmax_one_column_and_empty():
    a = np.array([[1.0], [-200.0], [np.nan], [np.inf]], np.float32)
    got = _softmax(a)
    np.testing.assert_array_equal(got[:2], [[1.0], [1.0]])
    assert np.isnan(got[2:]).all()
    assert _softmax(np.zeros((3, 0), np.float32)).shape == (3, 0)
