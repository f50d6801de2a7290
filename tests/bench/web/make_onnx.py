#!/usr/bin/env python3
"""ONNX files of the two benchmark models, built from the demos' safetensors weights, for
onnxruntime-web in ``bench_web.py`` (host side: needs numpy, onnx, onnxruntime, safetensors).

    python tests/bench/web/make_onnx.py [--out DIR] [--models mnist,minilm]

The graphs are written node by node with ``onnx.helper`` / ``onnx.numpy_helper`` (no torch, no
exporter), and compute exactly what ember's model code computes:

- ``mnist.onnx``: demos/mnist/model.py's MnistNet: the input normalisation ``(x - mean) / std``,
  then Conv/BatchNormalization/Relu/MaxPool twice, Flatten, Gemm/Relu, Gemm -> logits (N, 10).
- ``minilm.onnx``: demos/minilm/model.py's all-MiniLM-L6-v2 with the page's float16-rounded
  weights widened to float32: Gather embeddings (word + position + token type 0),
  LayerNormalization, six BERT layers (MatMul/Add projections, Reshape/Transpose heads,
  scaled scores + additive mask, Softmax, exact GELU through Erf), then mean pooling over the
  attention mask and L2 normalisation (sentence-transformers' Pooling + Normalize) ->
  ``sentence_embedding`` (B, 384). Inputs ``input_ids`` and ``attention_mask``, int64 (B, L).

Before a file is used it is checked: onnxruntime (CPython) on the file against ember's numpy
backend on the same weights and inputs; ``check`` returns the max |difference|, and
``ensure`` refuses a model that disagrees by more than ``TOLERANCE``. Files are cached: a stamp
next to them holds the hash of this script and of the weights they were built from.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CACHE = HERE / "cache"
MNIST_WEIGHTS = REPO / "demos" / "mnist" / "mnist.safetensors"
MINILM_WEIGHTS = REPO / "demos" / "minilm" / "minilm-l6-v2.f16.safetensors"
OPSET = 17            # LayerNormalization is opset 17
# Largest |onnxruntime - ember| accepted, relative to the largest |value| of ember's output
# (logits reach ~20; embeddings are unit vectors). Float32 sums in another order differ by a
# few ulps per layer; a wrong graph differs by orders of magnitude more.
TOLERANCE = 2e-5


def _load_f32(path: Path) -> dict:
    """{name: float32 (or integer) numpy array} of a safetensors file; float16 widened."""
    from safetensors.numpy import load_file

    return {k: (v.astype(np.float32) if v.dtype == np.float16 else v) for k, v in load_file(str(path)).items()}


class _Graph:
    """A small helper for writing graphs: ``g.op("Add", a, b)`` appends a node and returns the
    name of its (first) output; ``g.const(array)`` adds an initializer."""

    def __init__(self):
        self.nodes, self.inits, self._n = [], [], 0

    def _name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value, name: str | None = None, dtype=np.float32) -> str:
        arr = np.ascontiguousarray(np.asarray(value, dtype=dtype))
        name = name or self._name("c")
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def op(self, kind: str, *inputs: str, name: str | None = None, outputs: int = 1, **attrs):
        outs = [name] if name and outputs == 1 else [self._name(kind.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(kind, list(inputs), outs, name=self._name(f"n_{kind}"), **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self, inputs, outputs, doc: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "ember_bench", inputs, outputs, initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="ember tests/bench/web/make_onnx.py", doc_string=doc)
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


# ---- MNIST ------------------------------------------------------------------------------------

def mnist_graph(sd: dict) -> onnx.ModelProto:
    mnist = demo_module("mnist")   # the normalisation constants, from the model file itself
    g = _Graph()
    x = g.op("Div", g.op("Sub", "pixels", g.const(mnist.MEAN)), g.const(mnist.STD))  # (N, 1, 28, 28)
    for conv, bn in (("conv1", "bn1"), ("conv2", "bn2")):
        x = g.op("Conv", x, g.const(sd[f"{conv}.weight"]), g.const(sd[f"{conv}.bias"]),
                 kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
        x = g.op("BatchNormalization", x, g.const(sd[f"{bn}.weight"]), g.const(sd[f"{bn}.bias"]),
                 g.const(sd[f"{bn}.running_mean"]), g.const(sd[f"{bn}.running_var"]), epsilon=1e-5)
        x = g.op("MaxPool", g.op("Relu", x), kernel_shape=[2, 2], strides=[2, 2])     # (N, C, H/2, W/2)
    x = g.op("Flatten", x, axis=1)                                                     # (N, 1568)
    x = g.op("Relu", g.op("Gemm", x, g.const(sd["fc1.weight"]), g.const(sd["fc1.bias"]), transB=1))
    g.op("Gemm", x, g.const(sd["fc2.weight"]), g.const(sd["fc2.bias"]), transB=1, name="logits")
    return g.model([helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", 1, 28, 28])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
                   "ember's MNIST demo CNN (demos/mnist/model.py) with demos/mnist/mnist.safetensors")


# ---- all-MiniLM-L6-v2 -------------------------------------------------------------------------

HIDDEN, HEADS, LAYERS, EPS = 384, 12, 6, 1e-12


def minilm_graph(sd: dict) -> onnx.ModelProto:
    g = _Graph()
    head_dim = HIDDEN // HEADS

    def linear(x, prefix):   # x @ W^T + b with W^T stored (in, out): a plain MatMul
        return g.op("Add", g.op("MatMul", x, g.const(sd[f"{prefix}.weight"].T)), g.const(sd[f"{prefix}.bias"]))

    def layer_norm(x, prefix):
        return g.op("LayerNormalization", x, g.const(sd[f"{prefix}.weight"]), g.const(sd[f"{prefix}.bias"]),
                    axis=-1, epsilon=EPS)

    e = "embeddings"
    words = g.op("Gather", g.const(sd[f"{e}.word_embeddings.weight"]), "input_ids")   # (B, L, H)
    seq_len = g.op("Shape", "input_ids", start=1, end=2)                               # [L]
    positions = g.op("Slice", g.const(sd[f"{e}.position_embeddings.weight"]), g.const([0], dtype=np.int64),
                     seq_len, g.const([0], dtype=np.int64))                             # (L, H)
    # ember's model uses token type 0 everywhere: Gather of an all-zero index = row 0.
    x = g.op("Add", g.op("Add", words, positions), g.const(sd[f"{e}.token_type_embeddings.weight"][0]))
    x = layer_norm(x, f"{e}.LayerNorm")

    mask_f = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)                      # (B, L)
    # Additive mask as HF BERT builds it: 0 for real tokens, the float32 minimum for padding.
    bias = g.op("Mul", g.op("Sub", g.const(1.0), mask_f), g.const(np.finfo(np.float32).min))
    bias = g.op("Unsqueeze", bias, g.const([1, 2], dtype=np.int64))                    # (B, 1, 1, L)
    heads_shape = g.const([0, 0, HEADS, head_dim], dtype=np.int64)
    rows_shape = g.const([0, 0, HIDDEN], dtype=np.int64)
    scale = g.const(1.0 / math.sqrt(head_dim))

    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        q, k, v = (g.op("Reshape", linear(x, f"{p}.attention.self.{n}"), heads_shape) for n in ("query", "key", "value"))
        q = g.op("Transpose", q, perm=[0, 2, 1, 3])                                     # (B, heads, L, D)
        k = g.op("Transpose", k, perm=[0, 2, 3, 1])                                     # (B, heads, D, L)
        v = g.op("Transpose", v, perm=[0, 2, 1, 3])
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), bias)            # (B, heads, L, L)
        ctx = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)                       # (B, heads, L, D)
        ctx = g.op("Reshape", g.op("Transpose", ctx, perm=[0, 2, 1, 3]), rows_shape)    # (B, L, H)
        x = layer_norm(g.op("Add", linear(ctx, f"{p}.attention.output.dense"), x), f"{p}.attention.output.LayerNorm")
        h = linear(x, f"{p}.intermediate.dense")                                        # (B, L, 1536)
        h = g.op("Mul", g.op("Mul", h, g.op("Add", g.op("Erf", g.op("Div", h, g.const(math.sqrt(2.0)))), g.const(1.0))),
                 g.const(0.5))                                                          # exact GELU
        x = layer_norm(g.op("Add", linear(h, f"{p}.output.dense"), x), f"{p}.output.LayerNorm")

    m3 = g.op("Unsqueeze", mask_f, g.const([2], dtype=np.int64))                        # (B, L, 1)
    axis1 = g.const([1], dtype=np.int64)
    summed = g.op("ReduceSum", g.op("Mul", x, m3), axis1, keepdims=0)                  # (B, H)
    count = g.op("Max", g.op("ReduceSum", m3, axis1, keepdims=0), g.const(1e-9))        # (B, 1)
    mean = g.op("Div", summed, count)
    norm = g.op("Sqrt", g.op("ReduceSum", g.op("Mul", mean, mean), g.const([-1], dtype=np.int64), keepdims=1))
    g.op("Div", mean, g.op("Max", norm, g.const(1e-12)), name="sentence_embedding")
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["B", "L"]) for n in ("input_ids", "attention_mask")]
    return g.model(ints, [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["B", HIDDEN])],
                   "all-MiniLM-L6-v2 sentence embeddings (demos/minilm/model.py) with the float16-rounded "
                   "weights of demos/minilm/minilm-l6-v2.f16.safetensors, widened to float32")


# ---- check against ember and cache ---------------------------------------------------------

MODELS = {
    "mnist": {"weights": MNIST_WEIGHTS, "build": mnist_graph},
    "minilm": {"weights": MINILM_WEIGHTS, "build": minilm_graph},
}


def demo_module(demo: str):
    """demos/<demo>/model.py as a module of its own name (both demos call theirs model.py)."""
    import importlib.util

    name = f"bench_{demo}_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "demos" / demo / "model.py")
        sys.modules[name] = mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    return sys.modules[name]


def ember_reference(name: str, feeds: dict) -> np.ndarray:
    """ember's own output (numpy backend, natively) for the ONNX model's inputs."""
    import ember

    def tensor(a):
        return ember.from_bytes(a.tobytes(), a.shape, str(a.dtype), device="numpy")

    if name == "mnist":
        net = demo_module("mnist").load_model(str(MNIST_WEIGHTS), device="numpy")
        return net(tensor(feeds["pixels"])).numpy()
    net = demo_module("minilm").load_model(str(MINILM_WEIGHTS), device="numpy")
    return net.sentence_embedding(tensor(feeds["input_ids"]), tensor(feeds["attention_mask"])).numpy()


def check(name: str, path: Path, feeds_list) -> float:
    """Largest |onnxruntime(path) - ember| over the given input sets, relative to max |ember|."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for feeds in feeds_list:
        got = sess.run(None, feeds)[0]
        want = ember_reference(name, feeds)
        if got.shape != want.shape:
            raise SystemExit(f"make_onnx: {path.name} gives shape {got.shape}, ember {want.shape}")
        worst = max(worst, float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want)))))
    return worst


def _key(weights: Path) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(weights.read_bytes())
    return h.hexdigest()


def ensure(name: str, feeds_list, out: Path = CACHE, log=print) -> tuple[Path, float]:
    """``out/<name>.onnx``, built and checked unless a stamp says it is current; returns the path
    and the checked relative max |ORT - ember| (raises SystemExit above TOLERANCE)."""
    spec = MODELS[name]
    weights = spec["weights"]
    if not weights.is_file():
        raise SystemExit(f"make_onnx: {weights} is missing (demos/minilm/prepare.py or "
                         "'python3 build.py site' writes the MiniLM weights)")
    out.mkdir(parents=True, exist_ok=True)
    path, stamp = out / f"{name}.onnx", out / f"{name}.onnx.json"
    key = _key(weights)
    if path.is_file() and stamp.is_file():
        info = json.loads(stamp.read_text())
        if info.get("key") == key and info.get("size") == path.stat().st_size:
            return path, info["max_rel_diff"]
    log(f"building {path.name} from {weights.relative_to(REPO)}")
    model = spec["build"](_load_f32(weights))
    tmp = path.with_suffix(".onnx.part")
    onnx.save(model, str(tmp))
    diff = check(name, tmp, feeds_list)
    if not diff <= TOLERANCE:
        raise SystemExit(f"make_onnx: {name}.onnx disagrees with ember: max |diff| {diff:.2e} "
                         f"(relative) > {TOLERANCE:.0e}; the graph is wrong")
    tmp.replace(path)
    stamp.write_text(json.dumps({"key": key, "size": path.stat().st_size, "max_rel_diff": diff}) + "\n")
    log(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB, onnxruntime vs ember (numpy) max |diff| "
        f"{diff:.1e} (relative)")
    return path, diff


def default_feeds(name: str):
    """Inputs to check a model with when run on its own: one real digit; a padded batch."""
    if name == "mnist":
        digits = json.loads((REPO / "demos" / "mnist" / "testdigits.json").read_text())
        px = np.frombuffer(bytes.fromhex(digits["images_hex"][0]), dtype=np.uint8).astype(np.float32) / 255.0
        return [{"pixels": px.reshape(1, 1, 28, 28)}]
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 30000, size=(2, 12)).astype(np.int64)
    ids[:, 0], ids[0, -1], ids[1, 7] = 101, 102, 102
    mask = np.ones_like(ids)
    mask[1, 8:] = 0
    ids[1, 8:] = 0
    return [{"input_ids": ids, "attention_mask": mask}]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=CACHE)
    ap.add_argument("--models", default="mnist,minilm")
    a = ap.parse_args(argv)
    for name in a.models.split(","):
        path, diff = ensure(name, default_feeds(name), a.out)
        print(f"{path}  (max |ORT - ember| {diff:.1e} relative)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
