"""The wasm backend's cast kernel gives exactly the python backend's results for every pair of
float32/int32/int64/uint8/bool, edge values included (NaN, infinities, saturation, wrap)."""
import math

import pytest

import ember
from ember.errors import DeviceError

VALUES = {
    "float32": [-3.7, -0.0, 0.0, 0.5, 2.5, 255.5, 300.0, -1e20, 1e20, math.inf, -math.inf, math.nan,
                2147483520.0, -2147483648.0, 1.5e19, 16777217.0],
    "int32": [-3, 0, 2, 255, 256, 300, -129, 2**31 - 1, -2**31, 16777217],
    "int64": [-3, 0, 2, 255, 300, -129, 2**40 + 7, -2**63, 2**63 - 1, 2**31],
    "uint8": [0, 1, 127, 128, 255],
    "bool": [True, False, True],
}
DTYPES = list(VALUES)


@pytest.mark.parametrize("src", DTYPES)
def test_cast_matches_python(src):
    try:
        ember.get_backend("wasm")
    except DeviceError as e:
        pytest.skip(f"wasm backend unavailable on this machine: {e}")
    x = ember.tensor(VALUES[src] * 3, dtype=src)   # 3 copies: the SIMD body and the tail
    for dst in DTYPES:
        want = x.astype(dst).tolist()
        got = x.to("wasm").astype(dst).tolist()
        assert repr(got) == repr(want), (src, dst)
