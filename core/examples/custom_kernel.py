"""``python -m ember.examples custom-kernel``: the README's GELU written in WGSL as an ember op
(``ember.webgpu.custom_op``), run on webgpu (the CPU devices run its Python reference where no GPU
is found) and checked against the built-in ``ember.gelu``: forward, backward through its grad
rule, a compiled plan's replay, and the typed error a broken kernel gives.
"""
from __future__ import annotations

import argparse
import math

import ember
from ember.registry import OPS

GELU_WGSL = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;   // the output
@group(0) @binding(1) var<storage, read> x: array<f32>;           // input 0 (input i: binding i + 1)
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, 4>;     // info[1].x: the output's size

// erf after Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7)
fn erf_as(v: f32) -> f32 {
  let t = 1.0 / (1.0 + 0.3275911 * abs(v));
  let p = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
  return sign(v) * (1.0 - p * exp(-v * v));
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * 256u;          // one invocation per output element
  if (i >= info[1].x) { return; }
  out[i] = x[i] * (erf_as(x[i] * 0.70710678) + 1.0) * 0.5;
}
"""
NAME = "example_gelu_wgsl"


def gelu_grad(g, y, x, **_):
    phi = ember.exp(x * x * -0.5) * 0.3989422804014327
    return g * (((x * 0.7071067811865476).erf() + 1.0) * 0.5 + x * phi)


def gelu_reference(x):
    return x * ((x * 0.7071067811865476).erf() + 1.0) * 0.5


def op():
    """The custom op (declared once per process)."""
    if NAME not in OPS:
        op.spec = ember.webgpu.custom_op(NAME, GELU_WGSL, shape="same", dtype="same", grad=gelu_grad,
                                         python=gelu_reference)
    return op.spec


def run(*, n: int = 4096, device: str | None = None, seed: int = 0) -> dict:
    """Return the largest differences to the built-in op: forward, gradient, compiled replay."""
    device = device or ("webgpu" if "webgpu" in ember.devices() else "python")
    gelu = op()
    ember.manual_seed(seed)
    xs = ember.randn(n) * 3.0
    x = xs.to(device).requires_grad_()
    y = gelu(x)
    y.sum().backward()
    xr = xs.requires_grad_()                  # the built-in gelu on the CPU: the reference
    yr = ember.gelu(xr)
    yr.sum().backward()
    fwd = max(abs(a - b) for a, b in zip(y.tolist(), yr.tolist()))
    grad = max(abs(a - b) for a, b in zip(x.grad.tolist(), xr.grad.tolist()))
    exact = max(abs(a - v * (1 + math.erf(v / math.sqrt(2))) / 2) for a, v in zip(y.tolist(), xs.tolist()))
    f = ember.compile(lambda t: gelu(t * 2.0) - 1.0)
    with ember.no_grad():
        xd = xs.to(device)
        outs = [f(xd).tolist() for _ in range(3)]
        want = (ember.gelu(xs * 2.0) - 1.0).tolist()
    replay = max(abs(a - b) for a, b in zip(outs[-1], want))
    error = None
    if device == "webgpu":
        try:    # WGSL has no erf builtin: the compiler's message comes back with its line
            broken = ember.webgpu.custom_op(NAME + "_broken", GELU_WGSL.replace("erf_as(x[i]", "erf(x[i]"),
                                            shape="same", dtype="same")
            broken(ember.tensor([1.0], device="webgpu")).tolist()
        except ember.errors.ShaderError as e:
            error = e
    return {"device": device, "forward": fwd, "grad": grad, "exact": exact, "replay": replay, "error": error}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ember.examples custom-kernel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="webgpu (default where a GPU adapter exists) or a CPU device")
    a = ap.parse_args(argv)
    r = run(device=a.device)
    print(f"GELU as a WGSL kernel on {r['device']}:")
    print(f"  forward vs ember.gelu       max |diff| {r['forward']:.2e}   (vs math.erf: {r['exact']:.2e})")
    print(f"  gradient vs ember.gelu's    max |diff| {r['grad']:.2e}")
    print(f"  compiled plan, 3rd replay   max |diff| {r['replay']:.2e}")
    if r["error"] is not None:
        print(f"  a broken kernel raises {type(r['error']).__name__}: line {r['error'].line}, column "
              f"{r['error'].column}")
    ok = max(r["forward"], r["grad"], r["replay"]) < 1e-4
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1
