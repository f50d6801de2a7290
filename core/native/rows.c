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
 * exp, erf: our own float32 approximations (vec.h's vexp and vphi), VW values at a time: libm's
 * expf is a call per element. */
#include "vec.h"

#define LANES 16

/* y[i] = e^(x[i] - m) for i in [0, n) (vec.h's vexp, VW values at a time; x - 0 is x, -0 and NaN
 * included, so m = 0 gives e^x itself) */
INLINE void exp_run(i64 n, const f32 *x, f32 m, f32 *y) {
  i64 i = 0;
  for (; i + VW <= n; i += VW) store(y + i, vexp(load(x + i) - m));
  if (i < n) store_part(y + i, vexp(load_part(x + i, n - i) - m), n - i);
}

/* y = x Phi(x) for i in [0, n): GELU's exact (erf) form (vec.h's vgelu_erf: Phi's
 * approximation is described there), VW values at a time. gelu(-inf) = -inf * 0 = NaN, as the
 * numpy path. */
EXPORT void ember_gelu_erf(i64 n, const f32 *x, f32 *y) {
  i64 i = 0;
  for (; i + VW <= n; i += VW) store(y + i, vgelu_erf(load(x + i)));
  if (i < n) store_part(y + i, vgelu_erf(load_part(x + i, n - i)), n - i);
}

/* y = x / (1 + e^(-2k)), k = sqrt(2 / pi) (x + 0.044715 x^3): GELU's tanh form, written as
 * x (1 + tanh k) / 2 = x sigmoid(2k) (no cancellation in 1 + tanh k for negative x); vec.h's
 * vgelu_tanh, VW values at a time. */
EXPORT void ember_gelu_tanh(i64 n, const f32 *x, f32 *y) {
  i64 i = 0;
  for (; i + VW <= n; i += VW) store(y + i, vgelu_tanh(load(x + i)));
  if (i < n) store_part(y + i, vgelu_tanh(load_part(x + i, n - i)), n - i);
}

/* 16 float32 lanes as one GCC vector (vector extensions: clang and gcc; a vector register or
 * two), loaded and stored unaligned through memcpy; comparisons give lane masks (-1 / 0) */
typedef f32 v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

INLINE v16 vload(const f32 *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
INLINE v16 vsplat(f32 a) { return (v16){a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a}; }
INLINE v16 vsel(v16i m, v16 a, v16 b) { return (v16)((m & (v16i)a) | (~m & (v16i)b)); }

/* the lane sums' fixed pairwise order: (0+8, 1+9, ...), then (0+4, ...), (0+2, ...), 0+1 (by
 * shuffles where the compiler has __builtin_shufflevector: the same additions, no trip through memory) */
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define LANES_SHUFFLE 1
#endif
#endif
INLINE f32 lanes_sum(v16 acc) {
#ifdef LANES_SHUFFLE
  acc += __builtin_shufflevector(acc, acc, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
  acc += __builtin_shufflevector(acc, acc, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
  acc += __builtin_shufflevector(acc, acc, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  acc += __builtin_shufflevector(acc, acc, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
  return acc[0];
#else
  f32 a[LANES];
  memcpy(a, &acc, sizeof a);
  for (int w = LANES / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; j++) a[j] += a[j + w];
  return a[0];
#endif
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

/* rows [0, rows) of n values, x's rows ldx apart, y's ldy: y = (x - mean) / sqrt(var + eps) * w + b,
 * mean and the biased variance (of the deviations: two passes, as the numpy path) in float32 lane
 * sums; the rest the numpy path's float32 operations in its order. (Also fused.c's ember_linear's
 * prologue: the same bits there.) */
void ember_layer_norm_rows(i64 rows, i64 n, const f32 *x, i64 ldx, const f32 *w, const f32 *b, f32 eps, f32 *y,
                           i64 ldy) {
  for (i64 r = 0; r < rows; r++) {
    const f32 *xr = x + r * ldx;
    f32 *yr = y + r * ldy;
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

/* rows [0, rows) of n contiguous values: the layer norm above */
EXPORT void ember_layer_norm(i64 rows, i64 n, const f32 *x, const f32 *w, const f32 *b, f32 eps, f32 *y) {
  ember_layer_norm_rows(rows, n, x, n, w, b, eps, y, n);
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

/* rows [0, rows) of n values, x's rows ldx apart, y's ldy (y never x): the softmax below, a row at a
 * time (the same float32 operations per row; fused.c's attention) */
void ember_softmax_rows(i64 rows, i64 n, const f32 *x, i64 ldx, f32 *y, i64 ldy) {
  for (i64 r = 0; r < rows; r++) {
    const f32 *xr = x + r * ldx;
    f32 *yr = y + r * ldy;
    exp_run(n, xr, 0.0f, yr);
    f32 s = row_sum(n, yr);
    if (!(s >= 1.0f && s <= 3.40282347e38f)) {          /* (NaN fails both) */
      exp_run(n, xr, row_max(n, xr), yr);
      s = row_sum(n, yr);
    }
    row_divide(n, yr, s);
  }
}

EXPORT void ember_softmax(i64 rows, i64 n, const f32 *x, f32 *y) {
  i64 step = n >= SOFTMAX_BLOCK ? 1 : SOFTMAX_BLOCK / n;
  for (i64 r0 = 0; r0 < rows; r0 += step) {
    i64 r1 = r0 + step < rows ? r0 + step : rows;
    const f32 *xb = x + r0 * n;
    f32 *yb = y + r0 * n;
    exp_run((r1 - r0) * n, xb, 0.0f, yb);
    for (i64 r = r0; r < r1; r++) {
      const f32 *xr = x + r * n;
      f32 *yr = y + r * n;
      f32 s = row_sum(n, yr);
      if (!(s >= 1.0f && s <= 3.40282347e38f)) {          /* (NaN fails both) */
        f32 m = row_max(n, xr);
        exp_run(n, xr, m, yr);
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
