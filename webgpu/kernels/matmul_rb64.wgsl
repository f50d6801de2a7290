// Matmul variant "rb64": 64x64 output tile per workgroup of 16x16 threads, 4x4 outputs per
// thread in four NAMED vec4 accumulators (an array would be placed in memory, not registers),
// k tiles of 16 in shared memory stored as vec4 so the inner loop does 2 vector loads per 16 FMAs.
// Global loads follow whichever operand axis is contiguous (x @ w.T reads w along k), and the
// next k tile is loaded into registers while the current one is multiplied.
@group(0) @binding(0) var<storage, read_write> C: array<f32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
{{EPILOGUE}}
#include matmul_common

const BM = 64u;
const BN = 64u;
const BK = 16u;
var<workgroup> As: array<vec4<f32>, 256>;   // [BK][BM / 4]
var<workgroup> Bs: array<vec4<f32>, 256>;   // [BK][BN / 4]

fn load_a(t: u32, a0: u32, row0: u32, k0: u32, M: u32, K: u32) -> vec4<f32> {
  var v = vec4<f32>();
  if (u(6u) == 1u) {            // A row-major: 4 consecutive k of one row
    let r = row0 + (t >> 2u);
    let k = k0 + (t & 3u) * 4u;
    let base = a0 + r * u(5u) + k;
    for (var j = 0u; j < 4u; j = j + 1u) { v[j] = select(0.0, A[base + j], r < M && k + j < K); }
  } else {                      // A column-major: 4 consecutive rows of one k
    let r = row0 + (t & 15u) * 4u;
    let k = k0 + (t >> 4u);
    for (var j = 0u; j < 4u; j = j + 1u) { v[j] = select(0.0, A[a0 + (r + j) * u(5u) + k * u(6u)], r + j < M && k < K); }
  }
  return v;
}

fn store_a(t: u32, v: vec4<f32>) {
  if (u(6u) == 1u) {
    let r = t >> 2u;
    let k = (t & 3u) * 4u;
    for (var j = 0u; j < 4u; j = j + 1u) { As[(k + j) * 16u + (r >> 2u)][r & 3u] = v[j]; }
  } else {
    As[(t >> 4u) * 16u + (t & 15u)] = v;
  }
}

fn load_b(t: u32, b0: u32, col0: u32, k0: u32, N: u32, K: u32) -> vec4<f32> {
  var v = vec4<f32>();
  if (u(10u) == 1u) {           // B row-major: 4 consecutive columns of one k
    let c = col0 + (t & 15u) * 4u;
    let k = k0 + (t >> 4u);
    let base = b0 + k * u(9u) + c;
    for (var j = 0u; j < 4u; j = j + 1u) { v[j] = select(0.0, B[base + j], c + j < N && k < K); }
  } else {                      // B column-major (w.T): 4 consecutive k of one column
    let c = col0 + (t >> 2u);
    let k = k0 + (t & 3u) * 4u;
    for (var j = 0u; j < 4u; j = j + 1u) { v[j] = select(0.0, B[b0 + (k + j) * u(9u) + c * u(10u)], c < N && k + j < K); }
  }
  return v;
}

fn store_b(t: u32, v: vec4<f32>) {
  if (u(10u) == 1u) {
    Bs[(t >> 4u) * 16u + (t & 15u)] = v;
  } else {
    let c = t >> 2u;
    let k = (t & 3u) * 4u;
    for (var j = 0u; j < 4u; j = j + 1u) { Bs[(k + j) * 16u + (c >> 2u)][c & 3u] = v[j]; }
  }
}

fn store_row(base: u32, col: u32, N: u32, v: vec4<f32>) {
  for (var j = 0u; j < 4u; j = j + 1u) {
    if (col + j < N) { C[base + col + j] = epilogue(v[j], base + col + j); }
  }
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let offs = batch_offsets(wg.z);
  let row0 = wg.y * BM;
  let col0 = wg.x * BN;
  var c0 = vec4<f32>(); var c1 = vec4<f32>(); var c2 = vec4<f32>(); var c3 = vec4<f32>();
  var ra = load_a(t, offs.x, row0, 0u, M, K);
  var rb = load_b(t, offs.y, col0, 0u, N, K);
  for (var k0 = 0u; k0 < K; k0 = k0 + BK) {
    workgroupBarrier();
    store_a(t, ra);
    store_b(t, rb);
    workgroupBarrier();
    if (k0 + BK < K) {
      ra = load_a(t, offs.x, row0, k0 + BK, M, K);
      rb = load_b(t, offs.y, col0, k0 + BK, N, K);
    }
    for (var k = 0u; k < BK; k = k + 1u) {
      let a = As[k * 16u + lid.y];
      let b = Bs[k * 16u + lid.x];
      c0 = c0 + a.x * b;
      c1 = c1 + a.y * b;
      c2 = c2 + a.z * b;
      c3 = c3 + a.w * b;
    }
  }
  let r = row0 + lid.y * 4u;
  let col = col0 + lid.x * 4u;
  let cb = wg.z * M * N;
  if (r < M) { store_row(cb + r * N, col, N, c0); }
  if (r + 1u < M) { store_row(cb + (r + 1u) * N, col, N, c1); }
  if (r + 2u < M) { store_row(cb + (r + 2u) * N, col, N, c2); }
  if (r + 3u < M) { store_row(cb + (r + 3u) * N, col, N, c3); }
}
