"""Checks of the wasm command-table replay (``ember.wasm.plan_exec``), shared by
tests/test_wasm_plan.py (CPython, wasmtime: tables in a plan arena) and its Pyodide driver
(Node: tables on Pyodide's own memory). No pytest here: every check returns plain data (lists of
failures, dicts of facts) that the test asserts on.

Every check compares against the same computation run eagerly, **bit for bit**, and with inputs
that differ between replays (a value frozen into a table shows up as a wrong replay).
"""
from __future__ import annotations

import random
from array import array


def raw(result) -> list:
    """[(shape, dtype, bytes)] of a tensor or a tuple/list of tensors."""
    outs = result if isinstance(result, (list, tuple)) else [result]
    # through the backend's read (a KV cache a thread team keeps in its shared memory is synced)
    return [(tuple(t.shape), t.dtype.name, bytes(memoryview(t.backend.to_bytes(t._buf, t.shape, t.dtype))))
            if t.dtype.name != "float16" else (tuple(t.shape), t.dtype.name, bytes(memoryview(t._buf).cast("B")))
            for t in outs]


def fast_of(compiled):
    """The WasmPlanReplay of a compiled function's (only) plan, or None."""
    from ember.plan import Plan

    for p in compiled.plans.values():
        if isinstance(p, Plan):
            return p.fast or None
    return None


def op_cases(ember, op_cases_mod, select=None, before_call=None) -> dict:
    """Every op case (no error cases) compiled on wasm: capture on inputs A, record on A, then
    table replays on B (A's values reversed), A, B; each replay bit-identical to eager code.
    ``before_call(k)``, when given, runs before call k (0..4) of every case (the thread test sets
    a thread count per replay there)."""
    from ember.errors import EmberError

    def tensors(case, rev):
        out = []
        for flat, shape, dt in op_cases_mod.generate_inputs(case):
            out.append(ember.from_bytes(op_cases_mod._pack(flat[::-1] if rev else flat, dt), shape, dt,
                                        device="wasm"))
        return out

    failures, python_steps, spaces = [], {}, {}
    n = tables = one_segment = 0
    before = ember.default_device()
    ember.set_default_device("wasm")
    try:
        for case in op_cases_mod.all_cases():
            if "wasm" in case.skip or case.raises or (select and select not in case.id):
                continue
            try:
                want = [raw(case.ember_fn(ember, *tensors(case, rev))) for rev in (False, True)]
            except EmberError:
                continue
            fn = ember.compile(lambda *ts, case=case: case.ember_fn(ember, *ts))
            try:
                got = []
                for k, rev in enumerate((False, False, True, False, True)):
                    if before_call is not None:
                        before_call(k)
                    got.append(raw(fn(*tensors(case, rev))))
            except Exception as e:  # noqa: BLE001 (reported with the case id)
                failures.append(f"{case.id}: raised {type(e).__name__}: {e}")
                continue
            n += 1
            for k, (g, w) in enumerate(zip(got, [want[0], want[0], want[1], want[0], want[1]])):
                if g != w:
                    failures.append(f"{case.id}: call {k} differs from eager")
                    break
            fast = fast_of(fn)
            if fast is not None and fast.ready:
                d = fast.describe()
                if d["segments"]:   # where its tables ran
                    spaces[d["space"]] = spaces.get(d["space"], 0) + 1
                tables += 1
                one_segment += d["segments"] == 1
                for r in d["python_steps"].values():
                    python_steps[r] = python_steps.get(r, 0) + 1
    finally:
        ember.set_default_device(before)
    return {"cases": n, "tables": tables, "one_segment": one_segment, "failures": failures,
            "python_steps": python_steps, "spaces": spaces}


def mnist(ember, model_mod, weights, runs: int = 6) -> dict:
    """The MNIST demo CNN compiled: with the plan fusions off (``plan_fuse.ENABLED``), every
    replay bit-identical to eager, and how many ``ember_run`` calls one forward makes; with them
    on (batch norms folded into the convs: other bits), every replay within float tolerance of
    eager (``fused_close``, ``fused_max_diff``), one call, and what was fused (``fused``)."""
    import ember.wasm.plan_fuse as pf

    rng = random.Random(1)
    net = model_mod.load_model(weights, device="wasm")
    imgs = [model_mod.images_tensor([[rng.random() for _ in range(784)]], "wasm") for _ in range(3)]
    want = [raw(net(x)) for x in imgs]
    saved = pf.ENABLED
    pf.ENABLED = False
    try:
        f = ember.compile(net)
        kept = []
        same = True
        for k in range(runs):
            out = f(imgs[k % 3])
            kept.append((out, k % 3))
            same = same and raw(out) == want[k % 3]
    finally:
        pf.ENABLED = saved
    # results handed out earlier were not overwritten by later replays
    kept_ok = all(raw(o) == want[i] for o, i in kept)
    fast = fast_of(f)
    d = fast.describe()
    r0 = fast.runs
    f(imgs[0])
    res = {"same": same, "kept": kept_ok, "segments": d["segments"], "python_steps": d["python_steps"],
           "runs_per_forward": fast.runs - r0, "space": d["space"]}
    g = ember.compile(net)
    worst = 0.0
    for k in range(runs):
        out = g(imgs[k % 3]).tolist()[0]
        ref = net(imgs[k % 3]).tolist()[0]
        worst = max(worst, max(abs(a - b) / (1.0 + abs(b)) for a, b in zip(out, ref)))
    fast = fast_of(g)
    d = fast.describe()
    r0 = fast.runs
    g(imgs[0])
    res.update(fused=d.get("fused"), fused_max_diff=worst, fused_close=worst < 1e-4,
               fused_runs_per_forward=fast.runs - r0, fused_segments=d["segments"])
    return res


def llama_decode(ember, positions: int = 10) -> dict:
    """A tiny random llama's one-token step (KV cache written in place at a ``pos`` tensor)
    compiled, over positions, with tables and step by step: the logits bit for bit."""
    import ember.wasm.plan_exec as pe
    from ember.nn.llama import Llama, LlamaConfig

    cfg = LlamaConfig(n_layers=2, dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=50)
    res = {}
    for table in (True, False):
        saved = pe.ENABLED
        pe.ENABLED = table
        try:
            m = Llama.random(cfg, context=16, device="wasm")
            step = ember.compile(lambda ids, pos, m=m: m.forward(ids, pos))
            outs = []
            for p in range(positions):
                ids = ember.tensor([(p * 7 + 3) % 50], dtype="int32", device="wasm")
                outs.append(raw(step(ids, ember.tensor([p], dtype="int32", device="wasm"))))
            outs.append([raw(c) for c in m.k_cache + m.v_cache])
        finally:
            pe.ENABLED = saved
        res[table] = (outs, fast_of(step))
    fast = res[True][1]
    d = fast.describe() if fast is not None else {}
    return {"same": res[True][0] == res[False][0], "segments": d.get("segments"),
            "table_steps": d.get("table_steps"), "python_steps": d.get("python_steps")}


def guard(ember) -> dict:
    """sin recorded on small values, replayed on values from 2^20 up (which the kernel leaves to
    Python): the guarded command stops the table, Python finishes that step, the table resumes."""
    def vals(big):
        return array("f", [0.5, -1.25, 3.0e7 if big else 0.25, 2.0, -4.0e9 if big else 1.0, 0.125])

    def t(big):
        return ember.from_bytes(vals(big).tobytes(), (6,), "float32", device="wasm")

    # (the input's reshape sits inside the table's segment: the step redone in Python needs it)
    fn = lambda x: (x * 1.0).reshape((2, 3)) + ember.sin(x.reshape((2, 3)))    # noqa: E731
    f = ember.compile(fn)
    f(t(False))
    f(t(False))          # recorded here
    fast = fast_of(f)
    r0 = fast.runs
    small = raw(f(t(False)))
    r1 = fast.runs
    big = raw(f(t(True)))
    r2 = fast.runs
    return {"small": small == raw(fn(t(False))), "big": big == raw(fn(t(True))),
            "runs_small": r1 - r0, "runs_big": r2 - r1, "segments": fast.describe()["segments"]}


def data_reads(ember) -> dict:
    """``x / x.sum()`` on 1-D x: the divide's wrapper passes the one-element sum as a number read in
    Python, so that step must stay in Python (and results follow the data)."""
    f = ember.compile(lambda x: x / x.sum())
    outs, want = [], []
    for k in range(4):
        x = ember.tensor([float(k + 1), 2.0, 3.0], device="wasm")
        outs.append(raw(f(x)))
        want.append(raw(x / x.sum()))
    d = fast_of(f).describe()
    return {"same": outs == want, "python_steps": d["python_steps"], "segments": d["segments"]}


def stale_and_bounds(ember) -> dict:
    """A weight's buffer replaced after the table was built: the replay notices, finishes step by
    step and records again (results follow the new weight). A tensor whose buffer is shorter than
    its shape, given as input: BoundsError before the table runs (no command ran, the outputs
    of the last replay untouched). A table whose words were damaged: refused by ember_run."""
    from ember.errors import BoundsError
    from ember.tensor import Tensor

    w = ember.tensor([[1.0, 2.0], [3.0, -1.0]], device="wasm")
    fn = lambda x: ember.relu(ember.matmul(x, w)) * 2.0    # noqa: E731
    f = ember.compile(fn)
    x = ember.tensor([[1.0, 1.0]], device="wasm")
    for _ in range(3):
        f(x)
    fast = fast_of(f)
    out = {"records_before": fast.records}
    w.copy_(ember.tensor([[5.0, 0.0], [0.0, 5.0]], device="wasm"))   # swaps w's buffer
    out["after_swap"] = raw(f(x)) == raw(fn(x))
    out["again"] = raw(f(x)) == raw(fn(x))
    out["records_after"] = fast.records
    # an input whose buffer is too short for its shape
    last = f(x)
    r0 = fast.runs
    own = _own(fast)
    # (narrow: as many items as the input needs, but bytes ones: the check is on bytes, not items)
    for key, buf in (("short_input", array("f", [1.0])), ("narrow_input", array("B", [1, 1]))):
        try:
            f(Tensor._wrap(buf, (1, 2), x.dtype, "wasm"))
            out[key] = "ran"
        except BoundsError as e:
            out[key] = f"BoundsError: {e}"
        out[key + "_ran_nothing"] = fast.runs == r0 and own == _own(fast)
    out["last_intact"] = raw(last) == raw(fn(x))
    # inputs whose buffers change from call to call (checked and patched in each time), then the
    # first one again: each replay follows its own input
    ys = [ember.tensor([[float(k), -2.0 * k]], device="wasm") for k in range(1, 4)]
    out["new_inputs"] = all(raw(f(y)) == raw(fn(y)) for y in ys + [x] + ys[:1])
    # a constant's buffer replaced while its table stands: the next replay notices (by identity,
    # even when the new buffer holds the same values) and follows it
    f(x)
    r1 = fast.records
    w._buf = w._buf[:]
    out["same_values_swap"] = [raw(f(x)) == raw(fn(x)) for _ in range(2)] == [True, True] and \
        fast.records == r1 + 1   # (the replay that noticed finished step by step; the next recorded)
    # a damaged table: an unknown kernel id in its last command; its first commands would write
    # own buffers, which are zeroed first and must stay zero
    seg = fast.segments[0]
    _own(fast, zero=True)
    out["damaged"] = _damage(fast, seg)
    out["damaged_ran_nothing"] = not any(any(b) for b in _own(fast))
    return out


def _own(fast, zero=False) -> list:
    """The bytes of the plan's own buffers where the table runs (Pyodide: the arrays; wasmtime:
    their places in the arena); ``zero``: zero them first."""
    space = fast.space
    out = []
    for r, b in fast.own_buf.items():
        n = len(b) * b.itemsize
        if space.kind == "pyodide":
            if zero:
                memoryview(b).cast("B")[:] = bytes(n)
            out.append(bytes(memoryview(b).cast("B")))
        else:
            addr = space.addr[("s", r)]
            if zero:
                space.arena.write_from(addr, array("B", bytes(n)), n)
            got = array("B", bytes(n))
            space.arena.read_into(addr, got, n)
            out.append(bytes(got))
    return out


def _damage(fast, seg) -> str:
    """Set the last command's kernel id to one the module does not have, run, restore."""
    from ember.errors import BoundsError

    space = fast.space
    at = 4
    for c in seg.cmds[:-1]:
        at += 3 + len(c.words)
    if space.kind == "pyodide":
        tab = seg.table
        saved = tab[at]
        tab[at] = 1 << 20
        try:
            rc = space.run_fn(seg.addr, 0)
        finally:
            tab[at] = saved
    else:
        arena = space.arena
        word = array("I", [1 << 20])
        saved = array("I", [0])
        arena.read_into(seg.addr + 4 * at, saved, 4)
        arena.write_from(seg.addr + 4 * at, word, 4)
        try:
            rc = space.run_fn(seg.addr, 0)
        finally:
            arena.write_from(seg.addr + 4 * at, saved, 4)
    try:
        if rc < 0:
            raise BoundsError(f"refused ({rc})")
    except BoundsError as e:
        return f"refused: {e} (command {-2 - rc} of {len(seg.cmds)})"
    return f"ran ({rc})"


def segments(ember) -> dict:
    """A float16 step in the middle (rounded in Python) splits the table in two; a reshape
    (the input's buffer) costs nothing; a training step replays step by step."""
    f = ember.compile(lambda x: (((x * 2.0).astype("float16") * 3.0).astype("float32").reshape((2, 2)) + 1.0))
    outs, want = [], []
    for k in range(3):
        x = ember.tensor([0.1 * k, 1.5, -2.25, 3.0], device="wasm")
        outs.append(raw(f(x)))
        want.append(raw(((x * 2.0).astype("float16") * 3.0).astype("float32").reshape((2, 2)) + 1.0))
    d = fast_of(f).describe()
    # a training step: host steps that update parameters
    from ember import nn

    ember.manual_seed(0)
    lin = nn.Linear(2, 1).to("wasm")
    opt = ember.optim.SGD(lin.parameters(), lr=0.1)
    xs, ys = ember.tensor([[1.0, 2.0]], device="wasm"), ember.tensor([[1.0]], device="wasm")

    @ember.compile
    def step(x, y):
        opt.zero_grad()
        loss = ((lin(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss
    losses = [step(xs, ys).item() for _ in range(4)]
    tf = fast_of(step)
    return {"same": outs == want, "segments": d["segments"], "python_steps": d["python_steps"],
            "train_disabled": tf.disabled if tf is not None else None, "losses_fall": losses[-1] < losses[0]}
