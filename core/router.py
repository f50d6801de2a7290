"""The router device: one device name over several backends, each op run where it is cheapest.

``ember.router("webgpu", "numpy")`` (or ``device="auto"``) returns a device name usable anywhere
a device is: ``ember.tensor(..., device=...)``, ``.to()``, ``ember.compile``, ``ember.onnx.load``,
``Module.to()``. Each op runs on the member device where it costs least, counting the time to
move inputs that are not there yet: big matmuls and convolutions land on the GPU, small and
latency-bound ops (shape arithmetic, tiny elementwise ops) on a CPU device. Burn's Router
backend is the model.

How a decision is made: the first time an op meets a *shape class* (op, dtypes, every dimension
rounded up to a power of two, like autotune's keys) each member able to run it runs it once on
the real inputs and is timed (GPU work waited for); later calls look the winner up. The
estimate for a member is its measured time plus, for each input not already there, the cost
of moving it (a latency plus bytes over bandwidth, measured per pair of members). A tensor
moved once keeps its copy (buffers are immutable), so a weight crosses to the GPU only once.
Measured costs persist in ``$XDG_CACHE_HOME/ember/router.json`` (one section per member set;
``EMBER_ROUTER_CACHE=off`` keeps them in memory only, a path puts them elsewhere); in the page
they live in memory. ``ember.router_stats()`` explains every decision.

A plan captured through a router (``ember.compile``) replays with each step on the member it
ran on while capturing: the routing is fixed at capture.

>>> import ember
>>> dev = ember.router("numpy", "python")
>>> dev
'router:numpy+python'
>>> x = ember.tensor([[1.0, 2.0], [3.0, 4.0]], device=dev)
>>> (x @ x + 1).tolist()
[[8.0, 11.0], [16.0, 23.0]]
>>> st = ember.router_stats(dev)["ops"]["matmul"]    # where it ran, and the costs measured
>>> sum(st["calls"].values()), st["device"] in ("numpy", "python")
(1, True)
"""
from __future__ import annotations

import json
import os
import sys
import time
import types

from . import dtypes as _dt
from .backends import _INSTANCES, get_backend
from .errors import DeviceError, DTypeError, UnsupportedOp
from .registry import CAPTURE, DECOMPOSE, OPS
from .tensor import Tensor

_wrap = Tensor._wrap

__all__ = ["router", "router_stats", "RouterBackend", "auto_members"]

PREFIX = "router:"
DECOMPOSED = "decomposed"    # the choice "run the op's decomposition, each primitive routed"
INF = float("inf")
REUSE = 4                    # a reused tensor's move is counted as paid over this many reads
SLOW = {"python"}            # interpreted kernels: measured last, and only on small inputs
SLOW_LIMIT = 1 << 15         # elements (inputs + outputs) above which they are not run to be timed
# Ops that write into some inputs in place (KV caches): they run where those inputs live, and
# the other copies of those inputs are dropped afterwards.
MUTATES = {"attention_cached": (3, 4)}
_ROUTERS: dict = {}          # device name -> RouterBackend (created ones, for router_stats)
_FILE: dict = {}             # the JSON cache as loaded: section -> {"ops": .., "moves": ..}
_clock = time.perf_counter


def _in_browser() -> bool:
    return sys.platform == "emscripten"


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _metas(meta) -> tuple:
    """The output Metas of a kernel call (a Meta, or a tuple of them for multi-output ops)."""
    return meta if meta and hasattr(meta[0], "dtype") else (meta,)


def _shape_class(name: str, meta, inputs) -> str:
    """``op|in dtypes|in dims (powers of two)|out dims``: the key costs are measured under."""
    metas = _metas(meta)
    dims = ",".join("x".join(str(_pow2(d)) for d in t.shape) for t in inputs)
    outs = ",".join("x".join(str(_pow2(d)) for d in m.shape) for m in metas)
    dts = ",".join(t.dtype.name for t in inputs) or metas[0].dtype.name
    return f"{name}|{dts}|{dims}|{outs}"


class RBuf:
    """A router tensor's buffer: the member that produced it (``home``) and its copies by member
    (``home`` first; more appear as ops on other members read it)."""

    __slots__ = ("home", "copies", "where", "reused")

    def __init__(self, home: str, buf):
        self.home = home
        self.copies = {home: buf}
        self.where = home      # the members holding a copy, as one string (part of routing keys)
        self.reused = False    # read by an op before: likely read again (a weight), moves amortise

    def add(self, m: str, buf) -> None:
        self.copies[m] = buf
        self.where = "+".join(self.copies)

    def __repr__(self) -> str:
        return f"RBuf(on {', '.join(self.copies)})"


def _wait(buf) -> None:
    """Block until a member's asynchronous work behind ``buf`` is done (WebGPU: run its lazy
    expression and read 4 bytes back); CPU buffers are ready already."""
    if isinstance(buf, (tuple, list)):
        for b in buf:
            _wait(b)
        return
    if isinstance(buf, RBuf):
        for b in buf.copies.values():
            _wait(b)
        return
    if not (hasattr(buf, "expr") and hasattr(buf, "rt")):
        return
    from .webgpu.fusion import elem_bytes, realize

    realize(buf, wide=False)
    rt = buf.rt
    if buf.size and buf.storage is not None:   # (the 4-byte word holding its first element)
        rt.read(buf.storage, 4, buf.offset * elem_bytes(buf.storage) // 4 * 4)
    else:
        rt.driver.flush()


def _software_adapter(backend) -> bool:
    """A WebGPU adapter that runs on the CPU (lavapipe, SwiftShader): never faster than a CPU
    device on the same cores, so ``auto`` leaves it out."""
    info = getattr(getattr(getattr(backend, "rt", None), "driver", None), "info", {}) or {}
    text = " ".join(str(info.get(k, "")) for k in ("adapter_type", "device", "description", "architecture")).lower()
    return any(w in text for w in ("cpu", "fallback", "llvmpipe", "lavapipe", "swiftshader"))


def auto_members() -> list:
    """The members ``device="auto"`` uses here: WebGPU when a hardware adapter exists, plus the
    best CPU device (numpy natively, wasm in the page, else python); without a hardware GPU,
    two CPU devices (numpy + python natively, wasm + python in the page). DeviceError when
    fewer than two can run, saying which are missing and why."""
    cpu = ["wasm", "python"] if _in_browser() else ["numpy", "python"]
    why = {}

    def ok(name):
        try:
            return get_backend(name)
        except DeviceError as e:
            why[name] = str(e)
            return None

    gpu = ok("webgpu")
    if gpu is not None and _software_adapter(gpu):
        why["webgpu"] = "only a software (CPU) adapter here"
        gpu = None
    have = [c for c in cpu if ok(c) is not None]
    members = (["webgpu"] + have[:1]) if gpu is not None else have[:2]
    if len(members) < 2:
        missing = "; ".join(f"{k}: {v}" for k, v in why.items())
        raise DeviceError(f"device 'auto': needs two of webgpu, {', '.join(cpu)}; only {members} can run here "
                          f"({missing})")
    return members


class _Kernels(dict):
    """The router's kernel table: an entry per op some member has a kernel for. While a plan is
    being captured, ``get`` hands out a kernel that pins its member on its first call, so the
    plan replays with the routing of the capture."""

    def __init__(self, router):
        super().__init__()
        self.router = router

    def get(self, name, default=None):
        k = dict.get(self, name, default)
        if k is not None and CAPTURE[0] is not None:
            return _Pinned(self.router, name)
        return k


class _Pinned:
    """A captured step's kernel: routed on its first call, then always on that member."""

    __slots__ = ("router", "name", "member")

    def __init__(self, router, name):
        self.router, self.name, self.member = router, name, None

    def __call__(self, meta, *inputs, **attrs):
        if self.member is None:
            self.member = self.router.choose(self.name, meta, inputs, attrs)
            return self.router.run_on(self.member, self.name, meta, inputs, attrs)
        return self.router.run_on(self.member, self.name, meta, inputs, attrs)

    def __repr__(self) -> str:
        return f"<{self.name} on {self.member}>"


class RouterBackend:
    """The backend behind a router device name (see the module docstring)."""

    storage = None

    def __init__(self, name: str, members: list):
        self.name = name
        self.members = tuple(members)
        self.be = {m: get_backend(m) for m in members}
        # new tensors land on a CPU member (reading back is free there); ops move them on
        cpu = [m for m in members if m != "webgpu" and not m.startswith("remote")]
        self.host = cpu[0] if cpu else members[0]
        self.full = {m for m in members if m in _dt.FULL_DEVICES}
        self.section = "+".join(self._member_id(m) for m in members)
        saved = _load().get(self.section, {})
        self.costs: dict = {k: {m: (INF if c >= 1e29 else float(c)) for m, c in v.items()}
                            for k, v in saved.get("ops", {}).items() if isinstance(v, dict)}
        self.xfer: dict = {k: list(v) for k, v in saved.get("moves", {}).items() if isinstance(v, list)}
        self.decide: dict = {}       # exact (op, meta, input shapes/dtypes/places) -> member
        self.sizes: dict = {}        # (op, member) -> [(elements, seconds)] measured this session
        self.estimated: set = set()  # (shape class, member) whose cost was estimated, not measured
        self.calls: dict = {}        # (op, member) -> calls
        self.moves: dict = {}        # op -> [moves, bytes]
        self.pairs: dict = {}        # "a>b" -> [moves, bytes]
        self.kernels = _Kernels(self)
        self.last = None             # the member the previous op ran on
        self.flushers = {m: b.rt.driver.flush for m, b in self.be.items()
                         if hasattr(getattr(getattr(b, "rt", None), "driver", None), "flush")}
        self.cands: dict = {}        # op -> members with a kernel for it, in member order
        for m in members:
            for op_name in self.be[m].kernels:
                self.cands.setdefault(op_name, [])
        for op_name, lst in self.cands.items():
            lst.extend(m for m in members if op_name in self.be[m].kernels)
            d = OPS.get(op_name)
            if d is not None and d.decompose is not None and len(lst) < len(members):
                lst.append(DECOMPOSED)   # a composite fused on one member only: its primitives may win
            self.kernels[op_name] = self._routed(op_name)

    def _member_id(self, m: str) -> str:
        rt = getattr(self.be[m], "rt", None)
        info = getattr(getattr(rt, "driver", None), "info", None)
        return f"{m}({info.get('device', '')})" if info else m

    @staticmethod
    def available():
        return True, "routes each op to one of its member devices"

    # ---- compiled plans -----------------------------------------------------------------------
    def compile_plan(self, plan):
        """A plan captured through this router, replayed as one sub-plan per run of consecutive
        steps on the same member, each through that member's own compiled replay where it has
        one (WebGPU's prebuilt dispatch stream, numpy's): the routing of the capture, with
        members' replay speed. None (step by step) for plans with host steps or in-place ops."""
        from .plan import HOST, Plan, Step, unflatten

        steps = plan.steps
        if not steps or any(st.multi == HOST or not isinstance(st.kernel, _Pinned) or st.kernel.member not in self.be
                            or st.name in MUTATES for st in steps):
            return None
        runs: list = []
        for st in steps:
            m = st.kernel.member
            if runs and runs[-1][0] == m:
                runs[-1][1].append(st)
            else:
                runs.append((m, [st]))
        needed = set(plan.out_slots)     # slots read after each run, walking backwards
        after = []
        for m, sts in reversed(runs):
            after.append(set(needed))
            for st in sts:
                needed.update(st.ins)
        after.reverse()
        segments = []
        for (m, sts), later in zip(runs, after):
            made = {o for st in sts for o in st.outs}
            ins = list(dict.fromkeys(i for st in sts for i in st.ins if i not in made))
            local = {g: k for k, g in enumerate(ins)}
            for st in sts:
                for o in st.outs:
                    local[o] = len(local)
            outs = [o for st in sts for o in st.outs if o in later]
            sub_steps = [Step(self.be[m].kernels[st.name], st.name, tuple(local[i] for i in st.ins),
                              tuple(local[o] for o in st.outs), st.meta, st.attrs, m, st.multi) for st in sts]
            sub = Plan(sub_steps, len(local), len(ins), [], tuple(local[o] for o in outs),
                       ("list", tuple("T" for _ in outs)))
            fast = None
            make = getattr(self.be[m], "compile_plan", None)
            if make is not None:
                try:
                    fast = make(sub)
                except Exception:   # a member's replay that cannot take this sub-plan: step by step
                    fast = None
            segments.append((m, ins, outs, fast or sub._run_steps, [(st.name, m) for st in sts]))
        consts, out_slots, out_tree, name, calls = plan.consts, plan.out_slots, plan.out_tree, self.name, self.calls

        def run(inputs):
            vals = dict(enumerate(inputs))
            for s, t in consts:
                vals[s] = t
            for m, ins, outs, fn, counted in segments:
                res = fn([self._on(vals[i], m, "(plan input)") for i in ins])
                for s, t in zip(outs, res):
                    vals[s] = _wrap(RBuf(m, t._buf), t.shape, t.dtype, name)
                for k in counted:
                    calls[k] = calls.get(k, 0) + 1
            return unflatten(out_tree, [vals[s] for s in out_slots])
        run.segments = segments
        return run

    # ---- the backend protocol ---------------------------------------------------------------
    def from_bytes(self, data, shape, dtype) -> RBuf:
        m = self.host if (dtype not in _dt.WIDE or self.host in self.full) else next(iter(sorted(self.full)))
        return RBuf(m, self.be[m].from_bytes(data, shape, dtype))

    def _reader(self, rb: RBuf) -> str:
        return self.host if self.host in rb.copies else rb.home

    def to_bytes(self, rb: RBuf, shape, dtype) -> bytes:
        m = self._reader(rb)
        return self.be[m].to_bytes(rb.copies[m], shape, dtype)

    async def to_bytes_async(self, rb: RBuf, shape, dtype) -> bytes:
        m = self._reader(rb)
        return await self.be[m].to_bytes_async(rb.copies[m], shape, dtype)

    # ---- routing ----------------------------------------------------------------------------
    def _routed(self, name: str):
        def kernel(meta, *inputs, **attrs):
            return self.run_on(self.choose(name, meta, inputs, attrs), name, meta, inputs, attrs)
        kernel.__name__ = f"route_{name}"
        return kernel

    def _candidates(self, name: str, meta, inputs) -> list:
        cands = self.cands.get(name, ())
        if not cands:
            raise UnsupportedOp(f"{name}: no member of {self.name!r} ({', '.join(self.members)}) has a kernel for it")
        if any(t.dtype in _dt.WIDE for t in inputs) or any(m.dtype in _dt.WIDE for m in _metas(meta)):
            cands = [m for m in cands if m in self.full or m == DECOMPOSED]
            if not cands:
                raise UnsupportedOp(f"{name}: no member of {self.name!r} ({', '.join(self.members)}) holds "
                                    f"{', '.join(sorted({t.dtype.name for t in inputs}))}")
        return cands

    def choose(self, name: str, meta, inputs, attrs) -> str:
        """The member to run ``name`` on for these inputs (measuring on first sight)."""
        if not inputs:
            # a creation op (a scalar operand, zeros): made where the work is now, so the op that
            # takes it finds it in place; large ones on the host member
            cands = self._candidates(name, meta, inputs)
            small = all(_numel(x.shape) <= 64 for x in _metas(meta))
            for m in ((self.last, self.host) if small else (self.host,)):
                if m in cands:
                    return m
            return cands[0]
        key = (name, meta, tuple([(t.shape, t.dtype, t._buf.where, t._buf.reused) for t in inputs]))
        try:
            m = self.decide.get(key)
        except TypeError:   # an unhashable meta (never in practice): route without the memo
            key, m = None, None
        if m is not None:
            return m
        cands = self._candidates(name, meta, inputs)
        if name in MUTATES:
            home = inputs[MUTATES[name][0]]._buf.home
            m = home if home in cands else cands[0]
        elif len(cands) == 1:
            m = cands[0]
        else:
            ck = _shape_class(name, meta, inputs)
            costs = self.costs.get(ck)
            if costs is None or any(c not in costs for c in cands):
                costs = self._measure(name, ck, meta, inputs, attrs, cands)
            m = min(cands, key=lambda c: costs[c] + self._move_cost(inputs, c))
            if costs[m] == INF:
                raise UnsupportedOp(f"{name}: no member of {self.name!r} ({', '.join(cands)}) can run it "
                                    f"on {[t.dtype.name for t in inputs]} {[t.shape for t in inputs]}")
        if key is not None:
            self.decide[key] = m
        return m

    def run_on(self, m: str, name: str, meta, inputs, attrs):
        """Run kernel ``name`` on member ``m``, moving the inputs there first."""
        if m == DECOMPOSED:   # registry.apply runs the decomposition, each primitive routed
            self.calls[(name, m)] = self.calls.get((name, m), 0) + 1
            return DECOMPOSE
        kernel = self.be[m].kernels.get(name)
        if kernel is None:
            raise UnsupportedOp(f"{name}: member {m!r} of {self.name!r} has no kernel for it")
        if m != self.last:
            # leaving a GPU member: submit what it has recorded, so it computes while the CPU
            # member works (WebGPU batches dispatches until a read or a flush)
            flush = self.flushers.get(self.last)
            self.last = m
            if flush is not None:
                flush()
        args = []
        for t in inputs:   # (inlined _on: this loop is the router's per-op cost)
            rb = t._buf
            rb.reused = True
            buf = rb.copies.get(m)
            if buf is None:
                buf = self._move(rb, t.shape, t.dtype, m, name)
                rb.add(m, buf)
            args.append(_wrap(buf, t.shape, t.dtype, m))
        out = kernel(meta, *args, **attrs)
        k = (name, m)
        self.calls[k] = self.calls.get(k, 0) + 1
        if name in MUTATES:   # the member's copy changed in place: it is the only valid one now
            for i in MUTATES[name]:
                rb = inputs[i]._buf
                buf = rb.copies[m]
                rb.copies.clear()
                rb.copies[m] = buf
                rb.home = rb.where = m
        if meta and hasattr(meta[0], "dtype"):
            return tuple(RBuf(m, b) for b in out)
        return RBuf(m, out)

    def _on(self, t, m: str, op: str, keep: bool = True):
        """``t`` (a router tensor) as a tensor of member ``m``, moved there if it is not yet."""
        rb = t._buf
        buf = rb.copies.get(m)
        if buf is None:
            buf = self._move(rb, t.shape, t.dtype, m, op)
            if keep:
                rb.add(m, buf)
        return _wrap(buf, t.shape, t.dtype, m)

    def _move(self, rb: RBuf, shape, dtype, dst: str, op: str):
        src = min(rb.copies, key=lambda s: self._pair_cost(s, dst, 1 << 16))
        b_src, b_dst = self.be[src], self.be[dst]
        if getattr(b_src, "storage", None) == "array" and getattr(b_dst, "storage", None) == "array":
            return rb.copies[src]   # python <-> wasm: the same immutable array.array buffers
        t0 = _clock()
        raw = b_src.to_bytes(rb.copies[src], shape, dtype)
        buf = b_dst.from_bytes(raw, shape, dtype)
        n = len(raw)
        if n >= 1 << 20:
            # a large move teaches the bandwidth (a GPU's big readbacks are slower than the
            # calibration's 4 MB); slower than assumed: decisions are made again
            k = f"{src}>{dst}"
            lb = self.xfer.get(k)
            seen = max(_clock() - t0 - (lb[0] if lb else 0.0), 0.0) / n
            if lb is not None and seen > 1.5 * lb[1]:
                lb[1] = seen
                self.decide.clear()
        mv = self.moves.setdefault(op, [0, 0])
        mv[0] += 1
        mv[1] += len(raw)
        pr = self.pairs.setdefault(f"{src}>{dst}", [0, 0])
        pr[0] += 1
        pr[1] += len(raw)
        return buf

    # ---- costs ------------------------------------------------------------------------------
    def _move_cost(self, inputs, m: str) -> float:
        total = 0.0
        if m == DECOMPOSED:
            return 0.0   # (its measured time includes the moves its primitives made)
        for t in inputs:
            copies = t._buf.copies
            if m not in copies:
                n = t.size * t.dtype.itemsize
                c = min(self._pair_cost(s, m, n) for s in copies)
                # a tensor read before (a weight) is read again: its copy serves later calls too
                total += c / REUSE if t._buf.reused else c
        return total

    def _pair_cost(self, src: str, dst: str, nbytes: int) -> float:
        """Seconds to move ``nbytes`` from ``src`` to ``dst``: latency + bytes / bandwidth,
        measured once per pair (and kept with the op costs)."""
        if src == dst:
            return 0.0
        k = f"{src}>{dst}"
        lb = self.xfer.get(k)
        if lb is None:
            lb = self.xfer[k] = self._calibrate(src, dst)
            _save(self)
        return lb[0] + lb[1] * nbytes

    def _calibrate(self, src: str, dst: str) -> list:
        b_src, b_dst = self.be[src], self.be[dst]
        if getattr(b_src, "storage", None) == "array" and getattr(b_dst, "storage", None) == "array":
            return [0.0, 0.0]
        small, big = 64, 1 << 22
        times = {}
        for n in (small, big):
            buf = b_src.from_bytes(bytes(n), (n // 4,), _dt.float32)
            best = INF
            for _ in range(3):
                t0 = _clock()
                _wait(b_dst.from_bytes(b_src.to_bytes(buf, (n // 4,), _dt.float32), (n // 4,), _dt.float32))
                best = min(best, _clock() - t0)
            times[n] = best
        per_byte = max(times[big] - times[small], 0.0) / (big - small)
        return [times[small], per_byte]

    def _measure(self, name: str, ck: str, meta, inputs, attrs, cands) -> dict:
        """Run ``name`` on every candidate member and time it (twice: the first run warms or
        compiles a kernel; more when fast), the inputs already in place (their moves are costed
        separately). Slow members go last, and a member is not run where it cannot win: when its
        time extrapolated from a smaller shape class of the op is far above the best measured
        (then that estimate is its cost), or, for pure Python, on more than ``SLOW_LIMIT``
        elements with nothing to extrapolate from (a large convolution would take minutes)."""
        costs = dict(self.costs.get(ck, {}))
        size = sum(t.size for t in inputs) + sum(_numel(m.shape) for m in _metas(meta))
        first_error = None
        for m in sorted(cands, key=lambda c: c in SLOW):
            if m in costs:
                continue
            if m == DECOMPOSED:
                costs[m] = self._time_decomposition(name, inputs, attrs)
                continue
            best_other = min((c for c in costs.values() if c != INF), default=None)
            if best_other is not None:
                est = self._extrapolate(name, m, size)
                if est is not None and est > max(50 * best_other, 0.01):
                    costs[m] = est
                    self.estimated.add((ck, m))
                    continue
                if est is None and m in SLOW and size > SLOW_LIMIT:
                    costs[m] = INF
                    self.estimated.add((ck, m))
                    continue
            kernel = self.be[m].kernels[name]
            try:
                args = [self._on(t, m, name, keep=False) for t in inputs]
                for t in args:
                    _wait(t._buf)
                # the first run compiles (and autotunes) a GPU kernel: never the one that counts
                least = 3 if m in self.flushers else 2
                best, spent, n = INF, 0.0, 0
                while n < least or (spent < 1e-3 and n < 5):
                    t0 = _clock()
                    _wait(kernel(meta, *args, **attrs))
                    dt = _clock() - t0
                    best, spent, n = min(best, dt), spent + dt, n + 1
                    if dt > 0.5 and m in SLOW:   # slow interpreted kernel: one run tells enough
                        break
                costs[m] = best
                self.sizes.setdefault((name, m), []).append((size, best))
            except (UnsupportedOp, DTypeError) as e:
                costs[m] = INF     # this member cannot run it for these inputs
                first_error = first_error or e
        if first_error is not None and all(costs[c] == INF for c in cands):
            raise first_error
        self.costs[ck] = costs     # (a kernel's own error, bad indices say, left nothing measured)
        _save(self)
        return costs

    def _extrapolate(self, name: str, m: str, size: int):
        """Member ``m``'s time for ``name`` on ``size`` elements, scaled linearly from the largest
        smaller shape class measured on it (None if none near enough)."""
        # (only from a class within 64x of this one: at a few elements a kernel's fixed cost
        # dominates, and scaling it up would rule a fast member out)
        below = [(s, c) for s, c in self.sizes.get((name, m), ()) if size // 64 <= s <= size and s > 0]
        if not below:
            return None
        s, c = max(below)
        return c * size / s

    def _time_decomposition(self, name: str, inputs, attrs) -> float:
        """Seconds the op's decomposition takes on this router (the second of two runs: the
        first measures its primitives' new shape classes)."""
        from .autograd import no_grad
        from .plan import paused

        decompose = OPS[name].decompose
        best = INF
        with paused(), no_grad():
            for _ in range(2):
                t0 = _clock()
                out = decompose(*inputs, **attrs)
                for t in (out if isinstance(out, (tuple, list)) else (out,)):
                    _wait(t._buf)
                best = min(best, _clock() - t0)
        return best

    # ---- explaining -------------------------------------------------------------------------
    def stats(self) -> dict:
        calls: dict = {}
        for (op_name, m), n in self.calls.items():
            calls.setdefault(op_name, {})[m] = n
        ops: dict = {}
        for ck, costs in sorted(self.costs.items()):
            op_name, _, rest = ck.partition("|")
            if op_name not in calls:
                continue
            entry = ops.setdefault(op_name, {"shapes": {}})
            finite = {m: c for m, c in costs.items() if c != INF}
            entry["shapes"][rest] = {"device": min(finite, key=finite.get) if finite else None,
                                     "cost_us": {m: (round(c * 1e6, 2) if c != INF else None)
                                                 for m, c in costs.items()}}
            est = [m for m in costs if (ck, m) in self.estimated]
            if est:
                entry["shapes"][rest]["not_run"] = est   # estimated (or ruled out) without running
        for op_name, c in sorted(calls.items()):
            entry = ops.setdefault(op_name, {"shapes": {}})
            mv = self.moves.get(op_name, [0, 0])
            entry.update(device=max(c, key=c.get), calls=c, moves=mv[0], bytes_moved=mv[1])
        return {"device": self.name, "members": list(self.members), "ops": ops,
                "moves": {k: {"count": v[0], "bytes": v[1]} for k, v in sorted(self.pairs.items())},
                "move_cost_us": {k: {"latency": round(v[0] * 1e6, 2), "per_mb": round(v[1] * 1e12, 2)}
                                 for k, v in sorted(self.xfer.items())}}

    def reset_stats(self) -> None:
        self.calls.clear()
        self.moves.clear()
        self.pairs.clear()


# ---- the cost cache (JSON natively, memory in the page) ---------------------------------------

def cache_path() -> str | None:
    """Where measured costs persist, or None (memory only: ``EMBER_ROUTER_CACHE=off``, the page)."""
    env = os.environ.get("EMBER_ROUTER_CACHE", "")
    if env.lower() in ("off", "0", "no", "memory") or _in_browser():
        return None
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ember", "router.json")


def _load() -> dict:
    path = cache_path()
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


_LAST_SAVE = [0.0]


def _save(r: RouterBackend, force: bool = False) -> None:
    """Write ``r``'s costs into the JSON cache (at most every two seconds, and at exit)."""
    path = cache_path()
    if path is None:
        return
    _FILE[r.section] = r
    now = _clock()
    if not force and now - _LAST_SAVE[0] < 2.0:
        return
    _LAST_SAVE[0] = now
    data = _load()
    for section, rr in list(_FILE.items()):
        data[section] = {"ops": {k: {m: (c if c != INF else 1e30) for m, c in v.items()}
                                 for k, v in rr.costs.items()}, "moves": rr.xfer}
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass   # a read-only home must not break inference


def _save_all() -> None:
    for r in list(_FILE.values()):
        _save(r, force=True)
        break   # one write holds every section


__import__("atexit").register(_save_all)


# ---- public API ---------------------------------------------------------------------------------

def create_backend(name: str) -> RouterBackend:
    """The backend for a router device name (``"auto"`` or ``"router:a+b..."``); called by
    ``ember.get_backend``. DeviceError for unknown members, a member that cannot run here, or
    fewer than two members."""
    if name == "auto":
        members = auto_members()
    else:
        members = [m.strip() for m in name[len(PREFIX):].split("+") if m.strip()]
        _check_members(members, name)
    r = RouterBackend(name, members)
    _ROUTERS[name] = r
    if r.full:
        _dt.FULL_DEVICES.add(name)   # wide dtypes (float64, int8...) are routed to the members that hold them
    return r


def _check_members(members: list, name: str) -> None:
    from .backends import _FACTORIES

    if len(members) < 2:
        raise DeviceError(f"{name!r}: a router needs at least two member devices, got {members}")
    if len(set(members)) != len(members):
        raise DeviceError(f"{name!r}: a member device is named twice")
    missing = []
    for m in members:
        if m == "auto" or m.startswith(PREFIX) or m == "meta" or m not in _FACTORIES:
            raise DeviceError(f"{name!r}: unknown member device {m!r}; members can be "
                              f"{', '.join(k for k in _FACTORIES if k != 'meta')}")
        try:
            get_backend(m)
        except DeviceError as e:
            missing.append(f"{m} ({e})")
    if missing:
        raise DeviceError(f"{name!r}: a router needs at least two available member devices; not available "
                          f"here: {'; '.join(missing)}")


def router(*members: str) -> str:
    """The name of a router device over ``members`` (two or more device names, e.g.
    ``"webgpu", "numpy"``); without arguments ``"auto"`` (see ``auto_members``). Use the name
    as any device: ``ember.tensor(x, device=dev)``, ``t.to(dev)``, ``model.to(dev)``.

    >>> import ember
    >>> ember.router("numpy", "python")
    'router:numpy+python'
    >>> ember.router("numpy", "cuda")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ember.errors.DeviceError: 'router:numpy+cuda': unknown member device 'cuda'; members can be ...
    """
    for m in members:
        if not isinstance(m, str):
            raise TypeError(f"router: member devices are names (str), not {type(m).__name__}")
    name = "auto" if not members else PREFIX + "+".join(members)
    get_backend(name)
    return name


def router_stats(device: str | None = None, reset: bool = False) -> dict:
    """What a router did and why: ``{"device", "members", "ops": {op: {"device": the member it
    ran on most, "calls": {member: n}, "moves": inputs moved for it, "bytes_moved": n,
    "shapes": {shape class: {"device": the cheaper member, "cost_us": {member: measured µs}}}}},
    "moves": {"a>b": {"count", "bytes"}}, "move_cost_us": {"a>b": {"latency", "per_mb"}}}``.
    Without ``device``: the stats of every router created so far, by device name.
    ``reset=True`` zeroes the counters (the measured costs stay)."""
    if device is None:
        out = {n: r.stats() for n, r in _ROUTERS.items() if _INSTANCES.get(n) is r}
        if reset:
            for r in _ROUTERS.values():
                r.reset_stats()
        return out
    r = get_backend(device)
    if not isinstance(r, RouterBackend):
        raise DeviceError(f"router_stats: {device!r} is not a router device")
    out = r.stats()
    if reset:
        r.reset_stats()
    return out


class _CallableModule(types.ModuleType):
    """``ember.router`` is this module and ``ember.router(...)`` calls ``router``: importing the
    submodule binds the package attribute to the module, so the module itself is callable."""

    def __call__(self, *members: str) -> str:
        return router(*members)


sys.modules[__name__].__class__ = _CallableModule
