"""Optimizers with PyTorch's update rules, argument names and ``state_dict`` layout.

An optimizer holds the parameter tensors it was given; ``step()`` computes each new value from
``p.grad`` with ordinary (unrecorded) ops and swaps it into the parameter (``Tensor._set_``), so
the model, the optimizer and any compiled plan keep pointing at the same parameter objects. On
WebGPU a float32 parameter's whole update is ONE kernel (``ember.webgpu.optim``: the parameter,
its gradient and the state buffers in one dispatch, the state updated in place); elsewhere, and
for what that kernel does not cover, the update is the ordinary ops below (``_update``, the
reference rule), which WebGPU's lazy fusion runs as one kernel per state tensor and parameter.

>>> import ember
>>> w = ember.tensor([1.0, 2.0], requires_grad=True)
>>> opt = ember.optim.SGD([w], lr=0.1, momentum=0.9)
>>> (w * w).sum().backward()
>>> opt.step()
>>> [round(v, 4) for v in w.tolist()]
[0.8, 1.6]
"""
from __future__ import annotations

import math

from ..autograd import enable_grad, no_grad
from ..plan import host_step
from ..registry import CAPTURE as _CAPTURE
from ..tensor import Tensor

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]


class _Required:
    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


class Optimizer:
    """Base class: ``param_groups`` (list of dicts with ``"params"`` and the hyperparameters),
    ``state`` (per parameter), ``zero_grad``, ``step`` and ``state_dict`` / ``load_state_dict``."""

    def __init__(self, params, defaults: dict) -> None:
        self.defaults = dict(defaults)
        self.state: dict = {}
        self.param_groups: list = []
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            "but got a Tensor")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, param_group: dict) -> None:
        group = dict(param_group)
        ps = group["params"]
        group["params"] = [ps] if isinstance(ps, Tensor) else list(ps)
        for p in group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, got {type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        for k, v in self.defaults.items():
            if v is required and k not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {k}")
            group.setdefault(k, v)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in group["params"]):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    @host_step
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget every parameter's gradient (``set_to_none=False``: zeros instead)."""
        from ..ops import zeros_like
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.grad = None if set_to_none else zeros_like(p.grad)

    def step(self, closure=None):
        """One update of every parameter that has a gradient. ``closure`` (re-evaluates the
        model and returns the loss) is called first, with recording on, when given.

        Inside ``ember.compile`` the step is a host step: every replay calls it again (see
        ``ember.plan``), after the replayed backward has stored the gradients."""
        cap = _CAPTURE[0]
        if cap is not None:
            if closure is not None:
                cap.fail("optimizer.step(closure) while capturing: compile the closure's work and call "
                         "step() without one")
            return cap.host_call(self._step, (closure,), {})
        return self._step(closure)

    def _step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        lazy = []
        with no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        st = self.state.setdefault(p, {})
                        # (while ember.compile captures, the ops path: a plan replays registry kernels)
                        new = (self._fused(p, p.grad, st, group)
                               if p.device in _FUSED_DEVICES and _CAPTURE[0] is None else None)
                        if new is not None:
                            p._set_(new)
                            continue
                        p._set_(self._update(p, p.grad, st, group))
                        if p.device == "webgpu":
                            lazy.extend(v for v in st.values() if isinstance(v, Tensor))
                            lazy.append(p)
        if lazy:
            # WebGPU records elementwise ops lazily: run each parameter's update now (the state
            # first, then the parameter reading it: one fused kernel each) instead of letting
            # the next step's expressions grow over this one's
            import ember.webgpu
            ember.webgpu.evaluate(*lazy)
        return loss

    def _update(self, p, g, state, group):  # pragma: no cover - subclasses
        raise NotImplementedError

    def _fused(self, p, g, state, group):
        """The new value of webgpu / numpy parameter ``p`` from one fused kernel
        (``ember.webgpu.optim``, ``ember.backends.numpy_optim``), or None to take the reference
        ``_update``."""
        return None

    # ---- state_dict: PyTorch's layout (parameters numbered across groups in order) --------------
    def state_dict(self) -> dict:
        index, groups, n = {}, [], 0
        for g in self.param_groups:
            ids = []
            for p in g["params"]:
                index.setdefault(id(p), n)
                ids.append(index[id(p)])
                n += 1
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": ids})
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        params = []
        for mine, saved in zip(self.param_groups, groups):
            if len(mine["params"]) != len(saved["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                                 "optimizer's group")
            params.extend(zip(saved["params"], mine["params"]))
        by_index = dict(params)
        self.state = {}
        for k, s in state_dict["state"].items():
            p = by_index[int(k)]
            self.state[p] = {name: (v.to(p.device, p.dtype if v.dtype.kind == "f" else None)
                                    if isinstance(v, Tensor) else v) for name, v in s.items()}
        for mine, saved in zip(self.param_groups, groups):
            for k, v in saved.items():
                if k != "params":
                    mine[k] = tuple(v) if isinstance(v, list) and k == "betas" else v

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, g in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines.extend(f"    {k}: {v}" for k, v in sorted(g.items()) if k != "params")
        return "\n".join(lines + [")"])


# The fused webgpu step (tests switch it off to compare with the reference ops on the same GPU).
_FUSED = [True]
# devices whose parameters take ``_fused`` first (numpy: the same rule in a few numpy calls)
_FUSED_DEVICES = ("webgpu", "numpy")


def _fused_module(p):
    if p.device == "numpy":
        from ..backends import numpy_optim
        return numpy_optim
    from ember.webgpu import optim
    return optim


def _check(name, value, low=0.0):
    if value < low:
        raise ValueError(f"Invalid {name}: {value}")


class SGD(Optimizer):
    """Stochastic gradient descent with PyTorch's momentum, dampening, Nesterov momentum,
    (coupled) weight decay and ``maximize``::

        g = grad (+ weight_decay * p);  buf = momentum * buf + (1 - dampening) * g (buf = g at first)
        g = g + momentum * buf (nesterov) or buf;  p = p - lr * g
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 foreach=None, differentiable: bool = False, fused=None) -> None:
        _check("learning rate", lr)
        _check("momentum value", momentum)
        _check("weight_decay value", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def _update(self, p, g, state, group):
        if group["maximize"]:
            g = -g
        if group["weight_decay"]:
            g = g + p * group["weight_decay"]
        mom = group["momentum"]
        if mom:
            buf = state.get("momentum_buffer")
            buf = g if buf is None else buf * mom + g * (1.0 - group["dampening"])
            state["momentum_buffer"] = buf
            g = g + buf * mom if group["nesterov"] else buf
        return p - g * group["lr"]

    def _fused(self, p, g, state, group):
        if not _FUSED[0]:
            return None
        return _fused_module(p).sgd_step(p, g, state, group)


class Adam(Optimizer):
    """Adam (``amsgrad``, coupled ``weight_decay``, ``maximize``) with PyTorch's exact update:

        m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
        p = p - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)
    """

    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 amsgrad: bool = False, *, foreach=None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused=None, decoupled_weight_decay: bool = False) -> None:
        _check("learning rate", lr)
        _check("epsilon value", eps)
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {b}")
        _check("weight_decay value", weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize,
                                      decoupled_weight_decay=decoupled_weight_decay or self._decoupled))

    def _update(self, p, g, state, group):
        from ..ops import maximum, zeros_like

        if group["maximize"]:
            g = -g
        lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if not state:
            state["step"] = 0.0
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = zeros_like(p)
        state["step"] += 1.0
        t = state["step"]
        if wd:
            if group["decoupled_weight_decay"]:
                p = p * (1.0 - lr * wd)
            else:
                g = g + p * wd
        m = state["exp_avg"]
        m = m + (g - m) * (1.0 - b1)                              # torch's lerp_
        v = state["exp_avg_sq"] * b2 + g * g * (1.0 - b2)
        state["exp_avg"], state["exp_avg_sq"] = m, v
        step_size = lr / (1.0 - b1 ** t)
        bc2_sqrt = math.sqrt(1.0 - b2 ** t)
        if group["amsgrad"]:
            v = maximum(state["max_exp_avg_sq"], v)
            state["max_exp_avg_sq"] = v
        denom = v.sqrt() / bc2_sqrt + eps
        return p - m / denom * step_size

    def _fused(self, p, g, state, group):
        if not _FUSED[0]:
            return None
        return _fused_module(p).adam_step(p, g, state, group)


class AdamW(Adam):
    """Adam with decoupled weight decay (``p = p * (1 - lr * weight_decay)`` before the Adam
    step; default ``weight_decay=1e-2``), as ``torch.optim.AdamW``."""

    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 amsgrad: bool = False, *, maximize: bool = False, foreach=None, capturable: bool = False,
                 differentiable: bool = False, fused=None) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, decoupled_weight_decay=True)
