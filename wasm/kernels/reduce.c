/* Reductions over the middle axis of an (outer, r, inner) float32 layout (Python merges the
 * reduced axes into r, or permutes them innermost first): y[o * inner + j] = reduce over k of
 * x[(o * r + k) * inner + j]. Also argmax/argmin (int64 out) and cumsum on the same layout.
 *
 * sum accumulates in float32 lanes within blocks of 256 elements and in float64 across blocks
 * (rows reduced across an inner axis accumulate in float64 lanes), so long sums stay within a few
 * ulps of the exact result. max/min propagate NaN like numpy. r >= 1 for max/min/arg*. */
#include "mathf.h"

typedef double f64;

/* Lanes 0..r-1 from p, the others `fill`. */
INLINE f32x4 load_part_fill(const f32 *p, i32 r, f32x4 fill) {
  f32x4 v = wasm_f32x4_replace_lane(fill, 0, p[0]);
  if (r > 1) v = wasm_f32x4_replace_lane(v, 1, p[1]);
  if (r > 2) v = wasm_f32x4_replace_lane(v, 2, p[2]);
  return v;
}

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

/* max, min, prod: the same walk with float32 lanes; OP combines two vectors, FILL pads a
 * partial vector (the row's own first element for max/min, 1 for prod). */
#define REDUCE(NAME, OP, HREDUCE, FILL)                                                         \
  EXPORT(NAME) void NAME(const f32 *x, f32 *y, i32 outer, i32 r, i32 inner) {                   \
    if (inner == 1) {                                                                           \
      for (i32 o = 0; o < outer; o++) {                                                         \
        const f32 *p = x + o * r;                                                               \
        const f32x4 fill = FILL;                                                                \
        f32x4 a0 = fill, a1 = fill;                                                             \
        i32 i = 0;                                                                              \
        for (; i + 8 <= r; i += 8) {                                                            \
          a0 = OP(a0, wasm_v128_load(p + i));                                                   \
          a1 = OP(a1, wasm_v128_load(p + i + 4));                                               \
        }                                                                                       \
        for (; i + 4 <= r; i += 4) a0 = OP(a0, wasm_v128_load(p + i));                          \
        if (i < r) a1 = OP(a1, load_part_fill(p + i, r - i, fill));                             \
        y[o] = HREDUCE(OP(a0, a1));                                                             \
      }                                                                                         \
      return;                                                                                   \
    }                                                                                           \
    for (i32 o = 0; o < outer; o++, x += r * inner, y += inner) {                               \
      i32 j = 0;                                                                                \
      for (; j + 4 <= inner; j += 4) {                                                          \
        f32x4 a = wasm_v128_load(x + j);                                                        \
        for (i32 k = 1; k < r; k++) a = OP(a, wasm_v128_load(x + k * inner + j));               \
        wasm_v128_store(y + j, a);                                                              \
      }                                                                                         \
      if (j < inner) {                                                                          \
        const i32 w = inner - j;                                                                \
        f32x4 a = load_part(x + j, w);                                                          \
        for (i32 k = 1; k < r; k++) a = OP(a, load_part(x + k * inner + j, w));                 \
        store_part(y + j, a, w);                                                                \
      }                                                                                         \
    }                                                                                           \
  }

INLINE f32x4 vmax(f32x4 a, f32x4 b) { return wasm_f32x4_max(a, b); }
INLINE f32x4 vmin(f32x4 a, f32x4 b) { return wasm_f32x4_min(a, b); }
INLINE f32x4 vmul(f32x4 a, f32x4 b) { return wasm_f32x4_mul(a, b); }
INLINE f32 hprod(f32x4 v) {
  return (wasm_f32x4_extract_lane(v, 0) * wasm_f32x4_extract_lane(v, 1)) *
         (wasm_f32x4_extract_lane(v, 2) * wasm_f32x4_extract_lane(v, 3));
}

REDUCE(max_f32, vmax, hmax, F4(p[0]))
REDUCE(min_f32, vmin, hmin, F4(p[0]))
REDUCE(prod_f32, vmul, hprod, F4(1.f))

/* argmax / argmin: the index of the first extreme along r; a NaN wins at its first position
 * (numpy). Rows (inner == 1) take the extreme with SIMD first, then look for its first index. */
#define ARGREDUCE(NAME, OP, HREDUCE, BETTER)                                                    \
  EXPORT(NAME) void NAME(const f32 *x, i64 *y, i32 outer, i32 r, i32 inner) {                   \
    for (i32 o = 0; o < outer; o++, x += r * inner, y += inner) {                               \
      if (inner == 1) {                                                                         \
        f32x4 a = F4(x[0]);                                                                     \
        i32 i = 0;                                                                              \
        for (; i + 4 <= r; i += 4) a = OP(a, wasm_v128_load(x + i));                            \
        for (; i < r; i++) a = OP(a, F4(x[i]));                                                 \
        const f32 m = HREDUCE(a);                                                               \
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

ARGREDUCE(argmax_f32, vmax, hmax, v > best)
ARGREDUCE(argmin_f32, vmin, hmin, v < best)

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
