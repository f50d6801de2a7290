// Matmul variant "sg" (adapters with the subgroups feature): for few rows (M <= 16: batch-1
// inference, x @ w.T), where a tiled kernel would leave most of each tile empty. A workgroup
// computes 8 outputs of one row; each subgroup owns outputs in turn, its lanes split the k sum
// and subgroupAdd combines their partial sums. Coalesced when A and B are contiguous along k.
enable subgroups;
@group(0) @binding(0) var<storage, read_write> C: array<f32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
// V4: A and B also bound as vec4s (bindings 3, 4): both contiguous along k, rows 16-byte aligned,
// K a multiple of 4; each lane then has 4 vector loads of B in flight per step
const V4: bool = {{V4}};
{{V4DECL}}
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
      if (V4) {
        let ar = arow / 4u; let bc = bcol / 4u; let K4 = K / 4u;
        var k = lane;
        for (; k + 3u * sgs < K4; k = k + 4u * sgs) {
          let b0 = b4(bc + k); let b1 = b4(bc + k + sgs); let b2 = b4(bc + k + 2u * sgs); let b3 = b4(bc + k + 3u * sgs);
          acc = acc + (dot(a4(ar + k), b0) + dot(a4(ar + k + sgs), b1)) + (dot(a4(ar + k + 2u * sgs), b2) + dot(a4(ar + k + 3u * sgs), b3));
        }
        for (; k < K4; k = k + sgs) { acc = acc + dot(a4(ar + k), b4(bc + k)); }
      } else {
        for (var k = lane; k < K; k = k + sgs) {
          acc = acc + A[arow + k * u(6u)] * B[bcol + k * u(9u)];
        }
      }
    }
    let total = subgroupAdd(acc);
    if (ok && lane == 0u) {
      let at = wg.z * M * N + m * N + n;
      C[at] = epilogue(total, at);
    }
  }
}
