"""Runnable examples, one command each (Burn's ``examples/``)::

    python -m ember.examples LIST              # what there is
    python -m ember.examples regression        # run one (--help for its options)

Each example is a module here with ``main(argv) -> int`` (the command) and ``run(...) -> dict``
(what the command does, returning its results: the tests call it with a few steps).

>>> from ember.examples import EXAMPLES
>>> sorted(EXAMPLES)
['custom-kernel', 'mnist', 'onnx', 'regression', 'wgan']
"""
from __future__ import annotations

import importlib
import os

# name -> (module, one line)
EXAMPLES = {
    "mnist": ("mnist", "train the MNIST demo's CNN with the Learner (demos/mnist; --quick: a few batches)"),
    "regression": ("regression", "an MLP on the diabetes CSV through the dataset API and the Learner"),
    "wgan": ("wgan", "a Wasserstein GAN with gradient penalty on MNIST digits; writes a PNG grid"),
    "custom-kernel": ("custom_kernel", "a GELU written in WGSL as an ember op, checked against the built-in one"),
    "onnx": ("onnx_roundtrip", "build an ONNX file, import it with ember.onnx, run it on every device"),
}

HERE = os.path.dirname(os.path.abspath(__file__))


def data_path(name: str) -> str:
    """A data file shipped with the examples (``diabetes.csv``)."""
    return os.path.join(HERE, name)


def source_root() -> str | None:
    """The ember source checkout this package runs from (it holds ``demos/``), or None (an
    installed wheel: the demos and their data are not in it)."""
    root = os.path.dirname(os.path.dirname(HERE))     # core/examples -> the checkout
    return root if os.path.isfile(os.path.join(root, "demos", "mnist", "model.py")) else None


def load(name: str):
    """The module of example ``name``."""
    if name not in EXAMPLES:
        raise KeyError(f"no example {name!r}; examples: {', '.join(EXAMPLES)}")
    return importlib.import_module(f"ember.examples.{EXAMPLES[name][0]}")
