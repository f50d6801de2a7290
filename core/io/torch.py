"""PyTorch checkpoints (``torch.save``, both formats) read without torch and without running code.

Since PyTorch 1.6 a checkpoint is a zip archive: ``<name>/data.pkl`` (the pickled object, e.g. a
state_dict), ``<name>/data/<key>`` (raw little-endian bytes of each storage) and
``<name>/byteorder``. Older checkpoints (the *legacy* format, still common among published
weights) are one stream: five pickles -- a magic number, the protocol version (1001), a small
system-info dict, the object, the list of storage keys -- followed, for each key in that list, by
the storage's element count (int64, little-endian) and its raw little-endian bytes. Both go through
the same restricted unpickler and the same tensor checks; in the legacy stream every count and
length is checked against the bytes that are really there before anything is allocated.
Unpickling an arbitrary pickle can call any Python function, so ``data.pkl`` is read by a
restricted unpickler: the only globals it resolves are the handful a state_dict uses, and each
resolves to a small function written here (torch is never imported). Any other global --
``os.system``, ``builtins.eval``, ``subprocess.Popen``, even other torch functions -- raises
``WeightsError`` naming it, before anything is called.

Tensors may be views (storage offset, arbitrary strides, shared storages); they come back as
contiguous ember Tensors. dtypes: float32, float16, int64, int32, uint8 and bool keep their
dtype; bfloat16 becomes float32 (exact). The result has the structure that was saved: dicts
(an OrderedDict becomes a dict), lists and tuples of tensors, and plain Python scalars/strings.

>>> import ember, io, zipfile
>>> buf = io.BytesIO()
>>> with zipfile.ZipFile(buf, "w") as z:   # what torch.save({"w": torch.tensor([1.5])}) writes
...     z.writestr("archive/data.pkl", b"\\x80\\x02}X\\x01\\x00\\x00\\x00wctorch._utils\\n_rebuild_tensor_v2\\n"
...         b"((X\\x07\\x00\\x00\\x00storagectorch\\nFloatStorage\\nX\\x01\\x00\\x00\\x000X\\x03\\x00\\x00\\x00cpu"
...         b"K\\x01tQK\\x00K\\x01\\x85K\\x01\\x85\\x89ccollections\\nOrderedDict\\n)RtRs.")
...     z.writestr("archive/data/0", b"\\x00\\x00\\xc0\\x3f")
>>> ember.load_torch(buf.getvalue())["w"].tolist()
[1.5]
"""
from __future__ import annotations

import collections
import io
import os
import pickle
import zipfile
from math import prod

from .. import dtypes as _dt
from .. import limits as _limits
from ..errors import EmberError, ResourceError, WeightsError
from ..tensor import Tensor, from_bytes
from .safetensors import _BOOL_BYTES, bf16_to_f32_bytes

__all__ = ["load_torch"]

# torch storage class -> (dtype name in messages, ember dtype or None if unsupported, itemsize)
_STORAGES = {
    "FloatStorage": ("float32", _dt.float32, 4),
    "HalfStorage": ("float16", _dt.float16, 2),
    "BFloat16Storage": ("bfloat16", _dt.float32, 2),
    "LongStorage": ("int64", _dt.int64, 8),
    "IntStorage": ("int32", _dt.int32, 4),
    "ByteStorage": ("uint8", _dt.uint8, 1),
    "BoolStorage": ("bool", _dt.bool_, 1),
    "UntypedStorage": ("uint8", _dt.uint8, 1),
    # Recognised so the error names the dtype rather than the class.
    "DoubleStorage": ("float64", None, 8),
    "CharStorage": ("int8", None, 1),
    "ShortStorage": ("int16", None, 2),
    "ComplexFloatStorage": ("complex64", None, 8),
    "ComplexDoubleStorage": ("complex128", None, 16),
}
_ITEM_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}  # unsigned array codes used to move raw items


class _Guarded:
    """Base of every object the unpickler hands to the pickle: a pickle cannot set attributes
    on it (BUILD calls ``__setstate__``, which refuses), so one file cannot tamper with them."""

    __slots__ = ()

    def __setstate__(self, state):
        raise WeightsError(f"pickle tried to set the state of {self!r}; not a state_dict checkpoint")


class _StorageType(_Guarded):
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name}"


class _Storage(_Guarded):
    """One ``data/<key>`` entry; its bytes are read once, on first use, and shared by views."""

    __slots__ = ("stype", "key", "numel", "_raw")

    def __init__(self, stype, key, numel):
        self.stype, self.key, self.numel, self._raw = stype, key, numel, None

    def __repr__(self):
        return f"<storage {self.key!r} {self.stype!r}>"


class _StorageView(_Guarded):
    """Elements ``offset .. offset + numel - 1`` of a storage (legacy checkpoints of torch < 0.4)."""

    __slots__ = ("storage", "offset", "numel")

    def __init__(self, storage, offset, numel):
        self.storage, self.offset, self.numel = storage, offset, numel

    def __repr__(self):
        return f"<storage view of {self.storage.key!r}>"


class _TensorRef(_Guarded):
    __slots__ = ("storage", "offset", "size", "stride")

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride

    def __repr__(self):
        return "<tensor>"


class _Func(_Guarded):
    """An allowed global: a callable stand-in named like the torch function it replaces."""

    __slots__ = ("qualname", "fn")

    def __init__(self, qualname, fn):
        self.qualname, self.fn = qualname, fn

    def __call__(self, *args):
        return self.fn(*args)

    def __repr__(self):
        return self.qualname


def _rebuild_tensor(storage, offset, size, stride, *_ignored):
    # _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
    if isinstance(storage, _StorageView):   # shift into the root storage; tensor() checks the rest
        if (_count(offset) and isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride)
                and all(_count(v) for v in size + stride) and prod(size)):
            last = offset + sum((n - 1) * st for n, st in zip(size, stride))
            if last >= storage.numel:
                raise WeightsError(f"_rebuild_tensor: a view reaches element {last} of a storage view of "
                                   f"{storage.numel} elements")
        return _TensorRef(storage.storage, storage.offset + offset if _count(offset) else offset, size, stride)
    if not isinstance(storage, _Storage):
        raise WeightsError(f"_rebuild_tensor_v2: expected a storage, got {type(storage).__name__}")
    return _TensorRef(storage, offset, size, stride)


def _rebuild_parameter(data, *_ignored):
    # _rebuild_parameter(data, requires_grad, backward_hooks[, state]): a Parameter is its data here
    if not isinstance(data, _TensorRef):
        raise WeightsError(f"_rebuild_parameter: expected a tensor, got {type(data).__name__}")
    return data


def _allowed_globals() -> dict:
    """Fresh stand-ins for each load. ``collections.OrderedDict`` is the real (immutable, C)
    type: calling it only builds a dict."""
    table = {("collections", "OrderedDict"): collections.OrderedDict}
    for mod, name, fn in (("torch._utils", "_rebuild_tensor_v2", _rebuild_tensor),
                          ("torch._utils", "_rebuild_tensor", _rebuild_tensor),
                          ("torch._utils", "_rebuild_parameter", _rebuild_parameter),
                          ("torch._utils", "_rebuild_parameter_with_state", _rebuild_parameter)):
        table[(mod, name)] = _Func(f"{mod}.{name}", fn)
    for name in _STORAGES:
        table[("torch", name)] = _StorageType(name)
    return table


# Opcodes a checkpoint never needs and that make the C unpickler allocate what the file claims
# (BYTEARRAY8 preallocates its length) or reach outside the pickle (buffers, copyreg extensions).
_DENIED_OPCODES = {"BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER", "EXT1", "EXT2", "EXT4"}


def _check_opcodes(data: bytes, where: str) -> None:
    """Walk the opcodes before unpickling: pickletools checks every length against the bytes that
    are really there, so a 100-byte file cannot make the C unpickler preallocate gigabytes (for
    BINBYTES8 lengths or a memo index of 2**32)."""
    import pickletools

    ops = list(pickletools.genops(data))
    for op, arg, pos in ops:
        if op.name in _DENIED_OPCODES:
            raise WeightsError(f"{where}: data.pkl uses the pickle opcode {op.name} (byte {pos}), which a "
                               f"state_dict checkpoint never needs; refusing to load it")
        if op.name in ("PUT", "BINPUT", "LONG_BINPUT") and not 0 <= int(arg) <= len(ops):
            raise WeightsError(f"{where}: data.pkl memo index {arg} (byte {pos}) is out of range")


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, where: str, entries: set, prefix: str):
        super().__init__(io.BytesIO(data))
        self._where = where
        self._entries = entries
        self._prefix = prefix
        self._globals = _allowed_globals()
        self._storages: dict = {}

    def find_class(self, module, name):
        # Every global a pickle names (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT*) comes through here.
        g = self._globals.get((module, name))
        if g is None:
            raise WeightsError(f"{self._where}: data.pkl refers to the global {module}.{name}, which a "
                               f"state_dict checkpoint never needs; refusing to load it (nothing was run). "
                               f"Save only tensors: torch.save(model.state_dict(), path)")
        return g

    def persistent_load(self, pid):
        # zip: ('storage', storage_type, key, location, numel)
        # legacy: ('storage', storage_type, root_key, location, numel, view_metadata)
        #         with view_metadata None or (view_key, offset, size): a storage view (torch < 0.4)
        legacy = self._prefix is None
        if (not isinstance(pid, tuple) or len(pid) != (6 if legacy else 5) or pid[0] != "storage"
                or not isinstance(pid[1], _StorageType) or not isinstance(pid[2], str)
                or not _count(pid[4])):
            if legacy and isinstance(pid, tuple) and pid[:1] == ("module",):
                raise WeightsError(f"{self._where}: this legacy checkpoint pickles a whole module (its source "
                                   f"code), not a state_dict; save model.state_dict() instead")
            raise WeightsError(f"{self._where}: data.pkl has an unexpected persistent id {pid!r:.200}")
        _, stype, key, _location, numel = pid[:5]
        if not legacy:
            entry = f"{self._prefix}data/{key}"
            if entry not in self._entries:
                raise WeightsError(f"{self._where}: data.pkl refers to storage {key!r} but the archive has no "
                                   f"{entry!r}")
        s = self._storages.get(key)
        if s is None:
            s = self._storages[key] = _Storage(stype, key, numel)
        elif s.stype is not stype or s.numel != numel:
            raise WeightsError(f"{self._where}: storage {key!r} is described two different ways")
        view = pid[5] if legacy else None
        if view is None:
            return s
        if (not isinstance(view, tuple) or len(view) != 3 or not isinstance(view[0], str)
                or not _count(view[1]) or not _count(view[2]) or view[1] + view[2] > numel):
            raise WeightsError(f"{self._where}: storage {key!r} has a bad view {view!r:.100} (of {numel} elements)")
        return _StorageView(s, view[1], view[2])


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _merged_dims(size: tuple, stride: tuple) -> list:
    """(size, stride) axes of a view with size-1 axes dropped and neighbours merged where one
    stride steps over the whole inner axis (contiguous runs, and runs of zero strides)."""
    dims = [(m, st) for m, st in zip(size, stride) if m != 1]
    merged: list = []
    for m, st in reversed(dims):
        if merged and st == merged[-1][1] * merged[-1][0]:
            im, ist = merged[-1]
            merged[-1] = (m * im, ist)
        else:
            merged.append((m, st))
    merged.reverse()
    return merged


def _strided_bytes(raw: bytes, itemsize: int, offset: int, size: tuple, stride: tuple) -> bytes:
    """The elements of a strided view of ``raw``, gathered in row-major order.

    Works in blocks, never per element: the innermost axis is one strided slice (or one item
    repeated, for a zero stride), each outer axis joins or repeats the blocks below it, and a
    block is built once per distinct start offset. A zero-stride (``expand``ed) axis therefore
    costs one bytes repetition, and the Python-level work is bounded by the number of distinct
    block starts (at most the storage's element count per axis), not by the element count."""
    dims = _merged_dims(size, stride)
    if not dims:
        return raw[offset * itemsize:(offset + 1) * itemsize]
    if len(dims) == 1 and dims[0][1] == 1:
        return raw[offset * itemsize:(offset + dims[0][0]) * itemsize]
    items = memoryview(raw).cast(_ITEM_CODES[itemsize])
    # Start offsets needed at each level, outermost first.
    levels = [{offset}]
    for m, st in dims[:-1]:
        prev = levels[-1]
        levels.append(prev if st == 0 else {b + k * st for b in prev for k in range(m)})
    m, st = dims[-1]
    if st == 0:
        blocks = {b: items[b:b + 1].tobytes() * m for b in levels[-1]}
    else:
        blocks = {b: items[b:b + (m - 1) * st + 1:st].tobytes() for b in levels[-1]}
    for (m, st), starts in zip(reversed(dims[:-1]), reversed(levels[:-1])):
        if st == 0:
            blocks = {b: blocks[b] * m for b in starts}
        else:
            blocks = {b: b"".join([blocks[b + k * st] for k in range(m)]) for b in starts}
    return blocks[offset]


# A checkpoint may hold views that repeat elements (zero or overlapping strides, what torch.save
# writes for an expand()ed tensor): ember materialises every view, so the bytes all views of one
# file may come to are bounded: twice the storage bytes in the archive plus this much.
VIEW_SLACK_BYTES = 64 << 20
_PLAIN_KEYS = (str, int, float, bool, bytes, type(None))


class _Loader:
    """Turns what was unpickled into Tensors. ``fetch(storage, itemsize)`` returns a storage's raw
    little-endian bytes (already checked against the element count); ``storage_bytes`` is the
    total the checkpoint holds, which bounds what its views may materialise."""

    def __init__(self, where: str, device, storage_bytes: int, fetch):
        self.where, self.device, self.fetch = where, device, fetch
        self.view_budget = 2 * storage_bytes + VIEW_SLACK_BYTES
        self.view_bytes = 0
        self.views: dict = {}   # identical views (same storage, offset, size, stride) load once

    def storage_bytes(self, s: _Storage, itemsize: int) -> bytes:
        if s._raw is None:
            s._raw = self.fetch(s, itemsize)
        return s._raw

    def tensor(self, ref: _TensorRef, path: str) -> Tensor:
        what = f"{self.where}: tensor {path!r}"
        label, dtype, itemsize = _STORAGES[ref.storage.stype.name]
        if dtype is None:
            raise WeightsError(f"{what} has dtype {label}, which ember does not support; convert it "
                               f"(e.g. .float()) before saving")
        size, stride, offset = ref.size, ref.stride, ref.offset

        def ints(v):
            return isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
        if not (ints(size) and ints(stride) and len(size) == len(stride) and ints((offset,))):
            raise WeightsError(f"{what}: bad size {size!r:.100} / stride {stride!r:.100} / offset {offset!r:.50}")
        if len(size) > _limits.MAX_NDIM:
            raise WeightsError(f"{what}: {len(size)} dimensions (ember tensors have at most "
                               f"{_limits.MAX_NDIM}); the checkpoint is corrupt or hostile")
        key = (ref.storage.key, offset, size, stride)
        hit = self.views.get(key)
        if hit is not None:
            return hit
        numel = prod(size)
        nbytes = numel * dtype.itemsize
        if numel == 0:
            raw = b""
        else:
            last = offset + sum((n - 1) * st for n, st in zip(size, stride))
            if last >= ref.storage.numel:
                raise WeightsError(f"{what}: view (offset {offset}, size {size}, stride {stride}) reaches element "
                                   f"{last} of storage {ref.storage.key!r}, which has {ref.storage.numel}")
            # Before anything is read or allocated: a view of a few storage elements may claim
            # billions of them (zero strides).
            limit = _limits.max_tensor_bytes()
            if numel > ref.storage.numel and (limit is not None and nbytes > limit
                                              or self.view_bytes + nbytes > self.view_budget):
                raise WeightsError(
                    f"{what}: view with shape {size} and strides {stride} repeats the {ref.storage.numel} "
                    f"elements of storage {ref.storage.key!r} to {numel} elements ({nbytes} bytes of {dtype.name}),"
                    f" over " + (f"the {limit}-byte ceiling for one tensor" if limit is not None and nbytes > limit
                                 else f"what this checkpoint's views may materialise ({self.view_budget} bytes: "
                                      f"twice its storage bytes plus {VIEW_SLACK_BYTES})")
                    + "; refusing it before allocating anything (save it with .contiguous() or .clone() if it is real)")
            _limits.check_alloc("load_torch", size, dtype, what=f"tensor {path!r}")
            self.view_bytes += nbytes
            if self.view_bytes > self.view_budget:
                raise WeightsError(f"{what}: the checkpoint's views come to {self.view_bytes} bytes, more than "
                                   f"twice its {(self.view_budget - VIEW_SLACK_BYTES) // 2} storage bytes plus "
                                   f"{VIEW_SLACK_BYTES}; refusing to materialise them")
            raw = _strided_bytes(self.storage_bytes(ref.storage, itemsize), itemsize, offset, size, stride)
        if label == "bfloat16":
            raw = bf16_to_f32_bytes(raw)
        elif dtype is _dt.bool_:
            raw = raw.translate(_BOOL_BYTES)
        try:
            t = from_bytes(raw, size, dtype, device=self.device)
        except EmberError as e:  # e.g. int64 values the GPU cannot hold: say which tensor
            raise type(e)(f"{what}: {e}") from None
        self.views[key] = t
        return t

    def convert(self, obj, path: str, memo: dict):
        """Replace tensor references by Tensors throughout what was unpickled."""
        if isinstance(obj, (str, bytes, int, float, complex, type(None))):
            return obj
        key = id(obj)
        if key in memo:
            return memo[key]
        if isinstance(obj, _TensorRef):
            out = memo[key] = self.tensor(obj, path)
        elif isinstance(obj, dict):
            out = memo[key] = {}
            for k, v in obj.items():
                if not _plain_key(k):
                    raise WeightsError(f"{self.where}: {'dict ' + repr(path) if path else 'the checkpoint dict'} has "
                                       f"a key that is a {_kind(k)}, not a string or number; not a state_dict")
                out[k] = self.convert(v, f"{path}.{k}" if path else str(k), memo)
        elif isinstance(obj, list):
            out = memo[key] = []
            out.extend(self.convert(v, f"{path}.{i}" if path else str(i), memo) for i, v in enumerate(obj))
        elif isinstance(obj, tuple):
            out = memo[key] = tuple(self.convert(v, f"{path}.{i}" if path else str(i), memo)
                                    for i, v in enumerate(obj))
        else:
            raise WeightsError(f"{self.where}: {path or 'the checkpoint'} is a {obj!r:.80} object, "
                               f"not a tensor, container or plain value")
        return out


def _plain_key(k) -> bool:
    if isinstance(k, tuple):
        return all(_plain_key(x) for x in k)
    return isinstance(k, _PLAIN_KEYS)


def _kind(obj) -> str:
    if isinstance(obj, _TensorRef):
        return "tensor"
    return repr(obj)[:60] if isinstance(obj, _Guarded) else type(obj).__name__


def _open(source, where: str):
    """(ZipFile, underlying file) for the zip format, (None, bytes) for the legacy stream, or
    WeightsError saying what the bytes are instead."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        f = io.BytesIO(bytes(source))
    else:
        try:
            f = open(source, "rb")
        except OSError as e:
            raise WeightsError(f"{where}: cannot open ({e.strerror or e})") from e
    head = f.read(512)
    f.seek(0)
    try:
        return zipfile.ZipFile(f), f
    except Exception as e:  # BadZipFile, or OSError/ValueError/... from a mangled directory
        if head.startswith(b"PK"):
            f.close()
            raise WeightsError(f"{where}: corrupt zip archive ({type(e).__name__}: {str(e)[:200]})") from None
    try:
        if head[:1] == b"\x80":   # a pickle stream: the legacy format (any pickle protocol)
            f.seek(0)
            return None, f.read()
    finally:
        f.close()
    if head[257:262] == b"ustar":
        raise WeightsError(f"{where}: this is PyTorch's tar checkpoint format (torch < 0.1.10), which ember "
                           f"does not read; re-save it with a current torch")
    if len(head) >= 9 and head[8:9] == b"{":
        raise WeightsError(f"{where}: not a PyTorch zip checkpoint; it looks like safetensors, "
                           f"use ember.load_safetensors")
    raise WeightsError(f"{where}: not a PyTorch checkpoint (not a zip archive or a pickle stream; first "
                       f"bytes {head[:8]!r})")


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001


class _PlainUnpickler(pickle.Unpickler):
    """For the legacy header pickles and key list: plain values only, no globals, no ids."""

    def find_class(self, module, name):
        raise WeightsError(f"refers to the global {module}.{name}")

    def persistent_load(self, pid):
        raise WeightsError("has a persistent id")


def _load_legacy(data: bytes, where: str, device):
    """The pre-1.6 stream (see the module docstring). Every pickle's opcodes are walked before
    it is unpickled, every count and length is checked against the bytes left."""
    stream = io.BytesIO(data)
    import pickletools

    def next_pickle(what: str) -> tuple[bytes, int]:
        start = stream.tell()
        if start >= len(data):
            raise WeightsError(f"{where}: legacy checkpoint ends at byte {start}, before its {what}")
        try:
            for _ in pickletools.genops(stream):
                pass
        except Exception as e:  # noqa: BLE001 - truncated or garbled pickle
            raise WeightsError(f"{where}: legacy checkpoint: the {what} pickle at byte {start} is corrupt "
                               f"({type(e).__name__}: {str(e)[:160]})") from None
        return data[start:stream.tell()], start

    def plain(what: str):
        pkl, at = next_pickle(what)
        _check_opcodes(pkl, f"{where}: legacy checkpoint {what} (byte {at})")
        try:
            return _PlainUnpickler(io.BytesIO(pkl)).load()
        except WeightsError as e:
            raise WeightsError(f"{where}: legacy checkpoint: the {what} pickle at byte {at} {e}; refusing "
                               f"it (nothing was run)") from None

    magic = plain("magic number")
    if magic != _LEGACY_MAGIC:
        raise WeightsError(f"{where}: not a PyTorch checkpoint (a pickle stream without PyTorch's legacy "
                           f"magic number)")
    version = plain("protocol version")
    if version != _LEGACY_PROTOCOL:
        raise WeightsError(f"{where}: legacy checkpoint protocol version {version!r:.40}; ember reads "
                           f"{_LEGACY_PROTOCOL}")
    info = plain("system info")
    if not isinstance(info, dict):
        raise WeightsError(f"{where}: legacy checkpoint system info is a {type(info).__name__}, not a dict")
    pkl, at = next_pickle("object")
    _check_opcodes(pkl, where)
    up = _RestrictedUnpickler(pkl, where, set(), None)
    obj = up.load()
    keys = plain("storage key list")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        raise WeightsError(f"{where}: legacy checkpoint storage key list is not a list of distinct strings")
    missing = set(up._storages) - set(keys)
    if missing:
        raise WeightsError(f"{where}: legacy checkpoint never writes storage {sorted(missing)[0]!r}, which its "
                           f"object uses")
    pos, spans = stream.tell(), {}
    for key in keys:
        s = up._storages.get(key)
        if s is None:
            raise WeightsError(f"{where}: legacy checkpoint lists storage {key!r} (byte {pos}), which its "
                               f"object never uses")
        if pos + 8 > len(data):
            raise WeightsError(f"{where}: legacy checkpoint ends at byte {len(data)}, inside the header of "
                               f"storage {key!r} (byte {pos})")
        numel = int.from_bytes(data[pos:pos + 8], "little", signed=True)
        if numel != s.numel:
            raise WeightsError(f"{where}: legacy checkpoint storage {key!r} (byte {pos}) holds {numel} elements "
                               f"but the object says {s.numel}")
        nbytes = numel * _STORAGES[s.stype.name][2]
        if pos + 8 + nbytes > len(data):
            raise WeightsError(f"{where}: legacy checkpoint storage {key!r} needs {nbytes} bytes from byte "
                               f"{pos + 8} but the file ends at {len(data)} (truncated)")
        spans[key] = (pos + 8, nbytes)
        pos += 8 + nbytes

    def fetch(s: _Storage, itemsize: int) -> bytes:
        start, n = spans[s.key]
        return data[start:start + n]

    return _Loader(where, device, sum(n for _, n in spans.values()), fetch).convert(obj, "", {})


def load_torch(source, device: str | None = None) -> dict:
    """Read a PyTorch checkpoint written by ``torch.save`` (a path or bytes) into ember Tensors
    on ``device``, without importing torch or executing anything from the file.

    Returns what was saved with every tensor converted (usually ``{name: Tensor}``). Raises
    ``WeightsError`` for a malformed archive or stream, a global outside the state_dict allowlist
    (named in the message), an out-of-range view or an unsupported dtype. Reads the zip format
    (PyTorch >= 1.6) and the legacy pre-1.6 stream that many published checkpoints still use.
    See the module docstring for an example.
    """
    where = f"PyTorch checkpoint {source!r}" if isinstance(source, (str, os.PathLike)) else \
        f"PyTorch checkpoint <{len(source)} bytes>"
    zf, f = _open(source, where)
    try:
        return _load(zf, where, device) if zf is not None else _load_legacy(f, where, device)
    except EmberError:
        raise
    except RecursionError:
        raise WeightsError(f"{where}: data.pkl is nested too deeply") from None
    except MemoryError:
        raise ResourceError(f"{where}: ran out of memory while loading (the process's memory limit was "
                            f"reached below ember's per-tensor ceiling)", op="load_torch") from None
    except Exception as e:  # a corrupt archive or pickle can fail in many ways; report them all alike
        raise WeightsError(f"{where}: corrupt checkpoint ({type(e).__name__}: {str(e)[:200]})") from None
    finally:
        if zf is not None:
            zf.close()
            f.close()


def _load(zf: zipfile.ZipFile, where: str, device) -> dict:
    names = zf.namelist()
    pkls = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkls) != 1:
        if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
            raise WeightsError(f"{where}: this is a TorchScript archive (torch.jit.save), not a state_dict; "
                               f"save model.state_dict() with torch.save instead")
        raise WeightsError(f"{where}: expected exactly one <name>/data.pkl in the archive, found {pkls or 'none'}")
    prefix = pkls[0][:-len("data.pkl")]
    big_endian = False
    if prefix + "byteorder" in names:
        order = zf.read(prefix + "byteorder")
        if order not in (b"little", b"big"):
            raise WeightsError(f"{where}: byteorder is {order[:20]!r}, expected 'little' or 'big'")
        big_endian = order == b"big"

    def fetch(s: _Storage, itemsize: int) -> bytes:
        name = f"{prefix}data/{s.key}"
        info = zf.getinfo(name)
        need = s.numel * itemsize
        if info.file_size != need:
            raise WeightsError(f"{where}: storage {name!r} holds {info.file_size} bytes but data.pkl "
                               f"says {s.numel} elements of {itemsize} bytes ({need})")
        raw = zf.read(name)
        if len(raw) != need:   # the zip directory's size is only a claim: check what was read
            raise WeightsError(f"{where}: storage {name!r} gave {len(raw)} bytes, not the {need} its zip "
                               f"entry and data.pkl claim (corrupt archive)")
        if big_endian and itemsize > 1:
            from array import array

            a = array(_ITEM_CODES[itemsize], raw)
            a.byteswap()
            raw = a.tobytes()
        return raw

    total = sum(i.file_size for i in zf.infolist() if i.filename.startswith(prefix + "data/"))
    loader = _Loader(where, device, total, fetch)
    for info in zf.infolist():
        # torch.save stores entries uncompressed; refusing compression rules out zip bombs.
        if info.filename.startswith(prefix) and info.compress_type != zipfile.ZIP_STORED:
            raise WeightsError(f"{where}: entry {info.filename!r} is compressed (zip method "
                               f"{info.compress_type}); torch.save never compresses, re-save the checkpoint")
    pkl = zf.read(pkls[0])
    _check_opcodes(pkl, where)
    up = _RestrictedUnpickler(pkl, where, set(names), prefix)
    obj = up.load()
    return loader.convert(obj, "", {})
