// Quantized weights (GGUF block formats) read straight from their raw bytes: matrix-vector
// (`gemv`, decode), tiled matrix-matrix (`tiled`, prompt), `dequant` (whole matrix to f32) and
// `embed` (rows picked by id). ember.webgpu.quant picks the entry point and fills the template.
//
// The weight is an int32 tensor of the raw block bytes of its N rows, back to back: read here as
// words (`wq`). WGSL has no 8- or 16-bit storage (and Chromium's SwiftShader no shader-f16), so
// bytes, nibbles and halves are cut out of u32 words; f16 scales go through unpack2x16float.
// Blocks of 18, 22, 34 or 210 bytes leave a block's fields at 2-byte but not 4-byte boundaries:
// `word_at` reads the 4 bytes at any even offset (two words and a funnel shift; one word when the
// template's AL says every offset asked for is a multiple of 4).
//
// One "item" is 8 elements of a row given as two vec4s (w0 at elements e0..e0+3, w1 at
// e1..e1+3), decoded from one or two words of quants plus the block's scales. Items are laid
// out so that items 8j..8j+7 cover exactly elements [64j, 64j + 64) of the row: a kernel that
// works on 64-element slices of k knows which items fall in a slice from the index alone. A row
// of K elements has ceil(K / 8) items, whatever the format.
//
// Template: QT (format: q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl q2_k q3_k q4_k q5_k q6_k iq4_xs f16
// bf16 f32), AL (true when every block starts 4-byte aligned), WG (threads), R (gemv rows per
// workgroup), MT (gemv x rows, padded), XS (gemv x floats kept in workgroup memory), TM, TN (tiled tile sizes), INFO.
// info (every entry): 0 M (x rows / ids), 1 N (weight rows), 2 K, 3 bytes per weight row,
//       4 weight byte offset, 5 x element offset (ids offset for embed), 6 items per row
//
// The file is a prelude (the weight, its decoding) and one section per entry point ("//// name"
// lines): ember.webgpu.quant compiles the prelude with one section, so each entry declares
// exactly the bindings it uses (layout "auto"): 0 out, 1 the weight, then its own.
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;

#include qdecode

//// gemv
@group(0) @binding(2) var<storage, read> xin: array<{{XT}}>;
{{DECL}}
@group(0) @binding({{IB}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }
fn x1(i: u32) -> f32 { {{X1}} }             // x element i
fn x4(i: u32) -> vec4<f32> { {{X4}} }       // x elements i..i+3
// the sum of v over each aligned run of n lanes of a subgroup (n a power of two, at most the
// subgroup's size), by butterfly shuffles; without subgroups n is 1 and v comes back as it is
{{SG_SUM}}

// Folded neighbours (ops qlinear_rms / qlinear_residual), info 7 x row stride, 8 norm weight
// offset, 9 residual offset, 10 eps (f32 bits). PRO 0: x as it is; 1 (RMSNorm): x times
// 1/rms of its row (every workgroup sums its row's squares first: K floats, cached) times the
// norm weight; 2 (gated MLP): silu(gate) * up, the halves of a row of 2K. EPI: a residual added
// to each output.
const PRO: u32 = {{PRO}}u;
const EPI: bool = {{EPI}};
// ROPE: outputs 0 .. info 11 of each x row m rotated as llama's q and k rows ("pairs": rows 2i,
// 2i+1 of a head of 2 * info 12 rows turn by angle i of position pos + m; cos / sin tables at
// info 13 / 14, pos at info 15). A pair's two rows are always in one workgroup (it owns an even
// number of consecutive rows), so the epilogue reads the partner's sum from workgroup memory.
const ROPE: bool = {{ROPE}};
fn rope_cs(m: u32, i: u32) -> vec2<f32> { {{ROPE_CS}} }
var<private> nrm: array<f32, {{MT}}>;
fn nw4(e: u32) -> vec4<f32> { {{NW4}} }
fn res_at(i: u32) -> f32 { {{RES}} }
// XP (with PRO 1, one x row): x is a residual stream in parts, the sum of XR rows of K (info 7
// apart; a constant: a thread's loads of them issue together): the prologue sums them into
// workgroup memory once
const XP: bool = {{XP}};
const XR: u32 = {{XR}}u;
var<workgroup> xp: array<vec4<f32>, {{XP4}}>;
fn xrow(m: u32, e: u32) -> vec4<f32> {
  let b = u(5u) + m * u(7u);
  if (XP) { return xp[e / 4u] * nrm[0] * nw4(e); }
  if (PRO == 1u) { return x4(b + e) * nrm[m] * nw4(e); }
  if (PRO == 2u) { let g = x4(b + e); return g / (1.0 + exp(-g)) * x4(b + u(2u) + e); }
  return x4(b + e);
}

// ---- gemv: out (M, N) = x (M, K) @ dequantize(w).T for M <= MT ----------------------------------
// Threads come in groups of LANES consecutive ones; a group owns RB consecutive weight rows, so a
// workgroup owns (WG / LANES) * RB rows. Each step a lane takes U items whose loads are
// independent (more bytes in flight per thread): with IL false a run of U consecutive items
// (lane l: items lU .. lU+U-1, neighbouring lanes read neighbouring blocks), with IL true
// ("interleaved") items l, l + LANES, .. l + (U-1) LANES, so that at each of the U loads the
// group's lanes read consecutive items: consecutive quant words and consecutive x vectors (one
// memory transaction serves many lanes; runs of blocks spread a warp's loads over U times as
// many cache lines). Each x vector loaded serves the RB rows. x is read straight from its buffer (XSH false: cached, one pass
// over k) or staged in workgroup memory XS floats at a time (XSH true: KC = XS / MT columns of
// every x row per pass; rows of x past M and columns past K are zeros). The lanes' partial
// sums meet in one tree in workgroup memory.
const XSH: bool = {{XSH}};
const RB: u32 = {{RB}}u;
const LANES: u32 = {{LANES}}u;
const U: u32 = {{U}}u;
const IL: bool = {{IL}};
const LS: u32 = select(U, 1u, IL);      // a lane's first item, in lanes
const US: u32 = select(1u, LANES, IL);  // the items of one step, apart
const MT: u32 = {{MT}}u;
const KC: u32 = {{KC}}u;
var<workgroup> xs: array<vec4<f32>, {{XS4}}>;
var<workgroup> red: array<f32, {{RED}}>;

fn xget(m: u32, k0: u32, e: u32, M: u32, K: u32) -> vec4<f32> {
  if (XSH) { return xs[m * (KC / 4u) + (e - k0) / 4u]; }
  return xrow(min(m, M - 1u), e);
}

@compute @workgroup_size({{WG}})
fn gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32{{SG_ARGS}}) {
  let sgs = {{SGS}};
  let M = u(0u); let N = u(1u); let K = u(2u);
  let grp = t / LANES;
  let lane = t % LANES;
  let row0 = ((wid.x + wid.y * nwg.x) * ({{WG}}u / LANES) + grp) * RB;
  let nitems = u(6u);
  let rbytes = u(3u);
  var rb: array<u32, {{RB}}>;
  for (var r = 0u; r < RB; r = r + 1u) { rb[r] = u(4u) + min(row0 + r, N - 1u) * rbytes; }
  if (PRO == 1u) {
    // 1 / rms of each x row: the workgroup's threads sum squares, one tree per row
    for (var m = 0u; m < MT; m = m + 1u) {
      var s = 0.0;
      if (m < M) {
        for (var e = t * 4u; e < K; e = e + {{WG}}u * 4u) {
          var v = x4(u(5u) + m * u(7u) + e);
          if (XP) {
            for (var r = 1u; r < XR; r = r + 1u) { v = v + x4(u(5u) + r * u(7u) + e); }
            xp[e / 4u] = v;
          }
          s = s + dot(v, v);
        }
      }
      red[m * {{WG}}u + t] = sg_sum(s, min({{WG}}u, sgs));
    }
    for (var s = {{WG}}u / 2u; s >= min({{WG}}u, sgs); s = s / 2u) {
      workgroupBarrier();
      if (t < s && t % sgs == 0u) {
        for (var m = 0u; m < MT; m = m + 1u) { red[m * {{WG}}u + t] = red[m * {{WG}}u + t] + red[m * {{WG}}u + t + s]; }
      }
    }
    workgroupBarrier();
    for (var m = 0u; m < MT; m = m + 1u) { nrm[m] = 1.0 / sqrt(red[m * {{WG}}u] / f32(K) + bitcast<f32>(u(10u))); }
    workgroupBarrier();
  }
  var acc: array<f32, {{ACC}}>;
  for (var k0 = 0u; k0 < K; k0 = k0 + KC) {
    if (XSH) {
      for (var j = t; j < {{XS}}u; j = j + {{WG}}u) {
        let m = j / KC;
        let k = k0 + j % KC;
        var v = 0.0;
        if (m < M && k < K) { v = x1(u(5u) + m * K + k); }
        xs[j / 4u][j % 4u] = v;
      }
      workgroupBarrier();
    }
    if (row0 < N) {
      let i1 = min(nitems, (k0 + min(KC, K - k0) + 7u) / 8u);
      // U consecutive items per lane and step (U = 4: a whole 32-block), their loads independent
      for (var i0 = k0 / 8u + lane * LS; i0 < i1; i0 = i0 + LANES * U) {
        for (var uu = 0u; uu < U; uu = uu + 1u) {
          let iu = i0 + uu * US;
          let i = min(iu, i1 - 1u);
          let live_item = iu < i1;
          // (no array of the RB rows' items: one item at a time, its x vectors at positions
          // known from i alone: loaded once for one x row (decode; a prologue's x costs more
          // than a load), else re-read per row from the cache)
          let p = item_pos(i);
          if (MT == 1u) {
            let xa = xget(0u, k0, p.x, M, K);
            let xb = xget(0u, k0, p.y, M, K);
            for (var r = 0u; r < RB; r = r + 1u) {
              let it = item(rb[r], i);
              acc[r] = acc[r] + select(0.0, dot(it.w0, xa) + dot(it.w1, xb), live_item);
            }
            continue;
          }
          for (var r = 0u; r < RB; r = r + 1u) {
            let it = item(rb[r], i);
            for (var m = 0u; m < MT; m = m + 1u) {
              let d = dot(it.w0, xget(m, k0, p.x, M, K)) + dot(it.w1, xget(m, k0, p.y, M, K));
              acc[m * RB + r] = acc[m * RB + r] + select(0.0, d, live_item);
            }
          }
        }
      }
    }
    if (XSH) { workgroupBarrier(); }
  }
  // the lanes' partial sums: first across each run of min(LANES, subgroup size) lanes by
  // subgroup shuffles (adapters with subgroups; else runs of 1), then a tree over the runs
  let span = min(LANES, sgs);
  for (var j = 0u; j < MT * RB; j = j + 1u) { red[j * {{WG}}u + t] = sg_sum(acc[j], span); }
  for (var s = LANES / 2u; s >= span; s = s / 2u) {
    workgroupBarrier();
    if (lane < s && lane % span == 0u) {
      for (var j = 0u; j < MT * RB; j = j + 1u) { red[j * {{WG}}u + t] = red[j * {{WG}}u + t] + red[j * {{WG}}u + t + s]; }
    }
  }
  workgroupBarrier();
  if (lane == 0u) {
    let wrow0 = (wid.x + wid.y * nwg.x) * ({{WG}}u / LANES) * RB;
    for (var r = 0u; r < RB; r = r + 1u) {
      if (row0 + r < N) {
        for (var m = 0u; m < M; m = m + 1u) {
          var v = red[(m * RB + r) * {{WG}}u + t];
          if (ROPE && row0 + r < u(11u)) {
            let lr = (row0 + r) ^ 1u;                      // the partner row, same workgroup
            let pv = red[(m * RB + (lr - wrow0) % RB) * {{WG}}u + ((lr - wrow0) / RB) * LANES];
            let cs = rope_cs(m, ((row0 + r) % (2u * u(12u))) / 2u);
            v = select(v * cs.x + pv * cs.y, v * cs.x - pv * cs.y, (row0 + r) % 2u == 0u);
          }
          if (EPI) { v = v + res_at(m * N + row0 + r); }
          out[m * N + row0 + r] = v;
        }
      }
    }
  }
}

//// gemv8
@group(0) @binding(2) var<storage, read> xin: array<{{XT}}>;
{{DECL}}
@group(0) @binding({{IB}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;
fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }
fn x4(i: u32) -> vec4<f32> { {{X4}} }       // x elements i..i+3
{{SG_SUM}}
const PRO: u32 = {{PRO}}u;
const EPI: bool = {{EPI}};
const ROPE: bool = {{ROPE}};
fn rope_cs(i: u32) -> vec2<f32> { let m = 0u; {{ROPE_CS}} }
fn nw4(e: u32) -> vec4<f32> { {{NW4}} }
fn res_at(i: u32) -> f32 { {{RES}} }
const RB: u32 = {{RB}}u;
const LANES: u32 = {{LANES}}u;

// ---- gemv8: out (1, N) = x (1, K) @ dequantize(w).T for the 32-element block formats (q8_0
// q4_0 q4_1 q5_0 q5_1) and the K-quants whose scales cover 32 or 16 elements (q4_k q5_k q6_k
// q3_k), with x quantized to int8 per block of 32 in workgroup memory and each block's
// products summed by dot4I8Packed (4 multiply-adds an instruction; llama.cpp's mmvq does the
// same): a float kernel spends more instructions decoding and multiplying than the memory needs
// time (H100: 40-55% of HBM). Results differ from float by x's rounding to 8 bits (~0.5% of the outputs' spread,
// as the WebAssembly q_linear). Stage 1: each thread quantizes blocks of x' (x as it is, x times
// the RMSNorm weight (PRO 1: 1/rms, a scalar, scales the sums at the end; the squares are summed
// here too), or silu(gate) * up (PRO 2)): scale d = max|x'| / 127, 8 packed words, and the float
// sum of the block (for the minimum terms: q4_1's m, q4_k's dmin * m). Stage 2: groups of
// LANES threads own RB rows; lane l takes 32-element blocks l, l + LANES, .. (a K-quant's
// sub-blocks: SB of them in a super-block of BB bytes, so x's block index is the same);
// sums meet as in gemv.
const SB: u32 = {{SB}}u;
var<workgroup> xq: array<u32, {{XQ}}>;
var<workgroup> xd: array<f32, {{XB}}>;
var<workgroup> xs: array<f32, {{XB}}>;
var<workgroup> wmx: array<f32, {{XQ}}>;
var<workgroup> wsm: array<f32, {{XQ}}>;
var<workgroup> red: array<f32, {{RED}}>;

// XP (PRO 1): x is a residual stream in parts, the sum of XR rows (info 7 apart)
const XP: bool = {{XP}};
const XR: u32 = {{XR}}u;
fn xsum(e: u32) -> vec4<f32> {
  var v = x4(u(5u) + e);
  if (XP) { for (var r = 1u; r < XR; r = r + 1u) { v = v + x4(u(5u) + r * u(7u) + e); } }
  return v;
}
fn xp(e: u32) -> vec4<f32> {
  let b = u(5u);
  if (PRO == 1u) { return xsum(e) * nw4(e); }
  if (PRO == 2u) { let g = x4(b + e); return g / (1.0 + exp(-g)) * x4(b + u(2u) + e); }
  return x4(b + e);
}

// q - 32 (q6_k) / q - 4 (q3_k) of the 6- / 3-bit values in the bytes of q as signed bytes: flip
// the value's top bit, then extend its sign (byte-wise, no carries: top * ext = 0xc0 / 0xf8)
fn signed6(q: u32) -> u32 { let v = q ^ 0x20202020u; return v | ((v & 0x20202020u) * 6u); }
fn signed3(q: u32) -> u32 { let v = q ^ 0x04040404u; return v | ((v & 0x04040404u) * 0x3eu); }

// the products of x's block xb with 32-element (sub-)block j of the weight block at byte o:
// the row's contribution
fn block_dot(o: u32, j: u32, xb: u32) -> f32 {
  let xw = 8u * xb;
  var s = 0;
  if ({{QK}} == 0u) {            // q8_0: f16 d, 32 int8
    for (var i = 0u; i < 8u; i = i + 1u) { s = s + dot4I8Packed(word_at(o + 2u + 4u * i), xq[xw + i]); }
    return half_at(o) * xd[xb] * f32(s);
  }
  if ({{QK}} == 2u || {{QK}} == 4u) {   // q4_1: f16 d, f16 m, nibbles; q5_1: the same + 32 high bits
    let q5 = {{QK}} == 4u;
    let qh = select(0u, word_at(o + 4u), q5);
    for (var i = 0u; i < 4u; i = i + 1u) {
      let q = word_at(o + select(4u, 8u, q5) + 4u * i);
      var lo = q & 0x0f0f0f0fu;
      var hi = (q >> 4u) & 0x0f0f0f0fu;
      if (q5) { lo = lo | bit4(qh >> (4u * i)); hi = hi | bit4(qh >> (16u + 4u * i)); }
      s = s + dot4I8Packed(lo, xq[xw + i]) + dot4I8Packed(hi, xq[xw + 4u + i]);
    }
    let dm = unpack2x16float(word_at(o));
    return dm.x * xd[xb] * f32(s) + dm.y * xs[xb];
  }
  if ({{QK}} == 5u || {{QK}} == 6u) {
    // q4_k (144 bytes: f16 d, f16 dmin, 12 scale bytes, nibbles) / q5_k (176: + 32 bytes of high
    // bits before the nibbles): sub-block j is the low (j even) or high nibbles of the 32 bytes
    // 32 (j / 2).., byte l element l (and bit j of high-bit byte l its 5th bit); value
    // d * sc_j * q - dmin * m_j: the minimum meets x's float block sum
    let q5 = {{QK}} == 6u;
    let qo = o + select(16u, 48u, q5) + 32u * (j / 2u);
    let sh = 4u * (j % 2u);
    for (var i = 0u; i < 8u; i = i + 1u) {
      var q = (word_at(qo + 4u * i) >> sh) & 0x0f0f0f0fu;
      if (q5) { q = q | (((word_at(o + 16u + 4u * i) >> j) & 0x01010101u) << 4u); }
      s = s + dot4I8Packed(q, xq[xw + i]);
    }
    let dm = unpack2x16float(word_at(o));
    let sm = kscale(j, word_at(o + 4u), word_at(o + 8u), word_at(o + 12u));
    return dm.x * sm.x * xd[xb] * f32(s) - dm.y * sm.y * xs[xb];
  }
  if ({{QK}} == 7u || {{QK}} == 8u) {
    // q6_k (210 bytes: 128 of low nibbles, 64 of 2-bit highs, 16 int8 scales, f16 d): sub-block
    // j = 4h + c is elements 32j.. : low nibbles of bytes 64h + 32 (c % 2).. (the high nibbles
    // when c >= 2), bits 2c of bytes 128 + 32h..; value d * scale * (q - 32).
    // q3_k (110 bytes: 32 of hmask, 64 of 2-bit quants, 12 scale bytes, f16 d): sub-block
    // j = 4h + c: bits 2c of bytes 32 + 32h.., its high bit bit j of hmask byte l (clear: minus
    // 4); value d * scale * q.
    // Both: scales 2j, 2j + 1 for the sub-block's halves of 16 (two integer sums); two runs of 8
    // words (a: low bits, b: high bits) at offsets of o's alignment: unaligned blocks (AL false)
    // read each run as 9 words, each word funnel-shifted with the next (word_at reads 2 a word)
    let q6 = {{QK}} == 7u;
    let h = j / 4u;
    let c = j % 4u;
    let ra = (o + select(32u + 32u * h, 64u * h + 32u * (c % 2u), q6)) >> 2u;
    let rb = (o + select(0u, 128u + 32u * h, q6)) >> 2u;
    let sa = select(2u * c, 4u * (c / 2u), q6);     // shifts of the run words' bits
    let sb = select(j, 2u * c, q6);
    let fs = (o & 3u) * 8u;
    var pa = wq[ra];
    var pb = wq[rb];
    var s2 = 0;
    for (var i = 0u; i < 8u; i = i + 1u) {
      var wa: u32;
      var wb: u32;
      if (AL) {
        wa = wq[ra + i];
        wb = wq[rb + i];
      } else {
        let na = wq[ra + i + 1u];
        let nb = wq[rb + i + 1u];
        wa = select((pa >> fs) | (na << (32u - fs)), pa, fs == 0u);
        wb = select((pb >> fs) | (nb << (32u - fs)), pb, fs == 0u);
        pa = na;
        pb = nb;
      }
      var q: u32;
      if (q6) {
        q = signed6(((wa >> sa) & 0x0f0f0f0fu) | (((wb >> sb) & 0x03030303u) << 4u));
      } else {
        q = signed3(((wa >> sa) & 0x03030303u) | (((wb >> sb) & 0x01010101u) << 2u));
      }
      let p = dot4I8Packed(q, xq[xw + i]);
      s = s + select(0, p, i < 4u);
      s2 = s2 + select(p, 0, i < 4u);
    }
    if (q6) {
      let so = o + 192u + 2u * j;                  // (even: both scales in one half of a word)
      let sw = wq[so >> 2u] >> ((so & 2u) * 8u);
      let sc0 = f32(bitcast<i32>(sw << 24u) >> 24u);
      let sc1 = f32(bitcast<i32>(sw << 16u) >> 24u);
      return half_at(o + 208u) * xd[xb] * (sc0 * f32(s) + sc1 * f32(s2));
    }
    return half_at(o + 108u) * xd[xb] * (q3_scale(o, 2u * j) * f32(s) + q3_scale(o, 2u * j + 1u) * f32(s2));
  }
  // q4_0 (f16 d, nibbles, q - 8) / q5_0 (f16 d, 32 high bits, nibbles, q - 16): the bytes turned
  // into q - 8 / q - 16 as signed bytes (flip the top bit of the 4- / 5-bit value, then extend its
  // sign: byte-wise, no carries), so the integer sum holds small products, as q8_0's
  let q5 = {{QK}} == 3u;
  let qo = select(2u, 6u, q5);
  let qh = select(0u, word_at(o + 2u), q5);
  let top = select(0x08080808u, 0x10101010u, q5);
  let ext = select(0x1eu, 0x0fu, q5);          // top bit * ext = 0xf0 (4 bits) / 0xf0 (5 bits)
  for (var i = 0u; i < 4u; i = i + 1u) {
    let q = word_at(o + qo + 4u * i);
    var lo = q & 0x0f0f0f0fu;
    var hi = (q >> 4u) & 0x0f0f0f0fu;
    if (q5) { lo = lo | bit4(qh >> (4u * i)); hi = hi | bit4(qh >> (16u + 4u * i)); }
    lo = lo ^ top;
    hi = hi ^ top;
    lo = lo | ((lo & top) * ext);
    hi = hi | ((hi & top) * ext);
    s = s + dot4I8Packed(lo, xq[xw + i]) + dot4I8Packed(hi, xq[xw + 4u + i]);
  }
  return half_at(o) * xd[xb] * f32(s);
}

@compute @workgroup_size({{WG}})
fn gemv8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) t: u32{{SG_ARGS}}) {
  let sgs = {{SGS}};
  let N = u(1u); let K = u(2u);
  let nb = K / 32u;
  // stage 1: x' quantized per block (and PRO 1: the squares of x summed), in XV rounds of WG
  // vec4s: thread t takes vec4 t of the round (coalesced loads), the 8 threads of a block meet
  // in workgroup memory (wmx, wsm: max |x'| and sum of each vec4), then each packs its own vec4.
  // (One thread per block instead read 128-byte strided rows of x and left half the workgroup
  // idle; the vec4s of all rounds kept in a register array instead ran slower on an H100.)
  var ss = 0.0;
  for (var j = 0u; j < {{XV}}u; j = j + 1u) {
    let e4 = t + j * {{WG}}u;
    let live = e4 < K / 4u;
    var v = vec4<f32>(0.0);
    if (live) {
      if (PRO == 1u) {
        let r = xsum(4u * e4);
        ss = ss + dot(r, r);
        v = r * nw4(4u * e4);
      } else {
        v = xp(4u * e4);
      }
      let a = abs(v);
      wmx[e4] = max(max(a.x, a.y), max(a.z, a.w));
      wsm[e4] = (v.x + v.y) + (v.z + v.w);
    }
    workgroupBarrier();
    if (live) {
      let b8 = e4 & ~7u;
      var mx = 0.0;
      for (var i = 0u; i < 8u; i = i + 1u) { mx = max(mx, wmx[b8 + i]); }
      let inv = select(127.0 / mx, 0.0, mx == 0.0);
      // values 4j..4j+3 of a block go to its word j (elements 0..31 in order, as q8_0 and the
      // nibble halves read them)
      xq[e4] = pack4xI8(vec4<i32>(round(v * inv)));
      if (e4 == b8) {
        var sm = 0.0;
        for (var i = 0u; i < 8u; i = i + 1u) { sm = sm + wsm[b8 + i]; }
        xd[e4 / 8u] = mx / 127.0;
        xs[e4 / 8u] = sm;
      }
    }
  }
  var nrm = 1.0;
  if (PRO == 1u) {
    red[t] = sg_sum(ss, min({{WG}}u, sgs));
    for (var s = {{WG}}u / 2u; s >= min({{WG}}u, sgs); s = s / 2u) {
      workgroupBarrier();
      if (t < s && t % sgs == 0u) { red[t] = red[t] + red[t + s]; }
    }
    nrm = 1.0 / sqrt(workgroupUniformLoad(&red[0]) / f32(K) + bitcast<f32>(u(10u)));
  }
  workgroupBarrier();
  // stage 2
  let grp = t / LANES;
  let lane = t % LANES;
  let row0 = ((wid.x + wid.y * nwg.x) * ({{WG}}u / LANES) + grp) * RB;
  let rbytes = u(3u);
  var acc: array<f32, {{RB}}>;
  if (row0 < N) {
    for (var b = lane; b < nb; b = b + LANES) {
      for (var r = 0u; r < RB; r = r + 1u) {
        acc[r] = acc[r] + block_dot(u(4u) + min(row0 + r, N - 1u) * rbytes + (b / SB) * {{BB}}u, b % SB, b);
      }
    }
  }
  workgroupBarrier();      // (red is reused)
  let span = min(LANES, sgs);
  for (var j = 0u; j < RB; j = j + 1u) { red[j * {{WG}}u + t] = sg_sum(acc[j], span); }
  for (var s = LANES / 2u; s >= span; s = s / 2u) {
    workgroupBarrier();
    if (lane < s && lane % span == 0u) {
      for (var j = 0u; j < RB; j = j + 1u) { red[j * {{WG}}u + t] = red[j * {{WG}}u + t] + red[j * {{WG}}u + t + s]; }
    }
  }
  workgroupBarrier();
  if (lane == 0u) {
    let wrow0 = (wid.x + wid.y * nwg.x) * ({{WG}}u / LANES) * RB;
    for (var r = 0u; r < RB; r = r + 1u) {
      if (row0 + r < N) {
        var v = red[r * {{WG}}u + t] * nrm;
        if (ROPE && row0 + r < u(11u)) {
          let lr = (row0 + r) ^ 1u;                      // the partner row, same workgroup
          let pv = red[((lr - wrow0) % RB) * {{WG}}u + ((lr - wrow0) / RB) * LANES] * nrm;
          let cs = rope_cs(((row0 + r) % (2u * u(12u))) / 2u);
          v = select(v * cs.x + pv * cs.y, v * cs.x - pv * cs.y, (row0 + r) % 2u == 0u);
        }
        if (EPI) { v = v + res_at(row0 + r); }
        out[row0 + r] = v;
      }
    }
  }
}

//// tiled
@group(0) @binding(2) var<storage, read> xin: array<f32>;
@group(0) @binding(3) var<uniform> info: array<vec4<u32>, {{INFO}}>;
fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

// ---- tiled: out (M, N) = x (M, K) @ dequantize(w).T, TM x TN outputs per workgroup -------------
// Per 64-wide slice of k: TM rows of x and TN dequantized weight rows go to workgroup memory
// (the weight tile is decoded once, 8 items per row), then 256 threads (16 x 16) each add up
// (TM/16) x (TN/16) outputs; thread (ty, tx) owns rows ty + 16i and columns tx + 16j, so the
// reads of both tiles are broadcasts or consecutive.
const TK: u32 = 64u;
const TM: u32 = {{TM}}u;
const TN: u32 = {{TN}}u;
var<workgroup> ta: array<f32, {{TA}}>;
var<workgroup> tb: array<f32, {{TB}}>;

@compute @workgroup_size(256)
fn tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let nitems = u(6u);
  let xo = u(5u);
  let m0 = wid.y * TM;
  let n0 = wid.x * TN;
  let tx = t % 16u;
  let ty = t / 16u;
  var acc: array<f32, {{ACC}}>;
  for (var j = 0u; j < (TM / 16u) * (TN / 16u); j = j + 1u) { acc[j] = 0.0; }
  for (var k0 = 0u; k0 < K; k0 = k0 + TK) {
    for (var j = t; j < TM * TK; j = j + 256u) {
      let m = j / TK;
      let k = k0 + j % TK;
      var v = 0.0;
      if (m0 + m < M && k < K) { v = xin[xo + (m0 + m) * K + k]; }
      ta[(j % TK) * TM + m] = v;
    }
    for (var j = t; j < TN * 8u; j = j + 256u) {
      let n = j / 8u;
      let it = item_or_zero(n0 + n, k0 / 8u + j % 8u, N, nitems);
      let a = it.e0 - k0;
      let b = it.e1 - k0;
      for (var c = 0u; c < 4u; c = c + 1u) {
        tb[(a + c) * TN + n] = it.w0[c];
        tb[(b + c) * TN + n] = it.w1[c];
      }
    }
    workgroupBarrier();
    for (var k = 0u; k < TK; k = k + 1u) {
      var bv: array<f32, {{BV}}>;
      for (var jn = 0u; jn < TN / 16u; jn = jn + 1u) { bv[jn] = tb[k * TN + tx + 16u * jn]; }
      for (var im = 0u; im < TM / 16u; im = im + 1u) {
        let av = ta[k * TM + ty + 16u * im];
        for (var jn = 0u; jn < TN / 16u; jn = jn + 1u) {
          acc[im * (TN / 16u) + jn] = acc[im * (TN / 16u) + jn] + av * bv[jn];
        }
      }
    }
    workgroupBarrier();
  }
  for (var im = 0u; im < TM / 16u; im = im + 1u) {
    let m = m0 + ty + 16u * im;
    for (var jn = 0u; jn < TN / 16u; jn = jn + 1u) {
      let n = n0 + tx + 16u * jn;
      if (m < M && n < N) { out[m * N + n] = acc[im * (TN / 16u) + jn]; }
    }
  }
}

//// tiled4
@group(0) @binding(2) var<storage, read> xin: array<f32>;
@group(0) @binding(3) var<uniform> info: array<vec4<u32>, {{INFO}}>;
fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

// ---- tiled4: the tiled product with 64 x 64 tiles, thread (ty, tx) owning the 4 x 4 outputs at
// rows 4ty.., columns 4tx..; both tiles are read from workgroup memory as vec4s (2 loads per 16
// multiply-adds; the scalar `tiled` needs 8), k-major: xs4[k][m / 4], ws4[k][n / 4].
var<workgroup> xs4: array<vec4<f32>, 1024>;
var<workgroup> ws4: array<vec4<f32>, 1024>;

@compute @workgroup_size(256)
fn tiled4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let M = u(0u); let N = u(1u); let K = u(2u);
  let nitems = u(6u);
  let xo = u(5u);
  let m0 = wid.y * 64u;
  let n0 = wid.x * 64u;
  let tx = t % 16u;
  let ty = t / 16u;
  var c0 = vec4<f32>(0.0); var c1 = vec4<f32>(0.0); var c2 = vec4<f32>(0.0); var c3 = vec4<f32>(0.0);
  for (var k0 = 0u; k0 < K; k0 = k0 + 64u) {
    // x tile: 64 rows x 64 k, read along k (coalesced), stored k-major
    for (var j = t; j < 4096u; j = j + 256u) {
      let m = j / 64u;
      let k = k0 + j % 64u;
      var v = 0.0;
      if (m0 + m < M && k < K) { v = xin[xo + (m0 + m) * K + k]; }
      xs4[(j % 64u) * 16u + m / 4u][m % 4u] = v;
    }
    // weight tile: 64 rows x 8 items (64 k), decoded once
    for (var j = t; j < 512u; j = j + 256u) {
      let n = j / 8u;
      let it = item_or_zero(n0 + n, k0 / 8u + j % 8u, N, nitems);
      let a = it.e0 - k0;
      let b = it.e1 - k0;
      for (var c = 0u; c < 4u; c = c + 1u) {
        ws4[(a + c) * 16u + n / 4u][n % 4u] = it.w0[c];
        ws4[(b + c) * 16u + n / 4u][n % 4u] = it.w1[c];
      }
    }
    workgroupBarrier();
    for (var k = 0u; k < 64u; k = k + 1u) {
      let a = xs4[k * 16u + ty];
      let b = ws4[k * 16u + tx];
      c0 = c0 + a.x * b; c1 = c1 + a.y * b; c2 = c2 + a.z * b; c3 = c3 + a.w * b;
    }
    workgroupBarrier();
  }
  let n = n0 + tx * 4u;
  let rows = array<vec4<f32>, 4>(c0, c1, c2, c3);
  for (var i = 0u; i < 4u; i = i + 1u) {
    let m = m0 + ty * 4u + i;
    if (m < M) {
      for (var j = 0u; j < 4u; j = j + 1u) {
        if (n + j < N) { out[m * N + n + j] = rows[i][j]; }
      }
    }
  }
}

//// dequant
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, {{INFO}}>;
fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

// ---- dequant: out (N, K) f32, one thread per item ----------------------------------------------
@compute @workgroup_size({{WG}})
fn dequant(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let g = gid.x + gid.y * nwg.x * {{WG}}u;
  let nitems = u(6u);
  let K = u(2u);
  if (g >= u(1u) * nitems) { return; }
  let row = g / nitems;
  let it = item(u(4u) + row * u(3u), g % nitems);
  for (var c = 0u; c < 4u; c = c + 1u) {
    if (it.e0 + c < K) { out[row * K + it.e0 + c] = it.w0[c]; }
    if (it.e1 + c < K) { out[row * K + it.e1 + c] = it.w1[c]; }
  }
}

//// embed
@group(0) @binding(2) var<storage, read> ids: array<i32>;
@group(0) @binding(3) var<uniform> info: array<vec4<u32>, {{INFO}}>;
fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

// ---- embed: out (M, K) f32 = rows ids[0..M) of the weight; an id outside [0, N) gives zeros
// (the Python side raises first wherever the ids' range is known without reading the GPU).
@compute @workgroup_size({{WG}})
fn embed(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let g = gid.x + gid.y * nwg.x * {{WG}}u;
  let nitems = u(6u);
  let K = u(2u);
  if (g >= u(0u) * nitems) { return; }
  let r = g / nitems;
  let id = ids[u(5u) + r];
  // (a negative id wraps past N: zeros)
  let it = item_or_zero(u32(id), g % nitems, u(1u), nitems);
  for (var c = 0u; c < 4u; c = c + 1u) {
    if (it.e0 + c < K) { out[r * K + it.e0 + c] = it.w0[c]; }
    if (it.e1 + c < K) { out[r * K + it.e1 + c] = it.w1[c]; }
  }
}
