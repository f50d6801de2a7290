"""ember.optim: SGD, Adam and AdamW with PyTorch's update rules and argument names, and
``ember.optim.lr_scheduler``.

>>> import ember
>>> from ember import nn
>>> model = nn.Linear(3, 1)
>>> opt = ember.optim.AdamW(model.parameters(), lr=1e-2)
>>> loss = nn.functional.mse_loss(model(ember.ones((4, 3))), ember.zeros((4, 1)))
>>> loss.backward(); opt.step(); opt.zero_grad()
>>> model.weight.grad is None
True
"""
from . import lr_scheduler  # noqa: F401
from .optimizer import SGD, Adam, AdamW, Optimizer  # noqa: F401

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
