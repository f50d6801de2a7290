/* float32 math on f32x4 lanes for the elementwise, reduction and norm kernels.
 *
 * Every function works on 4 lanes at once and only uses registers (no tables: the module may not
 * have data). Polynomial coefficients are minimax fits made for this file by
 * wasm/kernels/fit_mathf.py (Lawson's iteration on relative error against mpmath); each comment
 * gives the fit's own error, the float32 evaluation adds about an ulp. Special values follow numpy:
 * NaN in -> NaN out, exp(-inf) = 0, log(0) = -inf, log(<0) = NaN, tanh(+-inf) = +-1,
 * erf(+-inf) = +-1, -0.0 stays -0.0 where numpy keeps it (tanh, erf, sin).
 *
 * Also here: partial-vector loads/stores for the last 1..3 elements of a row, so that every
 * kernel runs its tail through the same vector code as its body.
 */
#ifndef EMBER_MATHF_H
#define EMBER_MATHF_H
#include "ember.h"

typedef v128_t i32x4;

#define F4(c) wasm_f32x4_splat(c)
#define I4(c) wasm_i32x4_splat(c)

/* ---- partial vectors ------------------------------------------------------------------------- */

/* Lanes 0..r-1 from p (1 <= r <= 3), the others 0. Reads p[0..r-1] only. */
INLINE f32x4 load_part(const f32 *p, i32 r) {
  f32x4 v = wasm_f32x4_make(p[0], 0.f, 0.f, 0.f);
  if (r > 1) v = wasm_f32x4_replace_lane(v, 1, p[1]);
  if (r > 2) v = wasm_f32x4_replace_lane(v, 2, p[2]);
  return v;
}

/* Lanes 0..r-1 from p with stride s (elements). */
INLINE f32x4 load_part_strided(const f32 *p, i32 s, i32 r) {
  f32x4 v = wasm_f32x4_make(p[0], 0.f, 0.f, 0.f);
  if (r > 1) v = wasm_f32x4_replace_lane(v, 1, p[s]);
  if (r > 2) v = wasm_f32x4_replace_lane(v, 2, p[2 * s]);
  return v;
}

INLINE void store_part(f32 *p, f32x4 v, i32 r) {
  p[0] = wasm_f32x4_extract_lane(v, 0);
  if (r > 1) p[1] = wasm_f32x4_extract_lane(v, 1);
  if (r > 2) p[2] = wasm_f32x4_extract_lane(v, 2);
}

/* Lane masks (all ones / zeros) to bytes 1 / 0: four masks -> 16 bools. */
INLINE v128_t masks_to_bools16(i32x4 m0, i32x4 m1, i32x4 m2, i32x4 m3) {
  v128_t a = wasm_i16x8_narrow_i32x4(m0, m1), b = wasm_i16x8_narrow_i32x4(m2, m3);
  return wasm_v128_and(wasm_i8x16_narrow_i16x8(a, b), wasm_i8x16_splat(1));
}

INLINE void store_bools_part(unsigned char *p, i32x4 m, i32 r) {
  p[0] = (unsigned char)(wasm_i32x4_extract_lane(m, 0) & 1);
  if (r > 1) p[1] = (unsigned char)(wasm_i32x4_extract_lane(m, 1) & 1);
  if (r > 2) p[2] = (unsigned char)(wasm_i32x4_extract_lane(m, 2) & 1);
  if (r > 3) p[3] = (unsigned char)(wasm_i32x4_extract_lane(m, 3) & 1);
}

/* ---- small helpers --------------------------------------------------------------------------- */

#define SIGN_BIT I4((i32)0x80000000)

INLINE f32x4 vabs(f32x4 x) { return wasm_f32x4_abs(x); }
INLINE f32x4 sign_of(f32x4 x) { return wasm_v128_and(x, SIGN_BIT); }
/* |m| with the sign of s (s's sign bit xor-ed onto a non-negative m). */
INLINE f32x4 with_sign(f32x4 m, f32x4 s) { return wasm_v128_or(m, sign_of(s)); }
INLINE f32x4 madd(f32x4 a, f32x4 b, f32x4 c) { return wasm_f32x4_add(wasm_f32x4_mul(a, b), c); }
/* where m: a, else b */
INLINE f32x4 sel(i32x4 m, f32x4 a, f32x4 b) { return wasm_v128_bitselect(a, b, m); }

INLINE f32 hsum(f32x4 v) {
  return (wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1)) +
         (wasm_f32x4_extract_lane(v, 2) + wasm_f32x4_extract_lane(v, 3));
}

INLINE f32 hmax(f32x4 v) {   /* NaN-propagating, like wasm's f32x4.max */
  f32x4 s = wasm_f32x4_max(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
  s = wasm_f32x4_max(s, wasm_i32x4_shuffle(s, s, 1, 0, 3, 2));
  return wasm_f32x4_extract_lane(s, 0);
}

INLINE f32 hmin(f32x4 v) {
  f32x4 s = wasm_f32x4_min(v, wasm_i32x4_shuffle(v, v, 2, 3, 0, 1));
  s = wasm_f32x4_min(s, wasm_i32x4_shuffle(s, s, 1, 0, 3, 2));
  return wasm_f32x4_extract_lane(s, 0);
}

/* Lanes 0..r-1 from p, the others `fill`. */
INLINE f32x4 load_part_fill(const f32 *p, i32 r, f32x4 fill) {
  f32x4 v = wasm_f32x4_replace_lane(fill, 0, p[0]);
  if (r > 1) v = wasm_f32x4_replace_lane(v, 1, p[1]);
  if (r > 2) v = wasm_f32x4_replace_lane(v, 2, p[2]);
  return v;
}

/* max / min of x[0..n-1] (n >= 1); NaN when any element is NaN (numpy). The running extreme
 * uses pmax/pmin (one instruction; they drop a NaN operand) next to a NaN flag, which costs less
 * than the NaN-propagating max (several instructions on x86). */
#define ROW_EXTREME(NAME, POP, HREDUCE)                                                         \
  INLINE f32 NAME(const f32 *x, i32 n) {                                                        \
    f32x4 a0 = F4(x[0]), a1 = a0;                                                               \
    i32x4 nan = I4(0);                                                                          \
    i32 i = 0;                                                                                  \
    for (; i + 8 <= n; i += 8) {                                                                \
      f32x4 v0 = wasm_v128_load(x + i), v1 = wasm_v128_load(x + i + 4);                         \
      a0 = POP(a0, v0);                                                                         \
      a1 = POP(a1, v1);                                                                         \
      nan = wasm_v128_or(nan, wasm_v128_or(wasm_f32x4_ne(v0, v0), wasm_f32x4_ne(v1, v1)));      \
    }                                                                                           \
    for (; i < n; i += 4) {                                                                     \
      f32x4 v = n - i >= 4 ? wasm_v128_load(x + i) : load_part_fill(x + i, n - i, F4(x[0]));    \
      a0 = POP(a0, v);                                                                          \
      nan = wasm_v128_or(nan, wasm_f32x4_ne(v, v));                                             \
    }                                                                                           \
    return wasm_v128_any_true(nan) ? __builtin_nanf("") : HREDUCE(POP(a0, a1));                 \
  }

ROW_EXTREME(row_max, wasm_f32x4_pmax, hmax)
ROW_EXTREME(row_min, wasm_f32x4_pmin, hmin)

/* ---- exp --------------------------------------------------------------------------------------
 * x = k ln2 + r, |r| <= ln2/2 (Cody-Waite: k*LN2_HI is exact for |k| < 256), e^r = 1 + r + r^2 P(r)
 * (degree 6, fit error 3.1e-9), times 2^k applied in two halves so that results down to the
 * subnormals (k = -150) and up to overflow (k = 128) come out of one rounding. `lo` is a small
 * correction added to the argument after the reduction (exp(x + lo) with lo << ulp(x)), which lets
 * erfc take exp(-z^2) with z^2 given as an unrounded pair. exp_scaled(x, lo, m) is exp(x + lo) 2^m
 * (m = 0 or 24), for results that are scaled back after a product that would otherwise be rounded
 * in the subnormal range twice. */
#define EXP_LOG2E 1.442695022e+00f
#define EXP_LN2_HI 6.931457520e-01f
#define EXP_LN2_LO 1.428606765e-06f

INLINE f32x4 exp_core(f32x4 x, i32 has_lo, f32x4 lo, i32 m) {
  /* below -104 - m ln2 the result is 0; pmax(x, lo) = x < lo ? lo : x lets NaN through, and is
   * one instruction where the NaN-propagating max is several */
  x = wasm_f32x4_pmin(wasm_f32x4_pmax(x, F4(m ? -121.f : -104.f)), F4(89.f));
  /* k = round(x log2 e) by the 1.5 * 2^23 trick: the sum's low mantissa bits are k, the sum
   * minus the constant is k as a float (ties to even, like nearest) */
  f32x4 kb = wasm_f32x4_add(wasm_f32x4_mul(x, F4(EXP_LOG2E)), F4(12582912.f));
  f32x4 k = wasm_f32x4_sub(kb, F4(12582912.f));
  f32x4 r = wasm_f32x4_sub(x, wasm_f32x4_mul(k, F4(EXP_LN2_HI)));
  r = wasm_f32x4_sub(r, wasm_f32x4_mul(k, F4(EXP_LN2_LO)));
  if (has_lo) r = wasm_f32x4_add(r, lo);   /* (r + 0 is not a no-op for the compiler: -0) */
  f32x4 p = madd(r, F4(1.381461276e-03f), F4(8.368710056e-03f));
  p = madd(p, r, F4(4.166838899e-02f));
  p = madd(p, r, F4(1.666652113e-01f));
  p = madd(p, r, F4(4.999999404e-01f));
  p = wasm_f32x4_add(wasm_f32x4_mul(wasm_f32x4_mul(r, r), p), r);
  p = wasm_f32x4_add(p, F4(1.f));
  i32x4 ki = wasm_i32x4_sub(kb, I4(0x4b400000 - m));   /* NaN: some scale, times p = NaN */
  i32x4 k1 = wasm_i32x4_shr(ki, 1);
  i32x4 k2 = wasm_i32x4_sub(ki, k1);
  f32x4 s1 = wasm_i32x4_shl(wasm_i32x4_add(k1, I4(127)), 23);
  f32x4 s2 = wasm_i32x4_shl(wasm_i32x4_add(k2, I4(127)), 23);
  return wasm_f32x4_mul(wasm_f32x4_mul(p, s1), s2);
}

INLINE f32x4 exp_scaled(f32x4 x, f32x4 lo, i32 m) { return exp_core(x, 1, lo, m); }
INLINE f32x4 exp_lo(f32x4 x, f32x4 lo) { return exp_core(x, 1, lo, 0); }
INLINE f32x4 exp4(f32x4 x) { return exp_core(x, 0, x, 0); }

/* ---- log --------------------------------------------------------------------------------------
 * x = m 2^e with m in [sqrt(1/2), sqrt(2)) (subnormals scaled by 2^23 first), f = m - 1 (exact),
 * s = f / (2 + f): log(m) = 2 atanh(s) = f - s (f - R), R = s^2 P(s^2) (fit error 8e-10). Writing
 * 2s as f - s f keeps the rounding of s out of the leading term. */
INLINE f32x4 log4(f32x4 x) {
  i32x4 sub = wasm_f32x4_lt(x, F4(1.17549435e-38f));
  f32x4 xs = sel(sub, wasm_f32x4_mul(x, F4(8388608.f)), x);
  i32x4 ix = xs;
  i32x4 e = wasm_i32x4_shr(wasm_i32x4_sub(ix, I4(0x3f3504f3)), 23);
  f32x4 m = wasm_i32x4_sub(ix, wasm_i32x4_shl(e, 23));
  e = wasm_i32x4_sub(e, wasm_v128_and(sub, I4(23)));
  f32x4 ef = wasm_f32x4_convert_i32x4(e);
  f32x4 f = wasm_f32x4_sub(m, F4(1.f));
  f32x4 s = wasm_f32x4_div(f, wasm_f32x4_add(f, F4(2.f)));
  f32x4 z = wasm_f32x4_mul(s, s);
  f32x4 R = madd(z, F4(2.987094223e-01f), F4(3.997757435e-01f));
  R = madd(R, z, F4(6.666677594e-01f));
  R = wasm_f32x4_mul(R, z);
  f32x4 lo = wasm_f32x4_sub(wasm_f32x4_mul(ef, F4(EXP_LN2_LO)), wasm_f32x4_mul(s, wasm_f32x4_sub(f, R)));
  f32x4 y = wasm_f32x4_add(wasm_f32x4_mul(ef, F4(EXP_LN2_HI)), wasm_f32x4_add(f, lo));
  /* x <= 0, inf, NaN: -inf at +-0, NaN below 0 and for NaN, inf at inf */
  i32x4 ok = wasm_v128_and(wasm_f32x4_gt(x, F4(0.f)), wasm_f32x4_lt(x, F4(__builtin_inff())));
  f32x4 special = sel(wasm_f32x4_eq(x, F4(0.f)), F4(-__builtin_inff()),
                      sel(wasm_f32x4_eq(x, F4(__builtin_inff())), x, F4(__builtin_nanf(""))));
  return sel(ok, y, special);
}

/* ---- tanh -------------------------------------------------------------------------------------
 * |x| < 0.625: x + x^3 P(x^2) (fit error 4.4e-9); beyond: sign(x) (1 - 2 / (e^{2|x|} + 1)). */
INLINE f32x4 tanh4(f32x4 x) {
  f32x4 ax = vabs(x);
  f32x4 z = wasm_f32x4_mul(x, x);
  f32x4 p = madd(z, F4(-5.704982672e-03f), F4(2.063908428e-02f));
  p = madd(p, z, F4(-5.373971537e-02f));
  p = madd(p, z, F4(1.333144158e-01f));
  p = madd(p, z, F4(-3.333328068e-01f));
  p = wasm_f32x4_add(wasm_f32x4_mul(wasm_f32x4_mul(p, z), x), x);
  i32x4 small = wasm_f32x4_lt(ax, F4(0.625f));
  f32x4 e = exp4(wasm_f32x4_add(ax, ax));
  f32x4 t = wasm_f32x4_sub(F4(1.f), wasm_f32x4_div(F4(2.f), wasm_f32x4_add(e, F4(1.f))));
  return sel(small, p, with_sign(t, x));
}

/* ---- sigmoid ----------------------------------------------------------------------------------
 * e = exp(-|x|); 1 / (1 + e) for x >= 0, e / (1 + e) below (no overflow, no cancellation; tiny
 * results keep their relative accuracy down to the subnormals). */
INLINE f32x4 sigmoid4(f32x4 x) {
  f32x4 e = exp4(wasm_f32x4_neg(vabs(x)));
  f32x4 num = sel(wasm_f32x4_ge(x, F4(0.f)), F4(1.f), e);   /* NaN: e (NaN) */
  return wasm_f32x4_div(num, wasm_f32x4_add(e, F4(1.f)));
}

/* ---- erf, erfc, Phi ---------------------------------------------------------------------------
 * |x| < 0.875: erf(x) = x P(x^2) (degree 11, fit error 8.5e-9).
 * |x| >= 0.875: erfc(x) = exp(-x^2) t Q(t), t = 1 / (1 + x/2) (degree 8, fit error 1.9e-8 up to
 * x = 10, where erfc underflows float32 anyway). */
#define ERF_T 0.875f

INLINE f32x4 erf_small(f32x4 x, f32x4 z) {   /* z = x*x */
  f32x4 p = madd(z, F4(-6.203345838e-04f), F4(5.032200832e-03f));
  p = madd(p, z, F4(-2.679147758e-02f));
  p = madd(p, z, F4(1.128245592e-01f));
  p = madd(p, z, F4(-3.761255145e-01f));
  p = madd(p, z, F4(1.128379107e+00f));
  return wasm_f32x4_mul(p, x);
}

/* erfc(a) 2^m for a >= ERF_T given a and a^2 = hi (+ lo when has_lo). */
INLINE f32x4 erfc_tail(f32x4 a, f32x4 hi, i32 has_lo, f32x4 lo, i32 m) {
  f32x4 t = wasm_f32x4_div(F4(2.f), wasm_f32x4_add(a, F4(2.f)));
  f32x4 q = madd(t, F4(8.724778146e-02f), F4(-2.085739672e-01f));
  q = madd(q, t, F4(6.163225323e-02f));
  q = madd(q, t, F4(7.418362051e-02f));
  q = madd(q, t, F4(1.739505380e-01f));
  q = madd(q, t, F4(2.479866892e-01f));
  q = madd(q, t, F4(2.819238305e-01f));
  q = madd(q, t, F4(2.821038067e-01f));
  q = wasm_f32x4_mul(q, t);
  return wasm_f32x4_mul(exp_core(wasm_f32x4_neg(hi), has_lo, wasm_f32x4_neg(lo), m), q);
}

INLINE f32x4 erf4(f32x4 x) {
  f32x4 ax = vabs(x);
  f32x4 z = wasm_f32x4_mul(x, x);
  f32x4 y = erf_small(x, z);
  i32x4 small = wasm_f32x4_lt(ax, F4(ERF_T));
  /* both branches, then a select: skipping the tail when no lane needs it made V8 slower */
  return sel(small, y, with_sign(wasm_f32x4_sub(F4(1.f), erfc_tail(ax, z, 0, z, 0)), x));
}

/* x*x as hi + lo exactly (Dekker's product through Veltkamp's split; |x| <= 2^60). */
INLINE f32x4 square_lo(f32x4 x, f32x4 hi) {
  f32x4 c = wasm_f32x4_mul(x, F4(4097.f));
  f32x4 xh = wasm_f32x4_sub(c, wasm_f32x4_sub(c, x));
  f32x4 xl = wasm_f32x4_sub(x, xh);
  f32x4 l = wasm_f32x4_sub(wasm_f32x4_mul(xh, xh), hi);
  l = wasm_f32x4_add(l, wasm_f32x4_mul(wasm_f32x4_add(xh, xh), xl));
  return wasm_f32x4_add(l, wasm_f32x4_mul(xl, xl));
}

/* gelu(x) = x Phi(x / sqrt 2), Phi the standard normal CDF: (1 + erf(z)) / 2 for |z| < ERF_T, and
 * without the cancellation of 1 + erf for z << 0, erfc(|z|) / 2 beyond. There z^2 is taken as
 * x^2 / 2 from an exact square of x, so that exp(-z^2) keeps its relative accuracy in the far
 * tail, and erfc is scaled by 2^24 until after the product with x (one rounding into the
 * subnormals). gelu(-inf) = -inf * 0 = NaN, as x Phi(x) gives in float64. */
INLINE f32x4 gelu4(f32x4 x) {
  f32x4 z = wasm_f32x4_mul(x, F4(7.071067691e-01f));
  f32x4 az = vabs(z);
  f32x4 y = wasm_f32x4_mul(x, madd(erf_small(z, wasm_f32x4_mul(z, z)), F4(0.5f), F4(0.5f)));
  i32x4 small = wasm_f32x4_lt(az, F4(ERF_T));
  f32x4 ax = wasm_f32x4_pmin(vabs(x), F4(32.f));   /* beyond, erfc is 0 anyway; keeps the split finite */
  f32x4 hi = wasm_f32x4_mul(ax, ax);
  f32x4 lo = square_lo(ax, hi);
  f32x4 hs = wasm_f32x4_mul(erfc_tail(az, wasm_f32x4_mul(hi, F4(0.5f)), 1, wasm_f32x4_mul(lo, F4(0.5f)), 24),
                            F4(0.5f));   /* erfc(|z|) / 2 * 2^24 */
  f32x4 neg = wasm_f32x4_mul(wasm_f32x4_mul(x, hs), F4(5.9604645e-08f));
  f32x4 pos = wasm_f32x4_mul(x, wasm_f32x4_sub(F4(1.f), wasm_f32x4_mul(hs, F4(5.9604645e-08f))));
  y = sel(small, y, sel(wasm_f32x4_lt(x, F4(0.f)), neg, pos));
  return sel(wasm_f32x4_eq(x, F4(-__builtin_inff())), F4(__builtin_nanf("")), y);
}

/* The tanh form is x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) (= 0.5 x (1 + tanh u)
 * without the cancellation at x << 0). 2u is formed in float64 and handed to exp as a float32
 * pair: rounded to float32 alone, its error (|2u| ulps) would grow into exp(-|2u|). */
INLINE f32x4 gelu_tanh4(f32x4 x) {
  const v128_t a = wasm_f64x2_splat(1.5957691216057308), b = wasm_f64x2_splat(0.07135481627260025),
               lim = wasm_f64x2_splat(200.0);
  v128_t x0 = wasm_f64x2_promote_low_f32x4(x), x1 = wasm_f64x2_promote_low_f32x4(wasm_i32x4_shuffle(x, x, 2, 3, 2, 3));
  v128_t u0 = wasm_f64x2_mul(x0, wasm_f64x2_add(a, wasm_f64x2_mul(b, wasm_f64x2_mul(x0, x0))));
  v128_t u1 = wasm_f64x2_mul(x1, wasm_f64x2_add(a, wasm_f64x2_mul(b, wasm_f64x2_mul(x1, x1))));
  u0 = wasm_f64x2_pmin(wasm_f64x2_pmax(u0, wasm_f64x2_neg(lim)), lim);   /* sigmoid is 0 or 1 there */
  u1 = wasm_f64x2_pmin(wasm_f64x2_pmax(u1, wasm_f64x2_neg(lim)), lim);
  f32x4 h0 = wasm_f32x4_demote_f64x2_zero(u0), h1 = wasm_f32x4_demote_f64x2_zero(u1);
  f32x4 l0 = wasm_f32x4_demote_f64x2_zero(wasm_f64x2_sub(u0, wasm_f64x2_promote_low_f32x4(h0)));
  f32x4 l1 = wasm_f32x4_demote_f64x2_zero(wasm_f64x2_sub(u1, wasm_f64x2_promote_low_f32x4(h1)));
  f32x4 hi = wasm_i32x4_shuffle(h0, h1, 0, 1, 4, 5), lo = wasm_i32x4_shuffle(l0, l1, 0, 1, 4, 5);
  /* sigmoid(hi + lo) from e = exp(-|hi + lo|) 2^24 (kept normal until the product with x) */
  i32x4 neg = wasm_f32x4_lt(hi, F4(0.f));
  f32x4 es = exp_scaled(sel(neg, hi, wasm_f32x4_neg(hi)), sel(neg, lo, wasm_f32x4_neg(lo)), 24);
  f32x4 s = wasm_f32x4_div(sel(neg, es, F4(16777216.f)), madd(es, F4(5.9604645e-08f), F4(1.f)));
  return sel(neg, wasm_f32x4_mul(wasm_f32x4_mul(x, s), F4(5.9604645e-08f)),
             wasm_f32x4_mul(x, wasm_f32x4_mul(s, F4(5.9604645e-08f))));
}

/* silu(x) = x sigmoid(x): x / (1 + e) for x >= 0, (x e) / (1 + e) below, e = exp(-|x|) taken
 * scaled by 2^24 so that the product stays normal until the last step. silu(-inf) = NaN. */
INLINE f32x4 silu4(f32x4 x) {
  f32x4 es = exp_core(wasm_f32x4_neg(vabs(x)), 0, x, 24);
  f32x4 d = madd(es, F4(5.9604645e-08f), F4(1.f));
  f32x4 neg = wasm_f32x4_mul(wasm_f32x4_div(wasm_f32x4_mul(x, es), d), F4(5.9604645e-08f));
  f32x4 y = sel(wasm_f32x4_ge(x, F4(0.f)), wasm_f32x4_div(x, d), neg);   /* NaN: neg (NaN) */
  return sel(wasm_f32x4_eq(x, F4(-__builtin_inff())), F4(__builtin_nanf("")), y);
}

/* ---- sin, cos ---------------------------------------------------------------------------------
 * |x| = k pi/2 + r, |r| <= pi/4, reduced in float64 (pi/2 as a 33-bit head, exact times k < 2^20,
 * plus a 53-bit tail), so r is accurate for |x| < 2^20; lanes beyond (finite) are flagged in the
 * returned mask and left to the caller. sin(r) = r + r^3 P(r^2) (fit error 3.8e-9), cos(r) =
 * 1 - r^2/2 + r^4 Q(r^2) (1.2e-10); the quadrant k mod 4 picks and negates. */
#define TRIG_LIMIT 1048576.f

typedef struct { f32x4 r; i32x4 q; } reduced_t;

INLINE reduced_t reduce_pio2(f32x4 ax) {
  const v128_t invpio2 = wasm_f64x2_splat(0.63661977236758138), hi = wasm_f64x2_splat(1.5707963267341256),
               lo = wasm_f64x2_splat(6.0771005065061922e-11);
  v128_t a0 = wasm_f64x2_promote_low_f32x4(ax);
  v128_t a1 = wasm_f64x2_promote_low_f32x4(wasm_i32x4_shuffle(ax, ax, 2, 3, 2, 3));
  v128_t k0 = wasm_f64x2_nearest(wasm_f64x2_mul(a0, invpio2));
  v128_t k1 = wasm_f64x2_nearest(wasm_f64x2_mul(a1, invpio2));
  v128_t r0 = wasm_f64x2_sub(wasm_f64x2_sub(a0, wasm_f64x2_mul(k0, hi)), wasm_f64x2_mul(k0, lo));
  v128_t r1 = wasm_f64x2_sub(wasm_f64x2_sub(a1, wasm_f64x2_mul(k1, hi)), wasm_f64x2_mul(k1, lo));
  reduced_t out;
  out.r = wasm_i32x4_shuffle(wasm_f32x4_demote_f64x2_zero(r0), wasm_f32x4_demote_f64x2_zero(r1), 0, 1, 4, 5);
  out.q = wasm_i32x4_shuffle(wasm_i32x4_trunc_sat_f64x2_zero(k0), wasm_i32x4_trunc_sat_f64x2_zero(k1), 0, 1, 4, 5);
  return out;
}

INLINE f32x4 sin_poly(f32x4 r, f32x4 z) {
  f32x4 p = madd(z, F4(-1.951528247e-04f), F4(8.332160302e-03f));
  p = madd(p, z, F4(-1.666665524e-01f));
  return wasm_f32x4_add(wasm_f32x4_mul(wasm_f32x4_mul(p, z), r), r);
}

INLINE f32x4 cos_poly(f32x4 z) {
  f32x4 p = madd(z, F4(2.443315498e-05f), F4(-1.388731645e-03f));
  p = madd(p, z, F4(4.166664556e-02f));
  p = wasm_f32x4_mul(wasm_f32x4_mul(p, z), z);
  return wasm_f32x4_add(wasm_f32x4_sub(F4(1.f), wasm_f32x4_mul(z, F4(0.5f))), p);
}

/* sin (cosine = 0) or cos (cosine = 1); *big gets the lanes the caller must redo. */
INLINE f32x4 sincos4(f32x4 x, i32 cosine, i32x4 *big) {
  f32x4 ax = vabs(x);
  *big = wasm_v128_and(wasm_f32x4_ge(ax, F4(TRIG_LIMIT)), wasm_f32x4_lt(ax, F4(__builtin_inff())));
  reduced_t red = reduce_pio2(wasm_f32x4_pmin(ax, F4(TRIG_LIMIT)));   /* keeps k in range */
  f32x4 z = wasm_f32x4_mul(red.r, red.r);
  f32x4 s = sin_poly(red.r, z), c = cos_poly(z);
  i32x4 q = wasm_i32x4_add(red.q, I4(cosine));
  i32x4 odd = wasm_i32x4_eq(wasm_v128_and(q, I4(1)), I4(1));
  f32x4 v = sel(odd, c, s);
  v = wasm_v128_xor(v, wasm_i32x4_shl(wasm_v128_and(q, I4(2)), 30));
  if (!cosine) v = wasm_v128_xor(v, sign_of(x));
  /* inf -> NaN (the reduction gives inf - inf); NaN stays NaN */
  return sel(wasm_f32x4_eq(ax, F4(__builtin_inff())), F4(__builtin_nanf("")), sel(wasm_f32x4_ne(x, x), x, v));
}

#endif
