"""Choosing the next token from a row of logits, in pure Python (it runs in the page too).

The order is llama.cpp's and transformers': repetition penalty, then temperature (0 = greedy:
the largest logit, lowest id on ties), then top-k, top-p (nucleus), min-p, and a draw from what
is left with the generator's next number. ``Sampler.pick`` gives the same token from a device
tensor of logits while visiting only the few ids that can matter (see there).

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
import struct
import sys

from ..errors import EmberError


class SamplingError(EmberError, ValueError):
    """An invalid sampling option (negative temperature, top_p outside (0, 1]...)."""


# top_k used when sampling (temperature > 0) and the caller gave none: the tail of a 50k
# vocabulary carries almost no mass, and sorting it per token would cost more than the token.
DEFAULT_TOP_K = 40

# ``Sampler.pick``: the candidate set it aims for (ids above the threshold), the thresholds it
# tries per token, and the distance below the largest logit (in units of the temperature) past
# which a weight exp((logit - top) / T) is exactly 0 in float64 (below about -745.1).
CANDIDATES = 256
GAP_TRIES = 10
UNDERFLOW = 800.0
# devices whose compare runs in Python (one op per id): the whole row is cheaper there
ROW_DEVICES = {"python"}
_BIG_ENDIAN = sys.byteorder == "big"


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
        self.fast = self.full = 0      # tokens ``pick`` chose from candidates / from the whole row
        self._gap = 4.0                # pick's last threshold distance below the largest logit

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_logits(self) -> bool:
        """False when the largest logit alone decides (greedy, no penalty): a device argmax."""
        return not (self.greedy and self.penalty == 1.0)

    def __call__(self, logits: list, history) -> int:
        """The token for one row of logits (a list of floats): the specification, every token
        of the vocabulary visited in Python. ``pick`` gives the same token from a device tensor."""
        logits = self._penalized(logits, history)
        if self.greedy:
            return logits.index(max(logits))
        n = len(logits)
        if 0 < self.top_k < n:
            cand = heapq.nlargest(self.top_k, range(n), key=logits.__getitem__)
        else:
            cand = sorted(range(n), key=logits.__getitem__, reverse=True)
        return self._draw(cand, logits)

    def _draw(self, cand: list, value, complete: bool = True):
        """Temperature, top-p, min-p and the draw over ``cand`` (ids, best first; ``value[id]``
        their logits). ``complete=False``: ``cand`` is only the head of the full order, and
        every id after it has weight exactly 0 (``pick`` checks that); the result is then the
        same as over the full order, or None where that is the full order's last id (a draw
        past the rounded total with nothing cut: the caller finds it from the whole row)."""
        inv_t = 1.0 / self.temperature
        top = value[cand[0]]
        w = [math.exp((value[i] - top) * inv_t) for i in cand]
        z = sum(w)               # the zeros of a missing tail would not change it (nor sum(probs))
        probs = [x / z for x in w]
        keep = len(cand)
        cut = complete
        if self.top_p < 1.0:
            acc = 0.0
            for j, p in enumerate(probs):
                acc += p
                if acc >= self.top_p:
                    keep = j + 1
                    cut = True
                    break
        if self.min_p > 0.0:
            floor = self.min_p * probs[0]
            # a floor of 0 counts the missing tail's zeros too: no cut over the full order
            if complete or floor > 0.0:
                keep = min(keep, max(1, sum(1 for p in probs if p >= floor)))
                cut = True
        probs = probs[:keep]
        r = self.rng.random() * sum(probs)
        acc = 0.0
        for i, p in zip(cand, probs):
            acc += p
            if r < acc:
                return i
        return cand[keep - 1] if cut else None

    # ---- the same token from a device tensor ----------------------------------------------------

    def pick(self, logits, history) -> int:
        """``self(logits.tolist()[0], history)`` for a device tensor ``logits`` of shape
        ``(1, vocab)``, visiting only the ids whose logit is at least a threshold below the
        largest: the device compares (one op), Python reads one byte per id and the few values
        above it.

        Only exact shortcuts (the draws from ``self.rng`` are the same too):

        - greedy with a repetition penalty, or ``0 < top_k < vocab``: the ids above the
          threshold, once at least ``top_k`` (greedy: 1) of them are not penalized, plus the
          penalized ids, hold the full order's first ``top_k``: an id below the threshold that
          is not penalized is smaller than each of those ``top_k``;
        - no top-k cut: the ids above a threshold at which ``exp((logit - top) / T)`` is exactly
          0 for every id below it (their weights add exact zeros to every sum);

        otherwise (a NaN or infinite largest logit, a NaN after the penalty, too many ids above
        every threshold tried, a draw that needs the full order's last id) it runs ``self``
        on the whole row. ``self.fast`` / ``self.full`` count the two ways."""
        n = logits.shape[-1] if logits.ndim == 2 and logits.shape[0] == 1 else 0
        if (not n or logits.dtype.name != "float32" or _BIG_ENDIAN or logits.device in ROW_DEVICES
                or (self.greedy and self.penalty == 1.0)):
            return self._full(logits, history)
        pen = ()
        if self.penalty != 1.0 and history:
            pen = sorted(t for t in set(history[-self.window:]) if 0 <= t < n)
        mx = float(logits.max().item())
        if not math.isfinite(mx):          # NaN anywhere (max propagates it), or an infinity
            return self._full(logits, history)
        if self.greedy:
            need, thr = 1, None
        elif 0 < self.top_k < n:
            need, thr = self.top_k, None
        else:                              # no top-k cut: weights that underflow to 0
            need, thr = 1, _f32_below(mx - UNDERFLOW * self.temperature)
            if thr is None:
                return self._full(logits, history)
        mask = self._above(logits, mx, thr, need, pen, n)
        if mask is None:
            return self._full(logits, history)
        vals = memoryview(logits._bytes()).cast("f")
        value = {}
        i = mask.find(1)
        while i >= 0:
            value[i] = vals[i]
            i = mask.find(1, i + 1)
        p = self.penalty
        for t in pen:
            v = vals[t]
            value[t] = v / p if v > 0 else v * p
        ids = sorted(value)
        if any(v != v or v == math.inf for v in value.values()):
            return self._full(logits, history)
        if self.greedy:
            self.fast += 1
            return max(ids, key=value.__getitem__)   # the first largest, as list.index(max(...))
        if thr is None:
            cand = heapq.nlargest(self.top_k, ids, key=value.__getitem__)
            token = self._draw(cand, value)
        else:
            cand = sorted(ids, key=value.__getitem__, reverse=True)
            top = value[cand[0]]
            # every id below thr is not penalized and below it: (logit - top) / T < -750 there
            if not (thr - top) * (1.0 / self.temperature) < -750.0:
                return self._full(logits, history)
            token = self._draw(cand, value, complete=len(cand) == n)
            if token is None:              # the full order's last id (the draw is made already)
                self.full += 1
                row = self._penalized(logits.tolist()[0], history)
                return sorted(range(n), key=row.__getitem__, reverse=True)[-1]
        self.fast += 1
        return token

    def _above(self, logits, mx: float, thr, need: int, pen, n: int):
        """The bytes of ``logits >= threshold`` (one per id) with at least ``need`` ids that are
        not in ``pen`` set, or None. A fixed ``thr`` is used as given; else the threshold is
        ``mx - gap``, the gap searched from the last one that worked (as few ids as possible
        above ``need``, at most ``CANDIDATES`` if the search finds it)."""
        limit = max(CANDIDATES, 4 * (need + len(pen)))
        if thr is not None:
            mask = (logits >= thr)._bytes()
            c = mask.count(1)
            return mask if need <= c - sum(mask[t] for t in pen) and c <= max(limit, n // 8) else None
        gap, lo, hi, best = self._gap, 0.0, math.inf, None
        for _ in range(GAP_TRIES):
            mask = (logits >= mx - gap)._bytes()
            c = mask.count(1)
            if c - sum(mask[t] for t in pen) < need:
                lo = gap
                gap = gap * 2.0 if hi == math.inf else math.sqrt(lo * hi)
                continue
            best, hi = mask, gap
            if c <= limit:
                break
            gap = math.sqrt(lo * hi) if lo > 0 else gap / 2.0
        if best is None or best.count(1) > max(limit, n // 8):
            return None
        self._gap = hi
        return best

    def _penalized(self, logits: list, history) -> list:
        if self.penalty != 1.0 and history:
            logits = list(logits)
            p = self.penalty
            for t in set(history[-self.window:]):
                if 0 <= t < len(logits):
                    v = logits[t]
                    logits[t] = v / p if v > 0 else v * p
        return logits

    def _full(self, logits, history) -> int:
        self.full += 1
        return self(logits.tolist()[0], history)


def _f32_below(x: float) -> float | None:
    """A float32 value <= ``x`` (a threshold every backend compares without rounding), or None
    when ``x`` is outside float32's finite range."""
    try:
        y = struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return None
    if y > x:
        y = struct.unpack("<f", struct.pack("<f", x - abs(x) * 2.0 ** -23))[0]
    return y if math.isfinite(y) and y <= x else None
