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
@group(0) @binding(0) var<storage, read_write> C: array<f32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read> A4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> B4: array<vec4<f32>>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
{{EPILOGUE}}
#include matmul_common

const SPLIT = {{SPLIT}}u;
const AROW: bool = {{AROW}};   // A along k (row-major), else along rows (x.T)
const AVEC: bool = {{AVEC}};   // ... and every row 16-byte aligned: vec4 loads
const BROW: bool = {{BROW}};   // B along columns (row-major), else along k (w.T)
const BVEC: bool = {{BVEC}};
const FULL: bool = {{FULL}};   // M and N multiples of the tile, K of BK: every load and store in range
const BM = {{BM}}u;
const BN = {{BN}}u;
const BK = {{BK}}u;
var<workgroup> As: array<array<vec4<f32>, {{BM4}}>, {{BK}}>;   // [k][row / 4]
var<workgroup> Bs: array<array<vec4<f32>, {{BN4}}>, {{BK}}>;   // [k][column / 4]

fn load_a4(a0: u32, r: u32, k: u32, M: u32, K: u32) -> vec4<f32> {
  // k..k+3 of row r (A row-major)
  let base = a0 + r * u(5u) + k;
  if (AVEC && (FULL || (r < M && k + 4u <= K))) { return A4[base / 4u]; }
  let ok = FULL || r < M;
  return vec4<f32>(select(0.0, A[base], ok && k < K), select(0.0, A[base + 1u], ok && k + 1u < K),
                   select(0.0, A[base + 2u], ok && k + 2u < K), select(0.0, A[base + 3u], ok && k + 3u < K));
}
fn load_a_rows(a0: u32, r: u32, k: u32, M: u32, K: u32) -> vec4<f32> {
  // rows r..r+3 at one k (A column-major: x.T)
  let base = a0 + r * u(5u) + k * u(6u);
  let rs = u(5u);
  let ok = FULL || k < K;
  return vec4<f32>(select(0.0, A[base], ok && r < M), select(0.0, A[base + rs], ok && r + 1u < M),
                   select(0.0, A[base + 2u * rs], ok && r + 2u < M), select(0.0, A[base + 3u * rs], ok && r + 3u < M));
}
fn load_b4(b0: u32, c: u32, k: u32, N: u32, K: u32) -> vec4<f32> {
  // columns c..c+3 of row k (B row-major)
  let base = b0 + k * u(9u) + c;
  if (BVEC && (FULL || (k < K && c + 4u <= N))) { return B4[base / 4u]; }
  let ok = FULL || k < K;
  return vec4<f32>(select(0.0, B[base], ok && c < N), select(0.0, B[base + 1u], ok && c + 1u < N),
                   select(0.0, B[base + 2u], ok && c + 2u < N), select(0.0, B[base + 3u], ok && c + 3u < N));
}
fn load_b_ks(b0: u32, c: u32, k: u32, N: u32, K: u32) -> vec4<f32> {
  // k..k+3 of column c (B column-major: w.T)
  let base = b0 + k * u(9u) + c * u(10u);
  let ks = u(9u);
  let ok = FULL || c < N;
  return vec4<f32>(select(0.0, B[base], ok && k < K), select(0.0, B[base + ks], ok && k + 1u < K),
                   select(0.0, B[base + 2u * ks], ok && k + 2u < K), select(0.0, B[base + 3u * ks], ok && k + 3u < K));
}

// vec4 number e of the A tile at k0: 4 k of one row (A row-major) or 4 rows at one k
fn fetch_a(e: u32, a0: u32, row0: u32, k0: u32, M: u32, K: u32) -> vec4<f32> {
  if (AROW) { return load_a4(a0, row0 + e / (BK / 4u), k0 + (e % (BK / 4u)) * 4u, M, K); }
  return load_a_rows(a0, row0 + (e % (BM / 4u)) * 4u, k0 + e / (BM / 4u), M, K);
}
fn put_a(e: u32, v: vec4<f32>) {
  if (AROW) {
    let r = e / (BK / 4u);
    let k = (e % (BK / 4u)) * 4u;
    As[k][r >> 2u][r & 3u] = v.x; As[k + 1u][r >> 2u][r & 3u] = v.y;
    As[k + 2u][r >> 2u][r & 3u] = v.z; As[k + 3u][r >> 2u][r & 3u] = v.w;
  } else {
    As[e / (BM / 4u)][e % (BM / 4u)] = v;
  }
}
// vec4 number e of the B tile at k0: 4 columns of one k (B row-major) or 4 k of one column
fn fetch_b(e: u32, b0: u32, col0: u32, k0: u32, N: u32, K: u32) -> vec4<f32> {
  if (BROW) { return load_b4(b0, col0 + (e % (BN / 4u)) * 4u, k0 + e / (BN / 4u), N, K); }
  return load_b_ks(b0, col0 + e / (BK / 4u), k0 + (e % (BK / 4u)) * 4u, N, K);
}
fn put_b(e: u32, v: vec4<f32>) {
  if (BROW) {
    Bs[e / (BN / 4u)][e % (BN / 4u)] = v;
  } else {
    let c = e / (BK / 4u);
    let k = (e % (BK / 4u)) * 4u;
    Bs[k][c >> 2u][c & 3u] = v.x; Bs[k + 1u][c >> 2u][c & 3u] = v.y;
    Bs[k + 2u][c >> 2u][c & 3u] = v.z; Bs[k + 3u][c >> 2u][c & 3u] = v.w;
  }
}

fn store4(base: u32, col: u32, N: u32, v: vec4<f32>) {
  let i = base + col;
  if (FULL || col < N) { C[i] = epilogue(v.x, i); }
  if (FULL || col + 1u < N) { C[i + 1u] = epilogue(v.y, i + 1u); }
  if (FULL || col + 2u < N) { C[i + 2u] = epilogue(v.z, i + 2u); }
  if (FULL || col + 3u < N) { C[i + 3u] = epilogue(v.w, i + 3u); }
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
