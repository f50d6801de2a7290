"""ember.train: DataLoader batching and seeded shuffling, the Learner's fit loop (metrics,
validation, schedulers, early stopping), checkpoints that resume to the same numbers (after
whole epochs and after an interrupt mid-epoch), and the dashboards' output."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest

import ember
from ember import nn
from ember.train import (DataLoader, EarlyStopping, Learner, LogLines, TensorDataset, latest_checkpoint,
                         load_checkpoint, random_split, save_checkpoint, sparkline)


def blobs(n=96, seed=0, device="python"):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    centers = np.array([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    x = centers[y] + rng.standard_normal((n, 2)) * 0.5
    return TensorDataset(ember.tensor(x.astype(np.float32), device=device), ember.tensor(y, device=device))


def mlp(seed=0, device="python", dropout=0.0):
    ember.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 3)).to(device)


def test_dataloader_batches_and_shuffle():
    ds = TensorDataset(ember.arange(10), ember.arange(10) * 10)
    dl = DataLoader(ds, batch_size=4, drop_last=True)
    assert len(dl) == 2 and [x.tolist() for x, _ in dl] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    sh = DataLoader(ds, batch_size=3, shuffle=True, seed=5)
    e0 = [x.tolist() for x, _ in sh]
    e1 = [x.tolist() for x, _ in sh]
    assert e0 != e1 and sorted(sum(e0, [])) == list(range(10))        # a new order every epoch
    sh.set_epoch(0)
    assert [x.tolist() for x, _ in sh] == e0                           # an epoch's order is fixed by the seed
    assert all((y.numpy() == x.numpy() * 10).all() for x, y in sh)     # the tensors stay aligned
    a, b = random_split(ds, [0.7, 0.3], seed=1)
    assert len(a) == 7 and len(b) == 3 and not set(a.indices) & set(b.indices)
    assert [x.tolist() for x, _ in DataLoader(b, batch_size=3)][0] == sorted(b.indices, key=b.indices.index)

    class Pairs:
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return [float(i), float(i)], i % 2

    xb, yb = next(iter(DataLoader(Pairs(), batch_size=5)))
    assert xb.shape == (5, 2) and yb.tolist() == [0, 1, 0, 1, 0]


def test_fit_learns_and_logs(device):
    if device == "python":
        pass
    train, valid = random_split(blobs(device=device), [72, 24])
    model = mlp(device=device)
    opt = ember.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    sched = ember.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    out = io.StringIO()
    learner = Learner(model, opt, scheduler=sched, dashboard="log", stream=out, grad_clip=5.0)
    h = learner.fit(DataLoader(train, batch_size=16, shuffle=True), epochs=4,
                    valid=DataLoader(valid, batch_size=32))
    assert h["accuracy"][-1] > 0.9 and h["valid_accuracy"][-1] > 0.9
    assert h["loss"][-1] < h["loss"][0]
    assert h["lr"] == [0.2, 0.2, 0.1, 0.1]
    assert all(t > 0 for t in h["throughput"])
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 4 and lines[-1].startswith("epoch 4/4") and "valid_accuracy" in lines[-1]
    ev = learner.evaluate(DataLoader(valid, batch_size=8))
    assert ev["accuracy"] == pytest.approx(h["valid_accuracy"][-1])
    assert model.training                                             # evaluate() restores the mode


def _run(tmp, epochs, resume=False, stop_after=None, dropout=0.3):
    model = mlp(seed=1, dropout=dropout)
    opt = ember.optim.Adam(model.parameters(), lr=0.02)
    sched = ember.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)

    class StopAt(LogLines):
        def __init__(self):
            super().__init__(io.StringIO())
            self.n = 0

        def batch(self, *a):
            self.n += 1

        def stop_requested(self):
            return stop_after is not None and self.n >= stop_after

    learner = Learner(model, opt, scheduler=sched, checkpoint_dir=tmp, dashboard=StopAt())
    ember.manual_seed(123)   # dropout masks
    learner.fit(DataLoader(blobs(), batch_size=16, shuffle=True, seed=3), epochs=epochs, resume=resume)
    return learner


def test_checkpoint_resume_matches_uninterrupted_run(tmp_path):
    full = _run(str(tmp_path / "full"), 5)
    want = {k: v.numpy() for k, v in full.model.state_dict().items()}
    # two epochs, then a new process-like Learner resumes to five
    _run(str(tmp_path / "a"), 2)
    assert os.path.basename(latest_checkpoint(str(tmp_path / "a"))) == "epoch-0002"
    resumed = _run(str(tmp_path / "a"), 5, resume=True)
    for k, v in resumed.model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), want[k], err_msg=k)
    assert resumed.history["loss"] == full.history["loss"] and resumed.history["lr"] == full.history["lr"]
    # stopped mid-epoch (q in the dashboard): a partial checkpoint, then resume
    stopped = _run(str(tmp_path / "b"), 5, stop_after=9)
    assert stopped.stopped_by == "interrupt" and "step" in os.path.basename(latest_checkpoint(str(tmp_path / "b")))
    resumed = _run(str(tmp_path / "b"), 5, resume=True)
    for k, v in resumed.model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), want[k], err_msg=k)
    assert len(os.listdir(tmp_path / "full")) <= 4                    # keep=3 folders + "latest"


def test_ctrl_c_saves_a_checkpoint(tmp_path):
    model = mlp()
    calls = [0]

    def loss_fn(out, y):
        calls[0] += 1
        if calls[0] == 4:
            raise KeyboardInterrupt
        return ember.nn.functional.cross_entropy(out, y)

    out = io.StringIO()
    learner = Learner(model, ember.optim.SGD(model.parameters(), lr=0.1), loss_fn, checkpoint_dir=str(tmp_path),
                      dashboard="log", stream=out)
    learner.fit(DataLoader(blobs(), batch_size=16), epochs=2)
    assert learner.stopped_by == "interrupt" and "checkpoint saved" in out.getvalue()
    st = load_checkpoint(str(tmp_path), mlp(), ember.optim.SGD(mlp().parameters(), lr=0.1))
    assert st["epoch"] == 0 and st["extra"]["batch"] == 3


def test_early_stopping():
    model = mlp()
    learner = Learner(model, ember.optim.SGD(model.parameters(), lr=0.0), dashboard=None,
                      early_stopping=EarlyStopping("loss", patience=2))
    h = learner.fit(DataLoader(blobs(), batch_size=32), epochs=10)
    assert learner.stopped_by == "early_stopping" and len(h["loss"]) == 3


def test_checkpoint_files_and_optimizer_state(tmp_path):
    model = mlp()
    opt = ember.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    x, y = blobs().tensors
    for _ in range(2):
        opt.zero_grad()
        ember.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    path = save_checkpoint(str(tmp_path), model, opt, epoch=7, history={"loss": [1.0, float("nan")]})
    assert sorted(os.listdir(path)) == ["model.safetensors", "optimizer.safetensors", "state.json"]
    sd = ember.load_safetensors(os.path.join(path, "model.safetensors"))
    assert set(sd) == set(model.state_dict())
    m2 = mlp(seed=9)
    o2 = ember.optim.AdamW(m2.parameters(), lr=1.0)
    st = load_checkpoint(path, m2, o2)
    assert st["epoch"] == 7 and st["history"]["loss"][1] != st["history"]["loss"][1]
    assert o2.param_groups[0]["betas"] == (0.8, 0.9) and o2.param_groups[0]["lr"] == 0.01
    for p, q in zip(opt.param_groups[0]["params"], o2.param_groups[0]["params"]):
        assert o2.state[q]["step"] == 2.0
        np.testing.assert_array_equal(opt.state[p]["exp_avg_sq"].numpy(), o2.state[q]["exp_avg_sq"].numpy())


def test_live_dashboard_renders():
    out = io.StringIO()
    model = mlp()
    learner = Learner(model, ember.optim.SGD(model.parameters(), lr=0.1), dashboard="live", stream=out)
    learner.fit(DataLoader(blobs(), batch_size=16), epochs=2)
    text = out.getvalue()
    assert "\x1b[" in text and "epoch   2/2" in text and "ETA" in text and "loss" in text
    assert any(ch in text for ch in "▁▂▃▄▅▆▇█")
    assert sparkline([3, 2, 1]) == "█▄▁" and sparkline([]) == ""


def test_docstring_examples_run():
    import doctest
    import importlib

    for name in ("ember.train", "ember.train.data", "ember.train.learner", "ember.train.checkpoint"):
        result = doctest.testmod(importlib.import_module(name))
        assert result.failed == 0 and result.attempted > 0, name


PYODIDE_DRIVER = '''
import json, sys
sys.path.insert(0, "/repo/tests")
import ember
from ember import nn
from ember.train import DataLoader, Learner, TensorDataset
out = {"version": sys.version.split()[0], "numpy": "numpy" in sys.modules}
for dev in [d for d in ("python", "wasm") if d in ember.devices()]:
    ember.manual_seed(0)
    x = ember.randn(96, 2, device=dev)
    y = (x[:, 0] * x[:, 1] > 0).astype("int64")
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 2)).to(dev)
    opt = ember.optim.Adam(model.parameters(), lr=0.05)
    h = Learner(model, opt, dashboard=None).fit(DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True), 15)
    w = ember.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True, device=dev)
    ember.nn.functional.cross_entropy(w, ember.tensor([1, 0], device=dev)).backward()
    out[dev] = {"loss0": h["loss"][0], "loss": h["loss"][-1], "accuracy": h["accuracy"][-1], "grad": w.grad.tolist()}
json.dump(out, open("/io/train.json", "w"))
'''


def test_training_runs_in_pyodide(tmp_path_factory):
    """Autodiff, optim and the Learner inside Pyodide (no numpy), on python and wasm."""
    import json

    from test_pyodide import REPO, _wheel, need_node, run_driver

    node = need_node()
    wheel = _wheel(tmp_path_factory)
    io_dir = tmp_path_factory.mktemp("pyodide-train")
    proc = run_driver(node, wheel, io_dir, PYODIDE_DRIVER, {REPO / "tests": "/repo/tests", io_dir: "/io"})
    assert proc.returncode == 0 and (io_dir / "train.json").exists(), proc.stderr[-4000:]
    res = json.loads((io_dir / "train.json").read_text())
    assert res["version"].startswith("3.14") and not res["numpy"]
    x = np.array([[1.0, -2.0], [0.5, 3.0]])
    p = np.exp(x) / np.exp(x).sum(1, keepdims=True)
    want = (p - np.eye(2)[[1, 0]]) / 2
    for dev in ("python", "wasm"):
        assert dev in res, f"{dev} did not run in Pyodide"
        r = res[dev]
        assert r["loss"] < 0.5 * r["loss0"] and r["accuracy"] > 0.9, (dev, r)
        np.testing.assert_allclose(r["grad"], want, rtol=1e-5, atol=1e-6)


def test_plateau_scheduler_in_fit_and_checkpoint(tmp_path):
    model = mlp()
    opt = ember.optim.SGD(model.parameters(), lr=0.8)
    sched = ember.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
    flat = lambda out, y: (out * 0.0).sum() + 1.0             # noqa: E731  (a loss that never improves)
    learner = Learner(model, opt, flat, scheduler=sched, dashboard=None, checkpoint_dir=str(tmp_path))
    h = learner.fit(DataLoader(blobs(), batch_size=96), epochs=4)
    assert h["lr"] == [0.8, 0.8, 0.4, 0.2] and opt.param_groups[0]["lr"] == 0.1
    sched2 = ember.optim.lr_scheduler.ReduceLROnPlateau(ember.optim.SGD(mlp().parameters(), lr=1.0))
    st = load_checkpoint(str(tmp_path), mlp(), None, sched2)
    assert st["epoch"] == 4 and sched2.best == 1.0 and sched2.last_epoch == 4
