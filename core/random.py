"""Random numbers: one seeded generator (``ember.manual_seed``) for parameter initialisation,
``rand`` / ``randn`` / ``randint`` / ``randperm``, Dropout and DataLoader shuffling.

Values are drawn in Python (C-speed byte operations, no loop per value) and uploaded to the
device, so a seed gives the same numbers on every backend.

>>> import ember
>>> ember.manual_seed(0); a = ember.rand(3).tolist()
>>> ember.manual_seed(0); a == ember.rand(3).tolist()
True
"""
from __future__ import annotations

import math
import random as _random
from math import prod

from . import dtypes as _dt
from .registry import CAPTURE

__all__ = ["manual_seed", "seed_state", "rand", "randn", "randint", "randperm", "bernoulli_mask"]

_rng = _random.Random(0)
_SET_BIT7 = bytes(b | 0x80 for b in range(256))


def manual_seed(seed: int) -> None:
    """Reseed ember's generator (parameter init, rand/randn, Dropout, DataLoader shuffling)."""
    _rng.seed(int(seed))


def seed_state():
    """The generator's state (``random.Random.getstate()``), for checkpoints; restore it with
    ``ember.random.set_state``."""
    return _rng.getstate()


def set_state(state) -> None:
    _rng.setstate(state)


def _size(size, op: str = "rand", dtype=_dt.float32) -> tuple:
    """The shape, checked (ints, not negative) and held to the allocation ceiling
    (``ember.set_max_tensor_bytes``) before a single value is drawn: ``randn((10**10, 10**10))``
    is a clear error, not a hang or a MemoryError."""
    from . import limits

    if len(size) == 1 and isinstance(size[0], (list, tuple)):
        size = tuple(size[0])
    shape = limits.check_shape(op, size)
    limits.check_alloc(op, shape, dtype)
    return shape


def _no_plan(shape) -> None:
    """Random values drawn here while a plan is being captured would be replayed as constants:
    that capture must run eagerly instead (``randint``, ``randperm``, ``uniform_bits``; Dropout
    and ``rand``/``randn`` draw through ``_one_to_two``, which a plan replays)."""
    cap = CAPTURE[0]
    if cap is not None and cap.reason is None:
        cap.reason = (f"random numbers drawn while capturing (shape {tuple(shape)}: randint/randperm); a plan "
                      f"would replay the same values")


def uniform_bits(shape) -> bytes:
    """float32 bytes uniform in [1, 2): exponent 127 and 23 random mantissa bits per value."""
    _no_plan(shape)
    return _uniform_bits(shape)


def _uniform_bits(shape) -> bytes:
    n = prod(shape)
    rnd = _rng.randbytes(4 * n)
    bits = bytearray(rnd)
    bits[3::4] = b"\x3f" * n                       # sign 0, exponent bits 7..1 = 0111111
    bits[2::4] = rnd[2::4].translate(_SET_BIT7)    # exponent bit 0 = 1, 7 random mantissa bits
    return bytes(bits)


def _one_to_two(shape, device):
    """Uniform float32 values in [1, 2). While ``ember.compile`` captures, the draw is a host
    step of the plan: every replay draws new values (the generator's next ones, as eager code
    would), so a dropout mask or ``rand``/``randn`` noise is never frozen into a plan."""
    from .tensor import from_bytes

    def draw():
        return from_bytes(_uniform_bits(shape), shape, _dt.float32, device=device)
    t = draw()
    cap = CAPTURE[0]
    if cap is not None:
        cap.on_random(t, draw)
    return t


def rand(*size, dtype=None, device=None, requires_grad: bool = False):
    """Uniform values in [0, 1) (float32 unless ``dtype`` says otherwise)."""
    from .autograd import no_grad
    shape = _size(size)
    with no_grad():
        t = _one_to_two(shape, device) - 1.0
        dt = _dt.get(dtype) if dtype is not None else _dt.float32
        t = t if dt is _dt.float32 else t.astype(dt)
    return t.requires_grad_() if requires_grad else t


def randn(*size, dtype=None, device=None, requires_grad: bool = False):
    """Standard normal values (Box-Muller on two uniform draws)."""
    from .autograd import no_grad
    shape = _size(size, "randn")
    with no_grad():
        u1 = 2.0 - _one_to_two(shape, device)          # (0, 1]: log stays finite
        u2 = _one_to_two(shape, device) - 1.0
        t = (u1.log() * -2.0).sqrt() * (u2 * (2.0 * math.pi)).cos()
        dt = _dt.get(dtype) if dtype is not None else _dt.float32
        t = t if dt is _dt.float32 else t.astype(dt)
    return t.requires_grad_() if requires_grad else t


def randint(low, high=None, size=(), *, dtype=None, device=None):
    """Integers uniform in [low, high) (int64 unless ``dtype`` says otherwise)."""
    from .tensor import tensor
    if high is None:
        low, high = 0, low
    shape = _size(size if not isinstance(size, int) else (size,), "randint", _dt.int64) if size != () else ()
    _no_plan(shape)
    vals = [_rng.randrange(low, high) for _ in range(prod(shape))]
    t = tensor(vals, dtype=dtype or _dt.int64, device=device)
    return t.reshape(shape)


def randperm(n: int, *, device=None):
    """A random permutation of 0..n-1 (int64)."""
    from .tensor import tensor
    (n,) = _size((n,), "randperm", _dt.int64)
    _no_plan((n,))
    p = list(range(n))
    _rng.shuffle(p)
    return tensor(p, dtype=_dt.int64, device=device)


def bernoulli_mask(shape, keep: float, device):
    """A bool tensor, True with probability ``keep`` (Dropout's mask)."""
    return _one_to_two(shape, device) < (1.0 + keep)
