"""The webgpu backend's host <-> GPU element conversion without numpy (what runs in Pyodide,
where numpy is absent): every ember dtype the GPU holds round-trips through the pure-Python
branch exactly as through numpy's. A uint8 upload once went through ``array("I", bytes)``,
which reads the bytes as raw 4-byte words: the OCR page's images arrived on the GPU as garbage.
No adapter is needed: these are the conversions alone."""
import struct

import pytest

from ember import dtypes as D
from ember.webgpu import backend as B

CASES = {
    "uint8": (D.uint8, bytes([0, 1, 127, 128, 200, 255, 3, 4, 9])),
    "bool": (D.bool_, bytes([0, 1, 2, 0, 255])),
    "int32": (D.int32, struct.pack("<4i", -5, 0, 7, 2**31 - 1)),
    "float32": (D.float32, struct.pack("<3f", 1.5, -0.0, 3e38)),
    "float16": (D.float16, struct.pack("<3e", 1.5, -2.0, 65504.0)),
    "int64": (D.int64, struct.pack("<3q", -(2**31), 5, 2**31 - 1)),
}


@pytest.fixture(params=["numpy", "pure"])
def mode(request, monkeypatch):
    if request.param == "numpy":
        pytest.importorskip("numpy")
        if B._np is None:
            pytest.skip("numpy is not importable here")
    else:
        monkeypatch.setattr(B, "_np", None)
    return request.param


@pytest.mark.parametrize("name", sorted(CASES))
def test_host_bytes_round_trip(mode, name):
    dt, data = CASES[name]
    n = len(data) // dt.itemsize
    dev = B.to_device_bytes(data, dt)
    assert len(dev) == 4 * n
    back = B.from_device_bytes(dev, dt)
    want = bytes(1 if b else 0 for b in data) if dt is D.bool_ else data
    assert back == want
    if dt is D.uint8:
        assert list(struct.unpack(f"<{n}I", dev)) == list(data)
