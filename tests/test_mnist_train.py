"""demos/mnist/train.py (ember alone, no torch) and demos/train/app.py (the training page's
Python), on the committed MNIST subset demos/train/data/ (6,000 + 1,000 digits, IDX files).

Same seed -> bit-identical weights on numpy; the CLI writes the metadata and the golden logits
(ember's numpy forward of the written weights) and refuses weights under its accuracy bar; the
augmentation is PyTorch's affine_grid + grid_sample (checked against torch where installed);
the page's module trains, evaluates, predicts and round-trips its weights through safetensors.
"""
from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import sys
from pathlib import Path

import pytest

import ember

REPO = Path(__file__).resolve().parent.parent
MNIST = REPO / "demos" / "mnist"
SUBSET = REPO / "demos" / "train" / "data"

np = pytest.importorskip("numpy")


def _load(name: str, path: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


train = _load("ember_demo_mnist_train", MNIST / "train.py")


def _cli(tmp: Path, name: str, *extra):
    """Start train.py on 256 digits of the subset, one epoch of batch 64, in its own process:
    OpenBLAS's thread pool must be sized before numpy loads (``--threads 1``; a spinning pool
    on a busy machine is several times slower), which this process did long ago."""
    import subprocess

    out, digits = tmp / f"{name}.safetensors", tmp / f"{name}.json"
    cmd = [sys.executable, str(MNIST / "train.py"), "--data", str(SUBSET), "--limit", "256", "--epochs", "1",
           "--batch", "64", "--threads", "1", "--out", str(out), "--digits-out", str(digits), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out, digits


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (returncode, stderr, weights path, digits path)} of four CLI runs, two at a time."""
    tmp = tmp_path_factory.mktemp("mnist_train")
    plan = {"a": ("--seed", "3", "--min-accuracy", "0"), "b": ("--seed", "3", "--min-accuracy", "0"),
            "c": ("--seed", "4", "--min-accuracy", "0"), "bar": ("--seed", "3")}
    done = {}
    names = list(plan)
    for i in range(0, len(names), 2):
        started = {n: _cli(tmp, n, *plan[n]) for n in names[i:i + 2]}
        for n, (proc, out, digits) in started.items():
            _, err = proc.communicate(timeout=300)
            done[n] = (proc.returncode, err, out, digits)
    return done


def _weights(path) -> dict:
    # tolist() of float32 values is exact: equal lists are bit-identical weights
    return {k: v.tolist() for k, v in ember.load_safetensors(str(path)).items()}


def test_train_py_needs_no_torch():
    tree = ast.parse((MNIST / "train.py").read_text())
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not mods & {"torch", "torchvision", "safetensors"}, mods


def test_same_seed_gives_bit_identical_weights(runs):
    for n in "abc":
        assert runs[n][0] == 0, runs[n][1]
    a, b, c = (_weights(runs[n][2]) for n in "abc")
    assert sorted(a) == sorted(train.model_module().MnistNet().state_dict())
    assert a == b, "two runs with the same seed gave different weights"
    assert a != c, "a different seed gave the same weights"


def test_augment_is_torch_affine_grid_and_grid_sample():
    torch = pytest.importorskip("torch")
    import random

    imgs = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
    got = np.asarray(train.augment(ember.tensor(imgs, device="numpy"), random.Random(5)).tolist())
    theta = torch.tensor(train.affine_params(random.Random(5), 3), dtype=torch.float32)
    grid = torch.nn.functional.affine_grid(theta, [3, 1, 28, 28], align_corners=False)
    want = torch.nn.functional.grid_sample(torch.from_numpy(imgs), grid, align_corners=False).numpy()
    assert np.abs(got - want).max() < 1e-5


def test_cli_writes_metadata_and_golden_logits(runs):
    # The default bar (99.2% test accuracy) is far above one epoch on 256 digits: nothing written.
    code, err, out, _ = runs["bar"]
    assert code == 1 and "NOT written" in err and not out.exists()
    code, err, out, digits = runs["a"]
    assert code == 0, err
    sd = ember.load_safetensors(str(out))
    meta = sd.metadata
    assert meta["epochs"] == "1" and meta["seed"] == "3" and meta["device"] == "numpy"
    assert 0.0 < float(meta["test_accuracy"]) <= 1.0 and meta["date"].count("-") == 2
    assert meta["trainer"].startswith("ember ")
    doc = json.loads(digits.read_text())
    assert "ember" in doc["golden"]["producer"] and "numpy" in doc["golden"]["producer"]
    mdl = train.model_module()
    net = mdl.load_model(str(out), device="numpy")
    imgs = [bytes.fromhex(h) for h in doc["images_hex"][:doc["golden"]["count"]]]
    got = mdl.logits(net, imgs, device="numpy")
    assert max(abs(a - b) for g, r in zip(doc["golden"]["logits"], got) for a, b in zip(g, r)) < 1e-5


def test_training_page_module_trains_predicts_and_exports():
    sys.path.insert(0, str(MNIST))      # app.py imports demos/mnist/mnist_idx.py, as in the page
    app = _load("ember_demo_train_app", REPO / "demos" / "train" / "app.py")
    info = app.setup(str(SUBSET))
    assert (info["train"], info["test"]) == (6000, 1000)
    app.reset("cpu", batch=16, seed=0, total_steps=12)
    r = asyncio.run(app.steps(12))
    assert len(r["losses"]) == 12 and r["step"] == 12 and r["losses"][-1] < r["losses"][0]
    acc = asyncio.run(app.evaluate(limit=100))
    assert acc["count"] == 100 and 0.0 <= acc["accuracy"] <= 1.0
    px = [b / 255 for b in app.S.data["test"][0][:784]]
    p = asyncio.run(app.predict(px))
    assert len(p["probs"]) == 10 and abs(sum(p["probs"]) - 1) < 1e-5
    sd = ember.load_safetensors(app.weights())
    assert sd.metadata["steps"] == "12"
    net = app.TrainNet()
    net.load_state_dict(sd, strict=True)
    probs = ember.softmax(net.eval()(ember.tensor(px, dtype="float32").reshape((1, 1, 28, 28))), axis=-1).tolist()[0]
    assert max(abs(a - b) for a, b in zip(probs, p["probs"])) < 1e-5
    with pytest.raises(ValueError, match="784"):
        asyncio.run(app.predict([0.0] * 10))
    with pytest.raises(ValueError, match="unknown backend"):
        app.reset("tpu")
