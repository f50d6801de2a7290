// arange: out[i] = start + i * step (info: 0 n, 1 start bits, 2 step bits).
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<uniform> info: array<vec4<u32>, {{INFO}}>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * {{WG}}u;
  if (i >= u(0u)) { return; }
  out[i] = bitcast<{{T}}>(u(1u)) + {{T}}(i) * bitcast<{{T}}>(u(2u));
}
