"""The Python half of the MiniLM page: runs inside Pyodide in the page's ember Worker.

demo.js has the worker fetch this file, ``model.py``, ``tokenizer.py`` and the vocabulary into
Pyodide's file system and widen the float16 weights to a float32 safetensors file there (in JS,
weights.js), then calls ``load(vocab, weights_path, ["cpu"])`` once, ``await embed(sentences,
backend)`` for every comparison and, in the background, ``await start_webgpu()``. Plain ember:
the test suite runs it in CPython too.

Backends are the page's names: "cpu" runs on ember's WebAssembly SIMD backend ("wasm") where it
exists, else on the pure-Python one; "python" is always pure Python (for comparison); "webgpu"
the GPU; "server" an ``ember serve`` process's device (``await start_remote(url, token)``). Inside the worker, a long ``embed`` reports progress per batch and stops between
batches and between layers when the page cancels it (``ember_worker``, see /wasm/ember.js).
"""
from __future__ import annotations

import os
import time

import ember
import model as minilm
from tokenizer import Tokenizer

try:  # the bridge to the page, inside ember's Worker only
    import ember_worker
except ImportError:
    ember_worker = None

# The page's names for the backends -> ember device names.
DEVICES = {"cpu": "wasm" if "wasm" in ember.devices() else "python", "webgpu": "webgpu", "python": "python"}
# Padding wastes work: on the CPU every sentence runs alone; on the GPU sentences of similar
# length share a batch (one dispatch per op for the batch).
BATCH = {"cpu": 1, "webgpu": 16, "python": 1}
MAX_SENTENCES = 64

_tok: Tokenizer | None = None
_nets: dict = {}
_source = None   # the weights (a file path in the page, bytes in CPython), for later backends


def _as_bytes(data) -> bytes:
    # A JS Uint8Array arrives as a JsProxy (one copy across with to_bytes); CPython passes bytes.
    return data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)


def _as_list(values) -> list:
    return values.to_py() if hasattr(values, "to_py") else list(values)


def _check_cancelled() -> None:
    if ember_worker is not None:
        ember_worker.check_cancelled()


def _cancel_points(net):
    """Let a cancel stop the model between encoder layers (pure Python spends ~1 s per layer on
    one sentence in the page): each layer checks the page's cancel flag before it runs."""
    if ember_worker is None:
        return net
    for layer in net.encoder.layer:
        run = layer.forward

        def forward(*args, _run=run, **kwargs):
            ember_worker.check_cancelled()
            return _run(*args, **kwargs)
        layer.forward = forward
    return net


def _build(backend: str):
    t0 = time.perf_counter()
    src = _source if isinstance(_source, str) else _as_bytes(_source)
    _nets[backend] = _cancel_points(minilm.load_model(src, DEVICES[backend]))
    return (time.perf_counter() - t0) * 1000


def load(vocab_text: str, weights, backends=("cpu",)) -> dict:
    """Build the tokenizer and the model on each of ``backends`` ("cpu", "webgpu", "python").

    ``vocab_text`` is the vocabulary (one token per line) or the path of that file; ``weights``
    float32 safetensors bytes or the path of the file."""
    global _tok, _source
    backends = _as_list(backends)
    for b in backends:
        if b not in DEVICES:
            raise ValueError(f"load: unknown backend {b!r}; use 'cpu', 'webgpu' or 'python'")
    if "webgpu" in backends:
        _no_autotune()
    if "\n" not in vocab_text and os.path.isfile(vocab_text):
        with open(vocab_text, encoding="utf-8") as f:
            vocab_text = f.read()
    _tok = Tokenizer.from_text(vocab_text)
    _source = weights if isinstance(weights, str) else _as_bytes(weights)
    size = os.path.getsize(_source) if isinstance(_source, str) else len(_source)
    _nets.clear()
    ms = {b: _build(b) for b in backends}
    return {"backends": list(_nets), "bytes": size, "vocab": len(_tok.vocab), "load_ms": ms,
            "devices": dict(DEVICES)}


def _no_autotune() -> None:
    # Autotune benchmarks every matmul variant the first time a shape class is seen, and
    # sentence lengths make new shapes all the time: measured in headless Chromium
    # (SwiftShader), that made a 7-sentence comparison 5-20 s instead of 4 s with the
    # default variants.
    from ember.webgpu import autotune

    autotune.set_enabled(False)


async def start_webgpu() -> dict:
    """Put the model on WebGPU (after ``await ember.webgpu.init()``) and embed one sentence, so
    that exactly the pipelines this model uses are compiled before the page switches to it.
    ``{"load_ms", "warm_ms", "pipelines", "fallback_adapter"}`` (fallback: a software adapter,
    e.g. SwiftShader, often slower than the CPU backend)."""
    import ember.webgpu

    if _tok is None:
        raise RuntimeError("start_webgpu: call load() first")
    _no_autotune()
    load_ms = _build("webgpu")
    t0 = time.perf_counter()
    await embed(["Warming up the kernels."], "webgpu")
    return {"load_ms": load_ms, "warm_ms": (time.perf_counter() - t0) * 1000,
            "pipelines": ember.webgpu.stats()["pipelines_compiled"],
            "fallback_adapter": ember.webgpu.info().get("adapter_type") == "fallback"}


async def start_remote(url: str, token: str) -> dict:
    """The "server" backend: connect to an ``ember serve`` process (``build.py demo --remote
    URL``), put the model there (the weights go up once) and embed one sentence. Awaits every
    reply (``connect_async``, ``flush_async``, ``data_async``), so no JSPI is needed.
    ``{"load_ms", "warm_ms", "server_device", "url"}``."""
    import ember.remote

    if _tok is None:
        raise RuntimeError("start_remote: call load() first")
    t0 = time.perf_counter()
    dev = await ember.remote.connect_async(url, token=token)
    DEVICES["server"] = dev
    BATCH["server"] = 16
    _build("server")
    await ember.remote.flush_async(dev)   # the weights, in one batch
    load_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    await embed(["Warming up the server."], "server")
    return {"load_ms": load_ms, "warm_ms": (time.perf_counter() - t1) * 1000,
            "server_device": ember.remote.info(dev)["device"], "url": url}


async def embed(sentences, backend: str = "cpu") -> dict:
    """``{"embeddings", "tokens", "cut", "unknown", "max_tokens", "tokenize_ms", "embed_ms",
    "backend", "device"}`` for a list of strings; each embedding is 384 floats of unit length.
    Per sentence: ``tokens`` the ids the model reads, ``cut`` how many word pieces past
    ``max_tokens`` (256, with [CLS] and [SEP]) were dropped, ``unknown`` whether every word piece
    is ``[UNK]`` (emoji, scripts the English vocabulary lacks: such sentences all embed alike)."""
    if backend not in DEVICES:
        raise ValueError(f"embed: unknown backend {backend!r}; use 'cpu', 'webgpu' or 'python'")
    if backend not in _nets:
        if backend == "python" and _tok is not None:
            _build("python")     # for comparison only: built the first time it is asked for
        else:
            raise RuntimeError(f"embed: the model is not loaded on {backend!r}; call load() first")
    sentences = _as_list(sentences)
    if not sentences or len(sentences) > MAX_SENTENCES:
        raise ValueError(f"embed: give 1 to {MAX_SENTENCES} sentences, got {len(sentences)}")
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"embed: sentence {i} is a {type(s).__name__}, not a string")
    t0 = time.perf_counter()
    room = _tok.max_length - 2                       # [CLS] ... [SEP]
    pieces = [_tok.tokenize(s) for s in sentences]
    tokens = [min(len(p), room) + 2 for p in pieces]   # what encode() keeps
    cut = [max(0, len(p) - room) for p in pieces]
    unknown = [bool(p) and all(w == "[UNK]" for w in p) for p in pieces]
    t1 = time.perf_counter()
    out = [None] * len(sentences)
    done = 0
    # model.py's own batching (by length), one batch at a time so that a cancel stops between.
    for idx, e in minilm._embedding_tensor(_nets[backend], _tok, sentences, DEVICES[backend], BATCH[backend]):
        for i, row in zip(idx, await e.data_async()):
            out[i] = row
        done += len(idx)
        if ember_worker is not None:
            ember_worker.progress(done / len(sentences), f"{done} / {len(sentences)} sentences", done=done,
                                  total=len(sentences))
        _check_cancelled()
    t2 = time.perf_counter()
    return {"embeddings": out, "tokens": tokens, "cut": cut, "unknown": unknown,
            "max_tokens": _tok.max_length, "tokenize_ms": (t1 - t0) * 1000,
            "embed_ms": (t2 - t1) * 1000, "backend": backend, "device": DEVICES[backend]}
