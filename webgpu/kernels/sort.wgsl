// Stable sort along one axis of a contiguous (outer, n, inner) layout by ranking: each thread
// takes one element and counts the elements that go before it (smaller, or equal and earlier;
// NaN counts as the largest value), then writes the value and its index at that rank. O(n) work
// per element: fine for the rows models sort (top-k over a vocabulary, small n); no workgroup
// memory, any n. info: 0 total, 1 n, 2 inner, 3 descending
@group(0) @binding(0) var<storage, read_write> vals: array<{{T}}>;
@group(0) @binding(1) var<storage, read_write> idx: array<i32>;
@group(0) @binding(2) var<storage, read> x: array<{{T}}>;
@group(0) @binding(3) var<uniform> info: array<vec4<u32>, {{INFO}}>;

#include elementwise

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

// a < b in sort order (ascending), NaN largest
fn lt(a: {{T}}, b: {{T}}) -> bool {
  if ({{FLOAT}}) {
    let an = is_nan(f32(a));
    let bn = is_nan(f32(b));
    if (an || bn) { return !an && bn; }
  }
  return a < b;
}

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  let n = u(1u); let inner = u(2u);
  let r = i % inner;
  let p = (i / inner) % n;
  let base = (i / (inner * n)) * n * inner + r;
  let desc = u(3u) != 0u;
  let v = x[base + p * inner];
  var rank = 0u;
  for (var q = 0u; q < n; q = q + 1u) {
    let w = x[base + q * inner];
    let before = select(lt(w, v), lt(v, w), desc);
    let tie = !lt(w, v) && !lt(v, w) && q < p;
    if (before || tie) { rank = rank + 1u; }
  }
  vals[base + rank * inner] = v;
  idx[base + rank * inner] = i32(p);
}
