/* scaled_dot_product_attention in float32, fused: per batch, scores = q · k^T (a GEMM into
 * Python's scratch), then scale, mask and softmax row by row in place, then out = p · v (a GEMM).
 * The decomposition it replaces (nnops._dec_sdpa) makes a dozen passes over the scores through
 * Python; here they stay in cache between the two products.
 *
 * Semantics follow the decomposition: s = (q k^T) * scale; a bool mask sets s = -inf where it is
 * false, a float mask is added; is_causal hides keys j > i; a row whose keys are all -inf gives
 * zeros; NaN or +inf in a row gives a NaN row (as softmax does). */
#include "ember.h"
#include "linalg.h"
#include "mathf.h"
#include "team.h"

/* prm: sizes, then the per-batch offset tables (elements) */
enum { AT_L, AT_S, AT_E, AT_EV, AT_NB, AT_MASK, AT_MSL, AT_MSS, AT_CAUSAL, AT_NPARAMS };
enum { MASK_NONE = 0, MASK_BOOL = 1, MASK_FLOAT = 2 };

/* exp(d) for d = x - max <= 0, with results below float32's smallest normal (d < -87) as 0: the
 * subnormals exp would produce there are under 1.2e-38 (no difference at any tolerance), but on
 * x86 every operation with a subnormal result takes a slow microcode path, and masked keys (-inf)
 * made a quarter of a padded batch's softmax that slow. */
INLINE f32x4 exp_flushed(f32x4 d) {
  const f32x4 lo = F4(-87.f);
  const f32x4 e = exp4(wasm_f32x4_max(d, lo));
  return wasm_v128_andnot(e, wasm_f32x4_lt(d, lo));   /* NaN: lt is false, the NaN stays */
}

/* One row of scores in place: scale, mask, softmax. bm / fm: the row's mask, or 0, with stride
 * ms (0: one value for the row, 1: one per key); keys past `last` are hidden (causal). */
static void softmax_row_masked(f32 *x, i32 n, f32 scale, const unsigned char *bm, const f32 *fm, i32 ms,
                               i32 last) {
  const f32 ninf = -__builtin_inff();
  const f32x4 vscale = F4(scale), vninf = F4(ninf);
  f32x4 vmax = vninf;
  i32 j = 0;
  for (; j + 4 <= n; j += 4) {
    f32x4 v = wasm_f32x4_mul(wasm_v128_load(x + j), vscale);
    if (fm) v = wasm_f32x4_add(v, ms ? wasm_v128_load(fm + j) : F4(fm[0]));
    if (bm) {
      /* four bool bytes -> four lanes */
      const v128_t b8 = ms ? wasm_v128_load32_zero(bm + j) : wasm_i8x16_splat(bm[0]);
      const v128_t keep = wasm_u32x4_extend_low_u16x8(wasm_u16x8_extend_low_u8x16(b8));
      v = sel(wasm_i32x4_ne(keep, I4(0)), v, vninf);
    }
    if (j + 3 > last) v = sel(wasm_i32x4_gt(wasm_i32x4_add(I4(j), wasm_i32x4_make(0, 1, 2, 3)), I4(last)), vninf, v);
    wasm_v128_store(x + j, v);
    vmax = wasm_f32x4_max(vmax, v);   /* NaN wins */
  }
  f32 m = hmax(vmax);
  for (; j < n; j++) {
    f32 v = x[j] * scale;
    if (fm) v += fm[j * ms];
    if ((bm && !bm[j * ms]) || j > last) v = ninf;
    x[j] = v;
    m = (v > m || v != v) ? v : m;
  }
  if (m == ninf) {   /* every key hidden: zeros, as PyTorch gives */
    for (j = 0; j < n; j++) x[j] = 0.f;
    return;
  }
  const f32x4 vm = F4(m);
  f32x4 acc = F4(0.f);
  for (j = 0; j + 4 <= n; j += 4) {
    const f32x4 e = exp_flushed(wasm_f32x4_sub(wasm_v128_load(x + j), vm));
    wasm_v128_store(x + j, e);
    acc = wasm_f32x4_add(acc, e);
  }
  f32 sum = hsum(acc);
  if (j < n) {
    const f32x4 e = exp_flushed(wasm_f32x4_sub(load_part(x + j, n - j), vm));
    store_part(x + j, e, n - j);
    for (i32 q = j; q < n; q++) sum += x[q];
  }
  const f32x4 vs = F4(sum);
  for (j = 0; j + 4 <= n; j += 4) wasm_v128_store(x + j, wasm_f32x4_div(wasm_v128_load(x + j), vs));
  for (; j < n; j++) x[j] = x[j] / sum;
}

/* q (.., L, E), k (.., S, E), v (.., S, Ev) -> out (nb, L, Ev). scratch: L*S scores, then room for
 * k or v in packed panels (max of panels(E, S) and panels(S, Ev) floats). mask: bytes or floats. */
/* One thread's share (team.h): whole batches (heads), each thread's scores and panels in its own
 * scratch. */
void sdpa_f32_team(const f32 *q, const f32 *k, const f32 *v, const void *mask, f32 *out, f32 *scratch,
                   const i32 *prm, f32 scale, i32 *ctl, i32 tid, i32 nt) {
  const i32 L = prm[AT_L], S = prm[AT_S], E = prm[AT_E], Ev = prm[AT_EV], nb = prm[AT_NB];
  const i32 mkind = prm[AT_MASK], msl = prm[AT_MSL], mss = prm[AT_MSS], causal = prm[AT_CAUSAL];
  const i32 *qoff = prm + AT_NPARAMS, *koff = qoff + nb, *voff = koff + nb, *moff = voff + nb;
  i32 width = team_width(ctl, nt, (i64)L * S * (E + Ev) * nb), b0, b1;
  if (width > nb) width = nb;
  team_range(nb, 1, tid, width, &b0, &b1);
  if (width > 1) scratch = (f32 *)team_scratch(ctl, tid, scratch);
  f32 *sc = scratch, *pk = scratch + L * S;
  /* few query rows: dot products with k's rows and v read in place; many: pack k and v */
  const i32 pack = L > 16;
  for (i32 b = b0; b < b1; b++) {
    const f32 *qb = q + qoff[b], *kb = k + koff[b], *vb = v + voff[b];
    if (pack) {
      gemm_pack_cols(kb, E, pk, E, S);
      gemm_packed_one(qb, E, pk, sc, S, L, S, E, 0, 0);
    } else {
      gemm_dot_one(qb, E, kb, E, sc, S, L, S, E, 0, 0);
    }
    for (i32 i = 0; i < L; i++) {
      const unsigned char *bm = 0;
      const f32 *fm = 0;
      if (mkind == MASK_BOOL) bm = (const unsigned char *)mask + moff[b] + i * msl;
      if (mkind == MASK_FLOAT) fm = (const f32 *)mask + moff[b] + i * msl;
      softmax_row_masked(sc + i * S, S, scale, bm, fm, mss, causal ? i : S);
    }
    f32 *ob = out + b * L * Ev;
    if (pack) {
      gemm_pack_rows(vb, Ev, pk, S, Ev);
      gemm_packed_one(sc, S, pk, ob, Ev, L, Ev, S, 0, 0);
    } else {
      const i32 full = Ev / GEMM_NR * GEMM_NR;
      if (full < Ev) gemm_pack_rows(vb + full, Ev, pk, S, Ev - full);
      gemm_direct_one(sc, S, vb, Ev, pk, ob, Ev, L, Ev, S, 0, 0);
    }
  }
}

EXPORT(sdpa_f32) void sdpa_f32(const f32 *q, const f32 *k, const f32 *v, const void *mask, f32 *out,
                               f32 *scratch, const i32 *prm, f32 scale) {
  sdpa_f32_team(q, k, v, mask, out, scratch, prm, scale, 0, 0, 1);
}
