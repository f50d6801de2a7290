"""The Python half of the MiniLM page: runs inside Pyodide, called from demo.js.

demo.js writes this file, ``model.py`` and ``tokenizer.py`` into Pyodide's file system, calls
``load(vocab_text, weights, backends)`` once with the vocabulary and the float32 safetensors
bytes (the page downloads float16 weights and widens them in JS), then
``await embed(sentences, backend)`` for every comparison. Plain ember: the test suite runs it in
CPython too.
"""
from __future__ import annotations

import time

import model as minilm
from tokenizer import Tokenizer

# The page's names for the two backends -> ember device names.
DEVICES = {"cpu": "python", "webgpu": "webgpu"}
# Padding wastes work: on the CPU every sentence runs alone; on the GPU sentences of similar
# length share a batch (one dispatch per op for the batch).
BATCH = {"cpu": 1, "webgpu": 16}
MAX_SENTENCES = 64

_tok: Tokenizer | None = None
_nets: dict = {}


def _as_bytes(data) -> bytes:
    # A JS Uint8Array arrives as a JsProxy (one copy across with to_bytes); CPython passes bytes.
    return data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)


def _as_list(values) -> list:
    return values.to_py() if hasattr(values, "to_py") else list(values)


def load(vocab_text: str, weights, backends=("cpu",)) -> dict:
    """Build the tokenizer and the model on each of ``backends`` ("cpu", "webgpu")."""
    global _tok
    backends = _as_list(backends)
    for b in backends:
        if b not in DEVICES:
            raise ValueError(f"load: unknown backend {b!r}; use 'cpu' or 'webgpu'")
    if "webgpu" in backends:
        # Autotune benchmarks every matmul variant the first time a shape class is seen, and
        # sentence lengths make new shapes all the time: measured in headless Chromium
        # (SwiftShader), that made a 7-sentence comparison 5-20 s instead of 4 s with the
        # default variants.
        from ember.webgpu import autotune

        autotune.set_enabled(False)
    _tok = Tokenizer.from_text(vocab_text)
    raw = _as_bytes(weights)
    _nets.clear()
    ms = {}
    for b in backends:
        t0 = time.perf_counter()
        _nets[b] = minilm.load_model(raw, DEVICES[b])
        ms[b] = (time.perf_counter() - t0) * 1000
    return {"backends": list(_nets), "bytes": len(raw), "vocab": len(_tok.vocab), "load_ms": ms}


async def embed(sentences, backend: str = "cpu") -> dict:
    """``{"embeddings", "tokens", "tokenize_ms", "embed_ms", "backend"}`` for a list of strings;
    each embedding is 384 floats of unit length."""
    if backend not in DEVICES:
        raise ValueError(f"embed: unknown backend {backend!r}; use 'cpu' or 'webgpu'")
    if backend not in _nets:
        raise RuntimeError(f"embed: the model is not loaded on {backend!r}; call load() first")
    sentences = _as_list(sentences)
    if not sentences or len(sentences) > MAX_SENTENCES:
        raise ValueError(f"embed: give 1 to {MAX_SENTENCES} sentences, got {len(sentences)}")
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"embed: sentence {i} is a {type(s).__name__}, not a string")
    t0 = time.perf_counter()
    tokens = [len(_tok.encode(s)) for s in sentences]
    t1 = time.perf_counter()
    vecs = await minilm.embed_async(_nets[backend], _tok, sentences, DEVICES[backend], BATCH[backend])
    t2 = time.perf_counter()
    return {"embeddings": vecs, "tokens": tokens, "tokenize_ms": (t1 - t0) * 1000,
            "embed_ms": (t2 - t1) * 1000, "backend": backend}
