"""``Learner``: the fit loop (Burn's Learner, in PyTorch's vocabulary).

``Learner(model, optimizer, loss_fn, scheduler=...).fit(train_loader, epochs, valid_loader)``
trains with the given optimizer and scheduler (stepped per epoch or per batch;
``ReduceLROnPlateau`` on each epoch's validation loss, or training loss without validation), optional
gradient clipping, records the metrics of every epoch in ``history`` (loss, accuracy,
valid_loss, valid_accuracy, lr, throughput in samples/s, seconds; no accuracies when the
targets are floats, a regression), saves a checkpoint after
every epoch when ``checkpoint_dir`` is set (``fit(..., resume=True)`` continues from the
latest, to the same batches and the same numbers), stops early on a stalled metric, and shows
a live dashboard on a terminal (plain lines elsewhere). ``q`` or Ctrl+C saves a checkpoint of
where training is (mid-epoch included) and returns cleanly.

>>> import ember
>>> from ember import nn
>>> from ember.train import DataLoader, Learner, TensorDataset
>>> ember.manual_seed(0)
>>> x = ember.randn(64, 2)
>>> y = (x[:, 0] > 0).astype("int64")
>>> model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
>>> learner = Learner(model, ember.optim.Adam(model.parameters(), lr=0.05), dashboard=None)
>>> history = learner.fit(DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True), epochs=8)
>>> history["accuracy"][-1] > 0.9
True
"""
from __future__ import annotations

import time

import ember

from ..optim.lr_scheduler import ReduceLROnPlateau
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .dashboard import make_dashboard

__all__ = ["Learner", "EarlyStopping", "accuracy"]


def accuracy(output, target) -> int:
    """How many rows of ``output`` (N, C, ...) have their argmax over axis 1 at ``target``."""
    if output.ndim < 2 or target.dtype.kind not in "iu":
        return 0
    return int((ember.argmax(output, axis=1) == target).astype("int64").sum().item())


class EarlyStopping:
    """Stop when ``monitor`` (a history key, ``valid_loss`` by default) has not improved by more
    than ``min_delta`` for ``patience`` epochs (``mode="max"`` for accuracies)."""

    def __init__(self, monitor: str = "valid_loss", patience: int = 3, mode: str = "min", min_delta: float = 0.0):
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping: mode must be 'min' or 'max', got {mode!r}")
        self.monitor, self.patience, self.mode, self.min_delta = monitor, patience, mode, min_delta
        self.best = None
        self.bad_epochs = 0

    def update(self, value: float) -> bool:
        """Record one epoch's value; True when training should stop."""
        better = self.best is None or (value < self.best - self.min_delta if self.mode == "min"
                                       else value > self.best + self.min_delta)
        if better:
            self.best, self.bad_epochs = value, 0
        else:
            self.bad_epochs += 1
        return self.bad_epochs >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "bad_epochs": self.bad_epochs}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.bad_epochs = state.get("best"), state.get("bad_epochs", 0)


class _Stop(Exception):
    pass


class Learner:
    """Train ``model`` with ``optimizer`` on ``loss_fn(output, target)`` (default
    ``cross_entropy``). Batches are ``(input, target)`` pairs (more items are ignored)."""

    def __init__(self, model, optimizer, loss_fn=None, scheduler=None, *, scheduler_step: str = "epoch",
                 device: str | None = None, grad_clip: float | None = None, early_stopping: EarlyStopping | None = None,
                 checkpoint_dir: str | None = None, keep_checkpoints: int | None = 3, dashboard="auto",
                 log_every: int | None = None, stream=None, compile: bool = False) -> None:
        if scheduler_step not in ("epoch", "batch"):
            raise ValueError(f"scheduler_step must be 'epoch' or 'batch', got {scheduler_step!r}")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.loss_fn = loss_fn or ember.nn.functional.cross_entropy
        self.scheduler_step, self.device, self.grad_clip = scheduler_step, device, grad_clip
        self.early_stopping, self.checkpoint_dir, self.keep = early_stopping, checkpoint_dir, keep_checkpoints
        self.dashboard, self.log_every, self.stream = dashboard, log_every, stream
        self.history: dict = {}
        self.epoch = 0
        self.stopped_by = None          # "early_stopping", "interrupt" or None
        self._batches = 0
        # compile=True: each training step replays an ember.compile plan (forward, backward,
        # clipping, the optimizer's and a per-batch scheduler's steps) after its first batches
        self._train_step = ember.compile(self.train_step) if compile else self.train_step

    # ---- pieces ----------------------------------------------------------------------------------
    def _to(self, t):
        return t.to(self.device) if self.device is not None and t.device != self.device else t

    def _split(self, batch):
        if isinstance(batch, (tuple, list)):
            return self._to(batch[0]), self._to(batch[1])
        raise TypeError("Learner: batches must be (input, target) pairs")

    def train_step(self, x, y):
        """One optimizer step; returns (loss tensor, output)."""
        self.optimizer.zero_grad()
        out = self.model(x)
        loss = self.loss_fn(out, y)
        loss.backward()
        if self.grad_clip is not None:
            ember.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        if self.scheduler is not None and self.scheduler_step == "batch" and \
                not isinstance(self.scheduler, ReduceLROnPlateau):
            self.scheduler.step()
        return loss, out

    @ember.no_grad()
    def evaluate(self, loader) -> dict:
        """Mean loss and accuracy over ``loader`` in eval mode, without recording."""
        was = self.model.training
        self.model.eval()
        total = correct = 0
        loss_sum = 0.0
        for batch in loader:
            x, y = self._split(batch)
            out = self.model(x)
            n = x.shape[0]
            loss_sum += float(self.loss_fn(out, y).item()) * n
            correct += accuracy(out, y)
            total += n
        self.model.train(was)
        return {"loss": loss_sum / max(total, 1), "accuracy": correct / max(total, 1)}

    def save(self, epoch: int, batch: int = 0, partial: dict | None = None) -> str:
        extra = {"batch": batch, "partial": partial is not None, "sums": partial or {},
                 "early_stopping": self.early_stopping.state_dict() if self.early_stopping else None}
        return save_checkpoint(self.checkpoint_dir, self.model, self.optimizer, self.scheduler, epoch=epoch,
                               step=batch, history=self.history, extra=extra,
                               keep=self.keep)

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # ---- the loop ----------------------------------------------------------------------------------
    def fit(self, train, epochs: int, valid=None, resume: bool = False) -> dict:
        """Train until ``epochs`` epochs are done (counting resumed ones), early stopping, or
        ``q`` / Ctrl+C. Returns ``history``."""
        start, skip, sums = 0, 0, {}
        if resume and self.checkpoint_dir and latest_checkpoint(self.checkpoint_dir):
            st = load_checkpoint(self.checkpoint_dir, self.model, self.optimizer, self.scheduler)
            self.history = {k: list(v) for k, v in st["history"].items()}
            start = st["epoch"]
            ex = st.get("extra") or {}
            skip, sums = (ex.get("batch", 0), ex.get("sums") or {}) if ex.get("partial") else (0, {})
            if self.early_stopping and ex.get("early_stopping"):
                self.early_stopping.load_state_dict(ex["early_stopping"])
        self._batches = len(train) if hasattr(train, "__len__") else 0
        dash = make_dashboard(self.dashboard, self.stream, self.log_every)
        dash.start(self, epochs, self._batches)
        self.stopped_by = None
        epoch, done = start, 0
        seen = correct = 0
        loss_sum = 0.0
        classify = "accuracy" in self.history    # integer targets seen: report accuracy
        try:
            for epoch in range(start, epochs):
                self.epoch = epoch
                if hasattr(train, "set_epoch"):
                    train.set_epoch(epoch)
                self.model.train()
                seen, correct, loss_sum = sums.get("seen", 0), sums.get("correct", 0), sums.get("loss_sum", 0.0)
                train_time = sums.get("time", 0.0)
                sums = {}
                t0 = time.perf_counter()
                done = skip
                for i, batch in enumerate(train):
                    if i < skip:
                        continue
                    x, y = self._split(batch)
                    loss, out = self._train_step(x, y)
                    n = x.shape[0]
                    lv = float(loss.item())
                    loss_sum += lv * n
                    correct += accuracy(out, y)
                    seen += n
                    done = i + 1
                    classify = classify or y.dtype.kind in "iu"
                    bm = {"loss": lv, "accuracy": correct / seen, "lr": self._lr()}
                    if not classify:      # a regression (float targets): no accuracy to show
                        del bm["accuracy"]
                    dash.batch(self, epoch, epochs, i, self._batches, bm)
                    if dash.stop_requested():
                        raise _Stop
                skip = 0
                train_time += time.perf_counter() - t0
                m = {"loss": loss_sum / max(seen, 1), "accuracy": correct / max(seen, 1), "lr": self._lr(),
                     "throughput": seen / max(train_time, 1e-9), "seconds": train_time}
                if valid is not None:
                    v = self.evaluate(valid)
                    m["valid_loss"], m["valid_accuracy"] = v["loss"], v["accuracy"]
                if not classify:
                    m.pop("accuracy")
                    m.pop("valid_accuracy", None)
                if isinstance(self.scheduler, ReduceLROnPlateau):   # steps on the epoch's loss
                    self.scheduler.step(m.get("valid_loss", m["loss"]))
                elif self.scheduler is not None and self.scheduler_step == "epoch":
                    self.scheduler.step()
                for k, val in m.items():
                    self.history.setdefault(k, []).append(val)
                stop = False
                if self.early_stopping is not None:
                    key = self.early_stopping.monitor
                    val = m.get(key, m.get(key.replace("valid_", "")))
                    stop = val is not None and self.early_stopping.update(val)
                if self.checkpoint_dir:
                    self.save(epoch + 1)
                dash.epoch(self, epoch, epochs, m)
                if stop:
                    self.stopped_by = "early_stopping"
                    dash.message(f"early stopping: {self.early_stopping.monitor} has not improved for "
                                 f"{self.early_stopping.patience} epochs")
                    break
        except (KeyboardInterrupt, _Stop):
            self.stopped_by = "interrupt"
            where = ""
            if self.checkpoint_dir:
                part = {"seen": seen, "correct": correct, "loss_sum": loss_sum, "time": 0.0}
                path = self.save(epoch, done, part)
                where = f"; checkpoint saved to {path} (fit(..., resume=True) continues)"
            dash.message(f"stopped in epoch {epoch + 1} after batch {done}{where}")
        finally:
            dash.close()
        return self.history
