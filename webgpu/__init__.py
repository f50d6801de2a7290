"""ember's WebGPU backend: ``device="webgpu"``.

WGSL compute kernels (``kernels/*.wgsl``) run through a small driver (``driver.py``): wgpu-py
natively (``native.py``: Vulkan/Metal/DX12, lavapipe on a machine without a GPU), ``navigator.gpu``
in the browser (``browser.py``, Pyodide). Elementwise ops are recorded lazily and fused into one
kernel per chain, or into the epilogue of the matmul they follow (``fusion.py``); movement ops are
views; buffers are pooled (``pool.py``); matmul picks its fastest kernel variant per shape class
(``autotune.py``, ``linalg.py``). Every element is 4 bytes on the GPU except float16 where the
device has ``shader-f16``: there a float16 tensor is stored as ``f16`` (2 bytes; uploads and reads
copy the bytes, fused kernels and matmul read and write it; other kernels get a 4-byte copy).
Without ``shader-f16`` (Chromium's SwiftShader), or with ``EMBER_WEBGPU_F16=0`` /
``set_f16(False)``, float16 is stored as f32 rounded to half precision after each op. int64 is
stored as i32 (uploads outside the int32 range raise DTypeError), uint8 and bool as u32 (see
``backend.py``).

Natively nothing needs to be set up::

    >>> import ember                                      # doctest: +SKIP
    >>> x = ember.ones((2, 3), device="webgpu")           # doctest: +SKIP
    >>> (x * 2).sum().item()                              # doctest: +SKIP
    12.0

In the browser the GPU is requested asynchronously: run ``await ember.webgpu.init()`` once
(from ``pyodide.runPythonAsync``) before using ``device="webgpu"``. ``init()`` works natively too.

Limits: tensors larger than the adapter's ``maxStorageBufferBindingSize`` run in chunks where the
kernel allows it (fused elementwise chains, casts and ``where`` over aligned binding windows;
matmul by blocks of rows, its right operand within one binding); any other kernel that would bind
more raises ``ember.errors.DeviceLimitError`` (op, shape, bytes, limit) before its work is
recorded, and so does a buffer over ``maxBufferSize``. ``set_limits()`` or
``EMBER_WEBGPU_MAX_BINDING_BYTES`` / ``EMBER_WEBGPU_MAX_BUFFER_BYTES`` lower them (tests, or to
emulate a smaller GPU). A lost device (``GPUDevice.lost``, a driver reset) raises
``DeviceLostError`` on every later use until ``init()`` opens a new one; out of memory raises
``DeviceOutOfMemoryError``: never a raw wgpu or JavaScript exception.

Optimizers: a float32 parameter's ``SGD``/``Adam``/``AdamW`` step is one kernel (``optim.py``).

Your own kernels: ``custom_op(name, wgsl, shape=..., dtype=...)`` declares a registry op whose
webgpu kernel is your WGSL (``custom.py`` has the binding convention).

Introspection: ``stats()`` (counters), ``reset_stats()``, ``info()`` (adapter, limits, features).
``evaluate(*tensors)`` runs pending lazy work without reading it back; ``synchronize()`` waits
for the GPU. ``set_fusion(False)`` or ``EMBER_FUSION=off`` turns fusion off; ``EMBER_AUTOTUNE=off``
makes matmul use its default variant without benchmarking (choices are cached per adapter in
``~/.cache/ember/autotune.json``).
"""
from __future__ import annotations

from .custom import custom_op
from .fusion import fusion_enabled, set_fusion
from .runtime import get_runtime, init_runtime

__all__ = ["init", "stats", "reset_stats", "info", "set_fusion", "fusion_enabled", "evaluate", "synchronize",
           "set_limits", "custom_op", "set_f16"]


async def init(power_preference: str = "high-performance") -> dict:
    """Open the GPU (the browser's request is async; natively it opens wgpu-py's adapter).
    Returns ``info()``. Raises ``ember.errors.DeviceError`` when there is no adapter."""
    rt = await init_runtime(power_preference)
    from ..backends import reset_backend

    reset_backend("webgpu")  # a failed use before init() must not stick
    return rt.info()


def stats() -> dict:
    """Counters since the last ``reset_stats()``: dispatches, pipelines_compiled,
    pipeline_cache_hits, fused_kernels (generated elementwise kernels dispatched), fused_ops
    (elementwise ops inside them), bytes_allocated (GPU memory held, pool included),
    peak_bytes_allocated, bytes_in_use (held by live tensors), pool_hits, pool_misses, reads,
    bytes_read, writes, bytes_written, autotune_benchmarks."""
    return dict(get_runtime().stats)


def reset_stats() -> None:
    """Zero the counters (memory counters keep their current values)."""
    get_runtime().reset_stats()


def set_limits(max_binding_bytes=None, max_buffer_bytes=None) -> dict:
    """Lower the GPU limits ember plans with (``maxStorageBufferBindingSize``, ``maxBufferSize``)
    below the adapter's, as ``EMBER_WEBGPU_MAX_BINDING_BYTES`` / ``EMBER_WEBGPU_MAX_BUFFER_BYTES``
    do at start-up: to test the chunked kernels, or to emulate a smaller GPU. None restores the
    adapter's own. Returns the previous ``{"max_binding", "max_buffer"}``.

    Elementwise kernels (fused chains, casts, where) and matmul (by row blocks) run in chunks over
    tensors larger than one binding; other kernels raise ``ember.errors.DeviceLimitError``."""
    return get_runtime().set_limits(max_binding_bytes, max_buffer_bytes)


def set_f16(enabled: bool) -> bool:
    """Store new float16 tensors in 2-byte ``f16`` storage (True, the default where the device
    has ``shader-f16``) or as 4-byte f32 holding halves (False; ``EMBER_WEBGPU_F16=0`` at start-up
    does the same). Tensors made before keep their storage; both kinds mix freely. Without
    ``shader-f16`` it stays off. Returns the previous setting."""
    rt = get_runtime()
    old = rt.half
    rt.half = bool(enabled) and "shader-f16" in rt.features
    return old


def info() -> dict:
    """Adapter info (vendor, device, backend, driver), ``limits`` and ``features``."""
    return get_runtime().info()


def evaluate(*tensors) -> None:
    """Run the pending (lazy, fused) work of webgpu ``tensors`` now, without reading them back.

    >>> import ember                                      # doctest: +SKIP
    >>> y = ember.ones((4,), device="webgpu") * 2         # recorded, not run
    >>> ember.webgpu.evaluate(y)                          # one dispatch
    """
    from .fusion import realize

    for t in tensors:
        if t.device == "webgpu":
            realize(t._buf, wide=False)


def synchronize() -> None:
    """Submit recorded work and wait for the GPU (for timing)."""
    rt = get_runtime()
    st = rt.alloc(4)
    rt.driver.flush()
    rt.driver.read(st.buf, 4)
