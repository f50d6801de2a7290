"""Choosing the next token from a row of logits, in pure Python (it runs in the page too).

The order is llama.cpp's and transformers': repetition penalty, then temperature (0 = greedy:
the largest logit, lowest id on ties), then top-k, top-p (nucleus), min-p, and a draw from what
is left with the generator's next number.

>>> import random
>>> s = Sampler(temperature=0)
>>> s([0.1, 2.0, -1.0], history=[])
1
>>> s = Sampler(temperature=1.0, top_k=1, rng=random.Random(0))
>>> s([0.1, 2.0, 3.0], history=[])
2
>>> Sampler(repetition_penalty=10.0, temperature=0)([5.0, 4.0], history=[0])
1
"""
from __future__ import annotations

import heapq
import math
import random

from ..errors import EmberError


class SamplingError(EmberError, ValueError):
    """An invalid sampling option (negative temperature, top_p outside (0, 1]...)."""


# top_k used when sampling (temperature > 0) and the caller gave none: the tail of a 50k
# vocabulary carries almost no mass, and sorting it per token would cost more than the token.
DEFAULT_TOP_K = 40


class Sampler:
    """``sampler(logits, history) -> token id``; ``history`` is the ids seen so far (prompt and
    generated), which the repetition penalty discounts. ``top_k=0`` disables the top-k cut."""

    def __init__(self, *, temperature: float = 0.0, top_k: int | None = None, top_p: float = 1.0,
                 min_p: float = 0.0, repetition_penalty: float = 1.0, seed: int | None = None,
                 rng: random.Random | None = None, penalty_window: int = 64):
        if temperature is None or temperature < 0 or math.isnan(temperature):
            raise SamplingError(f"temperature must be >= 0 (0 = greedy), got {temperature!r}")
        if top_k is not None and top_k < 0:
            raise SamplingError(f"top_k must be >= 0 (0 = no cut), got {top_k!r}")
        if not 0.0 < top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], got {top_p!r}")
        if not 0.0 <= min_p <= 1.0:
            raise SamplingError(f"min_p must be in [0, 1], got {min_p!r}")
        if not repetition_penalty > 0:
            raise SamplingError(f"repetition_penalty must be > 0 (1 = none), got {repetition_penalty!r}")
        self.temperature = float(temperature)
        self.top_k = DEFAULT_TOP_K if top_k is None else int(top_k)
        self.top_p, self.min_p = float(top_p), float(min_p)
        self.penalty = float(repetition_penalty)
        self.window = penalty_window
        self.rng = rng or random.Random(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_logits(self) -> bool:
        """False when the largest logit alone decides (greedy, no penalty): a device argmax."""
        return not (self.greedy and self.penalty == 1.0)

    def __call__(self, logits: list, history) -> int:
        if self.penalty != 1.0 and history:
            logits = list(logits)
            p = self.penalty
            for t in set(history[-self.window:]):
                if 0 <= t < len(logits):
                    v = logits[t]
                    logits[t] = v / p if v > 0 else v * p
        if self.greedy:
            return logits.index(max(logits))
        n = len(logits)
        if 0 < self.top_k < n:
            cand = heapq.nlargest(self.top_k, range(n), key=logits.__getitem__)
        else:
            cand = sorted(range(n), key=logits.__getitem__, reverse=True)
        inv_t = 1.0 / self.temperature
        top = logits[cand[0]]
        w = [math.exp((logits[i] - top) * inv_t) for i in cand]
        z = sum(w)
        probs = [x / z for x in w]
        keep = len(cand)
        if self.top_p < 1.0:
            acc = 0.0
            for j, p in enumerate(probs):
                acc += p
                if acc >= self.top_p:
                    keep = j + 1
                    break
        if self.min_p > 0.0:
            floor = self.min_p * probs[0]
            keep = min(keep, max(1, sum(1 for p in probs if p >= floor)))
        probs = probs[:keep]
        r = self.rng.random() * sum(probs)
        acc = 0.0
        for i, p in zip(cand, probs):
            acc += p
            if r < acc:
                return i
        return cand[keep - 1]
