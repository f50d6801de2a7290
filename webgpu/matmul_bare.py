"""The bare fp32 GEMM kernel: ``matmul`` variants ``bare`` and ``bare2`` of ``linalg``, and the
generator of ``tests/bench/webgpu_gemm_lab.py`` (the lab imports ``render_bare`` from here).

A kernel for the one case it covers, with none of the general template's (``render_rb``)
machinery: C = A @ B with A (M, K) and B (K, N) row-major, contiguous and bound as vec4 arrays,
M and N multiples of the output tile, K a multiple of the k tile times the split-K parts, one
batch. No bounds checks, no strides, no batch offsets. On an H100 this text measured faster than
``render_rb``'s with the same tiles (128x128 tiles, 8x8 outputs a thread, k tiles of 16: 46.2
against 44.1 TFLOP/s at 4096^3; at 1024^3 split in 2 parts with one reduction dispatch 38.9
against 34.0 for ember's autotuned choice), and the sessions that bisected the difference found
no single cause, so this is kept as its own text rather than as switches of the template.

``render_bare`` writes the kernel for one configuration (BM x BN tile, TM x TN outputs a thread
in named vec4 accumulators, k tiles of BK in workgroup memory, S = 1 or 2 stages). Bindings: C
(vec4s) 0, A 1, B 2, then the uniform. Without an epilogue (the form measured in the lab) the
uniform is ``dims = (M, N, K, KC)``, KC the k range of one part (workgroup z is the part); with
one (``fusion.epilogue_source``'s ``fn epilogue(acc, i)`` and its input bindings, from binding 3)
the sizes are the first four words of ``info`` (``u(k)``: measured no slower in the lab), the
epilogue's words follow, and each stored vec4 goes through the epilogue element by element; the
k loop is the same text either way. Split-K (parts > 1) writes part z's sums into plane z of a
partial buffer and ``render_reduce``'s kernel adds the planes (and runs the epilogue).
"""
from __future__ import annotations

# The configuration ember runs (BM, BN, TM, TN, BK): the lab's ``128x128/8x8/k16/s1``.
CONFIG = (128, 128, 8, 8, 16)


def render_bare(BM: int, BN: int, TM: int, TN: int, BK: int, S: int = 1, *, warp: bool = False,
                cs: bool = False, al: bool = False, u: bool = False, epilogue: str | None = None,
                info: int = 3, info_binding: int = 3) -> str:
    """WGSL of the bare kernel. ``S``: 2 for double-buffered tiles (one barrier a tile), 1 for
    two barriers a tile. The lab's variations: ``warp`` (warps of 8 x 4 lanes, 128x128/8x8 only),
    ``cs`` (C written as scalars), ``al`` (A and B bound a second time as scalar arrays), ``u``
    (the sizes from a uniform array through ``u(k)``). ``epilogue``: WGSL defining ``fn
    epilogue(acc: f32, i: u32) -> f32`` (implies ``u``; the uniform ``info`` is then ``info``
    vec4s at ``info_binding``)."""
    TX, TY = BN // TN, BM // TM
    T = TX * TY
    if not (TM % 4 == 0 and TN % 4 == 0 and (BM * BK // 4) % T == 0 and (BK * BN // 4) % T == 0):
        raise ValueError(f"bare matmul: tile {BM}x{BN}/{TM}x{TN}/k{BK} does not divide into vec4 loads of {T} threads")
    if S not in (1, 2):
        raise ValueError(f"bare matmul: {S} stages (1 or 2)")
    u = u or epilogue is not None
    LA, LB = BM * BK // 4 // T, BK * BN // 4 // T
    L = []
    w = L.append
    w(f"@group(0) @binding(0) var<storage, read_write> C: array<{'f32' if cs else 'vec4<f32>'}>;")
    w("@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;")
    w("@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;")
    if u:
        w(f"@group(0) @binding({info_binding}) var<uniform> info: array<vec4<u32>, {info}>;")
        w("fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }")
    else:
        w("@group(0) @binding(3) var<uniform> dims: vec4<u32>;")
    if epilogue is not None:
        w("fn s(k: u32) -> i32 { return bitcast<i32>(info[k / 4u][k % 4u]); }")
        w(epilogue)
    if al:
        w("@group(0) @binding(4) var<storage, read> A1: array<f32>;")
        w("@group(0) @binding(5) var<storage, read> B1: array<f32>;")
    w(f"var<workgroup> As: array<array<vec4<f32>, {BM // 4}>, {S * BK}>;")
    w(f"var<workgroup> Bs: array<array<vec4<f32>, {BN // 4}>, {S * BK}>;")
    w(f"@compute @workgroup_size({T})")
    w("fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {")
    if u:
        w("  let M = u(0u); let N = u(1u); let K = u(2u); let KC = u(3u);")
    else:
        w("  let M = dims.x; let N = dims.y; let K = dims.z; let KC = dims.w;")
    w("  let kbeg = wg.z * KC; let kend = kbeg + KC;")
    w(f"  let row0 = wg.y * {BM}u; let col0 = wg.x * {BN}u;")
    w(f"  let tx = t % {TX}u; let ty = t / {TX}u;")
    if warp:
        if (BM, BN, TM, TN) != (128, 128, 8, 8):
            raise ValueError("bare matmul: the warp mapping is for 128x128/8x8 only")
        w("  let ao = (t / 128u) * 16u + ((t % 32u) / 4u) * 2u; let bo = ((t / 32u) % 4u) * 8u + t % 4u;")
        arow = lambda i: f"ao + {i}u"           # noqa: E731
        bcol = lambda j: f"bo + {4 * j}u"       # noqa: E731
    else:
        arow = lambda i: f"ty + {i * TY}u"      # noqa: E731
        bcol = lambda j: f"tx + {j * TX}u"      # noqa: E731
    for r in range(TM):
        for j in range(TN // 4):
            w(f"  var c{r}_{j} = vec4<f32>();")
    if al:      # a use the compiler cannot drop (never true at run time)
        w("  if (KC == 0xffffffffu) { c0_0.x = A1[t] + B1[t]; }")
    # per-thread global load coordinates (constant over k)
    for i in range(LA):
        w(f"  let ea{i} = t + {i * T}u; let ar{i} = ea{i} / {BK // 4}u; let aq{i} = (ea{i} % {BK // 4}u) * 4u;")
    for i in range(LB):
        w(f"  let eb{i} = t + {i * T}u; let bk{i} = eb{i} / {BN // 4}u; let bc{i} = eb{i} % {BN // 4}u;")
    for i in range(LA):
        w(f"  var ga{i}: vec4<f32>;")
    for i in range(LB):
        w(f"  var gb{i}: vec4<f32>;")

    def load(k0):
        out = []
        for i in range(LA):
            out.append(f"ga{i} = A[((row0 + ar{i}) * K + {k0} + aq{i}) / 4u];")
        for i in range(LB):
            out.append(f"gb{i} = B[(({k0} + bk{i}) * N) / 4u + col0 / 4u + bc{i}];")
        return " ".join(out)

    def store(stage):
        out = []
        for i in range(LA):
            for j in range(4):
                out.append(f"As[{stage * BK}u + aq{i} + {j}u][ar{i} >> 2u][ar{i} & 3u] = ga{i}[{j}];")
        for i in range(LB):
            out.append(f"Bs[{stage * BK}u + bk{i}][bc{i}] = gb{i};")
        return " ".join(out)

    def tile(stage):
        out = []
        for kk in range(BK):
            r = stage * BK + kk
            loads = [f"let a{i} = As[{r}][{arow(i)}];" for i in range(TM // 4)]
            loads += [f"let b{j} = Bs[{r}][{bcol(j)}];" for j in range(TN // 4)]
            out.append("    { " + " ".join(loads))
            for rr in range(TM):
                a = f"a{rr // 4}.{'xyzw'[rr % 4]}"
                out.append("      " + " ".join(f"c{rr}_{j} = c{rr}_{j} + {a} * b{j};" for j in range(TN // 4)))
            out.append("    }")
        return "\n".join(out)

    w(f"  {load('kbeg')}")
    w(f"  {store(0)}")
    w("  workgroupBarrier();")
    if S == 2:
        w(f"  for (var k0 = kbeg; k0 < kend; k0 = k0 + {2 * BK}u) {{")
        w(f"    let more1 = k0 + {BK}u < kend;")
        w(f"    if (more1) {{ {load(f'k0 + {BK}u')} }}")
        w(tile(0))
        w(f"    if (more1) {{ {store(1)} }}")
        w("    workgroupBarrier();")
        w("    if (!more1) { break; }")
        w(f"    let more2 = k0 + {2 * BK}u < kend;")
        w(f"    if (more2) {{ {load(f'k0 + {2 * BK}u')} }}")
        w(tile(1))
        w(f"    if (more2) {{ {store(0)} }}")
        w("    workgroupBarrier();")
        w("  }")
    else:
        w(f"  for (var k0 = kbeg; k0 < kend; k0 = k0 + {BK}u) {{")
        w(f"    let more = k0 + {BK}u < kend;")
        w(f"    if (more) {{ {load(f'k0 + {BK}u')} }}")
        w(tile(0))
        w("    workgroupBarrier();")
        w(f"    if (more) {{ {store(0)} }}")
        w("    workgroupBarrier();")
        w("  }")
    w("  let cb = wg.z * M * N / 4u;")
    for i in range(TM // 4):
        for q in range(4):
            rr = i * 4 + q
            w(f"  {{ let row = row0 + ({arow(i)}) * 4u + {q}u;")
            for j in range(TN // 4):
                if cs:
                    w(f"    {{ let o = cb * 4u + row * N + col0 + ({bcol(j)}) * 4u; let x = c{rr}_{j};"
                      " C[o] = x.x; C[o + 1u] = x.y; C[o + 2u] = x.z; C[o + 3u] = x.w; }")
                elif epilogue is not None:    # (one batch, one part: C's flat index is the output's)
                    w(f"    {{ let o = cb + row * N / 4u + col0 / 4u + {bcol(j)}; let x = c{rr}_{j}; let e = o * 4u;"
                      " C[o] = vec4<f32>(epilogue(x.x, e), epilogue(x.y, e + 1u), epilogue(x.z, e + 2u),"
                      " epilogue(x.w, e + 3u)); }")
                else:
                    w(f"    C[cb + row * N / 4u + col0 / 4u + {bcol(j)}] = c{rr}_{j};")
            w("  }")
    w("}")
    return "\n".join(L)


def render_reduce(epilogue: str | None = None, info: int = 1, info_binding: int = 2) -> str:
    """WGSL adding split-K planes: O[i] = the sum of P[z * n4 + i] over the parts z, by vec4s
    (n4 = M * N / 4 and the parts in the uniform's words 0 and 1); linear workgroup id
    ``wg.x + wg.y * nwg.x`` (``driver.grid_1d``), 256 threads each. With ``epilogue`` (as in
    ``render_bare``; its words follow from word 4) every element goes through it."""
    L = ["@group(0) @binding(0) var<storage, read_write> O: array<vec4<f32>>;",
         "@group(0) @binding(1) var<storage, read> P: array<vec4<f32>>;",
         f"@group(0) @binding({info_binding}) var<uniform> info: array<vec4<u32>, {info}>;"]
    if epilogue is not None:
        L += ["fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }",
              "fn s(k: u32) -> i32 { return bitcast<i32>(info[k / 4u][k % 4u]); }", epilogue]
    L += ["@compute @workgroup_size(256)",
          "fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,",
          "        @builtin(local_invocation_index) t: u32) {",
          "  let n4 = info[0].x; let parts = info[0].y;",
          "  let i = (wg.x + wg.y * nwg.x) * 256u + t;",
          "  if (i >= n4) { return; }",
          "  var acc = P[i];",
          "  for (var z = 1u; z < parts; z = z + 1u) { acc = acc + P[z * n4 + i]; }"]
    if epilogue is None:
        L.append("  O[i] = acc;")
    else:
        L.append("  let e = i * 4u;")
        L.append("  O[i] = vec4<f32>(epilogue(acc.x, e), epilogue(acc.y, e + 1u), epilogue(acc.z, e + 2u), "
                 "epilogue(acc.w, e + 3u));")
    L.append("}")
    return "\n".join(L)
