"""The public functions of ember, grouped by family. Each op is declared once in its family's
module (``registry.op``) next to the public function that calls it.

``METHODS`` maps Tensor method names to functions taking the tensor first: ``x.exp()``,
``x.sum(axis=1)``. Register with ``@method``.
"""
METHODS: dict = {}


def method(fn=None, *, name=None):
    """Decorator: expose a public function as a Tensor method too."""
    def deco(f):
        METHODS[name or f.__name__] = f
        return f
    return deco(fn) if fn is not None else deco


from .creation import *  # noqa: E402,F401,F403
from .elementwise import *  # noqa: E402,F401,F403
from .reduction import *  # noqa: E402,F401,F403
from .movement import *  # noqa: E402,F401,F403
from .indexing import *  # noqa: E402,F401,F403
from .linalg import *  # noqa: E402,F401,F403
from .nnops import *  # noqa: E402,F401,F403
from .llm import *  # noqa: E402,F401,F403
from .losses import *  # noqa: E402,F401,F403
from .array_api import *  # noqa: E402,F401,F403
from .extra import *  # noqa: E402,F401,F403
from .quant import *  # noqa: E402,F401,F403
