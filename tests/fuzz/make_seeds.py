"""Writes the small seed files of the fuzzers into tests/fuzz/seeds/ (run once from the repository
root: ``.venv/bin/python tests/fuzz/make_seeds.py``; the outputs are committed). The ONNX seeds
need the ``onnx`` package (a test dependency) only here; the fuzzers themselves need nothing but
ember. The committed tests/fixtures/ files are seeds too (see fuzz.py)."""
from __future__ import annotations

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(HERE, "seeds")
sys.path.insert(0, os.path.join(HERE, ".."))   # tests/: the hand-built checkpoint helpers


def onnx_seeds() -> dict:
    import numpy as np
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    def model(nodes, inputs, outputs, inits=(), functions=(), opset=17, name="g"):
        g = h.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
        m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)] +
                         ([h.make_opsetid("local", 1)] if functions else []), functions=list(functions))
        m.ir_version = 8
        return m.SerializeToString()

    x = h.make_tensor_value_info("x", T.FLOAT, ["n", 4])
    y = h.make_tensor_value_info("y", T.FLOAT, None)
    out = {}
    w = nh.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 10, "w")
    b = nh.from_array(np.ones(4, dtype=np.float32), "b")
    out["matmul_add.onnx"] = model([h.make_node("MatMul", ["x", "w"], ["t"]), h.make_node("Add", ["t", "b"], ["u"]),
                                    h.make_node("Relu", ["u"], ["y"])], [x], [y], [w, b])
    shape = nh.from_array(np.array([2, -1], dtype=np.int64), "shape")
    out["reshape_shape.onnx"] = model([h.make_node("Shape", ["x"], ["s"]), h.make_node("ConstantOfShape", ["s"], ["z"],
                                       value=nh.from_array(np.array([1.5], np.float32))),
                                       h.make_node("Add", ["x", "z"], ["a"]), h.make_node("Reshape", ["a", "shape"], ["y"])],
                                      [x], [y], [shape])
    img = h.make_tensor_value_info("x", T.FLOAT, [1, 1, 5, 5])
    k = nh.from_array(np.ones((2, 1, 3, 3), np.float32), "k")
    out["conv_pool.onnx"] = model([h.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
                                   h.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                                   h.make_node("Pad", ["p", "pads"], ["y"], mode="constant")],
                                  [img], [y], [k, nh.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")])
    # Loop: y = x + 1 (trip count 3), a loop-carried value
    body = h.make_graph([h.make_node("Add", ["v_in", "one"], ["v_out"]), h.make_node("Identity", ["cond_in"], ["cond_out"])],
                        "body", [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
                                 h.make_tensor_value_info("v_in", T.FLOAT, None)],
                        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("v_out", T.FLOAT, None)],
                        initializer=[nh.from_array(np.array(1.0, np.float32), "one")])
    out["loop.onnx"] = model([h.make_node("Loop", ["trip", "cond", "x"], ["y"], body=body)], [x], [y],
                             [nh.from_array(np.array(3, np.int64), "trip"), nh.from_array(np.array(True), "cond")])
    # Scan over the first axis: running sum
    sbody = h.make_graph([h.make_node("Add", ["acc_in", "row"], ["acc_out"]), h.make_node("Identity", ["acc_out"], ["row_out"])],
                         "sbody", [h.make_tensor_value_info("acc_in", T.FLOAT, [4]), h.make_tensor_value_info("row", T.FLOAT, [4])],
                         [h.make_tensor_value_info("acc_out", T.FLOAT, [4]), h.make_tensor_value_info("row_out", T.FLOAT, [4])])
    out["scan.onnx"] = model([h.make_node("Scan", ["init", "x"], ["last", "y"], body=sbody, num_scan_inputs=1)], [x],
                             [h.make_tensor_value_info("last", T.FLOAT, None), y],
                             [nh.from_array(np.zeros(4, np.float32), "init")])
    # If on a constant condition
    then = h.make_graph([h.make_node("Neg", ["x"], ["t_out"])], "then", [], [h.make_tensor_value_info("t_out", T.FLOAT, None)])
    other = h.make_graph([h.make_node("Abs", ["x"], ["e_out"])], "else", [], [h.make_tensor_value_info("e_out", T.FLOAT, None)])
    out["if.onnx"] = model([h.make_node("ReduceSum", ["x"], ["s"], keepdims=0), h.make_node("Greater", ["s", "zero"], ["c"]),
                            h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], [x], [y],
                           [nh.from_array(np.array(0.0, np.float32), "zero")])
    # a model-local function called twice
    fn = h.make_function("local", "Twice", ["a"], ["b"], [h.make_node("Add", ["a", "a"], ["b"])],
                         opset_imports=[h.make_opsetid("", 17)])
    out["function.onnx"] = model([h.make_node("Twice", ["x"], ["t"], domain="local"),
                                  h.make_node("Twice", ["t"], ["y"], domain="local")], [x], [y], functions=[fn])
    # gather / slice / concat / range / cast / softmax on ints and floats
    ids = h.make_tensor_value_info("x", T.INT64, ["n"])
    emb = nh.from_array(np.arange(24, dtype=np.float32).reshape(6, 4), "emb")
    out["gather_slice.onnx"] = model([h.make_node("Gather", ["emb", "x"], ["g"]),
                                      h.make_node("Slice", ["g", "st", "en", "ax"], ["s"]),
                                      h.make_node("Concat", ["s", "s"], ["c"], axis=1),
                                      h.make_node("Softmax", ["c"], ["y"], axis=-1)], [ids], [y],
                                     [emb, nh.from_array(np.array([1], np.int64), "st"),
                                      nh.from_array(np.array([3], np.int64), "en"), nh.from_array(np.array([1], np.int64), "ax")])
    # an int64 initializer in int64_data (repeated field, not raw_data) and a Range
    big = h.make_tensor("idx", T.INT64, [64], list(range(64)))
    out["int64_data_range.onnx"] = model([h.make_node("Range", ["zero", "lim", "one"], ["r"]),
                                          h.make_node("Add", ["r", "idx"], ["y"])],
                                         [h.make_tensor_value_info("lim", T.INT64, [])], [h.make_tensor_value_info("y", T.INT64, None)],
                                         [big, nh.from_array(np.array(0, np.int64), "zero"), nh.from_array(np.array(1, np.int64), "one")])
    for v in out.values():
        onnx.load_from_string(v)   # well-formed protobuf
    return out


def safetensors_seeds() -> dict:
    import ember

    return {
        "dtypes.safetensors": ember.save_safetensors({
            "f32": ember.tensor([[1.0, -2.0], [3.5, 0.0]]), "f16": ember.tensor([0.5, 2.0], dtype="float16"),
            "i64": ember.tensor([1, -(2 ** 40)]), "i32": ember.tensor([[7]], dtype="int32"),
            "u8": ember.tensor([0, 255], dtype="uint8"), "b": ember.tensor([True, False]),
            "empty": ember.zeros((0, 3)), "scalar": ember.tensor(1.5)}, metadata={"format": "pt", "k": "v"}),
        "one.safetensors": ember.save_safetensors({"w": ember.ones((3, 4))}),
    }


def pt_seeds() -> dict:
    from test_hardening import G, I, S, checkpoint, state_dict, tensor_pkl, tup  # noqa: F401

    f4 = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    views = state_dict(a=tensor_pkl(), t=tensor_pkl(size=(2, 2), stride=(1, 2)), tail=tensor_pkl(offset=1, size=(3,)),
                       rep=tensor_pkl(size=(3, 4), stride=(0, 1)),
                       n=tensor_pkl("LongStorage", "1", 2, size=(2,)),
                       h=tensor_pkl("HalfStorage", "2", 2, size=(2, 1), stride=(1, 1)))
    nested = (b"\x80\x02}(" + S("model") + b"}(" + S("w") + tensor_pkl() + S("b") + tensor_pkl(size=(2,), offset=2) + b"u"
              + S("epoch") + I(3) + S("names") + b"](" + S("x") + S("y") + b"e" + S("pair") + tup(I(1), S("z"))
              + S("lr") + b"G" + struct.pack(">d", 0.01) + b"u.")
    return {"views.pt": checkpoint(views, {"0": f4, "1": struct.pack("<2q", -5, 2 ** 40), "2": struct.pack("<2e", 0.5, 1.0)}),
            "nested.pt": checkpoint(nested, {"0": f4})}


def main():
    for sub, seeds in (("onnx", onnx_seeds()), ("safetensors", safetensors_seeds()), ("pt", pt_seeds())):
        os.makedirs(os.path.join(SEEDS, sub), exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(SEEDS, sub, name), "wb") as f:
                f.write(data)
            print(f"{sub}/{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
