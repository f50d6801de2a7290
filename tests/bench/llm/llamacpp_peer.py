"""llama.cpp natively (llama-cpp-python) on one GGUF file: the native CPU peer of ember.llm in
``python build.py bench llm``. Runs in its own virtual environment (the bench builds it), so it
imports nothing from ember; reads a JSON job, writes a JSON result.

    python llamacpp_peer.py job.json out.json

job: {"path": GGUF file, "prompt": str (tokenized with special tokens parsed, no BOS added),
"max_tokens": int, "threads": [int, ...], "n_ctx": int, "tokenize": [str, ...]}.
out: {"version", "prompt_ids", "tokenized": [[int, ...], ...], "rows": [{"threads", "load_ms",
"prompt_tokens", "prefill_ms", "prompt_tps", "tokens", "decode_ms", "decode_tps", "ids", "text"}]}

Greedy by hand: one batched ``eval`` of the prompt (its last logits give the first new token),
then one ``eval`` per new token, the next token the argmax of the last logits; generation ends
at an end-of-generation token or after max_tokens new tokens. prompt tok/s = prompt tokens /
prefill time; decode tok/s = (new tokens - 1) / time of the per-token evals (the first new token
comes from the prompt's logits), the same definition llama.cpp's own timings use.
"""
from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama

    job = json.loads(open(argv[0], encoding="utf-8").read())
    out = {"version": llama_cpp.__version__, "rows": [], "prompt_ids": None, "tokenized": []}
    for threads in job["threads"]:
        t = time.perf_counter()
        llm = Llama(model_path=job["path"], n_ctx=job.get("n_ctx", 1024), n_batch=512,
                    n_threads=threads, n_threads_batch=threads, verbose=False)
        load_ms = (time.perf_counter() - t) * 1e3
        ids = llm.tokenize(job["prompt"].encode("utf-8"), add_bos=False, special=True)
        if out["prompt_ids"] is None:
            out["prompt_ids"] = list(ids)
            out["tokenized"] = [list(llm.tokenize(s.encode("utf-8"), add_bos=False, special=True))
                                for s in job.get("tokenize", [])]
        vocab = llama_cpp.llama_model_get_vocab(llm.model)

        def is_eog(tok: int) -> bool:
            return bool(llama_cpp.llama_vocab_is_eog(vocab, tok))

        n_vocab = llm.n_vocab()

        def last_logits():   # the last evaluated token's logits (eval keeps them in the context)
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))

        # a short warm-up (first-call allocations), then the timed run on a fresh context
        llm.reset()
        llm.eval(ids[:8])
        llm.eval([int(np.argmax(last_logits()))])
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        tok = int(np.argmax(last_logits()))
        t1 = time.perf_counter()
        new = [tok]
        while not is_eog(tok) and len(new) < job["max_tokens"]:
            llm.eval([tok])
            tok = int(np.argmax(last_logits()))
            new.append(tok)
        t2 = time.perf_counter()
        text = llm.detokenize([i for i in new if not is_eog(i)]).decode("utf-8", errors="replace")
        prefill_ms, decode_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
        out["rows"].append({
            "threads": threads, "load_ms": load_ms, "prompt_tokens": len(ids), "prefill_ms": prefill_ms,
            "prompt_tps": len(ids) / (t1 - t0), "tokens": len(new), "decode_ms": decode_ms,
            "decode_tps": (len(new) - 1) / (t2 - t1) if len(new) > 1 else None, "ids": new, "text": text})
        print(f"llama.cpp {threads} thread(s): prompt {len(ids)} tok {out['rows'][-1]['prompt_tps']:.1f} tok/s, "
              f"decode {len(new)} tok {out['rows'][-1]['decode_tps'] or 0:.1f} tok/s", flush=True)
        llm.close() if hasattr(llm, "close") else None
        del llm
    with open(argv[1], "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
