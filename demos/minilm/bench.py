#!/usr/bin/env python3
"""MiniLM natively: embedding speed on each ember backend, side by side with PyTorch, and the
agreement with the committed PyTorch embeddings (host side; not part of the page).

    python demos/minilm/bench.py [--devices python,numpy,webgpu] [--repeat 3]

Per backend: model load time, ms per sentence one at a time (median over the sentences of
golden_embeddings.json, each the median of --repeat runs), ms for all of them in one call
(padded batches), the worst cosine / max |diff| against PyTorch with the same float16-rounded
weights. PyTorch (sentence-transformers, CPU, float32) runs the same sentences when installed;
the ratio column is ember's time over PyTorch's. The pure-Python backend gets two short
sentences only (it takes about half a second per token).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import model as minilm  # noqa: E402
import prepare  # noqa: E402
from tokenizer import Tokenizer  # noqa: E402

GOLDEN = json.loads((HERE / "golden_embeddings.json").read_text(encoding="utf-8"))
SHORT = [0, 7]


def _ms(fn, repeat):
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return statistics.median(out)


def bench_ember(device, tok, weights, repeat):
    t = time.perf_counter()
    net = minilm.load_model(weights, device)
    load_s = time.perf_counter() - t
    idx = SHORT if device == "python" else list(range(len(GOLDEN["texts"])))
    texts = [GOLDEN["texts"][i] for i in idx]
    minilm.embed(net, tok, texts[:1], device)                      # warm-up (kernel compiles)
    one = statistics.median(_ms(lambda s=s: minilm.embed(net, tok, [s], device), repeat) for s in texts)
    got = None

    def batch():
        nonlocal got
        got = minilm.embed(net, tok, texts, device)
    all_ms = _ms(batch, 1 if device == "python" else repeat)
    want = [GOLDEN["f16w"][i] for i in idx]
    cos = min(minilm.cosine(a, b) for a, b in zip(got, want))
    diff = max(abs(x - y) for a, b in zip(got, want) for x, y in zip(a, b))
    return {"load_s": load_s, "one_ms": one, "all_ms": all_ms, "n": len(texts), "cos": cos, "diff": diff}


def bench_torch(repeat):
    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer
        path = prepare._installed()
    except ImportError:
        return None
    if path is None:
        return None
    torch.set_grad_enabled(False)
    t = time.perf_counter()
    st = SentenceTransformer(str(path.parent), device="cpu")
    load_s = time.perf_counter() - t
    texts = GOLDEN["texts"]
    st.encode(texts[:1])
    one = statistics.median(_ms(lambda s=s: st.encode([s]), repeat) for s in texts)
    all_ms = _ms(lambda: st.encode(texts), repeat)
    return {"load_s": load_s, "one_ms": one, "all_ms": all_ms, "n": len(texts),
            "threads": torch.get_num_threads()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", default="python,numpy,webgpu")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    if not os.environ.get("XDG_RUNTIME_DIR"):   # Mesa's lavapipe warns without one
        d = tempfile.mkdtemp(prefix="ember-xdg-")
        os.chmod(d, 0o700)
        os.environ["XDG_RUNTIME_DIR"] = d
    weights = prepare.prepare()
    tok = Tokenizer.from_file(HERE / "vocab.txt")
    rows = {}
    for dev in a.devices.split(","):
        try:
            rows[dev] = bench_ember(dev, tok, weights, a.repeat)
        except Exception as e:  # a backend missing here is reported, not fatal
            print(f"{dev}: skipped ({type(e).__name__}: {str(e).splitlines()[0]})")
    ref = bench_torch(a.repeat)
    print(f"\nall-MiniLM-L6-v2, ms per sentence (one at a time, median over the sentences) and for "
          f"all of them in one call; vs PyTorch with the same weights")
    print(f"{'backend':<10} {'load s':>7} {'ms/sentence':>12} {'all (n)':>14} {'x torch':>8}  agreement")
    for dev, r in rows.items():
        ratio = f"{r['one_ms'] / ref['one_ms']:.1f}" if ref else "-"
        print(f"{dev:<10} {r['load_s']:7.2f} {r['one_ms']:12.1f} {r['all_ms']:10.1f} ({r['n']}) {ratio:>8}  "
              f"min cos {r['cos']:.9f}, max |d| {r['diff']:.1e}")
    if ref:
        print(f"{'torch cpu':<10} {ref['load_s']:7.2f} {ref['one_ms']:12.1f} {ref['all_ms']:10.1f} ({ref['n']}) "
              f"{1.0:8.1f}  (sentence-transformers, {ref['threads']} threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
