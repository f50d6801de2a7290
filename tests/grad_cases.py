"""Gradient cases, written once for both sides: ``tests/golden/make_grad_goldens.py`` runs the
``torch`` lambdas in float64 with torch.autograd and stores inputs, the upstream gradient and
the input gradients; ``tests/test_autograd.py`` runs the ``ember`` lambdas on every backend and
compares. Neither side imports the other's library at module level.

An input spec is ``(kind, shape)`` or ``(kind, shape, arg)``: ``"f"`` normal values, ``"pos"``
values in [0.5, 2), ``"far"`` normal values pushed away from zero (for kinks: abs, relu, max), ``"cpos"`` like
``"pos"`` but a constant,
``"int"`` integers in [0, arg) and ``"bool"``. Floating inputs are differentiated; the others
are constants.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple


class Case(NamedTuple):
    name: str
    inputs: tuple
    ember: Callable       # (ember, *tensors) -> tensor
    torch: Callable       # (torch, F, *tensors) -> tensor
    tol: float = 1e-4     # relative tolerance of float32 ember against float64 torch


def C(name, inputs, ember, torch, tol=1e-4):
    return Case(name, tuple(inputs), ember, torch, tol)


f = lambda *s: ("f", s)            # noqa: E731
pos = lambda *s: ("pos", s)        # noqa: E731
far = lambda *s: ("far", s)        # noqa: E731
cpos = lambda *s: ("cpos", s)      # noqa: E731  (positive, a constant: not differentiated)


def ints(high, *s):
    return ("int", s, high)


def _ember_cumsum_excl_rev(e, x):
    return e.cumsum(x, 1, exclusive=True, reverse=True)


def _torch_cumsum_excl_rev(T, F, x):
    r = T.flip(T.cumsum(T.flip(x, [1]), 1), [1])   # reverse inclusive
    return r - x


CASES = [
    # ---- unary ----
    C("negative", [f(3, 4)], lambda e, x: -x, lambda T, F, x: -x),
    C("abs", [far(3, 4)], lambda e, x: e.abs(x), lambda T, F, x: T.abs(x)),
    C("exp", [f(3, 4)], lambda e, x: e.exp(x), lambda T, F, x: T.exp(x)),
    C("log", [pos(3, 4)], lambda e, x: e.log(x), lambda T, F, x: T.log(x)),
    C("sqrt", [pos(3, 4)], lambda e, x: e.sqrt(x), lambda T, F, x: T.sqrt(x)),
    C("sin", [f(3, 4)], lambda e, x: e.sin(x), lambda T, F, x: T.sin(x)),
    C("cos", [f(3, 4)], lambda e, x: e.cos(x), lambda T, F, x: T.cos(x)),
    C("tanh", [f(3, 4)], lambda e, x: e.tanh(x), lambda T, F, x: T.tanh(x)),
    C("erf", [f(3, 4)], lambda e, x: e.erf(x), lambda T, F, x: T.erf(x)),
    C("sign_floor_round", [far(3, 4)], lambda e, x: e.sign(x) + e.floor(x) + e.round(x) + x,
      lambda T, F, x: T.sign(x) + T.floor(x) + T.round(x) + x),
    C("reciprocal", [pos(3, 4)], lambda e, x: e.reciprocal(x), lambda T, F, x: T.reciprocal(x)),
    C("rsqrt", [pos(3, 4)], lambda e, x: e.rsqrt(x), lambda T, F, x: T.rsqrt(x)),
    C("square", [f(3, 4)], lambda e, x: e.square(x), lambda T, F, x: T.square(x)),
    C("relu", [far(3, 4)], lambda e, x: e.relu(x), lambda T, F, x: F.relu(x)),
    C("leaky_relu", [far(3, 4)], lambda e, x: e.leaky_relu(x, 0.2), lambda T, F, x: F.leaky_relu(x, 0.2)),
    C("sigmoid", [f(3, 4)], lambda e, x: e.sigmoid(x), lambda T, F, x: T.sigmoid(x)),
    C("gelu", [f(3, 4)], lambda e, x: e.gelu(x), lambda T, F, x: F.gelu(x)),
    C("gelu_tanh", [f(3, 4)], lambda e, x: e.gelu(x, approximate="tanh"),
      lambda T, F, x: F.gelu(x, approximate="tanh")),
    C("silu", [f(3, 4)], lambda e, x: e.silu(x), lambda T, F, x: F.silu(x)),
    C("clip", [far(4, 5)], lambda e, x: e.clip(x, -0.5, 0.7), lambda T, F, x: T.clamp(x, -0.5, 0.7)),
    C("clip_tensor", [far(4, 5), f(5)], lambda e, x, lo: e.clip(x, lo - 3.0, lo),
      lambda T, F, x, lo: T.clamp(x, lo - 3.0, lo)),
    C("astype_f16", [f(3, 4)], lambda e, x: x.astype("float16").astype("float32") * x,
      lambda T, F, x: x.half().double() * x, tol=2e-3),
    # ---- binary, broadcasting ----
    C("add", [f(3, 4), f(4)], lambda e, a, b: a + b, lambda T, F, a, b: a + b),
    C("subtract", [f(2, 1, 3), f(4, 3)], lambda e, a, b: a - b, lambda T, F, a, b: a - b),
    C("multiply", [f(3, 1), f(1, 4)], lambda e, a, b: a * b, lambda T, F, a, b: a * b),
    C("divide", [f(3, 4), pos(3, 1)], lambda e, a, b: a / b, lambda T, F, a, b: a / b),
    C("pow", [pos(3, 4), f(4)], lambda e, a, b: a ** b, lambda T, F, a, b: a ** b),
    C("pow_scalar", [f(3, 4)], lambda e, a: a ** 3 + 2.0 ** a, lambda T, F, a: a ** 3 + 2.0 ** a),
    C("maximum", [f(3, 4), f(4)], lambda e, a, b: e.maximum(a, b), lambda T, F, a, b: T.maximum(a, b)),
    C("minimum", [f(3, 4), f(3, 1)], lambda e, a, b: e.minimum(a, b), lambda T, F, a, b: T.minimum(a, b)),
    C("remainder", [pos(3, 4), pos(4)], lambda e, a, b: a % (b + 1.0),
      lambda T, F, a, b: T.remainder(a, b + 1.0)),
    C("where", [("bool", (3, 4)), f(3, 4), f(4)], lambda e, c, a, b: e.where(c, a, b),
      lambda T, F, c, a, b: T.where(c, a, b)),
    C("scalar_ops", [f(3, 4)], lambda e, x: (2.0 - x) * 3.0 / 1.5 + 1.0 / (x * x + 1.0),
      lambda T, F, x: (2.0 - x) * 3.0 / 1.5 + 1.0 / (x * x + 1.0)),
    # ---- reductions ----
    C("sum_axis", [f(3, 4, 5)], lambda e, x: x.sum(axis=(0, 2)), lambda T, F, x: x.sum(dim=(0, 2))),
    C("sum_all_keep", [f(3, 4)], lambda e, x: x.sum(keepdims=True) * x,
      lambda T, F, x: x.sum(dim=(0, 1), keepdim=True) * x),
    C("mean", [f(3, 4, 5)], lambda e, x: x.mean(axis=1, keepdims=True), lambda T, F, x: x.mean(dim=1, keepdim=True)),
    C("var", [f(4, 5)], lambda e, x: e.var(x, axis=1, correction=1), lambda T, F, x: T.var(x, dim=1, correction=1)),
    C("std", [f(4, 5)], lambda e, x: e.std(x, axis=0), lambda T, F, x: T.std(x, dim=0, correction=0)),
    C("prod", [pos(3, 4)], lambda e, x: e.prod(x, axis=1), lambda T, F, x: T.prod(x, dim=1)),
    C("max_axis", [f(3, 5)], lambda e, x: e.max(x, axis=1), lambda T, F, x: T.amax(x, dim=1)),
    C("min_all", [f(3, 5)], lambda e, x: e.min(x), lambda T, F, x: T.amin(x)),
    C("logsumexp_like", [f(3, 5)], lambda e, x: (x - x.max(axis=1, keepdims=True)).exp().sum(axis=1).log(),
      lambda T, F, x: (x - T.amax(x, dim=1, keepdim=True)).exp().sum(dim=1).log()),
    # ---- movement ----
    C("reshape", [f(3, 4)], lambda e, x: x.reshape(2, 6) * e.arange(6, device=x.device).astype("float32"),
      lambda T, F, x: x.reshape(2, 6) * T.arange(6, dtype=T.float64)),
    C("permute", [f(2, 3, 4)], lambda e, x: x.permute(2, 0, 1), lambda T, F, x: x.permute(2, 0, 1)),
    C("broadcast_to", [f(3, 1)], lambda e, x: e.broadcast_to(x, (2, 3, 4)), lambda T, F, x: x.expand(2, 3, 4)),
    C("slice_steps", [f(5, 6)], lambda e, x: x[1:5:2, ::3], lambda T, F, x: x[1:5:2, ::3]),
    C("slice_negative", [f(5, 6)], lambda e, x: x[::-2, 4:0:-1], lambda T, F, x: T.flip(x, [0])[::2].flip([1])[:, 1:5]),
    C("getitem_int_none", [f(4, 5)], lambda e, x: x[2, None, 1:], lambda T, F, x: x[2, None, 1:]),
    C("getitem_array", [f(4, 5)], lambda e, x: x[[3, 0, 3]], lambda T, F, x: x[[3, 0, 3]]),
    C("concat", [f(2, 3), f(4, 3)], lambda e, a, b: e.concat([a, b, a], axis=0),
      lambda T, F, a, b: T.cat([a, b, a], 0)),
    C("stack", [f(2, 3), f(2, 3)], lambda e, a, b: e.stack([a, b], axis=1), lambda T, F, a, b: T.stack([a, b], 1)),
    C("split", [f(6, 2)], lambda e, x: e.split(x, [1, 4])[1] * 2.0 + e.split(x, 3)[2].sum(),
      lambda T, F, x: T.split(x, [1, 3, 2])[1] * 2.0 + T.split(x, 2)[2].sum()),
    C("take", [f(4, 3), ints(4, 5)], lambda e, x, i: e.take(x, i, axis=0), lambda T, F, x, i: x[i]),
    C("take_axis1", [f(2, 5, 3), ints(5, 2, 2)], lambda e, x, i: e.take(x, i, axis=1),
      lambda T, F, x, i: x[:, i]),
    C("take_along_axis", [f(3, 5), ints(5, 3, 4)], lambda e, x, i: e.take_along_axis(x, i, axis=1),
      lambda T, F, x, i: T.gather(x, 1, i)),
    C("flip", [f(3, 4)], lambda e, x: e.flip(x, axis=1) * e.arange(4, device=x.device).astype("float32"),
      lambda T, F, x: T.flip(x, [1]) * T.arange(4, dtype=T.float64)),
    C("tile", [f(2, 3)], lambda e, x: e.tile(x, (2, 2)), lambda T, F, x: x.repeat(2, 2)),
    C("squeeze_expand", [f(3, 1, 4)], lambda e, x: e.expand_dims(e.squeeze(x, axis=1), 0),
      lambda T, F, x: x.squeeze(1).unsqueeze(0)),
    C("transpose", [f(2, 3, 4)], lambda e, x: e.transpose(x, 0, 2), lambda T, F, x: x.transpose(0, 2)),
    C("flatten", [f(2, 3, 4)], lambda e, x: e.flatten(x, 1), lambda T, F, x: x.flatten(1)),
    C("scatter_add", [f(3, 4), ints(5, 3, 1)], lambda e, u, i: e.scatter_add(u, i, 0, 5),
      lambda T, F, u, i: T.zeros(5, 4, dtype=u.dtype).index_add(0, i[:, 0], u)),
    # ---- linear algebra ----
    C("matmul", [f(3, 4), f(4, 5)], lambda e, a, b: a @ b, lambda T, F, a, b: a @ b),
    C("matmul_batched", [f(2, 3, 4), f(4, 5)], lambda e, a, b: a @ b, lambda T, F, a, b: a @ b),
    C("matmul_bcast", [f(2, 1, 3, 4), f(3, 4, 2)], lambda e, a, b: a @ b, lambda T, F, a, b: a @ b),
    C("matmul_vec", [f(4), f(4, 3)], lambda e, a, b: a @ b, lambda T, F, a, b: a @ b),
    C("linear", [f(2, 3, 4), f(5, 4), f(5)], lambda e, x, w, b: e.linear(x, w, b),
      lambda T, F, x, w, b: F.linear(x, w, b)),
    C("linear_nobias", [f(3, 4), f(5, 4)], lambda e, x, w: e.linear(x, w), lambda T, F, x, w: F.linear(x, w)),
    # ---- nn ----
    C("softmax", [f(3, 5)], lambda e, x: e.softmax(x, axis=1), lambda T, F, x: T.softmax(x, 1)),
    C("softmax_axis0", [f(4, 3)], lambda e, x: e.softmax(x, axis=0), lambda T, F, x: T.softmax(x, 0)),
    C("log_softmax", [f(3, 5)], lambda e, x: e.log_softmax(x), lambda T, F, x: T.log_softmax(x, -1)),
    C("layer_norm", [f(2, 3, 6), f(6), f(6)], lambda e, x, w, b: e.layer_norm(x, 6, w, b),
      lambda T, F, x, w, b: F.layer_norm(x, (6,), w, b), tol=1e-3),
    C("layer_norm_2d", [f(2, 3, 4), f(3, 4), f(3, 4)], lambda e, x, w, b: e.layer_norm(x, (3, 4), w, b),
      lambda T, F, x, w, b: F.layer_norm(x, (3, 4), w, b), tol=1e-3),
    C("batch_norm_eval", [f(2, 3, 4, 4), f(3), pos(3), f(3), f(3)],
      lambda e, x, m, v, w, b: e.batch_norm(x, m, v, w, b, eps=1e-5),
      lambda T, F, x, m, v, w, b: (x - m[:, None, None]) / T.sqrt(v[:, None, None] + 1e-5) * w[:, None, None]
      + b[:, None, None], tol=1e-3),
    C("batch_norm_train", [f(4, 3, 2, 2), f(3), f(3)],
      lambda e, x, w, b: e.batch_norm(x, e.mean(x, axis=(0, 2, 3)), e.var(x, axis=(0, 2, 3)), w, b, eps=1e-5),
      lambda T, F, x, w, b: F.batch_norm(x, None, None, w, b, training=True, eps=1e-5), tol=1e-3),
    C("batch_norm_train_fused", [f(4, 3, 2, 2), f(3), f(3)],
      lambda e, x, w, b: e.batch_norm_train(x, w, b)[0] + e.batch_norm_train(x, w, b)[2].reshape(1, 3, 1, 1),
      lambda T, F, x, w, b: F.batch_norm(x, None, None, w, b, training=True, eps=1e-5)
      + x.var(dim=(0, 2, 3), unbiased=False).reshape(1, 3, 1, 1), tol=1e-3),
    C("conv2d", [f(2, 3, 7, 6), f(4, 3, 3, 3), f(4)],
      lambda e, x, w, b: e.conv2d(x, w, b, stride=2, padding=1),
      lambda T, F, x, w, b: F.conv2d(x, w, b, stride=2, padding=1)),
    C("conv2d_groups_dilation", [f(1, 4, 8, 8), f(6, 2, 3, 2)],
      lambda e, x, w: e.conv2d(x, w, stride=(1, 2), padding=(2, 1), dilation=(2, 1), groups=2),
      lambda T, F, x, w: F.conv2d(x, w, stride=(1, 2), padding=(2, 1), dilation=(2, 1), groups=2)),
    C("conv2d_same", [f(1, 2, 5, 5), f(3, 2, 2, 2)], lambda e, x, w: e.conv2d(x, w, padding="same"),
      lambda T, F, x, w: F.conv2d(F.pad(x, (0, 1, 0, 1)), w)),
    C("conv_transpose2d", [f(2, 4, 3, 3), f(4, 3, 3, 3), f(3)],
      lambda e, x, w, b: e.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
      lambda T, F, x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1)),
    C("conv_transpose2d_groups", [f(1, 4, 4, 3), f(4, 1, 2, 3)],
      lambda e, x, w: e.conv_transpose2d(x, w, stride=(2, 1), groups=2, dilation=(1, 2)),
      lambda T, F, x, w: F.conv_transpose2d(x, w, stride=(2, 1), groups=2, dilation=(1, 2))),
    C("max_pool2d", [f(2, 3, 6, 6)], lambda e, x: e.max_pool2d(x, 2), lambda T, F, x: F.max_pool2d(x, 2)),
    C("max_pool2d_pad_ceil", [f(1, 2, 7, 6)], lambda e, x: e.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
      lambda T, F, x: F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True)),
    C("max_pool2d_dilation", [f(1, 2, 7, 7)], lambda e, x: e.max_pool2d(x, 2, 1, dilation=2),
      lambda T, F, x: F.max_pool2d(x, 2, 1, dilation=2)),
    C("avg_pool2d", [f(2, 3, 6, 6)], lambda e, x: e.avg_pool2d(x, 2), lambda T, F, x: F.avg_pool2d(x, 2)),
    C("avg_pool2d_pad", [f(1, 2, 7, 6)],
      lambda e, x: e.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False),
      lambda T, F, x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False)),
    C("avg_pool2d_include_pad", [f(1, 2, 5, 5)], lambda e, x: e.avg_pool2d(x, 3, 2, padding=1),
      lambda T, F, x: F.avg_pool2d(x, 3, 2, padding=1)),
    C("adaptive_avg_pool2d", [f(1, 2, 5, 7)], lambda e, x: e.adaptive_avg_pool2d(x, (2, 3)),
      lambda T, F, x: F.adaptive_avg_pool2d(x, (2, 3))),
    C("embedding", [ints(6, 2, 3), f(6, 4)], lambda e, i, w: e.embedding(i, w), lambda T, F, i, w: F.embedding(i, w)),
    C("sdpa", [f(2, 3, 4), f(2, 5, 4), f(2, 5, 3)], lambda e, q, k, v: e.scaled_dot_product_attention(q, k, v),
      lambda T, F, q, k, v: F.scaled_dot_product_attention(q, k, v)),
    C("sdpa_causal", [f(1, 2, 4, 3), f(1, 2, 4, 3), f(1, 2, 4, 3)],
      lambda e, q, k, v: e.scaled_dot_product_attention(q, k, v, is_causal=True),
      lambda T, F, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    C("sdpa_float_mask", [f(2, 3, 4), f(2, 5, 4), f(2, 5, 3), f(3, 5)],
      lambda e, q, k, v, m: e.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
      lambda T, F, q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)),
    C("sdpa_bool_mask", [f(2, 3, 4), f(2, 5, 4), f(2, 5, 3), ("bool", (3, 5))],
      lambda e, q, k, v, m: e.scaled_dot_product_attention(q, k, v, attn_mask=m | e.eye(3, 5, device=m.device).astype("bool")),
      lambda T, F, q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m | T.eye(3, 5, dtype=T.bool))),
    C("cumsum", [f(3, 4)], lambda e, x: e.cumsum(x, 1), lambda T, F, x: T.cumsum(x, 1)),
    C("cumsum_excl_rev", [f(3, 4)], _ember_cumsum_excl_rev, _torch_cumsum_excl_rev),
    C("sort", [f(3, 5)], lambda e, x: e.sort(x, axis=1, descending=True), lambda T, F, x: T.sort(x, 1, True)[0]),
    C("topk", [f(3, 5)], lambda e, x: e.topk(x, 2)[0], lambda T, F, x: T.topk(x, 2)[0]),
    C("pad_constant", [f(2, 3)], lambda e, x: e.pad(x, ((1, 2), (-1, 1)), value=0.5),
      lambda T, F, x: F.pad(x, (-1, 1, 1, 2), value=0.5)),
    C("pad_reflect", [f(1, 2, 4, 5)], lambda e, x: e.pad(x, ((0, 0), (0, 0), (2, 1), (1, 3)), mode="reflect"),
      lambda T, F, x: F.pad(x, (1, 3, 2, 1), mode="reflect")),
    C("pad_edge", [f(1, 2, 3, 4)], lambda e, x: e.pad(x, ((0, 0), (0, 0), (2, 1), (1, 3)), mode="edge"),
      lambda T, F, x: F.pad(x, (1, 3, 2, 1), mode="replicate")),
    C("pad_wrap", [f(1, 2, 3, 4)], lambda e, x: e.pad(x, ((0, 0), (0, 0), (2, 1), (1, 3)), mode="wrap"),
      lambda T, F, x: F.pad(x, (1, 3, 2, 1), mode="circular")),
    # ---- losses (ember.nn.functional against torch.nn.functional) ----
    C("cross_entropy", [f(5, 4), ints(4, 5)], lambda e, x, t: e.nn.functional.cross_entropy(x, t),
      lambda T, F, x, t: F.cross_entropy(x, t)),
    C("cross_entropy_opts", [f(4, 5, 3), ints(5, 4, 3), cpos(5)],
      lambda e, x, t, w: e.nn.functional.cross_entropy(x, e.where(t == 2, -1, t), w, ignore_index=-1,
                                                       label_smoothing=0.1),
      lambda T, F, x, t, w: F.cross_entropy(x, T.where(t == 2, -1, t), w, ignore_index=-1, label_smoothing=0.1)),
    C("cross_entropy_none", [f(6, 3), ints(3, 6)],
      lambda e, x, t: e.nn.functional.cross_entropy(x, t, reduction="none", label_smoothing=0.3),
      lambda T, F, x, t: F.cross_entropy(x, t, reduction="none", label_smoothing=0.3)),
    C("cross_entropy_probs", [f(4, 5), cpos(4, 5)],
      lambda e, x, p: e.nn.functional.cross_entropy(x, p / p.sum(axis=1, keepdims=True), reduction="sum"),
      lambda T, F, x, p: F.cross_entropy(x, (p / p.sum(1, keepdim=True)).detach(), reduction="sum")),
    C("nll_loss", [f(5, 4), ints(4, 5), cpos(4)],
      lambda e, x, t, w: e.nn.functional.nll_loss(e.log_softmax(x, axis=1), t, w),
      lambda T, F, x, t, w: F.nll_loss(T.log_softmax(x, 1), t, w)),
    C("mse_loss", [f(3, 4), f(3, 4)], lambda e, a, b: e.nn.functional.mse_loss(a, b),
      lambda T, F, a, b: F.mse_loss(a, b)),
    C("l1_loss_sum", [far(3, 4), f(3, 4)], lambda e, a, b: e.nn.functional.l1_loss(a, b * 0.1, reduction="sum"),
      lambda T, F, a, b: F.l1_loss(a, b * 0.1, reduction="sum")),
    C("smooth_l1_loss", [f(3, 4), f(3, 4)], lambda e, a, b: e.nn.functional.smooth_l1_loss(a, b, beta=0.5),
      lambda T, F, a, b: F.smooth_l1_loss(a, b, beta=0.5)),
    C("huber_loss", [f(3, 4), f(3, 4)], lambda e, a, b: e.nn.functional.huber_loss(a, b, reduction="none", delta=0.7),
      lambda T, F, a, b: F.huber_loss(a, b, reduction="none", delta=0.7)),
    C("binary_cross_entropy", [f(3, 4), cpos(3, 4), cpos(4)],
      lambda e, x, t, w: e.nn.functional.binary_cross_entropy(e.sigmoid(x), t / 2.0, w),
      lambda T, F, x, t, w: F.binary_cross_entropy(T.sigmoid(x), t / 2.0, w)),
    C("bce_with_logits", [f(3, 4), cpos(3, 4), cpos(4)],
      lambda e, x, t, pw: e.nn.functional.binary_cross_entropy_with_logits(x * 4.0, t / 2.0, pos_weight=pw),
      lambda T, F, x, t, pw: F.binary_cross_entropy_with_logits(x * 4.0, t / 2.0, pos_weight=pw)),
    C("kl_div", [f(3, 4), cpos(3, 4)],
      lambda e, x, t: e.nn.functional.kl_div(e.log_softmax(x, axis=1), t / t.sum(axis=1, keepdims=True),
                                             reduction="batchmean"),
      lambda T, F, x, t: F.kl_div(T.log_softmax(x, 1), t / t.sum(1, keepdim=True), reduction="batchmean")),
    # ---- compositions (the graph engine: shared inputs, diamonds, reuse) ----
    C("diamond", [f(3, 4)], lambda e, x: e.tanh(x) * e.exp(x) + x * x,
      lambda T, F, x: T.tanh(x) * T.exp(x) + x * x),
    C("mlp", [f(5, 4), f(6, 4), f(6), f(3, 6)],
      lambda e, x, w1, b1, w2: e.log_softmax(e.linear(e.gelu(e.linear(x, w1, b1)), w2), axis=-1),
      lambda T, F, x, w1, b1, w2: T.log_softmax(F.linear(F.gelu(F.linear(x, w1, b1)), w2), -1)),
]

BY_NAME = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES), "duplicate case names"

_ = math  # (kept for cases that need constants)
