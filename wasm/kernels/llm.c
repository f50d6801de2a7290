/* Language-model ops (ember.ops.llm): rms_norm, rope, attention over a key/value cache.
 * Called from ember/wasm/ops_quant.py.
 *
 * rms_norm and rope compute in float64 from the float32 inputs and round once, like the python
 * specification (ember/backends/python_llm.py): rope's products are exact in float64, so its
 * results are the specification's bit for bit; rms_norm's differ only by the summation order of
 * the sum of squares (in float64). attention_cached is float32 (exp to about an ulp). */
#include "ember.h"
#include "mathf.h"
#include "team.h"

typedef double f64;

/* ---- rms_norm ---------------------------------------------------------------------------------- */

/* y = x / sqrt(mean(x^2) + eps) * w over `rows` rows of n (eps a double, as Python's). */
EXPORT(rms_norm_f32) void rms_norm_f32(const f32 *x, const f32 *w, f32 *y, i32 rows, i32 n, double eps) {
  for (i32 r = 0; r < rows; r++) {
    const f32 *xr = x + r * n;
    f32 *yr = y + r * n;
    v128_t a0 = wasm_f64x2_splat(0.0), a1 = a0;
    i32 i = 0;
    for (; i + 4 <= n; i += 4) {
      const f32x4 v = wasm_v128_load(xr + i);
      const v128_t lo = wasm_f64x2_promote_low_f32x4(v);
      const v128_t hi = wasm_f64x2_promote_low_f32x4(wasm_i32x4_shuffle(v, v, 2, 3, 2, 3));
      a0 = wasm_f64x2_add(a0, wasm_f64x2_mul(lo, lo));
      a1 = wasm_f64x2_add(a1, wasm_f64x2_mul(hi, hi));
    }
    a0 = wasm_f64x2_add(a0, a1);
    f64 ss = wasm_f64x2_extract_lane(a0, 0) + wasm_f64x2_extract_lane(a0, 1);
    for (; i < n; i++) ss += (f64)xr[i] * (f64)xr[i];
    const f64 inv = 1.0 / __builtin_sqrt(ss / (f64)n + eps);
    const v128_t vinv = wasm_f64x2_splat(inv);
    for (i = 0; i + 4 <= n; i += 4) {
      const f32x4 v = wasm_v128_load(xr + i), g = wasm_v128_load(w + i);
      const v128_t lo = wasm_f64x2_mul(wasm_f64x2_mul(wasm_f64x2_promote_low_f32x4(v), vinv),
                                       wasm_f64x2_promote_low_f32x4(g));
      const v128_t hi = wasm_f64x2_mul(
          wasm_f64x2_mul(wasm_f64x2_promote_low_f32x4(wasm_i32x4_shuffle(v, v, 2, 3, 2, 3)), vinv),
          wasm_f64x2_promote_low_f32x4(wasm_i32x4_shuffle(g, g, 2, 3, 2, 3)));
      wasm_v128_store(yr + i, wasm_i64x2_shuffle(wasm_f32x4_demote_f64x2_zero(lo), wasm_f32x4_demote_f64x2_zero(hi), 0, 2));
    }
    for (; i < n; i++) yr[i] = (f32)((f64)xr[i] * inv * (f64)w[i]);
  }
}

/* ---- rope -------------------------------------------------------------------------------------- */

/* x (T, H, D) rotated by cos/sin (T, D/2): mode 0 "pairs" (x[2i], x[2i+1]), 1 "halves"
 * (x[i], x[i + D/2]). y = (x0 c - x1 s, x0 s + x1 c), each one rounding from float64. */
EXPORT(rope_f32) void rope_f32(const f32 *x, const f32 *cs, const f32 *sn, f32 *y, i32 T, i32 H, i32 D, i32 mode) {
  const i32 half = D / 2;
  const i32 step = mode ? 1 : 2, other = mode ? half : 1;
  for (i32 t = 0; t < T; t++) {
    const f32 *c = cs + t * half, *s = sn + t * half;
    for (i32 h = 0; h < H; h++) {
      const f32 *xr = x + (t * H + h) * D;
      f32 *yr = y + (t * H + h) * D;
      for (i32 i = 0; i < half; i++) {
        const i32 a = i * step, b = a + other;
        const f64 x0 = xr[a], x1 = xr[b], ci = c[i], si = s[i];
        yr[a] = (f32)(x0 * ci - x1 * si);
        yr[b] = (f32)(x0 * si + x1 * ci);
      }
    }
  }
}

/* ---- attention over a key/value cache -------------------------------------------------------- */

enum { AC_T, AC_HQ, AC_HKV, AC_D, AC_C, AC_WIN, AC_CAP, AC_NPARAMS };  /* AC_CAP: f32 bits */
#define AC_ERR_POS 1   /* pos < 0 or pos + T > C: nothing was written */

/* exp(d) for d = s - max <= 0; below float's normal range (d < -87) it is 0 (as attention.c) */
INLINE f32x4 exp_neg(f32x4 d) {
  const f32x4 lo = F4(-87.f);
  return wasm_v128_andnot(exp4(wasm_f32x4_max(d, lo)), wasm_f32x4_lt(d, lo));
}

INLINE f32x4 dot_d(const f32 *a, const f32 *b, i32 D) {
  f32x4 s = F4(0.f);
  for (i32 d = 0; d < D; d += 4) s = wasm_f32x4_add(s, wasm_f32x4_mul(wasm_v128_load(a + d), wasm_v128_load(b + d)));
  return s;
}

/* s = cap tanh(s / cap) for the L scores of each of NH heads (rows C apart): tanh y =
 * sign(y) (1 - e) / (1 + e), e = exp(-2 |y|) (0 for |y| > 43: tanh = +-1) */
INLINE f32x4 cap4(f32x4 x, f32 cap) {
  const f32x4 one = F4(1.f);
  const f32x4 e = exp_neg(wasm_f32x4_mul(wasm_f32x4_abs(x), F4(-2.f / cap)));
  const f32x4 th = wasm_f32x4_div(wasm_f32x4_sub(one, e), wasm_f32x4_add(one, e));
  return wasm_f32x4_mul(wasm_v128_bitselect(wasm_f32x4_neg(th), th, wasm_f32x4_lt(x, F4(0.f))), F4(cap));
}

static void soft_cap(f32 *sc, i32 C, i32 NH, i32 L, f32 cap) {
  for (i32 hh = 0; hh < NH; hh++) {
    f32 *s = sc + hh * C;
    i32 j = 0;
    for (; j + 4 <= L; j += 4) wasm_v128_store(s + j, cap4(wasm_v128_load(s + j), cap));
    for (; j < L; j++) s[j] = wasm_f32x4_extract_lane(cap4(F4(s[j]), cap), 0);
  }
}

/* [hsum a, hsum b, hsum c, hsum d] */
INLINE f32x4 hsum4x4(f32x4 a, f32x4 b, f32x4 c, f32x4 d) {
  const f32x4 ab = wasm_f32x4_add(wasm_i32x4_shuffle(a, b, 0, 4, 1, 5), wasm_i32x4_shuffle(a, b, 2, 6, 3, 7));
  const f32x4 cd = wasm_f32x4_add(wasm_i32x4_shuffle(c, d, 0, 4, 1, 5), wasm_i32x4_shuffle(c, d, 2, 6, 3, 7));
  return wasm_f32x4_add(wasm_i64x2_shuffle(ab, cd, 0, 2), wasm_i64x2_shuffle(ab, cd, 1, 3));
}

/* out rows of NH (1..3, a constant after inlining) query heads = sum_j e[h][j] v_j / z[h], eight
 * features at a time: each value row is read once for the heads of its group. */
INLINE void pv_heads(const i32 NH, const f32 *sc, i32 C, const f32 *vb, i32 row, i32 L, i32 D, const f32 *rz,
                     f32 *o0, f32 *o1, f32 *o2) {
  for (i32 d = 0; d < D; d += 8) {
    const i32 two = d + 8 <= D;   /* D is a multiple of 4: the last chunk may hold 4 features */
    f32x4 a0 = F4(0.f), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0;
    for (i32 j = 0; j < L; j++) {
      const f32 *vr = vb + j * row + d;
      const f32x4 v0 = wasm_v128_load(vr), v1 = two ? wasm_v128_load(vr + 4) : v0;
      const f32x4 e0 = wasm_v128_load32_splat(sc + j);
      a0 = wasm_f32x4_add(a0, wasm_f32x4_mul(e0, v0));
      a1 = wasm_f32x4_add(a1, wasm_f32x4_mul(e0, v1));
      if (NH > 1) {
        const f32x4 e1 = wasm_v128_load32_splat(sc + C + j);
        b0 = wasm_f32x4_add(b0, wasm_f32x4_mul(e1, v0));
        b1 = wasm_f32x4_add(b1, wasm_f32x4_mul(e1, v1));
      }
      if (NH > 2) {
        const f32x4 e2 = wasm_v128_load32_splat(sc + 2 * C + j);
        c0 = wasm_f32x4_add(c0, wasm_f32x4_mul(e2, v0));
        c1 = wasm_f32x4_add(c1, wasm_f32x4_mul(e2, v1));
      }
    }
#define PUT(o, x0, x1, r)                                                   \
    wasm_v128_store(o + d, wasm_f32x4_mul(x0, F4(r)));                      \
    if (two) wasm_v128_store(o + d + 4, wasm_f32x4_mul(x1, F4(r)));
    PUT(o0, a0, a1, rz[0])
    if (NH > 1) { PUT(o1, b0, b1, rz[1]) }
    if (NH > 2) { PUT(o2, c0, c1, rz[2]) }
#undef PUT
  }
}

/* q (T, Hq, D), k/v (T, Hkv, D), caches (C, Hkv, D): writes k, v into cache rows pos .. pos+T-1,
 * then out (T, Hq, D) = causal grouped-query attention (query t over rows 0 .. pos+t of kv head
 * h / (Hq / Hkv)). pos is read here, at run time (a replayed plan passes the same pointer every
 * step). D must be a multiple of 4 (ops_quant.py sends other sizes to the python kernel).
 * The G = Hq / Hkv query heads of a key/value head go together: keys four at a time, each block of
 * four key rows used by every head of the group while in cache, and each value row by up to three
 * heads at once. scratch: G * (C + 1) floats (a group's scores, then 1 / their sums). Returns 0,
 * or AC_ERR_POS before
 * anything is written. prm[AC_WIN] > 0: a sliding window (query t over rows pos+t-WIN+1 .. pos+t
 * only: the run starts WIN rows back); prm[AC_CAP] (the bits of a float) > 0: scores soft-capped,
 * cap * tanh(s / cap), before the softmax (Gemma 2). */
/* One thread's share (team.h): thread 0 writes the cache rows, a barrier, then the (token, query
 * head) pairs split among threads in contiguous ranges (a decoded token has 9 heads over 3 key/value
 * heads here: 5 + 4 on two threads, where whole groups gave 1 + 2); each range runs as groups of
 * consecutive heads that share a key/value head, with their scores in the thread's own scratch.
 * A head's scores, softmax and output take the same operations whichever heads go with it. */
i32 attention_cached_f32_team(const f32 *q, const f32 *k, const f32 *v, f32 *kc, f32 *vc, const i32 *pos,
                              f32 *out, f32 *scratch, const i32 *prm, f32 scale, i32 *ctl, i32 tid, i32 nt) {
  const i32 T = prm[AC_T], Hq = prm[AC_HQ], Hkv = prm[AC_HKV], D = prm[AC_D], C = prm[AC_C];
  const i32 p = pos[0], win = prm[AC_WIN];
  f32 cap;
  __builtin_memcpy(&cap, prm + AC_CAP, 4);
  if (p < 0 || p > C - T) return AC_ERR_POS;
  const i32 row = Hkv * D, G = Hq / Hkv;
  i32 width = team_width(ctl, nt, (i64)T * Hq * D * (p + T)), u0, u1;
  if (width > T * Hq) width = T * Hq;
  if (tid == 0)
    for (i32 i = 0; i < T * row; i += 4) {
      wasm_v128_store(kc + p * row + i, wasm_v128_load(k + i));
      wasm_v128_store(vc + p * row + i, wasm_v128_load(v + i));
    }
  if (width > 1) {
    team_sync(ctl, tid, nt);
    scratch = (f32 *)team_scratch(ctl, tid, scratch);
  }
  team_range(T * Hq, 1, tid, width, &u0, &u1);
  const f32x4 vscale = F4(scale);
  for (i32 u = u0; u < u1;) {
    const i32 t = u / Hq, h0 = u % Hq, g = h0 / G;
    const i32 NH = (g + 1) * G - h0 < u1 - u ? (g + 1) * G - h0 : u1 - u;   /* heads h0 .. h0+NH-1 */
    u += NH;
    const i32 lo = win > 0 && p + t + 1 > win ? p + t + 1 - win : 0;   /* the window's first row */
    const i32 L = p + t + 1 - lo;
    {
      const f32 *kb = kc + lo * row + g * D, *vb = vc + lo * row + g * D;
      const f32 *qg = q + (t * Hq + h0) * D;
      /* scores of the run's heads: head hh's at scratch + hh * C */
      i32 j = 0;
      for (; j + 4 <= L; j += 4) {
        const f32 *k0 = kb + j * row;
        for (i32 hh = 0; hh < NH; hh++) {
          const f32 *qh = qg + hh * D;
          const f32x4 s = wasm_f32x4_mul(hsum4x4(dot_d(qh, k0, D), dot_d(qh, k0 + row, D), dot_d(qh, k0 + 2 * row, D),
                                                 dot_d(qh, k0 + 3 * row, D)),
                                         vscale);
          wasm_v128_store(scratch + hh * C + j, s);
        }
      }
      for (; j < L; j++)
        for (i32 hh = 0; hh < NH; hh++) scratch[hh * C + j] = hsum(dot_d(qg + hh * D, kb + j * row, D)) * scale;
      if (cap > 0.f) soft_cap(scratch, C, NH, L, cap);
      /* softmax numerators in place; 1 / their sum per head into rz */
      f32 *rz = scratch + G * C;
      for (i32 hh = 0; hh < NH; hh++) {
        f32 *sc = scratch + hh * C;
        f32x4 vmax = F4(-__builtin_inff());
        for (j = 0; j + 4 <= L; j += 4) vmax = wasm_f32x4_max(vmax, wasm_v128_load(sc + j));
        f32 m = hmax(vmax);
        for (; j < L; j++) m = (sc[j] > m || sc[j] != sc[j]) ? sc[j] : m;
        const f32x4 vm = F4(m);
        f32x4 acc = F4(0.f);
        for (j = 0; j + 4 <= L; j += 4) {
          const f32x4 e = exp_neg(wasm_f32x4_sub(wasm_v128_load(sc + j), vm));
          wasm_v128_store(sc + j, e);
          acc = wasm_f32x4_add(acc, e);
        }
        f32 z = hsum(acc);
        for (; j < L; j++) {
          const f32 e = wasm_f32x4_extract_lane(exp_neg(F4(sc[j] - m)), 0);
          sc[j] = e;
          z += e;
        }
        rz[hh] = 1.f / z;
      }
      /* out = e . v / z, up to three heads per pass over the values */
      for (i32 hh = 0; hh < NH; hh += 3) {
        const i32 nh = NH - hh < 3 ? NH - hh : 3;
        f32 *o0 = out + (t * Hq + h0 + hh) * D;
        const f32 *sc = scratch + hh * C;
        if (nh == 3) pv_heads(3, sc, C, vb, row, L, D, rz + hh, o0, o0 + D, o0 + 2 * D);
        else if (nh == 2) pv_heads(2, sc, C, vb, row, L, D, rz + hh, o0, o0 + D, o0);
        else pv_heads(1, sc, C, vb, row, L, D, rz + hh, o0, o0, o0);
      }
    }
  }
  return 0;
}

EXPORT(attention_cached_f32) i32 attention_cached_f32(const f32 *q, const f32 *k, const f32 *v, f32 *kc, f32 *vc,
                                                      const i32 *pos, f32 *out, f32 *scratch, const i32 *prm,
                                                      f32 scale) {
  return attention_cached_f32_team(q, k, v, kc, vc, pos, out, scratch, prm, scale, 0, 0, 1);
}
