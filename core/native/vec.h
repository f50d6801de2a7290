/* float32 vectors for the native kernels (dense.c, fused.c, rows.c's GELU): VW lanes, the widest
 * this target's registers hold: 16 with AVX-512, 8 with AVX, else 4 (SSE2, NEON, or the compiler's
 * own lowering elsewhere). GCC / clang vector extensions; intrinsics only where noted. Every
 * target compiles (tests/test_native_build.py builds for x86-64, -v2, -v3, -v4 and native): a
 * CPU without AVX gets 4-lane code, never a failed build.
 *
 * The math here (vexp, vphi, the activations of `finish`) gives the same bits whether or not the
 * including file is compiled with FP contraction: exact fused multiply-adds are explicit (vfma),
 * and a product that an add follows passes through NO_CONTRACT first. */
#ifndef EMBER_VEC_H
#define EMBER_VEC_H
#include "ember_native.h"
#include <math.h>
#include <string.h>

/* (vectors pass only between static inline functions: no ABI to keep, where a target without
 * registers of their width would warn about one) */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#if defined(__AVX512F__)
#include <immintrin.h>
#define VW 16
#elif defined(__AVX__)
#include <immintrin.h>
#define VW 8
#else
#define VW 4
#endif
typedef f32 vf __attribute__((vector_size(VW * 4)));
typedef f32 vfu __attribute__((vector_size(VW * 4), aligned(4)));   /* an unaligned load or store */
typedef i32 vi __attribute__((vector_size(VW * 4)));

INLINE vf load(const f32 *p) { return *(const vfu *)p; }
INLINE void store(f32 *p, vf v) { *(vfu *)p = v; }
INLINE vf splat(f32 a) {   /* (not 0 + a: an add, and +0 for -0; GCC builds a lane loop lane by lane) */
#if defined(__AVX512F__)
  return (vf)_mm512_set1_ps(a);
#elif defined(__AVX__)
  return (vf)_mm256_set1_ps(a);
#else
  vf v;
  for (int l = 0; l < VW; l++) v[l] = a;
  return v;
#endif
}

#if defined(__AVX512F__)
/* lanes [0, n) of p, 0 < n <= VW, by masked loads/stores (no access to the other lanes) */
INLINE vf load_part(const f32 *p, i64 n) { return (vf)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
INLINE void store_part(f32 *p, vf v, i64 n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)v); }
#else
INLINE vf load_part(const f32 *p, i64 n) {
  vf v = {0};
  memcpy(&v, p, (size_t)n * 4);
  return v;
}
INLINE void store_part(f32 *p, vf v, i64 n) { memcpy(p, &v, (size_t)n * 4); }
#endif
/* lanes [0, n) of p, 0 < n <= VW (a whole vector for n == VW) */
INLINE vf load_n(const f32 *p, i64 n) { return n == VW ? load(p) : load_part(p, n); }
INLINE void store_n(f32 *p, vf v, i64 n) {
  if (n == VW) store(p, v);
  else store_part(p, v, n);
}

/* an empty asm the value passes through: the compiler cannot fuse the product before it with the
 * add after it (dense.c is compiled with FP contraction), so results round as numpy's steps.
 * (x86: "v" names any vector register with AVX, "x" an SSE register for the 16-byte vectors of a
 * target without AVX) */
#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX__)
#define NO_CONTRACT(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) || defined(__i386__)
#define NO_CONTRACT(v) __asm__("" : "+x"(v))
#elif defined(__aarch64__)
#define NO_CONTRACT(v) __asm__("" : "+w"(v))
#else
#define NO_CONTRACT(v) __asm__("" : "+m"(v))
#endif

INLINE vf sel(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }   /* m ? a : b */

/* a * b + c rounded once (fmaf per lane), by the FMA instruction where the target has one; a
 * target without it calls libm's fmaf (exact, slow): rows.c's scalar code did the same */
INLINE vf vfma(vf a, vf b, vf c) {
#if defined(__AVX512F__)
  return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__) && VW == 8
  return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  vf r;
  for (int l = 0; l < VW; l++) r[l] = fmaf(a[l], b[l], c[l]);
  return r;
#endif
}

/* a * b + c for the matrix products' inner loops: the FMA instruction where there is one, else a
 * multiply and an add (a CPU without FMA: other roundings of the same sums, never libm's fmaf) */
INLINE vf vmadd(vf a, vf b, vf c) {
#if defined(__AVX512F__) || (defined(__FMA__) && VW == 8)
  return vfma(a, b, c);
#else
  vf t = a * b;
  NO_CONTRACT(t);
  return t + c;
#endif
}

/* ---- activations (the epilogues of dense.c and fused.c) ----------------------------------------
 *   0 none, 1 relu max(v, 0), 2 clip min(max(v, lo), hi), 3 hard sigmoid clip(v * a + b, 0, 1),
 *   4 hard swish v * clip(v * a + b, 0, 1), 5 GELU x Phi(x) (erf form), 6 GELU tanh form
 * ap = [a, b, lo, hi]. 0-4 round each step as numpy's clip / multiply / add (NaN stays NaN, -0
 * stays -0 as in numpy's clip); 5 and 6 are rows.c's ember_gelu_erf / ember_gelu_tanh. */
enum { ACT_NONE, ACT_RELU, ACT_CLIP, ACT_HARD_SIGMOID, ACT_HARD_SWISH, ACT_GELU, ACT_GELU_TANH, ACT_COUNT };

/* e^x in float32, within ~1 ulp on the normal range: x = n ln2 + r, |r| <= ln2 / 2,
 * e^r = 1 + r + r^2 q(r) with q of degree 4 (fitted for this file: relative error 3.7e-9 in
 * float64), times 2^n as two powers of two, so that results below 2^-126 are denormals as
 * libm's (rounded twice there: within one denormal step) and below 2^-150 zero. x is clamped to
 * [-110, 100] (e^100 overflows to inf) by comparisons that drop NaN: a NaN x is put back at the
 * end. n comes from the bits of x log2(e) + 1.5 * 2^23 (round to nearest), not an int
 * conversion. */
INLINE vf vexp(vf x) {
  vf c = sel(x > -110.0f, x, splat(-110.0f));
  c = sel(c < 100.0f, c, splat(100.0f));
  const vf magic = splat(12582912.0f);                 /* 1.5 * 2^23 */
  vf big = vfma(c, splat(1.44269504088896341f), magic);
  vi n = (vi)big - (vi)magic;
  vf nf = big - magic;
  vf r = vfma(-nf, splat(0.693147182464599609375f), c);     /* ln 2 rounded to float32 ... */
  r = vfma(-nf, splat(-1.904654299957768e-09f), r);         /* ... and the rest of it */
  vf q = splat(0.001375140812096566f);
  q = vfma(q, r, splat(0.008368918534079603f));
  q = vfma(q, r, splat(0.041669533338383274f));
  q = vfma(q, r, splat(0.16666518441755224f));
  q = vfma(q, r, splat(0.49999988593388706f));
  vf p = vfma(q, r * r, r) + 1.0f;
  vi h = n >> 1;
  vf e = p * (vf)((h + 127) << 23) * (vf)((n - h + 127) << 23);
  NO_CONTRACT(e);
  return sel(x != x, x, e);
}

/* Phi(x), the standard normal CDF, in float32 (fitted for this file, least squares on the
 * relative error in float64):
 *  - |x| < 1: 0.5 + x P(x^2), P of degree 5 (relative error 8e-10 on Phi - 0.5);
 *  - |x| >= 1: Q = Phi(-|x|) = e^(-x^2/2) t S(t), t = 1 / (1 + |x| / 2), S of degree 9 (relative
 *    error 1.3e-8 on [1, 14] in float64, ~2e-7 in float32 Horner), x^2 / 2's rounding corrected
 *    with its fma remainder; Phi = Q for x < 0, 1 - Q for x > 0; |x| is clamped to 20, where Q
 *    is 0 in float32.
 * Phi(-inf) = 0, Phi(inf) = 1, Phi(NaN) = NaN. */
INLINE vf vphi(vf x) {
  vf a = (vf)((vi)x & 0x7fffffff);
  a = sel(a < 20.0f, a, splat(20.0f));                 /* (Q(20) underflows to 0; inf * inf stays out) */
  vf t2 = a * a;
  vf p = splat(-7.680459413712414e-06f);
  p = vfma(p, t2, splat(0.00011355642129094318f));
  p = vfma(p, t2, splat(-0.0011863969843739636f));
  p = vfma(p, t2, splat(0.009973350765947197f));
  p = vfma(p, t2, splat(-0.06649036422121676f));
  p = vfma(p, t2, splat(0.3989422802733794f));
  vf near = vfma(x, p, splat(0.5f));
  vf t = 1.0f / vfma(splat(0.5f), a, splat(1.0f));
  vf s = splat(0.13961028980167478f);
  s = vfma(s, t, splat(-0.4340695151015087f));
  s = vfma(s, t, splat(0.43709021482500937f));
  s = vfma(s, t, splat(-0.023113768580281857f));
  s = vfma(s, t, splat(-0.1793759567340703f));
  s = vfma(s, t, splat(-0.031544024703741784f));
  s = vfma(s, t, splat(0.042697205392194945f));
  s = vfma(s, t, splat(0.15055368732455907f));
  s = vfma(s, t, splat(0.19940307337913235f));
  s = vfma(s, t, splat(0.1994731861881466f));
  s *= t;
  vf e = vexp(-0.5f * t2);
  e = vfma(-0.5f * vfma(a, a, -t2), e, e);             /* e^(-x^2/2) with x^2's rounding undone */
  vf q = e * s;
  NO_CONTRACT(q);
  vf far = sel(x < 0.0f, q, 1.0f - q);
  return sel(a < 1.0f, near, far);
}

/* GELU's exact (erf) form x Phi(x); gelu(-inf) = -inf * 0 = NaN, as the numpy path */
INLINE vf vgelu_erf(vf x) { return x * vphi(x); }

/* GELU's tanh form x / (1 + e^(-2k)), k = sqrt(2 / pi) (x + 0.044715 x^3): x (1 + tanh k) / 2 =
 * x sigmoid(2k) (no cancellation in 1 + tanh k for negative x) */
INLINE vf vgelu_tanh(vf v) {
  vf k = 0.7978845608028654f * vfma(0.044715f * v * v, v, v);
  return v / (1.0f + vexp(-2.0f * k));
}

/* the epilogue of one vector: + bias (a scalar, where there is one), then the activation */
INLINE vf finish(vf v, int has_bias, f32 bias, int act, const f32 *ap) {
  const vf zero = {0};
  if (has_bias) v = v + bias;
  if (act == ACT_NONE) return v;
  if (act == ACT_GELU) return vgelu_erf(v);
  if (act == ACT_GELU_TANH) return vgelu_tanh(v);
  if (act == ACT_RELU || act == ACT_CLIP) {
    vf lo = zero + (act == ACT_RELU ? 0.0f : ap[2]);
    v = sel(v < lo, lo, v);                  /* (NaN compares false: kept; so is -0 against 0, as in numpy) */
    if (act == ACT_CLIP) {
      vf hi = zero + ap[3];
      v = sel(v > hi, hi, v);
    }
    return v;
  }
  const vf one = zero + 1.0f;
  vf t = v * ap[0];
  NO_CONTRACT(t);                            /* (rounded before the add: numpy's multiply, then add) */
  t = t + ap[1];
  t = sel(t < zero, zero, t);
  t = sel(t > one, one, t);
  return act == ACT_HARD_SWISH ? v * t : t;
}

/* finish() with the activation a compile-time constant in each case (a switch per vector would
 * not be hoisted out of the callers' loops) */
#define FINISH_ACTS(ACT_CASE)                                                     \
  switch (act) {                                                                  \
    case ACT_NONE: ACT_CASE(ACT_NONE); break;                                     \
    case ACT_RELU: ACT_CASE(ACT_RELU); break;                                     \
    case ACT_CLIP: ACT_CASE(ACT_CLIP); break;                                     \
    case ACT_HARD_SIGMOID: ACT_CASE(ACT_HARD_SIGMOID); break;                     \
    case ACT_HARD_SWISH: ACT_CASE(ACT_HARD_SWISH); break;                         \
    case ACT_GELU: ACT_CASE(ACT_GELU); break;                                     \
    default: ACT_CASE(ACT_GELU_TANH); break;                                      \
  }

#endif
