"""A tiny llama GGUF written with the `gguf` package (a test dependency): a byte-level BPE
vocabulary (256 byte tokens, a few merges, ChatML control tokens), random weights in Q8_0 /
Q4_1 / F32 like SmolLM2's file, and an independent float64 numpy forward pass of the same model
(the reference ember's kernels are compared with)."""
from __future__ import annotations

import numpy as np

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CFG = dict(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=96, ctx=128, base=10000.0, eps=1e-5)


def byte_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def vocabulary():
    m = byte_unicode()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + [m[b] for b in range(256)]
    merges = []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n")]:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return tokens, merges, types


def write_tiny_gguf(path, seed: int = 0, qtypes=("Q4_1", "Q8_0"), cfg: dict | None = None):
    """Write the tiny model to ``path`` (``cfg`` overrides entries of ``CFG``); returns {name:
    float32 array (dequantized)}."""
    import gguf

    rng = np.random.default_rng(seed)
    c = dict(CFG, **(cfg or {}))
    tokens, merges, types = vocabulary()
    V, D, hd = len(tokens), c["dim"], c["dim"] // c["n_heads"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c["n_layers"])
    w.add_context_length(c["ctx"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(c["ffn_dim"])
    w.add_head_count(c["n_heads"])
    w.add_head_count_kv(c["n_kv_heads"])
    w.add_rope_freq_base(c["base"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    layer_q, embd_q = (getattr(gguf.GGMLQuantizationType, q) for q in qtypes)
    ref = {}

    def add(name, shape, qtype=None, scale=0.3, ones=False):
        a = (1.0 + 0.05 * rng.standard_normal(shape) if ones else scale * rng.standard_normal(shape)).astype(np.float32)
        if qtype is None:
            w.add_tensor(name, a)
            ref[name] = a
        else:
            q = gguf.quants.quantize(a, qtype)
            w.add_tensor(name, q, raw_dtype=qtype)
            ref[name] = gguf.quants.dequantize(q, qtype).reshape(shape).astype(np.float32)

    add("token_embd.weight", (V, D), embd_q, scale=1.0)
    add("output_norm.weight", (D,), ones=True)
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (D,), ones=True)
        add(p + "ffn_norm.weight", (D,), ones=True)
        add(p + "attn_q.weight", (c["n_heads"] * hd, D), layer_q)
        add(p + "attn_k.weight", (c["n_kv_heads"] * hd, D), layer_q)
        add(p + "attn_v.weight", (c["n_kv_heads"] * hd, D), layer_q)
        add(p + "attn_output.weight", (D, c["n_heads"] * hd), layer_q)
        add(p + "ffn_gate.weight", (c["ffn_dim"], D), layer_q)
        add(p + "ffn_up.weight", (c["ffn_dim"], D), layer_q)
        add(p + "ffn_down.weight", (D, c["ffn_dim"]), layer_q, scale=0.2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


def reference_logits(ref: dict, ids: list) -> np.ndarray:
    """float64 llama forward over all of ``ids`` from position 0: logits (T, V). Written from
    the architecture's definition (RMSNorm, adjacent-pair RoPE, causal GQA, SiLU-gated MLP,
    tied head), independently of ember."""
    c = CFG
    D, hq, hkv = c["dim"], c["n_heads"], c["n_kv_heads"]
    hd = D // hq
    T = len(ids)
    f = {k: v.astype(np.float64) for k, v in ref.items()}

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c["eps"]) * g

    ang = np.arange(T)[:, None] * (c["base"] ** (-np.arange(hd // 2) * 2 / hd))[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):
        a, b = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2], y[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return y

    x = f["token_embd.weight"][ids]
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        h = norm(x, f[p + "attn_norm.weight"])
        q = rope((h @ f[p + "attn_q.weight"].T).reshape(T, hq, hd))
        k = rope((h @ f[p + "attn_k.weight"].T).reshape(T, hkv, hd))
        v = (h @ f[p + "attn_v.weight"].T).reshape(T, hkv, hd)
        out = np.zeros((T, hq, hd))
        for hh in range(hq):
            g = hh // (hq // hkv)
            s = q[:, hh] @ k[:, g].T / np.sqrt(hd)
            s[np.triu_indices(T, 1)] = -np.inf
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            out[:, hh] = s @ v[:, g]
        x = x + out.reshape(T, D) @ f[p + "attn_output.weight"].T
        h = norm(x, f[p + "ffn_norm.weight"])
        gg, u = h @ f[p + "ffn_gate.weight"].T, h @ f[p + "ffn_up.weight"].T
        x = x + (gg / (1 + np.exp(-gg)) * u) @ f[p + "ffn_down.weight"].T
    return norm(x, f["output_norm.weight"]) @ f["token_embd.weight"].T
