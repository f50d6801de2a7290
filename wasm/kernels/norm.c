/* softmax / log_softmax over the middle axis of an (outer, n, inner) float32 layout, layer_norm
 * over trailing rows, inference batch_norm (a per-channel affine map). */
#include "mathf.h"

typedef double f64;

INLINE v128_t add_f64(v128_t acc, f32x4 v) {
  acc = wasm_f64x2_add(acc, wasm_f64x2_promote_low_f32x4(v));
  return wasm_f64x2_add(acc, wasm_f64x2_promote_low_f32x4(wasm_i32x4_shuffle(v, v, 2, 3, 2, 3)));
}

INLINE f64 hsum_f64(v128_t a) { return wasm_f64x2_extract_lane(a, 0) + wasm_f64x2_extract_lane(a, 1); }

INLINE f32 log1f_(f32 s) { return wasm_f32x4_extract_lane(log4(F4(s)), 0); }

/* One contiguous row: m = max (NaN wins), then exp(x - m) summed (and stored for softmax), then
 * y = e * (1 / s), or y = (x - m) - log(s). A row holding +inf or NaN comes out NaN, as in numpy.
 * (The reciprocal costs one rounding more than a division and a quarter of its time.) */
/* sum of exp(x - m) over a row, stored to y when y is given (missing lanes of the last vector
 * read -inf: exp gives 0 there). Kept out of line: inlined into softmax_row, V8 and wasmtime
 * both ran this loop at half the speed. */
static __attribute__((noinline)) f32 exp_sum(const f32 *x, f32 *y, i32 n, f32 mf) {
  const f32x4 m = F4(mf);
  f32x4 s = F4(0.f);
  i32 i = 0;
  if (y) {
    for (; i + 4 <= n; i += 4) {
      f32x4 e = exp4(wasm_f32x4_sub(wasm_v128_load(x + i), m));
      wasm_v128_store(y + i, e);
      s = wasm_f32x4_add(s, e);
    }
  } else {
    for (; i + 4 <= n; i += 4) s = wasm_f32x4_add(s, exp4(wasm_f32x4_sub(wasm_v128_load(x + i), m)));
  }
  if (i < n) {
    f32x4 e = exp4(wasm_f32x4_sub(load_part_fill(x + i, n - i, F4(-__builtin_inff())), m));
    if (y) store_part(y + i, e, n - i);
    s = wasm_f32x4_add(s, e);
  }
  return hsum(s);
}

static void softmax_row(const f32 *x, f32 *y, i32 n, i32 lg) {
  const f32 mf = row_max(x, n);
  const f32 sum = exp_sum(x, lg ? 0 : y, n, mf);
  const f32x4 m = F4(mf);
  i32 i;
  if (lg) {
    const f32x4 ls = F4(log1f_(sum));
    for (i = 0; i + 4 <= n; i += 4)
      wasm_v128_store(y + i, wasm_f32x4_sub(wasm_f32x4_sub(wasm_v128_load(x + i), m), ls));
    if (i < n) store_part(y + i, wasm_f32x4_sub(wasm_f32x4_sub(load_part(x + i, n - i), m), ls), n - i);
  } else {
    const f32x4 r = F4(1.f / sum);
    for (i = 0; i + 4 <= n; i += 4) wasm_v128_store(y + i, wasm_f32x4_mul(wasm_v128_load(y + i), r));
    if (i < n) store_part(y + i, wasm_f32x4_mul(load_part(y + i, n - i), r), n - i);
  }
}

/* Columns j..j+w-1 (w <= 4) of an (n, inner) block, one lane each. */
static void softmax_cols(const f32 *x, f32 *y, i32 n, i32 inner, i32 w, i32 lg) {
#define LD(p) (w == 4 ? wasm_v128_load(p) : load_part(p, w))
#define ST(p, v) do { if (w == 4) wasm_v128_store(p, v); else store_part(p, v, w); } while (0)
  f32x4 m = LD(x);
  i32x4 nan = wasm_f32x4_ne(m, m);
  for (i32 k = 1; k < n; k++) {
    f32x4 v = LD(x + k * inner);
    m = wasm_f32x4_pmax(m, v);
    nan = wasm_v128_or(nan, wasm_f32x4_ne(v, v));
  }
  m = sel(nan, F4(__builtin_nanf("")), m);
  f32x4 s = F4(0.f);
  for (i32 k = 0; k < n; k++) {
    f32x4 e = exp4(wasm_f32x4_sub(LD(x + k * inner), m));
    if (!lg) ST(y + k * inner, e);
    s = wasm_f32x4_add(s, e);
  }
  if (lg) {
    f32x4 ls = log4(s);
    for (i32 k = 0; k < n; k++) ST(y + k * inner, wasm_f32x4_sub(wasm_f32x4_sub(LD(x + k * inner), m), ls));
  } else {
    const f32x4 r = wasm_f32x4_div(F4(1.f), s);
    for (i32 k = 0; k < n; k++) ST(y + k * inner, wasm_f32x4_mul(LD(y + k * inner), r));
  }
#undef LD
#undef ST
}

/* log = 0: softmax, 1: log_softmax; n >= 1. */
EXPORT(softmax_f32) void softmax_f32(const f32 *x, f32 *y, i32 outer, i32 n, i32 inner, i32 lg) {
  for (i32 o = 0; o < outer; o++, x += n * inner, y += n * inner) {
    if (inner == 1) { softmax_row(x, y, n, lg); continue; }
    for (i32 j = 0; j < inner; j += 4) softmax_cols(x + j, y + j, n, inner, inner - j < 4 ? inner - j : 4, lg);
  }
}

/* Row sum in float32 lanes per block of 256, float64 across blocks. (x - c) first when centre. */
static f64 row_sum_c(const f32 *x, i32 n, f32 c, i32 square) {
  const f32x4 cv = F4(c);
  v128_t total = wasm_f64x2_splat(0.0);
  i32 i = 0;
  while (n - i >= 8) {
    i32 end = n - i >= 256 ? i + 256 : i + ((n - i) & ~7);
    f32x4 a0 = F4(0.f), a1 = F4(0.f);
    for (; i < end; i += 8) {
      f32x4 d0 = wasm_f32x4_sub(wasm_v128_load(x + i), cv), d1 = wasm_f32x4_sub(wasm_v128_load(x + i + 4), cv);
      if (square) { d0 = wasm_f32x4_mul(d0, d0); d1 = wasm_f32x4_mul(d1, d1); }
      a0 = wasm_f32x4_add(a0, d0);
      a1 = wasm_f32x4_add(a1, d1);
    }
    total = add_f64(total, wasm_f32x4_add(a0, a1));
  }
  f64 rest = 0.0;
  for (; i < n; i++) { f64 d = (f64)x[i] - c; rest += square ? d * d : d; }
  return hsum_f64(total) + rest;
}

/* y = (x - mean) / sqrt(var + eps) * w + b over rows of m elements (biased variance). */
EXPORT(layer_norm_f32) void layer_norm_f32(const f32 *x, const f32 *w, const f32 *b, f32 *y, i32 rows, i32 m, f32 eps) {
  for (i32 g = 0; g < rows; g++, x += m, y += m) {
    const f32 mean = (f32)(row_sum_c(x, m, 0.f, 0) / m);
    const f64 var = row_sum_c(x, m, mean, 1) / m;
    const f32x4 mv = F4(mean), rv = F4((f32)(1.0 / __builtin_sqrt(var + (f64)eps)));
    i32 i = 0;
    for (; i + 4 <= m; i += 4) {
      f32x4 d = wasm_f32x4_mul(wasm_f32x4_sub(wasm_v128_load(x + i), mv), rv);
      wasm_v128_store(y + i, madd(d, wasm_v128_load(w + i), wasm_v128_load(b + i)));
    }
    if (i < m) {
      f32x4 d = wasm_f32x4_mul(wasm_f32x4_sub(load_part(x + i, m - i), mv), rv);
      store_part(y + i, madd(d, load_part(w + i, m - i), load_part(b + i, m - i)), m - i);
    }
  }
}

/* Inference batch norm of (N, C, S): per channel scale = w / sqrt(var + eps) and shift =
 * b - mean * scale (in float64, then float32, as the decomposition does in float32), y = x * scale + shift. */
EXPORT(batch_norm_f32) void batch_norm_f32(const f32 *x, const f32 *mean, const f32 *var, const f32 *w, const f32 *b,
                                           f32 *y, i32 N, i32 C, i32 S, f32 eps) {
  for (i32 n = 0; n < N; n++)
    for (i32 c = 0; c < C; c++, x += S, y += S) {
      const f32 scale = (f32)((f64)w[c] / __builtin_sqrt((f64)var[c] + (f64)eps));
      const f32 shift = (f32)((f64)b[c] - (f64)mean[c] * scale);
      const f32x4 sv = F4(scale), tv = F4(shift);
      i32 i = 0;
      for (; i + 4 <= S; i += 4) wasm_v128_store(y + i, madd(wasm_v128_load(x + i), sv, tv));
      for (; i < S; i++) y[i] = x[i] * scale + shift;
    }
}
