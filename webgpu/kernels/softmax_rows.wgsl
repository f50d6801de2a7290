{{ENABLE}}
// softmax / log_softmax along the last axis with each row read from global memory once (the
// layout of layer_norm_rows.wgsl): LANES threads per row, WG / LANES rows per workgroup, each
// thread keeping NV units of its row in registers (a unit: a vec4 where the row's length is a
// multiple of 4, else one element; thread `lane` holds units lane, lane + LANES, ...). The row's
// maximum, then the sum of exp(x - max), meet by row_max / row_sum (row_reduce.wgsl); one write.
// softmax.wgsl (a workgroup per line, three reads) takes other axes and longer rows.
// info: 0 rows, 1 units per row, 2 flags (1: log_softmax; 2: a row whose every entry is -inf
// gives zeros (attention's fully masked rows, as PyTorch) instead of NaN), 3 x offset (in x's units)
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<storage, read> x: array<{{XT}}>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, {{INFO}}>;

#include elementwise

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

const LANES: u32 = {{LANES}}u;
const NV: u32 = {{NV}}u;

fn xget(i: u32) -> {{T}} { {{XGET}} }      // unit i of x after its offset
fn hsum(v: {{T}}) -> f32 { {{HSUM}} }      // the sum of a unit's elements
fn hmax(v: {{T}}) -> f32 { {{HMAX}} }      // the largest of a unit's elements (NaN if any is)
fn uexp(v: {{T}}) -> {{T}} { {{UEXP}} }    // exp_f32 of each element

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
  let flags = u(2u);
  let base = row * n;
  var v: array<{{T}}, NV>;
  var m = -f_inf();
  for (var k = 0u; k < NV; k = k + 1u) {
    let j = lane + k * LANES;
    if (live && j < n) { v[k] = xget(base + j); m = max_f32(m, hmax(v[k])); }
  }
  m = row_max(t, lane, m, sgs);
  let logo = (flags & 1u) != 0u;
  var s = 0.0;
  for (var k = 0u; k < NV; k = k + 1u) {
    if (live && lane + k * LANES < n) {
      let e = uexp(v[k] - m);
      s = s + hsum(e);
      if (!logo) { v[k] = e; }
    }
  }
  s = row_sum(t, lane, s, sgs);
  let zero = (flags & 2u) != 0u && m == -f_inf();
  let lse = log_f32(s);
  let inv = 1.0 / s;
  for (var k = 0u; k < NV; k = k + 1u) {
    let j = lane + k * LANES;
    if (live && j < n) {
      var r = select(v[k] * inv, v[k] - m - lse, logo);
      if (zero) { r = {{T}}(0.0); }
      out[base + j] = r;
    }
  }
}
