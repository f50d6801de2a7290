// Unfold an NCHW input into the columns of a convolution-as-matmul: cols is (N, C*KH*KW, OH*OW),
// row (c*KH + ky)*KW + kx, column oy*OW + ox holds x[n, c, oy*sh - pt + ky*dh, ox*sw - pl + kx*dw]
// (0 outside the input). One thread per column element; the weight (O, C*KH*KW) times cols is
// the convolution (groups = 1).
// info (u32 words): 0 n_out, 1 rows (C*KH*KW), 2 cols per image (OH*OW), 3 OW, 4 C, 5 H, 6 W,
//   7 KH, 8 KW, 9 stride h, 10 stride w, 11 pad top, 12 pad left, 13 dil h, 14 dil w, 15 x offset,
//   16..19 the element strides of x's n, c, h, w axes (x may be a permuted view)
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, {{INFO}}>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  let P = u(2u); let R = u(1u);
  let p = i % P;
  let t = i / P;
  let r = t % R;
  let n = t / R;
  let KH = u(7u); let KW = u(8u);
  let kx = r % KW;
  let ky = (r / KW) % KH;
  let c = r / (KW * KH);
  let OW = u(3u);
  let iy = i32((p / OW) * u(9u)) - i32(u(11u)) + i32(ky * u(13u));
  let ix = i32((p % OW) * u(10u)) - i32(u(12u)) + i32(kx * u(14u));
  let H = i32(u(5u)); let W = i32(u(6u));
  var v = 0.0;
  if (iy >= 0 && iy < H && ix >= 0 && ix < W) {
    v = x[u(15u) + n * u(16u) + c * u(17u) + u32(iy) * u(18u) + u32(ix) * u(19u)];
  }
  out[i] = v;
}
