{{ENABLE}}
// layer_norm with each row read from global memory once: LANES threads per row (WG / LANES rows
// per workgroup), each keeping NV units of its row in registers (a unit: a vec4 where D % 4 == 0,
// else one element; thread `lane` holds units lane, lane + LANES, ...). The mean, then the biased
// variance of the differences from that mean (two passes over the registers, as accurate as the
// reference; never E[x^2] - E[x]^2), then the affine map written. A row's sums meet by subgroup
// shuffles across runs of min(LANES, subgroup size) lanes (adapters with subgroups; else runs of
// 1), then a tree over the runs in workgroup memory. layer_norm.wgsl (a workgroup per row, the
// row read three times) takes rows longer than LANES <= 256 threads' registers hold.
// info: 0 rows, 1 units per row, 2 eps (f32 bits), 3 x offset (in x's elements), 4 D
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<storage, read> x: array<{{XT}}>;
@group(0) @binding(2) var<storage, read> w: array<{{T}}>;
@group(0) @binding(3) var<storage, read> b: array<{{T}}>;
@group(0) @binding(4) var<uniform> info: array<vec4<u32>, {{INFO}}>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

const LANES: u32 = {{LANES}}u;
const NV: u32 = {{NV}}u;

fn xget(i: u32) -> {{T}} { {{XGET}} }      // unit i of x after its offset
fn hsum(v: {{T}}) -> f32 { {{HSUM}} }      // the sum of a unit's elements

{{SG_SUM}}
#include row_reduce

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32{{SG_ARGS}}) {
  let sgs = {{SGS}};
  let rows = u(0u);
  let row0 = (wid.x + wid.y * nwg.x) * ({{WG}}u / LANES);
  if (row0 >= rows) { return; }          // the whole workgroup (a grid spread over y)
  let lane = t % LANES;
  let row = row0 + t / LANES;
  let live = row < rows;
  let n = u(1u);
  let base = row * n;
  let D = f32(u(4u));
  var v: array<{{T}}, NV>;
  var s = 0.0;
  for (var k = 0u; k < NV; k = k + 1u) {
    let j = lane + k * LANES;
    if (live && j < n) { v[k] = xget(base + j); s = s + hsum(v[k]); }
  }
  let mean = row_sum(t, lane, s, sgs) / D;
  var q = 0.0;
  for (var k = 0u; k < NV; k = k + 1u) {
    if (live && lane + k * LANES < n) { let d = v[k] - mean; q = q + hsum(d * d); }
  }
  let r = 1.0 / sqrt(row_sum(t, lane, q, sgs) / D + bitcast<f32>(u(2u)));
  for (var k = 0u; k < NV; k = k + 1u) {
    let j = lane + k * LANES;
    if (live && j < n) { out[base + j] = (v[k] - mean) * r * w[j] + b[j]; }
  }
}
