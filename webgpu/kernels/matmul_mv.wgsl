// Matmul variant "mv": few rows (M <= 16) times a right operand that runs along its columns
// (x @ w with w stored (K, N), as ONNX MatMul and `x @ w` keep weights). "sg" reads such a B
// down its columns, one strided word per lane (a BERT layer's 16x384x1536 took 32 us on an
// H100); here a workgroup owns CW vec4 columns and its 256 threads split k into KG = 256 / CW
// interleaved groups: thread t reads vec4 column t % CW of rows k = t / CW, t / CW + KG, ...
// (consecutive threads, consecutive 16 bytes of a row of B), four rows in flight, and keeps
// its partial sums for MR (<= 4) output rows in named vec4 registers; workgroup y picks the
// rows. The k groups are then summed in workgroup memory (a tree: the same order on every
// adapter). render_mv writes the body in; CW shrinks until the product has ~128 workgroups.
// B: a vec4 binding, columns and rows 16-byte aligned, N a multiple of 4; A through its strides.
@group(0) @binding(0) var<storage, read_write> C: array<f32>;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B4: array<vec4<f32>>;
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
{{EPILOGUE}}
#include matmul_common

const CW = {{CW}}u;
const KG = 256u / CW;
var<workgroup> red: array<vec4<f32>, 1024>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let offs = batch_offsets(wg.z);
  let c = t % CW;
  let kg = t / CW;
  let col = (wg.x * CW + c) * 4u;
  let on = col < N;
  let b0 = (offs.y + col) / 4u;     // vec4 index of row 0 of this column
  let bs = u(9u) / 4u;              // B's row stride in vec4s
  let rs = u(5u); let ks = u(6u);   // A's strides
  let row0 = wg.y * {{ROWS}}u;
{{BODY}}
}
