"""ember.train's dataset API (Burn's burn-dataset): CSV with typed columns (the shipped diabetes
file against the values scikit-learn bundles, re-read here with the csv module), typed errors
naming file/line/column, transforms, deterministic shuffles and splits, and the bridge to the
DataLoader."""
import csv

import pytest

import ember
from ember.errors import DatasetError
from ember.examples import data_path
from ember.train import CsvDataset, DataLoader, InMemoryDataset


def test_diabetes_csv_typed_columns():
    types = {"age": int, "sex": int, "s1": int, "s6": int, "progression": int}
    ds = CsvDataset(data_path("diabetes.csv"), columns=types)
    assert len(ds) == 442
    assert ds.columns == ["age", "sex", "bmi", "bp", "s1", "s2", "s3", "s4", "s5", "s6", "progression"]
    # given types are kept, the rest inferred (bmi "32.1" float; bp "101.0" float)
    assert ds.types == {**dict.fromkeys(ds.columns, float), **types}
    assert ds[0] == {"age": 59, "sex": 2, "bmi": 32.1, "bp": 101.0, "s1": 157, "s2": 93.2, "s3": 38.0,
                     "s4": 4.0, "s5": 4.8598, "s6": 87, "progression": 151}
    assert all(type(v) is ds.types[k] for r in ds for k, v in r.items())
    with open(data_path("diabetes.csv"), newline="") as f:    # every value, as the file has it
        rows = list(csv.reader(ln for ln in f if not ln.startswith("#")))[1:]
    assert [[float(v) for v in r] for r in rows] == [[float(r[c]) for c in ds.columns] for r in ds]
    assert {r["sex"] for r in ds} == {1, 2} and sum(ds.column("progression")) == 67243   # mean 152.13


def test_csv_errors_name_file_line_and_column(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("# note\na,b\n1,2\n3,x\n")
    with pytest.raises(DatasetError, match=r"bad\.csv:4: column 'b' \(field 2\) is int, but the value is 'x'"):
        CsvDataset(p, columns={"a": int, "b": int})
    assert CsvDataset(p).types == {"a": int, "b": str}           # inferred: b is text
    with pytest.raises(DatasetError, match="no column 'c'"):
        CsvDataset(p, columns={"c": float})
    with pytest.raises(DatasetError, match=r"<text>:3: 1 fields, the header has 2"):
        CsvDataset.from_text("a,b\n1,2\n3\n")
    ds = CsvDataset.from_text("1;true\n2;no\n", header=False, names=["n", "ok"], delimiter=";", columns={"ok": bool})
    assert list(ds) == [{"n": 1, "ok": True}, {"n": 2, "ok": False}]


def test_split_shuffle_map_and_loader():
    ds = InMemoryDataset(({"x": i, "y": 2.0 * i} for i in range(50)))
    tr, va = ds.split(0.8, seed=3)
    tr2, va2 = ds.split(0.8, seed=3)
    assert (len(tr), len(va)) == (40, 10)
    assert tr.column("x") == tr2.column("x") and va.column("x") == va2.column("x")     # deterministic
    assert sorted(tr.column("x") + va.column("x")) == list(range(50))                 # a partition
    assert tr.column("x") != list(range(40)) and ds.split(0.8, seed=4)[0].column("x") != tr.column("x")
    assert ds.split(0.8, seed=None)[1].column("x") == list(range(40, 50))
    assert ds.shuffled(1).take(3).column("x") == ds.shuffled(1).column("x")[:3]
    pairs = tr.map(lambda r: ([float(r["x"]), 1.0], [r["y"]]))
    td = pairs.to_tensors()
    assert [t.shape for t in td.tensors] == [(40, 2), (40, 1)] and td.tensors[0].dtype == ember.float32
    assert td.tensors[0][:, 0].tolist() == [float(v) for v in tr.column("x")]
    batches = list(DataLoader(pairs, batch_size=16))                 # per-sample collation works too
    assert [b[0].shape for b in batches] == [(16, 2), (16, 2), (8, 2)]
    with pytest.raises(DatasetError, match="map them to tuples"):
        tr.to_tensors()


@pytest.mark.parametrize("module", ["ember.train.dataset", "ember.examples", "ember.examples.png"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted and not result.failed
