// The bindings and info reader shared by attention.wgsl and attention_tiled.wgsl (the info
// layout is described in attention.wgsl).
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> mask: array<u32>;
@group(0) @binding(5) var<uniform> info: array<vec4<u32>, {{INFO}}>;

#include elementwise

fn u(k_: u32) -> u32 { return info[k_ / 4u][k_ % 4u]; }
