"""A GEMM kernel laboratory on a real GPU: register-blocked fp32 WGSL matmuls generated from a few
parameters, timed by GPU timestamps with wgpu-py alone, next to PyTorch's fp32 matmul (TF32 off)
on the same shapes when torch has CUDA. For choosing ember's matmul variants, not a test.

Parameters of a variant ``BMxBN/TMxTN/kBK/sS[/pP]``: a BM x BN output tile per workgroup, TM x TN
outputs per thread (named vec4 accumulators), k tiles of BK in workgroup memory (A transposed, B
as is, both as vec4 rows), S = 2 for double-buffered tiles (one barrier a tile, the next tile
fetched into registers during the multiply) or 1 (two barriers), P parts of k (split-K: partial
planes, then one reduction dispatch, timed with it). A is M x K and B is K x N, both row-major;
M, N, K are multiples of the tiles (a lab: no bounds checks beyond WebGPU's own). These kernels come from
``ember.webgpu.matmul_bare.render_bare``, the generator of ember's own ``bare`` / ``bare2`` matmul variants
(``128x128/8x8/k16/s1`` and ``.../p2`` are exactly what ember runs for them). ``rb:BMxBN/TMxTN/kBK[/pP]``
is ember's own kernel for that configuration (``ember.webgpu.linalg.render_rb``: bounds checks,
strided layouts, the info words), to compare with.

    python tests/bench/webgpu_gemm_lab.py [--shapes 1024,2048x2048x2048,512x384x384]
        [--variants 128x128/8x8/k8/s2,...] [--ms 40]

Prints TFLOP/s per variant and shape (best of 3 timed passes), the error against numpy on a
sample of rows, and PyTorch's figure for the shape.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import wgpu

from ember.webgpu.matmul_bare import render_bare, render_reduce

DEFAULT_VARIANTS = ("128x128/8x8/k8/s2", "128x128/8x8/k16/s2", "128x128/8x8/k16/s1", "128x128/8x8/k32/s1",
                    "128x64/8x4/k16/s2", "128x64/8x8/k16/s2", "64x128/8x8/k16/s2", "64x64/8x8/k16/s2",
                    "64x64/8x8/k32/s2", "64x64/4x4/k16/s2", "32x64/4x4/k32/s2",
                    "64x64/8x8/k16/s2/p2", "64x64/8x8/k16/s2/p4", "64x64/4x4/k16/s2/p2", "128x128/8x8/k8/s2/p4")
DEFAULT_SHAPES = ("1024", "2048", "4096", "512x384x384", "512x1536x384", "512x384x1536",
                  "4096x384x384", "4096x1536x384", "4096x384x1536", "1024x384x384")


def parse_variant(s: str) -> dict:
    if s.startswith("rb:"):     # ember's own template (ember.webgpu.linalg.render_rb), bounds checks and all
        p = s[3:].split("/")
        edits = [e for e in p[3:] if e.startswith("+")]
        v = parse_variant("/".join(p[:3] + ["s1"] + [e for e in p[3:] if not e.startswith("+")]))
        v.update(name=s, ember=True, edits=[e[1:] for e in edits])
        return v
    p = s.split("/")
    bm, bn = map(int, p[0].split("x"))
    tm, tn = map(int, p[1].split("x"))
    v = dict(BM=bm, BN=bn, TM=tm, TN=tn, BK=int(p[2][1:]), S=int(p[3][1:]), P=1, W=False, name=s)
    for extra in p[4:]:
        if extra.startswith("p"):
            v["P"] = int(extra[1:])
        elif extra == "w":       # warps of 8 x 4 lanes, each lane's rows together (128x128/8x8 only)
            v["W"] = True
        elif extra in ("cs", "al", "u"):
            # steps toward ember's template: C written as scalars (cs), A and B bound a second time
            # as scalar arrays (al), the sizes read through fn u(k) from a uniform array (u)
            v[extra] = True
    return v


# ``rb:...`` renders ember's previous (plain: scalar C stores) form, the base the
# edits below apply to; ``rb:.../+ok`` renders the template as ember runs it now.
# Edits of ember's rendered template (``rb:.../+name``), each moving one thing toward the bare
# kernel, to find what the template's remaining gap is (a whole-tile, row-major, identity-epilogue
# product; each edit asserts that its text was found):
RB_EDITS = {
    # vec4 stores straight into C (C bound as vec4s), no epilogue call, no per-element checks
    "vs": [("var<storage, read_write> C: array<f32>;", "var<storage, read_write> C: array<vec4<f32>>;"),
           ("fn store4(base: u32, col: u32, N: u32, v: vec4<f32>) {",
            "fn store4(base: u32, col: u32, N: u32, v: vec4<f32>) { C[(base + col) / 4u] = v; }\nfn store4_old(base: u32, col: u32, N: u32, v: vec4<f32>) {"),
           ("if (FULL || col < N) { C[i] = epilogue(v.x, i); }", ""),
           ("if (FULL || col + 1u < N) { C[i + 1u] = epilogue(v.y, i + 1u); }", ""),
           ("if (FULL || col + 2u < N) { C[i + 2u] = epilogue(v.z, i + 2u); }", ""),
           ("if (FULL || col + 3u < N) { C[i + 3u] = epilogue(v.w, i + 3u); }", "")],
    # the vec4 loads alone (no scalar fallback code after the return)
    "nl": [("  if (AVEC && (FULL || (r < M && k + 4u <= K))) { return A4[base / 4u]; }", "  return A4[base / 4u];"),
           ("  if (BVEC && (FULL || (k < K && c + 4u <= N))) { return B4[base / 4u]; }", "  return B4[base / 4u];")],
    # no batch offsets (zero), no split-K arithmetic, k range straight from K
    "nb": [("let offs = batch_offsets(wg.z / SPLIT);", "let offs = vec2<u32>(0u, 0u);")],
    "ke": [("let kend = min(K, kbeg + kc);", "let kend = K;"), ("let kbeg = (wg.z % SPLIT) * kc;", "let kbeg = 0u;")],
}


def edit_rb(src: str, edits) -> str:
    for name in edits:
        for old, new in RB_EDITS[name]:
            assert old in src, f"+{name}: {old!r} not in the template"
            src = src.replace(old, new)
    return src


def info_words(M: int, N: int, K: int) -> list:
    """matmul_common's info words for A (M, K) and B (K, N), both row-major and vec4-aligned."""
    return [M, N, K, 1, 0, K, 1, 1, 0, N, 1, 1]


def gen(v: dict) -> str:
    if v.get("ember"):
        from ember.webgpu.linalg import rb_layout, render_rb

        cfg = (v["BM"], v["BN"], v["TM"], v["TN"], v["BK"])
        edits = [e for e in v.get("edits", ()) if e != "ok"]
        src = render_rb(cfg, {"RANK": 0, "INFO": 3, "INFO_BINDING": 5, "SPLIT": v["P"], "PLAIN": len(edits) == len(v.get("edits", ())),
                              "EPILOGUE": "fn epilogue(acc: f32, i: u32) -> f32 { return acc; }",
                              **rb_layout(cfg, info_words(v["M"], v["N"], v["K"]))})
        return edit_rb(src, edits)
    return render_bare(v["BM"], v["BN"], v["TM"], v["TN"], v["BK"], v["S"], warp=v["W"], cs=v.get("cs", False),
                       al=v.get("al", False), u=v.get("u", False))




def parse_shape(s: str):
    d = [int(x) for x in s.split("x")]
    return (d[0], d[0], d[0]) if len(d) == 1 else tuple(d)


class Lab:
    def __init__(self):
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        lim = adapter.limits
        want = {k: lim[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size",
                                    "max-compute-workgroup-storage-size",
                                    "max-compute-invocations-per-workgroup")}
        self.dev = adapter.request_device_sync(required_limits=want, required_features=["timestamp-query"])
        self.info = adapter.info
        self.qs = self.dev.create_query_set(type="timestamp", count=2)
        self.qbuf = self.dev.create_buffer(size=256, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
        self.reduce = self.dev.create_compute_pipeline(
            layout="auto", compute={"module": self.dev.create_shader_module(code=render_reduce()), "entry_point": "main"})

    def buf(self, data=None, size=None):
        u = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        if data is not None:
            return self.dev.create_buffer_with_data(data=data, usage=u)
        return self.dev.create_buffer(size=size, usage=u)

    def uniform(self, words):
        return self.dev.create_buffer_with_data(data=np.array(words, np.uint32).tobytes(),
                                                usage=wgpu.BufferUsage.UNIFORM)

    def time(self, dispatches, reps: int) -> float:
        """GPU seconds of one pass running ``dispatches`` ``reps`` times, best of 3."""
        best = None
        for _ in range(3):
            enc = self.dev.create_command_encoder()
            cp = enc.begin_compute_pass(timestamp_writes={"query_set": self.qs, "beginning_of_pass_write_index": 0,
                                                          "end_of_pass_write_index": 1})
            for _ in range(reps):
                for pipe, bg, grid in dispatches:
                    cp.set_pipeline(pipe)
                    cp.set_bind_group(0, bg)
                    cp.dispatch_workgroups(*grid)
            cp.end()
            enc.resolve_query_set(self.qs, 0, 2, self.qbuf, 0)
            self.dev.queue.submit([enc.finish()])
            q = np.frombuffer(self.dev.queue.read_buffer(self.qbuf, 0, 16), np.uint64)
            s = (int(q[1]) - int(q[0])) * 1e-9
            best = s if best is None else min(best, s)
        return best / reps

    def run(self, v: dict, M: int, N: int, K: int, a, b, ref_rows, ms: float):
        BM, BN, BK, P = v["BM"], v["BN"], v["BK"], v["P"]
        if M % BM or N % BN or K % (BK * P):
            return None
        src = gen(dict(v, M=M, N=N, K=K))
        try:
            pipe = self.dev.create_compute_pipeline(
                layout="auto", compute={"module": self.dev.create_shader_module(code=src), "entry_point": "main"})
        except Exception as e:   # noqa: BLE001 - a variant the adapter cannot compile
            return f"compile failed: {str(e)[:200]}"
        ba, bb = self.buf(a.tobytes()), self.buf(b.tobytes())
        part = self.buf(size=P * M * N * 4)
        if v.get("ember"):      # matmul_common's info words: A (M, K) and B (K, N) row-major, vec4-aligned
            info = self.uniform(info_words(M, N, K))
            ents = [part, ba, bb, ba, bb, info]
        else:
            ents = [part, ba, bb, self.uniform([M, N, K, K // P] + ([0] * 8 if v.get("u") else []))]
            if v.get("al"):
                ents += [ba, bb]
        bg = self.dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": b}} for i, b in enumerate(ents)])
        disp = [(pipe, bg, (N // BN, M // BM, P))]
        out = part
        if P > 1:
            out = self.buf(size=M * N * 4)
            n4 = M * N // 4
            g = (n4 + 255) // 256
            rg = self.dev.create_bind_group(layout=self.reduce.get_bind_group_layout(0), entries=[
                {"binding": 0, "resource": {"buffer": out}}, {"binding": 1, "resource": {"buffer": part}},
                {"binding": 2, "resource": {"buffer": self.uniform([n4, P, 0, 0])}}])
            disp.append((self.reduce, rg, (min(g, 65535), (g + 65534) // 65535, 1)))
        one = self.time(disp, 1)
        reps = max(2, min(400, int(ms * 1e-3 / max(one, 1e-6))))
        sec = self.time(disp, reps)
        c = np.frombuffer(self.dev.queue.read_buffer(out), np.float32).reshape(M, N)
        rows, ref = ref_rows
        err = float(np.abs(c[rows] - ref).max() / (np.abs(ref).max() + 1e-30))
        for x in (ba, bb, part, out):
            x.destroy()
        return sec, err


def torch_time(M, N, K, ms):
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(M, K, device="cuda")
    b = torch.randn(K, N, device="cuda")
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    best = None
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 20
        s.record()
        for _ in range(reps):
            a @ b
        e.record()
        torch.cuda.synchronize()
        t = s.elapsed_time(e) * 1e-3 / reps
        best = t if best is None else min(best, t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES))
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS))
    ap.add_argument("--ms", type=float, default=40.0, help="GPU time per timed pass")
    ap.add_argument("--print", dest="show", help="print one variant's WGSL and exit")
    args = ap.parse_args(argv)
    if args.show:
        print(gen(parse_variant(args.show)))
        return 0
    lab = Lab()
    print(f"adapter: {lab.info.get('device')} ({lab.info.get('backend_type', '')})")
    rng = np.random.default_rng(0)
    variants = [parse_variant(s) for s in args.variants.split(",")]
    for shape in args.shapes.split(","):
        M, N, K = parse_shape(shape)
        a = rng.standard_normal((M, K), dtype=np.float32)
        b = rng.standard_normal((K, N), dtype=np.float32)
        rows = np.r_[0:8, M - 8:M]
        ref = (a[rows].astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
        flop = 2.0 * M * N * K
        tt = torch_time(M, N, K, args.ms)
        head = f"{M}x{N}x{K}" + (f"  torch {flop / tt * 1e-12:.1f} TFLOP/s ({tt * 1e6:.1f} us)" if tt else "")
        print(f"== {head}", flush=True)
        for v in variants:
            r = lab.run(v, M, N, K, a, b, (rows, ref), args.ms)
            if r is None:
                continue
            if isinstance(r, str):
                print(f"  {v['name']:<24} {r}", flush=True)
                continue
            sec, err = r
            ratio = f"  {tt / sec:.2f}x torch" if tt else ""
            print(f"  {v['name']:<24} {flop / sec * 1e-12:6.1f} TFLOP/s {sec * 1e6:9.1f} us  err {err:.1e}{ratio}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
