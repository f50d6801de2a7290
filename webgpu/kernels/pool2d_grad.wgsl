// The gradient of 2-D max pooling (NCHW, contiguous x and output gradient g), one thread per
// input element: it gathers g from every window that has it as a tap and picks it as that
// window's winner: the first tap in window order (row by row) holding the window's maximum, NaN
// counting as the largest (PyTorch's rule; taps outside the input count as -inf, so a window of
// -inf gives its gradient to its first tap, which may lie in the padding: then it is dropped).
// info: 0 n (N*C*H*W), 1 H, 2 W, 3 OH, 4 OW, 5 KH, 6 KW, 7 stride h, 8 stride w, 9 pad top,
//   10 pad left, 11 dil h, 12 dil w
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<uniform> info: array<vec4<u32>, {{INFO}}>;

#include elementwise

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

// the value of tap (iy, ix) of plane base (-inf outside the input)
fn tap(base: u32, iy: i32, ix: i32) -> f32 {
  let H = i32(u(1u)); let W = i32(u(2u));
  if (iy < 0 || iy >= H || ix < 0 || ix >= W) { return -f_inf(); }
  return x[base + u32(iy) * u32(W) + u32(ix)];
}

// index (ky * KW + kx) of window (oy, ox)'s winning tap
fn winner(base: u32, oy: u32, ox: u32) -> u32 {
  let KH = u(5u); let KW = u(6u);
  let y0 = i32(oy * u(7u)) - i32(u(9u));
  let x0 = i32(ox * u(8u)) - i32(u(10u));
  let dh = i32(u(11u)); let dw = i32(u(12u));
  var best = tap(base, y0, x0);
  var bi = 0u;
  for (var ky = 0u; ky < KH; ky = ky + 1u) {
    for (var kx = 0u; kx < KW; kx = kx + 1u) {
      let v = tap(base, y0 + i32(ky) * dh, x0 + i32(kx) * dw);
      if ((is_nan(v) && !is_nan(best)) || v > best) {
        best = v;
        bi = ky * KW + kx;
      }
    }
  }
  return bi;
}

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  let H = u(1u); let W = u(2u); let OH = u(3u); let OW = u(4u);
  let KH = u(5u); let KW = u(6u);
  let sh = i32(u(7u)); let sw = i32(u(8u));
  let dh = i32(u(11u)); let dw = i32(u(12u));
  let w = i % W;
  let h = (i / W) % H;
  let p = i / (W * H);
  let base = p * H * W;
  var acc = 0.0;
  for (var ky = 0u; ky < KH; ky = ky + 1u) {
    let ty = i32(h) + i32(u(9u)) - i32(ky) * dh;
    if (ty < 0 || ty % sh != 0) { continue; }
    let oy = u32(ty / sh);
    if (oy >= OH) { continue; }
    for (var kx = 0u; kx < KW; kx = kx + 1u) {
      let tx = i32(w) + i32(u(10u)) - i32(kx) * dw;
      if (tx < 0 || tx % sw != 0) { continue; }
      let ox = u32(tx / sw);
      if (ox >= OW) { continue; }
      if (winner(base, oy, ox) == ky * KW + kx) {
        acc = acc + g[(p * OH + oy) * OW + ox];
      }
    }
  }
  out[i] = acc;
}
