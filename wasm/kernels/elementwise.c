/* Elementwise float32 kernels: unary maps and activations, broadcasting binary ops and
 * comparisons, where, pow. (The Python side is wasm/ops_elementwise.py.)
 *
 * Unary:   NAME(const f32 *x, f32 *y, i32 n)                    (sin/cos return a count, below)
 * Binary:  NAME_vv(a, b, y, n)      a and b of n elements
 *          NAME_vs(a, f32 b, y, n)  b a scalar          NAME_sv(f32 a, b, y, n)
 *          NAME_bc(a, b, y, d)      broadcast: d = shape[6], a strides[6], b strides[6] (int32,
 *                                   elements, 0 on broadcast axes; Python merges axes and pads
 *                                   with size-1 axes in front), y row-major of that shape.
 * Comparisons write bytes 0/1 (ember's bool); where selects 4-byte values by a bool byte.
 */
#include "mathf.h"

#define NOINLINE static __attribute__((noinline))

/* ---- unary maps -------------------------------------------------------------------------------- */

/* Two vectors per step: V8 then interleaves the two independent chains (gelu 1.4x faster). */
#define MAP(NAME, F)                                                                        \
  EXPORT(NAME) void NAME(const f32 *x, f32 *y, i32 n) {                                     \
    i32 i = 0;                                                                              \
    for (; i + 8 <= n; i += 8) {                                                            \
      f32x4 a = F(wasm_v128_load(x + i)), b = F(wasm_v128_load(x + i + 4));                 \
      wasm_v128_store(y + i, a);                                                            \
      wasm_v128_store(y + i + 4, b);                                                        \
    }                                                                                       \
    for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, F(wasm_v128_load(x + i)));            \
    if (i < n) store_part(y + i, F(load_part(x + i, n - i)), n - i);                        \
  }

INLINE f32x4 neg4(f32x4 x) { return wasm_f32x4_neg(x); }
INLINE f32x4 abs4(f32x4 x) { return wasm_f32x4_abs(x); }
INLINE f32x4 sqrt4(f32x4 x) { return wasm_f32x4_sqrt(x); }
INLINE f32x4 floor4(f32x4 x) { return wasm_f32x4_floor(x); }
INLINE f32x4 ceil4(f32x4 x) { return wasm_f32x4_ceil(x); }
INLINE f32x4 round4(f32x4 x) { return wasm_f32x4_nearest(x); }   /* half to even */
INLINE f32x4 sign4(f32x4 x) {                                      /* +-0 and NaN stay */
  return sel(wasm_f32x4_gt(x, F4(0.f)), F4(1.f), sel(wasm_f32x4_lt(x, F4(0.f)), F4(-1.f), x));
}
INLINE f32x4 relu4(f32x4 x) { return sel(wasm_f32x4_lt(x, F4(0.f)), F4(0.f), x); }   /* NaN stays */

MAP(negative_f32, neg4)
MAP(abs_f32, abs4)
MAP(sqrt_f32, sqrt4)
MAP(floor_f32, floor4)
MAP(ceil_f32, ceil4)
MAP(round_f32, round4)
MAP(sign_f32, sign4)
MAP(exp_f32, exp4)
MAP(log_f32, log4)
MAP(tanh_f32, tanh4)
MAP(erf_f32, erf4)
MAP(relu_f32, relu4)
MAP(sigmoid_f32, sigmoid4)
MAP(silu_f32, silu4)
MAP(gelu_f32, gelu4)
MAP(gelu_tanh_f32, gelu_tanh4)

EXPORT(leaky_relu_f32) void leaky_relu_f32(const f32 *x, f32 *y, i32 n, f32 slope) {
  const f32x4 s = F4(slope);
  i32 i = 0;
  for (; i + 4 <= n; i += 4) {
    f32x4 v = wasm_v128_load(x + i);
    wasm_v128_store(y + i, sel(wasm_f32x4_lt(v, F4(0.f)), wasm_f32x4_mul(v, s), v));
  }
  if (i < n) {
    f32x4 v = load_part(x + i, n - i);
    store_part(y + i, sel(wasm_f32x4_lt(v, F4(0.f)), wasm_f32x4_mul(v, s), v), n - i);
  }
}

/* clip: min(max(x, lo), hi) with NaN kept, like maximum then minimum (lo > hi gives hi);
 * pmax(x, lo) = x < lo ? lo : x passes a NaN x through, as does pmin(x, hi). */
INLINE f32x4 clip4(f32x4 x, f32x4 l, f32x4 h) { return wasm_f32x4_pmin(wasm_f32x4_pmax(x, l), h); }

EXPORT(clip_f32) void clip_f32(const f32 *x, f32 *y, i32 n, f32 lo, f32 hi) {
  const f32x4 l = F4(lo), h = F4(hi);
  i32 i = 0;
  for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, clip4(wasm_v128_load(x + i), l, h));
  if (i < n) store_part(y + i, clip4(load_part(x + i, n - i), l, h), n - i);
}

/* sin/cos: return how many elements have |x| >= 2^20 (finite); those are left for the caller
 * (Python redoes them with a full-precision argument reduction). */
#define TRIG(NAME, COSINE)                                                                  \
  EXPORT(NAME) i32 NAME(const f32 *x, f32 *y, i32 n) {                                      \
    i32 i = 0, nbig = 0;                                                                    \
    i32x4 big;                                                                              \
    for (; i + 4 <= n; i += 4) {                                                            \
      wasm_v128_store(y + i, sincos4(wasm_v128_load(x + i), COSINE, &big));                 \
      nbig += __builtin_popcount(wasm_i32x4_bitmask(big));                                  \
    }                                                                                       \
    if (i < n) {                                                                            \
      store_part(y + i, sincos4(load_part(x + i, n - i), COSINE, &big), n - i);             \
      nbig += __builtin_popcount(wasm_i32x4_bitmask(big));                                  \
    }                                                                                       \
    return nbig;                                                                            \
  }

TRIG(sin_f32, 0)
TRIG(cos_f32, 1)

EXPORT(isnan_f32) void isnan_f32(const f32 *x, unsigned char *y, i32 n) {
  i32 i = 0;
  for (; i + 16 <= n; i += 16) {
    f32x4 a = wasm_v128_load(x + i), b = wasm_v128_load(x + i + 4), c = wasm_v128_load(x + i + 8),
          d = wasm_v128_load(x + i + 12);
    wasm_v128_store(y + i, masks_to_bools16(wasm_f32x4_ne(a, a), wasm_f32x4_ne(b, b), wasm_f32x4_ne(c, c),
                                            wasm_f32x4_ne(d, d)));
  }
  for (; i < n; i++) y[i] = x[i] != x[i];
}

/* ---- pow ----------------------------------------------------------------------------------------
 * |a|^b = 2^(b log2|a|) in float64 (series to ~1e-15, so the float32 result is rounded once from
 * an almost exact value), with C99/numpy special cases: x^0 = 1, 1^y = 1 (even NaN), a < 0 needs an
 * integer b (sign from its parity), +-0 and +-inf by the sign of b and its parity. */
typedef double f64;
typedef unsigned long long u64;

INLINE f64 bits_f64(u64 u) { f64 d; __builtin_memcpy(&d, &u, 8); return d; }
INLINE u64 f64_bits(f64 d) { u64 u; __builtin_memcpy(&u, &d, 8); return u; }

INLINE f64 log2_pos(f64 x) {   /* x > 0 finite, a float32 value (so a normal double) */
  i64 ix = (i64)f64_bits(x);
  i64 e = (ix - 0x3fe6a09e667f3bcdLL) >> 52;
  f64 m = bits_f64((u64)(ix - (e << 52)));
  f64 f = m - 1.0, s = f / (2.0 + f), z = s * s;
  f64 R = z * (2.0 / 3 + z * (2.0 / 5 + z * (2.0 / 7 + z * (2.0 / 9 + z * (2.0 / 11 + z * (2.0 / 13 +
          z * (2.0 / 15 + z * (2.0 / 17))))))));
  return (f64)e + (f - s * (f - R)) * 1.4426950408889634;
}

INLINE f64 exp2_clamped(f64 y) {
  if (y > 200.0) y = 200.0;      /* overflows float32 anyway (NaN cannot reach here) */
  if (y < -200.0) y = -200.0;    /* underflows to 0 */
  f64 k = __builtin_rint(y);
  f64 t = (y - k) * 0.69314718055994531;
  f64 p = 1.0 + t * (1.0 + t * (1.0 / 2 + t * (1.0 / 6 + t * (1.0 / 24 + t * (1.0 / 120 + t * (1.0 / 720 +
          t * (1.0 / 5040 + t * (1.0 / 40320 + t * (1.0 / 362880 + t * (1.0 / 3628800 + t * (1.0 / 39916800 +
          t * (1.0 / 479001600))))))))))));
  return p * bits_f64((u64)((i64)k + 1023) << 52);
}

NOINLINE f32 pow1(f32 a, f32 b) {
  if (b == 0.f || a == 1.f) return 1.f;
  if (a != a || b != b) return a + b;
  f32 ab = __builtin_fabsf(b);
  i32 integral = __builtin_floorf(b) == b;                       /* +-inf counts as even */
  i32 odd = integral && ab < 16777216.f && ((i32)(i64)ab & 1);  /* >= 2^24: every float is even */
  i32 neg = __builtin_signbit(a) && odd;
  if (a < 0.f && a > -__builtin_inff() && !integral) return __builtin_nanf("");
  f32 aa = __builtin_fabsf(a);
  f32 r;
  if (aa == 1.f) r = 1.f;                                        /* (-1)^+-inf = 1 */
  else {
    f64 l = aa == 0.f ? -__builtin_inf() : aa == __builtin_inff() ? __builtin_inf() : log2_pos(aa);
    f64 y = (f64)b * l;
    r = y != y ? 1.f : (f32)exp2_clamped(y);
  }
  return neg ? -r : r;
}

INLINE f32x4 pow4(f32x4 a, f32x4 b) {
  return wasm_f32x4_make(pow1(wasm_f32x4_extract_lane(a, 0), wasm_f32x4_extract_lane(b, 0)),
                         pow1(wasm_f32x4_extract_lane(a, 1), wasm_f32x4_extract_lane(b, 1)),
                         pow1(wasm_f32x4_extract_lane(a, 2), wasm_f32x4_extract_lane(b, 2)),
                         pow1(wasm_f32x4_extract_lane(a, 3), wasm_f32x4_extract_lane(b, 3)));
}

/* The five outer axes of a broadcast: ROW runs once per innermost row with oa/ob the element
 * offsets of that row in a and b and y pointing at its output. */
#define BC_LOOPS(ROW)                                                                           \
  const i32 *sh = d, *sa = d + 6, *sb = d + 12;                                                 \
  for (i32 i0 = 0; i0 < sh[0]; i0++)                                                            \
    for (i32 i1 = 0; i1 < sh[1]; i1++)                                                          \
      for (i32 i2 = 0; i2 < sh[2]; i2++)                                                        \
        for (i32 i3 = 0; i3 < sh[3]; i3++)                                                      \
          for (i32 i4 = 0; i4 < sh[4]; i4++) {                                                  \
            i32 oa = i0 * sa[0] + i1 * sa[1] + i2 * sa[2] + i3 * sa[3] + i4 * sa[4];            \
            i32 ob = i0 * sb[0] + i1 * sb[1] + i2 * sb[2] + i3 * sb[3] + i4 * sb[4];            \
            ROW;                                                                                \
            y += sh[5];                                                                         \
          }

/* ---- binary ops ---------------------------------------------------------------------------------
 * One row routine per operand pattern (both contiguous, one splat, strided), each op from its
 * 4-lane form (the scalar strided path uses lane 0), so every path computes the same values. */

INLINE f32x4 add4(f32x4 a, f32x4 b) { return wasm_f32x4_add(a, b); }
INLINE f32x4 sub4(f32x4 a, f32x4 b) { return wasm_f32x4_sub(a, b); }
INLINE f32x4 mul4(f32x4 a, f32x4 b) { return wasm_f32x4_mul(a, b); }
INLINE f32x4 div4(f32x4 a, f32x4 b) { return wasm_f32x4_div(a, b); }
/* NaN wins: pmax(a, b) = a < b ? b : a keeps a NaN a, the select a NaN b (cheaper than the
 * NaN-propagating f32x4.max, several instructions on x86) */
INLINE f32x4 max4(f32x4 a, f32x4 b) { return sel(wasm_f32x4_ne(b, b), b, wasm_f32x4_pmax(a, b)); }
INLINE f32x4 min4(f32x4 a, f32x4 b) { return sel(wasm_f32x4_ne(b, b), b, wasm_f32x4_pmin(a, b)); }

#define BINARY(NAME, OP)                                                                        \
  NOINLINE void NAME##_row(const f32 *a, i32 sa, f32 as, const f32 *b, i32 sb, f32 bs, f32 *y, i32 n) { \
    i32 i = 0;                                                                                  \
    if (sa == 1 && sb == 1) {                                                                   \
      for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, OP(wasm_v128_load(a + i), wasm_v128_load(b + i))); \
      if (i < n) store_part(y + i, OP(load_part(a + i, n - i), load_part(b + i, n - i)), n - i); \
    } else if (sa == 1 && sb == 0) {                                                            \
      const f32x4 bv = F4(bs);                                                                  \
      for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, OP(wasm_v128_load(a + i), bv));         \
      if (i < n) store_part(y + i, OP(load_part(a + i, n - i), bv), n - i);                     \
    } else if (sa == 0 && sb == 1) {                                                            \
      const f32x4 av = F4(as);                                                                  \
      for (; i + 4 <= n; i += 4) wasm_v128_store(y + i, OP(av, wasm_v128_load(b + i)));         \
      if (i < n) store_part(y + i, OP(av, load_part(b + i, n - i)), n - i);                     \
    } else {                                                                                    \
      for (; i < n; i++) y[i] = wasm_f32x4_extract_lane(OP(F4(a[i * sa]), F4(b[i * sb])), 0);   \
    }                                                                                           \
  }                                                                                             \
  EXPORT(NAME##_vv) void NAME##_vv(const f32 *a, const f32 *b, f32 *y, i32 n) { NAME##_row(a, 1, 0.f, b, 1, 0.f, y, n); } \
  EXPORT(NAME##_vs) void NAME##_vs(const f32 *a, f32 b, f32 *y, i32 n) { NAME##_row(a, 1, 0.f, a, 0, b, y, n); }          \
  EXPORT(NAME##_sv) void NAME##_sv(f32 a, const f32 *b, f32 *y, i32 n) { NAME##_row(b, 0, a, b, 1, 0.f, y, n); }          \
  EXPORT(NAME##_bc) void NAME##_bc(const f32 *a, const f32 *b, f32 *y, const i32 *d) {          \
    BC_LOOPS(NAME##_row(a + oa, sa[5], a[oa], b + ob, sb[5], b[ob], y, sh[5]))                  \
  }

BINARY(add_f32, add4)
BINARY(subtract_f32, sub4)
BINARY(multiply_f32, mul4)
BINARY(divide_f32, div4)
BINARY(maximum_f32, max4)
BINARY(minimum_f32, min4)
BINARY(pow_f32, pow4)

/* ---- comparisons -> bool bytes ----------------------------------------------------------------- */

INLINE i32x4 eq4(f32x4 a, f32x4 b) { return wasm_f32x4_eq(a, b); }
INLINE i32x4 ne4(f32x4 a, f32x4 b) { return wasm_f32x4_ne(a, b); }
INLINE i32x4 lt4(f32x4 a, f32x4 b) { return wasm_f32x4_lt(a, b); }
INLINE i32x4 le4(f32x4 a, f32x4 b) { return wasm_f32x4_le(a, b); }

#define LOADA(k) (sa ? wasm_v128_load(a + i + (k)) : av)
#define LOADB(k) (sb ? wasm_v128_load(b + i + (k)) : bv)

#define COMPARE(NAME, OP)                                                                       \
  NOINLINE void NAME##_row(const f32 *a, i32 sa, f32 as, const f32 *b, i32 sb, f32 bs, unsigned char *y, i32 n) { \
    i32 i = 0;                                                                                  \
    if ((sa == 0 || sa == 1) && (sb == 0 || sb == 1)) {                                         \
      const f32x4 av = F4(as), bv = F4(bs);                                                     \
      for (; i + 16 <= n; i += 16)                                                              \
        wasm_v128_store(y + i, masks_to_bools16(OP(LOADA(0), LOADB(0)), OP(LOADA(4), LOADB(4)),  \
                                                OP(LOADA(8), LOADB(8)), OP(LOADA(12), LOADB(12)))); \
      for (; i + 4 <= n; i += 4) store_bools_part(y + i, OP(LOADA(0), LOADB(0)), 4);            \
      if (i < n)                                                                                \
        store_bools_part(y + i, OP(sa ? load_part(a + i, n - i) : av, sb ? load_part(b + i, n - i) : bv), n - i); \
    } else {                                                                                    \
      for (; i < n; i++) y[i] = (unsigned char)(wasm_i32x4_extract_lane(OP(F4(a[i * sa]), F4(b[i * sb])), 0) & 1); \
    }                                                                                           \
  }                                                                                             \
  EXPORT(NAME##_vv) void NAME##_vv(const f32 *a, const f32 *b, unsigned char *y, i32 n) { NAME##_row(a, 1, 0.f, b, 1, 0.f, y, n); } \
  EXPORT(NAME##_vs) void NAME##_vs(const f32 *a, f32 b, unsigned char *y, i32 n) { NAME##_row(a, 1, 0.f, a, 0, b, y, n); }          \
  EXPORT(NAME##_sv) void NAME##_sv(f32 a, const f32 *b, unsigned char *y, i32 n) { NAME##_row(b, 0, a, b, 1, 0.f, y, n); }          \
  EXPORT(NAME##_bc) void NAME##_bc(const f32 *a, const f32 *b, unsigned char *y, const i32 *d) { \
    BC_LOOPS(NAME##_row(a + oa, sa[5], a[oa], b + ob, sb[5], b[ob], y, sh[5]))                  \
  }

COMPARE(equal_f32, eq4)
COMPARE(not_equal_f32, ne4)
COMPARE(less_f32, lt4)
COMPARE(less_equal_f32, le4)

/* ---- where ---------------------------------------------------------------------------------------
 * 4-byte values (float32, float16-as-float32, int32) picked by bool bytes.
 * where_vvv(c, x, y, out, n); where_bc(c, x, y, out, d): d = shape[6] and the strides of c, x, y. */

INLINE i32x4 bools4(const unsigned char *c) {   /* 4 bool bytes -> lane masks */
  v128_t b = wasm_v128_load32_zero(c);
  b = wasm_u32x4_extend_low_u16x8(wasm_u16x8_extend_low_u8x16(b));
  return wasm_i32x4_ne(b, I4(0));
}

EXPORT(where_vvv) void where_vvv(const unsigned char *c, const u32 *x, const u32 *y, u32 *o, i32 n) {
  i32 i = 0;
  for (; i + 4 <= n; i += 4)
    wasm_v128_store(o + i, wasm_v128_bitselect(wasm_v128_load(x + i), wasm_v128_load(y + i), bools4(c + i)));
  for (; i < n; i++) o[i] = c[i] ? x[i] : y[i];
}

EXPORT(where_bc) void where_bc(const unsigned char *c, const u32 *x, const u32 *y, u32 *o, const i32 *d) {
  const i32 *sh = d, *sc = d + 6, *sx = d + 12, *sy = d + 18;
  const i32 n = sh[5], c5 = sc[5], x5 = sx[5], y5 = sy[5];
  for (i32 i0 = 0; i0 < sh[0]; i0++)
    for (i32 i1 = 0; i1 < sh[1]; i1++)
      for (i32 i2 = 0; i2 < sh[2]; i2++)
        for (i32 i3 = 0; i3 < sh[3]; i3++)
          for (i32 i4 = 0; i4 < sh[4]; i4++) {
            const unsigned char *pc = c + i0 * sc[0] + i1 * sc[1] + i2 * sc[2] + i3 * sc[3] + i4 * sc[4];
            const u32 *px = x + i0 * sx[0] + i1 * sx[1] + i2 * sx[2] + i3 * sx[3] + i4 * sx[4];
            const u32 *py = y + i0 * sy[0] + i1 * sy[1] + i2 * sy[2] + i3 * sy[3] + i4 * sy[4];
            i32 i = 0;
            if (c5 == 1 && (x5 == 1 || x5 == 0) && (y5 == 1 || y5 == 0)) {
              const v128_t xv = wasm_i32x4_splat((i32)px[0]), yv = wasm_i32x4_splat((i32)py[0]);
              for (; i + 4 <= n; i += 4)
                wasm_v128_store(o + i, wasm_v128_bitselect(x5 ? wasm_v128_load(px + i) : xv,
                                                           y5 ? wasm_v128_load(py + i) : yv, bools4(pc + i)));
            }
            for (; i < n; i++) o[i] = pc[i * c5] ? px[i * x5] : py[i * y5];
            o += n;
          }
}
