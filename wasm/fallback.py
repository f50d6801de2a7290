"""The python backend's kernels as device "wasm" runs them: its fallbacks, from one place.

A wasm tensor's buffer may live in the thread team's shared memory (``team.Resident``): a
constant that tables write in place (a KV cache), whose Python copy may be older, or an array
*moved* there (``team.Moved``: a model's weights and KV cache), whose Python side holds no
elements at all. A python kernel reads ``t._buf`` directly, so before it runs every such input
gets its current elements in Python (``Resident.python_use``), and an input it writes in place
is marked as Python's newer copy (written back to the shared memory before a table reads it).

Every python kernel the wasm backend uses comes from ``PY`` here, already wrapped
(``python_kernel``): the backend's table for ops the module has no kernel for, the families'
fallbacks for dtypes and shapes they leave alone (``ops_*.py``), the replay recorder's table
(``plan_exec``); a kernel set on the backend later (a custom op's) is wrapped when it is set
(``backend.KernelTable``). tests/test_wasm_moved.py fails when a module of this package takes
the python backend's kernels from anywhere else.

Python code other than a kernel (a family's own Python path, ``tolist``, a tensor moved to
device "python" sharing the buffer) reaching a ``Moved`` array's elements goes through the
array's class, which re-materialises it the same way (``team.Moved``).
"""
from __future__ import annotations

import functools

from ..backends import python as _py
from ..router import MUTATES
from .runtime import RESIDENT

# python kernels that write into inputs, by op: the input positions written (the rest are read).
# The one declaration of such ops, the router's (``attention_cached`` writes its key/value
# caches; python_llm.py: "the one kernel in this backend that writes into an input");
# tests/test_wasm_moved.py runs op cases' python kernels and fails when one changes an input
# that is not listed.
WRITES = MUTATES


def python_use(tensors, writes=()) -> None:
    """Before Python reads the elements of ``tensors`` (``writes``: positions it also writes):
    bring each resident one's Python copy up to date (a moved one gets its elements)."""
    if not RESIDENT:
        return
    for k, t in enumerate(tensors):
        b = getattr(t, "_buf", None)
        ent = RESIDENT.get(id(b))
        if ent is not None and ent.buf() is b:
            ent.python_use(k in writes)


def python_kernel(name: str, kernel):
    """``kernel`` (a python-backend kernel of op ``name``) that first syncs its resident inputs
    (``python_use``). Wrapping a wrapped kernel returns it as it is."""
    if getattr(kernel, "python_use_guarded", False):
        return kernel
    writes = WRITES.get(name, ())

    @functools.wraps(kernel)
    def run(out, *inputs, **attrs):
        if RESIDENT:
            python_use(inputs, writes)
        return kernel(out, *inputs, **attrs)

    run.python_use_guarded = True
    return run


PY = {name: python_kernel(name, k) for name, k in _py.KERNELS.items()}
