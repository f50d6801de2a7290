"""Execution plans: capture a computation once, replay it fast.

Every op runs through ``ember.registry.apply``; while a ``Capture`` is active, ``apply`` also
appends each *kernel call* it makes to the capture (the kernel itself, its attributes, which
values it read and the shape/dtype of what it produced). Composite ops are recorded as the
kernels of their decomposition, so a plan holds only kernel calls. A ``Plan`` replays that
list: no device checks, no shape or dtype rules, no op lookups, no Python model code, just
``kernel(meta, *inputs, **attrs)`` per step, with intermediates dropped after their last use.

A plan is valid for one *signature*: the shapes, dtypes and devices of the input tensors and
the values of every other argument. Python control flow that depends on shapes is therefore
fine. Control flow that depends on tensor *values* is not: reading a value derived from an
input while capturing (``.item()``, ``.tolist()``, ``bool(t)``, ``float(t)``) makes the capture
*data-dependent*, and that signature runs eagerly from then on (``Compiled.stats()`` and
``explain=True`` say where). Values derived only from constants (weights, shapes) may be read.

>>> import ember
>>> f = ember.compile(lambda x: (x * 2 + 1).sum(axis=-1))
>>> f(ember.tensor([[1.0, 2.0], [3.0, 4.0]])).tolist()     # first call: runs and records
[8.0, 16.0]
>>> f(ember.tensor([[0.0, 0.0], [1.0, 1.0]])).tolist()     # same signature: replays the plan
[2.0, 6.0]
>>> f.stats()["replays"], f.stats()["plans"]
(1, 1)

**Training steps.** A whole step, forward, ``loss.backward()`` and ``optimizer.step()``, compiles
too: the forward and backward kernels are recorded like any others, and what a step does
*besides* computing tensors is recorded as host steps that the replay carries out in order:

- ``Tensor._set_`` (in-place updates: BatchNorm's running statistics, ``copy_``) swaps the new
  value into the same tensor object;
- each leaf's gradient is stored (or added to the ``.grad`` already there) as backward would;
- ``Optimizer.step``/``zero_grad`` and ``lr_scheduler`` steps are *called* at that point of the
  replay (``host_step``), so learning rates, Adam's step count and the fused WebGPU optimizer
  kernels behave exactly as in eager code;
- random draws (Dropout's masks, ``rand``/``randn``) are made again, the generator's next
  values as eagerly.

Parameters that require grad are never constant-folded while grad mode is on (they change
between calls), nor are tensors a step updates in place (found on the first capture, which is
then repeated once with them treated as variables). Outputs that still carry a live autograd
graph (a compiled forward whose caller runs ``backward``) make that signature eager: a plan
returns no graph.

>>> from ember import nn
>>> ember.manual_seed(0)
>>> lin = nn.Linear(2, 1)
>>> opt = ember.optim.SGD(lin.parameters(), lr=0.1)
>>> x, y = ember.tensor([[1.0, 2.0]]), ember.tensor([[1.0]])
>>> @ember.compile
... def step(x, y):
...     opt.zero_grad()
...     loss = ((lin(x) - y) ** 2).mean()
...     loss.backward()
...     opt.step()
...     return loss
>>> losses = [round(step(x, y).item(), 4) for _ in range(4)]
>>> step.stats()["replays"], losses[-1] < losses[0]
(3, True)
"""
from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from typing import Any, Callable

from .autograd import _MODE as _GRAD_MODE
from .autograd import is_grad_enabled as _is_grad_enabled
from .backends import _default as _DEFAULT_DEVICE
from .backends import default_device as _backend_default_device
# The active capture (one at a time): registry.apply and Tensor reads look at it.
from .registry import CAPTURE as _active
# (imported here, not per call: ember.compile's per-call Python is part of every replay)
from .tensor import Tensor


# Ops that must run on every replay even when their inputs are constant (none: random numbers
# are drawn in Python, and a capture records each draw as a host step, see ember.random).
NOT_FOLDED: set = set()

# ``Step.multi`` of a host step (``kernel(vals)`` at replay) rather than a kernel call.
HOST = 2


class Step:
    """One recorded kernel call. ``ins``: value slots read; ``outs``: slots written (one, or
    several for multi-output kernels); ``meta``: Meta or tuple of Metas passed to the kernel."""

    __slots__ = ("kernel", "name", "ins", "outs", "meta", "attrs", "device", "multi")

    def __init__(self, kernel, name, ins, outs, meta, attrs, device, multi):
        self.kernel = kernel
        self.name = name
        self.ins = ins
        self.outs = outs
        self.meta = meta
        self.attrs = attrs
        self.device = device
        self.multi = multi

    def __repr__(self) -> str:
        if self.multi == HOST:
            return f"{self.name}{tuple(self.ins)}"
        metas = self.meta if self.multi else (self.meta,)
        shown = ", ".join(f"{m.dtype.name}{list(m.shape)}" for m in metas)
        return f"{self.outs} = {self.name}{tuple(self.ins)} -> {shown} on {self.device}"


class Capture:
    """Records the kernel calls made between ``start()`` and ``stop()``.

    Tensors are tracked by id through weak references: an intermediate dies as soon as eager
    code drops it (capturing costs no more memory than running), and its id, if reused, gets a
    fresh slot. Tensors made outside the capture (weights) and constant-folded results that a
    recorded step or an output uses are held strongly: the plan needs them."""

    def __init__(self, inputs, mutable: dict | None = None):
        self.steps: list = []
        self.slot: dict = {}          # id(tensor) -> slot, for tensors alive now
        self.refs: dict = {}          # id(tensor) -> weakref whose callback forgets the id
        self.tainted: set = set()     # slots whose values derive from the inputs
        self.consts: list = []        # (slot, tensor) the plan holds: weights, folded values
        self.const_slots: set = set()
        self.outside: set = set()     # slots of tensors made before the capture (weights, constants)
        self.folded: set = set()      # slots of constant-folded results (held only if used)
        self.inputs = list(inputs)
        self.n = 0
        self.reason = None            # why the capture cannot become a plan
        self.grad_on = _grad_mode()   # then tensors that require grad are variables, not constants
        self.mutable = mutable if mutable is not None else {}   # id -> weakref: updated in place
        self.fold_reads: set = set()  # slots that constant-folded steps read
        self.retry: list = []         # tensors updated in place after a fold had read them
        for t in inputs:
            self._new(t, tainted=True)
        self.n_inputs = self.n

    def _new(self, t, tainted=False) -> int:
        s = self.n
        self.n += 1
        self._track(t, s)
        if tainted:
            self.tainted.add(s)
        return s

    def _slot_of(self, t, use: bool = True) -> int:
        """The slot of ``t``; ``use``: a recorded step (or the result) reads it, so a constant
        must be held by the plan."""
        s = self.slot.get(id(t))
        if s is None:   # made outside the capture (a weight, a constant): held by reference once used
            s = self._new(t, tainted=self._variable(t))
            self.outside.add(s)
        if use and (s in self.folded or s in self.outside) and s not in self.const_slots:
            # (one only a fold read stays out: an ONNX model's host-side copy of a weight that a
            # fold moved to the device is no constant of the device's plan)
            self.consts.append((s, t))
            self.const_slots.add(s)
        return s

    def _variable(self, t) -> bool:
        """Whether ``t``, made outside the capture, may change between calls: a parameter that
        requires grad (with grad mode on), or a tensor an earlier capture saw updated in place."""
        if self.grad_on and t._ag is not None:
            return True
        ref = self.mutable.get(id(t))
        return ref is not None and ref() is t

    def record(self, name, kernel, inputs, meta, attrs, outputs, multi) -> None:
        taint = False
        for t in inputs:
            s = self.slot.get(id(t))
            if (s in self.tainted) if s is not None else self._variable(t):
                taint = True
                break
        if not taint and name not in NOT_FOLDED:
            # Constant folding: inputs are all constants (weights, scalars, creation ops), so
            # the output is the same on every call: keep the value computed now (e.g. a
            # weight's transpose) instead of recomputing it on each replay.
            for t in inputs:
                self.fold_reads.add(self._slot_of(t, use=False))
            for t in outputs:
                self.folded.add(self._new(t))
            return
        ins = tuple(self._slot_of(t) for t in inputs)
        outs = tuple(self._new(t, True) for t in outputs)
        dev = outputs[0].device if outputs else (inputs[0].device if inputs else None)
        self.steps.append(Step(kernel, name, ins, outs, meta, attrs, dev, multi))

    # ---- what a step does besides computing tensors (host steps) ------------------------------
    def _host(self, name, fn, ins=()) -> None:
        self.steps.append(Step(fn, name, tuple(ins), (), None, {}, None, HOST))

    def alias(self, src, new) -> None:
        """``new`` is another tensor object over ``src``'s buffer (autograd's saved tensors,
        ``detach``): it reads the same slot, so a replay sees the parameter's value then, not
        the one it had while capturing."""
        self._track(new, self._slot_of(src))

    def _track(self, t, s: int) -> None:
        """Map tensor ``t`` to slot ``s`` while it lives (its id, if reused, gets a fresh slot)."""
        i = id(t)
        self.slot[i] = s

        def forget(ref, i=i, s=s):
            if self.slot.get(i) == s:
                del self.slot[i]
            if self.refs.get(i) is ref:
                del self.refs[i]
        self.refs[i] = weakref.ref(t, forget)

    def on_random(self, t, draw) -> None:
        """``t`` holds random values drawn while capturing (a dropout mask, ``rand``): it is a
        variable that every replay draws again at this point with ``draw()``, taking the
        generator's next values exactly as eager code would."""
        s = self._new(t, tainted=True)

        def redraw(vals, s=s):
            vals[s] = draw()
        self._host("draw", redraw)

    def on_set(self, target, new) -> None:
        """``target._set_(new)`` while capturing: the replay swaps the value in at this point."""
        ts, s = self._slot_of(target), self._slot_of(new)
        if ts in self.fold_reads and (ts in self.const_slots or ts in self.outside):
            self.retry.append(target)     # a fold read the old value: capture again, it is variable
        self.tainted.add(ts)

        def set_(vals, ts=ts, s=s):
            vals[ts]._set_(vals[s])
        self._host("set_", set_, (ts, s))

    def on_grad(self, leaf, g) -> None:
        """Backward stores ``g`` into ``leaf.grad`` (adding to a gradient already there): done
        now, and again at this point of every replay."""
        from .autograd import accumulate_grad

        s = self._slot_of(g)
        self._host("accumulate_grad", lambda vals, s=s: accumulate_grad(leaf, vals[s]), (s,))
        with paused():
            accumulate_grad(leaf, g)

    def on_grad_set(self, t, value) -> None:
        """``t.grad = value`` in the captured code."""
        if not t.is_leaf:
            self.fail(f"the .grad of a non-leaf tensor (shape {t.shape}) is set while capturing; a replay "
                      f"makes new intermediate tensors")
            return
        leaf = t._ag
        if value is None:
            self._host("grad = None", lambda vals: setattr(leaf, "grad", None))
            return
        s = self._slot_of(value)
        self._host("grad =", lambda vals, s=s: setattr(leaf, "grad", vals[s]), (s,))

    def host_call(self, fn, args, kwargs):
        """Run ``fn(*args, **kwargs)`` now, not recorded, and call it again at this point of every
        replay (``host_step``)."""
        from .tensor import Tensor

        if any(isinstance(a, Tensor) for a in list(args) + list(kwargs.values())):
            self.fail(f"{getattr(fn, '__qualname__', fn)} is called with a tensor argument while capturing; "
                      f"a replay would pass it the tensor of the first call")
        self._host(getattr(fn, "__qualname__", "host call"), lambda vals: fn(*args, **kwargs))
        with paused():
            return fn(*args, **kwargs)

    def fail(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def on_read(self, t) -> None:
        s = self.slot.get(id(t))
        if s is not None and s in self.tainted and self.reason is None:
            import traceback

            where = "".join(traceback.format_stack(limit=6)[:-2]).rstrip()
            self.reason = (f"a value derived from the inputs was read while capturing "
                           f"(shape {t.shape}, {t.dtype.name}); the computation depends on data:\n{where}")

    def start(self):
        if _active[0] is not None:
            raise RuntimeError("a capture is already running")
        _active[0] = self
        return self

    def stop(self) -> None:
        if _active[0] is self:
            _active[0] = None

    def plan(self, outputs, out_tree) -> "Plan":
        out_slots = tuple(self._slot_of(t) for t in outputs)
        return Plan(self.steps, self.n, self.n_inputs, self.consts, out_slots, out_tree)


def active():
    """The running capture, or None (``registry.apply`` checks this once per op)."""
    return _active[0]


class paused:
    """``with paused():`` nothing inside is recorded by the running capture (host steps)."""

    def __enter__(self):
        self.cap = _active[0]
        _active[0] = None
        return self

    def __exit__(self, *exc):
        _active[0] = self.cap
        return False


def host_step(fn):
    """Decorator for methods whose effects are outside tensors (``Optimizer.step``,
    ``zero_grad``, learning-rate schedulers): called while ``ember.compile`` captures, the call
    is recorded as a host step that every replay repeats at the same point, instead of being
    traced into kernels with its Python numbers frozen."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        cap = _active[0]
        if cap is None:
            return fn(*args, **kwargs)
        return cap.host_call(fn, args, kwargs)
    return wrapped



class Plan:
    """A replayable list of kernel calls for one input signature.

    ``plan.run(inputs)`` takes the input tensors in the captured order and returns the outputs
    in the structure the captured function returned. ``len(plan)`` is the number of kernel
    calls; ``print(plan)`` lists them."""

    def __init__(self, steps, n_slots, n_inputs, consts, out_slots, out_tree):
        self.steps = list(steps)
        self.n_slots = n_slots
        self.n_inputs = n_inputs
        self.consts = list(consts)
        self.out_slots = out_slots
        self.out_tree = out_tree
        # After each step, the slots nobody reads any more (outputs and constants stay).
        keep = set(out_slots) | {s for s, _ in consts}
        last = {}
        for i, st in enumerate(self.steps):
            for s in st.ins:
                last[s] = i
        self.free = [[] for _ in self.steps]
        for s, i in last.items():
            if s not in keep and s >= n_inputs:
                self.free[i].append(s)
        self._program = [(st.kernel, st.ins, st.outs[0] if not st.multi else st.outs, st.meta,
                          st.attrs, st.device, st.multi, tuple(f)) for st, f in zip(self.steps, self.free)]
        # A backend's compiled replay (``backend.compile_plan(plan)``, e.g. the wasm backend's
        # command tables), asked for on the first replay; False: none, replay step by step.
        self.fast = None

    def __len__(self) -> int:
        """The number of kernel calls (host steps not counted)."""
        return sum(1 for st in self.steps if st.multi != HOST)

    def __repr__(self) -> str:
        host = sum(1 for st in self.steps if st.multi == HOST)
        head = (f"Plan({len(self.steps) - host} kernel calls, {host} host steps, {self.n_inputs} inputs, "
                f"{len(self.consts)} constants)")
        return "\n".join([head] + [f"  {s!r}" for s in self.steps])

    def kernels(self) -> dict:
        """{op name: number of kernel calls}."""
        out: dict = {}
        for st in self.steps:
            if st.multi != HOST:
                out[st.name] = out.get(st.name, 0) + 1
        return out

    def run(self, inputs):
        fast = self.fast
        if fast is None:
            fast = self.fast = _compiled_replay(self)
        if fast is not False:
            return fast(inputs)
        return self._run_steps(inputs)

    def slots(self, inputs) -> list:
        """The value slots of one run: ``inputs`` and the constants in theirs, the rest None."""
        vals = [None] * self.n_slots
        vals[:self.n_inputs] = inputs
        for s, t in self.consts:
            vals[s] = t
        return vals

    def readers(self) -> dict:
        """{slot: indices of the steps that read it, in step order} (the plan fusions of the numpy
        and wasm backends look for a value's sole reader)."""
        out: dict = {}
        for i, st in enumerate(self.steps):
            for s in st.ins:
                out.setdefault(s, []).append(i)
        return out

    def _run_steps(self, inputs):
        """Replay step by step: each kernel called from Python."""
        wrap = Tensor._wrap
        vals = self.slots(inputs)
        for kernel, ins, out, meta, attrs, dev, multi, free in self._program:
            if multi is False:
                vals[out] = wrap(kernel(meta, *[vals[i] for i in ins], **attrs), meta.shape, meta.dtype, dev)
            elif multi is True:
                bufs = kernel(meta, *[vals[i] for i in ins], **attrs)
                for s, b, m in zip(out, bufs, meta):
                    vals[s] = wrap(b, m.shape, m.dtype, dev)
            else:
                kernel(vals)     # a host step
            for s in free:
                vals[s] = None
        return unflatten(self.out_tree, [vals[s] for s in self.out_slots])


def _compiled_replay(plan):
    """``backend.compile_plan(plan)`` when every kernel call of the plan is on one device whose
    backend offers one (a callable taking the inputs, as ``Plan.run``), else False."""
    devices = {st.device for st in plan.steps if st.multi != HOST}
    if len(devices) != 1:
        return False
    from .backends import get_backend

    make = getattr(get_backend(devices.pop()), "compile_plan", None)
    fast = make(plan) if make is not None else None
    return fast if fast is not None else False


# ---- argument trees ---------------------------------------------------------------------------

_NO_ITEMS = ("dict", ())   # flatten({}): the key part of every call without keyword arguments


def flatten(obj, leaves: list):
    """(structure key, appended tensor leaves): tensors anywhere in tuples/lists/dicts become
    leaves; everything else is part of the key (must be hashable or repr-able)."""
    if isinstance(obj, Tensor):
        leaves.append(obj)
        return ("T", obj.shape, obj.dtype.name, obj.device)
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple([flatten(v, leaves) for v in obj]))
    if isinstance(obj, dict):
        return ("dict", tuple([(k, flatten(v, leaves)) for k, v in obj.items()])) if obj else _NO_ITEMS
    try:
        hash(obj)
        return ("V", obj)
    except TypeError:
        return ("R", type(obj).__name__, repr(obj))


def out_structure(obj):
    """The shape of a return value: tensors are positions in the flat output list."""
    if isinstance(obj, Tensor):
        return "T"
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(out_structure(v) for v in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((k, out_structure(v)) for k, v in obj.items()))
    return ("V", obj)


def out_leaves(obj, leaves: list) -> list:
    if isinstance(obj, Tensor):
        leaves.append(obj)
    elif isinstance(obj, (tuple, list)):
        for v in obj:
            out_leaves(v, leaves)
    elif isinstance(obj, dict):
        for v in obj.values():
            out_leaves(v, leaves)
    return leaves


def unflatten(tree, flat: list):
    # (a module-level builder, not a recursive closure: a closure that refers to itself is a
    # reference cycle, and it held every output, GPU buffers included, until the next gc)
    return _build(tree, iter(flat))


def _build(t, it):
    if t == "T":
        return next(it)
    kind = t[0]
    if kind == "V":
        return t[1]
    if kind == "dict":
        return {k: _build(v, it) for k, v in t[1]}
    items = [_build(v, it) for v in t[1]]
    return tuple(items) if kind == "tuple" else items


# ---- ember.compile -----------------------------------------------------------------------------

class Compiled:
    """A function (or module) that records an execution plan on its first call for each input
    signature and replays it on later calls. See ``ember.compile``."""

    def __init__(self, fn: Callable, *, max_plans: int = 8, explain: bool = False):
        self.fn = fn
        self.max_plans = max_plans
        self.explain = explain
        self.plans: OrderedDict = OrderedDict()   # signature -> Plan, or a str reason (eager)
        self._stats = {"calls": 0, "replays": 0, "captures": 0, "eager_calls": 0}
        self._mutable: dict = {}     # id -> weakref of tensors the function updates in place
        self._retries: dict = {}
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args, **kwargs):
        stats = self._stats
        stats["calls"] += 1
        if _active[0] is not None:   # inside someone else's capture: just record into it
            return self.fn(*args, **kwargs)
        # The default device and grad mode are part of the signature: creation ops inside fn
        # land on that device; with grad mode on and parameters that require grad, fn records
        # gradients, which a plan does not (that signature runs eagerly).
        if not kwargs:
            # The usual call, tensors only: the key ``flatten`` would build, made directly (this
            # is per-call Python of every replay).
            sig = []
            for a in args:
                if a.__class__ is not Tensor:
                    break
                sig.append(("T", a.shape, a.dtype.name, a.device))
            else:
                key = (("tuple", tuple(sig)), _NO_ITEMS, _DEFAULT_DEVICE[0], _GRAD_MODE[0])
                plans = self.plans
                plan = plans.get(key)
                if plan.__class__ is Plan:
                    if len(plans) > 1:
                        plans.move_to_end(key)
                    stats["replays"] += 1
                    return plan.run(list(args))
        leaves: list = []
        key = (flatten(args, leaves), flatten(kwargs, leaves) if kwargs else _NO_ITEMS, _default_device(),
               _grad_mode())
        try:
            plan = self.plans.get(key)
        except TypeError:   # an unhashable argument: cannot key a plan on it
            stats["eager_calls"] += 1
            return self.fn(*args, **kwargs)
        if isinstance(plan, Plan):
            self.plans.move_to_end(key)
            stats["replays"] += 1
            return plan.run(leaves)
        if plan is not None:   # known to be data-dependent: eager
            self._stats["eager_calls"] += 1
            return self.fn(*args, **kwargs)
        return self._capture(key, leaves, args, kwargs)

    def _capture(self, key, leaves, args, kwargs):
        cap = Capture(leaves, self._mutable).start()
        try:
            result = self.fn(*args, **kwargs)
        finally:
            cap.stop()
        self._stats["captures"] += 1
        if cap.reason is None:
            from .autograd import has_live_graph

            if any(has_live_graph(t) for t in out_leaves(result, [])):
                cap.reason = ("an output requires grad and carries its autograd graph (the caller runs "
                              "backward): a plan returns no graph; compile the whole training step "
                              "(forward, loss.backward(), optimizer.step()) or run under ember.no_grad()")
        if cap.reason is None and cap.retry:
            # a tensor was updated in place after constant folding had read it (BatchNorm's
            # running statistics): capture once more with it as a variable
            for t in cap.retry:
                self._mutable[id(t)] = weakref.ref(t)
            n = self._retries[key] = self._retries.get(key, 0) + 1
            if n < 3:
                return result
            cap.reason = "tensors updated in place keep changing between captures"
        if cap.reason is None:
            outs = out_leaves(result, [])
            entry: Any = cap.plan(outs, out_structure(result))
            if self.explain:
                print(f"ember.compile: {getattr(self.fn, '__name__', self.fn)!r}: recorded a plan of "
                      f"{len(entry)} kernel calls for {_show_key(key)}")
        else:
            entry = cap.reason
            if self.explain:
                print(f"ember.compile: {getattr(self.fn, '__name__', self.fn)!r} runs eagerly for "
                      f"{_show_key(key)}: {cap.reason}")
        self.plans[key] = entry
        while len(self.plans) > self.max_plans:
            self.plans.popitem(last=False)
        return result

    def stats(self) -> dict:
        """Calls, replays, captures and eager calls so far; ``plans``: how many signatures have a
        plan; ``eager``: {signature: why it runs eagerly}; ``kernel_calls``: per plan."""
        out = dict(self._stats)
        out["plans"] = sum(1 for p in self.plans.values() if isinstance(p, Plan))
        out["eager"] = {_show_key(k): v.split("\n")[0] for k, v in self.plans.items() if isinstance(v, str)}
        out["kernel_calls"] = [len(p) for p in self.plans.values() if isinstance(p, Plan)]
        return out

    def plan_for(self, *args, **kwargs):
        """The Plan recorded for these arguments' signature (None if none)."""
        leaves: list = []
        p = self.plans.get((flatten(args, leaves), flatten(kwargs, leaves), _default_device(), _grad_mode()))
        return p if isinstance(p, Plan) else None

    def clear(self) -> None:
        """Forget every plan (e.g. after loading new weights into the module)."""
        self.plans.clear()


def _grad_mode() -> bool:
    return _is_grad_enabled()


def _default_device() -> str:
    return _backend_default_device()


def _show_key(key) -> str:
    shapes = []

    def walk(k):
        if isinstance(k, tuple) and k and k[0] == "T":
            shapes.append(f"{k[2]}{list(k[1])}@{k[3]}")
        elif isinstance(k, tuple):
            for v in k:
                walk(v)
    walk(key)
    return "inputs " + ", ".join(shapes) if shapes else "no tensor inputs"


def compile(fn: Callable = None, *, max_plans: int = 8, explain: bool = False):  # noqa: A001
    """Capture ``fn`` (a function or an ``ember.nn.Module``) once per input signature and replay
    the recorded kernel calls afterwards (see ``ember.plan``). Usable as ``@ember.compile`` or
    ``ember.compile(model, explain=True)``. ``max_plans`` bounds the signatures kept (least
    recently used dropped). The result has ``stats()``, ``plan_for(*args)`` and ``clear()``.

    Plans hold the model's weights by reference: after loading new weights into a module call
    ``compiled.clear()``. Run modules in eval mode (a plan replays kernels, not Python).

    >>> import ember
    >>> @ember.compile
    ... def f(x, y):
    ...     return ember.relu(x @ y)
    >>> f(ember.ones((2, 3)), ember.ones((3, 2))).tolist()
    [[3.0, 3.0], [3.0, 3.0]]
    """
    if fn is None:
        return lambda f: Compiled(f, max_plans=max_plans, explain=explain)
    return Compiled(fn, max_plans=max_plans, explain=explain)
