// Second pass of a split-K matmul: C[i] = epilogue(sum of the {{SPLIT}} partial planes of i).
// P holds planes [batch * SPLIT + part][M][N], written by matmul_db with SPLIT > 1.
@group(0) @binding(0) var<storage, read_write> C: array<f32>;
@group(0) @binding(1) var<storage, read> P: array<f32>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
{{EPILOGUE}}
#include matmul_common

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let mn = u(0u) * u(1u);
  let i = (wg.x + wg.y * nwg.x) * 256u + t;
  if (i >= mn * u(3u)) { return; }
  let at = (i / mn) * {{SPLIT}}u * mn + i % mn;
  var acc = 0.0;
  for (var p = 0u; p < {{SPLIT}}u; p = p + 1u) { acc = acc + P[at + p * mn]; }
  C[i] = epilogue(acc, i);
}
