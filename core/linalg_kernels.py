"""Pure-Python kernels of ``ember.linalg`` (the python backend's, and through it wasm's and the
host fallback of the others): small, obviously correct dense algorithms on Python floats
(float64), one matrix at a time over the batch axes. LU with partial pivoting (det, slogdet,
inv, solve), Cholesky, Householder QR, cyclic Jacobi for the symmetric eigenproblem and
one-sided Jacobi for the SVD. Not fast: a reference, like the rest of the python backend.
"""
from __future__ import annotations

import math
from math import prod


def _mats(t):
    """The (rows) matrices of a (..., M, N) python-backend tensor, and M, N."""
    M, N = t.shape[-2:]
    buf = t._buf
    out = []
    for b in range(prod(t.shape[:-2])):
        base = b * M * N
        out.append([[float(buf[base + i * N + j]) for j in range(N)] for i in range(M)])
    return out, M, N


def _flat(ms):
    return [v for m in ms for row in m for v in row]


def _lu(a):
    """(LU in place, permutation sign, singular?) with partial pivoting."""
    n = len(a)
    a = [row[:] for row in a]
    sign = 1.0
    singular = False
    for k in range(n):
        p = max(range(k, n), key=lambda i: abs(a[i][k]))
        if a[p][k] == 0 or a[p][k] != a[p][k]:
            singular = singular or a[p][k] == 0
            continue
        if p != k:
            a[k], a[p] = a[p], a[k]
            sign = -sign
        piv = a[k][k]
        for i in range(k + 1, n):
            f = a[i][k] / piv
            if f:
                a[i][k] = f
                ri, rk = a[i], a[k]
                for j in range(k + 1, n):
                    ri[j] -= f * rk[j]
            else:
                a[i][k] = 0.0
    return a, sign, singular


def _det(m):
    lu, sign, singular = _lu(m)
    if singular:
        return 0.0
    d = sign
    for i in range(len(m)):
        d *= lu[i][i]
    return d


def _slogdet(m):
    if not m:
        return 1.0, 0.0
    lu, sign, singular = _lu(m)
    if singular:
        return 0.0, -math.inf
    s, la = sign, 0.0
    for i in range(len(m)):
        v = lu[i][i]
        if v != v:
            return math.nan, math.nan
        s *= 1.0 if v > 0 else -1.0
        la += math.log(abs(v))
    return s, la


def _solve(a, b):
    """x with a @ x = b (b: n x k), Gauss-Jordan with partial pivoting; nan when singular."""
    n = len(a)
    k = len(b[0]) if b else 0
    aug = [a[i][:] + b[i][:] for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda i: abs(aug[i][c]))
        if aug[p][c] == 0:
            return [[math.nan] * k for _ in range(n)]
        aug[c], aug[p] = aug[p], aug[c]
        piv = aug[c][c]
        rc = [v / piv for v in aug[c]]
        aug[c] = rc
        for i in range(n):
            if i != c:
                f = aug[i][c]
                if f:
                    ri = aug[i]
                    aug[i] = [x - f * y for x, y in zip(ri, rc)]
    return [row[n:] for row in aug]


def _eye(n):
    return [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]


def _cholesky(a):
    n = len(a)
    L = [[0.0] * n for _ in range(n)]
    for j in range(n):
        s = a[j][j] - sum(L[j][k] ** 2 for k in range(j))
        if not s > 0:
            return [[math.nan] * n for _ in range(n)]
        L[j][j] = math.sqrt(s)
        for i in range(j + 1, n):
            L[i][j] = (a[i][j] - sum(L[i][k] * L[j][k] for k in range(j))) / L[j][j]
    return L


def _transpose(m, rows=None, cols=None):
    if not m:
        return [[] for _ in range(cols or 0)]
    return [list(c) for c in zip(*m)]


def _matmul(a, b):
    bt = _transpose(b)
    return [[sum(x * y for x, y in zip(r, c)) for c in bt] for r in a]


def _qr(a, complete):
    """Householder QR of an m x n matrix: (Q m x m or m x k, R m x n or k x n), k = min(m, n)."""
    m = len(a)
    n = len(a[0]) if m else 0
    r = [row[:] for row in a]
    q = _eye(m)
    for k in range(min(m - 1, n) if m else 0):
        x = [r[i][k] for i in range(k, m)]
        norm = math.sqrt(sum(v * v for v in x))
        if norm == 0:
            continue
        alpha = -norm if x[0] >= 0 else norm
        v = x[:]
        v[0] -= alpha
        vn = math.sqrt(sum(t * t for t in v))
        if vn == 0:
            continue
        v = [t / vn for t in v]
        for j in range(n):   # r = (I - 2 v v^T) r on rows k..m
            d = 2 * sum(v[i] * r[k + i][j] for i in range(len(v)))
            for i in range(len(v)):
                r[k + i][j] -= d * v[i]
        for i in range(m):   # q = q (I - 2 v v^T)
            d = 2 * sum(q[i][k + t] * v[t] for t in range(len(v)))
            for t in range(len(v)):
                q[i][k + t] -= d * v[t]
    kk = min(m, n)
    for i in range(m):
        for j in range(min(i, n)):
            r[i][j] = 0.0
    if complete:
        return q, r
    return [row[:kk] for row in q], r[:kk]


def _eigh(a):
    """Eigenvalues (ascending) and eigenvectors (columns) of a symmetric matrix, cyclic Jacobi
    on the lower triangle (the standard reads only one triangle)."""
    n = len(a)
    A = [[a[max(i, j)][min(i, j)] for j in range(n)] for i in range(n)]
    V = _eye(n)
    for _sweep in range(100):
        off = sum(A[i][j] ** 2 for i in range(n) for j in range(n) if i != j)
        if off == 0 or off != off or off < 1e-300:
            break
        scale = sum(A[i][i] ** 2 for i in range(n))
        if off <= 1e-30 * scale:
            break
        for p in range(n - 1):
            for q in range(p + 1, n):
                apq = A[p][q]
                if apq == 0:
                    continue
                theta = (A[q][q] - A[p][p]) / (2 * apq)
                t = (1.0 if theta >= 0 else -1.0) / (abs(theta) + math.sqrt(theta * theta + 1)) \
                    if math.isfinite(theta * theta) else 1 / (2 * theta)
                c = 1 / math.sqrt(t * t + 1)
                s = t * c
                for k in range(n):
                    akp, akq = A[k][p], A[k][q]
                    A[k][p] = c * akp - s * akq
                    A[k][q] = s * akp + c * akq
                for k in range(n):
                    apk, aqk = A[p][k], A[q][k]
                    A[p][k] = c * apk - s * aqk
                    A[q][k] = s * apk + c * aqk
                for k in range(n):
                    vkp, vkq = V[k][p], V[k][q]
                    V[k][p] = c * vkp - s * vkq
                    V[k][q] = s * vkp + c * vkq
    w = [A[i][i] for i in range(n)]
    order = sorted(range(n), key=lambda i: (w[i] != w[i], w[i]))
    return [w[i] for i in order], [[V[r][i] for i in order] for r in range(n)]


def _complete_basis(cols, m):
    """Extend orthonormal columns (a list of m-vectors) to m of them (Gram-Schmidt on e_i)."""
    cols = [c[:] for c in cols]
    for i in range(m):
        if len(cols) >= m:
            break
        v = [1.0 if j == i else 0.0 for j in range(m)]
        for c in cols:
            d = sum(x * y for x, y in zip(v, c))
            v = [x - d * y for x, y in zip(v, c)]
        nv = math.sqrt(sum(x * x for x in v))
        if nv > 1e-8:
            cols.append([x / nv for x in v])
    return cols


def _svd(a, full):
    """(U, S, Vh) by one-sided Jacobi on the columns of a (m >= n; the caller transposes)."""
    m = len(a)
    n = len(a[0]) if m else 0
    if m < n:
        u, s, vh = _svd(_transpose(a), full)
        return _transpose(vh), s, _transpose(u)
    cols = [[a[i][j] for i in range(m)] for j in range(n)]   # columns of a
    V = _eye(n)
    for _sweep in range(60):
        rotated = False
        for p in range(n - 1):
            for q in range(p + 1, n):
                cp, cq = cols[p], cols[q]
                alpha = sum(x * x for x in cp)
                beta = sum(x * x for x in cq)
                gamma = sum(x * y for x, y in zip(cp, cq))
                if gamma == 0 or abs(gamma) <= 1e-15 * math.sqrt(alpha * beta):
                    continue
                rotated = True
                zeta = (beta - alpha) / (2 * gamma)
                t = (1.0 if zeta >= 0 else -1.0) / (abs(zeta) + math.sqrt(1 + zeta * zeta)) \
                    if math.isfinite(zeta * zeta) else 1 / (2 * zeta)
                c = 1 / math.sqrt(1 + t * t)
                s = c * t
                cols[p] = [c * x - s * y for x, y in zip(cp, cq)]
                cols[q] = [s * x + c * y for x, y in zip(cp, cq)]
                for k in range(n):
                    vkp, vkq = V[k][p], V[k][q]
                    V[k][p] = c * vkp - s * vkq
                    V[k][q] = s * vkp + c * vkq
        if not rotated:
            break
    sv = [math.sqrt(sum(x * x for x in c)) for c in cols]
    order = sorted(range(n), key=lambda i: -sv[i] if sv[i] == sv[i] else -math.inf)
    S = [sv[i] for i in order]
    ucols = []
    for i in order:
        ucols.append([x / sv[i] for x in cols[i]] if sv[i] > 0 else None)
    good = [c for c in ucols if c is not None]
    basis = _complete_basis(good, m)
    extra = iter(basis[len(good):])
    ucols = [c if c is not None else next(extra) for c in ucols]
    if full:
        ucols = _complete_basis(ucols, m)
    U = _transpose(ucols) if ucols else [[] for _ in range(m)]
    Vh = [[V[k][i] for k in range(n)] for i in order]
    return U, S, Vh


# ---- kernels (registry calling convention: kernel(out_meta(s), *tensors, **attrs)) --------------

def _store(values, meta):
    from .backends.python import _store as store

    return store(values, meta.dtype)


def k_det(out, x):
    ms, _, _ = _mats(x)
    return _store([_det(m) for m in ms], out)


def k_slogdet(outs, x):
    ms, _, _ = _mats(x)
    r = [_slogdet(m) for m in ms]
    return _store([s for s, _ in r], outs[0]), _store([la for _, la in r], outs[1])


def k_inv(out, x):
    ms, n, _ = _mats(x)
    return _store(_flat(_solve(m, _eye(n)) for m in ms), out)


def k_solve(out, a, b):
    ams, n, _ = _mats(a)
    bms, _, k = _mats(b)
    return _store(_flat(_solve(m, r) for m, r in zip(ams, bms)), out)


def k_cholesky(out, x, *, upper=False):
    ms, _, _ = _mats(x)
    ls = [_cholesky(m) for m in ms]
    return _store(_flat(_transpose(m) if upper else m for m in ls), out)


def k_qr(outs, x, *, mode="reduced"):
    ms, _, _ = _mats(x)
    r = [_qr(m, mode == "complete") for m in ms]
    return _store(_flat(q for q, _ in r), outs[0]), _store(_flat(rr for _, rr in r), outs[1])


def k_eigh(outs, x):
    ms, _, _ = _mats(x)
    r = [_eigh(m) for m in ms]
    return _store([v for w, _ in r for v in w], outs[0]), _store(_flat(v for _, v in r), outs[1])


def k_svd(outs, x, *, full_matrices=True):
    ms, _, _ = _mats(x)
    r = [_svd(m, full_matrices) for m in ms]
    return (_store(_flat(u for u, _, _ in r), outs[0]), _store([v for _, s, _ in r for v in s], outs[1]),
            _store(_flat(vh for _, _, vh in r), outs[2]))


KERNELS = {"linalg_det": k_det, "linalg_slogdet": k_slogdet, "linalg_inv": k_inv, "linalg_solve": k_solve,
           "linalg_cholesky": k_cholesky, "linalg_qr": k_qr, "linalg_eigh": k_eigh, "linalg_svd": k_svd}
