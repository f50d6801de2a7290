// Skeleton of every generated elementwise kernel (ember.webgpu.fusion fills the template parts:
// the input bindings, the index arithmetic for strided/broadcast inputs and the expression body).
// One thread per output element; info[] holds n, the output shape, each input's offset and
// strides, and the scalar constants, so one pipeline serves every shape of the same expression.
@group(0) @binding(0) var<storage, read_write> out: array<{{OUT_T}}>;
{{BINDINGS}}
@group(0) @binding({{INFO_BINDING}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }
fn s(k: u32) -> i32 { return bitcast<i32>(info[k / 4u][k % 4u]); }

{{HELPERS}}

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
{{BODY}}
}
