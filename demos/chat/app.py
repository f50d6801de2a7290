"""The Python half of the chat page: runs inside Pyodide in the page's ember Worker.

demo.js has the worker download the GGUF (SmolLM2-135M-Instruct, Q4_1) into Pyodide's file
system and calls ``load(path)`` once, then ``await chat(messages, options)`` or ``await
generate(prompt, options)`` for every reply, and ``await start_webgpu(path)`` when WebGPU is
first picked. Plain ``ember.llm``: the test suite can run it in CPython too.

Backends are the page's names: "cpu" runs on ember's WebAssembly SIMD backend ("wasm") where it
exists, else on the pure-Python one; "webgpu" the GPU; "server" an ``ember serve`` process's
device (``await start_remote(url, token, path)``, when the site was started with a server). Inside the worker, the reply streams to
the page as it is decoded: every piece of text is one ``ember_worker.progress`` message
(``{piece, tokens, prefill_ms, ...}``), and a cancel from the page (the Stop button) makes the
model stop after the token being computed (``LLM.stop``); the call then returns what was made.
"""
from __future__ import annotations

import asyncio
import math
import os
import time

import ember
import ember.llm

try:  # the bridge to the page, inside ember's Worker only
    import ember_worker
except ImportError:
    ember_worker = None

# The page's names for the backends -> ember device names.
DEVICES = {"cpu": "wasm" if "wasm" in ember.devices() else "python", "webgpu": "webgpu"}
# Positions a conversation may use (prompt + reply). The key/value cache is this long on every
# backend: 30 layers x 2 x 2048 x 3 heads x 64 floats = 94 MB for SmolLM2-135M.
CONTEXT = 2048
MAX_TOKENS = 1024          # the most new tokens one call may ask for
ROLES = ("system", "user", "assistant")

_models: dict = {}         # page backend -> ember.llm.LLM
_info: dict = {}


def _as_list(values) -> list:
    return values.to_py() if hasattr(values, "to_py") else list(values)


def _as_dict(values) -> dict:
    if values is None:
        return {}
    return values.to_py() if hasattr(values, "to_py") else dict(values)


def heap_bytes() -> int | None:
    """The size of Pyodide's WebAssembly memory (it never shrinks: its high-water mark), or None
    outside Pyodide."""
    try:
        import pyodide_js
    except ImportError:
        return None
    return int(pyodide_js._module.HEAP8.length)


def shared_bytes() -> int:
    """The size of the wasm thread team's shared memory (its high-water mark: where a model
    loaded with the team keeps its weights and key/value cache), 0 without a team."""
    if DEVICES["cpu"] != "wasm":
        return 0
    return int(ember.wasm.info().get("shared_memory_bytes", 0) or 0)


def _build(backend: str, source, remove: bool) -> float:
    """Load the model on ``backend`` from a path (the page's download in Pyodide's file system,
    which lives in JavaScript's memory: ember reads the header, then each tensor's bytes
    straight into its buffer, so the whole file never sits in the WebAssembly heap; removed
    after when ``remove``), a JS Uint8Array (a JsProxy) or bytes."""
    t0 = time.perf_counter()
    if isinstance(source, str):
        try:
            _models[backend] = ember.llm.load(source, device=DEVICES[backend], context=CONTEXT)
        finally:
            if remove:
                os.remove(source)
    else:
        data = source.to_bytes() if hasattr(source, "to_bytes") else bytes(source)
        _models[backend] = ember.llm.load(data, device=DEVICES[backend], context=CONTEXT)
        del data
    return (time.perf_counter() - t0) * 1000


def load(source, backends=("cpu",), remove: bool = False) -> dict:
    """Load the GGUF (a path or bytes) on each of ``backends`` ("cpu", "webgpu"); ``remove``
    deletes the file once read. On the WebAssembly CPU backend the model is warmed up
    (``LLM.warm_up``: the decode step's capture, table and thread probes happen here, not in
    the first reply). Returns ``{"backends", "devices", "bytes", "load_ms", "warm",
    "context", "vocab", "name", "chat_template"}``."""
    backends = _as_list(backends)
    for b in backends:
        if b not in DEVICES:
            raise ValueError(f"load: unknown backend {b!r}; use 'cpu' or 'webgpu'")
    size = os.path.getsize(source) if isinstance(source, str) else len(source)
    heap_before, shared_before = heap_bytes(), shared_bytes()
    _models.clear()
    ms = {}
    for i, b in enumerate(backends):
        ms[b] = _build(b, source, remove and i == len(backends) - 1)
    m = next(iter(_models.values()))
    held = sum(_held_bytes(mm) for mm in _models.values())
    _info.update({"backends": list(_models), "devices": dict(DEVICES), "bytes": size, "load_ms": ms,
                  "heap_before": heap_before, "heap_after": heap_bytes(), "weights_bytes": held,
                  "context": m.context, "vocab": m.model.cfg.vocab_size,
                  "name": str(m.metadata.get("general.name", "")),
                  "chat_template": bool(m.metadata.get("tokenizer.chat_template"))})
    # the first forward allocates the key/value cache (on the CPU backend sized to what a reply
    # needs: ember.nn.llama's reserve; 94 MB at the whole 2048 positions): memory measured again
    # after the warm-up, the team's shared memory (weights and cache, with threads) included
    cpu = _models.get("cpu")
    _info["warm"] = cpu.warm_up() if cpu is not None and DEVICES["cpu"] == "wasm" else None
    _info.update({"heap_warm": heap_bytes(), "shared_before": shared_before, "shared_after": shared_bytes()})
    return dict(_info)


# A model the page may load (weights + its key/value cache at CONTEXT positions): Pyodide's
# WebAssembly memory is 32-bit (4 GiB at most, the interpreter and the file's header in it too).
MAX_MODEL_BYTES = 3 << 30


def check(path: str, name: str = "") -> dict:
    """Read a GGUF's header (not its tensors) and refuse, before anything is released, what the
    page cannot load: not a GGUF (``GGUFError``), an architecture or a tensor type ember does not
    run (``UnsupportedOp`` naming the key or the tensor), a vocabulary it cannot read
    (``TokenizerError``), a model too large for the page's memory (``ResourceError``). Returns
    ``{"name", "architecture", "parameters", "bytes", "quant_types"}`` (``name``:
    ``general.name``, else the given file name)."""
    from ember.errors import ResourceError, UnsupportedOp
    from ember.io.gguf import load_gguf
    from ember.nn.llama import LlamaConfig
    from ember.tokenizers import from_gguf

    with load_gguf(path) as g:
        md = g.metadata
        cfg = LlamaConfig.from_gguf(md)
        from_gguf(md)
        for t in g.tensors.values():
            if not t.supported:
                kind = f"ggml type {t.ggml_type}" if t.qtype.startswith("type") else \
                    f"type {t.qtype.upper()} (ggml type {t.ggml_type})"
                raise UnsupportedOp(f"gguf: tensor {t.name!r} has {kind}, which ember does not run")
        weights = sum(t.nbytes for t in g.tensors.values())
        cache = 2 * cfg.n_layers * min(CONTEXT, cfg.context_length) * cfg.n_kv_heads * cfg.head_dim * 4
        if weights + cache > MAX_MODEL_BYTES:
            raise ResourceError(f"the model needs {(weights + cache) / 1e6:,.0f} MB (weights "
                                f"{weights / 1e6:,.0f} MB + key/value cache {cache / 1e6:,.0f} MB); "
                                f"the page's memory holds at most {MAX_MODEL_BYTES / 1e6:,.0f} MB",
                                op="load", nbytes=weights + cache, limit=MAX_MODEL_BYTES)
        quant: dict = {}
        for t in g.tensors.values():
            quant[t.qtype.upper()] = quant.get(t.qtype.upper(), 0) + 1
        return {"name": str(md.get("general.name") or name), "architecture": str(md.get("general.architecture")),
                "parameters": sum(math.prod(t.shape) for t in g.tensors.values()),
                "bytes": os.path.getsize(path), "quant_types": quant}


def load_file(path: str, backend: str = "cpu", name: str = "") -> dict:
    """The page's "Open a GGUF file…": ``check`` the file, then release the model (every
    backend) and ``load`` this one on ``backend`` (the file is removed once read). ``load``'s
    dict plus ``check``'s (``name``, ``architecture``, ``parameters``, ``quant_types``)."""
    try:
        about = check(path, name)
    except BaseException:
        os.remove(path)
        raise
    release()
    info = load(path, [backend], remove=True)
    info.update(about, backend=backend)
    return info


def release() -> None:
    """Let the loaded model go (every backend), so a next one has the memory."""
    import gc

    _models.clear()
    gc.collect()


def _held_bytes(m) -> int:
    """Bytes of the buffers a loaded model holds (weights, RoPE tables; the key/value cache once
    a generation allocated it)."""
    def size(t):
        b = t._buf
        if hasattr(b, "nbytes"):
            return b.nbytes
        if hasattr(b, "__len__"):
            return len(b) * getattr(b, "itemsize", 1)
        return int(getattr(b, "size", 0)) * 4     # a WebGPU buffer (4-byte elements)
    model = m.model
    total = 0
    for w in model.w.values():   # (with the thread team: in its shared memory, not Python's heap)
        total += size(w.data if hasattr(w, "qtype") else w)
    for t in [model.cos, model.sin] + list(model.k_cache or []) + list(model.v_cache or []):
        total += size(t)
    return total


async def start_webgpu(source, remove: bool = False) -> dict:
    """Put the model on WebGPU (after ``await ember.webgpu.init()``) and make two tokens, so the
    pipelines the model uses are compiled before the first reply on the GPU.
    ``{"load_ms", "warm_ms", "fallback_adapter"}`` (fallback: a software adapter such as
    SwiftShader, usually far slower than the CPU backend)."""
    import ember.webgpu

    load_ms = _build("webgpu", source, remove)
    t0 = time.perf_counter()
    _models["webgpu"].generate("Hi", max_tokens=2, temperature=0)
    _info["backends"] = list(_models)
    return {"load_ms": load_ms, "warm_ms": (time.perf_counter() - t0) * 1000,
            "fallback_adapter": ember.webgpu.info().get("adapter_type") == "fallback"}


async def start_remote(url: str, token: str, source, remove: bool = False) -> dict:
    """The "server" backend: connect to an ``ember serve`` process (``build.py demo --remote
    URL``), load the model there from ``source`` (its quantized blocks go up once; the key/value
    cache is made on the server) and make two tokens. ``{"load_ms", "warm_ms", "server_device",
    "url"}``."""
    import ember.remote

    dev = await ember.remote.connect_async(url, token=token)
    DEVICES["server"] = dev
    load_ms = _build("server", source, remove)
    t0 = time.perf_counter()
    _models["server"].generate("Hi", max_tokens=2, temperature=0)
    _info["backends"] = list(_models)
    return {"load_ms": load_ms, "warm_ms": (time.perf_counter() - t0) * 1000,
            "server_device": ember.remote.info(dev)["device"], "url": url}


def _number(opts: dict, name: str, default, lo, hi, kind=float):
    v = opts.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name} must be a number from {lo} to {hi}, got {v!r}")
    if kind is int and v != int(v):
        raise ValueError(f"{name} must be a whole number, got {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be from {lo} to {hi}, got {v!r}")
    return kind(v)


def _options(options) -> tuple[str, dict, dict]:
    """(backend, ember.llm options, the page's own options) from the page's option dict."""
    o = _as_dict(options)
    known = {"max_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed",
             "backend", "trim", "yield_each_token"}
    extra = sorted(set(o) - known)
    if extra:
        raise ValueError(f"unknown option(s) {', '.join(extra)}")
    backend = o.get("backend") or "cpu"
    if backend not in DEVICES:
        raise ValueError(f"unknown backend {backend!r}: use 'cpu', 'webgpu' or 'server'")
    if backend not in _models:
        raise RuntimeError(f"the model is not loaded on {backend!r} yet")
    gen = {"max_tokens": _number(o, "max_tokens", 256, 1, MAX_TOKENS, int),
           "temperature": _number(o, "temperature", 0.0, 0, 5)}
    for name, lo, hi, kind in (("top_k", 0, 1 << 20, int), ("top_p", 0, 1, float), ("min_p", 0, 1, float),
                               ("repetition_penalty", 0.01, 10, float), ("seed", 0, 2**63 - 1, int)):
        if o.get(name) is not None:
            gen[name] = _number(o, name, None, lo, hi, kind)
    page = {"trim": bool(o.get("trim", False)), "yield_each_token": bool(o.get("yield_each_token", False))}
    return backend, gen, page


def _messages(messages) -> list:
    msgs = _as_list(messages)
    if not msgs:
        raise ValueError("chat: give at least one message")
    out = []
    for i, m in enumerate(msgs):
        m = _as_dict(m)
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ValueError(f"chat: message {i} has role {role!r}; use 'system', 'user' or 'assistant'")
        if not isinstance(content, str):
            raise ValueError(f"chat: message {i} has no text content (content must be a string)")
        out.append({"role": role, "content": content})
    return out


def _fit(model, messages: list, room: int) -> tuple[list, int]:
    """Drop the oldest turns (never the system prompt nor the last message) until the
    conversation's prompt leaves ``room`` positions for the reply; (messages, how many dropped)."""
    tok = model.tokenizer
    dropped = 0
    while True:
        n = len(tok.encode(tok.chat(messages, add_generation_prompt=True)))
        first = 1 if messages[0]["role"] == "system" else 0
        if n + room <= model.context or len(messages) - first <= 1:
            return messages, dropped
        messages = messages[:first] + messages[first + 1:]
        dropped += 1


# the reply's text reaches the page at most this often (seconds): smooth to read, and the page's
# main thread is not woken for every token
STREAM_S = 0.04


def _post(model, text: list, sent: int, decode_s: float) -> int:
    """Post the pieces of ``text`` from ``sent`` on as one progress message; returns len(text)."""
    s = model.stats
    ember_worker.progress(None, None, piece="".join(text[sent:]), tokens=s["tokens"],
                          prompt_tokens=s["prompt_tokens"], prefill_ms=s["prefill_ms"], decode_s=decode_s)
    return len(text)


async def _run(kind: str, payload, options) -> dict:
    backend, gen, page = _options(options)
    model = _models[backend]
    dropped = 0
    if kind == "chat":
        messages = _messages(payload)
        if page["trim"]:
            messages, dropped = _fit(model, messages, min(gen["max_tokens"], model.context // 2))
        pieces = model.chat(messages, stream=True, **gen)
    else:
        if not isinstance(payload, str) or not payload:
            raise ValueError("generate: the prompt must be a non-empty string")
        pieces = model.generate(payload, stream=True, **gen)
    text = []
    t0 = time.perf_counter()
    first = None
    sent = 0        # pieces of text already posted to the page
    last = 0.0
    for piece in pieces:
        text.append(piece)
        if ember_worker is not None:
            now = time.perf_counter()
            first = first or now
            # at most one message per STREAM_S: every message is work for the page's main thread,
            # which shares the cores with the decoding threads (per token it cost a fifth of the
            # decode rate on a 2-core machine)
            if now - last >= STREAM_S:
                sent, last = _post(model, text, sent, now - first), now
            if ember_worker.cancelled():
                model.stop()           # ends after this token
        if page["yield_each_token"]:
            await asyncio.sleep(0)     # lets a cancel message in (pages without SharedArrayBuffer)
    if ember_worker is not None and sent < len(text):
        _post(model, text, sent, time.perf_counter() - (first or t0))
    s = model.stats
    return {"text": "".join(text), "tokens": s["tokens"], "prompt_tokens": s["prompt_tokens"],
            "prefill_ms": s["prefill_ms"], "decode_ms": s["decode_ms"],
            "decode_tokens_per_second": s["decode_tokens_per_second"],
            "finish_reason": s.get("finish_reason", "length"), "dropped": dropped,
            "ms": (time.perf_counter() - t0) * 1000, "backend": backend, "device": DEVICES[backend],
            "threads": s.get("threads")}


async def generate(prompt, options=None) -> dict:
    """Continue raw text (no chat template). ``options``: max_tokens (1..1024, default 256),
    temperature (0 = greedy, the default), top_k, top_p, min_p, repetition_penalty, seed,
    backend ("cpu" | "webgpu"). Returns ``{"text", "tokens", "prompt_tokens", "prefill_ms",
    "decode_ms", "decode_tokens_per_second", "finish_reason", "ms", "backend", "device", "threads"}``
    (threads: how many the CPU backend's decode steps ran on, None elsewhere).

    >>> # await generate("The capital of France is", {"max_tokens": 8})["text"]  # doctest: +SKIP
    """
    return await _run("generate", prompt, options)


async def chat(messages, options=None) -> dict:
    """Answer a conversation (``[{"role", "content"}]``) through the model's chat template;
    options as ``generate``, plus ``trim`` (drop the oldest turns when the conversation and
    ``max_tokens`` do not fit the context; ``dropped`` says how many)."""
    return await _run("chat", messages, options)


def start_cpu(source, remove: bool = False) -> dict:
    """Put the model on the CPU backend too (a model of the user's that was opened on WebGPU,
    then the CPU picked): ``{"load_ms", "warm"}``."""
    load_ms = _build("cpu", source, remove)
    cpu = _models["cpu"]
    warm = cpu.warm_up() if DEVICES["cpu"] == "wasm" else None
    _info["backends"] = list(_models)
    return {"load_ms": load_ms, "warm": warm}


def loaded() -> list:
    """The backends a model is loaded on now (empty after a failed ``load_file``)."""
    return list(_models)
