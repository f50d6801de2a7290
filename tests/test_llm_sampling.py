"""ember.llm's Sampler: ``pick`` (the token from a device tensor, through a candidate set above a
threshold) against the specification ``Sampler.__call__`` (every id of the row in Python), on
random logits with ties, signed zeros, infinities and NaN, for many options and seeds, on every
backend; and whole generations of the tiny GGUF with the full path as the reference."""
import random

import numpy as np
import pytest

import ember
import ember.llm
from ember.llm import sampling
from ember.llm.sampling import Sampler
from llm_fixtures import write_tiny_gguf

V = 1000


@pytest.fixture(autouse=True)
def every_device_shortcut(monkeypatch):
    # the python backend normally takes the whole row (its compare runs in Python): test the
    # shortcut there too
    monkeypatch.setattr(sampling, "ROW_DEVICES", set())


def _rows(rs: np.random.RandomState, kind: str) -> np.ndarray:
    """(4, V) float32 logits of one kind."""
    x = rs.randn(4, V).astype(np.float32) * 3
    if kind == "ties":            # few distinct values: ties at every threshold, +-0
        x = np.round(x) * 0.5
        x[x == 0] = np.where(rs.rand(int((x == 0).sum())) < 0.5, -0.0, 0.0)
    elif kind == "neg_inf":       # masked ids, some rows mostly masked
        x[rs.rand(4, V) < np.array([[0.1], [0.5], [0.97], [0.999]])] = -np.inf
    elif kind == "nan":
        x[0, 7] = np.nan
        x[1, :] = np.nan
        x[2, rs.randint(0, V, 3)] = np.nan
    elif kind == "inf":
        x[0, 3] = np.inf
        x[1, [5, 900]] = np.inf
    elif kind == "spread":        # a head near the top, the rest far below: weights underflow
        x[:, 50:] -= np.float32(3000.0)
        x[1, 60] = x[1, :50].max() - 1       # a penalized id may climb back (penalty < 1)
    elif kind == "flat":
        x[0] = 1.25
        x[1] = rs.randint(0, 3, V)
    elif kind == "scaled":
        x *= np.float32(1e4)
    return x.astype(np.float32)


KINDS = ("plain", "ties", "neg_inf", "nan", "inf", "spread", "flat", "scaled")

OPTIONS = [
    dict(temperature=0.7),
    dict(temperature=0.7, repetition_penalty=1.3),
    dict(temperature=1.0, repetition_penalty=0.8, top_k=5),
    dict(temperature=0.0, repetition_penalty=1.3),
    dict(temperature=0.0, repetition_penalty=0.7),
    dict(temperature=1.5, top_k=1),
    dict(temperature=0.9, top_k=V - 1, repetition_penalty=1.1),
    dict(temperature=0.9, top_k=V),
    dict(temperature=0.7, top_k=0),
    dict(temperature=0.7, top_k=0, top_p=0.9, repetition_penalty=1.2),
    dict(temperature=0.05, top_k=0, min_p=0.05),
    dict(temperature=0.8, top_p=0.5, min_p=0.1),
    dict(temperature=0.8, top_k=60, top_p=0.95, min_p=1e-320),
    dict(temperature=2.0, repetition_penalty=float("inf")),
    dict(temperature=0.0, repetition_penalty=float("inf")),
]


def _history(rs):
    # repeats, ids past the vocabulary and negative ones (the penalty skips those)
    return [int(t) for t in rs.randint(0, V, 80)] + [V + 3, -2, 5, 5]


def test_pick_equals_the_full_path(device):
    rs = np.random.RandomState(1)
    fast = total = 0
    for kind in KINDS:
        rows = _rows(rs, kind)
        t = ember.tensor(rows, dtype="float32", device=device)
        lists = rows.tolist()
        for o, opts in enumerate(OPTIONS):
            seed = int(rs.randint(1 << 30))
            a, b = Sampler(seed=seed, **opts), Sampler(seed=seed, **opts)
            hist = _history(rs)
            for r in range(4):
                got = a.pick(t[r:r + 1], hist)
                want = b(lists[r], hist)
                assert got == want, (kind, opts, r)
                hist.append(want)
            assert a.rng.getstate() == b.rng.getstate(), (kind, opts)
            fast += a.fast
            total += a.fast + a.full
            if kind == "nan":
                assert a.fast <= 1, (kind, opts)   # only the row without NaN
    assert fast > total // 2, (fast, total)        # the shortcut ran most of the time


@pytest.mark.parametrize("opts", [dict(temperature=0.7), dict(temperature=0.7, top_k=0),
                                  dict(temperature=0.9, top_k=0, top_p=0.999, min_p=1e-320),
                                  dict(temperature=0.9, top_k=0, min_p=5e-324),   # floor 0
                                  dict(temperature=0.7, repetition_penalty=1.5)])
def test_pick_draw_past_the_total(device, opts):
    # a generator at its upper end (r = the whole sum): the draw runs past every candidate and the
    # result is the kept order's last id, for the no-cut case the full order's very last id
    class Top(random.Random):
        def random(self):
            return 1.0

    rs = np.random.RandomState(2)
    rows = _rows(rs, "spread")
    rows[2, :] = rows[2, :50].min()             # ties at the bottom of the full order too
    rows[2, :50] = rs.randn(50)
    t = ember.tensor(rows, dtype="float32", device=device)
    for r in range(4):
        a, b = Sampler(rng=Top(), **opts), Sampler(rng=Top(), **opts)
        hist = [3, 4, 700]
        assert a.pick(t[r:r + 1], hist) == b(rows[r].tolist(), hist), (opts, r)


def test_pick_threshold_edges(device):
    # rows built around the first threshold pick tries (4 below the largest logit): it holds one
    # id too few for the cut, or enough ids only when the penalized ones are counted; the next
    # id lies just below it. And a penalized largest logit: the ids below the "weights are 0"
    # threshold are not 0 against the penalized top, so that shortcut must not be taken.
    rows, cases = [], []
    for k in (1, 2, 5):
        x = np.full(V, -50.0, np.float32)
        x[10:10 + k - 1] = 10.0 - np.arange(k - 1, dtype=np.float32) * 0.25
        x[500] = 5.9                                 # the k-th: just below 10 - 4
        rows.append(x)
        cases.append((dict(temperature=10.0, top_k=k), [999]))
        y = x.copy()
        y[300] = 9.0                                 # above the threshold, penalized below 5.9
        rows.append(y)
        cases.append((dict(temperature=10.0, top_k=k, repetition_penalty=3.0), [300, 999]))
    z = np.full(V, 1.99, np.float32)
    z[[0, 1]] = [10.0, 9.0]                          # penalized to ~0
    z[2] = 2.0
    rows.append(z)
    cases.append((dict(temperature=0.01, top_k=0, repetition_penalty=1e4), [0, 1]))
    rows.append(z)
    cases.append((dict(temperature=0.0, repetition_penalty=1e4), [0, 1]))
    t = ember.tensor(np.stack(rows), device=device)
    for r, (opts, hist) in enumerate(cases):
        for seed in range(12):
            a, b = Sampler(seed=seed, **opts), Sampler(seed=seed, **opts)
            assert a.pick(t[r:r + 1], hist) == b(rows[r].tolist(), hist), (opts, seed)


def test_pick_large_vocabulary_numpy():
    # SmolLM2's vocabulary size, logits of a language model's shape (a few large, a long tail)
    rs = np.random.RandomState(3)
    n = 49152
    x = (rs.standard_t(4, (8, n)) * 2).astype(np.float32)
    t = ember.tensor(x, device="numpy")
    for opts in (dict(temperature=0.7), dict(temperature=0.7, top_p=0.9, repetition_penalty=1.2),
                 dict(temperature=0.02, top_k=0)):
        a, b = Sampler(seed=7, **opts), Sampler(seed=7, **opts)
        hist = [int(i) for i in rs.randint(0, n, 300)]
        for r in range(8):
            assert a.pick(t[r:r + 1], hist) == b(x[r].tolist(), hist)
        assert a.fast == 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("llm") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def test_generation_equals_the_full_path(device, tiny, monkeypatch):
    m = ember.llm.load(str(tiny), device=device, context=64)
    cases = [dict(temperature=0.8, seed=s) for s in range(3)] + [
        dict(temperature=1.2, top_k=5, seed=4), dict(temperature=0.7, top_p=0.8, repetition_penalty=1.3, seed=5),
        dict(temperature=0.0, repetition_penalty=1.5), dict(temperature=1.0, top_k=0, min_p=0.1, seed=6),
        dict(temperature=0.9, stop="e", seed=7)]
    got = [m.generate("the", max_tokens=10, **kw) for kw in cases]
    full = Sampler.pick
    picks = []

    def spy(self, logits, history):
        tok = full(self, logits, history)
        picks.append((self.fast, self.full))
        return tok
    monkeypatch.setattr(Sampler, "pick", lambda self, logits, history: self(logits.tolist()[0], history))
    want = [m.generate("the", max_tokens=10, **kw) for kw in cases]
    assert got == want
    monkeypatch.setattr(Sampler, "pick", spy)
    assert m.generate("the", max_tokens=10, **cases[0]) == want[0]
    assert picks and picks[-1][0] > 0      # the shortcut chose the tokens
