"""ember: deep-learning inference in Python, the same model code in CPython and in the browser.

>>> import ember
>>> x = ember.tensor([1.0, 2.0, 3.0])
>>> (x * x).tolist()
[1.0, 4.0, 9.0]
"""
__version__ = "0.1.0"

from . import dtypes, errors  # noqa: F401
from .backends import default_device, devices, get_backend, set_default_device  # noqa: F401
from .dtypes import bool_, float16, float32, int32, int64, uint8  # noqa: F401
from .tensor import Tensor, from_bytes, from_numpy, tensor  # noqa: F401
from .ops import *  # noqa: F401,F403

bool = bool_  # noqa: A001  (ember.bool, like numpy/torch; Python's bool stays builtins.bool)
