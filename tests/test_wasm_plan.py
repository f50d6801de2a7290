"""A replayed plan on device "wasm" runs as command tables inside the kernel module
(``ember.wasm.plan_exec``, ``wasm/kernels/exec.c``), bit for bit what step-by-step code gives.

The checks live in tests/wasm_plan_checks.py and run twice: here in CPython under wasmtime (the
tables in a plan arena, buffers copied in and out) and inside Pyodide under Node (the tables on
Pyodide's own memory, zero copy: the real target), one Pyodide boot for all of them.
"""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

import ember
import op_cases
import wasm_plan_checks as checks

REPO = Path(__file__).resolve().parent.parent
MNIST = REPO / "demos" / "mnist"


@pytest.fixture(scope="module")
def wasm():
    try:
        ember.get_backend("wasm")
    except ember.errors.DeviceError as e:
        pytest.skip(f"wasm backend unavailable: {e}")
    import ember.wasm.plan_exec as pe

    if not pe.ENABLED:
        pytest.skip("command tables are off (EMBER_WASM_PLAN_TABLE=0)")
    return pe


def _mnist_model():
    sys.path.insert(0, str(MNIST))
    try:
        import model
    finally:
        sys.path.remove(str(MNIST))
    return model


# ---- CPython (wasmtime) --------------------------------------------------------------------------

def test_op_cases_replay_bit_identical_through_tables(wasm):
    res = checks.op_cases(ember, op_cases)
    assert res["cases"] > 2000, res["cases"]
    assert not res["failures"], f"{len(res['failures'])} op cases differ:\n" + "\n".join(res["failures"][:30])
    # most plans became tables (the rest: ops without a module kernel, integer dtypes...)
    assert res["tables"] > 0.9 * res["cases"], res


def test_mnist_forward_is_one_call(wasm):
    res = checks.mnist(ember, _mnist_model(), str(MNIST / "mnist.safetensors"))
    assert res["same"] and res["kept"], res
    assert res["segments"] == 1 and res["runs_per_forward"] == 1 and not res["python_steps"], res
    assert res["space"] == "wasmtime"
    assert res["fused"] == ["conv2d + batch_norm + relu"] * 2 and res["fused_close"], res
    assert res["fused_segments"] == 1 and res["fused_runs_per_forward"] == 1, res


def test_llama_decode_step_bit_identical(wasm):
    res = checks.llama_decode(ember)
    assert res["same"], res
    assert res["table_steps"] and res["table_steps"] >= 10, res


def test_guarded_kernel_result_hands_the_step_to_python(wasm):
    res = checks.guard(ember)
    assert res["small"] and res["big"], res
    assert res["runs_small"] == 1 and res["runs_big"] == 2, res   # stopped once, resumed once


def test_a_value_read_in_python_keeps_the_step_out_of_the_table(wasm):
    res = checks.data_reads(ember)
    assert res["same"], res
    assert any("depend on the values" in r for r in res["python_steps"].values()), res


def test_stale_or_out_of_bounds_tables_are_refused(wasm):
    res = checks.stale_and_bounds(ember)
    assert res["after_swap"] and res["again"], res
    assert res["records_after"] == res["records_before"] + 1, res
    assert res["short_input"].startswith("BoundsError"), res
    assert res["short_input_ran_nothing"] and res["last_intact"], res
    assert res["narrow_input"].startswith("BoundsError") and res["narrow_input_ran_nothing"], res
    assert res["new_inputs"] and res["same_values_swap"], res
    assert res["damaged"].startswith("refused"), res
    assert res["damaged_ran_nothing"], res


def test_python_steps_split_segments_and_training_steps_replay_as_before(wasm):
    res = checks.segments(ember)
    assert res["same"] and res["losses_fall"], res
    assert res["segments"] == 2, res
    assert res["train_disabled"], res


def test_intermediates_over_the_limit_replay_step_by_step(wasm, monkeypatch):
    monkeypatch.setattr(wasm, "MAX_OWN_BYTES", 1000)
    f = ember.compile(lambda x: (x * 2.0 + 1.0) * 3.0)
    x = ember.ones((400,), device="wasm")
    outs = [checks.raw(f(x)) for _ in range(3)]
    assert outs[0] == outs[2] == checks.raw((x * 2.0 + 1.0) * 3.0)
    assert "MB" in checks.fast_of(f).disabled


def test_other_backends_replay_step_by_step():
    f = ember.compile(lambda x: x * 2.0 + 1.0)
    x = ember.ones((3,), device="python")
    f(x), f(x)
    assert f.plan_for(x).fast is False


def test_dispatch_numbering_matches_the_module(wasm):
    from ember.wasm.runtime import module_bytes

    d = wasm.Dispatch(module_bytes())
    rt = ember.get_backend("wasm").rt
    assert rt.call("ember_abi") & 0xFFFFFFFF == d.abi
    assert "gemm" in d.ids and "ember_run" not in d.ids
    assert list(d.ids) == sorted(d.ids)


# ---- Pyodide under Node (the page's engine) --------------------------------------------------------

DRIVER = textwrap.dedent('''
    import json, sys, traceback
    sys.path.insert(0, "/repo/tests")
    sys.path.insert(0, "/mnist")
    import ember
    import op_cases, model
    import wasm_plan_checks as C
    import ember.wasm
    ember.wasm.set_threads(1)   # tables on Pyodide's own memory (test_wasm_threads: the team's)
    out = {"runtime": ember.get_backend("wasm").rt.kind}
    for name, fn in [("op_cases", lambda: C.op_cases(ember, op_cases)),
                     ("mnist", lambda: C.mnist(ember, model, "/mnist/mnist.safetensors")),
                     ("llama", lambda: C.llama_decode(ember)), ("guard", lambda: C.guard(ember)),
                     ("data", lambda: C.data_reads(ember)), ("stale", lambda: C.stale_and_bounds(ember)),
                     ("segments", lambda: C.segments(ember))]:
        try:
            out[name] = fn()
        except Exception:
            out[name] = {"error": traceback.format_exc(limit=6)}
    # Pyodide's memory grows between replays: addresses stay valid, results the same
    import pyodide_js
    mem = pyodide_js._module.memory
    f = ember.compile(lambda x: ember.relu(x @ x.T) + 1.0)
    x = ember.tensor([[float(i * 3 + j) for j in range(9)] for i in range(7)], device="wasm")
    before = [f(x).tolist() for _ in range(3)][-1]
    size0 = mem.buffer.byteLength
    big = bytearray(size0 + (64 << 20))
    after = f(x).tolist()
    out["growth"] = {"grew": mem.buffer.byteLength > size0, "same": before == after,
                     "segments": C.fast_of(f).describe()["segments"]}
    del big
    json.dump(out, open("/io/plan.json", "w"))
''')


@pytest.fixture(scope="module")
def pyodide(tmp_path_factory):
    import test_pyodide as tp

    node = tp.need_node()
    wheel = tp._wheel(tmp_path_factory)
    io = tmp_path_factory.mktemp("pyodide-plan")
    proc = tp.run_driver(node, wheel, io, DRIVER, {REPO / "tests": "/repo/tests", MNIST: "/mnist", io: "/io"})
    if proc.returncode != 0 or not (io / "plan.json").exists():
        pytest.fail(f"Pyodide run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}",
                    pytrace=False)
    return json.loads((io / "plan.json").read_text())


def _ok(res):
    assert "error" not in res, res.get("error")
    return res


def test_pyodide_tables_on_pyodides_memory(pyodide):
    assert pyodide["runtime"] == "pyodide"
    oc = _ok(pyodide["op_cases"])
    assert oc["cases"] > 2000 and not oc["failures"], oc["failures"][:30]
    assert oc["tables"] > 0.9 * oc["cases"], oc
    m = _ok(pyodide["mnist"])
    assert m["same"] and m["kept"] and m["segments"] == 1 and m["runs_per_forward"] == 1, m
    assert m["space"] == "pyodide"
    assert m["fused"] == ["conv2d + batch_norm + relu"] * 2 and m["fused_close"], m
    assert m["fused_segments"] == 1 and m["fused_runs_per_forward"] == 1, m
    assert _ok(pyodide["llama"])["same"], pyodide["llama"]
    g = _ok(pyodide["guard"])
    assert g["small"] and g["big"] and g["runs_big"] == 2, g
    assert _ok(pyodide["data"])["same"], pyodide["data"]
    s = _ok(pyodide["stale"])
    assert s["after_swap"] and s["again"] and s["short_input"].startswith("BoundsError"), s
    assert s["short_input_ran_nothing"] and s["damaged"].startswith("refused") and s["damaged_ran_nothing"], s
    assert s["narrow_input"].startswith("BoundsError") and s["narrow_input_ran_nothing"], s
    assert s["new_inputs"] and s["same_values_swap"], s
    seg = _ok(pyodide["segments"])
    assert seg["same"] and seg["segments"] == 2 and seg["train_disabled"], seg
    gr = pyodide["growth"]
    assert gr["grew"] and gr["same"] and gr["segments"] == 1, gr


def test_a_parameter_array_refilled_for_every_call_is_kept_per_call(wasm, monkeypatch):
    """A wrapper that refills one shape/stride array for every call (a tempting saving): each
    command of the table must see the values of its own call, not the last ones written."""
    from array import array

    from ember.backends import python as py
    from ember.wasm.runtime import R, W

    def family(rt):
        sh, st = array("i", [1] * 6), array("i", [0] * 6)   # shared, refilled per call

        def permute_dims(out, x, *, axes, **_):
            strides = py.contiguous_strides(x.shape)
            shape = [1] * (6 - len(axes)) + list(out.shape)
            sts = [0] * (6 - len(axes)) + [strides[a] for a in axes]
            sh[:] = array("i", shape)
            st[:] = array("i", sts)
            y = array("f", bytes(4 * len(x._buf)))
            rt.call("copy_strided_x32", R(x._buf, len(x._buf)), W(y, len(y)), R(sh, 6), R(st, 6))
            return y
        permute_dims.__module__ = "ember.wasm.ops_test"
        return permute_dims

    backend = ember.get_backend("wasm")
    rec, table = wasm._recording_kernels(backend)
    monkeypatch.setitem(table, "permute_dims", family(rec))
    monkeypatch.setitem(backend.kernels, "permute_dims", family(backend.rt))
    fn = lambda x, y: ember.permute_dims(x, (1, 0)) + ember.permute_dims(y, (1, 0)).reshape((3, 2))  # noqa: E731
    f = ember.compile(fn)
    for k in range(4):
        x = ember.tensor([[1.0 + k, 2.0, 3.0], [4.0, 5.0, 6.0 * k]], device="wasm")
        y = ember.tensor([[float(i + 10 * k), 0.5 * i, -1.0] for i in range(2)], device="wasm").reshape((3, 2))
        assert checks.raw(f(x, y)) == checks.raw(fn(x, y))
    d = checks.fast_of(f).describe()
    assert d["segments"] == 1 and d["table_steps"] == 3, d


def test_the_build_refuses_a_dispatch_that_misses_an_export(tmp_path, monkeypatch):
    """An exported kernel the prototype scan did not see (say, declared in an unusual way) would
    shift every kernel id: the build stops instead of shipping such a module."""
    import shutil

    from ember.wasm import build_kernels as bk

    if bk.find_clang() is None or shutil.which("wasm-ld") is None:
        pytest.skip("clang/lld are not installed")
    scan = bk.exported_kernels
    monkeypatch.setattr(bk, "exported_kernels", lambda clang: [k for k in scan(clang) if k[0] != "relu_f32"])
    with pytest.raises(SystemExit, match="relu_f32"):
        bk.build(str(tmp_path / "k.wasm"))
