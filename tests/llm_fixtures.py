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


def write_tiny_gguf(path, seed: int = 0, qtypes=("Q4_1", "Q8_0"), cfg: dict | None = None,
                    mix: dict | None = None, tokenizer: dict | None = None):
    """Write the tiny model to ``path`` (``cfg`` overrides entries of ``CFG``; ``mix`` maps a
    tensor name to its type, e.g. Q6_K for some layers as llama.cpp's Q4_K_M does;
    ``tokenizer``: GGUF ``tokenizer.*`` keys written instead of the byte-level BPE vocabulary,
    e.g. a SentencePiece one); returns {name: float32 array (dequantized)}."""
    import gguf

    rng = np.random.default_rng(seed)
    c = dict(CFG, **(cfg or {}))
    tokens, merges, types = vocabulary()
    if tokenizer is not None:
        tokens = tokenizer["tokenizer.ggml.tokens"]
    V, D = len(tokens), c["dim"]
    hd = c.get("head_dim") or D // c["n_heads"]
    arch = c.get("arch", "llama")                # "qwen2"/"qwen3"/"gemma*": the rotation over halves of a head
    w = gguf.GGUFWriter(str(path), arch)
    if c.get("head_dim"):                        # (Gemma: heads need not split dim)
        w.add_key_length(hd)
        w.add_value_length(hd)
    if c.get("sliding_window"):                   # Gemma 2/3's local layers
        w.add_uint32(f"{arch}.attention.sliding_window", c["sliding_window"])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):   # (Gemma 2)
        if c.get(key):
            w.add_float32(f"{arch}.{key}", c[key])
    w.add_block_count(c["n_layers"])
    w.add_context_length(c["ctx"])
    w.add_embedding_length(D)
    w.add_feed_forward_length(c["ffn_dim"])
    w.add_head_count(c["n_heads"])
    w.add_head_count_kv(c["n_kv_heads"])
    w.add_rope_freq_base(c["base"])
    if c.get("rope_scaling") is not None:       # (type, factor): llama.{rope.scaling.type, .factor}
        w.add_string(f"{arch}.rope.scaling.type", c["rope_scaling"][0])
        w.add_float32(f"{arch}.rope.scaling.factor", c["rope_scaling"][1])
    w.add_layer_norm_rms_eps(c["eps"])
    if tokenizer is None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(False)
        w.add_chat_template(CHATML)
    for key, value in (tokenizer or {}).items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
    layer_q, embd_q = qtypes
    mix = mix or {}
    ref = {}

    def add(name, shape, qtype=None, scale=0.3, ones=False):
        a = (1.0 + 0.05 * rng.standard_normal(shape) if ones else scale * rng.standard_normal(shape)).astype(np.float32)
        qtype = mix.get(name, qtype)
        if qtype is None:
            w.add_tensor(name, a)
            ref[name] = a
        else:
            q, t = quantize(a, qtype)
            w.add_tensor(name, q, raw_dtype=t)
            ref[name] = gguf.quants.dequantize(q, t).reshape(shape).astype(np.float32)

    add("token_embd.weight", (V, D), embd_q, scale=1.0)
    if c.get("rope_factors") is not None:       # Llama 3.1+'s per-frequency RoPE divisors
        w.add_tensor("rope_freqs.weight", np.asarray(c["rope_factors"], np.float32))
    add("output_norm.weight", (D,), ones=True)
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (D,), ones=True)
        add(p + "ffn_norm.weight", (D,), ones=True)
        add(p + "attn_q.weight", (c["n_heads"] * hd, D), layer_q)
        add(p + "attn_k.weight", (c["n_kv_heads"] * hd, D), layer_q)
        add(p + "attn_v.weight", (c["n_kv_heads"] * hd, D), layer_q)
        if c.get("qkv_bias"):                     # (Qwen2)
            for part, rows in (("q", c["n_heads"]), ("k", c["n_kv_heads"]), ("v", c["n_kv_heads"])):
                add(p + f"attn_{part}.bias", (rows * hd,))
        if c.get("qk_norm"):                      # (Qwen3)
            add(p + "attn_q_norm.weight", (hd,), ones=True)
            add(p + "attn_k_norm.weight", (hd,), ones=True)
        add(p + "attn_output.weight", (D, c["n_heads"] * hd), layer_q)
        if arch in ("gemma2", "gemma3"):           # block outputs normalised before the residual add
            add(p + "post_attention_norm.weight", (D,), ones=True)
            add(p + "post_ffw_norm.weight", (D,), ones=True)
        add(p + "ffn_gate.weight", (c["ffn_dim"], D), layer_q)
        add(p + "ffn_up.weight", (c["ffn_dim"], D), layer_q)
        add(p + "ffn_down.weight", (D, c["ffn_dim"]), layer_q, scale=0.2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


def reference_logits(ref: dict, ids: list, cfg: dict | None = None) -> np.ndarray:
    """float64 llama forward over all of ``ids`` from position 0: logits (T, V). Written from
    the architecture's definition (RMSNorm, adjacent-pair RoPE, causal GQA, SiLU-gated MLP,
    tied head), independently of ember. ``cfg``: as given to ``write_tiny_gguf``.

    Gemma (arch "gemma", "gemma2", "gemma3", from llama.cpp's build_gemma*): embeddings times
    sqrt(dim), halves rotation, GELU (tanh) gate; gemma2/3: post-attention / post-MLP RMSNorms
    before each residual add, a sliding window (``sliding_window``) on layers i with
    i % n < n - 1 (n = 2 for gemma2, 6 for gemma3); gemma2: scores and logits soft-capped
    (``attn_logit_softcapping``, ``final_logit_softcapping``); gemma3: q/k norms (``qk_norm``),
    local layers turned with base 10000 and no scaling. Keys of ``cfg`` set to None/0 switch a
    feature off here only (tests that the reference sees each one)."""
    c = dict(CFG, **(cfg or {}))
    D, hq, hkv = c["dim"], c["n_heads"], c["n_kv_heads"]
    hd = c.get("head_dim") or D // hq
    T = len(ids)
    arch = c.get("arch", "llama")
    gemma = arch.startswith("gemma")
    pattern = {"gemma2": 2, "gemma3": 6}.get(arch, 0)
    f = {k: v.astype(np.float64) for k, v in ref.items()}

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c["eps"]) * g

    inv = c["base"] ** (-np.arange(hd // 2) * 2 / hd)
    if c.get("rope_factors") is not None:       # (llama.cpp: theta / freq_factor)
        inv = inv / np.asarray(c["rope_factors"], np.float64)
    if c.get("rope_scaling") is not None and c["rope_scaling"][0] == "linear":
        inv = inv / c["rope_scaling"][1]         # (positions / factor)
    ang = np.arange(T)[:, None] * inv[None, :]
    tables = {False: (np.cos(ang)[:, None, :], np.sin(ang)[:, None, :])}
    base_local = c.get("base_local", 10000.0 if arch == "gemma3" else None)
    if base_local:                                 # local layers: their own base, unscaled
        ang = np.arange(T)[:, None] * (base_local ** (-np.arange(hd // 2) * 2 / hd))[None, :]
        tables[True] = (np.cos(ang)[:, None, :], np.sin(ang)[:, None, :])

    halves = arch in ("qwen2", "qwen3") or gemma

    def rope(x):
        if halves:                                # feature i turns with feature i + hd/2
            a, b = x[..., :hd // 2], x[..., hd // 2:]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        y = np.empty_like(x)
        y[..., 0::2], y[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return y

    def proj(h, p, part, heads):
        y = h @ f[p + f"attn_{part}.weight"].T
        if p + f"attn_{part}.bias" in f:
            y = y + f[p + f"attn_{part}.bias"]
        y = y.reshape(T, heads, hd)
        if part != "v" and p + f"attn_{part}_norm.weight" in f:
            y = norm(y, f[p + f"attn_{part}_norm.weight"])
        return y

    def post(y, name):                             # (gemma2/3: the block output normalised)
        return norm(y, f[name]) if name in f else y

    x = f["token_embd.weight"][ids]
    if gemma and c.get("embed_scale", True):
        x = x * np.sqrt(D)
    window = c.get("sliding_window") or 0
    cap, final_cap = c.get("attn_logit_softcapping") or 0, c.get("final_logit_softcapping") or 0
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        local = bool(window and pattern and i % pattern < pattern - 1)
        cos, sin = tables[bool(local and base_local)]
        h = norm(x, f[p + "attn_norm.weight"])
        q, k, v = rope(proj(h, p, "q", hq)), rope(proj(h, p, "k", hkv)), proj(h, p, "v", hkv)
        out = np.zeros((T, hq, hd))
        tt, jj = np.arange(T)[:, None], np.arange(T)[None, :]
        masked = (jj > tt) | ((tt - jj >= window) if local else False)
        for hh in range(hq):
            g = hh // (hq // hkv)
            s = q[:, hh] @ k[:, g].T / np.sqrt(hd)
            if cap:
                s = cap * np.tanh(s / cap)
            s[masked] = -np.inf
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            out[:, hh] = s @ v[:, g]
        x = x + post(out.reshape(T, hq * hd) @ f[p + "attn_output.weight"].T, p + "post_attention_norm.weight")
        h = norm(x, f[p + "ffn_norm.weight"])
        gg, u = h @ f[p + "ffn_gate.weight"].T, h @ f[p + "ffn_up.weight"].T
        if gemma:                                  # GELU, tanh approximation
            act = 0.5 * gg * (1 + np.tanh(np.sqrt(2 / np.pi) * (gg + 0.044715 * gg ** 3)))
        else:                                      # SiLU
            act = gg / (1 + np.exp(-gg))
        x = x + post((act * u) @ f[p + "ffn_down.weight"].T, p + "post_ffw_norm.weight")
    logits = norm(x, f["output_norm.weight"]) @ f["token_embd.weight"].T
    return final_cap * np.tanh(logits / final_cap) if final_cap else logits


# ---- K-quants (Q2_K, Q3_K, Q4_K, Q6_K), IQ4_NL, IQ4_XS: gguf dequantizes them, does not quantize
# Plain round-to-nearest quantizers in numpy (llama.cpp searches scales harder; any valid blocks
# do for tests: ember's results are compared with gguf's dequantization of these same blocks).

def _f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def quantize_q4_k(a: np.ndarray) -> np.ndarray:
    """(rows, k) float32, k % 256 == 0 -> (rows, k // 256 * 144) uint8 of Q4_K blocks: per
    block d, dmin (f16), 8 sub-blocks of 32 with 6-bit scales and mins (packed in 12 bytes),
    4-bit quants; x = d * sc * q - dmin * m."""
    rows, k = a.shape
    x = a.reshape(-1, 8, 32).astype(np.float32)                      # (blocks, sub, 32)
    mn = np.minimum(x.min(axis=2), 0.0)
    sc_v = (x.max(axis=2) - mn) / 15.0
    m_v = -mn
    d = _f16(sc_v.max(axis=1) / 63.0)
    dmin = _f16(m_v.max(axis=1) / 63.0)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.where(df > 0, np.rint(sc_v / np.where(df > 0, df, 1)), 0).clip(0, 63).astype(np.uint8)
    m = np.where(dminf > 0, np.rint(m_v / np.where(dminf > 0, dminf, 1)), 0).clip(0, 63).astype(np.uint8)
    step = (df * sc)[:, :, None]
    q = np.where(step > 0, np.rint((x + (dminf * m)[:, :, None]) / np.where(step > 0, step, 1)), 0)
    q = q.clip(0, 15).astype(np.uint8)                               # (blocks, 8, 32)
    scales = np.zeros((x.shape[0], 12), np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)     # sub-blocks 2j (low), 2j+1 (high)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales, qs], axis=1)
    return out.reshape(rows, -1)


def quantize_q6_k(a: np.ndarray) -> np.ndarray:
    """(rows, k) float32, k % 256 == 0 -> (rows, k // 256 * 210) uint8 of Q6_K blocks: 6-bit
    quants (low 4 bits in ql, high 2 in qh), 16 int8 sub-block scales, d (f16)."""
    rows, k = a.shape
    x = a.reshape(-1, 16, 16).astype(np.float32)
    sub = np.abs(x).max(axis=2) / 31.0
    d = _f16(sub.max(axis=1) / 127.0)
    df = d.astype(np.float32)[:, None]
    sc = np.where(df > 0, np.rint(sub / np.where(df > 0, df, 1)), 0).clip(-128, 127).astype(np.int8)
    step = (df * sc.astype(np.float32))[:, :, None]
    q = np.where(step != 0, np.rint(x / np.where(step != 0, step, 1)), 0).clip(-32, 31).astype(np.int32) + 32
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)     # (blocks, half, quarter, l): element 128h + 32j + l
    ql = np.concatenate([(q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4),
                         (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4)], axis=2).reshape(-1, 128)
    qh = ((q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6))
    qh = qh.reshape(-1, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)
    return out.reshape(rows, -1)


def quantize_q3_k(a: np.ndarray) -> np.ndarray:
    """(rows, k) float32, k % 256 == 0 -> (rows, k // 256 * 110) uint8 of Q3_K blocks: hmask
    (32), 2-bit quants (64), 16 6-bit sub-block scales stored + 32 (12 bytes), d (f16);
    x = d * sc * q with q in -4..3 (the high bit set means no -4)."""
    rows, k = a.shape
    x = a.reshape(-1, 16, 16).astype(np.float32)
    far = np.take_along_axis(x, np.abs(x).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
    sub = far / -4.0                                 # signed: the largest magnitude becomes q = -4
    d = _f16(np.abs(sub).max(axis=1) / 31.0)
    df = d.astype(np.float32)[:, None]
    sc = np.where(df > 0, np.rint(sub / np.where(df > 0, df, 1)), 0).clip(-32, 31).astype(np.int32)
    step = (df * sc.astype(np.float32))[:, :, None]
    q = np.where(step != 0, np.rint(x / np.where(step != 0, step, 1)), 0).clip(-4, 3).astype(np.int32) + 4
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)     # (blocks, h, j, l): element 128h + 32j + l
    qs = ((q[:, :, 0] & 3) | ((q[:, :, 1] & 3) << 2) | ((q[:, :, 2] & 3) << 4) | ((q[:, :, 3] & 3) << 6))
    hbits = (q >> 2).reshape(-1, 8, 32)              # bit 4h + j of hmask[l]
    hmask = np.zeros((q.shape[0], 32), np.uint8)
    for i in range(8):
        hmask |= hbits[:, i] << i
    v = (sc + 32).astype(np.uint8)                   # (blocks, 16)
    scales = np.zeros((q.shape[0], 12), np.uint8)
    scales[:, :8] = (v[:, :8] & 15) | ((v[:, 8:] & 15) << 4)
    for g in range(16):
        scales[:, 8 + g % 4] |= (v[:, g] >> 4) << (2 * (g // 4))
    out = np.concatenate([hmask, qs.reshape(-1, 64), scales, d.view(np.uint8).reshape(-1, 2)], axis=1)
    return out.reshape(rows, -1)


def quantize_q2_k(a: np.ndarray) -> np.ndarray:
    """(rows, k) float32, k % 256 == 0 -> (rows, k // 256 * 84) uint8 of Q2_K blocks: 16 bytes
    of 4-bit sub-block scales (low nibble) and mins (high nibble), 2-bit quants (64), d, dmin
    (f16); x = d * sc * q - dmin * m."""
    rows, k = a.shape
    x = a.reshape(-1, 16, 16).astype(np.float32)
    mn = np.minimum(x.min(axis=2), 0.0)
    sc_v, m_v = (x.max(axis=2) - mn) / 3.0, -mn
    d, dmin = _f16(sc_v.max(axis=1) / 15.0), _f16(m_v.max(axis=1) / 15.0)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.where(df > 0, np.rint(sc_v / np.where(df > 0, df, 1)), 0).clip(0, 15).astype(np.uint8)
    m = np.where(dminf > 0, np.rint(m_v / np.where(dminf > 0, dminf, 1)), 0).clip(0, 15).astype(np.uint8)
    step = (df * sc)[:, :, None]
    q = np.where(step > 0, np.rint((x + (dminf * m)[:, :, None]) / np.where(step > 0, step, 1)), 0)
    q = q.clip(0, 3).astype(np.uint8).reshape(-1, 2, 4, 32)          # (blocks, h, j, l)
    qs = (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(-1, 64)
    out = np.concatenate([sc | (m << 4), qs, d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2)],
                         axis=1)
    return out.reshape(rows, -1)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


def _iq4_indices(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The nearest IQ4_VALUES index of each x / step (step broadcast over x's last axis)."""
    t = np.where(step != 0, x / np.where(step != 0, step, 1), 0)
    return np.abs(t[..., None] - IQ4_VALUES).argmin(axis=-1).astype(np.uint8)


def quantize_iq4_nl(a: np.ndarray) -> np.ndarray:
    """(rows, k) float32, k % 32 == 0 -> (rows, k // 32 * 18) uint8 of IQ4_NL blocks: d (f16),
    16 bytes of 4-bit indices into IQ4_VALUES (element j low nibble of byte j, j + 16 high);
    the block's largest magnitude becomes -127 d."""
    rows, k = a.shape
    x = a.reshape(-1, 32).astype(np.float32)
    far = np.take_along_axis(x, np.abs(x).argmax(axis=1)[:, None], axis=1)
    d = _f16(far[:, 0] / -127.0)
    q = _iq4_indices(x, d.astype(np.float32)[:, None])
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), q[:, :16] | (q[:, 16:] << 4)], axis=1)
    return out.reshape(rows, -1)


def quantize_iq4_xs(a: np.ndarray) -> np.ndarray:
    """(rows, k) float32, k % 256 == 0 -> (rows, k // 256 * 136) uint8 of IQ4_XS blocks: d (f16),
    scales_h (u16: 2 high bits per sub-block), scales_l (4 bytes: low nibbles), 8 sub-blocks of
    32 indices as IQ4_NL's; x = d * (ls - 32) * IQ4_VALUES[index]."""
    rows, k = a.shape
    x = a.reshape(-1, 8, 32).astype(np.float32)
    far = np.take_along_axis(x, np.abs(x).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
    sub = far / -127.0
    d = _f16(np.abs(sub).max(axis=1) / 31.0)
    df = d.astype(np.float32)[:, None]
    ls = np.where(df > 0, np.rint(sub / np.where(df > 0, df, 1)), 0).clip(-32, 31).astype(np.int32)
    q = _iq4_indices(x, (df * ls.astype(np.float32))[:, :, None])          # (blocks, 8, 32)
    v = (ls + 32).astype(np.uint16)
    scales_h = np.zeros(x.shape[0], np.uint16)
    for s in range(8):
        scales_h |= (v[:, s] >> 4) << (2 * s)
    scales_l = ((v[:, 0::2] & 15) | ((v[:, 1::2] & 15) << 4)).astype(np.uint8)
    qs = (q[:, :, :16] | (q[:, :, 16:] << 4)).reshape(-1, 128)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), scales_h.view(np.uint8).reshape(-1, 2), scales_l, qs],
                         axis=1)
    return out.reshape(rows, -1)


def quantize(a: np.ndarray, qtype: str):
    """(raw blocks, ggml type) of float32 ``a`` in ``qtype`` (a GGMLQuantizationType name)."""
    import gguf

    t = getattr(gguf.GGMLQuantizationType, qtype)
    if qtype == "Q4_K":
        return quantize_q4_k(a), t
    if qtype == "Q6_K":
        return quantize_q6_k(a), t
    if qtype == "Q3_K":
        return quantize_q3_k(a), t
    if qtype == "Q2_K":
        return quantize_q2_k(a), t
    if qtype == "IQ4_NL":
        return quantize_iq4_nl(a), t
    if qtype == "IQ4_XS":
        return quantize_iq4_xs(a), t
    return gguf.quants.quantize(a, t), t


def eager_and_compiled_decode(path, seed: int, steps: int = 6):
    """A tiny Llama (``write_tiny_gguf(path, seed=seed)``) on numpy: the logits of a 7-token
    prompt and of ``steps`` greedy one-token steps from an eager model and from a twin's
    ``ember.compile``d step, and that compiled step (both lists of numpy arrays)."""
    import ember
    from ember.nn.llama import Llama

    write_tiny_gguf(path, seed=seed)
    g = ember.load_gguf(str(path))
    T = lambda v: ember.tensor(v, dtype="int32", device="numpy")   # noqa: E731
    models = [Llama.from_gguf(g, device="numpy", context=64) for _ in range(2)]
    step = ember.compile(lambda ids, pos: models[1].forward(ids, pos))
    prompt = [5, 9, 77, 3, 120, 44, 8]
    outs = [[m.forward(T(prompt), T([0])).numpy()] for m in models]
    p = len(prompt)
    for _ in range(steps):
        tok = int(outs[0][-1].argmax())
        outs[0].append(models[0].forward(T([tok]), T([p])).numpy())
        outs[1].append(step(T([tok]), T([p])).numpy())
        p += 1
    return outs[0], outs[1], step, models[1]
