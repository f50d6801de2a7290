"""``python -m ember.examples regression``: an MLP predicts diabetes progression from ten
baseline variables (442 patients; ``diabetes.csv`` here, from scikit-learn, Efron et al. 2004).

The data goes through ``ember.train``'s dataset API: ``CsvDataset`` reads the CSV with typed
columns, ``split`` shuffles deterministically and cuts 80/20, the features are standardised with
the training rows' mean and deviation (a ``map`` transform), ``to_tensors`` collates once, and the
``Learner`` trains with ``DataLoader``s. The loss is the mean squared error of the standardised
target; the report gives the validation error in the target's own units and R².
"""
from __future__ import annotations

import argparse
import math

import ember
from ember import nn
from ember.train import CsvDataset, DataLoader, Learner

from . import data_path

FEATURES = ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6"]
TARGET = "progression"
TYPES = {"age": int, "sex": int, "bmi": float, "bp": float, "s1": int, "s2": float, "s3": float,
         "s4": float, "s5": float, "s6": int, "progression": int}


def load(path: str | None = None, seed: int = 0):
    """(train, valid, stats): the CSV split 80/20 with ``seed``; ``stats[col] = (mean, std)`` of
    the training rows."""
    ds = CsvDataset(path or data_path("diabetes.csv"), columns=TYPES)
    train, valid = ds.split(0.8, seed=seed)
    stats = {}
    for c in FEATURES + [TARGET]:
        v = train.column(c)
        m = sum(v) / len(v)
        stats[c] = (m, math.sqrt(sum((x - m) ** 2 for x in v) / len(v)) or 1.0)
    return train, valid, stats


def standardise(stats):
    """The transform: a row -> ([standardised features], [standardised target])."""
    def f(row):
        return ([(row[c] - stats[c][0]) / stats[c][1] for c in FEATURES],
                [(row[TARGET] - stats[TARGET][0]) / stats[TARGET][1]])
    return f


def run(*, epochs: int = 60, hidden: int = 32, lr: float = 3e-3, batch: int = 32, seed: int = 0,
        device: str | None = None, dashboard="auto", path: str | None = None) -> dict:
    """Train and return {history, valid_rmse (target units), valid_r2, rows}."""
    device = device or ("numpy" if "numpy" in ember.devices() else "python")
    ember.manual_seed(seed)
    train, valid, stats = load(path, seed)
    tr = train.map(standardise(stats)).to_tensors(device=device)
    va = valid.map(standardise(stats)).to_tensors(device=device)
    model = nn.Sequential(nn.Linear(len(FEATURES), hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                          nn.Linear(hidden, 1)).to(device)
    opt = ember.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-3)
    learner = Learner(model, opt, nn.functional.mse_loss, dashboard=dashboard)
    history = learner.fit(DataLoader(tr, batch_size=batch, shuffle=True, seed=seed), epochs=epochs,
                          valid=DataLoader(va, batch_size=256))
    with ember.no_grad():
        pred = model.eval()(va.tensors[0]).reshape((-1,)).tolist()
    sd, mean = stats[TARGET][1], stats[TARGET][0]
    truth = [r[TARGET] for r in valid]
    pred = [p * sd + mean for p in pred]
    sse = sum((p - t) ** 2 for p, t in zip(pred, truth))
    tm = sum(truth) / len(truth)
    sst = sum((t - tm) ** 2 for t in truth)
    return {"history": history, "valid_rmse": math.sqrt(sse / len(truth)), "valid_r2": 1 - sse / sst,
            "rows": (len(train), len(valid)), "types": dict(train.dataset.types)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ember.examples regression", description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--quick", action="store_true", help="5 epochs (a smoke test)")
    ap.add_argument("--device", default=None, help="python, numpy, wasm, webgpu (default: numpy if installed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", default=None, help="another CSV with the same columns")
    a = ap.parse_args(argv)
    r = run(epochs=5 if a.quick else a.epochs, device=a.device, seed=a.seed, path=a.csv)
    print(f"{r['rows'][0]} training rows, {r['rows'][1]} validation rows; columns: "
          + ", ".join(f"{k}:{t.__name__}" for k, t in r["types"].items()))
    print(f"validation: RMSE {r['valid_rmse']:.1f} (target units; its deviation is ~77), R^2 {r['valid_r2']:.3f}")
    return 0
