"""``python -m ember.examples``: every example runs a few steps and checks something real (CI
budget: the heavy ones on a few hundred images; numpy backend)."""
import os
import struct
import subprocess
import sys
import zlib

import pytest

import ember
from ember.examples import EXAMPLES, load, source_root

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_numpy = pytest.mark.skipif("numpy" not in ember.devices(), reason="numpy is not installed")


def test_list_command():
    r = subprocess.run([sys.executable, "-m", "ember.examples", "LIST"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in ("mnist", "regression", "wgan", "custom-kernel", "onnx"):
        assert name in EXAMPLES and f"  {name}" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "ember.examples", "nope"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no example 'nope'" in bad.stderr


@needs_numpy
def test_regression_csv_learner_loss_goes_down():
    r = load("regression").run(epochs=6, dashboard=None, device="numpy")
    h = r["history"]
    assert r["rows"] == (354, 88) and r["types"]["bmi"] is float and r["types"]["age"] is int
    assert h["loss"][-1] < 0.8 * h["loss"][0] and h["valid_loss"][-1] < h["valid_loss"][0]
    assert "accuracy" not in h              # float targets: a regression reports no accuracy
    assert r["valid_r2"] > 0.2, r["valid_r2"]


@needs_numpy
def test_mnist_quick_loss_goes_down():
    assert source_root() == ROOT
    r = load("mnist").run(limit=384, test_limit=200, epochs=1, batch=64, augment=False, dashboard=None,
                          device="numpy")
    losses = r["batch_losses"]
    assert len(losses) == 6 and sum(losses[-2:]) < sum(losses[:2]), losses
    assert r["test_accuracy"] > 0.2         # chance is 0.1


@needs_numpy
def test_wgan_input_gradient_and_png(tmp_path):
    wgan = load("wgan")
    ember.manual_seed(0)
    critic = wgan.Critic().to("numpy")
    x = ember.randn(5, 784, device="numpy", requires_grad=True)
    d, gx = critic.forward_with_input_grad(x)
    (want,) = ember.autograd.grad(critic(x).sum(), x)     # the penalty's input gradient is exact
    assert max(abs(a - b) for a, b in zip(gx.reshape((-1,)).tolist(), want.reshape((-1,)).tolist())) < 1e-5
    r = wgan.run(steps=3, critic_steps=3, batch=32, limit=256, device="numpy", out=str(tmp_path / "g.png"), log=None)
    w = r["history"]["wdist"]
    assert all(v == v for v in w) and w[-1] > w[0]        # the critic learns to tell real from fake
    raw = open(r["path"], "rb").read()                    # decode the PNG: size, CRCs, pixel count
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(raw):
        n, kind = struct.unpack(">I4s", raw[pos:pos + 8])
        body = raw[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", raw[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body)
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + n
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (width, height, depth, color) == (242, 242, 8, 0) == (r["png"][0], r["png"][1], 8, 0)
    assert len(zlib.decompress(chunks[b"IDAT"])) == height * (1 + width)


def test_custom_kernel_example():
    r = load("custom-kernel").run(n=1000)
    assert max(r["forward"], r["grad"], r["replay"], r["exact"]) < 1e-5, r
    if r["device"] == "webgpu":
        assert isinstance(r["error"], ember.errors.ShaderError) and r["error"].line == 17
    # the README shows the same kernel
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert load("custom-kernel").GELU_WGSL.strip() in readme


@needs_numpy
def test_onnx_export_import_run(tmp_path):
    r = load("onnx").run(out_dir=str(tmp_path), devices=["numpy"], n=4)
    assert set(r["results"]) >= {("ember.onnx.load", "numpy"), ("ember import", "numpy")}
    assert max(r["results"].values()) < 1e-4, r["results"]
    assert r["accuracy"] == 1.0 and "Conv" in r["export"]["ops"]
