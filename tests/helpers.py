"""pytest helpers around ``op_cases``: run ember on a device and numpy on the host, compare dtype,
shape and values (NaN-aware; float tolerances per output dtype from ``op_cases.TOLERANCES``
unless the case gives its own; ints and bools exact), and fail with a message that names the
case, the device, the inputs and the first mismatches.

Use::

    from helpers import check, check_arrays, raises
    from op_cases import OpCase, S

    @pytest.mark.parametrize("case", MY_CASES, ids=lambda c: c.id)
    def test_my_ops(case, device):
        check(case, device)

    def test_hypothesis_thing(device):            # arrays you already have (e.g. from hypothesis)
        check_arrays(lambda e, a, b: e.add(a, b), lambda np, a, b: a + b, [a_np, b_np], device)

    with raises(ShapeError, "matmul", "(2, 3)"):  # typed error whose message names what/where
        ...
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

import ember
from op_cases import OpCase, S, check_results, expected, generate_inputs, run_case

__all__ = ["check", "check_arrays", "raises", "OpCase", "S"]


def _describe_inputs(case: OpCase) -> str:
    parts = []
    for flat, shape, dt in generate_inputs(case):
        shown = flat if len(flat) <= 12 else flat[:12] + ["..."]
        parts.append(f"  {dt}{list(shape)}: {shown}")
    return "\n".join(parts)


def check(case: OpCase, device: str) -> None:
    """Run ``case`` on ``device`` and compare it with numpy (or check the expected error)."""
    if device in case.skip:
        pytest.skip(f"{case.id} on {device}: {case.skip[device]}")
    got = run_case(ember, case, device)
    want = expected(np, case)
    ok, msg = check_results(case, got, want)
    if not ok:
        pytest.fail(f"[{device}] {msg}\ninputs:\n{_describe_inputs(case)}", pytrace=False)


_NAMES = {"float64": "float32", "float32": "float32", "float16": "float16", "int32": "int32",
          "int64": "int64", "uint8": "uint8", "bool": "bool"}


def check_arrays(ember_fn, numpy_fn, arrays, device: str, *, rtol=None, atol=None, dtype=None,
                 id: str = "adhoc") -> None:
    """Like ``check`` for inputs given as numpy arrays (hypothesis examples, edge values)."""
    specs = []
    for a in arrays:
        a = np.asarray(a)
        name = _NAMES[a.dtype.name]
        specs.append(S(a.shape, name, values=a.astype(name if name != "bool" else bool).ravel().tolist()))
    check(OpCase(id, ember_fn, numpy_fn, specs, rtol, atol, dtype=dtype), device)


@contextlib.contextmanager
def raises(exc_type, *substrings):
    """``pytest.raises`` that also requires every substring in the message."""
    with pytest.raises(exc_type) as info:
        yield info
    msg = str(info.value)
    missing = [s for s in substrings if s not in msg]
    assert not missing, f"{exc_type.__name__} message {msg!r} lacks {missing}"
