"""Every supported ONNX operator as a single-node model (built with ``onnx.helper``), run by
``ember.onnx.load`` on every backend and compared with onnxruntime. A sample also goes
through the code generator (``ember import``)."""
from __future__ import annotations

import numpy as np
import pytest

from onnx_helpers import NodeCase as C
from onnx_helpers import check_case

rng = np.random.default_rng(0)


def f32(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def i64(*values):
    return np.array(values, dtype=np.int64)


def ints(*shape, lo=-5, hi=5):
    return rng.integers(lo, hi, shape).astype(np.int64)


def bools(*shape):
    return rng.random(shape) < 0.5


X = f32(2, 3, 4)
POS = f32(2, 3, 4, lo=0.1, hi=3.0)
IMG = f32(1, 2, 6, 6)

CASES = []
for op in ["Abs", "Neg", "Exp", "Floor", "Ceil", "Sign", "Sin", "Cos", "Tan", "Tanh", "Erf", "Sigmoid",
           "Relu", "Softplus", "Softsign", "Sinh", "Cosh", "Asinh", "Identity"]:
    CASES.append(C(f"{op}", op, {"x": X}))
CASES += [
    C("Round", "Round", {"x": np.array([0.5, 1.5, 2.5, -0.5, -1.7, 2.2], np.float32)}),
    C("Log", "Log", {"x": POS}), C("Sqrt", "Sqrt", {"x": POS}), C("Reciprocal", "Reciprocal", {"x": POS}),
    C("Acosh", "Acosh", {"x": f32(5, lo=1.1, hi=4)}), C("Atanh", "Atanh", {"x": f32(5, lo=-0.9, hi=0.9)}),
    C("HardSwish", "HardSwish", {"x": f32(10, lo=-5, hi=5)}, opset=14),
    C("Mish", "Mish", {"x": X}, opset=18),
    C("Elu", "Elu", {"x": X}, {"alpha": 0.7}), C("Selu", "Selu", {"x": X}),
    C("Celu", "Celu", {"x": X}, {"alpha": 1.5}), C("LeakyRelu", "LeakyRelu", {"x": X}, {"alpha": 0.2}),
    C("ThresholdedRelu", "ThresholdedRelu", {"x": X}, {"alpha": 0.5}),
    C("HardSigmoid", "HardSigmoid", {"x": X}, {"alpha": 0.3, "beta": 0.4}),
    C("Gelu", "Gelu", {"x": X}, opset=20), C("Gelu/tanh", "Gelu", {"x": X}, {"approximate": "tanh"}, opset=20),
    C("Shrink", "Shrink", {"x": X}, {"lambd": 0.7, "bias": 0.2}),
    C("IsNaN", "IsNaN", {"x": np.array([1.0, np.nan, np.inf], np.float32)}),
    C("IsInf", "IsInf", {"x": np.array([1.0, np.nan, np.inf, -np.inf], np.float32)}),
    C("IsInf/neg", "IsInf", {"x": np.array([1.0, np.inf, -np.inf], np.float32)}, {"detect_positive": 0}),
    C("Not", "Not", {"x": bools(3, 4)}),
    C("PRelu", "PRelu", {"x": IMG, "slope": f32(2, 1, 1)}, inits=["slope"]),
    # binary, broadcasting
    C("Add", "Add", {"a": X, "b": f32(4)}), C("Sub", "Sub", {"a": f32(3, 1), "b": f32(1, 4)}),
    C("Mul", "Mul", {"a": X, "b": f32(3, 1)}), C("Div", "Div", {"a": X, "b": POS}),
    C("Div/int", "Div", {"a": i64(7, -7, 7, -7, 9), "b": i64(2, 2, -2, -2, 3)}),
    C("Pow", "Pow", {"a": POS, "b": f32(4)}), C("Pow/int", "Pow", {"a": i64(2, 3, -2), "b": i64(3, 2, 3)}),
    C("Mod/int", "Mod", {"a": i64(7, -7, 7, -7), "b": i64(3, 3, -3, -3)}),
    C("Mod/fmod", "Mod", {"a": f32(6, lo=-9, hi=9), "b": f32(6, lo=1, hi=3)}, {"fmod": 1}),
    C("Mod/fmod-int", "Mod", {"a": i64(7, -7, 7, -7), "b": i64(3, 3, -3, -3)}, {"fmod": 1}),
    C("Max", "Max", {"a": X, "b": f32(4), "c": f32(3, 1)}), C("Min", "Min", {"a": X, "b": f32(4)}),
    C("Sum", "Sum", {"a": X, "b": f32(4), "c": X}), C("Mean", "Mean", {"a": X, "b": f32(4)}),
    C("Equal", "Equal", {"a": ints(3, 4, lo=0, hi=3), "b": ints(4, lo=0, hi=3)}),
    C("Less", "Less", {"a": X, "b": f32(4)}), C("Greater", "Greater", {"a": X, "b": f32(4)}),
    C("LessOrEqual", "LessOrEqual", {"a": ints(5, lo=0, hi=3), "b": ints(5, lo=0, hi=3)}),
    C("GreaterOrEqual", "GreaterOrEqual", {"a": X, "b": f32(4)}),
    C("And", "And", {"a": bools(3, 4), "b": bools(4)}), C("Or", "Or", {"a": bools(3, 4), "b": bools(4)}),
    C("Xor", "Xor", {"a": bools(3, 4), "b": bools(3, 4)}),
    C("Where", "Where", {"c": bools(3, 4), "a": f32(3, 4), "b": f32(4)}),
    C("Clip", "Clip", {"x": X, "lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)},
      inits=["lo", "hi"], opset=13),
    C("Clip/min-only", "Clip", {"x": X, "lo": np.array(0.1, np.float32)}, inits=["lo"], opset=13),
    C("Clip/v6", "Clip", {"x": X}, {"min": -0.5, "max": 0.5}, opset=6),
    # casts and creation
    C("Cast/f2i", "Cast", {"x": f32(6, lo=-5, hi=5)}, {"to": 7}),
    C("Cast/i2f", "Cast", {"x": ints(6)}, {"to": 1}), C("Cast/f2b", "Cast", {"x": i64(0, 1, -2).astype(np.float32)}, {"to": 9}),
    C("Cast/f2h", "Cast", {"x": X}, {"to": 10}, rtol=1e-3),
    C("CastLike", "CastLike", {"x": ints(5), "like": f32(1)}, opset=15),
    C("Shape", "Shape", {"x": X}), C("Shape/slice", "Shape", {"x": X}, {"start": 1, "end": -1}, opset=15),
    C("Size", "Size", {"x": X}),
    C("ConstantOfShape", "ConstantOfShape", {"s": i64(2, 3)}, inits=["s"]),
    C("Range", "Range", {"a": np.array(1.0, np.float32), "b": np.array(3.6, np.float32),
                         "c": np.array(0.5, np.float32)}, inits=["a", "b", "c"]),
    C("Range/int", "Range", {"a": np.array(10), "b": np.array(1), "c": np.array(-3)}, inits=["a", "b", "c"]),
    C("EyeLike", "EyeLike", {"x": f32(3, 4)}, {"k": 1}),
    # movement and indexing
    C("Reshape", "Reshape", {"x": X, "s": i64(0, -1)}, inits=["s"]),
    C("Reshape/runtime-shape", "Reshape", {"x": X, "s": i64(4, 6)}),
    C("Flatten", "Flatten", {"x": X}, {"axis": 2}), C("Transpose", "Transpose", {"x": X}, {"perm": [2, 0, 1]}),
    C("Transpose/default", "Transpose", {"x": X}),
    C("Squeeze", "Squeeze", {"x": f32(1, 3, 1, 2), "a": i64(0, -2)}, inits=["a"]),
    C("Squeeze/all", "Squeeze", {"x": f32(1, 3, 1, 2)}),
    C("Squeeze/v11", "Squeeze", {"x": f32(1, 3, 1)}, {"axes": [0]}, opset=11),
    C("Unsqueeze", "Unsqueeze", {"x": f32(3, 2), "a": i64(0, 3)}, inits=["a"]),
    C("Unsqueeze/v11", "Unsqueeze", {"x": f32(3, 2)}, {"axes": [-1]}, opset=11),
    C("Expand", "Expand", {"x": f32(3, 1), "s": i64(2, 1, 4)}, inits=["s"]),
    C("Tile", "Tile", {"x": f32(2, 3), "r": i64(2, 2)}, inits=["r"]),
    C("Concat", "Concat", {"a": f32(2, 3), "b": f32(2, 1), "c": f32(2, 2)}, {"axis": -1}),
    C("Split", "Split", {"x": f32(2, 6), "s": i64(2, 4)}, {"axis": 1}, inits=["s"], outputs=2),
    C("Split/equal", "Split", {"x": f32(6, 2)}, outputs=3),
    C("Split/num_outputs", "Split", {"x": f32(2, 7)}, {"axis": 1, "num_outputs": 3}, opset=18, outputs=3),
    C("Slice", "Slice", {"x": f32(5, 6), "s": i64(1, -1), "e": i64(4, -100), "a": i64(0, 1), "st": i64(2, -2)},
      inits=["s", "e", "a", "st"]),
    C("Slice/to-end", "Slice", {"x": f32(5, 6), "s": i64(-3), "e": i64(2**62), "a": i64(1)}, inits=["s", "e", "a"]),
    C("Slice/v1", "Slice", {"x": f32(5, 6)}, {"starts": [1], "ends": [3], "axes": [1]}, opset=9),
    C("Gather", "Gather", {"x": f32(4, 5), "i": i64(3, -1, 0)}, {"axis": 1}),
    C("Gather/2d-indices", "Gather", {"x": f32(4, 5), "i": np.array([[0, 1], [3, -2]])}),
    C("Gather/scalar", "Gather", {"x": f32(4, 5), "i": np.array(2)}, inits=["i"]),
    C("GatherElements", "GatherElements", {"x": f32(3, 4), "i": np.array([[0, 3], [-1, 1], [2, 2]])}, {"axis": 1}),
    C("GatherND", "GatherND", {"x": f32(3, 4, 2), "i": np.array([[0, 1], [2, -1]])}),
    C("GatherND/batch", "GatherND", {"x": f32(2, 3, 4), "i": np.array([[[1]], [[2]]])}, {"batch_dims": 1}),
    C("ScatterElements", "ScatterElements", {"x": f32(3, 4), "i": np.array([[1, 0], [3, 2], [0, 1]]),
                                            "u": f32(3, 2)}, {"axis": 1}),
    C("ScatterND", "ScatterND", {"x": f32(4, 3), "i": np.array([[1], [3]]), "u": f32(2, 3)}),
    C("Pad", "Pad", {"x": f32(2, 3), "p": i64(1, 0, 2, 1), "v": np.array(1.5, np.float32)}, inits=["p", "v"]),
    C("Pad/reflect", "Pad", {"x": f32(3, 4), "p": i64(1, 2, 1, 2)}, {"mode": "reflect"}, inits=["p"]),
    C("Pad/edge", "Pad", {"x": f32(3, 4), "p": i64(0, 2, 1, 0)}, {"mode": "edge"}, inits=["p"]),
    C("Pad/axes", "Pad", {"x": f32(2, 3), "p": i64(1, 2), "v": None, "a": i64(1)}, inits=["p", "a"], opset=18),
    C("DepthToSpace", "DepthToSpace", {"x": f32(1, 8, 2, 3)}, {"blocksize": 2}),
    C("DepthToSpace/CRD", "DepthToSpace", {"x": f32(1, 8, 2, 3)}, {"blocksize": 2, "mode": "CRD"}),
    C("SpaceToDepth", "SpaceToDepth", {"x": f32(1, 2, 4, 6)}, {"blocksize": 2}),
    C("Trilu", "Trilu", {"x": f32(3, 4, 5)}, opset=14),
    C("Trilu/lower-k", "Trilu", {"x": f32(4, 5), "k": np.array(-1)}, {"upper": 0}, inits=["k"], opset=14),
    C("OneHot", "OneHot", {"i": np.array([0, 2, -1]), "d": np.array(4), "v": np.array([0.0, 3.0], np.float32)},
      inits=["d", "v"]),
    C("NonZero", "NonZero", {"x": np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0]], np.float32)}),
    # linear algebra
    C("MatMul", "MatMul", {"a": f32(2, 3, 4), "b": f32(4, 5)}),
    C("MatMul/vec", "MatMul", {"a": f32(4), "b": f32(2, 4, 3)}),
    C("Gemm", "Gemm", {"a": f32(3, 4), "b": f32(5, 4), "c": f32(5)}, {"transB": 1}, inits=["b", "c"]),
    C("Gemm/alpha-beta-transA", "Gemm", {"a": f32(4, 3), "b": f32(4, 5), "c": f32(3, 5)},
      {"transA": 1, "alpha": 0.5, "beta": 2.0}),
    C("Einsum/bmm", "Einsum", {"a": f32(2, 3, 4), "b": f32(2, 4, 5)}, {"equation": "bij,bjk->bik"}),
    C("Einsum/transpose", "Einsum", {"a": f32(3, 4)}, {"equation": "ij->ji"}),
    C("Einsum/sum", "Einsum", {"a": f32(3, 4)}, {"equation": "ij->i"}),
    C("Einsum/outer", "Einsum", {"a": f32(3), "b": f32(4)}, {"equation": "i,j->ij"}),
    C("Einsum/attention", "Einsum", {"a": f32(2, 5, 3, 4), "b": f32(2, 6, 3, 4)}, {"equation": "bqhd,bkhd->bhqk"}),
    C("Einsum/ellipsis", "Einsum", {"a": f32(2, 3, 4), "b": f32(4, 2)}, {"equation": "...ij,jk->...ik"}),
    # convolution and pooling
    C("Conv", "Conv", {"x": IMG, "w": f32(3, 2, 3, 3), "b": f32(3)}, {"pads": [1, 1, 1, 1]}, inits=["w", "b"]),
    C("Conv/stride-dilation-asym", "Conv", {"x": f32(1, 2, 9, 8), "w": f32(4, 2, 3, 2)},
      {"strides": [2, 1], "dilations": [1, 2], "pads": [0, 1, 2, 0]}, inits=["w"]),
    C("Conv/group", "Conv", {"x": f32(1, 4, 5, 5), "w": f32(4, 2, 3, 3)}, {"group": 2}, inits=["w"]),
    C("Conv/same-upper", "Conv", {"x": f32(1, 2, 7, 7), "w": f32(2, 2, 4, 4)},
      {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, inits=["w"]),
    C("Conv/1d", "Conv", {"x": f32(2, 3, 10), "w": f32(4, 3, 3), "b": f32(4)}, {"pads": [1, 2], "strides": [2]},
      inits=["w", "b"]),
    C("ConvTranspose", "ConvTranspose", {"x": f32(1, 2, 4, 4), "w": f32(2, 3, 3, 3), "b": f32(3)},
      {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, inits=["w", "b"]),
    C("ConvTranspose/output_shape", "ConvTranspose", {"x": f32(1, 2, 3, 3), "w": f32(2, 2, 3, 3)},
      {"strides": [2, 2], "output_shape": [6, 6]}, inits=["w"]),
    C("ConvTranspose/1d", "ConvTranspose", {"x": f32(1, 2, 5), "w": f32(2, 3, 3)}, {"strides": [2]}, inits=["w"]),
    C("MaxPool", "MaxPool", {"x": IMG}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    C("MaxPool/ceil", "MaxPool", {"x": f32(1, 1, 7, 7)}, {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    # (SAME with dilations: onnxruntime leaves the dilation out of the padding, unlike the spec)
    C("MaxPool/same-lower", "MaxPool", {"x": IMG}, {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    C("MaxPool/dilated", "MaxPool", {"x": IMG}, {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    C("MaxPool/1d", "MaxPool", {"x": f32(2, 3, 9)}, {"kernel_shape": [3], "strides": [2]}),
    C("MaxPool/big-pads", "MaxPool", {"x": IMG}, {"kernel_shape": [3, 3], "pads": [2, 2, 2, 2]}),
    C("AveragePool", "AveragePool", {"x": IMG}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    C("AveragePool/include-pad", "AveragePool", {"x": IMG}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                                            "count_include_pad": 1, "strides": [2, 2]}),
    C("GlobalAveragePool", "GlobalAveragePool", {"x": IMG}), C("GlobalMaxPool", "GlobalMaxPool", {"x": IMG}),
    C("LRN", "LRN", {"x": f32(1, 5, 3, 3)}, {"size": 3, "alpha": 0.01, "beta": 0.6, "bias": 1.5}),
    C("LpNormalization", "LpNormalization", {"x": X}, {"axis": 1}),
    C("MeanVarianceNormalization", "MeanVarianceNormalization", {"x": f32(2, 3, 4, 4)}),
    # normalization
    C("BatchNormalization", "BatchNormalization",
      {"x": IMG, "s": f32(2), "b": f32(2), "m": f32(2), "v": f32(2, lo=0.5, hi=2)}, {"epsilon": 1e-3},
      inits=["s", "b", "m", "v"]),
    C("InstanceNormalization", "InstanceNormalization", {"x": IMG, "s": f32(2), "b": f32(2)}, inits=["s", "b"]),
    C("LayerNormalization", "LayerNormalization", {"x": X, "s": f32(4), "b": f32(4)}, inits=["s", "b"]),
    C("LayerNormalization/axis1-stats", "LayerNormalization", {"x": X, "s": f32(3, 4)}, {"axis": 1},
      inits=["s"], outputs=3),
    C("GroupNormalization", "GroupNormalization", {"x": f32(2, 4, 3, 3), "s": f32(4), "b": f32(4)},
      {"num_groups": 2}, inits=["s", "b"], opset=21),
    C("Softmax", "Softmax", {"x": X}, {"axis": 1}), C("LogSoftmax", "LogSoftmax", {"x": X}),
    C("Softmax/v11-2d", "Softmax", {"x": X}, {"axis": 1}, opset=11),
    C("Hardmax", "Hardmax", {"x": X}),
    # reductions
    C("ReduceMean", "ReduceMean", {"x": X, "a": i64(1)}, inits=["a"], opset=18),
    C("ReduceMean/v13-attr", "ReduceMean", {"x": X}, {"axes": [0, 2], "keepdims": 0}, opset=13),
    C("ReduceSum", "ReduceSum", {"x": X, "a": i64(-1, 0)}, {"keepdims": 0}, inits=["a"], opset=13),
    C("ReduceSum/all", "ReduceSum", {"x": X}, opset=13),
    C("ReduceSum/int", "ReduceSum", {"x": ints(3, 4), "a": i64(1)}, inits=["a"], opset=13),
    C("ReduceMax", "ReduceMax", {"x": X, "a": i64(1)}, inits=["a"], opset=18),
    C("ReduceMin", "ReduceMin", {"x": X}, {"keepdims": 0}, opset=18),
    C("ReduceProd", "ReduceProd", {"x": f32(2, 3, lo=0.5, hi=1.5), "a": i64(1)}, inits=["a"], opset=18),
    C("ReduceL1", "ReduceL1", {"x": X, "a": i64(2)}, inits=["a"], opset=18),
    C("ReduceL2", "ReduceL2", {"x": X, "a": i64(2)}, inits=["a"], opset=18),
    C("ReduceLogSumExp", "ReduceLogSumExp", {"x": X, "a": i64(0)}, inits=["a"], opset=18),
    C("ReduceSumSquare", "ReduceSumSquare", {"x": X, "a": i64(1)}, inits=["a"], opset=18),
    C("ReduceLogSum", "ReduceLogSum", {"x": POS, "a": i64(1)}, inits=["a"], opset=18),
    C("ArgMax", "ArgMax", {"x": X}, {"axis": 1}),
    C("ArgMin/last", "ArgMin", {"x": np.array([[1.0, 0.0, 0.0], [2.0, 2.0, 3.0]], np.float32)},
      {"axis": 1, "keepdims": 0, "select_last_index": 1}),
    C("TopK", "TopK", {"x": f32(3, 6), "k": i64(2)}, inits=["k"], outputs=2),
    C("TopK/smallest", "TopK", {"x": f32(5, 3), "k": i64(3)}, {"axis": 0, "largest": 0}, inits=["k"], outputs=2),
    C("CumSum", "CumSum", {"x": X, "a": np.array(1)}, inits=["a"]),
    C("CumSum/excl-rev", "CumSum", {"x": f32(5), "a": np.array(0)}, {"exclusive": 1, "reverse": 1}, inits=["a"]),
    C("Dropout", "Dropout", {"x": X}, outputs=2),
    # resize
    C("Resize/nearest", "Resize", {"x": f32(1, 1, 3, 4), "roi": None, "sc": np.array([1, 1, 2, 1.5], np.float32)},
      {"mode": "nearest"}, inits=["sc"], opset=13),
    C("Resize/linear", "Resize", {"x": f32(1, 2, 3, 4), "roi": None, "sc": None, "sz": i64(1, 2, 5, 7)},
      {"mode": "linear"}, inits=["sz"], opset=13),
    # (with scales that do not give whole sizes onnxruntime and the ONNX reference disagree on
    # align_corners; tests/onnx_report.py covers the reference's reading)
    C("Resize/linear-align", "Resize", {"x": f32(1, 1, 4, 4), "roi": None, "sc": None, "sz": i64(1, 1, 3, 6)},
      {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, inits=["sz"], opset=13),
    C("Resize/cubic", "Resize", {"x": f32(1, 1, 4, 4), "roi": None, "sc": np.array([1, 1, 2, 2], np.float32)},
      {"mode": "cubic"}, inits=["sc"], opset=13),
    C("Resize/linear-antialias", "Resize", {"x": f32(1, 1, 8, 8), "roi": None, "sc": np.array([1, 1, 0.4, 0.6], np.float32)},
      {"mode": "linear", "antialias": 1}, inits=["sc"], opset=18),
    C("Resize/cubic-antialias", "Resize", {"x": f32(1, 2, 9, 7), "roi": None, "sc": None, "sz": i64(1, 2, 4, 3)},
      {"mode": "cubic", "antialias": 1}, inits=["sz"], opset=18),
    C("Resize/nearest-asym-floor", "Resize", {"x": f32(1, 1, 2, 3), "roi": None, "sc": None, "sz": i64(1, 1, 5, 5)},
      {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
      inits=["sz"], opset=13),
]

# attention, losses, recurrent layers, sampling
Q4, K4, V4 = f32(2, 3, 4, 8), f32(2, 3, 6, 8), f32(2, 3, 6, 5)
CASES += [
    C("Attention", "Attention", {"q": Q4, "k": K4, "v": V4}, opset=23),
    C("Attention/causal-mask", "Attention", {"q": Q4, "k": K4, "v": V4, "m": bools(4, 6)}, {"is_causal": 1}, opset=23),
    C("Attention/float-mask-scale", "Attention", {"q": Q4, "k": K4, "v": V4, "m": f32(2, 1, 4, 6)},
      {"scale": 0.3}, opset=23),
    C("Attention/3d-gqa", "Attention", {"q": f32(2, 4, 16), "k": f32(2, 5, 8), "v": f32(2, 5, 8)},
      {"q_num_heads": 4, "kv_num_heads": 2}, opset=23),
    C("Attention/kv-cache", "Attention", {"q": Q4, "k": f32(2, 3, 1, 8), "v": f32(2, 3, 1, 5), "m": None,
                                          "pk": f32(2, 3, 5, 8), "pv": f32(2, 3, 5, 5)},
      {"is_causal": 1}, opset=23, outputs=3),
    C("NegativeLogLikelihoodLoss", "NegativeLogLikelihoodLoss",
      {"x": f32(3, 5, 2), "t": np.array([[0, 4], [2, 1], [3, 3]]), "w": f32(5, lo=0.1, hi=1)},
      {"ignore_index": 1}, opset=13),
    C("NegativeLogLikelihoodLoss/none", "NegativeLogLikelihoodLoss", {"x": f32(4, 3), "t": np.array([0, 2, 1, 2])},
      {"reduction": "none"}, opset=13),
    C("SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLoss", {"x": f32(3, 5), "t": np.array([0, 4, 2])},
      {"reduction": "sum"}, opset=13, outputs=2),
    C("LpPool", "LpPool", {"x": IMG}, {"kernel_shape": [2, 2], "p": 3, "strides": [2, 2]}, opset=18),
    C("CenterCropPad", "CenterCropPad", {"x": f32(5, 4), "s": i64(3, 7)}, inits=["s"], opset=18),
    C("Compress", "Compress", {"x": f32(3, 4), "c": np.array([True, False, True])}, {"axis": 0}),
    C("ReverseSequence", "ReverseSequence", {"x": f32(4, 3, 2), "l": i64(4, 2, 1)}, {"batch_axis": 1, "time_axis": 0}),
    C("Scatter/v10", "Scatter", {"x": f32(3, 3), "i": np.array([[1, 0, 2]]), "u": f32(1, 3)}, {"axis": 0}, opset=10),
    C("Atan", "Atan", {"x": np.array([-50.0, -1.0, -0.3, 0.0, 0.2, 0.99, 1.01, 7.0, np.inf], np.float32)}),
    C("Asin", "Asin", {"x": np.array([-1.0, -0.7, 0.0, 0.3, 0.999, 1.0], np.float32)}),
    C("Acos", "Acos", {"x": np.array([-1.0, -0.5, 0.0, 0.6, 1.0], np.float32)}),
    C("Unique", "Unique", {"x": np.array([2.0, 1.0, 1.0, 3.0, 4.0, 3.0], np.float32)}, outputs=4),
    C("Unique/axis", "Unique", {"x": np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]])}, {"axis": 0}, outputs=4),
    C("GridSample", "GridSample", {"x": f32(1, 2, 4, 5), "g": f32(1, 3, 2, 2, lo=-1.2, hi=1.2)}, opset=16),
    C("GridSample/nearest-border", "GridSample", {"x": f32(1, 1, 4, 4), "g": f32(1, 3, 3, 2, lo=-1.5, hi=1.5)},
      {"mode": "nearest", "padding_mode": "border"}, opset=16),
    C("GridSample/bicubic-reflect-align", "GridSample", {"x": f32(2, 1, 4, 4), "g": f32(2, 2, 3, 2, lo=-1.7, hi=1.7)},
      {"mode": "bicubic", "padding_mode": "reflection", "align_corners": 1}, opset=16),
    C("RNN", "RNN", {"x": f32(4, 2, 3), "w": f32(1, 5, 3), "r": f32(1, 5, 5), "b": f32(1, 10)}, {"hidden_size": 5},
      inits=["w", "r", "b"], outputs=2),
    C("GRU/bidirectional", "GRU", {"x": f32(3, 2, 3), "w": f32(2, 12, 3), "r": f32(2, 12, 4), "b": f32(2, 24)},
      {"hidden_size": 4, "direction": "bidirectional", "linear_before_reset": 1}, inits=["w", "r", "b"], outputs=2),
    C("LSTM/seq-lens-initial", "LSTM", {"x": f32(4, 2, 3), "w": f32(1, 16, 3), "r": f32(1, 16, 4), "b": f32(1, 32),
                                        "sl": np.array([4, 2], np.int32), "h0": f32(1, 2, 4), "c0": f32(1, 2, 4)},
      {"hidden_size": 4}, inits=["w", "r", "b"], outputs=3),
    C("CumProd", "CumProd", {"x": f32(3, 5), "a": np.array(1)}, inits=["a"], opset=26),
    C("CumProd/excl-rev", "CumProd", {"x": f32(6), "a": np.array(0)}, {"exclusive": 1, "reverse": 1}, inits=["a"],
      opset=26),
    C("AffineGrid", "AffineGrid", {"t": f32(2, 2, 3), "s": i64(2, 1, 3, 4)}, inits=["s"], opset=20),
    C("AffineGrid/3d-align", "AffineGrid", {"t": f32(1, 3, 4), "s": i64(1, 1, 2, 3, 2)}, {"align_corners": 1},
      inits=["s"], opset=20),
    C("RMSNormalization", "RMSNormalization", {"x": X, "s": f32(4)}, {"epsilon": 1e-4}, inits=["s"], opset=23),
    C("RotaryEmbedding", "RotaryEmbedding", {"x": f32(2, 3, 5, 8), "cos": f32(2, 5, 4), "sin": f32(2, 5, 4)}, opset=23),
    C("RotaryEmbedding/interleaved-ids", "RotaryEmbedding",
      {"x": f32(1, 4, 12), "cos": f32(6, 2), "sin": f32(6, 2), "p": np.array([[5, 0, 2, 3]])},
      {"interleaved": 1, "num_heads": 2, "rotary_embedding_dim": 4}, opset=23),
    C("Swish", "Swish", {"x": X}, {"alpha": 1.5}, opset=24),
    C("Upsample", "Upsample", {"x": f32(1, 1, 2, 3), "sc": np.array([1, 1, 2, 2], np.float32)}, inits=["sc"], opset=9),
    C("Hardmax/v11-2d", "Hardmax", {"x": X}, {"axis": 1}, opset=11),
    C("Resize/v10", "Resize", {"x": f32(1, 1, 2, 3), "sc": np.array([1, 1, 2, 1.5], np.float32)}, inits=["sc"], opset=10),
    C("Dropout/training-ratio0", "Dropout", {"x": X, "r": np.array(0.0, np.float32), "t": np.array(True)},
      inits=["r", "t"], opset=13),
]

IDS = [c.id for c in CASES]
assert len(set(IDS)) == len(IDS)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_node(case, device):
    if device in case.skip:
        pytest.skip(case.skip[device])
    check_case(case, device)


GENERATED = ["Conv/same-upper", "Gemm", "Split", "TopK", "Slice", "Resize/linear", "Pad/reflect",
             "LayerNormalization/axis1-stats", "Reshape/runtime-shape", "Einsum/attention", "Clip/min-only"]


@pytest.mark.parametrize("case", [c for c in CASES if c.id in GENERATED], ids=GENERATED)
def test_node_generated(case, tmp_path):
    """The same models through ``ember import``: the generated module reproduces onnxruntime."""
    check_case(case, "numpy", via="generated")


def test_every_op_of_the_table_is_tested():
    """Each operator ember claims has a case here (control flow: tests/test_onnx_control.py;
    Constant: in every exported model of tests/test_onnx_models.py)."""
    from ember.onnx.ops import TABLE
    from test_onnx_contrib import CONTRIB_OPS
    from test_onnx_fuse import FUSED_OPS
    from test_onnx_quant import CASES as QUANT_CASES
    from test_onnx_quant import QOPERATOR_OPS
    assert {c.op for c in CASES} <= set(TABLE)
    elsewhere = {"If", "Loop", "Scan", "Constant"} | {c[1] for c in QUANT_CASES} | QOPERATOR_OPS | CONTRIB_OPS | FUSED_OPS
    assert set(TABLE) - {c.op for c in CASES} == elsewhere - {c.op for c in CASES}
