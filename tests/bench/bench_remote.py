"""ember.remote on loopback: round-trip overhead per op call and per replayed plan, and
throughput with 1, 8 and 32 concurrent clients (``python build.py bench remote``).

    .venv/bin/python tests/bench/bench_remote.py [--quick] [--device numpy] [--json out.json]

Starts ``ember serve --device DEVICE`` (numpy by default) as a child process on a free loopback
port and measures, best of several repeats (the run nobody preempted on a shared machine):

- ``op call + read``: ``(x + 1).tolist()`` on a 4-float tensor: one op queued, one round trip;
- ``op queued``: the client cost of one lazy op call (no round trip), flushed at the end;
- ``replay + read``: a compiled 2-layer MLP (64 -> 64 -> 10) replayed on a fresh input upload
  and read back: one frame out (put, run, free, get), one back. The goal is <= 1 ms;
- ``replay queued``: replays without reads, flushed every 64;
- the same MLP on the local numpy device, eagerly and replayed, for scale;
- throughput: N client processes (fork) each replaying the MLP with a read for a fixed time;
  replays per second summed, and the server's peak memory from ``/health``.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import secrets
import sys
import time
import urllib.request

import ember
import ember.remote
from ember.remote.server import spawn

QUICK = "--quick" in sys.argv
DEVICE = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "numpy"
REPEATS = 5 if QUICK else 15
N = 50 if QUICK else 200
SECONDS = 2.0 if QUICK else 5.0


def best(fn, n=N, repeats=REPEATS):
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return min(out)


def mlp(device):
    ember.manual_seed(0)
    from ember import nn

    net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)
    net.eval()
    for p in net.parameters():   # inference: parameters that require grad would make the signature eager
        p.requires_grad_(False)
    return ember.compile(net)


def _x(device, k=0):
    return ember.full((8, 64), 0.01 * (k % 7), device=device)


def _client(url, token, seconds, q):
    try:
        dev = ember.remote.connect(url, token=token, name=f"p{os.getpid()}")
        f = mlp(dev)
        for k in range(3):
            f(_x(dev, k)).tolist()
        n, t_end = 0, time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            f(_x(dev, n)).tolist()
            n += 1
        ember.remote.disconnect(dev)
        q.put(("ok", n))
    except Exception as e:   # noqa: BLE001 - reported by the parent
        q.put(("error", f"{type(e).__name__}: {e}"))


def throughput(url, token, clients):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_client, args=(url, token, SECONDS, q)) for _ in range(clients)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    res = [q.get(timeout=SECONDS + 120) for _ in procs]
    for p in procs:
        p.join(30)
    wall = time.perf_counter() - t0
    errors = [r[1] for r in res if r[0] != "ok"]
    total = sum(r[1] for r in res if r[0] == "ok")
    return {"clients": clients, "replays": total, "replays_per_s": total / SECONDS, "errors": errors[:3],
            "wall_s": round(wall, 2)}


def main() -> int:
    token = secrets.token_hex(16)
    proc, url = spawn(DEVICE, token=token)
    out = {"device": DEVICE, "url": url}
    try:
        dev = ember.remote.connect(url, token=token)
        x = ember.tensor([1.0, 2.0, 3.0, 4.0], device=dev)
        out["op_call_read_us"] = best(lambda: (x + 1).tolist())

        def queued():
            for _ in range(64):
                x + 1
            ember.get_backend(dev).flush()
        out["op_queued_us"] = best(queued, n=max(N // 8, 5)) / 64

        f = mlp(dev)
        for k in range(3):
            f(_x(dev, k)).tolist()
        out["replay_read_us"] = best(lambda: f(_x(dev)).tolist())

        def replays():
            for _ in range(64):
                f(_x(dev))
            ember.get_backend(dev).flush()
        out["replay_queued_us"] = best(replays, n=max(N // 8, 5)) / 64
        st = f.stats()
        assert st["plans"] == 1 and not st["eager_calls"], st
        out["plan_kernel_calls"] = st["kernel_calls"]
        ember.remote.disconnect(dev)

        g = mlp("numpy")
        for k in range(3):
            g(_x("numpy", k)).tolist()
        out["numpy_replay_read_us"] = best(lambda: g(_x("numpy")).tolist())
        out["numpy_eager_read_us"] = best(lambda: g.fn(_x("numpy")).tolist())

        out["throughput"] = [throughput(url, token, c) for c in (1, 8, 32)]
        with urllib.request.urlopen(url.replace("ws://", "http://") + "health", timeout=10) as r:
            out["health_after"] = r.read().decode().strip()
    finally:
        proc.terminate()
        proc.wait(10)

    print(f"ember.remote on loopback, server device {DEVICE} (best of {REPEATS}, load {os.getloadavg()[0]:.1f})")
    print(f"  op call + read (one round trip)     {out['op_call_read_us']:9.0f} us")
    print(f"  op call, queued (no round trip)     {out['op_queued_us']:9.1f} us")
    print(f"  replay + read (MLP 8x64, 1 RT)      {out['replay_read_us']:9.0f} us   goal <= 1000 us")
    print(f"  replay, queued                      {out['replay_queued_us']:9.1f} us")
    print(f"  local numpy: replay + read          {out['numpy_replay_read_us']:9.0f} us, eager {out['numpy_eager_read_us']:.0f} us")
    for t in out["throughput"]:
        err = f"  errors: {t['errors']}" if t["errors"] else ""
        print(f"  {t['clients']:3d} clients: {t['replays_per_s']:8.0f} replays/s (with a read each){err}")
    print(f"  server after: {out['health_after']}")
    if "--json" in sys.argv:
        with open(sys.argv[sys.argv.index("--json") + 1], "w") as fh:
            json.dump(out, fh, indent=1)
    return 0 if not any(t["errors"] for t in out["throughput"]) else 1


if __name__ == "__main__":
    sys.exit(main())
