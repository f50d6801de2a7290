"""safetensors in pure Python: a lazy, fully validated reader and a byte-compatible writer.

The format: an 8-byte little-endian header length ``N``, ``N`` bytes of JSON (an object from
tensor name to ``{"dtype", "shape", "data_offsets"}`` plus an optional ``"__metadata__"`` object
of strings), then the data section; ``data_offsets`` are ``[begin, end)`` byte ranges relative
to the start of the data section.

Reading is lazy: ``load_safetensors`` parses and checks the header only; a tensor's bytes are
read (from the file, or sliced from the bytes) and converted when the tensor is accessed.
Every header field is checked first and any problem raises ``WeightsError`` naming the source,
the tensor and the byte offsets. The rules are the reference implementation's: known dtype,
shape a list of non-negative ints, ``0 <= begin <= end``, ``end - begin == prod(shape) *
itemsize``, and the tensors tile the data section exactly (no overlap, no gap, no trailing
bytes).

dtypes: F32, F16, I64, I32, U8 and BOOL map to the ember dtype of the same name. BF16 becomes
float32 (exact: a bfloat16 is the top half of a float32). Other dtypes raise WeightsError.

>>> import ember
>>> raw = ember.save_safetensors({"w": ember.tensor([[1.0, 2.0]]), "n": ember.tensor([3])})
>>> sd = ember.load_safetensors(raw)
>>> sorted(sd), sd["w"].tolist(), sd["n"].dtype
(['n', 'w'], [[1.0, 2.0]], ember.int64)
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from math import prod

from .. import dtypes as _dt
from .. import limits as _limits
from ..errors import ResourceError, WeightsError
from ..tensor import Tensor, from_bytes

__all__ = ["load_safetensors", "save_safetensors", "SafeTensors"]

# A header larger than this is refused before it is read (the reference caps it at 100 MB too);
# a real header is a few hundred bytes per tensor.
MAX_HEADER_BYTES = 100_000_000

# file dtype -> (ember dtype, bytes per element in the file)
_DTYPES = {
    "F32": (_dt.float32, 4),
    "F16": (_dt.float16, 2),
    "BF16": (_dt.float32, 2),
    "I64": (_dt.int64, 8),
    "I32": (_dt.int32, 4),
    "U8": (_dt.uint8, 1),
    "BOOL": (_dt.bool_, 1),
}
# The reference writer sorts tensors by descending dtype alignment (its dtype enum order), then
# by name; these ranks reproduce that order for the dtypes ember writes.
_WRITE_RANK = {"I64": 5, "F32": 4, "I32": 3, "F16": 2, "U8": 1, "BOOL": 0}
_BOOL_BYTES = bytes([0]) + bytes([1]) * 255  # translate table: any nonzero byte -> True (1)

PathOrBytes = "str | os.PathLike | bytes | bytearray | memoryview"


def bf16_to_f32_bytes(raw: bytes) -> bytes:
    """Little-endian bfloat16 values -> the same values as float32 (exact: a bfloat16 is the high
    half of a float32, so two zero bytes go below each value)."""
    wide = bytearray(2 * len(raw))
    wide[2::4] = raw[0::2]
    wide[3::4] = raw[1::2]
    return bytes(wide)


class _Source:
    """Where the bytes come from: ``read(begin, end)`` of absolute offsets, ``size``, ``name``."""

    def __init__(self, src):
        if isinstance(src, (bytes, bytearray, memoryview)):
            mv = memoryview(src)
            self._mem = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
            self._path = None
            self.size = self._mem.nbytes
            self.name = f"<{self.size} bytes>"
        elif isinstance(src, (str, os.PathLike)):
            self._mem = None
            self._path = os.fspath(src)
            self.name = repr(self._path)
            try:
                self.size = os.stat(self._path).st_size
            except OSError as e:
                raise WeightsError(f"safetensors {self.name}: cannot open ({e.strerror or e})") from e
        else:
            raise TypeError(f"load_safetensors: expected a path or bytes-like object, not {type(src).__name__}")

    def read(self, begin: int, end: int) -> bytes:
        if self._mem is not None:
            return bytes(self._mem[begin:end])
        try:
            with open(self._path, "rb") as f:
                f.seek(begin)
                data = f.read(end - begin)
        except OSError as e:
            raise WeightsError(f"safetensors {self.name}: cannot read bytes {begin}..{end} ({e})") from e
        if len(data) != end - begin:
            raise WeightsError(f"safetensors {self.name}: file ended at byte {begin + len(data)} while reading "
                               f"bytes {begin}..{end} (was it truncated after opening?)")
        return data


_MAX_DIM = (1 << 63) - 1   # sizes are int64 in every framework that writes safetensors


def _short(shape) -> str:
    return repr(shape) if len(shape) <= 8 else f"[{', '.join(map(str, shape[:8]))}, ... {len(shape)} dims]"


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise WeightsError(f"duplicate key {k!r}")
        d[k] = v
    return d


class SafeTensors(Mapping):
    """A lazy, read-only mapping from tensor name to ``Tensor`` over a safetensors file or bytes.

    The header is parsed and checked on construction; ``sd[name]`` reads and converts that one
    tensor (every access builds a new Tensor). ``metadata`` is the ``__metadata__`` dict (or
    ``{}``); ``info(name)`` gives ``(file_dtype, shape, (begin, end))`` without reading data.
    Iteration follows the header's order.
    """

    def __init__(self, source, device: str | None = None):
        self._src = src = _Source(source)
        self.device = device
        self._entries: dict = {}
        self.metadata: dict = {}
        where = f"safetensors {src.name}"
        if src.size < 8:
            raise WeightsError(f"{where}: {src.size} bytes is shorter than the 8-byte header length field")
        n = int.from_bytes(src.read(0, 8), "little")
        if n > MAX_HEADER_BYTES:
            raise WeightsError(f"{where}: header length {n} (bytes 0..8) exceeds the {MAX_HEADER_BYTES}-byte "
                               f"limit; this is not a safetensors file or it is corrupt")
        if 8 + n > src.size:
            raise WeightsError(f"{where}: header length {n} (bytes 0..8) runs past the end of the "
                               f"{src.size}-byte file (truncated download?)")
        self._data_start = start = 8 + n
        data_size = src.size - start
        try:
            header = json.loads(src.read(8, start).decode("utf-8"), object_pairs_hook=_no_duplicates)
        except UnicodeDecodeError as e:
            raise WeightsError(f"{where}: header (bytes 8..{start}) is not UTF-8 text: {e.reason} at "
                               f"file byte {8 + e.start}") from None
        except json.JSONDecodeError as e:
            raise WeightsError(f"{where}: header (bytes 8..{start}) is not valid JSON: {e.msg} at "
                               f"header char {e.pos}") from None
        except WeightsError as e:
            raise WeightsError(f"{where}: header (bytes 8..{start}) has a {e}") from None
        except RecursionError:
            raise WeightsError(f"{where}: header (bytes 8..{start}) is nested too deeply") from None
        except ValueError as e:  # e.g. an integer longer than Python's int parser accepts
            raise WeightsError(f"{where}: header (bytes 8..{start}) is not a valid safetensors header: "
                               f"{str(e)[:200]}") from None
        except MemoryError:
            raise ResourceError(f"{where}: the {n}-byte header does not fit in memory", op="load_safetensors",
                                nbytes=n) from None
        if not isinstance(header, dict):
            raise WeightsError(f"{where}: header (bytes 8..{start}) must be a JSON object, "
                               f"not {type(header).__name__}")
        meta = header.pop("__metadata__", None)
        if meta is not None:
            if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
                raise WeightsError(f"{where}: __metadata__ must be an object of strings, got {meta!r:.200}")
            self.metadata = meta
        spans = []
        for name, e in header.items():
            what = f"{where}: tensor {name!r}"
            if not isinstance(e, dict):
                raise WeightsError(f"{what}: header entry must be an object, not {type(e).__name__}")
            for key in ("dtype", "shape", "data_offsets"):
                if key not in e:
                    raise WeightsError(f"{what}: header entry has no {key!r}")
            dt, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
            if not isinstance(dt, str) or dt not in _DTYPES:
                raise WeightsError(f"{what}: dtype {dt!r} is not supported (ember reads "
                                   f"{', '.join(_DTYPES)}); convert the tensor before saving")
            if not isinstance(shape, list) or not all(_is_int(s) and 0 <= s <= _MAX_DIM for s in shape):
                raise WeightsError(f"{what}: shape must be a list of non-negative integers below 2**63, "
                                   f"got {shape!r:.200}")
            if len(shape) > _limits.MAX_NDIM:
                raise WeightsError(f"{what}: shape has {len(shape)} dimensions; ember tensors have at most "
                                   f"{_limits.MAX_NDIM}")
            if prod(d for d in shape if d) > _MAX_DIM:
                raise WeightsError(f"{what}: shape {_short(shape)} has more than 2**63 - 1 elements")
            if (not isinstance(offs, list) or len(offs) != 2 or not all(_is_int(o) for o in offs)
                    or not 0 <= offs[0] <= offs[1]):
                raise WeightsError(f"{what}: data_offsets must be [begin, end] with 0 <= begin <= end, "
                                   f"got {offs!r:.200}")
            begin, end = offs
            if end > data_size:
                raise WeightsError(f"{what}: data_offsets [{begin}, {end}] (file bytes {start + begin}.."
                                   f"{start + end}) run past the end of the {data_size}-byte data section "
                                   f"(file size {src.size}; truncated?)")
            need = prod(shape) * _DTYPES[dt][1]
            if end - begin != need:
                raise WeightsError(f"{what}: data_offsets [{begin}, {end}] hold {end - begin} bytes but "
                                   f"shape {tuple(shape)} of {dt} needs {need}")
            self._entries[name] = (dt, tuple(shape), begin, end)
            spans.append((begin, end, name))
        # The tensors must tile the data section exactly, as the format requires.
        spans.sort()
        pos, prev = 0, None
        for begin, end, name in spans:
            if begin < pos:
                raise WeightsError(f"{where}: tensor {name!r} data_offsets [{begin}, {end}] overlap tensor "
                                   f"{prev[2]!r} [{prev[0]}, {prev[1]}]; safetensors forbids overlapping tensors")
            if begin > pos:
                raise WeightsError(f"{where}: data bytes [{pos}, {begin}) (file bytes {start + pos}.."
                                   f"{start + begin}) belong to no tensor (before {name!r}); the file is corrupt")
            pos, prev = end, (begin, end, name)
        if pos != data_size:
            raise WeightsError(f"{where}: {data_size - pos} trailing bytes after the last tensor (data section "
                               f"is {data_size} bytes, tensors cover {pos}); the file is corrupt")

    def __getitem__(self, name: str) -> Tensor:
        try:
            dt, shape, begin, end = self._entries[name]
        except (KeyError, TypeError):
            raise KeyError(name) from None
        _limits.check_alloc("load_safetensors", shape, _DTYPES[dt][0], what=f"tensor {name!r}")
        raw = self._src.read(self._data_start + begin, self._data_start + end)
        if dt == "BF16":
            raw = bf16_to_f32_bytes(raw)
        elif dt == "BOOL":
            raw = raw.translate(_BOOL_BYTES)
        return from_bytes(raw, shape, _DTYPES[dt][0], device=self.device)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries

    def info(self, name: str) -> tuple:
        """``(file_dtype, shape, (begin, end))`` of tensor ``name`` from the header, no data read."""
        dt, shape, begin, end = self._entries[name]
        return dt, shape, (begin, end)

    def shape(self, name: str) -> tuple:
        """The shape of tensor ``name`` (from the header, no data read)."""
        return self._entries[name][1]

    def __repr__(self) -> str:
        return f"<SafeTensors {self._src.name}: {len(self)} tensors>"


def load_safetensors(source, device: str | None = None) -> SafeTensors:
    """Open a safetensors file (a path) or bytes (``bytes``/``bytearray``/``memoryview``, e.g.
    what the browser fetched) as a lazy ``{name: Tensor}`` mapping on ``device``.

    The header is checked now; data is read per tensor on access. ``dict(load_safetensors(p))``
    reads everything. Raises ``WeightsError`` for any malformed or inconsistent header.

    >>> import ember
    >>> raw = ember.save_safetensors({"b": ember.tensor([0.5, -1.0])}, metadata={"format": "pt"})
    >>> sd = ember.load_safetensors(raw)
    >>> sd["b"].tolist(), sd.metadata
    ([0.5, -1.0], {'format': 'pt'})
    """
    return SafeTensors(source, device=device)


def save_safetensors(tensors: Mapping, path=None, metadata: Mapping | None = None) -> bytes | None:
    """Serialize ``{name: Tensor}`` in the safetensors format; write it to ``path`` (returns None)
    or return the bytes.

    The output is byte-identical to the ``safetensors`` package's for the same tensors: compact
    JSON header padded with spaces to a multiple of 8 bytes, tensors ordered by descending dtype
    alignment then name. ``metadata`` (strings to strings) is written with sorted keys (the
    package's order is arbitrary when there is more than one key).

    >>> import ember
    >>> raw = ember.save_safetensors({"x": ember.tensor([1, 2], dtype="uint8")})
    >>> int.from_bytes(raw[:8], "little"), raw[8:]
    (56, b'{"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}   \\x01\\x02')
    """
    if not isinstance(tensors, Mapping):
        raise TypeError(f"save_safetensors: tensors must be a mapping of name -> Tensor, not {type(tensors).__name__}")
    items = []
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise WeightsError(f"save_safetensors: tensor names must be strings, got {name!r}")
        if name == "__metadata__":
            raise WeightsError("save_safetensors: '__metadata__' is reserved and cannot name a tensor")
        if not isinstance(t, Tensor):
            raise WeightsError(f"save_safetensors: {name!r} is a {type(t).__name__}, not an ember Tensor")
        items.append((name, t))
    items.sort(key=lambda kv: (-_WRITE_RANK[kv[1].dtype.safetensors], kv[0]))
    header: dict = {}
    if metadata is not None:
        if not isinstance(metadata, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise WeightsError(f"save_safetensors: metadata must map strings to strings, got {metadata!r:.200}")
        header["__metadata__"] = dict(sorted(metadata.items()))
    chunks = []
    pos = 0
    for name, t in items:
        raw = t._bytes()
        header[name] = {"dtype": t.dtype.safetensors, "shape": list(t.shape), "data_offsets": [pos, pos + len(raw)]}
        pos += len(raw)
        chunks.append(raw)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    chunks[:0] = [len(text).to_bytes(8, "little"), text]
    if path is None:
        return b"".join(chunks)
    with open(path, "wb") as f:
        for c in chunks:
            f.write(c)
    return None
