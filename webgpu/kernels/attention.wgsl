// scaled_dot_product_attention, one workgroup per query row: scores for all S keys in shared
// memory (S <= SMAX), a max and a sum reduction, then the weighted sum of value rows. Rows whose
// keys are all masked give zeros. Operands are read through strides (batch axes broadcast with
// stride 0), so head-broadcast keys or masks are never copied.
// The output is written heads-interleaved: logical (..., H, L, Ev) stored as (..., L, H, Ev), H the
// last batch axis, so the usual merge of heads (permute to (..., L, H, Ev), reshape) is a free view.
// info: 0 rows (batch * L), 1 L, 2 S, 3 E, 4 Ev, 5 mask kind (0 none, 1 bool, 2 additive float),
//       6 causal, 7 scale (f32 bits); per operand (q 8, k 12, v 16, mask 20): offset, row stride,
//       column stride, and word 11: H (1 without batch axes);
//       24.. batch shape[RANK], then batch strides[RANK] of q, k, v, mask
#include attention_io

const SMAX = 2048u;
var<workgroup> sc: array<f32, SMAX>;
#include wg_reduce

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let row = wid.x + wid.y * nwg.x;
  if (row >= u(0u)) { return; }
  let L = u(1u); let S = u(2u); let E = u(3u); let Ev = u(4u);
  let b = row / L;
  let l = row % L;
  var qo = u(8u); var ko = u(12u); var vo = u(16u); var mo = u(20u);
  var rem = b;
  for (var d = {{RANK}} - 1; d >= 0; d = d - 1) {
    let n = u(24u + u32(d));
    let i = rem % n;
    rem = rem / n;
    qo = qo + i * u(24u + {{RANK}}u + u32(d));
    ko = ko + i * u(24u + 2u * {{RANK}}u + u32(d));
    vo = vo + i * u(24u + 3u * {{RANK}}u + u32(d));
    mo = mo + i * u(24u + 4u * {{RANK}}u + u32(d));
  }
  qo = qo + l * u(9u);
  mo = mo + l * u(21u);
  let kind = u(5u);
  let scale = bitcast<f32>(u(7u));
  var m = -f_inf();
  for (var j = t; j < S; j = j + {{WG}}u) {
    var s = 0.0;
    let kr = ko + j * u(13u);
    for (var e = 0u; e < E; e = e + 1u) { s = s + q[qo + e * u(10u)] * k[kr + e * u(14u)]; }
    s = s * scale;
    if (kind == 1u) {
      if (mask[mo + j * u(22u)] == 0u) { s = -f_inf(); }
    } else if (kind == 2u) {
      s = s + bitcast<f32>(mask[mo + j * u(22u)]);
    }
    if (u(6u) != 0u && j > l) { s = -f_inf(); }
    sc[j] = s;
    m = max_f32(m, s);
  }
  var mx = wg_max(t, m);
  let dead = mx == -f_inf();
  if (dead) { mx = 0.0; }
  var tot = 0.0;
  for (var j = t; j < S; j = j + {{WG}}u) {
    let p = exp_f32(sc[j] - mx);
    sc[j] = p;
    tot = tot + p;
  }
  var total = wg_sum(t, tot);
  if (dead) { total = 1.0; }
  let inv = 1.0 / total;
  let H = u(11u);
  let orow = ((b / H) * L + l) * H + b % H;
  for (var e = t; e < Ev; e = e + {{WG}}u) {
    var acc = 0.0;
    for (var j = 0u; j < S; j = j + 1u) { acc = acc + sc[j] * v[vo + j * u(17u) + e * u(18u)]; }
    out[orow * Ev + e] = acc * inv;
  }
}
