"""Where one decoded SmolLM2 token's time goes on device "wasm" (inside Pyodide under Node).

    python tests/bench/llm_decode_profile.py [--threads=1,2] [--tokens=64] [--kernels-only]

The host side builds the wheel (as bench_wasm.py does) and runs this file in Pyodide with the
chat demo's Q4_1 GGUF (and the Q8_0 re-quantization when cached) mounted. Inside, for the page's
set-up (context 2048, a ~200-token prompt):

- ``generate``: decode tok/s as ``model.stats`` reports it, and the wall time per token of the
  whole loop (sampling, tokenizer streaming, the generator) for 1 and 2 threads;
- ``step``: the compiled one-token step alone (``step_argmax(ids, pos)`` + its 4-byte read);
- ``kernels``: each kernel kind called directly (``rt.call``, its call cost subtracted) on the
  model's own weights, times the calls per token: where a token's kernel time goes.
"""
from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else "."


def host_main(argv) -> int:
    sys.path.insert(0, HERE)
    from bench_wasm import run_llm_script

    return run_llm_script(os.path.abspath(__file__), argv)


def _arg(argv, name, default):
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), default)


def wait_threads(n):
    import ember.wasm as EW
    EW.set_threads(n)
    end = time.monotonic() + 10
    while EW.threads() < n and time.monotonic() < end:
        time.sleep(0.01)


def kernel_rows(model, pos: int, reps: int = 30) -> list:
    """(name, calls per token, µs per call) for each kernel kind of a decode step at ``pos``."""
    from array import array

    import ember
    from ember.quant import FORMATS
    from ember.wasm.ops_quant import scratch_floats
    from ember.wasm.runtime import R, W, runtime

    rt = runtime()
    m = model.model
    c = m.cfg
    w = m.w

    def timeit(fn, n=reps):
        fn()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n)
        return best * 1e6

    base = timeit(lambda: rt.call("ember_abi"), 200)
    rows = [("(rt.call itself, subtracted below)", 0, base)]
    x = array("f", [0.01 * ((i * 37) % 101 - 50) for i in range(max(c.ffn_dim, c.dim))])
    shapes = {}
    for part in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        q = w[f"blk.0.{part}.weight"]
        shapes.setdefault((q.qtype, q.shape), []).append(part)
    head = m.head
    shapes.setdefault((head.qtype, head.shape), []).append("output (head)")
    for (qt, (n, k)), parts in shapes.items():
        qw = w[f"blk.0.{parts[0]}.weight"] if parts[0] != "output (head)" else head
        buf = qw.data._buf
        y = array("f", bytes(4 * n))
        scr = array("f", bytes(4 * scratch_floats(qt, 1, k)))
        prm = array("i", [FORMATS[qt].ggml_type, 1, n, k])
        us = timeit(lambda: rt.call("q_linear", R(buf, len(buf)), R(x, k), W(y, n), W(scr, len(scr)), R(prm, 4)))
        per = len(parts) * (c.n_layers if parts[0] != "output (head)" else 1)
        rows.append((f"q_linear {qt} {n}x{k} ({', '.join(parts)})", per, us - base))
    # attention over pos cached rows (the cache of layer 0; rows past pos are whatever is there)
    hq, hkv, hd = c.n_heads, c.n_kv_heads, c.head_dim
    C = m.context
    kc, vc = m.k_cache[0]._buf, m.v_cache[0]._buf
    qv = array("f", x[:hq * hd])
    kv = array("f", x[:hkv * hd])
    out = array("f", bytes(4 * hq * hd))
    p = array("i", [pos])
    scr = array("f", bytes(4 * (hq // hkv) * (C + 1)))
    prm = array("i", [1, hq, hkv, hd, C])
    us = timeit(lambda: rt.call("attention_cached_f32", R(qv, len(qv)), R(kv, len(kv)), R(kv, len(kv)),
                                W(kc, len(kc)), W(vc, len(vc)), R(p, 1), W(out, len(out)), W(scr, len(scr)),
                                R(prm, 5), 0.125))
    rows.append((f"attention_cached (pos {pos}, context {C})", c.n_layers, us - base))
    nw = w["blk.0.attn_norm.weight"]._buf
    yd = array("f", bytes(4 * c.dim))
    us = timeit(lambda: rt.call("rms_norm_f32", R(x, c.dim), R(nw, c.dim), W(yd, c.dim), 1, c.dim, 1e-5))
    rows.append(("rms_norm 576", 2 * c.n_layers + 1, us - base))
    cs = array("f", x[:hd // 2])
    yq = array("f", bytes(4 * hq * hd))
    us = timeit(lambda: rt.call("rope_f32", R(qv, len(qv)), R(cs, hd // 2), R(cs, hd // 2), W(yq, len(yq)),
                                1, hq, hd, 0))
    rows.append((f"rope q ({hq} heads)", c.n_layers, us - base))
    us = timeit(lambda: rt.call("rope_f32", R(kv, len(kv)), R(cs, hd // 2), R(cs, hd // 2), W(yq, len(kv)),
                                1, hkv, hd, 0))
    rows.append((f"rope k ({hkv} heads)", c.n_layers, us - base))
    del ember
    return rows


def table_rows(replay, reps: int = 10) -> list:
    """(kernel name, commands, ms per token) from sub-tables of the step's own command table,
    each holding only one kernel's commands (same buffers, same addresses; one thread): the
    kernels' time inside the real step, weights streamed from memory as in decoding."""
    from array import array

    from ember.wasm.plan_exec import HEADER, MAGIC

    names = {k: n for n, k in replay.disp.ids.items()}
    run = replay.rt.fn("ember_run")
    (seg,) = replay.segments
    t = seg.table
    cmds = []
    at = HEADER
    for _ in range(t[2]):
        n = t[at + 1]
        cmds.append((t[at], list(t[at:at + 3 + n])))
        at += 3 + n
    keep = []

    def timed(words, ncmd):
        tab = array("I", [MAGIC, replay.disp.abi, ncmd, 0] + words)
        tab[3] = len(tab)
        keep.append(tab)
        addr = tab.buffer_info()[0]
        run(addr, 0)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            rc = run(addr, 0)
            best = min(best, time.perf_counter() - t0)
        return best * 1000, rc

    rows = []
    allw = [w for _, c in cmds for w in c]
    full, rc = timed(allw, len(cmds))
    rows.append(("(the whole table)", len(cmds), full, rc))
    for kid in sorted({k for k, _ in cmds}, key=lambda k: names[k]):
        sub = [c for k, c in cmds if k == kid]
        ms, rc = timed([w for c in sub for w in c], len(sub))
        rows.append((names[kid], len(sub), ms, rc))
    return rows


_PROMPT = [None]


def chat_prompt() -> str:
    """bench_llm's long prompt in ChatML (``bench_llm.chatml_prompt``, passed in by the host side
    as ``--prompt=``: Node's Pyodide has no jinja2)."""
    if _PROMPT[0] is None:
        raise SystemExit("llm_decode_profile: no --prompt= (run it from CPython: the host side passes it)")
    return _PROMPT[0]


def time_step(step, args, reps: int = 20, warm: int = 3) -> list:
    """Seconds of ``reps`` calls of the one-token ``step(*args)`` with its read, sorted, after
    ``warm`` uncounted ones."""
    for _ in range(warm):
        step(*args).tolist()
    ts = []
    for _ in range(reps):
        t1 = time.perf_counter()
        step(*args).tolist()
        ts.append(time.perf_counter() - t1)
    return sorted(ts)


def _min_median(ts: list) -> str:
    return f"min {ts[0] * 1000:.2f} ms, median {ts[len(ts) // 2] * 1000:.2f} ms"


def profile_model(model, threads=(1, 2), n_tok: int = 64, kernels: bool = True, tables: bool = True) -> None:
    """Print where a decoded token's time goes for ``model`` (an ember.llm.LLM on "wasm")."""
    import ember
    import ember.wasm as EW

    ids = model.tokenizer.encode(chat_prompt())
    print(f"prompt: {len(ids)} tokens; context {model.context}; {EW.info().get('threads')} threads now")
    for nt in threads:
        wait_threads(nt)
        model.generate(ids, max_tokens=4)   # capture + record + the team's probes
        model.generate(ids, max_tokens=8)
        t0 = time.perf_counter()
        n = 0
        for _ in model.generate(ids, max_tokens=n_tok, stream=True):
            n += 1
        wall = time.perf_counter() - t0
        s = model.stats
        loop_ms = (wall * 1000 - s["prefill_ms"]) / max(s["tokens"] - 1, 1)
        print(f"threads={nt}: prefill {s['prompt_tokens_per_second']:.1f} tok/s, decode "
              f"{s['decode_tokens_per_second']:.1f} tok/s ({1000 / max(s['decode_tokens_per_second'], 1e-9):.2f}"
              f" ms/token in steps) on {s.get('threads')} thread(s), loop {loop_ms:.2f} ms/token wall, "
              f"{s['tokens']} tokens")
        # the step alone, some positions past the prompt
        step_logits, step_argmax = model._steps()
        pos = len(ids) + 40
        args = (ember.tensor([1234], dtype="int32", device="wasm"),
                ember.tensor([pos], dtype="int32", device="wasm"))
        ts = time_step(step_argmax, args)
        rep = step_argmax.plan_for(*args).fast
        desc = rep.describe()
        print(f"   step alone: {_min_median(ts)}; "
              f"segments {desc.get('segments')}, commands {desc.get('commands')}, "
              f"python steps {len(desc.get('python_steps') or {})}, space {desc.get('space')}")
        if desc.get("space") == "pyodide" and tables:
            parts = 0.0
            for name, nc, ms, rc in table_rows(rep):
                print(f"   table {name:32s} {nc:4d} commands {ms:7.2f} ms" + (f" (rc {rc})" if rc else ""))
                parts += ms if name[0] != "(" else 0
            print(f"   table parts sum {parts:.2f} ms")
        from ember.wasm import team as T
        tm = T.team(create=False)
        if desc.get("space") == "threads" and tm is not None:
            st = getattr(rep.segments[0], "team_stats", {})
            b0 = tm.barriers()
            step_argmax(*args).tolist()
            print(f"   team chosen: {st.get('use')} (team {[round(t * 1000, 2) for t in st.get(True, [])]} ms,"
                  f" one thread {[round(t * 1000, 2) for t in st.get(False, [])]} ms); "
                  f"barriers per step {tm.barriers() - b0}")
            tm.adaptive = False
            ts = time_step(step_argmax, args, warm=0)
            tm.adaptive = True
            print(f"   step alone, team forced: {_min_median(ts)}")
    if kernels:
        wait_threads(1)
        rows = kernel_rows(model, len(ids) + 64)
        total = 0.0
        print("kernels alone on one thread, weights in cache (us per call x calls per token):")
        for name, per, us in rows:
            print(f"   {name:55s} {us:8.1f} us x {per:3d} = {us * per / 1000:6.2f} ms")
            total += us * per
        print(f"   {'sum':55s} {total / 1000:29.2f} ms/token -> {1e6 / total:.1f} tok/s")


def team_rows(model, reps: int = 25) -> None:
    """The decode step on the team (forced) under a few settings: what the team itself costs."""
    import ember
    from ember.wasm import team as T

    wait_threads(2)
    ids = model.tokenizer.encode(chat_prompt())
    model.generate(ids, max_tokens=4)
    _, step = model._steps()
    args = (ember.tensor([1234], dtype="int32", device="wasm"),
            ember.tensor([len(ids) + 40], dtype="int32", device="wasm"))
    tm = T.team(create=False)
    tm.adaptive = False

    for label, min_work, spin in (("default", T.DEFAULT_MIN_WORK, T.DEFAULT_SPIN),
                                  ("nothing splits (min work 2^30)", 1 << 30, T.DEFAULT_SPIN),
                                  ("spin 200000", T.DEFAULT_MIN_WORK, 200000),
                                  ("min work 2^20", 1 << 20, T.DEFAULT_SPIN),
                                  ("default again", T.DEFAULT_MIN_WORK, T.DEFAULT_SPIN)):
        tm.set_min_work(min_work)
        tm._set(T.SPIN, spin)
        b0 = tm.barriers()
        r = _min_median(time_step(step, args, reps))
        print(f"   team forced, {label:32s}: {r}; barriers per step {(tm.barriers() - b0) / (reps + 3):.0f}")
    tm.set_min_work(T.DEFAULT_MIN_WORK)
    tm._set(T.SPIN, T.DEFAULT_SPIN)
    tm.adaptive = True


def first_steps(model, n: int = 16) -> None:
    """Milliseconds of each of the first decode steps of a fresh model: capture, the table's
    recording, the team's probes, then steady replays."""
    import ember

    ids = model.tokenizer.encode(chat_prompt())
    model.generate(ids, max_tokens=1)       # the prompt's forward (fills the cache), no step yet
    _, step = model._steps()
    ms = []
    for i in range(n):
        args = (ember.tensor([1234 + i], dtype="int32", device="wasm"),
                ember.tensor([len(ids) + i], dtype="int32", device="wasm"))
        t1 = time.perf_counter()
        step(*args).tolist()
        ms.append(round((time.perf_counter() - t1) * 1000, 1))
    print(f"   first {n} steps (ms): {ms}")


def guest_main(argv) -> None:
    import ember.llm

    _PROMPT[0] = _arg(argv, "prompt", None)
    threads = [int(t) for t in _arg(argv, "threads", "1,2").split(",")]
    n_tok = int(_arg(argv, "tokens", "64"))
    for kind in ("q4_1", "q8_0"):
        path = _arg(argv, f"llm-{kind}", None)
        if path is None or kind not in _arg(argv, "files", "q4_1,q8_0"):
            continue
        t0 = time.perf_counter()
        model = ember.llm.load(path, device="wasm", context=2048)
        print(f"== {kind}: loaded in {time.perf_counter() - t0:.1f} s")
        if "--sampling" in argv:
            wait_threads(int(threads[-1]))
            ids = model.tokenizer.encode(chat_prompt())
            # "row": every sampled token from the whole row of logits in Python (Sampler.__call__,
            # the path before Sampler.pick), alternating with pick; same tokens either way
            from ember.llm import Sampler
            pick = Sampler.pick
            row = lambda self, logits, history: self(logits.tolist()[0], history)  # noqa: E731
            texts = {}
            for temp, way in ((0.0, "pick"), (0.7, "pick"), (0.7, "row")) * 2:
                Sampler.pick = pick if way == "pick" else row
                model.generate(ids, max_tokens=16, temperature=temp, seed=1)
                t0 = time.perf_counter()
                texts.setdefault(temp, set()).add(model.generate(ids, max_tokens=48, temperature=temp, seed=1))
                s = model.stats
                wall = (time.perf_counter() - t0) * 1000 - s["prefill_ms"]
                print(f"   temperature {temp} ({way}): decode {s['decode_tokens_per_second']:.1f} tok/s "
                      f"({s['decode_ms'] / max(s['tokens'] - 1, 1):.2f} ms/token incl. sampling), "
                      f"loop {wall / max(s['tokens'] - 1, 1):.2f} ms/token, {s['tokens']} tokens, threads {s.get('threads')}")
            Sampler.pick = pick
            print(f"   same text for both ways: {all(len(v) == 1 for v in texts.values())}")
        elif "--first" in argv:
            for nt in threads:
                wait_threads(nt)
                print(f"threads={nt}")
                model._step_logits = model._step_argmax = None
                first_steps(model)
        elif "--team" in argv:
            team_rows(model)
        else:
            profile_model(model, threads, n_tok, kernels="--no-kernels" not in argv)
        del model


if __name__ == "__main__":
    if sys.platform == "emscripten":
        guest_main(sys.argv[1:])
    else:
        raise SystemExit(host_main(sys.argv[1:]))
