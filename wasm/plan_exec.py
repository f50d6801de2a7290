"""A replayed plan on device ``"wasm"`` as one call into the kernel module: command tables.

``ember.compile`` (and the ONNX runtime) replay a ``Plan`` step by step in Python: per step a
kernel wrapper (``ops_*.py``) allocates its output, computes pointers and sizes and calls
``rt.call``, ~20 µs each in the page. Here the replay's kernel calls are recorded once and
encoded as a *command table* (int32 words: kernel id, argument words; see ``kernels/exec.c``)
that one exported function, ``ember_run``, runs without returning to Python.

**Recording.** The first replay (after the capture) runs every step's wrapper with a runtime
that records each ``rt.call(name, *args)`` and still runs it. A step enters the table when its
wrapper is *pure*: its whole effect is its recorded calls on buffers the plan can name, so that
making the same calls again on later data gives what the wrapper would. Checked per step:

- it made calls, every one to a kernel the table can dispatch, with number/pointer arguments;
- each output buffer was written by one of its calls (or is one of its inputs, unchanged);
- *perturbation*: run again with bit 0 of every element of its data inputs flipped (every value
  changes, by one unit in the last place for floats), the wrapper makes the same calls, with the
  same numbers and the same Python-made parameter arrays. A wrapper that read a value in Python
  (a one-element divisor passed as a number, a bounds check on a position) is caught here;
- *re-run*: making its recorded calls once more over the outputs just computed gives the same
  bits (no Python work after the call, no kernel that relies on a zeroed output);
- a kernel that returns an i32 (sin/cos report values left to Python, cast reports success) is
  *guarded*: the table stops where the result differs from the one recorded, Python redoes that
  step through its wrapper and the table resumes after it.

Everything else runs in Python at its point of the replay: python-backend fallbacks, float16
rounding, contiguous slices, steps whose wrapper fails a check, random draws (host steps). They
split the table into segments, one ``ember_run`` call each. Steps whose output is an input's
buffer (reshape) cost nothing. Plans whose host steps update tensors (a training step: optimizer
steps, ``_set_``, gradients) replay as before.

**Buffers and checks.** Intermediates written by table steps stay alive with the plan and are
written again by every replay (the plan's *own* buffers, pinned: an ``array`` exporting a buffer
cannot be resized, so their addresses never change); an output in one is copied out, so a
caller's result is never overwritten by the next replay. Inputs, constants and the outputs of
Python steps are *bound*: every span a command touches in them was checked when the table was
built, and before each segment runs the buffer behind each is compared with the one checked
(inputs and Python-step outputs by address and length, re-checked and patched into the table
when different; constants by identity: a replaced weight makes the replay finish step by step
and the next one record again; ``release_constants``/``bind_constants`` replace constants on
purpose, a language model's grown KV cache: only the steps that read them are recorded again
and the tables built again, with every check). Nothing runs unchecked: ``BoundsError`` is
raised before the call. Pyodide's memory growth moves nothing (addresses are offsets into one memory).

Under wasmtime (CPython) the module has its own memory: each plan gets an *arena* (an instance
of the module on a memory of its own) where every table buffer has a fixed place; bound buffers
are copied in before each segment and the ones it writes copied out after.

**Limits.** Intermediates stay allocated between replays (no liveness-based sharing yet):
plans over ``MAX_OWN_BYTES`` of them replay step by step, where kernels dominate anyway (with a
thread team, ``MAX_OWN_BYTES_TEAM``: tables are the only way onto the other cores). A
contiguous slice, a float16 result, an op without a module kernel or a wrapper that reads a
value in Python costs a segment boundary (one more ``ember_run`` call) and that step's Python.
Large constants that a recorded call writes in place (a KV cache) are checked by perturbing a
copy; a constant whose *values* a wrapper read in Python is trusted to keep them unless its
buffer is replaced (then the table is recorded again).

**Threads (later).** A table is data: absolute addresses, kernel ids, scalars, no function
pointers, so any instance of the module on the same memory can run it. A pool of workers on a
shared ``WebAssembly.Memory`` could each walk the same table, every kernel taking its share of
rows by worker index, with a barrier (``Atomics``) between commands: one message per replay, not
per op. What that needs from here: the table and every buffer it names must live in the shared
memory (Pyodide's own memory is not shared: the arena layout used under wasmtime, copies at
segment edges, is the ready-made variant), and scratch spans per worker (today one span per
command, shared by the steps of one thread).

>>> import ember
>>> f = ember.compile(lambda x: ember.relu(x * 2.0 - 1.0))
>>> x = ember.ones((4,), device="wasm")                       # doctest: +SKIP
>>> [f(x).tolist() for _ in range(3)][-1]                      # doctest: +SKIP
[1.0, 1.0, 1.0, 1.0]
>>> f.plan_for(x).fast.describe()["segments"]                  # doctest: +SKIP
1
"""
from __future__ import annotations

import os
import struct
import time
import weakref
from array import array

from ..errors import BoundsError, DeviceError, EmberError
from ..plan import unflatten
from ..tensor import Tensor
from .build_kernels import abi_hash, dispatchable, module_signatures
from .fallback import PY as PY_KERNELS
from .runtime import REMATERIALIZED, RESIDENT, R, W, module_bytes
from .team import Moved

# EMBER_WASM_PLAN_TABLE=0 turns command tables off (every plan replays step by step).
ENABLED = os.environ.get("EMBER_WASM_PLAN_TABLE", "1") != "0"
# A plan whose table would keep more bytes of intermediates alive than this replays step by step
# (its kernels dominate anyway); the recording stops holding them as soon as it passes this.
MAX_OWN_BYTES = int(os.environ.get("EMBER_WASM_PLAN_TABLE_BYTES", str(64 << 20)))
# ... and with a thread team, where tables are the only way onto the other cores (a MiniLM 8 x 64
# forward keeps ~90 MB of intermediates)
MAX_OWN_BYTES_TEAM = int(os.environ.get("EMBER_WASM_PLAN_TABLE_BYTES_TEAM", str(512 << 20)))
MAX_RECORDS = 3          # recordings per plan (a replaced constant asks for a new one) before giving up
FROZEN_MAX = 4096        # private read-only arrays up to this many bytes: the table keeps a copy
MAGIC = 0x54424D45       # kernels/exec.c TABLE_MAGIC
HEADER = 4
_HOST = 2                # ember.plan.HOST


# ---- what the module can dispatch ---------------------------------------------------------------

class Dispatch:
    """Kernel ids and argument types of the module: every exported function but ``ember_*``
    whose parameters are i32/f32/i64/f64 and whose result is nothing or an i32, numbered in
    sorted-name order (the order of the generated ``ember_dispatch``)."""

    def __init__(self, data: bytes):
        sigs = module_signatures(data)
        if "ember_run" not in sigs or "ember_abi" not in sigs:
            raise DeviceError("wasm kernel module: no ember_run (rebuild it with wasm/build_kernels.py)")
        table = dispatchable(sigs)
        self.ids = {n: k for k, (n, _, _) in enumerate(table)}
        self.sig = {n: (p, r) for n, p, r in table}
        self.abi = abi_hash(table)


_DISPATCH: dict = {}


def dispatch_for(rt) -> Dispatch:
    d = _DISPATCH.get(id(rt))
    if d is None or d[0] is not rt:
        disp = Dispatch(module_bytes())
        got = rt.call("ember_abi") & 0xFFFFFFFF
        if got != disp.abi:
            raise DeviceError(f"wasm kernel module: ember_abi {got:#x} differs from its exports' {disp.abi:#x}")
        d = _DISPATCH[id(rt)] = (rt, disp)
    return d[1]


# ---- recording ----------------------------------------------------------------------------------

class _Recorder:
    """A runtime for a second set of the family kernels: each call runs on the real runtime and is
    appended to ``sink`` (when set) as ``(name, args, result)``."""

    def __init__(self, rt):
        self.rt = rt
        self.sink = None

    def call(self, name, *args):
        if self.sink is None:
            return self.rt.call(name, *args)
        # small read-only arrays as the kernel sees them: a wrapper may refill one parameter
        # array for every call, and the table must keep the values of each
        snaps = {}
        for k, a in enumerate(args):
            if a.__class__ is R and a.buf.__class__ is array and len(a.buf) * a.buf.itemsize <= FROZEN_MAX:
                snaps[k] = bytes(memoryview(a.buf).cast("B"))
        res = self.rt.call(name, *args)
        self.sink.append((name, args, res, snaps))
        return res

    def __getattr__(self, attr):
        return getattr(self.rt, attr)


_RECORDERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _recorded(rec, kern, st, ins) -> tuple:
    """(result, the module calls it made) of step ``st``'s recording kernel on ``ins``."""
    calls = []
    rec.sink = calls
    try:
        return kern(st.meta, *ins, **st.attrs), calls
    finally:
        rec.sink = None


def _recording_kernels(backend):
    """(recorder, {op name: kernel}) for ``backend``: its kernel families built on a recorder."""
    ent = _RECORDERS.get(backend)
    if ent is None:
        from .backend import family_kernels

        rec = _Recorder(backend.rt)
        table = dict(PY_KERNELS)
        table.update(family_kernels(rec))
        ent = _RECORDERS[backend] = (rec, table)
    return ent


def _flip(rt, buf) -> None:
    """Flip bit 0 of every element of an array in place (its own inverse), in the module."""
    n = len(buf)
    if n:
        rt.call("ember_flip_bit0", W(buf, n), n, buf.itemsize)


def _raw(buf, start: int = 0, stop: int | None = None) -> bytes:
    return bytes(memoryview(buf).cast("B")[start:stop])


def _is_array(buf) -> bool:
    return isinstance(buf, array)


# what a replay's program item is (WasmPlanReplay.prog)
_SEG, _ALIAS, _PY, _HOST_STEP = "seg", "alias", "py", "host"


class _Impure(Exception):
    """A step's wrapper is not pure (the message says why): it runs in Python."""


def _describe(calls, in_bufs, out_bufs):
    """A comparable picture of a step's calls: names, results, numbers (bits), buffer spans and
    whose buffer each is (input k, output j, or a private buffer by first appearance, with the
    contents of private buffers that Python filled)."""
    ins = {}
    for k, b in enumerate(in_bufs):
        ins.setdefault(id(b), k)
    outs = {id(b): j for j, b in enumerate(out_bufs)}
    priv, written, pic = {}, set(), []
    for name, args, res, snaps in calls:
        items = []
        for k, a in enumerate(args):
            if isinstance(a, R):
                b = a.buf
                if id(b) in outs:
                    role = ("out", outs[id(b)])
                elif id(b) in ins:
                    role = ("in", ins[id(b)])
                else:
                    p = priv.setdefault(id(b), len(priv))
                    content = None
                    if not a.writes and id(b) not in written and _is_array(b):
                        isz = b.itemsize
                        raw = snaps[k] if k in snaps else _raw(b)
                        content = raw[a.offset * isz:(a.offset + a.n) * isz]
                    role = ("priv", p, content)
                items.append((a.__class__.__name__, a.n, a.offset, a.at, getattr(b, "typecode", None), role))
                if a.writes:
                    written.add(id(b))
            elif isinstance(a, float):
                items.append(("f", struct.pack("<d", a)))
            else:
                items.append((type(a).__name__, a))
        pic.append((name, res, tuple(items)))
    return pic


# ---- the table ----------------------------------------------------------------------------------

class _Cmd:
    __slots__ = ("step", "kid", "expect", "words", "fields")

    def __init__(self, step, kid, expect, words, fields):
        self.step, self.kid, self.expect, self.words, self.fields = step, kid, expect, words, fields


class _Segment:
    """Consecutive table steps: one table, one ``ember_run`` call."""

    def __init__(self):
        self.steps = []        # plan step indices
        self.cmds = []
        self.first_cmd = {}    # step -> index of its first command
        self.bound = []        # root slots of inputs/constants/Python outputs it references
        self.writes = set()    # bound root slots it writes
        self.out_own = []      # own root slots it writes that Python reads later (wasmtime copies)
        self.aliases = []      # alias steps inside it, bookkept after it runs
        self.writes_own = set()


def _f32_bits(v: float) -> int:
    try:
        return struct.unpack("<I", struct.pack("<f", v))[0]
    except OverflowError:   # beyond float32: JS and wasmtime round it to an infinity
        return 0xFF800000 if v < 0 else 0x7F800000


# Kernels whose work grows faster than their data: a product of three sizes (rows, columns, depth).
_CONTRACTIONS = frozenset(("gemm", "conv2d_gemm", "conv_transpose2d_gemm", "q_linear", "sdpa_f32",
                           "attention_cached_f32"))


def table_work(seg, names: dict) -> int:
    """A rough count of a segment's multiply-adds (float32 units) from its command table alone,
    to tell work too small for the thread team from work worth measuring it on. A contraction
    with operands of a and b bytes and a result of c bytes does about sqrt(a*b*c)/8 (M*K, K*N
    and M*N floats give M*N*K: exact for a GEMM, a third of a 3x3 convolution's, less for
    quantized weights); any other command one per float it writes. ``names``: kernel id -> name.

    >>> class C: pass
    >>> c = C(); c.kid = 0; c.fields = [(0, None, 0, (0, 4 * 8 * 384, False)),
    ...     (1, None, 0, (0, 4 * 384 * 384, False)), (2, None, 0, (0, 4 * 8 * 384, True))]
    >>> s = C(); s.cmds = [c]
    >>> table_work(s, {0: "gemm"}) == 8 * 384 * 384
    True
    """
    total = 0
    for c in seg.cmds:
        reads, wrote, result = [], 0, 0
        for _, ref, _, (lo, hi, wr) in c.fields:
            if wr:
                wrote = max(wrote, hi - lo)
                if not (ref and ref[0] == "p"):   # a result, not the kernel's own scratch
                    result = max(result, hi - lo)
            else:
                reads.append(hi - lo)
        if names.get(c.kid) in _CONTRACTIONS and len(reads) >= 2:
            reads.sort()
            total += int((reads[-1] * reads[-2] * max(result or wrote, 4)) ** 0.5) >> 3
        else:
            total += wrote >> 2
    return total


class WasmPlanReplay:
    """The compiled replay of one ``Plan`` on device "wasm" (``Plan.run`` calls it). Records on
    its first call; ``describe()`` says what became tables."""

    def __init__(self, backend, plan):
        self.backend = backend
        self.plan = plan
        self.rt = backend.rt
        self.disp = dispatch_for(self.rt)
        self.ready = False
        self.disabled = None      # why this plan replays step by step, or None
        self.records = 0
        self.runs = 0             # ember_run calls so far
        self.replays = 0
        self.reasons = {}         # step index -> why it runs in Python
        self.solo = None          # the one segment when that is the whole program (_replay)
        steps = plan.steps
        self.const_slots = {s for s, _ in plan.consts}
        if any(st.multi == _HOST and st.name != "draw" for st in steps):
            self.disabled = ("host steps that update tensors (a training step): parameters change "
                             "between replays")

    # ---- public --------------------------------------------------------------------------------
    def __call__(self, inputs):
        if self.ready and (self.team_epoch == _TEAM_STATE[0]["epoch"] or self.rt.kind != "pyodide"):
            return self._replay(inputs)    # (ready implies _TEAM_STATE is set: see _build)
        if self.disabled is not None:
            return self.plan._run_steps(inputs)
        if self.ready:
            self._retarget()
        if not self.ready:
            return self._record(inputs)
        return self._replay(inputs)

    def _retarget(self):
        """Threads were turned on or off since the tables were built: record them again, for
        the team's shared memory or for Pyodide's own (not counted against MAX_RECORDS)."""
        want = "threads" if self.segments and _plan_team(self, self.segments, self.plan.consts) else "pyodide"
        self.team_epoch = _team_epoch()   # (the call may have started the team)
        if want != self.space.kind:
            self.ready = False
            self.records -= 1

    def describe(self) -> dict:
        """What the replay does: ``segments`` (ember_run calls per replay), ``table_steps``,
        ``python_steps`` ({step: why}), ``commands``, ``runs``/``replays`` so far, ``disabled``."""
        if not self.ready:
            return {"ready": False, "disabled": self.disabled, "records": self.records}
        return {"ready": True, "disabled": self.disabled, "segments": len(self.segments),
                "table_steps": sum(len(s.steps) for s in self.segments),
                "commands": sum(len(s.cmds) for s in self.segments),
                "python_steps": {i: f"{self.plan.steps[i].name}: {r}" for i, r in self.reasons.items()},
                "own_bytes": self.own_bytes, "runs": self.runs, "replays": self.replays,
                "records": self.records, "space": self.space.kind}

    # ---- constants replaced (a language model's KV cache grown) -----------------------------------
    def release_constants(self, ids) -> tuple:
        """Let go of the constants whose Tensors have these ids (a KV cache about to be replaced
        by a larger one), before ``bind_constants`` gives the new ones: the plan holds None in
        their slots, the tables and the recorded calls of the steps that read them are dropped
        (so their buffers can go before the new ones are made). Returns the slots."""
        plan = self.plan
        slots = tuple(s for s, t in plan.consts if id(t) in ids)
        if not slots:
            return slots
        plan.consts = [(s, None if s in slots else t) for s, t in plan.consts]
        self.affected = None
        if self.ready and self.disabled is None:
            # table steps reading one of them (directly or through an alias): recorded again
            roots = set(slots)
            self.affected = [i for i, st in enumerate(plan.steps)
                             if self.info[i][0] == "table" and any(self.rootof(j) in roots for j in st.ins)]
            for i in self.affected:
                self.info[i] = None
        self.ready = False
        if getattr(self, "space", None) is not None:
            self.space.close()
            self.space = None
        self.base = self.segments = self.program = self.prog = self.outs = self.solo = None
        return slots

    def bind_constants(self, new: dict) -> bool:
        """Put Tensors ``new`` ({slot: tensor}, same dtypes, any shape the steps accept) where
        ``release_constants`` left None, and make the tables again without a capture or a whole
        recording: only the steps that read them are recorded again (every check of a recording:
        perturbation, re-run, bounds when the tables are built), on the last replay's inputs.
        False when that could not be done: the next call records as usual (not counted)."""
        plan = self.plan
        plan.consts = [(s, new.get(s, t)) for s, t in plan.consts]
        affected, self.affected = getattr(self, "affected", None), None
        if any(t is None for _, t in plan.consts) or affected is None:
            return self._record_again()
        try:
            vals = [None] * plan.n_slots
            vals[:plan.n_inputs] = self.last_inputs
            for s, t in plan.consts:
                vals[s] = t
            for s, (shape, dtype, dev) in _slot_metas(plan.steps).items():
                b = self.own_buf.get(self.rootof(s))
                if b is not None:
                    vals[s] = Tensor._wrap(b, shape, dtype, dev)
            rec, rkern = _recording_kernels(self.backend)
            written_ext = set()
            for i in affected:
                st = plan.steps[i]
                ins = [vals[j] for j in st.ins]
                kern = self._recording_kernel(st, rkern)
                if kern is None or any(t is None for t in ins):
                    return self._record_again()
                res, calls = _recorded(rec, kern, st, ins)
                bufs = res if st.multi else (res,)
                try:
                    self.info[i] = self._classify(i, st, kern, rec, ins, bufs, calls, written_ext)
                except _Impure as e:
                    self.info[i] = self._no_calls(i, ins, bufs, str(e))
                if self.info[i][0] != "table":
                    return self._record_again()
            self._build(self.info, vals)
        except (EmberError, _Stale):   # (a typed refusal: the next call records the usual way)
            return self._record_again()
        return True

    def _record_again(self) -> bool:
        self.ready = False
        self.records = max(0, self.records - 1)   # (a recording forced by a rebind is not counted)
        if getattr(self, "space", None) is not None:
            self.space.close()
            self.space = None
        return False

    # ---- recording -----------------------------------------------------------------------------
    def _record(self, inputs):
        plan = self.plan
        if any(t is None for _, t in plan.consts):
            raise DeviceError("wasm plan: constants were released (release_constants) and not bound again")
        self.records += 1
        self.last_inputs = inputs
        rec, rkern = _recording_kernels(self.backend)
        wrap = Tensor._wrap
        vals = plan.slots(inputs)
        info = [None] * len(plan.steps)
        self.reasons = {}
        own_bytes = 0
        written_ext = set()   # ids of input/constant buffers that recorded calls write
        abandon = None
        limit = MAX_OWN_BYTES
        if self.rt.kind == "pyodide" and MAX_OWN_BYTES_TEAM > limit:
            from .team import possible

            if possible():   # (a team runs, or the plan's build would start one: not here)
                limit = MAX_OWN_BYTES_TEAM
        for i, st in enumerate(plan.steps):
            if st.multi == _HOST:
                st.kernel(vals)
                info[i] = ("host",)
                continue
            ins = [vals[j] for j in st.ins]
            kern = self._recording_kernel(st, rkern)
            if kern is None or abandon is not None:
                res = st.kernel(st.meta, *ins, **st.attrs)
                calls = None
            else:
                res, calls = _recorded(rec, kern, st, ins)
            bufs = res if st.multi else (res,)
            metas = st.meta if st.multi else (st.meta,)
            for s, b, m in zip(st.outs, bufs, metas):
                vals[s] = wrap(b, m.shape, m.dtype, st.device)
            for j in plan.free[i]:
                vals[j] = None
            if abandon is not None:
                continue
            if calls is None:
                info[i] = self._no_calls(i, ins, bufs, "a kernel outside the wasm families", st, rec.rt, written_ext)
                continue
            try:
                info[i] = self._classify(i, st, kern, rec, ins, bufs, calls, written_ext)
            except _Impure as e:
                info[i] = self._no_calls(i, ins, bufs, str(e))
            if info[i][0] == "table":
                own_bytes += sum(b.buffer_info()[1] * b.itemsize for b in info[i][3])
                if own_bytes > limit:
                    abandon = (f"its intermediates need more than {limit >> 20} MB "
                               f"(EMBER_WASM_PLAN_TABLE_BYTES)")
                    info = None
        if abandon is not None:
            self.disabled = abandon
            return self._outputs_from(vals, None)
        self._build(info, vals)
        # the recording's own outputs are own buffers the next replay overwrites: hand out copies
        return self._outputs_from(vals, self.own_ids)

    def _recording_kernel(self, st, rkern):
        k = st.kernel
        if k is PY_KERNELS.get(st.name):
            return None
        if k is self.backend.kernels.get(st.name) or getattr(k, "__module__", "").startswith(__package__ + ".ops_"):
            return rkern.get(st.name)
        return None

    def _perturbed(self, st, ins, written_ext, rt) -> list:
        """``ins`` with each data input (not a constant, unless a recorded call writes it) replaced
        by a copy with bit 0 of every element flipped; aliased inputs share one copy."""
        copies, out = {}, []
        for t, s in zip(ins, st.ins):
            b = t._buf
            if s in self.const_slots and id(b) not in written_ext:
                out.append(t)
                continue
            if not _is_array(b):
                raise _Impure("an input buffer is not an array")
            c = copies.get(id(b))
            if c is None:
                ent = RESIDENT.get(id(b))
                c = copies[id(b)] = ent.copy() if ent is not None and ent.moved else b[:]
                _flip(rt, c)
            out.append(Tensor._wrap(c, t.shape, t.dtype, t.device))
        return out

    def _no_calls(self, i, ins, bufs, reason, st=None, rt=None, written_ext=None):
        """A step that made no table calls: an alias (its outputs are input buffers, also for
        other values: checked on perturbed copies when ``st`` is given) or Python."""
        where = []
        for b in bufs:
            k = next((k for k, t in enumerate(ins) if t._buf is b), None)
            if k is None:
                self.reasons[i] = reason
                return ("python",)
            where.append(k)
        if st is not None:
            try:
                ins2 = self._perturbed(st, ins, written_ext, rt)
                res2 = st.kernel(st.meta, *ins2, **st.attrs)
            except Exception:   # noqa: BLE001 (a data check in Python: run it in Python)
                res2 = None
            bufs2 = (res2 if st.multi else (res2,)) if res2 is not None else ()
            if len(bufs2) != len(where) or any(b is not ins2[k]._buf for b, k in zip(bufs2, where)):
                self.reasons[i] = "it returns an input's buffer for some values only"
                return ("python",)
        return ("alias", where)

    def _classify(self, i, st, kern, rec, ins, bufs, calls, written_ext):
        if not calls:
            return self._no_calls(i, ins, bufs, "its wrapper made no kernel call", st, rec.rt, written_ext)
        in_bufs = [t._buf for t in ins]
        in_ids = {id(b) for b in in_bufs}
        wbufs = {}
        for name, args, _, _ in calls:
            sig = self.disp.sig.get(name)
            if sig is None:
                raise _Impure(f"kernel {name} cannot sit in a table")
            params, _ = sig
            if len(args) != len(params):
                raise _Impure(f"{name}: {len(args)} arguments for {len(params)} parameters")
            for a, p in zip(args, params):
                if isinstance(a, R):
                    if p != "i" or not _is_array(a.buf):
                        raise _Impure(f"{name}: a buffer that is not an array")
                    if a.writes:
                        wbufs[id(a.buf)] = a.buf
                elif not isinstance(a, (int, float)):   # (a bool is an int: 0 or 1, as JS passes it)
                    raise _Impure(f"{name}: argument {a!r}")
                elif p == "i" and not (isinstance(a, int) and -(1 << 31) <= a < (1 << 32)):
                    raise _Impure(f"{name}: argument {a!r} for an i32")
                elif p == "I" and not (isinstance(a, int) and -(1 << 63) <= a < (1 << 64)):
                    raise _Impure(f"{name}: argument {a!r} for an i64")
        fresh = []
        for b in bufs:
            if id(b) in in_ids:
                continue   # the output is an input's buffer (written in place or not)
            if id(b) not in wbufs or not _is_array(b):
                raise _Impure("its output is made in Python, not by a kernel call")
            fresh.append(b)
        in_written = [b for b in wbufs.values() if id(b) in in_ids]
        pic = _describe(calls, in_bufs, bufs)
        # perturbation: the wrapper again, on copies of its data inputs (not constants, unless a
        # call writes them) with bit 0 of every element flipped; the real buffers stay untouched
        for b in in_written:
            written_ext.add(id(b))
        ins2 = self._perturbed(st, ins, written_ext, rec.rt)
        calls2 = []
        rec.sink = calls2
        try:
            res2 = kern(st.meta, *ins2, **st.attrs)
        except Exception as e:   # noqa: BLE001 (a data check in the wrapper: not pure)
            raise _Impure(f"its wrapper raised on other values ({type(e).__name__}): it checks data in Python")
        finally:
            rec.sink = None
        bufs2 = res2 if st.multi else (res2,)
        if _describe(calls2, [t._buf for t in ins2], bufs2) != pic:
            raise _Impure("its calls depend on the values (a value read in Python)")
        # re-run: the recorded calls alone, over the outputs just computed, give the same bits
        if not in_written:
            before = [_raw(b) for b in fresh]
            for name, args, _, _ in calls:
                rec.rt.call(name, *args)
            if [_raw(b) for b in fresh] != before:
                for b, raw in zip(fresh, before):   # the wrapper's result stands
                    memoryview(b).cast("B")[:] = raw
                raise _Impure("its calls alone do not reproduce its output (Python work after the call, "
                              "or a kernel that relies on a zeroed output)")
        return ("table", calls, in_bufs, fresh, list(bufs))

    # ---- building --------------------------------------------------------------------------------
    def _build(self, info, vals):
        plan = self.plan
        steps = plan.steps
        root = {}
        kind = {}
        own_buf = {}
        for s in range(plan.n_inputs):
            root[s], kind[s] = s, "in"
        for s, _ in plan.consts:
            root[s], kind[s] = s, "const"
        # roots: which buffer each slot's value lives in, as far as the table is concerned
        for i, st in enumerate(steps):
            inf = info[i]
            if inf[0] == "alias":
                for s, k in zip(st.outs, inf[1]):
                    root[s] = root.get(st.ins[k], st.ins[k])
            elif inf[0] == "table":
                _, calls, in_bufs, fresh, bufs = inf
                fresh_ids = {id(b) for b in fresh}
                for s, b in zip(st.outs, bufs):
                    if id(b) in fresh_ids:
                        root[s], kind[s], own_buf[s] = s, "own", b
                    else:
                        k = next(k for k, ib in enumerate(in_bufs) if ib is b)
                        root[s] = root.get(st.ins[k], st.ins[k])
            else:
                for s in st.outs:
                    root[s], kind[s] = s, "dyn"

        def rootof(s):
            return root.get(s, s)

        def kindof(s):
            return kind.get(rootof(s), "dyn")   # slots no step produces: written by host steps

        # slots Python reads (Python steps, host steps, outputs): own ones need Tensors
        py_reads = set()
        for i, st in enumerate(steps):
            if info[i][0] in ("python", "host"):
                py_reads.update(rootof(s) for s in st.ins)
        out_roots = {rootof(s) for s in plan.out_slots}

        # program: segments of table steps, Python steps between them
        program, seg = [], None
        privs = {}   # id -> buffer (pinned)
        for i, st in enumerate(steps):
            inf = info[i]
            if inf[0] == "table":
                if seg is None:
                    seg = _Segment()
                    program.append(("seg", seg))
                seg.first_cmd[i] = len(seg.cmds)
                seg.steps.append(i)
                self._encode(i, st, inf, seg, rootof, kindof, privs)
            elif inf[0] == "alias":
                if seg is not None:
                    seg.aliases.append(i)
                else:
                    program.append(("alias", i))
            else:
                seg = None
                program.append(("py" if inf[0] == "python" else "host", i))
        for item in program:
            if item[0] == "seg":
                s = item[1]
                s.out_own = sorted({r for r in s.writes_own if r in py_reads or r in out_roots})
        # the memory the tables run in
        self.own_buf = own_buf
        self.own_ids = {id(b) for b in own_buf.values()}
        self.own_bytes = sum(len(b) * b.itemsize for b in own_buf.values()) + \
            sum(len(b) * b.itemsize for b in privs.values())
        old = getattr(self, "space", None)
        if old is not None:
            old.close()
        team = None
        if self.rt.kind == "pyodide" and any(p[0] == "seg" for p in program):
            team = _plan_team(self, [p[1] for p in program if p[0] == "seg"], plan.consts)
        self.team_epoch = _team_epoch()   # (after _plan_team: it may have started the team)
        if team is not None:
            self.space = TeamSpace(self, program, own_buf, privs, vals, rootof, team=team)
        else:
            space = PyodideSpace if self.rt.kind == "pyodide" else ArenaSpace
            self.space = space(self, program, own_buf, privs, vals, rootof)
        # the values a replay starts from: constants and Tensors over own buffers (and aliases of them)
        base = [None] * plan.n_slots
        for s, t in plan.consts:
            base[s] = t
        for s, (shape, dtype, dev) in _slot_metas(steps).items():
            r = rootof(s)
            if kind.get(r) == "own":
                base[s] = Tensor._wrap(own_buf[r], shape, dtype, dev)
        self.base = base
        self.program = program
        self.rootof = rootof
        self.kindof = kindof
        self.segments = [p[1] for p in program if p[0] == "seg"]
        self.n_inputs = plan.n_inputs
        self.outs = [(s, own_buf.get(rootof(s))) for s in plan.out_slots]
        self.single = plan.out_tree == "T"
        self.info = info
        self._compile_program()
        self.ready = True

    def _encode(self, i, st, inf, seg, rootof, kindof, privs):
        _, calls, in_bufs, fresh, bufs = inf
        ids = self.disp.ids
        sigs = self.disp.sig
        in_slot = {}
        for k, b in enumerate(in_bufs):
            in_slot.setdefault(id(b), st.ins[k])
        out_slot = {id(b): s for s, b in zip(st.outs, bufs)}
        written = set()
        for name, args, res, snaps in calls:
            params, result = sigs[name]
            words, fields = [], []
            for k, (a, p) in enumerate(zip(args, params)):
                if isinstance(a, R):
                    b = a.buf
                    if not a.n:
                        words.append(0)    # the runtime passes a null pointer for an empty span
                        continue
                    isz = b.itemsize
                    span = (a.offset * isz, (a.offset + a.n) * isz, a.writes)
                    s = out_slot.get(id(b))
                    if s is None:
                        s = in_slot.get(id(b))
                    if s is not None:
                        r = rootof(s)
                        ref = ("s", r)
                        if kindof(r) == "own":
                            if a.writes:
                                seg.writes_own.add(r)
                        else:
                            if r not in seg.bound:
                                seg.bound.append(r)
                            if a.writes:
                                seg.writes.add(r)
                    elif k in snaps and id(b) not in written:
                        key = ("frozen", b.typecode, snaps[k])   # the values this call saw
                        if key not in privs:
                            frozen = array(b.typecode)
                            frozen.frombytes(snaps[k])
                            privs[key] = frozen
                        ref = ("p", key)
                    else:
                        privs[id(b)] = b
                        ref = ("p", id(b))
                    if a.writes:
                        written.add(id(b))
                    fields.append((len(words), ref, a.at * isz, span))
                    words.append(0)
                elif p == "f":
                    words.append(_f32_bits(float(a)))
                elif p == "F":
                    lo, hi = struct.unpack("<II", struct.pack("<d", float(a)))
                    words += [lo, hi]
                elif p == "I":
                    lo, hi = struct.unpack("<II", struct.pack("<Q", int(a) & 0xFFFFFFFFFFFFFFFF))
                    words += [lo, hi]
                else:
                    words.append(int(a) & 0xFFFFFFFF)
            expect = None
            if result == "i":
                if not isinstance(res, int):
                    raise BoundsError(f"wasm plan table: {name} returned {res!r}, not an i32")
                expect = res & 0xFFFFFFFF
            seg.cmds.append(_Cmd(i, ids[name], expect, words, fields))

    # ---- replaying -----------------------------------------------------------------------------
    def _replay(self, inputs):
        self.last_inputs = inputs   # (rebind_constants records steps again on them)
        vals = self.base.copy()
        vals[:self.n_inputs] = inputs
        solo = self.solo
        if solo is not None:    # the whole plan is one table (a compiled forward): one call
            try:
                self.space.run(solo, vals)
            except _Stale as e:
                return self._stale(solo, vals, e)
            self.replays += 1
            return self._outputs(vals)
        run = self.space.run
        wrap = Tensor._wrap
        # (self.prog: the program with what a replay needs resolved once, see _compile_program)
        for what, x, aliases in self.prog:
            if what is _SEG:
                try:
                    run(x, vals)
                except _Stale as e:
                    return self._stale(x, vals, e)
                for st in aliases:
                    _step(st, vals, wrap)
            elif what is _ALIAS:
                _step(x, vals, wrap)
            else:
                if RESIDENT:   # Python reads these buffers: a team's resident copy may be newer
                    _resident_use(x, vals)
                if what is _PY:
                    _step(x, vals, wrap)
                else:
                    x.kernel(vals)
        self.replays += 1
        return self._outputs(vals)

    def _stale(self, seg, vals, e):
        """A table refused as stale: record again on the next call (unless recorded too often),
        and finish this one step by step from the segment's first step."""
        self.ready = False
        if self.records >= MAX_RECORDS:
            self.disabled = f"recorded {self.records} times: {e}"
        return self._finish_steps(seg.steps[0], vals)

    def _outputs(self, vals):
        """The replay's outputs: copies of own buffers (the next replay overwrites them), the
        rest as they are."""
        wrap = Tensor._wrap
        own_ids = self.own_ids
        if self.single:
            s, own = self.outs[0]
            t = vals[s]
            if own is not None or id(t._buf) in own_ids:
                t = wrap(t._buf[:], t.shape, t.dtype, t.device)
            return t
        out = []
        for s, own in self.outs:
            t = vals[s]
            if own is not None or id(t._buf) in own_ids:
                t = wrap(t._buf[:], t.shape, t.dtype, t.device)
            out.append(t)
        return unflatten(self.plan.out_tree, out)

    def _compile_program(self):
        """``self.prog``: the program as ``_replay`` walks it: ``(_SEG, segment, its alias steps
        that are not static)``, ``(_ALIAS, step, ())`` (not static), ``(_PY | _HOST, step, ())``.
        An alias is *static* when the values a replay starts from already hold its outputs (an
        alias of a constant or an own buffer: made once), so a replay skips it."""
        steps, base = self.plan.steps, self.base

        def dynamic(i):
            return not all(base[s] is not None for s in steps[i].outs)

        prog = []
        for what, x in self.program:
            if what == "seg":
                prog.append((_SEG, x, tuple(steps[a] for a in x.aliases if dynamic(a))))
            elif what == "alias":
                if dynamic(x):
                    prog.append((_ALIAS, steps[x], ()))
            else:
                prog.append((_PY if what == "py" else _HOST_STEP, steps[x], ()))
        self.prog = prog
        # one segment and nothing else to do around it: _replay's short path
        self.solo = prog[0][1] if len(prog) == 1 and prog[0][0] is _SEG and not prog[0][2] else None

    @staticmethod
    def _alias(st, vals, wrap):
        if vals[st.outs[0]] is not None and all(vals[s] is not None for s in st.outs):
            return   # static: made once (an alias of a constant or an own buffer)
        _step(st, vals, wrap)

    def _finish_steps(self, start, vals):
        """Run steps ``start..`` step by step with their own kernels (a stale table's replay)."""
        wrap = Tensor._wrap
        self.space.sync_out(vals)
        for st in self.plan.steps[start:]:
            if RESIDENT:
                _resident_use(st, vals)
            if st.multi == _HOST:
                st.kernel(vals)
            else:
                _step(st, vals, wrap)
        return self._outputs_from(vals, self.own_ids)

    def _outputs_from(self, vals, own_ids):
        out = []
        for s in self.plan.out_slots:
            t = vals[s]
            if own_ids is not None and id(t._buf) in own_ids:
                t = Tensor._wrap(t._buf[:], t.shape, t.dtype, t.device)
            out.append(t)
        return unflatten(self.plan.out_tree, out)

    def redo_step(self, i, vals, seg):
        """A guarded command stopped at step ``i``: run it through its wrapper (which does the
        Python part); returns its output buffers (the space puts them where the table expects)."""
        for a in seg.aliases:   # aliases the segment would only make after it ran
            if a < i:
                self._alias(self.plan.steps[a], vals, Tensor._wrap)
        st = self.plan.steps[i]
        res = st.kernel(st.meta, *[vals[j] for j in st.ins], **st.attrs)
        return res if st.multi else (res,)


def _resident_use(st, vals) -> None:
    # (a moved array stays moved for a step whose wrapper calls the module: the call runs on
    # the shared memory; a Python kernel gets Python's copy. A python-backend kernel does this
    # itself, knowing which inputs it writes: fallback.python_kernel)
    if getattr(st.kernel, "python_use_guarded", False):
        return
    wasm = getattr(st.kernel, "__module__", "").startswith(__package__ + ".ops_")
    for j in st.ins:
        t = vals[j]
        ent = RESIDENT.get(id(t._buf)) if t is not None else None
        if ent is not None and not (wasm and ent.moved):
            ent.python_use(True)


def release_constants(compiled, tensors) -> list:
    """Let go of constant Tensors ``tensors`` in every plan of compiled function ``compiled``
    (``ember.compile``) that holds one (``WasmPlanReplay.release_constants``), before they are
    replaced (``core.llm``: a KV cache grown). Returns what ``bind_constants`` takes."""
    index = {id(t): k for k, t in enumerate(tensors)}
    held = []
    for key, plan in list(getattr(compiled, "plans", {}).items()):
        consts = getattr(plan, "consts", None)
        if not consts:
            continue   # (a reason this signature runs eagerly)
        where = {s: index[id(t)] for s, t in consts if t is not None and id(t) in index}
        if not where:
            continue
        olds = {s: (tuple(t.shape), t.dtype) for s, t in consts if s in where}
        fast = plan.fast
        if isinstance(fast, WasmPlanReplay):
            fast.release_constants(set(index))
        else:
            plan.consts = [(s, None if s in where else t) for s, t in consts]
        held.append((compiled, key, plan, where, olds))
    return held


def bind_constants(held, tensors) -> bool:
    """Give the plans ``release_constants`` left the new Tensors (``tensors[k]`` for the k-th
    released one). A plan whose steps reading them would give other shapes (their shape rules
    asked) is dropped: its function captures it again. A wasm replay records only the steps
    that read them again (``WasmPlanReplay.bind_constants``). True when every plan has its
    tables back."""
    done = True
    for compiled, key, plan, where, olds in held:
        new = {s: tensors[k] for s, k in where.items()}
        if not _same_shapes(plan, new, olds):
            compiled.plans.pop(key, None)   # captured again on its next call
            done = False
            continue
        fast = plan.fast
        if isinstance(fast, WasmPlanReplay):
            done = fast.bind_constants(new) and done
        else:
            plan.consts = [(s, new.get(s, t)) for s, t in plan.consts]
            done = False
    return done


def _same_shapes(plan, new: dict, olds: dict) -> bool:
    """Whether ``plan``'s steps that read slots ``new`` ({slot: Tensor}, were ``olds``: {slot:
    (shape, dtype)}) give the shapes they were captured with (their ops' shape rules)."""
    from ..registry import OPS

    if any(t.dtype is not olds[s][1] or len(t.shape) != len(olds[s][0]) for s, t in new.items()):
        return False
    shapes = {s: m[0] for s, m in _slot_metas(plan.steps).items()}
    shapes.update((s, tuple(t.shape)) for s, t in plan.consts if t is not None)
    last = getattr(plan.fast, "last_inputs", None) if isinstance(plan.fast, WasmPlanReplay) else None
    if last is not None:
        shapes.update((s, tuple(t.shape)) for s, t in enumerate(last))
    shapes.update((s, tuple(t.shape)) for s, t in new.items())
    for st in plan.steps:
        if st.multi == _HOST or not any(j in new for j in st.ins):
            continue
        d = OPS.get(st.name)
        if d is None or any(j not in shapes for j in st.ins):
            return False
        try:
            got = d.shape(*[shapes[j] for j in st.ins], **st.attrs)
        except Exception:   # noqa: BLE001 (the rule refuses the new shapes)
            return False
        want = [m.shape for m in st.meta] if st.multi else [st.meta.shape]
        got = list(got) if st.multi else [got]
        if [tuple(g) for g in got] != [tuple(w) for w in want]:
            return False
    return True


def _plan_team(replay, segs, consts):
    """The team a plan's tables run on, or None: Pyodide's own memory, one thread.

    - A constant moved into a team's shared memory (a model's weights) pins the plan to that
      team (threads turned off since: thread 0 runs it there).
    - A plan whose tables together do less work than ``TeamSpace.SMALL_WORK`` stays on
      Pyodide's memory even while a team runs (thread 0 would run it alone anyway, and the
      copies into and out of the shared memory cost more than its kernels: MNIST batch 1 in the
      page, 0.42 ms a forward there vs 0.185 in Pyodide's), and it does not start a team: a page
      whose plans are all this small never compiles the team's module nor starts a worker.
      Not when the running team is forced (``adaptive`` off: tests of the split kernels).
    - Any other plan gets the team, started now if more than one thread is wanted
      (``team.team()``; None where threads are off or unavailable)."""
    from .team import _STATE, team

    for _, c in consts:
        ent = RESIDENT.get(id(getattr(c, "_buf", None))) if RESIDENT else None
        if ent is not None and ent.moved:
            return team() or _STATE["team"]
    running = _STATE["team"]
    if running is None or running.adaptive:
        names = {k: n for n, k in replay.disp.ids.items()}
        if sum(table_work(s, names) for s in segs) < TeamSpace.SMALL_WORK:
            return None
    return team()


def _step(st, vals, wrap) -> None:
    """Run kernel step ``st`` from Python, as ``Plan._run_steps`` does."""
    res = st.kernel(st.meta, *[vals[j] for j in st.ins], **st.attrs)
    if st.multi:
        for s, b, m in zip(st.outs, res, st.meta):
            vals[s] = wrap(b, m.shape, m.dtype, st.device)
    else:
        vals[st.outs[0]] = wrap(res, st.meta.shape, st.meta.dtype, st.device)


def _slot_metas(steps) -> dict:
    """{slot: (shape, dtype, device)} of every step output."""
    out = {}
    for st in steps:
        if st.multi == _HOST:
            continue
        metas = st.meta if st.multi else (st.meta,)
        for s, m in zip(st.outs, metas):
            out[s] = (m.shape, m.dtype, st.device)
    return out


class _Stale(Exception):
    """A constant's buffer was replaced: this table must be recorded again."""


# ---- where tables run ---------------------------------------------------------------------------

class _Space:
    kind = "?"

    def __init__(self, replay, program, own_buf, privs, vals, rootof):
        self.replay = replay
        # per bound root: (typecode, bytes needed, written) over every segment
        need = {}
        for item in program:
            if item[0] != "seg":
                continue
            for c in item[1].cmds:
                for _, ref, _, (lo, hi, wr) in c.fields:
                    if ref[0] == "s":
                        tc, n, w = need.get(ref[1], (None, 0, False))
                        need[ref[1]] = (tc, max(n, hi), w or wr)
        self.need = need
        self.const_slots = replay.const_slots

    def check(self, r, b, seg_name=""):
        """Raise BoundsError unless buffer ``b`` can stand where the table puts root slot ``r``."""
        _, n, wr = self.need[r]
        if not _is_array(b):
            raise BoundsError(f"wasm plan table: slot {r} holds a {type(b).__name__}, not an array")
        if b.__class__ is Moved:   # (its len() is its shared copy's, when it has one: team.Moved)
            ent = RESIDENT.get(id(b))
            if ent is None or ent.buf() is not b:
                raise DeviceError(f"wasm plan table: slot {r} is a moved array without its copy in the "
                                  f"thread team's shared memory (its team was closed)")
        have = len(b) * b.itemsize
        if n > have:
            raise BoundsError(f"wasm plan table: slot {r} needs {n} bytes, its buffer has {have}")

    def execute(self, seg, vals) -> None:
        """``ember_run`` over the segment's table; where a guarded command stops it, that step
        runs through its wrapper (``_redo``) and the table resumes at the next step."""
        rep = self.replay
        rc = self.run_fn(seg.addr, 0)
        rep.runs += 1
        while rc:
            if rc < 0:
                raise BoundsError(f"wasm plan table refused by ember_run ({rc}): "
                                  + ("wrong ABI or magic" if rc == -1 else f"command {-2 - rc} is malformed"))
            i = seg.cmds[rc - 1].step
            self._redo(seg, i, vals)
            nxt = seg.steps.index(i) + 1
            if nxt >= len(seg.steps):
                return
            rc = self.run_fn(seg.addr, seg.first_cmd[seg.steps[nxt]])
            rep.runs += 1

    def close(self) -> None:
        """Let go of what this space holds (a new recording replaces it)."""

    def sync_out(self, vals):
        pass


class PyodideSpace(_Space):
    """Tables on Pyodide's memory: real addresses, no copies. The table words are array('I')s."""

    kind = "pyodide"

    def __init__(self, replay, program, own_buf, privs, vals, rootof):
        super().__init__(replay, program, own_buf, privs, vals, rootof)
        self.run_fn = replay.rt.fn("ember_run")
        self.pins = [memoryview(b) for b in list(own_buf.values()) + list(privs.values())]
        for item in program:
            if item[0] != "seg":
                continue
            seg = item[1]
            words = [MAGIC, replay.disp.abi, len(seg.cmds), 0]
            slot_fields = {}
            for c in seg.cmds:
                base = len(words) + 3
                words += [c.kid, len(c.words), 0 if c.expect is None else c.expect]
                words += c.words
                for w, ref, off, _ in c.fields:
                    if ref[0] == "p":
                        b = privs[ref[1]]
                        words[base + w] = b.buffer_info()[0] + off
                    elif ref[1] in own_buf:
                        words[base + w] = own_buf[ref[1]].buffer_info()[0] + off
                    else:
                        slot_fields.setdefault(ref[1], []).append((base + w, off))
            words[3] = len(words)
            seg.table = array("I", words)
            seg.addr = seg.table.buffer_info()[0]
            seg.pin = memoryview(seg.table)
            # bound slots. Constants: the table holds their buffers' addresses as long as the same
            # buffers stand in the same Tensors (pinned here): one identity test per constant and
            # replay (a loop of ``is``: in Pyodide faster than a C-level map over them). The rest
            # (inputs, Python steps' outputs): checked and patched in whenever its buffer's
            # (address, length, item size) differs from the one checked last, i.e. once per
            # buffer replacement, not per replay.
            seg.checks = [(r, tuple(slot_fields.get(r, ())), r in self.const_slots) for r in seg.bound]
            seg.dyn = [(r, fields) for r, fields, is_const in seg.checks if not is_const]
            seg.seen = {}
            const_ts, seg.const_rs = [], []
            for r, fields, is_const in seg.checks:
                if vals[r] is None:      # a Python step's output already dropped: bound on first run
                    seg.seen[r] = None
                    continue
                b = vals[r]._buf
                self.check(r, b)
                self._patch(seg, r, fields, b)
                seg.seen[r] = b.buffer_info() + (b.itemsize,)
                if is_const:
                    self.pins.append(memoryview(b))
                    const_ts.append(vals[r])
                    seg.const_rs.append(r)
            seg.const_pairs = tuple((t, t._buf) for t in const_ts)

    def close(self) -> None:
        for p in self.pins:
            p.release()
        self.pins = []

    @staticmethod
    def _patch(seg, r, fields, b):
        addr = b.buffer_info()[0]
        tab = seg.table
        for w, off in fields:
            tab[w] = addr + off

    def run(self, seg, vals):
        if RESIDENT:   # a team's resident copy of a constant may be newer than Python's array
            for r, _, _ in seg.checks:
                ent = RESIDENT.get(id(vals[r]._buf))
                if ent is not None:
                    ent.python_use(r in seg.writes)
        for t, b in seg.const_pairs:
            if t._buf is not b:
                raise _stale_const(seg)
        seen = seg.seen
        for r, fields in seg.dyn:
            b = vals[r]._buf
            if b.__class__ is not array or b.buffer_info() + (b.itemsize,) != seen[r]:
                self.check(r, b)     # raises BoundsError before anything runs
                self._patch(seg, r, fields, b)
                seen[r] = b.buffer_info() + (b.itemsize,)
        self.execute(seg, vals)

    def _redo(self, seg, i, vals):
        rep = self.replay
        st = rep.plan.steps[i]
        bufs = rep.redo_step(i, vals, seg)
        for s, b in zip(st.outs, bufs):
            r = rep.rootof(s)
            own = rep.own_buf.get(r)
            if own is None or own is b:
                continue
            if len(b) != len(own) or b.typecode != own.typecode:
                raise _Stale(f"step {i} redone in Python gave a buffer of another size")
            memoryview(own).cast("B")[:] = memoryview(b).cast("B")


class ArenaSpace(_Space):
    """Tables under wasmtime: every buffer a table touches has a fixed place in the plan's own
    memory (an arena); bound buffers are copied in before each segment and out after."""

    kind = "wasmtime"
    consts_once = False   # constants copied in before every segment (wasmtime) or once (threads)

    def __init__(self, replay, program, own_buf, privs, vals, rootof, arena=None):
        super().__init__(replay, program, own_buf, privs, vals, rootof)
        arena = self.arena = arena if arena is not None else replay.rt.arena()
        weakref.finalize(replay, arena.close)
        self.run_fn = arena.fn("ember_run")
        self.addr = {}
        for r, b in own_buf.items():
            self.addr[("s", r)] = arena.alloc(len(b) * b.itemsize)
        self.resident = {}    # root slot -> its resident copy (TeamSpace: constants tables write)
        for r, (_, n, _) in self.need.items():
            if r not in own_buf:
                self.addr[("s", r)] = self._bound_addr(r, n, vals)
        for pid, b in privs.items():
            a = self.addr[("p", pid)] = arena.alloc(len(b) * b.itemsize)
            arena.write_from(a, b, len(b) * b.itemsize)   # parameter arrays; scratch contents unused
        self.own_buf = own_buf
        for item in program:
            if item[0] != "seg":
                continue
            seg = item[1]
            words = [MAGIC, replay.disp.abi, len(seg.cmds), 0]
            for c in seg.cmds:
                base = len(words) + 3
                words += [c.kid, len(c.words), 0 if c.expect is None else c.expect]
                words += c.words
                for w, ref, off, _ in c.fields:
                    words[base + w] = self.addr[ref] + off
            words[3] = len(words)
            tab = array("I", words)
            seg.addr = arena.alloc(len(tab) * 4)
            arena.write_from(seg.addr, tab, len(tab) * 4)
            seg.checks = [(r, r in self.const_slots) for r in seg.bound]
            seg.seen = {r: vals[r]._buf for r, is_const in seg.checks if is_const and vals[r] is not None}
            if self.consts_once:
                # constants no table writes are copied in here, once: a segment checks only that
                # the same buffer still stands there (a replaced one records the table again);
                # constants a table writes are resident copies (synced when Python uses them)
                for r, is_const in seg.checks:
                    if is_const and not self.need[r][2] and vals[r] is not None and r not in self.resident:
                        self.check(r, vals[r]._buf)
                        arena.write_from(self.addr[("s", r)], vals[r]._buf, self.need[r][1])
                seg.checks = [(r, c, 2 if r in self.resident else 1 if c and not self.need[r][2] else 0)
                              for r, c in seg.checks]
            else:
                seg.checks = [(r, c, 0) for r, c in seg.checks]
            # what a run does, resolved once: constants checked by buffer identity, bound buffers
            # copied in (mode 0) or resident copies synced (mode 2) before it; what it wrote
            # copied back after it
            consts = [(r, vals[r]) for r, c, _ in seg.checks if c and vals[r] is not None]
            seg.const_rs = [r for r, _ in consts]
            seg.const_pairs = tuple((t, t._buf) for _, t in consts)
            seg.copy_in = [(r, self.addr[("s", r)], self.need[r][1])
                           for r, _, mode in seg.checks if mode == 0]
            # (a moved array needs no sync: only the shared memory has it; the lists are made
            # again when Python got one back, team.Resident.python_use)
            seg.res_all = [self.resident[r] for r, _, mode in seg.checks if mode == 2]
            seg.wrote_all = [self.resident[r] for r in seg.writes if r in self.resident]
            _resident_lists(seg)
            seg.copy_back = [(r, self.addr[("s", r)], self.need[r][1]) for r in seg.writes
                             if r not in self.resident]
            seg.own_back = [(own_buf[r], self.addr[("s", r)], len(own_buf[r]) * own_buf[r].itemsize)
                            for r in seg.out_own]
        # own buffers start with the recording's values (a segment may read one a Python step
        # or an earlier segment left)
        for r, b in own_buf.items():
            arena.write_from(self.addr[("s", r)], b, len(b) * b.itemsize)

    def _bound_addr(self, r, n, vals):
        """Where bound root slot ``r`` (``n`` bytes a table touches) lives in the arena."""
        return self.arena.alloc(n)

    def run(self, seg, vals):
        for t, b in seg.const_pairs:
            if t._buf is not b:
                raise _stale_const(seg)
        if seg.res_gen != REMATERIALIZED[0]:
            _resident_lists(seg)
        for ent in seg.residents:
            ent.to_shared()
        if RESIDENT:   # a bound input copied in from Python: a team's copy of it may be newer (or moved)
            for r, _, _ in seg.copy_in:
                ent = RESIDENT.get(id(vals[r]._buf))
                if ent is not None:
                    ent.python_use(r in seg.writes)
        write, read = self.write_from, self.read_into
        for r, addr, n in seg.copy_in:
            b = vals[r]._buf
            if b.__class__ is not array or n > len(b) * b.itemsize:
                self.check(r, b)     # raises BoundsError before anything runs
            write(addr, b, n)
        self.execute(seg, vals)
        for ent in seg.wrote_res:
            ent.shared_wrote()
        for r, addr, n in seg.copy_back:
            read(addr, vals[r]._buf, n)
        for b, addr, n in seg.own_back:
            read(addr, b, n)

    def write_from(self, addr, buf, nbytes):
        """Copy ``nbytes`` of array ``buf`` to ``addr`` in the arena (checked there)."""
        self.arena.write_from(addr, buf, nbytes)

    def read_into(self, addr, buf, nbytes):
        self.arena.read_into(addr, buf, nbytes)

    def _redo(self, seg, i, vals):
        rep = self.replay
        st = rep.plan.steps[i]
        arena = self.arena
        # the wrapper reads Python buffers: bring its own-buffer inputs up to date first
        for s in st.ins:
            r = rep.rootof(s)
            b = self.own_buf.get(r)
            if b is not None:
                arena.read_into(self.addr[("s", r)], b, len(b) * b.itemsize)
        bufs = rep.redo_step(i, vals, seg)
        for s, b in zip(st.outs, bufs):
            r = rep.rootof(s)
            key = ("s", r)
            if key in self.addr:
                own = self.own_buf.get(r)
                n = len(own) * own.itemsize if own is not None else self.need[r][1]
                if len(b) * b.itemsize < n:
                    raise _Stale(f"step {i} redone in Python gave a smaller buffer")
                arena.write_from(self.addr[key], b, n)
        for s in st.ins:   # inputs it may have written in place
            r = rep.rootof(s)
            if r in self.resident:
                self.resident[r].to_shared()
            elif r in seg.bound:
                arena.write_from(self.addr[("s", r)], vals[r]._buf, self.need[r][1])

    def close(self) -> None:
        self.arena.close()

    def sync_out(self, vals):
        """Bring every own buffer's Python copy up to date (before a step-by-step finish)."""
        for r, b in self.own_buf.items():
            self.arena.read_into(self.addr[("s", r)], b, len(b) * b.itemsize)


class TeamSpace(ArenaSpace):
    """Tables on the thread team's shared memory (``ember.wasm.team``): the arena layout, in
    the shared memory, with constants copied in once; ``ember_team_run`` runs each segment on
    every thread of the team."""

    kind = "threads"
    consts_once = True

    def __init__(self, replay, program, own_buf, privs, vals, rootof, team=None):
        from .team import TeamArena

        arena = TeamArena(team)
        super().__init__(replay, program, own_buf, privs, vals, rootof, arena=arena)
        # each thread's private scratch: as large as the largest buffer a table writes outside
        # the plan's slots (a kernel's own scratch bounds what any thread's share needs)
        big = 0
        for item in program:
            if item[0] == "seg":
                for c in item[1].cmds:
                    for _, ref, _, (lo, hi, wr) in c.fields:
                        if ref[0] == "p" and wr:
                            big = max(big, hi)
        team.ensure_scratch(big)
        self.team = team
        self.serial = team.exports.ember_run
        # copies in and out of a replay go straight to the team's copy function: every address
        # here is an arena span, inside the shared memory for good (it only grows), so only the
        # Python side of each copy needs a check (the team's own write_from/read_into also ask
        # the memory for its size, a JS property read per copy: ~2.5 us of a ~5 us copy)
        copy = getattr(team, "_copy", None)
        if copy is not None and hasattr(team, "heap") and hasattr(team, "memory"):
            self._cp = (copy, team.heap, team.memory)
        else:   # (a team without them: its checked copies)
            self._cp = None

    def write_from(self, addr, buf, nbytes):
        cp = self._cp
        if cp is None or buf.__class__ is not array:
            return self.arena.write_from(addr, buf, nbytes)
        if nbytes > 0:
            if nbytes > len(buf) * buf.itemsize:
                raise BoundsError(f"wasm threads: {nbytes} bytes from a buffer of {len(buf) * buf.itemsize}")
            cp[0](cp[1], cp[2], buf.buffer_info()[0], addr, nbytes, True)

    def read_into(self, addr, buf, nbytes):
        cp = self._cp
        if cp is None or buf.__class__ is not array:
            return self.arena.read_into(addr, buf, nbytes)
        if nbytes > 0:
            if nbytes > len(buf) * buf.itemsize:
                raise BoundsError(f"wasm threads: {nbytes} bytes into a buffer of {len(buf) * buf.itemsize}")
            cp[0](cp[1], cp[2], addr, buf.buffer_info()[0], nbytes, False)

    # Threads pay only where a segment's split kernels outweigh the barriers (and where the cores
    # are free): each segment times a few runs on the team and on thread 0 alone (same memory,
    # same bits) and keeps the faster, measured again every REPROBE runs. The first WARMUP runs
    # of each are not counted: a worker's first runs pay for waking and for the engine's optimizing
    # compile of the kernels (seen: an LLM decode step's first team runs 1.5-4.5x the later ones,
    # which made a page keep one thread). Thread 0's own probes come after the team's, whose runs
    # already compiled the kernels they share (gemm_one, gemm_nt_one, the maps...): one uncounted
    # run there (a MiniLM 1 x 8 page: its 20 timed runs held 7 one-thread runs before, at ~1.4x a
    # team run each).
    PROBES = 3
    WARMUP = 4
    WARMUP_ONE = 1
    REPROBE = 256
    # After a choice its runs are watched: when the best of WATCH of them is over SLACK times the
    # other way's best probe, the segment is measured again at once (seen in a page on a busy
    # 2-core machine: probes at a quiet moment chose the team, whose spin barriers then made
    # every MNIST forward 0.40 ms instead of 0.17 ms on one thread, for up to REPROBE runs).
    WATCH = 16
    SLACK = 1.3
    # A segment whose table does fewer multiply-adds than this (``table_work``) runs on one thread
    # from its first run, never probed: the team's wake-up, barriers and copies cost about what a
    # second core could save (MNIST batch 1, ~1.1 M: in the page, on a busy 2-core machine, 0.21
    # ms a forward on the team vs 0.17 on one thread, and its probes were a tenth of the first
    # timed runs). MiniLM 1 x 8 (~85 M), a 256^3 GEMM (~17 M) and an LLM decode step are probed.
    SMALL_WORK = int(os.environ.get("EMBER_WASM_TEAM_SMALL_WORK", str(4 << 20)))
    # runs of a segment that wait (uncounted, on the threads ready) for the workers to start
    START_RUNS = 64

    def execute(self, seg, vals):
        team = self.team
        if not team.adaptive:
            self.run_fn = team.run
            return super().execute(seg, vals)
        st = getattr(seg, "team_stats", None)
        if st is None or st["n"] >= self.REPROBE:
            st = seg.team_stats = {"n": 0, True: [], False: [], "use": None, "watch": [0, float("inf")]}
            work = getattr(seg, "team_work", None)
            if work is None:
                names = {k: n for n, k in self.replay.disp.ids.items()}
                work = seg.team_work = table_work(seg, names)
            if work < self.SMALL_WORK:
                st["use"] = False   # one thread; no probe (so no team time to watch against)
        st["n"] += 1
        use = st["use"]
        if use is not None:
            self.run_fn = team.run if use else self.serial
            t0 = _now()
            super().execute(seg, vals)
            dt = _now() - t0
            w = st["watch"]
            if dt < w[1]:
                w[1] = dt
            w[0] += 1
            if w[0] >= self.WATCH:
                k = self.WARMUP if not use else self.WARMUP_ONE
                if w[1] > self.SLACK * min(st[not use][k:], default=float("inf")):
                    st["n"] = self.REPROBE   # the next run starts new probes
                w[0], w[1] = 0, float("inf")
            return
        # the team's probes first, back to back, then thread 0's: alternating them put every team
        # probe right after a one-thread run, its workers asleep (woken at each barrier: an LLM
        # decode step measured 14-16 ms on the team that way, 7-8 ms when the team runs in a row)
        use = len(st[True]) < self.PROBES + self.WARMUP
        # a team started by this plan's build has workers still starting for its first runs
        # (~30-50 ms in a page): those runs are not probes of the team
        starting = use and st["n"] <= self.START_RUNS and team.ready() < team.wanted
        self.run_fn = team.run if use else self.serial
        t0 = _now()
        super().execute(seg, vals)
        if starting:
            return
        st[use].append(_now() - t0)
        k, k1 = self.WARMUP, self.WARMUP_ONE
        if len(st[True]) >= self.PROBES + k and len(st[False]) >= self.PROBES + k1:
            st["use"] = min(st[True][k:]) < 0.95 * min(st[False][k1:])

    def _bound_addr(self, r, n, vals):
        # a constant a table writes in place (a KV cache): one resident copy in the shared memory
        # for every plan that binds the same buffer, copied only when Python used it in between;
        # a constant moved there (``team.Moved``: a model's weights) is used where it lives
        b = vals[r]._buf if r in self.const_slots and vals[r] is not None else None
        ent = RESIDENT.get(id(b)) if b is not None else None
        if ent is not None and ent.moved and ent.buf() is b:
            self.check(r, b)
            self.resident[r] = ent
            return ent.addr
        if b is not None and self.need[r][2] and _is_array(b):
            self.check(r, b)
            res = self.resident[r] = self.arena.team.resident(b)
            return res.addr
        return self.arena.alloc(n)


def _resident_lists(seg) -> None:
    """The resident arrays a segment syncs before it runs and marks written after: those that
    are not moved (a moved array lives in the shared memory only)."""
    seg.residents = [e for e in seg.res_all if not e.moved]
    seg.wrote_res = [e for e in seg.wrote_all if not e.moved]
    seg.res_gen = REMATERIALIZED[0]


def _stale_const(seg) -> "_Stale":
    """The error for a segment whose constants' buffers are not all the ones it was built on."""
    for r, (t, b) in zip(seg.const_rs, seg.const_pairs):
        if t._buf is not b:
            return _Stale(f"the buffer of constant slot {r} was replaced")
    return _Stale("the buffer of a constant was replaced")


_now = time.perf_counter


def _team_epoch() -> int:
    st = _TEAM_STATE[0]
    if st is None:
        from .team import _STATE

        st = _TEAM_STATE[0] = _STATE
    return st["epoch"]


_TEAM_STATE = [None]


def compile_plan(backend, plan):
    """The compiled replay of ``plan`` on ``backend`` (a WasmBackend), or None when tables are
    off. Called by ``Plan.run`` on the plan's first replay."""
    if not ENABLED:
        return None
    try:
        from .plan_fuse import FusedReplay, fuse_candidates

        if fuse_candidates(plan):
            return FusedReplay(backend, plan, WasmPlanReplay)
        return WasmPlanReplay(backend, plan)
    except DeviceError:
        return None   # a module without ember_run (an old build): step-by-step replay
