"""The native driver: wgpu-py (Vulkan, Metal, DX12; lavapipe on a machine with no GPU).

>>> from ember.webgpu.native import NativeDriver        # doctest: +SKIP
>>> d = NativeDriver()                                   # doctest: +SKIP
>>> b = d.alloc(16); d.write(b, bytes(range(16))); d.read(b, 4)   # doctest: +SKIP
b'\\x00\\x01\\x02\\x03'

``WGPU_BACKEND_TYPE`` is set to ``Vulkan`` unless the user set it: without it wgpu silently falls
back to an OpenGL software rasteriser when Vulkan is missing, which then fails in odd places.
"""
from __future__ import annotations

import ctypes
import logging
import os
import tempfile

from ..errors import DeviceError
from .driver import LIMIT_NAMES, UNIFORM_ARENA_BYTES, BatchingDriver, cpu_adapter, device_error

_FEATURE_NAMES = {"subgroup": "subgroups"}  # wgpu-py spelling -> WebGPU spec spelling
# Readback buffers are kept for reuse by size class (powers of two from READBACK_MIN bytes), at
# most READBACK_KEEP of a class and classes up to READBACK_KEEP_MAX bytes (larger ones are made
# for the read and destroyed after it).
READBACK_MIN = 4096
READBACK_KEEP = 2
READBACK_KEEP_MAX = 64 << 20


class _QuietForcing(logging.Filter):
    """wgpu-py warns "Forcing backend: Vulkan" whenever WGPU_BACKEND_TYPE is set; when ember set
    it (not the user) that is no news to anyone."""

    def filter(self, record) -> bool:
        return not record.getMessage().startswith("Forcing backend:")


def _private_runtime_dir() -> None:
    """Mesa prints 'XDG_RUNTIME_DIR is invalid or not set' on every start when that folder is
    missing (containers, CI, sudo): give this process a private 0700 one instead."""
    d = os.environ.get("XDG_RUNTIME_DIR")
    try:
        ok = bool(d) and os.path.isdir(d) and (os.stat(d).st_mode & 0o077) == 0 and os.access(d, os.W_OK)
    except OSError:
        ok = False
    if not ok:
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="ember-xdg-")   # mkdtemp: 0700


def _adapter():
    forced = "WGPU_BACKEND_TYPE" not in os.environ
    if forced:
        os.environ["WGPU_BACKEND_TYPE"] = "Vulkan"
    _private_runtime_dir()
    try:
        import wgpu
    except ImportError as e:
        raise DeviceError(f"webgpu: wgpu-py is not installed ({e}); pip install 'wgpu>=0.32'") from e
    if forced:   # after the import: wgpu installs its own logger class first
        logging.getLogger("wgpu").addFilter(_QuietForcing())
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # wgpu raises RuntimeError with no driver at all
        raise DeviceError(f"webgpu: no WebGPU adapter found by wgpu-py "
                          f"(WGPU_BACKEND_TYPE={os.environ.get('WGPU_BACKEND_TYPE')}): {e}") from e
    if adapter is None:
        raise DeviceError("webgpu: wgpu-py found no WebGPU adapter")
    return wgpu, adapter


class NativeDriver(BatchingDriver):
    """Driver protocol (``ember.webgpu.driver``) over wgpu-py."""

    lost = None   # why the device was lost, once it is (then every call raises DeviceLostError)
    prebuilt_submits = 0    # replays submitted with a command buffer the builder thread made

    def __init__(self):
        wgpu, adapter = _adapter()
        self._wgpu = wgpu
        lim = adapter.limits
        want = {k: lim[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size",
                                    "max-compute-workgroup-storage-size",
                                    "max-compute-invocations-per-workgroup",
                                    "max-compute-workgroup-size-x", "max-compute-workgroup-size-y",
                                    "max-storage-buffers-per-shader-stage") if k in lim}
        feats = [f for f in ("subgroup", "timestamp-query", "shader-f16") if f in adapter.features]
        try:
            self._dev = adapter.request_device_sync(required_limits=want, required_features=feats)
        except Exception as e:
            raise DeviceError(f"webgpu: could not open the device on {adapter.info.get('device')}: {e}") from e
        dl = self._dev.limits
        self.limits = {n: int(dl[n.replace("_", "-")]) for n in LIMIT_NAMES}
        self.features = frozenset(_FEATURE_NAMES.get(f, f) for f in self._dev.features)
        # WGSL language features Naga (wgpu 0.32) compiles on every adapter
        self.wgsl_features = frozenset({"packed_4x8_integer_dot_product"})
        ai = adapter.info
        self.info = {"vendor": ai.get("vendor", ""), "architecture": ai.get("architecture", ""),
                     "device": ai.get("device", ""), "description": ai.get("description", ""),
                     "backend": ai.get("backend_type", ""), "adapter_type": ai.get("adapter_type", ""),
                     # wgpu-py 0.32 misspells these as "stackgroup_*"
                     "subgroup_min_size": ai.get("subgroup_min_size", ai.get("stackgroup_min_size")),
                     "subgroup_max_size": ai.get("subgroup_max_size", ai.get("stackgroup_max_size")),
                     "driver": "native (wgpu-py %s)" % wgpu.__version__}
        U = wgpu.BufferUsage
        self._usage = U.STORAGE | U.COPY_SRC | U.COPY_DST
        self._rb_free: dict = {}   # readback buffers by size class (_readback)
        self._init_batching(self._dev.create_buffer(size=UNIFORM_ARENA_BYTES, usage=U.UNIFORM | U.COPY_DST))
        self._c = None       # (SetPipeline, SetBindGroup, DispatchWorkgroups, NULL) of wgpu-native
        fast = None if os.environ.get("EMBER_WEBGPU_SAFE_CALLS") else self._fast_record()
        if fast is not None:
            self._record = fast

    def _alive(self, what: str) -> None:
        if self.lost is not None:
            raise device_error(RuntimeError(self.lost), what, self)

    def lose(self, reason: str = "destroyed") -> None:
        """Destroy the device (``GPUDevice.destroy()``), as a driver reset would lose it: every
        later call raises DeviceLostError (tests, and a way to free all GPU memory at once)."""
        self._open = None
        self._pending.clear()
        self._dev.destroy()
        self.lost = reason

    # ---- memory ------------------------------------------------------------------------------
    def alloc(self, nbytes: int):
        self._alive(f"allocating {nbytes} bytes")
        size = max(4, (int(nbytes) + 3) // 4 * 4)
        if size > self.limits["max_buffer_size"]:
            raise DeviceError(f"webgpu: a buffer of {size} bytes exceeds this adapter's "
                              f"maxBufferSize ({self.limits['max_buffer_size']} bytes)")
        try:
            return self._dev.create_buffer(size=size, usage=self._usage)
        except Exception as e:
            raise device_error(e, f"allocating {size} bytes on the GPU", self) from e

    def free(self, buf) -> None:
        if self.lost is None and id(buf) in self._pending:
            self.flush()
        self._forget(buf)
        try:
            buf.destroy()
        except Exception:   # a lost device: its buffers are gone already
            if self.lost is None:
                raise

    def write(self, buf, data, offset: int = 0) -> None:
        self._alive("writing to the GPU")
        if id(buf) in self._pending:
            self.flush()
        mv = memoryview(data).cast("B")
        n = len(mv)
        if n % 4:  # writeBuffer needs a multiple of 4 bytes
            mv = memoryview(bytes(mv) + bytes(4 - n % 4))
        if len(mv):
            try:
                self._dev.queue.write_buffer(buf, offset, mv)
            except Exception as e:
                raise device_error(e, f"writing {len(mv)} bytes to the GPU", self) from e

    def read(self, buf, nbytes: int, offset: int = 0) -> bytes:
        return self.read_later(buf, nbytes, offset)()

    def read_later(self, buf, nbytes: int, offset: int = 0):
        """Submit a copy of ``nbytes`` of ``buf`` into a mappable buffer and start mapping it; the
        returned function waits for that copy (only the work submitted before it) and gives the
        bytes. Work submitted between the two runs on meanwhile (a decode loop's next steps)."""
        import wgpu

        self._alive("reading back from the GPU")
        self.flush()
        size = max(4, (int(nbytes) + 3) // 4 * 4)
        what = f"reading {nbytes} bytes back from the GPU"
        rb = None
        try:
            rb, cls = self._readback(size)
            enc = self._dev.create_command_encoder()
            enc.copy_buffer_to_buffer(buf, offset, rb, 0, size)
            self._dev.queue.submit([enc.finish()])
            # (the map resolves once the copy's submission is done: wgpu-py's poll thread waits
            # for the submissions made before the map was asked for)
            mapping = rb.map_async(wgpu.MapMode.READ, 0, size)
        except Exception as e:
            if rb is not None:
                rb.destroy()
            raise device_error(e, what, self) from e

        def result() -> bytearray:
            done = False
            try:
                mapping.sync_wait()
                with rb.read_mapped(0, size, copy=False) as mv, mv[:nbytes] as part:
                    data = bytearray(part)      # the one copy; the caller owns it
                rb.unmap()
                done = True
            except Exception as e:
                raise device_error(e, what, self) from e
            finally:
                self._readback_done(rb, cls, done)
            return data
        return result

    def _readback(self, size: int):
        """A mappable buffer (MAP_READ | COPY_DST) of at least ``size`` bytes and its size class:
        one kept from an earlier read where there is one (creating host-visible memory for every
        read cost more than the copy for small reads, and large ones were allocated each time)."""
        import wgpu

        cls = max(READBACK_MIN, 1 << (size - 1).bit_length())
        free = self._rb_free.get(cls)
        if free:
            try:
                return free.pop(), cls
            except IndexError:   # (another thread took the last one)
                pass
        return self._dev.create_buffer(size=cls, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST), cls

    def _readback_done(self, rb, cls: int, reusable: bool) -> None:
        free = self._rb_free.setdefault(cls, [])
        if reusable and cls <= READBACK_KEEP_MAX and len(free) < READBACK_KEEP:
            free.append(rb)
        else:
            rb.destroy()

    async def read_async(self, buf, nbytes: int, offset: int = 0) -> bytes:
        return self.read(buf, nbytes, offset)

    # ---- compute ---------------------------------------------------------------------------
    def pipeline(self, wgsl: str, entry: str = "main"):
        # Naga (wgpu 0.32) rejects the standard `enable subgroups;` directive that Chromium's Tint
        # requires; it accepts the subgroup builtins whenever the device has the feature.
        wgsl = wgsl.replace("enable subgroups;", "")
        self._alive("compiling a pipeline")
        try:
            mod = self._dev.create_shader_module(code=wgsl)
            return self._dev.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": entry})
        except Exception as e:
            if self.lost is not None or "lost" in str(e).lower():
                raise device_error(e, f"compiling pipeline {entry!r}", self) from e
            raise DeviceError(f"webgpu: WGSL pipeline {entry!r} failed to compile: {e}") from e

    # ---- BatchingDriver hooks ----------------------------------------------------------------
    def _buffer_size(self, buf) -> int:
        return buf.size

    def _bind_group(self, pipe, entries):
        try:
            return self._dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
                {"binding": i, "resource": {"buffer": b, "offset": off, "size": size}}
                for i, b, off, size in entries])
        except Exception as e:
            raise device_error(e, f"binding {len(entries)} buffers", self) from e

    # A pass timer (benchmarks: ``tests/bench/bench_webgpu.py``): ``timer.writes()`` gives the
    # ``timestamp_writes`` of the next compute pass, ``timer.resolve(encoder)`` runs after it ends.
    timer = None

    def _begin_pass(self, enc=None):
        self._alive("recording GPU work")
        try:
            if enc is None:
                enc = self._dev.create_command_encoder()
            t = self.timer
            return enc, (enc.begin_compute_pass(timestamp_writes=t.writes()) if t is not None
                         else enc.begin_compute_pass())
        except Exception as e:
            raise device_error(e, "recording GPU work", self) from e

    def _record(self, cpass, pipe, bg, grid) -> None:
        cpass.set_pipeline(pipe)
        cpass.set_bind_group(0, bg)
        cpass.dispatch_workgroups(*grid)

    def _fast_record(self):
        """``_record`` through wgpu-native's C functions directly: wgpu-py wraps every call in
        an error-capturing proxy (a third of a replayed training step's Python time went to
        the three calls per dispatch). A compute pass defers its validation errors to
        ``finish()``, which still goes through wgpu-py and raises. None if wgpu-py's internals
        are not the ones this was written against (then the plain calls are used)."""
        try:
            from wgpu.backends.wgpu_native._ffi import ffi, lib

            set_pipeline = lib.wgpuComputePassEncoderSetPipeline
            set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
            dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
            null = ffi.NULL
            enc = self._dev.create_command_encoder()
            cp = enc.begin_compute_pass()
            if not hasattr(cp, "_internal"):
                return None
            cp.end()
            enc.finish()
        except Exception:
            return None

        self._c = (set_pipeline, set_bind_group, dispatch, null)

        def record(cpass, pipe, bg, grid):
            c = cpass._internal
            set_pipeline(c, pipe._internal)
            set_bind_group(c, 0, bg._internal, 0, null)
            dispatch(c, grid[0], grid[1], grid[2])
        return record

    def _submit(self, enc, cpass, arena: bytes) -> None:
        self._alive("submitting GPU work")
        try:
            cpass.end()
            if self.timer is not None:
                self.timer.resolve(enc)
            q = self._dev.queue
            if arena:
                q.write_buffer(self._arena_buf, 0, arena)
            q.submit([enc.finish()])
        except Exception as e:
            raise device_error(e, "submitting GPU work", self) from e

    # ---- prebuilt dispatch streams (ember.webgpu.replay) -------------------------------------
    def uniform_alloc(self, nbytes: int):
        """A uniform buffer of ``nbytes`` (a replayed plan's uniforms, written once)."""
        U = self._wgpu.BufferUsage
        try:
            return self._dev.create_buffer(size=(int(nbytes) + 15) // 16 * 16, usage=U.UNIFORM | U.COPY_DST)
        except Exception as e:
            raise device_error(e, f"allocating {nbytes} bytes of uniforms", self) from e

    def stream_prepare(self, cmds):
        """``cmds`` [(pipeline, bind group, grid)] as the list ``stream_submit`` walks: natively
        wgpu-native handles (a pipeline only where it changes, and at the start of every chunk),
        for three direct C calls each, cut into the chunks ``stream_chunks`` gives."""
        out = []
        last = None
        fast = self._c is not None
        chunks = stream_chunks(len(cmds))       # decided here, once: every chunk's start sets its pipeline
        starts = {lo for lo, _ in chunks}
        for i, (pipe, bg, (x, y, z)) in enumerate(cmds):
            p = None if pipe is last and i not in starts else (pipe._internal if fast else pipe)
            last = pipe
            out.append((p, bg._internal if fast else bg, int(x), int(y), int(z)))
        return (fast, out, cmds, chunks, self._native_words(out, chunks) if fast else None, _Ready())

    def _native_words(self, out, chunks):
        """Each chunk's dispatches as the words ``ember.native``'s ``ember_encode_dispatches``
        walks (five per dispatch: pipeline or 0, bind group, x, y, z), for one C call per chunk
        instead of three cffi calls per dispatch; None where that kernel is not in use (no
        compiler, ``EMBER_NATIVE=0``, ``EMBER_WEBGPU_NATIVE_ENCODE=0``)."""
        enc = _native_encoder(self._c)
        if enc is None:
            return None
        ffi = enc[1]
        words = []
        for lo, hi in chunks:
            vals = []
            for p, b, x, y, z in out[lo:hi]:
                vals += (0 if p is None else int(ffi.cast("uintptr_t", p)), int(ffi.cast("uintptr_t", b)), x, y, z)
            arr = (ctypes.c_uint64 * len(vals))(*vals)
            words.append((arr, ctypes.addressof(arr)))
        return enc, words

    def stream_copy(self, copies) -> None:
        """Submit buffer-to-buffer copies [(src, src offset, dst, dst offset, nbytes)] now, after
        the work recorded so far."""
        self.stream_submit(None, copies, ())

    def stream_submit(self, prepared, copies_in, copies_out) -> None:
        """``copies_in``, the prebuilt dispatches, ``copies_out``; submitted after the work
        recorded so far. A long stream goes as a few command buffers (``stream_chunks``): the
        GPU starts on the first while the rest are encoded."""
        self._alive("submitting GPU work")
        self.flush()
        ready = prepared[5] if prepared is not None and self.timer is None and self._prebuild_on else None
        cb = ready.take() if ready is not None else None
        try:
            if cb is not None:
                # the dispatches are one command buffer the builder thread encoded and finished
                # (wgpu-native's finish is most of a replay's host time); the copies round it
                cbs = [self._copies(None, copies_in).finish()] if copies_in else []
                cbs.append(cb)
                if copies_out:
                    cbs.append(self._copies(None, copies_out).finish())
                self._dev.queue.submit(cbs)
                self.prebuilt_submits += 1
                self._prebuild(prepared)
                return
            enc = self._copies(None, copies_in)
            if prepared is not None:
                chunks = prepared[3]
                for j in range(len(chunks)):
                    if j:
                        enc = self._dev.create_command_encoder()
                    _, cpass = self._begin_pass(enc)
                    self._encode_chunk(cpass, prepared, j)
                    cpass.end()
                    if self.timer is not None:
                        self.timer.resolve(enc)
                    if j + 1 < len(chunks):
                        self._dev.queue.submit([enc.finish()])
            self._dev.queue.submit([self._copies(enc, copies_out).finish()])
        except Exception as e:
            raise device_error(e, "submitting a replayed plan", self) from e
        if ready is not None:
            ready.uses += 1
            if ready.uses >= PREBUILD_AFTER:
                self._prebuild(prepared)

    # ---- prebuilt command buffers -----------------------------------------------------------
    @property
    def _prebuild_on(self) -> bool:
        """Whether replays take command buffers a builder thread prebuilt (``EMBER_WEBGPU_PREBUILD``:
        ``1`` on, ``0`` off; unset: on for GPUs, off for CPU adapters such as lavapipe, whose
        kernels share the cores the thread would use)."""
        if self._c is None:
            return False
        v = os.environ.get("EMBER_WEBGPU_PREBUILD")
        if v:
            return v.strip().lower() in ("1", "on", "true")
        return not cpu_adapter(self.info)

    def _prebuild(self, prepared) -> None:
        """Ask the builder thread for command buffers of ``prepared`` until PREBUILD_DEPTH are
        ready or being built."""
        ready = prepared[5]
        with ready.lock:
            want = PREBUILD_DEPTH - len(ready.cbs) - ready.pending
            if want <= 0 or ready.closed or ready.error is not None:
                return
            ready.pending += want
        b = self.__dict__.get("_builder")
        if b is None:
            import queue
            import threading

            jobs = queue.SimpleQueue()
            b = self._builder = (jobs, threading.Thread(target=_build_loop, args=(self, jobs), daemon=True,
                                                        name="ember-webgpu-prebuild"))
            b[1].start()
        for _ in range(want):
            b[0].put(prepared)

    def stream_close(self, prepared) -> None:
        """``prepared``'s stream is gone: drop its prebuilt command buffers."""
        if prepared is not None:
            prepared[5].close()

    def _copies(self, enc, copies):
        """``enc`` (a new encoder where None) with the buffer-to-buffer ``copies`` recorded."""
        if enc is None:
            enc = self._dev.create_command_encoder()
        for src, so, dst, do, n in copies:
            enc.copy_buffer_to_buffer(src, so, dst, do, n)
        return enc

    def _encode_chunk(self, cpass, prepared, j: int) -> None:
        """Record chunk ``j`` of ``prepared``'s dispatches into ``cpass``: one ember.native call, three
        direct C calls per dispatch, or wgpu-py's calls (each chunk starts with its pipeline set)."""
        fast, cmds, _, chunks, native, _ = prepared
        lo, hi = chunks[j]
        if native is not None:
            (fn, ffi, fps), words = native
            fn(int(ffi.cast("uintptr_t", cpass._internal)), *fps, words[j][1], hi - lo)
        elif fast:
            set_pipeline, set_bind_group, dispatch, null = self._c
            c = cpass._internal
            for p, b, x, y, z in cmds[lo:hi]:
                if p is not None:
                    set_pipeline(c, p)
                set_bind_group(c, 0, b, 0, null)
                dispatch(c, x, y, z)
        else:
            for p, b, x, y, z in cmds[lo:hi]:
                if p is not None:
                    cpass.set_pipeline(p)
                cpass.set_bind_group(0, b)
                cpass.dispatch_workgroups(x, y, z)

    def _encode_stream(self, prepared):
        """One finished command buffer of every dispatch of ``prepared``, its chunks in one pass (the
        builder thread's work: wgpu-native and ember.native's encoder release the GIL while they run)."""
        enc = self._dev.create_command_encoder()
        cpass = enc.begin_compute_pass()
        for j in range(len(prepared[3])):
            self._encode_chunk(cpass, prepared, j)
        cpass.end()
        return enc.finish()


# A stream's first PREBUILD_AFTER replays encode inline; from then on the builder thread keeps
# PREBUILD_DEPTH finished command buffers of it ready (a decode loop takes one a token).
PREBUILD_AFTER = 2
PREBUILD_DEPTH = 2


class _Ready:
    """The command buffers prebuilt for one prepared stream (``NativeDriver._prebuild``)."""

    __slots__ = ("cbs", "pending", "uses", "closed", "lock", "error")

    def __init__(self):
        import threading

        self.cbs = []
        self.pending = 0
        self.uses = 0
        self.closed = False
        self.lock = threading.Lock()
        self.error = None

    def take(self):
        with self.lock:
            return self.cbs.pop(0) if self.cbs else None

    def close(self) -> None:
        """Drop what is ready and build no more (the stream is gone or recorded again)."""
        with self.lock:
            self.closed = True
            self.cbs.clear()


def _build_loop(drv, jobs) -> None:
    """The builder thread: finish a command buffer for each prepared stream it is handed."""
    while True:
        prepared = jobs.get()
        if prepared is None:
            return
        ready = prepared[5]
        cb = None
        if not ready.closed and drv.lost is None:
            try:
                cb = drv._encode_stream(prepared)
            except Exception as e:   # the next replay encodes inline and raises it there, typed
                ready.error = e
        with ready.lock:
            ready.pending -= 1
            if cb is not None and not ready.closed and ready.error is None:
                ready.cbs.append(cb)
        prepared = ready = cb = None


def _native_encoder(c):
    """(``ember_encode_dispatches``, cffi's ffi, the addresses of wgpu-native's set-pipeline,
    set-bind-group and dispatch functions) or None: ember.native's C loop that calls those
    functions itself (core/native/encode.c), where the library is in use."""
    if c is None or os.environ.get("EMBER_WEBGPU_NATIVE_ENCODE") == "0":
        return None
    try:
        from .. import native
        from wgpu.backends.wgpu_native._ffi import ffi

        fn = native.kernel("ember_encode_dispatches", None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    except Exception:
        return None
    if fn is None:
        return None
    return fn, ffi, tuple(int(ffi.cast("uintptr_t", f)) for f in c[:3])


def stream_chunks(n: int) -> list:
    """[(start, end)] of a stream of ``n`` dispatches as command buffers: ``STREAM_FIRST``
    dispatches, then chunks twice as long as the one before, so the GPU works while the host
    encodes and wgpu-native validates the rest (a single buffer only reaches the GPU after all of
    it); one buffer where ``n`` < 3 * ``STREAM_FIRST`` or ``EMBER_WEBGPU_CHUNKS=0``."""
    if n < 3 * STREAM_FIRST or os.environ.get("EMBER_WEBGPU_CHUNKS") == "0":
        return [(0, n)] if n else []
    out, lo, size = [], 0, STREAM_FIRST
    while lo < n:
        hi = n if n - lo < 2 * size else lo + size     # no runt at the end
        out.append((lo, hi))
        lo, size = hi, size * 2
    return out


STREAM_FIRST = 16


class PassTimer:
    """GPU timestamps around EVERY compute pass the native driver submits (the adapter's
    ``timestamp-query`` feature), summed: the time the GPU spent on the recorded dispatches,
    nothing of the Python that recorded them, of the submit or of the wait. (An earlier version
    read the last pass only and divided by every repetition: with a submit every 32 dispatches
    it printed 1,682 TFLOP/s.) ``start()`` before the work, ``seconds()`` after it: the sum over
    the passes since, or None when more passes ran than the query set holds. Installed as the
    driver's ``timer`` by benchmarks and, for its timings only, by autotune; ``install`` gives
    ``None`` where the driver or adapter cannot."""

    PAIRS = 2048          # passes one timing may span (4096 queries: WebGPU's query-set limit)
    SLOT = 256            # resolveQuerySet's destination offset must be a multiple of 256

    @classmethod
    def install(cls, rt):
        drv = rt.driver
        dev = getattr(drv, "_dev", None)
        if dev is None or "timestamp-query" not in rt.features or not hasattr(drv, "timer"):
            return None
        return cls(drv, dev)

    def __init__(self, drv, dev):
        import wgpu

        self.dev = dev
        self.qs = dev.create_query_set(type="timestamp", count=2 * self.PAIRS)
        self.buf = dev.create_buffer(size=self.PAIRS * self.SLOT,
                                     usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.n = 0
        self.overflow = False
        self.cur = None
        drv.timer = self

    def start(self) -> None:
        self.n = 0
        self.overflow = False

    def writes(self):
        if self.n >= self.PAIRS:
            self.overflow = True
            self.cur = None
            return None
        self.cur = self.n
        self.n += 1
        return {"query_set": self.qs, "beginning_of_pass_write_index": 2 * self.cur,
                "end_of_pass_write_index": 2 * self.cur + 1}

    def resolve(self, enc) -> None:
        if self.cur is not None:
            enc.resolve_query_set(self.qs, 2 * self.cur, 2, self.buf, self.cur * self.SLOT)
            self.cur = None

    def durations(self) -> list:
        """GPU seconds of each pass since ``start()``, in order (waits for them)."""
        if self.n == 0:
            return []
        q = memoryview(self.dev.queue.read_buffer(self.buf, 0, self.n * self.SLOT)).cast("Q")
        w = self.SLOT // 8
        return [(q[i * w + 1] - q[i * w]) * 1e-9 for i in range(self.n)]   # nanoseconds (WebGPU's unit)

    def each(self, cmds) -> list:
        """GPU seconds of each ``(pipeline, bind group, grid)`` of ``cmds`` dispatched alone in a
        compute pass of its own between timestamps (a submit per ``PAIRS`` of them; waits)."""
        out = []
        for lo in range(0, len(cmds), self.PAIRS):
            self.start()
            enc = self.dev.create_command_encoder()
            for pipe, bg, grid in cmds[lo:lo + self.PAIRS]:
                cp = enc.begin_compute_pass(timestamp_writes=self.writes())
                cp.set_pipeline(pipe)
                cp.set_bind_group(0, bg)
                cp.dispatch_workgroups(*grid)
                cp.end()
                self.resolve(enc)
            self.dev.queue.submit([enc.finish()])
            out += self.durations()
        return out

    def seconds(self):
        """GPU seconds summed over the passes since ``start()`` (waits for them); None when
        the query set overflowed."""
        return None if self.overflow else sum(self.durations())

    def passes(self) -> int:
        return self.n
