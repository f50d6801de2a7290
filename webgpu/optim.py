"""Fused optimizer steps on WebGPU: one dispatch per parameter.

``ember.optim`` calls ``sgd_step`` / ``adam_step`` for a float32 webgpu parameter; each records
ONE kernel (``kernels/optim_sgd.wgsl``, ``kernels/optim_adam.wgsl``) that reads the parameter and
its gradient, updates the optimizer state in place and writes the new parameter into a fresh
buffer (swapped into the parameter with ``Tensor._set_``, so tensors sharing the old buffer keep
their values, as everywhere in ember). Hyperparameters are uniforms: one pipeline per rule
serves every shape and setting. The arithmetic is the reference update of
``core/optim/optimizer.py`` op for op, so trajectories match the other backends and PyTorch.

State buffers belong to the optimizer: a state tensor whose storage this module did not allocate
for this parameter's state (loaded with ``load_state_dict``, shared with another optimizer, a
view; ``Storage.owner``) is first copied into one of its own, so an in-place update never shows through another tensor. The functions return
None (the caller then takes the generic path, lazily fused elementwise ops) where the fused
kernel does not apply: other dtypes, tensors over one binding (``maxStorageBufferBindingSize``).
"""
from __future__ import annotations

import math
import struct

from .. import dtypes as _dt
from .driver import grid_1d
from .fusion import GBuf, Node, realize
from .runtime import f32_bits, kernel_source, pack_info, render

WG = 256
_SCRATCH: dict = {}


def _usable(rt, *tensors) -> bool:
    for t in tensors:
        if t.dtype is not _dt.float32 or t.device != "webgpu":
            return False
        if t._buf.size * 4 > rt.max_binding:
            return False
    return True


def _dense_input(t) -> GBuf:
    """``t``'s buffer realised and contiguous from element 0 (a copy when it is a view)."""
    g = realize(t._buf)
    if g.offset == 0 and g.is_contiguous():
        return g
    return realize(GBuf(g.rt, g.shape, g.dtype, expr=Node("leaf", g.dtype, buf=g)))


def _binding(g: GBuf):
    return (g.storage.buf, 0, max(4, g.size * 4))


def _own(rt, t, state: dict, *, fresh: bool):
    """(a dense state tensor for ``t`` that belongs to ``state``, its binding). ``fresh``: the
    kernel writes every element before reading any, so new storage needs no initialisation."""
    from ..tensor import Tensor

    g = t._buf
    if (g.expr is None and g.offset == 0 and g.is_contiguous() and g.dtype is _dt.float32
            and g.storage.owner == id(state)):
        return t, _binding(g)
    st = rt.alloc(g.size * 4, "optimizer state")
    st.owner = id(state)
    new = GBuf(rt, g.shape, _dt.float32, storage=st)
    if not fresh:
        from .fusion import run_into

        run_into(rt, g, st, 0, new.strides)   # one copy, the first time only
    return Tensor._wrap(new, t.shape, t.dtype, "webgpu"), _binding(new)


def _tensor(g: GBuf, like):
    """A webgpu Tensor over buffer ``g`` with ``like``'s shape and dtype."""
    from ..tensor import Tensor

    return Tensor._wrap(g, like.shape, like.dtype, "webgpu")


def _aliased(inputs, state: dict, keys) -> bool:
    """Whether the parameter or gradient shares a buffer with state the kernel writes in place
    (WebGPU refuses such bindings; the generic path handles it)."""
    w = {id(state[k]._buf.storage) for k in keys if state.get(k) is not None and state[k].device == "webgpu"}
    return any(id(g.storage) in w for g in inputs)


def _scratch(rt):
    s = _SCRATCH.get(id(rt))
    if s is None or s[0] is not rt:
        s = _SCRATCH[id(rt)] = (rt, rt.alloc(16, "optimizer scratch"))
    return (s[1].buf, 0, 16)


def _new_param(rt, p, pin: GBuf):
    st = rt.alloc(pin.size * 4)
    return GBuf(rt, pin.shape, _dt.float32, storage=st)


_PIPES: dict = {}
# uniform layout of both kernels: element count, flags, then f32 hyperparameters (8 / 12 words)
_INFO = {"optim_sgd": struct.Struct("<II4f8x"), "optim_adam": struct.Struct("<II8f8x")}


def _launch(rt, name, pout: GBuf, bufs, words) -> None:
    n = pout.size
    key = (id(rt), name)
    hit = _PIPES.get(key)
    if hit is None or hit[0] is not rt:
        pipe = rt.kernel(name, WG=WG, HELPERS=kernel_source("elementwise")) if name == "optim_adam" \
            else rt.kernel(name, WG=WG)
        hit = _PIPES[key] = (rt, pipe)
    try:   # one pack of the whole uniform (the float words as f32)
        info = _INFO[name].pack(*words)
    except (OverflowError, struct.error):
        info = pack_info([words[0], words[1]] + [_f(x) for x in words[2:]], 8 if name == "optim_sgd" else 12)
    rt.dispatch(hit[1], [_binding(pout)] + bufs, info, grid_1d((n + WG - 1) // WG, rt.max_groups))


def _f(x: float) -> int:
    return f32_bits(float(x))


def sgd_step(p, g, state: dict, group: dict):
    """One fused SGD step of ``p`` (updates ``state`` in place); the new parameter value as a
    Tensor, or None where the fused kernel does not apply."""
    from .runtime import get_runtime

    rt = get_runtime()
    if not _usable(rt, p, g) or g.shape != p.shape:
        return None
    pin, gg = _dense_input(p), _dense_input(g)
    if _aliased((pin, gg), state, ("momentum_buffer",)):
        return None
    mom = group["momentum"]
    first = False
    bufs = [_binding(pin), _binding(gg)]
    if mom:
        buf = state.get("momentum_buffer")
        first = buf is None
        buf, b = _own(rt, p if first else buf, state, fresh=first)
        state["momentum_buffer"] = buf
        bufs.append(b)
    else:
        bufs.append(_scratch(rt))
    wd = group["weight_decay"]
    flags = (bool(group["maximize"]) | (bool(wd) << 1) | (first << 2) | (bool(group["nesterov"]) << 3)
             | (bool(mom) << 4))
    pout = _new_param(rt, p, pin)
    _launch(rt, "optim_sgd", pout, bufs,
            [pin.size, flags, float(wd), float(mom), 1.0 - group["dampening"], float(group["lr"])])
    return _tensor(pout, p)


def adam_step(p, g, state: dict, group: dict):
    """One fused Adam/AdamW step of ``p`` (updates ``state`` in place, ``state["step"]``
    included); the new parameter value as a Tensor, or None where the fused kernel does not
    apply."""
    from .runtime import get_runtime

    rt = get_runtime()
    if not _usable(rt, p, g) or g.shape != p.shape:
        return None
    if state and not all(k in state for k in ("exp_avg", "exp_avg_sq")):
        return None
    ams = bool(group["amsgrad"])
    if state and ams and "max_exp_avg_sq" not in state:
        return None
    pin, gg = _dense_input(p), _dense_input(g)
    if _aliased((pin, gg), state, ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")):
        return None
    lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    fresh = not state
    if fresh:
        state["step"] = 0.0
    keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if ams else [])
    bufs = [_binding(pin), _binding(gg)]
    for k in keys:
        t, b = _own(rt, p if fresh else state[k], state, fresh=fresh)
        state[k] = t
        bufs.append(b)
    if not ams:
        bufs.append(_scratch(rt))
    state["step"] += 1.0
    t = state["step"]
    step_size = lr / (1.0 - b1 ** t)
    bc2_sqrt = math.sqrt(1.0 - b2 ** t)
    flags = (bool(group["maximize"]) | (bool(wd) << 1) | (fresh << 2)
             | (bool(group["decoupled_weight_decay"]) << 3) | (ams << 4))
    pout = _new_param(rt, p, pin)
    _launch(rt, "optim_adam", pout, bufs,
            [pin.size, flags, float(wd), 1.0 - lr * wd, 1.0 - b1, float(b2), 1.0 - b2, step_size,
             bc2_sqrt, float(eps)])
    return _tensor(pout, p)
