"""Where ember's WebAssembly kernels run: one small runtime protocol, two implementations.

- ``PyodideRuntime``: inside Pyodide (browser or Node). The kernel module is instantiated on
  *Pyodide's own* ``WebAssembly.Memory``, so a kernel reads and writes the ``array.array``
  buffers of ember tensors in place: a pointer is ``buf.buffer_info()[0]``. No copy.
- ``WasmtimeRuntime``: CPython with the ``wasmtime`` package (tests, native runs). The module
  has its own memory there: inputs are copied in before a call and outputs copied out after.

Both take a call as ``rt.call(name, *args)`` where each argument is an int/float or a buffer
handed over as ``R(buf, n, offset=0, at=None)`` (read) / ``W(...)`` (written): the kernel may
touch elements ``offset .. offset + n - 1`` of ``buf`` and nothing else, and gets a pointer to
element ``at`` (default ``offset``; a view walked with negative strides starts inside its span). Every call checks
each buffer against those bounds first (``BoundsError``), so a wrong length in Python can never
become an out-of-bounds write into Pyodide's heap. Pointers are taken at call time, never
cached: when Pyodide's memory grows, nothing held here goes stale.

>>> from array import array
>>> check_span(R(array("f", [1.0, 2.0]), 2))   # fine
>>> check_span(W(array("f", [1.0]), 2))
Traceback (most recent call last):
...
ember.errors.BoundsError: wasm kernel buffer: 2 elements from offset 0 exceed a buffer of 1
"""
from __future__ import annotations

import atexit
import ctypes
import importlib.resources
import sys
import weakref

from ..errors import BoundsError, DeviceError
from .team import Moved

MODULE_FILE = "kernels.wasm"


class R:
    """A buffer a kernel reads: ``n`` elements of ``buf`` from ``offset``."""

    __slots__ = ("buf", "n", "offset", "at")
    writes = False

    def __init__(self, buf, n: int, offset: int = 0, at: int | None = None):
        self.buf = buf
        self.n = n
        self.offset = offset
        self.at = offset if at is None else at


class W(R):
    """A buffer a kernel writes (and may read)."""

    __slots__ = ()
    writes = True


def check_span(a: R) -> None:
    if a.buf.__class__ is Moved:   # (here only without its shared copy: Team.call takes the others)
        raise DeviceError(f"wasm kernel buffer: a moved array of {len(a.buf)} elements has no copy in the "
                          f"thread team's shared memory (its team was closed)")
    n, off = a.n, a.offset
    size = len(a.buf)
    if n < 0 or off < 0 or off + n > size:
        raise BoundsError(f"wasm kernel buffer: {n} elements from offset {off} exceed a buffer of {size}")
    if n and not off <= a.at < off + n:
        raise BoundsError(f"wasm kernel buffer: pointer at element {a.at} lies outside its span "
                          f"{off}..{off + n - 1}")
    if a.writes and a.buf.__class__ is bytes:
        raise BoundsError("wasm kernel buffer: a kernel may not write into immutable bytes")


def module_bytes() -> bytes:
    """The shipped kernel module (built from wasm/kernels/*.c by build_kernels.py)."""
    try:
        return importlib.resources.files("ember.wasm").joinpath(MODULE_FILE).read_bytes()
    except (FileNotFoundError, OSError) as e:
        raise DeviceError(f"device 'wasm': the kernel module {MODULE_FILE} is missing from this "
                          f"install (build it with 'python build.py wheel', which needs clang and "
                          f"lld)") from e


# id(array) -> its resident copy in the thread team's shared memory (``team.Resident``): a
# constant that a replayed plan's tables write in place (a KV cache) lives there while the team
# runs them; an eager kernel call on such an array first brings Python's copy up to date.
RESIDENT: dict = {}
# how many moved arrays Python got back so far (``team.Resident.python_use``): a replay's lists
# of arrays to sync are made again when it changes
REMATERIALIZED = [0]


def _resident_use(args):
    """Bring Python's copy of resident arrays up to date for an eager call; the team instead
    when an argument is moved (``team.Moved``: the call runs on the shared memory)."""
    for a in args:
        if isinstance(a, R):
            ent = RESIDENT.get(id(a.buf))
            if ent is not None and ent.moved:
                return ent.team
    for a in args:
        if isinstance(a, R):
            ent = RESIDENT.get(id(a.buf))
            if ent is not None:
                ent.python_use(a.writes)
    return None


class PyodideRuntime:
    """Kernels on Pyodide's memory (zero copy)."""

    kind = "pyodide"

    def __init__(self, instance):
        self.exports = instance.exports
        self._fns = {}

    @classmethod
    def create_sync(cls) -> "PyodideRuntime":
        """Compile and instantiate synchronously (Node, Workers; Chromium refuses synchronous
        compilation of modules over 4 KB on a page's main thread)."""
        import js
        from pyodide.ffi import to_js

        try:
            mod = js.WebAssembly.Module.new(to_js(module_bytes()))
            inst = js.WebAssembly.Instance.new(mod, _imports())
        except Exception as e:  # a JsException: e.g. RangeError on Chromium's main thread
            raise DeviceError(f"device 'wasm' needs an asynchronous set-up here: "
                              f"'await ember.wasm.init()' first ({str(e).strip()})") from None
        return cls(inst)

    @classmethod
    async def create_async(cls) -> "PyodideRuntime":
        import js
        from pyodide.ffi import to_js

        mod = await js.WebAssembly.compile(to_js(module_bytes()))
        inst = await js.WebAssembly.instantiate(mod, _imports())
        return cls(inst)

    def fn(self, name):
        f = self._fns.get(name)
        if f is None:
            f = self._fns[name] = getattr(self.exports, name)
        return f

    def call(self, name, *args):
        f = self._fns.get(name) or self.fn(name)
        if RESIDENT:
            team = _resident_use(args)
            if team is not None:
                return team.call(name, args)
        conv = []
        app = conv.append
        for a in args:
            cls = a.__class__
            if cls is R or cls is W:
                # check_span inlined (the hot path of every kernel call in the page)
                buf, n, off = a.buf, a.n, a.offset
                if n < 0 or off < 0 or off + n > len(buf) or (n and not off <= a.at < off + n) \
                        or buf.__class__ is bytes or buf.__class__ is Moved:
                    check_span(a)   # raises with the message
                app(buf.buffer_info()[0] + a.at * buf.itemsize if n else 0)
            elif isinstance(a, R):
                check_span(a)
                buf = a.buf
                app(buf.buffer_info()[0] + a.at * buf.itemsize if a.n else 0)
            else:
                app(a)
        return f(*conv)


def _imports():
    import js
    import pyodide_js
    from pyodide.ffi import to_js

    memory = pyodide_js._module.memory
    if memory is None or not hasattr(memory, "grow"):
        raise DeviceError("device 'wasm': this Pyodide does not expose its WebAssembly.Memory")
    return to_js({"env": {"memory": memory}}, dict_converter=js.Object.fromEntries)


class WasmtimeRuntime:
    """The same module under wasmtime in CPython: its own memory, data copied in and out."""

    kind = "wasmtime"
    PAGE = 65536

    def __init__(self):
        import wasmtime

        self._w = wasmtime
        self.engine = wasmtime.Engine()
        self.store = wasmtime.Store(self.engine)
        self.module = wasmtime.Module(self.engine, module_bytes())
        self.memory = wasmtime.Memory(self.store, wasmtime.MemoryType(wasmtime.Limits(16, None)))
        self.instance = wasmtime.Instance(self.store, self.module, [self.memory])
        self.exports = self.instance.exports(self.store)
        self._fns = {}
        self._arenas = weakref.WeakSet()
        # Free wasmtime's objects before interpreter shutdown tears down its ctypes bindings
        # (otherwise their __del__ fails noisily at exit).
        atexit.register(self.close)

    def arena(self) -> "WasmtimeArena":
        """A fresh instance of the kernel module on a memory of its own: where a replayed plan's
        command table and buffers live under wasmtime (``plan_exec``), apart from the memory
        that eager calls lay their copies out in."""
        a = WasmtimeArena(self)
        self._arenas.add(a)
        return a

    def close(self) -> None:
        for a in list(self._arenas):
            a.close()
        self._fns.clear()
        self.exports = self.instance = self.memory = None
        for obj in (self.module, self.store, self.engine):
            try:
                obj.close()
            except Exception:  # already closed
                pass

    def fn(self, name):
        f = self._fns.get(name)
        if f is None:
            f = self._fns[name] = self.exports[name]
        return f

    def _reserve(self, nbytes: int) -> None:
        have = self.memory.data_len(self.store)
        if nbytes > have:
            self.memory.grow(self.store, (nbytes - have + self.PAGE - 1) // self.PAGE)

    def call(self, name, *args):
        f = self.fn(name)
        # Lay the buffers out one after another (16-byte aligned), starting past address 0 so
        # that no real buffer gets the null pointer.
        at, spans, conv = 64, [], []
        for a in args:
            if isinstance(a, R):
                check_span(a)
                nbytes = a.n * a.buf.itemsize
                spans.append((a, at, nbytes))
                conv.append(at + (a.at - a.offset) * a.buf.itemsize)
                at += (nbytes + 15) & ~15
            else:
                conv.append(a)
        self._reserve(at)
        mem, st = self.memory, self.store
        for a, addr, nbytes in spans:
            if nbytes:
                item = a.buf.itemsize
                mem.write(st, memoryview(a.buf).cast("B")[a.offset * item:a.offset * item + nbytes].tobytes(), addr)
        res = f(st, *conv)
        for a, addr, nbytes in spans:
            if a.writes and nbytes:
                item = a.buf.itemsize
                memoryview(a.buf).cast("B")[a.offset * item:a.offset * item + nbytes] = mem.read(st, addr, addr + nbytes)
        return res


class WasmtimeArena:
    """The kernel module instantiated on its own memory (a store of its own, freed with it).
    Addresses are plain offsets into that memory; ``write_from``/``read_into`` copy between it and
    a Python buffer with one ``memmove`` each."""

    def __init__(self, rt: WasmtimeRuntime):
        w = rt._w
        self.store = w.Store(rt.engine)
        self.memory = w.Memory(self.store, w.MemoryType(w.Limits(1, None)))
        self.instance = w.Instance(self.store, rt.module, [self.memory])
        self.exports = self.instance.exports(self.store)
        self.top = 64   # bump allocator; nothing at address 0

    def alloc(self, nbytes: int, align: int = 16) -> int:
        at = (self.top + align - 1) & -align
        self.top = at + max(nbytes, 0)
        have = self.memory.data_len(self.store)
        if self.top > have:
            self.memory.grow(self.store, (self.top - have + WasmtimeRuntime.PAGE - 1) // WasmtimeRuntime.PAGE)
        return at

    def _base(self) -> int:
        return ctypes.addressof(self.memory.data_ptr(self.store).contents)

    def write_from(self, addr: int, buf, nbytes: int) -> None:
        """Copy the first ``nbytes`` of array ``buf`` to ``addr`` (checked against both)."""
        if nbytes <= 0:
            return
        if addr < 0 or addr + nbytes > self.memory.data_len(self.store) or nbytes > len(buf) * buf.itemsize:
            raise BoundsError(f"wasm arena: {nbytes} bytes at {addr} reach outside the arena or the buffer")
        ctypes.memmove(self._base() + addr, buf.buffer_info()[0], nbytes)

    def read_into(self, addr: int, buf, nbytes: int) -> None:
        if nbytes <= 0:
            return
        if addr < 0 or addr + nbytes > self.memory.data_len(self.store) or nbytes > len(buf) * buf.itemsize:
            raise BoundsError(f"wasm arena: {nbytes} bytes at {addr} reach outside the arena or the buffer")
        ctypes.memmove(buf.buffer_info()[0], self._base() + addr, nbytes)

    def fn(self, name):
        f = self.exports[name]
        st = self.store
        return lambda *args: f(st, *args)

    def close(self) -> None:
        self.exports = self.instance = self.memory = None
        store, self.store = self.store, None
        if store is not None:
            try:
                store.close()
            except Exception:  # already closed
                pass


_runtime = [None]


def runtime():
    """The runtime of this process, created on first use (DeviceError when none can run)."""
    rt = _runtime[0]
    if rt is None:
        if sys.platform == "emscripten":
            rt = PyodideRuntime.create_sync()
        else:
            try:
                rt = WasmtimeRuntime()
            except ImportError:
                raise DeviceError("device 'wasm' runs inside Pyodide; in CPython it needs the "
                                  "wasmtime package (pip install wasmtime)") from None
        _runtime[0] = rt
    return rt


async def init_async():
    """Create the runtime with asynchronous compilation (what a page's main thread needs)."""
    if _runtime[0] is None:
        if sys.platform == "emscripten":
            _runtime[0] = await PyodideRuntime.create_async()
        else:
            runtime()
    return _runtime[0]
