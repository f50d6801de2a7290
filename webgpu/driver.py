"""The driver protocol: the only seam between the WebGPU backend and a WebGPU implementation.

Two drivers implement it: ``ember.webgpu.native.NativeDriver`` (wgpu-py, CPython) and
``ember.webgpu.browser.BrowserDriver`` (``navigator.gpu`` through ``pyodide.ffi``). The backend,
the fusion code and the autotuner talk to a driver only through the methods below, so the same
``.wgsl`` files and the same Python run in both places.

Conventions every driver follows:

- Buffers are opaque handles. Every buffer is a storage buffer that can also be copied from/to
  (``STORAGE | COPY_SRC | COPY_DST``); sizes are rounded up to a multiple of 4 bytes.
- ``dispatch`` only *records* work; recorded dispatches are submitted together at ``flush()``
  (or when the driver's batch is full). ``read`` flushes first. ``write`` flushes first when the
  buffer it writes is used by recorded work, so a write never overtakes a dispatch recorded
  before it.
- Bindings: ``buffers[i]`` is bound at ``@group(0) @binding(i)``; a non-empty ``uniforms`` is
  bound at the next binding as a uniform buffer (``var<uniform>``). A buffer entry is either a
  handle (whole buffer) or a ``(handle, offset, nbytes)`` tuple.
- Errors (shader compilation, validation, out of memory, no adapter) raise
  ``ember.errors.DeviceError`` with the driver's message (``device_error`` picks the subclass:
  ``DeviceLostError`` once the device is lost, ``DeviceOutOfMemoryError`` for out of memory).
  ``lost`` is None, or why the device was lost; every call after that raises DeviceLostError.

``limits`` keys (snake_case, same meaning as WebGPU's ``GPUSupportedLimits``):
``max_storage_buffer_binding_size``, ``max_buffer_size``, ``max_compute_workgroups_per_dimension``,
``max_compute_invocations_per_workgroup``, ``max_compute_workgroup_storage_size``,
``max_storage_buffers_per_shader_stage``, ``min_uniform_buffer_offset_alignment``,
``min_storage_buffer_offset_alignment``.
``features``: a frozenset of WebGPU feature names, normalised to the spec spelling
(``"subgroups"``, ``"shader-f16"``, ``"timestamp-query"``). ``info``: ``vendor``,
``architecture``, ``device``, ``description``, ``backend`` (``"Vulkan"``, ``"browser"``...),
``adapter_type``, ``subgroup_min_size``/``subgroup_max_size`` where known.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Protocol, Sequence

LIMIT_NAMES = (
    "max_storage_buffer_binding_size",
    "max_buffer_size",
    "max_compute_workgroups_per_dimension",
    "max_compute_invocations_per_workgroup",
    "max_compute_workgroup_storage_size",
    "max_storage_buffers_per_shader_stage",
    "min_uniform_buffer_offset_alignment",
    "min_storage_buffer_offset_alignment",
)

# How many dispatches a driver records before it submits on its own: the GPU works on one batch
# while Python records the next. 32 measured best on the H200 (encoder training step: 18.7 ms at
# 256, when the GPU sat idle until the whole step was recorded, 12.0 ms at 32, 13.8 ms at 16).
BATCH_DISPATCHES = 32
# Bind groups kept for reuse (least recently used dropped): a few models' worth of dispatches.
BIND_GROUP_CACHE = 4096
# Uniform data of the dispatches of one batch lives in one arena buffer, one aligned slot each.
UNIFORM_ARENA_BYTES = 1 << 20


class Driver(Protocol):
    """What the WebGPU backend needs from a WebGPU implementation (see the module docstring)."""

    limits: dict
    features: frozenset
    info: dict

    def alloc(self, nbytes: int) -> Any:
        """A new storage buffer of at least ``nbytes`` bytes (contents undefined)."""

    def free(self, buf: Any) -> None:
        """Destroy ``buf`` (after recorded work that uses it has been submitted)."""

    def write(self, buf: Any, data, offset: int = 0) -> None:
        """Copy bytes-like ``data`` into ``buf`` at byte ``offset``."""

    def read(self, buf: Any, nbytes: int, offset: int = 0) -> bytes:
        """Flush, wait for the GPU and return ``nbytes`` bytes of ``buf`` (blocks)."""

    def read_later(self, buf: Any, nbytes: int, offset: int = 0) -> Callable[[], bytes]:
        """Flush and start reading ``nbytes`` of ``buf`` as of now; the returned function blocks
        until that read is done and gives the bytes, while work submitted after this call runs on
        (a decode loop enqueues its next steps before it waits for the last ones' tokens)."""

    async def read_async(self, buf: Any, nbytes: int, offset: int = 0) -> bytes:
        """Like ``read`` without blocking the event loop (the browser's ``mapAsync``)."""

    def pipeline(self, wgsl: str, entry: str = "main") -> Any:
        """Compile a compute pipeline (layout ``auto``) from WGSL source; DeviceError on errors."""

    def dispatch(self, pipe: Any, buffers: Sequence, uniforms: bytes, grid: tuple) -> None:
        """Record one dispatch of ``grid`` = (x, y, z) workgroups (see the binding convention)."""

    def flush(self) -> None:
        """Submit the recorded work (does not wait for it)."""


def device_error(e: BaseException, what: str, driver=None):
    """The typed ember error for a WebGPU failure ``e`` while doing ``what``: DeviceLostError
    when the device is (or has just been found) lost, DeviceOutOfMemoryError for out of memory,
    else DeviceError; never a raw wgpu/JS exception."""
    from ..errors import DeviceError, DeviceLostError, DeviceOutOfMemoryError

    if isinstance(e, DeviceError):
        return e
    msg = str(e).strip()
    low = msg.lower()
    lost = getattr(driver, "lost", None)
    if lost is None and ("device is lost" in low or "device lost" in low or "device was lost" in low
                         or "destroyed device" in low):
        lost = msg.splitlines()[-1].strip() if msg else "lost"
        if driver is not None:
            driver.lost = lost
    if lost is not None:
        return DeviceLostError(f"webgpu: the GPU device was lost ({lost}) while {what}; its tensors are "
                               f"gone: move the work to device='python' (or 'wasm'/'numpy') or "
                               f"reopen the GPU with `await ember.webgpu.init()`")
    if "outofmemory" in type(e).__name__.lower() or "out of memory" in low or "outofmemory" in low:
        return DeviceOutOfMemoryError(f"webgpu: the GPU ran out of memory while {what}: {msg}")
    return DeviceError(f"webgpu: {what} failed: {msg}")


class UniformArena:
    """Packs the uniform data of one batch of dispatches into one bytearray, each slot aligned to
    ``min_uniform_buffer_offset_alignment``; the driver writes it to its arena buffer just before
    it submits, so uniform data costs one ``writeBuffer`` per submit, not one per dispatch."""

    __slots__ = ("align", "capacity", "data")

    def __init__(self, align: int, capacity: int = UNIFORM_ARENA_BYTES):
        self.align = max(int(align), 16)
        self.capacity = capacity
        self.data = bytearray()

    def fits(self, n: int) -> bool:
        return len(self.data) + _round_up(n, self.align) <= self.capacity

    def add(self, payload: bytes) -> tuple:
        """Append ``payload``; return (offset, bound size)."""
        data = self.data
        off = len(data)
        n = len(payload)
        size = (max(n, 16) + 15) & ~15
        data += payload
        data += _ZEROS[:(size + self.align - 1) // self.align * self.align - n]
        return off, size

    def take(self) -> bytes:
        d = bytes(self.data)
        self.data = bytearray()
        return d


class BatchingDriver:
    """What both drivers share: dispatches are recorded into one open compute pass, their uniform
    data packed into one arena buffer, and everything is submitted at ``flush()`` (or every
    ``BATCH_DISPATCHES``). Subclasses provide the API calls: ``_buffer_size(buf)``,
    ``_bind_group(pipe, entries)`` with entries ``(binding, buf, offset, size)``,
    ``_begin_pass() -> (encoder, pass)``, ``_record(pass, pipe, bind_group, grid)`` and
    ``_submit(encoder, pass, arena_bytes)``."""

    def _init_batching(self, arena_buf) -> None:
        self._arena = UniformArena(self.limits["min_uniform_buffer_offset_alignment"])
        self._arena_buf = arena_buf
        self._open = None        # (encoder, pass) while dispatches are being recorded
        self._count = 0
        self._pending = set()    # ids of buffers that recorded, unsubmitted work uses
        self._bg_cache = OrderedDict()   # (pipeline, entries) -> (bind group, pipeline, buffers)
        self._bg_by_buf = {}             # id(buffer) -> keys of the cached groups that use it

    def dispatch(self, pipe, buffers, uniforms: bytes, grid: tuple) -> None:
        # (the per-dispatch Python of every kernel: kept lean, one pass over the buffers builds
        # both the bind-group cache key and the entries)
        arena = self._arena
        if uniforms and not arena.fits(len(uniforms)):
            self.flush()
        pending = self._pending
        entries = []
        key = [id(pipe)]
        for b in buffers:
            if type(b) is tuple:
                buf, off, size = b
            else:
                buf, off, size = b, 0, self._buffer_size(b)
            entries.append((buf, off, size))
            i = id(buf)
            pending.add(i)
            key += (i, off, size)
        if uniforms:
            off, size = arena.add(uniforms)
            entries.append((self._arena_buf, off, size))
            key += (id(self._arena_buf), off, size)
        key = tuple(key)
        hit = self._bg_cache.get(key)
        if hit is not None:
            self._bg_cache.move_to_end(key)
            bg = hit[0]
        else:
            bg = self._new_bind_group(pipe, key, entries)
        if self._open is None:
            self._open = self._begin_pass()
        self._record(self._open[1], pipe, bg, grid)
        self._count += 1
        if self._count >= BATCH_DISPATCHES:
            self.flush()

    def _new_bind_group(self, pipe, key, entries):
        """Bind groups are reused: a model run again (a replayed plan above all) dispatches the
        same pipelines on the same pooled buffers at the same arena offsets, and creating bind
        groups was the largest Python cost of a replay. ``key``: the pipeline's id, then
        (id, offset, size) of each entry; the cache holds the buffers (so their ids stay unique
        while cached) and drops a buffer's groups when it is freed (``_forget``)."""
        bg = self._bind_group(pipe, [(i, b, off, size) for i, (b, off, size) in enumerate(entries)])
        bufs = [b for b, _, _ in entries]
        self._bg_cache[key] = (bg, pipe, bufs)
        for b in bufs:
            self._bg_by_buf.setdefault(id(b), set()).add(key)
        if len(self._bg_cache) > BIND_GROUP_CACHE:
            old, (_, _, obufs) = self._bg_cache.popitem(last=False)
            for b in obufs:
                keys = self._bg_by_buf.get(id(b))
                if keys is not None:
                    keys.discard(old)
                    if not keys:
                        del self._bg_by_buf[id(b)]
        return bg

    def _forget(self, buf) -> None:
        """``buf`` is about to be destroyed: drop the bind groups that use it."""
        for key in self._bg_by_buf.pop(id(buf), ()):
            self._bg_cache.pop(key, None)

    def flush(self) -> None:
        if self._open is None:
            return
        enc, cpass = self._open
        self._open = None
        self._count = 0
        self._pending.clear()
        self._submit(enc, cpass, self._arena.take())


_ZEROS = bytes(4096)


def cpu_adapter(info: dict) -> bool:
    """Whether the adapter ``info`` (a driver's ``info``) describes runs on the CPU
    (lavapipe/llvmpipe, SwiftShader, a browser's fallback adapter): there workgroups run a few at a
    time, each costing its barriers in software, and its kernels share the host's cores."""
    kind = str(info.get("adapter_type", "")).lower()
    names = " ".join(str(info.get(k, "")) for k in ("device", "architecture", "description")).lower()
    return kind in ("cpu", "fallback") or "llvmpipe" in names or "swiftshader" in names


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


def grid_1d(n_groups: int, max_per_dim: int) -> tuple:
    """Spread ``n_groups`` workgroups over x (and y when x would pass the per-dimension limit).
    Kernels recover the linear group id as ``wid.x + wid.y * nwg.x``."""
    if n_groups <= max_per_dim:
        return (max(n_groups, 1), 1, 1)
    y = (n_groups + max_per_dim - 1) // max_per_dim
    x = (n_groups + y - 1) // y
    return (x, y, 1)
