"""The cost of a dispatch that waits for the one before (a decode step is a chain of ~150 such),
measured with wgpu-py alone: N dispatches recorded into one compute pass, timed by GPU
timestamps at the pass's ends, for

- ``chain``: each dispatch reads and writes the same storage buffer (wgpu puts a barrier between
  every two), 1 workgroup of 64 threads or G workgroups of 256;
- ``free``: each dispatch writes a buffer of its own (no barrier: the floor of independent work);
- ``reduce``: ``chain`` where each workgroup of 256 first sums 576 floats (a decode gemv's RMS
  prologue) by a tree in workgroup memory, or by ``subgroupAdd`` (adapters with subgroups);
- ``body`` (``--body``): what a decode kernel's body adds to ``chain`` 144x256, one cost at a time:
  a word per thread from a weight window of its own (HBM, not cached), 4 such words (independent
  loads), 4 words each at an address that depends on the word before (4 memory round trips), the
  word's address from a uniform, x read first (the previous dispatch's output), a residual read
  after a subgroup sum.

    python tests/bench/webgpu_floor.py [--n 400] [--body]

Prints microseconds per dispatch (GPU) and the host's encode + submit time per dispatch.
"""
from __future__ import annotations

import argparse
import time

import wgpu

CHAIN = """
@group(0) @binding(0) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x % 1024u;
  b[i] = b[i] * 0.5 + 1.0;
}
"""

REDUCE_TREE = """
@group(0) @binding(0) var<storage, read_write> b: array<f32>;
var<workgroup> red: array<f32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  var s = 0.0;
  for (var e = t; e < 576u; e = e + 256u) { let v = b[e]; s = s + v * v; }
  red[t] = s;
  for (var k = 128u; k > 0u; k = k / 2u) {
    workgroupBarrier();
    if (t < k) { red[t] = red[t] + red[t + k]; }
  }
  workgroupBarrier();
  if (t == 0u && w.x == 0u) { b[1000u] = red[0] * 1e-9; }
}
"""

REDUCE_SG = """
@group(0) @binding(0) var<storage, read_write> b: array<f32>;
var<workgroup> red: array<f32, 256>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(local_invocation_index) t: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sgs: u32) {
  var s = 0.0;
  for (var e = t; e < 576u; e = e + 256u) { let v = b[e]; s = s + v * v; }
  s = subgroupAdd(s);
  if (lane == 0u) { red[t / sgs] = s; }
  workgroupBarrier();
  if (t == 0u && w.x == 0u) {
    var a = 0.0;
    for (var k = 0u; k < 256u / sgs; k = k + 1u) { a = a + red[k]; }
    b[1000u] = a * 1e-9;
  }
}
"""

# --body: binding 1 is this dispatch's own window of a large buffer (weights never in L2),
# binding 2 a uniform with the window's word offset (0); b is the chained state as in CHAIN
BODY = """
@group(0) @binding(0) var<storage, read_write> b: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<uniform> off: vec4<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let i = g.x;
  var v = 0.0;
  BODY
  let j = i % 1024u;
  b[j] = b[j] * 0.5 + v * 1e-30;
}
"""
STRIDE = 144 * 256
BODIES = {
    "body: chain only": "v = 0.0;",
    "body: 1 weight word": "v = f32(w[i]);",
    "body: 1 word, one window (L2)": "v = f32(w[i]);",
    "body: 4 weight words": "v = f32(w[i] + w[i + STRIDEu] + w[i + 2u * STRIDEu] + w[i + 3u * STRIDEu]);",
    "body: 4 dependent words": "var k = i; var a = 0u; for (var r = 0u; r < 4u; r = r + 1u) { let x = w[k]; a = a + x; k = k + STRIDEu + (x >> 31u); } v = f32(a);",
    "body: uniform then word": "v = f32(w[off.x + i]);",
    "body: x then word": "let x = b[t % 576u]; v = x + f32(w[i]);",
    "body: word, x (independent)": "v = f32(w[i]) + b[1024u + t % 576u];",
    "body: word, sum, residual": "let s = subgroupAdd(f32(w[i])); v = s + b[2048u + t % 576u];",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--body", action="store_true", help="also the body costs (see the docstring)")
    a = ap.parse_args()
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    feats = [f for f in ("timestamp-query", "subgroup") if f in adapter.features]
    dev = adapter.request_device_sync(required_features=feats)
    print("adapter:", adapter.info.get("device"), adapter.info.get("backend_type"), "features:", feats)
    ts = "timestamp-query" in feats
    U = wgpu.BufferUsage
    n = a.n
    shared = dev.create_buffer(size=4096 * 4, usage=U.STORAGE | U.COPY_DST)
    own = [dev.create_buffer(size=4096 * 4, usage=U.STORAGE) for _ in range(n)]

    def pipe(src):
        m = dev.create_shader_module(code=src)
        return dev.create_compute_pipeline(layout="auto", compute={"module": m, "entry_point": "main"})

    def bg(p, buf, *more):
        ents = [{"binding": 0, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}]
        ents += [{"binding": k + 1, "resource": r} for k, r in enumerate(more)]
        return dev.create_bind_group(layout=p.get_bind_group_layout(0), entries=ents)

    if ts:
        qs = dev.create_query_set(type="timestamp", count=2)
        qbuf = dev.create_buffer(size=16, usage=U.QUERY_RESOLVE | U.COPY_SRC)
    period = 1.0

    def timed(p, groups, grid):
        """(GPU us per dispatch, host us per dispatch) of the best of 5 passes of n dispatches."""
        best_g = best_h = float("inf")
        for _ in range(6):
            h0 = time.perf_counter()
            enc = dev.create_command_encoder()
            kw = {"timestamp_writes": {"query_set": qs, "beginning_of_pass_write_index": 0,
                                       "end_of_pass_write_index": 1}} if ts else {}
            cp = enc.begin_compute_pass(**kw)
            cp.set_pipeline(p)
            for i in range(n):
                cp.set_bind_group(0, groups[i % len(groups)])
                cp.dispatch_workgroups(grid, 1, 1)
            cp.end()
            if ts:
                enc.resolve_query_set(qs, 0, 2, qbuf, 0)
            dev.queue.submit([enc.finish()])
            h1 = time.perf_counter()
            if ts:
                raw = dev.queue.read_buffer(qbuf)
                t0, t1 = memoryview(raw).cast("Q")[:2]
                g = (t1 - t0) * period / 1e3 / n
            else:
                dev.queue.read_buffer(shared, 0, 4)
                g = (time.perf_counter() - h0) * 1e6 / n
            best_g, best_h = min(best_g, g), min(best_h, (h1 - h0) * 1e6 / n)
        return best_g, best_h

    rows = []
    for wg, grid in ((64, 1), (256, 144), (256, 768)):
        p = pipe(CHAIN.replace("WG", str(wg)))
        rows.append((f"chain {grid}x{wg}", *timed(p, [bg(p, shared)], grid)))
        rows.append((f"free  {grid}x{wg}", *timed(p, [bg(p, b) for b in own], grid)))
    for name, src in (("reduce tree", REDUCE_TREE), ("reduce subgroupAdd", REDUCE_SG)):
        if "subgroup" in src and "subgroup" not in feats:
            continue
        p = pipe(src)
        rows.append((f"{name} 144x256", *timed(p, [bg(p, shared)], 144)))
    if a.body:
        win = STRIDE * 4 * 5                      # 4 words a thread and slack, bytes
        big = dev.create_buffer(size=win * n, usage=U.STORAGE)
        uni = dev.create_buffer(size=16, usage=U.UNIFORM | U.COPY_DST)
        for name, body in BODIES.items():
            if "subgroup" in body and "subgroup" not in feats:
                continue
            p = pipe(BODY.replace("BODY", body.replace("STRIDE", str(STRIDE))))
            used = {0} | ({1} if "w[" in body else set()) | ({2} if "off." in body else set())
            groups = []
            for d in range(n):
                more = [{"buffer": big, "offset": 0 if "(L2)" in name else d * win, "size": win}, {"buffer": uni, "offset": 0, "size": 16}]
                ents = [{"binding": 0, "resource": {"buffer": shared, "offset": 0, "size": shared.size}}]
                ents += [{"binding": k + 1, "resource": r} for k, r in enumerate(more) if k + 1 in used]
                groups.append(dev.create_bind_group(layout=p.get_bind_group_layout(0), entries=ents))
            rows.append((f"{name}", *timed(p, groups, 144)))
    print(f"{n} dispatches in one compute pass, best of 6 (GPU timestamps{'' if ts else ' unavailable: wall'}):")
    print(f"{'case':28s} {'GPU us/dispatch':>16s} {'host us/dispatch':>17s}")
    for name, g, h in rows:
        print(f"{name:28s} {g:16.2f} {h:17.2f}")


if __name__ == "__main__":
    main()
