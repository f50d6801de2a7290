// layer_norm_backward over contiguous rows of D elements, a block of R rows per workgroup.
// Per row (the workgroup together): mean and rstd of x (two passes, as the forward), mean(gh)
// and mean(gh * xhat) with gh = g * w; then per column (a thread each) over the block's rows:
//   dx = rstd * (gh - mean(gh) - xhat * mean(gh * xhat))
// and the block's partial column sums of g * xhat (dweight) and g (dbias), written as
// part[block][0][col] and part[block][1][col] (summed over blocks by one reduction after).
// info: 0 rows, 1 D, 2 eps (f32 bits), 3 R, 4 x offset, 5 g offset, 6 w offset, 7 blocks
@group(0) @binding(0) var<storage, read_write> dx: array<f32>;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> g: array<f32>;
@group(0) @binding(4) var<storage, read> w: array<f32>;
@group(0) @binding(5) var<uniform> info: array<vec4<u32>, {{INFO}}>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

const RMAX: u32 = {{RMAX}}u;
var<workgroup> red2: array<vec2<f32>, {{WG}}>;
var<workgroup> stats: array<vec4<f32>, RMAX>;   // mean, rstd, mean(gh), mean(gh * xhat)

// Workgroup-wide sum of two f32 per thread; every thread calls it and gets the sums.
fn wg_sum2(t: u32, v: vec2<f32>) -> vec2<f32> {
  red2[t] = v;
  for (var s = {{WG}}u / 2u; s > 0u; s = s / 2u) {
    workgroupBarrier();
    if (t < s) { red2[t] = red2[t] + red2[t + s]; }
  }
  workgroupBarrier();
  let r = red2[0];
  workgroupBarrier();
  return r;
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let blk = wid.x + wid.y * nwg.x;
  if (blk >= u(7u)) { return; }
  let D = u(1u);
  let fD = f32(D);
  let eps = bitcast<f32>(u(2u));
  let r0 = blk * u(3u);
  let n = min(u(3u), u(0u) - r0);
  let xo = u(4u);
  let go = u(5u);
  let wo = u(6u);
  for (var i = 0u; i < n; i = i + 1u) {
    let xb = xo + (r0 + i) * D;
    let gb = go + (r0 + i) * D;
    var s = vec2<f32>(0.0, 0.0);
    for (var j = t; j < D; j = j + {{WG}}u) { s = s + vec2<f32>(x[xb + j], g[gb + j] * w[wo + j]); }
    let s1 = wg_sum2(t, s);
    let mean = s1.x / fD;
    var q = vec2<f32>(0.0, 0.0);
    for (var j = t; j < D; j = j + {{WG}}u) {
      let d = x[xb + j] - mean;
      q = q + vec2<f32>(d * d, g[gb + j] * w[wo + j] * d);
    }
    let s2 = wg_sum2(t, q);
    let rstd = 1.0 / sqrt(s2.x / fD + eps);
    if (t == 0u) { stats[i] = vec4<f32>(mean, rstd, s1.y / fD, s2.y * rstd / fD); }
  }
  workgroupBarrier();
  let pb = blk * 2u * D;
  for (var j = t; j < D; j = j + {{WG}}u) {
    let wj = w[wo + j];
    var aw = 0.0;
    var ab = 0.0;
    for (var i = 0u; i < n; i = i + 1u) {
      let st = stats[i];
      let r = (r0 + i) * D + j;
      let gv = g[go + r];
      let xh = (x[xo + r] - st.x) * st.y;
      dx[r] = st.y * (gv * wj - st.z - xh * st.w);
      aw = aw + gv * xh;
      ab = ab + gv;
    }
    part[pb + j] = aw;
    part[pb + D + j] = ab;
  }
}
