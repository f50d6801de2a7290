"""Where ember's WebAssembly kernels run: one small runtime protocol, two implementations.

- ``PyodideRuntime``: inside Pyodide (browser or Node). The kernel module is instantiated on
  *Pyodide's own* ``WebAssembly.Memory``, so a kernel reads and writes the ``array.array``
  buffers of ember tensors in place: a pointer is ``buf.buffer_info()[0]``. No copy.
- ``WasmtimeRuntime``: CPython with the ``wasmtime`` package (tests, native runs). The module
  has its own memory there: inputs are copied in before a call and outputs copied out after.

Two builds of the kernels ship (``build_kernels.py``): ``kernels.wasm`` (plain SIMD) and
``kernels_relaxed.wasm`` (relaxed SIMD: the float GEMM multiply-adds with ``f32x4.relaxed_madd``,
fused where the CPU has FMA). ``select_module`` picks one per process, before anything
instantiates it, and every user (the runtime, the thread team's workers, the command-table
dispatch) takes that one's bytes: results are the same bits for any thread count within the
module that runs. In Pyodide the relaxed one runs where the engine validates a tiny relaxed-SIMD
probe module (Chromium; Node 20 only with ``--experimental-wasm-relaxed-simd``), else the plain
one; CPython keeps the plain module (the reference the tests pin bit for bit). The environment
variable ``EMBER_WASM_KERNELS`` (``auto``, ``plain`` or ``relaxed``) overrides the choice;
``ember.wasm.info()`` says which module runs and why.

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
import os
import sys
import weakref

from ..errors import BoundsError, DeviceError
from .team import Moved

MODULE_FILE = "kernels.wasm"
RELAXED_FILE = "kernels_relaxed.wasm"
KERNELS_ENV = "EMBER_WASM_KERNELS"
# (module (func (param v128 v128 v128) (result v128)
#   local.get 0 local.get 1 local.get 2 f32x4.relaxed_madd)): validates only where the engine
# has relaxed SIMD (the opcode the relaxed module's GEMM uses)
RELAXED_PROBE = bytes.fromhex("0061736d01000000" "010801" "6003" "7b7b7b017b" "03020100"
                              "0a0d010b00" "200020012002" "fd8502" "0b")


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


def read_module(name: str = MODULE_FILE) -> bytes:
    """One shipped kernel module file (built from wasm/kernels/*.c by build_kernels.py)."""
    try:
        return importlib.resources.files("ember.wasm").joinpath(name).read_bytes()
    except (FileNotFoundError, OSError) as e:
        raise DeviceError(f"device 'wasm': the kernel module {name} is missing from this "
                          f"install (build it with 'python build.py wheel', which needs clang and "
                          f"lld)") from e


def _has_module(name: str) -> bool:
    try:
        return importlib.resources.files("ember.wasm").joinpath(name).is_file()
    except (FileNotFoundError, OSError):
        return False


def _engine_has_relaxed_simd() -> bool:
    """Whether this process's engine validates relaxed SIMD (Pyodide: the JS engine's
    ``WebAssembly.validate`` on ``RELAXED_PROBE``)."""
    if sys.platform != "emscripten":
        return False
    import js
    from pyodide.ffi import to_js

    try:
        return bool(js.WebAssembly.validate(to_js(RELAXED_PROBE)))
    except Exception:  # a JsException: no validate, or a broken engine
        return False


# the module this process runs: {"file", "relaxed", "why"}; set once by select_module
_SELECTED: dict = {}


def choose_module(want: str, pyodide: bool, have_relaxed: bool, engine_relaxed) -> tuple:
    """(relaxed?, why) for a setting ``want`` (auto, plain or relaxed), whether this runs in
    Pyodide, whether the relaxed module is installed, and ``engine_relaxed()`` (asked only when
    it matters): whether the engine validates relaxed SIMD. Raises DeviceError for an unknown
    setting, or for ``relaxed`` where it cannot run.

    >>> choose_module("auto", True, True, lambda: False)[0]
    False
    >>> choose_module("auto", True, True, lambda: True)
    (True, 'this engine validates relaxed SIMD (f32x4.relaxed_madd)')
    """
    if want not in ("auto", "plain", "relaxed"):
        raise DeviceError(f"device 'wasm': {KERNELS_ENV}={want!r}; expected auto, plain or relaxed")
    if want == "plain":
        return False, f"{KERNELS_ENV}=plain"
    if want == "relaxed":
        if not have_relaxed:
            raise DeviceError(f"device 'wasm': {KERNELS_ENV}=relaxed but {RELAXED_FILE} is not in this "
                              f"install (building it needs clang-19 and lld-19)")
        if pyodide and not engine_relaxed():
            raise DeviceError(f"device 'wasm': {KERNELS_ENV}=relaxed but this engine does not validate "
                              f"relaxed SIMD (Node 20: --experimental-wasm-relaxed-simd)")
        return True, f"{KERNELS_ENV}=relaxed"
    if not pyodide:
        return False, (f"CPython (wasmtime) runs the plain module, the reference the tests pin; "
                       f"{KERNELS_ENV}=relaxed picks the relaxed one")
    if not have_relaxed:
        return False, f"{RELAXED_FILE} is not in this install"
    if engine_relaxed():
        return True, "this engine validates relaxed SIMD (f32x4.relaxed_madd)"
    return False, "this engine does not validate relaxed SIMD (Node 20 needs --experimental-wasm-relaxed-simd)"


def _want() -> str:
    return os.environ.get(KERNELS_ENV, "auto").strip().lower() or "auto"


def select_module() -> dict:
    """Which kernel module this process runs and why: ``{"file", "relaxed", "why"}``. Decided
    on first use (``choose_module`` with ``EMBER_WASM_KERNELS``, default auto) and kept;
    ``use_plain_module`` replaces it when the relaxed one fails to compile."""
    if not _SELECTED:
        relaxed, why = choose_module(_want(), sys.platform == "emscripten", _has_module(RELAXED_FILE),
                                     _engine_has_relaxed_simd)
        _SELECTED.update(file=RELAXED_FILE if relaxed else MODULE_FILE, relaxed=relaxed, why=why)
    return dict(_SELECTED)


def use_plain_module(why: str) -> None:
    """Fall back to the plain module (the relaxed one failed to compile: ``why``)."""
    _SELECTED.clear()
    _SELECTED.update(file=MODULE_FILE, relaxed=False, why=why)


def module_bytes() -> bytes:
    """The bytes of the kernel module this process runs (``select_module``)."""
    return read_module(select_module()["file"])


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

        select_module()   # (a DeviceError of its own, not one of the set-up)
        try:
            try:
                mod = js.WebAssembly.Module.new(to_js(module_bytes()))
            except Exception as e:
                if not (select_module()["relaxed"] and _want() == "auto") or "RangeError" in type(e).__name__ + str(e):
                    raise
                use_plain_module(f"the relaxed module failed to compile ({str(e).strip()[:200]})")
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

        try:
            mod = await js.WebAssembly.compile(to_js(module_bytes()))
        except Exception as e:  # a JsException (CompileError)
            if not (select_module()["relaxed"] and _want() == "auto"):
                raise
            use_plain_module(f"the relaxed module failed to compile ({str(e).strip()[:200]})")
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

    def __init__(self, file: str | None = None):
        """``file``: the module to run (default: ``select_module``'s). The relaxed one runs with
        wasmtime's deterministic relaxed SIMD (``relaxed_madd`` always fused)."""
        import wasmtime

        self._w = wasmtime
        self.file = file or select_module()["file"]
        config = wasmtime.Config()
        if self.file == RELAXED_FILE:
            config.wasm_relaxed_simd = True
            config.wasm_relaxed_simd_deterministic = True
        self.engine = wasmtime.Engine(config)
        self.store = wasmtime.Store(self.engine)
        self.module = wasmtime.Module(self.engine, read_module(self.file))
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
