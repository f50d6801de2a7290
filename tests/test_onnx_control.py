"""If / Loop / Scan: subgraphs run through the same op table and see the enclosing graph's
values; compared with onnxruntime on every backend."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import ember
import ember.onnx
from onnx_helpers import compare, import_generated, reference, run_ember

F = TensorProto.FLOAT


def _vi(name, t=F, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _if_model(cond_const=None):
    # y = If(cond, then: relu(x) * w  (w from the outer graph), else: -x)
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "w"], ["t_out"])],
                               "then", [], [_vi("t_out", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e_out"])], "else", [], [_vi("e_out", F, [2, 3])])
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="branch")]
    inputs = [_vi("x", F, [2, 3])]
    inits = [numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w")]
    if cond_const is None:
        inputs.append(_vi("cond", TensorProto.BOOL, []))
    else:
        inits.append(numpy_helper.from_array(np.array(cond_const), "cond"))
    g = helper.make_graph(nodes, "if", inputs, [_vi("y", F, [2, 3])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_if_runtime_condition(device):
    raw = _if_model()
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for c in (True, False):
        feeds = {"x": x, "cond": np.array(c)}
        compare(run_ember(raw, feeds, device)[0], reference(raw, feeds)[0], 1e-6, 1e-6, f"If cond={c}")


def test_if_constant_condition_is_generated_inline(tmp_path):
    raw = _if_model(cond_const=True)
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    mod, info = import_generated(raw, str(tmp_path), name="if_const")
    src = open(info["module"]).read()
    assert "ember.multiply(ember.relu(x), self.w)" in src and "onnxf.node" not in src
    y = mod.load(device="numpy")(ember.from_numpy(x, device="numpy"))
    compare(y, reference(raw, {"x": x})[0], 1e-6, 1e-6, "generated If")


def test_loop_carried_and_scan_outputs(device):
    # for i < M while cond: acc = acc + x * i ; emit acc ; cond = i < 3
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Mul", ["x", "fi"], ["xi"]),
         helper.make_node("Add", ["acc_in", "xi"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["emit"]),
         helper.make_node("Less", ["i", "three"], ["cond_out"])],
        "body", [_vi("i", TensorProto.INT64, []), _vi("cond_in", TensorProto.BOOL, []), _vi("acc_in", F, [2])],
        [_vi("cond_out", TensorProto.BOOL, []), _vi("acc_out", F, [2]), _vi("emit", F, [2])])
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "c", "acc0"], ["acc", "seq"], body=body)], "loop",
        [_vi("x", F, [2]), _vi("acc0", F, [2])], [_vi("acc", F, [2]), _vi("seq", F, None)],
        [numpy_helper.from_array(np.array(10), "M"), numpy_helper.from_array(np.array(True), "c"),
         numpy_helper.from_array(np.array(3), "three")])
    raw = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    feeds = {"x": np.array([1.0, -2.0], np.float32), "acc0": np.array([0.5, 0.5], np.float32)}
    want = reference(raw, feeds)
    got = run_ember(raw, feeds, device)
    for g_, w in zip(got, want):
        compare(g_, w, 1e-6, 1e-6, "Loop")


def test_scan_running_sum(device):
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body", [_vi("s_in", F, [2]), _vi("x_t", F, [2])], [_vi("s_out", F, [2]), _vi("y_t", F, [2])])
    g = helper.make_graph([helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                                            scan_input_directions=[1])],
                          "scan", [_vi("s0", F, [2]), _vi("xs", F, [4, 2])], [_vi("s", F, [2]), _vi("ys", F, [4, 2])])
    raw = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    feeds = {"s0": np.zeros(2, np.float32), "xs": np.arange(8, dtype=np.float32).reshape(4, 2)}
    for g_, w in zip(run_ember(raw, feeds, device), reference(raw, feeds)):
        compare(g_, w, 1e-6, 1e-6, "Scan")


def test_loop_with_runtime_trip_count_is_left_to_run_time():
    body = helper.make_graph([helper.make_node("Add", ["a", "one"], ["b"]),
                              helper.make_node("Identity", ["c_in"], ["c_out"])],
                             "body", [_vi("i", TensorProto.INT64, []), _vi("c_in", TensorProto.BOOL, []), _vi("a", F, [])],
                             [_vi("c_out", TensorProto.BOOL, []), _vi("b", F, [])])
    g = helper.make_graph([helper.make_node("Loop", ["n", "", "a0"], ["a"], body=body)], "l",
                          [_vi("n", TensorProto.INT64, []), _vi("a0", F, [])], [_vi("a", F, [])],
                          [numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    raw = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    m = ember.onnx.load(raw, device="python")
    assert m(ember.tensor(5), ember.tensor(0.5)).item() == 5.5
    assert m(ember.tensor(0), ember.tensor(0.5)).item() == 0.5


def test_constant_work_in_subgraphs_is_cached_per_node(device):
    """Gemm transposes its constant weight once per model; a Gemm inside an If branch has
    its own cache entry (same position in its graph, different node)."""
    rng = np.random.default_rng(4)
    w1, w2 = rng.standard_normal((3, 3)).astype(np.float32), rng.standard_normal((3, 3)).astype(np.float32)
    then_g = helper.make_graph([helper.make_node("Gemm", ["h", "w2"], ["t_out"], transB=1)], "then", [],
                               [_vi("t_out", F, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Identity", ["h"], ["e_out"])], "else", [], [_vi("e_out", F, [2, 3])])
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w1"], ["h"], transB=1),
                           helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                          "g", [_vi("x", F, [2, 3]), _vi("c", TensorProto.BOOL, [])], [_vi("y", F, [2, 3])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    raw = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    m = ember.onnx.load(raw, device=device)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for _ in range(2):   # the second call reads the caches
        for c in (True, False):
            feeds = {"x": x, "c": np.array(c)}
            got = m.run({k: ember.from_numpy(v, device=device) for k, v in feeds.items()})["y"]
            compare(got, reference(raw, feeds)[0], 1e-5, 1e-5, f"cond={c}")
