"""Whole models exported from PyTorch once (tests/fixtures/onnx, see make_onnx_fixtures.py):
a small MNIST CNN (with a dynamic batch and a Shape->Reshape flatten), its external-data
variant, and a transformer encoder block (LayerNorm, 4-head attention, GELU, residuals; dynamic
batch and sequence). Each runs through the run-time loader on every backend and through the
generated code (``ember import``), against onnxruntime."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import ember
import ember.onnx
from ember.errors import OnnxError, ShapeError
from onnx_helpers import import_generated, reference

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "onnx")
MODELS = {
    "mnist_cnn": ("image", (3, 1, 28, 28)),
    "mnist_cnn_ext": ("image", (2, 1, 28, 28)),
    "encoder_block": ("tokens", (2, 6, 32)),
}


def _data(name, shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _ref(name, x):
    with open(os.path.join(FIX, name + ".onnx"), "rb") as f:
        raw = f.read()
    if name.endswith("_ext"):
        import onnxruntime as ort
        sess = ort.InferenceSession(os.path.join(FIX, name + ".onnx"), providers=["CPUExecutionProvider"])
        return sess.run(None, {MODELS[name][0]: x})[0]
    return reference(raw, {MODELS[name][0]: x})[0]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_runtime_loader(name, device):
    inp, shape = MODELS[name]
    x = _data(name, shape)
    model = ember.onnx.load(os.path.join(FIX, name + ".onnx"), device=device)
    assert model.input_names == [inp]
    y = model(ember.from_numpy(x, device=device))
    assert y.device == device
    np.testing.assert_allclose(y.numpy(), _ref(name, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["mnist_cnn", "encoder_block"])
def test_dynamic_dims(name):
    """Symbolic batch/sequence dims: one loaded model serves several sizes (nothing that depends
    on them was folded)."""
    inp, shape = MODELS[name]
    model = ember.onnx.load(os.path.join(FIX, name + ".onnx"), device="numpy")
    sizes = [(1,) + shape[1:], (4,) + shape[1:]]
    if name == "encoder_block":
        sizes.append((3, 1, 32))
    for s in sizes:
        x = _data(name, s, seed=sum(s))
        np.testing.assert_allclose(model(x).numpy(), _ref(name, x), rtol=1e-4, atol=1e-5)
    with pytest.raises(ShapeError, match=inp):
        model(_data(name, shape[:-1] + (shape[-1] + 1,)))


def test_shape_subgraph_is_folded_with_fixed_shapes():
    m_dyn = ember.onnx.load(os.path.join(FIX, "encoder_block.onnx"), device="python")
    m_fix = ember.onnx.load(os.path.join(FIX, "encoder_block.onnx"), device="python",
                            input_shapes={"tokens": (2, 6, 32)})
    ops_fix = {n.op_type for n in m_fix._plan}
    assert {"Shape", "Gather", "Concat", "Unsqueeze"} & {n.op_type for n in m_dyn._plan}
    assert not {"Shape", "Gather", "Concat", "Unsqueeze", "Constant"} & ops_fix
    x = _data("encoder_block", (2, 6, 32))
    np.testing.assert_allclose(m_fix(x).numpy(), _ref("encoder_block", x), rtol=1e-4, atol=1e-5)


def test_outputs_dict_and_kwargs():
    model = ember.onnx.load(os.path.join(FIX, "mnist_cnn.onnx"), device="numpy")
    x = _data("mnist_cnn", (1, 1, 28, 28))
    out = model.run({"image": x})
    assert list(out) == ["log_probs"]
    np.testing.assert_allclose(model(image=x).numpy(), out["log_probs"].numpy())
    with pytest.raises(OnnxError, match="missing input"):
        model.run({})
    with pytest.raises(OnnxError, match="unknown input"):
        model.run({"image": x, "other": x})


def test_inputs_are_checked_on_every_call_path():
    # positional calls take a shorter path than run(): the same checks must fire on both
    from ember.errors import DTypeError
    model = ember.onnx.load(os.path.join(FIX, "mnist_cnn.onnx"), device="numpy")
    x = _data("mnist_cnn", (1, 1, 28, 28))
    want = model.run({"image": x})["log_probs"].numpy()
    for call in (lambda v: model(v), lambda v: model(image=v), lambda v: model.run({"image": v})["log_probs"]):
        np.testing.assert_array_equal(call(x).numpy(), want)
        np.testing.assert_array_equal(call(ember.tensor(x, device="numpy")).numpy(), want)
        np.testing.assert_array_equal(call(ember.tensor(x, device="python")).numpy(), want)
        np.testing.assert_array_equal(call(x.tolist()).numpy(), want)
        with pytest.raises(ShapeError, match="expected shape"):
            call(_data("mnist_cnn", (1, 1, 28, 27)))
        with pytest.raises(ShapeError, match="expected shape"):
            call(x[0])
        with pytest.raises(ShapeError, match="expected shape"):
            call(x[..., None])            # (every declared dimension matches: the rank does not)
        with pytest.raises(DTypeError, match="expected float32"):
            call(ember.tensor(x.astype("int32"), device="numpy"))
    with pytest.raises(OnnxError, match="takes 1 inputs"):
        model(x, x)
    with pytest.raises(OnnxError, match="given twice"):
        model(x, image=x)
    with pytest.raises(OnnxError, match="missing input"):
        model()
    with pytest.raises(OnnxError, match="missing input"):
        model(other=x)
    with pytest.raises(OnnxError, match="unknown input"):
        model(image=x, other=x)


# ---- external data --------------------------------------------------------------------------

def test_external_data_from_bytes_needs_its_file(tmp_path):
    with open(os.path.join(FIX, "mnist_cnn_ext.onnx"), "rb") as f:
        raw = f.read()
    with pytest.raises(OnnxError, match="mnist_cnn_ext.data"):
        ember.onnx.load(raw)
    with open(os.path.join(FIX, "mnist_cnn_ext.data"), "rb") as f:
        blob = f.read()
    x = _data("mnist_cnn_ext", (2, 1, 28, 28))
    m1 = ember.onnx.load(raw, device="numpy", external_data={"mnist_cnn_ext.data": blob})
    m2 = ember.onnx.load(raw, device="numpy", base_dir=FIX)
    want = _ref("mnist_cnn_ext", x)
    np.testing.assert_allclose(m1(x).numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m2(x).numpy(), want, rtol=1e-4, atol=1e-5)


def _ext_model(tmp_path, location, offset=0, length=None, data=b"\0" * 16):
    from ember.onnx.testing import make_model, node, tensor_proto, value_info
    ext = {"location": location, "offset": offset}
    if length is not None:
        ext["length"] = length
    (tmp_path / "w.bin").write_bytes(data)
    raw = make_model([node("Add", ["x", "w"], ["y"])], [value_info("x", 1, (4,))], [value_info("y", 1, (4,))],
                     [tensor_proto("w", [4], 1, external=ext)])
    p = tmp_path / "m.onnx"
    p.write_bytes(raw)
    return str(p)


def test_external_data_checks(tmp_path):
    import struct
    data = struct.pack("<6f", 9, 1, 2, 3, 4, 9)
    ok = ember.onnx.load(_ext_model(tmp_path, "w.bin", offset=4, length=16, data=data))
    assert ok(ember.tensor([0.0, 0.0, 0.0, 0.0])).tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(OnnxError, match="past the end"):
        ember.onnx.load(_ext_model(tmp_path, "w.bin", offset=12, length=16, data=data))
    with pytest.raises(OnnxError, match="bytes of data"):
        ember.onnx.load(_ext_model(tmp_path, "w.bin", offset=0, length=8, data=data))
    with pytest.raises(OnnxError, match="outside"):
        ember.onnx.load(_ext_model(tmp_path, "../w.bin", data=data))
    with pytest.raises(OnnxError, match="outside"):
        ember.onnx.load(_ext_model(tmp_path, "/etc/passwd", data=data))
    with pytest.raises(OnnxError, match="does not exist"):
        ember.onnx.load(_ext_model(tmp_path, "nope.bin", data=data))
    with pytest.raises(OnnxError, match="not integers"):
        ember.onnx.load(_ext_model(tmp_path, "w.bin", offset="x", data=data))


def test_external_data_symlink_escape(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"\0" * 16)
    inner = tmp_path / "model"
    inner.mkdir()
    os.symlink(outside / "secret.bin", inner / "link.bin")
    path = _ext_model(inner, "link.bin")
    with pytest.raises(OnnxError, match="outside"):
        ember.onnx.load(path)


# ---- generated code -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen")
    mods = {}
    for name in MODELS:
        mods[name] = import_generated(os.path.join(FIX, name + ".onnx"), str(out / name))
    return mods


@pytest.mark.parametrize("name", sorted(MODELS))
def test_generated_module(name, device, generated):
    mod, info = generated[name]
    inp, shape = MODELS[name]
    x = _data(name, shape, seed=7)
    net = mod.load(device=device)
    assert all(t.device == device for t in net.state_dict().values())
    y = net(ember.from_numpy(x, device=device))
    assert y.device == device
    np.testing.assert_allclose(y.numpy(), _ref(name, x), rtol=1e-4, atol=1e-5)


def test_generated_code_is_readable(generated):
    mod, info = generated["mnist_cnn"]
    src = open(info["module"]).read()
    assert "class MnistCnn(nn.Module):" in src
    assert "ember.conv2d(image, self.conv1_weight, self.conv1_bias, padding=1)  # (batch, 8, 28, 28)" in src
    assert "ember.max_pool2d(" in src and "ember.log_softmax(" in src
    forward = src.split("def forward")[1].split("return")[0]
    # one line per node left after folding, each with a shape comment
    body = [ln for ln in forward.splitlines()[1:] if ln.strip()]
    assert len(body) == info["nodes"]
    assert all("  # (" in ln for ln in body)
    compile(src, info["module"], "exec")


def test_generated_specialised_shapes(tmp_path):
    mod, info = import_generated(os.path.join(FIX, "encoder_block.onnx"), str(tmp_path), name="enc_fixed")
    src = open(info["module"]).read()
    assert "onnxf.reshape" in src          # dynamic: shapes read at run time
    from ember.onnx.codegen import generate
    r = generate(os.path.join(FIX, "encoder_block.onnx"), str(tmp_path / "fixed"), input_shapes={"tokens": (2, 6, 32)},
                 progress=False)
    fixed = open(r["module"]).read()
    assert "onnxf.reshape" not in fixed and "onnxf.shape" not in fixed
    assert "ember.reshape(split, (2, 6, 4, 8))  # (2, 6, 4, 8)" in fixed


def test_generated_weights_are_the_initializers(generated):
    mod, info = generated["mnist_cnn"]
    sd = ember.load_safetensors(info["weights"])
    import onnx
    from onnx import numpy_helper
    m = onnx.load(os.path.join(FIX, "mnist_cnn.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    np.testing.assert_array_equal(sd["conv1_weight"].numpy(), inits["conv1.weight"])
    np.testing.assert_array_equal(sd["fc2_bias"].numpy(), inits["fc2.bias"])


def test_copy_of_generated_package_runs_elsewhere(tmp_path, generated):
    mod, info = generated["mnist_cnn"]
    for p in (info["module"], info["weights"]):
        shutil.copy(p, tmp_path)
    import importlib.util
    spec = importlib.util.spec_from_file_location("moved_mnist", tmp_path / "mnist_cnn.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    x = _data("mnist_cnn", (1, 1, 28, 28))
    y = m.load(device="numpy")(ember.from_numpy(x, device="numpy"))
    np.testing.assert_allclose(y.numpy(), _ref("mnist_cnn", x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("module", ["ember.onnx", "ember.onnx.proto", "ember.onnx.runtime", "ember.onnx.ops",
                                    "ember.onnx.functional", "ember.onnx.testing"])
def test_doctests(module):
    import doctest
    import importlib
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0


def test_symbolic_dim_that_only_one_size_fits():
    """An exporter declared a dim symbolic but baked the example's size into a Reshape: the
    model loads (those nodes are checked at run time only, with a note) and runs for that size,
    like onnxruntime; another size fails at the node, naming it."""
    from onnx import TensorProto, helper, numpy_helper
    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["t"], name="baked"),
                           helper.make_node("Relu", ["t"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([9, 2]), "s")])
    raw = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.warns(UserWarning, match="checked at run time"):
        m = ember.onnx.load(raw, device="numpy")
    x = _data("x", (3, 6))
    np.testing.assert_allclose(m(x).numpy(), reference(raw, {"x": x})[0])
    with pytest.raises(ShapeError, match="'baked'"):
        m(_data("x", (2, 6)))
