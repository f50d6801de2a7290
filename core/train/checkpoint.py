"""Checkpoints: the model, the optimizer and the scheduler as safetensors + JSON, in one folder
per save (``<dir>/epoch-0003/``), and ``latest`` to resume from.

Layout of a checkpoint folder: ``model.safetensors`` (the state_dict, PyTorch key names, so it
also loads with ``Module.load_state_dict`` or PyTorch tooling), ``optimizer.safetensors`` (the
optimizer's per-parameter tensors, keys ``<param index>.<name>``) and ``state.json`` (optimizer
param groups and scalar state, scheduler state, epoch, step, metrics history, ember's random
generator state, and anything passed as ``extra``).

>>> import tempfile, ember
>>> from ember import nn
>>> from ember.train import save_checkpoint, load_checkpoint
>>> m = nn.Linear(2, 1); opt = ember.optim.Adam(m.parameters())
>>> d = tempfile.mkdtemp()
>>> path = save_checkpoint(d, m, opt, epoch=1)
>>> m2 = nn.Linear(2, 1); opt2 = ember.optim.Adam(m2.parameters())
>>> load_checkpoint(d, m2, opt2)["epoch"], m2.weight.tolist() == m.weight.tolist()
(1, True)
"""
from __future__ import annotations

import json
import os

from .. import random as _random
from ..io.safetensors import load_safetensors, save_safetensors
from ..tensor import Tensor

__all__ = ["save_checkpoint", "load_checkpoint", "latest_checkpoint"]


def _jsonable(v):
    if isinstance(v, tuple):
        return {"__tuple__": [_jsonable(x) for x in v]}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, float) and v != v:
        return {"__float__": "nan"}
    if isinstance(v, float) and v in (float("inf"), float("-inf")):
        return {"__float__": "inf" if v > 0 else "-inf"}
    return v


def _unjson(v):
    if isinstance(v, dict):
        if "__tuple__" in v and len(v) == 1:
            return tuple(_unjson(x) for x in v["__tuple__"])
        if "__float__" in v and len(v) == 1:
            return float(v["__float__"])
        return {k: _unjson(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_unjson(x) for x in v]
    return v


def save_checkpoint(directory: str, model, optimizer=None, scheduler=None, *, epoch: int = 0, step: int = 0,
                    history=None, extra: dict | None = None, keep: int | None = None) -> str:
    """Write a checkpoint folder ``<directory>/epoch-<epoch>`` (replacing one of that name) and
    point ``<directory>/latest`` at it; ``keep`` keeps only the newest ``keep`` folders.
    Returns the folder's path."""
    os.makedirs(directory, exist_ok=True)
    name = f"epoch-{epoch:04d}" + (f"-step-{step}" if extra and extra.get("partial") else "")
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    save_safetensors({k: v for k, v in model.state_dict().items()}, os.path.join(tmp, "model.safetensors"))
    state = {"epoch": epoch, "step": step, "history": history or {}, "extra": extra or {},
             "rng": _jsonable(_random.seed_state())}
    if optimizer is not None:
        sd = optimizer.state_dict()
        tensors, scalars = {}, {}
        for idx, st in sd["state"].items():
            for k, v in st.items():
                if isinstance(v, Tensor):
                    tensors[f"{idx}.{k}"] = v
                else:
                    scalars.setdefault(str(idx), {})[k] = v
        if tensors:
            save_safetensors(tensors, os.path.join(tmp, "optimizer.safetensors"))
        state["optimizer"] = {"param_groups": sd["param_groups"], "scalars": scalars, "type": type(optimizer).__name__}
    if scheduler is not None:
        state["scheduler"] = {"state": scheduler.state_dict(), "type": type(scheduler).__name__}
    with open(os.path.join(tmp, "state.json"), "w") as fh:
        json.dump(_jsonable(state), fh, indent=1)
    if os.path.exists(path):
        import shutil
        shutil.rmtree(path)
    os.replace(tmp, path)
    with open(os.path.join(directory, "latest"), "w") as fh:
        fh.write(name + "\n")
    if keep is not None:
        import shutil
        olds = sorted(d for d in os.listdir(directory) if d.startswith("epoch-") and not d.endswith(".tmp"))
        for d in olds[:-keep] if keep > 0 else olds:
            if d != name:
                shutil.rmtree(os.path.join(directory, d), ignore_errors=True)
    return path


def latest_checkpoint(directory: str) -> str | None:
    """The newest checkpoint folder in ``directory`` (None if there is none)."""
    marker = os.path.join(directory, "latest")
    if os.path.exists(marker):
        with open(marker) as fh:
            p = os.path.join(directory, fh.read().strip())
        if os.path.isdir(p):
            return p
    if not os.path.isdir(directory):
        return None
    cands = sorted(d for d in os.listdir(directory) if d.startswith("epoch-") and not d.endswith(".tmp"))
    return os.path.join(directory, cands[-1]) if cands else None


def load_checkpoint(path: str, model, optimizer=None, scheduler=None, *, restore_rng: bool = True) -> dict:
    """Load a checkpoint folder (or the latest one of a directory of them) into ``model``,
    ``optimizer`` and ``scheduler`` (each optional); returns the JSON state (epoch, step,
    history, extra)."""
    if not os.path.exists(os.path.join(path, "state.json")):
        p = latest_checkpoint(path)
        if p is None:
            raise FileNotFoundError(f"load_checkpoint: no checkpoint in {path!r}")
        path = p
    with open(os.path.join(path, "state.json")) as fh:
        state = _unjson(json.load(fh))
    device = next((p.device for p in model.parameters()), None)
    sd = load_safetensors(os.path.join(path, "model.safetensors"), device=device)
    model.load_state_dict({k: sd[k] for k in sd})
    if optimizer is not None and "optimizer" in state:
        o = state["optimizer"]
        opt_state = {}
        tpath = os.path.join(path, "optimizer.safetensors")
        if os.path.exists(tpath):
            ts = load_safetensors(tpath, device=device)
            for key in ts:
                idx, name = key.split(".", 1)
                opt_state.setdefault(int(idx), {})[name] = ts[key]
        for idx, sc in o["scalars"].items():
            opt_state.setdefault(int(idx), {}).update(sc)
        optimizer.load_state_dict({"state": opt_state, "param_groups": o["param_groups"]})
    if scheduler is not None and "scheduler" in state:
        scheduler.load_state_dict(state["scheduler"]["state"])
    if restore_rng and "rng" in state:
        rng = state["rng"]
        _random.set_state((rng[0], tuple(rng[1]), rng[2]))
    state["path"] = path
    return state
