// Workgroup-wide sum and max of one f32 per thread (tree in shared memory). Every thread of the
// workgroup must call them (they contain barriers); all get the result. Needs elementwise.wgsl.
var<workgroup> red: array<f32, {{WG}}>;

fn wg_reduce(t: u32, v: f32, is_max: bool) -> f32 {
  red[t] = v;
  for (var w = {{WG}}u / 2u; w > 0u; w = w / 2u) {
    workgroupBarrier();
    if (t < w) {
      red[t] = select(red[t] + red[t + w], max_f32(red[t], red[t + w]), is_max);
    }
  }
  workgroupBarrier();
  let r = red[0];
  workgroupBarrier();
  return r;
}

fn wg_sum(t: u32, v: f32) -> f32 { return wg_reduce(t, v, false); }
fn wg_max(t: u32, v: f32) -> f32 { return wg_reduce(t, v, true); }
