// Direct 2-D convolutions, one thread per output element, NCHW input, optional bias,
// contiguous operands. Entry points:
//   conv2d: cross-correlation with an (O, C/groups, KH, KW) weight;
//   conv_transpose2d: each output gathers the inputs that scatter onto it, with a
//     (C, O/groups, KH, KW) weight.
// info (u32 words): 0 n_out, 1 N, 2 O, 3 OH, 4 OW, 5 C, 6 H, 7 W, 8 KH, 9 KW, 10 stride h,
//   11 stride w, 12 pad top, 13 pad left, 14 dil h, 15 dil w, 16 input channels per group,
//   17 output channels per group, 18 has bias
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<uniform> info: array<vec4<u32>, {{INFO}}>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

// (n, o, oy, ox) of output element i
fn out_index(i: u32) -> vec4<u32> {
  let OW = u(4u); let OH = u(3u); let O = u(2u);
  let ox = i % OW;
  var t = i / OW;
  let oy = t % OH;
  t = t / OH;
  return vec4<u32>(t / O, t % O, oy, ox);
}

@compute @workgroup_size({{WG}})
fn conv2d(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  let q = out_index(i);
  let n = q.x; let o = q.y; let oy = q.z; let ox = q.w;
  let C = u(5u); let H = i32(u(6u)); let W = i32(u(7u));
  let KH = u(8u); let KW = u(9u);
  let cg = u(16u);
  let g = o / u(17u);
  var acc = 0.0;
  if (u(18u) != 0u) { acc = bias[o]; }
  let y0 = i32(oy * u(10u)) - i32(u(12u));
  let x0 = i32(ox * u(11u)) - i32(u(13u));
  let dh = i32(u(14u)); let dw = i32(u(15u));
  for (var c = 0u; c < cg; c = c + 1u) {
    let xbase = (n * C + g * cg + c) * u32(H) * u32(W);
    let wbase = (o * cg + c) * KH * KW;
    for (var ky = 0u; ky < KH; ky = ky + 1u) {
      let iy = y0 + i32(ky) * dh;
      if (iy < 0 || iy >= H) { continue; }
      for (var kx = 0u; kx < KW; kx = kx + 1u) {
        let ix = x0 + i32(kx) * dw;
        if (ix < 0 || ix >= W) { continue; }
        acc = acc + x[xbase + u32(iy) * u32(W) + u32(ix)] * w[wbase + ky * KW + kx];
      }
    }
  }
  out[i] = acc;
}

@compute @workgroup_size({{WG}})
fn conv_transpose2d(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  let q = out_index(i);
  let n = q.x; let o = q.y; let oy = q.z; let ox = q.w;
  let C = u(5u); let H = i32(u(6u)); let W = i32(u(7u));
  let KH = u(8u); let KW = u(9u);
  let sh = i32(u(10u)); let sw = i32(u(11u));
  let cpg = u(16u); let og = u(17u);
  let g = o / og;
  let oo = o % og;
  var acc = 0.0;
  if (u(18u) != 0u) { acc = bias[o]; }
  let dh = i32(u(14u)); let dw = i32(u(15u));
  for (var c = 0u; c < cpg; c = c + 1u) {
    let ci = g * cpg + c;
    let xbase = (n * C + ci) * u32(H) * u32(W);
    let wbase = (ci * og + oo) * KH * KW;
    for (var ky = 0u; ky < KH; ky = ky + 1u) {
      let ty = i32(oy) + i32(u(12u)) - i32(ky) * dh;
      if (ty < 0 || u32(ty) % u32(sh) != 0u) { continue; }
      let iy = ty / sh;
      if (iy >= H) { continue; }
      for (var kx = 0u; kx < KW; kx = kx + 1u) {
        let tx = i32(ox) + i32(u(13u)) - i32(kx) * dw;
        if (tx < 0 || u32(tx) % u32(sw) != 0u) { continue; }
        let ix = tx / sw;
        if (ix >= W) { continue; }
        acc = acc + x[xbase + u32(iy) * u32(W) + u32(ix)] * w[wbase + ky * KW + kx];
      }
    }
  }
  out[i] = acc;
}
