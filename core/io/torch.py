"""PyTorch checkpoints (``torch.save`` zip format) read without torch and without running code.

A checkpoint is a zip archive: ``<name>/data.pkl`` (the pickled object, e.g. a state_dict),
``<name>/data/<key>`` (raw little-endian bytes of each storage) and ``<name>/byteorder``.
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
        # ('storage', storage_type, key, location, numel)
        if (not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage"
                or not isinstance(pid[1], _StorageType) or not isinstance(pid[2], str)
                or not isinstance(pid[4], int) or isinstance(pid[4], bool) or pid[4] < 0):
            raise WeightsError(f"{self._where}: data.pkl has an unexpected persistent id {pid!r:.200}")
        _, stype, key, _location, numel = pid
        entry = f"{self._prefix}data/{key}"
        if entry not in self._entries:
            raise WeightsError(f"{self._where}: data.pkl refers to storage {key!r} but the archive has no "
                               f"{entry!r}")
        s = self._storages.get(key)
        if s is None:
            s = self._storages[key] = _Storage(stype, key, numel)
        elif s.stype is not stype or s.numel != numel:
            raise WeightsError(f"{self._where}: storage {key!r} is described two different ways")
        return s


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
    def __init__(self, zf: zipfile.ZipFile, where: str, prefix: str, device):
        self.zf, self.where, self.prefix, self.device = zf, where, prefix, device
        self.big_endian = False
        storage_bytes = sum(i.file_size for i in zf.infolist() if i.filename.startswith(prefix + "data/"))
        self.view_budget = 2 * storage_bytes + VIEW_SLACK_BYTES
        self.view_bytes = 0
        self.views: dict = {}   # identical views (same storage, offset, size, stride) load once

    def storage_bytes(self, s: _Storage, itemsize: int) -> bytes:
        if s._raw is None:
            name = f"{self.prefix}data/{s.key}"
            info = self.zf.getinfo(name)
            need = s.numel * itemsize
            if info.file_size != need:
                raise WeightsError(f"{self.where}: storage {name!r} holds {info.file_size} bytes but data.pkl "
                                   f"says {s.numel} elements of {itemsize} bytes ({need})")
            raw = self.zf.read(name)
            if len(raw) != need:   # the zip directory's size is only a claim: check what was read
                raise WeightsError(f"{self.where}: storage {name!r} gave {len(raw)} bytes, not the {need} its zip "
                                   f"entry and data.pkl claim (corrupt archive)")
            if self.big_endian and itemsize > 1:
                from array import array

                a = array(_ITEM_CODES[itemsize], raw)
                a.byteswap()
                raw = a.tobytes()
            s._raw = raw
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


def _open_zip(source, where: str):
    """(ZipFile, underlying file) or WeightsError saying what the bytes are instead."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        f = io.BytesIO(bytes(source))
    else:
        try:
            f = open(source, "rb")
        except OSError as e:
            raise WeightsError(f"{where}: cannot open ({e.strerror or e})") from e
    head = f.read(16)
    f.seek(0)
    try:
        return zipfile.ZipFile(f), f
    except Exception as e:  # BadZipFile, or OSError/ValueError/... from a mangled directory
        f.close()
        if head.startswith(b"PK"):
            raise WeightsError(f"{where}: corrupt zip archive ({type(e).__name__}: {str(e)[:200]})") from None
    if head.startswith(b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19"):
        raise WeightsError(f"{where}: this is PyTorch's legacy (pre-1.6, non-zip) checkpoint format, which "
                           f"ember does not read; re-save it with a current torch: "
                           f"torch.save(torch.load(path, weights_only=True), new_path)")
    if len(head) >= 9 and head[8:9] == b"{":
        raise WeightsError(f"{where}: not a PyTorch zip checkpoint; it looks like safetensors, "
                           f"use ember.load_safetensors")
    raise WeightsError(f"{where}: not a PyTorch checkpoint (not a zip archive; first bytes {head[:8]!r})")


def load_torch(source, device: str | None = None) -> dict:
    """Read a PyTorch checkpoint written by ``torch.save`` (a path or bytes) into ember Tensors
    on ``device``, without importing torch or executing anything from the file.

    Returns what was saved with every tensor converted (usually ``{name: Tensor}``). Raises
    ``WeightsError`` for a malformed archive, a global outside the state_dict allowlist (named
    in the message), an out-of-range view, an unsupported dtype, or the legacy non-zip format.
    See the module docstring for an example.
    """
    where = f"PyTorch checkpoint {source!r}" if isinstance(source, (str, os.PathLike)) else \
        f"PyTorch checkpoint <{len(source)} bytes>"
    zf, f = _open_zip(source, where)
    try:
        return _load(zf, where, device)
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
    loader = _Loader(zf, where, prefix, device)
    if prefix + "byteorder" in names:
        order = zf.read(prefix + "byteorder")
        if order not in (b"little", b"big"):
            raise WeightsError(f"{where}: byteorder is {order[:20]!r}, expected 'little' or 'big'")
        loader.big_endian = order == b"big"
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
