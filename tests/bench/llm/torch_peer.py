"""PyTorch peer of ember.llm in ``python build.py bench llm``: a hand-written llama decode over
the GGUF file's weights dequantized to float (written by the bench into an .npz), with a static
KV cache; eager, and on CUDA also replayed as one CUDA graph per token. Needs torch and numpy
only (the bench runs it with the interpreter named by --torch-python); imports nothing from ember.

    python torch_peer.py job.json out.json

job: {"weights": .npz of float32 arrays named as in the GGUF, "config": {"n_layer", "n_embd",
"n_head", "n_head_kv", "rope_base", "eps"}, "prompt_ids": [int], "max_tokens": int,
"device": "cuda" | "cpu" | "auto" (cuda when there is one), "dtypes": ["float32", "bfloat16"] or
"auto" (both on CUDA, float32 on the CPU), "graphs": bool, "threads": int,
"cache_len": int, "eos_ids": [int]}
out: {"version", "device", "device_name", "rows": [{"mode": "eager" | "cuda graph", "dtype",
"prompt_tokens", "prefill_ms", "prompt_tps", "tokens", "decode_ms", "decode_tps", "ids"}]}

The model (llama as GGUF stores it): x = token_embd[id]; per layer h = x + Wo·attn(rms(x)·a),
x = h + Wdown·(silu(Wgate·rms(h)·f) * Wup·rms(h)·f); logits = (token_embd or output)·rms(x)·o.
RoPE rotates adjacent pairs (x[2i], x[2i+1]) (the GGUF converter permuted Q/K rows into that
order). Grouped-query attention: query head h reads kv head h // (n_head / n_head_kv).

Prompt: one batched forward over the prompt (causal attention), its last logits give the first
new token. Decode: one step per further token (the step feeds the previous token, writes its
K/V into the cache at row pos and attends over rows 0..pos through a mask, so the step's shapes
never change and it can be captured). Tokens stay on the device: no host sync per token, so
the run always makes max_tokens tokens and the ids are cut at the first end-of-generation
token afterwards. decode tok/s = (max_tokens - 1) / time of those steps.
"""
from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    import numpy as np
    import torch
    import torch.nn.functional as F

    job = json.loads(open(argv[0], encoding="utf-8").read())
    cfg = job["config"]
    want = job.get("device", "auto")
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if want == "auto" else want)
    dtypes = job.get("dtypes", "auto")
    if dtypes == "auto":
        dtypes = ["float32", "bfloat16"] if dev.type == "cuda" else ["float32"]
    if dev.type == "cpu" and job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    L, E, Hq, Hkv = cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["n_head_kv"]
    D = E // Hq
    C = int(job.get("cache_len", 1024))
    eos = set(job.get("eos_ids", []))
    prompt = job["prompt_ids"]
    n_new = int(job["max_tokens"])
    if len(prompt) + n_new > C:
        raise SystemExit(f"torch_peer: prompt {len(prompt)} + {n_new} tokens exceed the cache of {C}")
    npz = np.load(job["weights"])
    out = {"version": torch.__version__, "device": str(dev),
           "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "threads": torch.get_num_threads() if dev.type == "cpu" else None, "rows": []}

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for dtype_name in dtypes:
        dt = getattr(torch, dtype_name)

        def w(name):
            return torch.from_numpy(np.ascontiguousarray(npz[name])).to(dev, dt)

        emb = w("token_embd.weight")                      # (vocab, E)
        head = w("output.weight") if "output.weight" in npz.files else emb
        out_norm = w("output_norm.weight")
        layers = []
        for i in range(L):
            p = f"blk.{i}."
            layers.append({k: w(p + k + ".weight") for k in (
                "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                "ffn_up", "ffn_down")})
        inv = 1.0 / (cfg["rope_base"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        ang = torch.arange(C, dtype=torch.float64)[:, None] * inv[None, :]
        cos_t, sin_t = ang.cos().to(dev, dt), ang.sin().to(dev, dt)     # (C, D/2)
        k_cache = torch.zeros(L, 1, Hkv, C, D, device=dev, dtype=dt)
        v_cache = torch.zeros_like(k_cache)
        eps = cfg["eps"]

        def rms(x, g):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(dt) * g

        def rope(x, cos, sin):            # x (T, H, D); cos/sin (T, D/2)
            xp = x.unflatten(-1, (D // 2, 2))
            a, b = xp[..., 0], xp[..., 1]
            c, s = cos[:, None, :], sin[:, None, :]
            return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)

        def forward(ids, pos, mask):
            """ids (T,) int64 on the device, pos (T,) int64 cache rows, mask (1, 1, T, C) bool
            or None (then causal over rows 0..T-1, pos = arange(T))."""
            T = ids.shape[0]
            x = emb.index_select(0, ids)
            cos, sin = cos_t.index_select(0, pos), sin_t.index_select(0, pos)
            for li, ly in enumerate(layers):
                hn = rms(x, ly["attn_norm"])
                q = rope((hn @ ly["attn_q"].T).view(T, Hq, D), cos, sin)
                k = rope((hn @ ly["attn_k"].T).view(T, Hkv, D), cos, sin)
                v = (hn @ ly["attn_v"].T).view(T, Hkv, D)
                k_cache[li, 0].index_copy_(1, pos, k.transpose(0, 1))
                v_cache[li, 0].index_copy_(1, pos, v.transpose(0, 1))
                qh = q.transpose(0, 1)[None]                      # (1, Hq, T, D)
                if mask is None:
                    kk, vv = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
                    a = F.scaled_dot_product_attention(qh, kk, vv, is_causal=True, enable_gqa=True)
                else:
                    a = F.scaled_dot_product_attention(qh, k_cache[li], v_cache[li], attn_mask=mask,
                                                       enable_gqa=True)
                x = x + a[0].transpose(0, 1).reshape(T, E) @ ly["attn_output"].T
                hn = rms(x, ly["ffn_norm"])
                x = x + (F.silu(hn @ ly["ffn_gate"].T) * (hn @ ly["ffn_up"].T)) @ ly["ffn_down"].T
            return rms(x[-1:], out_norm) @ head.T                  # (1, vocab)

        rows_c = torch.arange(C, device=dev)
        tok_buf = torch.zeros(1, dtype=torch.long, device=dev)
        pos_buf = torch.zeros(1, dtype=torch.long, device=dev)
        ids_buf = torch.zeros(n_new, dtype=torch.long, device=dev)
        step_buf = torch.zeros(1, dtype=torch.long, device=dev)

        def step():
            """One decode step on the static buffers: token tok_buf at row pos_buf -> the next
            token, stored at ids_buf[step_buf]; then the buffers advance."""
            mask = (rows_c <= pos_buf)[None, None, None, :]
            nxt = forward(tok_buf, pos_buf, mask).argmax(-1)
            ids_buf.index_copy_(0, step_buf, nxt)
            tok_buf.copy_(nxt)
            pos_buf.add_(1)
            step_buf.add_(1)

        def prefill():
            ids = torch.tensor(prompt, dtype=torch.long, device=dev)
            logits = forward(ids, torch.arange(len(prompt), device=dev), None)
            first = logits.argmax(-1)
            ids_buf[0:1].copy_(first)
            tok_buf.copy_(first)
            pos_buf.fill_(len(prompt))
            step_buf.fill_(1)

        def run(decode):
            sync()
            t0 = time.perf_counter()
            prefill()
            sync()
            t1 = time.perf_counter()
            for _ in range(n_new - 1):
                decode()
            sync()
            t2 = time.perf_counter()
            ids = ids_buf.tolist()
            cut = next((i + 1 for i, t in enumerate(ids) if t in eos), len(ids))
            return {"dtype": dtype_name, "prompt_tokens": len(prompt), "prefill_ms": (t1 - t0) * 1e3,
                    "prompt_tps": len(prompt) / (t1 - t0), "tokens": n_new, "decode_ms": (t2 - t1) * 1e3,
                    "decode_tps": (n_new - 1) / (t2 - t1) if n_new > 1 else None, "ids": ids[:cut]}

        with torch.inference_mode():
            run(step)                      # warm-up: kernels, cuBLAS handles, allocator
            r = dict(run(step), mode="eager")
            out["rows"].append(r)
            print(f"torch {dev} {dtype_name} eager: prompt {r['prompt_tps']:.1f} tok/s, decode "
                  f"{r['decode_tps'] or 0:.1f} tok/s", flush=True)
            if job.get("graphs") and dev.type == "cuda":
                try:
                    prefill()
                    s = torch.cuda.Stream(dev)
                    s.wait_stream(torch.cuda.current_stream(dev))
                    with torch.cuda.stream(s):
                        for _ in range(3):
                            step()
                    torch.cuda.current_stream(dev).wait_stream(s)
                    prefill()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step()
                    run(graph.replay)          # warm-up replays
                    g = dict(run(graph.replay), mode="cuda graph")
                    g["same_ids_as_eager"] = g["ids"] == r["ids"]
                    out["rows"].append(g)
                    print(f"torch {dev} {dtype_name} cuda graph: prompt {g['prompt_tps']:.1f} tok/s, decode "
                          f"{g['decode_tps'] or 0:.1f} tok/s (ids as eager: {g['same_ids_as_eager']})", flush=True)
                    del graph
                except Exception as e:     # the eager row still counts
                    out["rows"].append({"mode": "cuda graph", "dtype": dtype_name,
                                        "error": f"{type(e).__name__}: {str(e)[:300]}"})
                    print(f"torch cuda graph failed: {type(e).__name__}: {e}", flush=True)
        del layers, emb, head, k_cache, v_cache
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    with open(argv[1], "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
