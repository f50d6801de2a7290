"""Not part of the wheel: lets a clone of this repository that is named ``ember`` be imported as
ember from the folder above it (e.g. ``git clone ... ember && python -c "import ember"``). Without
this file that folder would be an empty namespace package that shadows the installed ember.
The real package is ``core/`` (subpackages also in ``webgpu/``, ``wasm/``, ``web/``), exactly as
pyproject.toml maps them."""
import os as _os

_here = _os.path.dirname(_os.path.abspath(__file__))
__path__ = [_os.path.join(_here, "core"), _here]
_init = _os.path.join(_here, "core", "__init__.py")
with open(_init, encoding="utf-8") as _f:
    exec(compile(_f.read(), _init, "exec"))
del _f, _init
