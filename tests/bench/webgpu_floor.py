"""The cost of a dispatch that waits for the one before (a decode step is a chain of ~150 such),
measured with wgpu-py alone: N dispatches recorded into one compute pass, timed by GPU
timestamps at the pass's ends, for

- ``chain``: each dispatch reads and writes the same storage buffer (wgpu puts a barrier between
  every two), 1 workgroup of 64 threads or G workgroups of 256;
- ``free``: each dispatch writes a buffer of its own (no barrier: the floor of independent work);
- ``reduce``: ``chain`` where each workgroup of 256 first sums 576 floats (a decode gemv's RMS
  prologue) by a tree in workgroup memory, or by ``subgroupAdd`` (adapters with subgroups).

    python tests/bench/webgpu_floor.py [--n 400]

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
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

    def bg(p, buf):
        return dev.create_bind_group(layout=p.get_bind_group_layout(0),
                                     entries=[{"binding": 0, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}])

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
    print(f"{n} dispatches in one compute pass, best of 6 (GPU timestamps{'' if ts else ' unavailable: wall'}):")
    print(f"{'case':28s} {'GPU us/dispatch':>16s} {'host us/dispatch':>17s}")
    for name, g, h in rows:
        print(f"{name:28s} {g:16.2f} {h:17.2f}")


if __name__ == "__main__":
    main()
