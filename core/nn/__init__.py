"""ember.nn: modules with PyTorch's names, signatures and state_dict keys, for inference and
training (``functional``, ``init``, ``utils``, losses).

>>> import ember
>>> from ember import nn
>>> model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
...                       nn.Flatten(), nn.Linear(4, 2))
>>> model.eval()(ember.ones((2, 1, 8, 8))).shape
(2, 2)
>>> sd = ember.load_safetensors(ember.save_safetensors(model.state_dict()))
>>> nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
...               nn.Flatten(), nn.Linear(4, 2)).load_state_dict(sd)
IncompatibleKeys(missing_keys=[], unexpected_keys=[])
"""
from .layers import *  # noqa: F401,F403
from .layers import __all__ as _layers_all
from .loss import *  # noqa: F401,F403
from .loss import __all__ as _loss_all
from .module import IncompatibleKeys, Module, Parameter  # noqa: F401
from . import functional, init, utils  # noqa: F401,E402

__all__ = ["Module", "Parameter", "IncompatibleKeys", "functional", "init", "utils", *_layers_all, *_loss_all]
