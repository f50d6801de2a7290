"""Checkpoints that survive versions: ``ember.save(module, path)`` / ``ember.load(path)``.

A record is a safetensors file: the module's ``state_dict()`` as tensors, plus string metadata
saying what rebuilds it, so that ``ember.load`` gives the model back without its constructor
call:

- ``ember.format``: the record format version (``FORMAT_VERSION``); a newer one than this ember
  reads raises ``RecordVersionError`` (upgrade ember), files of every older version stay
  loadable (tests/fixtures/records holds files written by each version);
- ``ember.version``: the ember that wrote it (information only);
- ``ember.class``: the module class as a dotted path, ``ember.nn.layers.Linear``;
- ``ember.args``: its constructor arguments as JSON (every ``nn.Module`` records the arguments
  of its constructor call; a submodule given as an argument, as to ``Sequential``, is recorded
  the same way, nested);
- ``ember.training``: ``"1"`` or ``"0"``, the mode it was saved in.

Loading never imports a module named by the file and never runs code from it: the class must
be an ``ember.nn`` class or one registered with ``register``, and the arguments are JSON values
(numbers, strings, lists, tuples, dtypes, nested modules of allowed classes). The model is
first built on the ``meta`` device (shapes, no data), its shapes checked against the file's
tensors, then built on the device and filled; a file that names an unknown class, carries
arguments of the wrong kind or sizes that do not match its tensors raises ``RecordError``.

>>> import ember, tempfile, os
>>> from ember import nn
>>> model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
>>> path = os.path.join(tempfile.mkdtemp(), "mlp.safetensors")
>>> ember.save(model, path)
>>> back = ember.load(path)
>>> back
Sequential(
  (0): Linear(in_features=3, out_features=4, bias=True)
  (1): ReLU()
  (2): Linear(in_features=4, out_features=2, bias=True)
)
>>> x = ember.ones((1, 3))
>>> back(x).tolist() == model(x).tolist()
True
"""
from __future__ import annotations

import json
import math

from . import dtypes as _dt
from .errors import WeightsError

__all__ = ["save", "load", "register", "read_metadata", "FORMAT_VERSION", "RecordError", "RecordVersionError"]

FORMAT_VERSION = 1
MAX_ARGS_BYTES = 1 << 20      # the JSON of the constructor arguments
MAX_DEPTH = 32                # nesting of lists / dicts / modules in it
MAX_INT = 1 << 53             # larger integers are refused (no layer size is that large)

_REGISTERED: dict = {}


class RecordError(WeightsError):
    """A record (``ember.load``) that cannot be turned back into a model: unknown class,
    malformed metadata, arguments of the wrong kind, shapes that do not match the tensors."""


class RecordVersionError(RecordError):
    """A record written in a newer format than this ember reads."""


def register(cls):
    """Allow ``ember.load`` to rebuild ``cls`` (an ``nn.Module`` subclass outside ``ember.nn``);
    usable as a class decorator. Returns ``cls``.

    >>> import ember
    >>> from ember import nn
    >>> @ember.records.register
    ... class Scale(nn.Module):
    ...     def __init__(self, n: int, factor: float = 2.0):
    ...         super().__init__()
    ...         self.w = ember.ones((n,)) * factor
    ...     def forward(self, x):
    ...         return x * self.w
    >>> ember.load(ember.save(Scale(3, factor=0.5))).w.tolist()
    [0.5, 0.5, 0.5]
    """
    from .nn.module import Module

    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise TypeError(f"records.register: expected an ember.nn.Module subclass, got {cls!r}")
    _REGISTERED[_name_of(cls)] = cls
    return cls


def _name_of(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _allowed() -> dict:
    """{dotted name: class} of every class ``load`` may build: ember.nn's and registered ones."""
    import importlib

    from .nn.module import Module

    for m in ("ember.nn", "ember.nn.efficientnet"):     # fixed names: never one read from a file
        importlib.import_module(m)
    out = {}
    todo = [Module]
    while todo:
        c = todo.pop()
        if c.__module__.startswith("ember.nn.") and "<locals>" not in c.__qualname__:
            out[_name_of(c)] = c
        todo.extend(c.__subclasses__())
    out.update(_REGISTERED)
    return out


# ---- arguments <-> JSON -----------------------------------------------------------------------------

def _encode(v, where: str):
    from .nn.module import Module

    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else {"__float__": repr(v)}
    if isinstance(v, tuple):
        return {"__tuple__": [_encode(x, where) for x in v]}
    if isinstance(v, list):
        return [_encode(x, where) for x in v]
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise RecordError(f"ember.save: {where}: a dict argument with non-string keys cannot be recorded")
        return {"__dict__": {k: _encode(x, f"{where}[{k!r}]") for k, x in v.items()}}
    if isinstance(v, _dt.DType):
        return {"__dtype__": v.name}
    if isinstance(v, Module):
        return {"__module__": _spec(v)}
    raise RecordError(f"ember.save: {where} is a {type(v).__name__}, which a record cannot hold (numbers, "
                      f"strings, lists, tuples, dicts, dtypes and modules can); build the module from such "
                      f"arguments (sizes, names), or save its state_dict with ember.save_safetensors")


def _spec(m) -> dict:
    cls = type(m)
    name = _name_of(cls)
    args, kwargs = m.__dict__.get("_init_args", ((), {}))
    where = f"{cls.__name__}"
    return {"class": name, "args": [_encode(a, f"{where} argument {i}") for i, a in enumerate(args)],
            # the device is ember.load's to choose: a record is the same file on every backend
            "kwargs": {k: _encode(v, f"{where} argument {k!r}") for k, v in kwargs.items() if k != "device"}}


class _Decoder:
    def __init__(self, allowed: dict, budget: list):
        self.allowed = allowed
        self.budget = budget

    def value(self, v, depth: int, where: str):
        if depth > MAX_DEPTH:
            raise RecordError(f"ember.load: {where}: arguments nested deeper than {MAX_DEPTH}")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            if abs(v) > MAX_INT:
                raise RecordError(f"ember.load: {where}: integer {str(v)[:40]} is out of range (|n| <= 2**53)")
            return v
        if isinstance(v, float):
            if not math.isfinite(v):
                raise RecordError(f"ember.load: {where}: number {v!r} is not finite")
            return v
        if isinstance(v, list):
            return [self.value(x, depth + 1, where) for x in v]
        if isinstance(v, dict) and len(v) == 1:
            (tag, x), = v.items()
            if tag == "__tuple__" and isinstance(x, list):
                return tuple(self.value(y, depth + 1, where) for y in x)
            if tag == "__dict__" and isinstance(x, dict):
                return {k: self.value(y, depth + 1, f"{where}[{k!r}]") for k, y in x.items()}
            if tag == "__float__" and x in ("inf", "-inf", "nan"):
                return float(x)
            if tag == "__dtype__" and isinstance(x, str):
                try:
                    return _dt.get(x)
                except Exception:  # noqa: BLE001  (whatever dtypes.get raises for an unknown name)
                    raise RecordError(f"ember.load: {where}: unknown dtype {x[:40]!r}") from None
            if tag == "__module__":
                return self.module(x, depth + 1, where)
        raise RecordError(f"ember.load: {where}: {json.dumps(v)[:80]} is not a value a record holds")

    def module(self, spec, depth: int, where: str):
        if not isinstance(spec, dict) or set(spec) != {"class", "args", "kwargs"}:
            raise RecordError(f"ember.load: {where}: a module must be {{'class', 'args', 'kwargs'}}, got "
                              f"{json.dumps(spec)[:80]}")
        name, args, kwargs = spec["class"], spec["args"], spec["kwargs"]
        if not isinstance(name, str):
            raise RecordError(f"ember.load: {where}: the class must be a string, got {json.dumps(name)[:40]}")
        cls = self.allowed.get(name)
        if cls is None:
            raise RecordError(f"ember.load: {where}: class {name[:200]!r} is not an ember.nn class nor one "
                              f"registered with ember.records.register; import the code that defines it and "
                              f"register it (ember never imports a module a file names)")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise RecordError(f"ember.load: {where}: {name}'s args must be a list and kwargs an object")
        if "device" in kwargs:
            raise RecordError(f"ember.load: {where}: {name}'s arguments name a device; a record's device is "
                              f"ember.load's device argument")
        a = [self.value(x, depth + 1, f"{name} argument {i}") for i, x in enumerate(args)]
        kw = {k: self.value(x, depth + 1, f"{name} argument {k!r}") for k, x in kwargs.items()}
        from .nn.utils import skip_init

        try:
            return skip_init(cls, *a, **kw)
        except RecordError:
            raise
        except Exception as e:  # noqa: BLE001  (an allowed constructor refusing the file's arguments)
            raise RecordError(f"ember.load: {where}: {name}(*{_short(a)}, **{_short(kw)}) failed: "
                              f"{type(e).__name__}: {str(e)[:300]}") from e


def _short(v) -> str:
    s = repr(v)
    return s if len(s) <= 200 else s[:200] + "..."


def _build(spec, allowed: dict, n_tensors: int, device, what: str):
    """The module of ``spec`` on ``device`` (None: the default device), its weights not drawn.
    Builds at most as many modules as a file of ``n_tensors`` tensors could fill (with room for
    parameter-free layers): a hostile "1e9 layers" stops there, not after the memory is gone."""
    from .backends import default_device, set_default_device
    from .nn import module as _module

    budget = [16 * n_tensors + 10_000]

    def count(_m):
        budget[0] -= 1
        if budget[0] < 0:
            raise RecordError(f"{what}: the constructor arguments build more modules than a file with "
                              f"{n_tensors} tensors can fill; refused")

    prev, saved_hook = default_device(), _module.ON_CONSTRUCT[0]
    _module.ON_CONSTRUCT[0] = count
    try:
        if device is not None:
            set_default_device(device)
        return _Decoder(allowed, budget).module(spec, 0, "the record")
    finally:
        set_default_device(prev)
        _module.ON_CONSTRUCT[0] = saved_hook


def _probe(spec, allowed: dict, shapes: dict, what: str) -> None:
    """Build ``spec`` on the meta device and check its tensors against ``shapes`` {name: shape}."""
    probe = _build(spec, allowed, len(shapes), "meta", what)
    want = {k: tuple(v.shape) for k, v in probe.state_dict().items() if v is not None}
    if want != shapes:
        missing = sorted(set(want) - set(shapes))[:5]
        extra = sorted(set(shapes) - set(want))[:5]
        wrong = [f"{k}: {want[k]} vs {shapes[k]}" for k in sorted(set(want) & set(shapes)) if want[k] != shapes[k]][:5]
        raise RecordError(f"{what}: the constructor arguments build a {type(probe).__name__} whose tensors differ "
                          f"from the saved ones (missing {missing}, unexpected {extra}, shapes {wrong})")


# ---- save / load -----------------------------------------------------------------------------------

def save(module, path=None):
    """Write ``module`` (an ``ember.nn.Module``) as a record: its ``state_dict()`` and what
    rebuilds it (class, constructor arguments, format and ember versions) as safetensors
    metadata. ``path`` None: return the bytes. Raises ``RecordError`` if a constructor argument
    cannot be recorded (a tensor, a function...).

    >>> import ember
    >>> from ember import nn
    >>> raw = ember.save(nn.Conv2d(1, 2, 3, padding=1))
    >>> meta = ember.records.read_metadata(raw)
    >>> meta["ember.class"], meta["ember.args"]
    ('ember.nn.layers.Conv2d', '{"args": [1, 2, 3], "class": "ember.nn.layers.Conv2d", "kwargs": {"padding": 1}}')
    """
    from . import __version__
    from .io.safetensors import save_safetensors
    from .nn.module import Module

    if not isinstance(module, Module):
        raise TypeError(f"ember.save: expected an ember.nn.Module, got {type(module).__name__}")
    spec = _spec(module)
    meta = {"ember.format": str(FORMAT_VERSION), "ember.version": __version__, "ember.class": spec["class"],
            "ember.args": json.dumps(spec, sort_keys=True), "ember.training": "1" if module.training else "0"}
    sd = {k: v for k, v in module.state_dict().items() if v is not None}
    # The arguments must rebuild this very structure (not so after fuse_batchnorm, or after
    # layers were swapped in place): checked now, on the meta device, rather than at load.
    allowed = {**_allowed(), **{_name_of(type(m)): type(m) for m in module.modules()}}
    _probe(spec, allowed, {k: tuple(v.shape) for k, v in sd.items()}, "ember.save")
    return save_safetensors(sd, path, metadata=meta)


def read_metadata(source) -> dict:
    """The metadata of a record (a path or bytes), without reading its tensors."""
    from .io.safetensors import load_safetensors

    return dict(load_safetensors(source, device="meta").metadata)


def load(source, device: str | None = None):
    """The module saved by ``ember.save`` at ``source`` (a path or bytes), on ``device`` (default:
    the default device), in the mode it was saved in. Raises ``RecordVersionError`` for a newer
    format, ``RecordError`` for anything else that stops the model from being rebuilt, and
    ``WeightsError`` for a malformed safetensors file.

    >>> import ember
    >>> from ember import nn
    >>> m = ember.load(ember.save(nn.LayerNorm(4, eps=1e-3)))
    >>> m.eps, m.weight.shape
    (0.001, (4,))
    """
    from . import __version__
    from .io.safetensors import load_safetensors

    sd = load_safetensors(source, device=device)
    meta = sd.metadata
    what = "ember.load"
    fmt = meta.get("ember.format")
    if fmt is None:
        raise RecordError(f"{what}: the file is a safetensors file without ember's record metadata "
                          f"(ember.format); load its tensors with ember.load_safetensors")
    if not (isinstance(fmt, str) and fmt.isdigit() and len(fmt) <= 9):
        raise RecordError(f"{what}: the record format version {fmt[:40]!r} is not a number")
    if int(fmt) > FORMAT_VERSION:
        raise RecordVersionError(f"{what}: the file is record format {int(fmt)} (written by ember "
                                 f"{meta.get('ember.version', '?')[:40]}); this ember ({__version__}) reads "
                                 f"formats up to {FORMAT_VERSION}: upgrade ember to load it")
    if int(fmt) < 1:
        raise RecordError(f"{what}: record format {int(fmt)} does not exist (the first is 1)")
    raw = meta.get("ember.args")
    if raw is None:
        raise RecordError(f"{what}: the record has no ember.args (its constructor arguments)")
    if len(raw) > MAX_ARGS_BYTES:
        raise RecordError(f"{what}: ember.args is {len(raw)} bytes (at most {MAX_ARGS_BYTES})")
    try:
        spec = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise RecordError(f"{what}: ember.args is not valid JSON: {str(e)[:200]}") from None
    if isinstance(spec, dict) and meta.get("ember.class") not in (None, spec.get("class")):
        raise RecordError(f"{what}: ember.class {meta.get('ember.class')[:200]!r} differs from the class in "
                          f"ember.args {str(spec.get('class'))[:200]!r}")
    names = list(sd.keys())
    shapes = {k: tuple(sd.shape(k)) for k in names}
    allowed = _allowed()
    _probe(spec, allowed, shapes, what)                  # shapes only: nothing allocated for the check
    model = _build(spec, allowed, len(names), device, what)
    model.load_state_dict(sd, strict=True)
    return model.train(meta.get("ember.training") == "1")
