"""``Module``: the base of every ember.nn layer and model, with PyTorch's naming rules.

A Module holds parameters (every Tensor assigned as an attribute), buffers
(``register_buffer``) and submodules (every Module assigned as an attribute). ``state_dict()``
names them exactly like PyTorch (``features.0.weight``, ``bn.running_mean``...), so a PyTorch
checkpoint or safetensors file loads with ``load_state_dict`` and no renaming.

Parameters created by ember's layers (and ``nn.Parameter``) require grad, as in PyTorch, so
``loss.backward()`` fills their ``.grad``; ``train()``/``eval()`` switch Dropout and BatchNorm
between training and inference behaviour and do not change ``requires_grad`` (run inference
under ``ember.no_grad()``, or load with ``assign=True``, which keeps the loaded tensors as they
are, so that nothing is recorded).

>>> import ember
>>> from ember import nn
>>> class Tiny(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.fc = nn.Linear(2, 1)
...         self.register_buffer("scale", ember.tensor([2.0]))
...     def forward(self, x):
...         return self.fc(x) * self.scale
>>> m = Tiny()
>>> list(m.state_dict())
['scale', 'fc.weight', 'fc.bias']
>>> m.load_state_dict({"scale": ember.tensor([2.0]), "fc.weight": ember.tensor([[1.0, 1.0]]),
...                    "fc.bias": ember.tensor([0.5])})
IncompatibleKeys(missing_keys=[], unexpected_keys=[])
>>> m(ember.tensor([[1.0, 2.0]])).tolist()
[[7.0]]
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from .. import dtypes as _dt
from ..errors import WeightsError
from ..tensor import Tensor

__all__ = ["Module", "Parameter", "IncompatibleKeys"]


def Parameter(data: Tensor, requires_grad: bool = True) -> Tensor:
    """A leaf tensor over ``data``'s buffer (no copy) that requires grad (floating-point data
    only), as ``torch.nn.Parameter``. In ember every Tensor attribute of a Module is a
    parameter; this marks it trainable.

    >>> import ember
    >>> from ember import nn
    >>> p = nn.Parameter(ember.zeros((2,)))
    >>> p.shape, p.requires_grad
    ((2,), True)
    """
    if not isinstance(data, Tensor):
        raise TypeError(f"Parameter: expected an ember Tensor, got {type(data).__name__}")
    t = data.detach()
    return t.requires_grad_() if requires_grad and t.dtype.kind == "f" else t


class IncompatibleKeys(NamedTuple):
    """What ``load_state_dict(..., strict=False)`` could not match (as in PyTorch)."""

    missing_keys: list
    unexpected_keys: list


_LIST_LIMIT = 40  # keys shown per category in a load_state_dict error


def _show(keys) -> str:
    keys = list(keys)
    more = f", ... and {len(keys) - _LIST_LIMIT} more" if len(keys) > _LIST_LIMIT else ""
    return ", ".join(keys[:_LIST_LIMIT]) + more


def _shape_in(state_dict: Mapping, key: str):
    """The shape of ``state_dict[key]`` without reading data where the mapping can tell
    (a lazy safetensors file); None when the value is not a Tensor."""
    shape = getattr(state_dict, "shape", None)
    if callable(shape):
        return tuple(shape(key))
    v = state_dict[key]
    return v.shape if isinstance(v, Tensor) else None


# [callable or None]: called with each module whose construction starts (ember.records bounds
# how many modules a file's constructor arguments may build while it loads one).
ON_CONSTRUCT: list = [None]


def _recording(init):
    import functools

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        d = self.__dict__
        if "_init_args" not in d:
            d["_init_args"] = (args, kwargs)
            if ON_CONSTRUCT[0] is not None:
                ON_CONSTRUCT[0](self)
        init(self, *args, **kwargs)
    __init__._records_args = True
    return __init__


class Module:
    """Base class of layers and models: subclass it, assign layers/tensors in ``__init__`` (after
    ``super().__init__()``) and define ``forward``. Calling the module calls ``forward``."""

    training: bool

    def __init_subclass__(cls, **kwargs) -> None:
        # Each subclass's own __init__ records the arguments of the outermost constructor call
        # (``self._init_args``): ``ember.save`` writes them, so ``ember.load`` rebuilds the model
        # without its constructor call (see ``ember.records``).
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not hasattr(init, "_records_args"):
            cls.__init__ = _recording(init)

    def __init__(self) -> None:
        d = self.__dict__
        d["_parameters"] = {}   # name -> Tensor | None (None: registered but absent, like bias=False)
        d["_buffers"] = {}      # name -> Tensor | None
        d["_non_persistent"] = set()
        d["_modules"] = {}      # name -> Module | None
        d["training"] = True

    # ---- registration ------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        d = self.__dict__
        params = d.get("_parameters")
        if params is None:
            raise AttributeError(f"cannot assign {name!r} on {type(self).__name__} before Module.__init__(); "
                                 f"call super().__init__() first")
        buffers, modules = d["_buffers"], d["_modules"]
        if isinstance(value, Tensor):
            if name in buffers:
                buffers[name] = value
                return
            self._forget(name)
            params[name] = value
        elif isinstance(value, Module):
            self._forget(name)
            modules[name] = value
        elif value is None and (name in params or name in buffers or name in modules):
            (params if name in params else buffers if name in buffers else modules)[name] = None
        else:
            if name in params or name in buffers or name in modules:
                raise TypeError(f"cannot assign a {type(value).__name__} to {name!r} of {type(self).__name__}: "
                                f"it is a registered tensor/module (assign a Tensor, a Module or None)")
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):
        # Only reached when normal lookup fails: parameters, buffers and submodules live in dicts.
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            s = d.get(store)
            if s is not None and name in s:
                return s[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        if not self._forget(name):
            object.__delattr__(self, name)

    def _forget(self, name: str) -> bool:
        found = False
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                found = True
        self._non_persistent.discard(name)
        self.__dict__.pop(name, None)
        return found

    def register_parameter(self, name: str, param: Tensor | None) -> None:
        """Register ``param`` under ``name`` (None: a parameter slot that is absent, e.g. a bias
        turned off; it is not in the state_dict)."""
        if param is not None and not isinstance(param, Tensor):
            raise TypeError(f"register_parameter {name!r}: expected a Tensor or None, got {type(param).__name__}")
        self._forget(name)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Register a non-parameter tensor (running statistics, constants). Persistent buffers are
        in the state_dict; ``persistent=False`` ones are not."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer {name!r}: expected a Tensor or None, got {type(tensor).__name__}")
        self._forget(name)
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: "Module | None") -> None:
        """Register ``module`` as the submodule ``name`` (what attribute assignment does)."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module {name!r}: expected a Module or None, got {type(module).__name__}")
        self._forget(name)
        self._modules[name] = module

    register_module = add_module

    # ---- traversal -----------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator["Module"]:
        for _, m in self.named_children():
            yield m

    def named_modules(self, prefix: str = "", _seen=None) -> Iterator[tuple[str, "Module"]]:
        """This module and every submodule, depth first, each once (shared modules included once)."""
        seen = set() if _seen is None else _seen
        if id(self) in seen:
            return
        seen.add(id(self))
        yield prefix, self
        for name, m in self.named_children():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name, seen)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def _named_tensors(self, store: str, recurse: bool) -> Iterator[tuple[str, Tensor]]:
        seen = set()
        mods = self.named_modules() if recurse else [("", self)]
        for prefix, m in mods:
            for name, t in getattr(m, store).items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{prefix}.{name}" if prefix else name), t

    def named_parameters(self, recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        """``(dotted name, tensor)`` of every parameter (each tensor once)."""
        return self._named_tensors("_parameters", recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, t in self.named_parameters(recurse):
            yield t

    def named_buffers(self, recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        """``(dotted name, tensor)`` of every buffer, persistent or not."""
        return self._named_tensors("_buffers", recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, t in self.named_buffers(recurse):
            yield t

    def _state_slots(self, prefix: str = "") -> Iterator[tuple[str, "Module", str, str]]:
        """(key, owner module, store, attribute) of every state_dict entry, in PyTorch's order:
        a module's parameters, then its persistent buffers, then its children's entries."""
        for name, t in self._parameters.items():
            if t is not None:
                yield prefix + name, self, "_parameters", name
        for name, t in self._buffers.items():
            if t is not None and name not in self._non_persistent:
                yield prefix + name, self, "_buffers", name
        for name, m in self.named_children():
            yield from m._state_slots(f"{prefix}{name}.")

    # ---- state_dict ------------------------------------------------------------------------------
    def state_dict(self, prefix: str = "") -> dict:
        """``{dotted name: Tensor}`` of parameters and persistent buffers, named and ordered like
        PyTorch's ``state_dict()`` (a shared module appears under each of its names)."""
        return {key: getattr(m, store)[attr] for key, m, store, attr in self._state_slots(prefix)}

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, assign: bool = False) -> IncompatibleKeys:
        """Replace parameters and buffers by the tensors of ``state_dict`` (a dict, or the lazy
        mapping ``ember.load_safetensors`` returns; each tensor is read once).

        Every key is checked before anything changes. A shape mismatch always raises; with
        ``strict=True`` (the default) missing and unexpected keys raise too, all listed in one
        ``WeightsError``; with ``strict=False`` they are returned as ``IncompatibleKeys``.

        Loaded tensors take the dtype and device of the tensor they replace (a float16 model
        loading a float32 file casts to float16, as PyTorch's copy does); with ``assign=True``
        they are kept as loaded (their own dtype and device).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"load_state_dict: expected a mapping of name -> Tensor, got {type(state_dict).__name__}")
        slots = list(self._state_slots())
        expected = {key for key, *_ in slots}
        missing = [key for key, *_ in slots if key not in state_dict]
        unexpected = [key for key in state_dict if key not in expected]
        mismatched = []
        for key, m, store, attr in slots:
            if key in state_dict:
                want = getattr(m, store)[attr].shape
                got = _shape_in(state_dict, key)
                if got != want:
                    shown = "not a tensor" if got is None else f"state_dict has {got}"
                    mismatched.append(f"{key}: model expects {want}, {shown}")
        if mismatched or (strict and (missing or unexpected)):
            lines = [f"load_state_dict: the state_dict does not match {type(self).__name__}:"]
            if missing:
                lines.append(f"  missing keys ({len(missing)}): {_show(missing)}")
            if unexpected:
                lines.append(f"  unexpected keys ({len(unexpected)}): {_show(unexpected)}")
            if mismatched:
                lines.append(f"  shape mismatches ({len(mismatched)}): {_show(mismatched)}")
            if not mismatched:
                lines.append("  (pass strict=False to load the matching keys only)")
            raise WeightsError("\n".join(lines))
        from ..autograd import no_grad

        new = []
        with no_grad():
            for key, m, store, attr in slots:
                if key in state_dict:
                    t = state_dict[key]
                    if not assign:
                        old = getattr(m, store)[attr]
                        t = t.to(old.device if t.device != old.device else None,
                                 old.dtype if t.dtype != old.dtype else None)
                    new.append((m, store, attr, t))
        for m, store, attr, t in new:  # all read and converted: now commit
            old = getattr(m, store)[attr]
            if not assign and ((old.requires_grad and old.is_leaf) or store == "_buffers"):
                # a trainable parameter keeps its identity (optimizers hold it), as copy_; so does
                # a buffer (BatchNorm updates its statistics in place: never the caller's tensor)
                old._set_(t)
            else:
                getattr(m, store)[attr] = t
        return IncompatibleKeys(missing, unexpected)

    # ---- device, dtype, mode ---------------------------------------------------------------------
    def to(self, device: str | None = None, dtype=None) -> "Module":
        """Move every parameter and buffer to ``device`` and/or cast the floating-point ones to
        ``dtype`` (integer buffers such as ``num_batches_tracked`` keep their dtype). In place;
        returns self. ``m.to(ember.float16)`` also works."""
        if isinstance(device, _dt.DType):
            device, dtype = None, device
        from ..autograd import no_grad

        dt = _dt.get(dtype) if dtype is not None else None
        with no_grad():
            for m in self.modules():
                for store in (m._parameters, m._buffers):
                    for name, t in store.items():
                        if t is not None:
                            cast = dt if dt is not None and t.dtype.kind == "f" and t.dtype is not dt else None
                            moved = t.to(device if device != t.device else None, cast)
                            if moved is not t and t.requires_grad:
                                moved = moved.detach().requires_grad_()   # still a trainable leaf
                            store[name] = moved
        return self

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """Set ``requires_grad`` on every floating-point parameter (freeze with False); returns
        self."""
        for p in self.parameters():
            if p.dtype.kind == "f" and p.is_leaf:
                p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the parameters' gradients (``set_to_none=False``: zeros instead)."""
        from ..ops import zeros_like
        for p in self.parameters():
            if p.grad is not None:
                p.grad = None if set_to_none else zeros_like(p.grad)

    def train(self, mode: bool = True) -> "Module":
        """Set the ``training`` flag here and in every submodule: Dropout drops and BatchNorm
        uses (and updates) batch statistics while it is set. ``requires_grad`` is unchanged.
        Returns self."""
        for m in self.modules():
            m.__dict__["training"] = bool(mode)
        return self

    def eval(self) -> "Module":
        """``train(False)``; returns self."""
        return self.train(False)

    # ---- calling and printing --------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward(); define it in the subclass")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's repr (its constructor arguments)."""
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        kids = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self.named_children()]
        if not kids:
            return f"{type(self).__name__}({extra})"
        body = ([extra] if extra else []) + kids
        return f"{type(self).__name__}(\n  " + "\n  ".join(body) + "\n)"

    def __dir__(self):
        return sorted(set(object.__dir__(self)) | set(self._parameters) | set(self._buffers) | set(self._modules))
