"""Produce tests/golden/nn_ops.safetensors once, with PyTorch: inputs and outputs of the nn ops
(conv, transposed conv, pooling, norms, attention, activations, softmax, sort/topk, cumsum, pad)
over many configurations. torch is a golden-time tool only: the tests read the committed file
(tests/op_cases_nn.py parses it with the standard library, so the cases also run in Pyodide).

    .venv/bin/python tests/golden/make_nn_goldens.py

Layout: tensors ``<case id>/in<k>`` and ``<case id>/out<k>`` (float32, int64 or bool); the
metadata key ``cases`` holds a JSON list of ``{"id", "op", "kwargs", "n_in", "n_out", "tol",
"outputs"}``, where ``op`` names the ember function and ``kwargs`` its keyword arguments, and
``outputs`` says how ember's results line up with the stored ones (see op_cases_nn.py).
Seeded; torch 2.13 CPU made the committed file.
"""
import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "nn_ops.safetensors")

torch.manual_seed(1234)
CASES = []
TENSORS = {}


def rnd(*shape, scale=1.0):
    return (torch.randn(*shape) * scale).float()


# parameter names of the ember functions, in the order the inputs are given
ARGS = {"conv2d": ("x", "weight", "bias"), "conv_transpose2d": ("x", "weight", "bias"),
        "batch_norm": ("x", "running_mean", "running_var", "weight", "bias"),
        "layer_norm": ("x", "weight", "bias"), "embedding": ("indices", "weight"),
        "scaled_dot_product_attention": ("query", "key", "value", "attn_mask")}


def case(cid, op, inputs, outputs, kwargs=None, tol=None, mode=None):
    """Record one case: ember's ``op(**dict(zip(names, inputs)), **kwargs)`` must give
    ``outputs``. ``mode``: None (compare every output), "sort" (ember.sort gives the values,
    ember.argsort the indices), "values" (compare only the first output)."""
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    names = ARGS.get(op, ("x",))[:len(inputs)]
    for k, t in enumerate(inputs):
        TENSORS[f"{cid}/in{k}"] = t.contiguous().clone()
    for k, t in enumerate(outputs):
        TENSORS[f"{cid}/out{k}"] = t.detach().contiguous().clone()
    CASES.append({"id": cid, "op": op, "kwargs": kwargs or {}, "names": list(names), "n_out": len(outputs),
                  "tol": tol, "mode": mode})


CONV_TOL = [1e-4, 1e-4]

# ---- conv2d: (id, x shape, w shape, bias, kwargs) ----
for cid, xs, ws, bias, kw in [
    ("basic", (2, 3, 6, 5), (4, 3, 3, 3), True, {}),
    ("stride2_pad1", (1, 3, 7, 7), (5, 3, 3, 3), False, {"stride": 2, "padding": 1}),
    ("dilation2", (1, 2, 8, 7), (3, 2, 3, 3), True, {"padding": 2, "dilation": 2}),
    ("groups2_rect", (1, 4, 7, 6), (6, 2, 3, 2), True, {"stride": [2, 1], "padding": [1, 0], "groups": 2}),
    ("depthwise", (1, 4, 6, 6), (4, 1, 3, 3), True, {"padding": 1, "groups": 4}),
    ("depthwise_mult2", (1, 3, 5, 5), (6, 1, 3, 3), False, {"groups": 3, "stride": 2}),
    ("pointwise", (2, 5, 3, 4), (3, 5, 1, 1), True, {}),
    ("same_even", (1, 2, 6, 5), (3, 2, 4, 2), False, {"padding": "same"}),
    ("same_dilated", (1, 2, 6, 6), (2, 2, 3, 3), True, {"padding": "same", "dilation": 2}),
    ("valid", (1, 2, 5, 6), (2, 2, 2, 3), False, {"padding": "valid", "stride": 3}),
    ("full_kernel", (1, 1, 4, 4), (2, 1, 4, 4), True, {}),
    ("nonsquare_input", (1, 3, 3, 9), (2, 3, 2, 2), True, {"padding": [0, 1], "stride": [1, 2]}),
]:
    x, w = rnd(*xs), rnd(*ws)
    b = rnd(ws[0]) if bias else None
    tk = dict(kw)
    if "stride" in tk and isinstance(tk["stride"], list):
        tk["stride"] = tuple(tk["stride"])
    if "padding" in tk and isinstance(tk["padding"], list):
        tk["padding"] = tuple(tk["padding"])
    y = F.conv2d(x, w, b, **tk)
    case(f"conv2d/{cid}", "conv2d", [x, w] + ([b] if bias else []), y, kw, CONV_TOL)

# ---- conv_transpose2d ----
for cid, xs, ws, bias, kw in [
    ("basic", (1, 3, 4, 4), (3, 2, 3, 3), True, {}),
    ("stride2_outpad", (2, 2, 3, 4), (2, 3, 3, 3), False, {"stride": 2, "padding": 1, "output_padding": 1}),
    ("groups2_rect", (1, 4, 3, 3), (4, 2, 3, 2), True,
     {"stride": [2, 3], "padding": [1, 0], "output_padding": [1, 2], "groups": 2}),
    ("dilation2", (1, 2, 3, 3), (2, 2, 3, 3), True, {"stride": 2, "padding": 2, "dilation": 2}),
    ("pointwise_stride2", (1, 3, 3, 3), (3, 4, 1, 1), False, {"stride": 2}),
    ("big_padding", (1, 2, 5, 5), (2, 2, 3, 3), True, {"padding": 2}),
]:
    x, w = rnd(*xs), rnd(*ws)
    b = rnd(ws[1] * kw.get("groups", 1)) if bias else None
    tk = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
    y = F.conv_transpose2d(x, w, b, **tk)
    case(f"conv_transpose2d/{cid}", "conv_transpose2d", [x, w] + ([b] if bias else []), y, kw, CONV_TOL)

# ---- pooling ----
for cid, xs, kw in [
    ("k2", (2, 3, 6, 6), {"kernel_size": 2}),
    ("k3_s2_p1", (1, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("ceil", (1, 2, 8, 8), {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
    ("ceil_pad", (1, 2, 6, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ("dilated_rect", (1, 2, 7, 8), {"kernel_size": [2, 3], "stride": [1, 2], "padding": [1, 1], "dilation": [2, 1]}),
    ("rect", (1, 1, 5, 7), {"kernel_size": [2, 3]}),
]:
    x = rnd(*xs)
    tk = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
    case(f"max_pool2d/{cid}", "max_pool2d", [x], F.max_pool2d(x, **tk), kw)
x = rnd(1, 2, 4, 4)
x[0, 1, 1, 2] = float("nan")
case("max_pool2d/nan", "max_pool2d", [x], F.max_pool2d(x, 2), {"kernel_size": 2})

for cid, xs, kw in [
    ("k2", (2, 3, 6, 6), {"kernel_size": 2}),
    ("k3_s2_p1", (1, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("k3_s2_p1_nopad", (1, 2, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
    ("ceil_pad", (1, 2, 8, 8), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ("ceil_pad_nopad", (1, 2, 8, 8), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True,
                                      "count_include_pad": False}),
    ("ceil_nopadding", (1, 1, 7, 5), {"kernel_size": 2, "ceil_mode": True}),
    ("rect", (1, 2, 6, 5), {"kernel_size": [3, 2], "stride": [2, 1], "padding": [1, 1]}),
]:
    x = rnd(*xs)
    tk = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
    case(f"avg_pool2d/{cid}", "avg_pool2d", [x], F.avg_pool2d(x, **tk), kw)

for cid, xs, size in [("divisible", (1, 2, 6, 6), [3, 3]), ("uneven", (1, 2, 7, 5), [3, 2]),
                      ("global", (2, 3, 5, 7), [1, 1]), ("keep_h", (1, 2, 4, 5), [None, 3]),
                      ("upsample", (1, 1, 3, 4), [5, 6])]:
    x = rnd(*xs)
    case(f"adaptive_avg_pool2d/{cid}", "adaptive_avg_pool2d", [x], F.adaptive_avg_pool2d(x, tuple(size)),
         {"output_size": size})

# ---- normalization ----
x, m, v, w, b = rnd(2, 3, 4, 4), rnd(3), rnd(3).abs() + 0.5, rnd(3), rnd(3)
case("batch_norm/affine", "batch_norm", [x, m, v, w, b], F.batch_norm(x, m, v, w, b, eps=1e-5))
x2 = rnd(4, 3)
case("batch_norm/2d_eps", "batch_norm", [x2, m, v, w, b], F.batch_norm(x2, m, v, w, b, eps=1e-2), {"eps": 1e-2})
case("batch_norm/no_affine", "batch_norm", [x, m, v], F.batch_norm(x, m, v))
x = rnd(2, 3, 5, scale=3.0) + 2.0
w, b = rnd(5), rnd(5)
case("layer_norm/last", "layer_norm", [x, w, b], F.layer_norm(x, (5,), w, b), {"normalized_shape": 5})
w2, b2 = rnd(3, 5), rnd(3, 5)
case("layer_norm/two_dims", "layer_norm", [x, w2, b2], F.layer_norm(x, (3, 5), w2, b2, eps=1e-3),
     {"normalized_shape": [3, 5], "eps": 1e-3})
case("layer_norm/no_affine", "layer_norm", [x], F.layer_norm(x, (5,)), {"normalized_shape": [5]})

# ---- attention ----
q, k, v = rnd(2, 2, 3, 4), rnd(2, 2, 5, 4), rnd(2, 2, 5, 6)
case("sdpa/plain", "scaled_dot_product_attention", [q, k, v], F.scaled_dot_product_attention(q, k, v))
mask = torch.rand(3, 5) > 0.4
mask[1] = False   # a row with every key masked: PyTorch gives zeros
case("sdpa/bool_mask", "scaled_dot_product_attention", [q, k, v, mask],
     F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
fmask = rnd(2, 1, 3, 5)
case("sdpa/float_mask", "scaled_dot_product_attention", [q, k, v, fmask],
     F.scaled_dot_product_attention(q, k, v, attn_mask=fmask))
q4, k4, v4 = rnd(1, 2, 4, 3), rnd(1, 2, 4, 3), rnd(1, 2, 4, 3)
case("sdpa/causal", "scaled_dot_product_attention", [q4, k4, v4],
     F.scaled_dot_product_attention(q4, k4, v4, is_causal=True), {"is_causal": True})
case("sdpa/causal_rect_scale", "scaled_dot_product_attention", [q, k, v],
     F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3), {"is_causal": True, "scale": 0.3})
q3, k3, v3 = rnd(2, 3, 4), rnd(2, 6, 4), rnd(2, 6, 2)
case("sdpa/3d", "scaled_dot_product_attention", [q3, k3, v3], F.scaled_dot_product_attention(q3, k3, v3))

# ---- activations, softmax ----
x = torch.linspace(-8, 8, 41).reshape(1, 41)
case("gelu/erf", "gelu", [x], F.gelu(x))
case("gelu/tanh", "gelu", [x], F.gelu(x, approximate="tanh"), {"approximate": "tanh"})
case("sigmoid/range", "sigmoid", [x * 12], torch.sigmoid(x * 12))
case("silu/range", "silu", [x * 12], F.silu(x * 12))
case("leaky_relu/slope", "leaky_relu", [x], F.leaky_relu(x, 0.2), {"negative_slope": 0.2})
big = rnd(3, 5, scale=1000.0)
for ax in (-1, 0):
    case(f"softmax/large_axis{ax}", "softmax", [big], F.softmax(big, ax), {"axis": ax})
    case(f"log_softmax/large_axis{ax}", "log_softmax", [big], F.log_softmax(big, ax), {"axis": ax}, tol=[1e-5, 1e-3])
xi = rnd(2, 6)
xi[0, 2] = float("-inf")
case("softmax/neg_inf", "softmax", [xi], F.softmax(xi, -1))
case("log_softmax/neg_inf", "log_softmax", [xi], F.log_softmax(xi, -1))

# ---- sort, topk, cumsum ----
x = rnd(3, 8)
for ax in (-1, 0):
    vals, idx = torch.sort(x, dim=ax, stable=True)
    case(f"sort/axis{ax}", "sort", [x], [vals, idx], {"axis": ax}, mode="sort")
    vals, idx = torch.sort(x, dim=ax, descending=True, stable=True)
    case(f"sort/desc_axis{ax}", "sort", [x], [vals, idx], {"axis": ax, "descending": True}, mode="sort")
ties = torch.randint(0, 4, (3, 9)).float()
for desc in (False, True):
    vals, idx = torch.sort(ties, dim=-1, descending=desc, stable=True)
    case(f"sort/ties_desc{int(desc)}", "sort", [ties], [vals, idx], {"descending": desc}, mode="sort")
for cid, kw in [("largest", {"k": 3}), ("smallest", {"k": 2, "largest": False}), ("axis0", {"k": 2, "axis": 0}),
                ("all", {"k": 8})]:
    tk = {"k": kw["k"], "dim": kw.get("axis", -1), "largest": kw.get("largest", True)}
    case(f"topk/{cid}", "topk", [x], list(torch.topk(x, **tk)), kw)
v, i = torch.topk(ties, 4)
case("topk/ties", "topk", [ties], [v], {"k": 4}, mode="values")   # tie order unspecified: values only
for ax in (0, 1):
    case(f"cumsum/axis{ax}", "cumsum", [x], torch.cumsum(x, ax), {"axis": ax})
xi = torch.randint(-5, 6, (2, 5))
case("cumsum/int64", "cumsum", [xi], torch.cumsum(xi, 1), {"axis": 1})

# ---- pad (PyTorch's F.pad takes (left, right, top, bottom) for the last two axes) ----
x = rnd(1, 2, 4, 5)
for cid, mode, tp, pw in [("reflect", "reflect", (2, 1, 3, 0), [[0, 0], [0, 0], [3, 0], [2, 1]]),
                          ("edge", "replicate", (1, 3, 2, 2), [[0, 0], [0, 0], [2, 2], [1, 3]]),
                          ("wrap", "circular", (2, 0, 1, 3), [[0, 0], [0, 0], [1, 3], [2, 0]]),
                          ("constant_crop", "constant", (-1, 2, 1, -2), [[0, 0], [0, 0], [1, -2], [-1, 2]])]:
    kw = {"pad_width": pw, "mode": {"replicate": "edge", "circular": "wrap"}.get(mode, mode)}
    if mode == "constant":
        kw["value"] = 1.5
        y = F.pad(x, tp, mode="constant", value=1.5)
    else:
        y = F.pad(x, tp, mode=mode)
    case(f"pad/{cid}", "pad", [x], y, kw)

# ---- embedding ----
ids = torch.tensor([[0, 6, 2], [2, 2, 5]])
table = rnd(7, 4)
case("embedding/2d", "embedding", [ids, table], F.embedding(ids, table))

save_file(TENSORS, OUT, metadata={"cases": json.dumps(CASES), "torch": torch.__version__})
print(f"{len(CASES)} cases, {len(TENSORS)} tensors, {os.path.getsize(OUT) / 1024:.0f} KiB -> {OUT}")
