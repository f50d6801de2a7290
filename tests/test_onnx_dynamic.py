"""Every ONNX model the suite ships or builds, with dynamic axes, called at several shapes in a
row (issue 25: a value derived from the first call's input shape must never be reused for the
next input), against onnxruntime, on every backend, eagerly and compiled, and through the code
``ember import`` writes.

The models: the committed fixtures (tests/fixtures/onnx: the MNIST CNN, its external-data twin,
the encoder block, and tiny Hugging Face BertModel / GPT2Model / LlamaModel / SegFormer exports
made by make_onnx_fixtures.py), the graphs tests/bench/bench_models.py builds (MNIST, MobileNet,
the BERT graph and its onnxruntime-optimized form with com.microsoft fusions, the node chain),
the fuzzer's seed graphs (tests/fuzz/seeds/onnx) and the OCR demo's three PP-OCR graphs (from the
rapidocr-onnxruntime wheel, as demos/ocr/prepare.py takes them). Graphs whose inputs are fixed
are given symbolic dims first (``_dynamic``). The expected outputs come from onnxruntime.
"""
from __future__ import annotations

import functools
import os
import sys
import tempfile
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper

import ember
import ember.onnx
from onnx_helpers import import_generated

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures", "onnx")
SEEDS = os.path.join(HERE, "fuzz", "seeds", "onnx")
sys.path.insert(0, os.path.join(HERE, "bench"))
import bench_models  # noqa: E402

TEXT = [(2, 5), (1, 9), (3, 2), (2, 5)]        # (batch, seq), the first again at the end


# ---- the models --------------------------------------------------------------------------------

def _dynamic(raw: bytes, axes: dict) -> bytes:
    """``raw`` with input dims made symbolic (``axes``: input -> {axis: name}); output and
    intermediate shapes are dropped (onnxruntime checks them against what it computes)."""
    m = onnx.load_from_string(raw)
    for vi in m.graph.input:
        for ax, name in axes.get(vi.name, {}).items():
            d = vi.type.tensor_type.shape.dim[ax]
            d.Clear()
            d.dim_param = name
    for vi in m.graph.output:
        vi.type.tensor_type.ClearField("shape")
    del m.graph.value_info[:]
    return m.SerializeToString()


def _file(path):
    return lambda: path


def _seed(name, axes=None):
    def make():
        with open(os.path.join(SEEDS, name + ".onnx"), "rb") as f:
            raw = f.read()
        return _dynamic(raw, axes) if axes else raw
    return make


def _bench_bert():
    c = bench_models.TINY_BERT
    return bench_models.bert_onnx(c, bench_models.random_bert_weights(c))


def _bench_bert_optimized():
    from onnxruntime.transformers import optimizer
    c = bench_models.TINY_BERT
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src = os.path.join(d, "bert.onnx")
        with open(src, "wb") as f:
            f.write(_bench_bert())
        # opt_level=0: the optimizer's own fusions (level >= 1 runs a session pass that imports torch)
        opt = optimizer.optimize_model(src, model_type="bert", num_heads=c.heads, hidden_size=c.hidden, opt_level=0)
    assert "SkipLayerNormalization" in {n.op_type for n in opt.model.graph.node}
    return opt.model.SerializeToString()


def _ocr(file):
    def make():
        spec = pytest.importorskip("rapidocr_onnxruntime")
        path = os.path.join(os.path.dirname(spec.__file__), "models", file)
        if not os.path.isfile(path):
            pytest.skip(f"rapidocr_onnxruntime has no {file}")
        return path
    return make


def _images(shapes):
    return [{"image": s} for s in shapes]


def _text(shapes, names=("input_ids", "attention_mask")):
    return [{n: s for n in names} for s in shapes]


def _x(shapes, name="x"):
    return [{name: s} for s in shapes]


# name -> (source, [one {input: shape} per call], rtol/atol, backends that skip it and why)
SLOW_ON_PYTHON = "pure Python runs this graph in tens of seconds per shape"
MODELS = {
    "mnist_cnn": (_file(os.path.join(FIX, "mnist_cnn.onnx")), _x([(2, 1, 28, 28), (1, 1, 28, 28), (3, 1, 28, 28)],
                                                                  "image"), 1e-4, {}),
    "mnist_cnn_ext": (_file(os.path.join(FIX, "mnist_cnn_ext.onnx")), _x([(1, 1, 28, 28), (2, 1, 28, 28),
                                                                          (1, 1, 28, 28)], "image"), 1e-4, {}),
    "encoder_block": (_file(os.path.join(FIX, "encoder_block.onnx")),
                      _x([(2, 6, 32), (1, 3, 32), (3, 1, 32), (2, 6, 32)], "tokens"), 1e-4, {}),
    "bert_tiny": (_file(os.path.join(FIX, "bert_tiny.onnx")), _text(TEXT), 1e-4, {}),
    "gpt2_tiny": (_file(os.path.join(FIX, "gpt2_tiny.onnx")), _text(TEXT), 1e-4, {}),
    "llama_tiny": (_file(os.path.join(FIX, "llama_tiny.onnx")), _text(TEXT), 1e-4, {}),
    "segformer_tiny": (_file(os.path.join(FIX, "segformer_tiny.onnx")),
                       _x([(1, 3, 32, 32), (2, 3, 24, 40), (1, 3, 36, 28)], "pixel_values"), 1e-4, {}),
    "bench_mnist": (lambda: bench_models.mnist_onnx(bench_models.mnist_weights()),
                    _x([(1, 1, 28, 28), (3, 1, 28, 28), (2, 1, 28, 28)]), 1e-4, {}),
    "bench_mobilenet": (lambda: _dynamic(bench_models.mobilenet_onnx(bench_models.mobilenet_weights()),
                                         {"x": {2: "h", 3: "w"}}),
                        _x([(1, 3, 32, 32), (2, 3, 48, 40), (1, 3, 40, 56)]), 1e-4, {}),
    "bench_bert": (_bench_bert, _text(TEXT), 1e-4, {}),
    "bench_bert_optimized": (_bench_bert_optimized, _text(TEXT), 1e-4, {}),
    "bench_chain": (lambda: _dynamic(bench_models.chain_onnx(30), {"x": {0: "n"}}), _x([(1, 8), (4, 8), (2, 8)]),
                    1e-5, {}),
    "seed_conv_pool": (_seed("conv_pool", {"x": {0: "n", 2: "h", 3: "w"}}),
                       _x([(1, 1, 5, 5), (2, 1, 8, 7), (1, 1, 12, 9)]), 1e-5, {}),
    **{f"seed_{n}": (_seed(n), _x([(3, 4), (1, 4), (5, 4)]), 1e-5, {})
       for n in ("function", "if", "loop", "matmul_add", "reshape_shape", "scan")},
    "seed_gather_slice": (_seed("gather_slice"), _x([(3,), (1,), (6,)]), 1e-5, {}),
    "ocr_cls": (_ocr("ch_ppocr_mobile_v2.0_cls_infer.onnx"), _x([(1, 3, 48, 32), (2, 3, 48, 48), (1, 3, 48, 40)]),
                1e-4, {}),
    "ocr_det": (_ocr("ch_PP-OCRv4_det_infer.onnx"), _x([(1, 3, 32, 32), (1, 3, 32, 64), (2, 3, 32, 32)]), 1e-4,
                {"python": SLOW_ON_PYTHON}),
    "ocr_rec": (_ocr("ch_PP-OCRv4_rec_infer.onnx"), _x([(1, 3, 48, 32), (2, 3, 48, 48), (1, 3, 48, 40)]), 1e-4,
                {"python": SLOW_ON_PYTHON}),
}


@functools.lru_cache(maxsize=None)
def _model(name):
    """(path or bytes, the serialized model for onnxruntime or its path)."""
    src = MODELS[name][0]()
    return src


@functools.lru_cache(maxsize=None)
def _session(name):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    src = _model(name)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def _feeds(name, shapes: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    sess = _session(name)
    out = {}
    for i in sess.get_inputs():
        shape = shapes[i.name]
        if i.name == "attention_mask":
            m = np.ones(shape, np.int64)
            if shape[0] > 1:                 # a padded row
                m[1, max(1, shape[1] - 2):] = 0
            out[i.name] = m
        elif i.type == "tensor(int64)":      # token ids (vocabularies of 100 and more), indices of gather_slice
            hi = 3 if name == "seed_gather_slice" else 100
            out[i.name] = rng.integers(0, hi, shape).astype(np.int64)
        else:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _compare(got, want, tol, what):
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        assert tuple(g.shape) == w.shape, f"{what} output {k}: shape {g.shape}, onnxruntime gives {w.shape}"
        np.testing.assert_allclose(g.numpy().astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol,
                                   err_msg=f"{what} output {k}")


def _skip(name, device):
    why = MODELS[name][3].get(device)
    if why:
        pytest.skip(f"{name} on {device}: {why} (numpy, wasm and webgpu run it)")


# ---- the run-time loader, eagerly and compiled --------------------------------------------------

@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_runtime_at_several_shapes(name, device, compiled):
    _skip(name, device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # float64 initializers read as float32, ...
        model = ember.onnx.load(_model(name), device=device, compile=compiled)
    _, calls, tol, _ = MODELS[name]
    for i, shapes in enumerate(calls):
        feeds = _feeds(name, shapes, seed=i)
        want = _session(name).run(None, feeds)
        got = model(**{k: ember.from_numpy(v, device=device) for k, v in feeds.items()})
        _compare(got, want, tol, f"{name} on {device} ({'compiled' if compiled else 'eager'}), call {i} {shapes}")
    if compiled:
        s = model.stats()
        assert s["calls"] == len(calls)


# ---- ember import: the generated module ---------------------------------------------------------

@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    mods = {}

    def get(name):
        if name not in mods:
            out = tmp_path_factory.mktemp("gen_" + name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mods[name] = import_generated(_model(name), str(out), name=name)
        return mods[name]
    return get


# ember import writes no If/Loop/Scan bodies: it says so (a typed error) instead of writing code
NO_SUBGRAPHS = {"seed_if", "seed_loop", "seed_scan"}


def test_generated_refuses_subgraphs(tmp_path):
    from ember.errors import OnnxError
    for name in sorted(NO_SUBGRAPHS):
        with pytest.raises(OnnxError, match="holds a graph, which cannot be written out"):
            import_generated(_model(name), str(tmp_path / name), name=name)


@pytest.mark.parametrize("name", sorted(set(MODELS) - NO_SUBGRAPHS))
def test_generated_at_several_shapes(name, device, generated):
    _skip(name, device)
    mod, _ = generated(name)
    net = mod.load(device=device)
    _, calls, tol, _ = MODELS[name]
    order = [i.name for i in _session(name).get_inputs()]
    for i, shapes in enumerate(calls):
        feeds = _feeds(name, shapes, seed=10 + i)
        want = _session(name).run(None, feeds)
        got = net(*[ember.from_numpy(feeds[k], device=device) for k in order])
        _compare(got, want, tol, f"generated {name} on {device}, call {i} {shapes}")


# ---- issue 25 as filed, and the mechanisms behind it ---------------------------------------------

@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_bert_at_the_issue_shapes(compiled):
    """The report: a BertModel export ran at 8x64, then every other shape failed with a
    ShapeError at /m/embeddings/Add (the token-type ids expanded once, at 8x64)."""
    model = ember.onnx.load(os.path.join(FIX, "bert_tiny.onnx"), device="numpy", compile=compiled)
    for i, shape in enumerate([(8, 64), (32, 128), (1, 7), (8, 64)]):
        feeds = _feeds("bert_tiny", {"input_ids": shape, "attention_mask": shape}, seed=i)
        _compare(model(**feeds), _session("bert_tiny").run(None, feeds), 1e-4, f"bert_tiny at {shape}")


def _graph(nodes, inputs, outputs, inits) -> bytes:
    g = oh.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _check_shapes(raw, shapes, dtype=np.float32, devices=("python", "numpy")):
    for device in devices:
        for compiled in (False, True):
            model = ember.onnx.load(raw, device=device, compile=compiled)
            for s in shapes:
                x = (np.arange(np.prod(s)) % 7).reshape(s).astype(dtype)
                want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, {"x": x})
                got = model(x)
                got = got if isinstance(got, tuple) else (got,)
                for g, w in zip(got, want):
                    assert tuple(g.shape) == w.shape and np.array_equal(g.numpy(), w), (device, compiled, s)
    with tempfile.TemporaryDirectory() as d:
        mod, _ = import_generated(raw, d, name="g")
        net = mod.load(device="numpy")
        for s in shapes:
            x = (np.arange(np.prod(s)) % 7).reshape(s).astype(dtype)
            want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, {"x": x})
            got = net(ember.from_numpy(x, device="numpy"))
            got = got if isinstance(got, tuple) else (got,)
            for g, w in zip(got, want):
                assert tuple(g.shape) == w.shape and np.array_equal(g.numpy(), w), ("generated", s)


def test_constant_buffer_cut_and_expanded_to_the_input():
    """A constant buffer sliced to the sequence length and expanded to the input's shape (the
    token-type path): computed from constants only, but with sizes read from this call's input,
    so it is computed again for every other shape (first, second, first again)."""
    raw = _graph([oh.make_node("Shape", ["x"], ["sh"]),
                  oh.make_node("Gather", ["sh", "i1"], ["s"], axis=0),
                  oh.make_node("Unsqueeze", ["s", "zero"], ["s1"]),
                  oh.make_node("Slice", ["buf", "zero", "s1", "one"], ["cut"]),
                  oh.make_node("Expand", ["cut", "sh"], ["ex"]),
                  oh.make_node("Add", ["x", "ex"], ["y"])],
                 [oh.make_tensor_value_info("x", T.INT64, ["b", "s"])], [oh.make_tensor_value_info("y", T.INT64, None)],
                 {"buf": np.arange(32, dtype=np.int64).reshape(1, 32), "one": np.array([1], np.int64),
                  "i1": np.array(1, np.int64),
                  "zero": np.array([0], np.int64)})
    _check_shapes(raw, [(2, 3), (4, 5), (1, 7), (2, 3), (4, 5)], np.int64)


def test_values_equal_at_both_placeholder_sizes_are_not_folded():
    """seq // 8 and seq > 10 are 0 and False at any small placeholder size: loading must not
    fold them (it traces with sizes like 3 and 4), they depend on the input."""
    raw = _graph([oh.make_node("Shape", ["x"], ["sh"]),
                  oh.make_node("Gather", ["sh", "one"], ["s"], axis=0),
                  oh.make_node("Div", ["s", "eight"], ["q"]),
                  oh.make_node("Greater", ["s", "ten"], ["gt"]),
                  oh.make_node("Cast", ["gt"], ["gtf"], to=T.FLOAT),
                  oh.make_node("Unsqueeze", ["q", "zero"], ["q1"]),
                  oh.make_node("Concat", ["q1", "four"], ["shp"], axis=0),
                  oh.make_node("ConstantOfShape", ["shp"], ["z"], value=numpy_helper.from_array(np.array([1.0], np.float32))),
                  oh.make_node("ReduceSum", ["z"], ["n"], keepdims=0),
                  oh.make_node("Add", ["n", "gtf"], ["y"])],
                 [oh.make_tensor_value_info("x", T.FLOAT, ["b", "s", 4])],
                 [oh.make_tensor_value_info("y", T.FLOAT, None), oh.make_tensor_value_info("shp", T.INT64, None)],
                 {"one": np.array(1, np.int64), "eight": np.array(8, np.int64), "ten": np.array(10, np.int64),
                  "zero": np.array([0], np.int64), "four": np.array([4], np.int64)})
    _check_shapes(raw, [(2, 3, 4), (2, 16, 4), (1, 40, 4), (2, 3, 4)])
    # what may fold still does: the fixed last dim of the input
    raw_fixed = _graph([oh.make_node("Shape", ["x"], ["sh"]),
                        oh.make_node("Gather", ["sh", "two"], ["d"], axis=0),
                        oh.make_node("Mul", ["d", "two"], ["y"])],
                       [oh.make_tensor_value_info("x", T.FLOAT, ["b", "s", 4])],
                       [oh.make_tensor_value_info("y", T.INT64, None)], {"two": np.array(2, np.int64)})
    m = ember.onnx.load(raw_fixed, device="python")
    assert m._plan == [] and m(np.zeros((1, 2, 4), np.float32)).tolist() == 8


def test_pooled_size_is_not_folded():
    """floor(h / 2) after a pooling is 1 at h = 2 and h = 3: reading it back through Shape must
    not fold it."""
    raw = _graph([oh.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                  oh.make_node("Shape", ["p"], ["sh"]),
                  oh.make_node("Gather", ["sh", "two"], ["h"], axis=0),
                  oh.make_node("Cast", ["h"], ["hf"], to=T.FLOAT),
                  oh.make_node("Mul", ["p", "hf"], ["y"])],
                 [oh.make_tensor_value_info("x", T.FLOAT, [1, 1, "h", "w"])],
                 [oh.make_tensor_value_info("y", T.FLOAT, None)], {"two": np.array(2, np.int64)})
    _check_shapes(raw, [(1, 1, 2, 2), (1, 1, 8, 6), (1, 1, 3, 5)])


def test_value_dependent_output_shape():
    """The fuzzer's Range seed: the input is a scalar whose value sets the output's length;
    the same input shape, different values, one after the other."""
    raw = _seed("int64_data_range")()
    sess = ort.InferenceSession(raw, providers=["CPUExecutionProvider"])
    n = onnx.numpy_helper.to_array([t for t in onnx.load_from_string(raw).graph.initializer if t.name == "idx"][0]).size
    for device in ("python", "numpy"):
        for compiled in (False, True):
            model = ember.onnx.load(raw, device=device, compile=compiled)
            for lim in (n, 1, n, 1):
                feeds = {"lim": np.array(lim, np.int64)}
                got, want = model(**feeds), sess.run(None, feeds)[0]
                assert tuple(got.shape) == want.shape and np.array_equal(got.numpy(), want), (device, compiled, lim)
