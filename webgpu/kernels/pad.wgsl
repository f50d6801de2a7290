// pad with modes 0 constant, 1 edge, 2 reflect, 3 wrap, over a (possibly cropped) strided view.
// info: 0 n, 1 mode, 2 constant value (bits of T), 3 x offset,
//       8.. out shape[RANK], 8+RANK.. x strides[RANK] (signed), 8+2*RANK.. padding before[RANK]
//       (signed), 8+3*RANK.. input sizes[RANK]
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<storage, read> x: array<{{T}}>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, {{INFO}}>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }
fn s(k: u32) -> i32 { return bitcast<i32>(info[k / 4u][k % 4u]); }

// j mod m in [0, m) for negative j too, without WGSL's % on negative i32 operands (wrong on an
// NVIDIA Vulkan driver)
fn pos_mod(j: i32, m: i32) -> i32 {
  let r = j - (j / m) * m;
  return select(r, r + m, r < 0);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  let mode = u(1u);
  var rem = i;
  var xo = s(3u);
  var inside = true;
  for (var d = {{RANK}} - 1; d >= 0; d = d - 1) {
    let n = u(8u + u32(d));
    var j = i32(rem % n) - s(8u + 2u * {{RANK}}u + u32(d));
    rem = rem / n;
    let m = i32(u(8u + 3u * {{RANK}}u + u32(d)));
    if (j < 0 || j >= m) {
      if (mode == 0u) {
        inside = false;
      } else if (mode == 1u) {
        j = clamp(j, 0, m - 1);
      } else if (mode == 2u) {
        if (m == 1) {
          j = 0;
        } else {
          let p = 2 * (m - 1);
          let r = pos_mod(j, p);
          j = select(p - r, r, r < m);
        }
      } else {
        j = pos_mod(j, m);
      }
    }
    xo = xo + j * s(8u + {{RANK}}u + u32(d));
  }
  if (inside) {
    out[i] = x[u32(xo)];
  } else {
    out[i] = bitcast<{{T}}>(u(2u));
  }
}
