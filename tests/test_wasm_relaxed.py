"""The relaxed-SIMD kernel module (``kernels_relaxed.wasm``) and how a process picks it.

Two builds of the same kernel sources ship: ``kernels.wasm`` (plain SIMD) and
``kernels_relaxed.wasm`` (``-mrelaxed-simd``: the float GEMM's multiply-adds are
``f32x4.relaxed_madd``, fused where the CPU has FMA). ``ember.wasm.runtime.select_module`` picks
the relaxed one where the engine validates relaxed SIMD (Chromium; Node 20 only with
``--experimental-wasm-relaxed-simd``), the plain one elsewhere (CPython, Node without the flag),
and ``ember.wasm.info()`` says which and why. Checked here:

- the choice itself, for every setting of ``EMBER_WASM_KERNELS`` and engine;
- the relaxed module's rules, source hash and byte-identical rebuild (as for the plain one);
- under wasmtime (deterministic relaxed SIMD: always fused), ``linear`` and ``matmul`` equal
  their summation order with one rounding per multiply-add, bit for bit; they differ from the
  plain module's bits and stay within tolerance of float64; kernels other than the GEMM give
  the plain module's bits;
- in Node with and without the flag, and in a cross-origin isolated Chromium page: which module
  runs, a compiled program (linear, gelu, layer_norm, softmax, matmul) gives the same bits on 1
  and 2 threads, and its bits are those of wasmtime's plain module (plain engines) or of one of
  the two relaxed_madd behaviours (fused or not, the same for every element);
- a relaxed module the engine refuses to compile: ``init()`` falls back to the plain one and
  says why.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import ember
from ember.errors import DeviceError
from ember.wasm import build_kernels, runtime, wasmbin

np = pytest.importorskip("numpy")
pytest.importorskip("wasmtime")

REPO = Path(__file__).resolve().parent.parent


def _relaxed_bytes() -> bytes:
    try:
        return runtime.read_module(runtime.RELAXED_FILE)
    except DeviceError:
        pytest.fail("ember.wasm has no kernels_relaxed.wasm: build it with 'python build.py wheel' "
                    "(needs clang-19 and lld-19)", pytrace=False)


# ---- the choice --------------------------------------------------------------------------

def _never():
    raise AssertionError("the engine was asked although the answer did not depend on it")


@pytest.mark.parametrize("want, pyodide, have, engine, relaxed, why", [
    ("auto", True, True, lambda: True, True, "validates relaxed SIMD"),
    ("auto", True, True, lambda: False, False, "does not validate relaxed SIMD"),
    ("auto", True, False, _never, False, "not in this install"),
    ("auto", False, True, _never, False, "CPython (wasmtime) runs the plain module"),
    ("plain", True, True, _never, False, "EMBER_WASM_KERNELS=plain"),
    ("relaxed", True, True, lambda: True, True, "EMBER_WASM_KERNELS=relaxed"),
    ("relaxed", False, True, _never, True, "EMBER_WASM_KERNELS=relaxed"),
])
def test_choice_of_module(want, pyodide, have, engine, relaxed, why):
    got, note = runtime.choose_module(want, pyodide, have, engine)
    assert got is relaxed and why in note, (got, note)


@pytest.mark.parametrize("want, pyodide, have, engine, match", [
    ("fast", True, True, _never, "expected auto, plain or relaxed"),
    ("relaxed", True, False, _never, "not in this install"),
    ("relaxed", True, True, lambda: False, "does not validate relaxed SIMD"),
])
def test_impossible_choice_is_a_device_error(want, pyodide, have, engine, match):
    with pytest.raises(DeviceError, match=match):
        runtime.choose_module(want, pyodide, have, engine)


def test_probe_is_a_valid_module_with_one_relaxed_madd():
    # the probe parses, and is the plain SIMD probe but for the opcode: with f32x4.add (0xe4)
    # and two operands instead of relaxed_madd it validates in wasmtime without relaxed SIMD
    import wasmtime

    m = wasmbin.parse(runtime.RELAXED_PROBE)
    assert [s.id for s in m.sections] == [1, 3, 10]
    cfg = wasmtime.Config()
    cfg.wasm_relaxed_simd = True
    wasmtime.Module(wasmtime.Engine(cfg), runtime.RELAXED_PROBE)
    cfg = wasmtime.Config()
    cfg.wasm_relaxed_simd = False
    with pytest.raises(Exception):
        wasmtime.Module(wasmtime.Engine(cfg), runtime.RELAXED_PROBE)


def test_cpython_runs_the_plain_module_and_says_why():
    info = ember.wasm.info()
    assert info["module"] == "kernels.wasm" and info["relaxed_simd"] is False, info
    assert "CPython" in info["module_note"], info


# ---- the module file ---------------------------------------------------------------------

def test_relaxed_module_follows_the_rules_and_its_sources():
    data = _relaxed_bytes()
    assert wasmbin.check_kernel_module(data) == []
    assert set(wasmbin.parse(data).custom()) == {build_kernels.SECTION}
    assert build_kernels.embedded_hash(data) == build_kernels.source_hash(relaxed=True), \
        "kernels_relaxed.wasm was built from other sources: rebuild with 'python build.py wheel'"
    assert build_kernels.source_hash(relaxed=True) != build_kernels.source_hash()
    # the same kernels under the same numbers: one command-table ABI for both modules
    plain = runtime.read_module(runtime.MODULE_FILE)
    sigs = build_kernels.module_signatures
    assert build_kernels.dispatchable(sigs(data)) == build_kernels.dispatchable(sigs(plain))


@pytest.mark.skipif(build_kernels.find_clang(relaxed=True) is None,
                    reason="clang-19/lld-19 are not installed (python build.py setup installs them)")
def test_relaxed_rebuild_is_byte_identical(tmp_path):
    out = build_kernels.build(str(tmp_path / "k.wasm"), relaxed=True)
    assert open(out, "rb").read() == _relaxed_bytes()


# ---- the relaxed module under wasmtime ------------------------------------------------------

@pytest.fixture
def relaxed_rt():
    """device "wasm" on the relaxed module (wasmtime, relaxed_madd always fused) for one test."""
    from ember.backends import reset_backend

    _relaxed_bytes()
    saved = runtime._runtime[0]
    runtime._runtime[0] = runtime.WasmtimeRuntime(runtime.RELAXED_FILE)
    reset_backend("wasm")
    try:
        yield runtime._runtime[0]
    finally:
        runtime._runtime[0] = saved
        reset_backend("wasm")


def _fused(a, b, bias=None):
    """(M, K) @ (K, N) in gemm's order with one rounding per step: acc = bias or 0, then
    round32(acc + a[:, k] * b[k, :]) for k = 0, 1, ... (the product is exact in long double and
    the sum rounds twice only at a float32 midpoint after 64 bits: not in these data)."""
    ld = np.longdouble
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    if bias is not None:
        acc = acc + bias
    for k in range(a.shape[1]):
        acc = (acc.astype(ld) + a[:, k:k + 1].astype(ld) * b[k:k + 1, :].astype(ld)).astype(np.float32)
    return acc


def _w(x):
    return ember.from_bytes(np.ascontiguousarray(x, np.float32).tobytes(), x.shape, "float32", device="wasm")


def _np(t):
    return np.frombuffer(bytes(t.to("python")._buf), np.float32).reshape(t.shape)


@pytest.mark.skipif(np.finfo(np.longdouble).nmant < 63, reason="no 64-bit long double here")
@pytest.mark.parametrize("M, K, N", [(101, 400, 37), (40, 20, 24), (97, 385, 17)])
def test_relaxed_linear_fuses_each_multiply_add(relaxed_rt, M, K, N):
    from test_wasm_gemm import _sequential

    rng = np.random.default_rng(M + K + N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    got = _np(ember.linear(_w(x), _w(w), _w(b)))
    assert np.array_equal(got.view(np.uint32), _fused(x, w.T, b).view(np.uint32))
    assert not np.array_equal(got, _sequential(x, w.T, b))   # not the plain module's bits
    ref = x.astype(np.float64) @ w.T.astype(np.float64) + b
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.sqrt(K))


def test_relaxed_matmul_and_small_products_within_tolerance(relaxed_rt):
    rng = np.random.default_rng(3)
    for sa, sb in (((3, 20, 33), (33, 17)), ((2, 3, 36, 19), (3, 19, 21)), ((5, 40), (40, 9)), ((1, 64), (64, 96))):
        a = rng.standard_normal(sa).astype(np.float32)
        b = rng.standard_normal(sb).astype(np.float32)
        got = _np(ember.matmul(_w(a), _w(b)))
        np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_relaxed_module_changes_only_the_products(relaxed_rt):
    # kernels without a multiply-add in the GEMM give the plain module's bits
    from ember.backends import reset_backend

    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 96)).astype(np.float32) * 3
    g, wv, bv = (rng.standard_normal(96).astype(np.float32) for _ in range(3))

    def run():
        t = _w(x)
        return [_np(y) for y in (ember.gelu(t), ember.softmax(t, axis=-1), ember.layer_norm(t, (96,), _w(wv), _w(bv)),
                                 ember.add(t, _w(g)), ember.exp(t), ember.tanh(t))]
    relaxed = run()
    runtime._runtime[0] = runtime.WasmtimeRuntime(runtime.MODULE_FILE)
    reset_backend("wasm")
    plain = run()
    for r, p in zip(relaxed, plain):
        assert np.array_equal(r.view(np.uint32), p.view(np.uint32))


# ---- real engines: Node (with and without its flag) and Chromium -----------------------------

# One compiled program on inputs made by formula (no numpy in Pyodide), run on 1 and then 2
# threads (the team splitting every kernel however small); the results as hex of their bytes.
PROGRAM = r'''
import os, sys
if __KERNELS__:
    os.environ["EMBER_WASM_KERNELS"] = __KERNELS__
import ember, ember.wasm as W
import ember.wasm.team as T
from array import array
out = {}
try:
    ember.get_backend("wasm")
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
def t(shape, seed):
    n = 1
    for m in shape:
        n *= m
    v = array("f", [(((i * 7919 + seed * 104729) % 2003) - 1001) / 997.0 for i in range(n)])
    return ember.from_bytes(v.tobytes(), shape, "float32", device="wasm")
if "error" not in out:
    x, w1, b1, w2 = t((64, 96), 1), t((128, 96), 2), t((128,), 3), t((128, 40), 4)
    lw, lb = t((128,), 5), t((128,), 6)
    def prog(x, w1, b1, w2, lw, lb):
        h = ember.layer_norm(ember.gelu(ember.linear(x, w1, b1)), (128,), lw, lb)
        return ember.softmax(h @ w2, axis=-1), ember.linear(x[:3], w1)
    f = ember.compile(prog)
    eager = [bytes(y.to("python")._buf).hex() for y in prog(x, w1, b1, w2, lw, lb)]
    runs = {}
    await W.init(wait_threads=20)
    for n in (1, 2):
        W.set_threads(n)
        tm = T.team(create=False)
        if tm is not None:
            tm.set_min_work(1)
            tm.adaptive = False
        for _ in range(3):
            got = f(x, w1, b1, w2, lw, lb)
        runs[n] = [bytes(y.to("python")._buf).hex() for y in got]
    out.update(eager=eager, runs=runs, threads=W.threads())
out["info"] = {k: v for k, v in W.info().items() if k in ("module", "relaxed_simd", "module_note", "runtime")}
'''


def _cpython_program(file: str) -> list:
    """PROGRAM's results in CPython under wasmtime on module ``file`` (as float32 arrays)."""
    from ember.backends import reset_backend

    saved = runtime._runtime[0]
    runtime._runtime[0] = runtime.WasmtimeRuntime(file)
    reset_backend("wasm")
    try:
        scope = {}
        code = PROGRAM.replace("__KERNELS__", "None").replace("await W.init(wait_threads=20)", "pass")
        exec(compile(code, "program", "exec"), scope)
        assert "error" not in scope["out"], scope["out"]
        return [np.frombuffer(bytes.fromhex(h), np.float32) for h in scope["out"]["eager"]]
    finally:
        runtime._runtime[0] = saved
        reset_backend("wasm")


def _reference() -> list:
    """PROGRAM in float64 numpy."""
    def t(shape, seed):
        n = int(np.prod(shape))
        return ((((np.arange(n, dtype=np.int64) * 7919 + seed * 104729) % 2003) - 1001) / 997.0).astype(
            np.float32).astype(np.float64).reshape(shape)
    x, w1, b1, w2, lw, lb = t((64, 96), 1), t((128, 96), 2), t((128,), 3), t((128, 40), 4), t((128,), 5), t((128,), 6)
    from math import erf
    h = x @ w1.T + b1
    h = 0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))
    h = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5) * lw + lb
    s = h @ w2
    s = np.exp(s - s.max(-1, keepdims=True))
    return [(s / s.sum(-1, keepdims=True)).ravel(), (x[:3] @ w1.T).ravel()]


def _check_engine(res: dict, relaxed: bool) -> None:
    assert "error" not in res, res
    assert res["info"]["module"] == ("kernels_relaxed.wasm" if relaxed else "kernels.wasm"), res["info"]
    assert res["info"]["relaxed_simd"] is relaxed, res["info"]
    assert res["threads"] == 2 and res["runs"]["1"] == res["runs"]["2"] == res["eager"], \
        "thread counts or eager differ"
    got = [np.frombuffer(bytes.fromhex(h), np.float32) for h in res["eager"]]
    for g, r in zip(got, _reference()):
        np.testing.assert_allclose(g, r, rtol=2e-4, atol=2e-5)
    plain = _cpython_program(runtime.MODULE_FILE)
    same_plain = all(np.array_equal(g.view(np.uint32), p.view(np.uint32)) for g, p in zip(got, plain))
    if not relaxed:
        assert same_plain, "the plain module gives other bits here than in CPython"
    else:   # relaxed_madd fused on every element (FMA CPUs) or on none
        fused = _cpython_program(runtime.RELAXED_FILE)
        same_fused = all(np.array_equal(g.view(np.uint32), f.view(np.uint32)) for g, f in zip(got, fused))
        assert same_fused or same_plain, "relaxed_madd neither fused everywhere nor nowhere"


def _node_run(tmp_path_factory, flags: list, kernels: str | None) -> dict:
    import test_pyodide as tp

    node = tp.need_node()
    wheel = tp._wheel(tmp_path_factory)
    io = tmp_path_factory.mktemp("pyodide-relaxed")
    code = PROGRAM.replace("__KERNELS__", repr(kernels)) + '\nimport json\njson.dump(out, open("/io/out.json", "w"))\n'
    (io / "driver.py").write_text(code)
    import subprocess

    proc = subprocess.run([node, *flags, str(tp.RUNNER), "--wheel", str(wheel), "--mount", f"{io}:/io",
                           str(io / "driver.py")], capture_output=True, text=True, timeout=tp.NODE_TIMEOUT_S)
    if proc.returncode != 0 or not (io / "out.json").exists():
        pytest.fail(f"Pyodide run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}",
                    pytrace=False)
    return json.loads((io / "out.json").read_text())


def _node_knows_the_flag() -> bool:
    import subprocess

    node = shutil.which("node")
    if node is None:
        return False
    out = subprocess.run([node, "--v8-options"], capture_output=True, text=True).stdout
    return "--experimental-wasm-relaxed-simd" in out


def _node_validates_relaxed(flags) -> bool:
    import subprocess

    js = f"process.exit(WebAssembly.validate(Buffer.from('{runtime.RELAXED_PROBE.hex()}', 'hex')) ? 0 : 1)"
    return subprocess.run([shutil.which("node"), *flags, "-e", js]).returncode == 0


def test_node_without_relaxed_simd_runs_the_plain_module(tmp_path_factory):
    if shutil.which("node") is None or _node_validates_relaxed([]):
        pytest.skip("this Node validates relaxed SIMD by default")
    res = _node_run(tmp_path_factory, [], None)
    _check_engine(res, relaxed=False)
    assert "does not validate relaxed SIMD" in res["info"]["module_note"], res["info"]
    # asking for the relaxed one there is a DeviceError that says why, not a crash
    res = _node_run(tmp_path_factory, [], "relaxed")
    assert res["error"].startswith("DeviceError") and "does not validate" in res["error"], res


def test_node_with_relaxed_simd_runs_the_relaxed_module(tmp_path_factory):
    _relaxed_bytes()
    flags = ["--experimental-wasm-relaxed-simd"] if _node_knows_the_flag() else []
    if shutil.which("node") is None or not _node_validates_relaxed(flags):
        pytest.skip("this Node cannot validate relaxed SIMD")
    res = _node_run(tmp_path_factory, flags, None)
    _check_engine(res, relaxed=True)
    assert "validates relaxed SIMD" in res["info"]["module_note"], res["info"]
    res = _node_run(tmp_path_factory, flags, "plain")   # the setting wins over the engine
    _check_engine(res, relaxed=False)


FALLBACK = r'''
import json
import ember, ember.wasm as W
from ember.wasm import runtime as R
real = R.read_module
# a relaxed module the engine refuses (its code section cut short): auto falls back to the plain one
R.read_module = lambda name=R.MODULE_FILE: real(name)[:-100] if name == R.RELAXED_FILE else real(name)
got = await W.init()
a = ember.tensor([[1.0, 2.0], [3.0, 4.0]], device="wasm")
json.dump({"init": {k: got[k] for k in ("module", "relaxed_simd", "module_note")},
           "info": {k: W.info()[k] for k in ("module", "relaxed_simd", "module_note")},
           "mm": (a @ a).tolist()}, open("/io/out.json", "w"))
'''


def test_a_relaxed_module_that_fails_to_compile_falls_back_to_the_plain_one(tmp_path_factory):
    import subprocess

    import test_pyodide as tp

    _relaxed_bytes()
    flags = ["--experimental-wasm-relaxed-simd"] if _node_knows_the_flag() else []
    if shutil.which("node") is None or not _node_validates_relaxed(flags):
        pytest.skip("this Node cannot validate relaxed SIMD")
    node, wheel = tp.need_node(), tp._wheel(tmp_path_factory)
    io = tmp_path_factory.mktemp("pyodide-fallback")
    (io / "driver.py").write_text(FALLBACK)
    proc = subprocess.run([node, *flags, str(tp.RUNNER), "--wheel", str(wheel), "--mount", f"{io}:/io",
                           str(io / "driver.py")], capture_output=True, text=True, timeout=tp.NODE_TIMEOUT_S)
    assert proc.returncode == 0 and (io / "out.json").exists(), proc.stderr[-3000:]
    res = json.loads((io / "out.json").read_text())
    for key in ("init", "info"):
        assert res[key]["module"] == "kernels.wasm" and res[key]["relaxed_simd"] is False, res
        assert res[key]["module_note"].startswith("the relaxed module failed to compile"), res
    assert res["mm"] == [[7.0, 10.0], [15.0, 22.0]]


def test_chromium_page_runs_the_relaxed_module(tmp_path_factory):
    from browser_page import SKIPS, run_page

    for mark in SKIPS:
        if mark.args[0]:
            pytest.skip(mark.kwargs["reason"])
    _relaxed_bytes()
    res = run_page(tmp_path_factory.mktemp("ember-relaxed-site"),
                   PROGRAM.replace("__KERNELS__", "None") + "\nimport json\njson.dumps(out)\n", isolated=True)
    _check_engine(res, relaxed=True)
