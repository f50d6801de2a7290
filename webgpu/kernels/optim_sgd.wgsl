// One SGD step of one parameter in one dispatch (ember.webgpu.optim). The new parameter goes to
// pout (pin stays intact for tensors that share it); the momentum buffer is updated in place (a
// 16-byte scratch buffer is bound when there is no momentum). Written op for op like
// ember.optim.SGD's reference update (PyTorch's rule):
//   g = grad (negated: maximize) (+ p * weight_decay)
//   buf = g at the first step, else buf * momentum + g * (1 - dampening)
//   g = g + buf * momentum (nesterov) or buf;   p = p - g * lr
// info words: 0 n, 1 flags (bit 0 maximize, 1 weight decay, 2 first step, 3 nesterov, 4 momentum),
// 2 weight_decay, 3 momentum, 4 1 - dampening, 5 lr (f32 bit patterns).
@group(0) @binding(0) var<storage, read_write> pout: array<f32>;
@group(0) @binding(1) var<storage, read> pin: array<f32>;
@group(0) @binding(2) var<storage, read> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> buf: array<f32>;
@group(0) @binding(4) var<uniform> info: array<vec4<u32>, 2>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }
fn f(k: u32) -> f32 { return bitcast<f32>(info[k / 4u][k % 4u]); }
fn flag(bit: u32) -> bool { return (u(1u) & (1u << bit)) != 0u; }

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  let p = pin[i];
  var g = grad[i];
  if (flag(0u)) { g = -g; }
  if (flag(1u)) { g = g + p * f(2u); }
  if (flag(4u)) {
    var b = g;
    if (!flag(2u)) { b = buf[i] * f(3u) + g * f(4u); }
    buf[i] = b;
    if (flag(3u)) { g = g + b * f(3u); } else { g = b; }
  }
  pout[i] = p - g * f(5u);
}
