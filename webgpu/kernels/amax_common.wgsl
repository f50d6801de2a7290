// greedy_tokens' passes (llm.wgsl amax_part / amax_fin): the first largest value and its index,
// NaN counting as the largest (as argmax), and a workgroup tree over (value, index) pairs.
const NONE: u32 = 0xffffffffu;
var<workgroup> tv: array<f32, {{WG}}>;
var<workgroup> ti: array<u32, {{WG}}>;

// (v, i) comes before (w, j): larger, NaN, or equal at a lower index; NONE is no element
fn better(v: f32, i: u32, w: f32, j: u32) -> bool {
  if (j == NONE) { return i != NONE; }
  if (i == NONE) { return false; }
  let vn = is_nan(v);
  let wn = is_nan(w);
  if (vn || wn) { return vn && (!wn || i < j); }
  if (v == w) { return i < j; }
  return v > w;
}

fn amax_tree(t: u32, v: f32, i: u32) -> vec2<f32> {
  tv[t] = v;
  ti[t] = i;
  for (var s = {{WG}}u / 2u; s > 0u; s = s / 2u) {
    workgroupBarrier();
    if (t < s && better(tv[t + s], ti[t + s], tv[t], ti[t])) { tv[t] = tv[t + s]; ti[t] = ti[t + s]; }
  }
  workgroupBarrier();
  return vec2<f32>(tv[0], bitcast<f32>(ti[0]));
}
