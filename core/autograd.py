"""Reverse-mode automatic differentiation, listening at ``registry.apply``.

Nothing is recorded unless an input of an op requires grad: ``apply`` checks one flag
(``registry.GRAD``, true while grad mode is on and some tensor has ever required grad) and only
then looks at its inputs. An op with such an input is handed to ``record``, which runs the op
with recording suspended and attaches a ``Node`` to its floating-point output(s): the op's
gradient rule (``op(..., grad=rule)``), aliases of its inputs (and of its outputs when the rule
says it needs them) and the graph edges. A composite op without a rule of its own is recorded
through its decomposition instead, so its primitives' rules apply. ``Tensor.backward`` walks
the graph once in reverse topological order, running each rule with recording suspended: the
backward pass is made of ordinary ops, so it runs on every backend with the forward kernels.

A rule is ``rule(g, y, *inputs, need, **attrs)``: ``g`` the gradient of the output (a tuple, one
entry per output, ``None`` where no gradient flows, for ops with several outputs), ``y`` the
output (``None`` unless the rule is marked ``@keeps_output``), ``inputs`` the op's inputs,
``need`` one bool per input (does it require grad?) and the op's attributes. It returns one
gradient per input (a tuple; a single Tensor for one input), ``None`` where none is needed or
defined. Gradients with broadcast shapes are summed back with ``sum_to``.

Saved tensors are aliases (new Tensor objects over the same immutable buffers), so an
optimizer that later swaps a parameter's buffer never changes what a pending backward sees.

>>> import ember
>>> x = ember.tensor([1.0, 2.0, 3.0], requires_grad=True)
>>> y = (x * x).sum()
>>> y.backward()
>>> x.grad.tolist()
[2.0, 4.0, 6.0]
>>> with ember.no_grad():
...     z = x * 2
>>> z.requires_grad
False
"""
from __future__ import annotations

import functools

from .errors import EmberError, ShapeError, UnsupportedOp
from .registry import CAPTURE, GRAD, GRAD_HOOK, apply

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "backward", "grad",
           "keeps_output", "sum_to", "AutogradError"]


class AutogradError(EmberError, RuntimeError):
    """A misuse of autodiff: backward of a non-scalar without a gradient, twice through a freed
    graph, requires_grad on an integer tensor..."""


_MODE = [True]      # grad mode (no_grad / enable_grad / set_grad_enabled)
_LIVE = [0]         # Leaf objects alive: tensors that require grad (and graphs hold theirs)
_SUSPEND = [0]      # > 0 while record() runs an op or backward() runs rules


def _refresh() -> None:
    GRAD[0] = _MODE[0] and _LIVE[0] > 0 and not _SUSPEND[0]


def _arm() -> None:
    _refresh()


def is_grad_enabled() -> bool:
    """Whether ops on tensors that require grad are recorded (True outside ``no_grad``)."""
    return _MODE[0]


class _GradMode:
    _value = True

    def __enter__(self):
        self._prev = _MODE[0]
        _MODE[0] = self._value
        _refresh()
        return self

    def __exit__(self, *exc):
        _MODE[0] = self._prev
        _refresh()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with type(self)():
                return fn(*args, **kwargs)
        return wrapped


class no_grad(_GradMode):
    """Context manager and decorator: nothing inside is recorded (inference, optimizer
    updates). Results do not require grad.

    >>> import ember
    >>> w = ember.tensor([1.0], requires_grad=True)
    >>> @ember.no_grad()
    ... def infer(x):
    ...     return x * w
    >>> infer(ember.tensor([3.0])).requires_grad
    False
    """
    _value = False


class enable_grad(_GradMode):
    """Context manager and decorator: record again inside a ``no_grad`` block."""
    _value = True


class set_grad_enabled(_GradMode):
    """``set_grad_enabled(mode)``: switch grad mode now, or for a ``with`` block (the previous
    mode comes back at its end), as in PyTorch."""

    def __init__(self, mode: bool):
        self._value = bool(mode)
        self._prev = _MODE[0]
        _MODE[0] = self._value
        _refresh()

    def __enter__(self):
        return self

    def __call__(self, fn):
        mode = self._value
        _MODE[0] = self._prev
        _refresh()

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)
        return wrapped


# ---- the graph ----------------------------------------------------------------------------------

class Leaf:
    """``_ag`` of a tensor created by the user with requires_grad: holds its ``.grad``.
    Leaves are counted: once the last tensor that requires grad is gone (an inference model
    whose initial parameters were replaced by loaded weights), ``apply`` is back to one flag
    check per op."""

    __slots__ = ("grad",)

    def __init__(self):
        self.grad = None
        _LIVE[0] += 1
        if _LIVE[0] == 1:
            _refresh()

    def __del__(self):
        try:
            _LIVE[0] -= 1
            if _LIVE[0] == 0:
                _refresh()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass


class Node:
    """``_ag`` of a tensor an op produced from inputs that require grad (its ``grad_fn``)."""

    __slots__ = ("name", "rule", "saved", "y", "attrs", "parents", "need", "nout", "retained")

    def __init__(self, name, rule, saved, y, attrs, parents, need, nout):
        self.name = name
        self.rule = rule
        self.saved = saved        # aliases of the inputs (None once the graph is freed)
        self.y = y                # alias(es) of the output(s) when the rule keeps them
        self.attrs = attrs
        self.parents = parents    # the inputs' _ag (Leaf, Node, Out or None)
        self.need = need
        self.nout = nout
        self.retained = None      # [grad] after backward when retain_grad() was called

    @property
    def next_functions(self):
        return tuple(p.node if isinstance(p, Out) else p for p in self.parents)

    def __repr__(self) -> str:
        return f"<{self.name} backward>"


class Out:
    """``_ag`` of output ``index`` of a multi-output op's Node."""

    __slots__ = ("node", "index", "retained")

    def __init__(self, node, index):
        self.node = node
        self.index = index
        self.retained = None

    def __repr__(self) -> str:
        return f"<{self.node.name} backward (output {self.index})>"


def keeps_output(rule):
    """Mark a gradient rule that reads the op's output ``y`` (exp, tanh, softmax...), so record
    saves it. Other rules get ``y=None``: keeping outputs alive would, on WebGPU, stop a matmul
    from fusing the ops that consume it into its epilogue."""
    rule.keeps_output = True
    return rule


def _alias(t):
    a = type(t)._wrap(t._buf, t.shape, t.dtype, t.device)
    if CAPTURE[0] is not None:
        CAPTURE[0].alias(t, a)
    return a


def has_live_graph(t) -> bool:
    """Whether ``t`` carries an autograd graph that a ``backward`` could still run through."""
    ag = getattr(t, "_ag", None)
    node = ag.node if isinstance(ag, Out) else ag
    return isinstance(node, Node) and node.saved is not None


def record(d, inputs, attrs):
    """``registry.apply`` for op ``d`` when an input requires grad (installed as GRAD_HOOK)."""
    rule = d.grad
    if rule is None and d.decompose is not None:
        # a composite without a rule: record its primitives (after checking its own rules)
        d.shape(*[t.shape for t in inputs], **attrs)
        d.dtype(*[t.dtype for t in inputs], **attrs)
        return d.decompose(*inputs, **attrs)
    _SUSPEND[0] += 1
    GRAD[0] = False
    try:
        out = apply(d.name, *inputs, **attrs)
    finally:
        _SUSPEND[0] -= 1
        _refresh()
    if rule is None:
        return out       # not differentiable (comparisons, argmax, integer ops...)
    multi = d.outputs > 1
    outs = out if multi else (out,)
    if not any(o.dtype.kind == "f" for o in outs):
        return out
    keep = getattr(rule, "keeps_output", False)
    y = (tuple(_alias(o) for o in outs) if multi else _alias(out)) if keep else None
    node = Node(d.name, rule, tuple(_alias(t) for t in inputs), y, attrs,
                tuple(t._ag for t in inputs), tuple(t._ag is not None for t in inputs), d.outputs)
    if multi:
        for i, o in enumerate(outs):
            if o.dtype.kind == "f":
                o._ag = Out(node, i)
    else:
        out._ag = node
    return out


GRAD_HOOK[0] = record


def record_move(src, out):
    """``Tensor.to(device)`` of a tensor that requires grad: the gradient moves back."""
    if out.dtype.kind != "f" or src.dtype.kind != "f":
        return out
    dev = src.device
    node = Node("to", lambda g, y, x, need: g.to(dev), (_alias(src),), None, {}, (src._ag,), (True,), 1)
    out._ag = node
    return out


# ---- helpers for rules --------------------------------------------------------------------------

def sum_to(g, shape):
    """``g`` summed over the axes that broadcasting added or stretched, to ``shape``."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    if axes:
        g = apply("sum", g, axes=axes, keepdims=False)
    return g if g.shape == shape else apply("reshape", g, shape=shape)


# ---- backward -----------------------------------------------------------------------------------

def _node_of(ag):
    return ag.node if isinstance(ag, Out) else ag


def _topo(roots):
    """Nodes reachable from ``roots``, each after every node that feeds it a gradient."""
    order, seen = [], set()
    stack = [(r, False) for r in roots]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        for p in n.parents:
            p = _node_of(p)
            if isinstance(p, Node) and id(p) not in seen:
                stack.append((p, False))
    order.reverse()
    return order


def accumulate_grad(leaf, g) -> None:
    """Store ``g`` in ``leaf.grad``, or add it to the gradient already there (backward, and
    the same host step of a compiled training step)."""
    leaf.grad = g if leaf.grad is None else apply("add", leaf.grad, g)


def _add(a, b):
    return b if a is None else apply("add", a, b)


def _fit(g, t_shape, t_dtype, name):
    if g.shape != tuple(t_shape):
        if g.size == 1 and len(t_shape) == 0:
            return apply("reshape", g, shape=())
        raise AutogradError(f"backward of {name}: the gradient rule gave shape {g.shape} for an input of "
                            f"shape {tuple(t_shape)}")
    if g.dtype is not t_dtype:
        g = apply("cast", g, dtype=t_dtype)
    return g


def _run(roots, grads, retain_graph, capture=None):
    """Propagate ``grads`` (one per root ``_ag``) back through the graph. Leaves accumulate into
    ``.grad`` unless ``capture`` (id(_ag) -> None) asks for some gradients to be returned."""
    pending = {}            # id(node) -> grad, or list of grads for a multi-output node
    leaves = {}             # id(leaf) -> [leaf, grad]
    nodes = []

    def send(ag, g):
        if capture is not None and id(ag) in capture:
            capture[id(ag)] = _add(capture[id(ag)], g)
        if isinstance(ag, Leaf):
            if capture is None:
                e = leaves.get(id(ag))
                if e is None:
                    leaves[id(ag)] = [ag, g]
                else:
                    e[1] = _add(e[1], g)
        elif isinstance(ag, Out):
            slot = pending.setdefault(id(ag.node), [None] * ag.node.nout)
            slot[ag.index] = _add(slot[ag.index], g)
            if ag.retained is not None and capture is None:
                ag.retained[0] = _add(ag.retained[0], g)
        elif isinstance(ag, Node):
            pending[id(ag)] = _add(pending.get(id(ag)), g)

    _SUSPEND[0] += 1
    GRAD[0] = False
    try:
        for ag, g in zip(roots, grads):
            send(ag, g)
        for node in _topo([_node_of(r) for r in roots if isinstance(_node_of(r), Node)]):
            g = pending.pop(id(node), None)
            if g is None:
                continue
            if node.saved is None:
                raise AutogradError(f"backward through {node.name} a second time: its saved tensors were freed "
                                    f"by the first backward; pass retain_graph=True to the first call")
            if node.nout == 1 and node.retained is not None and capture is None:
                if CAPTURE[0] is not None:
                    CAPTURE[0].fail("retain_grad() on an intermediate tensor while capturing: a replay makes "
                                    "new intermediate tensors")
                node.retained[0] = _add(node.retained[0], g)
            if node.nout > 1:
                g = tuple(g)
            res = node.rule(g, node.y, *node.saved, need=node.need, **node.attrs)
            if not isinstance(res, (tuple, list)):
                res = (res,)
            if len(res) != len(node.saved):
                raise AutogradError(f"backward of {node.name}: the rule gave {len(res)} gradients for "
                                    f"{len(node.saved)} inputs")
            for p, gi, x, need in zip(node.parents, res, node.saved, node.need):
                if need and gi is not None:
                    send(p, _fit(gi, x.shape, x.dtype, node.name))
            nodes.append(node)
        cap = CAPTURE[0]
        for leaf, g in leaves.values():
            if cap is not None:    # ember.compile: the replay stores the gradient too
                cap.on_grad(leaf, g)
            else:
                accumulate_grad(leaf, g)
    finally:
        _SUSPEND[0] -= 1
        _refresh()
    if not retain_graph:
        for node in nodes:
            node.saved = None
            node.y = None


def _seed(t, gradient):
    from .tensor import Tensor
    from .ops import ones

    if gradient is None:
        if t.size != 1:
            raise AutogradError(f"backward: the tensor has shape {t.shape}; grad can be implicitly created only "
                                f"for a single value; pass gradient= (a tensor of that shape)")
        return ones(t.shape, dtype=t.dtype, device=t.device)
    if not isinstance(gradient, Tensor):
        from .tensor import tensor
        gradient = tensor(gradient, dtype=t.dtype, device=t.device)
    if gradient.shape != t.shape:
        raise ShapeError(f"backward: gradient has shape {gradient.shape} but the tensor has shape {t.shape}")
    return gradient.detach()


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None) -> None:
    """Accumulate d(tensors)/d(leaf) into every leaf's ``.grad`` (PyTorch's
    ``torch.autograd.backward``); ``grad_tensors`` are the upstream gradients (needed for
    non-scalar tensors)."""
    from .tensor import Tensor

    if create_graph:
        raise UnsupportedOp("backward: create_graph=True (higher-order gradients) is not supported")
    if inputs is not None:
        raise UnsupportedOp("backward: inputs= is not supported; use ember.autograd.grad")
    if isinstance(tensors, Tensor):
        tensors = (tensors,)
    tensors = tuple(tensors)
    if grad_tensors is None or isinstance(grad_tensors, Tensor):
        grad_tensors = (grad_tensors,) * len(tensors) if grad_tensors is None else (grad_tensors,)
    roots, seeds = [], []
    for t, g in zip(tensors, grad_tensors):
        if t._ag is None:
            raise AutogradError("backward: the tensor does not require grad and has no grad_fn (was it computed "
                                "under no_grad, or from tensors that do not require grad?)")
        roots.append(t._ag)
        seeds.append(_seed(t, g))
    _run(roots, seeds, bool(retain_graph))


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    """The gradients of ``outputs`` with respect to ``inputs`` (a tuple, one per input), without
    touching any ``.grad`` (PyTorch's ``torch.autograd.grad``).

    >>> import ember
    >>> x = ember.tensor([3.0], requires_grad=True)
    >>> [g.tolist() for g in ember.autograd.grad((x * x).sum(), x)]
    [[6.0]]
    """
    from .tensor import Tensor

    if create_graph:
        raise UnsupportedOp("grad: create_graph=True (higher-order gradients) is not supported")
    outputs = (outputs,) if isinstance(outputs, Tensor) else tuple(outputs)
    single = isinstance(inputs, Tensor)
    inputs = (inputs,) if single else tuple(inputs)
    if grad_outputs is None or isinstance(grad_outputs, Tensor):
        grad_outputs = (grad_outputs,) * len(outputs) if grad_outputs is None else (grad_outputs,)
    for x in inputs:
        if x._ag is None:
            raise AutogradError("grad: an input does not require grad")
    capture = {id(x._ag): None for x in inputs}
    roots, seeds = [], []
    for t, g in zip(outputs, grad_outputs):
        if t._ag is None:
            raise AutogradError("grad: an output does not require grad and has no grad_fn")
        roots.append(t._ag)
        seeds.append(_seed(t, g))
    _run(roots, seeds, bool(retain_graph), capture)
    res = []
    for x in inputs:
        g = capture[id(x._ag)]
        if g is None and not allow_unused:
            raise AutogradError("grad: one of the inputs was not used to compute the outputs "
                                "(pass allow_unused=True to get None for it)")
        res.append(g)
    return tuple(res)
