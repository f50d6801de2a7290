"""ember.llm's decode/prefill loop on a SmolLM2-135M-shaped llama with random weights (for a GPU
machine where the real 98 MB file cannot travel). Writes a GGUF of random Q4_1 layer blocks and
a Q8_0 tied token_embd (30 layers, dim 576, 9/3 heads, ffn 1536, vocab 49152), loads it with
``ember.load_gguf`` + ``Llama.from_gguf`` and runs the same steps as ``ember.llm.LLM._loop``:
prefill in PREFILL_CHUNK batches, then one replay of the compiled argmax step per token. Prints
decode tok/s, prefill tok/s, and per token the host time of the step call vs the wait for its
4-byte argmax read-back. Optionally writes a float .npz + job for torch_peer.py.

    python tests/bench/llm/h200_smol_shape.py --device webgpu --out /tmp/smol [--torch-job]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

CFG = dict(n_layers=30, dim=576, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab=49152, base=100000.0, eps=1e-5)


def shapes():
    c = CFG
    hd = c["dim"] // c["n_heads"]
    yield "token_embd.weight", (c["vocab"], c["dim"]), "Q8_0"
    yield "output_norm.weight", (c["dim"],), None
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", (c["dim"],), None
        yield p + "ffn_norm.weight", (c["dim"],), None
        yield p + "attn_q.weight", (c["n_heads"] * hd, c["dim"]), "Q4_1"
        yield p + "attn_k.weight", (c["n_kv_heads"] * hd, c["dim"]), "Q4_1"
        yield p + "attn_v.weight", (c["n_kv_heads"] * hd, c["dim"]), "Q4_1"
        yield p + "attn_output.weight", (c["dim"], c["n_heads"] * hd), "Q4_1"
        yield p + "ffn_gate.weight", (c["ffn_dim"], c["dim"]), "Q4_1"
        yield p + "ffn_up.weight", (c["ffn_dim"], c["dim"]), "Q4_1"
        yield p + "ffn_down.weight", (c["dim"], c["ffn_dim"]), "Q4_1"


def random_blocks(rng, n, k, qtype):
    """Random raw blocks: Q4_1 = f16 d, f16 m, 16 nibble bytes; Q8_0 = f16 d, 32 int8."""
    nb = k // 32
    if qtype == "Q4_1":
        b = rng.integers(0, 256, (n, nb, 20), dtype=np.uint8)
        b[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        b[..., 2:4] = np.frombuffer(np.float16(-0.075).tobytes(), np.uint8)
    else:
        b = rng.integers(0, 256, (n, nb, 34), dtype=np.uint8)
        b[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return b.reshape(n, nb * b.shape[-1])


def write_gguf(path: Path, seed: int = 0) -> None:
    import gguf

    rng = np.random.default_rng(seed)
    c = CFG
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c["n_layers"]); w.add_context_length(2048); w.add_embedding_length(c["dim"])
    w.add_feed_forward_length(c["ffn_dim"]); w.add_head_count(c["n_heads"]); w.add_head_count_kv(c["n_kv_heads"])
    w.add_rope_freq_base(c["base"]); w.add_layer_norm_rms_eps(c["eps"])
    for name, shape, q in shapes():
        if q is None:
            w.add_tensor(name, (1.0 + 0.05 * rng.standard_normal(shape)).astype(np.float32))
        else:
            w.add_tensor(name, random_blocks(rng, shape[0], shape[1], q),
                         raw_dtype=getattr(gguf.GGMLQuantizationType, q))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()


def run(device: str, path: Path, n_prompt: int, n_new: int, n_prefill: int, feedback: bool = False) -> dict:
    import ember
    from ember import ops as F
    from ember.io.gguf import load_gguf
    from ember.llm import PREFILL_CHUNK
    from ember.nn.llama import Llama
    from ember.tensor import tensor

    t = time.perf_counter()
    m = Llama.from_gguf(load_gguf(str(path)), device=device, context=1024)
    out = {"load_s": time.perf_counter() - t}
    step = ember.compile(lambda ids, pos: F.llm.greedy_tokens(m.forward(ids, pos)))   # as ember.llm's step
    rng = np.random.default_rng(1)

    def prefill(ids):
        t0 = time.perf_counter()
        for s in range(0, len(ids), PREFILL_CHUNK):
            lg = m.forward(tensor(ids[s:s + PREFILL_CHUNK], dtype="int32", device=device),
                           tensor([s], dtype="int32", device=device))
        tok = int(np.argmax(lg.tolist()[0]))
        return tok, time.perf_counter() - t0

    def decode(tok, pos, n):
        t_call = t_read = 0.0
        toks = []
        for _ in range(n):
            a = time.perf_counter()
            r = step(tensor([tok], dtype="int32", device=device), tensor([pos], dtype="int32", device=device))
            b = time.perf_counter()
            tok = int(r.tolist()[0])
            c = time.perf_counter()
            t_call += b - a; t_read += c - b
            toks.append(tok); pos += 1
        return toks, t_call, t_read

    def decode_fed(tok, pos, n):
        """The token stays on the GPU: each step is fed the previous step's argmax tensor (its
        range is known, so the embedding's guard needs no read) and the tokens are read once at
        the end: the host encodes step t+1 while the GPU runs step t."""
        r = tensor([tok], dtype="int32", device=device)
        outs = []
        for _ in range(n):
            r = step(r, tensor([pos], dtype="int32", device=device))
            outs.append(r)
            pos += 1
        return [int(o.tolist()[0]) for o in outs]

    # warm-up: compile the step, the prefill shapes
    tok, out["warm_prefill_s"] = prefill(rng.integers(0, CFG["vocab"], 20).tolist())
    t = time.perf_counter(); decode(tok, 20, 3); out["warm_decode3_s"] = time.perf_counter() - t
    for label, n in (("short", n_prompt), ("long", n_prefill)):
        ids = rng.integers(0, CFG["vocab"], n).tolist()
        tok, tp = prefill(ids)
        out[f"prefill_{label}"] = {"tokens": n, "s": tp, "tok_s": n / tp}
    ids = rng.integers(0, CFG["vocab"], n_prompt).tolist()
    tok, tp = prefill(ids)
    rt = timer = None
    if device == "webgpu":
        from ember.webgpu.runtime import get_runtime

        rt = get_runtime()
        rt.reset_stats()
        timer = _timer(rt)
        if timer is not None:
            timer.start()
    w = time.perf_counter()
    toks, t_call, t_read = decode(tok, n_prompt, n_new - 1)
    wall = time.perf_counter() - w
    steps = n_new - 1
    out["decode"] = {"steps": steps, "wall_s": wall, "tok_s": steps / wall, "ms_per_tok": 1e3 * wall / steps,
                     "host_call_ms_per_tok": 1e3 * t_call / steps, "readback_wait_ms_per_tok": 1e3 * t_read / steps,
                     "first_ids": toks[:8], "ids": toks}
    if rt is not None:
        d = out["decode"]
        d["reads_per_tok"] = rt.stats["reads"] / steps
        d["dispatches_per_tok"] = rt.stats["dispatches"] / steps
        d["host_us_per_dispatch"] = 1e3 * d["host_call_ms_per_tok"] / max(d["dispatches_per_tok"], 1)
        if timer is not None:
            g = timer.seconds()
            d["gpu_ms_per_tok"] = None if g is None else 1e3 * g / steps
            d["gpu_passes_per_tok"] = timer.passes() / steps
            if g is not None and g > wall * 1.05:
                d["BENCHMARK_FAILURE"] = f"GPU time {g:.3f} s > wall {wall:.3f} s"
            # the fed loops below run as users' do: no timestamps around every pass (and replays
            # may take prebuilt command buffers, which a timer turns off)
            rt.driver.timer = None
        plan = step.plan_for(tensor([tok], dtype="int32", device=device), tensor([0], dtype="int32", device=device))
        fast = getattr(plan, "fast", None)
        d["replay"] = fast.describe() if hasattr(fast, "describe") else str(fast)
    if device == "webgpu" and feedback:
        decode_fed(tok, 20, 3)       # warm-up: the step's plan for int64 ids
        tok, tp = prefill(ids)
        w = time.perf_counter()
        fed = decode_fed(tok, n_prompt, n_new - 1)
        wall_f = time.perf_counter() - w
        out["decode_fed"] = {"steps": steps, "wall_s": wall_f, "tok_s": steps / wall_f,
                             "ms_per_tok": 1e3 * wall_f / steps, "same_ids": fed == toks}
        # ember.llm's own loop (LLM._fed_tokens: batches of 2, 4 .. RUN_AHEAD steps, one read each)
        import ember.llm as L

        class _Host:
            device = "webgpu"
        tok, tp = prefill(ids)
        rt.reset_stats()
        timer_s = [0.0]
        # and its choice of step by position: below quant.decode_split_from's position the step
        # recorded with attention unsplit (where a GPU's rule splits it), the split one after
        from ember.webgpu.quant import decode_split_from

        split_from = decode_split_from(CFG["n_heads"], m.context)
        short = None if split_from is None else \
            L._Unsplit(ember.compile(lambda ids, pos: F.llm.greedy_tokens(m.forward(ids, pos))))
        if short is not None:    # (its capture, outside the timing)
            # (int64 ids, as _fed_tokens feeds: another input signature would be a capture of its own)
            short(tensor([tok], dtype="int64", device=device), tensor([n_prompt], dtype="int32", device=device)).tolist()
            tok, tp = prefill(ids)
            rt.reset_stats()
        w = time.perf_counter()
        got = list(L.LLM._fed_tokens(_Host(), lambda p: short if short is not None and p < split_from else step,
                                     tok, n_prompt, steps, timer_s))
        wall_l = time.perf_counter() - w
        out["decode_llm"] = {"steps": steps, "run_ahead": L.RUN_AHEAD, "split_from": split_from, "wall_s": wall_l, "tok_s": steps / wall_l,
                             "ms_per_tok": 1e3 * wall_l / steps, "reads": rt.stats["reads"],
                             "dispatches_per_tok": rt.stats["dispatches"] / steps, "same_ids": got == toks}
    return out


def _timer(rt):
    """bench_webgpu's PassTimer (GPU timestamps of every pass, summed), None where unavailable."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    try:
        from bench_webgpu import PassTimer
    except ImportError:
        return None
    if getattr(rt.driver, "timer", None) is not None:
        return rt.driver.timer
    return PassTimer.install(rt)


def torch_job(dirp: Path, n_prompt: int, n_new: int) -> Path:
    rng = np.random.default_rng(0)
    arrs = {}
    for name, shape, q in shapes():
        arrs[name] = ((1.0 + 0.05 * rng.standard_normal(shape)) if q is None else
                      0.05 * rng.standard_normal(shape)).astype(np.float32)
    np.savez(dirp / "w.npz", **arrs)
    c = CFG
    job = {"weights": str(dirp / "w.npz"), "config": {"n_layer": c["n_layers"], "n_embd": c["dim"],
           "n_head": c["n_heads"], "n_head_kv": c["n_kv_heads"], "rope_base": c["base"], "eps": c["eps"]},
           "prompt_ids": rng.integers(0, c["vocab"], n_prompt).tolist(), "max_tokens": n_new, "device": "auto",
           "dtypes": "auto", "graphs": True, "cache_len": 1024, "eos_ids": []}
    p = dirp / "job.json"
    p.write_text(json.dumps(job))
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="webgpu")
    ap.add_argument("--out", default="/tmp/smol")
    ap.add_argument("--prompt", type=int, default=20)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prefill", type=int, default=200)
    ap.add_argument("--torch-job", action="store_true", help="also write w.npz + job.json for torch_peer.py")
    ap.add_argument("--feedback", action="store_true",
                    help="webgpu: also decode with each token fed back on the GPU, read at the end")
    ap.add_argument("--compare-steps", action="store_true",
                    help="webgpu: also decode with EMBER_WEBGPU_STREAM off (step-by-step replay) and compare ids")
    a = ap.parse_args()
    d = Path(a.out); d.mkdir(parents=True, exist_ok=True)
    if a.torch_job:
        print("torch job:", torch_job(d, a.prompt, a.new), flush=True)
    p = d / "smol_shape.gguf"
    t = time.perf_counter(); write_gguf(p)
    print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB) in {time.perf_counter() - t:.1f} s", flush=True)
    res = run(a.device, p, a.prompt, a.new, a.prefill, feedback=a.feedback)
    print(json.dumps(res, indent=1), flush=True)
    if a.compare_steps and a.device == "webgpu":
        from ember.webgpu import replay

        replay.ENABLED = False
        steps = run(a.device, p, a.prompt, a.new, a.prefill)
        print("step-by-step replay:", json.dumps(steps["decode"], indent=1), flush=True)
        print("same ids (stream vs step by step):", steps["decode"]["ids"] == res["decode"]["ids"], flush=True)


if __name__ == "__main__":
    main()
