"""ONNX import: load a model at run time (``load``), or turn it into ember code
(``import_model`` / ``ember import model.onnx``). Neither needs the ``onnx`` package or numpy.

>>> import ember, ember.onnx
>>> from ember.onnx.testing import tiny_model
>>> model = ember.onnx.load(tiny_model())
>>> model(ember.tensor([[1.0, -5.0]])).tolist()
[[2.0, 0.0]]
"""
from .ops import supported_ops  # noqa: F401
from .runtime import Model, load  # noqa: F401


def import_model(path, out_dir, **kw):
    """Write ``<out_dir>/<name>.py`` (an ember ``nn.Module``) and ``<name>.safetensors`` for
    the ONNX model at ``path``; see ``ember.onnx.codegen.generate``."""
    from .codegen import generate
    return generate(path, out_dir, **kw)
from .budget import get_limits, limits, set_limits  # noqa: F401,E402

# The exporter lives in ember.onnx.exporter: a submodule named "export" would replace this
# function as the package attribute the first time it is imported.
from .exporter import export  # noqa: F401,E402
