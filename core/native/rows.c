/* Row kernels of the numpy backend: GELU (erf and tanh forms), layer norm and softmax over the
 * last axis, and the int8 path of quantized graphs (DynamicQuantizeLinear's pass over the data,
 * MatMulInteger's uint8 x int8 product). Each kernel is one loop over a range of rows (or
 * elements) of contiguous float32 data; Python splits a call into whole-row ranges for its
 * threads, so the bits never depend on the thread count.
 *
 * Sums run in 16 float32 lanes (lane j adds elements j, j + 16, ...; the lanes are then added in
 * a fixed pairwise order): the compiler keeps them in vector registers without reassociating
 * anything (no -ffast-math), and the order is the same on any machine.
 *
 * exp, erf: our own float32 approximations (below), written so that the compiler vectorises the
 * loops that call them: libm's expf is a call per element. */
#include "ember_native.h"
#include <math.h>
#include <string.h>

#define LANES 16

INLINE f32 bits_f32(int32_t b) { f32 f; memcpy(&f, &b, 4); return f; }
INLINE int32_t f32_bits(f32 f) { int32_t b; memcpy(&b, &f, 4); return b; }

/* e^x in float32, within ~1 ulp on the normal range: x = n ln2 + r, |r| <= ln2 / 2,
 * e^r = 1 + r + r^2 q(r) with q of degree 4 (fitted for this file: relative error 3.7e-9 in
 * float64), times 2^n as two powers of two, so that results below 2^-126 are denormals as
 * libm's (rounded twice there: within one denormal step) and below 2^-150 zero. x is clamped to
 * [-110, 100] (e^100 overflows to inf) by comparisons that drop NaN: a NaN x is put back at the
 * end. n comes from the bits of x log2(e) + 1.5 * 2^23 (round to nearest), not an int
 * conversion. */
INLINE f32 exp_f32(f32 x) {
  f32 c = x > -110.0f ? x : -110.0f;                  /* (maxps, minps: NaN becomes the bound) */
  c = c < 100.0f ? c : 100.0f;
  const f32 magic = 12582912.0f;                       /* 1.5 * 2^23 */
  f32 big = fmaf(c, 1.44269504088896341f, magic);
  int32_t n = f32_bits(big) - f32_bits(magic);
  f32 nf = big - magic;
  f32 r = fmaf(-nf, 0.693147182464599609375f, c);      /* ln 2 rounded to float32 ... */
  r = fmaf(-nf, -1.904654299957768e-09f, r);           /* ... and the rest of it */
  f32 q = 0.001375140812096566f;
  q = fmaf(q, r, 0.008368918534079603f);
  q = fmaf(q, r, 0.041669533338383274f);
  q = fmaf(q, r, 0.16666518441755224f);
  q = fmaf(q, r, 0.49999988593388706f);
  f32 p = fmaf(q, r * r, r) + 1.0f;
  int32_t h = n >> 1;
  f32 e = p * bits_f32((h + 127) << 23) * bits_f32((n - h + 127) << 23);
  return x != x ? x : e;
}

/* Phi(x), the standard normal CDF, in float32 (fitted for this file, least squares on the
 * relative error in float64):
 *  - |x| < 1: 0.5 + x P(x^2), P of degree 5 (relative error 8e-10 on Phi - 0.5);
 *  - |x| >= 1: Q = Phi(-|x|) = e^(-x^2/2) t S(t), t = 1 / (1 + |x| / 2), S of degree 9 (relative
 *    error 1.3e-8 on [1, 14] in float64, ~2e-7 in float32 Horner), x^2 / 2's rounding corrected
 *    with its fma remainder; Phi = Q for x < 0, 1 - Q for x > 0; |x| is clamped to 20, where Q
 *    is 0 in float32.
 * Phi(-inf) = 0, Phi(inf) = 1, Phi(NaN) = NaN. */
INLINE f32 phi_f32(f32 x) {
  f32 a = fabsf(x);
  a = a < 20.0f ? a : 20.0f;                           /* (Q(20) underflows to 0; inf * inf stays out) */
  f32 t2 = a * a;
  f32 p = -7.680459413712414e-06f;
  p = fmaf(p, t2, 0.00011355642129094318f);
  p = fmaf(p, t2, -0.0011863969843739636f);
  p = fmaf(p, t2, 0.009973350765947197f);
  p = fmaf(p, t2, -0.06649036422121676f);
  p = fmaf(p, t2, 0.3989422802733794f);
  f32 near = fmaf(x, p, 0.5f);
  f32 t = 1.0f / fmaf(0.5f, a, 1.0f);
  f32 s = 0.13961028980167478f;
  s = fmaf(s, t, -0.4340695151015087f);
  s = fmaf(s, t, 0.43709021482500937f);
  s = fmaf(s, t, -0.023113768580281857f);
  s = fmaf(s, t, -0.1793759567340703f);
  s = fmaf(s, t, -0.031544024703741784f);
  s = fmaf(s, t, 0.042697205392194945f);
  s = fmaf(s, t, 0.15055368732455907f);
  s = fmaf(s, t, 0.19940307337913235f);
  s = fmaf(s, t, 0.1994731861881466f);
  s *= t;
  f32 e = exp_f32(-0.5f * t2);
  e = fmaf(-0.5f * fmaf(a, a, -t2), e, e);             /* e^(-x^2/2) with x^2's rounding undone */
  f32 q = e * s;
  f32 far = x < 0.0f ? q : 1.0f - q;
  return a < 1.0f ? near : far;
}

/* y = x Phi(x) for i in [0, n): GELU's exact (erf) form. gelu(-inf) = -inf * 0 = NaN, as the
 * numpy path. */
EXPORT void ember_gelu_erf(i64 n, const f32 *x, f32 *y) {
  for (i64 i = 0; i < n; i++) y[i] = x[i] * phi_f32(x[i]);
}

/* y = x / (1 + e^(-2k)), k = sqrt(2 / pi) (x + 0.044715 x^3): GELU's tanh form, written as
 * x (1 + tanh k) / 2 = x sigmoid(2k) (no cancellation in 1 + tanh k for negative x). */
EXPORT void ember_gelu_tanh(i64 n, const f32 *x, f32 *y) {
  for (i64 i = 0; i < n; i++) {
    f32 v = x[i];
    f32 k = 0.7978845608028654f * fmaf(0.044715f * v * v, v, v);
    y[i] = v / (1.0f + exp_f32(-2.0f * k));
  }
}

/* 16 float32 lanes as one GCC vector (vector extensions: clang and gcc; a vector register or
 * two), loaded and stored unaligned through memcpy; comparisons give lane masks (-1 / 0) */
typedef f32 v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

INLINE v16 vload(const f32 *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
INLINE v16 vsplat(f32 a) { return (v16){a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a}; }
INLINE v16 vsel(v16i m, v16 a, v16 b) { return (v16)((m & (v16i)a) | (~m & (v16i)b)); }

/* the lane sums' fixed pairwise order: (0+8, 1+9, ...), then (0+4, ...), (0+2, ...), 0+1 */
INLINE f32 lanes_sum(v16 acc) {
  f32 a[LANES];
  memcpy(a, &acc, sizeof a);
  for (int w = LANES / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; j++) a[j] += a[j + w];
  return a[0];
}

/* sum of x[0, n): lane j adds x[j], x[j + 16], ... (the tail's values into lanes 0, 1, ...) */
INLINE f32 row_sum(i64 n, const f32 *x) {
  v16 acc = vsplat(0.0f);
  i64 i = 0;
  for (; i + LANES <= n; i += LANES) acc += vload(x + i);
  for (int j = 0; i + j < n; j++) acc[j] += x[i + j];
  return lanes_sum(acc);
}

/* max of x[0, n) (n >= 1; a NaN may or may not win: the callers' NaN comes out either way) */
INLINE f32 row_max(i64 n, const f32 *x) {
  v16 mx = vsplat(-INFINITY);
  i64 i = 0;
  for (; i + LANES <= n; i += LANES) {
    v16 v = vload(x + i);
    mx = vsel(v > mx, v, mx);
  }
  for (int j = 0; i + j < n; j++) mx[j] = x[i + j] > mx[j] ? x[i + j] : mx[j];
  f32 m = mx[0];
  for (int j = 1; j < LANES; j++) m = mx[j] > m ? mx[j] : m;
  return m;
}

/* rows [0, rows) of n values: y = (x - mean) / sqrt(var + eps) * w + b, mean and the biased
 * variance (of the deviations: two passes, as the numpy path) in float32 lane sums; the rest
 * the numpy path's float32 operations in its order. */
EXPORT void ember_layer_norm(i64 rows, i64 n, const f32 *x, const f32 *w, const f32 *b, f32 eps, f32 *y) {
  for (i64 r = 0; r < rows; r++) {
    const f32 *xr = x + r * n;
    f32 *yr = y + r * n;
    f32 mean = row_sum(n, xr) / (f32)n;
    v16 acc = vsplat(0.0f), vm = vsplat(mean);
    i64 i = 0;
    for (; i + LANES <= n; i += LANES) {
      v16 d = vload(xr + i) - vm;
      acc += d * d;
    }
    for (int j = 0; i + j < n; j++) {
      f32 d = xr[i + j] - mean;
      acc[j] += d * d;
    }
    f32 sd = sqrtf(lanes_sum(acc) / (f32)n + eps);
    for (i64 k = 0; k < n; k++) yr[k] = (xr[k] - mean) / sd * w[k] + b[k];
  }
}

/* rows [0, rows) of n values: softmax, as the numpy path (numpy_nn._softmax): y = e^x / sum(e^x)
 * where the row's sum s lies in [1, FLT_MAX] (then nothing underflowed that the shifted form
 * keeps, and nothing overflowed; e^x is not rounded through x - max: more accurate), else the
 * shifted form e^(x - max) / sum(e^(x - max)) for that row: a row with NaN or +inf gives NaN
 * (e^NaN, inf - inf), a row of -inf NaN (-inf - -inf), very negative rows their exact shift.
 * Blocks of rows: e^ over the whole block as one loop (short rows would otherwise run the
 * vector loop's set-up per row), then the sums and divisions per row. */
#define SOFTMAX_BLOCK 4096

INLINE void row_divide(i64 n, f32 *yr, f32 s) {
  v16 vs = vsplat(s);
  i64 i = 0;
  for (; i + LANES <= n; i += LANES) {
    v16 q = vload(yr + i) / vs;
    memcpy(yr + i, &q, sizeof q);
  }
  for (; i < n; i++) yr[i] = yr[i] / s;
}

EXPORT void ember_softmax(i64 rows, i64 n, const f32 *x, f32 *y) {
  i64 step = n >= SOFTMAX_BLOCK ? 1 : SOFTMAX_BLOCK / n;
  for (i64 r0 = 0; r0 < rows; r0 += step) {
    i64 r1 = r0 + step < rows ? r0 + step : rows;
    const f32 *xb = x + r0 * n;
    f32 *yb = y + r0 * n;
    for (i64 k = 0; k < (r1 - r0) * n; k++) yb[k] = exp_f32(xb[k]);
    for (i64 r = r0; r < r1; r++) {
      const f32 *xr = x + r * n;
      f32 *yr = y + r * n;
      f32 s = row_sum(n, yr);
      if (!(s >= 1.0f && s <= 3.40282347e38f)) {          /* (NaN fails both) */
        f32 m = row_max(n, xr);
        for (i64 k = 0; k < n; k++) yr[k] = exp_f32(xr[k] - m);
        s = row_sum(n, yr);
      }
      row_divide(n, yr, s);
    }
  }
}

/* ---- int8 ----------------------------------------------------------------------------------- */

/* DynamicQuantizeLinear's y for finite x and scale: q = min(max(rint(x / scale) + zp, lo), hi)
 * (rint: round half to even, the default rounding mode), the same float32 operations as the
 * numpy path; written as uint8 (u8 != NULL) or as q - zp in float32 (f != NULL: the "centered"
 * form the float32 BLAS path reads). */
EXPORT void ember_quantize(i64 n, const f32 *x, f32 scale, f32 zp, f32 lo, f32 hi, uint8_t *u8, f32 *f) {
  if (u8) {
    for (i64 i = 0; i < n; i++) {
      f32 q = rintf(x[i] / scale) + zp;
      q = q < lo ? lo : q;
      q = q > hi ? hi : q;
      u8[i] = (uint8_t)(int32_t)q;
    }
  } else {
    f32 l = lo - zp, h = hi - zp;
    for (i64 i = 0; i < n; i++) {
      f32 q = rintf(x[i] / scale);
      q = q < l ? l : q;
      f[i] = q > h ? h : q;
    }
  }
}

/* DynamicQuantizeLinear as ember.onnx.quant writes it (numpy_plan._dynamic_quantize's pattern),
 * whole: c = {lo0, hi0, n255, zero, one, zlo, zhi, ylo, yhi} its float32 constants (0 <= zlo <=
 * zhi <= 255, checked by Python); lo = min(min(x), lo0), hi = max(max(x), hi0), scale = (hi -
 * lo) / n255 (one where that is zero), zp = min(max(rint(-(lo / scale)), zlo), zhi), then y as
 * ember_quantize. Every step the numpy path's float32 operation. Returns 0 (and writes nothing)
 * where x holds NaN or inf or the scale is not finite: the caller's numpy path then runs the
 * recorded steps (NaN -> 0 casts). */
EXPORT int ember_dynamic_quantize(i64 n, const f32 *x, const f32 *c, f32 *scale_out, uint8_t *zp_out,
                                  uint8_t *u8, f32 *f) {
  if (n < 1) return 0;
  v16 lo = vsplat(x[0]), hi = lo, bad = vsplat(0.0f);
  i64 i = 0;
  for (; i + LANES <= n; i += LANES) {
    v16 v = vload(x + i);
    lo = vsel(v < lo, v, lo);
    hi = vsel(v > hi, v, hi);
    bad += v - v;                                       /* NaN once any value is NaN or inf */
  }
  for (int j = 0; i + j < n; j++) {
    f32 v = x[i + j];
    lo[j] = v < lo[j] ? v : lo[j];
    hi[j] = v > hi[j] ? v : hi[j];
    bad[j] += v - v;
  }
  f32 l = lo[0], h = hi[0], e = 0.0f;
  for (int j = 0; j < LANES; j++) {
    l = lo[j] < l ? lo[j] : l;
    h = hi[j] > h ? hi[j] : h;
    e += bad[j];
  }
  if (e != 0.0f) return 0;
  l = c[0] < l ? c[0] : l;
  h = c[1] > h ? c[1] : h;
  f32 scale = (h - l) / c[2];
  if (scale == c[3]) scale = c[4];
  if (!(fabsf(scale) <= 3.40282347e38f) || !(fabsf(l) <= 3.40282347e38f) || !(fabsf(h) <= 3.40282347e38f))
    return 0;
  f32 z = rintf(-(l / scale));
  z = z > c[5] ? z : c[5];
  z = z < c[6] ? z : c[6];
  if (!(z == z)) return 0;
  *scale_out = scale;
  *zp_out = (uint8_t)(int32_t)z;
  ember_quantize(n, x, scale, z, c[7], c[8], u8, f);
  return 1;
}

/* MatMulInteger: C[m, n] = sum_k (A[m, k] - za) W[k, n] = sum_k A[m, k] W[k, n] - za colsum[n],
 * A uint8 (rows of lda bytes), W int8 packed by Python (rows.py's pack) as blocks of QN = 64
 * columns: block b holds, for each quad of k (K padded to a multiple of 4 with zeros), its 64
 * columns' 4 values: packed[((b * KQ + kq) * 64 + j) * 4 + q] = W[4 kq + q, 64 b + j]; colsum
 * (padded to the blocks' width) the column sums of W. Rows [r0, r1) into C (int32, or float32
 * when cf: the int32 value converted, exact below 2^24), ldc elements per row. Exact integers:
 * every |product sum| < K * 255 * 128 < 2^31 (Python checks K). */
#define QN 64
#define QM 4

INLINE void qgemm_store(i64 ncols, const int32_t *acc, const int32_t *colsum, int32_t za, int32_t *ci, f32 *cf) {
  for (i64 j = 0; j < ncols; j++) {
    int32_t v = acc[j] - za * colsum[j];
    if (cf) cf[j] = (f32)v;
    else ci[j] = v;
  }
}

/* the portable kernel: every machine, and the reference the vectorised one is tested against */
EXPORT void ember_qgemm_generic(i64 r0, i64 r1, i64 K, i64 N, const uint8_t *A, i64 lda, int32_t za,
                                const int8_t *packed, const int32_t *colsum, int32_t *ci, f32 *cf, i64 ldc) {
  i64 KQ = (K + 3) / 4, NB = (N + QN - 1) / QN;
  for (i64 m = r0; m < r1; m++) {
    const uint8_t *a = A + m * lda;
    for (i64 b = 0; b < NB; b++) {
      int32_t acc[QN] = {0};
      const int8_t *wb = packed + b * KQ * QN * 4;
      for (i64 kq = 0; kq < KQ; kq++) {
        uint8_t av[4] = {0, 0, 0, 0};
        for (int q = 0; q < 4 && 4 * kq + q < K; q++) av[q] = a[4 * kq + q];
        const int8_t *w = wb + kq * QN * 4;
        for (int j = 0; j < QN; j++)
          acc[j] += av[0] * w[4 * j] + av[1] * w[4 * j + 1] + av[2] * w[4 * j + 2] + av[3] * w[4 * j + 3];
      }
      i64 nc = N - b * QN < QN ? N - b * QN : QN;
      qgemm_store(nc, acc, colsum + b * QN, za, ci ? ci + m * ldc + b * QN : NULL, cf ? cf + m * ldc + b * QN : NULL);
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>

/* A's 4 bytes from k = 4 kq on as one int32 lane value (zeros past K) */
INLINE int32_t quad(const uint8_t *a, i64 kq, i64 K) {
  int32_t v = 0;
  i64 k = 4 * kq;
  memcpy(&v, a + k, (size_t)(K - k >= 4 ? 4 : K - k));
  return v;
}

/* the product's epilogue for one row: - za colsum, int32 or float32, the columns past nc masked */
INLINE void qgemm_row_out(__m512i c0, __m512i c1, __m512i c2, __m512i c3, const int32_t *colsum, __m512i zv,
                          i64 nc, int32_t *ci, f32 *cf) {
  __m512i acc[4] = {c0, c1, c2, c3};
  for (int j = 0; j < 4 && 16 * j < nc; j++) {
    __m512i cs = _mm512_loadu_si512(colsum + 16 * j);
    __m512i v = _mm512_sub_epi32(acc[j], _mm512_mullo_epi32(cs, zv));
    __mmask16 keep = nc - 16 * j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nc - 16 * j)) - 1);
    if (cf) _mm512_mask_storeu_ps(cf + 16 * j, keep, _mm512_cvtepi32_ps(v));
    else _mm512_mask_storeu_epi32(ci + 16 * j, keep, v);
  }
}

/* one row's 4 A bytes times the 4 x 64 W values, into that row's 4 accumulators */
#define QROW(q, c0, c1, c2, c3) do {                                                   \
    __m512i av_ = _mm512_set1_epi32(q);                                                 \
    c0 = _mm512_dpbusd_epi32(c0, av_, w0); c1 = _mm512_dpbusd_epi32(c1, av_, w1);      \
    c2 = _mm512_dpbusd_epi32(c2, av_, w2); c3 = _mm512_dpbusd_epi32(c3, av_, w3);      \
  } while (0)

/* QM = 4 rows x 64 columns per step: 16 accumulators in registers, vpdpbusd (4 uint8 x int8
 * products summed into each int32 lane) per row and 16 columns; the full quads of k, then the
 * last partial one (zeros past K) */
EXPORT void ember_qgemm(i64 r0, i64 r1, i64 K, i64 N, const uint8_t *A, i64 lda, int32_t za,
                        const int8_t *packed, const int32_t *colsum, int32_t *ci, f32 *cf, i64 ldc) {
  i64 KQ = (K + 3) / 4, NB = (N + QN - 1) / QN, KF = K / 4;
  __m512i zv = _mm512_set1_epi32(za);
  for (i64 b = 0; b < NB; b++) {
    const int8_t *wb = packed + b * KQ * QN * 4;
    i64 nc = N - b * QN < QN ? N - b * QN : QN;
    for (i64 m = r0; m < r1; m += QM) {
      const uint8_t *a0 = A + m * lda;                                      /* (tail: repeat a row) */
      const uint8_t *a1 = A + (m + 1 < r1 ? m + 1 : r1 - 1) * lda;
      const uint8_t *a2 = A + (m + 2 < r1 ? m + 2 : r1 - 1) * lda;
      const uint8_t *a3 = A + (m + 3 < r1 ? m + 3 : r1 - 1) * lda;
      __m512i c00 = _mm512_setzero_si512(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00,
              c13 = c00, c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00;
      for (i64 kq = 0; kq < KQ; kq++) {
        const int8_t *w = wb + kq * QN * 4;
        __m512i w0 = _mm512_loadu_si512(w), w1 = _mm512_loadu_si512(w + 64);
        __m512i w2 = _mm512_loadu_si512(w + 128), w3 = _mm512_loadu_si512(w + 192);
        int32_t q0, q1, q2, q3;
        if (kq < KF) {
          memcpy(&q0, a0 + 4 * kq, 4), memcpy(&q1, a1 + 4 * kq, 4);
          memcpy(&q2, a2 + 4 * kq, 4), memcpy(&q3, a3 + 4 * kq, 4);
        } else {
          q0 = quad(a0, kq, K), q1 = quad(a1, kq, K), q2 = quad(a2, kq, K), q3 = quad(a3, kq, K);
        }
        QROW(q0, c00, c01, c02, c03);
        QROW(q1, c10, c11, c12, c13);
        QROW(q2, c20, c21, c22, c23);
        QROW(q3, c30, c31, c32, c33);
      }
      i64 off = m * ldc + b * QN;
      const int32_t *cs = colsum + b * QN;
      qgemm_row_out(c00, c01, c02, c03, cs, zv, nc, ci ? ci + off : NULL, cf ? cf + off : NULL);
      if (m + 1 < r1) qgemm_row_out(c10, c11, c12, c13, cs, zv, nc, ci ? ci + off + ldc : NULL, cf ? cf + off + ldc : NULL);
      if (m + 2 < r1) qgemm_row_out(c20, c21, c22, c23, cs, zv, nc, ci ? ci + off + 2 * ldc : NULL, cf ? cf + off + 2 * ldc : NULL);
      if (m + 3 < r1) qgemm_row_out(c30, c31, c32, c33, cs, zv, nc, ci ? ci + off + 3 * ldc : NULL, cf ? cf + off + 3 * ldc : NULL);
    }
  }
}

EXPORT int ember_qgemm_vectorised(void) { return 1; }
#else
EXPORT void ember_qgemm(i64 r0, i64 r1, i64 K, i64 N, const uint8_t *A, i64 lda, int32_t za,
                        const int8_t *packed, const int32_t *colsum, int32_t *ci, f32 *cf, i64 ldc) {
  ember_qgemm_generic(r0, r1, K, N, A, lda, za, packed, colsum, ci, cf, ldc);
}

/* 0: the integer product is the portable loop here (slower than float32 BLAS: Python keeps BLAS) */
EXPORT int ember_qgemm_vectorised(void) { return 0; }
#endif
