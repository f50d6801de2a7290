// Matmul variant "rb128": 128x128 output tile per workgroup of 16x16 threads, 8x8 outputs per
// thread in sixteen NAMED vec4 accumulators (c* for columns 0..63 of the tile, d* for 64..127;
// an indexed array would spill to memory: 2 instead of 24 TFLOP/s on an H200). k tiles of 16
// live in shared memory as vec4 (2 x 8 KiB: exactly WebGPU's default 16 KiB limit), so each k
// step is 4 vector loads for 64 FMAs. Global loads follow the contiguous axis of each operand
// (8 values per thread and operand), and the next tile is fetched into registers while the
// current one is multiplied.
@group(0) @binding(0) var<storage, read_write> C: array<f32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<uniform> info: array<vec4<u32>, {{INFO}}>;
#include matmul_common

const BK = 16u;
var<workgroup> As: array<vec4<f32>, 512>;   // [BK][128 / 4]
var<workgroup> Bs: array<vec4<f32>, 512>;   // [BK][128 / 4]

struct V8 { a: vec4<f32>, b: vec4<f32> }

fn load_a(t: u32, a0: u32, row0: u32, k0: u32, M: u32, K: u32) -> V8 {
  var v = V8(vec4<f32>(), vec4<f32>());
  if (u(6u) == 1u) {
    let r = row0 + (t >> 1u);
    let k = k0 + (t & 1u) * 8u;
    let base = a0 + r * u(5u) + k;
    for (var j = 0u; j < 4u; j = j + 1u) {
      v.a[j] = select(0.0, A[base + j], r < M && k + j < K);
      v.b[j] = select(0.0, A[base + 4u + j], r < M && k + 4u + j < K);
    }
  } else {
    let r = row0 + (t & 15u) * 8u;
    let k = k0 + (t >> 4u);
    for (var j = 0u; j < 4u; j = j + 1u) {
      v.a[j] = select(0.0, A[a0 + (r + j) * u(5u) + k * u(6u)], r + j < M && k < K);
      v.b[j] = select(0.0, A[a0 + (r + 4u + j) * u(5u) + k * u(6u)], r + 4u + j < M && k < K);
    }
  }
  return v;
}

fn store_a(t: u32, v: V8) {
  if (u(6u) == 1u) {
    let r = t >> 1u;
    let k = (t & 1u) * 8u;
    for (var j = 0u; j < 4u; j = j + 1u) {
      As[(k + j) * 32u + (r >> 2u)][r & 3u] = v.a[j];
      As[(k + 4u + j) * 32u + (r >> 2u)][r & 3u] = v.b[j];
    }
  } else {
    As[(t >> 4u) * 32u + (t & 15u) * 2u] = v.a;
    As[(t >> 4u) * 32u + (t & 15u) * 2u + 1u] = v.b;
  }
}

fn load_b(t: u32, b0: u32, col0: u32, k0: u32, N: u32, K: u32) -> V8 {
  var v = V8(vec4<f32>(), vec4<f32>());
  if (u(10u) == 1u) {
    let c = col0 + (t & 15u) * 8u;
    let k = k0 + (t >> 4u);
    let base = b0 + k * u(9u) + c;
    for (var j = 0u; j < 4u; j = j + 1u) {
      v.a[j] = select(0.0, B[base + j], c + j < N && k < K);
      v.b[j] = select(0.0, B[base + 4u + j], c + 4u + j < N && k < K);
    }
  } else {
    let c = col0 + (t >> 1u);
    let k = k0 + (t & 1u) * 8u;
    for (var j = 0u; j < 4u; j = j + 1u) {
      v.a[j] = select(0.0, B[b0 + (k + j) * u(9u) + c * u(10u)], c < N && k + j < K);
      v.b[j] = select(0.0, B[b0 + (k + 4u + j) * u(9u) + c * u(10u)], c < N && k + 4u + j < K);
    }
  }
  return v;
}

fn store_b(t: u32, v: V8) {
  if (u(10u) == 1u) {
    Bs[(t >> 4u) * 32u + (t & 15u) * 2u] = v.a;
    Bs[(t >> 4u) * 32u + (t & 15u) * 2u + 1u] = v.b;
  } else {
    let c = t >> 1u;
    let k = (t & 1u) * 8u;
    for (var j = 0u; j < 4u; j = j + 1u) {
      Bs[(k + j) * 32u + (c >> 2u)][c & 3u] = v.a[j];
      Bs[(k + 4u + j) * 32u + (c >> 2u)][c & 3u] = v.b[j];
    }
  }
}

fn store_row(base: u32, col: u32, N: u32, v: vec4<f32>, w: vec4<f32>) {
  for (var j = 0u; j < 4u; j = j + 1u) {
    if (col + j < N) { C[base + col + j] = v[j]; }
    if (col + 64u + j < N) { C[base + col + 64u + j] = w[j]; }
  }
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let offs = batch_offsets(wg.z);
  let row0 = wg.y * 128u;
  let col0 = wg.x * 128u;
  var c0 = vec4<f32>(); var c1 = vec4<f32>(); var c2 = vec4<f32>(); var c3 = vec4<f32>();
  var c4 = vec4<f32>(); var c5 = vec4<f32>(); var c6 = vec4<f32>(); var c7 = vec4<f32>();
  var d0 = vec4<f32>(); var d1 = vec4<f32>(); var d2 = vec4<f32>(); var d3 = vec4<f32>();
  var d4 = vec4<f32>(); var d5 = vec4<f32>(); var d6 = vec4<f32>(); var d7 = vec4<f32>();
  var ra = load_a(t, offs.x, row0, 0u, M, K);
  var rb = load_b(t, offs.y, col0, 0u, N, K);
  let ao = lid.y * 2u;
  for (var k0 = 0u; k0 < K; k0 = k0 + BK) {
    workgroupBarrier();
    store_a(t, ra);
    store_b(t, rb);
    workgroupBarrier();
    if (k0 + BK < K) {
      ra = load_a(t, offs.x, row0, k0 + BK, M, K);
      rb = load_b(t, offs.y, col0, k0 + BK, N, K);
    }
    // the k loop, unrolled by hand: Naga keeps loops as loops, and the unrolled form ran
    // 12% faster on an H200
    {
      let a0 = As[0u + ao];
      let a1 = As[0u + ao + 1u];
      let b0 = Bs[0u + lid.x];
      let b1 = Bs[0u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[32u + ao];
      let a1 = As[32u + ao + 1u];
      let b0 = Bs[32u + lid.x];
      let b1 = Bs[32u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[64u + ao];
      let a1 = As[64u + ao + 1u];
      let b0 = Bs[64u + lid.x];
      let b1 = Bs[64u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[96u + ao];
      let a1 = As[96u + ao + 1u];
      let b0 = Bs[96u + lid.x];
      let b1 = Bs[96u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[128u + ao];
      let a1 = As[128u + ao + 1u];
      let b0 = Bs[128u + lid.x];
      let b1 = Bs[128u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[160u + ao];
      let a1 = As[160u + ao + 1u];
      let b0 = Bs[160u + lid.x];
      let b1 = Bs[160u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[192u + ao];
      let a1 = As[192u + ao + 1u];
      let b0 = Bs[192u + lid.x];
      let b1 = Bs[192u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[224u + ao];
      let a1 = As[224u + ao + 1u];
      let b0 = Bs[224u + lid.x];
      let b1 = Bs[224u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[256u + ao];
      let a1 = As[256u + ao + 1u];
      let b0 = Bs[256u + lid.x];
      let b1 = Bs[256u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[288u + ao];
      let a1 = As[288u + ao + 1u];
      let b0 = Bs[288u + lid.x];
      let b1 = Bs[288u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[320u + ao];
      let a1 = As[320u + ao + 1u];
      let b0 = Bs[320u + lid.x];
      let b1 = Bs[320u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[352u + ao];
      let a1 = As[352u + ao + 1u];
      let b0 = Bs[352u + lid.x];
      let b1 = Bs[352u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[384u + ao];
      let a1 = As[384u + ao + 1u];
      let b0 = Bs[384u + lid.x];
      let b1 = Bs[384u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[416u + ao];
      let a1 = As[416u + ao + 1u];
      let b0 = Bs[416u + lid.x];
      let b1 = Bs[416u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[448u + ao];
      let a1 = As[448u + ao + 1u];
      let b0 = Bs[448u + lid.x];
      let b1 = Bs[448u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
    {
      let a0 = As[480u + ao];
      let a1 = As[480u + ao + 1u];
      let b0 = Bs[480u + lid.x];
      let b1 = Bs[480u + lid.x + 16u];
      c0 = c0 + a0.x * b0; d0 = d0 + a0.x * b1;
      c1 = c1 + a0.y * b0; d1 = d1 + a0.y * b1;
      c2 = c2 + a0.z * b0; d2 = d2 + a0.z * b1;
      c3 = c3 + a0.w * b0; d3 = d3 + a0.w * b1;
      c4 = c4 + a1.x * b0; d4 = d4 + a1.x * b1;
      c5 = c5 + a1.y * b0; d5 = d5 + a1.y * b1;
      c6 = c6 + a1.z * b0; d6 = d6 + a1.z * b1;
      c7 = c7 + a1.w * b0; d7 = d7 + a1.w * b1;
    }
  }
  let r = row0 + lid.y * 8u;
  let col = col0 + lid.x * 4u;
  let cb = wg.z * M * N;
  if (r < M) { store_row(cb + r * N, col, N, c0, d0); }
  if (r + 1u < M) { store_row(cb + (r + 1u) * N, col, N, c1, d1); }
  if (r + 2u < M) { store_row(cb + (r + 2u) * N, col, N, c2, d2); }
  if (r + 3u < M) { store_row(cb + (r + 3u) * N, col, N, c3, d3); }
  if (r + 4u < M) { store_row(cb + (r + 4u) * N, col, N, c4, d4); }
  if (r + 5u < M) { store_row(cb + (r + 5u) * N, col, N, c5, d5); }
  if (r + 6u < M) { store_row(cb + (r + 6u) * N, col, N, c6, d6); }
  if (r + 7u < M) { store_row(cb + (r + 7u) * N, col, N, c7, d7); }
}
