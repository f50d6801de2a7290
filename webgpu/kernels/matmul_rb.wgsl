// Register-blocked matmul variants "rb128", "rb64", "rb32" and split-K "sk": a BM x BN output
// tile per workgroup of T threads, TM x TN outputs per thread in NAMED vec4 accumulators (an
// indexed array would be placed in memory instead of registers: 2 instead of 24 TFLOP/s on an
// H200). ember.webgpu.linalg.render_rb writes the tile's sizes and the body of main in:
// accumulators, the k loop fully unrolled over a tile of BK, the stores.
// - A k tile sits in workgroup memory as vec4 rows (A transposed: [k][row / 4], B as is:
//   [k][column / 4]). The next tile is fetched into registers while this one is multiplied, then
//   stored after a barrier (two barriers a tile). On an H100 at 4096^3 a bare lab kernel of this
//   shape (`tests/bench/webgpu_gemm_lab.py`) measured 46 TFLOP/s with 128x128 tiles 16 deep,
//   against 33 for double-buffered tiles 8 deep (one barrier a tile); this template 41.
// - The shared arrays are two-dimensional and the unrolled loop indexes their outer axis with
//   constants, so the bounds clamp WebGPU adds to every dynamic index is computed once per
//   thread, not once per load. Vector components are picked by constants only (v.x, not v[j]
//   in a loop, which may place the vector in memory: with such loops this template ran 36
//   instead of 41 TFLOP/s at 4096^3 on an H100).
// - Thread t owns the vec4 rows ty + i * TY and vec4 columns tx + j * TX of the tile (tx = t % TX):
//   a warp reads few distinct A vectors and consecutive B vectors per step.
// - Global loads follow each operand's contiguous axis; where it is 16-byte aligned they are vec4
//   loads through a second binding of the same buffer (A4, B4), else scalar loads. Layouts,
//   alignment and whether the product is whole tiles (FULL: no bounds checks) are constants of
//   the pipeline, not info words read at run time (no branch on them in the kernel; on an H100
//   this alone measured no faster).
// - Split-K ("sk", SPLIT > 1): workgroup z = batch * SPLIT + part; each part sums its own range
//   of whole k tiles into plane z of a partial buffer (bound as C, identity epilogue), and
//   matmul_splitk adds the planes up and applies the epilogue.
// - "rbh" (ET = f16; ember.webgpu.linalg: MatmulPlan.rbh_ok, a float16 product of two half-stored
//   operands): A and B read as f16 (vec4<f16> where a row is 8-byte aligned), k tiles in workgroup
//   memory as vec4<f16> (half the bytes), and within a k tile the products and their sums in f16
//   (`h + a * b` on vec4<f16>: packed half FMAs, twice the fp32 rate on most GPUs); after each k
//   tile the f16 partial sums are added into the f32 accumulators, so an f16 sum never spans more
//   than BK products (the error grows with BK, not with K; render_rb(half=True) writes that
//   body). The epilogue runs in f32. A product of f16 values past 65504 (|a|, |b| ~ 256), or a
//   partial sum of BK of them, is inf there where the f32 variants stay finite: autotune's check
//   rejects rbh on inputs where that happens (linalg._close), EMBER_WEBGPU_F16_MATH=0 takes it out.
@group(0) @binding(0) var<storage, read_write> C: array<{{CT}}>;   // vec4s where N % 4 == 0 (CVEC)
@group(0) @binding(1) var<storage, read> A: array<{{ET}}>;
@group(0) @binding(2) var<storage, read> B: array<{{ET}}>;
@group(0) @binding(3) var<storage, read> A4: array<vec4<{{ET}}>>;
@group(0) @binding(4) var<storage, read> B4: array<vec4<{{ET}}>>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
{{EPILOGUE}}
#include matmul_common

const SPLIT = {{SPLIT}}u;
// (Whether A runs along k (row-major) or along rows (x.T), and B along columns or along k (w.T),
// render_rb decides when it writes the fetches: AROW / BROW.)
const AVEC: bool = {{AVEC}};   // ... and every row aligned to 4 elements: vec4 loads
const BVEC: bool = {{BVEC}};
const FULL: bool = {{FULL}};   // M and N multiples of the tile, K of BK: every load and store in range
const BM = {{BM}}u;
const BN = {{BN}}u;
const BK = {{BK}}u;
var<workgroup> As: array<array<vec4<{{ET}}>, {{BM4}}>, {{BK}}>;   // [k][row / 4]
var<workgroup> Bs: array<array<vec4<{{ET}}>, {{BN4}}>, {{BK}}>;   // [k][column / 4]

// The loads below take a precomputed element offset (base) and the row/column and k it stands
// for (bounds, unless FULL). render_rb works out each thread's offsets and workgroup-memory
// coordinates once, before the k loop, so a fetch is an add and a load.
// 4 elements of A (B) at base, base + s, base + 2s, base + 3s; element j read where ok and
// i + j < n (i: the row, column or k of the first), else 0
fn quad_a(base: u32, s: u32, ok: bool, i: u32, n: u32) -> vec4<{{ET}}> {
  return vec4<{{ET}}>(select({{ET}}(0), A[base], ok && i < n), select({{ET}}(0), A[base + s], ok && i + 1u < n),
                   select({{ET}}(0), A[base + 2u * s], ok && i + 2u < n), select({{ET}}(0), A[base + 3u * s], ok && i + 3u < n));
}
fn quad_b(base: u32, s: u32, ok: bool, i: u32, n: u32) -> vec4<{{ET}}> {
  return vec4<{{ET}}>(select({{ET}}(0), B[base], ok && i < n), select({{ET}}(0), B[base + s], ok && i + 1u < n),
                   select({{ET}}(0), B[base + 2u * s], ok && i + 2u < n), select({{ET}}(0), B[base + 3u * s], ok && i + 3u < n));
}
fn load_a4(base: u32, r: u32, k: u32, M: u32, K: u32) -> vec4<{{ET}}> {
  // k..k+3 of row r (A row-major)
  if (AVEC && (FULL || (r < M && k + 4u <= K))) { return A4[base / 4u]; }
  return quad_a(base, 1u, FULL || r < M, k, K);
}
fn load_a_rows(base: u32, r: u32, k: u32, M: u32, K: u32) -> vec4<{{ET}}> {
  // rows r..r+3 at one k (A column-major: x.T)
  return quad_a(base, u(5u), FULL || k < K, r, M);
}
fn load_b4(base: u32, c: u32, k: u32, N: u32, K: u32) -> vec4<{{ET}}> {
  // columns c..c+3 of row k (B row-major)
  if (BVEC && (FULL || (k < K && c + 4u <= N))) { return B4[base / 4u]; }
  return quad_b(base, 1u, FULL || k < K, c, N);
}
fn load_b_ks(base: u32, c: u32, k: u32, N: u32, K: u32) -> vec4<{{ET}}> {
  // k..k+3 of column c (B column-major: w.T)
  return quad_b(base, u(9u), FULL || c < N, k, K);
}

fn store4(base: u32, col: u32, N: u32, v: vec4<f32>) {
{{STORE4}}
}

@compute @workgroup_size({{T}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let offs = batch_offsets(wg.z / SPLIT);
  // this workgroup's k range: whole tiles, so parts never share one
  let kc = (K + SPLIT * BK - 1u) / (SPLIT * BK) * BK;
  let kbeg = (wg.z % SPLIT) * kc;
  let kend = min(K, kbeg + kc);
  let row0 = wg.y * BM;
  let col0 = wg.x * BN;
{{BODY}}
}
