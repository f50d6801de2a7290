"""A replayed plan on device ``"webgpu"`` as one prebuilt dispatch stream.

``ember.compile`` (and the ONNX runtime, and ``ember.llm``'s one-token step) replay a ``Plan``
step by step: per step a kernel wrapper computes its uniforms, takes buffers from the pool and
records its dispatches through the driver (bind-group lookup, three API calls): tens to hundreds
of microseconds of Python per dispatch. Here (``compile_plan``, the hook ``core/plan.py`` asks
every backend for, as the wasm backend's command tables) the plan's first replay is *recorded*
once and every later replay encodes the recorded list in one loop:

- the plan **owns its buffers**: its inputs' (the replay copies each input in, GPU-side), every
  intermediate (the buffers the pool handed out while recording, so intermediates whose lives do
  not overlap share one, exactly as they did then; taken out of the pool for the plan's life);
- its **uniforms** live in one buffer of the plan, written once (they hold shapes and offsets,
  never data: a value that varies per replay, a decoding position, is an input tensor the
  kernels read from a buffer the replay writes);
- its **bind groups** are made once, and its **dispatch list** is prebuilt per driver: natively
  a list of wgpu-native handles walked by three direct C calls per dispatch
  (``wgpuComputePassEncoderSetPipeline``/``SetBindGroup``/``DispatchWorkgroups`` through
  wgpu-py's cffi ``lib``), in the page one JavaScript function call that walks prebuilt arrays.
  Outputs are copied out into fresh buffers, so a result never changes under its holder.

**Guards** (never stale data). Every replay checks, before encoding, that each constant tensor
still holds the buffer recorded (a replaced weight, or a ``_set_``, makes that replay run step
by step and the next one record again; at most ``MAX_RECORDS`` recordings, then the plan stays
step by step). Index checks that the step-by-step replay makes in Python from an integer input's
known range (``take`` of the rope tables at ``pos + arange(T)``, ``attention_cached``'s position,
``qembedding``'s ids) are recorded as *guards* on the plan's inputs: ``Bounds.src`` tells which
input a range derives from and by what offset (interval arithmetic through integer ``add`` /
``subtract``), and each replay re-runs those checks on the new inputs' ranges (known at upload)
and raises the same ``IndexingError``/``ContextLengthError`` before any work is submitted. A
recording that reads from the GPU (an index range that had to be computed), writes host data, or
binds a buffer the plan cannot own is not used: that plan replays step by step.

Plans with host steps (training steps: optimizer updates, ``_set_``, gradients, random draws)
replay as streams between their host steps (``SegmentedReplay``): gradient stores and ``_set_``
move past the kernels after them, so a training step's forward and backward are one stream, and
only the host steps (``zero_grad``, the gradients, ``optimizer.step``'s fused kernel per
parameter) run Python. ``EMBER_WEBGPU_STREAM=0`` turns streams off,
``EMBER_WEBGPU_STREAM_SEGMENTS=0`` only those of plans with host steps (step by step).

>>> import ember
>>> f = ember.compile(lambda x: ember.relu(x * 2.0 - 1.0) @ ember.ones((3, 2), device="webgpu"))
>>> x = ember.ones((4, 3), device="webgpu")                     # doctest: +SKIP
>>> [f(x).tolist() for _ in range(3)][-1]                        # doctest: +SKIP
[[3.0, 3.0], [3.0, 3.0], [3.0, 3.0], [3.0, 3.0]]
>>> f.plan_for(x).fast.describe()["dispatches"]                  # doctest: +SKIP
2
"""
from __future__ import annotations

import gc
import os
import weakref

from ..plan import HOST, unflatten
from ..tensor import Tensor
from .fusion import GBuf, contiguous, realize

ENABLED = os.environ.get("EMBER_WEBGPU_STREAM", "1") != "0"
# Plans with host steps (training steps) as streams between their host steps (``SegmentedReplay``).
SEGMENTS = os.environ.get("EMBER_WEBGPU_STREAM_SEGMENTS", "1") != "0"
MAX_RECORDS = 3
MIXED = "mixed"     # Bounds.src of a range that derives from more than one input

# While a stream is recorded: the list its guards go to (see ``checked``).
_GUARDS: list = [None]


class Bounds(tuple):
    """``(lo, hi)`` of an integer tensor's values, with ``src``: None (a constant range),
    ``(k, dlo, dhi)`` (input ``k``'s range shifted by ``dlo``/``dhi``) or ``MIXED``."""

    src = None

    @classmethod
    def of(cls, lo: int, hi: int, src=None) -> "Bounds":
        b = cls((int(lo), int(hi)))
        b.src = src
        return b


def checked(b, check) -> None:
    """Run ``check(lo, hi)`` (raises on a bad range) on bounds ``b``; while a stream is being
    recorded and ``b`` derives from a plan input, the check becomes a guard of every replay."""
    check(b[0], b[1])
    rec = _GUARDS[0]
    if rec is not None:
        src = getattr(b, "src", None)
        if src is not None:
            rec.append((src, check))


_I32 = (-(1 << 31), (1 << 31) - 1)


def add_bounds(a, b, sign: int = 1):
    """Bounds of ``a + b`` (``sign`` -1: ``a - b``) for int32 tensors of known ranges, None when
    either is unknown or the result could wrap."""
    if a is None or b is None:
        return None
    lo = a[0] + (b[0] if sign > 0 else -b[1])
    hi = a[1] + (b[1] if sign > 0 else -b[0])
    if lo < _I32[0] or hi > _I32[1]:
        return None
    sa, sb = getattr(a, "src", None), getattr(b, "src", None)
    if sa is None and sb is None:
        src = None
    elif sa is None or sb is None:
        if sb is not None and sign < 0:
            src = MIXED          # a constant minus an input: the range flips (not tracked)
        else:
            k, dl, dh = sa if sa is not None else sb
            other = b if sa is not None else a
            if sa is MIXED or sb is MIXED:
                src = MIXED
            else:
                src = (k, dl + (other[0] if sign > 0 else -other[1]), dh + (other[1] if sign > 0 else -other[0]))
    else:
        src = MIXED
    return Bounds.of(lo, hi, src)


# ---- recording ------------------------------------------------------------------------------------

class _Fail(Exception):
    """The recording cannot become a stream (the message says why)."""


class _StepByStep(Exception):
    """This replay runs step by step (an input's index range is unknown), the stream stays."""


class _Recorder:
    """Hooks the runtime while a replay is recorded: dispatches are kept (and still run), reads
    and host writes fail the recording, every pool buffer handed out is noted."""

    def __init__(self, rt):
        self.rt = rt
        self.dispatches: list = []
        self.acquired: dict = {}        # id(buf) -> buf
        self.reason = None
        self.guards: list = []

    def __enter__(self):
        rt = self.rt
        real_dispatch, real_acquire = rt.dispatch, rt.pool.acquire

        def dispatch(pipe, buffers, info, grid):
            self.dispatches.append((pipe, list(buffers), bytes(info) if info else b"", tuple(grid)))
            real_dispatch(pipe, buffers, info, grid)

        def acquire(nbytes, what="tensor"):
            st = real_acquire(nbytes, what)
            self.acquired[id(st.buf)] = st.buf
            return st

        def refuse(what):
            def f(*a, **k):
                if self.reason is None:
                    self.reason = f"the plan {what} while replaying"
                return orig[what](*a, **k)
            return f
        orig = {"reads from the GPU": rt.read, "writes host data": rt.write}
        rt.dispatch, rt.pool.acquire = dispatch, acquire
        rt.read, rt.write = refuse("reads from the GPU"), refuse("writes host data")
        _GUARDS[0] = self.guards
        return self

    def __exit__(self, *exc):
        rt = self.rt
        for name in ("dispatch", "read", "write"):
            rt.__dict__.pop(name, None)
        rt.pool.__dict__.pop("acquire", None)
        _GUARDS[0] = None
        return False


def _input_buf(t):
    """The contiguous realised GBuf of input tensor ``t``."""
    return contiguous(realize(t._buf))


class StreamReplay:
    """``plan.fast`` for a plan on device "webgpu" (see the module docstring)."""

    def __init__(self, backend, plan):
        self.backend = backend
        self.rt = backend.rt
        self.plan = plan
        self.stream = None
        self.records = 0
        self.reason = None       # why the last recording was not used
        self.replays = 0

    def describe(self) -> dict:
        s = self.stream
        return {"stream": s is not None, "dispatches": len(s.cmds) if s else 0, "records": self.records,
                "replays": self.replays, "reason": self.reason,
                "owned_buffers": len(s.owned) if s else 0, "guards": len(s.guards) if s else 0}

    def __call__(self, inputs):
        s = self.stream
        if s is not None:
            try:
                out = s.run(inputs)
            except _StepByStep:
                return self.plan._run_steps(inputs)
            if out is not None:
                self.replays += 1
                return out
            self.stream = None          # a constant was replaced: record again next time
            s.close()
            return self.plan._run_steps(inputs)
        if self.records >= MAX_RECORDS:
            return self.plan._run_steps(inputs)
        self.records += 1
        return self._record(inputs)

    # ---- recording ----------------------------------------------------------------------------
    def _record(self, inputs):
        plan, rt = self.plan, self.rt
        drv = rt.driver
        ins = []
        for k, t in enumerate(inputs):
            if not isinstance(t, Tensor) or t.device != "webgpu":
                self.reason = f"input {k} is not a webgpu tensor"
                return plan._run_steps(inputs)
            ins.append(_input_buf(t))
        # the plan's own input buffers; the recording runs on them, carrying the input's range
        # tagged with its index (guards)
        own_in = []
        vals_in = []
        for k, (t, g) in enumerate(zip(inputs, ins)):
            st = rt.alloc(max(g.size * 4, 4), "a replayed plan's input")
            nb = g.size * 4
            if nb:
                drv.stream_copy([(g.storage.buf, g.offset * 4, st.buf, 0, nb)])
            own = GBuf(rt, g.shape, g.dtype, storage=st)
            if g.bounds is not None:
                own.bounds = Bounds.of(g.bounds[0], g.bounds[1], (k, 0, 0))
            own_in.append((st, nb))
            vals_in.append(Tensor._wrap(own, t.shape, t.dtype, t.device))
        drv.flush()
        rec = _Recorder(rt)
        try:
            with rec:
                result = plan._run_steps(vals_in)
                outs = []
                for t in _flat_outputs(plan, result):
                    g = contiguous(realize(t._buf))
                    outs.append((g, t))
        except _Fail as e:   # pragma: no cover - raised by nothing yet
            rec.reason = str(e)
            result, outs = None, []
        drv.flush()
        # (an output's range, when it is a constant one such as argmax's, goes with every copy)
        out_spec = [(g.storage.buf, g.offset * 4, g.size * 4, g.shape, g.dtype, t.shape, t.dtype,
                     _const_bounds(t._buf.bounds if t._buf.bounds is not None else g.bounds)) for g, t in outs]
        # drop the recording's tensors (lazy ones sit in reference cycles) so that every
        # intermediate buffer is back in the pool, where the stream takes it from
        result = outs = g = t = None
        gc.collect()
        reason = rec.reason
        if reason is None:
            try:
                self.stream = _Stream(self, rec, own_in, vals_in, out_spec)
            except _Fail as e:
                reason = str(e)
        self.reason = reason
        # the caller's results: copies, as every later replay gives (the buffers they come from
        # are the stream's now, or back in the pool untouched since: held until the copies are
        # submitted, so that no result is given one of them)
        held = []
        if self.stream is None:
            for sbuf, *_ in out_spec:
                cls = rt.pool.claim(sbuf)
                if cls is not None:
                    held.append((sbuf, cls))
        copies, fresh = [], []
        for sbuf, off, nb, gshape, gdtype, shape, dtype, bounds in out_spec:
            st = rt.alloc(max(nb, 4), "a replayed plan's output")
            if nb:
                copies.append((sbuf, off, st.buf, 0, nb))
            og = GBuf(rt, gshape, gdtype, storage=st)
            og.bounds = bounds
            fresh.append(Tensor._wrap(og, shape, dtype, "webgpu"))
        if copies:
            drv.stream_copy(copies)
        _give_back(rt.pool, held)
        return unflatten(plan.out_tree, fresh)


def _const_bounds(b):
    """``b`` when it is a range every replay's output has (not one derived from an input)."""
    if b is None or getattr(b, "src", None) is not None:
        return None
    return (b[0], b[1])


def _flat_outputs(plan, result) -> list:
    from ..plan import out_leaves

    return out_leaves(result, [])


class _Stream:
    """The prebuilt dispatch stream of one recording (see the module docstring)."""

    def __init__(self, replay, rec, own_in, vals_in, out_spec):
        rt = replay.rt
        self.rt, self.drv = rt, rt.driver
        plan = replay.plan
        pool = rt.pool
        self.in_bufs = [st.buf for st, _ in own_in]
        self.in_sizes = [nb for _, nb in own_in]
        self._in_storages = [st for st, _ in own_in]    # held: the plan's input buffers
        # constants: the GBuf each holds now and its storage (checked on every replay)
        self.consts = [(t, t._buf, getattr(t._buf, "storage", None)) for _, t in plan.consts if isinstance(t, Tensor)]
        const_bufs = {}
        for _, g, st in self.consts:
            if st is not None:
                const_bufs[id(st.buf)] = st.buf
            elif getattr(g, "expr", None) is not None:
                # a lazy constant (a folded one-hot, a broadcast): the buffers its expression reads
                for b in _leaf_bufs(g.expr):
                    const_bufs[id(b)] = b
        # the runtime's own zero buffer, bound for absent operands (attention without a mask),
        # lives as long as the runtime
        dummy = getattr(rt, "_dummy", None)
        if dummy is not None:
            const_bufs[id(dummy.buf)] = dummy.buf
        # every buffer the dispatches bind must be the plan's or a constant's
        self.owned = []
        try:
            self._claim(rec, pool, const_bufs, out_spec)
        except _Fail:
            _give_back(pool, self.owned)
            raise
        self._release = weakref.finalize(self, _give_back, pool, list(self.owned))
        guards = []
        for src, check in rec.guards:
            if src == MIXED:
                _give_back(pool, self.owned)
                self._release.detach()
                raise _Fail("an index range derives from several inputs")
            guards.append((src[0], src[1], src[2], check))
        self.guards = guards
        self.out_spec = out_spec
        self._build(rt, rec)
        self._tree = plan.out_tree

    def _claim(self, rec, pool, const_bufs, out_spec) -> None:
        in_ids = {id(b) for b in self.in_bufs}
        claimed = set()

        def claim(buf, what):
            i = id(buf)
            if i in in_ids or i in const_bufs or i in claimed:
                return
            if i not in rec.acquired:
                raise _Fail(f"{what} is neither the plan's nor a constant's")
            cls = pool.claim(buf)
            if cls is None:
                raise _Fail(f"{what} is still held outside the plan")
            claimed.add(i)
            self.owned.append((buf, cls))
        for pipe, bufs, info, grid in rec.dispatches:
            for b in bufs:
                claim(b[0] if type(b) is tuple else b, "a buffer a dispatch binds")
        for sbuf, off, nb, *_ in out_spec:
            if nb:
                claim(sbuf, "an output's buffer")

    def _build(self, rt, rec) -> None:
        # uniforms: one buffer, one aligned slot per dispatch that has any
        align = max(int(rt.limits.get("min_uniform_buffer_offset_alignment", 256)), 16)
        blob = bytearray()
        slots = []
        for _, _, info, _ in rec.dispatches:
            if info:
                off = len(blob)
                size = (max(len(info), 16) + 15) & ~15
                blob += info + bytes(size - len(info))
                blob += bytes(-len(blob) % align)
                slots.append((off, size))
            else:
                slots.append(None)
        self.ubuf = self.drv.uniform_alloc(max(len(blob), 16)) if blob else None
        if blob:
            self.drv.write(self.ubuf, bytes(blob))
        cmds = []
        groups = {}
        for (pipe, bufs, info, grid), slot in zip(rec.dispatches, slots):
            entries = []
            for b in bufs:
                if type(b) is tuple:
                    entries.append(b)
                else:
                    entries.append((b, 0, self.drv._buffer_size(b)))
            if slot is not None:
                entries.append((self.ubuf, slot[0], slot[1]))
            key = (id(pipe),) + tuple((id(b), o, s) for b, o, s in entries)
            bg = groups.get(key)
            if bg is None:
                bg = groups[key] = self.drv._bind_group(pipe, [(i, b, o, s) for i, (b, o, s) in enumerate(entries)])
            cmds.append((pipe, bg, grid))
        self.cmds = cmds
        self._groups = groups            # held: the stream's bind groups
        self.prepared = self.drv.stream_prepare(cmds)

    def close(self) -> None:
        closer = getattr(self.drv, "stream_close", None)
        if closer is not None:
            closer(self.prepared)
        self._release()

    def run(self, inputs):
        """Encode and submit one replay; returns the outputs, or None when a constant no longer
        holds its recorded buffer (the caller replays step by step and records again)."""
        for t, g, st in self.consts:
            if t._buf is not g or g.storage is not st:
                return None
        rt = self.rt
        copies_in = []
        bufs = []
        for t, dst, nb in zip(inputs, self.in_bufs, self.in_sizes):
            g = t._buf
            if g.expr is not None or not g.is_contiguous() or g.storage.half:
                g = _input_buf(t)        # (the plan's inputs are 4-byte buffers)
            bufs.append(g)
            if nb:
                copies_in.append((g.storage.buf, g.offset * 4, dst, 0, nb))
        for k, dlo, dhi, check in self.guards:
            b = bufs[k].bounds
            if b is None:       # a range computed on the GPU: the step-by-step replay checks it
                raise _StepByStep
            check(b[0] + dlo, b[1] + dhi)
        wrap = Tensor._wrap
        fresh, copies_out = [], []
        for sbuf, off, nb, gshape, gdtype, shape, dtype, bounds in self.out_spec:
            st = rt.alloc(max(nb, 4), "a replayed plan's output")
            if nb:
                copies_out.append((sbuf, off, st.buf, 0, nb))
            og = GBuf(rt, gshape, gdtype, storage=st)
            og.bounds = bounds
            fresh.append(wrap(og, shape, dtype, "webgpu"))
        self.drv.stream_submit(self.prepared, copies_in, copies_out)
        rt.stats["dispatches"] += len(self.cmds)
        return unflatten(self._tree, fresh)


def _leaf_bufs(root) -> list:
    """The GPU buffers that lazy expression ``root`` reads (its realised leaves)."""
    out, seen, stack = [], set(), [root]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        g = n.buf
        st = getattr(g, "storage", None)
        if st is not None:
            out.append(st.buf)
        elif getattr(g, "expr", None) is not None:
            stack.append(g.expr)
        stack.extend(a for a in n.args if hasattr(a, "kind"))
    return out


def _give_back(pool, owned) -> None:
    for buf, cls in owned:
        try:
            pool.release(buf, cls)
        except Exception:  # interpreter shutdown
            pass


# Host steps that only store a value somewhere a kernel step does not look (a leaf's ``.grad``)
# or swap a tensor's buffer (``_set_``: kernel steps that read the target come after it): they
# may run later, after the kernel steps that follow them, in their own order.
SINKABLE = frozenset({"set_", "accumulate_grad", "grad =", "grad = None"})


class SegmentedReplay:
    """``plan.fast`` for a webgpu plan with host steps (a compiled training step).

    The kernel steps between host steps become sub-plans replayed as prebuilt dispatch streams
    (``StreamReplay``); the host steps (``zero_grad``, gradients stored into ``.grad``,
    ``optimizer.step``, BatchNorm's ``_set_``, random draws) run in Python between them. Host
    steps in ``SINKABLE`` move past the kernel steps that follow them (unless one reads the
    tensor a ``_set_`` swaps), so a training step's forward and backward are ONE stream and its
    gradient and optimizer steps run after it.

    A sub-plan reads the values made before it (plan inputs, earlier segments' outputs, host
    steps' draws) as its inputs, copied into its own buffers GPU-side, as are the constants that
    change between replays (parameters that require grad, tensors a ``_set_`` swaps); the other
    constants are bound in place, their buffers checked on every replay. What later steps read
    it gives as fresh copies (a gradient stored into ``.grad`` never changes under its holder)."""

    def __init__(self, backend, plan):
        from ..plan import Plan

        self.plan = plan
        steps = plan.steps
        consts = dict(plan.consts)
        swapped = {st.ins[0] for st in steps if st.multi == HOST and st.name == "set_"}
        # items: ("seg", [steps]) and ("host", step), host steps sunk past kernels where allowed
        items: list = []
        run: list = []
        pending: list = []
        for st in steps:
            if st.multi != HOST:
                if pending and any(h.name == "set_" and h.ins[0] in st.ins for h in pending):
                    items += [("seg", run)] + [("host", h) for h in pending]
                    run, pending = [], []
                run.append(st)
            elif st.name in SINKABLE:
                pending.append(st)
            else:
                items += [("seg", run)] + [("host", h) for h in pending] + [("host", st)]
                run, pending = [], []
        items += [("seg", run)] + [("host", h) for h in pending]
        items = [it for it in items if it[0] == "host" or it[1]]
        # slots read after each item, walking backwards (host steps read their ``ins``)
        needed = set(plan.out_slots)
        later = []
        for kind, x in reversed(items):
            later.append(set(needed))
            for st in (x if kind == "seg" else [x]):
                needed.update(st.ins)
        later.reverse()
        self.items = []
        for (kind, x), after in zip(items, later):
            if kind == "host":
                self.items.append((x.kernel, None, None))
                continue
            made = {o for st in x for o in st.outs}
            reads = list(dict.fromkeys(i for st in x for i in st.ins if i not in made))
            ins = [i for i in reads if not (i in consts and _fixed(consts[i], i, swapped))]
            local = {g: k for k, g in enumerate(ins)}
            sub_consts = []
            for i in reads:
                if i not in local:
                    local[i] = len(local)
                    sub_consts.append((local[i], consts[i]))
            for st in x:
                for o in st.outs:
                    local[o] = len(local)
            outs = [o for st in x for o in st.outs if o in after]
            sub_steps = [type(st)(st.kernel, st.name, tuple(local[i] for i in st.ins),
                                  tuple(local[o] for o in st.outs), st.meta, st.attrs, st.device, st.multi)
                         for st in x]
            sub = Plan(sub_steps, len(local), len(ins), sub_consts, tuple(local[o] for o in outs),
                       ("list", tuple("T" for _ in outs)))
            sub.fast = StreamReplay(backend, sub)
            self.items.append((sub, ins, outs))

    def segments(self) -> list:
        """The sub-plans' ``StreamReplay`` objects, in order."""
        return [sub.fast for sub, ins, _ in self.items if ins is not None]

    def describe(self) -> dict:
        segs = [s.describe() for s in self.segments()]
        return {"segments": len(segs), "streams": sum(1 for d in segs if d["stream"]),
                "dispatches": sum(d["dispatches"] for d in segs),
                "host_steps": sum(1 for _, ins, _ in self.items if ins is None),
                "replays": min((d["replays"] for d in segs), default=0),
                "reason": next((d["reason"] for d in segs if d["reason"]), None)}

    def __call__(self, inputs):
        plan = self.plan
        vals = plan.slots(inputs)
        for sub, ins, outs in self.items:
            if ins is None:
                sub(vals)            # a host step
                continue
            res = sub.fast([vals[i] for i in ins])
            for s, t in zip(outs, res):
                vals[s] = t
        return unflatten(plan.out_tree, [vals[s] for s in plan.out_slots])


def _fixed(t, slot, swapped) -> bool:
    """Whether constant ``t`` keeps its buffer between replays (bound in place, checked), as
    opposed to a parameter an optimizer replaces or a tensor a ``_set_`` swaps (copied in)."""
    return isinstance(t, Tensor) and slot not in swapped and not t.requires_grad


def compile_plan(backend, plan):
    """``plan.fast`` for a webgpu plan (None: replay step by step): one stream, or for a plan with
    host steps (a training step) streams between the host steps."""
    if not ENABLED or not hasattr(backend.rt.driver, "stream_submit"):
        return None
    if any(st.multi == HOST for st in plan.steps):
        return SegmentedReplay(backend, plan) if SEGMENTS else None
    return StreamReplay(backend, plan)


def read_ints(ts: list) -> list:
    """The first value of each of the int32/int64 tensors ``ts`` (decode steps' argmax outputs),
    gathered into one buffer by GPU copies and read back in ONE read: a decode loop that ran
    several steps ahead reads their tokens together (a read waits for the queue to drain)."""
    return read_ints_later(ts)()


def read_ints_later(ts: list):
    """``read_ints`` in two halves: the gathering copies are submitted and the read started now;
    the returned function waits for them (only for the work submitted before this call) and
    gives the list. A decode loop enqueues its next steps in between, so the GPU has work while
    the host waits for, and hands out, the tokens before them."""
    from array import array

    gs = [contiguous(realize(t._buf)) for t in ts]
    if not gs:
        return list
    rt = gs[0].rt
    drv = rt.driver
    if not hasattr(drv, "stream_copy"):
        vals = [int(t.tolist()[0]) for t in ts]
        return lambda: vals
    st = None
    if len(gs) == 1:
        later = rt.read_later(gs[0].storage, 4, gs[0].offset * 4)
    else:
        st = rt.alloc(4 * len(gs), "gathered token ids")
        drv.stream_copy([(g.storage.buf, g.offset * 4, st.buf, 4 * i, 4) for i, g in enumerate(gs)])
        later = rt.read_later(st, 4 * len(gs))

    def result(held=(st, gs)) -> list:   # (the gathered buffer lives until it has been read)
        vals = array("i", later())
        if vals.itemsize != 4:       # pragma: no cover - every platform ember runs on has 4-byte ints
            raise RuntimeError("read_ints: array('i') is not 4 bytes here")
        return [int(v) for v in vals]
    return result
