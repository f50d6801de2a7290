"""The array API additions' op cases (``op_cases_array_api.CASES``) against numpy on every
backend, and the namespace-level functions that are not ops (asarray, finfo/iinfo, isdtype,
can_cast, result_type, the inspection namespace, EMBER_DEFAULT_DEVICE)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import ember
from ember.errors import DeviceError, ShapeError
from helpers import check, raises
from op_cases_array_api import CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_case(case, device):
    check(case, device)


def test_namespace_basics():
    x = ember.asarray([1, 2, 3], dtype=ember.int16)
    assert x.__array_namespace__() is ember and ember.__array_api_version__ == "2023.12"
    assert ember.asarray(np.arange(3.0)).dtype is ember.float64      # numpy's dtype is kept
    assert ember.asarray(x, copy=False) is x
    with pytest.raises(ValueError):
        ember.asarray(x, dtype=ember.int32, copy=False)
    for dt in ("float32", "float64"):
        assert ember.finfo(dt).eps == float(np.finfo(dt).eps) and ember.finfo(dt).max == float(np.finfo(dt).max)
    for dt in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        assert (ember.iinfo(dt).min, ember.iinfo(dt).max) == (np.iinfo(dt).min, np.iinfo(dt).max)
    assert ember.isdtype(ember.uint8, "integral") and not ember.isdtype(ember.float32, ("bool", "integral"))
    assert ember.can_cast(ember.int8, ember.int16) and not ember.can_cast(ember.int16, ember.uint8)
    assert ember.result_type(ember.uint8, ember.int8, 1) is ember.int16
    info = ember.__array_namespace_info__()
    assert info.default_dtypes()["indexing"] is ember.int64 and "python" in info.devices()
    assert "float64" in info.dtypes(device="numpy") and "float64" not in info.dtypes(device="wasm")
    assert (ember.e, ember.pi, ember.newaxis) == (np.e, np.pi, None) and ember.isnan(ember.asarray(ember.nan))
    assert x.to_device("numpy").device == "numpy"
    assert ember.reshape(x, (3, 1), copy=False).shape == (3, 1)


def test_issue12_inputs_are_refused_with_typed_errors():
    with raises(ShapeError, "reshape", "ints"):
        ember.arange(4).reshape((2.0, 2))
    for bad in (("2", 2), (True, 4)):
        with raises(ShapeError, "reshape"):
            ember.arange(4).reshape(bad)


def _import_with(value):
    env = dict(os.environ, EMBER_DEFAULT_DEVICE=value)
    return subprocess.run([sys.executable, "-c", "import ember; print(ember.tensor([1]).device)"],
                          capture_output=True, text=True, env=env)


def test_ember_default_device_environment_variable():
    r = _import_with("numpy")
    assert r.returncode == 0 and r.stdout.strip() == "numpy", r.stderr
    r = _import_with("nosuchdevice")
    assert r.returncode != 0 and "EMBER_DEFAULT_DEVICE='nosuchdevice'" in r.stderr and "DeviceError" in r.stderr
    assert DeviceError.__name__ in r.stderr


@pytest.mark.parametrize("module", ["ember.ops.array_api", "ember.ops.extra", "ember.linalg"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0
