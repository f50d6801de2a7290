"""The nn op family (ember.ops.nnops) on every backend.

- every case in ``op_cases_nn.CASES``: PyTorch golden outputs, numpy references, the composite
  decompositions, typed errors (the same list runs inside Pyodide, see test_pyodide.py);
- conv2d, conv_transpose2d and the pools on random configurations (hypothesis) against
  obviously-correct loop references written here with numpy;
- every nn op has a kernel or a decomposition on each backend.
"""
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ember
from ember.registry import OPS
from helpers import check, check_arrays
from op_cases_nn import CASES, COMPOSITES

PRIMITIVES = ("conv2d", "conv_transpose2d", "max_pool2d", "avg_pool2d", "cumsum", "sort", "pad")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_nn_case(case, device):
    check(case, device)


def test_declared_kinds(device):
    """Primitives need a kernel on every backend; composites carry a decomposition."""
    kernels = ember.get_backend(device).kernels
    for name in PRIMITIVES:
        assert OPS[name].kind == "other" and OPS[name].decompose is None, name
        assert name in kernels, f"{device} has no kernel for the primitive {name}"
    for name in COMPOSITES:
        assert OPS[name].kind == "composite" and callable(OPS[name].decompose), name


# ---- loop references for random configurations ------------------------------------------------

def ref_conv2d(x, w, b, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc, i, j in itertools.product(range(o), range(oh), range(ow)):
        g = oc // og
        patch = xp[:, g * cg:(g + 1) * cg, i * stride[0]:i * stride[0] + dil[0] * (kh - 1) + 1:dil[0],
                   j * stride[1]:j * stride[1] + dil[1] * (kw - 1) + 1:dil[1]]
        out[:, oc, i, j] = (patch * w[oc]).sum(axis=(1, 2, 3)) + (b[oc] if b is not None else 0.0)
    return out


def ref_conv_transpose2d(x, w, b, stride, pad, outpad, dil, groups):
    # scatter every input element times the kernel into the full output, then crop the padding
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    cg = c // groups
    fh = (h - 1) * stride[0] + dil[0] * (kh - 1) + 1 + outpad[0]
    fw = (wd - 1) * stride[1] + dil[1] * (kw - 1) + 1 + outpad[1]
    full = np.zeros((n, og * groups, fh, fw))
    for ci, i, j, ki, kj in itertools.product(range(c), range(h), range(wd), range(kh), range(kw)):
        g = ci // cg
        full[:, g * og:(g + 1) * og, i * stride[0] + ki * dil[0], j * stride[1] + kj * dil[1]] += \
            x[:, ci, i, j][:, None] * w[ci, :, ki, kj][None, :]
    out = full[:, :, pad[0]:fh - pad[0], pad[1]:fw - pad[1]]
    return out + (b.reshape(1, -1, 1, 1) if b is not None else 0.0)


def ref_pool(x, k, s, pad, dil, ceil_mode, kind, count_include_pad=True):
    n, c, h, w = x.shape
    sizes = []
    for size, kk, ss, pp, dd in zip((h, w), k, s, pad, dil):
        span = size + 2 * pp - dd * (kk - 1) - 1
        o = (span + (ss - 1 if ceil_mode else 0)) // ss + 1
        if ceil_mode and (o - 1) * ss >= size + pp:
            o -= 1
        sizes.append(o)
    out = np.zeros((n, c, *sizes))
    for i, j in itertools.product(range(sizes[0]), range(sizes[1])):
        ys = [i * s[0] - pad[0] + a * dil[0] for a in range(k[0])]
        xs = [j * s[1] - pad[1] + a * dil[1] for a in range(k[1])]
        inside = [(y, xx) for y in ys for xx in xs if 0 <= y < h and 0 <= xx < w]
        if not inside:   # a dilated window can fall entirely in the padding: PyTorch gives -inf
            out[:, :, i, j] = -np.inf
            continue
        vals = np.stack([x[:, :, y, xx] for y, xx in inside], axis=-1).astype(np.float64)
        if kind == "max":
            out[:, :, i, j] = vals.max(axis=-1)
        else:
            # PyTorch: the divisor counts the window clipped to the padded input
            y0, x0 = ys[0], xs[0]
            y1, x1 = min(y0 + k[0], h + pad[0]), min(x0 + k[1], w + pad[1])
            div = (y1 - y0) * (x1 - x0) if count_include_pad else len(inside)
            out[:, :, i, j] = vals.sum(axis=-1) / div
    return out


@st.composite
def conv_configs(draw, transpose=False):
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cg = draw(st.integers(1, 2))
    og = draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pad = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    h = draw(st.integers(1, 6))
    w = draw(st.integers(1, 6))
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return groups, cg, og, kh, kw, stride, dil, pad, h, w, bias, seed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=conv_configs())
def test_conv2d_random(device, cfg):
    groups, cg, og, kh, kw, stride, dil, pad, h, w, bias, seed = cfg
    h = max(h, dil[0] * (kh - 1) + 1 - 2 * pad[0])
    w = max(w, dil[1] * (kw - 1) + 1 - 2 * pad[1])
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, groups * cg, h, w)).astype(np.float32)
    wt = rng.standard_normal((groups * og, cg, kh, kw)).astype(np.float32)
    b = rng.standard_normal(groups * og).astype(np.float32) if bias else None
    arrays = [x, wt] + ([b] if bias else [])
    check_arrays(lambda e, x, w, *b: e.conv2d(x, w, b[0] if b else None, stride, pad, dil, groups),
                 lambda np_, x, w, *b: ref_conv2d(x, w, b[0] if b else None, stride, pad, dil, groups),
                 arrays, device, rtol=1e-4, atol=1e-4, id=f"conv2d/random/{cfg}")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cfg=conv_configs(), outpad=st.tuples(st.integers(0, 2), st.integers(0, 2)))
def test_conv_transpose2d_random(device, cfg, outpad):
    groups, cg, og, kh, kw, stride, dil, pad, h, w, bias, seed = cfg
    outpad = tuple(min(p, max(s, d) - 1) for p, s, d in zip(outpad, stride, dil))
    # keep the output non-empty: (in - 1) * s - 2p + d (k - 1) + op + 1 >= 1
    h = max(h, 1 + -(-max(0, 2 * pad[0] - dil[0] * (kh - 1) - outpad[0]) // stride[0]))
    w = max(w, 1 + -(-max(0, 2 * pad[1] - dil[1] * (kw - 1) - outpad[1]) // stride[1]))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, groups * cg, h, w)).astype(np.float32)
    wt = rng.standard_normal((groups * cg, og, kh, kw)).astype(np.float32)
    b = rng.standard_normal(groups * og).astype(np.float32) if bias else None
    arrays = [x, wt] + ([b] if bias else [])
    check_arrays(lambda e, x, w, *b: e.conv_transpose2d(x, w, b[0] if b else None, stride, pad, outpad, groups, dil),
                 lambda np_, x, w, *b: ref_conv_transpose2d(x, w, b[0] if b else None, stride, pad, outpad, dil, groups),
                 arrays, device, rtol=1e-4, atol=1e-4, id=f"conv_transpose2d/random/{cfg}/{outpad}")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.tuples(st.integers(1, 3), st.integers(1, 3)), s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       dil=st.tuples(st.integers(1, 2), st.integers(1, 2)), hw=st.tuples(st.integers(1, 7), st.integers(1, 7)),
       ceil_mode=st.booleans(), count_include_pad=st.booleans(), pad_frac=st.tuples(st.booleans(), st.booleans()),
       seed=st.integers(0, 2**16))
def test_pools_random(device, k, s, dil, hw, ceil_mode, count_include_pad, pad_frac, seed):
    # padding up to half the (dilated) kernel, the largest PyTorch accepts
    pad = tuple((d * (kk - 1) + 1) // 2 if f else 0 for kk, d, f in zip(k, dil, pad_frac))
    hw = tuple(max(n, d * (kk - 1) + 1 - 2 * p) for n, kk, d, p in zip(hw, k, dil, pad))
    x = np.random.default_rng(seed).standard_normal((1, 2, *hw)).astype(np.float32)
    check_arrays(lambda e, x: e.max_pool2d(x, k, s, pad, dil, ceil_mode),
                 lambda np_, x: ref_pool(x, k, s, pad, dil, ceil_mode, "max"), [x], device,
                 id=f"max_pool2d/random/{k}/{s}/{pad}/{dil}/{ceil_mode}")
    pad1 = tuple((kk // 2) if f else 0 for kk, f in zip(k, pad_frac))
    hw1 = tuple(max(n, kk - 2 * p) for n, kk, p in zip(hw, k, pad1))
    x1 = x[:, :, :hw1[0], :hw1[1]] if hw1 == hw else np.random.default_rng(seed).standard_normal((1, 2, *hw1)).astype(np.float32)
    check_arrays(lambda e, x: e.avg_pool2d(x, k, s, pad1, ceil_mode, count_include_pad),
                 lambda np_, x: ref_pool(x, k, s, pad1, (1, 1), ceil_mode, "avg", count_include_pad), [x1], device,
                 rtol=1e-5, atol=1e-6, id=f"avg_pool2d/random/{k}/{s}/{pad1}/{ceil_mode}/{count_include_pad}")


def test_unbatched_inputs(device):
    """CHW inputs work like a batch of one (PyTorch accepts them too)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    check_arrays(lambda e, x, w: e.conv2d(x, w, padding=1), lambda np_, x, w: ref_conv2d(x[None], w, None, (1, 1), (1, 1), (1, 1), 1)[0],
                 [x, w], device, rtol=1e-4, atol=1e-4, id="conv2d/unbatched")
    check_arrays(lambda e, x: e.max_pool2d(x, 2), lambda np_, x: ref_pool(x[None], (2, 2), (2, 2), (0, 0), (1, 1), False, "max")[0],
                 [x], device, id="max_pool2d/unbatched")


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8"])
def test_max_pool_integers(device, dtype):
    x = np.random.default_rng(1).integers(0 if dtype == "uint8" else -50, 50, (1, 2, 5, 4)).astype(dtype)
    check_arrays(lambda e, x: e.max_pool2d(x, 3, 2, 1), lambda np_, x: ref_pool(x, (3, 3), (2, 2), (1, 1), (1, 1), False, "max").astype(dtype),
                 [x], device, id=f"max_pool2d/{dtype}")
