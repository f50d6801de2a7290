"""GGUF in pure Python: a lazy, fully checked reader (llama.cpp's model format, versions 2 and 3).

The layout (little-endian): ``b"GGUF"``, a uint32 version, uint64 tensor and metadata counts;
the metadata key/value pairs (a key is a uint64-length UTF-8 string, a value a uint32 type tag
and the value: integers of 8 to 64 bits, float32/64, bool, string, or an array of one element
type, arrays nesting); the tensor infos (name, uint32 rank, uint64 dims with the fastest axis
first, uint32 ggml type, uint64 offset into the data section); padding to ``general.alignment``
(32 by default); the data section.

Reading is lazy: ``load_gguf`` parses and checks the header (metadata and tensor infos); a file
is memory-mapped, so a tensor's bytes are only touched when it is used, and on the numpy device
a tensor *is* a view of the mapping (no copy: loading a whole model costs about the file's size
of memory). Where mapping would copy the file into memory (Pyodide, whose file system lives in
JavaScript) or is missing, a path is read instead: the header first (more of it only if it runs
on), then each tensor's bytes straight into its buffer when it is built. On the python and wasm
devices a quantized tensor's int32 words are filled with one copy from the file or the caller's
bytes (``readinto``/a slice assignment), never through intermediate ``bytes``: a model held by
ember costs its tensors' bytes, whatever it was loaded from. Every length, count, offset and dimension is checked against the bytes left before
it is used (a count is only believed if ``count * smallest element`` fits), and any problem
raises ``ember.errors.GGUFError`` naming the key or tensor and the byte offset.

Tensors keep the file's storage: ``f.tensor(name)`` gives a float32 ``Tensor`` for F32 (and for
1-D F16/BF16: norms, biases), and an ``ember.quant.QTensor`` (the raw blocks, never expanded)
for quantized and 2-D half-precision matrices; ``dequantize=True`` gives float32 always. Shapes
are row-major (numpy order: the file's dims reversed), so a linear weight is ``(n_out, n_in)``.
Tensors of a type ember does not read (IQ2_*, IQ3_*, IQ1_*, TQ*, MXFP4, ...) are listed; using one raises
``UnsupportedOp`` naming the type and the tensor.

>>> import ember
>>> f = ember.load_gguf(_tiny_gguf())
>>> f.version, f.metadata["general.architecture"], f.metadata["llama.block_count"]
(3, 'llama', 2)
>>> info = f.tensors["w"]
>>> info.shape, info.qtype, info.nbytes
((2, 32), 'q8_0', 68)
>>> f.tensor("w")
QTensor(q8_0, shape=(2, 32), device='python')
>>> f.tensor("w", dequantize=True).tolist()[1][:3]
[-1.0, -1.0, -1.0]
>>> f.tensor("norm").tolist()
[1.0, 2.0]
"""
from __future__ import annotations

import os
import struct
import sys
from array import array
from math import prod
from typing import NamedTuple

from .. import dtypes as _dt
from .. import limits as _limits
from ..errors import GGUFError, UnsupportedOp
from ..quant import BY_GGML_TYPE, GGML_TYPES, QTensor

__all__ = ["load_gguf", "GGUFFile", "GGUFTensorInfo", "VALUE_TYPES"]

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                  # GGML_MAX_DIMS: ggml tensors have at most 4 axes
MAX_DEPTH = 8                 # arrays of arrays nest at most this deep (real files: 1)
_INT64_MAX = (1 << 63) - 1

# GGUF metadata value types: tag -> (name, struct format or None, bytes per element)
VALUE_TYPES = {
    0: ("UINT8", "B", 1), 1: ("INT8", "b", 1), 2: ("UINT16", "H", 2), 3: ("INT16", "h", 2),
    4: ("UINT32", "I", 4), 5: ("INT32", "i", 4), 6: ("FLOAT32", "f", 4), 7: ("BOOL", "?", 1),
    8: ("STRING", None, 8), 9: ("ARRAY", None, 12), 10: ("UINT64", "Q", 8), 11: ("INT64", "q", 8),
    12: ("FLOAT64", "d", 8),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7

# (elements per block, bytes per block) of the ggml types ember does not dequantize, so their
# byte ranges are checked too (the ones it does come from ember.quant.FORMATS)
_OTHER_SIZES = {
    9: (32, 36), 15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50),
    21: (256, 110), 22: (256, 82), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
    29: (256, 56), 34: (256, 54), 35: (256, 66), 39: (32, 17),
}

_ZERO_WORD = bytes(4)
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _block_size(ggml_type: int):
    f = BY_GGML_TYPE.get(ggml_type)
    return (f.block, f.nbytes) if f is not None else _OTHER_SIZES.get(ggml_type)


def _type_name(ggml_type: int) -> str:
    return GGML_TYPES.get(ggml_type, f"type {ggml_type}")


class GGUFTensorInfo(NamedTuple):
    """One tensor's header entry. ``shape``: row-major (the file's dims reversed); ``qtype``: the
    ``ember.quant.FORMATS`` key (``"q4_1"``...), or the ggml name in lower case for a type ember
    does not read; ``ggml_type``: its number; ``offset``: the absolute byte offset of its data in
    the file; ``nbytes``: its size in bytes (None for a type number ggml does not define)."""

    name: str
    shape: tuple
    qtype: str
    ggml_type: int
    offset: int
    nbytes: int | None

    @property
    def supported(self) -> bool:
        """Whether ember reads this tensor's type."""
        return self.ggml_type in BY_GGML_TYPE


class _NeedMore(Exception):
    """The header runs past the bytes read so far from a file: read up to ``upto``, parse again."""

    def __init__(self, upto: int):
        super().__init__(upto)
        self.upto = upto


class _Reader:
    """A cursor over the file's bytes; every read checks the bytes left first. ``mv`` may be the
    first ``avail`` bytes of a longer file of ``size`` bytes: a read past them (but within the
    file) raises ``_NeedMore``."""

    __slots__ = ("mv", "pos", "size", "avail", "where")

    def __init__(self, mv: memoryview, where: str, size: int | None = None):
        self.mv, self.pos, self.avail, self.where = mv, 0, mv.nbytes, where
        self.size = mv.nbytes if size is None else size

    def fail(self, what: str, msg: str, at: int | None = None):
        raise GGUFError(f"{self.where}: {what} (byte {self.pos if at is None else at}): {msg}")

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            self.fail(what, f"needs {n} bytes but the file ends after {self.size - self.pos} more "
                            f"(file size {self.size}; truncated?)")
        if n > self.avail - self.pos:
            raise _NeedMore(self.pos + n)

    def u32(self, what: str) -> int:
        self.need(4, what)
        v = _U32.unpack_from(self.mv, self.pos)[0]
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        v = _U64.unpack_from(self.mv, self.pos)[0]
        self.pos += 8
        return v

    def string(self, what: str, strict: bool = True) -> str:
        at = self.pos
        n = self.u64(what)
        if n > self.size - self.pos:
            self.fail(what, f"string length {n} runs past the end of the file ({self.size - self.pos} "
                            f"bytes left, file size {self.size})", at)
        if n > self.avail - self.pos:
            raise _NeedMore(self.pos + n)
        raw = self.mv[self.pos:self.pos + n]
        self.pos += n
        try:
            return str(raw, "utf-8") if strict else str(raw, "utf-8", "surrogateescape")
        except UnicodeDecodeError as e:
            self.fail(what, f"is not UTF-8 text ({e.reason} at string byte {e.start})", at)

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype == _STRING:
            return self.string(what, strict=False)
        if vtype == _ARRAY:
            return self.array(what, depth + 1)
        spec = VALUE_TYPES.get(vtype)
        if spec is None:
            self.fail(what, f"unknown value type {vtype} (GGUF defines 0..12)", self.pos - 4)
        self.need(spec[2], what)
        v = struct.unpack_from("<" + spec[1], self.mv, self.pos)[0]
        self.pos += spec[2]
        return v

    def array(self, what: str, depth: int) -> list:
        at = self.pos
        if depth > MAX_DEPTH:
            self.fail(what, f"arrays nest more than {MAX_DEPTH} deep")
        etype = self.u32(what + " array element type")
        spec = VALUE_TYPES.get(etype)
        if spec is None:
            self.fail(what, f"array of unknown value type {etype} (GGUF defines 0..12)", at)
        count = self.u64(what + " array length")
        left = self.size - self.pos
        # believe a count only if its elements, at their smallest, fit in the bytes left
        if count > left // spec[2]:
            self.fail(what, f"array of {count} {spec[0]} elements needs at least {count * spec[2]} bytes but "
                            f"only {left} are left (file size {self.size})", at)
        if spec[1] is not None:                        # fixed-size elements: one unpack
            n = count * spec[2]
            if n > self.avail - self.pos:
                raise _NeedMore(self.pos + n)
            if etype == _BOOL:
                out = [b != 0 for b in self.mv[self.pos:self.pos + n]]
            else:
                out = list(struct.unpack_from(f"<{count}{spec[1]}", self.mv, self.pos))
            self.pos += n
            return out
        if etype == _STRING:
            return self._strings(count, what)
        return [self.array(f"{what}[{i}]", depth + 1) for i in range(count)]

    def _strings(self, count: int, what: str) -> list:
        # the hot loop of a tokenizer's vocabulary (~50,000 strings): locals only
        mv, size, avail, pos = self.mv, self.size, self.avail, self.pos
        unpack = _U64.unpack_from
        out = []
        append = out.append
        for i in range(count):
            if avail - pos < 8:
                self.pos = pos
                self.need(8, f"{what}[{i}] length")
            n = unpack(mv, pos)[0]
            pos += 8
            if n > avail - pos:
                self.pos = pos
                if n > size - pos:
                    self.fail(f"{what}[{i}]", f"string length {n} runs past the end of the file "
                                              f"({size - pos} bytes left, file size {size})", pos - 8)
                raise _NeedMore(pos + n)
            append(str(mv[pos:pos + n], "utf-8", "surrogateescape"))
            pos += n
        self.pos = pos
        return out


# Where a memory map would be a copy of the file in memory (Emscripten maps a file by reading
# it into the heap), a path is read piece by piece instead.
_MAP_FILES = sys.platform != "emscripten"
_FIRST_READ = 4 << 20     # header bytes read first from an unmapped file (more when it runs on)


class _Source:
    """The file's bytes: a read-only memory map of a path, the caller's bytes, or (no map) an
    open file read on demand: ``mv`` is then only the header's bytes read so far and ``f`` the
    file; ``size`` is the file's size either way."""

    def __init__(self, src):
        self._mm = None
        self.f = None
        if isinstance(src, (bytes, bytearray, memoryview)):
            mv = memoryview(src)
            self.mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
            self.name = f"<{self.mv.nbytes} bytes>"
        elif isinstance(src, (str, os.PathLike)):
            path = os.fspath(src)
            self.name = repr(path)
            try:
                f = open(path, "rb")
            except OSError as e:
                raise GGUFError(f"gguf {self.name}: cannot open ({e.strerror or e})") from e
            try:
                if _MAP_FILES:
                    import mmap

                    self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    self.mv = memoryview(self._mm)
                    f.close()
            except (ImportError, OSError, ValueError):   # an empty file, or no mmap
                pass
            if self._mm is None:
                self.f = f
                self.mv = memoryview(b"")
                self.size = os.fstat(f.fileno()).st_size
                self.read_header(min(self.size, _FIRST_READ))
                return
        else:
            raise TypeError(f"load_gguf: expected a path or a bytes-like object, not {type(src).__name__}")
        self.size = self.mv.nbytes

    def read_header(self, upto: int) -> None:
        """(unmapped file) Hold the file's first ``upto`` bytes in ``mv``."""
        f = self.f
        f.seek(0)
        self.mv = memoryview(f.read(upto))

    def read_into(self, offset: int, dst: memoryview) -> None:
        """Copy the file's bytes from ``offset`` into ``dst`` (a writable byte view), whole."""
        n = dst.nbytes
        if self.f is None:
            dst[:] = self.mv[offset:offset + n]
            return
        f = self.f
        f.seek(offset)
        got = 0
        while got < n:
            k = f.readinto(dst[got:])
            if not k:
                raise GGUFError(f"gguf {self.name}: the file ended at byte {offset + got} while reading "
                                f"{n} bytes from byte {offset} (it changed after it was opened?)")
            got += k

    def bytes_at(self, offset: int, n: int) -> memoryview:
        """``n`` bytes from ``offset``: a view of the map or of the caller's bytes, or read."""
        if self.f is None:
            return self.mv[offset:offset + n]
        buf = bytearray(n)
        self.read_into(offset, memoryview(buf))
        return memoryview(buf)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()
        if self._mm is not None:
            try:
                self.mv.release()
                self._mm.close()
            except BufferError:   # tensors still view the mapping: it closes when they are gone
                pass


class GGUFFile:
    """A parsed GGUF file (see the module doc). ``version``; ``metadata``: key -> Python value
    (arrays as lists); ``metadata_types``: key -> the GGUF type name (``"UINT32"``,
    ``"ARRAY[STRING]"``...); ``tensors``: name -> ``GGUFTensorInfo`` in file order;
    ``alignment``; ``data_offset`` (where the data section starts). ``tensor(name)`` builds a
    tensor, ``raw(name)`` gives its bytes."""

    def __init__(self, source):
        self._src = src = _Source(source)
        self.name = src.name
        while True:
            try:
                self._parse(src)
                break
            except _NeedMore as e:      # (an unmapped file) the header runs on: read more of it
                src.read_header(min(src.size, max(e.upto + (1 << 20), 2 * src.mv.nbytes)))
            except BaseException:
                src.close()
                raise
        if src.f is not None:
            src.mv = memoryview(b"")    # the header's bytes are parsed: let them go

    def _parse(self, src: _Source) -> None:
        where = f"gguf {src.name}"
        r = _Reader(src.mv, where, src.size)
        magic = bytes(src.mv[:4])
        if magic != MAGIC:
            raise GGUFError(f"{where}: bad magic {magic!r} at byte 0 (a GGUF file starts with b'GGUF'; "
                            f"file size {r.size})")
        r.pos = 4
        self.version = v = r.u32("version")
        if v not in (2, 3):
            hint = " (a big-endian GGUF file? ember reads little-endian ones)" if v & 0xFFFF == 0 and v else ""
            hint = hint or (" (GGUF v1 is obsolete: convert the model again)" if v == 1 else "")
            raise GGUFError(f"{where}: version {v} at byte 4 is not supported (ember reads GGUF 2 and 3){hint}")
        n_tensors = r.u64("tensor count")
        n_kv = r.u64("metadata count")
        # each key/value needs >= 12 bytes (length + type), each tensor info >= 24
        if n_kv > (r.size - r.pos) // 12:
            r.fail("metadata count", f"{n_kv} key/value pairs cannot fit in the {r.size - r.pos} bytes left", 16)
        if n_tensors > (r.size - r.pos) // 24:
            r.fail("tensor count", f"{n_tensors} tensors cannot fit in the {r.size - r.pos} bytes left", 8)

        self.metadata: dict = {}
        self.metadata_types: dict = {}
        for i in range(n_kv):
            at = r.pos
            key = r.string(f"metadata key #{i}")
            if key in self.metadata:
                r.fail(f"metadata key {key!r}", "appears twice", at)
            vt = r.u32(f"metadata key {key!r} value type")
            if vt not in VALUE_TYPES:
                r.fail(f"metadata key {key!r}", f"unknown value type {vt} (GGUF defines 0..12)", r.pos - 4)
            what = f"metadata key {key!r}"
            if vt == _ARRAY:
                etype = _U32.unpack_from(src.mv, r.pos)[0] if r.avail - r.pos >= 4 else None
                self.metadata_types[key] = f"ARRAY[{VALUE_TYPES.get(etype, ('?',))[0]}]"
            else:
                self.metadata_types[key] = VALUE_TYPES[vt][0]
            self.metadata[key] = r.value(vt, what)

        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if (self.metadata_types.get("general.alignment", "UINT32") != "UINT32" or not isinstance(align, int)
                or align <= 0 or align & (align - 1)):
            raise GGUFError(f"{where}: metadata key 'general.alignment' must be a UINT32 power of two, got "
                            f"{align!r} ({self.metadata_types.get('general.alignment')})")
        self.alignment = align

        infos = []
        names = set()
        for i in range(n_tensors):
            at = r.pos
            name = r.string(f"tensor #{i} name")
            what = f"tensor {name!r}"
            if name in names:
                r.fail(what, "appears twice", at)
            names.add(name)
            nd = r.u32(what + " rank")
            if nd > MAX_DIMS:
                r.fail(what, f"rank {nd} is over ggml's {MAX_DIMS} dimensions", r.pos - 4)
            r.need(8 * nd, what + " dims")
            dims = struct.unpack_from(f"<{nd}Q", src.mv, r.pos)
            r.pos += 8 * nd
            if any(d > _INT64_MAX for d in dims) or prod(dims) > _INT64_MAX:
                r.fail(what, f"dims {list(dims)} have more than 2**63 - 1 elements", r.pos - 8 * nd)
            gt = r.u32(what + " type")
            off = r.u64(what + " offset")
            infos.append((name, dims, gt, off, at))

        # the data section starts at the next multiple of the alignment
        self.data_offset = start = -(-r.pos // align) * align
        if infos and start > r.size:
            raise GGUFError(f"{where}: the data section would start at byte {start}, past the end of the "
                            f"{r.size}-byte file (truncated?)")
        data_size = max(r.size - start, 0)
        self.tensors: dict = {}
        spans = []
        for name, dims, gt, off, at in infos:
            what = f"{where}: tensor {name!r} (header byte {at})"
            shape = tuple(reversed(dims)) if dims else ()
            bs = _block_size(gt)
            nbytes = None
            if bs is not None:
                k = dims[0] if dims else 1
                if k % bs[0]:
                    raise GGUFError(f"{what}: rows of {k} elements are not a whole number of {_type_name(gt)} "
                                    f"blocks of {bs[0]}")
                nbytes = prod(dims) // bs[0] * bs[1]
            if off % align:
                raise GGUFError(f"{what}: data offset {off} is not a multiple of the alignment {align}")
            if off > data_size or (nbytes is not None and nbytes > data_size - off):
                raise GGUFError(f"{what}: data at file bytes {start + off}..{start + off + (nbytes or 0)} runs "
                                f"past the end of the {r.size}-byte file (data section {data_size} bytes; "
                                f"truncated?)")
            f = BY_GGML_TYPE.get(gt)
            qtype = f.name if f is not None else _type_name(gt).lower()
            self.tensors[name] = GGUFTensorInfo(name, shape, qtype, gt, start + off, nbytes)
            spans.append((off, off + (nbytes or 0), name))
        spans.sort()
        for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
            if b1 < e0:
                raise GGUFError(f"{where}: tensor {n1!r} (file bytes {start + b1}..{start + e1}) overlaps tensor "
                                f"{n0!r} (file bytes {start + b0}..{start + e0})")

    # ---- tensors ------------------------------------------------------------------------------------
    def _info(self, name: str) -> GGUFTensorInfo:
        try:
            return self.tensors[name]
        except (KeyError, TypeError):
            raise KeyError(f"gguf {self.name}: no tensor {name!r}") from None

    def raw(self, name: str) -> memoryview:
        """The bytes of tensor ``name`` (a view of the file, no copy; read from an unmapped file)."""
        info = self._sized(name)
        return self._src.bytes_at(info.offset, info.nbytes)

    def _sized(self, name: str) -> GGUFTensorInfo:
        info = self._info(name)
        if info.nbytes is None:
            raise UnsupportedOp(f"gguf {self.name}: tensor {name!r} has ggml type {info.ggml_type}, which ggml "
                                f"does not define (or ember does not know its size)")
        return info

    def tensor(self, name: str, device: str | None = None, dequantize: bool = False):
        """Tensor ``name`` on ``device``: a float32 ``Tensor`` for F32 and for 1-D F16/BF16, an
        ``ember.quant.QTensor`` (raw blocks) otherwise; ``dequantize=True``: float32 always.
        A type ember does not read raises ``UnsupportedOp``."""
        from ..backends import default_device

        info = self._info(name)
        if not info.supported:
            raise UnsupportedOp(f"gguf {self.name}: tensor {name!r} has type {_type_name(info.ggml_type)} "
                                f"(ggml type {info.ggml_type}), which ember does not read; it reads "
                                f"{', '.join(_type_name(t) for t in BY_GGML_TYPE)}")
        device = device or default_device()
        shape, qt = info.shape, info.qtype
        what = f"tensor {name!r}"
        if qt == "f32" or (qt in ("f16", "bf16") and (len(shape) <= 1 or dequantize)):
            _limits.check_alloc("load_gguf", shape, _dt.float32, what=what)
            return _float_tensor(self.raw(name), qt, shape, device)
        _limits.check_alloc("load_gguf", (-(-info.nbytes // 4),), _dt.int32, what=what)
        q = QTensor(self._words(info, device), qt, shape if shape else (1,))
        return q.dequantize() if dequantize else q

    def _words(self, info: GGUFTensorInfo, device: str):
        """The int32 word tensor of a quantized tensor's bytes (zero padded to a whole word): a
        view of the map on numpy; on array-backed devices (python, wasm) one array filled with
        a single copy from the file."""
        from ..backends import get_backend
        from ..backends.python import PythonBackend
        from ..tensor import Tensor

        n = info.nbytes
        if isinstance(get_backend(device), PythonBackend) and sys.byteorder == "little":
            src = self._src
            if src.f is None and n % 4 == 0:        # bytes in memory or mapped: one copy
                words = array("i")
                words.frombytes(src.mv[info.offset:info.offset + n])
            else:                                   # read from the file into the zeroed words
                words = array("i", _ZERO_WORD) * (-(-n // 4))
                src.read_into(info.offset, memoryview(words).cast("B")[:n])
            return Tensor._wrap(words, (len(words),), _dt.int32, device)
        return _words(self._src.bytes_at(info.offset, n), device)

    # ---- misc ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap the file (tensors that still view it keep it mapped until they are freed)."""
        self._src.close()

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<GGUFFile {self.name}: v{self.version}, {len(self.metadata)} metadata keys, "
                f"{len(self.tensors)} tensors>")


def _numpy_view(raw, dtype_str: str, count: int):
    """A zero-copy numpy array over ``raw`` (the numpy device's buffer, read-only like the file)."""
    import numpy as np

    return np.frombuffer(raw, dtype=dtype_str, count=count)


def _float_tensor(raw, qt: str, shape, device):
    from ..tensor import Tensor, from_bytes
    from ..quant import FORMATS

    n = prod(shape)
    if device == "numpy":
        import numpy as np

        if qt == "f32":
            buf = _numpy_view(raw, "<f4", n).astype(np.float32, copy=False)
        elif qt == "f16":
            buf = _numpy_view(raw, "<f2", n).astype(np.float32)
        else:
            buf = (_numpy_view(raw, "<u2", n).astype(np.uint32) << 16).view(np.float32)
        return Tensor._wrap(buf.reshape(shape), shape, _dt.float32, device)
    data = raw if qt == "f32" else FORMATS[qt].dequantize(raw).tobytes()
    return from_bytes(data, shape, _dt.float32, device=device)


def _words(raw, device):
    """The int32 word tensor of a quantized tensor's bytes (zero padded to a whole word)."""
    from ..tensor import Tensor, from_bytes

    n = len(raw)
    if device == "numpy" and n % 4 == 0:
        import numpy as np

        buf = _numpy_view(raw, "<i4", n // 4)
        if not buf.flags.aligned:          # a file aligned to less than 4 bytes: copy once
            buf = buf.copy()
        return Tensor._wrap(buf.astype(np.int32, copy=False), (n // 4,), _dt.int32, device)
    data = bytes(raw) + b"\x00" * (-n % 4)
    return from_bytes(data, (len(data) // 4,), _dt.int32, device=device)


def load_gguf(source) -> GGUFFile:
    """Open a GGUF file (a path: memory-mapped) or bytes (``bytes``/``bytearray``/``memoryview``,
    what the browser fetched) and check its header; tensors are built on use with
    ``.tensor(name, device=...)``. Raises ``GGUFError`` for a malformed file.

    >>> import ember
    >>> f = ember.load_gguf(_tiny_gguf())
    >>> sorted(f.tensors), f.tensors["norm"].shape
    (['norm', 'w'], (2,))
    """
    return GGUFFile(source)


def _tiny_gguf() -> bytes:
    """A small GGUF v3 file for the examples: metadata ``general.architecture = "llama"``,
    ``llama.block_count = 2``; tensors ``w`` ((2, 32) q8_0: a row of 1.0, a row of -1.0) and
    ``norm`` ((2,) f32)."""
    def s(x: str) -> bytes:
        b = x.encode()
        return _U64.pack(len(b)) + b

    kv = (s("general.architecture") + _U32.pack(8) + s("llama")
          + s("llama.block_count") + _U32.pack(4) + _U32.pack(2))
    # two q8_0 blocks: scale 1.0, all quants 1 / all quants -1
    rows = struct.pack("<e32b", 1.0, *[1] * 32) + struct.pack("<e32b", 1.0, *[-1] * 32)
    infos = (s("w") + _U32.pack(2) + _U64.pack(32) + _U64.pack(2) + _U32.pack(8) + _U64.pack(0)
             + s("norm") + _U32.pack(1) + _U64.pack(2) + _U32.pack(0) + _U64.pack(96))
    head = MAGIC + _U32.pack(3) + _U64.pack(2) + _U64.pack(2) + kv + infos
    head += b"\x00" * (-len(head) % 32)
    data = rows + b"\x00" * (96 - len(rows)) + struct.pack("<2f", 1.0, 2.0)
    return head + data
