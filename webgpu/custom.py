"""Your own WGSL kernels as registry ops: ``ember.webgpu.custom_op``.

``custom_op(name, wgsl, *, shape, dtype, grad=None, workgroups=None)`` declares an op in the one
registry (``ember.registry.op``) whose ``device="webgpu"`` kernel is your WGSL. It is then an op
like ``matmul``: it runs through ``registry.apply``, so ``ember.compile`` plans capture and
replay it (in the prebuilt dispatch stream too), autodiff differentiates it with your ``grad``
rule, lazy elementwise chains are materialised before it and fuse again after it (a fusion
boundary, as every non-elementwise kernel), and the same WGSL runs natively (wgpu-py) and in the
page (``navigator.gpu`` in Pyodide): the driver protocol is the same.

Binding convention (``@group(0)``), for an op with ``n`` tensor inputs::

    @binding(0)      var<storage, read_write> out: array<f32>;   // the output, contiguous
    @binding(1..n)   var<storage, read> x: array<f32>;           // input i at binding i + 1,
                                                                 // contiguous from element 0
    @binding(n + 1)  var<uniform> info: array<vec4<u32>, K>;     // shapes (and params)

Every element a custom kernel binds is 4 bytes (``f32`` for float32/float16 tensors, ``i32`` for
int32/int64, ``u32`` for uint8/bool: see ``ember.webgpu.backend``): a float16 input held in 2-byte
half storage is handed over as a 4-byte copy (``fusion.dense``), and the output is 4-byte. Half-precision math inside a kernel (``enable
f16;``, ``f16`` / ``vec4<f16>`` values) works where ``"shader-f16" in
ember.webgpu.info()["features"]`` (natively where the adapter has it, in Chrome on most GPUs;
not SwiftShader): convert at the loads and stores, the buffers stay 4-byte. ``info`` holds, for tensor ``t`` (0 = the output,
1..n = the inputs):

- ``info[2 * t]``: its shape right-aligned in four dims (a (5, 7) tensor gives (1, 1, 5, 7);
  leading dims of a rank > 4 tensor are multiplied into ``.x``);
- ``info[2 * t + 1]``: ``(numel, rank, 0, 0)``;

then ``params`` (op attributes named at declaration), as f32 bits, four per vec4:
``bitcast<f32>(info[2 * (n + 1) + k / 4][k % 4])`` is parameter ``k``. The buffer is padded to
at least 16 vec4, so ``K`` may be any size up to ``max(16, 2 * (n + 1) + ceil(len(params) / 4))``.

Dispatch: ``workgroups=None`` runs one invocation per output element, reading the workgroup size
from your ``@workgroup_size(W)``: ``ceil(numel / W)`` workgroups, spread over y beyond the
per-dimension limit (65,535), so the element index is
``gid.x + gid.y * nwg.x * W`` (``gid`` the global invocation id, ``nwg`` num_workgroups; guard
it with ``if (i >= info[1].x) { return; }``). Or pass ``workgroups=`` an int, an ``(x, y, z)``
tuple, or a function ``(out_shape, *in_shapes, **attrs) -> int | tuple``. The entry point is
``main``.

Other devices: ``python=f`` (or use ``custom_op(...)`` as a decorator on ``f``) runs ``f(*inputs,
**attrs)`` (ember Tensors in, a Tensor out: write it with ember ops or by hand) on ``"python"``,
``"numpy"`` and ``"wasm"``; ``wasm=`` overrides it on ``"wasm"``. Without one, those devices
raise ``ember.errors.UnsupportedOp`` naming the op and the device.

WGSL that does not compile raises ``ember.errors.ShaderError`` with the compiler's message, line
and column (at the op's first webgpu use, or at declaration when the GPU is already open); the
device stays usable.

>>> import ember
>>> WGSL = '''
... @group(0) @binding(0) var<storage, read_write> out: array<f32>;
... @group(0) @binding(1) var<storage, read> x: array<f32>;
... @group(0) @binding(2) var<uniform> info: array<vec4<u32>, 2>;
... @compute @workgroup_size(64)
... fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
...   let i = gid.x + gid.y * nwg.x * 64u;
...   if (i >= info[1].x) { return; }
...   out[i] = x[i] * x[i] * x[i];
... }'''
>>> cube = ember.webgpu.custom_op("doc_cube", WGSL, shape="same", dtype="same",
...                               grad=lambda g, y, x, **_: g * 3.0 * x * x,
...                               python=lambda x: x * x * x)
>>> cube(ember.tensor([1.0, 2.0])).tolist()                                  # python= kernel
[1.0, 8.0]
>>> cube(ember.tensor([1.0, 2.0], device="webgpu")).tolist()                # doctest: +SKIP
[1.0, 8.0]
"""
from __future__ import annotations

import math
import re
from typing import Callable

from .. import registry
from ..errors import DeviceError, DeviceLostError, ShaderError, UnsupportedOp
from ..registry import OPS, apply

__all__ = ["custom_op", "CustomOp"]

INFO_MIN_VEC4 = 16
_WG_SIZE = re.compile(r"@workgroup_size\s*\(\s*(\d+)u?\s*(?:,\s*(\d+)u?\s*)?(?:,\s*(\d+)u?\s*)?\)")
# naga (wgpu-py): "┌─ wgsl:4:14"; the browser driver: "4:14 message" (GPUCompilationMessage)
_LINE = re.compile(r"wgsl:(\d+):(\d+)|(?:^|; |: )(\d+):(\d+) ")


def _same_shape(*shapes, **_):
    return tuple(shapes[0])


def _same_dtype(*dtypes, **_):
    return dtypes[0]


class CustomOp:
    """A declared custom op; call it on Tensors (``op(x, y, **attrs)``) like any ember op.
    Calling it on a plain function (decorator use) makes that function its ``python=`` kernel."""

    def __init__(self, name, wgsl, n_inputs, params, workgroups, python, wasm, entry="main"):
        self.name, self.wgsl, self.n_inputs, self.params = name, wgsl, n_inputs, tuple(params)
        self.workgroups, self.python, self.wasm, self.entry = workgroups, python, wasm, entry
        self.__doc__ = f"custom op {name!r} (WGSL kernel; see ember.webgpu.custom)"
        m = _WG_SIZE.search(wgsl)
        self.wg = None if m is None else (int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1))

    def __repr__(self) -> str:
        return f"<custom op {self.name}>"

    def __call__(self, *inputs, **attrs):
        from ..tensor import Tensor

        if len(inputs) == 1 and not attrs and callable(inputs[0]) and not isinstance(inputs[0], Tensor):
            self.python = inputs[0]      # @custom_op(...) on the reference implementation
            self.__doc__ = inputs[0].__doc__ or self.__doc__
            return self
        if self.n_inputs is not None and len(inputs) != self.n_inputs:
            raise TypeError(f"{self.name}: expects {self.n_inputs} tensor inputs, got {len(inputs)}")
        ts = []
        dev = next((x.device for x in inputs if isinstance(x, Tensor)), None)
        for x in inputs:
            if not isinstance(x, Tensor):
                import ember
                x = ember.tensor(x, device=dev)
            ts.append(x)
        return apply(self.name, *ts, **attrs)

    # ---- the webgpu kernel ----------------------------------------------------------------
    def pipeline(self, rt):
        """The compiled pipeline on runtime ``rt`` (cached); ShaderError when the WGSL is bad."""
        key = ("custom", self.name, self.entry, self.wgsl)
        try:
            return rt.pipeline(key, lambda: self.wgsl, self.entry)
        except DeviceLostError:
            raise
        except DeviceError as e:
            raise shader_error(self.name, self.wgsl, str(e)) from e

    def webgpu_kernel(self, rt):
        from .fusion import GBuf, dense
        from .ops import finish, raw_dtype
        from .runtime import f32_bits, pack_info

        spec = self

        def kernel(out, *inputs, **attrs):
            gs = [dense(t._buf) for t in inputs]      # pending lazy chains run here: a fusion boundary
            rt.op = (spec.name, out.shape)            # a binding over the GPU's limit names this op
            n = math.prod(out.shape)
            st = rt.alloc(n * 4)
            res = GBuf(rt, out.shape, raw_dtype(out.dtype), storage=st)
            if n:
                words = []
                for shape in [out.shape] + [g.shape for g in gs]:
                    words += _shape4(shape) + [math.prod(shape), len(shape), 0, 0]
                for p in spec.params:
                    if p not in attrs:
                        raise TypeError(f"{spec.name}: missing parameter {p!r} (declared in params=)")
                    words.append(f32_bits(float(attrs[p])))
                size = max(INFO_MIN_VEC4 * 4, (len(words) + 3) // 4 * 4)
                grid = spec.grid(rt, out.shape, [g.shape for g in gs], attrs, n)
                pipe = spec.pipeline(rt)
                bufs = [(st.buf, 0, n * 4)] + [(g.storage.buf, 0, max(g.size, 1) * 4) for g in gs]
                rt.dispatch(pipe, bufs, pack_info(words, size), grid)
            return finish(rt, res, out)
        kernel.__name__ = f"webgpu_custom_{self.name}"
        return kernel

    def grid(self, rt, out_shape, in_shapes, attrs, n) -> tuple:
        from .driver import grid_1d

        w = self.workgroups
        if callable(w):
            w = w(tuple(out_shape), *in_shapes, **attrs)
        if w is None:
            if self.wg is None:
                raise UnsupportedOp(f"{self.name}: no literal @workgroup_size(...) in its WGSL to size the "
                                    f"dispatch from; pass workgroups= to custom_op")
            per = self.wg[0] * self.wg[1] * self.wg[2]
            return grid_1d((n + per - 1) // per, rt.max_groups)
        if isinstance(w, int):
            return grid_1d(w, rt.max_groups)
        w = tuple(int(v) for v in w) + (1, 1)
        return w[:3]

    # ---- the other devices ----------------------------------------------------------------
    def fallback(self, *inputs, **attrs):
        """``registry.apply`` found no kernel for this op on the inputs' device (its backend was
        created before or after the declaration): install the one this device gets, or raise."""
        import ember
        from ..backends import get_backend

        dev = inputs[0].device if inputs else attrs.get("device")
        backend = get_backend(dev)
        k = self.kernel_for(dev, backend)
        if k is None:
            have = ["webgpu"] + (["python", "numpy", "wasm"] if self.python else ["wasm"] if self.wasm else [])
            raise UnsupportedOp(f"custom op {self.name!r} has no kernel for device {dev!r} (it has: "
                                f"{', '.join(have)}); pass python= (or wasm=) to custom_op, or move the "
                                f"tensors with .to('webgpu')")
        backend.kernels[self.name] = k
        # reached from autograd's "composite" path when there is no grad rule: not differentiable
        ctx = ember.no_grad() if OPS[self.name].grad is None else _Null()
        with ctx:
            return apply(self.name, *inputs, **attrs)

    def kernel_for(self, dev: str, backend):
        if dev == "webgpu":
            return self.webgpu_kernel(backend.rt)
        if dev not in ("python", "numpy", "wasm"):
            return None
        fn = self.wasm if dev == "wasm" and self.wasm is not None else self.python
        if fn is None:
            return None
        spec = self

        def kernel(out, *inputs, **attrs):
            # the user's function is one opaque kernel: its own ops are neither captured into a
            # plan (the plan replays this kernel) nor recorded for autodiff (grad= covers it)
            saved_cap, saved_grad = registry.CAPTURE[0], registry.GRAD[0]
            registry.CAPTURE[0], registry.GRAD[0] = None, False
            try:
                y = fn(*inputs, **attrs)
            finally:
                registry.CAPTURE[0], registry.GRAD[0] = saved_cap, saved_grad
            if tuple(y.shape) != tuple(out.shape) or y.device != inputs[0].device:
                raise ShaderError(f"{spec.name}: the {dev} kernel returned shape {tuple(y.shape)} on "
                                  f"{y.device!r}; the op's shape rule says {tuple(out.shape)} on {dev!r}",
                                  op=spec.name)
            if y.dtype is not out.dtype:
                y = y.astype(out.dtype)
            return y._buf
        kernel.__name__ = f"{dev}_custom_{self.name}"
        return kernel


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _shape4(shape) -> list:
    s = [int(v) for v in shape]
    if len(s) > 4:
        s = [math.prod(s[:len(s) - 3])] + s[-3:]
    return [1] * (4 - len(s)) + s


def shader_error(op: str, wgsl: str, message: str) -> ShaderError:
    """A ShaderError for ``op`` from a driver's compile message (line/column parsed out)."""
    m = _LINE.search(message)
    line = col = None
    if m:
        line, col = int(m.group(1) or m.group(3)), int(m.group(2) or m.group(4))
    msg = message.replace("webgpu: ", "", 1).strip()
    where = ""
    if line is not None:
        lines = wgsl.split("\n")
        src = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        where = f" at line {line}, column {col}" + (f" ({src!r})" if src else "")
    return ShaderError(f"custom op {op!r}: its WGSL does not compile{where}: {msg}", op=op, line=line,
                       column=col, compiler_message=msg)


def custom_op(name: str, wgsl: str, *, shape, dtype, grad: Callable | None = None, workgroups=None,
              params=(), python: Callable | None = None, wasm: Callable | None = None,
              n_inputs: int | None = None, doc: str = "") -> CustomOp:
    """Declare registry op ``name`` whose webgpu kernel is ``wgsl`` (see the module docstring for
    the binding convention) and return it as a callable.

    ``shape(*in_shapes, **attrs)`` / ``dtype(*in_dtypes, **attrs)`` give the output's shape and
    dtype (``"same"``: the first input's). ``grad(g, y, *inputs, need, **attrs)`` is the gradient
    rule (``ember.autograd``'s convention; without it the op is not differentiable).
    ``workgroups``: None (one invocation per output element), an int, an (x, y, z) tuple or a
    function of the shapes. ``params``: attribute names passed to the kernel as f32 in ``info``.
    ``python=``/``wasm=``: kernels for the other devices (ember Tensors in, a Tensor out).

    Usable as a decorator: ``@custom_op("name", WGSL, shape="same", dtype="same")`` on a function
    makes that function the ``python=`` kernel and binds the op to its name."""
    if not isinstance(wgsl, str) or "@compute" not in wgsl:
        raise ShaderError(f"custom op {name!r}: wgsl must be the WGSL source of a compute shader "
                          f"(with an @compute entry point named main)", op=name)
    shape_rule = _same_shape if shape == "same" else shape
    dtype_rule = _same_dtype if dtype == "same" else dtype
    if not callable(shape_rule) or not callable(dtype_rule):
        raise TypeError(f"custom op {name!r}: shape and dtype must be functions (or 'same')")
    spec = CustomOp(name, wgsl, n_inputs, params, workgroups, python, wasm)
    from .runtime import _RUNTIME

    rt = _RUNTIME[0]
    if rt is not None and getattr(rt.driver, "lost", None) is None:
        spec.pipeline(rt)     # the GPU is open: report bad WGSL now, before the op exists
    if name in OPS:
        raise ValueError(f"custom op {name!r}: an op of that name is already declared")
    registry.op(name, kind="other", shape=shape_rule, dtype=dtype_rule, decompose=spec.fallback,
                doc=doc or f"custom op (WGSL kernel, {len(wgsl.splitlines())} lines)", grad=grad)
    from ..backends import _INSTANCES

    for dev, b in list(_INSTANCES.items()):     # backends already created get their kernel now
        k = spec.kernel_for(dev, b)
        if k is not None:
            b.kernels[name] = k
    return spec
