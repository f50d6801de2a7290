"""The models of ``bench_core.py``'s ONNX section, each defined once as a weights dict plus two
renderings of the same computation: an ONNX graph (built with ``onnx.helper``, so no exporter is
needed) and a PyTorch function (used only when torch is importable).

- ``mnist``: the MNIST demo CNN (demos/mnist/mnist.safetensors): normalise, conv+BN+ReLU+pool
  twice, two linear layers.
- ``minilm``: all-MiniLM-L6-v2 (demos/minilm weights): a 6-layer BERT as transformers exports it
  (Gather embeddings, LayerNormalization, MatMul+Add projections, Reshape/Transpose heads,
  Softmax attention with an additive mask, Erf GELU).
- ``mobilenet``: a torchvision-style MobileNetV2 (width 0.5, 32 px input trimmed to 8 blocks),
  random weights, batch norm folded into the convolutions as torch.onnx does: 1x1 expand,
  depthwise 3x3 (stride 1 and 2), 1x1 project, residual adds, Clip(0, 6), global pool, Gemm.
- ``tiny_bert``: the BERT graph with a transformers "tiny" config (2 layers, hidden 128, 2
  heads), random weights: a graph where per-node overhead dominates.

``chain(n)`` is a graph of ``n`` tiny elementwise nodes, for the per-node overhead column.
"""
from __future__ import annotations

import math
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OPSET = 17


class _G:
    """A small graph builder: ``g.op("MatMul", a, b)`` returns the output name."""

    def __init__(self, name):
        self.name = name
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.n = 0

    def init(self, name, array):
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def const(self, values, dtype=np.int64):
        self.n += 1
        return self.init(f"c{self.n}", np.asarray(values, dtype=dtype))

    def op(self, op_type, *inputs, outputs=1, **attrs):
        self.n += 1
        outs = [f"{op_type.lower()}{self.n}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=f"{op_type}_{self.n}", **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self) -> bytes:
        g = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = 8
        return m.SerializeToString()


# ---- MNIST demo CNN --------------------------------------------------------------------------

def mnist_weights() -> dict:
    import ember
    sd = ember.load_safetensors(os.path.join(ROOT, "demos", "mnist", "mnist.safetensors"))
    return {k: sd[k].numpy().astype(np.float32) for k in sd if "num_batches" not in k}


def mnist_onnx(w) -> bytes:
    g = _G("mnist_demo")
    g.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 28, 28]))
    x = g.op("Div", g.op("Sub", "x", g.const(0.1307, np.float32)), g.const(0.3081, np.float32))
    for i in (1, 2):
        p = {k: g.init(f"{k}", w[k]) for k in w if k.startswith((f"conv{i}.", f"bn{i}."))}
        x = g.op("Conv", x, p[f"conv{i}.weight"], p[f"conv{i}.bias"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        x = g.op("BatchNormalization", x, p[f"bn{i}.weight"], p[f"bn{i}.bias"], p[f"bn{i}.running_mean"],
                 p[f"bn{i}.running_var"], epsilon=1e-5)
        x = g.op("MaxPool", g.op("Relu", x), kernel_shape=[2, 2], strides=[2, 2])
    x = g.op("Flatten", x, axis=1)
    for i in (1, 2):
        x = g.op("Gemm", x, g.init(f"fc{i}.weight", w[f"fc{i}.weight"]), g.init(f"fc{i}.bias", w[f"fc{i}.bias"]),
                 transB=1)
        if i == 1:
            x = g.op("Relu", x)
    g.outputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, None))
    return g.model()


def mnist_torch(w):
    import torch
    import torch.nn.functional as TF
    t = {k: torch.from_numpy(v) for k, v in w.items()}

    def fwd(x):
        x = (x - 0.1307) / 0.3081
        for i in (1, 2):
            x = TF.conv2d(x, t[f"conv{i}.weight"], t[f"conv{i}.bias"], padding=1)
            x = TF.batch_norm(x, t[f"bn{i}.running_mean"], t[f"bn{i}.running_var"], t[f"bn{i}.weight"],
                              t[f"bn{i}.bias"], eps=1e-5)
            x = TF.max_pool2d(TF.relu(x), 2)
        x = TF.relu(TF.linear(x.flatten(1), t["fc1.weight"], t["fc1.bias"]))
        return TF.linear(x, t["fc2.weight"], t["fc2.bias"])
    return fwd


# ---- BERT (MiniLM, tiny BERT) ----------------------------------------------------------------

class BertConfig:
    def __init__(self, layers, hidden, heads, intermediate, vocab=30522, positions=512, eps=1e-12):
        self.layers, self.hidden, self.heads, self.intermediate = layers, hidden, heads, intermediate
        self.vocab, self.positions, self.eps = vocab, positions, eps


MINILM = BertConfig(6, 384, 12, 1536)
TINY_BERT = BertConfig(2, 128, 2, 512, vocab=1000)


def minilm_weights() -> dict:
    import ember
    sd = ember.load_safetensors(os.path.join(ROOT, "demos", "minilm", "minilm-l6-v2.f16.safetensors"))
    return {k: sd[k].numpy().astype(np.float32) for k in sd if not k.startswith("pooler") and "position_ids" not in k}


def random_bert_weights(c: BertConfig, seed=0) -> dict:
    rng = np.random.default_rng(seed)

    def r(*shape, s=0.05):
        return (rng.standard_normal(shape) * s).astype(np.float32)
    w = {"embeddings.word_embeddings.weight": r(c.vocab, c.hidden, s=0.5),
         "embeddings.position_embeddings.weight": r(c.positions, c.hidden, s=0.5),
         "embeddings.token_type_embeddings.weight": r(2, c.hidden, s=0.5),
         "embeddings.LayerNorm.weight": 1 + r(c.hidden), "embeddings.LayerNorm.bias": r(c.hidden)}
    for i in range(c.layers):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            w[p + f"attention.self.{n}.weight"] = r(c.hidden, c.hidden)
            w[p + f"attention.self.{n}.bias"] = r(c.hidden)
        w[p + "attention.output.dense.weight"] = r(c.hidden, c.hidden)
        w[p + "attention.output.dense.bias"] = r(c.hidden)
        w[p + "intermediate.dense.weight"] = r(c.intermediate, c.hidden)
        w[p + "intermediate.dense.bias"] = r(c.intermediate)
        w[p + "output.dense.weight"] = r(c.hidden, c.intermediate)
        w[p + "output.dense.bias"] = r(c.hidden)
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + n + ".weight"] = 1 + r(c.hidden)
            w[p + n + ".bias"] = r(c.hidden)
    return w


def bert_onnx(c: BertConfig, w) -> bytes:
    """BERT as transformers' exporter writes it: (input_ids, attention_mask) int64 (B, L) ->
    last hidden state (B, L, hidden)."""
    g = _G("bert")
    for name in ("input_ids", "attention_mask"):
        g.inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64, ["B", "L"]))
    W = {k: g.init(k, v.T.copy() if k.endswith("dense.weight") or ".self." in k and k.endswith("weight") else v)
         for k, v in w.items()}    # Linear weights stored (in, out), as MatMul expects
    d = c.hidden // c.heads
    seq = g.op("Gather", g.op("Shape", "input_ids"), g.const(1), axis=0)                  # L
    pos = g.op("Slice", W["embeddings.position_embeddings.weight"], g.const([0]),
               g.op("Unsqueeze", seq, g.const([0])), g.const([0]))                         # (L, hidden)
    x = g.op("Gather", W["embeddings.word_embeddings.weight"], "input_ids", axis=0)       # (B, L, hidden)
    tt = g.op("Gather", W["embeddings.token_type_embeddings.weight"], g.const(0), axis=0)
    x = g.op("Add", g.op("Add", x, pos), tt)
    x = g.op("LayerNormalization", x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"],
             axis=-1, epsilon=c.eps)
    m = g.op("Cast", g.op("Unsqueeze", "attention_mask", g.const([1, 2])), to=TensorProto.FLOAT)
    bias = g.op("Mul", g.op("Sub", g.const(1.0, np.float32), m), g.const(-3.4e38, np.float32))   # (B,1,1,L)
    heads_shape = g.op("Concat", g.const([0, 0]), g.const([c.heads, d]), axis=0)
    for i in range(c.layers):
        p = f"encoder.layer.{i}."

        def lin(t, name):
            return g.op("Add", g.op("MatMul", t, W[p + name + ".weight"]), W[p + name + ".bias"])

        def split(t, perm):
            return g.op("Transpose", g.op("Reshape", t, heads_shape), perm=perm)
        q = split(lin(x, "attention.self.query"), [0, 2, 1, 3])
        k = split(lin(x, "attention.self.key"), [0, 2, 3, 1])
        v = split(lin(x, "attention.self.value"), [0, 2, 1, 3])
        s = g.op("Div", g.op("MatMul", q, k), g.const(math.sqrt(d), np.float32))
        a = g.op("Softmax", g.op("Add", s, bias), axis=-1)
        ctx = g.op("Transpose", g.op("MatMul", a, v), perm=[0, 2, 1, 3])
        ctx = g.op("Reshape", ctx, g.const([0, 0, c.hidden]))
        x = g.op("LayerNormalization", g.op("Add", lin(ctx, "attention.output.dense"), x),
                 W[p + "attention.output.LayerNorm.weight"], W[p + "attention.output.LayerNorm.bias"],
                 axis=-1, epsilon=c.eps)
        h = lin(x, "intermediate.dense")
        h = g.op("Mul", g.op("Mul", h, g.op("Add", g.op("Erf", g.op("Div", h, g.const(math.sqrt(2.0), np.float32))),
                                            g.const(1.0, np.float32))), g.const(0.5, np.float32))
        x = g.op("LayerNormalization", g.op("Add", lin(h, "output.dense"), x),
                 W[p + "output.LayerNorm.weight"], W[p + "output.LayerNorm.bias"], axis=-1, epsilon=c.eps)
    g.outputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, None))
    return g.model()


def bert_torch(c: BertConfig, w, device: str = "cpu"):
    import torch
    import torch.nn.functional as TF
    t = {k: torch.from_numpy(v).to(device) for k, v in w.items()}
    d = c.hidden // c.heads

    def fwd(ids, mask):
        b, n = ids.shape
        x = (t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:n]
             + t["embeddings.token_type_embeddings.weight"][0])
        x = TF.layer_norm(x, (c.hidden,), t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], c.eps)
        keep = mask.bool().reshape(b, 1, 1, n)
        for i in range(c.layers):
            p = f"encoder.layer.{i}."

            def lin(u, name):
                return TF.linear(u, t[p + name + ".weight"], t[p + name + ".bias"])

            def split(u):
                return u.reshape(b, n, c.heads, d).transpose(1, 2)
            ctx = TF.scaled_dot_product_attention(split(lin(x, "attention.self.query")),
                                                  split(lin(x, "attention.self.key")),
                                                  split(lin(x, "attention.self.value")), attn_mask=keep)
            ctx = ctx.transpose(1, 2).reshape(b, n, c.hidden)
            x = TF.layer_norm(lin(ctx, "attention.output.dense") + x, (c.hidden,),
                              t[p + "attention.output.LayerNorm.weight"], t[p + "attention.output.LayerNorm.bias"], c.eps)
            h = TF.gelu(lin(x, "intermediate.dense"))
            x = TF.layer_norm(lin(h, "output.dense") + x, (c.hidden,), t[p + "output.LayerNorm.weight"],
                              t[p + "output.LayerNorm.bias"], c.eps)
        return x
    return fwd


def bert_inputs(c: BertConfig, batch, length, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000 if c.vocab > 2000 else 1, c.vocab, (batch, length)).astype(np.int64)
    mask = np.ones((batch, length), np.int64)
    for i in range(batch):      # ragged batch: the later rows are padded
        real = max(1, length - i * (length // (2 * batch) or 1))
        mask[i, real:] = 0
        ids[i, real:] = 0
    return ids, mask


# ---- MobileNetV2-style CNN -----------------------------------------------------------------

# (expansion, out channels, stride) per inverted-residual block
MOBILENET_BLOCKS = [(1, 8, 1), (6, 12, 2), (6, 12, 1), (6, 16, 2), (6, 16, 1), (6, 32, 2), (6, 32, 1), (6, 48, 1)]


def mobilenet_weights(seed=0) -> dict:
    rng = np.random.default_rng(seed)

    def conv(o, i, k):
        return ((rng.standard_normal((o, i, k, k)) * math.sqrt(2.0 / (i * k * k))).astype(np.float32),
                (rng.standard_normal(o) * 0.05).astype(np.float32))
    w = {}
    w["stem.w"], w["stem.b"] = conv(16, 3, 3)
    c_in = 16
    for j, (e, c_out, _s) in enumerate(MOBILENET_BLOCKS):
        hid = c_in * e
        if e != 1:
            w[f"b{j}.expand.w"], w[f"b{j}.expand.b"] = conv(hid, c_in, 1)
        w[f"b{j}.dw.w"], w[f"b{j}.dw.b"] = conv(hid, 1, 3)
        w[f"b{j}.project.w"], w[f"b{j}.project.b"] = conv(c_out, hid, 1)
        c_in = c_out
    w["head.w"], w["head.b"] = conv(256, c_in, 1)
    w["fc.w"] = (rng.standard_normal((100, 256)) * 0.05).astype(np.float32)
    w["fc.b"] = np.zeros(100, np.float32)
    return w


def mobilenet_onnx(w, size=96) -> bytes:
    g = _G("mobilenet_v2_style")
    g.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, size, size]))
    lo, hi = g.const(0.0, np.float32), g.const(6.0, np.float32)

    def conv(x, name, k, stride=1, group=1, act=True):
        y = g.op("Conv", x, g.init(name + ".w", w[name + ".w"]), g.init(name + ".b", w[name + ".b"]),
                 kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4, group=group)
        return g.op("Clip", y, lo, hi) if act else y
    x = conv("x", "stem", 3, 2)
    c_in = 16
    for j, (e, c_out, s) in enumerate(MOBILENET_BLOCKS):
        y = conv(x, f"b{j}.expand", 1) if e != 1 else x
        y = conv(y, f"b{j}.dw", 3, s, group=c_in * e)
        y = conv(y, f"b{j}.project", 1, act=False)
        x = g.op("Add", x, y) if s == 1 and c_in == c_out else y
        c_in = c_out
    x = g.op("Flatten", g.op("GlobalAveragePool", conv(x, "head", 1)), axis=1)
    x = g.op("Gemm", x, g.init("fc.w", w["fc.w"]), g.init("fc.b", w["fc.b"]), transB=1)
    g.outputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, None))
    return g.model()


def mobilenet_torch(w):
    import torch
    import torch.nn.functional as TF
    t = {k: torch.from_numpy(v) for k, v in w.items()}

    def conv(x, name, k, stride=1, group=1, act=True):
        y = TF.conv2d(x, t[name + ".w"], t[name + ".b"], stride=stride, padding=k // 2, groups=group)
        return TF.relu6(y) if act else y

    def fwd(x):
        x = conv(x, "stem", 3, 2)
        c_in = 16
        for j, (e, c_out, s) in enumerate(MOBILENET_BLOCKS):
            y = conv(x, f"b{j}.expand", 1) if e != 1 else x
            y = conv(y, f"b{j}.dw", 3, s, group=c_in * e)
            y = conv(y, f"b{j}.project", 1, act=False)
            x = x + y if s == 1 and c_in == c_out else y
            c_in = c_out
        x = conv(x, "head", 1).mean((2, 3))
        return TF.linear(x, t["fc.w"], t["fc.b"])
    return fwd


# ---- per-node overhead ----------------------------------------------------------------------

def chain_onnx(n=200) -> bytes:
    """``n`` alternating Add / Mul / Relu nodes on a (1, 8) tensor: the compute is nothing, the
    time per node is what a runtime spends per node."""
    g = _G("chain")
    g.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]))
    a, b = g.const(np.full(8, 0.5), np.float32), g.const(np.full(8, 0.999), np.float32)
    x = "x"
    for i in range(n):
        x = g.op(("Add", "Mul", "Relu")[i % 3], *((x, a), (x, b), (x,))[i % 3])
    g.outputs.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, None))
    return g.model()


def chain_torch(n=200):
    import torch
    a, b = torch.full((8,), 0.5), torch.full((8,), 0.999)

    def fwd(x):
        for i in range(n):
            x = (x + a) if i % 3 == 0 else (x * b) if i % 3 == 1 else torch.relu(x)
        return x
    return fwd
