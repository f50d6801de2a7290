"""``device="wasm"``: the pure-Python backend's storage with WebAssembly SIMD kernels.

Tensors keep the python backend's flat row-major ``array.array`` buffers; the kernels of the
module built from ``wasm/kernels/*.c`` run on those buffers in place (inside Pyodide the module
shares Pyodide's memory; in CPython it runs under wasmtime on copies, see ``runtime``). Ops the
module has no kernel for, and dtypes it does not handle, run the python backend's kernels on the
same buffers: no copy either way, and ``t.to("python")`` / ``t.to("wasm")`` are cheap. Those
kernels come from ``fallback.PY`` (each first brings a thread team's resident or moved input up
to date in Python, ``fallback.python_kernel``); so does any kernel set on the table later.

The kernel table is assembled from one Python module per kernel family (``ops_layout``,
``ops_elementwise``, ``ops_linalg``, ``ops_cast``, ``ops_quant``), each with ``kernels(rt) -> {op name: kernel}``; a family
kernel handles what its C code does and hands everything else to the python kernel.

>>> import ember
>>> "wasm" in ember.devices()        # doctest: +SKIP  (Pyodide, or CPython with wasmtime)
True
"""
from __future__ import annotations

import importlib

from ..backends.python import PythonBackend
from .fallback import PY as PY_KERNELS
from .fallback import python_kernel
from .runtime import RESIDENT, runtime

FAMILIES = ("ops_layout", "ops_elementwise", "ops_linalg", "ops_cast", "ops_quant")


def family_kernels(rt) -> dict:
    """{op name: kernel} of every kernel family built on runtime ``rt`` (the replay recorder
    builds a second set on a recording runtime, see ``plan_exec``)."""
    table = {}
    for fam in FAMILIES:
        try:
            mod = importlib.import_module(f"{__package__}.{fam}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{fam}":
                raise
            continue   # a family not written yet
        table.update(mod.kernels(rt))
    return table


class KernelTable(dict):
    """The backend's {op name: kernel}. A kernel set on it one by one (after the backend was
    made: a custom op's) is not a family kernel, so it may read buffers in Python: it is
    wrapped by ``fallback.python_kernel`` (the families and the python table come in through
    ``update``, as they are)."""

    def __setitem__(self, name, kernel) -> None:
        super().__setitem__(name, python_kernel(name, kernel))


class WasmBackend(PythonBackend):
    """``device="wasm"``: ``array.array`` storage, WebAssembly SIMD kernels."""

    name = "wasm"

    def __init__(self, rt=None):
        self.rt = rt if rt is not None else runtime()
        self.kernels = KernelTable(PY_KERNELS)
        table = family_kernels(self.rt)
        self.kernels.update(table)
        self.native = set(table)   # op names served by the SIMD module (for the rest: python)

    def to_bytes(self, buf, shape, dtype) -> bytes:
        if RESIDENT:   # a thread team's copy of this array may be newer (``team.Resident``)
            ent = RESIDENT.get(id(buf))
            if ent is not None:
                ent.python_use(False)
        return super().to_bytes(buf, shape, dtype)

    def compile_plan(self, plan):
        """A replay of ``plan`` as command tables run inside the module (``plan_exec``), or None."""
        from .plan_exec import compile_plan

        return compile_plan(self, plan)

    @staticmethod
    def available():
        try:
            rt = runtime()
        except Exception as e:  # DeviceError with the reason
            return False, str(e)
        return True, f"WebAssembly SIMD kernels on {rt.kind}"


def create_backend() -> WasmBackend:
    return WasmBackend()
