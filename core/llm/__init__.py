"""Text generation with GGUF language models, in CPython and in the page.

>>> import ember.llm                                    # doctest: +SKIP  (needs a GGUF file)
>>> model = ember.llm.load("SmolLM2-135M-Instruct.Q4_1.gguf", device="numpy")
>>> model.chat([{"role": "user", "content": "What is the capital of France?"}], max_tokens=16)
'The capital of France is Paris.'
>>> for piece in model.generate("Once upon a time", max_tokens=32, temperature=0.8, seed=1, stream=True):
...     print(piece, end="", flush=True)
>>> model.stats["decode_tokens_per_second"]

How a generation runs (DESIGN.md, "Generation"): the prompt's tokens go through the model as one
batched forward (in chunks of ``PREFILL_CHUNK``), which fills the key/value cache and gives the
first token; every further token is one replay of a plan captured once (``ember.compile`` of the
one-token step, whose inputs are the token id and its position, both tensors): no model code,
no shape rules and no op lookups per token. Greedy decoding without a repetition penalty asks the
device for the argmax only (4 bytes read back instead of the vocabulary's logits). On device
``"webgpu"`` that argmax stays on the GPU: each step's output tensor is the next step's token
input, so up to ``RUN_AHEAD`` steps are enqueued before their tokens are read back in one read
(the GPU runs step t while the host encodes step t+1). Sampling (temperature > 0, or a
penalty) reads only the ids above a threshold the device compares against (``Sampler.pick``:
the same tokens as visiting the whole row). Tokens past a stop (an end token, a stop
string, ``max_tokens``, ``stop()``) are computed but dropped; the cache rows they wrote lie past
every position a later step reads before writing it again (positions are inputs).

Memory: on device "wasm" the key/value cache is sized to what a reply can reach (prompt +
``max_tokens``), not the whole context: ``Llama.reserve`` grows it in chunks (at least doubling)
before a reply's prompt runs. A growth gives the compiled steps the new cache (their plans let
the old one go first; only their attention steps are recorded again and the tables rebuilt,
``plan_exec.bind_constants``: ~0.1 s for SmolLM2, was 0.24-0.42 s to capture, record and warm
them up again), before the prompt runs: ``stats["grow_ms"]``, outside the prompt and decode
rates. It happens at the
first reply that needs more rows than any before (the chat page: its first reply, then at
doublings). With the thread team the weights and the cache live in the team's shared memory
only (``ember.nn.llama``).

Options of ``generate``/``chat``: ``max_tokens`` (default 256), ``temperature`` (0 = greedy,
the default), ``top_k`` (40 when sampling unless given; 0 = none), ``top_p``, ``min_p``,
``repetition_penalty``, ``seed``, ``stop`` (a string or strings that end the text, not included),
``stream`` (an iterator of text pieces, each valid UTF-8, instead of one string). Generation also
ends at the model's end-of-generation tokens and at the context's end.
"""
from __future__ import annotations

import time

from .. import ops as F
from ..errors import ContextLengthError, EmberError
from ..tensor import tensor
from .sampling import DEFAULT_TOP_K, Sampler, SamplingError  # noqa: F401

__all__ = ["load", "load_async", "LLM", "Sampler", "SamplingError"]

PREFILL_CHUNK = 256      # prompt tokens per batched forward (bounds the activations' memory)
RUN_AHEAD = 32           # webgpu greedy: the most decode steps enqueued before their tokens are read

# Token texts that end a turn in common chat formats (llama.cpp treats them the same way when
# the file marks them as control tokens and names no end-of-turn id of its own).
_EOG_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<end_of_turn>", "<|eom_id|>")


def load(source, device: str | None = None, *, context: int | None = None) -> "LLM":
    """Load a GGUF language model (path, bytes or memoryview) onto ``device``; its weights stay
    in their quantized block format there. ``context``: the most positions a generation may
    use (default: the model's own, at most 4096); the key/value cache is that long.

    Raises ``ember.errors.WeightsError`` (a malformed file or missing tensor),
    ``ember.errors.UnsupportedOp`` (an architecture or tensor type ember does not run)."""
    from ..io.gguf import load_gguf
    from ..nn.llama import Llama
    from ..tokenizers import from_gguf

    g = load_gguf(source)
    tok = from_gguf(g.metadata)       # byte-level BPE ("gpt2") or SentencePiece ("llama")
    model = Llama.from_gguf(g, device=device, context=context)
    return LLM(model, tok, metadata=g.metadata)


async def load_async(source, device: str | None = None, *, context: int | None = None) -> "LLM":
    """``load`` for a page's main thread: opens WebGPU / the wasm module asynchronously first."""
    if device == "webgpu":
        from .. import webgpu
        await webgpu.init_async() if hasattr(webgpu, "init_async") else None
    elif device == "wasm":
        from .. import wasm
        await wasm.init()
    return load(source, device, context=context)


class LLM:
    """A loaded model with its tokenizer: ``generate``, ``chat``, ``stats``, ``stop``."""

    def __init__(self, model, tokenizer, *, metadata: dict | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.metadata = metadata or {}
        self.device = model.device
        self.stats: dict = {}
        self._stop = False
        self._step_logits = None
        self._step_argmax = None
        self._short = None        # webgpu: the steps recorded with attention unsplit, for pos < _split_from
        self._split_from = None
        self.eog = self._end_ids()

    # ---- set-up ---------------------------------------------------------------------------------

    def _end_ids(self) -> set:
        md, tok = self.metadata, self.tokenizer
        ids = {tok.eos_id} if tok.eos_id is not None else set()
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            if md.get(key) is not None:
                ids.add(int(md[key]))
        for text in _EOG_TEXTS:
            i = tok.token_to_id(text)
            if i is not None and tok.is_special(i):
                ids.add(i)
        return ids

    def _steps(self, pos: int | None = None):
        """The compiled one-token steps (logits, argmax) for a step at ``pos`` (captured on their
        first call, replayed after). On webgpu, where a decode step's attention splits over
        positions (``ember.webgpu.quant.decode_split_from``: one more dispatch a layer, which
        pays only once the cache holds a few hundred rows), a second pair recorded unsplit
        serves the positions before that."""
        if self._step_logits is None:
            import ember

            m = self.model

            def logits(ids, pos):
                return m.forward(ids, pos)

            def argmax(ids, pos):
                return F.llm.greedy_tokens(m.forward(ids, pos))
            self._step_logits, self._step_argmax = ember.compile(logits), ember.compile(argmax)
            self._short = self._split_from = None
            if self.device == "webgpu":
                from ..webgpu.quant import decode_split_from

                self._split_from = decode_split_from(m.cfg.n_heads, m.context)
                if self._split_from is not None:
                    self._short = (_Unsplit(ember.compile(logits)), _Unsplit(ember.compile(argmax)))
        if pos is not None and self._short is not None and pos < self._split_from:
            return self._short
        return self._step_logits, self._step_argmax

    def warm_up(self, steps: int | None = None) -> dict:
        """Pay a first reply's one-time costs now: a one-token prompt forward, then ``steps``
        greedy one-token steps through the compiled step (its capture, the recording of its
        wasm command table, and the wasm thread team's probes of one thread against the team:
        ``ember.wasm.team``; the default covers them). The key/value rows these write lie where
        a later reply writes before it reads. Returns ``{"ms", "steps"}``.

        A chat page calls it once after loading: on the CPU backend the first reply's decode
        otherwise includes ~0.2-0.4 s of recording and probing."""
        if steps is None:
            steps = 2
            if self.device == "wasm":
                from ..wasm.plan_exec import TeamSpace
                from ..wasm.team import team

                if team(create=False) is not None:
                    steps += 2 * (TeamSpace.WARMUP + TeamSpace.PROBES)
        steps = max(0, min(int(steps), self.context - 2))
        dev = self.device
        t0 = time.perf_counter()
        self._reserve(steps + 1, warm=False)
        token = self.tokenizer.bos_id if self.tokenizer.bos_id is not None else 0
        self.model.forward(tensor([token], dtype="int32", device=dev), tensor([0], dtype="int32", device=dev))
        # (webgpu's greedy decoding feeds each step the previous one's int64 argmax tensor: that
        # input signature is the plan it replays, so that is the one warmed)
        ids = "int64" if dev == "webgpu" else "int32"
        for pos in range(1, steps + 1):
            token = int(self._steps(pos)[1](tensor([token], dtype=ids, device=dev),
                                            tensor([pos], dtype="int32", device=dev)).tolist()[0])
        if self._short is not None and steps:   # (webgpu: the split step too, recorded at pos `steps`)
            self._step_argmax(tensor([token], dtype=ids, device=dev),
                              tensor([steps], dtype="int32", device=dev)).tolist()
        return {"ms": (time.perf_counter() - t0) * 1000.0, "steps": steps}

    def _reserve(self, positions: int, warm: bool = True) -> float:
        """(wasm) The key/value cache holds ``positions`` rows. When it grows, compiled steps
        made before keep their plans: the old cache is released from them first, then given the
        new one (``plan_exec.release_constants`` / ``bind_constants``: only the attention steps
        are recorded again and the tables rebuilt, every address bounds-checked as when they were
        first built: about 0.1 s for SmolLM2 in Node, 1 or 2 threads, where capturing, recording
        and warming them up again took 0.24-0.42 s). Where that cannot be done the steps are made again and, with ``warm``, warmed
        up at once. Returns the milliseconds that took (0.0: no growth)."""
        if self.device != "wasm":
            return 0.0
        m = self.model
        if m.k_cache is not None and min(int(positions), m.context) <= m.capacity:
            return 0.0
        t0 = time.perf_counter()
        made = self._step_logits is not None
        choice = held = None
        if made:   # the old steps' plans (and their tables' spans) let the old cache go first
            import gc

            from ..wasm.plan_exec import release_constants

            choice = _team_choices(self._step_argmax)
            old = m.k_cache + m.v_cache
            held = [h for step in self._steps() for h in release_constants(step, old)]
            del old
            if not held:   # (no plan holds it: the steps are made again, as before a first reply)
                self._step_logits = self._step_argmax = None
            # (the old cache goes with m.reserve's reference; the collection frees what waits in
            # reference cycles, so the new cache can take its place: without it the shared memory
            # after a long reply was 3 MB larger, for ~30 ms less)
            gc.collect()
        try:
            m.reserve(positions)
        except BaseException:
            if held:   # (their plans hold no cache now)
                self._step_logits = self._step_argmax = None
            raise
        if held:
            # the same steps on the new cache: only their attention steps are recorded again, the
            # tables rebuilt (bounds checked as always) and the team's choices kept; a step that
            # could not be (another plan shape) is captured again at its next call, and warmed here
            from ..wasm.plan_exec import bind_constants

            if bind_constants(held, m.k_cache + m.v_cache):
                if choice:
                    _team_choices(self._step_argmax, choice)
                return (time.perf_counter() - t0) * 1000.0
        if warm and made:
            # the thread team's choice per segment carries over to the same step on the new cache
            # (its probes, 14 steps, are the larger part of a warm-up); the usual watch and
            # re-probes still check it
            self.warm_up(steps=2 if choice else None)
            if choice and not _team_choices(self._step_argmax, choice):
                self.warm_up()   # (another plan structure: probe as usual)
        return (time.perf_counter() - t0) * 1000.0

    @property
    def context(self) -> int:
        return self.model.context

    def stop(self) -> None:
        """End the running generation after the token being computed (safe from another thread
        or a page's message handler)."""
        self._stop = True

    # ---- public API -----------------------------------------------------------------------------

    def generate(self, prompt, *, stream: bool = False, **options):
        """Continue ``prompt`` (text, or a list of token ids) and return the new text (``str``),
        or with ``stream=True`` an iterator of its pieces as they are decoded."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        it = self._run(ids, lstrip=False, **options)
        return it if stream else "".join(it)

    def chat(self, messages: list, *, stream: bool = False, **options):
        """Answer a conversation (``[{"role": "system"|"user"|"assistant", "content": str}]``)
        with the file's own chat template; returns the assistant's reply like ``generate``."""
        tok = self.tokenizer
        ids = tok.encode(tok.chat(messages, add_generation_prompt=True))
        if tok.add_bos and len(ids) > 1 and ids[1] == ids[0]:
            del ids[0]      # the template wrote BOS itself (Llama 2's does): once, as llama.cpp
        it = self._run(ids, **options)
        return it if stream else "".join(it)

    # ---- the loop -------------------------------------------------------------------------------

    def _run(self, ids: list, *, max_tokens: int = 256, temperature: float = 0.0, top_k: int | None = None,
             top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0, seed: int | None = None,
             stop=None, lstrip: bool | None = None):
        # Validate everything before the generator starts, so errors raise at the call.
        sampler = Sampler(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          repetition_penalty=repetition_penalty, seed=seed)
        if max_tokens is None or int(max_tokens) < 0:
            raise SamplingError(f"max_tokens must be >= 0, got {max_tokens!r}")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise SamplingError(f"stop must be a non-empty string or a list of them, got {stop!r}")
        if not ids:
            raise ContextLengthError("generate: the prompt has no tokens", tokens=0, context=self.context)
        if len(ids) >= self.context:
            raise ContextLengthError(f"generate: the prompt has {len(ids)} tokens; the context holds "
                                     f"{self.context} (prompt + at least one new token). Shorten the "
                                     f"prompt or load with a larger context=", tokens=len(ids), context=self.context)
        vocab = self.model.cfg.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise EmberError(f"generate: token id {bad[0]} is outside the vocabulary of {vocab}")
        return self._loop(list(ids), int(max_tokens), sampler, stops, lstrip)

    def _loop(self, ids, max_tokens, sampler, stops, lstrip=None):
        dev = self.device
        self._stop = False
        n_prompt = len(ids)
        stats = self.stats = {"prompt_tokens": n_prompt, "tokens": 0, "prefill_ms": 0.0, "decode_ms": 0.0,
                              "prompt_tokens_per_second": 0.0, "decode_tokens_per_second": 0.0,
                              "device": dev, "finish_reason": "length"}
        max_tokens = min(max_tokens, self.context - n_prompt)
        if max_tokens == 0:
            return
        history = list(ids)
        # a reply's first space is dropped as decode drops it (SentencePiece's "▁Hello" after
        # the chat prompt is "Hello"); generate's text continues the prompt and keeps it
        dec = self.tokenizer.stream(lstrip=lstrip)
        held = ""          # text not yet given out: it might be the start of a stop string
        cut_by_stop = False
        longest = max((len(s) for s in stops), default=0)

        stats["grow_ms"] = self._reserve(n_prompt + max_tokens)
        # prefill: the prompt in batched chunks; the last chunk's logits give the first token
        t0 = time.perf_counter()
        logits = None
        for start in range(0, n_prompt, PREFILL_CHUNK):
            chunk = ids[start:start + PREFILL_CHUNK]
            logits = self.model.forward(tensor(chunk, dtype="int32", device=dev),
                                        tensor([start], dtype="int32", device=dev))
        token = sampler.pick(logits, history)
        t1 = time.perf_counter()
        stats["prefill_ms"] = (t1 - t0) * 1000.0
        stats["prompt_tokens_per_second"] = n_prompt / max(t1 - t0, 1e-9)
        step_logits, step_argmax = self._steps()
        pos = n_prompt
        steps = 0
        t_dec = 0.0
        timer = [0.0]
        fed = None
        if dev == "webgpu" and not sampler.needs_logits and RUN_AHEAD > 1:
            fed = self._fed_tokens(lambda p: self._steps(p)[1], token, pos, max_tokens - 1, timer)
        while True:
            if token in self.eog:
                stats["finish_reason"] = "stop"
                break
            history.append(token)
            stats["tokens"] += 1
            piece = dec.put(token)
            if piece:
                held += piece
                if stops:
                    hit = min((held.find(s) for s in stops if s in held), default=-1)
                    if hit >= 0:
                        if held[:hit]:
                            yield held[:hit]
                        held = ""
                        stats["finish_reason"] = "stop"
                        cut_by_stop = True
                        break
                    # give out all but what could still grow into a stop string
                    cut = len(held) - (longest - 1)
                    if cut > 0:
                        yield held[:cut]
                        held = held[cut:]
                else:
                    yield held
                    held = ""
            if stats["tokens"] >= max_tokens or self._stop:
                stats["finish_reason"] = "stopped" if self._stop else "length"
                break
            if fed is not None:
                token = next(fed)
                steps += 1
                continue
            ts = time.perf_counter()
            args = (tensor([token], dtype="int32", device=dev), tensor([pos], dtype="int32", device=dev))
            step_logits, step_argmax = self._steps(pos)
            if sampler.needs_logits:
                token = sampler.pick(step_logits(*args), history)
            else:
                token = int(step_argmax(*args).tolist()[0])
            t_dec += time.perf_counter() - ts
            steps += 1
            pos += 1
        if not cut_by_stop:
            tail = held + dec.flush()
            hits = [tail.find(s) for s in stops if s in tail]
            if hits:
                tail = tail[:min(hits)]
            if tail:
                yield tail
        if fed is not None:
            fed.close()
            t_dec = timer[0]
        stats["decode_ms"] = t_dec * 1000.0
        stats["decode_tokens_per_second"] = steps / t_dec if t_dec > 0 else 0.0
        if dev == "wasm":
            stats["threads"] = _wasm_threads(step_logits if sampler.needs_logits else step_argmax)

    def _fed_tokens(self, step_at, token: int, pos: int, n: int, timer: list):
        """The next ``n`` greedy tokens (an iterator), each step fed the previous step's argmax
        tensor on the GPU: batches of steps (2, 4, ... ``RUN_AHEAD``, so the first tokens still
        stream early) are enqueued with a read of their tokens started behind them; the next
        batch is enqueued before that read is waited for, so the GPU is never left without work
        while the host waits for tokens, hands them out and encodes the next steps.
        ``timer[0]`` gathers the seconds spent enqueuing and waiting. Closing it early waits for
        the read in flight (the steps enqueued past the stop still run: their cache rows lie
        where a later reply writes before it reads). ``step_at(pos)``: the step for ``pos``."""
        from ..webgpu.replay import read_ints_later   # (the loop runs on webgpu only)

        dev = self.device
        # int64 like argmax's output: every step replays one plan (one input signature)
        r = tensor([token], dtype="int64", device=dev)
        batch = 2
        pending = None
        try:
            while n > 0 or pending is not None:
                t0 = time.perf_counter()
                started = None
                if n > 0:
                    outs = []
                    for _ in range(min(batch, n)):
                        r = step_at(pos)(r, tensor([pos], dtype="int32", device=dev))
                        outs.append(r)
                        pos += 1
                    n -= len(outs)
                    batch = min(2 * batch, RUN_AHEAD)
                    started = read_ints_later(outs)
                toks = pending() if pending is not None else ()
                pending = started
                timer[0] += time.perf_counter() - t0
                yield from toks
        finally:
            if pending is not None:
                try:
                    pending()
                except EmberError:   # (a device lost meanwhile says so at the next call)
                    pass


class _Unsplit:
    """A compiled step recorded and replayed with attention unsplit (webgpu,
    ``ember.webgpu.quant.attn_unsplit``): the decode step of the short positions."""

    def __init__(self, step):
        self.step = step

    def __call__(self, *args):
        from ..webgpu.quant import attn_unsplit

        with attn_unsplit():
            return self.step(*args)

    def plan_for(self, *args):
        return self.step.plan_for(*args)


def _wasm_threads(step) -> int:
    """How many threads the wasm one-token step ran on last (the thread team's choice per
    segment: ``ember.wasm.team``; 1 without a team)."""
    from ..wasm.team import team

    t = team(create=False)
    if t is None:
        return 1
    for plan in step.plans.values():
        fast = getattr(plan, "fast", None)
        if getattr(getattr(fast, "space", None), "kind", None) != "threads":
            continue
        if not t.adaptive or any((getattr(s, "team_stats", None) or {}).get("use") for s in fast.segments):
            return t.ready()
    return 1


def _team_choices(step, give: dict | None = None):
    """The wasm thread team's choice for each table segment of compiled ``step``'s plans
    (``{signature: [use, ...]}``, only where every segment has made one), or with ``give``:
    set those choices on ``step``'s plans of the same signatures and segment counts (True if
    all were set)."""
    out, done, given = {}, True, 0
    for key, plan in getattr(step, "plans", {}).items():
        fast = getattr(plan, "fast", None)
        segs = getattr(fast, "segments", None) if getattr(fast, "ready", False) else None
        if not segs or getattr(getattr(fast, "space", None), "kind", None) != "threads":
            continue
        if give is None:
            uses = [(getattr(sg, "team_stats", None) or {}).get("use") for sg in segs]
            if all(u is not None for u in uses):
                out[key] = uses
            continue
        uses = give.get(key)
        if uses is None or len(uses) != len(segs):
            done = False
            continue
        for sg, u in zip(segs, uses):
            sg.team_stats = {"n": 0, True: [], False: [], "use": u, "watch": [0, float("inf")]}
        given += 1
    return out if give is None else (done and given > 0)


