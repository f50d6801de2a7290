// layer_norm over contiguous rows of D elements: one workgroup per row, mean then the biased
// variance of the differences (two passes, as accurate as the reference), then the affine map.
// info: 0 rows, 1 D, 2 eps (f32 bits), 3 x offset
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<uniform> info: array<vec4<u32>, {{INFO}}>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

#include elementwise
#include wg_reduce

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let row = wid.x + wid.y * nwg.x;
  if (row >= u(0u)) { return; }
  let D = u(1u);
  let base = row * D;
  let xb = u(3u) + base;
  var s = 0.0;
  for (var j = t; j < D; j = j + {{WG}}u) { s = s + x[xb + j]; }
  let mean = wg_sum(t, s) / f32(D);
  var q = 0.0;
  for (var j = t; j < D; j = j + {{WG}}u) { let d = x[xb + j] - mean; q = q + d * d; }
  let r = 1.0 / sqrt(wg_sum(t, q) / f32(D) + bitcast<f32>(u(2u)));
  for (var j = t; j < D; j = j + {{WG}}u) { out[base + j] = (x[xb + j] - mean) * r * w[j] + b[j]; }
}
