// Matmul variant "rb128": a 128x128 output tile per workgroup of 16x16 threads, 8x8 outputs per
// thread in sixteen NAMED vec4 accumulators (c<row>_<group>; an indexed array would be placed in
// memory instead of registers: 2 instead of 24 TFLOP/s on an H200). k tiles of 16 sit in shared
// memory as vec4 (2 x 8 KiB, exactly WebGPU's default 16 KiB), so each k step is 4 vector loads
// for 64 FMAs. Global loads follow each operand's contiguous axis; where it is 16-byte aligned
// (info words 7 and 11, set by the host) they are vec4 loads through a second binding of the same
// buffer (A4, B4), else scalar loads with bounds checks. The next k tile is fetched into registers
// while the current one is multiplied, and the k loop is unrolled (Naga keeps loops as loops).
// Written out by a small generator during tuning on an H200 (4096^3: 27 TFLOP/s against 20 for
// the rolled scalar-load version); edit it as plain WGSL.
@group(0) @binding(0) var<storage, read_write> C: array<f32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read> A4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> B4: array<vec4<f32>>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
{{EPILOGUE}}
#include matmul_common
var<workgroup> As: array<vec4<f32>, 512>;
var<workgroup> Bs: array<vec4<f32>, 512>;
struct VA { v0: vec4<f32>, v1: vec4<f32> }
struct VB { v0: vec4<f32>, v1: vec4<f32> }
fn load_a(t: u32, a0: u32, row0: u32, k0: u32, M: u32, K: u32) -> VA {
  var v: VA;
  if (u(6u) == 1u) {
    let r = row0 + t / 2u;
    let k = k0 + (t % 2u) * 8u;
    let base = a0 + r * u(5u) + k;
    if (u(7u) == 1u && r < M && k + 8u <= K) {
      v.v0 = A4[base / 4u + 0u];
      v.v1 = A4[base / 4u + 1u];
      return v;
    }
    for (var j = 0u; j < 4u; j = j + 1u) { v.v0[j] = select(0.0, A[base + 0u + j], r < M && k + 0u + j < K); }
    for (var j = 0u; j < 4u; j = j + 1u) { v.v1[j] = select(0.0, A[base + 4u + j], r < M && k + 4u + j < K); }
  } else {
    let r = row0 + (t % 16u) * 8u;
    let k = k0 + t / 16u;
    for (var j = 0u; j < 4u; j = j + 1u) { v.v0[j] = select(0.0, A[a0 + (r + 0u + j) * u(5u) + k * u(6u)], r + 0u + j < M && k < K); }
    for (var j = 0u; j < 4u; j = j + 1u) { v.v1[j] = select(0.0, A[a0 + (r + 4u + j) * u(5u) + k * u(6u)], r + 4u + j < M && k < K); }
  }
  return v;
}
fn store_a(t: u32, v: VA) {
  if (u(6u) == 1u) {
    let r = t / 2u;
    let k = (t % 2u) * 8u;
    for (var j = 0u; j < 4u; j = j + 1u) { As[(k + 0u + j) * 32u + (r >> 2u)][r & 3u] = v.v0[j]; }
    for (var j = 0u; j < 4u; j = j + 1u) { As[(k + 4u + j) * 32u + (r >> 2u)][r & 3u] = v.v1[j]; }
  } else {
    let r4 = (t % 16u) * 2u;
    let k = t / 16u;
    As[k * 32u + r4 + 0u] = v.v0;
    As[k * 32u + r4 + 1u] = v.v1;
  }
}
fn load_b(t: u32, b0: u32, col0: u32, k0: u32, N: u32, K: u32) -> VB {
  var v: VB;
  if (u(10u) == 1u) {
    let c = col0 + (t % 16u) * 8u;
    let k = k0 + t / 16u;
    let base = b0 + k * u(9u) + c;
    if (u(11u) == 1u && k < K && c + 8u <= N) {
      v.v0 = B4[base / 4u + 0u];
      v.v1 = B4[base / 4u + 1u];
      return v;
    }
    for (var j = 0u; j < 4u; j = j + 1u) { v.v0[j] = select(0.0, B[base + 0u + j], c + 0u + j < N && k < K); }
    for (var j = 0u; j < 4u; j = j + 1u) { v.v1[j] = select(0.0, B[base + 4u + j], c + 4u + j < N && k < K); }
  } else {
    let c = col0 + t / 2u;
    let k = k0 + (t % 2u) * 8u;
    for (var j = 0u; j < 4u; j = j + 1u) { v.v0[j] = select(0.0, B[b0 + (k + 0u + j) * u(9u) + c * u(10u)], c < N && k + 0u + j < K); }
    for (var j = 0u; j < 4u; j = j + 1u) { v.v1[j] = select(0.0, B[b0 + (k + 4u + j) * u(9u) + c * u(10u)], c < N && k + 4u + j < K); }
  }
  return v;
}
fn store_b(t: u32, v: VB) {
  if (u(10u) == 1u) {
    let c4 = (t % 16u) * 2u;
    let k = t / 16u;
    Bs[k * 32u + c4 + 0u] = v.v0;
    Bs[k * 32u + c4 + 1u] = v.v1;
  } else {
    let c = t / 2u;
    let k = (t % 2u) * 8u;
    for (var j = 0u; j < 4u; j = j + 1u) { Bs[(k + 0u + j) * 32u + (c >> 2u)][c & 3u] = v.v0[j]; }
    for (var j = 0u; j < 4u; j = j + 1u) { Bs[(k + 4u + j) * 32u + (c >> 2u)][c & 3u] = v.v1[j]; }
  }
}
fn store4(base: u32, col: u32, N: u32, v: vec4<f32>) {
  for (var j = 0u; j < 4u; j = j + 1u) { if (col + j < N) { C[base + col + j] = epilogue(v[j], base + col + j); } }
}
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let offs = batch_offsets(wg.z);
  let row0 = wg.y * 128u;
  let col0 = wg.x * 128u;
  var c0_0 = vec4<f32>(); var c0_1 = vec4<f32>();
  var c1_0 = vec4<f32>(); var c1_1 = vec4<f32>();
  var c2_0 = vec4<f32>(); var c2_1 = vec4<f32>();
  var c3_0 = vec4<f32>(); var c3_1 = vec4<f32>();
  var c4_0 = vec4<f32>(); var c4_1 = vec4<f32>();
  var c5_0 = vec4<f32>(); var c5_1 = vec4<f32>();
  var c6_0 = vec4<f32>(); var c6_1 = vec4<f32>();
  var c7_0 = vec4<f32>(); var c7_1 = vec4<f32>();
  let ao = lid.y * 2u;
  var ra = load_a(t, offs.x, row0, 0u, M, K);
  var rb = load_b(t, offs.y, col0, 0u, N, K);
  for (var k0 = 0u; k0 < K; k0 = k0 + 16u) {
    workgroupBarrier();
    store_a(t, ra);
    store_b(t, rb);
    workgroupBarrier();
    if (k0 + 16u < K) {
      ra = load_a(t, offs.x, row0, k0 + 16u, M, K);
      rb = load_b(t, offs.y, col0, k0 + 16u, N, K);
    }
    {
      let a0 = As[0u + ao];
      let a1 = As[1u + ao];
      let b0 = Bs[0u + lid.x];
      let b1 = Bs[16u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[32u + ao];
      let a1 = As[33u + ao];
      let b0 = Bs[32u + lid.x];
      let b1 = Bs[48u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[64u + ao];
      let a1 = As[65u + ao];
      let b0 = Bs[64u + lid.x];
      let b1 = Bs[80u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[96u + ao];
      let a1 = As[97u + ao];
      let b0 = Bs[96u + lid.x];
      let b1 = Bs[112u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[128u + ao];
      let a1 = As[129u + ao];
      let b0 = Bs[128u + lid.x];
      let b1 = Bs[144u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[160u + ao];
      let a1 = As[161u + ao];
      let b0 = Bs[160u + lid.x];
      let b1 = Bs[176u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[192u + ao];
      let a1 = As[193u + ao];
      let b0 = Bs[192u + lid.x];
      let b1 = Bs[208u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[224u + ao];
      let a1 = As[225u + ao];
      let b0 = Bs[224u + lid.x];
      let b1 = Bs[240u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[256u + ao];
      let a1 = As[257u + ao];
      let b0 = Bs[256u + lid.x];
      let b1 = Bs[272u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[288u + ao];
      let a1 = As[289u + ao];
      let b0 = Bs[288u + lid.x];
      let b1 = Bs[304u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[320u + ao];
      let a1 = As[321u + ao];
      let b0 = Bs[320u + lid.x];
      let b1 = Bs[336u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[352u + ao];
      let a1 = As[353u + ao];
      let b0 = Bs[352u + lid.x];
      let b1 = Bs[368u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[384u + ao];
      let a1 = As[385u + ao];
      let b0 = Bs[384u + lid.x];
      let b1 = Bs[400u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[416u + ao];
      let a1 = As[417u + ao];
      let b0 = Bs[416u + lid.x];
      let b1 = Bs[432u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[448u + ao];
      let a1 = As[449u + ao];
      let b0 = Bs[448u + lid.x];
      let b1 = Bs[464u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
    {
      let a0 = As[480u + ao];
      let a1 = As[481u + ao];
      let b0 = Bs[480u + lid.x];
      let b1 = Bs[496u + lid.x];
      c0_0 = c0_0 + a0.x * b0; c0_1 = c0_1 + a0.x * b1;
      c1_0 = c1_0 + a0.y * b0; c1_1 = c1_1 + a0.y * b1;
      c2_0 = c2_0 + a0.z * b0; c2_1 = c2_1 + a0.z * b1;
      c3_0 = c3_0 + a0.w * b0; c3_1 = c3_1 + a0.w * b1;
      c4_0 = c4_0 + a1.x * b0; c4_1 = c4_1 + a1.x * b1;
      c5_0 = c5_0 + a1.y * b0; c5_1 = c5_1 + a1.y * b1;
      c6_0 = c6_0 + a1.z * b0; c6_1 = c6_1 + a1.z * b1;
      c7_0 = c7_0 + a1.w * b0; c7_1 = c7_1 + a1.w * b1;
    }
  }
  let r = row0 + lid.y * 8u;
  let cb = wg.z * M * N;
  if (r + 0u < M) {
    store4(cb + (r + 0u) * N, col0 + 0u + lid.x * 4u, N, c0_0);
    store4(cb + (r + 0u) * N, col0 + 64u + lid.x * 4u, N, c0_1);
  }
  if (r + 1u < M) {
    store4(cb + (r + 1u) * N, col0 + 0u + lid.x * 4u, N, c1_0);
    store4(cb + (r + 1u) * N, col0 + 64u + lid.x * 4u, N, c1_1);
  }
  if (r + 2u < M) {
    store4(cb + (r + 2u) * N, col0 + 0u + lid.x * 4u, N, c2_0);
    store4(cb + (r + 2u) * N, col0 + 64u + lid.x * 4u, N, c2_1);
  }
  if (r + 3u < M) {
    store4(cb + (r + 3u) * N, col0 + 0u + lid.x * 4u, N, c3_0);
    store4(cb + (r + 3u) * N, col0 + 64u + lid.x * 4u, N, c3_1);
  }
  if (r + 4u < M) {
    store4(cb + (r + 4u) * N, col0 + 0u + lid.x * 4u, N, c4_0);
    store4(cb + (r + 4u) * N, col0 + 64u + lid.x * 4u, N, c4_1);
  }
  if (r + 5u < M) {
    store4(cb + (r + 5u) * N, col0 + 0u + lid.x * 4u, N, c5_0);
    store4(cb + (r + 5u) * N, col0 + 64u + lid.x * 4u, N, c5_1);
  }
  if (r + 6u < M) {
    store4(cb + (r + 6u) * N, col0 + 0u + lid.x * 4u, N, c6_0);
    store4(cb + (r + 6u) * N, col0 + 64u + lid.x * 4u, N, c6_1);
  }
  if (r + 7u < M) {
    store4(cb + (r + 7u) * N, col0 + 0u + lid.x * 4u, N, c7_0);
    store4(cb + (r + 7u) * N, col0 + 64u + lid.x * 4u, N, c7_1);
  }
}
