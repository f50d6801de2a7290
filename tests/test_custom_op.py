"""ember.webgpu.custom_op: a user's WGSL kernel as a registry op. The README's GELU kernel runs
on webgpu (lavapipe in CI) against numpy (math.erf), forward and through its grad rule; plans,
the fusion boundary, parameters, the other devices and bad WGSL are checked with small kernels."""
import math
import os
import re

import numpy as np
import pytest

import ember
from ember.errors import ShaderError, UnsupportedOp
from ember.webgpu import custom_op

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def _webgpu():
    try:
        ember.get_backend("webgpu")
    except ember.errors.DeviceError as e:
        pytest.skip(f"webgpu backend unavailable on this machine: {e}")


def _readme_block() -> dict:
    """Run the README's custom-kernel block (once) and return its namespace."""
    if "ns" not in _readme_block.__dict__:
        block = next(b for b in re.findall(r"^```python\n(.*?)^```", README, re.S | re.M) if "GELU_WGSL" in b)
        ns = {}
        exec(compile(block, "README.md (custom kernel)", "exec"), ns)
        _readme_block.ns = ns
    return _readme_block.ns


def _gelu_np(x):
    return x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))) / 2.0


def _gelu_grad_np(x):
    return (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))) / 2.0 + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)


CUBE = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, 2>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 64u;
  if (i >= info[1].x) { return; }
  out[i] = x[i] * x[i] * x[i];
}"""
cube = custom_op("test_cube", CUBE, shape="same", dtype="same", grad=lambda g, y, x, **_: g * 3.0 * x * x)

# one workgroup per row: alpha * sum(x[row, :]) + b[row]; reads the input's shape from info
ROWSUM = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<uniform> info: array<vec4<u32>, 7>;
@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) wid: vec3<u32>) {
  let cols = info[2].w;                      // input 0's last dim
  let alpha = bitcast<f32>(info[6].x);       // params[0]
  var s = 0.0;
  for (var j = 0u; j < cols; j = j + 1u) { s = s + x[wid.x * cols + j]; }
  out[wid.x] = alpha * s + b[wid.x];
}"""
rowsum = custom_op("test_rowsum", ROWSUM, shape=lambda xs, bs, **_: (xs[0],), dtype="same", params=("alpha",),
                   workgroups=lambda out, xs, bs, **_: (out[0], 1, 1),
                   python=lambda x, b, *, alpha: ember.sum(x, axis=1) * alpha + b)


def test_readme_gelu_kernel_matches_numpy_on_webgpu():
    _webgpu()
    ns = _readme_block()
    rng = np.random.default_rng(0)
    xv = rng.standard_normal((3, 333)).astype(np.float32) * 3
    x = ember.tensor(xv, device="webgpu", requires_grad=True)
    y = ns["gelu_wgsl"](x)
    np.testing.assert_allclose(y.numpy(), _gelu_np(xv.astype(np.float64)), rtol=1e-5, atol=1e-6)
    (y * ember.tensor(np.arange(999, dtype=np.float32).reshape(3, 333) / 999, device="webgpu")).sum().backward()
    want = _gelu_grad_np(xv.astype(np.float64)) * np.arange(999).reshape(3, 333) / 999
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-4, atol=1e-5)
    # the decorated function is the kernel on the CPU devices
    np.testing.assert_allclose(ns["gelu_wgsl"](ember.tensor(xv, device="numpy")).numpy(),
                               _gelu_np(xv.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_plan_replay_and_fusion_boundary():
    _webgpu()
    import ember.webgpu as wg

    x = ember.tensor([1.0, 2.0, -3.0], device="webgpu")
    wg.evaluate(x)
    wg.reset_stats()
    y = cube(x * 2.0 + 1.0) * 3.0 - 1.0
    assert y.tolist() == [((v * 2 + 1) ** 3) * 3 - 1 for v in (1.0, 2.0, -3.0)]
    assert wg.stats()["dispatches"] == 3          # fused chain, the custom kernel, fused chain
    f = ember.compile(lambda a: cube(a * 2.0) + 1.0)
    outs = [f(ember.tensor([v, 1.0], device="webgpu")).tolist() for v in (1.0, 2.0, 3.0)]
    assert outs == [[(2 * v) ** 3 + 1, 9.0] for v in (1.0, 2.0, 3.0)]
    fast = f.plan_for(x[:2]).fast
    assert fast is not None and fast.describe()["stream"] and fast.describe()["dispatches"] == 3


def test_params_shapes_and_python_kernel(device):
    if device == "wasm":
        pytest.skip("the python= kernel is the same function on wasm (one CPU device is enough)")
    rng = np.random.default_rng(1)
    xv, bv = rng.standard_normal((5, 37)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    y = rowsum(ember.tensor(xv, device=device), ember.tensor(bv, device=device), alpha=0.5)
    assert y.shape == (5,)
    np.testing.assert_allclose(y.numpy(), 0.5 * xv.astype(np.float64).sum(1) + bv, rtol=1e-5, atol=1e-5)


def test_other_device_without_a_kernel_raises_unsupported_op():
    with pytest.raises(UnsupportedOp, match="test_cube.*'python'"):
        cube(ember.tensor([1.0]))


def test_bad_wgsl_is_a_shader_error_with_its_line_and_the_gpu_survives():
    _webgpu()
    bad = CUBE.replace("x[i] * x[i] * x[i]", "x[i] * y[i]")
    ember.webgpu.get_runtime()        # the GPU is open: the WGSL is compiled at declaration
    with pytest.raises(ShaderError) as e:
        custom_op("test_bad", bad, shape="same", dtype="same")
    assert e.value.line == 9 and e.value.column and "y" in e.value.compiler_message, str(e.value)
    assert "test_bad" not in ember.registry.OPS           # nothing half-declared
    assert (ember.tensor([1.0, 2.0], device="webgpu") * 2).tolist() == [2.0, 4.0]


def test_docstring_example():
    import doctest

    import ember.webgpu.custom as mod

    result = doctest.testmod(mod)
    assert result.attempted and not result.failed


# CUBE's bindings and guard, the body in half precision: rounded to f16, then one f16 product
HALF_TIMES3 = "enable f16;\n" + CUBE.replace("out[i] = x[i] * x[i] * x[i];", "out[i] = f32(f16(x[i]) * f16(3.0));")


def test_half_precision_math_in_a_custom_kernel():
    """``enable f16;`` compiles where the device has ``shader-f16`` (lavapipe does, natively: the
    driver requests it) and computes in half precision: numpy's float16 arithmetic, bit for bit."""
    _webgpu()
    import ember.webgpu as wg

    if "shader-f16" not in wg.info()["features"]:
        pytest.skip("this WebGPU adapter has no shader-f16 feature (half-precision shader math)")
    half_times3 = custom_op("test_half_times3", HALF_TIMES3, shape="same", dtype="same")
    xv = np.random.default_rng(3).standard_normal(1000).astype(np.float32) * 100
    want = (xv.astype(np.float16) * np.float16(3.0)).astype(np.float32)
    assert not np.array_equal(want, xv.astype(np.float16).astype(np.float32) * 3)   # f32 math would differ
    got = half_times3(ember.tensor(xv, device="webgpu")).numpy()
    np.testing.assert_array_equal(got, want)
