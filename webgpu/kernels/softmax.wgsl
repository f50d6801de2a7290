// softmax / log_softmax along one axis of a contiguous (outer, n, inner) layout: one workgroup
// per line, three passes (max, sum of exp, write) with tree reductions in shared memory.
// info: 0 lines, 1 n, 2 inner, 3 offset
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, {{INFO}}>;

#include elementwise

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

#include wg_reduce

fn line(wid: vec3<u32>, nwg: vec3<u32>, t: u32, log_out: bool) {
  let l = wid.x + wid.y * nwg.x;
  if (l >= u(0u)) { return; }
  let n = u(1u); let inner = u(2u);
  let base = (l / inner) * n * inner + l % inner;
  let xb = u(3u) + base;
  var m = -f_inf();
  for (var j = t; j < n; j = j + {{WG}}u) { m = max_f32(m, x[xb + j * inner]); }
  let mx = wg_max(t, m);
  var s = 0.0;
  for (var j = t; j < n; j = j + {{WG}}u) { s = s + exp_f32(x[xb + j * inner] - mx); }
  let total = wg_sum(t, s);
  if (log_out) {
    let lse = log_f32(total);
    for (var j = t; j < n; j = j + {{WG}}u) { out[base + j * inner] = x[xb + j * inner] - mx - lse; }
  } else {
    let inv = 1.0 / total;
    for (var j = t; j < n; j = j + {{WG}}u) { out[base + j * inner] = exp_f32(x[xb + j * inner] - mx) * inv; }
  }
}

@compute @workgroup_size({{WG}})
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) t: u32) {
  line(wid, nwg, t, false);
}

@compute @workgroup_size({{WG}})
fn log_softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) t: u32) {
  line(wid, nwg, t, true);
}
