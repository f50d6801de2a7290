// Matmul variant "sg" (adapters with the subgroups feature): for few rows (M <= 16: batch-1
// inference, x @ w.T), where a tiled kernel would leave most of each tile empty. A workgroup
// computes 8 outputs of one row; each subgroup owns outputs in turn, its lanes split the k sum
// and subgroupAdd combines their partial sums. Coalesced when A and B are contiguous along k.
enable subgroups;
@group(0) @binding(0) var<storage, read_write> C: array<f32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
{{EPILOGUE}}
#include matmul_common

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sgs: u32) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let offs = batch_offsets(wg.z);
  let m = wg.y;
  let n0 = wg.x * 8u;
  let sg = t / sgs;
  let nsg = {{WG}}u / sgs;
  let rounds = (8u + nsg - 1u) / nsg;
  let arow = offs.x + m * u(5u);
  // every lane runs every round, so subgroupAdd is reached in uniform control flow
  for (var r = 0u; r < rounds; r = r + 1u) {
    let j = r * nsg + sg;
    let n = n0 + j;
    let ok = j < 8u && n < N;
    var acc = 0.0;
    if (ok) {
      let bcol = offs.y + n * u(10u);
      for (var k = lane; k < K; k = k + sgs) {
        acc = acc + A[arow + k * u(6u)] * B[bcol + k * u(9u)];
      }
    }
    let total = subgroupAdd(acc);
    if (ok && lane == 0u) {
      let at = wg.z * M * N + m * N + n;
      C[at] = epilogue(total, at);
    }
  }
}
