"""In-memory datasets and a DataLoader with seeded shuffling.

``TensorDataset`` keeps whole tensors and the loader slices a batch out of each with one
``take`` per tensor (no Python loop per sample); any other dataset (``__len__`` and
``__getitem__`` returning a tuple of tensors, numbers or arrays) is collated sample by sample.

Shuffling is reproducible and resumable: epoch ``e`` of a loader with ``seed=s`` always visits
the samples in the same order (``random.Random((s, e))``), whatever happened before.

>>> import ember
>>> from ember.train import DataLoader, TensorDataset
>>> ds = TensorDataset(ember.arange(10), ember.arange(10) * 2)
>>> [x.tolist() for x, _ in DataLoader(ds, batch_size=4)]
[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
>>> a = [x.tolist() for x, _ in DataLoader(ds, batch_size=5, shuffle=True, seed=1)]
>>> b = [x.tolist() for x, _ in DataLoader(ds, batch_size=5, shuffle=True, seed=1)]
>>> a == b and sorted(a[0] + a[1]) == list(range(10))
True
"""
from __future__ import annotations

import math
import random

import ember

from ..tensor import Tensor

__all__ = ["Dataset", "TensorDataset", "DataLoader", "random_split"]


class Dataset:
    """A map-style dataset: ``len(ds)`` samples, ``ds[i]`` a tuple."""

    def __len__(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def __getitem__(self, i):  # pragma: no cover - interface
        raise NotImplementedError


class TensorDataset(Dataset):
    """Samples are the rows (axis 0) of equally long tensors (numpy arrays are converted)."""

    def __init__(self, *tensors) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one tensor")
        self.tensors = tuple(t if isinstance(t, Tensor) else ember.tensor(t) for t in tensors)
        n = self.tensors[0].shape[0] if self.tensors[0].ndim else 0
        for t in self.tensors:
            if not t.ndim or t.shape[0] != n:
                raise ValueError(f"TensorDataset: every tensor needs the same length along axis 0, got "
                                 f"{[tuple(x.shape) for x in self.tensors]}")
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return tuple(t[i] for t in self.tensors)

    def batch(self, indices, device=None):
        """The samples at ``indices`` stacked: one gather per tensor."""
        out = []
        for t in self.tensors:
            idx = ember.tensor(indices, dtype=ember.int64, device=t.device)
            b = ember.take(t, idx, axis=0)
            out.append(b.to(device) if device is not None and device != b.device else b)
        return tuple(out)


class _Subset(Dataset):
    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, list(indices)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        return self.dataset[self.indices[i]]

    def batch(self, indices, device=None):
        if hasattr(self.dataset, "batch"):
            return self.dataset.batch([self.indices[i] for i in indices], device)
        return _collate([self[i] for i in indices], device)


def random_split(dataset, lengths, seed: int = 0):
    """Split into non-overlapping subsets of the given lengths (or fractions summing to 1)."""
    n = len(dataset)
    if all(isinstance(x, float) for x in lengths) and abs(sum(lengths) - 1.0) < 1e-6:
        sizes = [int(math.floor(n * f)) for f in lengths]
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
    else:
        sizes = [int(x) for x in lengths]
    if sum(sizes) != n:
        raise ValueError(f"random_split: lengths {lengths} do not add up to the dataset's {n} samples")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    out, start = [], 0
    for s in sizes:
        out.append(_Subset(dataset, order[start:start + s]))
        start += s
    return out


def _collate(samples, device):
    cols = list(zip(*samples)) if isinstance(samples[0], (tuple, list)) else [samples]
    out = []
    for col in cols:
        if isinstance(col[0], Tensor):
            b = ember.stack([c.to(device) if device else c for c in col])
        else:
            b = ember.tensor([c.tolist() if hasattr(c, "tolist") else c for c in col], device=device)
        out.append(b)
    return tuple(out) if isinstance(samples[0], (tuple, list)) else out[0]


class DataLoader:
    """Batches of a dataset: ``batch_size``, ``shuffle`` (seeded per epoch), ``drop_last``,
    ``device`` (batches are moved there). Iterating runs one epoch; ``set_epoch(e)`` picks the
    shuffle order (the Learner sets it, so a resumed run sees the same batches)."""

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 seed: int = 0, device: str | None = None, collate_fn=None) -> None:
        if batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be >= 1, got {batch_size}")
        self.dataset, self.batch_size, self.shuffle = dataset, int(batch_size), bool(shuffle)
        self.drop_last, self.seed, self.device, self.collate_fn = drop_last, seed, device, collate_fn
        self.epoch = 0
        self._auto_epoch = True

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._auto_epoch = False

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self, epoch: int | None = None) -> list:
        """The sample indices of one epoch, in visiting order."""
        idx = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(f"{self.seed}/{self.epoch if epoch is None else epoch}").shuffle(idx)
        return idx

    def __iter__(self):
        idx = self.order()
        if self._auto_epoch:
            self.epoch += 1      # plain iteration: a new order every epoch
        bs = self.batch_size
        stop = len(idx) - len(idx) % bs if self.drop_last else len(idx)
        for s in range(0, stop, bs):
            chunk = idx[s:s + bs]
            if self.collate_fn is not None:
                yield self.collate_fn([self.dataset[i] for i in chunk])
            elif hasattr(self.dataset, "batch"):
                yield self.dataset.batch(chunk, self.device)
            else:
                yield _collate([self.dataset[i] for i in chunk], self.device)
