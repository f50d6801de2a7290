// Reductions over any set of axes of a strided view. The host orders the view's axes as
// (kept..., reduced...) and merges neighbours where it can; info layout (u32 words):
//   0 outputs, 1 reduced count R, 2 op (0 sum, 1 prod, 2 max, 3 min), 3 number of kept axes,
//   4 input offset, 5 divisor of a float result (f32 bits: 1, or the count of a mean),
//   8.. shape[RANK], 8+RANK.. strides[RANK] (signed)
// A is the accumulator type, O the output's (A, or i32 for the index of argmax/argmin).
// Entry points:
//   "cols": a workgroup of CX x CY threads (CX * CY = WG) handles CX outputs, each with CY lanes
//     that split its reduced elements (summed in shared memory); neighbouring threads take
//     neighbouring outputs, so a sum over leading axes (a bias gradient) reads whole lines. With
//     CX = 1 a workgroup reduces one output (long rows); the reduced elements may be split over
//     nwg.z workgroups too (parts): part s takes the s-th of nwg.z equal ranges and writes
//     out[o + s * outputs]; the host reduces the parts;
//   "arg_rows"/"arg_wg" give argmax/argmin (op 2/3) as the index of the first extreme, NaN
//     counting as the largest and winning first (one thread / one workgroup per output).
@group(0) @binding(0) var<storage, read_write> out: array<{{O}}>;
@group(0) @binding(1) var<storage, read> x: array<{{T}}>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, {{INFO}}>;

#include elementwise

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }
fn s(k: u32) -> i32 { return bitcast<i32>(info[k / 4u][k % 4u]); }

// element offset of output o's r-th reduced element
fn offset(o: u32, r: u32) -> u32 {
  let nk = u(3u);
  var ro = o;
  var rr = r;
  var off = s(4u);
  for (var d = {{RANK}} - 1; d >= 0; d = d - 1) {
    let n = u(8u + u32(d));
    let st = s(8u + {{RANK}}u + u32(d));
    if (u32(d) >= nk) {
      off = off + i32(rr % n) * st;
      rr = rr / n;
    } else {
      off = off + i32(ro % n) * st;
      ro = ro / n;
    }
  }
  return u32(off);
}

fn load(o: u32, r: u32) -> {{A}} { return {{A}}(x[offset(o, r)]); }

fn identity(op: u32) -> {{A}} {
  switch (op) {
    case 0u: { return {{A}}(0); }
    case 1u: { return {{A}}(1); }
    case 2u: { return lowest_{{A}}(); }
    default: { return highest_{{A}}(); }
  }
}

fn lowest_f32() -> f32 { return -f_inf(); }
fn highest_f32() -> f32 { return f_inf(); }
fn lowest_i32() -> i32 { return -2147483647 - 1; }
fn highest_i32() -> i32 { return 2147483647; }
fn lowest_u32() -> u32 { return 0u; }
fn highest_u32() -> u32 { return 0xffffffffu; }
fn max_any_f32(a: f32, b: f32) -> f32 { return max_f32(a, b); }
fn min_any_f32(a: f32, b: f32) -> f32 { return min_f32(a, b); }
fn max_any_i32(a: i32, b: i32) -> i32 { return max(a, b); }
fn min_any_i32(a: i32, b: i32) -> i32 { return min(a, b); }
fn max_any_u32(a: u32, b: u32) -> u32 { return max(a, b); }
fn min_any_u32(a: u32, b: u32) -> u32 { return min(a, b); }

fn combine(op: u32, a: {{A}}, b: {{A}}) -> {{A}} {
  switch (op) {
    case 0u: { return a + b; }
    case 1u: { return a * b; }
    case 2u: { return max_any_{{A}}(a, b); }
    default: { return min_any_{{A}}(a, b); }
  }
}

// Sequential part over reduced elements lo+start, lo+start+step, ... < hi: Kahan-compensated
// for float sums, plain otherwise; four loads issued before they are combined (they overlap).
fn add(op: u32, acc: ptr<function, {{A}}>, comp: ptr<function, {{A}}>, v: {{A}}) {
  if (op == 0u && {{FLOAT}}) {
    let y = v - *comp;
    let t = *acc + y;
    *comp = (t - *acc) - y;
    *acc = t;
  } else {
    *acc = combine(op, *acc, v);
  }
}

fn run(o: u32, lo: u32, hi: u32, start: u32, step: u32) -> {{A}} {
  let op = u(2u);
  var acc = identity(op);
  var comp = {{A}}(0);
  var r = lo + start;
  loop {
    if (r + 3u * step >= hi) { break; }
    let v0 = load(o, r);
    let v1 = load(o, r + step);
    let v2 = load(o, r + 2u * step);
    let v3 = load(o, r + 3u * step);
    add(op, &acc, &comp, v0);
    add(op, &acc, &comp, v1);
    add(op, &acc, &comp, v2);
    add(op, &acc, &comp, v3);
    r = r + 4u * step;
  }
  for (; r < hi; r = r + step) {
    add(op, &acc, &comp, load(o, r));
  }
  return acc;
}

// a float result divided by word 5 (a mean's count; 1 otherwise)
fn scaled(v: {{A}}) -> {{A}} {
  if ({{FLOAT}}) { return v / {{A}}(bitcast<f32>(u(5u))); }
  return v;
}

// [lo, hi) of part s of nparts of the R reduced elements
fn part_range(s: u32, nparts: u32) -> vec2<u32> {
  let R = u(1u);
  let chunk = (R + nparts - 1u) / nparts;
  let lo = min(R, s * chunk);
  return vec2<u32>(lo, min(R, lo + chunk));
}

var<workgroup> part: array<{{A}}, {{WG}}>;
var<workgroup> part_i: array<u32, {{WG}}>;

@compute @workgroup_size({{WG}})
fn cols(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let tx = t % {{CX}}u;
  let ty = t / {{CX}}u;
  let o = (wid.x + wid.y * nwg.x) * {{CX}}u + tx;
  let n = u(0u);
  let valid = o < n;
  let op = u(2u);
  let rng = part_range(wid.z, nwg.z);
  var acc = identity(op);
  if (valid) { acc = run(o, rng.x, rng.y, ty, {{CY}}u); }
  part[t] = acc;
  for (var w = {{CY}}u / 2u; w > 0u; w = w / 2u) {
    workgroupBarrier();
    if (ty < w) { part[t] = combine(op, part[t], part[t + w * {{CX}}u]); }
  }
  if (valid && ty == 0u) { out[o + wid.z * n] = {{O}}(scaled(part[t])); }
}

// (value, index) pairs: is (v, i) better than (w, j)?
fn better(op: u32, v: {{A}}, i: u32, w: {{A}}, j: u32) -> bool {
  if (j == 0xffffffffu) { return i != 0xffffffffu; }
  if (i == 0xffffffffu) { return false; }
  if ({{FLOAT}}) {
    let vn = is_nan(f32(v));
    let wn = is_nan(f32(w));
    if (vn || wn) { return vn && (!wn || i < j); }
  }
  if (v == w) { return i < j; }
  return select((v < w), (v > w), op == 2u);
}

fn arg_run(o: u32, start: u32, step: u32) -> vec2<u32> {
  let op = u(2u);
  let R = u(1u);
  var best = identity(op);
  var bi = 0xffffffffu;
  for (var r = start; r < R; r = r + step) {
    let v = load(o, r);
    if (better(op, v, r, best, bi)) { best = v; bi = r; }
  }
  return vec2<u32>(bi, 0u);
}

@compute @workgroup_size({{WG}})
fn arg_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let o = gid.x + gid.y * nwg.x * {{WG}}u;
  if (o >= u(0u)) { return; }
  out[o] = {{O}}(arg_run(o, 0u, 1u).x);
}

@compute @workgroup_size({{WG}})
fn arg_wg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) t: u32) {
  let o = wid.x + wid.y * nwg.x;
  let valid = o < u(0u);
  let op = u(2u);
  var bi = 0xffffffffu;
  if (valid) { bi = arg_run(o, t, {{WG}}u).x; }
  part_i[t] = bi;
  part[t] = select(identity(op), load(o, min(bi, u(1u) - 1u)), valid && bi != 0xffffffffu);
  for (var w = {{WG}}u / 2u; w > 0u; w = w / 2u) {
    workgroupBarrier();
    if (t < w && better(op, part[t + w], part_i[t + w], part[t], part_i[t])) {
      part[t] = part[t + w];
      part_i[t] = part_i[t + w];
    }
  }
  if (valid && t == 0u) { out[o] = {{O}}(part_i[0]); }
}
