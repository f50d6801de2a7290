// Matmul variants "rb128" and "sk": a 128x128 output tile per workgroup of 256 threads, 8x8
// outputs per thread in sixteen NAMED vec4 accumulators (an indexed array would be placed in
// memory instead of registers: 2 instead of 24 TFLOP/s on an H200). The k loop, fully unrolled,
// is written in by ember.webgpu.linalg.render_rb128 (template parameter MAIN_LOOP).
// - k tiles of 8 sit in shared memory as vec4 in two buffers: the next tile is fetched into
//   registers and stored into the other buffer while this one is multiplied, so a tile costs
//   one barrier (2 x 8 KiB: WebGPU's default 16 KiB of workgroup memory).
// - The shared arrays are two-dimensional and the unrolled loop indexes their outer axis with
//   constants, so the bounds clamp WebGPU adds to every dynamic index is computed once per
//   thread, not once per load.
// - Threads are laid out per warp (2 x 4 warps of 8 x 4 threads): per k step the 32 threads of
//   a warp read 8 distinct A vectors and 4 distinct B vectors per load.
// - Global loads follow each operand's contiguous axis; where it is 16-byte aligned (info words
//   7 and 11, set by the host) they are vec4 loads through a second binding of the same buffer
//   (A4, B4), else scalar loads with bounds checks.
// - Split-K ("sk", SPLIT > 1): workgroup z = batch * SPLIT + part; each part sums its own range
//   of whole k tiles into plane z of a partial buffer (bound as C, identity epilogue), and
//   matmul_splitk adds the planes up and applies the epilogue.
// On an H200 (Vulkan) at 4096^3: 36 TFLOP/s, 0.70x PyTorch's fp32 (TF32 off); the previous
// single-buffered 16-deep version with 16x16 threads: 28.6.
@group(0) @binding(0) var<storage, read_write> C: array<f32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read> A4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> B4: array<vec4<f32>>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
{{EPILOGUE}}
#include matmul_common

const SPLIT = {{SPLIT}}u;
var<workgroup> As: array<array<vec4<f32>, 32>, 16>;   // [buffer * 8 + k][row / 4]
var<workgroup> Bs: array<array<vec4<f32>, 32>, 16>;   // [buffer * 8 + k][column / 4]

// one thread's share of a k tile: 4 values of A and 4 of B
struct Tile { a: vec4<f32>, b: vec4<f32> }

fn load_a4(a0: u32, r: u32, k: u32, M: u32, K: u32) -> vec4<f32> {
  // k..k+3 of row r (A row-major)
  let base = a0 + r * u(5u) + k;
  if (u(7u) == 1u && r < M && k + 4u <= K) { return A4[base / 4u]; }
  var v = vec4<f32>();
  for (var j = 0u; j < 4u; j = j + 1u) { v[j] = select(0.0, A[base + j], r < M && k + j < K); }
  return v;
}
fn load_a_rows(a0: u32, r: u32, k: u32, M: u32, K: u32) -> vec4<f32> {
  // rows r..r+3 at one k (A column-major: x.T)
  var v = vec4<f32>();
  for (var j = 0u; j < 4u; j = j + 1u) { v[j] = select(0.0, A[a0 + (r + j) * u(5u) + k * u(6u)], r + j < M && k < K); }
  return v;
}
fn load_b4(b0: u32, c: u32, k: u32, N: u32, K: u32) -> vec4<f32> {
  // columns c..c+3 of row k (B row-major)
  let base = b0 + k * u(9u) + c;
  if (u(11u) == 1u && k < K && c + 4u <= N) { return B4[base / 4u]; }
  var v = vec4<f32>();
  for (var j = 0u; j < 4u; j = j + 1u) { v[j] = select(0.0, B[base + j], c + j < N && k < K); }
  return v;
}
fn load_b_ks(b0: u32, c: u32, k: u32, N: u32, K: u32) -> vec4<f32> {
  // k..k+3 of column c (B column-major: w.T)
  var v = vec4<f32>();
  for (var j = 0u; j < 4u; j = j + 1u) { v[j] = select(0.0, B[b0 + (k + j) * u(9u) + c * u(10u)], c < N && k + j < K); }
  return v;
}

// the tile at k0: A as 128 rows x 2 vec4 along k, or 8 k x 32 vec4 along rows; B likewise
fn load(t: u32, offs: vec2<u32>, row0: u32, col0: u32, k0: u32, M: u32, N: u32, K: u32) -> Tile {
  var v: Tile;
  if (u(6u) == 1u) {
    v.a = load_a4(offs.x, row0 + t / 2u, k0 + (t % 2u) * 4u, M, K);
  } else {
    v.a = load_a_rows(offs.x, row0 + (t % 32u) * 4u, k0 + t / 32u, M, K);
  }
  if (u(10u) == 1u) {
    v.b = load_b4(offs.y, col0 + (t % 32u) * 4u, k0 + t / 32u, N, K);
  } else {
    v.b = load_b_ks(offs.y, col0 + t / 2u, k0 + (t % 2u) * 4u, N, K);
  }
  return v;
}

// v holds 4 consecutive k of row r (column c): shared rows o..o+3
fn put_a_t(o: u32, r: u32, v: vec4<f32>) {
  for (var j = 0u; j < 4u; j = j + 1u) { As[o + j][r >> 2u][r & 3u] = v[j]; }
}
fn put_b_t(o: u32, c: u32, v: vec4<f32>) {
  for (var j = 0u; j < 4u; j = j + 1u) { Bs[o + j][c >> 2u][c & 3u] = v[j]; }
}

// into shared rows o.. (o = 0 or 8: the buffer)
fn store(t: u32, o: u32, v: Tile) {
  if (u(6u) == 1u) {
    put_a_t(o + (t % 2u) * 4u, t / 2u, v.a);
  } else {
    As[o + t / 32u][t % 32u] = v.a;
  }
  if (u(10u) == 1u) {
    Bs[o + t / 32u][t % 32u] = v.b;
  } else {
    put_b_t(o + (t % 2u) * 4u, t / 2u, v.b);
  }
}

fn store4(base: u32, col: u32, N: u32, v: vec4<f32>) {
  for (var j = 0u; j < 4u; j = j + 1u) { if (col + j < N) { C[base + col + j] = epilogue(v[j], base + col + j); } }
}

// 16 x 16 threads (lid unused) rather than 256 in a row: on an H200 the very same kernel
// otherwise ran at 34.4 instead of 36.0 TFLOP/s (4096^3, same run)
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let offs = batch_offsets(wg.z / SPLIT);
  // this workgroup's k range: whole tiles, so parts never share one
  let kc = (K + SPLIT * 8u - 1u) / (SPLIT * 8u) * 8u;
  let kbeg = (wg.z % SPLIT) * kc;
  let kend = min(K, kbeg + kc);
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
  // warp w covers rows 64 (w / 4).. and columns 32 (w % 4)..; its lane l, 8 rows from
  // 8 (l / 4) and the 4 columns from 4 (l % 4) plus the 4 from 16 + 4 (l % 4) of those.
  // ao, bo: vec4 indices (row / 4, column / 4) of the thread's first rows and columns.
  let w = t / 32u;
  let l = t % 32u;
  let ao = (w / 4u) * 16u + (l / 4u) * 2u;
  let bo = (w % 4u) * 8u + l % 4u;
{{MAIN_LOOP}}
  let r = row0 + ao * 4u;
  let cl = col0 + bo * 4u;
  let cb = wg.z * M * N;
  if (r + 0u < M) { store4(cb + (r + 0u) * N, cl, N, c0_0); store4(cb + (r + 0u) * N, cl + 16u, N, c0_1); }
  if (r + 1u < M) { store4(cb + (r + 1u) * N, cl, N, c1_0); store4(cb + (r + 1u) * N, cl + 16u, N, c1_1); }
  if (r + 2u < M) { store4(cb + (r + 2u) * N, cl, N, c2_0); store4(cb + (r + 2u) * N, cl + 16u, N, c2_1); }
  if (r + 3u < M) { store4(cb + (r + 3u) * N, cl, N, c3_0); store4(cb + (r + 3u) * N, cl + 16u, N, c3_1); }
  if (r + 4u < M) { store4(cb + (r + 4u) * N, cl, N, c4_0); store4(cb + (r + 4u) * N, cl + 16u, N, c4_1); }
  if (r + 5u < M) { store4(cb + (r + 5u) * N, cl, N, c5_0); store4(cb + (r + 5u) * N, cl + 16u, N, c5_1); }
  if (r + 6u < M) { store4(cb + (r + 6u) * N, cl, N, c6_0); store4(cb + (r + 6u) * N, cl + 16u, N, c6_1); }
  if (r + 7u < M) { store4(cb + (r + 7u) * N, cl, N, c7_0); store4(cb + (r + 7u) * N, cl + 16u, N, c7_1); }
}
