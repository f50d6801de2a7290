// 2-D max and average pooling over NCHW windows, one thread per output element; contiguous
// input. info: 0 n_out, 1 C (N*C planes share the layout), 2 OH, 3 OW, 4 H, 5 W, 6 KH, 7 KW,
//   8 stride h, 9 stride w, 10 pad top, 11 pad left, 12 pad bottom, 13 pad right,
//   14 dil h, 15 dil w, 16 count_include_pad
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<storage, read> x: array<{{T}}>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, {{INFO}}>;

#include elementwise

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

fn lowest_f32() -> f32 { return -f_inf(); }
fn lowest_i32() -> i32 { return -2147483647 - 1; }
fn lowest_u32() -> u32 { return 0u; }
fn max_f32_(a: f32, b: f32) -> f32 { return max_f32(a, b); }
fn max_i32_(a: i32, b: i32) -> i32 { return max(a, b); }
fn max_u32_(a: u32, b: u32) -> u32 { return max(a, b); }

@compute @workgroup_size({{WG}})
fn max_pool(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  let OW = u(3u); let OH = u(2u);
  let ox = i % OW;
  let oy = (i / OW) % OH;
  let p = i / (OW * OH);
  let H = i32(u(4u)); let W = i32(u(5u));
  let base = p * u32(H) * u32(W);
  let y0 = i32(oy * u(8u)) - i32(u(10u));
  let x0 = i32(ox * u(9u)) - i32(u(11u));
  var acc = lowest_{{T}}();
  for (var ky = 0u; ky < u(6u); ky = ky + 1u) {
    let iy = y0 + i32(ky * u(14u));
    if (iy < 0 || iy >= H) { continue; }
    for (var kx = 0u; kx < u(7u); kx = kx + 1u) {
      let ix = x0 + i32(kx * u(15u));
      if (ix < 0 || ix >= W) { continue; }
      acc = max_{{T}}_(acc, x[base + u32(iy) * u32(W) + u32(ix)]);
    }
  }
  out[i] = acc;
}

@compute @workgroup_size({{WG}})
fn avg_pool(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  let OW = u(3u); let OH = u(2u);
  let ox = i % OW;
  let oy = (i / OW) % OH;
  let p = i / (OW * OH);
  let H = i32(u(4u)); let W = i32(u(5u));
  let base = p * u32(H) * u32(W);
  let y0 = i32(oy * u(8u)) - i32(u(10u));
  let x0 = i32(ox * u(9u)) - i32(u(11u));
  let KH = i32(u(6u)); let KW = i32(u(7u));
  var acc = 0.0;
  for (var iy = max(y0, 0); iy < min(y0 + KH, H); iy = iy + 1) {
    for (var ix = max(x0, 0); ix < min(x0 + KW, W); ix = ix + 1) {
      acc = acc + f32(x[base + u32(iy) * u32(W) + u32(ix)]);
    }
  }
  // PyTorch's divisor: the window clipped to the padded input, then (without
  // count_include_pad) to the input itself.
  let y1 = min(y0 + KH, H + i32(u(12u)));
  let x1 = min(x0 + KW, W + i32(u(13u)));
  var cnt: i32;
  if (u(16u) != 0u) {
    cnt = (y1 - y0) * (x1 - x0);
  } else {
    cnt = (min(y1, H) - max(y0, 0)) * (min(x1, W) - max(x0, 0));
  }
  out[i] = {{T}}(acc / f32(cnt));
}
