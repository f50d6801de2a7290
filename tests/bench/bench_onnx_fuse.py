"""The ONNX load-time fusions' A/B (ember.onnx.fuse: attention, parallel Linears, GELU, Linear):
a MiniLM-shaped BERT (bench_models' ONNX graph, random weights) loaded with EMBER_ONNX_FUSE on and
off, alternating in one process; median ms per call (output read back) and dispatches per call on
webgpu.

    python tests/bench/bench_onnx_fuse.py [--device numpy|webgpu|python] [--shapes 8x64,1x16] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models as M  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="numpy")
    ap.add_argument("--shapes", default="8x64,1x16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    import ember
    import ember.onnx

    c = M.MINILM
    blob = M.bert_onnx(c, M.random_bert_weights(c))
    stats = None
    if a.device == "webgpu":
        from ember.webgpu.runtime import get_runtime
        stats = get_runtime()
    print(f"{'shape':>8} {'fused ms':>9} {'unfused ms':>11} {'ratio':>6} {'disp':>9}")
    for shape in a.shapes.split(","):
        b, n = (int(v) for v in shape.split("x"))
        ids, mask = M.bert_inputs(c, b, n)
        feeds = {"input_ids": ids, "attention_mask": mask}
        res, disp, outs = {}, {}, {}
        for _ in range(a.rounds):
            for fuse in ("on", "off"):
                os.environ["EMBER_ONNX_FUSE"] = fuse
                m = ember.onnx.load(blob, device=a.device)
                for _ in range(2):
                    m.run(feeds)
                ts = []
                for _ in range(a.reps):
                    if stats is not None:
                        stats.reset_stats()
                    t0 = time.perf_counter()
                    outs[fuse] = next(iter(m.run(feeds).values())).numpy()
                    ts.append(time.perf_counter() - t0)
                if stats is not None:
                    disp[fuse] = stats.stats.get("dispatches", 0)
                res.setdefault(fuse, []).append(1e3 * float(np.median(ts)))
        os.environ.pop("EMBER_ONNX_FUSE", None)
        on, off = min(res["on"]), min(res["off"])
        assert np.allclose(outs["on"], outs["off"], rtol=1e-4, atol=1e-4), "fused and unfused results differ"
        d = f"{disp['on']}/{disp['off']}" if disp else "-"
        print(f"{shape:>8} {on:9.2f} {off:11.2f} {off / on:6.2f} {d:>9}")


if __name__ == "__main__":
    main()
