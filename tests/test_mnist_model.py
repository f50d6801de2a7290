"""The MNIST demo's model (demos/mnist/model.py) with the shipped weights, on every backend.

References: golden logits for the first 16 MNIST test digits (written once by
demos/mnist/train.py --export-only from the same weights, committed in testdigits.json, and
checked here against PyTorch running the same network on the same weights) and the MNIST
labels themselves.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

import ember
from ember.errors import WeightsError

DEMO = Path(__file__).resolve().parent.parent / "demos" / "mnist"
WEIGHTS = DEMO / "mnist.safetensors"
N_CHECK = 50          # labelled digits predicted per backend
TOL = 1e-4            # vs the golden float32 logits


def _load(name: str, file: str):
    # Loaded by path under a unique name: other demos may have their own model.py.
    spec = importlib.util.spec_from_file_location(name, DEMO / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


mnist = _load("ember_demo_mnist_model", "model.py")
idx = _load("ember_demo_mnist_idx", "mnist_idx.py")
DIGITS = idx.read_testdigits(str(DEMO / "testdigits.json"))


@pytest.fixture(scope="module")
def outputs():
    """{device: logits of the first N_CHECK digits}, computed once per backend."""
    return {}


def _logits(outputs, device):
    if device not in outputs:
        net = mnist.load_model(str(WEIGHTS), device)
        outputs[device] = mnist.logits(net, DIGITS["images"][:N_CHECK], device)
    return outputs[device]


def _softmax(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    s = sum(e)
    return [v / s for v in e]


def test_weights_match_the_model_strictly():
    sd = ember.load_safetensors(str(WEIGHTS))
    net = mnist.MnistNet()
    assert sorted(net.state_dict()) == sorted(sd)
    for name, t in net.state_dict().items():
        assert tuple(t.shape) == tuple(sd[name].shape), name
    net.load_state_dict(sd, strict=True)
    # The trainer refuses to write weights below 99.2% test accuracy; the header says what it got.
    assert float(sd.metadata["test_accuracy"]) >= 0.992


def test_strict_load_rejects_missing_and_unexpected_keys():
    sd = dict(ember.load_safetensors(str(WEIGHTS)))
    missing = {k: v for k, v in sd.items() if k != "fc2.bias"}
    with pytest.raises(WeightsError, match="fc2.bias"):
        mnist.MnistNet().load_state_dict(missing, strict=True)
    extra = dict(sd, **{"fc3.weight": sd["fc2.weight"]})
    with pytest.raises(WeightsError, match="fc3.weight"):
        mnist.MnistNet().load_state_dict(extra, strict=True)


def test_truncated_weights_raise_weights_error():
    raw = WEIGHTS.read_bytes()
    with pytest.raises(WeightsError):
        mnist.load_model(raw[: len(raw) // 2], "python")


def test_golden_logits_are_pytorchs():
    """The committed golden logits are what PyTorch computes with the shipped weights (an
    independent implementation of the same network), so the backends are not checked against
    ember itself."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    sd = {k: torch.tensor(v.numpy()) for k, v in ember.load_safetensors(str(WEIGHTS), device="numpy").items()}
    golden = DIGITS["golden"]["logits"]
    x = torch.tensor([[float(p) / 255.0 for p in img] for img in DIGITS["images"][:len(golden)]]).reshape(-1, 1, 28, 28)

    def bn(x, p):
        return F.batch_norm(x, sd[p + ".running_mean"], sd[p + ".running_var"], sd[p + ".weight"], sd[p + ".bias"],
                            training=False, eps=1e-5)

    with torch.no_grad():
        x = (x - mnist.MEAN) / mnist.STD
        x = F.max_pool2d(F.relu(bn(F.conv2d(x, sd["conv1.weight"], sd["conv1.bias"], padding=1), "bn1")), 2)
        x = F.max_pool2d(F.relu(bn(F.conv2d(x, sd["conv2.weight"], sd["conv2.bias"], padding=1), "bn2")), 2)
        x = F.relu(F.linear(x.flatten(1), sd["fc1.weight"], sd["fc1.bias"]))
        ref = F.linear(x, sd["fc2.weight"], sd["fc2.bias"]).tolist()
    worst = max(abs(a - b) for g, r in zip(golden, ref) for a, b in zip(g, r))
    assert worst <= TOL, f"golden logits differ from PyTorch's by {worst:.2e}"


def test_matches_golden_logits(device, outputs):
    golden = DIGITS["golden"]["logits"]
    got = _logits(outputs, device)[: len(golden)]
    worst = max(abs(a - b) for g, r in zip(golden, got) for a, b in zip(g, r))
    assert worst <= TOL, f"{device}: max |ember - golden| logit difference {worst:.2e} > {TOL}"


def test_predicts_real_test_digits(device, outputs):
    got = _logits(outputs, device)
    labels = DIGITS["labels"][:N_CHECK]
    wrong = [(i, lab, mnist.argmax(r)) for i, (r, lab) in enumerate(zip(got, labels)) if mnist.argmax(r) != lab]
    assert len(wrong) <= N_CHECK * 0.02, f"{device}: misclassified (index, label, predicted): {wrong}"


def test_predict_gives_softmax_probabilities(device):
    net = mnist.load_model(str(WEIGHTS), device)
    img = DIGITS["images"][0]
    probs = mnist.predict(net, [b / 255 for b in img], device)
    want = _softmax(DIGITS["golden"]["logits"][0])
    assert len(probs) == 10 and abs(sum(probs) - 1) < 1e-5
    assert max(abs(a - b) for a, b in zip(probs, want)) < 1e-5
    # bytes and [0, 1] floats are the same image
    assert max(abs(a - b) for a, b in zip(mnist.predict(net, img, device), probs)) < 1e-6
    assert asyncio.run(mnist.predict_async(net, img, device)) == pytest.approx(probs, abs=1e-6)


def test_bad_images_are_rejected():
    with pytest.raises(ValueError, match="image 1: 783 pixels"):
        mnist.images_tensor([[0.0] * 784, [0.0] * 783])


def test_page_app_module(monkeypatch):
    # app.py is what the page runs in Pyodide; it imports the demo's model as `model`.
    monkeypatch.setitem(sys.modules, "model", mnist)
    app = _load("ember_demo_mnist_app", "app.py")
    with pytest.raises(RuntimeError, match="not loaded"):
        app.net("cpu")
    assert app.load(WEIGHTS.read_bytes())["backends"] == ["cpu"]
    px = [b / 255 for b in DIGITS["images"][1]]
    # The CPU backends answer synchronously (a plain dict, no coroutine for the worker to
    # schedule on the event loop): the same probabilities as the model's own predict.
    r = app.predict(px, "cpu")
    assert isinstance(r, dict), type(r)
    assert r["digit"] == DIGITS["labels"][1] and r["backend"] == "cpu" and len(r["probs"]) == 10
    ref = mnist.predict(mnist.load_model(WEIGHTS.read_bytes(), app.DEVICES["cpu"]), px, app.DEVICES["cpu"])
    assert r["probs"] == pytest.approx(ref, abs=1e-6)
    assert app.predict(px, "python")["probs"] == pytest.approx(ref, abs=1e-5)
    with pytest.raises(ValueError, match="784"):
        app.predict([0.0] * 10, "cpu")
    with pytest.raises(ValueError, match="unknown backend"):
        app.predict([0.0] * 784, "tpu")


def test_idx_reader_rejects_malformed_files():
    good = bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9])
    assert idx.parse_idx(good) == ((3,), bytes([7, 8, 9]))
    with pytest.raises(ValueError, match="not an unsigned-byte IDX"):
        idx.parse_idx(bytes([0, 0, 13, 1, 0, 0, 0, 3, 7, 8, 9]))
    with pytest.raises(ValueError, match="2 payload bytes"):
        idx.parse_idx(good[:-1])
    with pytest.raises(ValueError, match="too short"):
        idx.parse_idx(b"\x00")


def test_committed_digits_are_consistent():
    doc = json.loads((DEMO / "testdigits.json").read_text())
    assert len(doc["images_hex"]) == len(doc["labels"]) == 100
    assert all(len(bytes.fromhex(h)) == 784 for h in doc["images_hex"])
    assert doc["labels"][:10] == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]  # MNIST t10k starts like this
