// scaled_dot_product_attention for many query rows (encoders: BERT and the like), one workgroup
// per block of BQ query rows of one (batch, head): the block's q rows are loaded into shared memory
// once, then the keys are walked in tiles of BK rows, each tile of k and v loaded into shared
// memory ONCE for the whole block (the per-row kernel, attention.wgsl, reads every key and value
// row once per query row: L times as much global traffic).
// Softmax: online ("flash" style), a running max m and sum l per query row, the accumulated
// output rescaled by exp(m_old - m_new) when a tile raises the max. Chosen over keeping the
// block's BQ x S scores in shared memory because it needs no bound on S (shared memory is
// BQ x BK whatever S is: a 16 KB device still fits a block, long sequences need no fallback) and
// costs the same exps; the rescale is one multiply per output element per tile (1/BK of the
// p @ v work).
// Threads: 64 as 8 x 8 (ty = t / 8, tx = t % 8). Thread (ty, tx) owns query rows ty + 8 i
// (i < RQ = BQ / 8) in every phase: its scores are keys tx + 8 c (c < KT = BK / 8) of the tile,
// its output columns the vec4 columns tx + 8 n (n < NV). Owning the same rows in the scores and
// in the p @ v phase keeps m (shared by the 8 threads of a row, each computing it alike from the
// same partials) and the thread's part of l in registers; only the tile's row max goes through
// shared memory, and l's 8 parts once at the end. Reductions are in a fixed order
// (deterministic). Shared rows are padded by one vec4 so the 4 row / 8 key reads of a warp fall
// in distinct banks.
// Rows whose keys are all masked give zeros (m stays -inf, as attention.wgsl's dead rows);
// NaN scores give NaN rows. Output heads-interleaved as in attention.wgsl.
// info: the layout of attention.wgsl (0 rows = batch * L, 1 L, 2 S, 3 E, 4 Ev, 5 mask kind,
//       6 causal, 7 scale bits, q 8.. (11: H), k 12.., v 16.., mask 20.., 24.. batch shape and
//       strides); workgroups: batch * ceil(L / BQ).
// Template: RANK, INFO, BQ (16 or 32), BK (16 or 32), EQ (E rounded up to 4), NV (vec4 output
// columns per thread: ceil(Ev / 32)).
#include attention_io

const BQ = {{BQ}}u;
const BK = {{BK}}u;
const RQ = {{BQ}}u / 8u;
const KT = {{BK}}u / 8u;
const NV = {{NV}}u;
const E4 = {{EQ}}u / 4u;
const QW = {{EQ}}u / 4u + 1u;    // vec4s per q / k row (one of padding)
const VW = {{NV}}u * 8u;         // vec4s per v row (Ev rounded up to 32: the columns of 8 threads)
const PW = {{BK}}u / 4u + 1u;    // vec4s per probability row

var<workgroup> Qs: array<vec4<f32>, {{BQ}} * QW>;
var<workgroup> Ks: array<vec4<f32>, {{BK}} * QW>;
var<workgroup> Vs: array<vec4<f32>, {{BK}} * VW>;
var<workgroup> Ps: array<vec4<f32>, {{BQ}} * PW>;
var<workgroup> Pm: array<vec4<f32>, {{BQ}} * 2>;   // per row, the 8 threads' partial max (then sum)

// 4 elements of a row from e4 * 4 on, zeros past n (the padding of E or Ev).
fn row4_q(base: u32, cs: u32, e4: u32, n: u32) -> vec4<f32> {
  var r = vec4<f32>();
  for (var c = 0u; c < 4u; c = c + 1u) { let e = e4 * 4u + c; if (e < n) { r[c] = q[base + e * cs]; } }
  return r;
}
fn row4_k(base: u32, cs: u32, e4: u32, n: u32) -> vec4<f32> {
  var r = vec4<f32>();
  for (var c = 0u; c < 4u; c = c + 1u) { let e = e4 * 4u + c; if (e < n) { r[c] = k[base + e * cs]; } }
  return r;
}
fn row4_v(base: u32, cs: u32, e4: u32, n: u32) -> vec4<f32> {
  var r = vec4<f32>();
  for (var c = 0u; c < 4u; c = c + 1u) { let e = e4 * 4u + c; if (e < n) { r[c] = v[base + e * cs]; } }
  return r;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let L = u(1u); let S = u(2u); let E = u(3u); let Ev = u(4u);
  let nb = (L + BQ - 1u) / BQ;
  let blk = wid.x + wid.y * nwg.x;
  if (blk >= (u(0u) / L) * nb) { return; }
  let b = blk / nb;
  let l0 = (blk % nb) * BQ;
  let tx = t % 8u; let ty = t / 8u;
  var qo = u(8u); var ko = u(12u); var vo = u(16u); var mo = u(20u);
  var rem = b;
  for (var d = {{RANK}} - 1; d >= 0; d = d - 1) {
    let n = u(24u + u32(d));
    let i = rem % n;
    rem = rem / n;
    qo = qo + i * u(24u + {{RANK}}u + u32(d));
    ko = ko + i * u(24u + 2u * {{RANK}}u + u32(d));
    vo = vo + i * u(24u + 3u * {{RANK}}u + u32(d));
    mo = mo + i * u(24u + 4u * {{RANK}}u + u32(d));
  }
  let kind = u(5u);
  let causal = u(6u) != 0u;
  let scale = bitcast<f32>(u(7u));

  // the block's q rows (zeros past L and past E)
  for (var i = t; i < BQ * E4; i = i + 64u) {
    let r = i / E4; let e4 = i % E4;
    var x = vec4<f32>();
    if (l0 + r < L) { x = row4_q(qo + (l0 + r) * u(9u), u(10u), e4, E); }
    Qs[r * QW + e4] = x;
  }

  var m: array<f32, RQ>;
  var lp: array<f32, RQ>;                 // this thread's part of the row sums
  var o: array<vec4<f32>, RQ * NV>;
  for (var i = 0u; i < RQ; i = i + 1u) { m[i] = -f_inf(); lp[i] = 0.0; }
  for (var i = 0u; i < RQ * NV; i = i + 1u) { o[i] = vec4<f32>(); }
  // causal: keys past the block's last row are masked for every row of the block
  var kend = S;
  if (causal) { kend = min(S, l0 + BQ); }

  for (var k0 = 0u; k0 < kend; k0 = k0 + BK) {
    // 1. the tile's k and v rows (zeros past S)
    for (var i = t; i < BK * E4; i = i + 64u) {
      let r = i / E4; let e4 = i % E4;
      var x = vec4<f32>();
      if (k0 + r < S) { x = row4_k(ko + (k0 + r) * u(13u), u(14u), e4, E); }
      Ks[r * QW + e4] = x;
    }
    for (var i = t; i < BK * VW; i = i + 64u) {
      let r = i / VW; let e4 = i % VW;
      var x = vec4<f32>();
      if (k0 + r < S) { x = row4_v(vo + (k0 + r) * u(17u), u(18u), e4, Ev); }
      Vs[r * VW + e4] = x;
    }
    workgroupBarrier();
    // 2. scores of rows ty + 8 i, keys tx + 8 c; scale, mask, causal; the rows' partial max
    var s: array<f32, RQ * KT>;
    for (var i = 0u; i < RQ * KT; i = i + 1u) { s[i] = 0.0; }
    for (var e4 = 0u; e4 < E4; e4 = e4 + 1u) {
      var kv: array<vec4<f32>, KT>;
      for (var c = 0u; c < KT; c = c + 1u) { kv[c] = Ks[(tx + 8u * c) * QW + e4]; }
      for (var i = 0u; i < RQ; i = i + 1u) {
        let qv = Qs[(ty + 8u * i) * QW + e4];
        for (var c = 0u; c < KT; c = c + 1u) { s[i * KT + c] = s[i * KT + c] + dot(qv, kv[c]); }
      }
    }
    for (var i = 0u; i < RQ; i = i + 1u) {
      let l = min(l0 + ty + 8u * i, L - 1u);    // rows past L: any real row's mask (not stored)
      var mx = -f_inf();
      for (var c = 0u; c < KT; c = c + 1u) {
        let j = k0 + tx + 8u * c;
        var x = s[i * KT + c] * scale;
        if (j >= S || (causal && j > l)) {
          x = -f_inf();
        } else if (kind == 1u) {
          if (mask[mo + l * u(21u) + j * u(22u)] == 0u) { x = -f_inf(); }
        } else if (kind == 2u) {
          x = x + bitcast<f32>(mask[mo + l * u(21u) + j * u(22u)]);
        }
        s[i * KT + c] = x;
        mx = max_f32(mx, x);
      }
      Pm[(ty + 8u * i) * 2u + tx / 4u][tx % 4u] = mx;
    }
    workgroupBarrier();
    // 3. the rows' new max (the 8 partials in a fixed order), p = exp(s - m), rescaled outputs
    for (var i = 0u; i < RQ; i = i + 1u) {
      let r = ty + 8u * i;
      let a = Pm[r * 2u]; let bb = Pm[r * 2u + 1u];
      let mt = max_f32(max_f32(max_f32(a.x, a.y), max_f32(a.z, a.w)),
                       max_f32(max_f32(bb.x, bb.y), max_f32(bb.z, bb.w)));
      let mn = max_f32(m[i], mt);
      let mu = select(mn, 0.0, mn == -f_inf());   // all masked so far: p = 0, not exp(-inf + inf)
      let alpha = exp_f32(m[i] - mu);
      m[i] = mn;
      var ps = 0.0;
      for (var c = 0u; c < KT; c = c + 1u) {
        let p = exp_f32(s[i * KT + c] - mu);
        let key = tx + 8u * c;
        Ps[r * PW + key / 4u][key % 4u] = p;
        ps = ps + p;
      }
      lp[i] = lp[i] * alpha + ps;
      for (var n = 0u; n < NV; n = n + 1u) { o[i * NV + n] = o[i * NV + n] * alpha; }
    }
    workgroupBarrier();
    // 4. o += p @ v over the tile's keys
    for (var j4 = 0u; j4 < BK / 4u; j4 = j4 + 1u) {
      var pv: array<vec4<f32>, RQ>;
      for (var i = 0u; i < RQ; i = i + 1u) { pv[i] = Ps[(ty + 8u * i) * PW + j4]; }
      for (var c = 0u; c < 4u; c = c + 1u) {
        for (var n = 0u; n < NV; n = n + 1u) {
          let vv = Vs[(j4 * 4u + c) * VW + tx + 8u * n];
          for (var i = 0u; i < RQ; i = i + 1u) { o[i * NV + n] = o[i * NV + n] + pv[i][c] * vv; }
        }
      }
    }
    workgroupBarrier();
  }

  // the row sums from the 8 threads' parts (fixed order), then the normalised rows
  for (var i = 0u; i < RQ; i = i + 1u) { Pm[(ty + 8u * i) * 2u + tx / 4u][tx % 4u] = lp[i]; }
  workgroupBarrier();
  let H = u(11u);
  for (var i = 0u; i < RQ; i = i + 1u) {
    let r = ty + 8u * i;
    let l = l0 + r;
    if (l >= L) { continue; }
    let a = Pm[r * 2u]; let bb = Pm[r * 2u + 1u];
    var total = ((a.x + a.y) + (a.z + a.w)) + ((bb.x + bb.y) + (bb.z + bb.w));
    if (m[i] == -f_inf()) { total = 1.0; }     // every key masked: zeros
    let inv = 1.0 / total;
    let orow = ((b / H) * L + l) * H + b % H;
    for (var n = 0u; n < NV; n = n + 1u) {
      let x = o[i * NV + n] * inv;
      let e0 = (tx + 8u * n) * 4u;
      for (var c = 0u; c < 4u; c = c + 1u) {
        if (e0 + c < Ev) { out[orow * Ev + e0 + c] = x[c]; }
      }
    }
  }
}
