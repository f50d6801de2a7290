"""The numpy device's compiled replay of an execution plan (``NumpyBackend.compile_plan``).

A plan replayed step by step allocates a new array for every kernel call and makes one pass over
memory per primitive: the activations exporters write as chains of primitives (HardSwish:
multiply, add, clip, multiply) cost four passes and four arrays. Knowing the whole plan, this
replay does these things on top of the recorded kernels, with results identical bit for bit (the
same float32 operations in the same order, only the destination arrays differ) except where
noted:

- **activation chains** ``clip(x * a + b, 0, 1)`` (hard sigmoid) and ``x * clip(x * a + b, 0, 1)``
  (hard swish), with ``a``, ``b`` scalar constants, become one step: one temporary at most;
- **convolution + activation [+ max pooling]**: a float32 conv2d read only by a relu, a clip or
  one of those chains, and/or then by a 2x2 max pooling of stride 2, becomes one step
  (numpy_nn.conv2d_act): the activation (and the pooling, for the small stride-1 convolutions
  dense.c's ember_conv_pad takes) in the native kernel's epilogue (core/native/dense.c), or
  in-place passes after the convolution, each rounded as the separate steps round it;
- **scalar chains**: two or more add / subtract / multiply / divide of a float32 value by float32
  scalar constants (an input normalization ``(x - mean) / std``) become one step, in place after
  the first;
- **one-row linears** with a constant weight run dense.c's ember_gemv, the relu / clip / hard
  sigmoid / hard swish after them in its epilogue (a classifier at batch 1);
- **convolutions** keep the native call they ran (numpy_nn.NativeConvCall, NativeConvPad) for the
  next run, with or without an activation;
- **transformer layers** (core/native/fused.c; the products sum in another order than BLAS's, so
  these give the step-by-step results within float32 rounding, not bit for bit): a linear layer
  with the layer norm only it reads, a GELU after it or a residual add (ember_linear); attention
  over heads, softmax(q k^T * c) v read through the reshape / permute / slice steps that split a
  fused qkv projection, written with the heads merged (ember_attention);
- **silu(g) * u** (a SwiGLU feed-forward): a float32 silu read only by a multiply of its shape
  becomes one native pass (core/native/glu.c, numpy_llm.native_silu_mul: vec.h's exp, so within
  float32 roundings of the two steps; SmolLM2's decode step 45 -> 18 us a layer, notes/native-decode-attn.md);
- **a residual add and the rms_norm after it** (float32, one shape): one op with both results
  (core/native/rmsnorm.c, numpy_llm.native_add_rms_norm: the two steps' bits);
- **a decode step's native calls prepared once** (_prepared_step; _silu_mul and _add_rms_norm too):
  a qlinear, rope or attention_cached step calls numpy_quant.qlinear_call / numpy_llm.rope_call /
  attention_cached_call, made for its shapes and attributes when the plan is built, which check per
  run only what can change (the library, switches, dtypes, layouts, a constant's buffer) and call
  the kernel the recorded step would: the same bits (the recorded step where they decline);
- **slices of one value in a row** (a fused product's q / k / v or gate / up) are one op, with the
  reshape just before them when only they read it (_slice_steps); other reshapes skip the kernel's
  call (_reshape_step);
- **squeeze-excite** at batch 1 (MobileNetV3): the global average pool as its recorded kernels
  compute it, then the two one-pixel 1x1 convolutions and the product in one call, in place
  (ember_squeeze_excite: the step-by-step bits);
- **the kernels' second thread** (numpy_nn.Team, core/native/team.c: large linear, convolution,
  attention and matrix-vector steps split between this thread and a spinning helper): woken at the
  start of a run where the last one used it, parked when the run ends (no spinning between runs);
- **in place**: an elementwise step (add, subtract, multiply, divide, relu, clip, the fused
  activations) writes into one of its float32 inputs when that array is the plan's own (made by
  a kernel that always returns a new array, never an input, a constant or an output), has the
  output's shape, and no value still to be read shares its memory (a reshape of it, say).

``EMBER_NUMPY_PLAN=off`` turns it off (the plan then replays step by step).

>>> import ember, numpy as np
>>> f = ember.compile(lambda x: ember.relu(ember.add(ember.multiply(x, 2.0), 1.0)))
>>> x = ember.from_numpy(np.array([-1.0, 0.5], np.float32), device="numpy")
>>> f(x).tolist(), f(x).tolist()
([0.0, 2.0], [0.0, 2.0])
"""
from __future__ import annotations

import math
import os
import time
from math import isfinite

import numpy as np

from . import numpy_rows
from .numpy_blas import matmul
from .numpy_nn import _addr, clip
from .numpy_nn import park_team as _park_team
from .numpy_nn import wake_team as _wake_team

# kernels whose result is always a new array (never an input's buffer or a view of one)
FRESH = frozenset({"conv2d", "conv_transpose2d", "linear", "matmul", "add", "subtract", "multiply", "divide",
                   "relu", "clip", "sigmoid", "silu", "gelu", "softmax", "log_softmax", "layer_norm", "batch_norm",
                   "max_pool2d", "avg_pool2d", "concat", "exp", "tanh", "sqrt", "erf", "hard_swish", "hard_sigmoid",
                   "matmul_integer", "scalar_chain"})
_BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.true_divide}
_F32 = np.dtype(np.float32)


class _Op:
    """One step of the compiled program: a recorded kernel call, or a fused/in-place one."""

    __slots__ = ("name", "ins", "out", "meta", "run", "free", "inplace", "multi", "mode", "qgemm", "act", "pool")

    def __init__(self, name, ins, out, meta, run, multi=False):
        self.name, self.ins, self.out, self.meta, self.run, self.multi = name, ins, out, meta, run, multi
        self.inplace = None
        self.mode = None        # int8 ops: "centered" (see _centered_quantization)
        self.qgemm = None       # matmul_integer: its numpy_rows.QGemm; dynamic_quantize_linear: True
        #                         when every reader has one (then y stays uint8 where the library runs)
        self.act = None         # conv2d: the activation fused into it (_conv_act)
        self.pool = 0           # conv2d: 2 where a 2x2 max pooling is fused into it (_conv_act)
        self.free = ()


def _const_scalar(consts: dict, slot):
    """The float32 0-d array of a scalar float32 constant slot, else None."""
    t = consts.get(slot)
    if t is None or t.dtype.name != "float32" or t.size != 1:
        return None
    return np.asarray(t._buf, dtype=np.float32).reshape(())


class NumpyReplay:
    """A plan's steps rewritten as described in the module docstring; call it with the inputs."""

    def __init__(self, plan):
        from ..plan import HOST
        from ..tensor import Tensor
        self.plan = plan
        self._wrap = Tensor._wrap
        steps = plan.steps
        if any(st.multi == HOST for st in steps):
            raise ValueError("host steps")           # they may touch any slot: replay as recorded
        consts = dict(plan.consts)
        readers = plan.readers()
        protected = set(plan.out_slots) | set(consts) | set(range(plan.n_inputs))
        ops = self._fuse(steps, consts, readers, protected)
        self._inplace(ops, protected)
        # after each op, the slots nobody reads any more
        last = {}
        for i, op in enumerate(ops):
            for s in op.ins:
                last[s] = i
        frees = [[] for _ in ops]
        for s, i in last.items():
            if s not in protected:
                frees[i].append(s)
        for op, f in zip(ops, frees):
            op.free = tuple(f)
        self.ops = ops
        self._seq = tuple((op.run, op, op.free) for op in ops)   # (what a run reads of each op, unpacked once)
        # (hard sigmoid / hard swish chains: their own op or fused into a convolution)
        self.fused = sum(1 for op in ops if op.name.startswith("hard_") or (op.act or "").startswith("hard_"))
        self.conv_act = sum(1 for op in ops if op.act is not None)
        self.conv_pool = sum(1 for op in ops if op.pool)
        # what a run starts from and returns, made once: a call after other work (onnxruntime's, in
        # the benchmark) finds little of this in the caches, where each Python line costs ~2-3 us
        # (MNIST at batch 1: setup, import and unflatten 8 of ~70 us per call)
        from ..plan import unflatten
        self._slots, self._n_inputs, self._unflatten = plan.slots([None] * plan.n_inputs), plan.n_inputs, unflatten
        self._single = plan.out_slots[0] if plan.out_tree == "T" and len(plan.out_slots) == 1 else None
        self.in_place = sum(1 for op in ops if op.inplace is not None)
        self._team = False              # (whether the last run used numpy_nn.Team: wake it first)

    # ---- rewriting -------------------------------------------------------------------------------
    def _fuse(self, steps, consts, readers, protected) -> list:
        """Recorded steps as _Ops, with hard sigmoid / hard swish chains made one op each."""
        ops, skip = [], set()
        only = lambda s, i: readers.get(s) == [i] and s not in protected   # noqa: E731
        dtypes = {s: t.dtype.name for s, t in consts.items()}
        budget = [_LINEAR_COPY_BYTES]           # (bytes left for linear weight copies)
        producer = {}
        for k, st in enumerate(steps):
            for s, m in zip(st.outs, st.meta if st.multi else (st.meta,)):
                dtypes[s] = m.dtype.name
                producer[s] = k
        def plain(r):               # (op, later steps) -> (op, later steps, no earlier op replaced)
            return None if r is None else (r[0], r[1], ())

        def attention(i):           # (its view steps: now inside the op)
            r = _attention(steps, i, consts, readers, only, producer, protected)
            return None if r is None else (r[0], r[1], {steps[j].outs[0] for j in r[2]})

        def linear_fused(i):        # (the layer norm before it: now inside the op)
            r = _linear_fused(steps, i, consts, budget, readers, only, producer, protected)
            return None if r is None else (r[0], r[1], () if r[2] is None else {steps[r[2]].outs[0]})

        def linear_const(i):        # (where it reads the input of the reshape before it)
            r = _linear_const(steps, i, consts, dtypes, budget, readers, only, producer)
            x = steps[i].ins[0]
            return None if r is None else (r[0], r[1], {x} if r[0].ins[0] != x else ())

        def hard_chain(i):          # (later steps: a chain reads only its own results)
            r = self._hard_chain(steps, i, consts, readers, only)
            if r is None:
                return None
            name, x, a, b, last = r
            return (_Op(name, (x,), steps[last[-1]].outs[0], steps[last[-1]].meta, _hard(name == "hard_swish", a, b)),
                    last[1:], ())

        # each rewrite, tried in this order: (the op, later steps it takes in, earlier ops' outputs it replaces)
        rewrites = (lambda i: plain(_dynamic_quantize(steps, i, consts, readers, only)),
                    lambda i: plain(_integer_matmul(steps, i, consts, readers, only, dtypes)),
                    lambda i: plain(_squeeze_excite(steps, i, consts, readers, only, producer, protected)),
                    attention, linear_fused, linear_const,
                    lambda i: plain(self._conv_act(steps, i, consts, readers, only, protected)),
                    hard_chain,
                    lambda i: _silu_mul(steps, i, readers, only, producer),
                    lambda i: _add_rms_norm(steps, i, readers, producer),
                    lambda i: _slice_steps(steps, i, readers, producer, protected),
                    lambda i: plain(_slice_step(steps, i)),
                    lambda i: plain(_reshape_step(steps, i)),
                    lambda i: plain(_prepared_step(steps, i)),
                    lambda i: plain(self._scalar_chain(steps, i, consts, readers, only, skip)))
        for i, st in enumerate(steps):
            if i in skip:
                continue
            for rewrite in rewrites:
                r = rewrite(i)
                if r is not None:
                    op, used, gone = r
                    skip.update(used)
                    if gone:
                        ops = [o for o in ops if o.multi or o.out not in gone]
                    ops.append(op)
                    break
            else:
                ops.append(_Op(st.name, st.ins, st.outs if st.multi else st.outs[0], st.meta, _recorded(st),
                               bool(st.multi)))
        _centered_quantization(ops, protected)
        return ops

    def _scalar_chain(self, steps, i, consts, readers, only, skip):
        """``(op, later step indices)`` when steps i, i + 1, ... (two or more) are add / subtract /
        multiply / divide of a float32 value and a float32 scalar constant (an input
        normalization ``(x - mean) / std``), each result read only by the next step, all of one
        shape: one op, the first step into a new array and the others in place on it (the same
        float32 operations in the same order; the recorded steps where x is not float32). A
        hard sigmoid / hard swish chain is left to ``_hard_chain``."""
        seq, used, prev, shape = [], [], None, None
        k = i
        while k < len(steps):
            st = steps[k]
            if k in skip or st.name not in _BINARY or st.multi or st.meta.dtype.name != "float32" or len(st.ins) != 2 \
                    or (shape is not None and tuple(st.meta.shape) != shape) \
                    or self._hard_chain(steps, k, consts, readers, only) is not None:
                break
            a, b = st.ins
            ca, cb = _const_scalar(consts, a), _const_scalar(consts, b)
            if (ca is None) == (cb is None):
                break
            x = b if ca is not None else a
            if prev is not None and (x != prev or not only(prev, k)):
                break
            if prev is None and x in consts:
                break
            seq.append((_BINARY[st.name], ca if ca is not None else cb, ca is not None))
            used.append(k)
            prev, shape = st.outs[0], tuple(st.meta.shape)
            r = readers.get(prev, [])
            if len(r) != 1:
                break
            k = r[0]
        if len(seq) < 2:
            return None
        first = steps[i]
        x0 = first.ins[1] if seq[0][2] else first.ins[0]
        last = steps[used[-1]]
        recs = [_recorded(steps[k]) for k in used]
        from ..tensor import Tensor
        wrap, o, meta, dev = Tensor._wrap, last.outs[0], last.meta, last.device
        mshape, dtype = meta.shape, meta.dtype
        f0, c0, cfirst0 = seq[0]
        rest = tuple(seq[1:])

        def run(vals, op, into=None):
            xt = vals[x0]
            a = xt._buf
            if a.dtype != _F32:                      # (the recorded steps: their own promotions)
                for rec in recs:
                    rec(vals, None)
                return
            if into is None:
                t = f0(c0, a) if cfirst0 else f0(a, c0)
            else:
                t = into
                f0(c0, a, out=t) if cfirst0 else f0(a, c0, out=t)
            for f, c, cfirst in rest:
                f(c, t, out=t) if cfirst else f(t, c, out=t)
            vals[o] = wrap(t.reshape(mshape), mshape, dtype, dev)
        run.device = dev
        return _Op("scalar_chain", (x0,), o, meta, run), used[1:]

    @staticmethod
    def _hard_chain(steps, i, consts, readers, only):
        """``(name, x slot, a, b, [step indices])`` when steps i.. are multiply(x, a), add(., b),
        clip(., 0, 1)[, multiply(x, .)] on float32 with every intermediate read only by the
        next step; else None."""
        st = steps[i]
        if st.name != "multiply" or st.multi or st.meta.dtype.name != "float32":
            return None
        x, c = st.ins
        a = _const_scalar(consts, c)
        if a is None:
            x, c = c, x
            a = _const_scalar(consts, c)
        if a is None or x in consts:
            return None
        t1 = st.outs[0]
        r = _sole_reader(readers, only, t1)
        if r is None:
            return None
        i_add = r[0]
        add = steps[i_add]
        if add.name != "add" or add.multi:
            return None
        b = _const_scalar(consts, add.ins[1] if add.ins[0] == t1 else add.ins[0])
        if b is None:
            return None
        t2 = add.outs[0]
        r = _sole_reader(readers, only, t2)
        if r is None:
            return None
        i_cl = r[0]
        cl = steps[i_cl]
        if cl.name != "clip" or cl.attrs.get("min") != 0.0 or cl.attrs.get("max") != 1.0 \
                or cl.meta.dtype.name != "float32":
            return None
        idx = [i, i_add, i_cl]
        t3 = cl.outs[0]
        r = readers.get(t3, [])
        if len(r) == 1 and only(t3, r[0]):
            m2 = steps[r[0]]
            if m2.name == "multiply" and not m2.multi and sorted(m2.ins) == sorted((x, t3)) and x != t3 \
                    and tuple(m2.meta.shape) == tuple(st.meta.shape):
                return "hard_swish", x, a, b, idx + [r[0]]
        if tuple(cl.meta.shape) != tuple(st.meta.shape):
            return None
        return "hard_sigmoid", x, a, b, idx

    def _conv_act(self, steps, i, consts, readers, only, protected):
        """``(op, later step indices)`` for a float32 conv2d step (read by at most two steps, not an
        output): when its result is read only by a relu, a clip or a hard sigmoid / hard swish
        chain (``_hard_chain``), or by a 2x2 max pooling of stride 2 (``_pool_2x2``), the
        activation's result likewise, one op with them, ``numpy_nn.conv2d_act`` (the activation
        and the pooling in the native kernels' epilogues, or in-place passes after the
        convolution; the same bits as the separate steps on the same convolution); else the
        convolution alone through it. Either way the native call it ran (ember_conv_pad's, a
        depthwise or 1x1 one: numpy_nn.NativeConvCall) is kept for the next run: ~1.5 us of
        Python instead of conv2d_act's dispatch (MobileNetV3-small: 11 depthwise and 34 1x1
        convolutions). Else None."""
        st = steps[i]
        if st.name != "conv2d" or st.multi or st.meta.dtype.name != "float32":
            return None
        y = st.outs[0]
        r = sorted(readers.get(y, []))
        if not r or len(r) > 2 or y in protected:
            return None
        nxt = steps[r[0]]
        plain = None, (0.0, 0.0, 0.0, 0.0), []          # (the convolution alone: its own call kept)
        if nxt.multi or nxt.meta.dtype.name != "float32":
            act, args, used = plain
        elif len(r) == 1 and self._pool_2x2(steps, r[0], st.meta, y):
            act, args, used = None, (0.0, 0.0, 0.0, 0.0), []
        elif tuple(nxt.meta.shape) != tuple(st.meta.shape):
            act, args, used = plain
        elif len(r) == 1 and nxt.name == "relu" and nxt.ins == (y,):
            act, args, used = "relu", (0.0, 0.0, 0.0, np.inf), [r[0]]
        elif len(r) == 1 and nxt.name == "clip" and nxt.ins == (y,):
            lo, hi = nxt.attrs.get("min"), nxt.attrs.get("max")
            act, used = "clip", [r[0]]
            args = (0.0, 0.0, -np.inf if lo is None else float(np.float32(lo)),
                    np.inf if hi is None else float(np.float32(hi)))
        else:
            chain = self._hard_chain(steps, r[0], consts, readers, only)
            act, args, used = plain
            if chain is not None and chain[1] == y:
                act, _, a, b, used = chain
                args = (float(a), float(b), 0.0, 1.0)
                nxt = steps[used[-1]]
                # y's readers: the chain's first step, and for hard swish its last (x * clip(...))
                if r != sorted({used[0], used[-1]} if act == "hard_swish" else {used[0]}) \
                        or tuple(nxt.meta.shape) != tuple(st.meta.shape) or nxt.meta.dtype.name != "float32":
                    act, args, used = plain
        if not used and act is None:
            nxt = st
        pool = 0
        last = steps[used[-1]] if used else st
        rp = readers.get(last.outs[0], [])
        if len(rp) == 1 and last.outs[0] not in protected and self._pool_2x2(steps, rp[0], st.meta, last.outs[0]):
            pool = 2
            used = used + rp
            nxt = steps[rp[0]]
        from .numpy_nn import conv2d_act, conv_pad_call, native_conv_call, native_conv_pad_case
        from ..tensor import Tensor
        wrap, attrs, dev, ins = Tensor._wrap, dict(st.attrs), st.device, tuple(st.ins)
        meta, o, cmeta = nxt.meta, nxt.outs[0], st.meta
        shape, dtype = meta.shape, meta.dtype
        if pool:
            attrs["pool"] = pool
        # dense.c's ember_conv_pad set up once (numpy_nn.NativeConvPad) where it takes the case:
        # (the weight and bias buffers it was made for, the call or None: conv2d_act each time)
        _, oc, oh, ow = cmeta.shape
        pad_case = native_conv_pad_case(cmeta.shape, st.attrs, pool)
        cache = [None]

        def run(vals, op):
            xs = [vals[k] for k in ins]
            a, wb = xs[0]._buf, xs[1]._buf
            bb = xs[2]._buf if len(xs) == 3 else None
            c = cache[0]
            if c is not None and c[0] is wb and c[1] is bb and c[2] is not None:
                yb = c[2](a)
                if yb is not None:
                    vals[o] = wrap(yb, shape, dtype, dev)
                    return
            yb = conv2d_act(cmeta, *xs, **attrs, act=act, act_args=args)
            vals[o] = wrap(yb, shape, dtype, dev)
            if (c is None or c[0] is not wb or c[1] is not bb) and a.flags.c_contiguous and a.ndim == 4 \
                    and wb.ndim == 4:
                kh, kw = wb.shape[2:]
                call = None
                if pad_case:
                    call = conv_pad_call(a, wb, bb, oh, ow, kh, kw, st.attrs["padding"], st.attrs["dilation"],
                                         act, args, pool)
                if call is None and not pool:   # (a depthwise or 1x1 convolution's kept addresses, if it ran so)
                    call = native_conv_call(a, wb, bb, oh, ow, st.attrs["stride"], st.attrs["padding"],
                                            st.attrs["dilation"], st.attrs["groups"], act, args)
                cache[0] = (wb, bb, call)
        op = _Op("conv2d", ins, o, meta, run)
        op.act, op.pool = act, pool
        return op, used

    @staticmethod
    def _pool_2x2(steps, k, cmeta, x) -> bool:
        """Whether step k is a float32 2x2 max pooling of stride 2 of ``x`` (the convolution's
        (N, C, H, W) shape), no padding or dilation, with the floor mode's (N, C, H // 2, W // 2)
        result (numpy_nn.conv2d_act's ``pool``)."""
        st = steps[k]
        if st.name != "max_pool2d" or st.multi or st.ins != (x,) or st.meta.dtype.name != "float32":
            return False
        a = st.attrs
        n, c, h, w = cmeta.shape
        return (h >= 2 and w >= 2 and tuple(a.get("kernel_size", ())) == (2, 2)
                and tuple(a.get("stride", ())) == (2, 2) and tuple(a.get("dilation", (1, 1))) == (1, 1)
                and a.get("padding") == ((0, 0), (0, 0))
                and tuple(st.meta.shape) == (n, c, h // 2, w // 2))

    def _inplace(self, ops, protected) -> None:
        """Mark elementwise ops that may write into one of their inputs (see the docstring)."""
        group: dict = {}           # slot -> the set of slots sharing its memory (may alias)
        fresh: set = set()         # slots holding arrays the plan made and owns
        shape: dict = {}           # slot -> (shape, dtype name)
        last: dict = {}
        for i, op in enumerate(ops):
            for s in op.ins:
                last[s] = i
        for i, op in enumerate(ops):
            outs = op.out if op.multi else (op.out,)
            metas = op.meta if op.multi else (op.meta,)
            for s, m in zip(outs, metas):
                shape[s] = (tuple(m.shape), m.dtype.name)
            target = None
            if op.name in _BINARY or op.name in ("relu", "clip", "hard_swish", "hard_sigmoid", "scalar_chain",
                                                 "squeeze_excite"):
                want = (tuple(op.meta.shape), "float32")
                for s in op.ins:
                    if s in fresh and s not in protected and shape.get(s) == want and \
                            all(last.get(t, -1) <= i and t not in protected for t in group.get(s, {s})):
                        target = s
                        break
            if target is not None and len(outs) == 1 and shape[outs[0]][1] == "float32":
                op.inplace = op.ins.index(target)
                op.run = _inplace_run(op)
                g = group.setdefault(target, {target})
                g.add(outs[0])
                group[outs[0]] = g
                fresh.add(outs[0])
                continue
            if op.name in FRESH and len(outs) == 1:
                fresh.add(outs[0])
                group[outs[0]] = {outs[0]}
                continue
            # anything else may return (a view of) an input: its outputs share the inputs' memory
            g = set(outs)
            for s in op.ins:
                g |= group.get(s, {s})
            for s in g:
                group[s] = g

    # ---- running ---------------------------------------------------------------------------------
    def _setup(self, inputs):
        vals = self._slots.copy()              # (the constants in their slots: the plan's, fixed)
        vals[:self._n_inputs] = inputs
        return vals

    def __call__(self, inputs):
        vals = self._setup(inputs)
        if self._team:
            _wake_team()                # (the native kernels' helper thread, up before the first big step)
        with np.errstate(all="ignore"):
            for run, op, free in self._seq:
                run(vals, op)
                for s in free:
                    vals[s] = None
        self._team = _park_team()       # (and parked once the run is done: no spinning between runs)
        if self._single is not None:
            return vals[self._single]
        return self._unflatten(self.plan.out_tree, [vals[s] for s in self.plan.out_slots])

    def profile(self, inputs, times: dict, steps: list | None = None) -> None:
        """Run once, adding each op's wall time to ``times[name]`` (in-place ops as ``name (in place)``);
        with ``steps``, also append ``(name, seconds)`` per op in order (so that a caller can keep
        each op's fastest run over several: on a loaded machine the sums are mostly waiting)."""
        vals = self._setup(inputs)
        clock = time.perf_counter
        with np.errstate(all="ignore"):
            for op in self.ops:
                t = clock()
                op.run(vals, op)
                dt = clock() - t
                key = op.name if op.inplace is None else op.name + " (in place)"
                times[key] = times.get(key, 0.0) + dt
                if steps is not None:
                    steps.append((key, dt))
                for s in op.free:
                    vals[s] = None
        self._team = _park_team()


def _recorded(st):
    # the replay runs inside np.errstate(all="ignore") already: call a kernel without its own
    kernel, attrs, dev = getattr(st.kernel, "__wrapped__", st.kernel), st.attrs, st.device
    from ..tensor import Tensor
    wrap = Tensor._wrap
    if st.multi:
        def run(vals, op):
            bufs = kernel(op.meta, *[vals[i] for i in op.ins], **attrs)
            for s, b, m in zip(op.out, bufs, op.meta):
                vals[s] = wrap(b, m.shape, m.dtype, dev)
        return run

    # the step's slots, shape and dtype bound once (its _Op carries the same ones)
    ins, o, meta = tuple(st.ins), st.outs[0], st.meta
    shape, dtype = meta.shape, meta.dtype
    if len(ins) == 1:
        i0, = ins

        def run(vals, op):
            vals[o] = wrap(kernel(meta, vals[i0], **attrs), shape, dtype, dev)
    elif len(ins) == 2:
        i0, i1 = ins

        def run(vals, op):
            vals[o] = wrap(kernel(meta, vals[i0], vals[i1], **attrs), shape, dtype, dev)
    else:
        def run(vals, op):
            vals[o] = wrap(kernel(meta, *[vals[i] for i in ins], **attrs), shape, dtype, dev)
    run.attrs, run.device = attrs, dev
    return run


def _hard(swish: bool, a, b):
    """hard sigmoid ``clip(x * a + b, 0, 1)`` / hard swish ``x * that`` as one op, out of place."""
    from ..tensor import Tensor
    wrap = Tensor._wrap
    lo, hi = np.float32(0.0), np.float32(1.0)

    def run(vals, op, out=None):
        xt = vals[op.ins[0]]
        x = xt._buf.astype(np.float32, copy=False)     # (float16 / ints: computed in float32, as recorded)
        t = np.multiply(x, a, out=out)
        t += b
        clip(t, lo, hi, out=t)
        if swish:
            t *= x          # x * clip(...): the same product as multiply(x, clip) (commutative)
        vals[op.out] = wrap(t, op.meta.shape, op.meta.dtype, xt.device)
    run.hard = (swish, a, b)
    return run


def _inplace_run(op):
    """The op's run writing into input ``op.inplace``'s array."""
    from ..tensor import Tensor
    wrap = Tensor._wrap
    j = op.inplace
    name = op.name
    if name == "squeeze_excite":         # (into x's array: x * its gate, plane by plane)
        se = op.run

        def run(vals, op):
            a = vals[op.ins[0]]._buf
            se(vals, op, a if a.dtype == _F32 and a.flags.c_contiguous and a.flags.writeable else None)
        return run
    if name == "scalar_chain":           # (the chain's first step writes into x too)
        chain = op.run

        def run(vals, op):
            a = vals[op.ins[0]]._buf
            chain(vals, op, a if a.dtype == _F32 else None)
        return run
    lo_hi = None
    if name == "relu":
        lo_hi = (np.float32(0.0), np.float32(np.inf))
    elif name == "clip":
        attrs = op.run.attrs
        lo = attrs.get("min")
        hi = attrs.get("max")
        lo_hi = (np.float32(-np.inf if lo is None else lo), np.float32(np.inf if hi is None else hi))
    if lo_hi is not None:
        lo, hi = lo_hi
        dev = op.run.device

        def run(vals, op):
            y = vals[op.ins[0]]._buf
            clip(y, lo, hi, out=y)
            vals[op.out] = wrap(y, op.meta.shape, op.meta.dtype, dev)
        return run
    if name in _BINARY:
        fn = _BINARY[name]
        dev = op.run.device
        recorded = op.run

        def run(vals, op):
            A, B = vals[op.ins[0]]._buf, vals[op.ins[1]]._buf
            y = A if j == 0 else B
            if A.dtype != _F32 or B.dtype != _F32:    # (a float16 / int operand: the recorded kernel)
                recorded(vals, op)
                return
            fn(A, B, out=y)
            vals[op.out] = wrap(y, op.meta.shape, op.meta.dtype, dev)
        return run
    # hard_swish / hard_sigmoid: the temporary is the input itself for hard sigmoid; hard swish
    # needs x after the clip, so it keeps one temporary and multiplies into x
    swish, a, b = op.run.hard
    lo, hi = np.float32(0.0), np.float32(1.0)

    def run(vals, op):
        xt = vals[op.ins[0]]
        x = xt._buf
        if swish:
            t = x * a
            t += b
            clip(t, lo, hi, out=t)
            x *= t
        else:
            x *= a
            x += b
            clip(x, lo, hi, out=x)
        vals[op.out] = wrap(x, op.meta.shape, op.meta.dtype, xt.device)
    return run


# ---- int8 graphs: DynamicQuantizeLinear and MatMulInteger ---------------------------------------
#
# ember.onnx.quant writes DynamicQuantizeLinear as 20 primitive steps (13 of them on scalars) and
# MatMulInteger as casts, a subtraction and an integer matmul: a quantized linear layer replays as
# ~28 kernel calls. Both are recognised by their exact data flow and run as one op each.

_DQ = ("min", "minimum", "max", "maximum", "subtract", "divide", "equal", "where", "divide", "negative", "round",
       "clip", "cast", "divide", "round", "cast", "add", "round", "clip", "cast")


def _dynamic_quantize(steps, i, consts, readers, only):
    """(op, step indices) when steps i..i+19 are ember.onnx.quant.dynamic_quantize_linear of a
    float32 ``x``, else None. The op's outputs: y (uint8), scale, zero point (uint8)."""
    if i + len(_DQ) > len(steps) or steps[i].name != "min":
        return None
    seq = steps[i:i + len(_DQ)]
    if tuple(st.name for st in seq) != _DQ or any(st.multi for st in seq):
        return None
    o = [st.outs[0] for st in seq]
    x = seq[0].ins[0]
    c = lambda st, k: _const_scalar(consts, st.ins[k])   # noqa: E731
    want = [(x,), (o[0], None), (x,), (o[2], None), (o[3], o[1]), (o[4], None), (o[5], None), (o[6], None, o[5]),
            (o[1], o[7]), (o[8],), (o[9],), (o[10],), (o[11],), (x, o[7]), (o[13],), (o[12],), (o[14], o[15]),
            (o[16],), (o[17],), (o[18],)]
    for st, w in zip(seq, want):
        if len(st.ins) != len(w) or any(a is not None and a != b for a, b in zip(w, st.ins)):
            return None
        if any(a is None and c(st, k) is None for k, a in enumerate(w)):
            return None
    if seq[0].meta.dtype.name != "float32" or seq[0].meta.shape != () or seq[2].meta.shape != () \
            or seq[12].meta.dtype.name != "uint8" or seq[19].meta.dtype.name != "uint8" \
            or seq[15].meta.dtype.name != "float32" or seq[13].meta.dtype.name != "float32":
        return None
    # every intermediate is read only inside the pattern: then only y, scale and zp survive it
    inside = set(range(i, i + len(_DQ)))
    keep = {19: o[19], 7: o[7], 12: o[12]}
    for k, s in enumerate(o):
        if k not in keep and not set(readers.get(s, [])) <= inside:
            return None
    lo0, hi0, n255, zero, one = c(seq[1], 1), c(seq[3], 1), c(seq[5], 1), c(seq[6], 1), c(seq[7], 1)
    zlo, zhi = seq[11].attrs.get("min"), seq[11].attrs.get("max")
    ylo, yhi = seq[18].attrs.get("min"), seq[18].attrs.get("max")
    if None in (zlo, zhi, ylo, yhi):
        return None
    zlo, zhi, ylo, yhi = (np.float32(v) for v in (zlo, zhi, ylo, yhi))
    zp_in_range = 0 <= zlo <= zhi <= 255
    cast_zp, cast_y, dev = seq[12].kernel, seq[19].kernel, seq[0].device
    zp_attrs, y_attrs = seq[12].attrs, seq[19].attrs
    from ..tensor import Tensor
    wrap = Tensor._wrap
    metas = (seq[19].meta, seq[7].meta, seq[12].meta)

    native_consts = np.array([lo0, hi0, n255, zero, one, zlo, zhi, ylo, yhi], np.float32) if zp_in_range else None

    def run(vals, op):
        xt = vals[op.ins[0]]
        a = xt._buf
        if native_consts is not None:
            # the whole op in one native call (rows.c: the same float32 operations); uint8 y, also
            # in "centered" mode where every reader multiplies uint8 natively
            u8 = op.mode != "centered" or (op.qgemm and numpy_rows.qgemm_available())
            r = numpy_rows.dynamic_quantize(a, native_consts, centered=not u8)
            if r is not None:
                q, scale, zp = r
                vals[op.out[0]] = wrap(q.reshape(metas[0].shape), metas[0].shape, (metas[0] if u8 else metas[1]).dtype, dev)
                vals[op.out[1]] = wrap(scale, (), metas[1].dtype, dev)
                vals[op.out[2]] = wrap(zp, (), metas[2].dtype, dev)
                return
        lo = np.minimum(a.min(), lo0) if a.size else np.minimum(np.float32(0), lo0)
        hi = np.maximum(a.max(), hi0) if a.size else np.maximum(np.float32(0), hi0)
        scale = np.true_divide(np.subtract(hi, lo), n255)
        scale = np.asarray(one if scale == zero else scale, np.float32)
        zf = clip(np.rint(np.negative(np.true_divide(lo, scale))), zlo, zhi)
        finite = isfinite(scale) and isfinite(lo) and isfinite(hi)
        if finite and zp_in_range:
            # an integer in [0, 255]: the recorded cast (truncation, saturation, NaN -> 0) is a plain one
            zp = np.asarray(zf).astype(np.uint8).reshape(())
        else:
            zt = wrap(np.asarray(zf, np.float32).reshape(()), (), metas[1].dtype, dev)
            zp = cast_zp(metas[2], zt, **zp_attrs)                             # (the recorded cast: NaN -> 0)
        y = np.true_divide(a, scale)
        np.rint(y, out=y)
        if op.mode == "centered":
            # only integer matmuls read y, minus this zero point: give them y - zp in float32.
            # clip(r + zp, 0, 255) - zp == clip(r, -zp, 255 - zp) exactly (integers below 2**24)
            zpf = zp.astype(np.float32)
            if finite:
                clip(y, ylo - zpf, yhi - zpf, out=y)
            else:
                np.rint(y, out=y)
                y += zpf
                np.clip(y, ylo, yhi, out=y)
                y = cast_y(metas[0], wrap(y, metas[0].shape, seq[18].meta.dtype, dev), **y_attrs).astype(np.float32)
                y -= zpf
            vals[op.out[0]] = wrap(y, metas[0].shape, metas[1].dtype, dev)
            vals[op.out[1]] = wrap(scale.reshape(()), (), metas[1].dtype, dev)
            vals[op.out[2]] = wrap(zp, (), metas[2].dtype, dev)
            return
        y += zp.astype(np.float32)
        if finite:
            # |y| <= 255 + 255: integers already, so the recorded second rint changes nothing, and
            # the clipped values are integers in [0, 255]: clipped straight into the uint8 result
            q = np.empty(y.shape, np.uint8)
            np.clip(y, ylo, yhi, out=q, casting="unsafe")
        else:                             # NaN / inf in x: the recorded steps and cast (NaN -> 0, saturation)
            np.rint(y, out=y)
            np.clip(y, ylo, yhi, out=y)
            q = cast_y(metas[0], wrap(y, metas[0].shape, seq[18].meta.dtype, dev), **y_attrs)
        vals[op.out[0]] = wrap(q, metas[0].shape, metas[0].dtype, dev)
        vals[op.out[1]] = wrap(scale.reshape(()), (), metas[1].dtype, dev)
        vals[op.out[2]] = wrap(zp, (), metas[2].dtype, dev)
    return _Op("dynamic_quantize_linear", (x,), (o[19], o[7], o[12]), metas, run, True), list(range(i, i + len(_DQ)))


# ---- linear layers with a constant weight -------------------------------------------------------
#
# linear reads its (out, in) weight transposed in the GEMM; OpenBLAS packs a transposed B more
# slowly than a row-major one: x @ W.T vs x @ (a contiguous W.T) 1.44x on PP-OCR's classifier
# (40 x 120 @ 120 x 6625) and 1.07x on a small encoder's layers, the same bits (the summation
# order does not change). So a constant weight is copied transposed once when the plan is
# compiled, up to _LINEAR_COPY_BYTES of copies per plan. One row (a matrix-vector product,
# where the copy gives no gain and other bits) runs dense.c's ember_gemv on the weight as it is
# (with a relu / clip after it in its epilogue), and products of at most _LINEAR_COPY_MIN_MACS
# multiply-adds keep the recorded kernel: there OpenBLAS may run its small-matrix kernels
# (SkylakeX and later, its own choice on AVX-512 machines), whose transposed-B and row-major-B
# versions sum in other orders: with OPENBLAS_CORETYPE unset, 30 of 84 random products below
# 2**20 multiply-adds gave other bits (e.g. 3 x 128 @ 128 x 384), none of 1020 above it.
_LINEAR_COPY_BYTES = 64 << 20
_LINEAR_COPY_MIN_MACS = 1 << 20


def _sole_reader(readers, only, s):
    """``[i]`` when step i alone reads slot ``s`` (and ``s`` is not protected: ``only``), else None."""
    r = readers.get(s, [])
    return r if len(r) == 1 and only(s, r[0]) else None


def _linear_const(steps, i, consts, dtypes, budget, readers, only, producer):
    """(an _Op, later step indices) for a linear step whose weight is a constant float32 matrix
    (float32 input and bias checked when it runs: a plan's inputs have no recorded dtype here).
    One row (a classifier's at batch 1) with a constant float32 bias or none: dense.c's ember_gemv
    with the relu, clip or hard sigmoid / hard swish that alone reads the result in its epilogue (numpy_nn.NativeGemv, the
    addresses taken once; ~8 -> ~1.5 us of Python, and one step fewer), the same bits as the
    recorded linear and activation steps, which run where the kernel does not (the library off,
    another dtype). A reshape that only this linear reads (a flatten before a classifier) is
    taken into the step: the kernel reads the reshape's input as it is (its K floats in order).
    More rows: the transposed copy described above."""
    st = steps[i]
    if st.name != "linear" or st.multi or len(st.ins) not in (2, 3) or st.meta.dtype.name != "float32":
        return None
    w = consts.get(st.ins[1])
    if w is None or w.dtype.name != "float32" or len(w.shape) != 2 or st.ins[0] == st.ins[1]:
        return None
    from ..tensor import Tensor
    wrap = Tensor._wrap
    b = consts.get(st.ins[2]) if len(st.ins) == 3 else None
    if math.prod(st.meta.shape[:-1]) == 1 and st.ins[0] not in consts and (
            len(st.ins) == 2 or (b is not None and b.dtype.name == "float32" and tuple(b.shape) == (w.shape[0],))):
        from .numpy_nn import NativeGemv, activation_
        used, act, args = _one_row_act(steps, i, readers, only, consts)
        kernel = getattr(st.kernel, "__wrapped__", st.kernel)
        meta, ins, attrs, dev = st.meta, tuple(st.ins), st.attrs, st.device
        ometa = steps[used[-1]].meta if used else meta
        o1, shape1, dtype1 = (steps[used[-1]].outs[0] if used else st.outs[0]), ometa.shape, ometa.dtype
        gemv = [None]
        flat = steps[producer[ins[0]]] if ins[0] in producer else None
        if flat is None or flat.name != "reshape" or flat.multi or len(flat.ins) != 1 or flat.ins[0] in consts \
                or not only(ins[0], i):
            flat = None
        xs = flat.ins[0] if flat is not None else ins[0]
        fshape, fdtype = (flat.meta.shape, flat.meta.dtype) if flat is not None else (None, None)

        def run(vals, op):
            bb = vals[ins[2]]._buf if len(ins) == 3 else None
            g = gemv[0]
            if g is None or g.w is not vals[ins[1]]._buf or g.bias is not bb:
                g = gemv[0] = NativeGemv(vals[ins[1]]._buf, bb, act, args)     # (a new weight: anew)
            xt = vals[xs]
            yb = g(xt._buf) if g.ok else None
            if yb is None:                      # (the recorded steps: the reshape, linear, activation)
                if flat is not None:
                    xt = wrap(xt._buf.reshape(fshape), fshape, fdtype, dev)
                yb = kernel(meta, xt, *[vals[k] for k in ins[1:]], **attrs)
                if act is not None:
                    yb = activation_(yb if yb.dtype == _F32 and yb.flags.writeable else np.array(yb, _F32),
                                     act, args)
            vals[o1] = wrap(yb.reshape(shape1), shape1, dtype1, dev)
        op = _Op("linear", (xs,) + ins[1:], o1, ometa, run)
        op.act = act
        return op, used
    wb = np.asarray(w._buf)
    if wb.nbytes > budget[0] or not wb.size:
        return None
    budget[0] -= wb.nbytes
    # (in, out), made once; ember never writes a tensor's buffer in place (an update swaps in a
    # new one: Tensor._set_), so the copy is valid while the weight holds the same buffer object
    cache = [wb, np.ascontiguousarray(wb.T)]
    recorded = _recorded(st)
    o, shape, dtype, dev = st.outs[0], st.meta.shape, st.meta.dtype, st.device
    bias = len(st.ins) == 3

    def run(vals, op):
        a = vals[op.ins[0]]._buf
        if a.ndim > 2 and a.flags.c_contiguous:
            a = a.reshape(-1, a.shape[-1])
        b = vals[op.ins[2]]._buf if bias else None
        w = vals[op.ins[1]]._buf
        if a.ndim != 2 or a.shape[0] < 2 or a.dtype != _F32 or (bias and b.dtype != _F32) \
                or a.shape[0] * a.shape[1] * cache[0].shape[0] <= _LINEAR_COPY_MIN_MACS:
            return recorded(vals, op)
        if w is not cache[0]:                           # the weight was updated (swapped): copy anew
            if not isinstance(w, np.ndarray) or w.dtype != _F32 or w.shape != cache[0].shape:
                return recorded(vals, op)
            cache[:] = [w, np.ascontiguousarray(w.T)]
        y = matmul(a, cache[1])
        if bias:
            y += b
        vals[o] = wrap(y.reshape(shape), shape, dtype, dev)
    return _Op("linear", st.ins, o, st.meta, run), []


def _linear_fused(steps, i, consts, budget, readers, only, producer, protected):
    """``(op, later step indices, the layer norm's step index or None)`` for a float32 linear step of
    two or more rows with a constant (N, K) float32 weight (and a constant bias or none) that has
    a layer norm over K that only it reads before it (a pre-norm transformer's qkv / fc1), a
    GELU that alone reads its result, or an add of a value of the same shape computed before the
    linear (a residual; a relu / clip between them too): one op, fused.c's ember_linear
    (numpy_nn.NativeLinear: the weight packed once, ~3 us of Python a call; rows over the
    threads). On an encoder layer's 256 x 128 rows the four linears with these steps went from
    ~0.8 to ~0.35 ms (pre-norm encoder 8x32x128 in bench_core's graphs section). The product
    sums in k order (not BLAS's blocks): the step-by-step run's results within float32 rounding,
    not bit for bit; its layer norm, GELU and add are the same float32 operations as the
    separate native steps'. Where the kernel cannot run (the library off, another dtype), the
    recorded steps run. A plain linear (+ bias) keeps ``_linear_const``'s path."""
    st = steps[i]
    if st.name != "linear" or st.multi or len(st.ins) not in (2, 3) or st.meta.dtype.name != "float32" \
            or math.prod(st.meta.shape[:-1]) < 2:
        return None
    w = consts.get(st.ins[1])
    b = consts.get(st.ins[2]) if len(st.ins) == 3 else None
    if w is None or w.dtype.name != "float32" or len(w.shape) != 2 or st.ins[0] == st.ins[1] \
            or st.ins[0] in consts or (len(st.ins) == 3 and (b is None or b.dtype.name != "float32"
                                                              or tuple(b.shape) != (w.shape[0],))):
        return None
    n, k = w.shape
    if tuple(st.meta.shape[-1:]) != (n,):
        return None
    x = st.ins[0]
    # a layer norm over the last axis (K) only this linear reads
    lnk = producer.get(x)
    ln = steps[lnk] if lnk is not None else None
    if ln is None or ln.name != "layer_norm" or ln.multi or len(ln.ins) != 3 or not only(x, i) \
            or tuple(ln.attrs.get("normalized_shape", ())) != (k,) or ln.meta.dtype.name != "float32" \
            or ln.ins[0] in consts or x in protected:
        ln, lnk = None, None
    used, act, args = [], None, (0.0, 0.0, 0.0, 0.0)
    y, shape = st.outs[0], tuple(st.meta.shape)
    r = readers.get(y, [])
    if len(r) == 1 and only(y, r[0]):
        nxt = steps[r[0]]
        if not nxt.multi and nxt.ins == (y,) and nxt.meta.dtype.name == "float32" and tuple(nxt.meta.shape) == shape:
            if nxt.name == "gelu" and nxt.attrs.get("approximate", "none") in ("none", "tanh"):
                act = "gelu" if nxt.attrs.get("approximate", "none") == "none" else "gelu_tanh"
            elif nxt.name in ("relu", "clip"):
                _, act, args = _one_row_act(steps, i, readers, only)
            if act is not None:
                used, y = [r[0]], nxt.outs[0]
    res = None
    r = readers.get(y, [])
    if len(r) == 1 and only(y, r[0]):
        add = steps[r[0]]
        if add.name == "add" and not add.multi and len(add.ins) == 2 and add.meta.dtype.name == "float32" \
                and tuple(add.meta.shape) == shape and add.ins.count(y) == 1:
            other = add.ins[1] if add.ins[0] == y else add.ins[0]
            # (a value made before the linear, of the result's shape and float32: an input's is
            # checked when it runs, the numpy path taking any other)
            if other in producer:
                pm = steps[producer[other]]
                ok = producer[other] < i and not pm.multi and tuple(pm.meta.shape) == shape \
                    and pm.meta.dtype.name == "float32"
            else:
                c = consts.get(other)
                ok = c is None or (tuple(c.shape) == shape and c.dtype.name == "float32")
            if ok:
                res = other
                used.append(r[0])
    if ln is None and res is None and act not in ("gelu", "gelu_tanh"):
        return None         # (a relu / clip alone, a CNN's classifier: BLAS, the eager bits)
    wb = np.asarray(w._buf)
    if wb.nbytes > budget[0]:
        return None
    budget[0] -= wb.nbytes
    from .numpy_nn import NativeLinear
    from ..tensor import Tensor
    wrap = Tensor._wrap
    seq = ([lnk] if lnk is not None else []) + [i] + used
    recs = [_recorded(steps[j]) for j in seq]
    last = steps[seq[-1]]
    o, meta, dev = last.outs[0], last.meta, last.device
    oshape, odtype = meta.shape, meta.dtype
    xs = ln.ins[0] if ln is not None else x
    ins = (xs,) + tuple(st.ins[1:]) + (tuple(ln.ins[1:]) if ln is not None else ()) + ((res,) if res else ())
    ws, bs = st.ins[1], (st.ins[2] if len(st.ins) == 3 else None)
    lws = ln.ins[1:] if ln is not None else None
    eps = ln.attrs.get("eps", 1e-5) if ln is not None else 0.0
    cache = [None]

    def run(vals, op):
        c = cache[0]
        wbuf = vals[ws]._buf
        bbuf = vals[bs]._buf if bs is not None else None
        lnb = (vals[lws[0]]._buf, vals[lws[1]]._buf) if lws is not None else None
        if c is None or c.w is not wbuf or c.bias is not bbuf or (lnb is not None and (
                c.ln[0] is not lnb[0] or c.ln[1] is not lnb[1])):
            c = cache[0] = NativeLinear(wbuf, bbuf, act, args, None if lnb is None else (*lnb, eps))
        yb = c(vals[xs]._buf, vals[res]._buf if res is not None else None) if c.ok else None
        if yb is None:                       # (the recorded steps: layer norm, linear, activation, add)
            for rec in recs:
                rec(vals, None)
            return
        vals[o] = wrap(yb.reshape(oshape), oshape, odtype, dev)
    op = _Op("linear", ins, o, meta, run)
    op.act = act
    return op, used, lnk


def _conv1x1_const(st, x, consts, cin):
    """(weight, bias or None) tensors when step ``st`` is a float32 1x1 convolution of ``x`` (cin
    channels) by a constant weight (and a constant bias or none), stride 1, no padding or groups."""
    if st.name != "conv2d" or st.multi or not st.ins or st.ins[0] != x or len(st.ins) not in (2, 3) \
            or st.meta.dtype.name != "float32":
        return None
    a = st.attrs
    w = consts.get(st.ins[1])
    b = consts.get(st.ins[2]) if len(st.ins) == 3 else None
    if w is None or w.dtype.name != "float32" or len(w.shape) != 4 or tuple(w.shape[1:]) != (cin, 1, 1) \
            or (len(st.ins) == 3 and (b is None or b.dtype.name != "float32")) \
            or tuple(a.get("stride", ())) != (1, 1) or a.get("padding") != ((0, 0), (0, 0)) \
            or tuple(a.get("dilation", (1, 1))) != (1, 1) or a.get("groups", 1) != 1:
        return None
    return w, b


def _act_after(steps, y, consts, readers, only):
    """``(name, (a, b, lo, hi), step indices, result slot)`` for the relu, clip or hard sigmoid chain
    that alone reads ``y`` (float32, its shape); else None."""
    r = _sole_reader(readers, only, y)
    if r is None:
        return None
    st = steps[r[0]]
    if st.multi or st.meta.dtype.name != "float32":
        return None
    if st.name == "relu" and st.ins == (y,):
        return "relu", (0.0, 0.0, 0.0, np.inf), [r[0]], st.outs[0]
    if st.name == "clip" and st.ins == (y,):
        lo, hi = st.attrs.get("min"), st.attrs.get("max")
        return "clip", (0.0, 0.0, -np.inf if lo is None else float(np.float32(lo)),
                        np.inf if hi is None else float(np.float32(hi))), [r[0]], st.outs[0]
    chain = NumpyReplay._hard_chain(steps, r[0], consts, readers, only)
    if chain is None or chain[1] != y or chain[0] != "hard_sigmoid":
        return None
    _, _, a, b, idx = chain
    return "hard_sigmoid", (float(a), float(b), 0.0, 1.0), idx, steps[idx[-1]].outs[0]


def _squeeze_excite(steps, i, consts, readers, only, producer, protected):
    """``(op, later step indices)`` when step i is the sum over the planes of a float32 (1, C, H, W)
    value y that a squeeze-excite reads: sum (keepdims) / a scalar constant, a 1x1 convolution
    by constants + relu / clip, another + hard sigmoid / relu / clip, y * that gate (MobileNetV3's
    global average pool, its two 1x1 layers at one pixel and the product), y read by nothing else.
    One op: the sum and the division as the recorded kernels make them (their bits: numpy_backend's
    row sums, one BLAS matrix-vector product with ones), then fused.c's ember_squeeze_excite
    (numpy_nn.NativeSqueezeExcite: the convolutions' ember_gemv and the product), in place on y
    where the plan owns it; per block ~50-80 us of six steps -> ~20-30 us (MobileNetV3-small at
    224x224, nine blocks). The step-by-step bits. Where the kernel cannot run, the recorded steps."""
    st = steps[i]
    if st.name != "sum" or st.multi or len(st.ins) != 1 or st.meta.dtype.name != "float32" \
            or not st.attrs.get("keepdims") or len(st.meta.shape) != 4:
        return None
    y = st.ins[0]
    if y not in producer or y in protected:
        return None
    ym = steps[producer[y]].meta if not steps[producer[y]].multi else None
    if ym is None or len(ym.shape) != 4 or ym.dtype.name != "float32" \
            or sorted(a % 4 for a in st.attrs.get("axes", ())) != [2, 3]:
        return None
    n, c, h, w = ym.shape
    if n != 1:                  # (at batch 1 the plan's one-pixel convolutions are ember_gemv's: their bits)
        return None
    s = st.outs[0]
    r = _sole_reader(readers, only, s)
    if r is None:
        return None
    dv = steps[r[0]]
    if dv.name != "divide" or dv.multi or len(dv.ins) != 2 or dv.ins[0] != s or dv.meta.dtype.name != "float32":
        return None
    div = _const_scalar(consts, dv.ins[1])
    if div is None:
        return None
    used = [r[0]]
    m = dv.outs[0]
    r = _sole_reader(readers, only, m)
    if r is None:
        return None
    c1 = _conv1x1_const(steps[r[0]], m, consts, c)
    if c1 is None:
        return None
    used.append(r[0])
    act1 = _act_after(steps, steps[r[0]].outs[0], consts, readers, only)
    if act1 is None:
        return None
    used += act1[2]
    r = _sole_reader(readers, only, act1[3])
    if r is None:
        return None
    c2 = _conv1x1_const(steps[r[0]], act1[3], consts, c1[0].shape[0])
    from .numpy_nn import _NATIVE_GEMV_MAX_MACS
    if c2 is None or c2[0].shape[0] != c or c * c1[0].shape[0] > _NATIVE_GEMV_MAX_MACS:
        return None
    used.append(r[0])
    act2 = _act_after(steps, steps[r[0]].outs[0], consts, readers, only)
    if act2 is None:
        return None
    used += act2[2]
    gate = act2[3]
    r = _sole_reader(readers, only, gate)
    if r is None:
        return None
    mul = steps[r[0]]
    if mul.name != "multiply" or mul.multi or sorted(mul.ins) != sorted((y, gate)) or y == gate \
            or tuple(mul.meta.shape) != (n, c, h, w) or mul.meta.dtype.name != "float32":
        return None
    used.append(r[0])
    if sorted(readers.get(y, [])) != sorted([i, r[0]]):
        return None
    from .numpy_nn import NativeSqueezeExcite
    from ..tensor import Tensor
    wrap = Tensor._wrap
    recs = [_recorded(steps[j]) for j in [i] + used]
    axes, divc, yshape = tuple(st.attrs["axes"]), div, tuple(ym.shape)
    from .numpy_backend import _ROW_SUM_MAX, _ROW_SUM_MIN_ROWS
    ones = np.ones(h * w, np.float32) if 2 <= h * w <= _ROW_SUM_MAX and c >= _ROW_SUM_MIN_ROWS else None
    o, meta, dev = mul.outs[0], mul.meta, mul.device
    oshape, odtype = meta.shape, meta.dtype
    w1s, w2s = steps[used[1]].ins[1:], steps[used[2 + len(act1[2])]].ins[1:]
    cache = [(), None]              # (the weight and bias buffers, their NativeSqueezeExcite)
    args = (act1[0], act1[1], act2[0], act2[1])

    def run(vals, op, into=None):
        w1, b1 = vals[w1s[0]]._buf, (vals[w1s[1]]._buf if len(w1s) == 2 else None)
        w2, b2 = vals[w2s[0]]._buf, (vals[w2s[1]]._buf if len(w2s) == 2 else None)
        bufs, se = cache
        if len(bufs) != 4 or bufs[0] is not w1 or bufs[1] is not b1 or bufs[2] is not w2 or bufs[3] is not b2:
            se = NativeSqueezeExcite(w1, b1, w2, b2, *args)
            cache[:] = [(w1, b1, w2, b2), se]
        a = vals[y]._buf
        yb = None
        if se.ok and a.dtype == _F32 and a.flags.c_contiguous and a.shape == yshape:
            # the means as the recorded sum and division make them (numpy_backend's row sums: one
            # BLAS matrix-vector product with ones where it takes the shape, else numpy's sum)
            sm = matmul(a.reshape(c, h * w), ones) if ones is not None else np.sum(a, axis=axes, keepdims=True)
            yb = se(a, np.true_divide(sm, divc), into)
        if yb is None:
            for rec in recs:
                rec(vals, None)
            return
        vals[o] = wrap(yb, oshape, odtype, dev)
    return _Op("squeeze_excite", (y,) + tuple(w1s) + tuple(w2s), o, meta, run), used


# steps that only re-view their input (numpy_backend copies the result of a permute or a slice;
# an attention step reads through them: _attention)
_VIEWS = frozenset({"reshape", "permute_dims", "slice"})


def _silu_mul(steps, j, readers, only, producer):
    """``(op, [], {the silu's output})`` when step j is a float32 multiply of a silu's result (a
    float32 silu step that nothing else reads) by another float32 value of its shape (a SwiGLU
    feed-forward, ``silu(g) * u``): one native pass in place of both steps (the silu's op is
    dropped; numpy_llm.native_silu_mul, glu.c), within float32 roundings of the two (vec.h's exp);
    where the kernel does not take a run's arrays, or numpy_llm.NATIVE_SILU_MUL is off, the two
    recorded steps run."""
    from . import numpy_llm
    m = steps[j]
    if m.name != "multiply" or m.multi or len(m.ins) != 2 or m.meta.dtype.name != "float32" \
            or m.ins[0] == m.ins[1]:
        return None
    for s, u in (m.ins, m.ins[::-1]):
        i = producer.get(s)
        st = steps[i] if i is not None else None
        if st is not None and st.name == "silu" and not st.multi and len(st.ins) == 1 \
                and st.meta.dtype.name == "float32" and tuple(st.meta.shape) == tuple(m.meta.shape) \
                and readers.get(s) == [j] and only(s, j):
            break
    else:
        return None
    if numpy_llm.silu_mul_kernel() is None:
        return None
    x = st.ins[0]
    run_silu, run_mul = _recorded(st), _recorded(m)
    o, meta, dev = m.outs[0], m.meta, m.device
    shape, dtype = meta.shape, meta.dtype
    from ..tensor import Tensor
    wrap, native = Tensor._wrap, numpy_llm.silu_mul_call(shape)

    def run(vals, op):
        y = native(vals[x]._buf, vals[u]._buf)
        if y is None:
            run_silu(vals, op)
            run_mul(vals, op)
            vals[s] = None
        else:
            vals[o] = wrap(y, shape, dtype, dev)
    return _Op("silu_mul", (x, u), o, meta, run), [], {s}


def _slice_key(st):
    """The index tuple of a slice step of numpy_backend's kernel (its region), else None."""
    if st.name != "slice" or st.multi or len(st.ins) != 1:
        return None
    from .numpy_backend import _slice
    if getattr(st.kernel, "__wrapped__", st.kernel) is not _slice:
        return None
    key = []
    for (start, _stop, step), n in zip(st.attrs["slices"], st.meta.shape):
        stop = start + n * step
        key.append(slice(start, stop if stop >= 0 else None, step))
    return tuple(key)


def _slice_steps(steps, i, readers, producer, protected):
    """``(op, later steps, {the reshape's output} or ())`` for two or more slice steps of one value in
    a row (a decode step's q / k / v and gate / up halves): one op with every slice's result, each
    the kernel's contiguous copy of its region (``_slice_step``); with the reshape step just before
    them when only they read its result (a fused qkv product's split into heads): its view, never
    stored (SmolLM2's decode step: 180 slice and 60 reshape ops -> 90 and 30)."""
    key = _slice_key(steps[i])
    if key is None:
        return None
    x = steps[i].ins[0]
    group, keys = [i], [key]
    while i + len(group) < len(steps):
        nxt = steps[i + len(group)]
        k2 = _slice_key(nxt) if nxt.ins[:1] == (x,) else None
        if k2 is None:
            break
        group.append(i + len(group))
        keys.append(k2)
    if len(group) < 2:
        return None
    src, rshape, gone = x, None, ()
    k = producer.get(x)
    if k == i - 1 and x not in protected and sorted(readers.get(x, [])) == group:
        rs = steps[k]
        from .numpy_backend import KERNELS
        if rs.name == "reshape" and not rs.multi and len(rs.ins) == 1 and rs.kernel is KERNELS.get("reshape"):
            src, rshape, gone = rs.ins[0], tuple(rs.meta.shape), {x}
    from ..tensor import Tensor
    wrap, contiguous, dev = Tensor._wrap, np.ascontiguousarray, steps[i].device
    outs = tuple(steps[j].outs[0] for j in group)
    metas = tuple(steps[j].meta for j in group)
    items = tuple((o, kk, m.shape, m.dtype) for o, kk, m in zip(outs, keys, metas))

    def run(vals, op):
        a = vals[src]._buf
        if rshape is not None:
            a = a.reshape(rshape)
        for o, kk, shape, dtype in items:
            vals[o] = wrap(contiguous(a[kk]), shape, dtype, dev)
    return _Op("slice", (src,), outs, metas, run, multi=True), group[1:], gone


def _slice_step(steps, i):
    """``(op, [])`` for a slice step of numpy_backend's kernel: the same contiguous copy of the
    same region, its index tuple made once (the kernel builds it every call: ~0.9 -> ~0.3 us, 180
    slices in a SmolLM2 decode step)."""
    st = steps[i]
    key = _slice_key(st)
    if key is None:
        return None
    x, o, shape, dtype, dev = st.ins[0], st.outs[0], st.meta.shape, st.meta.dtype, st.device
    from ..tensor import Tensor
    wrap, contiguous = Tensor._wrap, np.ascontiguousarray

    def run(vals, op):
        vals[o] = wrap(contiguous(vals[x]._buf[key]), shape, dtype, dev)
    return _Op("slice", st.ins, o, st.meta, run), []


def _reshape_step(steps, i):
    """``(op, [])`` for a reshape step of numpy_backend's kernel: the same ``reshape`` of the
    buffer, without the kernel's call and keyword arguments (0.75 -> 0.44 us; a SmolLM2 decode step's
    30 attention outputs)."""
    st = steps[i]
    if st.name != "reshape" or st.multi or len(st.ins) != 1:
        return None
    from .numpy_backend import KERNELS
    if st.kernel is not KERNELS.get("reshape"):
        return None
    x, o, shape, dtype, dev = st.ins[0], st.outs[0], st.meta.shape, st.meta.dtype, st.device
    from ..tensor import Tensor
    wrap = Tensor._wrap

    def run(vals, op):
        vals[o] = wrap(vals[x]._buf.reshape(shape), shape, dtype, dev)
    return _Op("reshape", st.ins, o, st.meta, run), []


def _prepared_calls():
    """{step name: (the numpy backend's kernel, a maker of its prepared call from (out meta, attrs))}."""
    from . import numpy_llm, numpy_quant
    return {
        "qlinear": (numpy_quant._qlinear, lambda meta, a: numpy_quant.qlinear_call(a["qtype"], a["n"], a["k"], meta.shape)),
        "rope": (numpy_llm._rope, lambda meta, a: numpy_llm.rope_call(meta.shape, a["mode"])
                 if len(meta.shape) == 3 else None),
        "attention_cached": (numpy_llm._attention_cached, None),
    }


def _prepared_step(steps, i):
    """``(op, [])`` for a float32 qlinear, rope or attention_cached step of the numpy backend's kernel:
    the kernel's native call prepared once for the step's shapes and attributes (numpy_quant.
    qlinear_call, numpy_llm.rope_call / attention_cached_call: per call only what can change between
    runs is checked), the same bits; the recorded step runs where that call answers None. A SmolLM2
    decode step has 121 + 30 + 30 of them."""
    st = steps[i]
    if st.name not in ("qlinear", "rope", "attention_cached") or st.multi or st.meta.dtype.name != "float32":
        return None
    kernel, make = _prepared_calls()[st.name]
    if getattr(st.kernel, "__wrapped__", st.kernel) is not kernel:
        return None
    meta, attrs = st.meta, st.attrs
    if st.name == "attention_cached":
        if len(st.ins) != 6 or len(meta.shape) != 3:
            return None
        return _attention_cached_step(st)
    call = make(meta, attrs)
    if call is None:
        return None
    from ..tensor import Tensor
    wrap, recorded = Tensor._wrap, _recorded(st)
    o, shape, dtype, dev = st.outs[0], meta.shape, meta.dtype, st.device
    if len(st.ins) == 2:
        x0, x1 = st.ins

        def run(vals, op):
            y = call(vals[x0]._buf, vals[x1]._buf)
            if y is None:
                recorded(vals, op)
            else:
                vals[o] = wrap(y, shape, dtype, dev)
    elif len(st.ins) == 3:
        x0, x1, x2 = st.ins

        def run(vals, op):
            y = call(vals[x0]._buf, vals[x1]._buf, vals[x2]._buf)
            if y is None:
                recorded(vals, op)
            else:
                vals[o] = wrap(y, shape, dtype, dev)
    else:
        return None
    run.attrs, run.device = attrs, dev
    return _Op(st.name, st.ins, o, meta, run), []


def _attention_cached_step(st):
    """_prepared_step's op for attention_cached: the caches' shape is read from their tensors on the
    first run (they are a plan's constants or inputs; the call checks them each run)."""
    from . import numpy_llm
    from ..tensor import Tensor
    wrap, recorded = Tensor._wrap, _recorded(st)
    meta, attrs = st.meta, st.attrs
    o, shape, dtype, dev = st.outs[0], meta.shape, meta.dtype, st.device
    q, k, v, kc, vc, pos = st.ins
    scale, window, softcap = attrs.get("scale"), attrs.get("window", 0), attrs.get("softcap", 0.0)
    calls = {}   # the caches' shape -> its prepared call

    def run(vals, op):
        kb = vals[kc]._buf
        call = calls.get(kb.shape)
        if call is None:
            if len(kb.shape) != 3 or scale is None or len(calls) > 8:
                return recorded(vals, op)
            call = calls[kb.shape] = numpy_llm.attention_cached_call(shape, kb.shape, scale, window, softcap)
        y = call(vals[q]._buf, vals[k]._buf, vals[v]._buf, kb, vals[vc]._buf, vals[pos]._buf)
        if y is None:
            recorded(vals, op)
        else:
            vals[o] = wrap(y, shape, dtype, dev)
    run.attrs, run.device = attrs, dev
    return _Op(st.name, st.ins, o, meta, run), []


def _add_rms_norm(steps, j, readers, producer):
    """``(op, [], {the add's output})`` when step j is a float32 rms_norm of the result of a
    float32 add of two values of its shape that nothing reads before step j (a decoder layer's
    residual ``x = x + o`` then ``rms_norm(x)``; x is read again later): one op with both results
    (numpy_llm.native_add_rms_norm, rmsnorm.c: the two steps' bits); where the kernel does not take
    a run's arrays, or numpy_llm.NATIVE_ADD_RMS_NORM is off, the two recorded steps run."""
    from . import numpy_llm
    st = steps[j]
    if st.name != "rms_norm" or st.multi or len(st.ins) != 2 or st.meta.dtype.name != "float32":
        return None
    s, w = st.ins
    i = producer.get(s)
    ad = steps[i] if i is not None else None
    if ad is None or ad.name != "add" or ad.multi or len(ad.ins) != 2 or ad.meta.dtype.name != "float32" \
            or tuple(ad.meta.shape) != tuple(st.meta.shape) or s == w or w in ad.outs \
            or min(readers.get(s, [j])) < j or producer.get(w, -1) > i:
        return None
    if numpy_llm.add_rms_norm_kernel() is None:
        return None
    a, b = ad.ins
    run_add, run_norm = _recorded(ad), _recorded(st)
    n = st.outs[0]
    eps = float(st.attrs["eps"])
    dev = st.device
    (s_shape, s_dtype), (n_shape, n_dtype) = (ad.meta.shape, ad.meta.dtype), (st.meta.shape, st.meta.dtype)
    from ..tensor import Tensor
    wrap, native = Tensor._wrap, numpy_llm.add_rms_norm_call(st.meta.shape, eps)

    def run(vals, op):
        r = native(vals[a]._buf, vals[b]._buf, vals[w]._buf)
        if r is None:
            run_add(vals, op)
            run_norm(vals, op)
        else:
            vals[s] = wrap(r[0], s_shape, s_dtype, dev)
            vals[n] = wrap(r[1], n_shape, n_dtype, dev)
    return _Op("add_rms_norm", (a, b, w), (s, n), (ad.meta, st.meta), run, multi=True), [], {s}


def _view_of(a, chain):
    """``a`` through the recorded view steps ``chain`` ((name, attrs, out shape), ...) as a numpy
    view where numpy can make one (a reshape it cannot view copies, as np.reshape does)."""
    for name, attrs, shape in chain:
        if name == "reshape":
            a = a.reshape(shape)
        elif name == "permute_dims":
            a = a.transpose(attrs["axes"])
        else:
            key = []
            for (start, _stop, step), n in zip(attrs["slices"], shape):
                stop = start + n * step
                key.append(slice(start, stop if stop >= 0 else None, step))
            a = a[tuple(key)]
    return a


def _attention(steps, i, consts, readers, only, producer, protected):
    """``(op, later step indices, earlier step indices)`` when step i is the scores' matmul of an
    attention over heads: matmul(q, k^T) [* a float32 scalar constant], softmax over the last
    axis, matmul(., v), float32, 4-d (batch, heads, tokens, head size) or 3-d (one head), each
    result read only by the next; with a permute (0, 2, 1, 3) and a reshape to (batch, tokens,
    heads x head size) after it (the heads merged back) when only they read it. One op, fused.c's
    ember_attention (numpy_nn.native_attention): q, k^T and v read through their reshape /
    permute / slice steps where these feed only the attention (an exported qkv projection's
    split into heads: no permuted copies), the result written in the merged layout. On the
    8x32x128 encoder's layers (8 x 4 heads of 32 x 32): ~150 us of steps -> ~60 us. The products
    sum in order (not BLAS's); the softmax is rows.c's: the step-by-step run's results within
    float32 rounding. Where the kernel cannot run, the recorded steps run."""
    st = steps[i]
    if st.name != "matmul" or st.multi or len(st.ins) != 2 or st.meta.dtype.name != "float32" \
            or len(st.meta.shape) not in (3, 4) or st.ins[0] in consts or st.ins[1] in consts:
        return None
    nd = len(st.meta.shape)
    core = [i]
    s = st.outs[0]
    r = _sole_reader(readers, only, s)
    if r is None:
        return None
    nxt = steps[r[0]]
    scale = None
    if nxt.name == "multiply" and not nxt.multi and len(nxt.ins) == 2 and nxt.meta.dtype.name == "float32" \
            and tuple(nxt.meta.shape) == tuple(st.meta.shape) and nxt.ins.count(s) == 1:
        c = _const_scalar(consts, nxt.ins[1] if nxt.ins[0] == s else nxt.ins[0])
        if c is None:
            return None
        scale = float(c)
        core.append(r[0])
        s = nxt.outs[0]
        r = _sole_reader(readers, only, s)
        if r is None:
            return None
        nxt = steps[r[0]]
    if nxt.name != "softmax" or nxt.multi or nxt.ins != (s,) or nxt.meta.dtype.name != "float32" \
            or nxt.attrs.get("axis", -1) % nd != nd - 1:
        return None
    core.append(r[0])
    s = nxt.outs[0]
    r = _sole_reader(readers, only, s)
    if r is None:
        return None
    pv = steps[r[0]]
    if pv.name != "matmul" or pv.multi or len(pv.ins) != 2 or pv.ins[0] != s or pv.ins[1] == s \
            or pv.ins[1] in consts or pv.meta.dtype.name != "float32" or len(pv.meta.shape) != nd:
        return None
    core.append(r[0])
    out, meta = pv.outs[0], pv.meta
    merge = False
    r = readers.get(out, [])
    if nd == 4 and len(r) == 1 and only(out, r[0]):
        pm = steps[r[0]]
        if pm.name == "permute_dims" and not pm.multi and tuple(pm.attrs.get("axes", ())) == (0, 2, 1, 3):
            r2 = readers.get(pm.outs[0], [])
            if len(r2) == 1 and only(pm.outs[0], r2[0]):
                rs = steps[r2[0]]
                b, h, t, e = meta.shape
                if rs.name == "reshape" and not rs.multi and tuple(rs.meta.shape) == (b, t, h * e):
                    merge = True
                    core += [r[0], r2[0]]
                    out, meta = rs.outs[0], rs.meta
    # the view steps q, k^T and v come through, where nothing else reads them
    operands = (st.ins[0], st.ins[1], pv.ins[1])
    cand = set()
    for x in operands:
        while x in producer and x not in protected:
            p = steps[producer[x]]
            if p.name not in _VIEWS or p.multi or len(p.ins) != 1 or p.ins[0] in consts:
                break
            cand.add(producer[x])
            x = p.ins[0]
    changed = True
    while changed:
        changed = False
        for k in sorted(cand):
            o = steps[k].outs[0]
            if any(j not in cand and j not in core for j in readers.get(o, [])) or o in protected:
                cand.discard(k)
                changed = True
    chains = []
    for x in operands:
        chain = []
        while x in producer and producer[x] in cand:
            p = steps[producer[x]]
            chain.append((p.name, p.attrs, tuple(p.meta.shape)))
            x = p.ins[0]
        chains.append((x, tuple(reversed(chain))))
    from .numpy_nn import NativeAttention
    from ..tensor import Tensor
    wrap = Tensor._wrap
    group = sorted(cand | set(core))
    recs = [_recorded(steps[j]) for j in group]
    dev = pv.device
    oshape, odtype = meta.shape, meta.dtype
    (q0, qc), (k0, kc), (v0, vc) = chains
    # by the roots' (shape, strides): (NativeAttention, each view's offset in bytes from its root,
    # or None where a view is a copy: then the views are made each run)
    calls: dict = {}

    def run(vals, op):
        a, b, c = vals[q0]._buf, vals[k0]._buf, vals[v0]._buf
        key = (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype, c.shape, c.strides, c.dtype)
        hit = calls.get(key)
        if hit is None:
            views = (_view_of(a, qc), _view_of(b, kc), _view_of(c, vc))
            att = NativeAttention(*views, scale, merge)
            offs = None
            if all(np.may_share_memory(x, r) for x, r in zip(views, (a, b, c))):
                offs = tuple(x.ctypes.data - r.ctypes.data for x, r in zip(views, (a, b, c)))
            hit = (att, offs)
            if len(calls) < 16:
                calls[key] = hit
        att, offs = hit
        yb = None
        if att.ok:
            if offs is not None:
                yb = att(_addr(a) + offs[0], _addr(b) + offs[1], _addr(c) + offs[2])
            else:
                views = (_view_of(a, qc), _view_of(b, kc), _view_of(c, vc))
                yb = att(*(x.ctypes.data for x in views))
        if yb is None:                        # (the recorded steps, views and copies included)
            for rec in recs:
                rec(vals, None)
            return
        vals[out] = wrap(yb.reshape(oshape), oshape, odtype, dev)
    op = _Op("attention", (q0, k0, v0), out, meta, run)
    return op, [j for j in group if j > i], [j for j in group if j < i]


def _one_row_act(steps, i, readers, only, consts=None):
    """([the activation's step indices] or [], activation name or None, its (a, b, lo, hi)): the relu
    or clip (float32, the same shape) that alone reads linear step i's result; with ``consts``
    also a hard sigmoid / hard swish chain (``NumpyReplay._hard_chain``: dense.c's epilogue
    rounds it as those steps)."""
    st = steps[i]
    y = st.outs[0]
    r = readers.get(y, [])
    if len(r) == 1 and only(y, r[0]):
        nxt = steps[r[0]]
        if not nxt.multi and nxt.ins == (y,) and nxt.meta.dtype.name == "float32" \
                and tuple(nxt.meta.shape) == tuple(st.meta.shape):
            if nxt.name == "relu":
                return [r[0]], "relu", (0.0, 0.0, 0.0, np.inf)
            if nxt.name == "clip":
                lo, hi = nxt.attrs.get("min"), nxt.attrs.get("max")
                return [r[0]], "clip", (0.0, 0.0, -np.inf if lo is None else float(np.float32(lo)),
                                        np.inf if hi is None else float(np.float32(hi)))
    if consts is not None and r and y not in consts:
        chain = NumpyReplay._hard_chain(steps, min(r), consts, readers, only)
        if chain is not None and chain[1] == y:
            name, _, a, b, idx = chain
            last = steps[idx[-1]]
            if sorted(r) == sorted({idx[0], idx[-1]} if name == "hard_swish" else {idx[0]}) \
                    and tuple(last.meta.shape) == tuple(st.meta.shape) and last.meta.dtype.name == "float32":
                return idx, name, (float(a), float(b), 0.0, 1.0)
    return [], None, (0.0, 0.0, 0.0, 0.0)


def _integer_matmul(steps, i, consts, readers, only, dtypes):
    """(op, step indices) for cast(a -> int32), cast(zp -> int32), subtract, matmul(., W) [,
    cast(-> float32)] with W a constant int32 matrix and a uint8: ``(a - zp) @ W`` on float32 BLAS
    with a float32 copy of W made once (exact when k * 255 * max|W| < 2**24, else float64 BLAS),
    straight to float32 when the next step casts the int32 result to it."""
    if i + 4 > len(steps):
        return None
    ca, cz, sub, mm = steps[i:i + 4]
    if (ca.name, cz.name, sub.name, mm.name) != ("cast", "cast", "subtract", "matmul") or \
            any(st.multi for st in (ca, cz, sub, mm)):
        return None
    a, z = ca.outs[0], cz.outs[0]
    if sub.ins != (a, z) or ca.meta.dtype.name != "int32" or cz.meta.dtype.name != "int32" or cz.meta.shape != () \
            or sub.meta.dtype.name != "int32" or mm.ins[0] != sub.outs[0] or mm.meta.dtype.name != "int32":
        return None
    w = consts.get(mm.ins[1])
    if dtypes.get(ca.ins[0]) != "uint8" or dtypes.get(cz.ins[0]) != "uint8" or w is None or w.dtype.name != "int32" or w.ndim != 2 or not (only(a, i + 2) and only(z, i + 2)) \
            or not only(sub.outs[0], i + 3) or mm.ins[0] == mm.ins[1]:
        return None
    wb = np.asarray(w._buf)
    if not wb.size:
        return None
    from .numpy_backend import exact_float_type, max_abs
    ft = exact_float_type(wb.shape[0], 255.0, max_abs(wb))
    if ft is None:
        return None
    wf = wb.astype(ft)                       # once, when the plan is compiled
    used = [i, i + 1, i + 2, i + 3]
    out, meta = mm.outs[0], mm.meta
    r = readers.get(out, [])
    if len(r) == 1 and only(out, r[0]) and steps[r[0]].name == "cast" and steps[r[0]].meta.dtype.name == "float32" \
            and r[0] == i + 4 and ft is np.float32:
        used.append(i + 4)
        out, meta = steps[i + 4].outs[0], steps[i + 4].meta
    dev = mm.device
    from ..tensor import Tensor
    wrap = Tensor._wrap
    ins = (ca.ins[0], cz.ins[0])

    def run(vals, op):
        at, zt = vals[op.ins[0]], vals[op.ins[1]]
        A = at._buf
        if A.dtype != np.uint8:
            x = A                                       # "centered": (a - zp) as float32 already
        else:
            Z = zt._buf                                 # uint8 both (checked when compiled)
            if op.qgemm is not None:                    # the native integer product (exact int32)
                y = op.qgemm(A, Z, as_float=op.meta.dtype.name == "float32")
                if y is not None:
                    vals[op.out] = wrap(y.reshape(op.meta.shape), op.meta.shape, op.meta.dtype, dev)
                    return
            x = A.astype(ft)
            x -= ft(Z)                                  # exact: integers below 256
        if x.ndim > 2:
            y = matmul(x.reshape(-1, x.shape[-1]), wf).reshape(op.meta.shape)
        else:
            y = matmul(x, wf)
        if op.meta.dtype.name != "float32":
            y = y.astype(np.int32)
        vals[op.out] = wrap(y, op.meta.shape, op.meta.dtype, dev)
    op = _Op("matmul_integer", ins, out, meta, run)
    op.mode = "float32" if ft is np.float32 else None    # (may become "centered")
    qg = numpy_rows.QGemm(wb)                            # (W packed once, where its values are int8)
    op.qgemm = qg if qg.ok else None
    return op, used


def _centered_quantization(ops: list, protected) -> None:
    """A dynamic_quantize_linear whose quantized result is read only by float32 matmul_integer
    ops, each with that same zero point, writes ``y - zp`` as float32 for them (clipped to
    [-zp, 255 - zp]; the same integers), and those read it as is: no uint8 array, and no cast and
    subtraction per matmul (three passes fewer over the activations)."""
    readers: dict = {}
    for op in ops:
        for s in op.ins:
            readers.setdefault(s, []).append(op)
    for op in ops:
        if op.name != "dynamic_quantize_linear" or op.out[0] in protected:
            continue
        y, zp = op.out[0], op.out[2]
        mms = readers.get(y, [])
        if mms and all(m.name == "matmul_integer" and m.mode == "float32" and m.ins == (y, zp) for m in mms):
            op.mode = "centered"
            op.qgemm = all(m.qgemm is not None for m in mms)
            for m in mms:
                m.mode = "centered"


def compile_plan(plan):
    """A NumpyReplay of ``plan``, or None (``EMBER_NUMPY_PLAN=off``, or a plan with host steps)."""
    if os.environ.get("EMBER_NUMPY_PLAN", "on") == "off":
        return None
    try:
        return NumpyReplay(plan)
    except ValueError:
        return None
