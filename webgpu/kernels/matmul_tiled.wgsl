// Matmul variant "tiled": 16x16 shared-memory tiles, one output per thread, any dtype and any
// operand strides. The reference the other variants are checked against at autotune time.
@group(0) @binding(0) var<storage, read_write> C: array<{{T}}>;
@group(0) @binding(1) var<storage, read> A: array<{{T}}>;
@group(0) @binding(2) var<storage, read> B: array<{{T}}>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
{{EPILOGUE}}
#include matmul_common

var<workgroup> As: array<{{T}}, 256>;   // [16 rows][16 k]
var<workgroup> Bs: array<{{T}}, 256>;   // [16 k][16 cols]

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let offs = batch_offsets(wg.z);
  let row = wg.y * 16u + lid.y;
  let col = wg.x * 16u + lid.x;
  var acc = {{T}}(0);
  for (var k0 = 0u; k0 < K; k0 = k0 + 16u) {
    let ka = k0 + lid.x;
    let kb = k0 + lid.y;
    As[lid.y * 16u + lid.x] = select({{T}}(0), A[offs.x + row * u(5u) + ka * u(6u)], row < M && ka < K);
    Bs[lid.y * 16u + lid.x] = select({{T}}(0), B[offs.y + kb * u(9u) + col * u(10u)], col < N && kb < K);
    workgroupBarrier();
    for (var k = 0u; k < 16u; k = k + 1u) {
      acc = acc + As[lid.y * 16u + k] * Bs[k * 16u + lid.x];
    }
    workgroupBarrier();
  }
  if (row < M && col < N) {
    let at = wg.z * M * N + row * N + col;
    C[at] = epilogue(acc, at);
  }
}
