/* Decode attention over a key/value cache on the team's two threads (numpy_llm.py's
 * attention_cached for one new token; team.c's job 9).
 *
 * One query row of Hq heads attends over the rows lo .. last of a cache (C, Hkv, D), query head h
 * reading key/value head h / G (G = Hq / Hkv). A decode step's cost is reading those rows (at
 * SmolLM2's 3 x 64 floats a row, ~1.5 KB of keys and values a row: ~460 KB a layer at position
 * 300, cold after the step's weights went through the caches), so the work splits along the rows:
 *
 *  - a unit is (key/value head g, chunk c of ACH consecutive rows). It computes the scores of the
 *    G query heads of g against its rows (each key row read once for the G heads), their maximum
 *    m, e = exp(s - m), z = sum e and acc = sum e v (each value row read once for the G heads), and
 *    writes (m, z, acc[D]) per head into `part` (record (c Hkv + g) G + head in group). Units are
 *    independent; the team splits them into contiguous ranges of u = c Hkv + g (chunk-major: a
 *    thread reads one stretch of the caches; g-major measured the same). Each unit prefetches its
 *    key rows APF ahead and, while scoring, the value rows it reads next.
 *  - the merge (one thread, after the team) combines a head's chunks: M = max m_c,
 *    out = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) z_c, and writes k, v into cache row `last`.
 *    The units read that row from k and v themselves, so nothing is written while they run.
 *
 * The chunk size is fixed (not derived from the thread count) and the merge runs in chunk order:
 * the results are the same bits on one thread or two. They differ from llm.c's single-pass softmax
 * (wasm_llm.c) and from the numpy path by float32 roundings only (tests/test_native_llm_attn.py
 * checks both against float64).
 *
 * Order of the float32 math, per head: s_j = (sum over d ascending in VW-lane partial sums, then
 * the lanes added) * scale; with a softcap, cap tanh(s / cap); per chunk m = max s (NaN wins),
 * e_j = vec.h's vexp(s_j - m), z = sum e_j (VW-lane partial sums), acc[d] = sum over j ascending of
 * e_j v_j[d] (fused multiply-adds); the merge as above, chunks ascending, then one division.
 * Compiled without FP contraction: every fused multiply-add is written. */
#include "vec.h"

/* the argument array (int64): heads, head size, the cache's row (Hkv * D floats), the first row
 * attended, the rows attended (the last being the new one), the units, the caches' addresses, the
 * scale's and the softcap's float32 bits (0: none) */
enum { AD_HQ, AD_HKV, AD_D, AD_ROW, AD_LO, AD_L, AD_UNITS, AD_KC, AD_VC, AD_SCALE, AD_CAP, AD_LEN };

#define ACH 64   /* rows a unit: at SmolLM2's 9 / 3 / 64, position 300: 15 units (a thread's 7-8) */
#define AHB 4    /* query heads a pass over a unit's rows (a group of more makes several passes) */
#define APF 16   /* key rows prefetched ahead */
#define ADV 4    /* vectors of the head size a pass over the values accumulates (in registers) */

EXPORT i64 ember_attn_decode_chunk(void) { return ACH; }

INLINE f32 hsum_v(vf v) {
#if VW == 16
  return _mm512_reduce_add_ps((__m512)v);
#else
  f32 t = v[0];
  for (int l = 1; l < VW; l++) t += v[l];
  return t;
#endif
}

/* the cache lines of a head's row (D floats at p) into L1: the cache's rows are cold in a decode
 * (the step's weights went through the caches since this layer's last step) */
INLINE void prefetch_row(const f32 *p, i64 D) {
  for (i64 o = 0; o < D; o += 16) __builtin_prefetch(p + o, 0, 3);
}

INLINE f32 bits_f32(i64 b) {
  f32 f;
  const int32_t i = (int32_t)b;
  memcpy(&f, &i, 4);
  return f;
}

/* cap tanh(s / cap): tanh y = sign(y) (1 - e) / (1 + e), e = e^(-2 |y|) */
INLINE vf softcap_v(vf s, f32 cap) {
  const vf y = s / cap;
  const vf a = (vf)((vi)y & 0x7fffffff);
  const vf e = vexp(-2.0f * a);
  const vf th = (1.0f - e) / (1.0f + e);
  return cap * sel(y < 0.0f, -th, th);
}

/* the key or value row r of head g: the cache's, or the new row (k / v) for r == last */
INLINE const f32 *row_of(const f32 *cache, const f32 *fresh, i64 r, i64 last, i64 row, i64 g, i64 D) {
  return (r == last ? fresh : cache + r * row) + g * D;
}

/* Unit u's work for heads h0 .. h0+NH-1 of its group (NH <= AHB): NH and D compile-time constants
 * where unit() is called with literals (the loops over the head size unroll). */
INLINE void unit_heads(const int NH, const i64 D, const f32 *q, const f32 *k, const f32 *v, const f32 *kc,
                       const f32 *vc, f32 *part, i64 u, i64 g, i64 G, i64 h0, i64 r0, i64 n, i64 last, i64 row,
                       f32 scale, f32 cap) {
  f32 sc[AHB][ACH];
  const f32 *qh[AHB];
  for (int h = 0; h < NH; h++) qh[h] = q + (g * G + h0 + h) * D;
  /* scores; the key rows APF ahead and this row's values (the pass after this) are prefetched */
  for (i64 j = 0; j < (n < APF ? n : APF); j++)
    if (r0 + j < last) prefetch_row(kc + (r0 + j) * row + g * D, D);
  for (i64 j = 0; j < n; j++) {
    if (r0 + j + APF < last) prefetch_row(kc + (r0 + j + APF) * row + g * D, D);
    if (r0 + j < last) prefetch_row(vc + (r0 + j) * row + g * D, D);
    const f32 *kr = row_of(kc, k, r0 + j, last, row, g, D);
    vf acc[AHB] = {{0}};
    for (i64 d = 0; d < D; d += VW) {
      const i64 w = D - d < VW ? D - d : VW;
      const vf kv = load_n(kr + d, w);
      for (int h = 0; h < NH; h++) acc[h] = vfma(load_n(qh[h] + d, w), kv, acc[h]);
    }
    for (int h = 0; h < NH; h++) sc[h][j] = hsum_v(acc[h]) * scale;
  }
  /* softcap, maximum, e and z per head */
  f32 m[AHB], z[AHB];
  for (int h = 0; h < NH; h++) {
    f32 *s = sc[h];
    if (cap > 0.0f)
      for (i64 j = 0; j < n; j += VW) {
        const i64 w = n - j < VW ? n - j : VW;
        store_n(s + j, softcap_v(load_n(s + j, w), cap), w);
      }
    f32 mx = -__builtin_inff();
    for (i64 j = 0; j < n; j++) mx = (s[j] > mx || s[j] != s[j]) ? s[j] : mx;
    vf zs = {0};
    for (i64 j = 0; j < n; j += VW) {
      const i64 w = n - j < VW ? n - j : VW;
      const vf e = vexp(load_n(s + j, w) - mx);
      store_n(s + j, e, w);
      zs = zs + (w == VW ? e : load_n(s + j, w));   /* (the lanes past n: 0) */
    }
    m[h] = mx, z[h] = hsum_v(zs);
  }
  /* acc = sum_j e_j v_j, ADV vectors of the head size at a time */
  for (i64 d0 = 0; d0 < D; d0 += ADV * VW) {
    vf acc[AHB][ADV] = {{{0}}};
    for (i64 j = 0; j < n; j++) {
      const f32 *vr = row_of(vc, v, r0 + j, last, row, g, D) + d0;
      vf vv[ADV];
      for (int t = 0; t < ADV; t++) {
        const i64 d = d0 + t * VW, w = D - d < VW ? D - d : VW;
        vv[t] = w > 0 ? load_n(vr + t * VW, w) : (vf){0};
      }
      for (int h = 0; h < NH; h++) {
        const vf e = splat(sc[h][j]);
        for (int t = 0; t < ADV; t++) acc[h][t] = vfma(e, vv[t], acc[h][t]);
      }
    }
    for (int h = 0; h < NH; h++) {
      f32 *rec = part + ((u * G) + h0 + h) * (D + 2);
      rec[0] = m[h], rec[1] = z[h];
      for (int t = 0; t < ADV; t++) {
        const i64 d = d0 + t * VW, w = D - d < VW ? D - d : VW;
        if (w > 0) store_n(rec + 2 + d, acc[h][t], w);
      }
    }
  }
}

INLINE void unit(const i64 D, const f32 *q, const f32 *k, const f32 *v, const f32 *kc, const f32 *vc, f32 *part,
                 i64 u, i64 g, i64 G, i64 r0, i64 n, i64 last, i64 row, f32 scale, f32 cap) {
  for (i64 h0 = 0; h0 < G; h0 += AHB) {
    const i64 nh = G - h0 < AHB ? G - h0 : AHB;
#define UNIT_NH(NH) unit_heads(NH, D, q, k, v, kc, vc, part, u, g, G, h0, r0, n, last, row, scale, cap)
    if (nh == 4) UNIT_NH(4);
    else if (nh == 3) UNIT_NH(3);
    else if (nh == 2) UNIT_NH(2);
    else UNIT_NH(1);
#undef UNIT_NH
  }
}

/* Units [u0, u1): see above. part: (units * G) records of D + 2 floats (m, z, acc). Returns 0. */
EXPORT i64 ember_attn_decode_units(const i64 *a, const f32 *q, const f32 *k, const f32 *v, f32 *part, i64 u0,
                                   i64 u1) {
  const i64 Hq = a[AD_HQ], Hkv = a[AD_HKV], D = a[AD_D], row = a[AD_ROW], lo = a[AD_LO], L = a[AD_L];
  const i64 G = Hq / Hkv, last = lo + L - 1;
  const f32 *kc = (const f32 *)(intptr_t)a[AD_KC], *vc = (const f32 *)(intptr_t)a[AD_VC];
  const f32 scale = bits_f32(a[AD_SCALE]), cap = bits_f32(a[AD_CAP]);
  for (i64 u = u0; u < u1; u++) {
    const i64 g = u % Hkv, c = u / Hkv;
    const i64 r0 = lo + c * ACH, n = L - c * ACH < ACH ? L - c * ACH : ACH;
#define UNIT_D(DD) unit(DD, q, k, v, kc, vc, part, u, g, G, r0, n, last, row, scale, cap)
    if (D == 64) UNIT_D(64);
    else if (D == 128) UNIT_D(128);
    else UNIT_D(D);
#undef UNIT_D
  }
  return 0;
}

/* After every unit: out (Hq, D) from the records (see above), then k and v (Hkv * D floats each)
 * into the caches' row lo + L - 1. Returns 0. */
EXPORT i64 ember_attn_decode_merge(const i64 *a, const f32 *k, const f32 *v, const f32 *part, f32 *out) {
  const i64 Hq = a[AD_HQ], Hkv = a[AD_HKV], D = a[AD_D], row = a[AD_ROW], L = a[AD_L];
  const i64 G = Hq / Hkv, chunks = (L + ACH - 1) / ACH, last = a[AD_LO] + L - 1;
  for (i64 h = 0; h < Hq; h++) {
    const i64 g = h / G, hh = h % G;
    const f32 *rec0 = part + (g * G + hh) * (D + 2);   /* chunk c's record: c * Hq * (D + 2) on */
    const i64 step = Hq * (D + 2);
    f32 M = rec0[0];
    for (i64 c = 1; c < chunks; c++) {
      const f32 mc = rec0[c * step];
      M = (mc > M || mc != mc) ? mc : M;
    }
    f32 *o = out + h * D;
    f32 zt = 0.0f;
    for (i64 c = 0; c < chunks; c++) {
      const f32 *rec = rec0 + c * step;
      const f32 w = rec[0] == M ? 1.0f : vexp(splat(rec[0] - M))[0];
      zt += w * rec[1];
      for (i64 d = 0; d < D; d += VW) {
        const i64 n = D - d < VW ? D - d : VW;
        const vf x = load_n(rec + 2 + d, n);
        store_n(o + d, c ? vfma(splat(w), x, load_n(o + d, n)) : x * w, n);
      }
    }
    for (i64 d = 0; d < D; d += VW) {
      const i64 n = D - d < VW ? D - d : VW;
      store_n(o + d, load_n(o + d, n) / zt, n);
    }
  }
  f32 *kc = (f32 *)(intptr_t)a[AD_KC], *vc = (f32 *)(intptr_t)a[AD_VC];
  memcpy(kc + last * row, k, (size_t)row * 4);
  memcpy(vc + last * row, v, (size_t)row * 4);
  return 0;
}

/* Units and merge in one call (one thread: no team, or too little to split). Returns 0. */
EXPORT i64 ember_attn_decode(const i64 *a, const f32 *q, const f32 *k, const f32 *v, f32 *part, f32 *out) {
  ember_attn_decode_units(a, q, k, v, part, 0, a[AD_UNITS]);
  return ember_attn_decode_merge(a, k, v, part, out);
}
