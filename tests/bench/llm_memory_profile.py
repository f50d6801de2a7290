"""Memory a loaded SmolLM2 holds on device "wasm" inside Pyodide under Node, with and without the
thread team (issue 18: resident memory <= 1.3x the file), and the speed and tokens of a greedy
reply next to it.

    python tests/bench/llm_memory_profile.py [--threads=2] [--files=q4_1] [--tokens=128] [--root=DIR]

One process per call (Pyodide's heap never shrinks: its size is a high-water mark). Inside, the
chat page's set-up: ``await ember.wasm.init()``, ``ember.llm.load(path, context=2048)``,
``warm_up()``, then a greedy reply to the 21-token ChatML prompt (bench_llm's "short" one) and to
the ~200-token one. Printed: the heap's growth over the load and over load + warm-up, the team's
shared memory (``ember.wasm.info()['shared_memory_bytes']``: weights that live there, the KV cache,
tables, intermediates), their sum over the file size, prompt and decode tok/s, and a hash of the
reply's token ids. ``--root``: another checkout (e.g. ``git archive HEAD`` unpacked) to measure
instead of this one.
"""
from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else "."


def host_main(argv) -> int:
    sys.path.insert(0, HERE)
    from bench_wasm import run_llm_script

    return run_llm_script(os.path.abspath(__file__), argv, _arg(argv, "root", None))


def _arg(argv, name, default):
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), default)


def wait_threads(n):
    import ember.wasm as EW
    EW.set_threads(n)
    end = time.monotonic() + 10
    while EW.threads() < n and time.monotonic() < end:
        time.sleep(0.01)


_PROMPT = [None]


def chat_prompt() -> str:
    """bench_llm's long prompt in ChatML (``bench_llm.chatml_prompt``, passed in by the host side
    as ``--prompt=``: Node's Pyodide has no jinja2)."""
    if _PROMPT[0] is None:
        raise SystemExit("llm_memory_profile: no --prompt= (run it from CPython: the host side passes it)")
    return _PROMPT[0]


SHORT = "<|im_start|>user\nTell me a story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"


def guest_main(argv) -> None:
    import hashlib

    import pyodide_js

    import ember.llm
    import ember.wasm as EW

    _PROMPT[0] = _arg(argv, "prompt", None)
    n = int(_arg(argv, "threads", "2"))
    kind = _arg(argv, "files", "q4_1")
    n_tok = int(_arg(argv, "tokens", "128"))
    path = _arg(argv, f"llm-{kind}", None)
    wait_threads(n)
    heap = lambda: int(pyodide_js._module.HEAP8.length)  # noqa: E731
    info = EW.info()
    shared0 = info.get("shared_memory_bytes", 0)
    size = os.path.getsize(path)
    if _arg(argv, "kv-chunk", None):
        from ember.nn import llama
        llama.KV_CHUNK = int(_arg(argv, "kv-chunk", None))
    if "--decode-ab" in argv:   # one process: weights in Python (copied into the team's memory by
        # its tables, as before) vs moved, alternating; the team forced (2 threads), then one thread
        import ember
        from ember.wasm import team as T
        EW.set_threads(1)
        old = ember.llm.load(path, device="wasm", context=2048)
        wait_threads(n)
        new = ember.llm.load(path, device="wasm", context=2048)
        ids = old.tokenizer.encode(SHORT)
        for threads in (n, 1):
            EW.set_threads(threads)
            t = T.team(create=False)
            if t is not None:
                t.adaptive = False
            rates, outs = {"python weights": [], "moved": []}, {}
            for m in (old, new):   # the tables recorded for this thread count
                m.generate(ids, max_tokens=4)
            for _ in range(4):
                for key, m in (("python weights", old), ("moved", new)):
                    outs[key] = m.generate(ids, max_tokens=96)
                    rates[key].append(m.stats["decode_tokens_per_second"])
            print(f"   decode, {threads} thread(s), tok/s max/median of 4: " + ", ".join(
                f"{k} {max(v):.1f} / {sorted(v)[2]:.1f}" for k, v in rates.items())
                + f"; same text: {outs['python weights'] == outs['moved']}")
        return
    if "--prefill-ab" in argv:   # one process: weights in Python (no team) vs moved (team), alternating
        import ember
        EW.set_threads(1)
        py_model = ember.llm.load(path, device="wasm", context=2048)
        wait_threads(n)
        moved_model = ember.llm.load(path, device="wasm", context=2048)
        for m in (py_model, moved_model):
            m._reserve(512, warm=False)
        times = {"python": [], "moved": []}
        for name, prompt in (("short", SHORT), ("long", chat_prompt())):
            ids = model_ids = py_model.tokenizer.encode(prompt)
            x = ember.tensor(model_ids, dtype="int32", device="wasm")
            p0 = ember.tensor([0], dtype="int32", device="wasm")
            times = {"python": [], "moved": []}
            outs = {}
            for _ in range(6):
                for key, m in (("python", py_model), ("moved", moved_model)):
                    t = time.perf_counter()
                    outs[key] = m.model.forward(x, p0).tolist()
                    times[key].append((time.perf_counter() - t) * 1000)
            print(f"   prefill {name} ({len(ids)} tok), one thread each, ms min/median of 6: " + ", ".join(
                f"{k} {min(v):.1f} / {sorted(v)[3]:.1f}" for k, v in times.items())
                + f"; same logits: {outs['python'] == outs['moved']}")
        return
    h0 = heap()
    t0 = time.perf_counter()
    model = ember.llm.load(path, device="wasm", context=2048)
    t_load = time.perf_counter() - t0
    h1 = heap()
    if "--detail" in argv:   # the heap after each part of warm_up
        from ember import tensor
        marks = [("load", h1)]
        model._reserve(17)
        marks.append(("kv", heap()))
        model.model.forward(tensor([1], dtype="int32", device="wasm"), tensor([0], dtype="int32", device="wasm"))
        marks.append(("eager forward", heap()))
        _, step = model._steps()
        for pos in range(1, 17):
            step(tensor([1], dtype="int32", device="wasm"), tensor([pos], dtype="int32", device="wasm")).tolist()
            marks.append((f"step {pos}", heap()))
        print("   heap growth after: " + ", ".join(f"{k} {(v - h0) / 1e6:.1f}" for k, v in marks))
    warm = model.warm_up()
    h2 = heap()
    shared = EW.info().get("shared_memory_bytes", 0) - shared0
    print(f"== {kind} threads={n} (team threads {EW.threads()}): file {size / 1e6:.1f} MB, load {t_load:.1f} s, "
          f"warm {warm['ms']:.0f} ms")
    print(f"   heap growth: load {(h1 - h0) / 1e6:.1f} MB, load+warm {(h2 - h0) / 1e6:.1f} MB; shared memory "
          f"{shared / 1e6:.1f} MB; total {(h2 - h0 + shared) / 1e6:.1f} MB = {(h2 - h0 + shared) / size:.2f}x the file")
    if "--prefill" in argv:   # the prompt alone, 8 times each: the fastest
        best = {}
        for _ in range(8):
            for name, prompt in (("short", SHORT), ("long", chat_prompt())):
                ids = model.tokenizer.encode(prompt)
                model.generate(ids, max_tokens=1)
                best.setdefault(name, []).append(model.stats["prefill_ms"])
        print("   prefill ms (min / median of 8): " + ", ".join(
            f"{k} {min(v):.1f} / {sorted(v)[4]:.1f}" for k, v in best.items()))
        return
    for name, prompt in (("short", SHORT), ("long", chat_prompt())) * 2:
        ids = model.tokenizer.encode(prompt)
        out = model.tokenizer.encode(model.generate(ids, max_tokens=n_tok))
        s = model.stats
        print(f"   {name} ({len(ids)} tok): prompt {s['prompt_tokens_per_second']:.1f} tok/s, decode "
              f"{s['decode_tokens_per_second']:.1f} tok/s, {s['tokens']} tokens, threads {s.get('threads')}, grow {s.get('grow_ms', 0):.0f} ms, "
              f"reply ids {hashlib.sha1(str(out).encode()).hexdigest()[:10]}")
    h3 = heap()
    shared = EW.info().get("shared_memory_bytes", 0) - shared0
    print(f"   after the replies: heap growth {(h3 - h0) / 1e6:.1f} MB, shared {shared / 1e6:.1f} MB, "
          f"total {(h3 - h0 + shared) / size:.2f}x the file")


if __name__ == "__main__":
    if sys.platform == "emscripten":
        guest_main(sys.argv[1:])
    else:
        raise SystemExit(host_main(sys.argv[1:]))
