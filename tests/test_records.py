"""``ember.save`` / ``ember.load``: records that come back without their constructor call, on
every backend; files written by earlier versions (tests/fixtures/records, made by
make_records.py) keep loading; newer formats, unknown classes and hostile metadata give typed
errors and never import or run anything the file names."""
from __future__ import annotations

import json
import math
import os
import sys

import pytest

import ember
from ember import nn
from ember.errors import WeightsError
from ember.records import FORMAT_VERSION, RecordError, RecordVersionError

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "records")
with open(os.path.join(FIX, "expected.json")) as _f:
    EXPECTED = json.load(_f)
sys.path.insert(0, FIX)
from make_records import fixed_input  # noqa: E402


def _close(a, b, tol=1e-5):
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


@pytest.mark.parametrize("file", sorted(EXPECTED))
def test_fixture_files_load(file, device):
    """Every committed record (one per format version and model) loads and computes what it did."""
    want = EXPECTED[file]
    m = ember.load(os.path.join(FIX, file), device=device)
    assert f"{type(m).__module__}.{type(m).__qualname__}" == want["class"]
    assert m.training == want["training"]
    assert all(t.device == device for t in m.state_dict().values() if t is not None)
    with ember.no_grad():
        got = m(fixed_input(want["shape"]).to(device)).tolist()
    assert _close(got, want["output"], 1e-4)


def test_fixtures_cover_this_format_version():
    assert any(f.startswith(f"v{FORMAT_VERSION}_") for f in EXPECTED), \
        "run tests/fixtures/records/make_records.py to add files of the new format version"


def test_round_trip_keeps_arguments_mode_and_values():
    m = nn.Sequential(nn.Conv2d(2, 3, (3, 1), stride=(2, 1), padding=1, bias=False), nn.BatchNorm2d(3),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 2))
    raw = ember.save(m)
    meta = ember.records.read_metadata(raw)
    assert meta["ember.format"] == str(FORMAT_VERSION) and meta["ember.version"] == ember.__version__
    assert meta["ember.class"] == "ember.nn.layers.Sequential" and meta["ember.training"] == "1"
    back = ember.load(raw)
    assert back.training and back[0].kernel_size == (3, 1) and back[0].bias is None
    assert back[0].weight.requires_grad                  # parameters, as constructed
    x = ember.randn((1, 2, 5, 4))
    assert back.eval()(x).tolist() == m.eval()(x).tolist()


def test_registered_class(tmp_path):
    class Affine(nn.Module):
        def __init__(self, n, *, scale=1.0, dtype=ember.float32):
            super().__init__()
            self.w = ember.full((n,), scale, dtype=dtype)
            self.inner = nn.Linear(n, n)

        def forward(self, x):
            return self.inner(x) * self.w

    path = str(tmp_path / "a.safetensors")
    ember.save(Affine(4, scale=3.0), path)
    with pytest.raises(RecordError, match="not an ember.nn class nor one registered"):
        ember.load(path)
    ember.records.register(Affine)
    try:
        back = ember.load(path)
    finally:
        ember.records._REGISTERED.clear()
    assert type(back) is Affine and back.w.tolist() == [3.0] * 4


def test_changed_structure_is_refused_at_save():
    from ember.nn.efficientnet import EfficientNetLite

    m = EfficientNetLite([(1, 3, 1, 1, 8, 8)], num_classes=2, stem_channels=8, head_channels=16).eval()
    with pytest.raises(RecordError, match="ember.save: the constructor arguments build"):
        ember.save(m.fuse_batchnorm())


def test_unrecordable_argument_is_named():
    with pytest.raises(RecordError, match="Embedding argument '_weight' is a Tensor"):
        ember.save(nn.Embedding(3, 2, _weight=ember.zeros((3, 2))))


# ---- hostile and future files ----------------------------------------------------------------------

def _record(spec, tensors=None, **meta):
    md = {"ember.format": "1", "ember.version": "0.1.0", "ember.training": "0",
          "ember.args": spec if isinstance(spec, str) else json.dumps(spec)}
    md.update(meta)
    return ember.save_safetensors(tensors or {"weight": ember.zeros((2, 3)), "bias": ember.zeros((2,))}, metadata=md)


LINEAR = {"class": "ember.nn.layers.Linear", "args": [3, 2], "kwargs": {}}


def test_hand_made_record_loads():
    assert ember.load(_record(LINEAR)).out_features == 2


def test_newer_format_version():
    with pytest.raises(RecordVersionError, match="reads formats up to 1: upgrade ember"):
        ember.load(_record(LINEAR, **{"ember.format": "2", "ember.version": "9.0"}))


@pytest.mark.parametrize("name", ["os.system", "builtins.eval", "subprocess.Popen", "ember.records.RecordError",
                                  "ember_never_imported_xyz.Evil", "ember.nn.layers.<locals>.X", ""])
def test_classes_outside_the_allowlist(name):
    with pytest.raises(RecordError, match="not an ember.nn class"):
        ember.load(_record({"class": name, "args": [], "kwargs": {}}))
    assert "ember_never_imported_xyz" not in sys.modules


@pytest.mark.parametrize("args, match", [
    ('{"class": "ember.nn.layers.Linear", "args": [3, 2], "kwargs": {}, "x": 1}', "must be"),
    ("not json", "not valid JSON"),
    ("[" * 100000 + "]" * 100000, "JSON|deeper"),
    ('{"class": "ember.nn.layers.Linear", "args": [1e999, 2], "kwargs": {}}', "not finite"),
    ('{"class": "ember.nn.layers.Linear", "args": [' + "9" * 5000 + ', 2], "kwargs": {}}', "JSON"),
    ('{"class": "ember.nn.layers.Linear", "args": [1000000000000, 1000000000000], "kwargs": {}}', "differ from the saved"),
    ('{"class": "ember.nn.layers.Linear", "args": [100000000000000000000, 2], "kwargs": {}}', "out of range"),
    ('{"class": "ember.nn.layers.Linear", "args": ["three", 2], "kwargs": {}}', "failed"),
    ('{"class": "ember.nn.layers.Linear", "args": {"a": 1}, "kwargs": {}}', "must be a list"),
    ('{"class": 7, "args": [], "kwargs": {}}', "must be a string"),
    ('{"class": "ember.nn.layers.Linear", "args": [3, 2], "kwargs": {"device": "webgpu"}}', "device"),
    ('{"class": "ember.nn.layers.Linear", "args": [{"__import__": "os"}, 2], "kwargs": {}}', "not a value"),
    ('{"class": "ember.nn.layers.Linear", "args": [{"__dtype__": "os.system"}, 2], "kwargs": {}}', "unknown dtype"),
])
def test_hostile_arguments(args, match):
    with pytest.raises(RecordError, match=match):
        ember.load(_record(args))


def test_too_many_modules_are_refused():
    relu = {"__module__": {"class": "ember.nn.layers.ReLU", "args": [], "kwargs": {}}}
    spec = {"class": "ember.nn.layers.Sequential", "args": [relu] * 12000, "kwargs": {}}
    with pytest.raises(RecordError, match="more modules"):
        ember.load(_record(spec, tensors={"x": ember.zeros((1,))}))


def test_metadata_missing_or_mismatched():
    plain = ember.save_safetensors({"w": ember.zeros((2,))})
    with pytest.raises(RecordError, match="without ember's record metadata"):
        ember.load(plain)
    with pytest.raises(RecordError, match="not a number"):
        ember.load(_record(LINEAR, **{"ember.format": "1e9"}))
    with pytest.raises(RecordError, match="differs from the class"):
        ember.load(_record(LINEAR, **{"ember.class": "ember.nn.layers.Conv2d"}))
    with pytest.raises(WeightsError):
        ember.load(b"\x08\x00\x00\x00\x00\x00\x00\x00{}garbage")
