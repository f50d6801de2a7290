"""Typed errors. Every message says what went wrong, where (op, shape, dtype, file offset,
ONNX node) and, where it helps, what to do about it.

>>> import ember
>>> try:
...     ember.add(ember.ones((2, 3)), ember.ones((4,)))
... except ember.errors.ShapeError as e:
...     print(e)
add: shapes (2, 3) and (4,) do not broadcast (axis -1: 3 vs 4)
"""


class EmberError(Exception):
    """Base class of every error ember raises on purpose."""


class ShapeError(EmberError, ValueError):
    """Shapes that an op cannot accept (broadcasting, matmul inner dims, reshape sizes...)."""


class DTypeError(EmberError, TypeError):
    """A dtype an op does not accept, or an unknown dtype name."""


class DeviceError(EmberError, RuntimeError):
    """An unknown or unavailable device, or tensors on different devices mixed in one op."""


class DeviceLimitError(DeviceError):
    """A tensor or binding over one of the GPU's limits (``maxStorageBufferBindingSize``,
    ``maxBufferSize``) in a kernel that cannot be split into chunks; raised before the op's work
    is submitted. ``op``, ``shape``, ``nbytes``, ``limit`` and ``limit_name`` say which."""

    def __init__(self, message="", *, op=None, shape=None, nbytes=None, limit=None, limit_name=None):
        super().__init__(message)
        self.op, self.shape, self.nbytes, self.limit, self.limit_name = op, shape, nbytes, limit, limit_name


class DeviceLostError(DeviceError):
    """The GPU device was lost (driver reset, ``GPUDevice.destroy()``, the browser reclaiming it):
    the tensors on it are gone; move the work to another device (``"python"``, ``"wasm"``)."""


class DeviceOutOfMemoryError(DeviceError, MemoryError):
    """The GPU ran out of memory while allocating a buffer or running work."""


class IndexingError(EmberError, IndexError):
    """An index out of range or an indexing form ember does not support."""


class WeightsError(EmberError, ValueError):
    """A malformed or unsafe weights file (safetensors, PyTorch checkpoint), or a state_dict mismatch."""


class UnsupportedOp(EmberError, NotImplementedError):
    """An op (or ONNX operator, attribute value, dtype) that ember does not implement."""


class OnnxError(EmberError, ValueError):
    """A malformed ONNX file or graph."""


class ResourceError(EmberError, MemoryError):
    """An op, creation function or loader would allocate a tensor over the per-tensor ceiling
    (``ember.set_max_tensor_bytes``); raised before anything is allocated. ``op``, ``shape``,
    ``nbytes`` and ``limit`` say which, how big, and the ceiling it exceeds."""

    def __init__(self, message="", *, op=None, shape=None, nbytes=None, limit=None):
        super().__init__(message)
        self.op, self.shape, self.nbytes, self.limit = op, shape, nbytes, limit


class BoundsError(EmberError, IndexError):
    """A native kernel was about to touch memory outside the buffer it was given (a bug in the
    kernel's Python wrapper; the call is refused before it runs)."""


class ContextLengthError(EmberError, ValueError):
    """A language model's prompt (plus the tokens asked for) does not fit its context window.
    ``tokens`` and ``context`` say how many and how many fit."""

    def __init__(self, message="", *, tokens=None, context=None):
        super().__init__(message)
        self.tokens, self.context = tokens, context


class TokenizerError(EmberError, ValueError):
    """A tokenizer that cannot be built from its metadata (unknown ``tokenizer.ggml.model`` or
    ``tokenizer.ggml.pre``, missing or inconsistent keys), or text it cannot encode."""


class ChatTemplateError(EmberError, ValueError):
    """A chat template that does not parse, fails while rendering (``raise_exception``), tries to
    leave jinja2's sandbox, or goes over a render limit (output size, loop steps, time)."""


class GGUFError(WeightsError):
    """A malformed GGUF file: bad magic or version, a length, count, offset or dimension that
    runs past the end of the file or overflows, overlapping or misaligned tensor data. The
    message names the key or tensor and the byte offset."""


class ShaderError(EmberError, ValueError):
    """A user's WGSL kernel (``ember.webgpu.custom_op``) that does not compile, or a custom
    kernel that broke its op's contract. ``op``, ``line``, ``column`` (1-based, where the
    compiler gave them) and ``compiler_message`` say which and where; the device stays usable."""

    def __init__(self, message="", *, op=None, line=None, column=None, compiler_message=None):
        super().__init__(message)
        self.op, self.line, self.column, self.compiler_message = op, line, column, compiler_message


class DatasetError(EmberError, ValueError):
    """A data file that does not match what was asked of it (``ember.train.CsvDataset``: a value
    that does not parse as its column's type, a missing column, a short row). The message names
    the file, the line and the column."""
