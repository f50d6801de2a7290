// take / take_along_axis: out[i] = x[x_offset + sum(d_k * xs_k) + fix(idx[idx_offset + sum(d_k * is_k)]) * axis_stride]
// where d is the multi-index of output element i; xs is 0 on the index axes, is is 0 on the
// others (and on broadcast ones). Negative indices count from the end; the host has checked the
// range before the dispatch, the clamp only keeps a bad index inside the buffer.
// info: 0 n, 1 axis size, 2 axis stride (signed), 3 x offset, 4 idx offset,
//       8.. out shape[RANK], 8+RANK.. xs[RANK], 8+2*RANK.. is[RANK] (signed)
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<storage, read> x: array<{{T}}>;
@group(0) @binding(2) var<storage, read> idx: array<{{I}}>;
@group(0) @binding(3) var<uniform> info: array<vec4<u32>, {{INFO}}>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }
fn s(k: u32) -> i32 { return bitcast<i32>(info[k / 4u][k % 4u]); }

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  var rem = i;
  var xo = s(3u);
  var io = s(4u);
  for (var d = {{RANK}} - 1; d >= 0; d = d - 1) {
    let n = u(8u + u32(d));
    let k = i32(rem % n);
    rem = rem / n;
    xo = xo + k * s(8u + {{RANK}}u + u32(d));
    io = io + k * s(8u + 2u * {{RANK}}u + u32(d));
  }
  let size = i32(u(1u));
  var v = i32(idx[u32(io)]);
  if (v < 0) { v = v + size; }
  v = clamp(v, 0, size - 1);
  out[i] = x[u32(xo + v * s(2u))];
}
