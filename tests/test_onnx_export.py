"""``ember.onnx.export`` round trips: ember model -> ONNX file -> onnxruntime (the reference) and
back into ember (``ember.onnx.load`` and ``ember import``). Dynamic axes are exported at one
shape and run at another. Models are captured on the numpy backend (the exporter reads the
plan, not the backend) with small random weights; the op cases run one per op family."""
from __future__ import annotations

import importlib.util
import math
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ember
import ember.native
import ember.onnx
from ember.errors import UnsupportedOp
from ember.onnx import exporter
from onnx_helpers import import_generated

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _session(path):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _eager(fn, *arrays):
    with ember.no_grad():
        out = fn(*[ember.from_numpy(a, device="numpy") for a in arrays])
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]


def _check(path, fn, feeds: dict, rtol=1e-4, atol=1e-5):
    """onnxruntime on ``feeds`` == ember eager on the same arrays; returns the outputs."""
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    got = _session(path).run(None, feeds)
    want = _eager(fn, *feeds.values())
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


def _back(path, tmp_path, feeds: dict, want, rtol=1e-4, atol=1e-5):
    """The exported file back in ember: the run-time loader and the generated module (ember import)."""
    args = [ember.from_numpy(a, device="numpy") for a in feeds.values()]
    loaded = ember.onnx.load(str(path), device="numpy")(*args)
    np.testing.assert_allclose(loaded.numpy(), want, rtol=rtol, atol=atol)
    mod, _ = import_generated(str(path), str(tmp_path / "gen"), name=os.path.basename(str(path))[:-5] + "_back")
    np.testing.assert_allclose(mod.load(device="numpy")(*args).numpy(), want, rtol=rtol, atol=atol)


def _load_demo(name, folder):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "demos", folder, "model.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True)
def _numpy_default():
    before = ember.default_device()
    ember.set_default_device("numpy")
    yield
    ember.set_default_device(before)


def _randomize(module, seed=0, scale=0.2):
    rng = np.random.default_rng(seed)
    sd = module.state_dict()
    new = {}
    for k, t in sd.items():
        if t.dtype.kind == "f":
            a = rng.standard_normal(t.shape).astype(np.float32) * scale
            if k.endswith("running_var") or k.endswith("LayerNorm.weight"):
                a = np.abs(a) + 0.5
            new[k] = ember.from_numpy(a, device="numpy")
        else:
            new[k] = t
    module.load_state_dict(new)
    return module.eval()


# ---- whole models ----------------------------------------------------------------------------------

def test_mnist_cnn_round_trip(tmp_path):
    mnist = _load_demo("ember_export_mnist", "mnist")
    net = _randomize(mnist.MnistNet().to("numpy"))
    x = np.random.default_rng(1).random((2, 1, 28, 28), dtype=np.float32)
    path = tmp_path / "mnist.onnx"
    r = ember.onnx.export(net, (ember.from_numpy(x),), path, input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})
    assert r["inputs"] == ["image"] and r["outputs"] == ["logits"]
    assert {"Conv", "BatchNormalization", "MaxPool", "Relu"} <= set(r["ops"])
    m = onnx.load(str(path))
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert m.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert m.opset_import[0].version == 17
    x5 = np.random.default_rng(2).random((5, 1, 28, 28), dtype=np.float32)   # another batch size
    want = _check(path, net, {"image": x5})[0]
    _back(path, tmp_path, {"image": x5}, want)


def test_minilm_round_trip(tmp_path):
    """MiniLM's code with a small random config (the real weights are a download: the code path
    is the same); batch and sequence both dynamic."""
    minilm = _load_demo("ember_export_minilm", "minilm")

    class Small(minilm.Config):
        vocab_size, hidden, layers, heads, intermediate, max_positions = 40, 32, 2, 4, 64, 16

    net = _randomize(minilm.MiniLM(Small).to("numpy"))
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 40, (2, 5)).astype(np.int64)
    mask = np.ones((2, 5), np.int64)
    path = tmp_path / "minilm.onnx"
    ember.onnx.export(net, (ember.from_numpy(ids), ember.from_numpy(mask)), path,
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})
    ids3 = rng.integers(0, 40, (3, 7)).astype(np.int64)
    mask3 = np.ones((3, 7), np.int64)
    mask3[1, 4:] = 0                                                      # padding
    feeds = {"input_ids": ids3, "attention_mask": mask3}
    _back(path, tmp_path, feeds, _check(path, net, feeds)[0])


def test_efficientnet_lite0_round_trip(tmp_path):
    from ember.nn.efficientnet import efficientnet_lite0

    net = efficientnet_lite0(num_classes=10).eval()                       # random init
    x = np.random.default_rng(4).standard_normal((1, 3, 32, 32)).astype(np.float32)
    path = tmp_path / "effnet.onnx"
    ember.onnx.export(net, ember.from_numpy(x), path, dynamic_axes={"x": [0]})
    x2 = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)
    got = _check(path, net, {"x": x2}, rtol=1e-3, atol=1e-6)[0]
    assert got.shape == (2, 10)
    np.testing.assert_allclose(ember.onnx.load(str(path), device="numpy")(ember.from_numpy(x2)).numpy(), got,
                               rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "q8_0"])
def test_llama_block_round_trip(tmp_path, quantized):
    """One decoder layer of ember.nn.llama (RMSNorm, RoPE, grouped-query attention over the KV
    cache, SwiGLU); quantized weights are exported dequantized. The token count is dynamic."""
    from ember import quant
    from ember.nn.llama import Llama, LlamaConfig

    cfg = LlamaConfig(n_layers=1, dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=48)
    m = Llama.random(cfg, seed=1, context=16, device="numpy")
    if quantized:
        w = {k: (quant.QTensor.quantize(v, "q8_0") if v.ndim == 2 else v) for k, v in m.w.items()}
        m = Llama(cfg, w, context=16, device="numpy")

    def step(ids, pos):
        return m.forward(ids, pos, all_logits=True)

    ids = ember.tensor([3, 1, 4], dtype="int32", device="numpy")
    pos = ember.tensor([0], dtype="int32", device="numpy")
    path = tmp_path / "llama.onnx"
    r = ember.onnx.export(step, (ids, pos), path, dynamic_axes={"ids": {0: "tokens"}})
    if quantized:
        assert not any("q8" in o.lower() for o in r["ops"])
    ids5 = np.array([5, 9, 2, 6, 5], np.int32)
    feeds = {"ids": ids5, "pos": np.array([0], np.int32)}
    # the graph holds the dequantized weights' float product; the numpy device's native qlinear
    # (ember.native: the page's kernels) rounds activations to int16 per block, so ember's side
    # runs its float path here
    with ember.native.disabled():
        _back(path, tmp_path, feeds, _check(path, step, feeds)[0])


# ---- every op of the op cases that ONNX can express -------------------------------------------------

def _op_cases():
    """The first case of each op family with float32 inputs (small, no NaN/inf, no empty
    shapes); a family with no such case gets its first case without float16 inputs (integer
    and bool ops, creation ops with no input)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from op_cases import all_cases

    picked, fallback = {}, {}
    for c in all_cases():
        fam = c.id.split("/")[0]
        if c.raises or fam in picked or any(0 in s.shape or s.special for s in c.inputs):
            continue
        if c.inputs and all(s.dtype == "float32" and len(s.shape) > 0 for s in c.inputs):
            picked[fam] = c
        elif all(s.dtype != "float16" for s in c.inputs):
            fallback.setdefault(fam, c)
    picked = {**fallback, **picked}
    return [picked[k] for k in sorted(picked)]


CASES = _op_cases()
# families whose kernels have no ONNX mapping (UnsupportedOp names them; checked below)
UNSUPPORTED = {"linalg.cholesky", "linalg.eigvalsh", "linalg.inv", "linalg.matrix_rank", "linalg.pinv",
               "linalg.qr", "linalg.slogdet", "linalg.solve", "linalg.svd", "linalg.svdvals",
               "searchsorted", "mask", "unique_values", "unique_counts",
               "unique_inverse", "nonzero"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_case(case, tmp_path):
    from op_cases import make_tensors

    tensors = make_tensors(ember, case, "numpy")

    def fn(*ts):
        return case.ember_fn(ember, *ts)

    path = tmp_path / "op.onnx"
    fam = case.id.split("/")[0]
    try:
        try:
            ember.onnx.export(fn, tuple(tensors), path)
        except UnsupportedOp as e:
            if "opset 18" not in str(e):
                raise
            ember.onnx.export(fn, tuple(tensors), path, opset=18)    # bitwise ops on integers
    except UnsupportedOp as e:
        assert fam in UNSUPPORTED, f"{case.id}: {e}"
        return
    assert fam not in UNSUPPORTED, f"{case.id} exports now: take it off UNSUPPORTED"
    sess = _session(path)
    feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), tensors)}
    got = sess.run(None, feeds)
    with ember.no_grad():
        want = fn(*tensors)
    want = want if isinstance(want, (tuple, list)) else [want]
    for g, w in zip(got, want):
        w = w.numpy()
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=case.rtol or 1e-5, atol=max(case.atol or 0, 1e-5))
        else:
            np.testing.assert_array_equal(g, w)


# ---- behaviour -------------------------------------------------------------------------------------------

def test_unsupported_op_is_named():
    with pytest.raises(UnsupportedOp, match="linalg_inv"):
        ember.onnx.export(lambda a: ember.linalg.inv(a), (ember.eye(3) * 2.0,), None)


def test_branching_on_a_dynamic_axis_is_refused():
    def f(x):
        return x * 2.0 if x.shape[0] < 3 else x - 1.0

    with pytest.raises(UnsupportedOp, match="branches"):
        ember.onnx.export(f, (ember.ones((2, 3)),), None, dynamic_axes={"x": [0]})


def test_external_data(tmp_path, monkeypatch):
    """Above the limit (2 GB; lowered here) the weights go to ``<file>.data`` beside the model."""
    monkeypatch.setattr(exporter, "EXTERNAL_LIMIT", 1000)
    lin = ember.nn.Linear(64, 32).to("numpy").eval()
    path = tmp_path / "lin.onnx"
    r = ember.onnx.export(lin, ember.ones((2, 64)), path)
    assert r["external"] == "lin.onnx.data" and (tmp_path / "lin.onnx.data").stat().st_size >= 64 * 32 * 4
    assert os.path.getsize(path) < 2000
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    want = _check(path, lin, {"x": x})[0]
    np.testing.assert_allclose(ember.onnx.load(str(path))(ember.from_numpy(x)).numpy(), want, rtol=1e-5, atol=1e-6)


def test_names_opset_and_bytes():
    r = ember.onnx.export(lambda a, b: (a + b, a * b), (ember.ones((2,)), ember.ones((2,))), None,
                          opset=18, output_names=["s", "p"])
    m = onnx.load_from_string(r["bytes"])
    assert [o.name for o in m.graph.output] == ["s", "p"] and m.opset_import[0].version == 18
    with pytest.raises(ValueError, match="opset"):
        ember.onnx.export(lambda a: a, (ember.ones((2,)),), None, opset=11)
    with pytest.raises(ValueError, match="dynamic_axes"):
        ember.onnx.export(lambda a: a, (ember.ones((2,)),), None, dynamic_axes={"nope": [0]})


def test_softmax_reductions_opset_18_and_21(tmp_path):
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)

    def f(a):
        return ember.softmax(a, axis=-1) + a.max(axis=0) + ember.rms_norm(a, ember.ones((4,)), eps=1e-5)

    for opset in (18, 21):
        path = tmp_path / f"o{opset}.onnx"
        ember.onnx.export(f, ember.from_numpy(x), path, opset=opset)
        _check(path, f, {"a": x})


PYODIDE_DRIVER = '''
import json, sys
import ember, ember.onnx
from ember import nn
ember.manual_seed(3)
net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                    nn.Linear(4 * 4 * 4, 5), nn.Softmax(dim=-1)).eval()
x = ember.tensor([[[[((i * 7 + j * 3) % 11) / 5.0 - 1.0 for j in range(8)] for i in range(8)]]])
r = ember.onnx.export(net, x, "/io/net.onnx", input_names=["x"], dynamic_axes={"x": [0]})
ember.save(net, "/io/net.safetensors")
json.dump({"numpy": "numpy" in sys.modules, "y": net(x).tolist(), "ops": r["ops"]}, open("/io/out.json", "w"))
'''


def test_export_and_save_in_pyodide(tmp_path_factory):
    """Inside Pyodide (no numpy, no onnx package): export and ember.save write files that
    onnxruntime and ember.load read here."""
    from test_pyodide import _wheel, need_node, run_driver

    node = need_node()
    io = tmp_path_factory.mktemp("export-pyodide-io")
    proc = run_driver(node, _wheel(tmp_path_factory), io, PYODIDE_DRIVER, {io: "/io"})
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    out = __import__("json").loads((io / "out.json").read_text())
    assert not out["numpy"] and "Conv" in out["ops"]
    x = np.array([[[[((i * 7 + j * 3) % 11) / 5.0 - 1.0 for j in range(8)] for i in range(8)]]], np.float32)
    got = _session(io / "net.onnx").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, np.array(out["y"], np.float32), rtol=1e-5, atol=1e-6)
    back = ember.load(str(io / "net.safetensors"), device="numpy")
    with ember.no_grad():
        np.testing.assert_allclose(back(ember.from_numpy(np.concatenate([x, x]))).numpy()[1], got[0],
                                   rtol=1e-5, atol=1e-6)
