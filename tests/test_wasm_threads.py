"""The wasm thread team (``ember.wasm.team``, ``wasm/kernels/team.h``): replayed plans on a shared
WebAssembly.Memory, split kernels run by 1-4 threads, every result the same bits as eager code
on one thread. Runs inside Pyodide under Node (worker_threads) and in headless Chromium on a
cross-origin isolated page (Web Workers); a page without isolation runs on one thread and says so
(tests/test_wasm_browser.py). Kernels split here however small their work (min work 1), and
workers sleep soon (4 threads on a 2-core machine).

Each op case is compiled with the team at 4 threads, then its three table replays run with 2, 3
and 4 threads; one thread on the whole list is tests/test_wasm_plan.py's Pyodide run (and the
llama step runs at 1-4 threads here, and at 2 and 3 with a minimum work that leaves the smallest
commands to thread 0 between split ones: the barrier rule of kernels/exec.c): every case, every
thread count, one pass (CI time).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import ember

REPO = Path(__file__).resolve().parent.parent

CHECK = '''
import sys
sys.path.insert(0, "/repo/tests")
import ember, ember.wasm as W
import op_cases, wasm_plan_checks as C
from ember.wasm import team as T
out = {"info_before": W.info()}
# init() starts the team in the background and returns at once (it used to build it, workers
# and all, before returning); info() starts nothing; a small plan (64^3, under
# TeamSpace.SMALL_WORK) runs on one thread, a 256^3 one on the team
def sq(n):
    return ember.tensor([[((i * 5 + j * 3) % 13 - 6) / 8 for j in range(n)] for i in range(n)], device="wasm")
# before init(): a small plan's first replays start no team (a plan worth it would)
pre = ember.compile(lambda a, b: ember.relu(a @ b))
x = sq(64)
pre_got = [pre(x, x).tolist() for _ in range(3)]
lazy0 = {"pre_small_team": T._STATE["team"] is not None, "pre_same": all(g == ember.relu(x @ x).tolist() for g in pre_got)}
init0 = await W.init()
import asyncio, time as _time
lazy = {"workers_after_init": init0["workers_started"], "init_threads": init0["threads"], **lazy0}
end = _time.monotonic() + 20
while T._STATE["team"] is None and _time.monotonic() < end:
    await asyncio.sleep(0.01)
lazy["started"] = T._STATE["team"] is not None
lf = ember.compile(lambda a, b: ember.relu(a @ b))
x = sq(64)
runs0 = T._STATE["team"].runs() if T._STATE["team"] else 0
got = [lf(x, x).tolist() for _ in range(4)]
lazy.update(small_space=C.fast_of(lf).space.kind, small_same=all(g == ember.relu(x @ x).tolist() for g in got),
            small_team_runs=(T._STATE["team"].runs() if T._STATE["team"] else 0) - runs0)
bf = ember.compile(lambda a, b: ember.relu(a @ b))
y = sq(256)
got = [bf(y, y).tolist() for _ in range(2)]
lazy.update(big_space=C.fast_of(bf).space.kind, big_same=all(g == ember.relu(y @ y).tolist() for g in got))
out["lazy"] = lazy
out["threads_before"] = W.threads()
try:
    W.set_threads(0)
    out["zero"] = "accepted"
except ValueError as e:
    out["zero"] = "ValueError"
W.set_threads(4)
out["init"] = await W.init(wait_threads=20)
t = T.team(create=False)
t.set_min_work(1)       # every split kernel splits, however small its work
t.adaptive = False      # ... and runs on the team even where one thread would be faster
t._set(T.SPIN, 2000)    # more threads than cores: sleep soon
out["threads"] = W.threads()
for name, sched in (("a", (4, 4, 2, 3, 4)),):   # threads per call: capture, record, 3 replays
    runs0 = t.runs()
    r = C.op_cases(ember, op_cases, before_call=lambda k, s=sched: W.set_threads(s[k]))
    out["pass_" + name] = {"cases": r["cases"], "tables": r["tables"], "failures": r["failures"][:30],
                          "spaces": r["spaces"], "team_runs": t.runs() - runs0}
llama = {}
for n in (1, 2, 3, 4):
    W.set_threads(n)
    llama[n] = C.llama_decode(ember)
t.set_min_work(300)     # a mix: the smallest commands run on thread 0 alone, between split ones
for n in (2, 3):
    W.set_threads(n)
    llama[f"{n}, mixed widths"] = C.llama_decode(ember)
t.set_min_work(1)
out["llama"] = llama
W.set_threads(2)
runs0 = t.runs()
out["guard"] = C.guard(ember)
out["stale"] = C.stale_and_bounds(ember)
out["guard_team_runs"] = t.runs() - runs0
# strided copies split by rows of their output (kernels/exec.c TEAM_COPY): a compiled permute
# (MiniLM's heads), flip (negative strides), broadcast (zero strides), of 4-, 1- and 8-byte
# elements, is a table of copies that runs on the team at 2-4 threads with eager's bits; a
# copy whose destination overlaps its source keeps one thread's order (thread 0 alone)
def cx(shape, dtype="float32"):
    n = 1
    for m in shape:
        n *= m
    vals = [((i * 37) % 101 - 50) / 8 for i in range(n)]
    if dtype == "int64":
        vals = [int(v * 8) * 3_000_000_000 for v in vals]
    return ember.reshape(ember.tensor(vals, dtype=dtype, device="wasm"), shape)
copies = {}
heads = cx((2, 16, 3, 8))
for label, fn, arg in (("permute", lambda a: ember.permute_dims(a, (0, 2, 1, 3)), heads),
                       ("flip", lambda a: ember.flip(a, axis=1), heads),
                       ("broadcast", lambda a: ember.broadcast_to(a, (5, 7, 9)), cx((7, 1))),
                       ("bool", lambda a: ember.permute_dims(a > 0, (1, 0)), cx((13, 11))),
                       ("int64", lambda a: ember.permute_dims(a, (1, 0)), cx((9, 10), "int64"))):
    ref = C.raw(fn(arg))
    cf = ember.compile(fn)
    row = {}
    for n in (1, 2, 3, 4):
        W.set_threads(n)
        runs0 = t.runs()
        got = [C.raw(cf(arg)) for _ in range(3)]
        row[n] = {"same": all(g == ref for g in got), "team_runs": t.runs() - runs0}
    copies[label] = row
W.set_threads(2)
from array import array as _array
cf = ember.compile(lambda a: ember.permute_dims(a, (1, 0)))
cf(cx((4, 4))); cf(cx((4, 4)))
disp = C.fast_of(cf).disp
R_, N_ = 16, 8
nbuf = 4 * 2 * R_ * N_
buf, prm, tab = t.alloc(nbuf), t.alloc(48), t.alloc(4 * 16)
t.write_from(prm, _array("i", [1, 1, 1, 1, R_, N_, 0, 0, 0, 0, N_, 1]), 48)
def hand_copy(dst_row):
    """buf's rows 0..R_-1 copied onto its rows dst_row.. by a hand-made one-command table"""
    t.write_from(buf, _array("f", [float(i) for i in range(2 * R_ * N_)]), nbuf)
    words = _array("I", [0x54424D45, disp.abi, 1, 11, disp.ids["copy_strided_x32"], 4, 0,
                         buf, buf + 4 * N_ * dst_row, prm, prm + 24])
    t.write_from(tab, words, 4 * len(words))
    runs0 = t.runs()
    rc = t.run(tab, 0)
    got = _array("f", [0.0]) * (2 * R_ * N_)
    t.read_into(buf, got, nbuf)
    return {"rc": rc, "team_runs": t.runs() - runs0, "got": list(got)}
row0 = [float(i) for i in range(N_)]
h = hand_copy(1)        # overlapping: in one thread's order every row becomes row 0
h["same"] = h.pop("got") == row0 * (R_ + 1) + [float(i) for i in range((R_ + 1) * N_, 2 * R_ * N_)]
copies["overlap"] = h
h = hand_copy(R_)       # apart: split
h["same"] = h.pop("got") == [float(i) for i in range(R_ * N_)] * 2
copies["apart"] = h
for a_, n_ in ((buf, nbuf), (prm, 48), (tab, 64)):
    t.release(a_, n_)
out["copies"] = copies
t.adaptive = True       # a segment's probes: WARMUP + PROBES runs on the team, WARMUP_ONE + PROBES on thread 0, then a choice
from ember.wasm.plan_exec import TeamSpace
want = TeamSpace.WARMUP + TeamSpace.PROBES
want_one = TeamSpace.WARMUP_ONE + TeamSpace.PROBES
# a small plan (64^3 = 262 k multiply-adds by its table) runs on one thread from its first
# replay, with no probe on the team; a 256^3 one is probed from its first replay
def mk(n):
    return ember.tensor([[((i * 7 + j * 3) % 11 - 5) / 8 for j in range(n)] for i in range(n)], device="wasm")
small_f = ember.compile(lambda a, b: ember.relu(a @ b))
x = mk(64)
ref = ember.relu(x @ x).tolist()
runs0 = t.runs()
got = [small_f(x, x).tolist() for _ in range(2 + 2 * want + 2)]   # capture, record, replays
# (a plan this small runs on Pyodide's own memory: no copies into the team's, never on the team)
from ember.wasm.plan_exec import table_work
fast = C.fast_of(small_f)
seg = fast.segments[0]
small = {"work": table_work(seg, {k: n for n, k in fast.disp.ids.items()}), "limit": TeamSpace.SMALL_WORK,
         "space": fast.space.kind, "stats": hasattr(seg, "team_stats"),
         "team_runs": t.runs() - runs0, "same": all(g == ref for g in got)}
big_f = ember.compile(lambda a, b: ember.relu(a @ b))
y = mk(256)
ref = ember.relu(y @ y).tolist()
got = [big_f(y, y).tolist() for _ in range(3)]
seg = C.fast_of(big_f).segments[0]
small["big"] = {"work": seg.team_work, "use": seg.team_stats["use"], "team_probes": len(seg.team_stats[True]),
                "same": all(g == ref for g in got)}
out["small"] = small
TeamSpace.SMALL_WORK = 0   # the probes and the watch below, on a small plan
f = ember.compile(lambda a, b: ember.relu(a @ b))
a = ember.ones((64, 64), device="wasm")
for _ in range(2 + want + want_one - 1):   # capture, record, all probes but the last
    f(a, a)
st = C.fast_of(f).segments[0].team_stats
probe = {"want": want, "want_one": want_one, "decided_early": st["use"] is not None}
f(a, a)
probe.update(team=len(st[True]), one=len(st[False]), decided=st["use"] is not None and st["n"] == want + want_one)
out["probe"] = probe
# after the choice its runs are watched: slower than the other way's best probe -> probed again
seg = C.fast_of(f).segments[0]
st = seg.team_stats
st["use"], st[False], st["watch"] = True, [1e-9] * want, [0, float("inf")]   # one thread "took" 1 ns
for _ in range(TeamSpace.WATCH):
    f(a, a)
watch = {"reprobe": seg.team_stats["n"] >= TeamSpace.REPROBE}
f(a, a)
watch["fresh"] = seg.team_stats is not st and seg.team_stats["use"] is None
st = seg.team_stats
st["use"], st[True], st[False], st["n"] = True, [1e-9] * want, [1e3] * want_one, want + want_one   # a choice that holds
for _ in range(TeamSpace.WATCH + 1):
    f(a, a)
watch["kept"] = seg.team_stats is st and st["use"] is True and st["n"] < TeamSpace.REPROBE
out["watch"] = watch
TeamSpace.SMALL_WORK = small["limit"]
t.adaptive = False
W.set_threads(None)
out["info_after"] = W.info()
'''

NODE_DRIVER = CHECK + '''
import json
json.dump(out, open("/io/threads.json", "w"))
'''

PAGE_CODE = CHECK + '''
import json
json.dumps(out)
'''


def _check(res, where):
    lz = res["lazy"]
    assert not lz["pre_small_team"] and lz["pre_same"], (where, lz)
    assert lz["workers_after_init"] == 0 and lz["init_threads"] == 1 and lz["started"], (where, lz)
    assert lz["small_space"] == "pyodide" and lz["small_team_runs"] == 0 and lz["small_same"], (where, lz)
    assert lz["big_space"] == "threads" and lz["big_same"], (where, lz)
    assert res["zero"] == "ValueError"
    assert res["info_before"]["shared_memory"] is True, res["info_before"]
    # Chromium runs the relaxed-SIMD module (its GEMM fused), Node 20 the plain one (newer Node
    # may validate relaxed SIMD): the whole op-case list below checks both at 2-4 threads
    # (tests/test_wasm_relaxed.py: the choice)
    want = ("kernels_relaxed.wasm",) if where == "chromium" else ("kernels.wasm", "kernels_relaxed.wasm")
    assert res["info_before"]["module"] in want, (where, res["info_before"])
    assert res["threads"] == 4, (where, res["init"])
    for name in ("pass_a",):
        p = res[name]
        assert p["cases"] > 2000 and not p["failures"], (where, name, p["failures"])
        assert p["tables"] > 0.9 * p["cases"] and set(p["spaces"]) == {"threads"}, (where, p)
        assert p["spaces"]["threads"] > 1000, (where, p)
        assert p["team_runs"] > 100, (where, p)   # tables with split kernels ran on the team
    for n, r in res["llama"].items():
        assert r["same"] and r["table_steps"] >= 10, (where, n, r)
    g = res["guard"]
    assert g["small"] and g["big"] and g["runs_big"] == 2, (where, g)
    s = res["stale"]
    assert s["after_swap"] and s["again"] and s["short_input"].startswith("BoundsError"), (where, s)
    assert s["short_input_ran_nothing"] and s["damaged"].startswith("refused") and s["damaged_ran_nothing"], s
    assert s["narrow_input"].startswith("BoundsError") and s["narrow_input_ran_nothing"], (where, s)
    assert s["new_inputs"] and s["same_values_swap"], (where, s)
    cp = res["copies"]
    for label in ("permute", "flip", "broadcast", "bool", "int64"):
        for n, r in cp[label].items():
            assert r["same"], (where, label, n, r)
            # one thread: ember_run, never a team run; 2-4: the replays' copies split on the team
            assert r["team_runs"] == 0 if str(n) == "1" else r["team_runs"] >= 1, (where, label, n, r)
    assert cp["overlap"] == {"rc": 0, "team_runs": 0, "same": True}, (where, cp["overlap"])
    assert cp["apart"] == {"rc": 0, "team_runs": 1, "same": True}, (where, cp["apart"])
    p = res["probe"]
    assert p["team"] == p["want"] and p["one"] == p["want_one"] and p["decided"] and not p["decided_early"], (where, p)
    assert res["watch"] == {"reprobe": True, "fresh": True, "kept": True}, (where, res["watch"])
    sm = res["small"]
    assert sm["work"] == 64 ** 3 + 64 * 64 and sm["work"] < sm["limit"], (where, sm)   # gemm + relu
    assert sm["space"] == "pyodide" and not sm["stats"] and sm["team_runs"] == 0 and sm["same"], (where, sm)
    big = sm["big"]
    assert big["work"] == 256 ** 3 + 256 * 256 and big["work"] >= sm["limit"], (where, big)
    assert big["use"] is None and big["team_probes"] == 1 and big["same"], (where, big)
    assert res["info_after"]["threads_wanted"] == res["info_after"]["max_threads"] or \
        res["info_after"]["threads_wanted"] == 8, res["info_after"]


@pytest.fixture(scope="module")
def node_result(tmp_path_factory):
    import test_pyodide as tp

    try:
        ember.get_backend("wasm")
    except ember.errors.DeviceError as e:
        pytest.skip(f"wasm backend unavailable: {e}")
    node = tp.need_node()
    wheel = tp._wheel(tmp_path_factory)
    io = tmp_path_factory.mktemp("pyodide-threads")
    proc = tp.run_driver(node, wheel, io, NODE_DRIVER, {REPO / "tests": "/repo/tests", io: "/io"})
    if proc.returncode != 0 or not (io / "threads.json").exists():
        pytest.fail(f"Pyodide run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}",
                    pytrace=False)
    return json.loads((io / "threads.json").read_text())


def test_node_any_thread_count_gives_the_same_bits(node_result):
    _check(node_result, "node")


def test_chromium_isolated_page_any_thread_count_gives_the_same_bits(tmp_path_factory):
    from browser_page import SKIPS, run_page

    for mark in SKIPS:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    res = run_page(tmp_path_factory.mktemp("ember-threads-site"), PAGE_CODE, isolated=True,
                   links={"tests": str(REPO / "tests")},
                   files=["tests/op_cases.py", "tests/op_cases_nn.py", "tests/op_cases_array_api.py",
                          "tests/golden/nn_ops.safetensors", "tests/wasm_plan_checks.py"],
                   timeout_ms=1_500_000)
    _check(res, "chromium")


def test_cpython_runs_one_thread_and_says_why():
    try:
        ember.get_backend("wasm")
    except ember.errors.DeviceError as e:
        pytest.skip(f"wasm backend unavailable: {e}")
    ember.wasm.set_threads(3)
    try:
        info = ember.wasm.info()
        assert ember.wasm.threads() == 1 and info["threads"] == 1 and info["threads_wanted"] == 3
        assert info["runtime"] == "wasmtime" and "one thread" in info["note"]
        f = ember.compile(lambda a, b: ember.relu(a @ b))
        a = ember.ones((5, 7), device="wasm")
        f(a, a.T), f(a, a.T)
        assert f(a, a.T).tolist() == ember.relu(a @ a.T).tolist()
    finally:
        ember.wasm.set_threads(None)
    with pytest.raises(ValueError):
        ember.wasm.set_threads(0)


def test_shared_memory_allocator_survives_releases_by_the_garbage_collector():
    """A plan's spans in the shared memory are released by a finalizer (its replay sits in a
    reference cycle with its space), which the collector runs at whatever allocation triggers
    it, also one inside ``alloc`` or ``release``. That once rebuilt the free list under the walk
    and handed out bytes of live spans (a llama decode's bits differed from eager now and then,
    a table was refused for its magic). Pure Python: runs in CPython."""
    import gc
    import random
    import weakref

    from ember.wasm import team as T

    class Cycle:
        pass

    found = 0
    for threshold in (11, 23, 37, 50, 64):   # where the collector runs inside alloc differs
        size = [16 * T.PAGE]
        heap = T.Spans(lambda: size[0], lambda pages: size.__setitem__(0, size[0] + pages * T.PAGE))
        live = {}

        def drop(a, n, live=live, heap=heap):
            live.pop(a, None)
            heap.release(a, n)

        rng = random.Random(threshold)
        saved = gc.get_threshold()
        gc.set_threshold(threshold)
        try:
            for _ in range(1500):
                n = rng.choice((16, 48, 256, 4096, 100000))
                a = heap.alloc(n, rng.choice((16, 64)))
                gc.disable()    # the bookkeeping here must not be interrupted
                m = (n + 15) & ~15
                found += sum(1 for b, k in live.items() if a < b + k and b < a + m)
                assert a % 16 == 0 and a + m <= size[0]
                live[a] = m
                gc.enable()
                c = Cycle()
                c.me = c
                weakref.finalize(c, drop, a, n)
                del c
        finally:
            gc.enable()
            gc.set_threshold(*saved)
            gc.collect()
    assert found == 0, f"{found} allocations overlapped live spans"
