// Reductions over the LANES lanes of a row (lane = t % LANES) for the *_rows kernels: subgroup
// shuffles across runs of min(LANES, subgroup size) lanes (sg_sum / sg_max from the template;
// runs of 1 without subgroups), then a tree over the runs in workgroup memory. Every thread of
// the workgroup calls them (barriers where the subgroup is narrower than a row's lanes).
var<workgroup> red: array<f32, {{WG}}>;

fn row_tree(t: u32, lane: u32, s: f32, span: u32, take_max: bool) -> f32 {
  red[t] = s;
  for (var h = LANES / 2u; h >= span; h = h / 2u) {
    workgroupBarrier();
    if (lane < h) { red[t] = select(red[t] + red[t + h], max(red[t], red[t + h]), take_max); }
  }
  workgroupBarrier();
  let r = red[t - lane];
  workgroupBarrier();
  return r;
}

fn row_sum(t: u32, lane: u32, v: f32, sgs: u32) -> f32 {
  let span = min(LANES, sgs);
  let s = sg_sum(v, span);
  if (span < LANES) { return row_tree(t, lane, s, span, false); }
  return s;
}

fn row_max(t: u32, lane: u32, v: f32, sgs: u32) -> f32 {
  let span = min(LANES, sgs);
  let s = sg_max(v, span);
  if (span < LANES) { return row_tree(t, lane, s, span, true); }
  return s;
}
