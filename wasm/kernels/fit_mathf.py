"""Refit the polynomial coefficients in mathf.h (a development tool; needs numpy and mpmath).

    python wasm/kernels/fit_mathf.py

Each approximation is a weighted least-squares fit on Chebyshev nodes, reweighted by Lawson's
iteration towards the minimax (smallest maximum) relative error, against mpmath at 80 bits.
Prints, per function, the float32 coefficients in the order mathf.h's Horner chains use them
(highest power first) and the fit's max relative error (the float32 evaluation adds ~1 ulp).
"""
from __future__ import annotations

import math

import mpmath
import numpy as np

mpmath.mp.prec = 80


def lawson(A, y, w, iters=80):
    """Coefficients c minimising max |(A c - y) / w| (approximately)."""
    A2, y2 = A / w[:, None], y / w
    lw = np.full(len(y), 1.0 / len(y))
    for _ in range(iters):
        sw = np.sqrt(lw)
        c, *_ = np.linalg.lstsq(A2 * sw[:, None], y2 * sw, rcond=None)
        e = np.abs(A2 @ c - y2)
        lw = lw * e
        lw /= lw.sum()
    return c, e.max()


def nodes(lo, hi, n=3000):
    return (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.linspace(0, np.pi, n))


def mp(f, x):
    return np.array([float(f(mpmath.mpf(float(v)))) for v in x])


def fit(name, x, target, basis, weight):
    A = np.stack([b(x) for b in basis], 1)
    c, err = lawson(A, target, weight)
    coeffs = ", ".join(f"{np.float32(v):.9e}f" for v in reversed(c))
    print(f"{name}: {coeffs}\n    max relative error {err:.2e}")


def main():
    r = nodes(-math.log(2) / 2, math.log(2) / 2)   # exp(r) = 1 + r + r^2 P(r)
    fit("exp P", r, mp(lambda v: mpmath.exp(v) - 1 - v, r), [lambda t, i=i: t ** (2 + i) for i in range(5)],
        mp(mpmath.exp, r))
    s = nodes(1e-6, (math.sqrt(2) - 1) / (math.sqrt(2) + 1))   # log(m) = 2s + s^3 P(s^2)
    fit("log P", s, mp(lambda v: 2 * mpmath.atanh(v) - 2 * v, s), [lambda t, i=i: t ** (3 + 2 * i) for i in range(3)],
        mp(lambda v: 2 * mpmath.atanh(v), s))
    x = nodes(1e-6, 0.625)   # tanh(x) = x + x^3 P(x^2)
    fit("tanh P", x, mp(lambda v: mpmath.tanh(v) - v, x), [lambda t, i=i: t ** (3 + 2 * i) for i in range(5)],
        mp(mpmath.tanh, x))
    x = nodes(1e-6, math.pi / 4)   # sin(r) = r + r^3 P(r^2), cos(r) = 1 - r^2/2 + r^4 Q(r^2)
    fit("sin P", x, mp(lambda v: mpmath.sin(v) - v, x), [lambda t, i=i: t ** (3 + 2 * i) for i in range(3)],
        mp(mpmath.sin, x))
    fit("cos Q", x, mp(lambda v: mpmath.cos(v) - 1 + v * v / 2, x), [lambda t, i=i: t ** (4 + 2 * i) for i in range(3)],
        mp(mpmath.cos, x))
    x = nodes(1e-6, 0.875)   # erf(x) = x P(x^2)
    y = mp(mpmath.erf, x)
    fit("erf P", x, y, [lambda t, i=i: t ** (1 + 2 * i) for i in range(6)], y)
    x = nodes(0.875, 10.0, 4000)   # erfc(x) = exp(-x^2) t Q(t), t = 1 / (1 + x/2)
    g = mp(lambda v: mpmath.erfc(v) * mpmath.exp(v * v), x)
    t = 1 / (1 + 0.5 * x)
    A = np.stack([t ** (1 + i) for i in range(8)], 1)
    c, err = lawson(A, g, g)
    print("erfc Q: " + ", ".join(f"{np.float32(v):.9e}f" for v in reversed(c)) + f"\n    max relative error {err:.2e}")


if __name__ == "__main__":
    main()
