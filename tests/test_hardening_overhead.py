"""What the allocation ceiling costs per eager op: ``registry.apply`` with its one
``_limit(...)`` call against the same function with that line removed, interleaved in one
process on tiny tensors (where per-op overhead dominates).

    .venv/bin/python tests/test_hardening_overhead.py      # the A/B table
"""
from __future__ import annotations

import inspect
import statistics
import timeit

import ember
import ember.registry as R

LINE = "    _limit(name, out_shape, out_dtype, dev)\n"


def apply_without_limit():
    src = inspect.getsource(R.apply)
    assert LINE in src, "registry.apply no longer has the _limit line"
    ns = dict(R.__dict__)
    exec(compile(src.replace(LINE, ""), R.__file__, "exec"), ns)
    return ns["apply"]


def measure(rounds: int = 7, number: int = 5000) -> dict:
    without, with_ = apply_without_limit(), R.apply
    cases = {}
    for dev in ("python", "numpy"):
        try:
            a, b = ember.ones((2, 3), device=dev), ember.ones((2, 3), device=dev)
        except Exception:  # noqa: BLE001 - numpy missing
            continue
        cases[f"add/{dev}"] = lambda ap, a=a, b=b: ap("add", a, b)
        cases[f"exp/{dev}"] = lambda ap, a=a: ap("exp", a)
        cases[f"full/{dev}"] = lambda ap, dev=dev: ap("full", shape=(2, 3), value=0.0, dtype=ember.float32, device=dev)
    out = {}
    for name, f in cases.items():
        t = {"without": [], "with": []}
        for _ in range(rounds):
            for label, ap in (("without", without), ("with", with_)):
                t[label].append(min(timeit.repeat(lambda: f(ap), number=number, repeat=3)) / number * 1e9)
        out[name] = {k: statistics.median(v) for k, v in t.items()}
    check = min(timeit.repeat(lambda: R._limit("add", (2, 3), ember.float32, "python"), number=100_000,
                              repeat=5)) / 100_000 * 1e9
    out["check_output alone"] = {"with": check}
    return out


def test_the_check_is_cheap():
    # the check itself, not the noisy A/B: well under a microsecond on any machine that runs ops
    n = 20_000
    t = min(timeit.repeat(lambda: R._limit("add", (2, 3, 4), ember.float32, "python"), number=n, repeat=5)) / n
    assert t < 2e-6, t


if __name__ == "__main__":
    for name, v in measure().items():
        if "without" in v:
            d = v["with"] - v["without"]
            print(f"{name:14s} without {v['without']:7.0f} ns   with {v['with']:7.0f} ns   "
                  f"diff {d:+5.0f} ns ({100 * d / v['without']:+.1f}%)")
        else:
            print(f"{name:14s} {v['with']:.0f} ns per call")
