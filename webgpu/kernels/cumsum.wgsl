// cumsum along one axis of a contiguous (outer, n, inner) layout; one thread per line,
// Kahan-compensated for floats. info: 0 lines, 1 n, 2 inner, 3 exclusive, 4 reverse, 5 offset
@group(0) @binding(0) var<storage, read_write> out: array<{{A}}>;
@group(0) @binding(1) var<storage, read> x: array<{{T}}>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, {{INFO}}>;

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let l = gid.x + gid.y * nwg.x * {{WG}}u;
  if (l >= u(0u)) { return; }
  let n = u(1u); let inner = u(2u);
  let base = (l / inner) * n * inner + l % inner;
  let excl = u(3u) != 0u;
  let rev = u(4u) != 0u;
  var acc = {{A}}(0);
  var comp = {{A}}(0);
  for (var j = 0u; j < n; j = j + 1u) {
    let k = select(j, n - 1u - j, rev);
    let at = base + k * inner;
    let v = {{A}}(x[u(5u) + at]);
    if (excl) { out[at] = acc; }
    if ({{FLOAT}}) {
      let y = v - comp;
      let t = acc + y;
      comp = (t - acc) - y;
      acc = t;
    } else {
      acc = acc + v;
    }
    if (!excl) { out[at] = acc; }
  }
}
