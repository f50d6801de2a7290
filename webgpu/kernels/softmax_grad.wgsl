// softmax_backward along one axis of contiguous (outer, n, inner) layouts: one workgroup per
// line, dx = y * (g - sum(g * y)) with the sum a tree reduction in shared memory.
// info: 0 lines, 1 n, 2 inner, 3 g offset, 4 y offset
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<uniform> info: array<vec4<u32>, {{INFO}}>;

#include elementwise

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

#include wg_reduce

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let l = wid.x + wid.y * nwg.x;
  if (l >= u(0u)) { return; }
  let n = u(1u); let inner = u(2u);
  let base = (l / inner) * n * inner + l % inner;
  let gb = u(3u) + base;
  let yb = u(4u) + base;
  var s = 0.0;
  for (var j = t; j < n; j = j + {{WG}}u) { s = s + g[gb + j * inner] * y[yb + j * inner]; }
  let total = wg_sum(t, s);
  for (var j = t; j < n; j = j + {{WG}}u) {
    out[base + j * inner] = y[yb + j * inner] * (g[gb + j * inner] - total);
  }
}
