// Llama ops: attention_cached (the KV-cache write and causal grouped-query attention over the
// cache, one dispatch), rms_norm and rope. ember.webgpu.quant fills the template and dispatches.
// Every position comes from the pos buffer at run time (never from Python), so a recorded plan
// replays these dispatches unchanged with a new pos. Rows outside [0, C) are never written.
//
// Template: WIN (attn: a sliding window of WIN rows, 0: none), CAP (attn: the scores' soft cap,
// a statement or nothing), WG (threads), DPT (head dims per thread in attn: ceil(D / WG)), QS (WG * DPT), NS
// (attn: value-row slices, WG / D), KT, KDOT_C, KDOT_N, KIN_AT, KC_SET (keys read and written as
// vec4 or as floats), SPL (attn: workgroups per (query, head), each over one run of its rows;
// 1: the whole attention), RMIN (attn: a run's fewest rows, the later runs left empty), SPLIT
// (true: runs' partial results for attn_comb, SPL of them, even
// 1), ML (SPLIT: the statement storing a run's max and sum), INFO.
// attn_comb: the split attention's second pass. amax_part / amax_fin: greedy_tokens' two passes.
//
// The file is a prelude and one section per entry point ("//// name" lines): ember.webgpu.quant
// compiles the prelude with one section, so each entry declares exactly the bindings it uses
// (layout "auto"; the uniform info comes after the buffers).
#include elementwise

fn u(k: u32) -> u32 { return info[k / 4u][k % 4u]; }

//// attn
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> kc: array<{{KT}}>;   // vec4<f32> where D and the offsets allow
@group(0) @binding(3) var<storage, read_write> vc: array<{{VT}}>;   // vec4<f32> where D and the offsets allow
@group(0) @binding(4) var<storage, read> kin: array<{{KT}}>;
@group(0) @binding(5) var<storage, read> vin: array<{{VT}}>;
@group(0) @binding(6) var<storage, read> posb: array<i32>;
@group(0) @binding({{IB}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;

// q . (a key row starting at element kb of the cache / of the new keys), q pre-scaled in
// workgroup memory; one element of the new keys; a store into the key cache
const HDC: u32 = {{HD}}u;     // the head's dimension D (a constant: a key's loads issue together)
fn kdot_c(kb: u32, D: u32) -> f32 { var s = 0.0; {{KDOT_C}} return s; }
fn kdot_n(kb: u32, D: u32) -> f32 { var s = 0.0; {{KDOT_N}} return s; }
fn kin_at(i: u32) -> f32 { {{KIN_AT}} }
fn kc_set(i: u32, v: f32) { {{KC_SET}} }

// ---- attn: the whole of attention_cached in one dispatch, one workgroup per (query t, head h).
// The write: the first query head of each kv group stores its token's key and value rows at
// cache row pos + t (skipped outside [0, C)). The attention: online softmax over rows 0..pos+t
// (clamped to the cache) of kv head h / (Hq / Hkv); rows before pos come from the cache, rows
// from pos on from the new k, v themselves, so no workgroup reads a row another one is writing
// in this dispatch (and the cache's rows before pos were written by earlier dispatches). Per
// chunk of WG rows each thread scores one row, then the running max, sum and weighted sum of
// value rows (threads over the head dims: neighbouring threads read neighbouring floats) are
// updated. Writes out (T, Hq, D).
// Split over positions (SPLIT, "flash-decoding": few queries leave most of a GPU idle with one
// workgroup per (query, head)): workgroup (t, h, p) takes run p of SPL equal runs of the rows
// lo..pos+t (their length from pos, read here: a run is ceil(rows / SPL) long, runs past the
// end are empty), and stores its unnormalised partial result in out as slot (t Hq + h) SPL + p:
// the weighted value sum (D floats at slot * D) and the run's max m and sum l (at info 12 + 2
// slot; an empty run: m = -inf, l = 0, sum 0). attn_comb merges the runs. The write: by run 0.
// info: 0 T, 1 Hq, 2 Hkv, 3 D, 4 C, 5 scale (f32 bits), 6 q offset, 7 k_cache offset,
//       8 v_cache offset, 9 pos offset, 10 k offset, 11 v offset, 12 (SPLIT) where the runs'
//       (m, l) pairs start in out
var<workgroup> qsh: array<f32, {{QS}}>;
var<workgroup> ssh: array<f32, {{WG}}>;     // a chunk's scores, then its weights exp(s - max)
var<workgroup> rsh: array<f32, {{WG}}>;     // tree reductions (the chunk's max, its sum)
var<workgroup> ash: array<{{VV}}, {{WG}}>;     // NS > 1: each slice's output rows, summed at the end
var<workgroup> wpos: i32;

// The head's output, element d of query row `row` (attention_cached: into out; attention_proj:
// into workgroup memory, for the projection after it)
fn emit(row: u32, d: u32, v: f32) { {{EMIT}} }

// PROJ (attention_proj): binding 7 the output projection's raw blocks (wq), its decoding, and
// proj(): out (Hq, T, n) = the head's output (in qsh) times the head's slice of every weight row.
// info 12 n, 13 the weight's byte offset, 14 bytes per row; the head's D elements are the items
// [h D / 8, (h + 1) D / 8) of a row (D a multiple of 64, or of 32 in a 32-block format). A
// thread per weight row, its items' loads independent; no reduction.
{{PROJ}}

// NS > 1 (D <= WG / 2): the value rows of a chunk are split between NS slices of D / VW threads
// (thread t: slice t / (D / VW), head dims VW (t % (D / VW)) on, VW = 4: as one vec4), each slice
// summing its share of the rows, 8 rows' loads issued together; NS = 1: a thread per head dim (DPT
// dims per thread), all rows of the chunk. (vec4 values: 4x the slices, so a slice's rows take a
// quarter of the dependent rounds of loads.)
const NS: u32 = {{NS}}u;
const VW: u32 = {{VW}}u;

// The workgroup's max / sum of rsh[t]: first across runs of min(WG, subgroup size) threads by
// subgroup shuffles (adapters with subgroups; else runs of 1), then a tree over the runs.
{{SG_SUM}}
fn tree_max(t: u32, sgs: u32) -> f32 {
  let span = min({{WG}}u, sgs);
  rsh[t] = sg_max(rsh[t], span);
  for (var w = {{WG}}u / 2u; w >= span; w = w / 2u) {
    workgroupBarrier();
    if (t < w && t % span == 0u) { rsh[t] = max(rsh[t], rsh[t + w]); }
  }
  return workgroupUniformLoad(&rsh[0]);
}
fn tree_sum(t: u32, sgs: u32) -> f32 {
  let span = min({{WG}}u, sgs);
  rsh[t] = sg_sum(rsh[t], span);
  for (var w = {{WG}}u / 2u; w >= span; w = w / 2u) {
    workgroupBarrier();
    if (t < w && t % span == 0u) { rsh[t] = rsh[t] + rsh[t + w]; }
  }
  return workgroupUniformLoad(&rsh[0]);
}

// sum of ssh[c] * (value row j0 + c, head dim d) over chunk rows c0 .. c1: rows before pos from the
// cache (vo: its offset for this kv head), rows from pos on from the new v (vno)
// (VW = 4: vo, vno, rs and d count vec4s)
fn vsum(a0: {{VV}}, j0: u32, c0: u32, c1: u32, pos: i32, d: u32, vo: u32, vno: u32, rs: u32) -> {{VV}} {
  var a = a0;
  let nc = u32(clamp(pos - i32(j0), i32(c0), i32(c1)));
  var c = c0;
  for (; c + 8u <= nc; c = c + 8u) {
    let b = vo + (j0 + c) * rs + d;
    let v0 = vc[b]; let v1 = vc[b + rs]; let v2 = vc[b + 2u * rs]; let v3 = vc[b + 3u * rs];
    let v4 = vc[b + 4u * rs]; let v5 = vc[b + 5u * rs]; let v6 = vc[b + 6u * rs]; let v7 = vc[b + 7u * rs];
    a = a + (ssh[c] * v0 + ssh[c + 1u] * v1) + (ssh[c + 2u] * v2 + ssh[c + 3u] * v3)
          + (ssh[c + 4u] * v4 + ssh[c + 5u] * v5) + (ssh[c + 6u] * v6 + ssh[c + 7u] * v7);
  }
  for (; c < nc; c = c + 1u) { a = a + ssh[c] * vc[vo + (j0 + c) * rs + d]; }
  for (; c < c1; c = c + 1u) { a = a + ssh[c] * vin[vno + u32(i32(j0 + c) - pos) * rs + d]; }
  return a;
}

@compute @workgroup_size({{WG}})
fn attn(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32{{SG_ARGS}}) {
  let sgs = {{SGS}};
  let g = wid.x + wid.y * nwg.x;
  let row = g / {{SPL}}u;       // (query, head)
  let sp = g % {{SPL}}u;        // its run of rows
  let Hq = u(1u); let Hkv = u(2u); let D = u(3u); let C = u(4u);
  if (row >= u(0u) * Hq) { return; }
  let tq = row / Hq;
  let G = Hq / Hkv;
  let hk = (row % Hq) / G;
  // (q first: its loads need no position, so they overlap the wait for pos)
  let scale = bitcast<f32>(u(5u));
  for (var d = t; d < D; d = d + {{WG}}u) { qsh[d] = q[u(6u) + row * D + d] * scale; }
  // the new key and value rows this workgroup writes (the first head of each kv group, run 0):
  // loaded here too, so their stores below wait for nothing but pos
  let writer = (row % Hq) % G == 0u && sp == 0u;
  let src = (tq * Hkv + hk) * D;
  var kn: array<f32, {{DPT}}>;
  var vn: array<{{VT}}, {{DPT}}>;
  if (writer) {
    for (var i = 0u; i < {{DPT}}u; i = i + 1u) {
      let d = t + i * {{WG}}u;
      if (d < D) { kn[i] = kin_at(u(10u) + src + d); }
      if (d < D / VW) { vn[i] = vin[(u(11u) + src) / VW + d]; }
    }
  }
  if (t == 0u) { wpos = posb[u(9u)]; }
  let pos = workgroupUniformLoad(&wpos);
  let rs = Hkv * D;
  let r = pos + i32(tq);
  if (writer && r >= 0 && r < i32(C)) {
    let dst = u32(r) * rs + hk * D;
    for (var i = 0u; i < {{DPT}}u; i = i + 1u) {
      let d = t + i * {{WG}}u;
      if (d < D) { kc_set(u(7u) + dst + d, kn[i]); }
      if (d < D / VW) { vc[(u(8u) + dst) / VW + d] = vn[i]; }
    }
  }
  let S = u32(clamp(pos + i32(tq) + 1, 0, i32(C)));
  // WIN > 0 (a template constant): a sliding window, rows pos+t-WIN+1 .. pos+t only
  let lo = select(0u, u32(clamp(pos + i32(tq) + 1 - {{WIN}}, 0, i32(S))), {{WIN}} > 0);
  // this workgroup's run of those rows: jlo .. jhi (SPL 1: all of them)
  // (RMIN: runs of at least that many rows, so a short prefix of a long cache keeps few runs busy)
  let rl = max({{RMIN}}u, (S - lo + {{SPL}}u - 1u) / {{SPL}}u);
  let jlo = min(S, lo + sp * rl);
  let jhi = min(S, jlo + rl);
  var m = -f_inf();
  var l = 0.0;
  let orow = row * {{SPL}}u + sp;
  if ({{SPLIT}} && jlo == jhi) {      // an empty run: zeros, m = -inf, l = 0, and no reductions
    for (var d = t; d < D; d = d + {{WG}}u) { emit(orow, d, 0.0); }
    {{ML}}
    return;
  }
  var acc: array<f32, {{DPT}}>;
  for (var c = 0u; c < {{DPT}}u; c = c + 1u) { acc[c] = 0.0; }
  let ko = u(7u) + hk * D;
  let vo = u(8u) + hk * D;
  // row j >= pos is new token j - pos: element e at (j - pos) * rs + hk * D + e of k / v
  let kno = u(10u) + hk * D;
  let vno = u(11u) + hk * D;
  let sl = t / (D / VW);
  var accv = {{VV}}(0.0);
  for (var j0 = jlo; j0 < jhi; j0 = j0 + {{WG}}u) {
    let j = j0 + t;
    var s = -f_inf();
    if (j < jhi) {
      if (i32(j) >= pos) {
        s = kdot_n(kno + u32(i32(j) - pos) * rs, D);
      } else {
        s = kdot_c(ko + j * rs, D);
      }
      {{CAP}}
    }
    rsh[t] = s;
    let mx = max(m, tree_max(t, sgs));
    // the first chunk has m = -inf: its correction multiplies zeros
    let corr = select(exp(m - mx), 0.0, m == -f_inf());
    let p = select(0.0, exp(s - mx), j < jhi);
    ssh[t] = p;
    workgroupBarrier();
    rsh[t] = p;
    l = l * corr + tree_sum(t, sgs);
    let cnt = min({{WG}}u, jhi - j0);
    if (NS > 1u) {
      if (sl < NS) {
        let per = (cnt + NS - 1u) / NS;
        let c0 = min(cnt, sl * per);
        accv = vsum(accv * corr, j0, c0, min(cnt, c0 + per), pos, t % (D / VW), vo / VW, vno / VW, rs / VW);
      }
    } else {
      {{VSUM1}}
    }
    m = mx;
    workgroupBarrier();     // (ssh and rsh are rewritten by the next chunk)
  }
  // (no rows, l = 0: zeros. SPLIT: the run's sums as they are, in slot orow)
  let inv = select(select(1.0 / l, 0.0, l == 0.0), 1.0, {{SPLIT}});
  if (NS > 1u) {
    if (sl < NS) { ash[t] = accv; }
    workgroupBarrier();
    if (t < D / VW) {
      var a = {{VV}}(0.0);
      for (var k = 0u; k < NS; k = k + 1u) { a = a + ash[k * (D / VW) + t]; }
      {{VEMIT}}
    }
  } else {
    for (var dd = 0u; dd < {{DPT}}u; dd = dd + 1u) {
      let d = t + dd * {{WG}}u;
      if (d < D) { emit(orow, d, acc[dd] * inv); }
    }
  }
  {{ML}}
  {{TAIL}}
}

//// attn_comb
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding({{IB}}) var<uniform> info: array<vec4<u32>, {{INFO}}>;

// ---- attn_comb: the split attention's second pass, workgroup (row = t Hq + h, block b): the
// SPL runs' partial results of attn (slots row SPL + p of part) merged into the head's output,
// m = max m_p, l = sum l_p e^(m_p - m), out = sum acc_p e^(m_p - m) / l (empty runs, m_p =
// -inf, weigh 0). attention_cached: out (T, Hq, D), one block. attention_proj (PROJ): the
// output into workgroup memory, then block b of the projection's weight rows as attn's PROJ
// tail, NB blocks per head. info: attn's (12: the (m, l) pairs' start in part), 13.. PROJ's.
#include wg_reduce
var<workgroup> qsh: array<f32, {{QS}}>;
var<workgroup> wsh: array<f32, {{SPL}}>;    // run p's max, then its weight e^(m_p - m)
var<workgroup> lsh: array<f32, {{SPL}}>;    // run p's sum
const SPL: u32 = {{SPL}}u;
fn emit(row: u32, d: u32, v: f32) { {{EMIT}} }
{{PROJ}}

@compute @workgroup_size({{WG}})
fn attn_comb(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) t: u32) {
  let g = wid.x + wid.y * nwg.x;
  let row = g / {{NB}}u;
  let blk = g % {{NB}}u;
  let D = u(3u);
  if (row >= u(0u) * u(1u)) { return; }
  // The runs' (m, l) pairs: a run per thread (loads issued together, into workgroup memory), the
  // max and the sum by workgroup trees. (Each thread looping over every run, its weights in a
  // private array, took 20 us on an H100 for 28 runs: one memory latency per run.)
  let ml = u(12u) + 2u * row * SPL;
  var mloc = -f_inf();
  for (var p = t; p < SPL; p = p + {{WG}}u) {
    let mp = part[ml + 2u * p];
    lsh[p] = part[ml + 2u * p + 1u];
    wsh[p] = mp;
    mloc = max(mloc, mp);
  }
  let mx = wg_max(t, mloc);
  var lloc = 0.0;
  for (var p = t; p < SPL; p = p + {{WG}}u) {
    let w = select(exp(wsh[p] - mx), 0.0, wsh[p] == -f_inf());     // the run's max -> its weight
    wsh[p] = w;
    lloc = lloc + lsh[p] * w;
  }
  let l = wg_sum(t, lloc);          // (its barriers also publish wsh's weights)
  let inv = select(1.0 / l, 0.0, l == 0.0);
  // a head dim per thread, the runs' loads four at a time, independent of each other
  for (var d = t; d < D; d = d + {{WG}}u) {
    let b = row * SPL * D + d;
    var a0 = 0.0; var a1 = 0.0; var a2 = 0.0; var a3 = 0.0;
    var p = 0u;
    for (; p + 4u <= SPL; p = p + 4u) {
      let x0 = part[b + p * D]; let x1 = part[b + (p + 1u) * D];
      let x2 = part[b + (p + 2u) * D]; let x3 = part[b + (p + 3u) * D];
      a0 = a0 + x0 * wsh[p]; a1 = a1 + x1 * wsh[p + 1u]; a2 = a2 + x2 * wsh[p + 2u]; a3 = a3 + x3 * wsh[p + 3u];
    }
    for (; p < SPL; p = p + 1u) { a0 = a0 + part[b + p * D] * wsh[p]; }
    emit(row, d, ((a0 + a1) + (a2 + a3)) * inv);
  }
  {{TAIL}}
}

//// rms_norm
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<uniform> info: array<vec4<u32>, {{INFO}}>;
#include wg_reduce

// ---- rms_norm: out (rows, D) = x / sqrt(mean(x * x) + eps) * w, one workgroup per row
// info: 0 rows, 1 D, 2 eps (f32 bits), 3 x offset, 4 w offset

@compute @workgroup_size({{WG}})
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) t: u32) {
  let r = wid.x + wid.y * nwg.x;
  if (r >= u(0u)) { return; }
  let D = u(1u);
  let xb = u(3u) + r * D;
  var s = 0.0;
  for (var d = t; d < D; d = d + {{WG}}u) { let v = x[xb + d]; s = s + v * v; }
  let total = wg_sum(t, s);
  let inv = 1.0 / sqrt(total / f32(D) + bitcast<f32>(u(2u)));
  for (var d = t; d < D; d = d + {{WG}}u) { out[r * D + d] = x[xb + d] * inv * w[u(4u) + d]; }
}

//// rope
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> cs: array<f32>;
@group(0) @binding(3) var<storage, read> sn: array<f32>;
@group(0) @binding(4) var<uniform> info: array<vec4<u32>, {{INFO}}>;

// ---- rope: out (T, H, D) = x rotated by (cos, sin) (T, D/2); mode 0 "pairs" rotates
// (x[2i], x[2i+1]), mode 1 "halves" rotates (x[i], x[i + D/2]). One thread per pair.
// info: 0 pairs (T * H * D/2), 1 H, 2 D/2, 3 mode, 4 x offset, 5 cos offset, 6 sin offset
@compute @workgroup_size({{WG}})
fn rope(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let g = gid.x + gid.y * nwg.x * {{WG}}u;
  if (g >= u(0u)) { return; }
  let half = u(2u);
  let i = g % half;
  let th = g / half;                // t * H + h
  let tt = th / u(1u);
  let base = th * 2u * half;
  var ia = base + 2u * i;
  var ib = ia + 1u;
  if (u(3u) == 1u) { ia = base + i; ib = base + i + half; }
  let c = cs[u(5u) + tt * half + i];
  let s = sn[u(6u) + tt * half + i];
  let x0 = x[u(4u) + ia];
  let x1 = x[u(4u) + ib];
  out[ia] = x0 * c - x1 * s;
  out[ib] = x0 * s + x1 * c;
}

//// amax_part
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, {{INFO}}>;
#include amax_common

// ---- greedy_tokens, pass 1: workgroup (row r, part g) finds the first largest of elements
// [g * CH, (g + 1) * CH) of row r (NaN counting as the largest), stored as (value bits, index)
// at out[2 * (r * G + g)]. info: 0 rows, 1 n, 2 G (parts per row), 3 CH, 4 x offset
@compute @workgroup_size({{WG}})
fn amax_part(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) t: u32) {
  let o = wid.x + wid.y * nwg.x;
  let valid = o < u(0u) * u(2u);
  let r = o / u(2u);
  let g = o % u(2u);
  var bv = 0.0;
  var bi = NONE;
  if (valid) {
    let e1 = min(u(1u), (g + 1u) * u(3u));
    for (var e = g * u(3u) + t; e < e1; e = e + {{WG}}u) {
      let v = x[u(4u) + r * u(1u) + e];
      if (better(v, e, bv, bi)) { bv = v; bi = e; }
    }
  }
  let w = amax_tree(t, bv, bi);
  if (valid && t == 0u) { out[2u * o] = bitcast<u32>(w.x); out[2u * o + 1u] = bitcast<u32>(w.y); }
}

//// amax_fin
@group(0) @binding(0) var<storage, read_write> out: array<i32>;
@group(0) @binding(1) var<storage, read> part: array<u32>;
@group(0) @binding(2) var<uniform> info: array<vec4<u32>, {{INFO}}>;
#include amax_common

// ---- greedy_tokens, pass 2: one workgroup per row reduces its G (value, index) pairs
@compute @workgroup_size({{WG}})
fn amax_fin(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) t: u32) {
  let r = wid.x + wid.y * nwg.x;
  let valid = r < u(0u);
  var bv = 0.0;
  var bi = NONE;
  if (valid) {
    for (var g = t; g < u(2u); g = g + {{WG}}u) {
      let k = 2u * (r * u(2u) + g);
      let v = bitcast<f32>(part[k]);
      let i = part[k + 1u];
      if (better(v, i, bv, bi)) { bv = v; bi = i; }
    }
  }
  let w = amax_tree(t, bv, bi);
  if (valid && t == 0u) { out[r] = i32(bitcast<u32>(w.y)); }
}
