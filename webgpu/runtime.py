"""The runtime: one driver, the buffer pool, the pipeline cache, kernel templates and counters.

Kernels live in ``kernels/*.wgsl`` (loaded with ``importlib.resources``, so they work from the
wheel in Pyodide). Their only template parameters are ``{{T}}`` (element type), ``{{VW}}``
(vector width), ``{{RANK}}`` and ``{{WG}}`` (workgroup size), plus ``{{INFO}}`` (the size of the
uniform info array, which follows from the rank); shapes, strides and offsets go in the uniform
info buffer, so one compiled pipeline serves every shape. The pipeline cache key is exactly
``(kernel file, entry point, template parameters)``; generated (fused) kernels use their
structural signature instead.
"""
from __future__ import annotations

import os
import re
import struct
import sys
from array import array
from importlib import resources

from ..errors import DeviceError, DeviceLimitError
from .pool import BufferPool

STAT_KEYS = ("dispatches", "pipelines_compiled", "pipeline_cache_hits", "fused_kernels", "fused_ops", "fused_epilogues",
             "bytes_allocated", "peak_bytes_allocated", "bytes_in_use", "pool_hits", "pool_misses",
             "reads", "bytes_read", "writes", "bytes_written", "autotune_benchmarks")

_SOURCES: dict = {}


def kernel_source(name: str) -> str:
    """The text of ``kernels/<name>.wgsl``, with its ``#include other`` lines replaced by
    ``kernels/other.wgsl`` (shared helper functions)."""
    src = _SOURCES.get(name)
    if src is None:
        src = (resources.files("ember.webgpu") / "kernels" / f"{name}.wgsl").read_text(encoding="utf-8")
        lines = src.split("\n")
        for i, line in enumerate(lines):
            if line.startswith("#include "):
                lines[i] = kernel_source(line.split()[1])
        src = "\n".join(lines)
        _SOURCES[name] = src
    return src


def render(src: str, params: dict) -> str:
    for k, v in params.items():
        src = src.replace("{{" + k + "}}", str(v))
    if "{{" in src:
        start = src.index("{{")
        raise ValueError(f"unfilled template parameter {src[start:src.index('}}', start) + 2]}")
    return src


def env_on(name: str, default: bool = True) -> bool:
    """A switch read from the environment: on unless set to 0 / off / false / no (any case);
    ``default`` where it is not set."""
    return os.environ.get(name, "on" if default else "off").strip().lower() not in ("0", "off", "false", "no")


_F16_USE = re.compile(r"<f16>|\bf16\(")
_COMMENT = re.compile(r"//[^\n]*")
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def f32_bits(v: float) -> int:
    """The u32 bit pattern of float ``v`` rounded to f32 (overflow -> inf)."""
    try:
        return _U32.unpack(_F32.pack(v))[0]
    except OverflowError:
        return 0x7F800000 if v > 0 else 0xFF800000


def pack_info(words, size_words: int | None = None) -> bytes:
    """u32 words (negative ints wrap to two's complement) -> uniform bytes, padded to 16 bytes
    or to ``size_words`` words."""
    w = [x & 0xFFFFFFFF for x in words]
    n = size_words if size_words is not None else (len(w) + 3) // 4 * 4
    w += [0] * (max(n, 4) - len(w))
    return array("I", w).tobytes()


def _env_bytes(name: str):
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    try:
        n = int(float(v))
    except ValueError:
        raise DeviceError(f"webgpu: {name}={v!r} is not a number of bytes") from None
    if n < 256:
        raise DeviceError(f"webgpu: {name}={n} is too small (at least 256 bytes)")
    return n


class Runtime:
    """Everything that belongs to one GPU device.

    ``limits`` are the device's, lowered by ``set_limits`` or the environment variables
    ``EMBER_WEBGPU_MAX_BINDING_BYTES`` / ``EMBER_WEBGPU_MAX_BUFFER_BYTES`` (to emulate a smaller
    GPU, or test the chunked paths on a large one): ``max_binding`` (bytes one kernel may bind
    of a buffer) and ``max_buffer`` (bytes one buffer may hold). Elementwise kernels and matmul
    run in chunks over tensors larger than ``max_binding``; any other kernel that would bind more
    raises DeviceLimitError naming the op before its work is submitted."""

    def __init__(self, driver):
        self.driver = driver
        self.stats = dict.fromkeys(STAT_KEYS, 0)
        self.limits = dict(driver.limits)
        self.limits.setdefault("min_storage_buffer_offset_alignment", 256)
        self.pool = BufferPool(driver, self.stats, limits=self.limits)
        self.op = None     # (name, output shape) of the op whose kernel is running (error messages)
        self.pipelines: dict = {}
        self.features = driver.features
        # float16 tensors in 2-byte ``f16`` storage (see ``ember.webgpu.backend``): where the device
        # has ``shader-f16`` and EMBER_WEBGPU_F16 is not 0/off (the switch back to the 4-byte form)
        self.half = "shader-f16" in self.features and env_on("EMBER_WEBGPU_F16")
        self.set_limits(_env_bytes("EMBER_WEBGPU_MAX_BINDING_BYTES"), _env_bytes("EMBER_WEBGPU_MAX_BUFFER_BYTES"))
        self.max_groups = driver.limits["max_compute_workgroups_per_dimension"]
        # storage buffers one kernel may bind (WebGPU's default limit is 8; cap fusion inputs)
        self.max_storage = min(driver.limits["max_storage_buffers_per_shader_stage"], 10)

    def set_limits(self, max_binding=None, max_buffer=None) -> dict:
        """Lower the effective ``maxStorageBufferBindingSize`` / ``maxBufferSize`` (None: the
        device's own); never above the device's. Returns the previous values."""
        old = {"max_binding": self.max_binding if hasattr(self, "max_binding") else None,
               "max_buffer": self.max_buffer if hasattr(self, "max_buffer") else None}
        dl = self.driver.limits
        align = max(int(self.limits["min_storage_buffer_offset_alignment"]), 16)
        mb = dl["max_storage_buffer_binding_size"] if max_binding is None else min(int(max_binding), dl["max_storage_buffer_binding_size"])
        self.max_binding = max(mb // align * align, align)
        self.max_buffer = dl["max_buffer_size"] if max_buffer is None else min(int(max_buffer), dl["max_buffer_size"])
        self.limits["max_storage_buffer_binding_size"] = self.max_binding
        self.limits["max_buffer_size"] = self.max_buffer
        self.pool.set_limits(self.max_binding, self.max_buffer)
        return old

    def limit_error(self, nbytes: int, what: str = "", op=None, shape=None) -> DeviceLimitError:
        op_, shape_ = self.op or (None, None)
        op = op or op_ or "a kernel"
        shape = shape if shape is not None else shape_
        sh = f" on shape {tuple(shape)}" if shape is not None else ""
        return DeviceLimitError(
            f"webgpu: {op}{sh} would bind {nbytes} bytes{(' (' + what + ')') if what else ''}, over this "
            f"GPU's maxStorageBufferBindingSize of {self.max_binding} bytes, and this kernel cannot run in "
            f"chunks; split the tensor or run this op on device='numpy'/'python'",
            op=op, shape=tuple(shape) if shape is not None else None, nbytes=nbytes, limit=self.max_binding,
            limit_name="maxStorageBufferBindingSize")

    def reset_stats(self) -> None:
        for k in STAT_KEYS:
            if k not in ("bytes_allocated", "bytes_in_use", "peak_bytes_allocated"):
                self.stats[k] = 0
        self.stats["peak_bytes_allocated"] = self.stats["bytes_allocated"]

    def pipeline(self, key, make_source, entry: str = "main"):
        """The cached pipeline for ``key``; ``make_source()`` gives the WGSL on a miss. A source
        that uses ``f16`` (half storage bindings, ``f16(...)`` stores) gets ``enable f16;`` first:
        such sources are only generated for buffers in half storage, which exist only on a device
        with ``shader-f16``, so the directive never reaches a device without it."""
        p = self.pipelines.get(key)
        if p is not None:
            self.stats["pipeline_cache_hits"] += 1
            return p
        src = make_source()
        # (code only: a comment that names vec4<f16> must not ask a device without shader-f16
        # for the extension, which Chromium's SwiftShader refuses)
        if "enable f16;" not in src and _F16_USE.search(_COMMENT.sub("", src)):
            src = "enable f16;\n" + src
        p = self.driver.pipeline(src, entry)
        self.pipelines[key] = p
        self.stats["pipelines_compiled"] += 1
        return p

    def kernel(self, name: str, entry: str = "main", **params):
        """Pipeline for ``kernels/<name>.wgsl`` with template ``params``."""
        key = (name, entry, tuple(sorted(params.items())))
        return self.pipeline(key, lambda: render(kernel_source(name), params), entry)

    def dispatch(self, pipe, buffers, info: bytes, grid) -> None:
        mb = self.max_binding
        for b in buffers:
            size = b[2] if isinstance(b, tuple) else self.driver._buffer_size(b)
            if size > mb:
                raise self.limit_error(size)
        self.stats["dispatches"] += 1
        self.driver.dispatch(pipe, buffers, info, grid)

    def alloc(self, nbytes: int, what: str = "tensor", half: bool = False):
        """A pooled Storage of at least ``nbytes`` bytes; ``half``: it holds 2-byte f16 elements."""
        st = self.pool.acquire(nbytes, what)
        st.half = half
        return st

    def write(self, storage, data) -> None:
        self.stats["writes"] += 1
        self.stats["bytes_written"] += len(data)
        self.driver.write(storage.buf, data)

    def read(self, storage, nbytes: int, offset: int = 0) -> bytes:
        return self.read_later(storage, nbytes, offset)()

    def read_later(self, storage, nbytes: int, offset: int = 0):
        """``driver.read_later``: a function giving the bytes as of this call (a driver without
        it reads now)."""
        self.stats["reads"] += 1
        self.stats["bytes_read"] += nbytes
        later = getattr(self.driver, "read_later", None)
        if later is not None:
            return later(storage.buf, nbytes, offset)
        data = self.driver.read(storage.buf, nbytes, offset)
        return lambda: data

    async def read_async(self, storage, nbytes: int, offset: int = 0) -> bytes:
        self.stats["reads"] += 1
        self.stats["bytes_read"] += nbytes
        return await self.driver.read_async(storage.buf, nbytes, offset)

    def info(self) -> dict:
        out = {**self.driver.info, "limits": dict(self.limits), "features": sorted(self.driver.features)}
        if self.limits != self.driver.limits:
            out["adapter_limits"] = dict(self.driver.limits)   # before set_limits / EMBER_WEBGPU_MAX_*
        return out


_RUNTIME: list = [None]


def in_browser() -> bool:
    return sys.platform == "emscripten"


def get_runtime() -> Runtime:
    """The process's runtime, opening the native device on first use (natively)."""
    rt = _RUNTIME[0]
    if rt is not None and rt.driver.lost is not None:
        from .driver import device_error

        raise device_error(RuntimeError(rt.driver.lost), "opening the webgpu backend", rt.driver)
    if rt is None:
        if in_browser():
            raise DeviceError("webgpu: in the browser, run `await ember.webgpu.init()` once before "
                              "using device='webgpu' (requesting the GPU is asynchronous there)")
        from .native import NativeDriver

        rt = Runtime(NativeDriver())
        _RUNTIME[0] = rt
    return rt


async def init_runtime(power_preference: str = "high-performance") -> Runtime:
    rt = _RUNTIME[0]
    if rt is not None and getattr(rt.driver, "lost", None) is not None:
        _RUNTIME[0] = rt = None     # the device was lost: open a new one
    if rt is not None:
        return rt
    if in_browser():
        from .browser import create_browser_driver

        rt = Runtime(await create_browser_driver(power_preference))
        _RUNTIME[0] = rt
        return rt
    return get_runtime()
