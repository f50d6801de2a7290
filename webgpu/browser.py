"""The browser driver: ``navigator.gpu`` from Pyodide through ``pyodide.ffi``.

Requesting an adapter and a device is asynchronous in the browser, so the page must run
``await ember.webgpu.init()`` once (from ``pyodide.runPythonAsync``) before ``device="webgpu"``
is used. Reads:

- ``await tensor.data_async()`` always works (``mapAsync`` awaited on the event loop);
- ``tensor.tolist()`` / ``.item()`` / ``.numpy()`` block through JSPI
  (``pyodide.ffi.run_sync``) when ``pyodide.ffi.can_run_sync()`` is true, i.e. in code entered
  through ``runPythonAsync``; elsewhere they raise DeviceError saying to use ``data_async``.

WebGPU reports validation and shader errors asynchronously. Compilation messages are checked
with ``getCompilationInfo()`` (synchronously where JSPI allows, else on the next read), and every
``uncapturederror`` event is stored and raised as DeviceError at the next read or flush.
"""
from __future__ import annotations

from ..errors import DeviceError, DeviceOutOfMemoryError
from .driver import LIMIT_NAMES, UNIFORM_ARENA_BYTES, BatchingDriver, device_error

_LIMIT_JS = {n: "".join(w if i == 0 else w.capitalize() for i, w in enumerate(n.split("_")))
             for n in LIMIT_NAMES}  # max_buffer_size -> maxBufferSize


def _ffi():
    try:
        import js  # noqa: F401
        from pyodide import ffi
    except ImportError as e:
        raise DeviceError("webgpu: the browser driver needs Pyodide (no 'js' module here)") from e
    return js, ffi


def _obj(ffi, js, value):
    """Python dicts/lists -> JS objects/arrays (WebGPU descriptors)."""
    return ffi.to_js(value, dict_converter=js.Object.fromEntries)


async def create_browser_driver(power_preference: str = "high-performance") -> "BrowserDriver":
    """Request the adapter and device (async in the browser) and return a BrowserDriver."""
    js, ffi = _ffi()
    gpu = getattr(js.navigator, "gpu", None)
    if gpu is None:
        raise DeviceError("webgpu: this browser has no navigator.gpu (WebGPU is off or unsupported; "
                          "Chromium needs a secure context, headless needs --enable-unsafe-webgpu)")
    adapter = await gpu.requestAdapter(_obj(ffi, js, {"powerPreference": power_preference}))
    if adapter is None:
        raise DeviceError("webgpu: navigator.gpu.requestAdapter() returned no adapter")
    lim = adapter.limits
    req = {}
    for js_name in ("maxStorageBufferBindingSize", "maxBufferSize", "maxComputeWorkgroupStorageSize",
                    "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX",
                    "maxComputeWorkgroupSizeY", "maxStorageBuffersPerShaderStage"):
        v = getattr(lim, js_name, None)
        if v is not None:
            req[js_name] = int(v)
    # shader-f16: float16 tensors in 2-byte storage (ember.webgpu.backend) where the adapter has it
    # (a real GPU; Chromium's SwiftShader has not, and keeps the 4-byte form)
    feats = [f for f in ("subgroups", "timestamp-query", "shader-f16") if adapter.features.has(f)]
    try:
        dev = await adapter.requestDevice(_obj(ffi, js, {"requiredLimits": req, "requiredFeatures": feats}))
    except Exception as e:
        raise DeviceError(f"webgpu: adapter.requestDevice failed: {e}") from e
    info = getattr(adapter, "info", None)
    return BrowserDriver(js, ffi, adapter, dev, info)


class BrowserDriver(BatchingDriver):
    """Driver protocol (``ember.webgpu.driver``) over the browser's WebGPU."""

    def __init__(self, js, ffi, adapter, dev, info):
        self._js, self._ffi, self._dev = js, ffi, dev
        dl = dev.limits
        self.limits = {n: int(getattr(dl, _LIMIT_JS[n])) for n in LIMIT_NAMES}
        feats = set()
        for f in ("subgroups", "shader-f16", "timestamp-query"):
            if dev.features.has(f):
                feats.add(f)
        self.features = frozenset(feats)
        try:   # WGSL language features (dot4I8Packed: "packed_4x8_integer_dot_product")
            lf = js.navigator.gpu.wgslLanguageFeatures
            self.wgsl_features = frozenset(f for f in ("packed_4x8_integer_dot_product",) if lf.has(f))
        except Exception:
            self.wgsl_features = frozenset()

        def attr(name):
            return str(getattr(info, name, "") or "") if info is not None else ""
        # isFallbackAdapter moved from GPUAdapter to GPUAdapterInfo (Chromium 156 has it only there).
        fallback = getattr(adapter, "isFallbackAdapter", None)
        if fallback is None and info is not None:
            fallback = getattr(info, "isFallbackAdapter", False)
        self.info = {"vendor": attr("vendor"), "architecture": attr("architecture"),
                     "device": attr("device"), "description": attr("description"),
                     "backend": "browser", "adapter_type": "fallback" if fallback else "",
                     "subgroup_min_size": getattr(info, "subgroupMinSize", None) if info is not None else None,
                     "subgroup_max_size": getattr(info, "subgroupMaxSize", None) if info is not None else None,
                     "driver": "browser (navigator.gpu via Pyodide)"}
        U = js.GPUBufferUsage
        self._U = U
        self._usage = U.STORAGE | U.COPY_SRC | U.COPY_DST
        self._init_batching(dev.createBuffer(_obj(ffi, js, {"size": UNIFORM_ARENA_BYTES,
                                                            "usage": U.UNIFORM | U.COPY_DST})))
        self._errors: list = []
        self._unchecked: list = []  # shader modules whose compilation info is not checked yet

        def on_error(ev):
            kind = str(getattr(getattr(ev.error, "constructor", None), "name", "") or "")
            self._errors.append(("OutOfMemory: " if "OutOfMemory" in kind else "") + str(ev.error.message))
        self._on_error = ffi.create_proxy(on_error)
        dev.addEventListener("uncapturederror", self._on_error)
        self._layouts = {}
        self.lost = None   # GPUDevice.lost resolved: why; every call then raises DeviceLostError

        def on_lost(info):
            msg = str(getattr(info, "message", "") or "")
            self.lost = f"{getattr(info, 'reason', '') or 'unknown reason'}{': ' + msg if msg else ''}"
        self._on_lost = ffi.create_proxy(on_lost)
        try:
            dev.lost.then(self._on_lost)
        except Exception:  # pragma: no cover - a browser without GPUDevice.lost
            pass

    # ---- errors ------------------------------------------------------------------------------
    def _alive(self, what: str) -> None:
        if self.lost is not None:
            raise device_error(RuntimeError(self.lost), what, self)

    def _raise_errors(self, where: str) -> None:
        self._alive(where)
        if self._errors:
            msgs, self._errors = self._errors, []
            if any(m.startswith("OutOfMemory: ") for m in msgs):
                raise DeviceOutOfMemoryError(f"webgpu: the GPU ran out of memory ({where}): " + " | ".join(msgs))
            raise DeviceError(f"webgpu: the browser reported a WebGPU error ({where}): " + " | ".join(msgs))

    async def _check_modules_async(self) -> None:
        mods, self._unchecked = self._unchecked, []
        for mod, entry in mods:
            info = await mod.getCompilationInfo()
            self._compile_errors(info, entry)

    def _compile_errors(self, info, entry) -> None:
        errs = [f"{m.lineNum}:{m.linePos} {m.message}" for m in info.messages if m.type == "error"]
        if errs:
            raise DeviceError(f"webgpu: WGSL pipeline {entry!r} failed to compile: " + "; ".join(errs))

    def _can_block(self) -> bool:
        return bool(self._ffi.can_run_sync())

    # ---- memory ------------------------------------------------------------------------------
    def alloc(self, nbytes: int):
        self._alive(f"allocating {nbytes} bytes")
        size = max(4, (int(nbytes) + 3) // 4 * 4)
        if size > self.limits["max_buffer_size"]:
            raise DeviceError(f"webgpu: a buffer of {size} bytes exceeds this adapter's "
                              f"maxBufferSize ({self.limits['max_buffer_size']} bytes)")
        return self._dev.createBuffer(_obj(self._ffi, self._js, {"size": size, "usage": self._usage}))

    def free(self, buf) -> None:
        if id(buf) in self._pending:
            self.flush()
        self._forget(buf)
        buf.destroy()

    def write(self, buf, data, offset: int = 0) -> None:
        self._alive("writing to the GPU")
        if id(buf) in self._pending:
            self.flush()
        mv = memoryview(data).cast("B")
        n = len(mv)
        if n % 4:
            mv = memoryview(bytes(mv) + bytes(4 - n % 4))
        if len(mv):
            # queue.writeBuffer does not take a memoryview; to_js makes one typed-array copy
            self._dev.queue.writeBuffer(buf, offset, self._ffi.to_js(mv))

    def _staging_copy(self, buf, nbytes: int, offset: int):
        size = max(4, (int(nbytes) + 3) // 4 * 4)
        U = self._U
        rb = self._dev.createBuffer(_obj(self._ffi, self._js, {"size": size, "usage": U.MAP_READ | U.COPY_DST}))
        self.flush()
        enc = self._dev.createCommandEncoder()
        enc.copyBufferToBuffer(buf, offset, rb, 0, size)
        self._dev.queue.submit(self._ffi.to_js([enc.finish()]))
        return rb

    def _finish_read(self, rb, nbytes: int) -> bytes:
        data = rb.getMappedRange().to_bytes()[:nbytes]
        rb.unmap()
        rb.destroy()
        return data

    def read(self, buf, nbytes: int, offset: int = 0) -> bytes:
        return self.read_later(buf, nbytes, offset)()

    def read_later(self, buf, nbytes: int, offset: int = 0):
        """Submit the staging copy and start ``mapAsync`` now; the returned function waits for
        it (JSPI) and gives the bytes, so work submitted in between overlaps the wait."""
        self._alive("reading back from the GPU")
        if not self._can_block():
            raise DeviceError("webgpu: a synchronous read (tolist/item/numpy) cannot block here: "
                              "this code was not entered through pyodide.runPythonAsync (JSPI). "
                              "Use `await tensor.data_async()` instead")
        run_sync = self._ffi.run_sync
        if self._unchecked:
            run_sync(self._check_modules_async())
        rb = self._staging_copy(buf, nbytes, offset)
        mapping = rb.mapAsync(self._js.GPUMapMode.READ)

        def result() -> bytes:
            try:
                run_sync(mapping)
            except Exception as e:   # mapAsync rejects when the device is lost meanwhile
                raise device_error(e, f"reading {nbytes} bytes back from the GPU", self) from e
            self._raise_errors("read")
            return self._finish_read(rb, nbytes)
        return result

    async def read_async(self, buf, nbytes: int, offset: int = 0) -> bytes:
        if self._unchecked:
            await self._check_modules_async()
        self._alive("reading back from the GPU")
        rb = self._staging_copy(buf, nbytes, offset)
        try:
            await rb.mapAsync(self._js.GPUMapMode.READ)
        except Exception as e:
            raise device_error(e, f"reading {nbytes} bytes back from the GPU", self) from e
        self._raise_errors("read")
        return self._finish_read(rb, nbytes)

    # ---- compute ---------------------------------------------------------------------------
    def pipeline(self, wgsl: str, entry: str = "main"):
        ffi, js = self._ffi, self._js
        self._alive("compiling a pipeline")
        if self._can_block():
            # the module's validation error is reported here (an error scope), not again as an
            # uncaptured error at a later, unrelated flush
            self._dev.pushErrorScope("validation")
            mod = self._dev.createShaderModule(_obj(ffi, js, {"code": wgsl}))
            ffi.run_sync(self._dev.popErrorScope())
        else:
            mod = self._dev.createShaderModule(_obj(ffi, js, {"code": wgsl}))
        desc = _obj(ffi, js, {"layout": "auto", "compute": {"module": mod, "entryPoint": entry}})
        if self._can_block():
            self._compile_errors(ffi.run_sync(mod.getCompilationInfo()), entry)
            # createComputePipelineAsync where JSPI can wait for it: the browser compiles off its
            # GPU thread while only this Python stack is suspended (in ember's Worker the page's
            # other calls, e.g. CPU predictions, run meanwhile), and a pipeline that cannot be
            # created fails here, naming it, not as an uncaptured error at a later read.
            try:
                pipe = ffi.run_sync(self._dev.createComputePipelineAsync(desc))
            except Exception as e:  # the promise rejects with a GPUPipelineError
                raise DeviceError(f"webgpu: WGSL pipeline {entry!r} could not be created: {e}") from e
        else:
            self._unchecked.append((mod, entry))
            pipe = self._dev.createComputePipeline(desc)
        self._layouts[id(pipe)] = pipe.getBindGroupLayout(0)
        return pipe

    # ---- BatchingDriver hooks ----------------------------------------------------------------
    def _buffer_size(self, buf) -> int:
        return int(buf.size)

    def _bind_group(self, pipe, entries):
        layout = self._layouts.get(id(pipe)) or pipe.getBindGroupLayout(0)
        return self._dev.createBindGroup(_obj(self._ffi, self._js, {"layout": layout, "entries": [
            {"binding": i, "resource": {"buffer": b, "offset": off, "size": size}}
            for i, b, off, size in entries]}))

    def _begin_pass(self):
        self._alive("recording GPU work")
        enc = self._dev.createCommandEncoder()
        return enc, enc.beginComputePass()

    def _record(self, cpass, pipe, bg, grid) -> None:
        cpass.setPipeline(pipe)
        cpass.setBindGroup(0, bg)
        cpass.dispatchWorkgroups(*grid)

    def _submit(self, enc, cpass, arena: bytes) -> None:
        cpass.end()
        q = self._dev.queue
        if arena:
            q.writeBuffer(self._arena_buf, 0, self._ffi.to_js(memoryview(arena)))
        q.submit(self._ffi.to_js([enc.finish()]))

    def flush(self) -> None:
        super().flush()
        self._raise_errors("flush")

    # ---- prebuilt dispatch streams (ember.webgpu.replay) -------------------------------------
    # One JavaScript function encodes a replayed plan's whole dispatch list from prebuilt arrays:
    # one call across the bridge per replay instead of three per dispatch.
    _ENCODE_JS = ("for (let i = 0; i < groups.length; i++) {"
                  " const p = pipes[i]; if (p) pass.setPipeline(p);"
                  " pass.setBindGroup(0, groups[i]);"
                  " pass.dispatchWorkgroups(grid[3 * i], grid[3 * i + 1], grid[3 * i + 2]); }")
    _encode_fn = None

    def uniform_alloc(self, nbytes: int):
        """A uniform buffer of ``nbytes`` (a replayed plan's uniforms, written once)."""
        U = self._U
        return self._dev.createBuffer(_obj(self._ffi, self._js, {"size": (int(nbytes) + 15) // 16 * 16,
                                                                  "usage": U.UNIFORM | U.COPY_DST}))

    def stream_prepare(self, cmds):
        """``cmds`` [(pipeline, bind group, grid)] as JS arrays (a pipeline only where it
        changes) and a Uint32Array of grids, for one call of the encoding function per replay."""
        from array import array

        js = self._js
        if self._encode_fn is None:
            self._encode_fn = js.Function.new("pass", "pipes", "groups", "grid", self._ENCODE_JS)
        pipes, groups = js.Array.new(), js.Array.new()
        words = array("I")
        last = None
        for pipe, bg, (x, y, z) in cmds:
            pipes.push(None if pipe is last else pipe)
            last = pipe
            groups.push(bg)
            words.extend((int(x), int(y), int(z)))
        grid = js.Uint32Array.new(len(words))
        if len(words):
            grid.set(self._ffi.to_js(memoryview(words)))
        return (pipes, groups, grid, cmds)

    def stream_copy(self, copies) -> None:
        """Submit buffer-to-buffer copies [(src, src offset, dst, dst offset, nbytes)] now."""
        self.stream_submit(None, copies, ())

    def stream_submit(self, prepared, copies_in, copies_out) -> None:
        """One command buffer: ``copies_in``, the prebuilt dispatches in one compute pass
        (encoded by one JavaScript call), ``copies_out``."""
        self._alive("submitting GPU work")
        self.flush()
        enc = self._dev.createCommandEncoder()
        for src, so, dst, do, n in copies_in:
            enc.copyBufferToBuffer(src, so, dst, do, n)
        if prepared is not None:
            pipes, groups, grid, _ = prepared
            cpass = enc.beginComputePass()
            self._encode_fn(cpass, pipes, groups, grid)
            cpass.end()
        for src, so, dst, do, n in copies_out:
            enc.copyBufferToBuffer(src, so, dst, do, n)
        self._dev.queue.submit(self._ffi.to_js([enc.finish()]))
