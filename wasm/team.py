"""A team of threads for the wasm kernels: Web Workers (or Node ``worker_threads``) running the
kernel module on one shared ``WebAssembly.Memory``.

**Where tensors live (decided by measurement).** Pyodide's own memory is not shared, so workers
cannot see an ``array.array``. Two layouts were possible: every wasm tensor in the shared memory
(Python holding offsets: every op, every ``tolist``, every python-backend fallback would go
through JS) or copies at the edges of a *replayed plan* (the layout wasmtime already uses: a plan
arena, ``plan_exec.ArenaSpace``). The second is what runs here: when threads are on, a plan's
command tables, its intermediates, its parameter arrays and its constants (weights, copied once
when the table is built) live in the shared memory; per replay only the inputs are copied in and
the outputs out (one ``TypedArray.set`` each). For MiniLM 8 × 64 that is ~4 KB in and 786 KB out
around a 100+ ms forward; an LLM decode step copies a few KB per token (its KV cache stays in
the shared memory, see below). Eager (not compiled) ops
stay on one thread on Pyodide's memory: copying a GEMM's operands per call costs about what a
second core saves below ~256³.

**How a replay runs.** ``ember_team_run`` (``kernels/exec.c``) is called by the Python thread
(thread 0) with the table's address and the team's control block (``kernels/team.h``): it
publishes the run in the control block and wakes the workers, and every thread walks the same
table. Kernels that split (``gemm``, ``q_linear``, ``conv2d_gemm``, ``sdpa_f32``,
``attention_cached_f32``, the elementwise maps) take their share of output rows / panels / heads
by thread index when their work is worth more than one thread; every other command runs on
thread 0 alone. Threads meet at a barrier only where a command may touch what another thread
wrote since the last one (or write what it read): commands whose memory the table names
(``q_linear``, maps, same-shape binary ops) and that touch none of it run on without one, so a
llama layer's Q/K/V products meet once, gate and up once (9 barriers per SmolLM2 layer, was 16;
``Team.barriers()`` counts them). One wake-up per segment, not per op. Workers spin a little between runs, then sleep in ``memory.atomic.wait``; thread 0 only
spins (a page's main thread may not wait).

**Identical results.** The module's code is the same bytes on Pyodide's memory and on the shared
one (only the memory import differs, ``wasmbin.with_shared_memory``), and a kernel splits only
along whole outputs, each computed by the same instructions in the same order: any thread count
gives the same bits (tests/test_wasm_threads.py, 1-4 threads, every op case).

**Where there are no threads** (a page without cross-origin isolation: no SharedArrayBuffer;
CPython under wasmtime; a JS host without workers) everything runs on one thread as before and
``ember.wasm.info()`` says why.

A constant a table writes in place (a KV cache) is *resident*: one copy in the shared memory for
every plan that binds it, synced with Python's array only when Python uses it (``Resident``).

**Arrays moved into the shared memory (a language model's weights, decided by measurement).**
Copying constants in once still held every weight twice: SmolLM2 Q4_1 (98 MB file) in Pyodide's
heap and again here, plus its KV cache in both (4.15x the file after a load and warm-up, Node,
2 threads). So a model loaded while the team runs (``ember.nn.llama``) reads its quantized
weights from the file straight into spans here (``Team.moved``, 1 MB at a time through one
buffer) and makes its KV cache here: Python's side is a ``Moved`` array, the right typecode and
``len()`` but no elements (1.17x the file, everything counted). Where such an array is used:

- a table binds it where it lives (``plan_exec.TeamSpace``: no copy; the usual checks, its size
  is the resident span's);
- an eager kernel call naming it (``runtime.PyodideRuntime.call``: the prompt's forward) runs on
  thread 0's instance of the module on this memory (``Team.call``): the call's other buffers are
  copied into a staging span and written ones back, every span bounds-checked first (a moved
  array against its resident size); the same kernel code, so the same bits;
- Python reading it gives it its elements back (``Resident.python_use``: a copy, kept; it is a
  plain resident array from then on): every python-backend kernel the wasm backend runs (an op
  or dtype the module has no kernel for, eagerly or as a step of a replay) syncs its inputs
  first (``fallback.python_kernel``, the one source of them; an input it writes marks Python's
  copy the newer), and any other Python code reaching the elements (``tolist``, indexing,
  iteration, the buffer protocol, the python device sharing the buffer) goes through the
  ``Moved`` class, which does the same. A slice of a moved array is copied in the shared memory
  (it stays moved). After ``set_threads(1)`` its plans' tables run on thread 0 of the team's
  memory instead (``plan_exec._plan_team``), so nothing is copied back;
- after ``Team.close()`` (its memory given up) reading a moved array raises ``DeviceError``.

**Limits.** ``array(typecode, moved)`` with the same typecode copies C-level elements (none);
``buffer_info()`` reports the none Python holds. Threads help only compiled plans
(``ember.compile``, ONNX sessions, ``ember.llm``'s steps). A resident array that is not moved,
read by Python code other than a kernel call or ``tolist`` (a family kernel indexing a scalar
operand, the python device sharing the buffer), may show values from before the last replays.
Workers are started once and stopped only by ``close()`` (``set_threads(1)`` parks them); they
start asynchronously: the first replays after ``set_threads`` may run on fewer threads (the same
results; a segment's probes wait for them), ``await ember.wasm.init(wait_threads=s)`` waits.

**When the team starts.** ``ember.wasm.init()`` starts it in the background: the module for
the shared memory compiled asynchronously, the workers started when that is done (an event loop
turn of the page's model load), and ``init()`` returns at once; ``info()`` never starts it. A
plan that runs before then, or without ``init()`` (Node scripts), starts it synchronously when
its tables are worth the team (``plan_exec._plan_team``: at least ``TeamSpace.SMALL_WORK``
multiply-adds); a small plan never starts it and never runs on it. Starting it with the first
big plan only (tried, measured in bench web pages): the MNIST page's start was ~40 ms shorter
(the loader's init step 119 -> 102 ms, the model load 208 -> 189, load 2.8-4), but a page that
calls a big model in a loop that never yields to its event loop (bench web's timed loop) kept
one thread for the whole workload: Chromium starts a Web Worker only from the page's event loop
(MiniLM 8 x 64: 340-370 ms instead of 175). Before that, ``init()`` built the team synchronously
(``info()`` asked for ``threads()``): the init step 166 vs 132 ms now (5 alternating pages, load
2-3). The idle workers cost the page nothing measurable (/proc per-thread CPU of the renderer:
under 10 ms for a whole MNIST page; MNIST forwards the same with a team of 1 or none).
"""
from __future__ import annotations

import os
import sys

from array import array

from ..errors import BoundsError, DeviceError

PAGE = 65536
MAX_PAGES = 32768          # 2 GiB: the shared memory's maximum (reserved up front by the engine)
MAX_THREADS = 8            # the default never uses more (hardwareConcurrency is capped here)
CTL_WORDS = 88             # kernels/team.h TEAM_WORDS
# kernels/team.h word indices
RUN_GEN, THREADS_W, SCRATCH, SCRATCH_STRIDE, MIN_WORK, SPIN, RUNS, MAIN_WAIT, READY = 0, 12, 9, 10, 11, 13, 14, 16, 24
BARRIERS = 18
QUIT = 8
# a kernel splits only work of at least this many multiply-adds per thread (a barrier costs ~1 us)
DEFAULT_MIN_WORK = int(os.environ.get("EMBER_WASM_MIN_WORK", "65536"))
# spins before a waiting thread sleeps (memory.atomic.wait): long enough to cover a kernel's
# imbalance on idle cores, short enough to hand a busy machine's cores back
DEFAULT_SPIN = 20000

_WORKER_NODE = """
const { workerData: d } = require('node:worker_threads');
const inst = new WebAssembly.Instance(d.module, { env: { memory: d.memory } });
inst.exports.ember_team_worker(d.ctl, d.tid);
"""
_WORKER_WEB = """
onmessage = (e) => {
  const d = e.data;
  const inst = new WebAssembly.Instance(d.module, { env: { memory: d.memory } });
  inst.exports.ember_team_worker(d.ctl, d.tid);
};
"""
# Runs in the JS host: starts one worker (Node or browser) on the shared module and memory.
_SPAWN = """(module, memory, ctl, tid, nodeSrc, webSrc) => {
  const g = globalThis;
  if (g.process && g.process.versions && g.process.versions.node && typeof g.window === 'undefined') {
    const wt = g.process.getBuiltinModule ? g.process.getBuiltinModule('node:worker_threads') : null;
    if (!wt) throw new Error('no node:worker_threads (process.getBuiltinModule)');
    const w = new wt.Worker(nodeSrc, { eval: true, workerData: { module, memory, ctl, tid } });
    w.unref();
    w.on('error', (e) => console.error('ember wasm worker ' + tid + ': ' + e));
    return w;
  }
  const url = URL.createObjectURL(new Blob([webSrc], { type: 'text/javascript' }));
  const w = new Worker(url);
  w.onerror = (e) => console.error('ember wasm worker ' + tid + ': ' + (e.message || e));
  w.postMessage({ module, memory, ctl, tid });
  return w;
}"""
# Copies between Pyodide's memory (heap) and the shared one.
_COPY = """(heap, shared, src, dst, n, toShared) => {
  if (toShared) new Uint8Array(shared.buffer, dst, n).set(new Uint8Array(heap.buffer, src, n));
  else new Uint8Array(heap.buffer, dst, n).set(new Uint8Array(shared.buffer, src, n));
}"""


# An eager call on the shared memory in one crossing (Team.call): nIn (heap address, shared
# address, bytes) triples read from Pyodide's memory at plan are copied in, f(...args) runs, the
# nBack triples after them are copied back; f's result is returned.
_CALL_STAGED = """(heap, shared, plan, nIn, nBack, f, ...args) => {
  const p = new Uint32Array(heap.buffer, plan, 3 * (nIn + nBack));
  let h = new Uint8Array(heap.buffer), s = new Uint8Array(shared.buffer);
  for (let i = 0; i < 3 * nIn; i += 3) s.set(h.subarray(p[i], p[i] + p[i + 2]), p[i + 1]);
  const r = f(...args);
  if (nBack) {
    h = new Uint8Array(heap.buffer); s = new Uint8Array(shared.buffer);
    for (let i = 3 * nIn; i < 3 * (nIn + nBack); i += 3) h.set(s.subarray(p[i + 1], p[i + 1] + p[i + 2]), p[i]);
  }
  return r;
}"""
# Zeroes n bytes of the shared memory from dst.
_FILL = """(shared, dst, n) => { new Uint8Array(shared.buffer, dst, n).fill(0); }"""


def environment() -> dict:
    """What the JS host offers: {'shareable': bool, 'max_threads': int, 'why': str or None}."""
    if sys.platform != "emscripten":
        return {"shareable": False, "max_threads": 1,
                "why": "CPython runs the kernels under wasmtime: one thread"}
    import js

    g = js.globalThis
    node = bool(getattr(g, "process", None)) and bool(getattr(getattr(g.process, "versions", None), "node", None))
    if not hasattr(g, "SharedArrayBuffer") or (not node and not getattr(g, "crossOriginIsolated", False)):
        return {"shareable": False, "max_threads": 1,
                "why": "the page is not cross-origin isolated (COOP/COEP headers): no SharedArrayBuffer, one thread"}
    if node:
        if not getattr(g.process, "getBuiltinModule", None):
            return {"shareable": False, "max_threads": 1,
                    "why": "this Node has no process.getBuiltinModule (node:worker_threads): one thread"}
        cores = int(g.process.getBuiltinModule("node:os").availableParallelism())
    else:
        if not hasattr(g, "Worker"):
            return {"shareable": False, "max_threads": 1, "why": "no Web Workers here: one thread"}
        cores = int(getattr(g.navigator, "hardwareConcurrency", 1) or 1)
    return {"shareable": True, "max_threads": max(1, cores), "why": None}


def _on_page_main_thread() -> bool:
    import js

    return hasattr(js.globalThis, "document") or hasattr(js.globalThis, "window")


class Spans:
    """The shared memory's allocator: a free list of (address, size) sorted by address over a bump
    pointer. ``have()`` is the memory's size in bytes, ``grow(pages)`` adds pages.

    Spans are released by finalizers (``weakref.finalize`` on a plan's replay, which sits in a
    reference cycle with its space, and on a resident array), and the garbage collector runs
    those at whatever allocation triggers it, also one in the middle of ``alloc`` or ``release``
    walking the free list: a release there used to rebuild the list under the walk, and two live
    spans could end up sharing bytes (a plan's buffers or table header overwritten by another's,
    threads' scratch over a KV cache). So ``release`` only queues the span (one ``list.append``)
    and the free list changes only in ``alloc``, which takes the queue first."""

    def __init__(self, have, grow):
        self.have, self.grow = have, grow
        self.free = []       # [(addr, size)] sorted by address
        self.top = 64        # bump pointer past everything allocated
        self.released = []   # spans released since the last alloc

    def release(self, addr: int, nbytes: int) -> None:
        self.released.append((addr, max(16, (nbytes + 15) & ~15)))

    def _take_released(self) -> None:
        # pop() and append() are single steps: a finalizer run in between only queues more
        while self.released:
            self._free(*self.released.pop())

    def _free(self, addr: int, nbytes: int) -> None:
        spans = sorted(self.free + [(addr, nbytes)])
        merged = []
        for a, n in spans:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((a, n))
        if merged and merged[-1][0] + merged[-1][1] == self.top:
            self.top = merged.pop()[0]
        self.free = merged

    def alloc(self, nbytes: int, align: int = 16) -> int:
        self._take_released()
        nbytes = max(16, (nbytes + 15) & ~15)
        for k, (a, n) in enumerate(self.free):
            at = (a + align - 1) & -align
            if at + nbytes <= a + n:
                rest = []
                if at > a:
                    rest.append((a, at - a))
                if a + n > at + nbytes:
                    rest.append((at + nbytes, a + n - at - nbytes))
                self.free[k:k + 1] = rest
                return at
        at = (self.top + align - 1) & -align
        end = at + nbytes
        have = self.have()
        if end > have:
            self.grow((end - have + PAGE - 1) // PAGE)
        if at > self.top:
            self._free(self.top, at - self.top)
        self.top = end
        return at


class Team:
    """The shared memory, the main thread's instance of the module on it, the control block and
    the workers. One per process (``team()``) until ``close()``."""

    closed = False

    def __init__(self, module, instance, memory):
        import js
        import pyodide_js

        self.module, self.instance, self.memory = module, instance, memory
        self.exports = instance.exports
        self.heap = pyodide_js._module.memory
        self._spawn = js.Function.new("return " + _SPAWN)()
        self._copy = js.Function.new("return " + _COPY)()
        self._fill = js.Function.new("return " + _FILL)()
        self._call_staged = js.Function.new("return " + _CALL_STAGED)()
        self.stage_addr, self.stage_bytes = 0, 0   # where eager calls on moved arrays stage the rest
        self._fns = {}
        self.workers = []
        self.spans = Spans(lambda: int(self.memory.buffer.byteLength), self._grow)
        self.ctl = self.alloc(CTL_WORDS * 4)
        self.scratch_addr, self.scratch_stride, self.scratch_slots = 0, 0, 0
        self.wanted = 1
        # plan_exec.TeamSpace times each segment on the team and on one thread and keeps the
        # faster; False: always the team (tests of the split kernels)
        self.adaptive = True
        self._set(MIN_WORK, DEFAULT_MIN_WORK)
        self._set(SPIN, DEFAULT_SPIN)
        self._set(THREADS_W, 1)
        # a page's main thread may not block in memory.atomic.wait: there thread 0 only spins
        self._set(MAIN_WAIT, 0 if _on_page_main_thread() else 1)
        self._run = self.exports.ember_team_run

    # ---- the control block -------------------------------------------------------------------
    def _view(self):
        import js

        return js.Int32Array.new(self.memory.buffer, self.ctl, CTL_WORDS)

    def _set(self, word: int, value: int) -> None:
        import js

        js.Atomics.store(self._view(), word, int(value))

    def _get(self, word: int) -> int:
        import js

        return int(js.Atomics.load(self._view(), word))

    def ready(self) -> int:
        """Threads that can take part in a run now (1 + the workers started, in index order)."""
        v = self._view()
        n = 1
        while n < self.wanted and n <= len(self.workers) and int(v[READY + n]):
            n += 1
        return n

    def set_threads(self, n: int) -> None:
        n = max(1, min(int(n), 64))
        while len(self.workers) < n - 1:
            tid = len(self.workers) + 1
            self.workers.append(self._spawn(self.module, self.memory, self.ctl, tid, _WORKER_NODE, _WORKER_WEB))
        self.wanted = n
        self.ensure_scratch(0, n)   # thread indices below n have a scratch before any run uses them
        self._set(THREADS_W, n)

    def set_min_work(self, n: int) -> None:
        self._set(MIN_WORK, max(1, int(n)))

    def runs(self) -> int:
        return self._get(RUNS)

    def barriers(self) -> int:
        """Barriers between table commands that thread 0 met so far (a kernel's own inside it
        aside): with ``runs()``, how often a replay's threads wait for each other."""
        return self._get(BARRIERS)

    # ---- memory ------------------------------------------------------------------------------
    def _grow(self, pages: int) -> None:
        if int(self.memory.buffer.byteLength) // PAGE + pages > MAX_PAGES:
            raise DeviceError(f"wasm threads: the shared memory would pass {MAX_PAGES * PAGE >> 20} MB")
        self.memory.grow(pages)

    def alloc(self, nbytes: int, align: int = 16) -> int:
        if self.closed:
            raise DeviceError("wasm threads: the team's shared memory was closed")
        return self.spans.alloc(nbytes, align)

    def release(self, addr: int, nbytes: int) -> None:
        self.spans.release(addr, nbytes)

    def _check(self, addr: int, buf, nbytes: int) -> None:
        # (the elements the array holds: a Moved array's len() counts those in the shared memory)
        if self.closed:
            raise DeviceError("wasm threads: the team's shared memory was closed")
        have = buf.buffer_info()[1] * buf.itemsize if isinstance(buf, array) else len(buf) * buf.itemsize
        if addr < 0 or addr + nbytes > int(self.memory.buffer.byteLength) or nbytes > have:
            raise BoundsError(f"wasm threads: {nbytes} bytes at {addr} reach outside the shared memory or the buffer")

    def write_from(self, addr: int, buf, nbytes: int) -> None:
        if nbytes > 0:
            self._check(addr, buf, nbytes)
            self._copy(self.heap, self.memory, buf.buffer_info()[0], addr, nbytes, True)

    def read_into(self, addr: int, buf, nbytes: int) -> None:
        if nbytes > 0:
            self._check(addr, buf, nbytes)
            self._copy(self.heap, self.memory, addr, buf.buffer_info()[0], nbytes, False)

    def ensure_scratch(self, nbytes: int, slots: int = 0) -> None:
        """Every thread's private scratch holds at least ``nbytes`` (kernels/team.h), for at
        least ``slots`` threads (the threads asked for by default)."""
        stride = max((nbytes + 63) & ~63, self.scratch_stride)
        slots = max(slots, self.wanted, self.scratch_slots)
        if stride == self.scratch_stride and slots == self.scratch_slots:
            return
        if self.scratch_addr:
            self.release(self.scratch_addr, self.scratch_stride * self.scratch_slots)
        self.scratch_addr = self.alloc(stride * slots, 64) if stride else 0
        self.scratch_stride, self.scratch_slots = stride, slots
        self._set(SCRATCH, self.scratch_addr)
        self._set(SCRATCH_STRIDE, stride)

    def run(self, table_addr: int, start: int) -> int:
        if self.closed:
            raise DeviceError("wasm threads: a table of a closed team (its plan records again on its next call)")
        return self._run(table_addr, start, self.ctl)

    def close(self) -> None:
        """Stop the workers and give the shared memory up (the process's next ``team()`` makes
        a new team): resident arrays that are not moved get Python's copy up to date and stop
        being resident; moved ones are gone with the memory, so Python reading one, an eager
        call naming one or a table of this team raises ``DeviceError`` (never zeros). Plans
        notice the change (``epoch``) and record their tables again."""
        if self.closed:
            return
        from .runtime import RESIDENT

        for key, ent in list(RESIDENT.items()):
            if ent.team is self:
                if not ent.moved:
                    ent.python_use(False)
                del RESIDENT[key]
        self.closed = True
        for w in self.workers:
            w.terminate()
        self.workers = []
        self._fns.clear()
        if _STATE["team"] is self:
            _STATE["team"] = None
            _bump()

    # ---- arrays that live in the shared memory only --------------------------------------------
    def moved(self, typecode: str, n: int, fill=None, chunk: int = 1 << 20) -> "Moved":
        """A ``Moved`` array of ``n`` elements whose elements live in the shared memory only.
        ``fill(offset, view)`` writes the bytes from ``offset`` into ``view`` (a writable byte
        view of at most ``chunk`` bytes, copied over through one reused buffer of Pyodide's
        heap: a GGUF tensor read straight from its file); without it, zeros."""
        buf = Moved(typecode)
        buf.n = int(n)
        nbytes = buf.n * buf.itemsize
        ent = Resident(self, buf, moved=True)
        if fill is None:
            if nbytes:
                self._fill(self.memory, ent.addr, nbytes)
            return buf
        bounce = array("B", bytes(min(chunk, nbytes)))
        mv = memoryview(bounce)
        try:
            at = 0
            while at < nbytes:
                k = min(len(bounce), nbytes - at)
                fill(at, mv[:k])
                self._copy(self.heap, self.memory, bounce.buffer_info()[0], ent.addr + at, k, True)
                at += k
        finally:
            mv.release()
        return buf

    def call(self, name: str, args) -> object:
        """Eager kernel call ``name(*args)`` (``runtime.R``/``W`` buffers and numbers) run by
        thread 0's instance on the shared memory: what ``runtime.PyodideRuntime.call`` does
        when an argument is a ``Moved`` array. Resident arrays are used where they live (made
        current there first); every other buffer span is copied into a staging span before the
        call and, when written, back after. Bounds are checked as the runtime checks them
        (moved arrays against their resident size) before anything is copied."""
        from .runtime import RESIDENT, R, check_span

        if self.closed:
            raise DeviceError(f"wasm threads ({name}): the team was closed")
        plan, total = [], 0
        for a in args:
            if not isinstance(a, R):
                plan.append(None)
                continue
            buf = a.buf
            ent = RESIDENT.get(id(buf))
            if ent is not None and ent.buf() is not buf:
                ent = None
            isz = buf.itemsize
            if ent is not None:
                n, off = a.n, a.offset
                if n < 0 or off < 0 or (off + n) * isz > ent.nbytes or (n and not off <= a.at < off + n):
                    raise BoundsError(f"wasm kernel buffer ({name}): {n} elements from offset {off} exceed "
                                      f"a resident buffer of {ent.nbytes // isz}")
                plan.append((ent, 0))
            else:
                if ent is None and isinstance(buf, Moved):
                    raise DeviceError(f"wasm threads ({name}): a moved array without its shared copy")
                check_span(a)
                plan.append((None, total))
                total += (a.n * isz + 15) & ~15
        if total > self.stage_bytes:
            if self.stage_addr:
                self.release(self.stage_addr, self.stage_bytes)
            self.stage_bytes = max(total, 2 * self.stage_bytes)
            self.stage_addr = self.alloc(self.stage_bytes)
        base = self.stage_addr
        conv, wrote = [], []
        into, back = array("I"), array("I")   # (heap address, shared address, bytes) triples
        for a, how in zip(args, plan):
            if how is None:
                conv.append(a)
                continue
            ent, at = how
            isz = a.buf.itemsize
            if ent is not None:
                ent.to_shared()
                conv.append(ent.addr + a.at * isz if a.n else 0)
                if a.writes:
                    wrote.append(ent)
                continue
            nb = a.n * isz
            src = a.buf.buffer_info()[0] + a.offset * isz
            if nb:
                into.extend((src, base + at, nb))
                if a.writes:
                    back.extend((src, base + at, nb))
            conv.append(base + at + (a.at - a.offset) * isz if a.n else 0)
        f = self._fns.get(name)
        if f is None:
            f = self._fns[name] = getattr(self.exports, name)
        n_in, n_back = len(into) // 3, len(back) // 3
        into.extend(back)
        # (the plan array is not touched until the call returns: its address stays valid)
        res = self._call_staged(self.heap, self.memory, into.buffer_info()[0], n_in, n_back, f, *conv)
        for ent in wrote:
            ent.shared_wrote()
        return res

    def resident(self, buf) -> "Resident":
        """The resident copy of array ``buf`` (made on first use, freed with ``buf``)."""
        from .runtime import RESIDENT

        ent = RESIDENT.get(id(buf))
        if ent is None or ent.buf() is not buf:
            ent = Resident(self, buf)
        return ent


class _Held(array):
    """A ``Moved`` array that got its elements back (``Resident.python_use`` changes its class
    to this one): a plain array but for the slot, so Python reads it at array speed."""

    __slots__ = ("n",)


class Moved(_Held):
    """Python's side of an array that lives in the team's shared memory only (``Team.moved``):
    its typecode, and ``len()`` the elements it stands for, but no elements of its own. Eager
    wasm kernel calls that name it run on the shared memory (``Team.call``), tables bind it where
    it lives.

    Python code that reads or writes its elements goes through this class (indexing, slicing,
    iteration, ``tolist``/``tobytes``, comparisons, ``+``/``*``, the buffer protocol:
    ``memoryview``, ``bytes()``, ``struct``): the first such use gives it its elements
    (``Resident.python_use``, a write marking Python's copy the newer) and makes it a plain
    ``_Held`` array; an array whose shared copy is gone (its team closed, or never made by
    ``Team.moved``) raises ``DeviceError`` there instead of reading nothing. Left out:
    ``buffer_info()`` (metadata: it reports the 0 elements Python holds) and ``array(typecode,
    moved)`` with the same typecode, which copies C-level elements (an empty array); python
    kernels are also synced before they run (``fallback.python_kernel``)."""

    __slots__ = ()

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Moved({self.typecode!r}, n={self.n})"

    def _use(self, writes: bool = False) -> array:
        """Give this array its elements (``Resident.python_use``); returns it (now a ``_Held``)."""
        from .runtime import RESIDENT

        ent = RESIDENT.get(id(self))
        if ent is None or ent.buf() is not self:
            raise DeviceError(f"wasm threads: a moved array of {self.n} {self.typecode!r} elements has no copy in "
                              f"the shared memory (its team was closed, or it was not made by Team.moved): "
                              f"Python cannot read its elements")
        ent.python_use(writes)
        return self

    # reads
    def __getitem__(self, i):
        return self._use()[i]

    def __iter__(self):
        return iter(self._use())

    def __contains__(self, v) -> bool:
        return v in self._use()

    def __eq__(self, other):
        return self._use() == other

    def __ne__(self, other):
        return self._use() != other

    def __lt__(self, other):
        return self._use() < other

    def __le__(self, other):
        return self._use() <= other

    def __gt__(self, other):
        return self._use() > other

    def __ge__(self, other):
        return self._use() >= other

    __hash__ = None

    def __add__(self, other):
        return self._use() + other

    def __radd__(self, other):
        self._use()
        return NotImplemented   # the left array's concatenation now sees the elements

    def __mul__(self, k):
        return self._use() * k

    __rmul__ = __mul__

    def __copy__(self):
        return self._use()[:]

    def __deepcopy__(self, memo):
        return self._use()[:]

    def __reduce_ex__(self, protocol):
        return array, (self.typecode, self._use().tolist())

    def __buffer__(self, flags: int) -> memoryview:   # (Python 3.12+: memoryview, bytes(), struct)
        self._use(bool(flags & 1))   # PyBUF_WRITABLE
        return memoryview(self)

    # writes (Python's copy becomes the newer one)
    def __setitem__(self, i, v) -> None:
        self._use(True)[i] = v

    def __delitem__(self, i) -> None:
        del self._use(True)[i]

    def __iadd__(self, other):
        arr = self._use(True)
        arr += other
        return arr

    def __imul__(self, k):
        arr = self._use(True)
        arr *= k
        return arr


def _forwarded(name: str, writes: bool):
    """``Moved.<name>``: array's own method, on the array once it has its elements."""
    def method(self, *args):
        return getattr(self._use(writes), name)(*args)
    method.__name__ = method.__qualname__ = name
    return method


# array's named methods: those that only read, then those that write (Python's copy the newer)
for _name in ("tolist", "tobytes", "tofile", "count", "index"):
    setattr(Moved, _name, _forwarded(_name, False))
for _name in ("append", "extend", "insert", "pop", "remove", "reverse", "byteswap", "frombytes", "fromlist",
              "fromfile"):
    setattr(Moved, _name, _forwarded(_name, True))
del _name


class Resident:
    """An array kept in the shared memory between replays instead of being copied in and out
    around every segment: a constant that tables write in place (a KV cache), or one *moved*
    there (``Team.moved``: weights and the KV cache of a model loaded with the team; Python's
    ``Moved`` array holds no elements). Whichever side wrote last is the current one:
    ``to_shared`` before a table reads it, ``python_use`` before an eager kernel call
    (``runtime.PyodideRuntime.call``) or a one-thread table touches Python's array; a moved
    array gets its elements there (a copy, kept: the array is no longer moved). Python code that
    reads a non-moved resident array by other means than those (``tolist`` goes through the
    backend's ``to_bytes``, which syncs) may see values from before the last replays."""

    SAME, PY_NEWER, SHARED_NEWER = 0, 1, 2

    def __init__(self, team: "Team", buf, moved: bool = False):
        import weakref

        from .runtime import RESIDENT

        self.team = team
        self.nbytes = len(buf) * buf.itemsize
        self.addr = team.alloc(self.nbytes)
        self.buf = weakref.ref(buf)
        self.moved = moved
        if not moved:
            team.write_from(self.addr, buf, self.nbytes)
        self.state = self.SAME
        key = id(buf)
        RESIDENT[key] = self
        weakref.finalize(buf, Resident._drop, RESIDENT, key, self, team, self.addr, self.nbytes)

    @staticmethod
    def _drop(registry, key, ent, team, addr, nbytes):
        if registry.get(key) is ent:
            del registry[key]
        team.release(addr, nbytes)

    def to_shared(self) -> None:
        if self.state == self.PY_NEWER and not self.moved:
            b = self.buf()
            if b is not None:
                self.team.write_from(self.addr, b, self.nbytes)
            self.state = self.SAME

    def shared_wrote(self) -> None:
        if not self.moved:
            self.state = self.SHARED_NEWER

    def copy(self) -> array:
        """A plain array with the current values (a moved array's, read from the shared memory)."""
        b = self.buf()
        if not self.moved:
            self.python_use(False)
            return b[:]
        if self.team.closed:
            raise DeviceError(f"wasm threads: the team holding this {self.nbytes}-byte array was closed")
        out = array(b.typecode, bytes(self.nbytes))
        self.team.read_into(self.addr, out, self.nbytes)
        return out

    def python_use(self, writes: bool) -> None:
        """Python is about to read (``writes``: and write) the array: bring its elements up to
        date there (a moved array gets them now, kept: a plain resident array from then on);
        ``DeviceError`` when the team is closed."""
        if self.team.closed:
            raise DeviceError(f"wasm threads: the team holding this {self.nbytes}-byte array was closed")
        if self.moved:
            b = self.buf()
            if b is not None:   # Python's copy, made now (and kept)
                b.__class__ = _Held   # (before its first element: Moved's methods would come back here)
                try:
                    array.frombytes(b, bytes(self.nbytes))
                    self.team.read_into(self.addr, b, self.nbytes)
                except BaseException:
                    del b[:]
                    b.__class__ = Moved
                    raise
            self.moved = False
            self.state = self.PY_NEWER if writes else self.SAME
            from .runtime import REMATERIALIZED

            REMATERIALIZED[0] += 1   # replays that skipped syncing it (plan_exec) list it again
            return
        if self.state == self.SHARED_NEWER:
            b = self.buf()
            if b is not None:
                self.team.read_into(self.addr, b, self.nbytes)
            self.state = self.SAME
        if writes:
            self.state = self.PY_NEWER


class TeamArena:
    """A plan's spans in the team's shared memory (the arena protocol of ``plan_exec``:
    ``alloc``, ``write_from``, ``read_into``, ``fn``, ``close``)."""

    kind = "threads"

    def __init__(self, team: Team):
        self.team = team
        self.spans = []

    def alloc(self, nbytes: int, align: int = 16) -> int:
        a = self.team.alloc(nbytes, align)
        self.spans.append((a, nbytes))
        return a

    def write_from(self, addr, buf, nbytes):
        self.team.write_from(addr, buf, nbytes)

    def read_into(self, addr, buf, nbytes):
        self.team.read_into(addr, buf, nbytes)

    def fn(self, name):
        if name != "ember_run":
            raise DeviceError(f"wasm threads: a plan arena runs tables only, not {name}")
        return self.team.run

    def close(self) -> None:
        spans, self.spans = self.spans, []
        for a, n in spans:
            self.team.release(a, n)


_STATE = {"team": None, "wanted": None, "why": None, "env": None, "epoch": 0, "pending": None}


def epoch() -> int:
    """Changes whenever replayed plans should move between one thread (Pyodide's memory) and the
    team (a plan notices on its next replay and records its tables again)."""
    return _STATE["epoch"]


def _bump() -> None:
    _STATE["epoch"] += 1


def _env() -> dict:
    if _STATE["env"] is None:
        _STATE["env"] = environment()
    return _STATE["env"]


def default_threads() -> int:
    """The browser's hardwareConcurrency (Node: available cores), capped at MAX_THREADS."""
    return max(1, min(_env()["max_threads"], MAX_THREADS))


def _module_bytes() -> bytes:
    from .runtime import module_bytes
    from .wasmbin import with_shared_memory

    return with_shared_memory(module_bytes(), MAX_PAGES)


def _make_team_sync() -> Team:
    import js
    from pyodide.ffi import to_js

    mem = js.WebAssembly.Memory.new(to_js({"initial": 16, "maximum": MAX_PAGES, "shared": True},
                                          dict_converter=js.Object.fromEntries))
    mod = js.WebAssembly.Module.new(to_js(_module_bytes()))
    inst = js.WebAssembly.Instance.new(mod, to_js({"env": {"memory": mem}}, dict_converter=js.Object.fromEntries))
    return Team(mod, inst, mem)


async def _make_team_async() -> Team:
    import js
    from pyodide.ffi import to_js

    mem = js.WebAssembly.Memory.new(to_js({"initial": 16, "maximum": MAX_PAGES, "shared": True},
                                          dict_converter=js.Object.fromEntries))
    mod = await js.WebAssembly.compile(to_js(_module_bytes()))
    inst = await js.WebAssembly.instantiate(mod, to_js({"env": {"memory": mem}}, dict_converter=js.Object.fromEntries))
    return Team(mod, inst, mem)


def possible() -> bool:
    """Whether replayed plans would get a team here now: more than one thread wanted and a
    shared memory available (the team itself may not be started yet: ``team()`` starts it)."""
    return wanted() > 1 and _env()["shareable"]


def team(create: bool = True):
    """The process's team when more than one thread is asked for and possible, else None.

    ``create``: start it now if it is not running (the shared memory, the module compiled for
    it, the workers). Only a caller that will use it asks for that: a replayed plan whose
    tables are worth the team (``plan_exec._plan_team``), a model moving its weights into the
    shared memory, ``threads()``; ``info()`` does not. Where the host refuses a synchronous
    compile (an older browser's main thread), the team is started in the background instead
    and plans move to it on their next replay (``epoch``)."""
    t = _STATE["team"]
    if t is not None or not create:
        return t if t is not None and t.wanted > 1 else None
    if not possible():
        return None
    try:
        t = _make_team_sync()
    except Exception as e:  # noqa: BLE001 (a page's main thread may refuse synchronous compilation)
        _STATE["why"] = f"the thread team is starting in the background ({str(e).strip()[:120]})"
        _create_soon()
        return None
    _start(t)
    return t if t.wanted > 1 else None


def _create_soon() -> None:
    """Start the team asynchronously (once) where an event loop runs (Pyodide's)."""
    if _STATE["pending"] is not None:
        return
    try:
        import asyncio

        _STATE["pending"] = asyncio.ensure_future(_create())
    except Exception as e:  # noqa: BLE001 (no event loop: the team stays off, and says why)
        _STATE["why"] = f"the thread team could not start: {str(e).strip()[:160]}"


def _start(t: Team) -> None:
    _STATE["team"] = t
    _STATE["why"] = None
    t.set_threads(wanted())
    _bump()


def wanted() -> int:
    w = _STATE["wanted"]
    return default_threads() if w is None else w


async def init_async(wait: float = 0.0) -> None:
    """Start the team where threads are possible. With ``wait`` == 0 it starts in the background
    (compiled asynchronously, its workers started when that is done, on an event loop turn of
    the page's model load) and this returns at once; ``wait`` > 0 starts it now and waits up to
    that many seconds for it and all its workers."""
    import asyncio
    import time

    if not possible():
        return
    if wait <= 0:
        if _STATE["team"] is None:
            _create_soon()
        return
    if _STATE["team"] is None:
        team()   # synchronously where the host allows it; else in the background
        if _STATE["team"] is None and _STATE["pending"] is not None:
            await _STATE["pending"]
    t = _STATE["team"]
    if t is None:
        return
    end = time.monotonic() + wait
    while t.ready() < t.wanted and time.monotonic() < end:
        await asyncio.sleep(0.005)


async def _create() -> None:
    try:
        t = await _make_team_async()
    except Exception as e:  # noqa: BLE001
        _STATE["why"] = f"the thread team could not start: {str(e).strip()[:160]}"
        return   # (pending stays set: not tried again)
    _STATE["pending"] = None
    if _STATE["team"] is None:
        _start(t)


def set_threads(n) -> None:
    if n is None:
        _STATE["wanted"] = None
    else:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"ember.wasm.set_threads: n must be an int >= 1 or None, got {n!r}")
        _STATE["wanted"] = n
    t = _STATE["team"]
    if t is not None:
        was = t.wanted > 1
        t.set_threads(wanted() if _env()["shareable"] else 1)
        if was != (t.wanted > 1):
            _bump()


def threads() -> int:
    """Threads a replayed plan runs on now (1 where threads are unavailable). Asking starts the
    team where more than one thread is wanted (its workers start in the background: poll)."""
    if not _env()["shareable"]:
        return 1
    t = _STATE["team"]
    if t is None:
        return 1 if team() is None else _STATE["team"].ready()
    return t.ready()


def describe() -> dict:
    """``ember.wasm.info()``'s thread entries. Asking does not start the team: ``threads`` is
    1 until it is running (``init()`` starts it in the background)."""
    env = _env()
    t = _STATE["team"]
    threads_now = t.ready() if t is not None and env["shareable"] and t.wanted > 1 else 1
    out = {"threads": threads_now, "threads_wanted": wanted(), "max_threads": env["max_threads"],
           "shared_memory": env["shareable"], "workers_started": len(t.workers) if t else 0}
    why = env["why"] or _STATE["why"]
    if why is None and out["threads"] == 1:
        if wanted() <= 1:
            why = "one thread asked for (ember.wasm.set_threads)"
        elif t is None:
            why = ("the thread team is not running yet (ember.wasm.init() starts it in the background; "
                   "a replayed plan worth it starts it)")
    if why:
        out["note"] = why
    if t is not None:
        out["team_runs"] = t.runs()
        out["team_barriers"] = t.barriers()
        out["shared_memory_bytes"] = int(t.memory.buffer.byteLength)
    return out
