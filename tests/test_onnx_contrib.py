"""onnxruntime's fused transformer operators (``com.microsoft``) against onnxruntime itself:
one node at a time, and a BERT graph after ``onnxruntime.transformers.optimizer`` rewrote it
(SkipLayerNormalization, BiasGelu)."""
from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T

import ember
import ember.onnx
from onnx_helpers import node_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench"))
import bench_models  # noqa: E402

MS = "com.microsoft"
rng = np.random.default_rng(5)


def f32(*shape, s=1.0):
    return (rng.standard_normal(shape) * s).astype(np.float32)


def _model(op, inputs, attrs=None, inits=(), n_out=1, domain=MS, want=None):
    m, feeds = node_model(op, inputs, attrs, opset=17, inits=inits, n_out=n_out, domain=domain, want=want)
    return m.SerializeToString(), feeds


B, S, D, H = 2, 5, 16, 4
X3 = f32(B, S, D)
GAMMA, BETA, BIAS = f32(D) + 1, f32(D, s=0.1), f32(D, s=0.1)
W_QKV, B_QKV = f32(D, 3 * D, s=0.3), f32(3 * D, s=0.1)
MASK2 = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32)
IDS = rng.integers(0, 30, (B, S)).astype(np.int32)
SEG = rng.integers(0, 2, (B, S)).astype(np.int32)
EMB = {"word": f32(30, D), "pos": f32(16, D), "seg": f32(2, D)}

CASES = [
    ("SkipLayerNormalization", {"x": X3, "skip": f32(B, S, D), "g": GAMMA, "b": BETA, "bias": BIAS},
     {"epsilon": 1e-5}, ["g", "b", "bias"], 1, None),
    ("SkipLayerNormalization", {"x": X3, "skip": f32(B, S, D), "g": GAMMA}, {}, ["g"], 1, None),
    ("SkipLayerNormalization", {"x": X3, "skip": f32(B, S, D), "g": GAMMA, "b": BETA, "bias": BIAS}, {},
     ["g", "b", "bias"], 4, {0, 3}),
    ("SkipSimplifiedLayerNormalization", {"x": X3, "skip": f32(B, S, D), "g": GAMMA}, {"epsilon": 1e-6}, ["g"], 1,
     None),
    ("SimplifiedLayerNormalization", {"x": X3, "g": GAMMA}, {"epsilon": 1e-6, "axis": -1}, ["g"], 1, None),
    ("EmbedLayerNormalization", {"ids": IDS, "seg": SEG, "w": EMB["word"], "p": EMB["pos"], "s": EMB["seg"],
                                 "g": GAMMA, "b": BETA, "m": MASK2}, {"epsilon": 1e-12},
     ["w", "p", "s", "g", "b"], 2, None),
    ("EmbedLayerNormalization", {"ids": IDS, "seg": None, "w": EMB["word"], "p": EMB["pos"], "s": None,
                                 "g": GAMMA, "b": BETA}, {}, ["w", "p", "g", "b"], 2, None),
    ("Attention", {"x": X3, "w": W_QKV, "b": B_QKV, "m": MASK2}, {"num_heads": H}, ["w", "b"], 1, None),
    ("Attention", {"x": X3, "w": W_QKV, "b": B_QKV, "m": np.array([5, 3], np.int32)}, {"num_heads": H},
     ["w", "b"], 1, None),
    ("Attention", {"x": X3, "w": W_QKV, "b": B_QKV, "m": (rng.random((B, S, S)) < 0.7).astype(np.int32)},
     {"num_heads": H, "mask_filter_value": -1e4}, ["w", "b"], 1, None),
    ("Attention", {"x": X3, "w": W_QKV, "b": B_QKV}, {"num_heads": H, "unidirectional": 1, "scale": 0.3},
     ["w", "b"], 1, None),
    ("Attention", {"x": X3, "w": f32(D, 2 * D + 8, s=0.3), "b": f32(2 * D + 8, s=0.1)},
     {"num_heads": H, "qkv_hidden_sizes": [D, D, 8]}, ["w", "b"], 1, None),
    ("FastGelu", {"x": X3, "bias": BIAS}, {}, ["bias"], 1, None),
    ("FastGelu", {"x": X3}, {}, [], 1, None),
    ("BiasGelu", {"x": X3, "bias": BIAS}, {}, ["bias"], 1, None),
    ("Gelu", {"x": X3}, {}, [], 1, None),
    ("QuickGelu", {"x": X3}, {"alpha": 1.5}, [], 1, None),
    ("FusedMatMul", {"a": f32(2, 3, 4), "b": f32(2, 5, 4)}, {"alpha": 0.5, "transB": 1}, [], 1, None),
    ("FusedMatMul", {"a": f32(4, 3), "b": f32(4, 5)}, {"transA": 1}, [], 1, None),
]
CONTRIB_OPS = {(c[0] if c[0] == "SimplifiedLayerNormalization" else f"{MS}:{c[0]}") for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}{i}" for i, c in enumerate(CASES)])
def test_contrib_node(case, device):
    op, inputs, attrs, inits, n_out, want = case
    domain = "" if op == "SimplifiedLayerNormalization" else MS
    model, feeds = _model(op, inputs, attrs, inits, n_out, domain, want)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = ember.onnx.load(model, device=device)
        out = m.run({k: ember.tensor(v, device=device) for k, v in feeds.items()})
    got = [out[n].numpy() for n in m.output_names]
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, f"{op}: {g.shape} {g.dtype} vs {r.shape} {r.dtype}"
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=2e-5, err_msg=op)


def test_contrib_errors():
    from ember.errors import UnsupportedOp
    model, _ = _model("Attention", {"x": X3, "w": W_QKV, "b": B_QKV}, {"num_heads": H, "do_rotary": 1}, ["w", "b"])
    with pytest.raises(UnsupportedOp, match="'Attention_node'.*do_rotary=1"):
        ember.onnx.load(model, device="numpy")
    model, _ = _model("FusedMatMul", {"a": f32(2, 3, 4), "b": f32(2, 4, 5)}, {"transBatchA": 1})
    with pytest.raises(UnsupportedOp, match="'FusedMatMul_node'.*transBatchA"):
        ember.onnx.load(model, device="numpy")
    model, _ = _model("NoSuchFusion", {"x": X3})
    with pytest.raises(UnsupportedOp, match="NoSuchFusion of domain 'com.microsoft'"):
        ember.onnx.load(model, device="numpy")


def test_optimized_bert_matches_onnxruntime(tmp_path):
    """A BERT graph through onnxruntime's transformer optimizer, then both runtimes."""
    from onnxruntime.transformers import optimizer
    c = bench_models.TINY_BERT
    src = tmp_path / "bert.onnx"
    src.write_bytes(bench_models.bert_onnx(c, bench_models.random_bert_weights(c)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # opt_level=0: the optimizer's own Python fusions only (levels >= 1 first run an
        # onnxruntime session pass, whose code imports torch).
        opt = optimizer.optimize_model(str(src), model_type="bert", num_heads=c.heads, hidden_size=c.hidden,
                                       opt_level=0)
    ops = {(n.domain, n.op_type) for n in opt.model.graph.node}
    assert {(MS, "SkipLayerNormalization"), (MS, "BiasGelu")} <= ops
    raw = opt.model.SerializeToString()
    ids, mask = bench_models.bert_inputs(c, 2, 7)
    want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids,
                                                                                 "attention_mask": mask})[0]
    for device in ("numpy", "python"):
        got = ember.onnx.load(raw, device=device)(ids, mask).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
