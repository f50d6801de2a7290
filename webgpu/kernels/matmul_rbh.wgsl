// Register-blocked matmul "rbh": matmul_rb's tiling with its multiply-adds in half precision, for
// float16 products whose operands are both in half storage (ember.webgpu.linalg: MatmulPlan.rbh_ok).
// - A and B are read as f16 (vec4<f16> through A4 / B4 where a row is 8-byte aligned), and their
//   k tiles sit in workgroup memory as vec4<f16> (half matmul_rb's bytes).
// - Within a k tile of BK the products and their sums are f16 (`h + a * b` on vec4<f16>: packed
//   half FMAs, twice the fp32 rate on most GPUs). After each k tile the f16 partial sums are added
//   into f32 accumulators, so an f16 sum never spans more than BK products: the rounding error of
//   a result grows with BK, not with K (render_rb(half=True) writes that body).
// - The epilogue (bias, activation, the float16 rounding) runs in f32 on the f32 accumulators; a
//   float16 result in half storage is stored as f16 (linalg.f16_io rewrites C's binding).
// - A product of f16 values past 65504 (|a|, |b| ~ 256), or a partial sum of BK of them, is inf
//   here where the f32 variants stay finite; autotune's check rejects rbh on inputs where that
//   happens (linalg._close), and EMBER_WEBGPU_F16_MATH=0 takes the variant out.
// Layouts, alignment, bounds (FULL) and batch offsets are as in matmul_rb.wgsl.
@group(0) @binding(0) var<storage, read_write> C: array<{{CT}}>;   // vec4s where N % 4 == 0 (CVEC)
@group(0) @binding(1) var<storage, read> A: array<f16>;
@group(0) @binding(2) var<storage, read> B: array<f16>;
@group(0) @binding(3) var<storage, read> A4: array<vec4<f16>>;
@group(0) @binding(4) var<storage, read> B4: array<vec4<f16>>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
{{EPILOGUE}}
#include matmul_common

const SPLIT = {{SPLIT}}u;
const AVEC: bool = {{AVEC}};   // A along k and every row 8-byte aligned: vec4<f16> loads
const BVEC: bool = {{BVEC}};
const FULL: bool = {{FULL}};   // M and N multiples of the tile, K of BK: every load and store in range
const BM = {{BM}}u;
const BN = {{BN}}u;
const BK = {{BK}}u;
var<workgroup> As: array<array<vec4<f16>, {{BM4}}>, {{BK}}>;   // [k][row / 4]
var<workgroup> Bs: array<array<vec4<f16>, {{BN4}}>, {{BK}}>;   // [k][column / 4]

// As matmul_rb.wgsl's loads, in f16: element j read where ok and i + j < n, else 0
fn quad_a(base: u32, s: u32, ok: bool, i: u32, n: u32) -> vec4<f16> {
  return vec4<f16>(select(0.0h, A[base], ok && i < n), select(0.0h, A[base + s], ok && i + 1u < n),
                   select(0.0h, A[base + 2u * s], ok && i + 2u < n), select(0.0h, A[base + 3u * s], ok && i + 3u < n));
}
fn quad_b(base: u32, s: u32, ok: bool, i: u32, n: u32) -> vec4<f16> {
  return vec4<f16>(select(0.0h, B[base], ok && i < n), select(0.0h, B[base + s], ok && i + 1u < n),
                   select(0.0h, B[base + 2u * s], ok && i + 2u < n), select(0.0h, B[base + 3u * s], ok && i + 3u < n));
}
fn load_a4(base: u32, r: u32, k: u32, M: u32, K: u32) -> vec4<f16> {
  if (AVEC && (FULL || (r < M && k + 4u <= K))) { return A4[base / 4u]; }
  return quad_a(base, 1u, FULL || r < M, k, K);
}
fn load_a_rows(base: u32, r: u32, k: u32, M: u32, K: u32) -> vec4<f16> {
  return quad_a(base, u(5u), FULL || k < K, r, M);
}
fn load_b4(base: u32, c: u32, k: u32, N: u32, K: u32) -> vec4<f16> {
  if (BVEC && (FULL || (k < K && c + 4u <= N))) { return B4[base / 4u]; }
  return quad_b(base, 1u, FULL || k < K, c, N);
}
fn load_b_ks(base: u32, c: u32, k: u32, N: u32, K: u32) -> vec4<f16> {
  return quad_b(base, u(9u), FULL || c < N, k, K);
}

fn store4(base: u32, col: u32, N: u32, v: vec4<f32>) {
{{STORE4}}
}

@compute @workgroup_size({{T}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let offs = batch_offsets(wg.z / SPLIT);
  let kc = (K + SPLIT * BK - 1u) / (SPLIT * BK) * BK;
  let kbeg = (wg.z % SPLIT) * kc;
  let kend = min(K, kbeg + kc);
  let row0 = wg.y * BM;
  let col0 = wg.x * BN;
{{BODY}}
}
