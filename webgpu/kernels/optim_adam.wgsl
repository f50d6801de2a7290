// One Adam / AdamW step of one parameter in one dispatch (ember.webgpu.optim). The new parameter
// goes to pout (pin stays intact for tensors that share it); the moments (and amsgrad's running
// maximum; a 16-byte scratch buffer is bound without amsgrad) are updated in place. Written op
// for op like ember.optim.Adam's reference update (PyTorch's rule), with the helpers of the fused
// elementwise kernels:
//   g = grad (negated: maximize);  p = p * (1 - lr * wd) (decoupled) or g = g + p * wd
//   m = m + (g - m) * (1 - beta1);  v = v * beta2 + g * g * (1 - beta2)
//   v' = max(vmax, v) (amsgrad, stored);  p = p - m / (sqrt(v') / sqrt(1 - beta2^t) + eps) * lr / (1 - beta1^t)
// info words: 0 n, 1 flags (bit 0 maximize, 1 weight decay, 2 fresh state: the moments start at
// zero and are not read, 3 decoupled weight decay, 4 amsgrad), 2 weight_decay,
// 3 1 - lr * weight_decay, 4 1 - beta1, 5 beta2, 6 1 - beta2, 7 lr / (1 - beta1^t),
// 8 sqrt(1 - beta2^t), 9 eps (f32 bit patterns).
@group(0) @binding(0) var<storage, read_write> pout: array<f32>;
@group(0) @binding(1) var<storage, read> pin: array<f32>;
@group(0) @binding(2) var<storage, read> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;
@group(0) @binding(5) var<storage, read_write> vmax: array<f32>;
@group(0) @binding(6) var<uniform> info: array<vec4<u32>, 3>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }
fn f(k: u32) -> f32 { return bitcast<f32>(info[k / 4u][k % 4u]); }
fn flag(bit: u32) -> bool { return (u(1u) & (1u << bit)) != 0u; }

{{HELPERS}}

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  var p = pin[i];
  var g = grad[i];
  if (flag(0u)) { g = -g; }
  if (flag(1u)) {
    if (flag(3u)) { p = p * f(3u); } else { g = g + p * f(2u); }
  }
  let fresh = flag(2u);
  var m0 = 0.0;
  var v0 = 0.0;
  if (!fresh) { m0 = m[i]; v0 = v[i]; }
  let mn = m0 + (g - m0) * f(4u);
  var vn = v0 * f(5u) + g * g * f(6u);
  m[i] = mn;
  v[i] = vn;
  if (flag(4u)) {
    var vm = 0.0;
    if (!fresh) { vm = vmax[i]; }
    vn = max_f32(vm, vn);
    vmax[i] = vn;
  }
  let denom = div_f32(sqrt_f32(vn), f(8u)) + f(9u);
  pout[i] = p - div_f32(mn, denom) * f(7u);
}
