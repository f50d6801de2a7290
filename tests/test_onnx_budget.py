"""Issue 12, ONNX: hostile models fail fast with ember's own errors, the way a user meets them
(``ember.onnx.load(bytes or path)``, then a call). Load-time work has one budget per load
(function inlining, Loop/Scan iterations, constant folding by estimated work); a call has one
Loop/Scan iteration budget; repeated numeric fields parse in linear time."""
from __future__ import annotations

import time
import warnings

import pytest

import ember
import ember.onnx
from ember.errors import EmberError, OnnxError, ResourceError
from ember.onnx import testing as T
from ember.onnx.testing import FLOAT, INT64, make_model, node, tensor_proto, value_info

warnings.simplefilter("ignore")   # hostile models warn (shapes checked at run time, ...)


def graph(nodes, inputs, outputs, initializers=(), name="body") -> bytes:
    g = b"".join(T._len(1, n) for n in nodes) + T._str(2, name)
    g += b"".join(T._len(5, t) for t in initializers)
    g += b"".join(T._len(11, i) for i in inputs) + b"".join(T._len(12, o) for o in outputs)
    return g


def graph_attr(name, g: bytes) -> bytes:
    return T._str(1, name) + T._len(6, g) + T._int(20, 5)


def node_g(op_type, inputs, outputs, graphs: dict, **attrs) -> bytes:
    out = node(op_type, inputs, outputs, **attrs)
    for k, g in graphs.items():
        out += T._len(5, graph_attr(k, g))
    return out


def function(name, inputs, outputs, nodes, domain="local") -> bytes:
    out = T._str(1, name) + b"".join(T._str(4, i) for i in inputs) + b"".join(T._str(5, o) for o in outputs)
    out += b"".join(T._len(7, n) for n in nodes) + T._len(9, T._int(2, 17)) + T._str(10, domain)
    return out


def with_functions(model: bytes, functions, domain="local") -> bytes:
    return model + T._len(8, T._str(1, domain) + T._int(2, 1)) + b"".join(T._len(25, f) for f in functions)


def call_node(op, inputs, outputs, domain="local") -> bytes:
    return node(op, inputs, outputs) + T._str(7, domain)


def zeros_for(m):
    return [ember.zeros(tuple(d if isinstance(d, int) and d >= 0 else 1 for d in (vi.shape or ())))
            for vi in m.inputs]


def fails_fast(fn, exc=EmberError, match=None, seconds=2.0):
    t0 = time.perf_counter()
    with pytest.raises(exc, match=match) as info:
        fn()
    assert time.perf_counter() - t0 < seconds, f"took {time.perf_counter() - t0:.2f} s"
    return info.value


# ---- load-time budgets -------------------------------------------------------------------------

def _exploding_functions(levels=12, calls=4):
    """f0 calls f1 `calls` times, f1 calls f2 ..., the last is one Identity: calls**levels nodes."""
    funcs = []
    for k in range(levels):
        if k == levels - 1:
            body = [node("Identity", ["a"], ["b"])]
        else:
            body = [call_node(f"f{k + 1}", ["a" if i == 0 else f"t{i - 1}"], [f"t{i}" if i < calls - 1 else "b"])
                    for i in range(calls)]
        funcs.append(function(f"f{k}", ["a"], ["b"], body))
    m = make_model([call_node("f0", ["x"], ["y"])], [value_info("x", FLOAT, (2,))], [value_info("y", FLOAT, (2,))])
    return with_functions(m, funcs)


def test_function_inlining_explosion_is_refused_naming_the_function():
    data = _exploding_functions()
    assert len(data) < 3000
    e = fails_fast(lambda: ember.onnx.load(data), OnnxError, match="model-local function")
    assert "'f" in str(e) and "inlined_nodes" in str(e)


def test_a_few_nested_function_calls_still_inline_and_run():
    m = ember.onnx.load(_exploding_functions(levels=3, calls=3))     # 9 Identity nodes
    assert m(ember.tensor([1.0, 2.0])).tolist() == [1.0, 2.0]


def _counting_loop(inner=None):
    """A Loop body adding 1 to a carried float; ``inner``: a Loop node run first inside it."""
    nodes = [node("Identity", ["cond_in"], ["cond_out"])]
    if inner is not None:
        nodes += [inner, node("Add", ["v_inner", "one_b"], ["v_out"])]
    else:
        nodes.append(node("Add", ["v_in", "one_b"], ["v_out"]))
    return graph(nodes, [value_info("i", INT64, ()), value_info("cond_in", 9, ()), value_info("v_in", FLOAT, ())],
                 [value_info("cond_out", 9, ()), value_info("v_out", FLOAT, ())],
                 [tensor_proto("one_b", [], FLOAT, [1.0])])


def _nested_loops(depth=3, trips=1000):
    """``depth`` Loops inside each other, ``trips`` iterations each, on constants only: all of it
    could be folded at load (trips**depth iterations) if each loop had its own limit."""
    inner = None
    for _ in range(depth - 1):
        inner = node_g("Loop", ["M", "", "v_in"], ["v_inner"], {"body": _counting_loop(inner)})
    outer = node_g("Loop", ["M", "", "v0"], ["y"], {"body": _counting_loop(inner)})
    return make_model([outer], [], [value_info("y", FLOAT, ())],
                      [tensor_proto("M", [], INT64, [trips]), tensor_proto("v0", [], FLOAT, [0.0])])


def test_nested_loops_share_one_budget_at_load_and_at_run_time():
    data = _nested_loops(depth=3, trips=1000)       # 10**9 iterations of an Add
    t0 = time.perf_counter()
    m = ember.onnx.load(data)                      # the loops are left to run time ...
    assert time.perf_counter() - t0 < 2.0
    with ember.onnx.limits(loop_iterations=1000):  # (smaller than the default 5,000: a fast test)
        fails_fast(lambda: m(), OnnxError, match="Loop/Scan iterations")     # ... which refuses them


def test_small_nested_loops_still_fold_and_run():
    m = ember.onnx.load(_nested_loops(depth=2, trips=3))
    assert float(m().item()) == 3 * (3 + 1)      # each outer trip: +3 in the inner loop, then +1


def test_loop_iteration_budget_is_configurable():
    data = _nested_loops(depth=1, trips=300)
    with ember.onnx.limits(loop_iterations=100, trace_iterations=0):
        m = ember.onnx.load(data)
        e = fails_fast(lambda: m(), OnnxError, match="more than 100 Loop/Scan")
        assert "Loop" in str(e) and "set_limits" in str(e)
    assert ember.onnx.get_limits()["loop_iterations"] == 5_000
    assert float(ember.onnx.load(data)().item()) == 300
    with pytest.raises(OnnxError):
        ember.onnx.set_limits(loop_iterations=-1)
    with pytest.raises(OnnxError):
        ember.onnx.set_limits(no_such_limit=1)


def test_loop_without_trip_count_and_constant_true_condition_is_refused():
    body = graph([node("Identity", ["cond_in"], ["cond_out"]), node("Add", ["v_in", "one_b"], ["v_out"])],
                 [value_info("i", INT64, ()), value_info("cond_in", 9, ()), value_info("v_in", FLOAT, ())],
                 [value_info("cond_out", 9, ()), value_info("v_out", FLOAT, ())],
                 [tensor_proto("one_b", [], FLOAT, [1.0])])
    data = make_model([node_g("Loop", ["", "t", "x"], ["y"], {"body": body})], [value_info("x", FLOAT, ())],
                      [value_info("y", FLOAT, ())], [tensor_proto("t", [], 9, [1])])
    m = ember.onnx.load(data)
    with ember.onnx.limits(loop_iterations=2000):
        fails_fast(lambda: m(ember.tensor(0.0)), OnnxError, match="Loop/Scan iterations")


def _scan_model(xs_dims, xs_values=None):
    body = graph([node("Identity", ["s_in"], ["s_out"]), node("Identity", ["x_t"], ["y_t"])],
                 [value_info("s_in", FLOAT, (1,)), value_info("x_t", FLOAT, tuple(xs_dims[1:]))],
                 [value_info("s_out", FLOAT, (1,)), value_info("y_t", FLOAT, tuple(xs_dims[1:]))])
    return make_model([node_g("Scan", ["s0", "xs"], ["s", "ys"], {"body": body}, num_scan_inputs=1)],
                      [], [value_info("s", FLOAT, (1,))],
                      [tensor_proto("s0", [1], FLOAT, [0.0]), tensor_proto("xs", xs_dims, FLOAT, xs_values or [])])


def test_scan_over_a_zero_size_tensor_with_a_huge_axis_does_not_iterate():
    data = _scan_model([10 ** 12, 0])
    t0 = time.perf_counter()
    try:
        m = ember.onnx.load(data)
    except EmberError:
        pass
    else:
        fails_fast(lambda: m(), EmberError)
    assert time.perf_counter() - t0 < 2.0


def test_a_short_scan_still_runs():
    m = ember.onnx.load(_scan_model([3, 2], [1, 2, 3, 4, 5, 6]))
    assert m().tolist() == [0.0]


def test_constant_folding_is_bounded_by_estimated_work_on_the_python_device():
    n = 2048      # a 2048 x 2048 matmul of constants: 8.6e9 multiply-adds in pure Python
    data = make_model([node("MatMul", ["a", "b"], ["y"])], [], [value_info("y", FLOAT, (n, n))],
                      [tensor_proto("a", [n, n], FLOAT, raw=bytes(4 * n * n)),
                       tensor_proto("b", [n, n], FLOAT, raw=bytes(4 * n * n))])
    t0 = time.perf_counter()
    m = ember.onnx.load(data, device="python")
    assert time.perf_counter() - t0 < 2.0, "the matmul was computed at load"
    assert "MatMul" in [nd.op_type for nd in m._plan]


def test_small_constant_subgraphs_are_still_folded():
    data = make_model([node("MatMul", ["a", "b"], ["c"]), node("Add", ["x", "c"], ["y"])],
                      [value_info("x", FLOAT, (2, 2))], [value_info("y", FLOAT, (2, 2))],
                      [tensor_proto("a", [2, 2], FLOAT, [1, 2, 3, 4]), tensor_proto("b", [2, 2], FLOAT, [1, 0, 0, 1])])
    m = ember.onnx.load(data, device="python")
    assert [nd.op_type for nd in m._plan] == ["Add"]
    assert m(ember.zeros((2, 2))).tolist() == [[1.0, 2.0], [3.0, 4.0]]


@pytest.mark.parametrize("packed", [True, False])
def test_repeated_int64_fields_parse_in_linear_time(packed):
    n = 80_000        # 200+ KB of int64 varints
    vals = [(i * 7919) % 100_000 for i in range(n)]
    if packed:
        payload = T._len(7, b"".join(T._varint(v) for v in vals))
    else:
        payload = b"".join(T._int(7, v) for v in vals)          # one field per value
    t = T._int(1, n) + T._int(2, INT64) + T._str(8, "w") + payload
    data = make_model([node("ReduceSum", ["w"], ["y"], keepdims=0)], [], [value_info("y", INT64, ())], [t])
    assert len(data) > 200_000
    t0 = time.perf_counter()
    from ember.onnx import proto
    mp = proto.parse_model(data)
    assert mp.graph.initializers[0].int64_data[:3] == vals[:3]
    assert time.perf_counter() - t0 < 1.0


def test_repeated_float_fields_parse_in_linear_time():
    n = 50_000
    payload = b"".join(T._key(4, 5) + b"\x00\x00\x80\x3f" for _ in range(n))     # unpacked 1.0s
    t = T._int(1, n) + T._int(2, FLOAT) + T._str(8, "w") + payload
    data = make_model([node("Identity", ["w"], ["y"])], [], [value_info("y", FLOAT, (n,))], [t])
    t0 = time.perf_counter()
    from ember.onnx import proto
    assert len(proto.parse_model(data).graph.initializers[0].float_data) == n
    assert time.perf_counter() - t0 < 1.0


# ---- run time: malformed nodes the load-time checks did not see --------------------------------

def _unshaped(name, elem=FLOAT):
    """A graph input without a shape: the nodes reading it are only checked at run time."""
    return T._str(1, name) + T._len(2, T._len(1, T._int(1, elem)))


def _run_unshaped(nodes, outputs, inits=(), feeds=None, inputs=("x",)):
    data = make_model(nodes, [_unshaped(n) for n in inputs], outputs, inits)
    m = ember.onnx.load(data)
    feeds = feeds if feeds is not None else [ember.zeros((2, 3)) for _ in inputs]
    return fails_fast(lambda: m(*feeds), OnnxError)


def test_too_few_inputs_at_run_time_names_the_node():
    e = _run_unshaped([node("Add", ["x"], ["y"], name="add1")], [value_info("y", FLOAT, (2, 3))])
    assert "add1" in str(e) and "takes 2" in str(e)


def test_reshape_and_slice_with_an_empty_optional_name():
    e = _run_unshaped([node("Reshape", ["x", ""], ["y"], name="rs")], [value_info("y", FLOAT, (6,))])
    assert "rs" in str(e) and "shape" in str(e)
    e = _run_unshaped([node("Slice", ["x", "", "e"], ["y"], name="sl")], [value_info("y", FLOAT, (2, 3))],
                      [tensor_proto("e", [1], INT64, [1])])
    assert "sl" in str(e)


def test_scan_with_a_missing_or_scalar_scan_input():
    body = graph([node("Identity", ["x_t"], ["y_t"])], [value_info("x_t", FLOAT, ())],
                 [value_info("y_t", FLOAT, ())])
    for ins, feed in ((["x"], ember.tensor(1.0)), ([""], None)):
        data = make_model([node_g("Scan", ins, ["y"], {"body": body}, num_scan_inputs=1, name="sc")],
                          [_unshaped("x")], [value_info("y", FLOAT, (1,))])

        def load_and_run():
            m = ember.onnx.load(data)
            m(feed if feed is not None else ember.tensor(1.0))
        e = fails_fast(load_and_run, OnnxError)
        assert "'sc'" in str(e) and "Scan" in str(e)


def test_gather_indices_out_of_range_are_an_ember_error_negative_ones_allowed():
    data = make_model([node("Gather", ["x", "i"], ["y"], name="g", axis=0)], [_unshaped("x"), _unshaped("i", INT64)],
                      [value_info("y", FLOAT, (1, 3))])
    m = ember.onnx.load(data)
    x = ember.tensor([[1.0, 2, 3], [4, 5, 6]])
    assert m(x, ember.tensor([-2])).tolist() == [[1.0, 2, 3]]
    assert m(x, ember.tensor([-1])).tolist() == [[4.0, 5, 6]]
    for bad in ([2], [-3]):
        e = fails_fast(lambda: m(x, ember.tensor(bad)), EmberError, match="out of range")
        assert "ONNX node 'g'" in str(e)
    e = fails_fast(lambda: m(ember.tensor(1.0), ember.tensor([0])), OnnxError, match="rank")


def test_range_of_a_huge_length_is_refused_before_any_list_is_built():
    data = make_model([node("Range", ["a", "b", "d"], ["y"], name="r")], [_unshaped("b")],
                      [value_info("y", FLOAT, (1,))],
                      [tensor_proto("a", [], FLOAT, [-7.2e16]), tensor_proto("d", [], FLOAT, [1.0])])
    m = ember.onnx.load(data)
    e = fails_fast(lambda: m(ember.tensor(1.0)), ResourceError)
    assert "Range" in str(e)


def test_layer_norm_over_a_zero_size_axis():
    data = make_model([node("LayerNormalization", ["x", "s"], ["y"], name="ln", axis=-1)], [_unshaped("x")],
                      [value_info("y", FLOAT, (2, 0))], [tensor_proto("s", [0], FLOAT, [])])
    assert ember.onnx.load(data)(ember.zeros((2, 0))).shape == (2, 0)      # empty in, empty out
    data = make_model([node("LayerNormalization", ["x", "s"], ["y", "mean"], name="ln", axis=-1)],
                      [_unshaped("x")], [value_info("y", FLOAT, (2, 0)), value_info("mean", FLOAT, (2, 1))],
                      [tensor_proto("s", [0], FLOAT, [])])
    m = ember.onnx.load(data)
    e = fails_fast(lambda: m(ember.zeros((2, 0))), OnnxError)
    assert "'ln'" in str(e) and "zero" in str(e)


def test_external_data_with_a_nul_byte_or_an_offset_past_the_file(tmp_path):
    (tmp_path / "w.bin").write_bytes(bytes(16))
    for ext, match in (({"location": "w\x00.bin"}, "NUL"), ({"location": "w.bin", "offset": 64}, "past the end"),
                       ({"location": "w.bin", "offset": "9" * 5000}, "not integers")):
        t = tensor_proto("wt", [4], FLOAT, external=ext)
        data = make_model([node("Identity", ["wt"], ["y"])], [], [value_info("y", FLOAT, (4,))], [t])
        path = tmp_path / "m.onnx"
        path.write_bytes(data)
        e = fails_fast(lambda: ember.onnx.load(str(path)), OnnxError, match=match)
        assert "'wt'" in str(e)


def test_findings_replayed_in_process():
    """Every saved reproducer (tests/fuzz/onnx_findings/) gives an ember error or runs, fast."""
    import glob
    import os
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz", "onnx_findings")
    paths = sorted(glob.glob(os.path.join(here, "*.onnx")))
    assert paths
    for p in paths:
        t0 = time.perf_counter()
        try:
            with ember.onnx.limits(loop_iterations=2000):     # three are 10**12-trip Loops
                m = ember.onnx.load(p)
                m(*zeros_for(m))
        except EmberError:
            pass
        assert time.perf_counter() - t0 < 2.0, (p, time.perf_counter() - t0)


def test_a_shape_input_with_millions_of_values_is_not_read():
    n = 1 << 20
    data = make_model([node("Reshape", ["x", "s"], ["y"], name="rs")], [_unshaped("x")], [value_info("y", FLOAT, (1,))],
                      [tensor_proto("s", [n], INT64, raw=bytes(8 * n))])
    e = fails_fast(lambda: ember.onnx.load(data)(ember.zeros((1,))), OnnxError, match="values")
    assert "'rs'" in str(e)


def test_loop_bodies_count_their_nodes_against_the_call():
    """A body of many nodes costs more per iteration: ``loop_nodes`` bounds the nodes run."""
    data = _nested_loops(depth=1, trips=300)          # 300 iterations of a 2-node body
    with ember.onnx.limits(loop_nodes=100, trace_iterations=0):
        m = ember.onnx.load(data)
        e = fails_fast(lambda: m(), OnnxError, match="nodes run by Loop/Scan bodies")
        assert "loop_nodes" in str(e)
    assert float(ember.onnx.load(data)().item()) == 300


def test_default_loop_budget_refuses_a_trillion_trip_loop_fast():
    body = _counting_loop()
    data = make_model([node_g("Loop", ["M", "", "x"], ["y"], {"body": body}, name="lp")], [value_info("x", FLOAT, ())],
                      [value_info("y", FLOAT, ())], [tensor_proto("M", [], INT64, [10 ** 12])])
    m = ember.onnx.load(data)
    e = fails_fast(lambda: m(ember.tensor(0.0)), OnnxError, match="Loop/Scan iterations", seconds=3.0)
    assert "'lp'" in str(e)


def test_budget_doctests():
    import doctest

    import ember.onnx.budget as budget
    assert doctest.testmod(budget).failed == 0


def test_typed_data_for_a_shape_of_astronomical_size_is_an_onnx_error():
    t = tensor_proto("idx", [64] + [8] * 30, INT64, [1, -2, 300])     # 2^96 elements, 3 values
    data = make_model([node("Identity", ["idx"], ["y"])], [], [value_info("y", INT64, (3,))], [t])
    e = fails_fast(lambda: ember.onnx.load(data), OnnxError, match="2\\^62")
    assert "'idx'" in str(e)


def test_packed_varints_decode_one_and_many_byte_values():
    vals = [0, 1, 127, 128, 300, -1, -(2 ** 63), 2 ** 63 - 1, 5]
    data = make_model([node("Identity", ["w"], ["y"])], [], [value_info("y", INT64, (len(vals),))],
                      [tensor_proto("w", [len(vals)], INT64, vals)])
    assert ember.onnx.load(data)().tolist() == vals
    small = list(range(100))
    data = make_model([node("Identity", ["w"], ["y"])], [], [value_info("y", INT64, (100,))],
                      [tensor_proto("w", [100], INT64, small)])
    assert ember.onnx.load(data)().tolist() == small


def test_an_oversized_opset_import_entry_is_refused_before_it_is_walked():
    m = make_model([node("Relu", ["x"], ["y"])], [value_info("x", FLOAT, (1,))], [value_info("y", FLOAT, (1,))])
    junk = T._len(8, T._int(2, 17) + b"".join(T._int(2, 17) for _ in range(50_000)))   # 150 KB
    fails_fast(lambda: ember.onnx.load(m + junk * 20), OnnxError, match="opset_import entry")
