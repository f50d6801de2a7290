"""``device="wasm"``: the pure-Python backend's storage with WebAssembly SIMD kernels.

Tensors keep the python backend's flat row-major ``array.array`` buffers; the kernels of the
module built from ``wasm/kernels/*.c`` run on those buffers in place (inside Pyodide the module
shares Pyodide's memory; in CPython it runs under wasmtime on copies, see ``runtime``). Ops the
module has no kernel for, and dtypes it does not handle, run the python backend's kernels on the
same buffers: no copy either way, and ``t.to("python")`` / ``t.to("wasm")`` are cheap.

The kernel table is assembled from one Python module per kernel family (``ops_layout``,
``ops_elementwise``, ``ops_linalg``, ``ops_cast``, ``ops_quant``), each with ``kernels(rt) -> {op name: kernel}``; a family
kernel handles what its C code does and hands everything else to the python kernel.

>>> import ember
>>> "wasm" in ember.devices()        # doctest: +SKIP  (Pyodide, or CPython with wasmtime)
True
"""
from __future__ import annotations

import importlib

from ..backends.python import KERNELS as PY_KERNELS
from ..backends.python import PythonBackend
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


class WasmBackend(PythonBackend):
    """``device="wasm"``: ``array.array`` storage, WebAssembly SIMD kernels."""

    name = "wasm"

    def __init__(self, rt=None):
        self.rt = rt if rt is not None else runtime()
        self.kernels = dict(PY_KERNELS)
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
