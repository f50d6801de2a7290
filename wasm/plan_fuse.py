"""Inference fusions of a plan on device ``"wasm"`` before it becomes command tables.

What onnxruntime's graph optimizer does for a convolutional network, done on ember's ``Plan``
when its compiled replay is made (``plan_exec.compile_plan``):

- **batch norm folded into the conv before it**: a ``conv2d`` whose weight (and bias, if any)
  are constants, whose output only an inference ``batch_norm`` reads, and whose batch norm's
  statistics, weight and bias are constants becomes one ``conv2d`` with the weight and bias
  ``w' = w * s``, ``b' = (b - mean) * s + beta``, ``s = gamma / sqrt(var + eps)`` per output
  channel (computed in float64 once, rounded to float32). The batch norm's pass over the
  output is gone. This changes bits: the product of the rounded ``w'`` is not the batch norm of
  the rounded product (relative differences of a few float32 ulps, as onnxruntime's folding).
- **relu in the conv's store**: a ``conv2d`` (folded or not) whose output only a ``relu``
  reads stores ``max(y, 0)`` itself (``GEMM_RELU`` of conv2d_gemm / conv2d_depthwise). Same
  bits as the two steps: the kernels' relu passes NaN and -0.0 as ``relu_f32`` does.

Only float32 convs on the wasm backend's own conv2d kernel, in plans with no host steps (a
training step updates its parameters between replays). A fused plan keeps the original plan's
inputs, outputs and slots; the folded weights are new constants in new slots.

**Constants replaced.** A constant's values change only by a new buffer (``Tensor._set_``:
optimizers, ``copy_``, ``load_state_dict``), and the original plan's constant list is replaced
by ``release_constants`` / ``bind_constants``. ``FusedReplay`` checks both before every replay
(by identity, ~0.1 µs per folded constant) and folds again from the new values when either
changed, so a replay never runs on stale folded weights.

``EMBER_WASM_FUSE=0`` turns the fusions off (the plan is replayed as captured).

>>> import ember
>>> conv, bn = ember.nn.Conv2d(1, 2, 3), ember.nn.BatchNorm2d(2)      # doctest: +SKIP
>>> f = ember.compile(lambda x: ember.relu(bn(conv(x))))              # doctest: +SKIP
>>> f.plan_for(x).fast.describe()["fused"]                           # doctest: +SKIP
['conv2d + batch_norm + relu']
"""
from __future__ import annotations

import math
import os
from array import array

from .. import dtypes as _dt
from ..plan import Plan, Step
from ..tensor import Tensor

ENABLED = os.environ.get("EMBER_WASM_FUSE", "1") != "0"
_HOST = 2   # ember.plan.HOST


def _const_f32(consts: dict, slot: int, device: str):
    """The float32 constant Tensor in ``slot`` on ``device``, or None."""
    t = consts.get(slot)
    if t is None or t.dtype is not _dt.float32 or t.device != device or t._buf.__class__ is not array:
        return None   # (a moved or resident buffer is read in place by the team: left alone)
    return t


def _fold(conv_w: Tensor, conv_b, mean: Tensor, var: Tensor, gamma: Tensor, beta: Tensor,
          eps: float) -> tuple:
    """(weight buffer, bias buffer) of conv ``conv_w``/``conv_b`` followed by the batch norm."""
    o = conv_w.shape[0]
    per = len(conv_w._buf) // o if o else 0
    mv, vv, gv, bv = mean._buf, var._buf, gamma._buf, beta._buf
    cb = conv_b._buf if conv_b is not None else None
    w = conv_w._buf
    nw = array("f", bytes(4 * len(w)))
    nb = array("f", bytes(4 * o))
    for c in range(o):
        s = gv[c] / math.sqrt(vv[c] + eps)
        nb[c] = ((cb[c] if cb is not None else 0.0) - mv[c]) * s + bv[c]
        base = c * per
        nw[base:base + per] = array("f", [v * s for v in w[base:base + per]])
    return nw, nb


def fuse_candidates(plan: Plan) -> bool:
    """Whether ``plan`` may have something to fuse (a conv2d step, no host step)."""
    return ENABLED and any(st.name == "conv2d" for st in plan.steps) and all(st.multi != _HOST for st in plan.steps)


def fuse(plan: Plan, conv_kernel, bn_kernel, relu_kernel, device: str = "wasm"):
    """(fused plan, what was fused: ["conv2d + batch_norm + relu", ...], the constant Tensors the
    folds read), or None when nothing fuses. ``*_kernel``: the backend's own kernels (a step
    with another kernel, a custom op's, is left alone)."""
    steps = plan.steps
    if not ENABLED or any(st.multi == _HOST for st in steps):
        return None
    consts = {s: t for s, t in plan.consts if t is not None}
    readers = plan.readers()
    outs = set(plan.out_slots)
    new_steps = list(steps)
    drop: set = set()
    new_consts = list(plan.consts)
    n_slots = plan.n_slots
    done, sources = [], []

    def sole_reader(slot, name, kernel):
        """The one step reading ``slot`` when it is a ``name`` step on ``kernel``, else None."""
        r = readers.get(slot, ())
        if slot in outs or len(r) != 1 or r[0] in drop:
            return None
        j = r[0]
        st = steps[j]
        if st.name != name or st.kernel is not kernel or st.multi is not False or st.ins[0] != slot:
            return None
        return j

    for i, st in enumerate(steps):
        if (st.name != "conv2d" or st.kernel is not conv_kernel or st.multi is not False
                or st.meta.dtype is not _dt.float32 or "relu" in st.attrs or 0 in st.meta.shape):
            continue
        ins, attrs, out, what = list(st.ins), dict(st.attrs), st.outs[0], ["conv2d"]
        j = sole_reader(out, "batch_norm", bn_kernel)
        if j is not None:
            bn = steps[j]
            w = _const_f32(consts, ins[1], device)
            b = _const_f32(consts, ins[2], device) if len(ins) > 2 else None
            stats = [_const_f32(consts, s, device) for s in bn.ins[1:5]]
            o = st.meta.shape[1] if len(st.meta.shape) > 1 else -1
            ok = (w is not None and (len(ins) == 2 or b is not None) and len(bn.ins) == 5
                  and all(t is not None and tuple(t.shape) == (o,) for t in stats)
                  and w.shape[0] == o and 0 not in w.shape)
            if ok:
                nw, nb = _fold(w, b, *stats, float(bn.attrs.get("eps", 1e-5)))
                tw = Tensor._wrap(nw, tuple(w.shape), _dt.float32, device)
                tb = Tensor._wrap(nb, (o,), _dt.float32, device)
                new_consts += [(n_slots, tw), (n_slots + 1, tb)]
                ins = [ins[0], n_slots, n_slots + 1]
                n_slots += 2
                sources += [w] + ([b] if b is not None else []) + stats
                drop.add(j)
                out = bn.outs[0]
                what.append("batch_norm")
        j = sole_reader(out, "relu", relu_kernel)
        if j is not None:
            drop.add(j)
            out = steps[j].outs[0]
            attrs["relu"] = True
            what.append("relu")
        if len(what) > 1:
            new_steps[i] = Step(st.kernel, st.name, tuple(ins), (out,), st.meta, attrs, st.device, st.multi)
            done.append(" + ".join(what))
    if not done:
        return None
    kept = [s for k, s in enumerate(new_steps) if k not in drop]
    read = {s for st in kept for s in st.ins} | set(plan.out_slots)
    fused = Plan(kept, n_slots, plan.n_inputs, [(s, t) for s, t in new_consts if s in read],
                 plan.out_slots, plan.out_tree)
    return fused, done, sources


class FusedReplay:
    """``plan.fast`` for a plan with fusions: the command-table replay (``WasmPlanReplay``) of the
    fused plan, folded again whenever a constant the folds read was replaced (see the module
    docstring). Everything else (``describe``, ``ready``, ``records``...) is the inner replay's."""

    def __init__(self, backend, plan, make_replay):
        self.backend = backend
        self.source = plan
        self._make = make_replay
        self.inner = None
        self._build()

    def _build(self) -> None:
        k = self.backend.kernels
        res = fuse(self.source, k.get("conv2d"), k.get("batch_norm"), k.get("relu"))
        old = self.inner
        if old is not None and getattr(old, "space", None) is not None:
            old.space.close()
            old.space = None
        self.consts_seen = self.source.consts
        if res is None:
            self.fused, self.sources, self.bufs = [], (), ()
            self.inner = self._make(self.backend, self.source)
            return
        fplan, self.fused, srcs = res
        self.sources = tuple(srcs)
        self.bufs = tuple(t._buf for t in srcs)
        self.inner = self._make(self.backend, fplan)

    def __call__(self, inputs):
        if self.source.consts is not self.consts_seen:
            self._build()
        else:
            for t, b in zip(self.sources, self.bufs):
                if t._buf is not b:
                    self._build()
                    break
        return self.inner(inputs)

    def describe(self) -> dict:
        d = self.inner.describe()
        d["fused"] = list(self.fused)
        return d

    def __getattr__(self, attr):
        if attr == "inner":   # (not made yet)
            raise AttributeError(attr)
        return getattr(self.inner, attr)
