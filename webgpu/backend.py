"""``device="webgpu"``: the WebGPU backend (see ``ember.webgpu`` for the overview).

Storage on the GPU: every element is 4 bytes, except float16 in half storage.

- float32 -> ``f32``.
- float16 -> ``f16`` (2 bytes an element, "half storage") where the device has ``shader-f16``
  (``Runtime.half``: lavapipe, most GPUs natively and in browsers): uploads and downloads copy the
  bytes as they are, the fused elementwise kernels read ``f16`` (computing in f32) and store
  ``f16``, and the matmul reads ``f16`` operands. Other hand-written kernels get a 4-byte copy
  (``fusion.realize``'s ``wide``) and give 4-byte results, which the next elementwise op or cast
  narrows. ``EMBER_WEBGPU_F16=0`` (or ``ember.webgpu.set_f16(False)``) turns half storage off.
- float16 -> ``f32`` holding half-precision values otherwise (Chromium's SwiftShader has no
  ``shader-f16``), and for the results of the other kernels: halves are widened on upload, every
  float16 result is rounded to half precision in the shader (``round_f16``) and narrowed on
  download. Memory use is that of float32.
- int64 -> ``i32``: WGSL has no 64-bit integer. Uploading an int64 value outside
  [-2**31, 2**31) raises DTypeError; results of int64 arithmetic wrap at 32 bits on the GPU.
- int32 -> ``i32``; uint8 -> ``u32`` (masked to 8 bits after each op); bool -> ``u32`` 0/1.
"""
from __future__ import annotations

from array import array

from .. import dtypes as _dt
from ..errors import DeviceError, DTypeError
from . import fusion
from .fusion import GBuf, contiguous, realize
from .runtime import get_runtime

try:  # numpy makes the host-side conversions fast; the pure-Python path runs in Pyodide
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None


def create_backend() -> "WebGPUBackend":
    """The backend factory ``ember.backends`` calls; DeviceError when there is no adapter."""
    return WebGPUBackend(get_runtime())


_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1


def to_device_bytes(data, dtype) -> bytes:
    """Host bytes in ``dtype``'s layout -> 4-byte GPU elements (see the module docstring)."""
    data = bytes(data)
    if dtype is _dt.float32 or dtype is _dt.int32:
        return data
    if _np is not None:
        if dtype is _dt.float16:
            return _np.frombuffer(data, "<f2").astype("<f4").tobytes()
        if dtype is _dt.int64:
            a = _np.frombuffer(data, "<i8")
            if a.size and (a.min() < _I32_MIN or a.max() > _I32_MAX):
                bad = a[(a < _I32_MIN) | (a > _I32_MAX)][0]
                raise _int64_error(int(bad), a.size)
            return a.astype("<i4").tobytes()
        a = _np.frombuffer(data, "u1")
        return (a != 0 if dtype is _dt.bool_ else a).astype("<u4").tobytes()
    if dtype is _dt.float16:
        import struct

        n = len(data) // 2
        return array("f", struct.unpack(f"<{n}e", data)).tobytes()
    if dtype is _dt.int64:
        a = array("q")
        a.frombytes(data)
        if a and (min(a) < _I32_MIN or max(a) > _I32_MAX):
            bad = next(v for v in a if v < _I32_MIN or v > _I32_MAX)
            raise _int64_error(bad, len(a))
        return array("i", a).tobytes()
    if dtype is _dt.bool_:  # any nonzero byte is True; the kernels rely on 0/1
        return array("I", [1 if b else 0 for b in data]).tobytes()
    # a memoryview, not the bytes: array() would read bytes as raw 4-byte words
    return array("I", memoryview(data)).tobytes()


def _int64_error(value, n):
    return DTypeError(f"webgpu: int64 tensor of {n} elements holds {value}, outside the int32 range "
                      f"[-2**31, 2**31) that the GPU stores int64 in (WGSL has no 64-bit integers); "
                      f"keep it on device='python'/'numpy' or reduce the values")


def _bounds(raw: bytes, dtype) -> tuple:
    if _np is not None:
        a = _np.frombuffer(raw, "<i4" if dtype.kind == "i" else "<u4")
        return int(a.min()), int(a.max())
    a = array("i" if dtype.kind == "i" else "I")
    a.frombytes(raw)
    return min(a), max(a)


def from_device_bytes(raw: bytes, dtype) -> bytes:
    """4-byte GPU elements -> host bytes in ``dtype``'s layout."""
    if dtype is _dt.float32 or dtype is _dt.int32:
        return raw
    if _np is not None:
        if dtype is _dt.float16:
            return _np.frombuffer(raw, "<f4").astype("<f2").tobytes()
        if dtype is _dt.int64:
            return _np.frombuffer(raw, "<i4").astype("<i8").tobytes()
        if dtype is _dt.bool_:
            return (_np.frombuffer(raw, "<u4") != 0).astype("u1").tobytes()
        return (_np.frombuffer(raw, "<u4") & 0xFF).astype("u1").tobytes()
    if dtype is _dt.float16:
        import struct

        a = array("f")
        a.frombytes(raw)
        return struct.pack(f"<{len(a)}e", *a)
    if dtype is _dt.int64:
        a = array("i")
        a.frombytes(raw)
        return array("q", a).tobytes()
    a = array("I")
    a.frombytes(raw)
    if dtype is _dt.bool_:
        return bytes(1 if v else 0 for v in a)
    return bytes(v & 0xFF for v in a)


class WebGPUBackend:
    """``device="webgpu"``: WGSL compute kernels through a driver (native or browser)."""

    name = "webgpu"

    def __init__(self, rt):
        self.rt = rt
        from .ops import build_kernels

        self.kernels = build_kernels(rt)

    @staticmethod
    def available():
        try:
            rt = get_runtime()
        except DeviceError as e:
            return False, str(e)
        return True, f"{rt.driver.info.get('device')} ({rt.driver.info.get('backend')})"

    def compile_plan(self, plan):
        """A replayed plan as one prebuilt dispatch stream (``ember.webgpu.replay``), or None."""
        from .replay import compile_plan

        return compile_plan(self, plan)

    def from_bytes(self, data, shape, dtype) -> GBuf:
        if dtype is _dt.float16 and self.rt.half:   # half storage: the bytes as they are
            raw = bytes(data)
            st = self.rt.alloc(fusion.storage_bytes(len(raw) // 2, True), half=True)
            if raw:
                self.rt.write(st, raw)
            return GBuf(self.rt, shape, dtype, storage=st)
        raw = to_device_bytes(data, dtype)
        st = self.rt.alloc(len(raw))
        if raw:
            self.rt.write(st, raw)
        g = GBuf(self.rt, shape, dtype, storage=st)
        if dtype.kind in "iu" and raw:
            g.bounds = _bounds(raw, dtype)  # lets take/embedding check indices without a GPU read
        return g

    def _prepare(self, buf: GBuf):
        """(contiguous buffer, bytes to read, byte offset, bytes to drop from the front): a
        half-stored tensor is read as it is, from the 4-byte word its first element lies in."""
        g = contiguous(buf, wide=False)
        if fusion.is_half(g):
            start = g.offset * 2 // 4 * 4
            return g, ((g.offset + g.size) * 2 - start + 3) // 4 * 4, start, g.offset * 2 - start
        return g, g.size * 4, g.offset * 4, 0

    def _host(self, raw, g, skip, dtype) -> bytes:
        if fusion.is_half(g):
            return bytes(raw[skip:skip + 2 * g.size])
        return from_device_bytes(raw, dtype)

    def to_bytes(self, buf: GBuf, shape, dtype) -> bytes:
        g, n, off, skip = self._prepare(buf)
        if g.size == 0:
            self.rt.driver.flush()
            return b""
        return self._host(self.rt.read(g.storage, n, off), g, skip, dtype)

    async def to_bytes_async(self, buf: GBuf, shape, dtype) -> bytes:
        g, n, off, skip = self._prepare(buf)
        if g.size == 0:
            return b""
        return self._host(await self.rt.read_async(g.storage, n, off), g, skip, dtype)


__all__ = ["create_backend", "WebGPUBackend", "GBuf", "realize", "contiguous", "fusion"]
