"""Arrays moved into the wasm thread team's shared memory (``ember.wasm.team.Moved``: a model's
weights and KV cache, no elements in Python) met by Python code: a python-backend kernel the
wasm backend falls back to, a family kernel's own Python path, ``tolist``. Each must give the
array its elements first (``Resident.python_use``; a write marks Python's copy the newer one),
never read the empty array; an array whose shared copy is gone raises ``DeviceError``.

Two halves: in CPython a stand-in team on a bytearray (``FakeTeam``, the parts of ``Team`` a
``Resident`` uses) drives every python fallback quickly; in Pyodide under Node the real team
(2 threads) runs eager ops and compiled plans on moved arrays, against numpy.
"""
from __future__ import annotations

import json
import re
import sys
from array import array
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.errors import DeviceError

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]


def _wasm():
    try:
        ember.get_backend("wasm")
    except DeviceError as e:
        pytest.skip(f"wasm backend unavailable: {e}")


class FakeTeam:
    """``team.Team``'s memory side on a bytearray (no JS): what ``Resident`` and ``Team.close``
    use."""

    closed = False

    def __init__(self):
        from ember.wasm.team import PAGE, Spans

        self.mem = bytearray(PAGE)
        self.spans = Spans(lambda: len(self.mem), lambda pages: self.mem.extend(bytes(pages * PAGE)))
        self.workers, self._fns = [], {}

    def alloc(self, nbytes, align=16):
        if self.closed:
            raise DeviceError("closed")
        return self.spans.alloc(nbytes, align)

    def release(self, addr, nbytes):
        self.spans.release(addr, nbytes)

    def write_from(self, addr, buf, nbytes):
        self.mem[addr:addr + nbytes] = memoryview(buf).cast("B")[:nbytes]

    def read_into(self, addr, buf, nbytes):
        memoryview(buf).cast("B")[:nbytes] = self.mem[addr:addr + nbytes]

    def moved(self, values: np.ndarray, shape=None):
        """A wasm Tensor over a ``Moved`` array holding ``values`` in this memory only."""
        from ember.tensor import Tensor
        from ember.wasm.team import Moved, Resident

        tc = {"int32": "i", "float32": "f"}[values.dtype.name]
        buf = Moved(tc)
        buf.n = values.size
        ent = Resident(self, buf, moved=True)
        self.mem[ent.addr:ent.addr + values.nbytes] = values.tobytes()
        return Tensor._wrap(buf, tuple(shape or values.shape), ember.dtypes.get(values.dtype.name), "wasm")

    def shared(self, t) -> bytes:
        """The bytes of tensor ``t``'s copy in this memory."""
        from ember.wasm.runtime import RESIDENT

        ent = RESIDENT[id(t._buf)]
        return bytes(self.mem[ent.addr:ent.addr + ent.nbytes])

    def close(self):
        from ember.wasm.team import Team

        Team.close(self)


def _ent(t):
    from ember.wasm.runtime import RESIDENT

    return RESIDENT.get(id(t._buf))


WORDS = np.array([5, -3, 1 << 20, 255, -256, 7, 0, 123456, -1, 42], dtype=np.int32)


def test_python_fallbacks_on_a_moved_array_get_its_elements():
    """int32 ops the module leaves to python kernels (directly, or from a family kernel that
    falls back), on a moved array: numpy's answers (before: empty results or an IndexError);
    the array is a plain resident one after, holding its elements, its shared copy untouched."""
    _wasm()
    team = FakeTeam()
    x = team.moved(WORDS)
    raw = team.shared(x)
    cases = [
        ("bitwise_and", lambda t: t & 0xFF, lambda a: a & 0xFF),
        ("add int32", lambda t: t + 7, lambda a: a + 7),
        ("floor_divide", lambda t: t // 3, lambda a: a // 3),
        ("max int32", lambda t: t.max(), lambda a: a.max()),
        ("cumsum int32", lambda t: ember.cumsum(t, axis=0), lambda a: np.cumsum(a)),
        ("take", lambda t: ember.take(t, ember.tensor([9, 0, 3], dtype="int32", device="wasm"), axis=0),
         lambda a: a[[9, 0, 3]]),
    ]
    first = True
    for name, f, ref in cases:
        got = f(x).tolist()
        assert got == ref(WORDS).tolist(), name
        if first:
            ent = _ent(x)
            assert not ent.moved and ent.state == ent.SAME and x._buf.buffer_info()[1] == WORDS.size, name
            first = False
    assert team.shared(x) == raw


def test_python_reads_of_a_moved_array_go_through_it():
    """Python code other than a kernel (a family's Python path, ``tolist``, the python device
    sharing the buffer) gets the elements: each access re-materialises the array once."""
    _wasm()
    from ember.wasm.team import Moved

    team = FakeTeam()
    vals = np.arange(12, dtype=np.float32) * 0.5 - 2.0
    for read, want in [
        (lambda t: t.tolist(), vals.tolist()),
        (lambda t: list(t._buf), vals.tolist()),
        (lambda t: t._buf[3:5].tolist(), vals[3:5].tolist()),
        (lambda t: t.to("python").sum().item(), float(vals.sum())),     # the python device: same buffer
        (lambda t: (t.to("python") * 2.0).tolist(), (vals * 2).tolist()),
        (lambda t: t._buf.tobytes(), vals.tobytes()),
        (lambda t: (array("f") + t._buf).tolist(), vals.tolist()),      # the other side's concatenation
        (lambda t: t._buf == array("f", vals.tolist()), True),
    ]:
        t = team.moved(vals)
        assert t._buf.__class__ is Moved and len(t._buf) == 12 and t._buf.buffer_info()[1] == 0
        assert read(t) == want
        assert t._buf.__class__ is not Moved and not _ent(t).moved


def test_a_python_kernel_writing_a_moved_cache_marks_python_newer():
    """``attention_cached`` with a head size the wasm kernel does not take (6) runs the python
    kernel on moved caches: it gets their rows, writes the new ones in Python, and the shared
    copies are brought up to date before a table reads them (``to_shared``)."""
    _wasm()
    team = FakeTeam()
    rng = np.random.default_rng(1)
    C, H, D, T = 5, 1, 6, 2
    kc0 = rng.standard_normal((C, H, D)).astype(np.float32)
    vc0 = rng.standard_normal((C, H, D)).astype(np.float32)
    q = rng.standard_normal((T, 2, D)).astype(np.float32)
    k = rng.standard_normal((T, H, D)).astype(np.float32)
    v = rng.standard_normal((T, H, D)).astype(np.float32)
    kc, vc = team.moved(kc0), team.moved(vc0)
    dev = dict(device="wasm")
    out = ember.ops.llm.attention_cached(ember.tensor(q, **dev), ember.tensor(k, **dev), ember.tensor(v, **dev),
                                         kc, vc, ember.tensor([1], dtype="int32", **dev))
    ref = ember.ops.llm.attention_cached(ember.tensor(q), ember.tensor(k), ember.tensor(v),
                                         ember.tensor(kc0), ember.tensor(vc0), ember.tensor([1], dtype="int32"))
    np.testing.assert_allclose(np.array(out.tolist()), np.array(ref.tolist()), rtol=1e-5, atol=1e-6)
    want_k = kc0.copy()
    want_k[1:3] = k
    for cache, want in ((kc, want_k),):
        ent = _ent(cache)
        assert ent.state == ent.PY_NEWER and not ent.moved
        ent.to_shared()
        assert team.shared(cache) == want.tobytes()


def test_compiled_plan_python_steps_on_a_moved_constant():
    """A compiled function whose python-kernel steps read a moved constant: the numpy answer on
    every call (capture, recording, replays)."""
    _wasm()
    team = FakeTeam()
    w = team.moved(WORDS)
    f = ember.compile(lambda a: (a & w) + (w // 5))
    for seed in range(4):
        a = np.random.default_rng(seed).integers(-1000, 1000, WORDS.size).astype(np.int32)
        got = f(ember.tensor(a, device="wasm")).tolist()
        assert got == ((a & WORDS) + (WORDS // 5)).tolist(), seed


def test_a_moved_array_whose_span_is_gone_raises():
    """After its team closed (or for a ``Moved`` never given a span) every way of reading the
    array raises DeviceError: tolist, a python kernel, a wasm kernel, Python indexing."""
    _wasm()
    from ember.wasm.runtime import RESIDENT
    from ember.wasm.team import Moved

    team = FakeTeam()
    x = team.moved(WORDS)
    y = team.moved(np.arange(4, dtype=np.float32))
    kept = team.moved(np.arange(3, dtype=np.int32))
    kept.tolist()                          # Python has its elements: they stay valid after the close
    team.close()
    assert id(x._buf) not in RESIDENT and team.closed
    for name, f in [("tolist", lambda: x.tolist()), ("python kernel", lambda: x & 1),
                    ("family fallback", lambda: x + 1), ("wasm kernel", lambda: y * 2.0),
                    ("index", lambda: x._buf[0]), ("iterate", lambda: sum(x._buf)),
                    ("slice (module copy)", lambda: y[1:3].tolist())]:
        with pytest.raises(DeviceError):
            f()
    assert kept.tolist() == [0, 1, 2]
    orphan = Moved("f")
    orphan.n = 3
    with pytest.raises(DeviceError, match="no copy in the shared memory"):
        orphan.tolist()


def test_every_python_kernel_of_the_wasm_backend_is_guarded():
    """One choke point: the wasm backend's table, the families' fallbacks and the recorder take
    python kernels from ``fallback.PY`` only (a module reaching the python backend's table by
    another name fails here), and a kernel set on the table later is wrapped too."""
    _wasm()
    from ember.wasm import fallback
    from ember.wasm.backend import family_kernels

    be = ember.get_backend("wasm")
    native = family_kernels(be.rt)
    for name, k in be.kernels.items():
        if name not in native:
            assert getattr(k, "python_use_guarded", False), name
    pat = re.compile(r"backends\.python import [^\n]*KERNELS|_py\.KERNELS|python\.KERNELS|backends import python_")
    for path in sorted((REPO / "wasm").glob("*.py")):
        if path.name != "fallback.py":
            assert not pat.search(path.read_text()), f"{path.name} takes the python kernels unguarded"

    def custom(out, x):
        return x._buf
    be.kernels["_test_custom"] = custom
    try:
        assert be.kernels["_test_custom"].python_use_guarded
    finally:
        del be.kernels["_test_custom"]
    assert set(fallback.PY) == set(ember.backends.python.KERNELS)


def test_python_kernels_write_only_the_inputs_they_declare():
    """``fallback.WRITES`` lists the inputs a python kernel writes in place (then Python's copy
    of a resident one becomes the newer): run the op cases on device "python" and fail on an
    input whose bytes a kernel changed without a listing."""
    import op_cases

    from ember.wasm.fallback import WRITES

    be = ember.get_backend("python")
    seen, bad = set(), []
    orig = dict(be.kernels)

    def watch(name, k):
        def run(out, *ins, **attrs):
            before = [t._buf.tobytes() if hasattr(t, "_buf") else None for t in ins]
            res = k(out, *ins, **attrs)
            for i, (t, b) in enumerate(zip(ins, before)):
                if b is not None and t._buf.tobytes() != b and i not in WRITES.get(name, ()):
                    bad.append((name, i))
            seen.add(name)
            return res
        return run

    be.kernels.update({n: watch(n, k) for n, k in orig.items()})
    try:
        per_op = {}
        for case in op_cases.all_cases():
            op = case.id.split("[")[0].split("/")[0]
            if per_op.get(op, 0) < 3:
                per_op[op] = per_op.get(op, 0) + 1
                op_cases.run_case(ember, case, "python")
        # the in-place op: the listed caches change, the rest not
        kc, vc = ember.zeros((4, 1, 2)), ember.zeros((4, 1, 2))
        ember.ops.llm.attention_cached(ember.ones((1, 2, 2)), ember.ones((1, 1, 2)), ember.ones((1, 1, 2)),
                                       kc, vc, ember.tensor([0], dtype="int32"))
        assert kc.tolist()[0] == [[1.0, 1.0]]
    finally:
        be.kernels.clear()
        be.kernels.update(orig)
    assert len(seen) > 40 and "attention_cached" in seen, sorted(seen)
    assert not bad, bad


# ---- the real team: Pyodide under Node, 2 threads ----------------------------------------------------

TEAM_DRIVER = r'''
import json, struct, time
import ember, ember.wasm as W
from ember.tensor import Tensor
from ember import dtypes
from ember.quant import QTensor
from ember.wasm import team as T
from ember.wasm import ops_quant as OQ
from ember.wasm.runtime import RESIDENT
from array import array

data = json.load(open("/io/inputs.json"))
W.set_threads(2)
end = time.monotonic() + 20
while W.threads() < 2 and time.monotonic() < end:
    time.sleep(0.01)
team = T.team(create=False)
out = {"threads": W.threads()}

def flat(v):
    return [z for y in v for z in flat(y)] if isinstance(v, list) else [v]

def moved(values, tc, shape, dtype):
    values = flat(values)
    raw = array(tc, values).tobytes()
    def fill(at, view):
        view[:] = raw[at:at + len(view)]
    return Tensor._wrap(team.moved(tc, len(values), fill), tuple(shape), dtype, "wasm")

def words():
    return moved(data["words"], "i", (len(data["words"]),), dtypes.int32)

def cache():
    return moved(data["cache"], "f", data["cache_shape"], dtypes.float32)

def still_moved(t):
    e = RESIDENT.get(id(t._buf))
    return e is not None and e.moved

def run(name, f, t=None):
    try:
        r = f()
        out[name] = {"value": r.tolist() if hasattr(r, "tolist") else r}
    except Exception as e:
        out[name] = {"error": type(e).__name__, "message": str(e)[:300]}
    if t is not None:
        out[name]["moved_after"] = still_moved(t)

# eager: ops the module leaves to python kernels (int32), family kernels that fall back, and ops
# the module does on the shared memory (the array stays moved)
ix = ember.tensor([7, 0, 3], dtype="int32", device="wasm")
for name, f in [("and", lambda x: x & 0xFF), ("add", lambda x: x + 7), ("floordiv", lambda x: x // 3),
                ("max", lambda x: x.max()), ("cumsum", lambda x: ember.cumsum(x, axis=0)),
                ("take", lambda x: ember.take(x, ix, axis=0)), ("slice", lambda x: x[2:7]),
                ("strided", lambda x: x[1::3]), ("cast", lambda x: x.astype("float32")),
                ("bytes", lambda x: list(struct.unpack_from("<4i", bytes(x._buf)))),
                ("memoryview", lambda x: memoryview(x._buf).cast("B")[4:8].cast("i").tolist()),
                ("struct", lambda x: list(struct.unpack_from("<2i", x._buf, 8)))]:
    x = words()
    run("words_" + name, lambda: f(x), x)
for name, f in [("rows", lambda c: c[1:3]), ("sum", lambda c: c.sum(axis=0)), ("exp", lambda c: ember.exp(c)),
                ("python_device", lambda c: c.to("python")[2] * 2.0), ("iter", lambda c: sum(c._buf))]:
    c = cache()
    run("cache_" + name, lambda: f(c), c)

# a moved quantized weight: the module's dequantize (stays moved), then as if the module had no
# kernel for the format (the python kernel: the weight's words come back)
qw = moved(data["qwords"], "i", (len(data["qwords"]),), dtypes.int32)
q = QTensor(qw, "q4_1", tuple(data["qshape"]))
run("dequantize", lambda: q.dequantize(), qw)
known = OQ.KNOWN
OQ.KNOWN = frozenset()
try:
    run("dequantize_python", lambda: q.dequantize(), qw)
    qw2 = moved(data["qwords"], "i", (len(data["qwords"]),), dtypes.int32)
    run("qlinear_python", lambda: ember.quant.linear(ember.tensor(data["qx"], device="wasm"),
                                                  QTensor(qw2, "q4_1", tuple(data["qshape"]))), qw2)
finally:
    OQ.KNOWN = known

# the python attention kernel (head size 6) writes moved caches: Python's copy is the newer, and
# the shared copy is brought up to date before a table reads it
a = data["attn"]
dev = dict(device="wasm")
kc = moved(a["kc"], "f", a["cache_shape"], dtypes.float32)
vc = moved(a["vc"], "f", a["cache_shape"], dtypes.float32)
run("attention_python", lambda: ember.ops.llm.attention_cached(
    ember.tensor(a["q"], **dev), ember.tensor(a["k"], **dev), ember.tensor(a["v"], **dev), kc, vc,
    ember.tensor([1], dtype="int32", **dev)), kc)
ent = RESIDENT[id(kc._buf)]
out["attention_state"] = ent.state
ent.to_shared()
back = array("f", bytes(ent.nbytes))
team.read_into(ent.addr, back, ent.nbytes)
out["attention_shared_k"] = back.tolist()

# compiled plans: python steps on a moved constant, module steps binding one where it lives
w = words()
f = ember.compile(lambda v: (v & w) + (w // 5))
out["plan_python"] = [f(ember.tensor(v, dtype="int32", device="wasm")).tolist() for v in data["plan_inputs"]]
wf = cache()
g = ember.compile(lambda v: (wf * v).sum(axis=0) + wf[1:3].sum(axis=0))
out["plan_module"] = [g(ember.tensor(v, device="wasm")).tolist() for v in data["plan_floats"]]
out["plan_module_moved"] = still_moved(wf)
wi, wf2 = words(), cache()
h = ember.compile(lambda v: ember.cumsum(wi & 3, axis=0).astype("float32") + (wf2 * v).sum(axis=(1, 2))[:1])
out["plan_mixed"] = [h(ember.tensor(v, device="wasm")).tolist() for v in data["plan_floats"]]

# hostile: the team closes; every read of what was moved there raises DeviceError
gone_w, gone_c = words(), cache()
g2 = ember.compile(lambda v: (gone_c * v).sum())
g2(ember.tensor(data["plan_floats"][0], device="wasm"))
g2(ember.tensor(data["plan_floats"][0], device="wasm"))
kept = words()
kept.tolist()
team.close()
W.set_threads(1)
for name, fn in [("tolist", lambda: gone_w.tolist()), ("python_kernel", lambda: gone_w & 1),
                 ("family_fallback", lambda: gone_w + 1), ("module_kernel", lambda: gone_c * 2.0),
                 ("slice", lambda: gone_c[1:2]), ("memoryview", lambda: memoryview(gone_w._buf)),
                 ("plan", lambda: g2(ember.tensor(data["plan_floats"][0], device="wasm")))]:
    run("closed_" + name, fn)
run("closed_kept", lambda: kept & 0xFF)
json.dump(out, open("/io/moved.json", "w"))
'''


def _inputs():
    from ember.quant import QTensor

    rng = np.random.default_rng(7)
    words = rng.integers(-(1 << 30), 1 << 30, 40).astype(np.int32)
    cache = rng.standard_normal((6, 2, 4)).astype(np.float32)
    qf = rng.standard_normal((3, 64)).astype(np.float32)
    qt = QTensor.quantize(ember.tensor(qf), "q4_1")
    attn = {"cache_shape": [5, 1, 6], "kc": rng.standard_normal(30).astype(np.float32),
            "vc": rng.standard_normal(30).astype(np.float32),
            "q": rng.standard_normal((2, 2, 6)).astype(np.float32),
            "k": rng.standard_normal((2, 1, 6)).astype(np.float32),
            "v": rng.standard_normal((2, 1, 6)).astype(np.float32)}
    return {"words": words, "cache": cache, "cache_shape": list(cache.shape), "qwords": qt.data.tolist(),
            "qshape": [3, 64], "qx": rng.standard_normal((2, 64)).astype(np.float32), "attn": attn,
            "plan_inputs": [rng.integers(-1000, 1000, 40).astype(np.int32) for _ in range(4)],
            "plan_floats": [rng.standard_normal((6, 2, 4)).astype(np.float32) for _ in range(4)]}


def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return v


@pytest.fixture(scope="module")
def node_moved(tmp_path_factory):
    import test_pyodide as tp

    _wasm()
    node = tp.need_node()
    wheel = tp._wheel(tmp_path_factory)
    io = tmp_path_factory.mktemp("pyodide-moved")
    inp = _inputs()
    (io / "inputs.json").write_text(json.dumps(_jsonable(inp)))
    proc = tp.run_driver(node, wheel, io, TEAM_DRIVER, {io: "/io"})
    if proc.returncode != 0 or not (io / "moved.json").exists():
        pytest.fail(f"Pyodide run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}",
                    pytrace=False)
    return inp, json.loads((io / "moved.json").read_text())


def _close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.array(got, dtype=np.float64), np.asarray(want, dtype=np.float64),
                               rtol=tol, atol=tol)


def test_node_eager_ops_on_moved_arrays(node_moved):
    """Eager ops on moved arrays with the real team: python-kernel fallbacks re-materialise the
    array (numpy's answers; before they gave empty results); the module's own ops (a contiguous
    or strided slice, take, cast, sums, exp, dequantize) run on the shared memory and leave it
    moved; the buffer protocol (bytes, memoryview, struct) gets the elements too."""
    inp, res = node_moved
    assert res["threads"] == 2
    w, c = inp["words"], inp["cache"]
    want = {"and": (w & 0xFF, False), "add": (w + 7, False), "floordiv": (w // 3, False), "max": (w.max(), False),
            "cumsum": (np.cumsum(w), False), "take": (w[[7, 0, 3]], True), "slice": (w[2:7], True),
            "strided": (w[1::3], True), "cast": (w.astype(np.float32), True), "bytes": (w[:4], False),
            "memoryview": (w[1:2], False), "struct": (w[2:4], False)}
    for name, (v, stays) in want.items():
        r = res["words_" + name]
        assert "error" not in r, (name, r)
        assert r["value"] == v.tolist(), name
        assert r["moved_after"] == stays, name
    for name, v, stays in [("rows", c[1:3], True), ("sum", c.sum(axis=0), True), ("exp", np.exp(c), True),
                           ("python_device", c[2] * 2.0, False), ("iter", float(c.ravel().sum()), False)]:
        r = res["cache_" + name]
        assert "error" not in r, (name, r)
        _close(r["value"], v)
        assert r["moved_after"] == stays, name


def test_node_quantized_weight_and_python_attention_on_moved_arrays(node_moved):
    """A moved Q4_1 weight: dequantize on the module (stays moved) and, as for a format the
    module has no kernel for, the python kernels of dequantize and qlinear (the words come
    back); the python attention kernel (head size 6) writes moved caches and the shared copy
    gets the new rows before a table would read it."""
    from ember.quant import QTensor

    inp, res = node_moved
    q = QTensor(ember.tensor(np.array(inp["qwords"], dtype=np.int32)), "q4_1", (3, 64))
    deq = np.array(q.dequantize().tolist())
    for name, stays in (("dequantize", True), ("dequantize_python", False)):
        r = res[name]
        assert "error" not in r, r
        _close(r["value"], deq)
        assert r["moved_after"] == stays, name
    r = res["qlinear_python"]
    assert "error" not in r and not r["moved_after"], r
    _close(r["value"], inp["qx"] @ deq.T, 1e-4)
    a = inp["attn"]
    kc0, vc0 = a["kc"].reshape(5, 1, 6), a["vc"].reshape(5, 1, 6)
    ref = ember.ops.llm.attention_cached(*(ember.tensor(a[n]) for n in ("q", "k", "v")), ember.tensor(kc0),
                                         ember.tensor(vc0), ember.tensor([1], dtype="int32"))
    r = res["attention_python"]
    assert "error" not in r and not r["moved_after"], r
    _close(r["value"], np.array(ref.tolist()))
    want_k = kc0.copy()
    want_k[1:3] = a["k"]
    assert res["attention_state"] == 1        # Resident.PY_NEWER: Python wrote it
    _close(res["attention_shared_k"], want_k.ravel(), 0)


def test_node_compiled_plans_on_moved_constants(node_moved):
    """Compiled functions over moved constants, 4 calls each (capture, recording, replays):
    python-kernel steps, module steps binding the constant where it lives (it stays moved), and
    both in one plan; numpy's answers every call."""
    inp, res = node_moved
    w, c = inp["words"], inp["cache"]
    assert res["plan_python"] == [((v & w) + (w // 5)).tolist() for v in inp["plan_inputs"]]
    for got, v in zip(res["plan_module"], inp["plan_floats"]):
        _close(got, (c * v).sum(axis=0) + c[1:3].sum(axis=0), 1e-4)
    assert res["plan_module_moved"]
    for got, v in zip(res["plan_mixed"], inp["plan_floats"]):
        _close(got, np.cumsum(w & 3).astype(np.float32) + (c * v).sum(axis=(1, 2))[:1], 1e-4)


def test_node_a_closed_team_s_moved_arrays_raise(node_moved):
    """After ``Team.close()`` whatever reads an array moved there raises DeviceError (no zeros,
    no empty results): tolist, a python kernel, a family fallback, a module kernel, a slice, the
    buffer protocol, a compiled plan that bound it; an array Python had read before keeps its
    values."""
    inp, res = node_moved
    for name in ("tolist", "python_kernel", "family_fallback", "module_kernel", "slice", "memoryview", "plan"):
        assert res["closed_" + name].get("error") == "DeviceError", (name, res["closed_" + name])
    assert res["closed_kept"]["value"] == (inp["words"] & 0xFF).tolist()


# ---- a KV cache grown: the compiled steps' tables rebound, not captured and recorded again -------

def test_a_grown_kv_cache_rebinds_the_compiled_steps(tmp_path, monkeypatch):
    """``LLM._reserve`` on device "wasm": when the cache grows the compiled decode steps keep
    their plans (no capture, no whole recording: ``plan_exec.release_constants`` /
    ``bind_constants`` record only the attention steps again and rebuild the tables), greedy
    text equals numpy's after every growth, and the old cache is gone right after the growth
    (no garbage collection needed)."""
    import gc
    import weakref

    import ember.llm
    from ember.nn import llama as L
    from llm_fixtures import write_tiny_gguf

    _wasm()
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, seed=3, cfg=dict(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=128, ctx=64))
    monkeypatch.setattr(L, "KV_CHUNK", 8)
    ref = ember.llm.load(str(path), device="numpy", context=64)
    m = ember.llm.load(str(path), device="wasm", context=64)
    prompt = ref.tokenizer.encode("the cat")
    assert m.generate(prompt, max_tokens=3) == ref.generate(prompt, max_tokens=3)
    step = m._step_argmax
    (plan,) = step.plans.values()
    fast = plan.fast
    assert fast.ready and fast.records == 1 and step.stats()["captures"] == 1
    segments = fast.describe()["segments"]
    for n in (20, 40):
        old = [weakref.ref(t._buf) for t in m.model.k_cache + m.model.v_cache]
        cap = m.model.capacity
        gc.disable()
        try:
            assert m.generate(prompt, max_tokens=n) == ref.generate(prompt, max_tokens=n), n
            assert m.model.capacity > cap and m.stats["grow_ms"] > 0
            assert all(r() is None for r in old), "the old cache outlived its growth"
        finally:
            gc.enable()
        assert m._step_argmax is step and step.plans[next(iter(step.plans))] is plan and plan.fast is fast
        assert fast.ready and fast.records == 1 and step.stats()["captures"] == 1, (fast.records, step.stats())
        assert fast.describe()["segments"] == segments
        assert {id(t) for _, t in plan.consts} >= {id(t) for t in m.model.k_cache + m.model.v_cache}


def test_rebinding_a_constant_keeps_or_drops_each_plan_by_its_shapes():
    """``release_constants`` / ``bind_constants`` on compiled functions over a constant of
    another size: a plan whose steps give the same shapes replays on the new values (its
    tables rebuilt, not captured again); one whose output shape would change is dropped and
    captured again; both give numpy's answers on every later call."""
    from ember.wasm.plan_exec import bind_constants, release_constants

    _wasm()
    holder = [ember.tensor(np.arange(8, dtype=np.float32).reshape(4, 2), device="wasm")]
    same = ember.compile(lambda i: ember.take(holder[0], i, axis=0) * 2.0)     # (len(i), 2) for any rows
    grows = ember.compile(lambda x: holder[0] * x)                               # (rows, 2)
    x = np.array([0.5, -1.0], dtype=np.float32)
    idx = np.array([3, 1, 0], dtype=np.int32)
    for _ in range(3):
        same(ember.tensor(idx, device="wasm"))
        grows(ember.tensor(x, device="wasm"))
    held = release_constants(same, [holder[0]]) + release_constants(grows, [holder[0]])
    assert len(held) == 2
    new = np.arange(16, dtype=np.float32).reshape(8, 2) * 0.25
    holder[0] = ember.tensor(new, device="wasm")
    assert not bind_constants(held, [holder[0]])        # one plan was dropped
    for _ in range(3):
        _close(same(ember.tensor(np.array([7, 1, 5], dtype=np.int32), device="wasm")).tolist(),
                   new[[7, 1, 5]] * 2.0)
        _close(grows(ember.tensor(x, device="wasm")).tolist(), new * x)
    assert same.stats()["captures"] == 1 and grows.stats()["captures"] == 2
    (plan,) = same.plans.values()
    assert plan.fast.ready and plan.fast.records == 1 and plan.fast.describe()["table_steps"] >= 1
