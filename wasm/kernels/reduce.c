/* Reductions over the middle axis of an (outer, r, inner) float32 layout (Python merges the
 * reduced axes into r, or permutes them innermost first): y[o * inner + j] = reduce over k of
 * x[(o * r + k) * inner + j]. Also argmax/argmin (int64 out) and cumsum on the same layout.
 *
 * sum accumulates in float32 lanes within blocks of 256 elements and in float64 across blocks
 * (rows reduced across an inner axis accumulate in float64 lanes), so long sums stay within a few
 * ulps of the exact result. max/min propagate NaN like numpy. r >= 1 for max/min/arg*. */
#include "mathf.h"

typedef double f64;

INLINE v128_t add_f64(v128_t acc, f32x4 v) {   /* acc (2 doubles) += the 4 lanes of v */
  acc = wasm_f64x2_add(acc, wasm_f64x2_promote_low_f32x4(v));
  return wasm_f64x2_add(acc, wasm_f64x2_promote_low_f32x4(wasm_i32x4_shuffle(v, v, 2, 3, 2, 3)));
}

INLINE f64 hsum_f64(v128_t a) { return wasm_f64x2_extract_lane(a, 0) + wasm_f64x2_extract_lane(a, 1); }

static f64 row_sum(const f32 *x, i32 n) {
  v128_t total = wasm_f64x2_splat(0.0);
  i32 i = 0;
  while (n - i >= 16) {
    i32 end = n - i >= 256 ? i + 256 : i + ((n - i) & ~15);
    f32x4 a0 = F4(0.f), a1 = F4(0.f), a2 = F4(0.f), a3 = F4(0.f);
    for (; i < end; i += 16) {
      a0 = wasm_f32x4_add(a0, wasm_v128_load(x + i));
      a1 = wasm_f32x4_add(a1, wasm_v128_load(x + i + 4));
      a2 = wasm_f32x4_add(a2, wasm_v128_load(x + i + 8));
      a3 = wasm_f32x4_add(a3, wasm_v128_load(x + i + 12));
    }
    total = add_f64(total, wasm_f32x4_add(wasm_f32x4_add(a0, a1), wasm_f32x4_add(a2, a3)));
  }
  f32x4 a = F4(0.f);
  for (; i + 4 <= n; i += 4) a = wasm_f32x4_add(a, wasm_v128_load(x + i));
  if (i < n) a = wasm_f32x4_add(a, load_part(x + i, n - i));
  return hsum_f64(add_f64(total, a));
}

EXPORT(sum_f32) void sum_f32(const f32 *x, f32 *y, i32 outer, i32 r, i32 inner) {
  if (inner == 1) {
    for (i32 o = 0; o < outer; o++) y[o] = (f32)row_sum(x + o * r, r);
    return;
  }
  for (i32 o = 0; o < outer; o++, x += r * inner, y += inner) {
    for (i32 j = 0; j < inner; j += 4) {
      const i32 w = inner - j < 4 ? inner - j : 4;
      v128_t lo = wasm_f64x2_splat(0.0), hi = lo;
      for (i32 k = 0; k < r; k++) {
        const f32 *p = x + k * inner + j;
        f32x4 v = w == 4 ? wasm_v128_load(p) : load_part(p, w);
        lo = wasm_f64x2_add(lo, wasm_f64x2_promote_low_f32x4(v));
        hi = wasm_f64x2_add(hi, wasm_f64x2_promote_low_f32x4(wasm_i32x4_shuffle(v, v, 2, 3, 2, 3)));
      }
      f32x4 s = wasm_i32x4_shuffle(wasm_f32x4_demote_f64x2_zero(lo), wasm_f32x4_demote_f64x2_zero(hi), 0, 1, 4, 5);
      if (w == 4) wasm_v128_store(y + j, s); else store_part(y + j, s, w);
    }
  }
}

/* max, min, prod. Rows: max/min through row_max/row_min (mathf.h), prod with float32 lanes.
 * Columns (inner > 1): OP over k for 4 columns at a time; for max/min OP drops NaN operands and
 * a lane flag remembers them (NANF). */
#define REDUCE(NAME, ROW, OP, NANF)                                                             \
  EXPORT(NAME) void NAME(const f32 *x, f32 *y, i32 outer, i32 r, i32 inner) {                   \
    if (inner == 1) {                                                                           \
      for (i32 o = 0; o < outer; o++) y[o] = ROW(x + o * r, r);                                 \
      return;                                                                                   \
    }                                                                                           \
    for (i32 o = 0; o < outer; o++, x += r * inner, y += inner) {                               \
      for (i32 j = 0; j < inner; j += 4) {                                                      \
        const i32 w = inner - j < 4 ? inner - j : 4;                                            \
        f32x4 a = w == 4 ? wasm_v128_load(x + j) : load_part(x + j, w);                         \
        i32x4 nan = wasm_f32x4_ne(a, a);                                                        \
        for (i32 k = 1; k < r; k++) {                                                           \
          f32x4 v = w == 4 ? wasm_v128_load(x + k * inner + j) : load_part(x + k * inner + j, w); \
          a = OP(a, v);                                                                         \
          if (NANF) nan = wasm_v128_or(nan, wasm_f32x4_ne(v, v));                               \
        }                                                                                       \
        if (NANF) a = sel(nan, F4(__builtin_nanf("")), a);                                      \
        if (w == 4) wasm_v128_store(y + j, a); else store_part(y + j, a, w);                    \
      }                                                                                         \
    }                                                                                           \
  }

static f32 row_prod(const f32 *x, i32 n) {
  f32x4 a0 = F4(1.f), a1 = a0;
  i32 i = 0;
  for (; i + 8 <= n; i += 8) {
    a0 = wasm_f32x4_mul(a0, wasm_v128_load(x + i));
    a1 = wasm_f32x4_mul(a1, wasm_v128_load(x + i + 4));
  }
  for (; i < n; i += 4) a0 = wasm_f32x4_mul(a0, n - i >= 4 ? wasm_v128_load(x + i) : load_part_fill(x + i, n - i, F4(1.f)));
  f32x4 v = wasm_f32x4_mul(a0, a1);
  return (wasm_f32x4_extract_lane(v, 0) * wasm_f32x4_extract_lane(v, 1)) *
         (wasm_f32x4_extract_lane(v, 2) * wasm_f32x4_extract_lane(v, 3));
}

REDUCE(max_f32, row_max, wasm_f32x4_pmax, 1)
REDUCE(min_f32, row_min, wasm_f32x4_pmin, 1)
REDUCE(prod_f32, row_prod, wasm_f32x4_mul, 0)

/* argmax / argmin: the index of the first extreme along r; a NaN wins at its first position
 * (numpy). Rows (inner == 1) take the extreme with SIMD first, then look for its first index. */
#define ARGREDUCE(NAME, ROW, BETTER)                                                            \
  EXPORT(NAME) void NAME(const f32 *x, i64 *y, i32 outer, i32 r, i32 inner) {                   \
    for (i32 o = 0; o < outer; o++, x += r * inner, y += inner) {                               \
      if (inner == 1) {                                                                         \
        const f32 m = ROW(x, r);                                                                \
        i32 k = 0;                                                                              \
        if (m != m) { while (x[k] == x[k]) k++; }                                               \
        else { while (x[k] != m) k++; }                                                         \
        y[0] = k;                                                                               \
        continue;                                                                               \
      }                                                                                         \
      for (i32 j = 0; j < inner; j++) {                                                         \
        const f32 *p = x + j;                                                                   \
        f32 best = p[0];                                                                        \
        i32 at = 0;                                                                             \
        if (best == best)                                                                       \
          for (i32 k = 1; k < r; k++) {                                                         \
            const f32 v = p[k * inner];                                                         \
            if (v != v) { at = k; break; }                                                      \
            if (BETTER) { best = v; at = k; }                                                   \
          }                                                                                     \
        y[j] = at;                                                                              \
      }                                                                                         \
    }                                                                                           \
  }

ARGREDUCE(argmax_f32, row_max, v > best)
ARGREDUCE(argmin_f32, row_min, v < best)

/* cumsum along r: float64 running sums rounded once per output (like the python backend);
 * exclusive leaves out the current element, reverse runs from the end. */
EXPORT(cumsum_f32) void cumsum_f32(const f32 *x, f32 *y, i32 outer, i32 r, i32 inner, i32 exclusive, i32 reverse) {
  for (i32 o = 0; o < outer; o++, x += r * inner, y += r * inner)
    for (i32 j = 0; j < inner; j++) {
      f64 acc = 0.0;
      for (i32 t = 0; t < r; t++) {
        const i32 at = (reverse ? r - 1 - t : t) * inner + j;
        const f64 v = x[at];
        if (exclusive) { y[at] = (f32)acc; acc += v; }
        else { acc += v; y[at] = (f32)acc; }
      }
    }
}
