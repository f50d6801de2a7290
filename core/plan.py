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
"""
from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from typing import Any, Callable

# The active capture (one at a time): registry.apply and Tensor reads look at it.
from .registry import CAPTURE as _active


# Ops that must run on every replay even when their inputs are constant (none yet: random
# ops, once they exist, go here).
NOT_FOLDED: set = set()


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
        metas = self.meta if self.multi else (self.meta,)
        shown = ", ".join(f"{m.dtype.name}{list(m.shape)}" for m in metas)
        return f"{self.outs} = {self.name}{tuple(self.ins)} -> {shown} on {self.device}"


class Capture:
    """Records the kernel calls made between ``start()`` and ``stop()``.

    Tensors are tracked by id through weak references: an intermediate dies as soon as eager
    code drops it (capturing costs no more memory than running), and its id, if reused, gets a
    fresh slot. Tensors made outside the capture (weights) and constant-folded results that a
    recorded step or an output uses are held strongly: the plan needs them."""

    def __init__(self, inputs):
        self.steps: list = []
        self.slot: dict = {}          # id(tensor) -> slot, for tensors alive now
        self.refs: dict = {}          # id(tensor) -> weakref whose callback forgets the id
        self.tainted: set = set()     # slots whose values derive from the inputs
        self.consts: list = []        # (slot, tensor) the plan holds: weights, folded values
        self.const_slots: set = set()
        self.folded: set = set()      # slots of constant-folded results (held only if used)
        self.inputs = list(inputs)
        self.n = 0
        self.reason = None            # why the capture cannot become a plan
        for t in inputs:
            self._new(t, tainted=True)
        self.n_inputs = self.n

    def _new(self, t, tainted=False) -> int:
        s = self.n
        self.n += 1
        i = id(t)
        self.slot[i] = s

        def forget(ref, i=i, s=s):
            if self.slot.get(i) == s:
                del self.slot[i]
            if self.refs.get(i) is ref:
                del self.refs[i]
        self.refs[i] = weakref.ref(t, forget)
        if tainted:
            self.tainted.add(s)
        return s

    def _slot_of(self, t, use: bool = True) -> int:
        """The slot of ``t``; ``use``: a recorded step (or the result) reads it, so a constant
        must be held by the plan."""
        s = self.slot.get(id(t))
        if s is None:   # made outside the capture (a weight, a constant): held by reference
            s = self._new(t)
            self.consts.append((s, t))
            self.const_slots.add(s)
        elif use and s in self.folded and s not in self.const_slots:
            self.consts.append((s, t))
            self.const_slots.add(s)
        return s

    def record(self, name, kernel, inputs, meta, attrs, outputs, multi) -> None:
        if self.reason is None and _grad_mode() and any(t._ag is not None for t in inputs):
            self.reason = (f"{name}: a tensor that requires grad is used with grad mode on, and a plan "
                           f"replays inference only (no gradients); run under ember.no_grad() to "
                           f"compile it")
        taint = False
        for t in inputs:
            s = self.slot.get(id(t))
            if s is not None and s in self.tainted:
                taint = True
                break
        if not taint and name not in NOT_FOLDED:
            # Constant folding: inputs are all constants (weights, scalars, creation ops), so
            # the output is the same on every call: keep the value computed now (e.g. a
            # weight's transpose) instead of recomputing it on each replay.
            for t in inputs:
                self._slot_of(t, use=False)
            for t in outputs:
                self.folded.add(self._new(t))
            return
        ins = tuple(self._slot_of(t) for t in inputs)
        outs = tuple(self._new(t, True) for t in outputs)
        dev = outputs[0].device if outputs else (inputs[0].device if inputs else None)
        self.steps.append(Step(kernel, name, ins, outs, meta, attrs, dev, multi))

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

    def __len__(self) -> int:
        return len(self.steps)

    def __repr__(self) -> str:
        head = f"Plan({len(self.steps)} kernel calls, {self.n_inputs} inputs, {len(self.consts)} constants)"
        return "\n".join([head] + [f"  {s!r}" for s in self.steps])

    def kernels(self) -> dict:
        """{op name: number of kernel calls}."""
        out: dict = {}
        for st in self.steps:
            out[st.name] = out.get(st.name, 0) + 1
        return out

    def run(self, inputs):
        from .tensor import Tensor

        wrap = Tensor._wrap
        vals = [None] * self.n_slots
        vals[:self.n_inputs] = inputs
        for s, t in self.consts:
            vals[s] = t
        for kernel, ins, out, meta, attrs, dev, multi, free in self._program:
            if multi:
                bufs = kernel(meta, *[vals[i] for i in ins], **attrs)
                for s, b, m in zip(out, bufs, meta):
                    vals[s] = wrap(b, m.shape, m.dtype, dev)
            else:
                vals[out] = wrap(kernel(meta, *[vals[i] for i in ins], **attrs), meta.shape, meta.dtype, dev)
            for s in free:
                vals[s] = None
        return unflatten(self.out_tree, [vals[s] for s in self.out_slots])


# ---- argument trees ---------------------------------------------------------------------------

def flatten(obj, leaves: list):
    """(structure key, appended tensor leaves): tensors anywhere in tuples/lists/dicts become
    leaves; everything else is part of the key (must be hashable or repr-able)."""
    from .tensor import Tensor

    if isinstance(obj, Tensor):
        leaves.append(obj)
        return ("T", obj.shape, obj.dtype.name, obj.device)
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(flatten(v, leaves) for v in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((k, flatten(v, leaves)) for k, v in obj.items()))
    try:
        hash(obj)
        return ("V", obj)
    except TypeError:
        return ("R", type(obj).__name__, repr(obj))


def out_structure(obj):
    """The shape of a return value: tensors are positions in the flat output list."""
    from .tensor import Tensor

    if isinstance(obj, Tensor):
        return "T"
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, tuple(out_structure(v) for v in obj))
    if isinstance(obj, dict):
        return ("dict", tuple((k, out_structure(v)) for k, v in obj.items()))
    return ("V", obj)


def out_leaves(obj, leaves: list) -> list:
    from .tensor import Tensor

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
    it = iter(flat)

    def build(t):
        if t == "T":
            return next(it)
        kind = t[0]
        if kind == "V":
            return t[1]
        if kind == "dict":
            return {k: build(v) for k, v in t[1]}
        items = [build(v) for v in t[1]]
        return tuple(items) if kind == "tuple" else items
    return build(tree)


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
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args, **kwargs):
        self._stats["calls"] += 1
        if _active[0] is not None:   # inside someone else's capture: just record into it
            return self.fn(*args, **kwargs)
        leaves: list = []
        # The default device and grad mode are part of the signature: creation ops inside fn
        # land on that device; with grad mode on and parameters that require grad, fn records
        # gradients, which a plan does not (that signature runs eagerly).
        key = (flatten(args, leaves), flatten(kwargs, leaves), _default_device(), _grad_mode())
        try:
            plan = self.plans.get(key)
        except TypeError:   # an unhashable argument: cannot key a plan on it
            self._stats["eager_calls"] += 1
            return self.fn(*args, **kwargs)
        if isinstance(plan, Plan):
            self.plans.move_to_end(key)
            self._stats["replays"] += 1
            return plan.run(leaves)
        if plan is not None:   # known to be data-dependent: eager
            self._stats["eager_calls"] += 1
            return self.fn(*args, **kwargs)
        return self._capture(key, leaves, args, kwargs)

    def _capture(self, key, leaves, args, kwargs):
        cap = Capture(leaves).start()
        try:
            result = self.fn(*args, **kwargs)
        finally:
            cap.stop()
        self._stats["captures"] += 1
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
    from .autograd import is_grad_enabled

    return is_grad_enabled()


def _default_device() -> str:
    from .backends import default_device

    return default_device()


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
