"""Datasets in the manner of Burn's burn-dataset: a CSV file with typed columns, rows in memory,
lazy transforms, a deterministic shuffle and a train/valid split, and a bridge to the tensors the
``DataLoader`` and the ``Learner`` take.

Every dataset here is map-style (``len(ds)``, ``ds[i]``) and composes: ``ds.map(fn)`` applies
``fn`` to each item when it is read (Burn's ``MapperDataset``), ``ds.shuffled(seed)`` is a fixed
permutation (``ShuffledDataset``), ``ds.split(0.8, seed)`` a shuffled (train, valid) pair (the
same seed always gives the same rows), ``ds.take(n)`` the first rows. ``ds.to_tensors()``
collates every item once into a ``TensorDataset`` (one tensor per item field), which the
``DataLoader`` batches with one gather per tensor.

>>> from ember.train import CsvDataset
>>> ds = CsvDataset.from_text("x,y,name\\n1,2.5,a\\n2,3.5,b\\n3,4.5,c\\n", columns={"x": int, "y": float})
>>> ds.types == {"x": int, "y": float, "name": str}, len(ds), ds[0]
(True, 3, {'x': 1, 'y': 2.5, 'name': 'a'})
>>> train, valid = ds.split(2 / 3, seed=0)
>>> len(train), len(valid), sorted(r["x"] for r in list(train) + list(valid))
(2, 1, [1, 2, 3])
>>> xy = ds.map(lambda r: ([float(r["x"])], [r["y"]])).to_tensors()
>>> [t.shape for t in xy.tensors]
[(3, 1), (3, 1)]
"""
from __future__ import annotations

import csv
import io
import os
import random
from typing import Callable, Iterable

from ..errors import DatasetError
from .data import Dataset, TensorDataset, _collate

__all__ = ["InMemoryDataset", "CsvDataset", "MappedDataset", "SubsetDataset", "DatasetError"]


class _Composable(Dataset):
    """The methods every dataset of this module has."""

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def map(self, fn: Callable) -> "MappedDataset":
        """A dataset whose item ``i`` is ``fn(self[i])`` (computed when read)."""
        return MappedDataset(self, fn)

    def shuffled(self, seed: int = 0) -> "SubsetDataset":
        """The same items in a fixed order drawn from ``seed``."""
        order = list(range(len(self)))
        random.Random(f"ember.dataset/{seed}").shuffle(order)
        return SubsetDataset(self, order)

    def split(self, train: float = 0.8, seed: int | None = 0) -> tuple:
        """``(train, valid)``: the items shuffled with ``seed`` (``None``: file order), the first
        ``round(train * len)`` for training, the rest for validation."""
        if not 0.0 < train < 1.0:
            raise ValueError(f"split: train must be a fraction in (0, 1), got {train}")
        ds = self.shuffled(seed) if seed is not None else SubsetDataset(self, range(len(self)))
        k = int(round(train * len(self)))
        return SubsetDataset(ds.dataset, ds.indices[:k]), SubsetDataset(ds.dataset, ds.indices[k:])

    def take(self, n: int) -> "SubsetDataset":
        """The first ``n`` items."""
        return SubsetDataset(self, range(min(int(n), len(self))))

    def column(self, name: str) -> list:
        """The values of field ``name`` of every item (items that are dicts)."""
        return [item[name] for item in self]

    def to_tensors(self, device: str | None = None, dtype=None) -> TensorDataset:
        """Every item collated at once: item fields (numbers, lists, tensors) become the rows of
        one tensor each (floats as float32 unless ``dtype`` says otherwise)."""
        items = list(self)
        if not items:
            raise DatasetError("to_tensors: the dataset is empty")
        if isinstance(items[0], dict):
            raise DatasetError("to_tensors: items are dicts (rows); map them to tuples first, e.g. "
                               "ds.map(lambda r: ([r['a'], r['b']], r['y']))")
        cols = _collate(items, device)
        cols = cols if isinstance(cols, tuple) else (cols,)
        if dtype is not None:
            cols = tuple(c.astype(dtype) if c.dtype.kind == "f" else c for c in cols)
        return TensorDataset(*cols)


class InMemoryDataset(_Composable):
    """Items held in a list (Burn's ``InMemDataset``): rows as dicts, tuples, anything."""

    def __init__(self, items: Iterable) -> None:
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


class MappedDataset(_Composable):
    """``fn`` applied to every item of ``dataset`` as it is read."""

    def __init__(self, dataset, fn: Callable) -> None:
        self.dataset, self.fn = dataset, fn

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        return self.fn(self.dataset[i])


class SubsetDataset(_Composable):
    """The items of ``dataset`` at ``indices``, in that order."""

    def __init__(self, dataset, indices) -> None:
        self.dataset, self.indices = dataset, list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i):
        return self.dataset[self.indices[i]]


_BOOL = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def _parse(value: str, typ):
    if typ is str:
        return value
    if typ is bool:
        v = _BOOL.get(value.strip().lower())
        if v is None:
            raise ValueError(f"not a boolean: {value!r}")
        return v
    if typ is int:
        s = value.strip()
        try:
            return int(s)
        except ValueError:
            f = float(s)            # "151.0" is an int column's 151
            if f != int(f):
                raise ValueError(f"not an integer: {value!r}") from None
            return int(f)
    return typ(value.strip())


def _infer(values) -> type:
    for typ in (int, float):
        try:
            for v in values:
                _parse(v, typ)
            return typ
        except ValueError:
            continue
    return str


class CsvDataset(InMemoryDataset):
    """Rows of a CSV file as dicts ``{column: value}`` with typed columns.

    ``columns``: ``{name: type}`` (``int``, ``float``, ``bool``, ``str`` or any callable that
    parses a string) for the columns to convert; the others are inferred (int if every value is
    an integer, else float if every value is a number, else str). ``select``: keep only these
    columns, in this order. ``header=False`` names the columns ``c0, c1...`` (or ``names``).
    Lines starting with ``comment`` are skipped (attribution lines above the header). A value
    that does not parse raises ``ember.errors.DatasetError`` naming the file, line and column."""

    def __init__(self, path, columns: dict | None = None, *, delimiter: str = ",", header: bool = True,
                 names: list | None = None, select: list | None = None, comment: str | None = "#",
                 source: str | None = None) -> None:
        self.path = source or (os.fspath(path) if not isinstance(path, io.IOBase) else "<stream>")
        if isinstance(path, io.IOBase):
            text = path.read()
        else:
            with open(path, encoding="utf-8", newline="") as f:
                text = f.read()
        self._load(text, columns or {}, delimiter, header, names, select, comment)

    @classmethod
    def from_text(cls, text: str, columns: dict | None = None, **kw) -> "CsvDataset":
        """The same from CSV text (``source`` names it in errors)."""
        return cls(io.StringIO(text), columns, source=kw.pop("source", "<text>"), **kw)

    def _load(self, text, columns, delimiter, header, names, select, comment) -> None:
        lines = [(n, ln) for n, ln in enumerate(text.splitlines(), 1)
                 if ln.strip() and not (comment and ln.lstrip().startswith(comment))]
        rows = list(csv.reader([ln for _, ln in lines], delimiter=delimiter))
        numbers = [n for n, _ in lines]
        if header:
            if not rows:
                raise DatasetError(f"{self.path}: no header line")
            head, rows, numbers = [h.strip() for h in rows[0]], rows[1:], numbers[1:]
        else:
            width = len(rows[0]) if rows else 0
            head = list(names) if names else [f"c{i}" for i in range(width)]
        unknown = [c for c in list(columns) + list(select or []) if c not in head]
        if unknown:
            raise DatasetError(f"{self.path}: no column {unknown[0]!r} (columns: {', '.join(head)})")
        for r, n in zip(rows, numbers):
            if len(r) != len(head):
                raise DatasetError(f"{self.path}:{n}: {len(r)} fields, the header has {len(head)}")
        keep = list(select) if select else head
        idx = [head.index(c) for c in keep]
        types = {}
        for c, j in zip(keep, idx):
            types[c] = columns.get(c) or _infer([r[j] for r in rows])
        items = []
        for r, n in zip(rows, numbers):
            item = {}
            for c, j in zip(keep, idx):
                try:
                    item[c] = _parse(r[j], types[c])
                except (ValueError, TypeError) as e:
                    tname = getattr(types[c], "__name__", str(types[c]))
                    raise DatasetError(f"{self.path}:{n}: column {c!r} (field {j + 1}) is {tname}, "
                                       f"but the value is {r[j]!r} ({e})") from None
            items.append(item)
        self.columns, self.types, self.items = keep, types, items
