"""The numpy device's compiled replay of an execution plan (``NumpyBackend.compile_plan``).

A plan replayed step by step allocates a new array for every kernel call and makes one pass over
memory per primitive: the activations exporters write as chains of primitives (HardSwish:
multiply, add, clip, multiply) cost four passes and four arrays. Knowing the whole plan, this
replay does these things on top of the recorded kernels, with results identical bit for bit (the
same float32 operations in the same order, only the destination arrays differ):

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
- **one-row linears** with a constant weight run dense.c's ember_gemv, the relu or clip after them
  in its epilogue (a classifier at batch 1);
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
from .numpy_nn import clip

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
        for i, st in enumerate(steps):
            if i in skip:
                continue
            dq = _dynamic_quantize(steps, i, consts, readers, only)
            if dq is not None:
                op, used = dq
                skip.update(used)
                ops.append(op)
                continue
            qm = _integer_matmul(steps, i, consts, readers, only, dtypes)
            if qm is not None:
                op, used = qm
                skip.update(used)
                ops.append(op)
                continue
            lin = _linear_const(steps, i, consts, dtypes, budget, readers, only, producer)
            if lin is not None:
                op, used = lin
                skip.update(used)
                if op.ins[0] != st.ins[0]:          # (it reads the input of the reshape before it)
                    ops = [o for o in ops if o.multi or o.out != st.ins[0]]
                ops.append(op)
                continue
            ca = self._conv_act(steps, i, consts, readers, only, protected)
            if ca is not None:
                op, used = ca
                skip.update(used)
                ops.append(op)
                continue
            chain = self._hard_chain(steps, i, consts, readers, only)
            if chain is not None:
                name, x, a, b, last = chain
                skip.update(last[1:])       # (later steps: a chain reads only its own results)
                ops.append(_Op(name, (x,), steps[last[-1]].outs[0], steps[last[-1]].meta,
                               _hard(name == "hard_swish", a, b)))
                continue
            sc = self._scalar_chain(steps, i, consts, readers, only, skip)
            if sc is not None:
                op, used = sc
                skip.update(used)
                ops.append(op)
                continue
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
        r = readers.get(t1, [])
        if len(r) != 1 or not only(t1, r[0]):
            return None
        i_add = r[0]
        add = steps[i_add]
        if add.name != "add" or add.multi:
            return None
        b = _const_scalar(consts, add.ins[1] if add.ins[0] == t1 else add.ins[0])
        if b is None:
            return None
        t2 = add.outs[0]
        r = readers.get(t2, [])
        if len(r) != 1 or not only(t2, r[0]):
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
        """``(op, later step indices)`` when step i is a float32 conv2d whose result is read only
        by a relu, a clip or a hard sigmoid / hard swish chain (``_hard_chain``), or by a 2x2 max
        pooling of stride 2 (``_pool_2x2``), the activation's result likewise: one op,
        ``numpy_nn.conv2d_act`` (the activation and the pooling in dense.c's epilogue, or in-place
        passes after the convolution; the same bits as the separate steps on the same
        convolution); else None."""
        st = steps[i]
        if st.name != "conv2d" or st.multi or st.meta.dtype.name != "float32":
            return None
        y = st.outs[0]
        r = sorted(readers.get(y, []))
        if not r or len(r) > 2 or y in protected:
            return None
        nxt = steps[r[0]]
        if nxt.multi or nxt.meta.dtype.name != "float32":
            return None
        if len(r) == 1 and self._pool_2x2(steps, r[0], st.meta, y):
            act, args, used = None, (0.0, 0.0, 0.0, 0.0), []
        elif tuple(nxt.meta.shape) != tuple(st.meta.shape):
            return None
        elif len(r) == 1 and nxt.name == "relu" and nxt.ins == (y,):
            act, args, used = "relu", (0.0, 0.0, 0.0, np.inf), [r[0]]
        elif len(r) == 1 and nxt.name == "clip" and nxt.ins == (y,):
            lo, hi = nxt.attrs.get("min"), nxt.attrs.get("max")
            act, used = "clip", [r[0]]
            args = (0.0, 0.0, -np.inf if lo is None else float(np.float32(lo)),
                    np.inf if hi is None else float(np.float32(hi)))
        else:
            chain = self._hard_chain(steps, r[0], consts, readers, only)
            if chain is None or chain[1] != y:
                return None
            act, _, a, b, used = chain
            # y's readers: the chain's first step, and for hard swish its last (x * clip(...))
            if r != sorted({used[0], used[-1]} if act == "hard_swish" else {used[0]}):
                return None
            args = (float(a), float(b), 0.0, 1.0)
            nxt = steps[used[-1]]
            if tuple(nxt.meta.shape) != tuple(st.meta.shape) or nxt.meta.dtype.name != "float32":
                return None
        pool = 0
        last = steps[used[-1]] if used else st
        rp = readers.get(last.outs[0], [])
        if len(rp) == 1 and last.outs[0] not in protected and self._pool_2x2(steps, rp[0], st.meta, last.outs[0]):
            pool = 2
            used = used + rp
            nxt = steps[rp[0]]
        from .numpy_nn import conv2d_act, conv_pad_call, native_conv_pad_case
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
            if pad_case and (c is None or c[0] is not wb or c[1] is not bb) and a.flags.c_contiguous \
                    and a.ndim == 4 and wb.ndim == 4:
                kh, kw = wb.shape[2:]
                cache[0] = (wb, bb, conv_pad_call(a, wb, bb, oh, ow, kh, kw, st.attrs["padding"],
                                                  st.attrs["dilation"], act, args, pool))
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
            if op.name in _BINARY or op.name in ("relu", "clip", "hard_swish", "hard_sigmoid", "scalar_chain"):
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
        with np.errstate(all="ignore"):
            for op in self.ops:
                op.run(vals, op)
                for s in op.free:
                    vals[s] = None
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


def _linear_const(steps, i, consts, dtypes, budget, readers, only, producer):
    """(an _Op, later step indices) for a linear step whose weight is a constant float32 matrix
    (float32 input and bias checked when it runs: a plan's inputs have no recorded dtype here).
    One row (a classifier's at batch 1) with a constant float32 bias or none: dense.c's ember_gemv
    with the relu or clip that alone reads the result in its epilogue (numpy_nn.NativeGemv, the
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
        used, act, args = _one_row_act(steps, i, readers, only)
        kernel = getattr(st.kernel, "__wrapped__", st.kernel)
        meta, ins, attrs, dev = st.meta, tuple(st.ins), st.attrs, st.device
        ometa = steps[used[0]].meta if used else meta
        o1, shape1, dtype1 = (steps[used[0]].outs[0] if used else st.outs[0]), ometa.shape, ometa.dtype
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


def _one_row_act(steps, i, readers, only):
    """([the activation step's index] or [], activation name or None, its (a, b, lo, hi)): the relu
    or clip (float32, the same shape) that alone reads linear step i's result."""
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
