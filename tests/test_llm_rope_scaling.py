"""RoPE scaling in GGUF llama files: linear scaling (``llama.rope.scaling.type`` = "linear") and
Llama 3.1+'s per-frequency factors (tensor ``rope_freqs.weight``), against the float64 reference
forward of tests/llm_fixtures.py; other scaling types are refused, never run wrong."""
import math

import numpy as np
import pytest

import ember
import ember.llm
from ember.backends.numpy_quant import native_qlinear
from ember.errors import ShapeError, UnsupportedOp, WeightsError
from llm_fixtures import CFG, reference_logits, write_tiny_gguf


def llama3_factors(hd, base, factor=8.0, low=1.0, high=4.0, old_ctx=32):
    """The divisors Llama 3.1's converter writes (wavelengths above old_ctx / low turn ``factor``
    times slower, below old_ctx / high unchanged, smoothly in between), for a tiny head."""
    out = []
    for i in range(hd // 2):
        wavelen = 2 * math.pi / base ** (-2 * i / hd)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return out


HD = CFG["dim"] // CFG["n_heads"]
CASES = {
    "llama3": dict(rope_factors=llama3_factors(HD, CFG["base"])),
    "linear": dict(rope_scaling=("linear", 4.0)),
    "both": dict(rope_factors=llama3_factors(HD, CFG["base"], factor=2.0), rope_scaling=("linear", 2.0)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_scaled_rope_logits_match_the_reference(device, tmp_path, case):
    cfg = CASES[case]
    assert len(set(cfg.get("rope_factors", [1.0]))) > 1 or "rope_scaling" in cfg   # (a real change)
    path = tmp_path / "m.gguf"
    ref = write_tiny_gguf(path, cfg=cfg)
    m = ember.llm.load(str(path), device=device, context=48)
    ids = m.tokenizer.encode("the theater in a tent on the hill, then another tent")
    assert len(ids) > 20                        # (positions far enough for the scaling to matter)
    want = reference_logits(ref, ids, cfg)
    plain = reference_logits(ref, ids)
    assert np.abs(want - plain).max() > 1e-2    # the scaling changes the logits
    got = np.asarray(m.model.forward(ember.tensor(ids, dtype="int32", device=device),
                                     ember.tensor([0], dtype="int32", device=device), all_logits=True).tolist())
    tol = {"wasm": 2e-2, "webgpu": 1e-3, "numpy": 2e-2 if native_qlinear() else 1e-4}.get(device, 1e-4)   # (see test_llm.py)
    np.testing.assert_allclose(got, want, atol=tol * 10, rtol=tol)


def test_rope_tables_scale_and_factors():
    c, s = ember.ops.llm.rope_tables(9, 6, 500.0, scale=3.0, factors=[1.0, 2.0, 5.0])
    inv = 500.0 ** (-np.arange(3) * 2 / 6) / np.array([1.0, 2.0, 5.0]) / 3.0
    ang = np.arange(9)[:, None] * inv[None, :]
    np.testing.assert_allclose(np.asarray(c.tolist()), np.cos(ang), atol=1e-6)
    np.testing.assert_allclose(np.asarray(s.tolist()), np.sin(ang), atol=1e-6)
    for bad in ([1.0, 2.0], [1.0, 0.0, 1.0], [1.0, float("nan"), 1.0]):
        with pytest.raises(ShapeError, match="factors"):
            ember.ops.llm.rope_tables(4, 6, factors=bad)
    with pytest.raises(ShapeError, match="scale"):
        ember.ops.llm.rope_tables(4, 6, scale=0.0)


@pytest.mark.parametrize("kind", ["yarn", "longrope", "su"])
def test_other_scaling_types_are_refused(tmp_path, kind):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, cfg=dict(rope_scaling=(kind, 4.0)))
    with pytest.raises(UnsupportedOp, match=f"RoPE scaling '{kind}'"):
        ember.llm.load(str(path), device="numpy")


def test_bad_rope_freqs_and_factor(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, cfg=dict(rope_factors=[1.0, 2.0, 3.0]))          # not hd // 2 values
    with pytest.raises(WeightsError, match="rope_freqs.weight"):
        ember.llm.load(str(path), device="numpy")
    write_tiny_gguf(path, cfg=dict(rope_factors=[1.0] * (HD // 2 - 1) + [-1.0]))
    with pytest.raises(WeightsError, match="positive"):
        ember.llm.load(str(path), device="numpy")
    write_tiny_gguf(path, cfg=dict(rope_scaling=("linear", 0.0)))
    with pytest.raises(WeightsError, match="scaling factor"):
        ember.llm.load(str(path), device="numpy")


def test_architectures_that_would_run_wrong_are_refused():
    """Granite's extra scale factors and Mixtral's experts (arch "llama") are not run: refused
    by name, not run as a plain llama."""
    from ember.nn.llama import LlamaConfig

    base = {"block_count": 2, "embedding_length": 64, "attention.head_count": 4, "feed_forward_length": 96}
    md = {"general.architecture": "granite", **{"granite." + k: v for k, v in base.items()},
          "granite.residual_scale": 0.22}
    with pytest.raises(UnsupportedOp, match="'granite'"):
        LlamaConfig.from_gguf(md)
    md = {"general.architecture": "llama", **{"llama." + k: v for k, v in base.items()}, "llama.expert_count": 8}
    with pytest.raises(UnsupportedOp, match="mixture of experts"):
        LlamaConfig.from_gguf(md)
    md["llama.expert_count"] = 0
    assert LlamaConfig.from_gguf(md).n_layers == 2
