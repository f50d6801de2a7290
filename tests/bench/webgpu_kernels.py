"""Every dispatch of one replayed compiled step on webgpu, with the op that made it, its grid and
shapes, and (where the adapter has ``timestamp-query``) its GPU time: which kernels a training
step's GPU time goes to, and which dispatches are under-parallel by construction (a handful of
workgroups for a large reduction).

Used by ``tests/bench/bench_train.py --kernels``; ``capture(plan)`` and ``report(...)`` work on
any ``ember.compile`` plan on device "webgpu".

How: the step's plan is recorded once more as a fresh prebuilt stream (what every replay
encodes: forward and backward as one stream, the optimizer's kernels from its host step) with
every dispatch noted (pipeline, buffers, uniforms, grid) together with the plan step that was
running (op name, input and output shapes; a lazy value, a fused elementwise chain or a matmul,
is dispatched by the step that first needs it, shown as "during op"). Then each noted dispatch
is replayed alone in a compute pass of its own between two GPU timestamps, ``rounds`` times; the
median per dispatch is summed per kernel. Timing a dispatch alone adds the pass's fixed cost and
loses the overlap of neighbours in one pass: the per-dispatch sum is printed next to the step's
own GPU time (one pass per stream chunk) to show how far apart the two are.
"""
from __future__ import annotations

import statistics
from math import prod

from ember.plan import HOST

# A dispatch whose grid has fewer workgroups than this while the buffers it reads (every binding
# but the first, its output) hold at least ``BIG_INPUT`` floats is flagged: on a GPU with ~132
# multiprocessors it leaves most of them idle.
FEW_GROUPS = 32
BIG_INPUT = 1 << 14


def _pipeline_names(rt) -> dict:
    """id(pipeline) -> a short name from its cache key (kernel file, entry point, the params
    that tell variants apart)."""
    out = {}
    for key, pipe in rt.pipelines.items():
        out[id(pipe)] = _key_name(key)
    return out


def _key_name(key) -> str:
    if not isinstance(key, tuple) or not key:
        return repr(key)[:60]
    head = key[0]
    if not isinstance(head, str):
        return repr(key)[:60]
    entry = key[1] if len(key) > 1 and isinstance(key[1], str) else None
    name = head if entry in (None, "main") else f"{head}:{entry}"
    if head in ("reduce", "reduce_fused"):
        params = dict(p for p in key[2] if isinstance(p, tuple) and len(p) == 2) if len(key) > 2 else {}
        shape = f" {params['CX']}x{params['CY']}" if entry == "cols" and "CX" in params else ""
        name = f"reduce:{entry}{'+fused' if head == 'reduce_fused' else ''}{shape}"
    elif head in ("fused", "fusion", "elementwise") or head.startswith("fused"):
        name = "fused elementwise"
    return name


class Dispatch:
    """One noted dispatch: where it came from and what it binds."""

    __slots__ = ("index", "op", "ins", "out", "pipe", "buffers", "info", "grid", "kernel", "us", "nbytes")

    def __init__(self, index, op, ins, out, pipe, buffers, info, grid):
        self.index, self.op, self.ins, self.out = index, op, ins, out
        self.pipe, self.buffers, self.info, self.grid = pipe, buffers, info, tuple(grid)
        self.kernel = "?"
        self.us = None
        self.nbytes = 0

    @property
    def groups(self) -> int:
        return prod(self.grid)

    def read_bytes(self, size_of) -> int:
        """Bytes of the buffers bound after the first (the output): what the dispatch may read."""
        return sum(b[2] if type(b) is tuple else size_of(b) for b in self.buffers[1:])

    def flagged(self) -> bool:
        """Under-parallel: few workgroups for many elements read."""
        return self.groups < FEW_GROUPS and self.nbytes >= 4 * BIG_INPUT


def _shape(t):
    return tuple(getattr(t, "shape", ()))


def capture(rt, plan, inputs=()) -> list:
    """Record ``plan`` once more as a fresh prebuilt stream (``replay.compile_plan``: the same
    recording every replay of it encodes, host steps in their places) on ``inputs``, noting every
    dispatch (a list of ``Dispatch``); the step's effects happen (a training step trains one
    step). The fresh recording is dropped after (its buffers go back to the pool)."""
    import gc

    import ember
    from ember.webgpu.replay import compile_plan

    noted: list = []
    cur = ["?", (), ()]
    cls = type(rt)
    real = cls.dispatch

    def dispatch(self, pipe, buffers, info, grid):
        if self is rt:
            noted.append(Dispatch(len(noted), cur[0], cur[1], cur[2], pipe, list(buffers),
                                  bytes(info) if info else b"", grid))
        return real(self, pipe, buffers, info, grid)

    def wrap(st, kernel):
        if st.multi == HOST:
            def k(vals, _k=kernel, _n=st.name):
                cur[:] = [f"host: {_n}", (), ()]
                return _k(vals)
        else:
            metas = st.meta if st.multi else (st.meta,)

            def k(meta, *args, _k=kernel, _n=st.name, _o=tuple(m.shape for m in metas), **kw):
                cur[:] = [_n, tuple(_shape(a) for a in args), _o]
                return _k(meta, *args, **kw)
        return k

    kernels = [st.kernel for st in plan.steps]
    program = plan._program
    cls.dispatch = dispatch
    try:
        for st in plan.steps:
            st.kernel = wrap(st, st.kernel)
        plan._program = [(st.kernel,) + tuple(item[1:]) for st, item in zip(plan.steps, program)]
        fast = compile_plan(ember.get_backend("webgpu"), plan)
        if fast is None:          # streams off: the step-by-step replay
            plan._run_steps(list(inputs))
        else:
            fast(list(inputs))
            fast = None
        rt.driver.flush()
    finally:
        cls.dispatch = real
        plan._program = program
        for st, k in zip(plan.steps, kernels):
            st.kernel = k
    gc.collect()
    names = _pipeline_names(rt)
    for d in noted:
        d.kernel = names.get(id(d.pipe), "?")
        d.nbytes = d.read_bytes(rt.driver._buffer_size)
    return noted


def time_each(rt, noted: list, rounds: int = 5) -> bool:
    """Set ``d.us`` (median GPU microseconds over ``rounds``) of every noted dispatch, each
    replayed alone in its own timestamped pass. False (nothing timed) without timestamp queries."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_webgpu import PassTimer

    drv = rt.driver
    timer = PassTimer.install(rt)
    if timer is None:
        return False
    align = max(int(rt.limits.get("min_uniform_buffer_offset_alignment", 256)), 16)
    blob, slots = bytearray(), []
    for d in noted:
        if d.info:
            off = len(blob)
            size = (max(len(d.info), 16) + 15) & ~15
            blob += d.info + bytes(size - len(d.info))
            blob += bytes(-len(blob) % align)
            slots.append((off, size))
        else:
            slots.append(None)
    ubuf = drv.uniform_alloc(max(len(blob), 16))
    if blob:
        drv.write(ubuf, bytes(blob))
    cmds = []
    for d, slot in zip(noted, slots):
        entries = [b if type(b) is tuple else (b, 0, drv._buffer_size(b)) for b in d.buffers]
        if slot is not None:
            entries.append((ubuf, slot[0], slot[1]))
        bg = drv._bind_group(d.pipe, [(i, b, o, s) for i, (b, o, s) in enumerate(entries)])
        cmds.append((d.pipe, bg, d.grid))
    per = [[] for _ in cmds]
    try:
        for _ in range(rounds):
            for k, sec in enumerate(timer.each(cmds)):
                per[k].append(sec * 1e6)
    finally:
        drv.timer = None
    for d, xs in zip(noted, per):
        d.us = statistics.median(xs) if xs else None
    return True


def step_gpu_us(rt, step, reps: int = 5):
    """Median GPU microseconds of ``step()`` (summed timestamped passes), or None."""
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_webgpu import PassTimer

    timer = PassTimer.install(rt)
    if timer is None:
        return None
    xs = []
    try:
        for _ in range(reps):
            timer.start()
            out = step()
            rt.driver.flush()
            if hasattr(out, "item"):
                out.item()
            s = timer.seconds()
            if s is not None:
                xs.append(s * 1e6)
    finally:
        rt.driver.timer = None
    return statistics.median(xs) if xs else None


def _fmt_shapes(shapes) -> str:
    return " ".join("x".join(map(str, s)) if s else "()" for s in shapes)


def report(title: str, noted: list, step_us=None, listing: bool = True) -> str:
    """The table: every dispatch (``listing``), then per (kernel, op) the count, workgroups,
    total microseconds and share when timed; under-parallel dispatches marked ``<<``."""
    lines = [f"== {title}: {len(noted)} dispatches"]
    timed = any(d.us is not None for d in noted)
    total = sum(d.us for d in noted if d.us is not None) if timed else None
    if listing:
        lines.append(f"  {'#':>4} {'us':>8} {'wgs':>7} {'grid':>14}  {'kernel':34} {'during op':26} inputs -> output")
        for d in noted:
            us = f"{d.us:8.1f}" if d.us is not None else f"{'-':>8}"
            mark = " <<" if d.flagged() else ""
            lines.append(f"  {d.index:4d} {us} {d.groups:7d} {str(d.grid):>14}  {d.kernel[:34]:34} {d.op[:26]:26} "
                         f"{_fmt_shapes(d.ins)} -> {_fmt_shapes(d.out)}{mark}")
    groups: dict = {}
    for d in noted:
        key = (d.kernel, d.op)
        g = groups.setdefault(key, [0, 0.0, set(), set()])
        g[0] += 1
        g[1] += d.us or 0.0
        g[2].add(d.groups)
        g[3].add(f"{_fmt_shapes(d.ins)}->{_fmt_shapes(d.out)}")
    order = sorted(groups.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))
    lines.append(f"  per kernel and op{' (GPU time, each dispatch in its own pass)' if timed else ''}:")
    lines.append(f"  {'total us':>9} {'share':>6} {'n':>4}  {'kernel':34} {'during op':26} workgroups / shapes")
    for (kernel, op), (n, us, wgs, shapes) in order:
        share = f"{100 * us / total:5.1f}%" if timed and total else f"{'-':>6}"
        tot = f"{us:9.1f}" if timed else f"{'-':>9}"
        wg = ",".join(str(w) for w in sorted(wgs)[:4]) + (",..." if len(wgs) > 4 else "")
        sh = "; ".join(sorted(shapes)[:2]) + ("; ..." if len(shapes) > 2 else "")
        lines.append(f"  {tot} {share} {n:4d}  {kernel[:34]:34} {op[:26]:26} [{wg}] {sh}")
    flagged = [d for d in noted if d.flagged()]
    lines.append(f"  under-parallel (< {FEW_GROUPS} workgroups reading >= {BIG_INPUT} elements): {len(flagged)}"
                 + (f", {sum(d.us or 0 for d in flagged):.1f} us" if timed else ""))
    if timed:
        lines.append(f"  sum of dispatches timed alone: {total:.1f} us"
                     + (f"; the step's GPU time (its passes): {step_us:.1f} us" if step_us else ""))
    return "\n".join(lines)
